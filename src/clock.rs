//! Time: the epoch-millisecond clock used by storage, and the parser for the
//! `since`/`until` arguments (RFC 3339 times or durations like `24h`).
//! mrctl checks its flags with these same functions, so the client refuses
//! exactly what the server would.
//!
//! Must never panic on user input: every parse error is a sentence.

use chrono::{DateTime, Utc};

pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

pub fn ms_to_rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Parses `90s`, `15m`, `24h`, `7d`, `2w` (also combined: `1h30m`) into milliseconds.
pub fn parse_duration_ms(raw: &str) -> Result<i64, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total: i64 = 0;
    let mut digits = String::new();
    let mut saw_unit = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit: i64 = match c {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => {
                return Err(format!(
                    "{raw:?} is not a duration (use e.g. 90s, 15m, 24h, 7d)"
                ))
            }
        };
        let n: i64 = digits.parse().map_err(|_| {
            format!("{raw:?} is not a duration (a number must come before each unit)")
        })?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("{raw:?} is too long"))?;
        saw_unit = true;
    }
    if !digits.is_empty() || !saw_unit {
        return Err(format!(
            "{raw:?} is not a duration (a unit s, m, h, d or w must follow each number)"
        ));
    }
    // Callers add it to now: a bound keeps `now + d` far from overflowing.
    if total > MAX_DURATION_MS {
        return Err(format!("{raw:?} is longer than 100 years"));
    }
    Ok(total)
}

/// The longest duration accepted anywhere (mute `for`, token `expires_in`,
/// `since`): 100 years.
pub const MAX_DURATION_MS: i64 = 100 * 366 * 86_400_000;

/// An RFC 3339 time (surrounding whitespace ignored) as epoch milliseconds.
/// The one RFC 3339 reading shared by the server's `since`/`until` and
/// mrctl's early checks, so the two cannot disagree on what is a time.
pub fn parse_rfc3339_ms(raw: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(raw.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|_| format!("{raw:?} is not an RFC 3339 time (e.g. 2026-11-29T10:00:00Z)"))
}

/// `since`/`until`: an RFC 3339 time, or a duration meaning "that long before now".
pub fn parse_time_arg(raw: &str, now: i64) -> Result<i64, String> {
    if let Ok(t) = parse_rfc3339_ms(raw) {
        return Ok(t);
    }
    parse_duration_ms(raw).map(|d| now - d).map_err(|_| {
        format!("{raw:?} is neither an RFC 3339 time (2026-11-29T10:00:00Z) nor a duration (24h)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_combine() {
        assert_eq!(parse_duration_ms("24h"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert!(parse_duration_ms("24").is_err());
        assert!(parse_duration_ms("h").is_err());
        assert!(parse_duration_ms("3x").is_err());
        assert_eq!(parse_duration_ms("36600d"), Ok(MAX_DURATION_MS));
        for too_long in ["36601d", "106751991167d", "9223372036854775s"] {
            let e = parse_duration_ms(too_long).unwrap_err();
            assert!(
                e.contains("100 years") || e.contains("too long"),
                "{too_long}: {e}"
            );
        }
    }

    #[test]
    fn time_args_take_rfc3339_or_duration() {
        let now = 1_000_000_000_000;
        assert_eq!(parse_time_arg("1h", now), Ok(now - 3_600_000));
        assert_eq!(parse_time_arg("1970-01-01T00:00:01Z", now), Ok(1000));
        assert!(parse_time_arg("yesterday", now).is_err());
    }

    #[test]
    fn rfc3339_times_parse_to_ms() {
        assert_eq!(parse_rfc3339_ms(" 1970-01-01T00:00:01Z "), Ok(1000));
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Ok(0));
        // A real calendar, not a shape: there is no 30 February.
        assert!(parse_rfc3339_ms("2026-02-30T10:00:00Z").is_err());
        assert!(parse_rfc3339_ms("2026-11-29T10:00:00").is_err());
    }
}
