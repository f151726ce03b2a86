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
//! A finding may cite a step of its run's trace (`trace: run R step N`).
//! The run id is the host's own (a 32-hex UUIDv7 from the run row, added to
//! a citation the judge's answer was validated against), so the gate masks
//! exactly the cited run ids before it checks, as it lets the findings'
//! `[msg N]` through: a hex id can hold a seven-digit run. Friction signals
//! are written as names and counts with words between them (a table's
//! `| 1 | 2 |` would join digits into a run).
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
use crate::review::friction::{self, Signal};
use crate::review::judge::{FindingKind, Scope, TargetLayer};

/// Exchanges with friction listed by id in a report (the counts cover all).
pub(crate) const FRICTION_LISTED: usize = 100;

/// The trace step a finding cites.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TraceCitation {
    /// The run the exchange's message started (`mrctl runs show RUN`).
    pub run_id: String,
    /// The step's number in that run.
    pub step: u32,
    /// The step's tool, as the redactor left its name.
    pub tool: String,
    pub exit_code: Option<i64>,
}

/// One exchange (or unanswered message) with friction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FrictionEntry {
    pub space: String,
    pub message_id: i64,
    pub signals: Vec<Signal>,
}

/// The friction signals of the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct FrictionSection {
    /// Per (redacted) space, per signal: messages with it.
    pub counts: friction::Counts,
    /// The messages with a signal, at most [`FRICTION_LISTED`].
    pub exchanges: Vec<FrictionEntry>,
    /// Messages with a signal left out of `exchanges`.
    pub unlisted: u64,
}

impl FrictionSection {
    /// Adds one message's signals (empty: nothing).
    pub(crate) fn add(&mut self, space: &str, message_id: i64, signals: &friction::Signals) {
        if signals.is_empty() {
            return;
        }
        let per = self.counts.entry(space.to_owned()).or_default();
        for s in signals {
            *per.entry(*s).or_default() += 1;
        }
        if self.exchanges.len() < FRICTION_LISTED {
            self.exchanges.push(FrictionEntry {
                space: space.to_owned(),
                message_id,
                signals: signals.iter().copied().collect(),
            });
        } else {
            self.unlisted += 1;
        }
    }
}

/// `3 correction, 1 abandoned`: a space's counts in words (never zeros).
pub(crate) fn friction_counts_line(counts: &BTreeMap<Signal, u64>) -> String {
    Signal::ALL
        .iter()
        .filter_map(|s| {
            counts
                .get(s)
                .filter(|n| **n > 0)
                .map(|n| format!("{} {}", count(*n), s.as_str()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

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
    /// The trace step the finding cites, when the judge cited one the batch sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceCitation>,
    /// The exchange's friction signals.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub friction: Vec<Signal>,
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
    /// Trace citations dropped by validation (a step not sent with that
    /// exchange); their findings are kept without them.
    pub dropped_citations: u64,
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
    /// The window's friction signals, per space and per message.
    pub friction: FrictionSection,
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
            if let Some(t) = &f.trace {
                md.push_str(&format!(
                    "- trace: run {} step {} (tool {}{})\n",
                    t.run_id,
                    t.step,
                    t.tool,
                    t.exit_code
                        .map_or_else(|| ", no exit code".to_owned(), |c| format!(", exit {c}"))
                ));
            }
            if !f.friction.is_empty() {
                md.push_str(&format!(
                    "- friction: {}\n",
                    friction::list(&f.friction.iter().copied().collect())
                ));
            }
            md.push_str(&format!("- summary: {}\n", f.summary));
            md.push_str(&format!("- evidence: {}\n", f.evidence));
            md.push_str(&format!("- suggestion: {}\n\n", f.suggestion));
        }
        let fr = &self.friction;
        md.push_str("## Friction signals\n\n");
        if fr.counts.is_empty() {
            md.push_str("None in this window.\n\n");
        } else {
            for (space, counts) in &fr.counts {
                md.push_str(&format!("- {space}: {}\n", friction_counts_line(counts)));
            }
            md.push('\n');
            for e in &fr.exchanges {
                md.push_str(&format!(
                    "- [msg {}] in {}: {}\n",
                    e.message_id,
                    e.space,
                    friction::list(&e.signals.iter().copied().collect())
                ));
            }
            if fr.unlisted > 0 {
                md.push_str(&format!(
                    "- and {} more messages with a signal (counted above)\n",
                    count(fr.unlisted)
                ));
            }
            md.push('\n');
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
        if ft.dropped_citations > 0 {
            md.push_str(&format!(
                "- trace citations dropped (step not in the batch; finding kept): {}\n",
                count(ft.dropped_citations)
            ));
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
/// The run ids of the findings' trace citations are masked before the check
/// (see the module's header): only those, and only in that exact shape.
pub(crate) fn gate(markdown: &str, json: &Value, gate: &IdentifierGate) -> Result<(), GateFailure> {
    let runs = cited_runs(json);
    let mask = |text: &str| {
        runs.iter()
            .fold(text.to_owned(), |t, run| t.replace(run.as_str(), "[run]"))
    };
    let ids = finding_ids(json);
    gate.check_with_ids(&mask(markdown), &ids)?;
    let mut strings = String::new();
    collect_strings(json, &mut strings);
    gate.check_with_ids(&mask(&strings), &ids)
}

/// A report that crossed from another host, with its findings' trace
/// citations removed before it is gated or used: their run ids name runs of
/// that host, and [`gate`] masks a cited run id, so a hostile source could
/// hide a digit run (a phone number is valid hex) in one and name it in the
/// text. Without them the crossed report is gated with nothing masked.
pub(crate) fn without_traces(mut json: Value) -> Value {
    if let Some(findings) = json.get_mut("findings").and_then(Value::as_array_mut) {
        for f in findings.iter_mut().filter_map(Value::as_object_mut) {
            f.remove("trace");
        }
    }
    json
}

/// The run ids the findings cite: host-made ids only (32 lowercase hex
/// digits, a simple UUID), longest first so no id masks part of another.
fn cited_runs(json: &Value) -> Vec<String> {
    let mut runs: Vec<String> = json["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["trace"]["run_id"].as_str())
        .filter(|r| r.len() == 32 && r.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .map(str::to_owned)
        .collect();
    runs.sort();
    runs.dedup();
    runs
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
    let friction = json["friction"]["exchanges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| &e["message_id"]);
    json["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| [&f["message_id"], &f["reply_id"]])
        .chain(friction)
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
                    trace: None,
                    friction: Vec::new(),
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
                    // A run id with a long digit run: masked by the gate
                    // because the finding cites it.
                    trace: Some(TraceCitation {
                        run_id: "019af3b21234567890abcdef12345678".into(),
                        step: 3,
                        tool: "shell".into(),
                        exit_code: Some(1),
                    }),
                    friction: vec![Signal::Correction, Signal::FailedTurn],
                },
            ],
            friction: {
                let mut f = FrictionSection::default();
                for (space, id, signals) in [
                    (
                        "review-test",
                        12_345_678,
                        vec![Signal::Correction, Signal::FailedTurn],
                    ),
                    ("review-test", 12_345_690, vec![Signal::Abandoned]),
                    ("a", 7, vec![Signal::Rephrased]),
                ] {
                    f.add(space, id, &signals.into_iter().collect());
                }
                f
            },
            footer: Footer {
                spaces_judged: 2,
                exchanges_judged: 1_234_567,
                skipped: vec![Skip {
                    what: "client-x".into(),
                    reason: "tagged client".into(),
                    count: 0,
                }],
                dropped_findings: [("unknown kind".to_owned(), 2)].into_iter().collect(),
                dropped_citations: 1,
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
            "- trace: run 019af3b21234567890abcdef12345678 step 3 (tool shell, exit 1)",
            "- friction: correction, failed_turn",
            "- review-test: 1 correction, 1 failed_turn, 1 abandoned",
            "- a: 1 rephrased",
            "- [msg 12345690] in review-test: abandoned",
            "- trace citations dropped (step not in the batch; finding kept): 1",
        ] {
            assert!(md.contains(want), "{want} missing in\n{md}");
        }
        // Big ids and counts must not look like phone numbers to the gate.
        let open = IdentifierGate::new(&RedactionList::new()).unwrap();
        gate(&md, &r.to_json(), &open).unwrap();
        // Only a cited run id is masked: the same id in a summary, uncited, trips it.
        let mut uncited = r.clone();
        uncited.findings[0].trace = None;
        uncited.findings[0].summary = "see run 019af3b21234567890abcdef12345678".into();
        assert!(gate(&uncited.to_markdown(), &uncited.to_json(), &open).is_err());
        // A crossed report loses its citations, so its text is gated with
        // nothing masked: a phone number dressed as a cited run id is caught.
        let mut hostile = r.clone();
        let disguised = "0000000000000000000031612345678a";
        let cited = hostile.findings[0]
            .trace
            .as_mut()
            .expect("the cited finding");
        cited.run_id = disguised.into();
        hostile.findings[0].summary = format!("call {disguised}");
        let json = hostile.to_json();
        let masked = gate("", &json, &open);
        assert!(masked.is_ok(), "masked where it was written: {masked:?}");
        let crossed = without_traces(json);
        assert!(crossed["findings"][0].get("trace").is_none());
        assert!(gate("", &crossed, &open).is_err());
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
