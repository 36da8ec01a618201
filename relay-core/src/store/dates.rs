//! Calendar dates and RFC 3339 times (UTC) for the API and the daily roll-ups, from Unix
//! milliseconds and back. Days are civil days of the proleptic Gregorian calendar, converted with
//! the days-from-civil arithmetic (no time-zone data: everything here is UTC).

const MS_PER_DAY: i64 = 86_400_000;

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date of a day since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DD` of the day `unix_ms` falls in.
pub fn day_of(unix_ms: i64) -> String {
    let (y, m, d) = civil_from_days(unix_ms.div_euclid(MS_PER_DAY));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `unix_ms` as RFC 3339 in UTC, to the second.
pub fn rfc3339(unix_ms: i64) -> String {
    let secs_of_day = unix_ms.rem_euclid(MS_PER_DAY) / 1000;
    format!(
        "{}T{:02}:{:02}:{:02}Z",
        day_of(unix_ms),
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

/// The start (Unix ms) of a `YYYY-MM-DD` day.
pub fn parse_day(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(i64::from(year), month) {
        return None;
    }
    Some(days_from_civil(i64::from(year), month, day) * MS_PER_DAY)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Unix ms of an RFC 3339 time (`2026-11-25T12:00:00Z`, fractions and offsets allowed) or the
/// start of a `YYYY-MM-DD` day.
pub fn parse_time(text: &str) -> Option<i64> {
    let day = parse_day(text.get(..10)?)?;
    let rest = &text[10..];
    if rest.is_empty() {
        return Some(day);
    }
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let clock = rest.get(..8)?;
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = clock.get(r)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if clock.as_bytes()[2] != b':' || clock.as_bytes()[5] != b':' {
        return None;
    }
    let (h, m, s) = (digits(0..2)?, digits(3..5)?, digits(6..8)?);
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let mut rest = &rest[8..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        let first3 = format!("{:0<3}", &fraction[..len.min(3)]);
        millis = first3.parse::<i64>().ok()?;
        rest = &fraction[len..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = &rest[1..];
            if zone.len() != 5 || zone.as_bytes()[2] != b':' {
                return None;
            }
            let hours: i64 = zone.get(..2)?.parse().ok()?;
            let minutes: i64 = zone.get(3..)?.parse().ok()?;
            sign * (hours * 3600 + minutes * 60)
        }
    };
    Some(day + ((h * 3600 + m * 60 + s) - offset_secs) * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_times_round_trip_across_leap_years_and_the_epoch() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(day_of(-1), "1969-12-31");
        assert_eq!(parse_day("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(parse_day("2023-02-29"), None);
        assert_eq!(rfc3339(1_764_072_000_000), "2025-11-25T12:00:00Z");
        for day in [-700_000i64, -1, 0, 1, 11_016, 19_782, 20_000, 2_932_896] {
            let ms = day * MS_PER_DAY;
            assert_eq!(parse_day(&day_of(ms)), Some(ms), "day {day}");
        }
    }

    #[test]
    fn rfc3339_times_with_fractions_and_offsets_are_read() {
        assert_eq!(parse_time("2025-11-25T12:00:00Z"), Some(1_764_072_000_000));
        assert_eq!(
            parse_time("2025-11-25T12:00:00.25Z"),
            Some(1_764_072_000_250)
        );
        assert_eq!(
            parse_time("2025-11-25T13:30:00+01:30"),
            Some(1_764_072_000_000)
        );
        assert_eq!(parse_time("2025-11-25"), Some(1_764_028_800_000));
        for bad in [
            "",
            "2025-11-25T",
            "2025-13-01",
            "2025-11-25T25:00:00Z",
            "2025-11-25T12:00:00",
            "yesterday",
            "2025-11-25T12:00:00.Z",
            "２０２５-11-25",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
    }
}
