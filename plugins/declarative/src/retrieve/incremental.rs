//! Incremental reads as the CDK's concurrent cursor makes them: the
//! windows a stream is read in (from the start, or from the state, less
//! the lookback, to the end, a step at a time), the latest cursor value
//! seen in each, the intervals read merged, and the state they give —
//! `{cursor_field: value}`, the CDK's own (sequential) state, so a state
//! either side wrote is one the other reads.

use chrono::{DateTime, FixedOffset, Utc};
use serde_json::{Map, Value};

use super::ReadError;
use crate::datetime::Gap;
use crate::model::cursor::DatetimeCursor;

/// A cursor value read, with the offset it was written with.
pub type Instant = DateTime<FixedOffset>;

/// An interval of the cursor read, and the latest value seen in it.
#[derive(Debug, Clone, PartialEq)]
struct Interval {
    start: Instant,
    end: Instant,
    latest: Option<Instant>,
}

/// One window of a read: its bounds, as the slice (and a request) holds
/// them, in the cursor's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub start: String,
    pub end: String,
}

/// What a stream's cursor knows: the intervals read, and the rest of the
/// state it was given.
#[derive(Debug, Clone)]
pub struct CursorState {
    intervals: Vec<Interval>,
    /// The state as given, minus nothing: its other keys are kept.
    legacy: Map<String, Value>,
    /// Where this read starts (the state's value, or the start).
    sync_start: Instant,
    /// The end of the read, fixed when it begins.
    end: Instant,
}

impl CursorState {
    /// The cursor's state from a saved `state` (the CDK's sequential
    /// `{cursor_field: value}` or its concurrent `date-range` form), the
    /// read ending at the cursor's end or `now`.
    pub fn new(cursor: &DatetimeCursor, state: Option<&Value>, now: DateTime<Utc>) -> Result<CursorState, ReadError> {
        let now = now.fixed_offset();
        // Python's clock has microseconds.
        let now = now - chrono::TimeDelta::nanoseconds(i64::from(now.timestamp_subsec_nanos() % 1000));
        let end = cursor.end.unwrap_or(now);
        let empty = Map::new();
        let state = match state {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(other) => return Err(ReadError::Invalid(format!("the saved state {other} is not an object"))),
        };
        let unreadable = |v: &Value| {
            ReadError::Invalid(format!("the saved state's {} ({v}) matches none of the cursor's formats", cursor.field))
        };
        if matches!(state.get("state_type").and_then(Value::as_str), Some("date-range" | "integer")) {
            let mut intervals = Vec::new();
            for s in state.get("slices").and_then(Value::as_array).into_iter().flatten() {
                let read = |key: &str| {
                    s.get(key).filter(|v| !v.is_null()).map(|v| cursor.parse(v).ok_or_else(|| unreadable(v)))
                };
                let (Some(start), Some(end)) = (read("start").transpose()?, read("end").transpose()?) else {
                    return Err(ReadError::Invalid("a slice of the saved state lacks its start or end".into()));
                };
                intervals.push(Interval { start, end, latest: read("most_recent_cursor_value").transpose()? });
            }
            let sync_start = intervals.first().map(|i| i.latest.unwrap_or(i.end)).unwrap_or(cursor.start);
            let legacy = state.get("legacy").and_then(Value::as_object).cloned().unwrap_or_default();
            return Ok(CursorState { intervals, legacy, sync_start, end });
        }
        let previous = state.get(&cursor.field).map(|v| cursor.parse(v).ok_or_else(|| unreadable(v))).transpose()?;
        let sync_start = match previous {
            Some(p) if p >= cursor.start => p,
            _ => cursor.start,
        };
        Ok(CursorState {
            intervals: vec![Interval { start: cursor.start, end: sync_start, latest: Some(sync_start) }],
            legacy: state.clone(),
            sync_start,
            end,
        })
    }

    /// The windows to read, in order.
    pub fn windows(&mut self, cursor: &DatetimeCursor) -> Result<Vec<Window>, ReadError> {
        self.intervals = merge(std::mem::take(&mut self.intervals), cursor);
        let Some(first) = self.intervals.first().cloned() else {
            return Err(ReadError::Invalid("the cursor's state holds no interval".into()));
        };
        let mut out = Vec::new();
        if cursor.start < first.start {
            split(cursor, self.end, cursor.start, first.start, false, &mut out);
        }
        for pair in self.intervals.windows(2) {
            let lower = match cursor.granularity {
                Some(g) => g.after(&pair[0].end).unwrap_or(pair[0].end),
                None => pair[0].end,
            };
            split(cursor, self.end, lower, pair[1].start, false, &mut out);
        }
        let last = self.intervals.last().map_or(first.end, |i| i.end);
        let lower = match cursor.lookback {
            Some(l) => l.before(&last).unwrap_or(last),
            None => last,
        };
        split(cursor, self.end, lower, self.end, true, &mut out);
        Ok(out)
    }

    /// A window read to its end, with the latest cursor value its records
    /// held.
    pub fn close(
        &mut self,
        cursor: &DatetimeCursor,
        window: &Window,
        latest: Option<Instant>,
    ) -> Result<(), ReadError> {
        let read = |text: &str| {
            cursor.parse(&Value::String(text.to_owned())).ok_or_else(|| {
                ReadError::Invalid(format!("the window bound {text:?} cannot be read back with the cursor's formats"))
            })
        };
        self.intervals.push(Interval { start: read(&window.start)?, end: read(&window.end)?, latest });
        self.intervals = merge(std::mem::take(&mut self.intervals), cursor);
        Ok(())
    }

    /// The state to save: the given state with the cursor field set to
    /// the latest value of the first interval read without a gap.
    pub fn state(&self, cursor: &DatetimeCursor) -> Value {
        let mut out = self.legacy.clone();
        let merged = merge(self.intervals.clone(), cursor);
        if let Some(first) = merged.first() {
            out.insert(cursor.field.clone(), Value::String(cursor.output(&first.latest.unwrap_or(first.start))));
        }
        Value::Object(out)
    }

    /// Whether a record is new enough to keep (as the CDK's
    /// `should_be_synced`): a record without a readable cursor value is.
    pub fn keeps(&self, cursor: &DatetimeCursor, record: &Value) -> bool {
        let Some(value) = record.get(&cursor.field).filter(|v| !v.is_null()).and_then(|v| cursor.parse(v)) else {
            return true;
        };
        let lowest = match cursor.lookback {
            None => self.sync_start,
            Some(l) => match l.before(&self.sync_start) {
                Some(lower) => lower.max(self.sync_start.min(cursor.start)),
                None => self.sync_start,
            },
        };
        lowest <= value && value <= self.end
    }
}

/// The latest of a page's records' cursor values and `so_far`.
pub fn latest(cursor: &DatetimeCursor, records: &[Value], so_far: Option<Instant>) -> Option<Instant> {
    records
        .iter()
        .filter_map(|r| r.get(&cursor.field).filter(|v| !v.is_null()).and_then(|v| cursor.parse(v)))
        .fold(so_far, |best, v| Some(best.map_or(v, |b| b.max(v))))
}

/// Intervals sorted and merged where one ends (plus a granularity, or a
/// millisecond) at or past where the next starts.
fn merge(mut intervals: Vec<Interval>, cursor: &DatetimeCursor) -> Vec<Interval> {
    intervals.sort_by_key(|i| (i.start, i.end));
    let step = cursor.granularity.unwrap_or(Gap { months: 0, exact: chrono::TimeDelta::milliseconds(1) });
    let mut out: Vec<Interval> = Vec::with_capacity(intervals.len());
    for current in intervals {
        match out.last_mut() {
            Some(last) if step.after(&last.end).is_none_or(|e| e >= current.start) => {
                last.end = last.end.max(current.end);
                last.latest = match (last.latest, current.latest) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => b.or(a),
                };
            }
            _ => out.push(current),
        }
    }
    out
}

/// The windows from `lower` to `upper`, a step at a time (the CDK's
/// `_split_per_slice_range`, without clamping).
fn split(
    cursor: &DatetimeCursor,
    end: Instant,
    lower: Instant,
    upper: Instant,
    upper_is_end: bool,
    out: &mut Vec<Window>,
) {
    let granularity = cursor.granularity;
    if lower > upper || (lower == upper && granularity.is_none()) {
        return;
    }
    if upper < cursor.start {
        return;
    }
    let lower = lower.max(cursor.start);
    if lower > upper || (lower == upper && (cursor.compare_strictly || !upper_is_end)) {
        return;
    }
    let less_granularity = |t: Instant| granularity.and_then(|g| g.before(&t)).unwrap_or(t);
    let window = |start: Instant, stop: Instant| Window { start: cursor.output(&start), end: cursor.output(&stop) };
    // `lower + step`, or the end where that overflows (or there is no step).
    let plus_step = |t: Instant| match cursor.step {
        Some(step) => step.after(&t).unwrap_or(end),
        None => end.max(upper),
    };
    if cursor.step.is_none() || plus_step(lower) >= upper {
        let stop = if granularity.is_some() && !upper_is_end { less_granularity(upper) } else { upper };
        out.push(window(lower, stop));
        return;
    }
    let mut current = lower;
    loop {
        let next = plus_step(current).min(upper);
        let reached = next >= upper;
        if current >= next {
            break;
        }
        let stop = if granularity.is_some() && (!upper_is_end || !reached) { less_granularity(next) } else { next };
        out.push(window(current, stop));
        current = next;
        if reached {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::interpolation::Val;
    use crate::model::node::Node;

    fn cursor(component: Value) -> DatetimeCursor {
        let config = Val::from(&json!({ "start": "2024-01-01T00:00:00Z" }));
        DatetimeCursor::read(&Node::at(&component, "/c").unwrap(), &config, now()).unwrap()
    }

    fn now() -> DateTime<Utc> {
        "2024-01-03T12:00:00Z".parse().unwrap()
    }

    fn windows(cursor: &DatetimeCursor, state: Option<Value>) -> (Vec<(String, String)>, CursorState) {
        let mut state = CursorState::new(cursor, state.as_ref(), now()).unwrap();
        let windows = state.windows(cursor).unwrap().into_iter().map(|w| (w.start, w.end)).collect();
        (windows, state)
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    // Each expectation is what the CDK 7.39.1's concurrent cursor gives
    // for the same component, configuration, state and clock.
    #[test]
    fn windows_and_states_are_the_cdks() {
        let daily = json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at",
            "datetime_format": "%Y-%m-%dT%H:%M:%SZ", "start_datetime": "{{ config['start'] }}",
            "step": "P1D", "cursor_granularity": "PT1S" });
        let c = cursor(daily.clone());
        let (w, mut state) = windows(&c, None);
        assert_eq!(
            w,
            pairs(&[
                ("2024-01-01T00:00:00Z", "2024-01-01T23:59:59Z"),
                ("2024-01-02T00:00:00Z", "2024-01-02T23:59:59Z"),
                ("2024-01-03T00:00:00Z", "2024-01-03T12:00:00Z"),
            ])
        );
        assert_eq!(state.state(&c), json!({ "updated_at": "2024-01-01T00:00:00Z" }));
        // Windows read in any order, each with its latest record, merge
        // into one interval whose latest value is the state.
        for (i, (start, end)) in w.iter().enumerate().rev() {
            let records = [json!({ "updated_at": format!("2024-01-0{}T08:00:00Z", i + 1) }), json!({ "id": 1 })];
            let latest = latest(&c, &records, None);
            state.close(&c, &Window { start: start.clone(), end: end.clone() }, latest).unwrap();
        }
        assert_eq!(state.state(&c), json!({ "updated_at": "2024-01-03T08:00:00Z" }));

        let mut lookback = daily;
        lookback["lookback_window"] = json!("P1D");
        let c = cursor(lookback);
        let (w, state) = windows(&c, Some(json!({ "updated_at": "2024-01-02T10:00:00Z", "other": 1 })));
        assert_eq!(
            w,
            pairs(&[
                ("2024-01-01T10:00:00Z", "2024-01-02T09:59:59Z"),
                ("2024-01-02T10:00:00Z", "2024-01-03T09:59:59Z"),
                ("2024-01-03T10:00:00Z", "2024-01-03T12:00:00Z"),
            ])
        );
        assert_eq!(state.state(&c), json!({ "updated_at": "2024-01-02T10:00:00Z", "other": 1 }));
        // Older than the state less the lookback: not kept by a
        // client-side filter; no cursor value: kept.
        assert!(!state.keeps(&c, &json!({ "updated_at": "2024-01-01T09:00:00Z" })));
        assert!(state.keeps(&c, &json!({ "updated_at": "2024-01-01T11:00:00Z" })));
        assert!(state.keeps(&c, &json!({ "id": 2 })));

        // No step: one window; the start read with its own format.
        let c =
            cursor(json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at", "datetime_format": "%Y-%m-%d",
            "start_datetime": { "type": "MinMaxDatetime", "datetime": "{{ config['start'] }}",
                "datetime_format": "%Y-%m-%dT%H:%M:%SZ" } }));
        let (w, state) = windows(&c, Some(json!({ "updated_at": "2024-01-02" })));
        assert_eq!(w, pairs(&[("2024-01-02", "2024-01-03")]));
        assert_eq!(state.state(&c), json!({ "updated_at": "2024-01-02" }));
    }

    #[test]
    fn a_state_the_cursor_cannot_read_is_an_error() {
        let c = cursor(json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at",
            "datetime_format": "%Y-%m-%d", "start_datetime": "2024-01-01" }));
        assert!(CursorState::new(&c, Some(&json!({ "updated_at": "yesterday" })), now()).is_err());
        assert!(CursorState::new(&c, Some(&json!([1])), now()).is_err());
    }
}
