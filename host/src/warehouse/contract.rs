//! Data contracts: a stream's records judged against the JSON Schema its
//! connector declares, before they are loaded ([`Contract::judge`]).
//!
//! A record breaks a rule when it has a field the schema does not declare
//! (`new_columns`), a value of a type the schema does not allow for its
//! field, outside its enumeration or, for a declared decimal, with more
//! places or digits than it holds, or for a declared 32-bit integer,
//! beyond its range (`type_changes`; null fits every
//! type), or is not an object or lacks a required field or its primary key
//! (`invalid_records`). The stream's contract says, per rule, what such a
//! record does: it loads as it is (`evolve`), fails the sync before its
//! batch is written (`freeze`), loads with the offending values left out
//! (`discard_value`), or is kept aside in the rejected-rows table
//! (`quarantine`). Only top-level fields are judged: they are the columns.
//! Values are judged from their JSON text as shaping splits a record
//! into fields ([`Contract::verdict`]), the split a destination lays out,
//! so a record judged on its way in is read once; they are never parsed
//! into a tree (bar the few compared with an enumeration).
//!
//! A batch is judged as the loader shapes it for the destination
//! ([`shape_judged`]). What such a table is called and holds is here too
//! ([`rejected_stream`], [`REJECTED_COLUMNS`]); writing it is the sync's.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde_json::Value;
use serde_json::value::RawValue;

use super::WriteError;
use super::decimal::{DecimalError, DecimalType};
use super::shape::{AppendKeys, FieldList, Fields, Shaped, shape_all_keyed, shape_keyed};
use crate::store::kinds::{ContractMode, ContractRule, RejectionReason};
use crate::store::pipelines::{StreamContract, StreamSyncMode};

/// The stream whose table holds `stream`'s rejected rows (the records its
/// contract kept aside): `{stream}__rejected`. A table's name is cut at
/// [`super::sql_name`]'s length, so where that cut would leave the
/// rejected table with the stream's own name (a stream of 60 characters
/// or more), the name keeps the start of the stream's, a digest of all
/// of it, and the suffix whole.
pub(crate) fn rejected_stream(stream: &str) -> String {
    const SUFFIX: &str = "__rejected";
    let plain = format!("{stream}{SUFFIX}");
    let table = super::sql_name(stream);
    if super::sql_name(&plain) != table {
        return plain;
    }
    use sha2::Digest;
    let digest = hex::encode(super::shape::parts_hashed(&[stream]).finalize());
    let start: String = table.chars().take(super::SQL_NAME_LENGTH - SUFFIX.len() - 9).collect();
    format!("{start}_{}{SUFFIX}", &digest[..8])
}

/// The key of a rejected row, and the field it is derived from.
pub(crate) const REJECTION_ID: &str = "rejection_id";

/// The fields of a rejected row, as its table holds them.
pub(crate) const REJECTED_COLUMNS: [&str; 10] =
    [REJECTION_ID, "job_id", "attempt", "stream", "cursor", "reason", "pointer", "rule", "record", "rejected_at"];

/// JSON types, as a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Types(u8);

impl Types {
    const STRING: u8 = 1;
    const INTEGER: u8 = 2;
    const NUMBER: u8 = 4;
    const BOOLEAN: u8 = 8;
    const OBJECT: u8 = 16;
    const ARRAY: u8 = 32;

    /// The types a schema's `type` names (`None` for any: no `type`, or
    /// one this reads no limit from). A number allows integers.
    fn declared(schema: &Value) -> Option<Types> {
        let one = |name: &str| match name {
            "string" => Some(Types::STRING),
            "integer" => Some(Types::INTEGER),
            "number" => Some(Types::NUMBER | Types::INTEGER),
            "boolean" => Some(Types::BOOLEAN),
            "object" => Some(Types::OBJECT),
            "array" => Some(Types::ARRAY),
            "null" => Some(0),
            _ => None,
        };
        match &schema["type"] {
            Value::String(name) => one(name).map(Types),
            Value::Array(names) => {
                names.iter().map(|n| n.as_str().and_then(one)).try_fold(0, |all, t| t.map(|t| all | t)).map(Types)
            }
            _ => None,
        }
    }

    /// The type of a value from its JSON text; `None` for null.
    fn of(raw: &str) -> Option<u8> {
        match raw.as_bytes().first()? {
            b'n' => None,
            b'"' => Some(Types::STRING),
            b't' | b'f' => Some(Types::BOOLEAN),
            b'{' => Some(Types::OBJECT),
            b'[' => Some(Types::ARRAY),
            // JSON Schema counts 1.0 as an integer.
            _ if raw.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) => match raw.parse::<f64>() {
                Ok(n) if n.is_finite() && n.fract() == 0.0 => Some(Types::INTEGER),
                _ => Some(Types::NUMBER),
            },
            _ => Some(Types::INTEGER),
        }
    }
}

/// What the schema says of one field.
#[derive(Debug)]
struct Declared {
    types: Option<Types>,
    /// Its enumeration, when it has one.
    allowed: Option<Vec<Value>>,
    /// The decimal it declares, when it declares one the service holds.
    decimal: Option<DecimalType>,
    /// Whether it declares a 32-bit integer (`format: int32`).
    int32: bool,
}

/// A stream's contract, ready to judge its records.
#[derive(Debug)]
pub(crate) struct Contract {
    rules: StreamContract,
    fields: HashMap<String, Declared>,
    required: Vec<(String, RejectionReason)>,
}

/// A rule a record broke, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Breach {
    pub(crate) rule: ContractRule,
    pub(crate) reason: RejectionReason,
    /// The JSON pointer of the field (`""`: the whole record).
    pub(crate) pointer: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() { "the record" } else { &self.pointer };
        write!(f, "{} at {at} (contract rule {})", self.reason, self.rule)
    }
}

/// A record kept aside, and the rule that sent it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejected {
    pub(crate) record: String,
    pub(crate) breach: Breach,
    /// Where the record was read, as its row would have been keyed: in an
    /// append its key ([`AppendKeys`]: a read resumed from the same state
    /// that reads it again finds the same place), otherwise its text's
    /// digest. The same record kept aside again keys the same rejected
    /// row.
    pub(crate) place: String,
}

/// A batch judged: what to load (records with discarded values rewritten),
/// what to keep aside, and how many loaded records lost a value.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Judged {
    pub(crate) load: Vec<String>,
    pub(crate) rejected: Vec<Rejected>,
    pub(crate) value_discarded: u64,
}

/// What a contract makes of one record that does not fail its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It loads as it is.
    Load,
    /// It loads, with the values a rule discards left out.
    ValueDiscarded,
    /// It is kept aside, for this breach.
    Rejected(Breach),
}

/// What a stream's contract made of a batch besides the records it
/// loads.
#[derive(Debug, Default)]
pub(crate) struct Judgement {
    /// The records kept aside, each with its breach.
    pub(crate) rejected: Vec<Rejected>,
    /// Records loaded with a value left out.
    pub(crate) value_discarded: u64,
}

/// Every record of a batch shaped ([`shape_keyed`], appended records
/// keyed by `keys`) and judged by `contract`
/// on the same fields ([`Contract::verdict`]): those it keeps aside are
/// left out, the values it discards left out of theirs. A breach of a
/// rule that freezes fails the batch before any of it is written, as does
/// a record that is not an object and is not kept aside. Where a record
/// kept aside was read is its key in the stream's mode and `places`
/// (in an append, the key its row would have had; otherwise its text).
pub(super) fn shape_judged<'a>(
    stream: &str,
    records: &'a [String],
    (mode, primary_key, keys): (StreamSyncMode, &[String], &AppendKeys),
    places: (StreamSyncMode, &AppendKeys),
    contract: Option<&Contract>,
) -> Result<(Vec<Shaped<'a>>, Judgement), WriteError> {
    let Some(contract) = contract else {
        return Ok((shape_all_keyed(records, mode, primary_key, keys)?, Judgement::default()));
    };
    let mut shaped = Vec::with_capacity(records.len());
    let mut judgement = Judgement::default();
    for (at, record) in records.iter().enumerate() {
        let mut one = shape_keyed(record, mode, primary_key, keys, at);
        let verdict = contract.verdict(one.as_mut().ok().map(|s| &mut s.fields)).map_err(|breach| {
            WriteError::BadRecord(format!(
                "stream {stream}: {breach}, which the stream's contract freezes; nothing of the batch was written"
            ))
        })?;
        match verdict {
            Verdict::Rejected(breach) => {
                let place = match places {
                    (StreamSyncMode::IncrementalAppend, keys) => keys.key(at, record),
                    _ => text_digest(record),
                };
                judgement.rejected.push(Rejected { record: record.clone(), breach, place });
                continue;
            }
            Verdict::ValueDiscarded => judgement.value_discarded += 1,
            Verdict::Load => {}
        }
        shaped.push(one.map_err(WriteError::BadRecord)?);
    }
    Ok((shaped, judgement))
}

/// What a number, or a number's text, breaks of a declared decimal:
/// nothing when it fits exactly, its type when the text is no number.
fn decimal_breach(decimal: &DecimalType, raw: &str) -> Option<RejectionReason> {
    let text = match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if inner.contains('\\') => match serde_json::from_str::<String>(raw) {
            Ok(text) => Cow::Owned(text),
            Err(_) => return Some(RejectionReason::TypeMismatch),
        },
        Some(inner) => Cow::Borrowed(inner),
        None => Cow::Borrowed(raw),
    };
    match decimal.unscaled(&text) {
        Ok(_) => None,
        Err(DecimalError::NotANumber(_)) => Some(RejectionReason::TypeMismatch),
        Err(DecimalError::TooManyPlaces { .. } | DecimalError::TooManyDigits { .. }) => {
            Some(RejectionReason::DecimalOutOfRange)
        }
    }
}

/// A field's JSON pointer.
pub(super) fn pointer(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

impl Contract {
    /// The contract `rules` over a stream declared by `schema`, with
    /// `primary_key` (in deduplicated mode; empty otherwise). `None` when
    /// every rule evolves: there is nothing to judge.
    pub(crate) fn new(rules: StreamContract, schema: &Value, primary_key: &[String]) -> Option<Contract> {
        if ContractRule::ALL.iter().all(|r| rules.mode(*r) == ContractMode::Evolve) {
            return None;
        }
        let fields = schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, field)| {
                let allowed = field["enum"].as_array().cloned();
                let decimal = DecimalType::declared(field).and_then(Result::ok);
                let int32 = field["format"] == "int32";
                (name.clone(), Declared { types: Types::declared(field), allowed, decimal, int32 })
            })
            .collect();
        let mut required: Vec<(String, RejectionReason)> =
            primary_key.iter().map(|k| (k.clone(), RejectionReason::MissingPrimaryKey)).collect();
        for name in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if !required.iter().any(|(k, _)| k == name) {
                required.push((name.to_owned(), RejectionReason::MissingRequired));
            }
        }
        Some(Contract { rules, fields, required })
    }

    /// What the contract does with a record breaking `rule`.
    pub(crate) fn mode(&self, rule: ContractRule) -> ContractMode {
        self.rules.mode(rule)
    }

    /// Judges one record from its fields as shaping split them (`None`:
    /// it is not an object). A breach of a rule that freezes is the error;
    /// otherwise a record that breaks a rule that quarantines is kept
    /// aside (with its first such breach), values that break rules that
    /// discard are left out of `fields` (a new field dropped, a value of
    /// another type null), and the rest loads as it is.
    pub(super) fn verdict(&self, fields: Option<&mut FieldList<'_>>) -> Result<Verdict, Breach> {
        let breaches = self.breaches_of(fields.as_deref().map(Vec::as_slice));
        if breaches.is_empty() {
            return Ok(Verdict::Load);
        }
        let first = |mode: ContractMode| breaches.iter().find(|(_, b)| self.rules.mode(b.rule) == mode);
        if let Some((_, frozen)) = first(ContractMode::Freeze) {
            return Err(frozen.clone());
        }
        if let Some((_, quarantined)) = first(ContractMode::Quarantine) {
            return Ok(Verdict::Rejected(quarantined.clone()));
        }
        let discarded: Vec<(usize, ContractRule)> = breaches
            .iter()
            .filter(|(_, b)| self.rules.mode(b.rule) == ContractMode::DiscardValue)
            .filter_map(|(at, b)| at.map(|at| (at, b.rule)))
            .collect();
        let Some(fields) = fields.filter(|_| !discarded.is_empty()) else { return Ok(Verdict::Load) };
        // From the last, so the positions before stay where they were.
        for (at, rule) in discarded.into_iter().rev() {
            if rule == ContractRule::NewColumns {
                fields.remove(at);
            } else {
                fields[at].1 = RawValue::NULL;
            }
        }
        Ok(Verdict::ValueDiscarded)
    }

    /// Judges a batch of records as text ([`Contract::verdict`] each): a
    /// breach of a rule that freezes fails it, naming the first such
    /// field; records that lost a value are loaded as rewritten.
    pub(crate) fn judge(&self, records: Vec<String>) -> Result<Judged, Breach> {
        let mut judged = Judged { load: Vec::with_capacity(records.len()), ..Judged::default() };
        for record in records {
            let mut fields = serde_json::from_str::<Fields>(&record).ok().map(|Fields(f)| f);
            match self.verdict(fields.as_mut())? {
                Verdict::Load => judged.load.push(record),
                Verdict::Rejected(breach) => {
                    let place = text_digest(&record);
                    judged.rejected.push(Rejected { record, breach, place });
                }
                Verdict::ValueDiscarded => {
                    judged.value_discarded += 1;
                    judged.load.push(render(fields.as_deref().unwrap_or_default()));
                }
            }
        }
        Ok(judged)
    }

    /// Every rule a record breaks (given its fields; `None`: it is not an
    /// object), field by field in its order, each with the position of
    /// its field (`None` for a field the record lacks, or the whole
    /// record).
    fn breaches_of(&self, fields: Option<&[(Cow<'_, str>, &RawValue)]>) -> Vec<(Option<usize>, Breach)> {
        let breach = |rule, reason, pointer| Breach { rule, reason, pointer };
        let Some(fields) = fields else {
            return vec![(None, breach(ContractRule::InvalidRecords, RejectionReason::NotAnObject, String::new()))];
        };
        let mut found = Vec::new();
        for (at, (name, raw)) in fields.iter().enumerate() {
            let Some(declared) = self.fields.get(name.as_ref()) else {
                found.push((Some(at), breach(ContractRule::NewColumns, RejectionReason::NewColumn, pointer(name))));
                continue;
            };
            let Some(kind) = Types::of(raw.get()) else { continue };
            if declared.types.is_some_and(|t| t.0 & kind == 0) {
                found.push((Some(at), breach(ContractRule::TypeChanges, RejectionReason::TypeMismatch, pointer(name))));
            } else if let Some(allowed) = &declared.allowed
                && !serde_json::from_str::<Value>(raw.get()).is_ok_and(|v| allowed.contains(&v))
            {
                found.push((Some(at), breach(ContractRule::TypeChanges, RejectionReason::NotInEnum, pointer(name))));
            } else if let Some(decimal) = &declared.decimal
                && kind & (Types::INTEGER | Types::NUMBER | Types::STRING) != 0
                && let Some(reason) = decimal_breach(decimal, raw.get())
            {
                found.push((Some(at), breach(ContractRule::TypeChanges, reason, pointer(name))));
            } else if declared.int32
                && kind == Types::INTEGER
                && raw.get().parse::<f64>().is_ok_and(|n| n < f64::from(i32::MIN) || n > f64::from(i32::MAX))
            {
                found.push((Some(at), breach(ContractRule::TypeChanges, RejectionReason::TypeMismatch, pointer(name))));
            }
        }
        for (name, reason) in &self.required {
            let present = fields.iter().rev().find(|(n, _)| n == name).is_some_and(|(_, raw)| raw.get() != "null");
            if !present {
                found.push((None, breach(ContractRule::InvalidRecords, *reason, pointer(name))));
            }
        }
        found
    }
}

/// The hex SHA-256 of a record's text.
pub(super) fn text_digest(record: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(record.as_bytes()))
}

/// A record's fields as JSON text.
pub(super) fn render(fields: &[(Cow<'_, str>, &RawValue)]) -> String {
    let mut out = String::with_capacity(2 + fields.iter().map(|(n, v)| n.len() + v.get().len() + 4).sum::<usize>());
    out.push('{');
    for (name, raw) in fields {
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(name.as_ref()).unwrap_or_default());
        out.push(':');
        out.push_str(raw.get());
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A stream's rejected rows never share its table, however long its
    /// name; names that were told apart before keep their tables.
    #[test]
    fn a_rejected_table_is_never_its_streams_own() {
        use crate::warehouse::sql_name;
        assert_eq!(rejected_stream("users"), "users__rejected");
        let medium = "m".repeat(55);
        assert_eq!(rejected_stream(&medium), format!("{medium}__rejected"), "already a table of its own");
        for long in ["l".repeat(60), "l".repeat(90), format!("9{}", "x".repeat(70)), "É".repeat(64)] {
            let rejected = sql_name(&rejected_stream(&long));
            assert_ne!(rejected, sql_name(&long), "{long}");
            assert!(rejected.ends_with("__rejected") && rejected.len() <= 60, "{rejected}");
            assert_eq!(rejected, sql_name(&rejected), "a name sql_name keeps as it is");
        }
        let (a, b) = (format!("{}a", "s".repeat(60)), format!("{}b", "s".repeat(60)));
        assert_eq!(sql_name(&a), sql_name(&b), "one table for both streams");
        assert_ne!(sql_name(&rejected_stream(&a)), sql_name(&rejected_stream(&b)), "each its own rejected rows");
    }

    fn schema() -> Value {
        json!({ "type": "object", "required": ["id"], "properties": {
            "id": { "type": "integer" },
            "name": { "type": ["string", "null"] },
            "amount": { "type": "number" },
            "status": { "type": "string", "enum": ["open", "closed"] },
            "meta": {},
            "a/b~c": { "type": "boolean" },
        } })
    }

    fn contract(new_columns: ContractMode, type_changes: ContractMode, invalid_records: ContractMode) -> Contract {
        let rules = StreamContract { new_columns, type_changes, invalid_records };
        Contract::new(rules, &schema(), &["id".to_owned()]).expect("a contract that judges")
    }

    /// A batch judged as it is shaped: the records a rule keeps aside
    /// are left out of the batch (kept as read), the values a rule
    /// discards left out of their records' fields (a new field dropped, a
    /// value of another type null, the key from the record as read), a
    /// record that is not an object fails the batch unless it is kept
    /// aside, and a rule that freezes fails the batch naming the stream.
    #[test]
    fn a_contract_judges_records_on_the_fields_shaped_for_the_destination() {
        use ContractMode::{DiscardValue, Evolve, Freeze, Quarantine};
        let schema = serde_json::json!({ "type": "object", "properties": {
            "id": { "type": "integer" }, "amount": { "type": "number" },
        } });
        let contract = |new_columns, type_changes, invalid_records| {
            let rules = StreamContract { new_columns, type_changes, invalid_records };
            Contract::new(rules, &schema, &["id".to_owned()]).unwrap()
        };
        let records: Vec<String> = [
            r#"{"id": 1, "amount": 2.5}"#,
            r#"{"id": 2, "extra": true, "amount": "lots"}"#,
            r#"[1, 2]"#,
            r#"{"amount": 3}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let dedupe = StreamSyncMode::IncrementalDeduped;
        let key = ["id".to_owned()];

        let c = contract(DiscardValue, DiscardValue, Quarantine);
        let (shaped, judged) =
            shape_judged("s", &records, (dedupe, &key, &AppendKeys::Fresh), (dedupe, &AppendKeys::Fresh), Some(&c))
                .unwrap();
        let fields: Vec<Vec<(String, String)>> = shaped
            .iter()
            .map(|s| s.fields.iter().map(|(n, v)| (n.to_string(), v.get().to_owned())).collect())
            .collect();
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            fields,
            vec![vec![pair("id", "1"), pair("amount", "2.5")], vec![pair("id", "2"), pair("amount", "null")]]
        );
        assert_eq!(shaped[1].raw_id, shape_keyed(&records[1], dedupe, &key, &AppendKeys::Fresh, 1).unwrap().raw_id);
        assert_eq!(judged.value_discarded, 1);
        let aside: Vec<(&str, RejectionReason)> =
            judged.rejected.iter().map(|r| (r.record.as_str(), r.breach.reason)).collect();
        assert_eq!(
            aside,
            vec![
                (records[2].as_str(), RejectionReason::NotAnObject),
                (records[3].as_str(), RejectionReason::MissingPrimaryKey)
            ]
        );

        let not_an_object = shape_judged(
            "s",
            &records,
            (dedupe, &key, &AppendKeys::Fresh),
            (dedupe, &AppendKeys::Fresh),
            Some(&contract(DiscardValue, Evolve, Evolve)),
        );
        assert!(matches!(not_an_object, Err(WriteError::BadRecord(m)) if m.contains("not a JSON object")));

        let frozen = shape_judged(
            "s",
            &records,
            (dedupe, &key, &AppendKeys::Fresh),
            (dedupe, &AppendKeys::Fresh),
            Some(&contract(Evolve, Freeze, Quarantine)),
        );
        let Err(WriteError::BadRecord(m)) = frozen else { panic!("the batch was not refused") };
        assert_eq!(
            m,
            "stream s: type_mismatch at /amount (contract rule type_changes), which the stream's contract freezes; nothing of the batch was written"
        );
    }

    impl Contract {
        /// The breaches of a record given as text.
        fn breaches(&self, record: &str) -> Vec<Breach> {
            let fields = serde_json::from_str::<Fields>(record).ok().map(|Fields(f)| f);
            self.breaches_of(fields.as_deref()).into_iter().map(|(_, b)| b).collect()
        }
    }

    fn records(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| (*t).to_owned()).collect()
    }

    /// Every rule evolving judges nothing.
    #[test]
    fn a_contract_that_evolves_everything_is_none() {
        assert!(Contract::new(StreamContract::default(), &schema(), &[]).is_none());
    }

    /// Each kind of breach, with its rule, reason and pointer; fitting
    /// values of every declared type (an integer as a number, 1.0 as an
    /// integer, null for anything) break nothing.
    #[test]
    fn each_breach_is_named_with_its_rule_reason_and_pointer() {
        use ContractMode::Quarantine as Q;
        let c = contract(Q, Q, Q);
        let fits = r#"{"id": 1.0, "name": null, "amount": 3, "status": "open", "meta": {"x": [1]}, "a/b~c": true}"#;
        assert_eq!(c.breaches(fits), vec![]);
        let cases: [(&str, ContractRule, RejectionReason, &str); 7] = [
            (r#"{"id": 1, "extra": 2}"#, ContractRule::NewColumns, RejectionReason::NewColumn, "/extra"),
            (r#"{"id": 1, "amount": "3"}"#, ContractRule::TypeChanges, RejectionReason::TypeMismatch, "/amount"),
            (r#"{"id": 1.5}"#, ContractRule::TypeChanges, RejectionReason::TypeMismatch, "/id"),
            (r#"{"id": 1, "status": "lost"}"#, ContractRule::TypeChanges, RejectionReason::NotInEnum, "/status"),
            (r#"{"id": 1, "a/b~c": "yes"}"#, ContractRule::TypeChanges, RejectionReason::TypeMismatch, "/a~1b~0c"),
            (r#"{"id": null}"#, ContractRule::InvalidRecords, RejectionReason::MissingPrimaryKey, "/id"),
            (r#"[1, 2]"#, ContractRule::InvalidRecords, RejectionReason::NotAnObject, ""),
        ];
        for (record, rule, reason, at) in cases {
            assert_eq!(c.breaches(record), vec![Breach { rule, reason, pointer: at.to_owned() }], "{record}");
        }
    }

    /// A declared decimal takes numbers, and numbers' text, that fit it
    /// exactly; more places or digits are out of its range, and text that
    /// is no number is of another type.
    #[test]
    fn a_declared_decimal_is_judged_by_its_places_and_digits() {
        use ContractMode::Quarantine as Q;
        let schema = serde_json::json!({ "type": "object", "properties": {
            "price": { "type": ["string", "number", "null"], "format": "decimal", "precision": 6, "scale": 2 },
        } });
        let rules = StreamContract { new_columns: Q, type_changes: Q, invalid_records: Q };
        let c = Contract::new(rules, &schema, &[]).unwrap();
        for fits in [r#"{"price": 1234.5}"#, r#"{"price": "-0.25"}"#, r#"{"price": 12}"#, r#"{"price": null}"#] {
            assert_eq!(c.breaches(fits), vec![], "{fits}");
        }
        let breach = |reason| Breach { rule: ContractRule::TypeChanges, reason, pointer: "/price".to_owned() };
        for (record, reason) in [
            (r#"{"price": 12.345}"#, RejectionReason::DecimalOutOfRange),
            (r#"{"price": "12.345"}"#, RejectionReason::DecimalOutOfRange),
            (r#"{"price": 12345}"#, RejectionReason::DecimalOutOfRange),
            (r#"{"price": "1\u0032.345"}"#, RejectionReason::DecimalOutOfRange),
            (r#"{"price": "n/a"}"#, RejectionReason::TypeMismatch),
        ] {
            assert_eq!(c.breaches(record), vec![breach(reason)], "{record}");
        }
    }

    /// A declared 32-bit integer takes integers in its range (1.0 among
    /// them); one beyond it is a type change.
    #[test]
    fn a_declared_32_bit_integer_is_judged_by_its_range() {
        use ContractMode::Quarantine as Q;
        let schema = serde_json::json!({ "type": "object", "properties": {
            "n": { "type": ["integer", "null"], "format": "int32" }, "m": { "type": "integer" } } });
        let rules = StreamContract { new_columns: Q, type_changes: Q, invalid_records: Q };
        let c = Contract::new(rules, &schema, &[]).unwrap();
        for fits in [r#"{"n": 2147483647}"#, r#"{"n": -2147483648}"#, r#"{"n": 1.0}"#, r#"{"m": 5000000000}"#] {
            assert_eq!(c.breaches(fits), vec![], "{fits}");
        }
        let breach =
            Breach { rule: ContractRule::TypeChanges, reason: RejectionReason::TypeMismatch, pointer: "/n".into() };
        for beyond in [r#"{"n": 2147483648}"#, r#"{"n": -5e9}"#] {
            assert_eq!(c.breaches(beyond), vec![breach.clone()], "{beyond}");
        }
    }

    /// Freeze fails the batch at the first frozen breach; quarantine keeps
    /// the record aside whole; discard leaves the values out (a new field
    /// dropped, another value null) and counts the record; evolve loads
    /// it as it is.
    #[test]
    fn each_mode_does_what_it_says_to_a_breaking_record() {
        use ContractMode::{DiscardValue, Evolve, Freeze, Quarantine};
        let batch = records(&[
            r#"{"id": 1, "amount": 2.5}"#,
            r#"{"id": 2, "amount": "lots", "extra": [1]}"#,
            r#"{"name": "no id"}"#,
        ]);
        let frozen = contract(Evolve, Freeze, Evolve).judge(batch.clone()).unwrap_err();
        assert_eq!(frozen.pointer, "/amount");
        assert_eq!(frozen.to_string(), "type_mismatch at /amount (contract rule type_changes)");

        let judged = contract(DiscardValue, Quarantine, Quarantine).judge(batch.clone()).unwrap();
        assert_eq!(judged.load, records(&[r#"{"id": 1, "amount": 2.5}"#]));
        assert_eq!(judged.rejected.len(), 2);
        assert_eq!(judged.rejected[0].record, batch[1], "kept whole, as read");
        assert_eq!(judged.rejected[0].breach.reason, RejectionReason::TypeMismatch);
        assert_eq!(judged.rejected[1].breach.reason, RejectionReason::MissingPrimaryKey);
        assert_eq!(judged.value_discarded, 0);

        let judged = contract(DiscardValue, DiscardValue, Evolve).judge(batch.clone()).unwrap();
        assert_eq!(judged.load[1], r#"{"id":2,"amount":null}"#);
        assert_eq!(judged.load[2], batch[2], "a missing key evolves: loaded as it is");
        assert_eq!(judged.value_discarded, 1);
        assert!(judged.rejected.is_empty());
    }
}
