//! Cron and one-shot schedules for tasks. Cron expressions are the standard
//! five fields, evaluated in UTC. Must never: accept an expression that has
//! no future fire time, or an `at` in the past.

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

/// The first fire time strictly after `after_ms`.
pub(crate) fn next_fire(cron: &Cron, after_ms: i64) -> Result<i64, String> {
    let start: DateTime<Utc> =
        DateTime::from_timestamp_millis(after_ms).ok_or_else(|| "time out of range".to_string())?;
    cron.find_next_occurrence(&start, false)
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
        let next = next_fire(&c, now).unwrap();
        assert!(next > now && next - now <= 5 * 60_000);
    }

    #[test]
    fn at_must_be_future() {
        assert!(parse_at("2000-01-01T00:00:00Z", 1_700_000_000_000).is_err());
        assert!(parse_at("tomorrow", 0).is_err());
        assert_eq!(parse_at("1970-01-01T00:00:01Z", 0), Ok(1000));
    }
}
