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
//! So a read checkpoints the cursor it *started from* after every page (a
//! commit point for the records emitted so far, always safe to resume from),
//! and the newest `updated_at` it saw only once the last page is done. An
//! interrupted read therefore re-emits what it had emitted (duplicates the
//! primary key absorbs) instead of losing records. Since every read walks all
//! pages anyway, resuming from the older cursor costs no extra requests.

use std::cmp::Ordering;
use std::fmt;

use connector_sdk::Value;
use serde::{Deserialize, Serialize};

/// The field every incremental stream of this connector uses as cursor.
pub const CURSOR_FIELD: &str = "updated_at";

/// A point in time, in nanoseconds since the Unix epoch (UTC).
///
/// The provider writes timestamps as `2024-03-01T09:30:00.000000Z`, but older
/// instances and proxies may use an offset (`+02:00`) or a space instead of
/// `T`; comparing text would get those wrong, comparing parsed values does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i128);

impl Timestamp {
    /// Parses an RFC 3339 / ISO 8601 date-time, or a bare `YYYY-MM-DD`
    /// (midnight UTC). A missing offset means UTC, which is what the provider
    /// uses. Returns `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let date = text.get(..10)?;
        let (year, month, day) = parse_date(date)?;
        let days = days_since_epoch(year, month, day);
        let rest = &text[10..];
        if rest.is_empty() {
            return Some(Self(i128::from(days) * NANOS_PER_DAY));
        }
        let rest = rest.strip_prefix(['T', 't', ' ']).filter(|time| !time.is_empty())?;
        let (clock, offset_seconds) = split_offset(rest)?;
        let nanos_of_day = parse_clock(clock)?;
        let utc = i128::from(days) * NANOS_PER_DAY + nanos_of_day - i128::from(offset_seconds) * NANOS_PER_SECOND;
        Some(Self(utc))
    }
}

const NANOS_PER_SECOND: i128 = 1_000_000_000;
const NANOS_PER_DAY: i128 = 86_400 * NANOS_PER_SECOND;

/// `YYYY-MM-DD`, checked against the calendar.
fn parse_date(date: &str) -> Option<(i64, u32, u32)> {
    let bytes = date.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let year = digits(&date[0..4])?;
    let month = digits(&date[5..7])?;
    let day = digits(&date[8..10])?;
    let year = i64::from(year);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some((year, month, day))
}

/// `HH:MM[:SS[.fraction]]` as nanoseconds since midnight.
fn parse_clock(clock: &str) -> Option<i128> {
    let (hms, fraction) = match clock.split_once(['.', ',']) {
        Some((hms, fraction)) => (hms, Some(fraction)),
        None => (clock, None),
    };
    let mut parts = hms.split(':');
    let hour = two_digits(parts.next()?)?;
    let minute = two_digits(parts.next()?)?;
    let second = match parts.next() {
        Some(second) => two_digits(second)?,
        None if fraction.is_none() => 0,
        None => return None,
    };
    // 60 allows a leap second; it sorts after :59 as it should.
    if parts.next().is_some() || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut nanos = 0i128;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Keep nanosecond precision; further digits cannot change the order
        // of the timestamps a provider realistically writes.
        let kept = &fraction[..fraction.len().min(9)];
        nanos = i128::from(digits(kept)?) * 10i128.pow(9 - kept.len() as u32);
    }
    let seconds = i128::from(hour) * 3600 + i128::from(minute) * 60 + i128::from(second);
    Some(seconds * NANOS_PER_SECOND + nanos)
}

/// Splits `time` into the clock and its UTC offset in seconds (`Z`,
/// `+HH:MM`, `+HHMM`, `+HH`; none means UTC).
fn split_offset(time: &str) -> Option<(&str, i64)> {
    if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        return Some((clock, 0));
    }
    let Some(sign_at) = time.rfind(['+', '-']) else {
        return Some((time, 0));
    };
    let (clock, offset) = time.split_at(sign_at);
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let offset = &offset[1..];
    let (hours, minutes) = match offset.len() {
        2 => (offset, "00"),
        4 => (&offset[..2], &offset[2..]),
        5 if offset.as_bytes()[2] == b':' => (&offset[..2], &offset[3..]),
        _ => return None,
    };
    let (hours, minutes) = (two_digits(hours)?, two_digits(minutes)?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some((clock, sign * (i64::from(hours) * 3600 + i64::from(minutes) * 60)))
}

fn digits(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn two_digits(text: &str) -> Option<u32> {
    (text.len() == 2).then(|| digits(text)).flatten()
}

fn is_leap_year(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date (negative before it).
fn days_since_epoch(year: i64, month: u32, day: u32) -> i64 {
    /// Days in the months before each month of a common year.
    const BEFORE_MONTH: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    // Leap years in 1..year (exclusive); the difference counts those between
    // 1970 and the given year.
    let leap_years_before = |y: i64| {
        let y = y - 1;
        y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400)
    };
    let mut days = 365 * (year - 1970) + leap_years_before(year) - leap_years_before(1970);
    days += BEFORE_MONTH[(month - 1) as usize] + i64::from(day) - 1;
    if month > 2 && is_leap_year(year) {
        days += 1;
    }
    days
}

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
    /// the cursor the read started from (see the module documentation).
    pub fn mid_read_state(&self) -> CursorState {
        CursorState { updated_at: self.saved.as_ref().map(|c| c.text.clone()) }
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
    fn the_providers_format_parses_to_the_right_instant() {
        assert_eq!(at("1970-01-01T00:00:00.000000Z"), Timestamp(0));
        assert_eq!(at("2000-02-29T12:00:00Z"), Timestamp(951_825_600 * NANOS_PER_SECOND));
        assert_eq!(at("2024-03-01T09:30:00.250000Z"), Timestamp(1_709_285_400 * NANOS_PER_SECOND + 250_000_000));
    }

    #[test]
    fn offsets_spaces_and_bare_dates_are_understood() {
        let utc = at("2024-03-01T09:30:00Z");
        assert_eq!(at("2024-03-01T11:30:00+02:00"), utc);
        assert_eq!(at("2024-03-01T04:30:00-0500"), utc);
        assert_eq!(at("2024-03-01 09:30:00"), utc);
        assert_eq!(at("2024-03-01T09:30Z"), utc);
        assert_eq!(at("2024-03-01"), at("2024-03-01T00:00:00Z"));
    }

    #[test]
    fn malformed_timestamps_are_rejected() {
        for text in [
            "",
            "yesterday",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-03-01T24:00:00Z",
            "2024-03-01T09:30:00+25:00",
            "2024-03-01T09:30:00.Z",
            "2024-03-01T",
            "2024-3-1",
        ] {
            assert_eq!(Timestamp::parse(text), None, "{text}");
        }
    }

    #[test]
    fn timestamps_compare_by_instant_not_by_text() {
        // Text order would put "+02:00" (10:00 UTC) after "Z" (10:30 UTC).
        assert!(at("2024-03-01T12:00:00+02:00") < at("2024-03-01T10:30:00Z"));
        assert!(at("2024-03-01T10:00:00.1Z") > at("2024-03-01T10:00:00.09Z"));
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
        assert_eq!(read.mid_read_state(), CursorState { updated_at: Some("2024-01-01T00:00:00Z".into()) });
        assert_eq!(IncrementalRead::new(None, None).mid_read_state().updated_at, None);
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
