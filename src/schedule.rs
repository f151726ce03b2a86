//! Cron and one-shot schedules for tasks. Cron expressions are the standard
//! five fields, evaluated in a time zone: the space's `timezone` config key,
//! else the deployment's `timezone` (so `0 9 * * *` is nine on the space's
//! clock, through daylight saving changes). Must never: accept an
//! expression that has no future fire time, or an `at` in the past.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use croner::Cron;

pub(crate) fn parse_cron(expr: &str) -> Result<Cron, String> {
    let fields = expr.split_whitespace().count();
    if fields != 5 {
        return Err(format!(
            "cron {expr:?} has {fields} fields; use the five fields minute hour day-of-month month day-of-week (e.g. \"0 9 * * MON-FRI\")"
        ));
    }
    let cron = Cron::from_str(expr).map_err(|e| format!("cron {expr:?} is not valid: {e}"))?;
    Ok(cron)
}

/// The zone a space's cron times are read in: its own `timezone` when set
/// and valid, else the deployment's, else UTC (both are validated where
/// they are set; a stored value that no longer parses falls through).
pub(crate) fn zone(space: Option<&str>, deployment: &str) -> chrono_tz::Tz {
    space
        .filter(|z| !z.trim().is_empty())
        .and_then(|z| z.trim().parse().ok())
        .or_else(|| deployment.trim().parse().ok())
        .unwrap_or(chrono_tz::UTC)
}

/// The first fire time strictly after `after_ms`, the expression read on
/// the clock of `tz`.
pub(crate) fn next_fire(cron: &Cron, after_ms: i64, tz: chrono_tz::Tz) -> Result<i64, String> {
    let start: DateTime<Utc> =
        DateTime::from_timestamp_millis(after_ms).ok_or_else(|| "time out of range".to_string())?;
    cron.find_next_occurrence(&start.with_timezone(&tz), false)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("cron {:?} has no next fire time: {e}", cron.as_str()))
}

/// Parses an `at` time (RFC 3339) that must lie in the future.
pub(crate) fn parse_at(raw: &str, now_ms: i64) -> Result<i64, String> {
    let t = DateTime::parse_from_rfc3339(raw.trim())
        .map_err(|_| format!("at {raw:?} is not an RFC 3339 time (e.g. 2026-12-01T09:00:00Z)"))?
        .timestamp_millis();
    if t <= now_ms {
        return Err(format!("at {raw:?} is in the past"));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_needs_five_valid_fields_and_fires_later() {
        assert!(parse_cron("* * * *").is_err());
        assert!(parse_cron("61 * * * *").is_err());
        let c = parse_cron("*/5 * * * *").unwrap();
        let now = 1_700_000_000_000;
        let next = next_fire(&c, now, chrono_tz::UTC).unwrap();
        assert!(next > now && next - now <= 5 * 60_000);
    }

    #[test]
    fn cron_is_read_on_the_zones_clock_through_daylight_saving() {
        let nine = parse_cron("0 9 * * *").unwrap();
        let ams: chrono_tz::Tz = "Europe/Amsterdam".parse().unwrap();
        // 2026-03-28 12:00 UTC: the next nine in Amsterdam is on the 29th,
        // the first day of summer time (UTC+2): 07:00 UTC.
        let before_dst = 1_774_699_200_000;
        assert_eq!(
            next_fire(&nine, before_dst, ams).unwrap(),
            1_774_767_600_000
        );
        // In winter (UTC+1), nine is 08:00 UTC: 2026-01-16.
        let winter = 1_768_478_400_000; // 2026-01-15 12:00 UTC
        assert_eq!(next_fire(&nine, winter, ams).unwrap(), 1_768_550_400_000);
        assert_eq!(
            next_fire(&nine, winter, chrono_tz::UTC).unwrap(),
            1_768_554_000_000
        );
    }

    #[test]
    fn the_space_zone_beats_the_deployments_and_a_bad_one_falls_through() {
        assert_eq!(
            zone(Some("Asia/Tokyo"), "Europe/Amsterdam"),
            chrono_tz::Asia::Tokyo
        );
        assert_eq!(
            zone(Some(""), "Europe/Amsterdam"),
            chrono_tz::Europe::Amsterdam
        );
        assert_eq!(
            zone(Some("Mars/Olympus"), "Europe/Amsterdam"),
            chrono_tz::Europe::Amsterdam
        );
        assert_eq!(zone(None, "nowhere"), chrono_tz::UTC);
    }

    #[test]
    fn at_must_be_future() {
        assert!(parse_at("2000-01-01T00:00:00Z", 1_700_000_000_000).is_err());
        assert!(parse_at("tomorrow", 0).is_err());
        assert_eq!(parse_at("1970-01-01T00:00:01Z", 0), Ok(1000));
    }
}
