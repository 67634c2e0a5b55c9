//! Finding things in a page without building it: a [`Selector`] walks a
//! page's raw JSON level by level, and [`fields`] picks a few fields out of
//! a record. What is found stays a slice of the page's text, so records
//! are handed to the host as the provider wrote them.

use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A place in a JSON document: a JSON pointer (`/data/items`), a dotted
/// path (`data.items`, `data.0`), or the document itself (empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    steps: Vec<String>,
    text: String,
}

impl Selector {
    pub fn parse(text: &str) -> Selector {
        let steps = if text.is_empty() || text == "/" {
            Vec::new()
        } else if let Some(pointer) = text.strip_prefix('/') {
            pointer.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect()
        } else {
            text.split('.').map(str::to_owned).collect()
        };
        Selector { steps, text: text.to_owned() }
    }

    /// What is at this place of `doc`; `None` when the walk leaves the
    /// document (a key that is not there, an index past the end, a step
    /// into a string or number).
    pub fn find<'a>(&self, doc: &'a RawValue) -> Option<&'a RawValue> {
        let mut here = doc;
        for step in &self.steps {
            here = match first_byte(here) {
                b'{' => serde_json::from_str::<HashMap<String, &RawValue>>(here.get()).ok()?.remove(step.as_str())?,
                b'[' => {
                    let index: usize = step.parse().ok()?;
                    serde_json::from_str::<Vec<&RawValue>>(here.get()).ok()?.get(index).copied()?
                }
                _ => return None,
            };
        }
        Some(here)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.text.is_empty() { f.write_str("(the whole page)") } else { f.write_str(&self.text) }
    }
}

/// The first significant byte of a raw value: `{`, `[`, `"`, a digit,
/// `t`, `f`, `n` or `-`.
pub fn first_byte(raw: &RawValue) -> u8 {
    raw.get().bytes().find(|b| !b.is_ascii_whitespace()).unwrap_or(b' ')
}

/// The keys of an object, for an error that says what a page holds.
pub fn keys(raw: &RawValue) -> Vec<String> {
    let mut keys: Vec<String> = serde_json::from_str::<HashMap<String, IgnoredAny>>(raw.get())
        .map(|m| m.into_keys().collect())
        .unwrap_or_default();
    keys.sort();
    keys.truncate(20);
    keys
}

/// The values of `wanted` fields of a JSON object (top level), each `None`
/// when absent; other fields are skipped without being built.
pub fn fields<'a>(record: &'a RawValue, wanted: &[&str]) -> Result<Vec<Option<&'a RawValue>>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(record.get());
    let found = Picker { wanted }.deserialize(&mut de)?;
    Ok(found)
}

struct Picker<'w> {
    wanted: &'w [&'w str],
}

impl<'de> DeserializeSeed<'de> for Picker<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Picker<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.wanted.len()];
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match self.wanted.iter().position(|w| *w == key.as_str()) {
                Some(i) => found[i] = Some(map.next_value::<&RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A key, borrowed from the text unless it has escapes.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key::Owned(v.to_owned()))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn pointers_and_dotted_paths_find_the_same_place() {
        let doc = raw(r#"{"data": {"items": [{"id": 1}, {"id": 2}]}, "a/b": {"~": 3}}"#);
        let items = Selector::parse("/data/items").find(&doc).unwrap();
        assert_eq!(items.get(), r#"[{"id": 1}, {"id": 2}]"#);
        assert_eq!(Selector::parse("data.items").find(&doc).unwrap().get(), items.get());
        assert_eq!(Selector::parse("data.items.1").find(&doc).unwrap().get(), r#"{"id": 2}"#);
        assert_eq!(Selector::parse("/a~1b/~0").find(&doc).unwrap().get(), "3");
        assert_eq!(Selector::parse("").find(&doc).unwrap().get(), doc.get());
    }

    #[test]
    fn a_walk_off_the_document_finds_nothing() {
        let doc = raw(r#"{"data": {"items": [1]}, "n": 5}"#);
        for path in ["/data/missing", "data.items.3", "n.deeper", "/data/items/x"] {
            assert!(Selector::parse(path).find(&doc).is_none(), "{path}");
        }
        assert_eq!(keys(&doc), ["data", "n"]);
    }

    #[test]
    fn only_the_wanted_fields_are_picked() {
        let record = raw(r#"{"id": 7, "big": {"nested": [1, 2, 3]}, "upd\u0061ted": "2024-01-01", "x": null}"#);
        let found = fields(&record, &["updated", "id", "absent"]).unwrap();
        assert_eq!(found[0].unwrap().get(), r#""2024-01-01""#);
        assert_eq!(found[1].unwrap().get(), "7");
        assert!(found[2].is_none());
        assert!(fields(&raw("[1]"), &["id"]).is_err());
    }
}
