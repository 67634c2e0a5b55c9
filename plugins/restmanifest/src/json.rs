//! Finding things in a page without building it: a [`Page`] is parsed once
//! with its top level indexed, a [`Selector`] walks it level by level, and
//! [`fields`] picks a few fields out of a record. What is found stays a
//! slice of the page's text, so records are handed to the host as the
//! provider wrote them. Each walk re-reads only what lies below its first
//! step: a page's records, its total and its cursor cost one pass over the
//! page, not one each.

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
        self.steps.iter().try_fold(doc, |here, step| down(here, step))
    }

    /// What is at this place of `page`, as [`Selector::find`] says.
    pub fn find_in<'a>(&self, page: &Page<'a>) -> Option<&'a RawValue> {
        let Some((first, rest)) = self.steps.split_first() else { return page.whole() };
        let start = match &page.top {
            Some(top) => *top.get(first.as_str())?,
            None => down(page.whole()?, first)?,
        };
        rest.iter().try_fold(start, |here, step| down(here, step))
    }
}

/// One step into a value: a key of an object, an index of a list.
fn down<'a>(here: &'a RawValue, step: &str) -> Option<&'a RawValue> {
    match first_byte(here) {
        b'{' => serde_json::from_str::<HashMap<String, &RawValue>>(here.get()).ok()?.remove(step),
        b'[' => {
            let index: usize = step.parse().ok()?;
            serde_json::from_str::<Vec<&RawValue>>(here.get()).ok()?.get(index).copied()
        }
        _ => None,
    }
}

/// A page's body, checked to be JSON in one pass that also indexes its top
/// level when it is an object (the usual `{"data": [...], "meta": ...}`).
pub struct Page<'a> {
    text: &'a str,
    top: Option<HashMap<String, &'a RawValue>>,
    /// The body as one value, when it is no object.
    value: Option<&'a RawValue>,
}

impl<'a> Page<'a> {
    pub fn parse(text: &'a str) -> Result<Page<'a>, serde_json::Error> {
        if text.bytes().find(|b| !b.is_ascii_whitespace()) == Some(b'{') {
            Ok(Page { text, top: Some(serde_json::from_str(text)?), value: None })
        } else {
            Ok(Page { text, top: None, value: Some(serde_json::from_str(text)?) })
        }
    }

    /// The whole body as one value (read again for an object: only the
    /// empty selector on an object body asks, and it finds no list).
    fn whole(&self) -> Option<&'a RawValue> {
        self.value.or_else(|| serde_json::from_str(self.text).ok())
    }

    /// The top-level keys, sorted, at most 20: for an error that says
    /// what the page holds.
    pub fn keys(&self) -> Vec<String> {
        match &self.top {
            Some(top) => {
                let mut keys: Vec<String> = top.keys().cloned().collect();
                keys.sort();
                keys.truncate(20);
                keys
            }
            None => Vec::new(),
        }
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
        let text = doc.get().to_owned();
        let page = Page::parse(&text).unwrap();
        assert_eq!(page.keys(), ["data", "n"]);
        for path in ["/data/items", "data.items.0", "/n"] {
            assert_eq!(
                Selector::parse(path).find_in(&page).map(RawValue::get),
                Selector::parse(path).find(&doc).map(RawValue::get),
                "{path}"
            );
        }
        assert!(Selector::parse("/nothing").find_in(&page).is_none());
        let list = Page::parse("[{\"id\": 1}]").unwrap();
        assert_eq!(Selector::parse("").find_in(&list).unwrap().get(), "[{\"id\": 1}]");
        assert_eq!(Selector::parse("0.id").find_in(&list).unwrap().get(), "1");
        assert!(list.keys().is_empty());
        assert!(Page::parse("{\"a\": [1,}").is_err(), "a page that is not JSON is refused whole");
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
