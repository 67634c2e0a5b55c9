//! Incremental reads with an exact boundary.
//!
//! The state is the newest cursor value a read saw and the primary keys of
//! the records that carry exactly that value: `{"cursor": ..., "keys":
//! [[...], ...]}`. The next read asks the API for records from that value
//! on (APIs' `since` filters include it), skips records older than it, and
//! skips records *at* it whose key it already has. So a second read emits
//! exactly the records that are new or changed, even when several records
//! share the boundary value. (Without a primary key, records at the
//! boundary are read again: the destination's key cannot absorb them.)
//!
//! Pages need not come in cursor order: a read checkpoints the state it
//! started from after each page (safe to resume from) and the newest one
//! only at its end.
//!
//! Cursor values compare as instants when both parse as timestamps, as
//! numbers when both are numbers or texts of digits, and as text when both
//! are written in one fixed format (digits where the other has digits, the
//! same characters elsewhere: `2024-01-01 10:00`). Nothing else compares:
//! a record without a cursor (null or empty), or with one that cannot be
//! compared, is emitted and never becomes the saved boundary, so one odd
//! value can neither hide later records nor stop later reads.

use std::cmp::Ordering;

use connector_sdk::time::Timestamp;
use connector_sdk::{Value, json};
use serde::{Deserialize, Serialize};

use crate::manifest::CursorFormat;

/// Keys kept at the boundary at most; past this, records at the boundary
/// value are read again rather than the state growing without end.
const MAX_BOUNDARY_KEYS: usize = 10_000;

/// A cursor value and the keys of the records seen at it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Boundary {
    pub cursor: Value,
    #[serde(default)]
    pub keys: Vec<Vec<Value>>,
}

/// How two cursor values compare; `None` when they cannot be.
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => x.as_f64()?.partial_cmp(&y.as_f64()?),
        },
        (Value::String(x), Value::String(y)) => match (Timestamp::parse(x), Timestamp::parse(y)) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ if digits(x) && digits(y) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                Some(x.len().cmp(&y.len()).then_with(|| x.cmp(y)))
            }
            _ if same_format(x, y) => Some(x.cmp(y)),
            _ => None,
        },
        _ => None,
    }
}

/// A non-empty text of ASCII digits.
fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Two texts of one fixed format: as long as each other, with digits in
/// the same places and the same characters in all others.
fn same_format(x: &str, y: &str) -> bool {
    !x.is_empty()
        && x.len() == y.len()
        && x.bytes().zip(y.bytes()).all(|(a, b)| a == b || (a.is_ascii_digit() && b.is_ascii_digit()))
}

/// A cursor value written as a request parameter wants it; `None` when it
/// cannot be (a text that is no timestamp, asked for as Unix seconds).
pub fn format(value: &Value, format: CursorFormat) -> Option<String> {
    let instant = || match value {
        Value::String(text) => Timestamp::parse(text),
        Value::Number(n) => n.as_i64().map(Timestamp::from_unix_seconds),
        _ => None,
    };
    match (format, value) {
        (CursorFormat::Raw, Value::String(text)) => Some(text.clone()),
        (CursorFormat::Raw, Value::Number(n)) => Some(n.to_string()),
        (CursorFormat::Rfc3339, Value::String(text)) if Timestamp::parse(text).is_some() => Some(text.clone()),
        (CursorFormat::Rfc3339, _) => instant().map(Timestamp::to_rfc3339),
        (CursorFormat::Unix, Value::Number(n)) | (CursorFormat::UnixMs, Value::Number(n)) => Some(n.to_string()),
        (CursorFormat::Unix, _) => instant().map(|t| t.unix_seconds().to_string()),
        (CursorFormat::UnixMs, _) => instant().map(|t| t.unix_millis().to_string()),
        (CursorFormat::Date, _) => instant().map(Timestamp::date),
        _ => None,
    }
}

/// One incremental read of a stream.
#[derive(Debug)]
pub struct IncrementalRead {
    /// Where the read starts: the saved state, or the manifest's start
    /// (with no keys: inclusive).
    from: Option<Boundary>,
    /// Whether `from` is a saved state (to checkpoint again) or only the
    /// manifest's start.
    saved: bool,
    /// The newest value seen so far and the keys seen at it.
    newest: Option<Boundary>,
    /// The format the value is sent in, if it is sent: a value that cannot
    /// be written in it is never saved.
    format: Option<CursorFormat>,
}

impl IncrementalRead {
    pub fn new(state: Option<Boundary>, start: Option<Value>, format: Option<CursorFormat>) -> Self {
        let saved = state.is_some();
        let from = state.or_else(|| start.map(|cursor| Boundary { cursor, keys: Vec::new() }));
        IncrementalRead { from, saved, newest: None, format }
    }

    /// The value the read asks the API for records from.
    pub fn from(&self) -> Option<&Value> {
        self.from.as_ref().map(|b| &b.cursor)
    }

    /// Whether a record with this cursor and key is new to the
    /// destination; remembers it either way.
    pub fn admits(&mut self, cursor: Option<Value>, key: Option<Vec<Value>>) -> bool {
        let Some(cursor) = cursor.filter(|c| !c.is_null() && c.as_str() != Some("")) else {
            return true;
        };
        let (admitted, comparable) = match &self.from {
            None => (true, true),
            Some(from) => match compare(&cursor, &from.cursor) {
                Some(Ordering::Less) => (false, true),
                Some(Ordering::Equal) => (key.as_ref().is_none_or(|k| !from.keys.contains(k)), true),
                Some(Ordering::Greater) => (true, true),
                None => (true, false),
            },
        };
        let writable = self.format.is_none_or(|f| format(&cursor, f).is_some());
        if comparable && writable {
            self.remember(cursor, key);
        }
        admitted
    }

    fn remember(&mut self, cursor: Value, key: Option<Vec<Value>>) {
        let order = self.newest.as_ref().map(|n| compare(&cursor, &n.cursor));
        match order {
            None | Some(Some(Ordering::Greater)) => {
                self.newest = Some(Boundary { cursor, keys: key.into_iter().collect() });
            }
            Some(Some(Ordering::Equal)) => {
                if let (Some(newest), Some(key)) = (self.newest.as_mut(), key)
                    && newest.keys.len() < MAX_BOUNDARY_KEYS
                    && !newest.keys.contains(&key)
                {
                    newest.keys.push(key);
                }
            }
            Some(_) => {}
        }
    }

    /// The state to checkpoint mid-read: where the read started (nothing
    /// before a first state exists).
    pub fn resume_state(&self) -> Option<Value> {
        self.from.as_ref().filter(|_| self.saved).map(|b| json!(b))
    }

    /// The newest value seen so far, when `cursor` comes before it: a
    /// record out of the ascending order a sorted stream promises.
    pub fn behind(&self, cursor: &Value) -> Option<&Value> {
        let newest = self.newest.as_ref()?;
        (compare(cursor, &newest.cursor) == Some(Ordering::Less)).then_some(&newest.cursor)
    }

    /// The state to checkpoint at the end: the newest boundary, never
    /// before where the read started. For a sorted stream, also after
    /// each page.
    pub fn final_state(&self) -> Option<Value> {
        let from = self.from.as_ref().filter(|_| self.saved);
        let boundary = match (from, &self.newest) {
            (None, None) => return None,
            (Some(from), None) => from.clone(),
            (None, Some(newest)) => newest.clone(),
            (Some(from), Some(newest)) => match compare(&newest.cursor, &from.cursor) {
                Some(Ordering::Greater) => newest.clone(),
                Some(Ordering::Equal) => {
                    let mut keys = from.keys.clone();
                    for key in &newest.keys {
                        if keys.len() < MAX_BOUNDARY_KEYS && !keys.contains(key) {
                            keys.push(key.clone());
                        }
                    }
                    Boundary { cursor: from.cursor.clone(), keys }
                }
                Some(Ordering::Less) | None => from.clone(),
            },
        };
        Some(json!(boundary))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_value_before_the_newest_is_behind() {
        let mut read = IncrementalRead::new(None, None, None);
        assert_eq!(read.behind(&json!("2024-01-01T00:05:00Z")), None, "nothing read yet");
        read.admits(Some(json!("2024-01-01T00:05:00Z")), Some(vec![json!(5)]));
        assert_eq!(read.behind(&json!("2024-01-01T00:05:00Z")), None, "a tie is in order");
        assert_eq!(read.behind(&json!("2024-01-01T00:06:00Z")), None);
        assert_eq!(read.behind(&json!("2024-01-01T00:04:00Z")), Some(&json!("2024-01-01T00:05:00Z")));
    }
    use super::*;

    fn key(id: i64) -> Option<Vec<Value>> {
        Some(vec![json!(id)])
    }

    #[test]
    fn a_second_read_admits_exactly_what_is_new_at_and_past_the_boundary() {
        let mut first = IncrementalRead::new(None, None, None);
        for (id, at) in [(1, "2024-01-01T00:00:00Z"), (2, "2024-01-02T00:00:00Z"), (3, "2024-01-02T00:00:00Z")] {
            assert!(first.admits(Some(json!(at)), key(id)));
        }
        assert_eq!(first.resume_state(), None, "nothing to resume from before a first state");
        let state: Boundary = serde_json::from_value(first.final_state().unwrap()).unwrap();
        assert_eq!(
            state,
            Boundary { cursor: json!("2024-01-02T00:00:00Z"), keys: vec![vec![json!(2)], vec![json!(3)]] }
        );

        // The API's `since` includes the boundary: 2 and 3 come again, with
        // 4 (new at the boundary) and 5 (past it).
        let mut second = IncrementalRead::new(Some(state.clone()), None, None);
        let admitted: Vec<i64> = [
            (2, "2024-01-02T00:00:00Z"),
            (3, "2024-01-02T00:00:00Z"),
            (4, "2024-01-02T00:00:00Z"),
            (5, "2024-01-03T00:00:00Z"),
            (6, "2023-12-31T00:00:00Z"),
        ]
        .into_iter()
        .filter(|(id, at)| second.admits(Some(json!(at)), key(*id)))
        .map(|(id, _)| id)
        .collect();
        assert_eq!(admitted, vec![4, 5]);
        assert_eq!(second.resume_state(), Some(json!(state)));
        assert_eq!(second.final_state(), Some(json!({ "cursor": "2024-01-03T00:00:00Z", "keys": [[5]] })));
    }

    #[test]
    fn a_read_that_finds_nothing_newer_keeps_and_widens_its_boundary() {
        let from = Boundary { cursor: json!(100), keys: vec![vec![json!("a")]] };
        let mut read = IncrementalRead::new(Some(from), None, None);
        assert!(!read.admits(Some(json!(100)), Some(vec![json!("a")])));
        assert!(read.admits(Some(json!(100)), Some(vec![json!("b")])));
        assert!(!read.admits(Some(json!(99)), Some(vec![json!("c")])));
        assert_eq!(read.final_state(), Some(json!({ "cursor": 100, "keys": [["a"], ["b"]] })));
    }

    #[test]
    fn timestamps_compare_as_instants_and_records_without_a_cursor_pass() {
        assert_eq!(compare(&json!("2024-03-01T12:00:00+02:00"), &json!("2024-03-01T10:30:00Z")), Some(Ordering::Less));
        assert_eq!(compare(&json!(10), &json!(9.5)), Some(Ordering::Greater));
        assert_eq!(compare(&json!("2024-01-02 09:00"), &json!("2024-01-01 10:00")), Some(Ordering::Greater));
        assert_eq!(compare(&json!("1000"), &json!("999")), Some(Ordering::Greater), "digits compare as numbers");
        assert_eq!(compare(&json!("007"), &json!("7")), Some(Ordering::Equal));
        assert_eq!(compare(&json!("zzz"), &json!("2024-01-01T00:00:00Z")), None);
        assert_eq!(compare(&json!("b"), &json!("a")), None, "opaque texts have no order");
        assert_eq!(compare(&json!(1), &json!("1")), None);
        let mut read = IncrementalRead::new(None, Some(json!("2024-01-01")), None);
        assert!(read.admits(None, key(1)));
        assert!(!read.admits(Some(json!("2023-06-01")), key(2)), "before the manifest's start");
        assert!(read.admits(Some(json!("2024-01-01T00:00:00Z")), key(3)), "the start is inclusive");
        assert_eq!(read.from(), Some(&json!("2024-01-01")));
    }

    #[test]
    fn an_odd_cursor_value_is_emitted_but_never_becomes_the_boundary() {
        let from = Boundary { cursor: json!("2024-01-01T00:00:00Z"), keys: Vec::new() };
        let mut read = IncrementalRead::new(Some(from.clone()), None, Some(CursorFormat::Rfc3339));
        assert!(read.admits(Some(json!("zzz")), key(1)), "emitted: better twice than never");
        assert!(read.admits(Some(json!("")), key(2)), "empty is no cursor");
        assert_eq!(read.final_state(), Some(json!(from)), "the boundary is not poisoned");
        assert!(read.admits(Some(json!("2024-02-01T00:00:00Z")), key(3)));
        assert_eq!(read.final_state(), Some(json!({ "cursor": "2024-02-01T00:00:00Z", "keys": [[3]] })));

        // With nothing saved, a first odd value does not become the boundary
        // either when the parameter could not be written from it.
        let mut first = IncrementalRead::new(None, None, Some(CursorFormat::Unix));
        assert!(first.admits(Some(json!("N/A")), key(1)));
        assert!(first.admits(Some(json!("2024-03-01T00:00:00Z")), key(2)));
        assert_eq!(first.final_state(), Some(json!({ "cursor": "2024-03-01T00:00:00Z", "keys": [[2]] })));

        // Numbers written as text: 1000 is after 999.
        let mut numbers = IncrementalRead::new(Some(Boundary { cursor: json!("999"), keys: Vec::new() }), None, None);
        assert!(numbers.admits(Some(json!("1000")), key(4)));
        assert!(!numbers.admits(Some(json!("998")), key(5)));
        assert_eq!(numbers.final_state(), Some(json!({ "cursor": "1000", "keys": [[4]] })));
    }

    #[test]
    fn cursor_values_are_written_as_parameters_want_them() {
        let text = json!("2024-03-01T11:30:00+02:00");
        assert_eq!(format(&text, CursorFormat::Raw).unwrap(), "2024-03-01T11:30:00+02:00");
        assert_eq!(format(&text, CursorFormat::Rfc3339).unwrap(), "2024-03-01T11:30:00+02:00");
        assert_eq!(format(&text, CursorFormat::Unix).unwrap(), "1709285400");
        assert_eq!(format(&text, CursorFormat::UnixMs).unwrap(), "1709285400000");
        assert_eq!(format(&text, CursorFormat::Date).unwrap(), "2024-03-01");
        assert_eq!(format(&json!(1709285400), CursorFormat::Rfc3339).unwrap(), "2024-03-01T09:30:00Z");
        assert_eq!(format(&json!("soon"), CursorFormat::Unix), None);
    }
}
