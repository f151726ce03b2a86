//! Trends over weeks (review roadmap, "cross-bot clustering and trends"):
//! which dates make up the last [`WEEKS`] weeks, which week a report's date
//! falls in, a cluster's findings counted per week, and that count written
//! so a report can carry it.
//!
//! A week is seven days ending on the report's day (week 0 ends today), so
//! a weekly report and its trend line cover the same days whatever the
//! weekday. Counts are written with a comma and a space between them and a
//! sparkline after: a comma is no phone separator, so eight small counts
//! never read as one long digit run to the identifier gate.
//!
//! Must never: count a date it cannot parse, or one outside the weeks.

use std::collections::BTreeSet;

use chrono::NaiveDate;

/// Weeks a trend covers.
pub(crate) const WEEKS: usize = 8;
/// Days in a week of the trend.
const DAYS: i64 = 7;
/// Sparkline levels, lowest first; a zero is a dot.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Every date (`YYYY-MM-DD`) of the [`WEEKS`] weeks ending `today`.
pub(crate) fn dates(today: NaiveDate) -> BTreeSet<String> {
    (0..DAYS * WEEKS as i64)
        .map(|i| {
            (today - chrono::Duration::days(i))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect()
}

/// The week `date` falls in, 0 for the seven days ending `today`; `None`
/// for a date that is not one, in the future, or older than the weeks.
pub(crate) fn week_of(today: NaiveDate, date: &str) -> Option<usize> {
    let d = NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?;
    let days = (today - d).num_days();
    let week = usize::try_from(days / DAYS).ok().filter(|_| days >= 0)?;
    (week < WEEKS).then_some(week)
}

/// How many of `dates` fall in each week, oldest week first.
pub(crate) fn per_week<'a>(today: NaiveDate, dates: impl IntoIterator<Item = &'a str>) -> Vec<u64> {
    let mut out = vec![0u64; WEEKS];
    for d in dates {
        if let Some(w) = week_of(today, d) {
            out[WEEKS - 1 - w] += 1;
        }
    }
    out
}

/// The last day of each week, oldest week first.
pub(crate) fn week_ends(today: NaiveDate) -> Vec<String> {
    (0..WEEKS as i64)
        .rev()
        .map(|w| {
            (today - chrono::Duration::days(w * DAYS))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect()
}

/// `0, 0, 1, 0, 2, 4, 3, 5 (··▂·▃▇▅█)`: the counts, then a sparkline
/// scaled to the largest.
pub(crate) fn line(weeks: &[u64]) -> String {
    let counts: Vec<String> = weeks.iter().map(u64::to_string).collect();
    format!("{} ({})", counts.join(", "), sparkline(weeks))
}

/// One character a week: a dot for none, else a bar of eight heights
/// scaled to the largest count.
pub(crate) fn sparkline(weeks: &[u64]) -> String {
    let max = weeks.iter().copied().max().unwrap_or(0);
    weeks
        .iter()
        .map(|&n| {
            if n == 0 || max == 0 {
                '·'
            } else {
                // 1..=max onto 1..=8, rounding up so any finding shows.
                let level = (n * BARS.len() as u64).div_ceil(max) as usize;
                BARS[level.clamp(1, BARS.len()) - 1]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn review_trend_weeks_end_on_the_report_day() {
        let today = day("2026-12-05");
        assert_eq!(week_of(today, "2026-12-05"), Some(0));
        assert_eq!(week_of(today, "2026-11-29"), Some(0));
        assert_eq!(week_of(today, "2026-11-28"), Some(1));
        assert_eq!(week_of(today, "2026-10-11"), Some(7));
        assert_eq!(week_of(today, "2026-10-10"), None, "older than eight weeks");
        assert_eq!(week_of(today, "2026-12-06"), None, "in the future");
        assert_eq!(week_of(today, "not-a-date"), None);
        assert_eq!(dates(today).len(), 56);
        assert!(dates(today).contains("2026-10-11"));
        let ends = week_ends(today);
        assert_eq!(ends.len(), WEEKS);
        assert_eq!(
            (ends[0].as_str(), ends[7].as_str()),
            ("2026-10-17", "2026-12-05")
        );
    }

    #[test]
    fn review_trend_counts_oldest_first_and_draws_a_sparkline() {
        let today = day("2026-12-05");
        let weeks = per_week(
            today,
            [
                "2026-12-05",
                "2026-12-01",
                "2026-11-20",
                "2026-10-11",
                "2026-01-01",
            ],
        );
        assert_eq!(weeks, [1, 0, 0, 0, 0, 1, 0, 2]);
        assert_eq!(line(&weeks), "1, 0, 0, 0, 0, 1, 0, 2 (▄····▄·█)");
        assert_eq!(sparkline(&[0; WEEKS]), "········");
        // The gate would take eight counts with spaces between them for a
        // phone number; with commas it does not.
        let gate =
            crate::redaction::IdentifierGate::new(&crate::redaction::RedactionList::new()).unwrap();
        assert!(gate.check(&line(&[1, 2, 3, 4, 5, 6, 7, 8])).is_ok());
        assert!(gate.check("1 2 3 4 5 6 7 8").is_err());
    }
}
