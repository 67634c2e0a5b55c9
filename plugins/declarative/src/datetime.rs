//! Dates as Airbyte's CDK reads and writes them: Python's `strptime` and
//! `strftime` for the directives manifests use (`%Y-%m-%dT%H:%M:%S.%f%z`
//! and the like, matched as Python's regular expressions match them,
//! backtracking included), the CDK's own formats on top (`%s`, `%ms`,
//! `%s_as_float`, `%epoch_microseconds`, `%_ms`), and ISO 8601 durations
//! as `isodate` reads them (`P1M` is a calendar month, not 30 days).
//!
//! A value read without an offset is taken as UTC, as the CDK's
//! `DatetimeParser` takes it.

use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, TimeDelta, TimeZone, Timelike, Utc};

/// Why a date or a duration cannot be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DateError(pub String);

impl std::fmt::Display for DateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DateError {}

type Result<T> = std::result::Result<T, DateError>;

fn bad(message: impl Into<String>) -> DateError {
    DateError(message.into())
}

/// The CDK's `DatetimeParser.parse`: its own epoch formats, else Python's
/// `strptime`, a value without an offset taken as UTC.
pub fn parse(text: &str, format: &str) -> Result<DateTime<FixedOffset>> {
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    let int = |t: &str| t.trim().parse::<i64>().map_err(|_| bad(format!("{t:?} is not an integer")));
    let at = match format {
        "%s" => Utc.timestamp_opt(int(text)?, 0).single(),
        "%s_as_float" => {
            let seconds: f64 = text.trim().parse().map_err(|_| bad(format!("{text:?} is not a number")))?;
            epoch.checked_add_signed(TimeDelta::microseconds((seconds * 1e6).round() as i64))
        }
        "%epoch_microseconds" => epoch.checked_add_signed(TimeDelta::microseconds(int(text)?)),
        "%ms" => epoch.checked_add_signed(TimeDelta::milliseconds(int(text)?)),
        _ => return strptime(text, &format.replace("%_ms", "%f")),
    };
    at.map(|t| t.fixed_offset()).ok_or_else(|| bad(format!("{text:?} is out of range")))
}

/// The CDK's `DatetimeParser.format`: its own epoch formats, else
/// Python's `strftime`.
pub fn format(t: &DateTime<FixedOffset>, format: &str) -> Result<String> {
    Ok(match format {
        "%s" => t.timestamp().to_string(),
        "%s_as_float" => python_float(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6),
        "%epoch_microseconds" => t.timestamp_micros().to_string(),
        "%ms" => t.timestamp_millis().to_string(),
        _ if format.contains("%_ms") => {
            let text = strftime(t, &format.replace("%_ms", "%f"))?;
            text.replace(&format!("{:06}", t.nanosecond() / 1000), &format!("{:03}", t.nanosecond() / 1_000_000))
        }
        _ => strftime(t, format)?,
    })
}

/// Python's `repr` of a float that holds a timestamp.
fn python_float(f: f64) -> String {
    let text = format!("{f}");
    if text.contains('.') || text.contains('e') { text } else { format!("{text}.0") }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// One piece of a `strptime` format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Literal(char),
    Space,
    Directive(char),
}

fn pieces(format: &str) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => match chars.next() {
                Some('%') => out.push(Piece::Literal('%')),
                Some(
                    d @ ('Y' | 'y' | 'm' | 'd' | 'H' | 'I' | 'M' | 'S' | 'f' | 'z' | 'Z' | 'j' | 'p' | 'b' | 'B' | 'a'
                    | 'A'),
                ) => out.push(Piece::Directive(d)),
                Some(d) => return Err(bad(format!("'{d}' is a bad directive in format {format:?}"))),
                None => return Err(bad(format!("stray % in format {format:?}"))),
            },
            c if c.is_whitespace() => {
                // Python turns a run of whitespace into `\s+`.
                if out.last() != Some(&Piece::Space) {
                    out.push(Piece::Space);
                }
            }
            c => out.push(Piece::Literal(c)),
        }
    }
    Ok(out)
}

/// The fields a match found.
#[derive(Debug, Clone, Default)]
struct Found {
    year: Option<i32>,
    short_year: Option<i32>,
    month: Option<u32>,
    day: Option<u32>,
    hour: Option<u32>,
    hour12: Option<u32>,
    pm: Option<bool>,
    minute: u32,
    second: u32,
    micro: u32,
    offset: Option<i32>,
    yday: Option<u32>,
}

/// What a matched piece of text sets.
type Setter = Box<dyn Fn(&mut Found)>;

/// The texts a directive may match at the start of `s`, in the order
/// Python's regular expression tries them, each with what it sets.
fn candidates(d: char, s: &str) -> Vec<(usize, Setter)> {
    let digits = |n: usize| s.len() >= n && s.as_bytes()[..n].iter().all(u8::is_ascii_digit);
    let number = |n: usize| s[..n].trim_start().parse::<u32>().unwrap_or(u32::MAX);
    let mut out: Vec<(usize, Setter)> = Vec::new();
    // Two digits within range, then one (a leading space allowed where
    // Python allows it).
    let mut small = |lo2: u32, hi: u32, one_lo: u32, spaced: bool, set: fn(&mut Found, u32)| {
        if digits(2) && (lo2..=hi).contains(&number(2)) {
            let v = number(2);
            out.push((2, Box::new(move |f| set(f, v))));
        }
        if digits(1) && number(1) >= one_lo {
            let v = number(1);
            out.push((1, Box::new(move |f| set(f, v))));
        }
        if spaced
            && s.len() >= 2
            && s.as_bytes()[0] == b' '
            && s.as_bytes()[1].is_ascii_digit()
            && s.as_bytes()[1] != b'0'
        {
            let v = u32::from(s.as_bytes()[1] - b'0');
            out.push((2, Box::new(move |f| set(f, v))));
        }
    };
    match d {
        'Y' if digits(4) => {
            let v = number(4) as i32;
            out.push((4, Box::new(move |f| f.year = Some(v))));
        }
        'y' if digits(2) => {
            let v = number(2) as i32;
            out.push((2, Box::new(move |f| f.short_year = Some(v))));
        }
        'm' => small(1, 12, 1, false, |f, v| f.month = Some(v)),
        'd' => small(1, 31, 1, true, |f, v| f.day = Some(v)),
        'H' => small(0, 23, 0, false, |f, v| f.hour = Some(v)),
        'I' => small(1, 12, 1, true, |f, v| f.hour12 = Some(v)),
        'M' => small(0, 59, 0, false, |f, v| f.minute = v),
        'S' => small(0, 61, 0, false, |f, v| f.second = v),
        'j' => {
            for n in [3, 2, 1] {
                if digits(n) && (1..=366).contains(&number(n)) {
                    let v = number(n);
                    out.push((n, Box::new(move |f| f.yday = Some(v))));
                }
            }
        }
        'f' => {
            let n = s.bytes().take(6).take_while(u8::is_ascii_digit).count();
            for len in (1..=n).rev() {
                let text = format!("{:0<6}", &s[..len]);
                let v: u32 = text.parse().unwrap_or(0);
                out.push((len, Box::new(move |f| f.micro = v)));
            }
        }
        'z' => {
            if s.starts_with('Z') {
                out.push((1, Box::new(|f| f.offset = Some(0))));
            }
            out.extend(offsets(s).into_iter().map(|(len, v)| {
                let b: Setter = Box::new(move |f| f.offset = Some(v));
                (len, b)
            }));
        }
        'Z' => {
            for name in ["UTC", "GMT"] {
                if s.len() >= 3 && s[..3].eq_ignore_ascii_case(name) {
                    out.push((3, Box::new(|_| {})));
                }
            }
        }
        'p' => {
            for (name, pm) in [("AM", false), ("PM", true)] {
                if s.len() >= 2 && s[..2].eq_ignore_ascii_case(name) {
                    out.push((2, Box::new(move |f| f.pm = Some(pm))));
                }
            }
        }
        'b' | 'B' | 'a' | 'A' => {
            let names: Vec<(String, usize)> = match d {
                'b' => MONTHS.iter().enumerate().map(|(i, m)| (m[..3].to_owned(), i)).collect(),
                'B' => MONTHS.iter().enumerate().map(|(i, m)| ((*m).to_owned(), i)).collect(),
                'a' => DAYS.iter().enumerate().map(|(i, m)| (m[..3].to_owned(), i)).collect(),
                _ => DAYS.iter().enumerate().map(|(i, m)| ((*m).to_owned(), i)).collect(),
            };
            for (name, i) in names {
                if s.len() >= name.len()
                    && s.is_char_boundary(name.len())
                    && s[..name.len()].eq_ignore_ascii_case(&name)
                {
                    let month = matches!(d, 'b' | 'B');
                    out.push((
                        name.len(),
                        Box::new(move |f| {
                            if month {
                                f.month = Some(i as u32 + 1)
                            }
                        }),
                    ));
                }
            }
        }
        _ => {}
    }
    out
}

/// `[+-]HH:?MM(:?SS(.ffffff)?)?` at the start of `s`: each length it may
/// take, longest first, with the offset in seconds.
fn offsets(s: &str) -> Vec<(usize, i32)> {
    let b = s.as_bytes();
    let sign = match b.first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Vec::new(),
    };
    let two = |i: usize| -> Option<i32> {
        (b.len() >= i + 2 && b[i].is_ascii_digit() && b[i + 1].is_ascii_digit())
            .then(|| i32::from(b[i] - b'0') * 10 + i32::from(b[i + 1] - b'0'))
    };
    let Some(hours) = two(1) else { return Vec::new() };
    let colon = b.get(3) == Some(&b':');
    let at = if colon { 4 } else { 3 };
    let Some(minutes) = two(at).filter(|m| *m < 60) else { return Vec::new() };
    let mut out = Vec::new();
    let end = at + 2;
    let sec_at = if b.get(end) == Some(&b':') { end + 1 } else { end };
    if let Some(seconds) = two(sec_at).filter(|s| *s < 60) {
        let mut len = sec_at + 2;
        if b.get(len) == Some(&b'.') {
            let n = b[len + 1..].iter().take(6).take_while(|c| c.is_ascii_digit()).count();
            if n > 0 {
                len += 1 + n;
            }
        }
        out.push((len, sign * (hours * 3600 + minutes * 60 + seconds)));
    }
    out.push((end, sign * (hours * 3600 + minutes * 60)));
    out
}

/// Python's `strptime`, a value without an offset taken as UTC.
pub fn strptime(text: &str, format: &str) -> Result<DateTime<FixedOffset>> {
    let pieces = pieces(format)?;
    let mismatch = || bad(format!("time data {text:?} does not match format {format:?}"));
    let found = matches(&pieces, text, Found::default()).ok_or_else(mismatch)?;
    build(&found).ok_or_else(|| bad(format!("time data {text:?} is not a valid date for format {format:?}")))
}

/// The first way `pieces` match all of `s`, as a backtracking regular
/// expression finds it.
fn matches(pieces: &[Piece], s: &str, found: Found) -> Option<Found> {
    let Some((first, rest)) = pieces.split_first() else {
        return s.is_empty().then_some(found);
    };
    match first {
        Piece::Literal(c) => {
            let next = s.chars().next()?;
            let same = next == *c || next.to_lowercase().eq(c.to_lowercase());
            if same { matches(rest, &s[next.len_utf8()..], found) } else { None }
        }
        Piece::Space => {
            let n = s.chars().take_while(|c| c.is_whitespace()).map(char::len_utf8).sum::<usize>();
            // Greedy, then fewer.
            let mut ends: Vec<usize> = s[..n].char_indices().map(|(i, c)| i + c.len_utf8()).collect();
            ends.reverse();
            ends.into_iter().find_map(|end| matches(rest, &s[end..], found.clone()))
        }
        Piece::Directive(d) => candidates(*d, s).into_iter().find_map(|(len, set)| {
            let mut next = found.clone();
            set(&mut next);
            matches(rest, &s[len..], next)
        }),
    }
}

fn build(f: &Found) -> Option<DateTime<FixedOffset>> {
    let year = match (f.year, f.short_year) {
        (Some(y), _) => y,
        (None, Some(y)) if y < 69 => 2000 + y,
        (None, Some(y)) => 1900 + y,
        (None, None) => 1900,
    };
    let hour = match (f.hour, f.hour12, f.pm) {
        (Some(h), _, _) => h,
        (None, Some(h), Some(true)) => h % 12 + 12,
        (None, Some(h), _) => h % 12,
        (None, None, _) => 0,
    };
    let date = match (f.yday, f.month, f.day) {
        (Some(yday), None, None) => NaiveDate::from_yo_opt(year, yday)?,
        _ => NaiveDate::from_ymd_opt(year, f.month.unwrap_or(1), f.day.unwrap_or(1))?,
    };
    let naive = date.and_hms_micro_opt(hour, f.minute, f.second, f.micro)?;
    let offset = FixedOffset::east_opt(f.offset.unwrap_or(0))?;
    offset.from_local_datetime(&naive).single()
}

/// Python's `strftime` (glibc's directives, Python's `%f`, `%z`, `%Z`).
pub fn strftime(t: &DateTime<FixedOffset>, format: &str) -> Result<String> {
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let d = chars.next().ok_or_else(|| bad(format!("stray % in format {format:?}")))?;
        let offset = t.offset().local_minus_utc();
        match d {
            'Y' => out.push_str(&t.year().to_string()),
            'y' => out.push_str(&format!("{:02}", t.year().rem_euclid(100))),
            'm' => out.push_str(&format!("{:02}", t.month())),
            'd' => out.push_str(&format!("{:02}", t.day())),
            'e' => out.push_str(&format!("{:>2}", t.day())),
            'H' => out.push_str(&format!("{:02}", t.hour())),
            'I' => out.push_str(&format!("{:02}", (t.hour() + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{:02}", t.minute())),
            'S' => out.push_str(&format!("{:02}", t.second())),
            'f' => out.push_str(&format!("{:06}", t.nanosecond() / 1000)),
            'j' => out.push_str(&format!("{:03}", t.ordinal())),
            'p' => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
            'b' | 'h' => out.push_str(&MONTHS[t.month0() as usize][..3]),
            'B' => out.push_str(MONTHS[t.month0() as usize]),
            'a' => out.push_str(&DAYS[t.weekday().num_days_from_monday() as usize][..3]),
            'A' => out.push_str(DAYS[t.weekday().num_days_from_monday() as usize]),
            'z' => {
                let sign = if offset < 0 { '-' } else { '+' };
                let a = offset.abs();
                out.push_str(&format!("{sign}{:02}{:02}", a / 3600, a % 3600 / 60));
                if a % 60 != 0 {
                    out.push_str(&format!("{:02}", a % 60));
                }
            }
            'Z' => {
                if offset == 0 {
                    out.push_str("UTC");
                } else {
                    let sign = if offset < 0 { '-' } else { '+' };
                    let a = offset.abs();
                    out.push_str(&format!("UTC{sign}{:02}:{:02}", a / 3600, a % 3600 / 60));
                }
            }
            's' => out.push_str(&t.naive_local().and_utc().timestamp().to_string()),
            'T' => out.push_str(&format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second())),
            'F' => out.push_str(&format!("{}-{:02}-{:02}", t.year(), t.month(), t.day())),
            'D' => out.push_str(&format!("{:02}/{:02}/{:02}", t.month(), t.day(), t.year().rem_euclid(100))),
            'u' => out.push_str(&t.weekday().number_from_monday().to_string()),
            'w' => out.push_str(&t.weekday().num_days_from_sunday().to_string()),
            'U' | 'W' | 'V' | 'G' => out.push_str(&t.format(&format!("%{d}")).to_string()),
            '%' => out.push('%'),
            other => return Err(bad(format!("the date directive %{other}"))),
        }
    }
    Ok(out)
}

/// An ISO 8601 duration as `isodate` reads it: calendar years and months
/// (added as `isodate.Duration` adds them: the day kept, or the month's
/// last), and the rest exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub months: i32,
    pub exact: TimeDelta,
}

impl Gap {
    /// `isodate.parse_duration` of `P[nY][nM][nW][nD][T[nH][nM][nS]]`,
    /// signed; fractions only where they are exact.
    pub fn parse(text: &str) -> Result<Gap> {
        let invalid = || bad(format!("{text:?} is not an ISO 8601 duration"));
        let (negative, rest) = match text.trim() {
            t if t.starts_with('-') => (true, &t[1..]),
            t => (false, t.strip_prefix('+').unwrap_or(t)),
        };
        let rest = rest.strip_prefix('P').ok_or_else(invalid)?;
        let (date, time) = match rest.split_once('T') {
            Some((d, t)) if !t.is_empty() => (d, Some(t)),
            Some(_) => return Err(invalid()),
            None => (rest, None),
        };
        if date.is_empty() && time.is_none() {
            return Err(invalid());
        }
        let mut months = 0i64;
        let mut micros = 0f64;
        let mut parse_part = |part: &str, units: &[(char, f64)], is_date: bool| -> Result<()> {
            let mut number = String::new();
            let mut order = 0;
            for c in part.chars() {
                if c.is_ascii_digit() || c == '.' || c == ',' {
                    number.push(if c == ',' { '.' } else { c });
                    continue;
                }
                let at = units.iter().position(|(u, _)| *u == c).ok_or_else(invalid)?;
                if at < order || number.is_empty() {
                    return Err(invalid());
                }
                order = at + 1;
                let n: f64 = number.parse().map_err(|_| invalid())?;
                number.clear();
                match (is_date, c) {
                    (true, 'Y' | 'M') => {
                        if n.fract() != 0.0 {
                            return Err(bad(format!("{text:?}: fractional years and months are not supported")));
                        }
                        months += n as i64 * if c == 'Y' { 12 } else { 1 };
                    }
                    _ => micros += n * units[at].1,
                }
            }
            if number.is_empty() { Ok(()) } else { Err(invalid()) }
        };
        parse_part(date, &[('Y', 0.0), ('M', 0.0), ('W', 7.0 * 86_400e6), ('D', 86_400e6)], true)?;
        if let Some(time) = time {
            parse_part(time, &[('H', 3_600e6), ('M', 60e6), ('S', 1e6)], false)?;
        }
        let sign = if negative { -1 } else { 1 };
        let months = i32::try_from(months).map_err(|_| invalid())? * sign;
        let exact = TimeDelta::microseconds(micros.round() as i64) * sign;
        Ok(Gap { months, exact })
    }

    /// Whether it is nothing (as Python finds `timedelta(0)` false).
    pub fn is_zero(&self) -> bool {
        self.months == 0 && self.exact.is_zero()
    }

    /// `t + self`; `None` past the range of dates.
    pub fn after(&self, t: &DateTime<FixedOffset>) -> Option<DateTime<FixedOffset>> {
        let moved = if self.months == 0 {
            *t
        } else {
            let total = t.year() * 12 + t.month0() as i32 + self.months;
            let (year, month) = (total.div_euclid(12), total.rem_euclid(12) as u32 + 1);
            let last = (28..=31).rev().find(|d| NaiveDate::from_ymd_opt(year, month, *d).is_some())?;
            let date = NaiveDate::from_ymd_opt(year, month, t.day().min(last))?;
            t.offset().from_local_datetime(&date.and_time(t.time())).single()?
        };
        let out = moved.checked_add_signed(self.exact)?;
        (1..=9999).contains(&out.year()).then_some(out)
    }

    /// `t - self`.
    pub fn before(&self, t: &DateTime<FixedOffset>) -> Option<DateTime<FixedOffset>> {
        Gap { months: -self.months, exact: -self.exact }.after(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<FixedOffset> {
        DateTime::parse_from_rfc3339(text).unwrap()
    }

    #[test]
    fn strptime_matches_as_python_does() {
        assert_eq!(strptime("2024-01-15", "%Y-%m-%d").unwrap(), at("2024-01-15T00:00:00Z"));
        assert_eq!(strptime("2024-1-5", "%Y-%m-%d").unwrap(), at("2024-01-05T00:00:00Z"));
        assert_eq!(strptime("2024011510", "%Y%m%d%H").unwrap(), at("2024-01-15T10:00:00Z"));
        assert_eq!(strptime("2024-01-15T10:20:30Z", "%Y-%m-%dT%H:%M:%SZ").unwrap(), at("2024-01-15T10:20:30Z"));
        assert_eq!(
            strptime("2024-01-15T10:20:30.5+02:00", "%Y-%m-%dT%H:%M:%S.%f%z").unwrap(),
            at("2024-01-15T10:20:30.5+02:00")
        );
        assert_eq!(
            strptime("2024-01-15T10:20:30.123Z", "%Y-%m-%dT%H:%M:%S.%f%z").unwrap(),
            at("2024-01-15T10:20:30.123Z")
        );
        assert_eq!(strptime("15/01/2024 10:20", "%d/%m/%Y %H:%M").unwrap(), at("2024-01-15T10:20:00Z"));
        assert_eq!(strptime("Jan 5 2024", "%b %d %Y").unwrap(), at("2024-01-05T00:00:00Z"));
        assert!(strptime("2024-01-15T10:20:30", "%Y-%m-%d").is_err(), "unconverted data remains");
        assert!(strptime("2024-02-30", "%Y-%m-%d").is_err());
        assert!(strptime("2024-01-15", "%Y-%m-%d%s").is_err());
    }

    #[test]
    fn formats_as_the_cdk_does() {
        let t = at("2024-01-15T10:20:30.123456Z");
        assert_eq!(format(&t, "%Y-%m-%dT%H:%M:%S.%f%z").unwrap(), "2024-01-15T10:20:30.123456+0000");
        assert_eq!(format(&t, "%s").unwrap(), "1705314030");
        assert_eq!(format(&t, "%ms").unwrap(), "1705314030123");
        assert_eq!(format(&t, "%Y-%m-%dT%H:%M:%S.%_msZ").unwrap(), "2024-01-15T10:20:30.123Z");
        assert_eq!(format(&t, "%s_as_float").unwrap(), "1705314030.123456");
        assert_eq!(parse("1705314030", "%s").unwrap(), at("2024-01-15T10:20:30Z"));
        assert_eq!(parse("1705314030123", "%ms").unwrap(), at("2024-01-15T10:20:30.123Z"));
        assert_eq!(format(&at("2024-01-15T10:20:30+02:00"), "%z %Z").unwrap(), "+0200 UTC+02:00");
    }

    #[test]
    fn durations_add_calendar_months() {
        let month = Gap::parse("P1M").unwrap();
        assert_eq!(month.after(&at("2024-01-31T00:00:00Z")).unwrap(), at("2024-02-29T00:00:00Z"));
        assert_eq!(month.before(&at("2024-03-31T00:00:00Z")).unwrap(), at("2024-02-29T00:00:00Z"));
        assert_eq!(Gap::parse("P1Y").unwrap().after(&at("2024-02-29T00:00:00Z")).unwrap(), at("2025-02-28T00:00:00Z"));
        assert_eq!(Gap::parse("PT0.000001S").unwrap().exact, TimeDelta::microseconds(1));
        assert_eq!(Gap::parse("P1W").unwrap().exact, TimeDelta::days(7));
        assert!(Gap::parse("P0D").unwrap().is_zero());
        assert!(Gap::parse("P").is_err());
        assert!(Gap::parse("1D").is_err());
    }
}
