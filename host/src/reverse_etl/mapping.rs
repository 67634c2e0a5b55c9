//! An activation's field mapping applied to model rows: which column (or
//! constant) each destination field takes, the row's key, and the
//! fingerprint of what would be sent.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::credentials::lookalike;
use crate::store::reverse_etl::FieldMapping;
use crate::warehouse::query::{Column, key_text};

/// Where a field's value comes from, resolved against the columns.
enum From {
    Column(usize),
    Constant(Value),
}

/// A mapping checked against a model's columns.
pub(crate) struct Mapper {
    fields: Vec<(String, From)>,
    key: usize,
    /// The position of the destination's matching field among `fields`.
    matching: Option<usize>,
}

/// Why a mapping does not fit a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MappingError {
    /// The JSON path of the offending input.
    pub field: String,
    pub message: String,
    /// The input is (or looks like) a secret, which belongs in a
    /// credential.
    pub secret: bool,
}

impl Mapper {
    /// Resolves `mappings` against `columns`; `primary_key` must be a
    /// column, and `matching` (the destination's matching field), when
    /// given, must be mapped.
    pub(crate) fn new(
        mappings: &[FieldMapping],
        columns: &[Column],
        primary_key: &str,
        matching: Option<&str>,
    ) -> Result<Mapper, MappingError> {
        let position = |name: &str| columns.iter().position(|c| c.name == name);
        let key = position(primary_key).ok_or_else(|| MappingError {
            field: "primary_key".into(),
            message: format!("the model's result has no column {primary_key}"),
            secret: false,
        })?;
        let mut fields = Vec::with_capacity(mappings.len());
        for (i, m) in mappings.iter().enumerate() {
            let at = format!("mappings[{i}]");
            if m.field.trim().is_empty() {
                return Err(MappingError {
                    field: format!("{at}.field"),
                    message: "field must name a destination field".into(),
                    secret: false,
                });
            }
            if fields.iter().any(|(f, _): &(String, From)| *f == m.field) {
                return Err(MappingError {
                    field: format!("{at}.field"),
                    message: format!("field {} is mapped twice", m.field),
                    secret: false,
                });
            }
            let from = match (&m.column, &m.value) {
                (Some(c), None) => From::Column(position(c).ok_or_else(|| MappingError {
                    field: format!("{at}.column"),
                    message: format!("the model's result has no column {c}"),
                    secret: false,
                })?),
                (None, Some(v)) => {
                    // A secret goes through a credential flow, never into a
                    // mapping that every reader of the activation sees.
                    if lookalike::is_secret_name(&m.field) {
                        return Err(MappingError {
                            field: format!("{at}.value"),
                            message: format!(
                                "field {} takes a secret, which cannot be a constant: the destination's credential supplies it",
                                m.field
                            ),
                            secret: true,
                        });
                    }
                    if lookalike::find_secret(v, "").is_some() {
                        return Err(MappingError {
                            field: format!("{at}.value"),
                            message:
                                "the constant looks like a secret; secrets enter only through the credential flows"
                                    .into(),
                            secret: true,
                        });
                    }
                    From::Constant(v.clone())
                }
                _ => {
                    return Err(MappingError {
                        field: at,
                        message: "each mapping takes exactly one of column and value".into(),
                        secret: false,
                    });
                }
            };
            fields.push((m.field.clone(), from));
        }
        if fields.is_empty() {
            return Err(MappingError {
                field: "mappings".into(),
                message: "map at least one destination field".into(),
                secret: false,
            });
        }
        let matching = match matching {
            Some(name) => Some(fields.iter().position(|(f, _)| f == name).ok_or_else(|| MappingError {
                field: "mappings".into(),
                message: format!("the destination matches records by {name}: map a column to it"),
                secret: false,
            })?),
            None => None,
        };
        Ok(Mapper { fields, key, matching })
    }

    /// The row's key, `None` when it is null.
    pub(crate) fn key(&self, row: &[Value]) -> Option<String> {
        row.get(self.key).and_then(key_text)
    }

    /// The record sent for `row`: its mapped fields.
    pub(crate) fn record(&self, row: &[Value]) -> Map<String, Value> {
        self.values(row).map(|(field, value)| (field.to_owned(), value.clone())).collect()
    }

    /// The fingerprint of the record `row` makes and its size, without
    /// building the record.
    pub(crate) fn fingerprint(&self, row: &[Value]) -> (i64, usize) {
        fingerprint_of(self.values(row))
    }

    /// Each mapped field of `row` with its value, in mapping order.
    fn values<'a>(&'a self, row: &'a [Value]) -> impl Iterator<Item = (&'a str, &'a Value)> {
        static NULL: Value = Value::Null;
        self.fields.iter().map(move |(field, from)| {
            let value = match from {
                From::Column(i) => row.get(*i).unwrap_or(&NULL),
                From::Constant(v) => v,
            };
            (field.as_str(), value)
        })
    }

    /// The value of the destination's matching field in `record`, as text.
    pub(crate) fn matching_value(&self, record: &Map<String, Value>) -> Option<String> {
        self.matching.and_then(|i| record.get(&self.fields[i].0)).and_then(key_text)
    }

    /// The value of the destination's matching field for `row`, as text.
    pub(crate) fn row_matching_value(&self, row: &[Value]) -> Option<String> {
        self.matching.and_then(|i| self.values(row).nth(i)).and_then(|(_, v)| key_text(v))
    }
}

/// A stable 64-bit fingerprint of a record (field names and JSON values,
/// in mapping order), the same on every server and version, with the
/// size of that text in bytes.
fn fingerprint_of<'a>(fields: impl Iterator<Item = (&'a str, &'a Value)>) -> (i64, usize) {
    /// Hashes what JSON serialisation writes, counting it, without
    /// building the text.
    struct Hashing(Sha256, usize);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            self.1 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Hashing(Sha256::new(), 0);
    for (k, v) in fields {
        out.0.update(k.as_bytes());
        out.0.update([0]);
        out.1 += k.len() + 4;
        // Writing a JSON value into memory cannot fail.
        let _ = serde_json::to_writer(&mut out, v);
        out.0.update([1]);
    }
    let digest = out.0.finalize();
    (i64::from_le_bytes(digest[..8].try_into().expect("eight bytes")), out.1)
}

/// Suggested mappings: each destination field takes the column with the
/// same name, compared without case, `_`, `-` or spaces.
pub(crate) fn suggest(fields: &[String], columns: &[Column]) -> Vec<FieldMapping> {
    let plain = |s: &str| s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    fields
        .iter()
        .filter_map(|f| {
            columns.iter().find(|c| plain(&c.name) == plain(f)).map(|c| FieldMapping {
                field: f.clone(),
                column: Some(c.name.clone()),
                value: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn columns(names: &[&str]) -> Vec<Column> {
        names.iter().map(|n| Column { name: (*n).into(), type_name: "TEXT".into() }).collect()
    }

    fn map(field: &str, column: &str) -> FieldMapping {
        FieldMapping { field: field.into(), column: Some(column.into()), value: None }
    }

    #[test]
    fn rows_become_records_with_constants_and_a_stable_fingerprint() {
        let cols = columns(&["id", "mail", "first"]);
        let mappings = vec![
            map("email", "mail"),
            map("first_name", "first"),
            FieldMapping { field: "source".into(), column: None, value: Some(json!("warehouse")) },
        ];
        let m = Mapper::new(&mappings, &cols, "id", Some("email")).unwrap();
        let row = vec![json!(7), json!("a@b.c"), json!("Ada")];
        assert_eq!(m.key(&row).as_deref(), Some("7"));
        let record = m.record(&row);
        assert_eq!(
            Value::Object(record.clone()),
            json!({ "email": "a@b.c", "first_name": "Ada", "source": "warehouse" })
        );
        assert_eq!(m.matching_value(&record).as_deref(), Some("a@b.c"));
        assert_eq!(m.row_matching_value(&row).as_deref(), Some("a@b.c"));
        // Stable: the same row gives the same fingerprint, a changed value
        // another, and the size counts the JSON text of names and values.
        assert_eq!(m.fingerprint(&row), m.fingerprint(&row.clone()));
        assert_ne!(m.fingerprint(&row).0, m.fingerprint(&[json!(7), json!("a@b.c"), json!("Grace")]).0);
        assert_eq!(
            m.fingerprint(&row).1,
            "email".len() + "first_name".len() + "source".len() + 12 + "\"a@b.c\"\"Ada\"\"warehouse\"".len()
        );
        // Pinned, so a change of algorithm cannot slip in and resend every row.
        const PINNED: i64 = 2_832_440_833_469_680_556;
        assert_eq!(m.fingerprint(&row).0, PINNED);
        assert_eq!(m.key(&[Value::Null, json!("x"), json!("y")]), None);
    }

    #[test]
    fn mappings_that_do_not_fit_are_refused_with_the_field_at_fault() {
        let cols = columns(&["id", "mail"]);
        assert_eq!(Mapper::new(&[map("email", "mail")], &cols, "nope", None).err().unwrap().field, "primary_key");
        assert_eq!(
            Mapper::new(&[map("email", "missing")], &cols, "id", None).err().unwrap().field,
            "mappings[0].column"
        );
        assert_eq!(
            Mapper::new(&[map("email", "mail"), map("email", "id")], &cols, "id", None).err().unwrap().field,
            "mappings[1].field"
        );
        assert_eq!(
            Mapper::new(&[map("first_name", "mail")], &cols, "id", Some("email")).err().unwrap().field,
            "mappings"
        );
        let both = FieldMapping { field: "x".into(), column: Some("id".into()), value: Some(json!(1)) };
        assert_eq!(Mapper::new(&[both], &cols, "id", None).err().unwrap().field, "mappings[0]");
        assert_eq!(Mapper::new(&[], &cols, "id", None).err().unwrap().field, "mappings");
    }

    #[test]
    fn suggestions_match_names_loosely() {
        let cols = columns(&["Email", "first-name", "plan"]);
        let got = suggest(&["email".into(), "first_name".into(), "last_name".into()], &cols);
        assert_eq!(got, vec![map("email", "Email"), map("first_name", "first-name")]);
    }
}
