//! A stream's JSON Schema as an Iceberg table's columns, and a table's
//! schema evolved to take a stream's new schema where Iceberg allows it.
//!
//! The types come from the stream's declared schema, never from the
//! values a sync happens to see:
//!
//! | JSON Schema | Iceberg |
//! |---|---|
//! | `integer` (`format: int32`) | `long` (`int`) |
//! | `number` (`format: float`) | `double` (`float`) |
//! | `format: decimal`, `precision` (default 38), `scale` (default 9) | `decimal(p,s)` |
//! | `string`, `format: date-time` | `timestamptz` (µs) |
//! | `string`, `format: local-date-time` | `timestamp` (µs) |
//! | `string`, `format: date` | `date` |
//! | `boolean` | `boolean` |
//! | `object` with `properties` and `additionalProperties: false` | `struct` |
//! | `array` with `items` | `list` of the items' type |
//! | anything else | `string` holding the value's JSON text |
//!
//! "Anything else" is where a value's shape may vary: an object that
//! admits fields it does not declare, an array with no `items`, a union of
//! two non-null types, or no type at all. `null` beside one type (`["string",
//! "null"]`) is that type; every column is optional.
//!
//! The top level is the exception to the object rule: the stream's
//! declared properties are the table's columns, and the fields a record
//! holds beyond them are kept together, as a JSON object, in
//! `_service_unmapped` (so nothing is dropped, and a field a later schema
//! declares gets a column from then on).

use iceberg::spec::{
    ListType, NestedField, NestedFieldRef, PartitionSpec, PrimitiveType, Schema, StructType, Transform, Type,
    UnboundPartitionSpec,
};

use super::super::config::PartitionField;
use super::super::decimal::DecimalType;
use serde_json::Value;

/// The columns every table starts with, before the stream's own.
pub(super) const METADATA_COLUMNS: [(&str, PrimitiveType); 4] = [
    ("_service_raw_id", PrimitiveType::String),
    ("_service_extracted_at", PrimitiveType::Timestamptz),
    ("_service_meta", PrimitiveType::String),
    ("_service_unmapped", PrimitiveType::String),
];

/// A column's type as a stream's schema declares it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Primitive(PrimitiveType),
    Struct(Vec<(String, Kind)>),
    List(Box<Kind>),
}

/// Why a stream's schema cannot be a table's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SchemaError {
    /// The stream's schema declares something no column can hold.
    #[error("the stream's schema is not usable: {0}")]
    Invalid(String),
    /// The table holds a field whose type the new schema changes in a way
    /// Iceberg cannot promote.
    #[error(
        "schema change refused: field {field} is {table} in the table and {stream} in the stream's schema, which Iceberg cannot promote (a full refresh or a reset writes the table anew)"
    )]
    Incompatible { field: String, table: String, stream: String },
}

/// The columns a stream's JSON Schema declares, in its order.
pub(super) fn columns(schema: &Value) -> Result<Vec<(String, Kind)>, SchemaError> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(Vec::new()) };
    properties
        .iter()
        .filter(|(name, _)| !name.starts_with("_service_"))
        .map(|(name, s)| Ok((name.clone(), kind(s).map_err(|m| SchemaError::Invalid(format!("{name}: {m}")))?)))
        .collect()
}

/// The Iceberg type of a value schema (see the module documentation).
fn kind(schema: &Value) -> Result<Kind, String> {
    let json_text = Ok(Kind::Primitive(PrimitiveType::String));
    let Some(obj) = schema.as_object() else { return json_text };
    let format = obj.get("format").and_then(Value::as_str);
    if let Some(declared) = DecimalType::declared(schema) {
        return declared.map(decimal).map_err(|e| e.to_string());
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
    let [one] = types.as_slice() else { return json_text };
    Ok(match (*one, format) {
        ("integer", Some("int32")) => Kind::Primitive(PrimitiveType::Int),
        ("integer", _) => Kind::Primitive(PrimitiveType::Long),
        ("number", Some("float")) => Kind::Primitive(PrimitiveType::Float),
        ("number", _) => Kind::Primitive(PrimitiveType::Double),
        ("boolean", _) => Kind::Primitive(PrimitiveType::Boolean),
        ("string", Some("date-time")) => Kind::Primitive(PrimitiveType::Timestamptz),
        ("string", Some("local-date-time")) => Kind::Primitive(PrimitiveType::Timestamp),
        ("string", Some("date")) => Kind::Primitive(PrimitiveType::Date),
        ("object", _) => match (obj.get("properties").and_then(Value::as_object), obj.get("additionalProperties")) {
            (Some(properties), Some(Value::Bool(false))) => Kind::Struct(
                properties
                    .iter()
                    .map(|(name, s)| Ok((name.clone(), kind(s).map_err(|m| format!("{name}: {m}"))?)))
                    .collect::<Result<_, String>>()?,
            ),
            _ => return json_text,
        },
        ("array", _) => match obj.get("items") {
            Some(items) if items.is_object() => Kind::List(Box::new(kind(items)?)),
            _ => return json_text,
        },
        _ => return json_text,
    })
}

fn decimal(declared: DecimalType) -> Kind {
    let (precision, scale) = (declared.precision as u32, declared.scale as u32);
    Kind::Primitive(PrimitiveType::Decimal { precision, scale })
}

/// A new table's schema: the metadata columns, then the stream's (ids are
/// assigned again when the table is created).
pub(super) fn new_table(columns: &[(String, Kind)]) -> Result<Schema, SchemaError> {
    let mut ids = Ids(0);
    let mut fields: Vec<NestedFieldRef> = METADATA_COLUMNS
        .iter()
        .map(|(name, t)| NestedField::optional(ids.next(), *name, Type::Primitive(t.clone())).into())
        .collect();
    fields.extend(columns.iter().map(|(name, kind)| field(&mut ids, name, kind)));
    build(fields)
}

/// The table's schema evolved to take `columns`: new fields added (at any
/// depth), types widened where Iceberg promotes them (int to long, float to
/// double, a decimal's precision up), fields the stream no longer declares
/// kept. `None` when the table takes them as it is.
pub(super) fn evolve(
    current: &Schema,
    last_column_id: i32,
    columns: &[(String, Kind)],
) -> Result<Option<Schema>, SchemaError> {
    let mut ids = Ids(last_column_id.max(current.highest_field_id()));
    let fields = merge_fields("", current.as_struct().fields(), columns, &mut ids)?;
    let evolved = build(fields)?;
    Ok((evolved.as_struct() != current.as_struct()).then_some(evolved))
}

/// The table's schema with its top-level columns `wider` promoted to
/// those types as Iceberg promotes them (a column wider already stays as
/// it is). `None` when no column changes.
pub(super) fn widened(current: &Schema, wider: &[(String, PrimitiveType)]) -> Result<Option<Schema>, SchemaError> {
    let mut ids = Ids(current.highest_field_id());
    let fields = current
        .as_struct()
        .fields()
        .iter()
        .map(|f| match wider.iter().find(|(name, _)| *name == f.name) {
            Some((_, want)) => {
                let t = merge_type(&f.name, &f.field_type, &Kind::Primitive(want.clone()), &mut ids)?;
                Ok(NestedField::new(f.id, &f.name, t, f.required).into())
            }
            None => Ok(f.clone()),
        })
        .collect::<Result<Vec<NestedFieldRef>, SchemaError>>()?;
    let widened = build(fields)?;
    Ok((widened.as_struct() != current.as_struct()).then_some(widened))
}

/// The partition spec `fields` make of `schema`'s columns. Each partition
/// field is named after its column and transform (`updated_at_day`,
/// `id_bucket_16`; an identity partition after its column).
pub(super) fn partition_spec(schema: &Schema, fields: &[PartitionField]) -> Result<UnboundPartitionSpec, SchemaError> {
    let mut spec = UnboundPartitionSpec::builder();
    for PartitionField { field, transform } in fields {
        let invalid = |m: String| SchemaError::Invalid(format!("partition field {field}: {m}"));
        let source = schema.field_by_name(field).ok_or_else(|| invalid("the stream has no such column".into()))?;
        transform
            .result_type(&source.field_type)
            .map_err(|_| invalid(format!("{transform} does not apply to a {} column", source.field_type)))?;
        let name = match transform {
            Transform::Identity => field.clone(),
            other => format!("{field}_{}", other.to_string().replace(['[', ']'], "_").trim_end_matches('_')),
        };
        spec = spec.add_partition_field(source.id, name, *transform).map_err(|e| invalid(e.to_string()))?;
    }
    Ok(spec.build())
}

/// Whether a table's partition spec is the one wanted.
pub(super) fn same_spec(current: &PartitionSpec, wanted: &UnboundPartitionSpec) -> bool {
    let current: Vec<_> = current.fields().iter().map(|f| (f.source_id, f.transform)).collect();
    let wanted: Vec<_> = wanted.fields().iter().map(|f| (f.source_id, f.transform)).collect();
    current == wanted
}

struct Ids(i32);

impl Ids {
    fn next(&mut self) -> i32 {
        self.0 += 1;
        self.0
    }
}

fn build(fields: Vec<NestedFieldRef>) -> Result<Schema, SchemaError> {
    Schema::builder().with_fields(fields).build().map_err(|e| SchemaError::Invalid(e.to_string()))
}

fn field(ids: &mut Ids, name: &str, kind: &Kind) -> NestedFieldRef {
    let id = ids.next();
    NestedField::optional(id, name, iceberg_type(ids, kind)).into()
}

fn iceberg_type(ids: &mut Ids, kind: &Kind) -> Type {
    match kind {
        Kind::Primitive(p) => Type::Primitive(p.clone()),
        Kind::Struct(fields) => Type::Struct(StructType::new(fields.iter().map(|(n, k)| field(ids, n, k)).collect())),
        Kind::List(element) => {
            let id = ids.next();
            Type::List(ListType::new(NestedField::list_element(id, iceberg_type(ids, element), false).into()))
        }
    }
}

fn merge_fields(
    path: &str,
    existing: &[NestedFieldRef],
    wanted: &[(String, Kind)],
    ids: &mut Ids,
) -> Result<Vec<NestedFieldRef>, SchemaError> {
    let mut out = Vec::with_capacity(existing.len() + wanted.len());
    for f in existing {
        let merged = match wanted.iter().find(|(name, _)| *name == f.name) {
            Some((_, kind)) => {
                let t = merge_type(&format!("{path}{}", f.name), &f.field_type, kind, ids)?;
                NestedField::new(f.id, &f.name, t, f.required).into()
            }
            None => f.clone(),
        };
        out.push(merged);
    }
    for (name, kind) in wanted.iter().filter(|(name, _)| !existing.iter().any(|f| f.name == *name)) {
        out.push(field(ids, name, kind));
    }
    Ok(out)
}

fn merge_type(path: &str, existing: &Type, wanted: &Kind, ids: &mut Ids) -> Result<Type, SchemaError> {
    use PrimitiveType::{Decimal, Double, Float, Int, Long};
    let refused = || SchemaError::Incompatible {
        field: path.to_owned(),
        table: existing.to_string(),
        stream: iceberg_type(&mut Ids(0), wanted).to_string(),
    };
    Ok(match (existing, wanted) {
        (Type::Primitive(have), Kind::Primitive(want)) => match (have, want) {
            _ if have == want => existing.clone(),
            // Widened: promoted in place.
            (Int, Long) | (Float, Double) => Type::Primitive(want.clone()),
            (Decimal { precision: p1, scale: s1 }, Decimal { precision: p2, scale: s2 }) if s1 == s2 && p2 > p1 => {
                Type::Primitive(want.clone())
            }
            // Narrowed: the wider column still holds every value.
            (Long, Int) | (Double, Float) => existing.clone(),
            (Decimal { precision: p1, scale: s1 }, Decimal { precision: p2, scale: s2 }) if s1 == s2 && p2 < p1 => {
                existing.clone()
            }
            _ => return Err(refused()),
        },
        (Type::Struct(have), Kind::Struct(want)) => {
            Type::Struct(StructType::new(merge_fields(&format!("{path}."), have.fields(), want, ids)?))
        }
        (Type::List(have), Kind::List(want)) => {
            let element = &have.element_field;
            let t = merge_type(&format!("{path}[]"), &element.field_type, want, ids)?;
            Type::List(ListType::new(NestedField::list_element(element.id, t, element.required).into()))
        }
        _ => return Err(refused()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(properties: Value) -> Vec<(String, Kind)> {
        columns(&json!({ "type": "object", "properties": properties })).unwrap()
    }

    #[test]
    fn each_declared_type_has_its_column_and_varying_shapes_are_json_text() {
        let cols = stream(json!({
            "id": { "type": "integer" },
            "small": { "type": ["integer", "null"], "format": "int32" },
            "ratio": { "type": "number" },
            "price": { "type": ["string", "number", "null"], "format": "decimal", "precision": 38, "scale": 9 },
            "at": { "type": "string", "format": "date-time" },
            "local": { "type": "string", "format": "local-date-time" },
            "day": { "type": "string", "format": "date" },
            "ok": { "type": "boolean" },
            "closed": { "type": "object", "additionalProperties": false, "properties": { "a": { "type": "integer" } } },
            "open": { "type": "object", "properties": { "a": { "type": "integer" } } },
            "tags": { "type": "array", "items": { "type": "string" } },
            "anything": { "type": "array" },
            "either": { "type": ["string", "integer"] },
            "untyped": {},
            "_service_meta": { "type": "string" },
        }));
        let of = |name: &str| cols.iter().find(|(n, _)| n == name).map(|(_, k)| k.clone());
        let p = Kind::Primitive;
        assert_eq!(of("id"), Some(p(PrimitiveType::Long)));
        assert_eq!(of("small"), Some(p(PrimitiveType::Int)));
        assert_eq!(of("ratio"), Some(p(PrimitiveType::Double)));
        assert_eq!(of("price"), Some(p(PrimitiveType::Decimal { precision: 38, scale: 9 })));
        assert_eq!(of("at"), Some(p(PrimitiveType::Timestamptz)));
        assert_eq!(of("local"), Some(p(PrimitiveType::Timestamp)));
        assert_eq!(of("day"), Some(p(PrimitiveType::Date)));
        assert_eq!(of("ok"), Some(p(PrimitiveType::Boolean)));
        assert_eq!(of("closed"), Some(Kind::Struct(vec![("a".into(), p(PrimitiveType::Long))])));
        assert_eq!(of("tags"), Some(Kind::List(Box::new(p(PrimitiveType::String)))));
        for text in ["open", "anything", "either", "untyped"] {
            assert_eq!(of(text), Some(p(PrimitiveType::String)), "{text} is JSON text");
        }
        assert_eq!(of("_service_meta"), None, "reserved names are the service's");
        let bad = columns(&json!({ "properties": { "x": { "format": "decimal", "precision": 39 } } }));
        assert!(matches!(bad, Err(SchemaError::Invalid(m)) if m.contains("x: decimal(39,9)")));
    }

    #[test]
    fn partition_fields_are_named_after_their_column_and_must_fit_its_type() {
        let table = new_table(&stream(json!({
            "at": { "type": "string", "format": "date-time" },
            "id": { "type": "integer" },
            "kind": { "type": "string" },
        })))
        .unwrap();
        let field = |field: &str, transform: Transform| PartitionField { field: field.into(), transform };
        let spec = partition_spec(
            &table,
            &[field("at", Transform::Day), field("id", Transform::Bucket(16)), field("kind", Transform::Identity)],
        )
        .unwrap();
        let names: Vec<&str> = spec.fields().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["at_day", "id_bucket_16", "kind"]);
        assert_eq!(spec.fields()[0].source_id, table.field_by_name("at").unwrap().id);
        for (bad, why) in [
            (field("kind", Transform::Day), "day does not apply to a string column"),
            (field("nope", Transform::Identity), "the stream has no such column"),
        ] {
            match partition_spec(&table, &[bad]) {
                Err(SchemaError::Invalid(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_table_takes_new_fields_and_widened_types_and_refuses_the_rest() {
        let v1 = stream(json!({
            "n": { "type": "integer", "format": "int32" },
            "f": { "type": "number", "format": "float" },
            "d": { "format": "decimal", "precision": 10, "scale": 2 },
            "s": { "type": "object", "additionalProperties": false, "properties": { "a": { "type": "integer" } } },
        }));
        let table = new_table(&v1).unwrap();
        let last = table.highest_field_id();
        assert_eq!(evolve(&table, last, &v1).unwrap(), None, "the same schema changes nothing");

        let v2 = stream(json!({
            "n": { "type": "integer" },
            "f": { "type": "number" },
            "d": { "format": "decimal", "precision": 20, "scale": 2 },
            "s": { "type": "object", "additionalProperties": false,
                   "properties": { "a": { "type": "integer" }, "b": { "type": "boolean" } } },
            "new": { "type": "string" },
        }));
        let evolved = evolve(&table, last, &v2).unwrap().expect("changed");
        let t = |name: &str| evolved.field_by_name(name).unwrap().clone();
        assert_eq!(*t("n").field_type, Type::Primitive(PrimitiveType::Long));
        assert_eq!(t("n").id, table.field_by_name("n").unwrap().id, "promoted in place");
        assert_eq!(*t("f").field_type, Type::Primitive(PrimitiveType::Double));
        assert_eq!(*t("d").field_type, Type::Primitive(PrimitiveType::Decimal { precision: 20, scale: 2 }));
        assert!(t("new").id > last, "a new column takes a new id");
        assert!(evolved.field_by_name("s.b").unwrap().id > last, "nested fields are added too");
        assert!(evolved.field_by_name("_service_unmapped").is_some(), "no column is dropped");

        // Narrower again: the wider columns hold those values already.
        assert_eq!(evolve(&evolved, evolved.highest_field_id(), &v1).unwrap(), None);

        for (field, change) in [
            ("n", json!({ "type": "string" })),
            ("d", json!({ "format": "decimal", "precision": 12, "scale": 3 })),
            ("s", json!({ "type": "integer" })),
        ] {
            let v3 = stream(json!({ field: change }));
            match evolve(&table, last, &v3) {
                Err(SchemaError::Incompatible { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected a refusal, got {other:?}"),
            }
        }
    }
}
