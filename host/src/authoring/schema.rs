//! What the records say a stream's schema is, and where the schema the
//! plugin declares disagrees.
//!
//! Inference walks every recorded record: the JSON types each field held,
//! how often it was present, the fields of nested objects and the items
//! of arrays. The result is a JSON Schema per stream (`schemas.json` in a
//! cassette) and three kinds of disagreement with the declared one: a
//! field the declaration never names, a declared type a recorded value
//! contradicts, and a required field some record lacks. A record's
//! fields must be named in `properties` (`additionalProperties: true`
//! tolerates others, it does not declare them); below the record, an
//! object whose schema names no properties is a map whose keys are data,
//! and `additionalProperties` given as a schema declares the fields
//! `properties` does not name. Unions (`anyOf`, `oneOf`) and references
//! are taken as allowing anything below them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The kinds of disagreement between declared and recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DisagreementKind {
    /// Records hold a field the declared schema does not name.
    Undeclared,
    /// A recorded value has a type the declared schema does not allow.
    TypeMismatch,
    /// A field the declared schema requires is absent from some record.
    RequiredAbsent,
}

/// One place where records and declaration disagree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Disagreement {
    pub stream: String,
    /// `id`, `author.name`, `tags[]`.
    pub field: String,
    pub kind: DisagreementKind,
    /// What was seen, in words.
    pub detail: String,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {}, field {}: {}", self.stream, self.field, self.detail)
    }
}

/// What the records showed of one place in them.
#[derive(Debug, Default)]
struct Shape {
    /// Values seen here, by JSON type (`integer` apart from `number`).
    types: BTreeMap<&'static str, u64>,
    /// Fields of the objects seen here.
    fields: BTreeMap<String, Shape>,
    /// Items of the arrays seen here.
    items: Option<Box<Shape>>,
}

impl Shape {
    fn observe(&mut self, value: &Value) {
        *self.types.entry(type_of(value)).or_default() += 1;
        match value {
            Value::Object(fields) => {
                for (name, v) in fields {
                    self.fields.entry(name.clone()).or_default().observe(v);
                }
            }
            Value::Array(items) => {
                let shape = self.items.get_or_insert_with(Default::default);
                for item in items {
                    shape.observe(item);
                }
            }
            _ => {}
        }
    }

    fn seen(&self) -> u64 {
        self.types.values().sum()
    }

    fn objects(&self) -> u64 {
        self.types.get("object").copied().unwrap_or(0)
    }

    /// The JSON Schema of what was seen.
    fn schema(&self) -> Value {
        let mut types: Vec<&str> = self.types.keys().copied().collect();
        if types.contains(&"integer") && types.contains(&"number") {
            types.retain(|t| *t != "integer");
        }
        let mut schema = Map::new();
        match types.as_slice() {
            [] => {}
            [one] => {
                schema.insert("type".into(), json!(one));
            }
            many => {
                schema.insert("type".into(), json!(many));
            }
        }
        if self.objects() > 0 {
            let properties: Map<String, Value> = self.fields.iter().map(|(k, s)| (k.clone(), s.schema())).collect();
            let required: Vec<&String> =
                self.fields.iter().filter(|(_, s)| s.seen() >= self.objects()).map(|(k, _)| k).collect();
            schema.insert("properties".into(), Value::Object(properties));
            if !required.is_empty() {
                schema.insert("required".into(), json!(required));
            }
        }
        if let Some(items) = &self.items
            && items.seen() > 0
        {
            schema.insert("items".into(), items.schema());
        }
        Value::Object(schema)
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The schema inferred from `records`, and where `declared` disagrees.
pub(crate) fn infer<'a>(
    stream: &str,
    records: impl IntoIterator<Item = &'a Value>,
    declared: &Value,
) -> (Value, Vec<Disagreement>) {
    let mut shape = Shape::default();
    let mut count = 0u64;
    for record in records {
        shape.observe(record);
        count += 1;
    }
    let mut found = Vec::new();
    if count > 0 {
        compare(stream, "", &shape, declared, &mut found);
    }
    let mut schema = shape.schema();
    if let Value::Object(map) = &mut schema {
        map.insert("x-records".into(), json!(count));
    }
    found.sort();
    (schema, found)
}

/// Walks what was seen against what is declared.
fn compare(stream: &str, path: &str, seen: &Shape, declared: &Value, out: &mut Vec<Disagreement>) {
    let Value::Object(declared) = declared else {
        // `true` or nothing: anything goes.
        return;
    };
    if ["anyOf", "oneOf", "$ref", "not"].iter().any(|k| declared.contains_key(*k)) {
        return;
    }
    let field = if path.is_empty() { "(record)".to_owned() } else { path.to_owned() };
    let mut disagree = |kind, detail: String| {
        out.push(Disagreement { stream: stream.to_owned(), field: field.clone(), kind, detail });
    };
    let allowed: Option<Vec<&str>> = match declared.get("type") {
        Some(Value::String(t)) => Some(vec![t.as_str()]),
        Some(Value::Array(ts)) => Some(ts.iter().filter_map(Value::as_str).collect()),
        _ => None,
    };
    if let Some(allowed) = &allowed {
        for (ty, n) in &seen.types {
            let fits = allowed.contains(ty) || (*ty == "integer" && allowed.contains(&"number"));
            if !fits {
                disagree(
                    DisagreementKind::TypeMismatch,
                    format!("declared {}, but {n} of {} value(s) recorded are {ty}", allowed.join(" or "), seen.seen()),
                );
            }
        }
    }
    if seen.objects() > 0 {
        let properties = declared.get("properties").and_then(Value::as_object);
        let additional = declared.get("additionalProperties").filter(|a| a.is_object());
        // A record's fields are declared by name. Below it, an object
        // whose schema names no field is a map: its keys are data.
        let named = path.is_empty() || properties.is_some();
        for (name, shape) in &seen.fields {
            let below = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
            match (properties.and_then(|p| p.get(name)), additional) {
                (Some(schema), _) | (None, Some(schema)) => compare(stream, &below, shape, schema, out),
                (None, None) if !named => {}
                (None, None) => out.push(Disagreement {
                    stream: stream.to_owned(),
                    field: below,
                    kind: DisagreementKind::Undeclared,
                    detail: format!("not declared, but present in {} of {} record(s)", shape.seen(), seen.objects()),
                }),
            }
        }
        for name in declared.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            let present = seen.fields.get(name).map_or(0, Shape::seen);
            if present < seen.objects() {
                let below = if path.is_empty() { name.to_owned() } else { format!("{path}.{name}") };
                out.push(Disagreement {
                    stream: stream.to_owned(),
                    field: below,
                    kind: DisagreementKind::RequiredAbsent,
                    detail: format!(
                        "required, but absent from {} of {} record(s)",
                        seen.objects() - present,
                        seen.objects()
                    ),
                });
            }
        }
    }
    if let (Some(items), Some(declared_items)) = (&seen.items, declared.get("items")) {
        compare(stream, &format!("{path}[]"), items, declared_items, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(found: &[Disagreement]) -> Vec<(String, DisagreementKind)> {
        found.iter().map(|d| (d.field.clone(), d.kind)).collect()
    }

    #[test]
    fn agreeing_records_raise_nothing() {
        let declared = json!({ "type": "object", "required": ["id"], "properties": {
            "id": { "type": "integer" }, "score": { "type": "number" }, "tags": { "type": "array", "items": { "type": "string" } } } });
        let records = [json!({ "id": 1, "score": 2, "tags": ["a"] }), json!({ "id": 2, "score": 2.5, "tags": [] })];
        let (schema, found) = infer("s", &records, &declared);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(schema["properties"]["score"]["type"], "number", "integers and fractions make a number");
        assert_eq!(schema["required"], json!(["id", "score", "tags"]));
        assert_eq!(schema["x-records"], 2);
    }

    #[test]
    fn each_kind_of_disagreement_is_found_where_it_is() {
        let declared = json!({ "type": "object", "required": ["id", "title"], "properties": {
            "id": { "type": "integer" }, "title": { "type": "string" },
            "author": { "type": "object", "properties": { "name": { "type": "string" } } },
            "tags": { "type": "array", "items": { "type": "string" } } } });
        let records = [
            json!({ "id": "7", "title": "a", "author": { "name": "x", "email": "e" }, "tags": ["a", 3] }),
            json!({ "id": 8, "extra": true }),
        ];
        let (_, found) = infer("posts", &records, &declared);
        assert_eq!(
            kinds(&found),
            vec![
                ("author.email".into(), DisagreementKind::Undeclared),
                ("extra".into(), DisagreementKind::Undeclared),
                ("id".into(), DisagreementKind::TypeMismatch),
                ("tags[]".into(), DisagreementKind::TypeMismatch),
                ("title".into(), DisagreementKind::RequiredAbsent),
            ]
        );
        assert!(found[2].detail.contains("1 of 2"), "{}", found[2].detail);
    }

    #[test]
    fn records_name_their_fields_and_maps_below_them_need_not() {
        let declared = json!({ "type": "object", "additionalProperties": true, "properties": {
            "attributes": { "type": "object" }, "author": { "type": "object", "properties": {} } } });
        let (_, found) =
            infer("s", &[json!({ "attributes": { "plan": "pro" }, "author": { "name": "x" }, "html": "" })], &declared);
        assert_eq!(
            kinds(&found),
            vec![("author.name".into(), DisagreementKind::Undeclared), ("html".into(), DisagreementKind::Undeclared)]
        );
        let (_, found) = infer("s", &[json!({ "id": 1 })], &json!({ "type": "object" }));
        assert_eq!(kinds(&found), vec![("id".into(), DisagreementKind::Undeclared)], "a stream that declares nothing");
    }

    #[test]
    fn unions_and_schemas_for_additional_fields_are_respected() {
        let declared = json!({ "type": "object", "properties": { "v": { "anyOf": [{ "type": "string" }, { "type": "integer" }] } },
            "additionalProperties": { "type": "string" } });
        let (_, found) = infer("s", &[json!({ "v": 1, "free": "x", "other": 2 })], &declared);
        assert_eq!(kinds(&found), vec![("other".into(), DisagreementKind::TypeMismatch)]);
    }
}
