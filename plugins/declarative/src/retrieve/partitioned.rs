//! The state of a stream with a cursor and partition routers, as the CDK's
//! `ConcurrentPerPartitionCursor` keeps it: a cursor per partition (each
//! read in its own windows from its own state), a global cursor (the
//! latest value seen in the last read that saw one, where a partition new
//! to the state starts, less the duration of that read), and that
//! duration:
//!
//! ```json
//! {"use_global_cursor": false,
//!  "states": [{"partition": {"id": 1, "parent_slice": {}}, "cursor": {"updated_at": "…"}}],
//!  "state": {"updated_at": "…"}, "lookback_window": 2, "parent_state": {}}
//! ```
//!
//! A state in the global form (`{cursor_field: value}`, as a stream kept
//! before it had partitions) starts every partition there.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use super::ReadError;
use super::incremental::{CursorState, Instant};
use crate::model::cursor::DatetimeCursor;

/// One partition's cursor: the partition as the state names it, and
/// whether this read generated it already.
#[derive(Debug, Clone)]
struct Partition {
    key: String,
    partition: Value,
    state: CursorState,
    seen: bool,
}

/// The cursors of a partitioned stream.
#[derive(Debug, Clone)]
pub struct PartitionedState {
    /// In the order the state listed them, then as this read found them.
    partitions: Vec<Partition>,
    /// The global cursor the read started from, formatted.
    global: Option<String>,
    /// The latest value this read saw (or a partition ended at).
    new_global: Option<String>,
    /// Whether any record held a cursor value.
    synced: bool,
    /// Seconds, the duration of the last read that saw a record.
    lookback_secs: i64,
    /// What the routers keep of their parents (`{}` for one
    /// `SubstreamPartitionRouter`, nothing for a list or a list of them).
    parent_state: Option<Value>,
    now: DateTime<Utc>,
}

impl PartitionedState {
    /// The state of the stream from a saved `state`; `parent_state` is
    /// what its routers keep.
    pub fn new(
        cursor: &DatetimeCursor,
        state: Option<&Value>,
        parent_state: Option<Value>,
        now: DateTime<Utc>,
    ) -> Result<PartitionedState, ReadError> {
        let mut out = PartitionedState {
            partitions: Vec::new(),
            global: None,
            new_global: None,
            synced: false,
            lookback_secs: 0,
            parent_state,
            now,
        };
        let state = match state {
            None | Some(Value::Null) => return Ok(out),
            Some(Value::Object(m)) if m.is_empty() => return Ok(out),
            Some(Value::Object(m)) => m,
            Some(other) => return Err(ReadError::Invalid(format!("the saved state {other} is not an object"))),
        };
        if !state.contains_key("states") && !state.contains_key("state") {
            // The global form: every partition starts at its value.
            out.set_global(cursor, state)?;
            return Ok(out);
        }
        if state.get("use_global_cursor").is_some_and(|v| v == &Value::Bool(true)) {
            return Err(ReadError::Invalid(
                "the saved state keeps one cursor for every partition (use_global_cursor), which is not supported yet"
                    .into(),
            ));
        }
        out.lookback_secs = match state.get("lookback_window") {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)).ok_or_else(|| {
                ReadError::Invalid(format!("the saved state's lookback_window ({v}) is not a number of seconds"))
            })?,
        };
        for entry in state.get("states").and_then(Value::as_array).into_iter().flatten() {
            let (Some(partition), Some(saved)) = (entry.get("partition"), entry.get("cursor")) else {
                return Err(ReadError::Invalid("a partition of the saved state lacks its partition or cursor".into()));
            };
            let key = key_of(partition);
            let state = CursorState::new(cursor, Some(saved), now)?;
            match out.partitions.iter_mut().find(|p| p.key == key) {
                Some(p) => p.state = state,
                None => out.partitions.push(Partition { key, partition: partition.clone(), state, seen: false }),
            }
        }
        if let Some(Value::Object(global)) = state.get("state") {
            out.set_global(cursor, global)?;
        }
        Ok(out)
    }

    fn set_global(&mut self, cursor: &DatetimeCursor, state: &Map<String, Value>) -> Result<(), ReadError> {
        if let Some(v) = state.get(&cursor.field) {
            let at = cursor.parse(v).ok_or_else(|| {
                ReadError::Invalid(format!(
                    "the saved state's {} ({v}) matches none of the cursor's formats",
                    cursor.field
                ))
            })?;
            self.global = Some(cursor.output(&at));
            self.new_global = self.global.clone();
        }
        Ok(())
    }

    /// The index of `partition`'s cursor, made from the global cursor
    /// (less the last read's duration) for a partition new to the state;
    /// `None` for a partition this read already generated.
    pub fn partition(&mut self, cursor: &DatetimeCursor, partition: &Value) -> Result<Option<usize>, ReadError> {
        let key = key_of(partition);
        if let Some(i) = self.partitions.iter().position(|p| p.key == key) {
            if self.partitions[i].seen {
                return Ok(None);
            }
            self.partitions[i].seen = true;
            return Ok(Some(i));
        }
        let start = match &self.global {
            None => None,
            Some(global) => {
                let at = cursor.parse(&Value::String(global.clone())).ok_or_else(|| {
                    ReadError::Invalid(format!("the global cursor {global:?} cannot be read with the cursor's formats"))
                })?;
                let at = at - chrono::TimeDelta::seconds(self.lookback_secs);
                Some(json!({ cursor.field.clone(): cursor.output(&at) }))
            }
        };
        let state = CursorState::new(cursor, start.as_ref(), self.now)?;
        self.partitions.push(Partition { key, partition: partition.clone(), state, seen: true });
        Ok(Some(self.partitions.len() - 1))
    }

    /// Partition `i`'s cursor.
    pub fn cursor_state(&mut self, i: usize) -> &mut CursorState {
        &mut self.partitions[i].state
    }

    /// The latest cursor value of a window's records, seen.
    pub fn observe(&mut self, cursor: &DatetimeCursor, latest: Option<Instant>) {
        if let Some(latest) = latest {
            self.synced = true;
            self.raise_global(cursor.output(&latest));
        }
    }

    /// Partition `i` read to its end: the global cursor is at least its
    /// state.
    pub fn close(&mut self, cursor: &DatetimeCursor, i: usize) {
        let state = self.partitions[i].state.state(cursor);
        if let Some(Value::String(v)) = state.get(&cursor.field) {
            self.raise_global(v.clone());
        }
    }

    /// As the CDK compares them: formatted values, as text.
    fn raise_global(&mut self, value: String) {
        if self.new_global.as_ref().is_none_or(|g| *g < value) {
            self.new_global = Some(value);
        }
    }

    /// The read ended after `elapsed_secs` (rounded up): a read that saw
    /// a record moves the global cursor and keeps its duration.
    pub fn finish(&mut self, elapsed_secs: i64) {
        if self.synced {
            self.global = self.new_global.clone();
            self.lookback_secs = elapsed_secs;
        }
    }

    /// The state to save.
    pub fn state(&self, cursor: &DatetimeCursor) -> Value {
        let states: Vec<Value> = self
            .partitions
            .iter()
            .map(|p| json!({ "partition": p.partition, "cursor": p.state.state(cursor) }))
            .collect();
        let mut out = json!({ "use_global_cursor": false, "states": states, "lookback_window": self.lookback_secs });
        if let Some(global) = &self.global {
            out["state"] = json!({ cursor.field.clone(): global });
        }
        if let Some(parent) = &self.parent_state {
            out["parent_state"] = parent.clone();
        }
        out
    }
}

/// A partition's key: its JSON with sorted keys, as the CDK's serializer
/// writes it.
fn key_of(partition: &Value) -> String {
    // Without `preserve_order`, maps are sorted.
    partition.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpolation::Val;
    use crate::model::node::Node;

    fn cursor() -> DatetimeCursor {
        let component = json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at",
            "datetime_format": "%Y-%m-%dT%H:%M:%SZ", "start_datetime": "2024-01-01T00:00:00Z" });
        let config = Val::from(&json!({}));
        DatetimeCursor::read(&Node::at(&component, "/c").unwrap(), &config, now()).unwrap()
    }

    fn now() -> DateTime<Utc> {
        "2024-01-03T12:00:00Z".parse().unwrap()
    }

    fn at(text: &str) -> Instant {
        chrono::DateTime::parse_from_rfc3339(text).unwrap()
    }

    #[test]
    fn each_partition_keeps_its_cursor_and_a_new_one_starts_at_the_global_less_the_last_reads_duration() {
        let c = cursor();
        let mut first = PartitionedState::new(&c, None, Some(json!({})), now()).unwrap();
        let a = first.partition(&c, &json!({ "id": 1, "parent_slice": {} })).unwrap().unwrap();
        let b = first.partition(&c, &json!({ "id": 2, "parent_slice": {} })).unwrap().unwrap();
        // A partition generated twice in one read is read once.
        assert_eq!(first.partition(&c, &json!({ "parent_slice": {}, "id": 1 })).unwrap(), None);
        for (i, latest) in [(a, "2024-01-02T00:00:00Z"), (b, "2024-01-03T00:00:00Z")] {
            let windows = first.cursor_state(i).windows(&c).unwrap();
            for w in &windows {
                first.cursor_state(i).close(&c, w, Some(at(latest))).unwrap();
            }
            first.observe(&c, Some(at(latest)));
            first.close(&c, i);
        }
        first.finish(3);
        let saved = first.state(&c);
        assert_eq!(
            saved,
            json!({ "use_global_cursor": false, "lookback_window": 3, "parent_state": {},
                "state": { "updated_at": "2024-01-03T00:00:00Z" },
                "states": [
                    { "partition": { "id": 1, "parent_slice": {} }, "cursor": { "updated_at": "2024-01-02T00:00:00Z" } },
                    { "partition": { "id": 2, "parent_slice": {} }, "cursor": { "updated_at": "2024-01-03T00:00:00Z" } },
                ] })
        );
        let mut again = PartitionedState::new(&c, Some(&saved), None, now()).unwrap();
        let a = again.partition(&c, &json!({ "id": 1, "parent_slice": {} })).unwrap().unwrap();
        assert_eq!(again.cursor_state(a).windows(&c).unwrap()[0].start, "2024-01-02T00:00:00Z");
        let new = again.partition(&c, &json!({ "id": 3, "parent_slice": {} })).unwrap().unwrap();
        assert_eq!(again.cursor_state(new).windows(&c).unwrap()[0].start, "2024-01-02T23:59:57Z");
        // A read that saw nothing keeps the global cursor and duration.
        again.finish(9);
        let kept = again.state(&c);
        assert_eq!((&kept["state"], &kept["lookback_window"]), (&saved["state"], &json!(3)));
        assert!(kept.get("parent_state").is_none());
        assert_eq!(kept["states"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_global_state_starts_every_partition_and_a_state_of_one_cursor_for_all_is_refused() {
        let c = cursor();
        let mut s =
            PartitionedState::new(&c, Some(&json!({ "updated_at": "2024-01-02T00:00:00Z" })), None, now()).unwrap();
        let i = s.partition(&c, &json!({ "region": "eu" })).unwrap().unwrap();
        assert_eq!(s.cursor_state(i).windows(&c).unwrap()[0].start, "2024-01-02T00:00:00Z");
        let refused = PartitionedState::new(&c, Some(&json!({ "use_global_cursor": true, "state": {} })), None, now());
        assert!(matches!(refused, Err(ReadError::Invalid(m)) if m.contains("use_global_cursor")));
    }
}
