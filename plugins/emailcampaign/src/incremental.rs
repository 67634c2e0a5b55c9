//! Incremental reads on `updated_at`: which records a read lets through and
//! what it checkpoints.
//!
//! The provider has **no server-side "updated since" filter**: every read,
//! incremental or not, pages through the whole collection. What makes a read
//! incremental is the filtering done here, on the plugin's side:
//!
//! - a record whose `updated_at` is at or before the saved cursor is skipped
//!   (it was emitted by an earlier read);
//! - on a first incremental read (no saved cursor), a record updated before
//!   the configured `start_date` is skipped;
//! - a record without a readable `updated_at` is always emitted: the plugin
//!   cannot tell whether it is new, and dropping it could lose data.
//!
//! # What gets checkpointed, and why not "max seen" after every page
//!
//! The state is `{"updated_at": "<timestamp>"}` (or `null` before anything
//! has been committed). The list endpoints are not ordered by `updated_at`
//! (campaigns can only be sorted by send date, name or statistics), so after
//! page 3 the pages still to come may hold records *older* than the newest one
//! seen so far. Checkpointing the newest value mid-read would make an
//! interrupted read resume past those records and lose them for good.
//!
//! So a read that resumes a saved cursor checkpoints that same cursor after
//! every page (a commit point for the records emitted so far, always safe
//! to resume from), and the newest `updated_at` it saw only once the last
//! page is done. An interrupted read therefore re-emits what it had emitted
//! (duplicates the primary key absorbs) instead of losing records; a host
//! that appends sees a checkpoint that does not advance the saved state and
//! writes nothing with it. A first read (no saved cursor) checkpoints only
//! at the end: `{"updated_at": null}` mid-read would read to the host as a
//! state that advances, and a crash after it would append the first pages
//! twice. Since every read walks all pages anyway, resuming from the older
//! cursor costs no extra requests.

use std::cmp::Ordering;
use std::fmt;

use connector_sdk::Value;
use serde::{Deserialize, Serialize};

/// The field every incremental stream of this connector uses as cursor.
pub const CURSOR_FIELD: &str = "updated_at";

pub use connector_sdk::time::Timestamp;

/// A cursor value: the provider's text (kept verbatim for the state) and its
/// parsed instant (used for every comparison).
#[derive(Debug, Clone)]
pub struct CursorValue {
    /// The instant, for comparisons.
    pub at: Timestamp,
    /// The text as the provider wrote it, for the checkpoint.
    pub text: String,
}

impl CursorValue {
    /// Parses `text`; `None` when it is not a timestamp.
    pub fn parse(text: &str) -> Option<Self> {
        Timestamp::parse(text).map(|at| Self { at, text: text.to_owned() })
    }

    /// The cursor of a record: its top-level `updated_at`, when readable.
    pub fn of_record(record: &Value) -> Option<Self> {
        record.get(CURSOR_FIELD)?.as_str().and_then(Self::parse)
    }
}

impl PartialEq for CursorValue {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl PartialOrd for CursorValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.at.cmp(&other.at))
    }
}

impl fmt::Display for CursorValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The state this connector checkpoints for an incremental stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorState {
    /// The newest `updated_at` of a completed read, verbatim; `null` when
    /// no read has completed yet.
    pub updated_at: Option<String>,
}

/// Decides which records an incremental read emits and tracks the cursor.
///
/// Create one per read with [`IncrementalRead::new`], pass every record of
/// every page through [`admits`](Self::admits), and checkpoint
/// [`mid_read_state`](Self::mid_read_state) after each page and
/// [`final_state`](Self::final_state) at the end.
#[derive(Debug, Clone)]
pub struct IncrementalRead {
    /// The cursor the read started from: records at or before it are skipped.
    saved: Option<CursorValue>,
    /// The configured `start_date`: applies when there is no saved cursor.
    start_date: Option<Timestamp>,
    /// The newest `updated_at` among the records seen so far (admitted or
    /// not), at least `saved`.
    newest: Option<CursorValue>,
    /// How many records had no readable `updated_at` (emitted anyway).
    without_cursor: u64,
}

impl IncrementalRead {
    /// A read resuming from `saved` (the previous cursor, if any), with the
    /// configured `start_date` as the lower bound of a first read.
    pub fn new(saved: Option<CursorValue>, start_date: Option<Timestamp>) -> Self {
        Self { newest: saved.clone(), saved, start_date, without_cursor: 0 }
    }

    /// Whether `record` should be emitted, noting its cursor on the way.
    /// [`IncrementalRead::admits`] for a record's JSON text, reading only
    /// its cursor field.
    pub fn admits_text(&mut self, record: &str) -> bool {
        #[derive(Deserialize)]
        struct Cursor {
            #[serde(default, rename = "updated_at")]
            cursor: Value,
        }
        debug_assert_eq!(CURSOR_FIELD, "updated_at");
        let cursor = serde_json::from_str::<Cursor>(record).map(|c| c.cursor).unwrap_or(Value::Null);
        self.admits_cursor(cursor.as_str().and_then(CursorValue::parse))
    }

    pub fn admits(&mut self, record: &Value) -> bool {
        self.admits_cursor(CursorValue::of_record(record))
    }

    fn admits_cursor(&mut self, cursor: Option<CursorValue>) -> bool {
        let Some(cursor) = cursor else {
            self.without_cursor += 1;
            return true;
        };
        let admitted = match (&self.saved, self.start_date) {
            (Some(saved), _) => cursor > *saved,
            (None, Some(start)) => cursor.at >= start,
            (None, None) => true,
        };
        if self.newest.as_ref().is_none_or(|newest| cursor > *newest) {
            self.newest = Some(cursor);
        }
        admitted
    }

    /// The state to checkpoint after a page while more pages may follow:
    /// the cursor the read started from, when it started from one (see the
    /// module documentation).
    pub fn mid_read_state(&self) -> Option<CursorState> {
        self.saved.as_ref().map(|c| CursorState { updated_at: Some(c.text.clone()) })
    }

    /// The state to checkpoint once every page has been read: the newest
    /// `updated_at` seen (or the saved cursor when nothing newer came).
    pub fn final_state(&self) -> CursorState {
        CursorState { updated_at: self.newest.as_ref().map(|c| c.text.clone()) }
    }

    /// How many records had no readable `updated_at`.
    pub fn records_without_cursor(&self) -> u64 {
        self.without_cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::json;

    #[test]
    fn record_text_is_admitted_as_its_parsed_record_would_be() {
        let saved = CursorValue::parse("2024-03-02T10:00:00.000000Z");
        let records = [
            json!({ "uuid": "a", "updated_at": "2024-03-01T10:00:00.000000Z" }),
            json!({ "uuid": "b", "updated_at": "2024-03-03T10:00:00.000000Z", "html": "<p>\"x\"</p>" }),
            json!({ "uuid": "c" }),
            json!({ "uuid": "d", "updated_at": 7 }),
        ];
        let mut by_value = IncrementalRead::new(saved.clone(), None);
        let mut by_text = IncrementalRead::new(saved, None);
        for r in &records {
            assert_eq!(by_text.admits_text(&r.to_string()), by_value.admits(r), "{r}");
        }
        assert_eq!(by_text.records_without_cursor(), 2);
        assert_eq!(by_text.final_state().updated_at, by_value.final_state().updated_at);
    }

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap_or_else(|| panic!("{text} should parse"))
    }

    fn cursor(text: &str) -> Option<CursorValue> {
        Some(CursorValue::parse(text).unwrap())
    }

    fn record(updated_at: &str) -> Value {
        json!({ "uuid": "x", "updated_at": updated_at })
    }

    #[test]
    fn records_at_or_before_the_saved_cursor_are_skipped() {
        let mut read = IncrementalRead::new(cursor("2024-03-01T10:00:00.000000Z"), None);
        assert!(!read.admits(&record("2024-02-01T00:00:00.000000Z")));
        assert!(!read.admits(&record("2024-03-01T10:00:00.000000Z")));
        assert!(read.admits(&record("2024-03-01T10:00:00.000001Z")));
    }

    #[test]
    fn start_date_bounds_a_first_read_inclusively() {
        let mut read = IncrementalRead::new(None, Some(at("2024-01-01T00:00:00Z")));
        assert!(!read.admits(&record("2023-12-31T23:59:59Z")));
        assert!(read.admits(&record("2024-01-01T00:00:00Z")));
    }

    #[test]
    fn the_saved_cursor_wins_over_start_date() {
        let mut read = IncrementalRead::new(cursor("2024-01-01T00:00:00Z"), Some(at("2025-01-01T00:00:00Z")));
        assert!(read.admits(&record("2024-06-01T00:00:00Z")));
    }

    #[test]
    fn records_without_a_readable_cursor_are_emitted_and_counted() {
        let mut read = IncrementalRead::new(cursor("2024-01-01T00:00:00Z"), None);
        assert!(read.admits(&json!({ "uuid": "a" })));
        assert!(read.admits(&json!({ "uuid": "b", "updated_at": null })));
        assert!(read.admits(&json!({ "uuid": "c", "updated_at": "soon" })));
        assert_eq!(read.records_without_cursor(), 3);
        assert_eq!(read.final_state().updated_at.as_deref(), Some("2024-01-01T00:00:00Z"));
    }

    #[test]
    fn mid_read_checkpoints_keep_the_starting_cursor() {
        let mut read = IncrementalRead::new(cursor("2024-01-01T00:00:00Z"), None);
        read.admits(&record("2024-05-01T00:00:00Z"));
        assert_eq!(read.mid_read_state(), Some(CursorState { updated_at: Some("2024-01-01T00:00:00Z".into()) }));
        // A first read has no commit point before its end.
        assert_eq!(IncrementalRead::new(None, None).mid_read_state(), None);
    }

    #[test]
    fn the_final_checkpoint_is_the_newest_cursor_seen_verbatim() {
        let mut read = IncrementalRead::new(None, Some(at("2030-01-01")));
        // Skipped records still count: they were seen, and are older anyway.
        for text in ["2024-03-01T10:00:00.000000Z", "2024-03-02T01:00:00+02:00", "2024-03-01T23:30:00.000000Z"] {
            read.admits(&record(text));
        }
        assert_eq!(read.final_state().updated_at.as_deref(), Some("2024-03-01T23:30:00.000000Z"));
    }

    #[test]
    fn the_final_checkpoint_never_goes_back_before_the_saved_cursor() {
        let mut read = IncrementalRead::new(cursor("2024-06-01T00:00:00Z"), None);
        read.admits(&record("2024-01-01T00:00:00Z"));
        assert_eq!(read.final_state().updated_at.as_deref(), Some("2024-06-01T00:00:00Z"));
    }

    #[test]
    fn state_serialises_as_a_single_updated_at_field() {
        let state = CursorState { updated_at: Some("2024-06-01T00:00:00.000000Z".into()) };
        assert_eq!(serde_json::to_value(&state).unwrap(), json!({ "updated_at": "2024-06-01T00:00:00.000000Z" }));
        assert_eq!(serde_json::to_value(CursorState { updated_at: None }).unwrap(), json!({ "updated_at": null }));
    }
}
