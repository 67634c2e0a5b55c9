//! `Retry-After` (RFC 9110, section 10.2.3), read one way by the host and
//! its connectors: the host makes every replica wait what one provider
//! answer asked, the SDK retries after it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses `Retry-After`: delay-seconds, or an IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`) measured from `now`.
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = UNIX_EPOCH + Duration::from_secs(imf_fixdate(value)?);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Seconds since the Unix epoch of an IMF-fixdate, the only date format
/// servers may send (RFC 9110, section 5.6.7).
pub fn imf_fixdate(value: &str) -> Option<u64> {
    let mut parts = value.split_ascii_whitespace();
    let (_weekday, day, month, year, time, zone) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if zone != "GMT" || parts.next().is_some() {
        return None;
    }
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = MONTHS.iter().position(|m| *m == month)? as i64 + 1;
    let day: i64 = day.parse().ok()?;
    let year: i64 = year.parse().ok()?;
    let mut clock = time.split(':').map(|n| n.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let seconds = days_since_epoch(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds).ok()
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
/// Counting years from March puts the leap day at the end of the year, so
/// the days before a month follow one formula.
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719_468 days lie between 0000-03-01 and 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777 - 30);
        assert_eq!(parse("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT", now + Duration::from_secs(60)), Some(Duration::ZERO));
        assert_eq!(parse("soon", now), None);
    }

    #[test]
    fn imf_fixdate_matches_known_timestamps() {
        assert_eq!(imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(imf_fixdate("Tue, 29 Feb 2000 12:00:00 GMT"), Some(951_825_600));
        assert_eq!(imf_fixdate("Wed, 01 Jan 2025 00:00:00 UTC"), None);
    }
}
