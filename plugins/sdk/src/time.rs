//! Points in time as providers write them: RFC 3339 / ISO 8601 text
//! parsed into an instant that compares correctly whatever the offset, and
//! written back as RFC 3339, a date or Unix seconds for request
//! parameters.

/// A point in time, in nanoseconds since the Unix epoch (UTC).
///
/// Providers write timestamps as `2024-03-01T09:30:00.000000Z`, but also
/// with an offset (`+02:00`) or a space instead of `T`; comparing text
/// would get those wrong, comparing parsed values does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i128);

impl Timestamp {
    /// The instant `seconds` after the Unix epoch.
    pub fn from_unix_seconds(seconds: i64) -> Self {
        Self(i128::from(seconds) * NANOS_PER_SECOND)
    }

    /// The instant `millis` milliseconds after the Unix epoch.
    pub fn from_unix_millis(millis: i64) -> Self {
        Self(i128::from(millis) * 1_000_000)
    }

    /// Whole seconds since the Unix epoch (rounded down).
    pub fn unix_seconds(self) -> i64 {
        i64::try_from(self.0.div_euclid(NANOS_PER_SECOND)).unwrap_or(i64::MAX)
    }

    /// Whole milliseconds since the Unix epoch (rounded down).
    pub fn unix_millis(self) -> i64 {
        i64::try_from(self.0.div_euclid(1_000_000)).unwrap_or(i64::MAX)
    }

    /// The UTC date, `YYYY-MM-DD`.
    pub fn date(self) -> String {
        let (year, month, day) = civil_from_days(self.0.div_euclid(NANOS_PER_DAY) as i64);
        format!("{year:04}-{month:02}-{day:02}")
    }

    /// RFC 3339 in UTC, `YYYY-MM-DDTHH:MM:SSZ`, with as many fraction
    /// digits as the instant needs.
    pub fn to_rfc3339(self) -> String {
        let of_day = self.0.rem_euclid(NANOS_PER_DAY);
        let seconds = of_day / NANOS_PER_SECOND;
        let nanos = of_day % NANOS_PER_SECOND;
        let clock = format!("{:02}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
        let fraction = if nanos == 0 { String::new() } else { format!(".{nanos:09}").trim_end_matches('0').to_owned() };
        format!("{}T{clock}{fraction}Z", self.date())
    }

    /// Parses an RFC 3339 / ISO 8601 date-time, or a bare `YYYY-MM-DD`
    /// (midnight UTC). A missing offset means UTC. Returns `None` for
    /// anything else.
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

/// The date `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap_or_else(|| panic!("{text} should parse"))
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
    fn instants_are_written_back_in_every_form() {
        let t = at("2024-03-01T11:30:00.250+02:00");
        assert_eq!(t.to_rfc3339(), "2024-03-01T09:30:00.25Z");
        assert_eq!(t.date(), "2024-03-01");
        assert_eq!(t.unix_seconds(), 1_709_285_400);
        assert_eq!(t.unix_millis(), 1_709_285_400_250);
        assert_eq!(Timestamp::from_unix_seconds(1_709_285_400).to_rfc3339(), "2024-03-01T09:30:00Z");
        assert_eq!(Timestamp::from_unix_millis(951_825_600_000).to_rfc3339(), "2000-02-29T12:00:00Z");
        assert_eq!(Timestamp::from_unix_seconds(-86_400).date(), "1969-12-31");
        for text in ["1999-12-31T23:59:59Z", "2100-03-01T00:00:00Z", "1970-01-01T00:00:00Z"] {
            assert_eq!(at(text).to_rfc3339(), text);
        }
    }
}
