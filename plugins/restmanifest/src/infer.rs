//! A stream's schema when the manifest declares none: the top-level fields
//! of the first page's records and the JSON types they held, marked as
//! inferred so nobody takes it for a declaration.

use std::collections::BTreeMap;

use connector_sdk::{Value, json};
use serde_json::value::RawValue;

/// Records of the first page looked at, at most.
const SAMPLE: usize = 100;

/// The schema the first records of a stream show.
pub fn schema(records: &[&RawValue]) -> Value {
    let mut fields: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut seen = 0usize;
    for record in records.iter().take(SAMPLE) {
        let Ok(Value::Object(record)) = serde_json::from_str::<Value>(record.get()) else { continue };
        seen += 1;
        for (name, value) in record {
            let types = fields.entry(name).or_default();
            let ty = match value {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            if !types.contains(&ty) {
                types.push(ty);
            }
        }
    }
    let properties: serde_json::Map<String, Value> = fields
        .into_iter()
        .map(|(name, mut types)| {
            if types.contains(&"number") {
                types.retain(|t| *t != "integer");
            }
            types.sort_unstable();
            let ty = if types.len() == 1 { json!(types[0]) } else { json!(types) };
            (name, json!({ "type": ty }))
        })
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "x-inferred": true,
        "description": format!(
            "Inferred from {seen} record(s) of the first page: the manifest declares no schema for this stream. Declare one (`schema`) to fix the fields and their types."
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_gathered_per_field_and_marked_inferred() {
        let texts = [r#"{"id": 1, "name": "a", "score": 2}"#, r#"{"id": 2, "name": null, "score": 2.5, "tags": []}"#];
        let records: Vec<Box<RawValue>> =
            texts.iter().map(|t| RawValue::from_string((*t).to_owned()).unwrap()).collect();
        let refs: Vec<&RawValue> = records.iter().map(AsRef::as_ref).collect();
        let s = schema(&refs);
        assert_eq!(s["x-inferred"], true);
        assert_eq!(s["properties"]["id"]["type"], "integer");
        assert_eq!(s["properties"]["name"]["type"], json!(["null", "string"]));
        assert_eq!(s["properties"]["score"]["type"], "number");
        assert_eq!(s["properties"]["tags"]["type"], "array");
    }
}
