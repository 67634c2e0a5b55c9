//! Records out of a page's text, and the parts of it templates read,
//! without decoding more of the page than that.
//!
//! [`records`] is the `DpathExtractor`'s `field_path` (already
//! interpolated) as the CDK reads it with `dpath`, after its JSON
//! decoder: a page that is a JSON list is a stream of bodies, each
//! searched; text that is not JSON is an empty body; a path without `*`
//! is followed to one value (a list is its records, another truthy value
//! is one record, anything missing or empty none); a path with `*`
//! segments collects every value at that depth, `*` matching every key
//! of an object and every item of a list. The records stay the page's
//! text: a connector that only passes them on never decodes them.
//!
//! [`view`] is the response as the paginator's templates see it, decoded
//! only along the key paths they read ([`Reach`]).
//!
//! A page read for both is parsed once ([`Parsed`]): its first level
//! split into members in one pass over the text, which the records and
//! the view then share.
//!
//! Objects are read as Python's `json` reads them: keys in the order
//! written, a repeated key in its first place with its last value.

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::interpolation::{Reach, Val};

/// The records `path` selects in `page`, in the order the page holds them.
pub fn records<'a>(page: &'a str, path: &[String]) -> Vec<&'a RawValue> {
    Parsed::parse(page, path).records(path)
}

/// A page's text with its first level split into members (an object's
/// entries, a list's items), read once; where the records are a list
/// one key down (`field_path: ["data"]`), its items are split in the
/// same pass.
pub struct Parsed<'a> {
    text: &'a str,
    top: Top<'a>,
}

/// A page's first level.
enum Top<'a> {
    Object(Vec<(String, Member<'a>)>),
    List(Vec<&'a RawValue>),
    Other,
}

/// A member of the page's object.
enum Member<'a> {
    Raw(&'a RawValue),
    /// The list of records, split into its items as the page was read:
    /// its text (`[]` when empty) and items.
    Items {
        text: &'a str,
        items: Vec<&'a RawValue>,
    },
}

impl<'a> Member<'a> {
    /// The member as one value (a list of items is read again for it).
    fn raw(&self) -> Option<&'a RawValue> {
        match self {
            Member::Raw(raw) => Some(raw),
            Member::Items { text, .. } => serde_json::from_str(text).ok(),
        }
    }
}

impl<'a> Parsed<'a> {
    /// Splits the first level of `page` (nothing when it is not a JSON
    /// object or list), and the list of records `path` selects when it
    /// is one key down.
    pub fn parse(page: &'a str, path: &[String]) -> Parsed<'a> {
        if !matches!(page.trim_start().as_bytes().first(), Some(b'{' | b'[')) {
            return Parsed { text: page, top: Top::Other };
        }
        let read = |records: Option<&str>| {
            let mut de = serde_json::Deserializer::from_str(page);
            de.deserialize_any(TopVisitor { page, records }).and_then(|top| de.end().map(|()| top))
        };
        let records = match path {
            [key] if key != "*" => Some(key.as_str()),
            _ => None,
        };
        // Where the records' key holds no list, the page is read again
        // without splitting it.
        let top = read(records).or_else(|_| if records.is_some() { read(None) } else { Ok(Top::Other) });
        Parsed { text: page, top: top.unwrap_or(Top::Other) }
    }

    /// The records `path` selects, in the order the page holds them.
    pub fn records(&self, path: &[String]) -> Vec<&'a RawValue> {
        match &self.top {
            Top::List(bodies) => bodies.iter().flat_map(|b| select(b, path)).collect(),
            Top::Object(entries) if !path.is_empty() => {
                let (segment, rest) = (&path[0], &path[1..]);
                if let ([], Some((_, Member::Items { items, .. }))) = (rest, entries.iter().find(|(k, _)| k == segment))
                {
                    return items.clone();
                }
                let mut found = Vec::new();
                let members: Vec<&'a RawValue> = match segment.as_str() {
                    "*" => entries.iter().filter_map(|(_, v)| v.raw()).collect(),
                    key => entries.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.raw()).into_iter().collect(),
                };
                let wildcard = path.iter().any(|s| s == "*");
                for member in members {
                    if wildcard {
                        collect(member, rest, &mut found);
                    } else {
                        found.extend(select(member, rest));
                    }
                }
                found
            }
            // The whole page (or a scalar, or text that is not JSON).
            _ => root(self.text).map_or_else(Vec::new, |body| select(body, path)),
        }
    }

    /// The response as templates reading `reach` of it see it, as [`view`].
    pub fn view(&self, reach: &Reach) -> Val {
        let empty = || Val::Dict(Vec::new());
        let whole = || serde_json::from_str(self.text).unwrap_or_else(|_| empty());
        match reach {
            Reach::Nothing => empty(),
            Reach::Whole => whole(),
            Reach::Paths(paths) => {
                let paths: Vec<&[String]> = paths.iter().map(Vec::as_slice).collect();
                match &self.top {
                    Top::Object(entries) if !paths.iter().any(|p| p.is_empty()) => pruned_members(entries, &paths),
                    _ => root(self.text).map_or_else(empty, |body| pruned(body, &paths)),
                }
            }
        }
    }
}

/// The response as templates reading `reach` of it see it: the decoded
/// page where they read all of it, else an object holding only the
/// values at their key paths (an empty object for a page that is not
/// JSON, or that nothing reads).
pub fn view(page: &str, reach: &Reach) -> Val {
    Parsed::parse(page, &[]).view(reach)
}

/// The page as one JSON value, if it is one.
fn root(page: &str) -> Option<&RawValue> {
    serde_json::from_str::<&RawValue>(page).ok()
}

/// The value at `paths` of `raw`, decoded where a path ends (or meets
/// anything but an object), left out where no path goes.
fn pruned(raw: &RawValue, paths: &[&[String]]) -> Val {
    let whole = || serde_json::from_str(raw.get()).unwrap_or(Val::None);
    if paths.iter().any(|p| p.is_empty()) {
        return whole();
    }
    match level(raw) {
        Level::Object(entries) => pruned_entries(&entries, paths),
        _ => whole(),
    }
}

/// An object's entries at `paths` (none empty), as [`pruned`].
fn pruned_entries(entries: &[(String, &RawValue)], paths: &[&[String]]) -> Val {
    Val::Dict(
        entries
            .iter()
            .filter_map(|(key, value)| {
                let below: Vec<&[String]> = paths.iter().filter(|p| p[0] == *key).map(|p| &p[1..]).collect();
                (!below.is_empty()).then(|| (key.clone(), pruned(value, &below)))
            })
            .collect(),
    )
}

/// The page's members at `paths` (none empty), as [`pruned`].
fn pruned_members(entries: &[(String, Member)], paths: &[&[String]]) -> Val {
    Val::Dict(
        entries
            .iter()
            .filter_map(|(key, member)| {
                let below: Vec<&[String]> = paths.iter().filter(|p| p[0] == *key).map(|p| &p[1..]).collect();
                (!below.is_empty()).then(|| {
                    let value = match member {
                        Member::Raw(raw) => pruned(raw, &below),
                        // A list is read whole wherever a path meets it.
                        Member::Items { text, .. } => serde_json::from_str(text).unwrap_or(Val::None),
                    };
                    (key.clone(), value)
                })
            })
            .collect(),
    )
}

/// The records of one body.
fn select<'a>(body: &'a RawValue, path: &[String]) -> Vec<&'a RawValue> {
    if path.iter().any(|segment| segment == "*") {
        // dpath's `values` is a list, and each value found is one of its
        // records, as it is (a list, or null, too).
        let mut found = Vec::new();
        collect(body, path, &mut found);
        return found;
    }
    let mut at = body;
    for segment in path {
        match step(at, segment) {
            Some(next) => at = next,
            None => return Vec::new(),
        }
    }
    expand(at)
}

/// What the CDK yields for one extracted value: a list's items, a truthy
/// value itself, nothing for a falsy one.
fn expand(v: &RawValue) -> Vec<&RawValue> {
    let text = v.get();
    match text.as_bytes().first() {
        Some(b'[') => match level(v) {
            Level::List(items) => items,
            _ => Vec::new(),
        },
        Some(b'n' | b'f') => Vec::new(),
        Some(b'{') if text[1..].trim_start().starts_with('}') => Vec::new(),
        Some(b'"') if text == "\"\"" => Vec::new(),
        Some(b'-' | b'0'..=b'9') if text.parse::<f64>().is_ok_and(|n| n == 0.0) => Vec::new(),
        _ => vec![v],
    }
}

/// The member `segment` of an object, or the item at that index of a list.
fn step<'a>(at: &'a RawValue, segment: &str) -> Option<&'a RawValue> {
    match level(at) {
        Level::Object(entries) => entries.into_iter().find(|(k, _)| k == segment).map(|(_, v)| v),
        Level::List(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i).copied()),
        Level::Other => None,
    }
}

/// Every value at `path`, `*` matching each key or item at its level.
fn collect<'a>(at: &'a RawValue, path: &[String], out: &mut Vec<&'a RawValue>) {
    let Some((segment, rest)) = path.split_first() else {
        out.push(at);
        return;
    };
    if segment == "*" {
        match level(at) {
            Level::Object(entries) => entries.into_iter().for_each(|(_, v)| collect(v, rest, out)),
            Level::List(items) => items.into_iter().for_each(|v| collect(v, rest, out)),
            Level::Other => {}
        }
    } else if let Some(next) = step(at, segment) {
        collect(next, rest, out);
    }
}

/// One level of a JSON value, its members still text.
enum Level<'a> {
    /// Keys in the order written; a repeated key keeps its first place
    /// and its last value.
    Object(Vec<(String, &'a RawValue)>),
    List(Vec<&'a RawValue>),
    Other,
}

fn level(raw: &RawValue) -> Level<'_> {
    match raw.get().as_bytes().first() {
        Some(b'{' | b'[') => {
            serde_json::Deserializer::from_str(raw.get()).deserialize_any(LevelVisitor).unwrap_or(Level::Other)
        }
        _ => Level::Other,
    }
}

struct LevelVisitor;

impl<'de> Visitor<'de> for LevelVisitor {
    type Value = Level<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object or list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Level<'de>, A::Error> {
        let mut entries: Vec<(String, &'de RawValue)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, &'de RawValue>()? {
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(Level::Object(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Level<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            items.push(item);
        }
        Ok(Level::List(items))
    }
}

/// Reads a page's first level, splitting the list at `records` (a key)
/// into its items in the same pass.
struct TopVisitor<'p, 'k> {
    page: &'p str,
    records: Option<&'k str>,
}

impl<'de> Visitor<'de> for TopVisitor<'de, '_> {
    type Value = Top<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object or list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        let mut entries: Vec<(String, Member<'de>)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = if self.records == Some(key.as_str()) {
                let items = map.next_value_seed(ItemsSeed)?;
                Member::Items { text: list_text(self.page, &items), items }
            } else {
                Member::Raw(map.next_value::<&'de RawValue>()?)
            };
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(Top::Object(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top<'de>, A::Error> {
        match LevelVisitor.visit_seq(seq)? {
            Level::List(items) => Ok(Top::List(items)),
            _ => Ok(Top::Other),
        }
    }
}

/// The items of a list; anything else is an error (the page is then read
/// without splitting).
struct ItemsSeed;

impl<'de> serde::de::DeserializeSeed<'de> for ItemsSeed {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        match deserializer.deserialize_seq(LevelVisitor)? {
            Level::List(items) => Ok(items),
            _ => Err(serde::de::Error::custom("not a list")),
        }
    }
}

/// The text of the list of `items` in `page`: from the `[` before the
/// first to the `]` after the last (only JSON whitespace lies between).
fn list_text<'a>(page: &'a str, items: &[&'a RawValue]) -> &'a str {
    let (Some(first), Some(last)) = (items.first(), items.last()) else { return "[]" };
    let offset = |item: &str| item.as_ptr() as usize - page.as_ptr() as usize;
    let start = page[..offset(first.get())].rfind('[').unwrap_or(0);
    let end = offset(last.get()) + last.get().len();
    let end = end + page[end..].find(']').map_or(0, |i| i + 1);
    &page[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    fn decoded(records: Vec<&RawValue>) -> Vec<Value> {
        records.iter().map(|r| serde_json::from_str(r.get()).unwrap()).collect()
    }

    #[test]
    fn paths_select_records_as_dpath_does() {
        let body = json!({ "data": [{ "id": 1 }, { "id": 2 }], "one": { "id": 3 }, "empty": {}, "none": null,
            "groups": [{ "items": [{ "id": 4 }] }, { "items": [{ "id": 5 }, { "id": 6 }] }], "zero": 0.0, "blank": "", "no": false })
        .to_string();
        let ids = |records: Vec<&RawValue>| decoded(records).iter().map(|r| r["id"].clone()).collect::<Vec<_>>();
        assert_eq!(ids(records(&body, &path(&["data"]))), [json!(1), json!(2)]);
        assert_eq!(ids(records(&body, &path(&["one"]))), [json!(3)]);
        for falsy in ["empty", "none", "zero", "blank", "no"] {
            assert!(records(&body, &path(&[falsy])).is_empty(), "{falsy}");
        }
        assert!(records(&body, &path(&["missing", "x"])).is_empty());
        assert_eq!(ids(records(&body, &path(&["data", "1"]))), [json!(2)]);
        // Keys in the order written, as Python's dicts keep them.
        let by_key = r#"{"byKey": {"b": {"id": 7}, "a": {"id": 8}}}"#;
        assert_eq!(ids(records(by_key, &path(&["byKey", "*"]))), [json!(7), json!(8)]);
        // Each value found is one record, a list too.
        let lists = records(&body, &path(&["groups", "*", "items"]));
        assert_eq!(lists.len(), 2);
        assert!(decoded(lists)[1].is_array());
    }

    #[test]
    fn a_list_is_a_stream_of_bodies_and_text_that_is_not_json_an_empty_one() {
        let page = r#"[{"data": [{"id": 1}]}, {"data": [{"id": 2}, {"id": 3}]}]"#;
        assert_eq!(records(page, &path(&["data"])).len(), 3);
        assert_eq!(records(r#"[{"id": 9}, {}]"#, &[]).len(), 1);
        assert!(records("not json", &[]).is_empty());
        assert!(records("  ", &path(&["data"])).is_empty());
        // The records are the page's own text.
        assert_eq!(records(r#"{"data": [ {"b": 1,  "a": 2} ]}"#, &path(&["data"]))[0].get(), r#"{"b": 1,  "a": 2}"#);
        // A repeated key: its last value.
        assert_eq!(records(r#"{"data": [1], "data": [{"id": 4}]}"#, &path(&["data"])).len(), 1);
    }

    #[test]
    fn a_view_decodes_only_the_paths_read() {
        let page = r#"{"data": [{"id": 1}], "meta": {"next": "b", "size": 3}, "links": {"self": "x"}}"#;
        let reach = Reach::Paths(vec![path(&["meta", "next"]), path(&["links"])]);
        assert_eq!(
            view(page, &reach),
            Val::Dict(vec![
                ("meta".into(), Val::Dict(vec![("next".into(), Val::Str("b".into()))])),
                ("links".into(), Val::Dict(vec![("self".into(), Val::Str("x".into()))])),
            ])
        );
        // Through a list, the list whole.
        let reach = Reach::Paths(vec![path(&["data", "0", "id"])]);
        assert_eq!(view(page, &reach).get("data"), Some(&Val::List(vec![Val::Dict(vec![("id".into(), Val::Int(1))])])));
        assert_eq!(view(page, &Reach::Whole), serde_json::from_str::<Val>(page).unwrap());
        assert_eq!(view(page, &Reach::Nothing), Val::Dict(Vec::new()));
        assert_eq!(view("<html>", &Reach::Whole), Val::Dict(Vec::new()));
        assert_eq!(view("[1, 2]", &Reach::Paths(vec![path(&["x"])])), Val::List(vec![Val::Int(1), Val::Int(2)]));
    }

    #[test]
    fn a_records_list_split_while_the_page_is_read_gives_what_reading_it_again_gives() {
        let pages = [
            "{\"data\" : \n [ {\"id\": 1} ,\t{\"id\": [2, \"]\"]} \r\n] , \"next\": \"b\"}",
            r#"{"data": [], "next": null}"#,
            r#"{"data": {"id": 3}, "next": "c"}"#,
            r#"{"data": null}"#,
            r#"{"data": [{"id": 4}], "data": {"id": 5}}"#,
            r#"{"data": {"id": 6}, "data": [{"id": 7}, {"id": 8}]}"#,
            r#"{"data": [1, 2"#,
        ];
        let reach = Reach::Paths(vec![path(&["data"]), path(&["next"])]);
        for page in pages {
            let (split, whole) = (Parsed::parse(page, &path(&["data"])), Parsed::parse(page, &[]));
            for p in [path(&["data"]), path(&["*"]), path(&["data", "0"]), path(&["next"])] {
                assert_eq!(decoded(split.records(&p)), decoded(whole.records(&p)), "{page} {p:?}");
            }
            assert_eq!(split.view(&reach), whole.view(&reach), "{page}");
            assert_eq!(split.view(&Reach::Whole), whole.view(&Reach::Whole), "{page}");
        }
        // The split list's text is the page's, brackets and all.
        let split = Parsed::parse(pages[0], &path(&["data"]));
        let Top::Object(entries) = &split.top else { panic!("an object") };
        let Member::Items { text, items } = &entries[0].1 else { panic!("split") };
        assert_eq!((*text, items.len()), ("[ {\"id\": 1} ,\t{\"id\": [2, \"]\"]} \r\n]", 2));
    }
}
