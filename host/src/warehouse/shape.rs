//! Record shaping: a record's top-level fields in the provider's order
//! (nested values kept as the provider wrote them), its key, and a batch
//! laid out as rows over the union of its columns.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::sql_name;
use crate::store::pipelines::StreamSyncMode;

/// A JSON string's content, borrowed from the input when it has no escapes.
pub(super) struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A record's top-level fields in the provider's order, each value kept as
/// the provider wrote it.
pub(super) type FieldList<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

/// A record's top-level fields in the provider's order, each value kept as
/// the provider wrote it: nested values are never parsed into a tree.
pub(super) struct Fields<'a>(pub(super) FieldList<'a>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'de>, M::Error> {
                // JSON text does not say how many fields follow; records
                // commonly have tens, and growing from a few would copy
                // the vector several times per record.
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(32));
                while let Some((Text(k), v)) = map.next_entry::<Text<'de>, &'de RawValue>()? {
                    fields.push((k, v));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One record ready for a destination: its key and its fields.
pub(super) struct Shaped<'a> {
    pub(super) raw_id: String,
    pub(super) fields: FieldList<'a>,
    /// When the record was read (Unix ms), where it says so itself and
    /// its writer trusts it ([`ReadTimes::Carried`]); `None`: now.
    pub(super) read_at: Option<i64>,
}

/// A record's own read time, which a replayed record carries (Unix ms):
/// a `_service_` field, so never a column.
pub(crate) const READ_AT: &str = "_service_read_at";

/// When the rows of a batch were read, as their `_service_extracted_at`
/// tells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ReadTimes {
    /// As the batch is written: its records were read just now. A
    /// record's own [`READ_AT`] field is ignored (a connector's records
    /// never choose their metadata).
    #[default]
    Now,
    /// Each record's [`READ_AT`] field (its last), where it holds a
    /// number: a replayed record keeps the time it was first read, so
    /// that its row is ordered among versions of its key as that read
    /// was. Only a replay's loader trusts records so.
    Carried,
}

impl ReadTimes {
    /// The time `shaped` says it was read, where this trusts it.
    pub(super) fn of(self, shaped: &Shaped<'_>) -> Option<i64> {
        match self {
            ReadTimes::Now => None,
            ReadTimes::Carried => {
                let (_, raw) = shaped.fields.iter().rev().find(|(name, _)| name == READ_AT)?;
                raw.get().parse().ok()
            }
        }
    }
}

/// How the rows of an append are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppendKeys {
    /// Time-ordered random ids, so rows append at the end of the key index.
    Fresh,
    /// Derived from `seed` (the pipeline, the stream and the state the
    /// records follow), each record's place after that state (`first` for
    /// the batch's first record) and its text. A read resumed from the
    /// same state that reads the same records keys them the same, so the
    /// rows an attempt killed before saving its state wrote are replaced
    /// by the retry, not doubled; a record read anew keys a new row.
    /// `replaces`: rows with these keys may exist already.
    Seeded { seed: [u8; 32], first: u64, replaces: bool },
}

/// A hash begun with `parts`, each after its length (so no two lists of
/// parts hash alike): what keys derived from names and places start from.
pub(crate) fn parts_hashed(parts: &[&str]) -> Sha256 {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash
}

impl AppendKeys {
    /// Keys for the records of `pipeline_id`'s `stream` read after
    /// `state` (`None`: from the start).
    pub(crate) fn after(pipeline_id: &str, stream: &str, state: Option<&str>, replaces: bool) -> AppendKeys {
        let mut seed = parts_hashed(&[pipeline_id, stream, state.unwrap_or("")]);
        seed.update([u8::from(state.is_some())]);
        AppendKeys::Seeded { seed: seed.finalize().into(), first: 0, replaces }
    }

    /// Whether rows with these keys may exist already.
    pub(crate) fn replaces(&self) -> bool {
        matches!(self, AppendKeys::Seeded { replaces: true, .. })
    }

    /// The key of `record`, the batch's `at`-th.
    pub(super) fn key(&self, at: usize, record: &str) -> String {
        match self {
            AppendKeys::Fresh => uuid::Uuid::now_v7().to_string(),
            AppendKeys::Seeded { seed, first, .. } => {
                let place = first + at as u64;
                // The text's fingerprint rather than the text: a record is
                // a kilobyte, hashing it cryptographically would cost the
                // append a share of its throughput, and only the seed and
                // place must be beyond a provider's reach.
                let text = twox_hash::XxHash64::oneshot(0, record.as_bytes());
                let key =
                    Sha256::new().chain_update(seed).chain_update(place.to_le_bytes()).chain_update(text.to_le_bytes());
                hex::encode(key.finalize())
            }
        }
    }

    /// The keys of the next batch, once `records` of this one are keyed.
    pub(crate) fn advanced(self, records: usize) -> AppendKeys {
        match self {
            AppendKeys::Seeded { seed, first, replaces } => {
                AppendKeys::Seeded { seed, first: first + records as u64, replaces }
            }
            fresh => fresh,
        }
    }
}

/// Splits a record into its fields and derives its key: from the primary
/// key in deduplicated mode (so a rewrite replaces the row), otherwise a
/// time-ordered random id (so rows append at the end of the key index).
#[cfg(test)]
pub(super) fn shape<'a>(record: &'a str, mode: StreamSyncMode, primary_key: &[String]) -> Result<Shaped<'a>, String> {
    shape_keyed(record, mode, primary_key, &AppendKeys::Fresh, 0)
}

/// Splits a record into its fields and derives its key: from the primary
/// key in deduplicated mode (so a rewrite replaces the row), otherwise
/// from `keys`, as the batch's `at`-th record.
pub(super) fn shape_keyed<'a>(
    record: &'a str,
    mode: StreamSyncMode,
    primary_key: &[String],
    keys: &AppendKeys,
    at: usize,
) -> Result<Shaped<'a>, String> {
    let Fields(fields) = serde_json::from_str(record).map_err(|_| "a record is not a JSON object".to_owned())?;
    let raw_id = if mode == StreamSyncMode::IncrementalDeduped {
        // The key's canonical JSON, so formatting differences between two
        // copies of one record do not make two rows.
        let key: Vec<Value> = primary_key
            .iter()
            .map(|k| {
                fields
                    .iter()
                    .rev()
                    .find(|(name, _)| name == k)
                    .map_or(Ok(Value::Null), |(_, raw)| serde_json::from_str(raw.get()))
            })
            .collect::<Result<_, _>>()
            .map_err(|_| "a record's key is not valid JSON".to_owned())?;
        hex::encode(Sha256::digest(serde_json::to_vec(&key).unwrap_or_default()))
    } else {
        keys.key(at, record)
    };
    Ok(Shaped { raw_id, fields, read_at: None })
}

/// Every record of a batch shaped ([`shape`]); the first that is not an
/// object fails the batch as a bad record.
#[cfg(test)]
pub(super) fn shape_all<'a>(
    records: &'a [String],
    mode: StreamSyncMode,
    primary_key: &[String],
) -> Result<Vec<Shaped<'a>>, super::WriteError> {
    shape_all_keyed(records, mode, primary_key, &AppendKeys::Fresh)
}

/// Every record of a batch shaped ([`shape_keyed`]); the first that is
/// not an object fails the batch as a bad record.
pub(super) fn shape_all_keyed<'a>(
    records: &'a [String],
    mode: StreamSyncMode,
    primary_key: &[String],
    keys: &AppendKeys,
) -> Result<Vec<Shaped<'a>>, super::WriteError> {
    records
        .iter()
        .enumerate()
        .map(|(at, r)| shape_keyed(r, mode, primary_key, keys, at))
        .collect::<Result<_, _>>()
        .map_err(super::WriteError::BadRecord)
}

/// A field as a column value: strings unquoted, null as NULL, anything
/// else (numbers, booleans, nested objects and arrays) as its JSON text.
pub(super) fn column_value(raw: &RawValue) -> Result<Option<Cow<'_, str>>, String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'n') => Ok(None),
        // The string was checked when the record was split into fields;
        // without a backslash its text is its value, and a byte search is
        // much cheaper than decoding it again.
        Some(b'"') if memchr::memchr(b'\\', text.as_bytes()).is_none() => {
            Ok(Some(Cow::Borrowed(&text[1..text.len() - 1])))
        }
        Some(b'"') => serde_json::from_str::<Text>(text)
            .map(|t| Some(t.0))
            .map_err(|_| "a record holds an invalid string".to_owned()),
        _ => Ok(Some(Cow::Borrowed(text))),
    }
}

/// A row: its key, when its record was read (`None`: as the batch is
/// written), and its values, in the order of [`Rows::columns`].
pub(crate) struct Row<'a> {
    pub(super) key: String,
    pub(super) read_at: Option<i64>,
    pub(super) values: Vec<Option<Cow<'a, str>>>,
}

/// Cells (rows times columns) a batch may lay out. Destinations take a
/// value or a NULL for every cell (PostgreSQL's `COPY` writes each), so a
/// batch of many small records after one with many fields would cost far
/// more memory than its text: such a batch is split instead. A batch of
/// 16 MiB of 1 KB records with 200 fields each stays whole.
pub(super) const MAX_CELLS: usize = 4_000_000;

/// The rows of one batch, aligned to the union of their columns.
pub(super) struct Rows<'a> {
    pub(super) columns: Vec<String>,
    pub(super) rows: Vec<Row<'a>>,
}

impl<'a> Rows<'a> {
    /// Lays the batch out as rows. Fields whose column names collide keep
    /// the last value; in deduplicated mode a key seen twice in one batch
    /// keeps its last version. `None` when the batch would lay out more than
    /// `max_cells` cells: it is to be split.
    pub(super) fn collect(shaped: Vec<Shaped<'a>>, dedupe: bool, max_cells: usize) -> Result<Option<Rows<'a>>, String> {
        let mut columns: Vec<String> = Vec::new();
        let mut by_field: HashMap<String, Option<usize>> = HashMap::new();
        let mut rows: Vec<Row<'a>> = Vec::with_capacity(shaped.len());
        let mut by_key: HashMap<String, usize> = HashMap::new();
        // The fields of the record before, in its order, with their slots:
        // records of one stream mostly list the same fields in the same
        // order, and comparing a name with the one at the same position is
        // cheaper than hashing it.
        let mut last: Vec<(Cow<'a, str>, Option<usize>)> = Vec::new();
        for record in shaped {
            // As long as the record's last field needs: rows are read with
            // `get`, and a missing value is NULL.
            let mut row: Vec<Option<Cow<'a, str>>> = Vec::new();
            for (at, (name, raw)) in record.fields.iter().enumerate() {
                let hit = last.get(at).and_then(|(seen, slot)| (seen == name).then_some(*slot));
                let slot = match hit.or_else(|| by_field.get(name.as_ref()).copied()) {
                    Some(slot) => slot,
                    None => {
                        let column = sql_name(name);
                        let slot = if column.starts_with("_service_") {
                            None
                        } else if let Some(i) = columns.iter().position(|c| *c == column) {
                            Some(i)
                        } else {
                            columns.push(column);
                            Some(columns.len() - 1)
                        };
                        by_field.insert(name.to_string(), slot);
                        slot
                    }
                };
                if hit.is_none() {
                    // Positions grow one by one, so `at` is at most the length.
                    last.truncate(at);
                    last.push((name.clone(), slot));
                }
                if let Some(i) = slot {
                    if row.len() <= i {
                        row.resize(i + 1, None);
                    }
                    row[i] = column_value(raw)?;
                }
            }
            if (rows.len() + 1) * columns.len() > max_cells {
                return Ok(None);
            }
            if dedupe && let Some(&at) = by_key.get(&record.raw_id) {
                rows[at].values = row;
                rows[at].read_at = record.read_at;
                continue;
            }
            if dedupe {
                by_key.insert(record.raw_id.clone(), rows.len());
            }
            rows.push(Row { key: record.raw_id, read_at: record.read_at, values: row });
        }
        Ok(Some(Rows { columns, rows }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys derived from parts stay what they were: rows written by an
    /// earlier version are found again under the same keys (each part
    /// after its length as eight little-endian bytes).
    #[test]
    fn parts_hash_to_the_keys_they_always_did() {
        let hash = parts_hashed(&["pl_1", "events", "/kind", ""]).finalize();
        assert_eq!(hex::encode(hash), "5b00f7e3422046167cabeefebb5454df4cde7ba18389b490b80ceb842e0e4b99");
    }

    /// An append keyed by where it was read: the same records read again
    /// after the same state key the same rows, whatever batches they come
    /// in; another record, place, state, stream or pipeline keys another
    /// row; fresh keys never repeat.
    #[test]
    fn appended_records_read_again_from_the_same_state_key_the_same_rows() {
        let append = StreamSyncMode::IncrementalAppend;
        let records: Vec<String> = [r#"{"n": 1}"#, r#"{"n": 2}"#, r#"{"n": 1}"#].map(str::to_owned).to_vec();
        let keys_of = |keys: AppendKeys, records: &[String]| -> Vec<String> {
            shape_all_keyed(records, append, &[], &keys).unwrap().into_iter().map(|s| s.raw_id).collect()
        };
        let after = |state: Option<&str>| AppendKeys::after("p", "events", state, true);
        let whole = keys_of(after(Some("s1")), &records);
        let mut split = keys_of(after(Some("s1")), &records[..1]);
        split.extend(keys_of(after(Some("s1")).advanced(1), &records[1..]));
        assert_eq!(whole, split, "the batches a read comes in do not change its keys");
        assert_ne!(whole[0], whole[2], "the same text in another place is another row");
        assert_ne!(whole, keys_of(after(Some("s2")), &records));
        assert_ne!(whole, keys_of(after(None), &records));
        assert_ne!(whole, keys_of(AppendKeys::after("p", "other", Some("s1"), true), &records));
        assert_ne!(whole, keys_of(AppendKeys::after("q", "events", Some("s1"), true), &records));
        let changed: Vec<String> = [r#"{"n": 1}"#, r#"{"n": 3}"#].map(str::to_owned).to_vec();
        let changed = keys_of(after(Some("s1")), &changed);
        assert_eq!(changed[0], whole[0]);
        assert_ne!(changed[1], whole[1], "a record read anew is a new row");
        assert_ne!(keys_of(AppendKeys::Fresh, &records), keys_of(AppendKeys::Fresh, &records));
        assert!(after(None).replaces() && !AppendKeys::after("p", "events", None, false).replaces());
    }

    #[test]
    fn records_become_rows_with_their_fields_as_column_text() {
        let records = [
            r#"{"id": 1, "name": "caf\u00e9 \"x\"", "tags": ["a", "b"], "gone": null, "_service_raw_id": "spoof"}"#
                .to_owned(),
            r#"{"id": 2, "Name": "second", "extra": {"deep": true}}"#.to_owned(),
        ];
        let shaped = records
            .iter()
            .map(|r| shape(r, StreamSyncMode::IncrementalAppend, &[]))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert_ne!(shaped[0].raw_id, shaped[1].raw_id);
        let Rows { columns, rows } = Rows::collect(shaped, false, MAX_CELLS).unwrap().unwrap();
        assert_eq!(
            columns,
            ["id", "name", "tags", "gone", "extra"],
            "one column per field name, _service_ fields dropped"
        );
        let first: Vec<Option<&str>> = rows[0].values.iter().map(|v| v.as_deref()).collect();
        assert_eq!(first, [Some("1"), Some("café \"x\""), Some(r#"["a", "b"]"#), None]);
        let second: Vec<Option<&str>> = rows[1].values.iter().map(|v| v.as_deref()).collect();
        assert_eq!(
            second,
            [Some("2"), Some("second"), None, None, Some(r#"{"deep": true}"#)],
            "Name and name share a column"
        );
    }

    /// Fields are matched by name, whatever their order or number from
    /// one record to the next.
    #[test]
    fn fields_land_in_their_columns_in_any_order() {
        let records = [
            r#"{"a": 1, "b": 2}"#,
            r#"{"b": 3, "a": 4}"#,
            r#"{"a": 5, "b": 6, "c": 7}"#,
            r#"{"a": 8}"#,
            r#"{"c": 9, "\u0061": 10}"#,
            r#"{"a": 11, "b": 12}"#,
        ];
        let shaped = records
            .iter()
            .map(|r| shape(r, StreamSyncMode::IncrementalAppend, &[]))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let Rows { columns, rows } = Rows::collect(shaped, false, MAX_CELLS).unwrap().unwrap();
        assert_eq!(columns, ["a", "b", "c"]);
        // Rows are as long as their last field needs; the rest is NULL.
        let values: Vec<Vec<Option<&str>>> = rows
            .iter()
            .map(|row| (0..columns.len()).map(|j| row.values.get(j).and_then(|v| v.as_deref())).collect())
            .collect();
        let want: [&[Option<&str>]; 6] = [
            &[Some("1"), Some("2"), None],
            &[Some("4"), Some("3"), None],
            &[Some("5"), Some("6"), Some("7")],
            &[Some("8"), None, None],
            &[Some("10"), None, Some("9")],
            &[Some("11"), Some("12"), None],
        ];
        assert_eq!(values, want.map(<[_]>::to_vec));
    }

    /// Many small records after one with many fields: the batch is to be
    /// split rather than laid out, and a row costs what its fields need.
    #[test]
    fn a_batch_wider_than_the_cell_limit_is_to_be_split() {
        let wide = format!("{{{}}}", (0..100).map(|i| format!(r#""f{i}": {i}"#)).collect::<Vec<_>>().join(", "));
        let records: Vec<String> = std::iter::once(wide).chain((0..20).map(|_| "{}".to_owned())).collect();
        let lay_out = |max_cells| {
            let shaped = records
                .iter()
                .map(|r| shape(r, StreamSyncMode::IncrementalAppend, &[]))
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            Rows::collect(shaped, false, max_cells).unwrap()
        };
        assert!(lay_out(21 * 100 - 1).is_none(), "21 rows of 100 columns exceed 2,099 cells");
        let Some(Rows { columns, rows }) = lay_out(21 * 100) else {
            panic!("21 rows of 100 columns fit in 2,100 cells")
        };
        assert_eq!((columns.len(), rows.len()), (100, 21));
        assert!(rows[1..].iter().all(|row| row.values.is_empty()), "an empty record allocates no cells");
    }

    #[test]
    fn deduplicated_keys_come_from_the_primary_key_and_the_last_copy_wins() {
        let pk = ["id".to_owned()];
        let records = [
            r#"{"id": 7, "v": "old"}"#.to_owned(),
            r#"{"v": "other", "id": 8}"#.to_owned(),
            r#"{ "id" : 7 , "v": "new"}"#.to_owned(),
        ];
        let shaped = records
            .iter()
            .map(|r| shape(r, StreamSyncMode::IncrementalDeduped, &pk))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert_eq!(shaped[0].raw_id, shaped[2].raw_id, "formatting does not change the key");
        assert_eq!(shaped[0].raw_id, hex::encode(Sha256::digest(b"[7]")));
        let Rows { rows, .. } = Rows::collect(shaped, true, MAX_CELLS).unwrap().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].values[1].as_deref(), Some("new"));
        assert!(shape("[1]", StreamSyncMode::IncrementalAppend, &[]).is_err());
        assert!(shape("not json", StreamSyncMode::IncrementalAppend, &[]).is_err());
    }
}
