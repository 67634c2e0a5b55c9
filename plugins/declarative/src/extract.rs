//! Records out of a decoded page: the `DpathExtractor`'s `field_path`
//! (already interpolated), as the CDK reads it with `dpath`: a path
//! without `*` is followed to one value (a list is its records, another
//! truthy value is one record, anything missing or empty none); a path
//! with `*` segments collects every value at that depth, `*` matching
//! every key of an object and every item of a list.

use serde_json::Value;

/// The records `path` selects in `body`, in the order the page holds them.
pub fn records<'a>(body: &'a Value, path: &[String]) -> Vec<&'a Value> {
    let extracted: Vec<&Value> = if path.is_empty() {
        vec![body]
    } else if path.iter().any(|segment| segment == "*") {
        // dpath's `values` is a list, and each value found is one of its
        // records, as it is (a list, or null, too).
        let mut found = Vec::new();
        collect(body, path, &mut found);
        return found;
    } else {
        match follow(body, path) {
            Some(v) => vec![v],
            None => return Vec::new(),
        }
    };
    extracted.into_iter().flat_map(expand).collect()
}

/// What the CDK yields for one extracted value: a list's items, a truthy
/// value itself, nothing for a falsy one.
fn expand(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(items) => items.iter().collect(),
        Value::Null | Value::Bool(false) => Vec::new(),
        Value::Object(o) if o.is_empty() => Vec::new(),
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::Number(n) if n.as_f64() == Some(0.0) => Vec::new(),
        other => vec![other],
    }
}

/// The one value at `path` (list items by their index), if there is one.
fn follow<'a>(mut at: &'a Value, path: &[String]) -> Option<&'a Value> {
    for segment in path {
        at = step(at, segment)?;
    }
    Some(at)
}

fn step<'a>(at: &'a Value, segment: &str) -> Option<&'a Value> {
    match at {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    }
}

/// Every value at `path`, `*` matching each key or item at its level.
fn collect<'a>(at: &'a Value, path: &[String], out: &mut Vec<&'a Value>) {
    let Some((segment, rest)) = path.split_first() else {
        out.push(at);
        return;
    };
    if segment == "*" {
        match at {
            Value::Object(map) => map.values().for_each(|v| collect(v, rest, out)),
            Value::Array(items) => items.iter().for_each(|v| collect(v, rest, out)),
            _ => {}
        }
    } else if let Some(next) = step(at, segment) {
        collect(next, rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn paths_select_records_as_dpath_does() {
        let body = json!({ "data": [{ "id": 1 }, { "id": 2 }], "one": { "id": 3 }, "empty": {}, "none": null,
            "groups": [{ "items": [{ "id": 4 }] }, { "items": [{ "id": 5 }, { "id": 6 }] }], "byKey": { "a": { "id": 7 }, "b": { "id": 8 } } });
        let ids = |records: Vec<&Value>| records.iter().map(|r| r["id"].clone()).collect::<Vec<_>>();
        assert_eq!(ids(records(&body, &path(&["data"]))), [json!(1), json!(2)]);
        assert_eq!(ids(records(&body, &path(&["one"]))), [json!(3)]);
        assert!(records(&body, &path(&["empty"])).is_empty());
        assert!(records(&body, &path(&["none"])).is_empty());
        assert!(records(&body, &path(&["missing", "x"])).is_empty());
        assert_eq!(ids(records(&body, &path(&["data", "1"]))), [json!(2)]);
        assert_eq!(ids(records(&body, &path(&["byKey", "*"]))), [json!(7), json!(8)]);
        // Each value found is one record, a list too.
        let lists = records(&body, &path(&["groups", "*", "items"]));
        assert_eq!(lists.len(), 2);
        assert!(lists[1].is_array());
        assert_eq!(records(&json!([{ "id": 9 }]), &[]).len(), 1);
    }
}
