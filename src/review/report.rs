//! The report (M1.4): `report.md` for people and `report.json` for tools, in
//! `<data_dir>/reviews/<YYYY-MM-DD>-daily/`, both written atomically (a temp
//! file in the same directory, then a rename) and only after the identifier
//! gate passed on what would be written.
//!
//! The gate covers the whole of `report.md` and every string of
//! `report.json`. JSON numbers are counts and message ids the host made; they
//! are not gated, so a message id past a million is not taken for a phone
//! number. In `report.md` message ids are written `[msg N]` (the gate lets
//! through exactly the findings' ids in that shape) and counts with thousands
//! separators (a comma is no phone separator).
//!
//! Must never: write a file before the gate passed, leave a half-written
//! report behind, or name anything in it that did not come out of the
//! scan's redactor (space ids included).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::redaction::{GateFailure, IdentifierGate};
use crate::review::catalog::{ReportKind, ReportName};
use crate::review::judge::{FindingKind, Scope, TargetLayer};

/// One finding as reported: the judge's validated fields plus where it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ReportFinding {
    /// The space, as the redactor left its id.
    pub space: String,
    /// The user message of the exchange.
    pub message_id: i64,
    /// The bot's reply to it.
    pub reply_id: i64,
    pub kind: FindingKind,
    pub scope: Scope,
    pub target_layer: TargetLayer,
    pub severity: u8,
    pub summary: String,
    pub evidence: String,
    pub suggestion: String,
}

/// Something the scan did not judge, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
pub struct Skip {
    /// What was skipped: a (redacted) space, or `exchanges` of one.
    pub what: String,
    pub reason: String,
    /// Exchanges (or user messages) affected; 0 for a whole space.
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Footer {
    pub spaces_judged: u64,
    pub exchanges_judged: u64,
    pub skipped: Vec<Skip>,
    /// Reason → judge items dropped by validation.
    pub dropped_findings: BTreeMap<String, u32>,
    /// Findings dropped because the owner rejected the same finding before
    /// (its fingerprint is a `reject` in the intake ledger, M3.2).
    pub suppressed_rejected: u64,
    /// Model calls of the judge (each a spawn of the judge), retries included.
    pub judge_calls: u64,
    pub wall_clock_ms: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// Set when a spend cap stopped the scan: the cap, in words. What was
    /// not judged is under `skipped`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The deployment's currency, for the markdown's cost line.
    #[serde(skip)]
    pub currency: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    /// `YYYY-MM-DD` in `review.timezone`: the day the scan ran.
    pub date: String,
    pub kind: &'static str,
    /// RFC 3339, UTC.
    pub window_since: String,
    pub window_until: String,
    pub window_hours: u32,
    /// Most severe first.
    pub findings: Vec<ReportFinding>,
    pub footer: Footer,
}

/// Where a day's report lives.
pub(crate) fn report_dir(reviews: &Path, date: &str) -> PathBuf {
    ReportName {
        date: date.to_owned(),
        kind: ReportKind::Daily,
    }
    .dir(reviews)
}

impl Report {
    pub(crate) fn sort_findings(&mut self) {
        self.findings.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then_with(|| a.space.cmp(&b.space))
                .then_with(|| a.message_id.cmp(&b.message_id))
        });
    }

    pub(crate) fn to_markdown(&self) -> String {
        let mut md = String::new();
        md.push_str(&format!("# Conversation review, {} (daily)\n\n", self.date));
        md.push_str(&format!(
            "Window: {} to {} ({} h).\n\n",
            self.window_since, self.window_until, self.window_hours
        ));
        md.push_str(&format!(
            "## Findings ({})\n\n",
            count(self.findings.len() as u64)
        ));
        if self.findings.is_empty() {
            md.push_str("No problems found.\n\n");
        }
        for (i, f) in self.findings.iter().enumerate() {
            md.push_str(&format!(
                "### {}. {} (severity {})\n\n",
                i + 1,
                f.kind.as_str(),
                f.severity
            ));
            md.push_str(&format!("- kind: {}\n", f.kind.as_str()));
            md.push_str(&format!("- scope: {}\n", f.scope.as_str()));
            md.push_str(&format!("- target layer: {}\n", f.target_layer.as_str()));
            md.push_str(&format!("- space: {}\n", f.space));
            md.push_str(&format!(
                "- message: [msg {}] (reply [msg {}])\n",
                f.message_id, f.reply_id
            ));
            md.push_str(&format!("- summary: {}\n", f.summary));
            md.push_str(&format!("- evidence: {}\n", f.evidence));
            md.push_str(&format!("- suggestion: {}\n\n", f.suggestion));
        }
        let ft = &self.footer;
        md.push_str("## Footer\n\n");
        md.push_str(&format!("- spaces judged: {}\n", count(ft.spaces_judged)));
        md.push_str(&format!(
            "- exchanges judged: {}\n",
            count(ft.exchanges_judged)
        ));
        if ft.skipped.is_empty() {
            md.push_str("- skipped: none\n");
        } else {
            md.push_str("- skipped:\n");
            for s in &ft.skipped {
                if s.count > 0 {
                    md.push_str(&format!(
                        "  - {}: {} ({})\n",
                        s.what,
                        s.reason,
                        count(s.count)
                    ));
                } else {
                    md.push_str(&format!("  - {}: {}\n", s.what, s.reason));
                }
            }
        }
        if !ft.dropped_findings.is_empty() {
            md.push_str("- judge items dropped by validation:\n");
            for (reason, n) in &ft.dropped_findings {
                md.push_str(&format!("  - {reason}: {}\n", count(u64::from(*n))));
            }
        }
        if ft.suppressed_rejected > 0 {
            md.push_str(&format!(
                "- findings rejected at intake before (dropped): {}\n",
                count(ft.suppressed_rejected)
            ));
        }
        md.push_str(&format!(
            "- judge calls (spawns): {}\n",
            count(ft.judge_calls)
        ));
        md.push_str(&format!("- wall clock: {}\n", seconds(ft.wall_clock_ms)));
        md.push_str(&format!(
            "- tokens: {} in, {} out\n",
            count(ft.tokens_in),
            count(ft.tokens_out)
        ));
        md.push_str(&format!(
            "- cost: {}\n",
            crate::spend::format_amount(ft.cost, &ft.currency)
        ));
        if let Some(cap) = &ft.stopped {
            md.push_str(&format!("- stopped: {cap}\n"));
        }
        md
    }

    pub(crate) fn to_json(&self) -> Value {
        // Serialising plain data with string keys cannot fail; Null would
        // still be gated and written, so nothing unchecked gets out.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The gate over what would be written: all of the markdown and every
/// string in the JSON.
/// The findings' message and reply ids (numbers the host validated against
/// the batch) are the only `[msg N]` the gate lets through.
pub(crate) fn gate(markdown: &str, json: &Value, gate: &IdentifierGate) -> Result<(), GateFailure> {
    gate_with_ids(markdown, json, &finding_ids(json), gate)
}

/// [`gate`] for any written text and JSON (the intake's triage, ledger and
/// items, the weekly report), with the `[msg N]` ids it may carry.
pub(crate) fn gate_with_ids(
    text: &str,
    json: &Value,
    ids: &BTreeSet<i64>,
    gate: &IdentifierGate,
) -> Result<(), GateFailure> {
    gate.check_with_ids(text, ids)?;
    let mut strings = String::new();
    collect_strings(json, &mut strings);
    gate.check_with_ids(&strings, ids)
}

fn finding_ids(json: &Value) -> BTreeSet<i64> {
    json["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| [&f["message_id"], &f["reply_id"]])
        .filter_map(Value::as_i64)
        .collect()
}

fn collect_strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|i| collect_strings(i, out)),
        Value::Object(map) => map.values().for_each(|i| collect_strings(i, out)),
        _ => {}
    }
}

/// Paths of a written report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
}

/// Writes both files atomically into `dir` (created if needed). Call only
/// after [`gate`] passed on exactly this text.
pub(crate) fn write_atomically(
    dir: &Path,
    markdown: &str,
    json: &Value,
) -> std::io::Result<Written> {
    std::fs::create_dir_all(dir)?;
    let json_text = serde_json::to_string_pretty(json).map_err(std::io::Error::other)?;
    let written = Written {
        markdown: dir.join("report.md"),
        json: dir.join("report.json"),
    };
    persist(dir, &written.json, json_text.as_bytes())?;
    persist(dir, &written.markdown, markdown.as_bytes())?;
    Ok(written)
}

/// Writes `target` (inside `dir`) atomically: a synced temp file in `dir`,
/// then a rename.
pub(crate) fn persist(dir: &Path, target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".report-")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}

/// `1234567` → `1,234,567`: no run of seven digits for the phone matcher.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds as seconds with one decimal, e.g. `12.3 s`.
pub(crate) fn seconds(ms: u64) -> String {
    format!("{}.{} s", count(ms / 1000), (ms % 1000) / 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redaction::RedactionList;

    fn sample() -> Report {
        let mut r = Report {
            date: "2026-09-28".into(),
            kind: "daily",
            window_since: "2026-09-27T04:00:00Z".into(),
            window_until: "2026-09-28T04:00:00Z".into(),
            window_hours: 24,
            findings: vec![
                ReportFinding {
                    space: "a".into(),
                    message_id: 5,
                    reply_id: 6,
                    kind: FindingKind::Tone,
                    scope: Scope::Global,
                    target_layer: TargetLayer::Character,
                    severity: 1,
                    summary: "curt".into(),
                    evidence: "no.".into(),
                    suggestion: "be kind".into(),
                },
                ReportFinding {
                    space: "review-test".into(),
                    message_id: 12_345_678,
                    reply_id: 12_345_679,
                    kind: FindingKind::WrongAnswer,
                    scope: Scope::Space,
                    target_layer: TargetLayer::Memory,
                    severity: 3,
                    summary: "said Lyon".into(),
                    evidence: "Lyon".into(),
                    suggestion: "Paris".into(),
                },
            ],
            footer: Footer {
                spaces_judged: 2,
                exchanges_judged: 1_234_567,
                skipped: vec![Skip {
                    what: "client-x".into(),
                    reason: "tagged client".into(),
                    count: 0,
                }],
                dropped_findings: [("unknown kind".to_owned(), 2)].into_iter().collect(),
                suppressed_rejected: 3,
                judge_calls: 123_457,
                wall_clock_ms: 12_345_678,
                tokens_in: 98_765_432,
                tokens_out: 5,
                cost: 12_345.678,
                stopped: None,
                currency: "USD".into(),
            },
        };
        r.sort_findings();
        r
    }

    #[test]
    fn review_report_markdown_names_every_field_and_passes_the_gate() {
        let r = sample();
        let md = r.to_markdown();
        assert!(
            md.find("wrong_answer").unwrap() < md.find("tone").unwrap(),
            "most severe first"
        );
        for want in [
            "- kind: wrong_answer",
            "- scope: space",
            "- target layer: memory",
            "- space: review-test",
            "- message: [msg 12345678] (reply [msg 12345679])",
            "- spaces judged: 2",
            "- exchanges judged: 1,234,567",
            "  - client-x: tagged client",
            "  - unknown kind: 2",
            "- findings rejected at intake before (dropped): 3",
            "- judge calls (spawns): 123,457",
            "- wall clock: 12,345.6 s",
            "- tokens: 98,765,432 in, 5 out",
            "- cost: 12,345.68 USD",
        ] {
            assert!(md.contains(want), "{want} missing in\n{md}");
        }
        // Big ids and counts must not look like phone numbers to the gate.
        let open = IdentifierGate::new(&RedactionList::new()).unwrap();
        gate(&md, &r.to_json(), &open).unwrap();
    }

    #[test]
    fn review_report_gate_catches_an_identifier_in_either_file() {
        let list = IdentifierGate::new(&RedactionList::new().with_name("Olivia Bakker")).unwrap();
        let mut r = sample();
        r.findings[0].evidence = "call +31 6 1234 5678".into();
        assert!(gate(&r.to_markdown(), &r.to_json(), &list).is_err());
        let clean = sample();
        let mut json = clean.to_json();
        json["findings"][0]["summary"] = Value::String("Olivia said so".into());
        assert!(gate(&clean.to_markdown(), &json, &list).is_err());
    }

    #[test]
    fn review_report_is_written_atomically_in_its_day_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = report_dir(tmp.path(), "2026-09-28");
        assert!(dir.ends_with("2026-09-28-daily"));
        let r = sample();
        let w = write_atomically(&dir, &r.to_markdown(), &r.to_json()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&w.markdown).unwrap(),
            r.to_markdown()
        );
        let back: Value = serde_json::from_str(&std::fs::read_to_string(&w.json).unwrap()).unwrap();
        assert_eq!(back["findings"][0]["kind"], "wrong_answer");
        assert_eq!(back["findings"][0]["message_id"], 12_345_678);
        // Written again: replaced whole, no temp file left behind.
        write_atomically(&dir, "# again\n", &r.to_json()).unwrap();
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(std::fs::read_to_string(&w.markdown).unwrap(), "# again\n");
    }

    #[test]
    fn review_number_formats() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(seconds(1_250), "1.2 s");
    }
}
