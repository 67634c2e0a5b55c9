//! Records as an Arrow batch of a table's columns: each value parsed
//! exactly for its column's type (decimals from their text, never through
//! a float; timestamps to the microsecond, never rounded), a record's
//! undeclared fields kept in `_service_unmapped`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, ListArray, RecordBatch, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use iceberg::spec::PrimitiveType;
use serde_json::value::RawValue;

use super::super::WriteError;
use super::super::decimal::DecimalType;
use super::super::shape::{Fields, Shaped, column_value};

/// The rows of one batch: the `shaped` records as the table's columns
/// (`schema`, the metadata columns first), written at `now_us`.
pub(super) fn batch(
    shaped: Vec<Shaped<'_>>,
    schema: &SchemaRef,
    now_us: i64,
    meta: &str,
) -> Result<RecordBatch, WriteError> {
    let bad = WriteError::BadRecord;
    let metadata = super::schema::METADATA_COLUMNS.len();
    let declared: HashMap<&str, usize> =
        schema.fields().iter().skip(metadata).enumerate().map(|(i, f)| (f.name().as_str(), i)).collect();
    let mut values: Vec<Vec<Option<&RawValue>>> = vec![vec![None; shaped.len()]; declared.len()];
    let mut raw_ids = StringBuilder::with_capacity(shaped.len(), shaped.len() * 36);
    let mut unmapped = StringBuilder::new();
    let n = shaped.len();
    for (row, shaped) in shaped.iter().enumerate() {
        raw_ids.append_value(&shaped.raw_id);
        let mut extra = Vec::new();
        for (name, raw) in &shaped.fields {
            match declared.get(name.as_ref()) {
                Some(&column) => values[column][row] = Some(*raw),
                None if name.starts_with("_service_") => {}
                None => extra.push((name.as_ref(), *raw)),
            }
        }
        if extra.is_empty() {
            unmapped.append_null();
        } else {
            let map: serde_json::Map<String, serde_json::Value> = extra
                .into_iter()
                .map(|(k, raw)| Ok((k.to_owned(), serde_json::from_str(raw.get())?)))
                .collect::<Result<_, serde_json::Error>>()
                .map_err(|e| bad(e.to_string()))?;
            unmapped.append_value(serde_json::Value::Object(map).to_string());
        }
    }
    let fields = schema.fields();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    columns.push(Arc::new(raw_ids.finish()));
    let tz = match fields[1].data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        _ => None,
    };
    columns.push(Arc::new(TimestampMicrosecondBuilder::new().with_timezone_opt(tz).append_value_n(now_us, n)));
    let mut metas = StringBuilder::with_capacity(n, n * meta.len());
    (0..n).for_each(|_| metas.append_value(meta));
    columns.push(Arc::new(metas.finish()));
    columns.push(Arc::new(unmapped.finish()));
    for (field, column) in fields.iter().skip(metadata).zip(&values) {
        columns.push(array(field, column).map_err(|m| bad(format!("field {}{m}", field.name())))?);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| WriteError::BadRecord(e.to_string()))
}

/// The declared columns of `schema` that a value of `shaped` overflows but
/// the wider type Iceberg promotes the column to would hold, each with
/// that type: a 32-bit integer column given a larger integer (`long`), a
/// float column a number beyond its range (`double`), a decimal column
/// more digits than its precision at its scale (the precision the largest
/// needs, up to 38). A value no wider type holds (more places than the
/// scale, text for a number) widens nothing.
pub(super) fn widenings(shaped: &[Shaped<'_>], schema: &SchemaRef) -> Vec<(String, PrimitiveType)> {
    let metadata = super::schema::METADATA_COLUMNS.len();
    let mut wider = Vec::new();
    for field in schema.fields().iter().skip(metadata) {
        let values = shaped.iter().filter_map(|s| {
            let raw = s.fields.iter().rev().find(|(name, _)| name == field.name()).map(|(_, raw)| raw.get())?;
            (raw != "null").then_some(raw)
        });
        let widened = match field.data_type() {
            DataType::Int32 => values
                .into_iter()
                .any(|t| t.parse::<i32>().is_err() && t.parse::<i64>().is_ok())
                .then_some(PrimitiveType::Long),
            DataType::Float32 => values
                .into_iter()
                .any(|t| number(t).is_ok_and(|v| v.is_finite() && v.abs() > f64::from(f32::MAX)))
                .then_some(PrimitiveType::Double),
            DataType::Decimal128(p, s) => {
                let widest = DecimalType { precision: 38, scale: u64::try_from(*s).unwrap_or(0) };
                let needed = values
                    .filter_map(|t| widest.unscaled(unquoted(t).ok()?.as_ref()).ok())
                    .map(|unscaled| unscaled.unsigned_abs().checked_ilog10().map_or(1, |d| d + 1))
                    .max()
                    .unwrap_or(0);
                (needed > u32::from(*p))
                    .then(|| PrimitiveType::Decimal { precision: needed, scale: (*s).max(0) as u32 })
            }
            _ => None,
        };
        if let Some(t) = widened {
            wider.push((field.name().clone(), t));
        }
    }
    wider
}

/// Every declared column of `schema` but those named in `widened` that
/// `shaped`'s value cannot be written to, by name (a value of another type
/// than the column's, or beyond it), in the table's order.
pub(super) fn refused(shaped: &Shaped<'_>, schema: &SchemaRef, widened: &[String]) -> Vec<String> {
    let metadata = super::schema::METADATA_COLUMNS.len();
    schema
        .fields()
        .iter()
        .skip(metadata)
        .filter(|f| !widened.contains(f.name()))
        .filter(|field| {
            let value = shaped.fields.iter().rev().find(|(name, _)| name == field.name()).map(|(_, raw)| *raw);
            array(field, &[value]).is_err()
        })
        .map(|field| field.name().clone())
        .collect()
}

trait AppendN {
    fn append_value_n(self, v: i64, n: usize) -> arrow_array::TimestampMicrosecondArray;
}

impl AppendN for TimestampMicrosecondBuilder {
    fn append_value_n(mut self, v: i64, n: usize) -> arrow_array::TimestampMicrosecondArray {
        (0..n).for_each(|_| self.append_value(v));
        self.finish()
    }
}

/// A column of `values` (`None` for missing or `null`) as `field` types
/// it. An error reads after the field's name (`: …` or `.child: …`).
fn array(field: &Field, values: &[Option<&RawValue>]) -> Result<ArrayRef, String> {
    let values: Vec<Option<&RawValue>> = values.iter().map(|v| v.filter(|raw| raw.get() != "null")).collect();
    macro_rules! primitive {
        ($builder:expr, $parse:expr) => {{
            let mut b = $builder;
            for v in &values {
                match v {
                    Some(raw) => b.append_value($parse(raw.get()).map_err(|m: String| format!(": {m}"))?),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    Ok(match field.data_type() {
        DataType::Boolean => primitive!(BooleanBuilder::with_capacity(values.len()), |t: &str| match t {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{t} is not a boolean")),
        }),
        DataType::Int32 => primitive!(Int32Builder::with_capacity(values.len()), |t: &str| t
            .parse::<i32>()
            .map_err(|_| format!("{t} is not a 32-bit integer"))),
        DataType::Int64 => primitive!(Int64Builder::with_capacity(values.len()), |t: &str| t
            .parse::<i64>()
            .map_err(|_| format!("{t} is not a 64-bit integer"))),
        // A number beyond a float's range is refused, never stored as an
        // infinity.
        DataType::Float32 => {
            primitive!(Float32Builder::with_capacity(values.len()), |t: &str| number(t).and_then(|f| match f as f32 {
                narrowed if narrowed.is_finite() || !f.is_finite() => Ok(narrowed),
                _ => Err(format!("{t} is beyond a 32-bit float")),
            }))
        }
        DataType::Float64 => primitive!(Float64Builder::with_capacity(values.len()), number),
        DataType::Decimal128(p, s) => primitive!(
            Decimal128Builder::with_capacity(values.len())
                .with_precision_and_scale(*p, *s)
                .map_err(|e| e.to_string())?,
            |t: &str| DecimalType { precision: u64::from(*p), scale: u64::try_from(*s).unwrap_or(0) }
                .unscaled(unquoted(t)?.as_ref())
                .map_err(|e| e.to_string())
        ),
        DataType::Date32 => primitive!(Date32Builder::with_capacity(values.len()), |t: &str| date(t)),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => primitive!(
            TimestampMicrosecondBuilder::with_capacity(values.len()).with_timezone_opt(tz.clone()),
            |t: &str| timestamp(t, tz.is_some())
        ),
        DataType::Utf8 => {
            let mut b =
                StringBuilder::with_capacity(values.len(), values.iter().flatten().map(|r| r.get().len()).sum());
            for v in &values {
                match v.map(|raw| column_value(raw)).transpose().map_err(|m| format!(": {m}"))?.flatten() {
                    Some(text) => b.append_value(text),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Struct(children) => {
            let objects: Vec<Option<Object<'_>>> = values
                .iter()
                .map(|v| {
                    v.map(|raw| {
                        serde_json::from_str::<Fields>(raw.get())
                            .map(|f| f.0)
                            .map_err(|_| ": is not an object".to_owned())
                    })
                    .transpose()
                })
                .collect::<Result<_, _>>()?;
            let arrays = children
                .iter()
                .map(|child| {
                    let column: Vec<Option<&RawValue>> = objects
                        .iter()
                        .map(|o| {
                            o.as_ref().and_then(|fields| {
                                fields.iter().rev().find(|(name, _)| name == child.name()).map(|(_, raw)| *raw)
                            })
                        })
                        .collect();
                    array(child, &column).map_err(|m| format!(".{}{m}", child.name()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let nulls = NullBuffer::from(objects.iter().map(Option::is_some).collect::<Vec<_>>());
            Arc::new(StructArray::try_new(children.clone(), arrays, Some(nulls)).map_err(|e| format!(": {e}"))?)
        }
        DataType::List(element) => {
            let lists: Vec<Option<Vec<&RawValue>>> = values
                .iter()
                .map(|v| {
                    v.map(|raw| {
                        serde_json::from_str::<Vec<&RawValue>>(raw.get()).map_err(|_| ": is not an array".into())
                    })
                    .transpose()
                })
                .collect::<Result<_, String>>()?;
            let lengths = lists.iter().map(|l| l.as_ref().map_or(0, Vec::len));
            let offsets = OffsetBuffer::from_lengths(lengths);
            let flat: Vec<Option<&RawValue>> = lists.iter().flatten().flatten().map(|raw| Some(*raw)).collect();
            let items = array(element, &flat).map_err(|m| format!("[]{m}"))?;
            let nulls = NullBuffer::from(lists.iter().map(Option::is_some).collect::<Vec<_>>());
            Arc::new(ListArray::try_new(element.clone(), offsets, items, Some(nulls)).map_err(|e| format!(": {e}"))?)
        }
        other => return Err(format!(": the service writes no {other} columns")),
    })
}

/// A JSON object's fields, each value as written.
type Object<'a> = Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>;

/// A JSON string's content, or a number's text.
fn unquoted(text: &str) -> Result<std::borrow::Cow<'_, str>, String> {
    if text.starts_with('"') {
        serde_json::from_str::<String>(text).map(Into::into).map_err(|_| format!("{text} is not a string"))
    } else {
        Ok(text.into())
    }
}

fn string(text: &str) -> Result<String, String> {
    serde_json::from_str::<String>(text).map_err(|_| format!("{text} is not a string"))
}

fn number(text: &str) -> Result<f64, String> {
    if text.starts_with('"') {
        return Err(format!("{text} is not a number"));
    }
    text.parse::<f64>().map_err(|_| format!("{text} is not a number"))
}

fn date(text: &str) -> Result<i32, String> {
    let s = string(text)?;
    let day =
        chrono::NaiveDate::parse_from_str(&s, "%Y-%m-%d").map_err(|_| format!("{s} is not a date (YYYY-MM-DD)"))?;
    Ok((day - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date")).num_days() as i32)
}

/// Microseconds since the epoch (UTC); a zone is required for a zoned
/// column and refused for a local one. Finer than a microsecond is
/// refused: it would be rounded.
fn timestamp(text: &str, zoned: bool) -> Result<i64, String> {
    let s = string(text)?;
    let (micros, nanos) = if zoned {
        let t = chrono::DateTime::parse_from_rfc3339(&s)
            .map_err(|_| format!("{s} is not a date-time with a zone (RFC 3339)"))?;
        (t.timestamp_micros(), t.timestamp_subsec_nanos())
    } else {
        let t = chrono::NaiveDateTime::parse_from_str(&s, "%Y-%m-%dT%H:%M:%S%.f")
            .map_err(|_| format!("{s} is not a local date-time (YYYY-MM-DDThh:mm:ss)"))?
            .and_utc();
        (t.timestamp_micros(), t.timestamp_subsec_nanos())
    };
    if nanos % 1000 != 0 {
        return Err(format!("{s} is finer than a microsecond, which Iceberg does not hold"));
    }
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::super::schema::Kind;
    use super::*;
    use crate::store::pipelines::StreamSyncMode;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
    use iceberg::spec::PrimitiveType;

    fn shaped(records: &[String]) -> Vec<Shaped<'_>> {
        super::super::super::shape::shape_all(records, StreamSyncMode::IncrementalAppend, &[]).unwrap()
    }

    #[test]
    fn timestamps_keep_the_microsecond_and_refuse_finer() {
        assert_eq!(timestamp(r#""1970-01-01T00:00:00.000001Z""#, true), Ok(1));
        assert_eq!(timestamp(r#""1970-01-01T01:00:00+01:00""#, true), Ok(0));
        assert_eq!(timestamp(r#""1970-01-01T00:00:01.5""#, false), Ok(1_500_000));
        assert!(timestamp(r#""1970-01-01T00:00:00.0000001Z""#, true).unwrap_err().contains("microsecond"));
        assert!(timestamp(r#""1970-01-01T00:00:00""#, true).is_err(), "a zoned column needs a zone");
        assert_eq!(date(r#""1970-01-02""#), Ok(1));
    }

    #[test]
    fn records_become_typed_columns_with_their_extra_fields_kept() {
        let columns = vec![
            ("id".to_owned(), Kind::Primitive(PrimitiveType::Long)),
            ("price".to_owned(), Kind::Primitive(PrimitiveType::Decimal { precision: 38, scale: 9 })),
            ("at".to_owned(), Kind::Primitive(PrimitiveType::Timestamptz)),
            ("note".to_owned(), Kind::Primitive(PrimitiveType::String)),
            (
                "tags".to_owned(),
                Kind::List(Box::new(Kind::Struct(vec![("n".to_owned(), Kind::Primitive(PrimitiveType::Long))]))),
            ),
        ];
        let schema = super::super::schema::new_table(&columns).unwrap();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap());
        let records = vec![
            r#"{"id": 1, "price": 12345678901234567890123456789.123456789, "at": "2024-02-29T23:59:59.999999Z", "note": {"a": [1]}, "tags": [{"n": 5}, {"n": null}], "other": true}"#.to_owned(),
            r#"{"id": null, "price": "-1E-9", "tags": null}"#.to_owned(),
        ];
        let b = batch(shaped(&records), &arrow, 7, "{}").unwrap();
        assert_eq!(b.num_rows(), 2);
        let col = |name: &str| b.column_by_name(name).unwrap().clone();
        assert_eq!(col("id").as_primitive::<Int64Type>().iter().collect::<Vec<_>>(), vec![Some(1), None]);
        assert_eq!(
            col("price").as_primitive::<Decimal128Type>().iter().collect::<Vec<_>>(),
            vec![Some(12345678901234567890123456789123456789), Some(-1)]
        );
        assert_eq!(col("at").as_primitive::<TimestampMicrosecondType>().value(0), 1_709_251_199_999_999);
        assert_eq!(col("note").as_string::<i32>().value(0), r#"{"a": [1]}"#, "JSON text as the provider wrote it");
        assert_eq!(col("_service_unmapped").as_string::<i32>().value(0), r#"{"other":true}"#);
        assert!(col("_service_unmapped").is_null(1));
        let tags = col("tags");
        let tags = tags.as_list::<i32>();
        assert_eq!(tags.value_length(0), 2);
        assert!(tags.is_null(1));
        assert_eq!(col("_service_extracted_at").as_primitive::<TimestampMicrosecondType>().value(1), 7);

        let wrong = batch(shaped(&[r#"{"tags": [{"n": "x"}]}"#.to_owned()]), &arrow, 0, "{}").unwrap_err();
        assert!(wrong.to_string().contains("field tags[].n: \"x\" is not a 64-bit integer"), "{wrong}");
    }
}
