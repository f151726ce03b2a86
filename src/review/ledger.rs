//! Owner approval and the ledger (M2.1): `mercury review approve` takes the
//! pending triage, applies only the rows the owner approved, and appends
//! **every** row, applied or not, to `<intake_dir>/ledger.json`.
//!
//! Applying a row: `new` writes a pre-filled bug (a wrong answer, refusal,
//! ignored instruction, hallucination, tool failure or privacy finding) or
//! idea (tone, other) under `bugs/` or `ideas/`, carrying the finding's
//! fingerprint line so a later finding relates to it; `attach`,
//! `fixed-not-deployed` and `revisit` append a reference to the matched
//! item; `reject` changes no item (the ledger row is what suppresses the
//! finding from then on); `duplicate` does what the row it follows did.
//!
//! Must never: apply a row the owner did not approve, start applying an
//! approval one of whose rows has nothing to apply to (a dry pass refuses it
//! before anything is written), write an item or the ledger the gate has not
//! passed, or lose a ledger row (the file is read, extended and replaced
//! atomically).

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::redaction::IdentifierGate;
use crate::review::draft::Draft;
use crate::review::fingerprint::{self, Fingerprint};
use crate::review::intake::{self, Decision, IntakeError, Triage, TriageRow};
use crate::review::judge::FindingKind;
use crate::review::relate;

/// `review.intake_dir`, or `<reviews>/intake` (`reviews` is the data
/// dir's `reviews/`).
pub(crate) fn intake_dir(reviews: &Path, cfg: &crate::config::ReviewConfig) -> std::path::PathBuf {
    if cfg.intake_dir.trim().is_empty() {
        reviews.join("intake")
    } else {
        std::path::PathBuf::from(cfg.intake_dir.trim())
    }
}

/// The gate every intake and ledger file passes: the review's identifier
/// gate with the owner's names (`review.owner_names`) as identifiers too.
pub(crate) fn intake_gate(cfg: &crate::config::ReviewConfig) -> Result<IdentifierGate, String> {
    let list = crate::redaction::RedactionList::new().with_names(cfg.owner_names.iter().cloned());
    IdentifierGate::new(&list).map_err(|e| e.to_string())
}

/// What the ledger feeds back to the daily judge (M3.2).
#[derive(Debug, Clone, Default)]
pub(crate) struct Feedback {
    /// Fingerprints of findings the owner rejected: a finding that is the
    /// same is dropped and counted.
    pub rejected: Vec<Fingerprint>,
    /// The most recent rejected findings as `kind: summary`, not yet redacted.
    pub counter_examples: Vec<String>,
}

impl Ledger {
    pub(crate) fn feedback(&self, max_examples: usize) -> Feedback {
        let rejected = self.rejected();
        let mut seen = BTreeSet::new();
        let counter_examples = rejected
            .iter()
            .rev()
            .map(|r| format!("{}: {}", r.kind.as_str(), one_line(&r.summary)))
            .filter(|t| seen.insert(t.clone()))
            .take(max_examples)
            .collect();
        Feedback {
            rejected: rejected.iter().map(|r| r.fingerprint.clone()).collect(),
            counter_examples,
        }
    }
}

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct LedgerRow {
    /// 12 letters, unique per row.
    pub id: String,
    pub fingerprint: Fingerprint,
    pub bot: String,
    pub date: String,
    pub message_id: i64,
    pub space: String,
    #[schema(value_type = String)]
    pub kind: FindingKind,
    pub summary: String,
    pub proposed: Decision,
    /// What the owner approved; `None` when the row was not approved.
    pub approved: Option<Decision>,
    /// Whether the approved decision was carried out.
    pub applied: bool,
    pub who: String,
    /// RFC 3339, UTC.
    pub when: String,
    /// Items matched or written.
    pub paths: Vec<String>,
    /// The drafted change approved with this row, and what applying it did
    /// (`outcome`); none for a row rejected or left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Draft>,
    /// The rehearsal of the draft, when one ran before the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehearsal: Option<crate::review::rehearse::Rehearsal>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Ledger {
    pub rows: Vec<LedgerRow>,
}

impl Ledger {
    /// Fingerprints the owner rejected (a finding that matches one is dropped
    /// from the daily report).
    pub(crate) fn rejected(&self) -> Vec<&LedgerRow> {
        self.rows
            .iter()
            .filter(|r| r.approved == Some(Decision::Reject))
            .collect()
    }
}

pub(crate) fn read(intake_dir: &Path) -> Result<Ledger, IntakeError> {
    let p = intake_dir.join("ledger.json");
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ledger::default()),
        Err(source) => {
            return Err(IntakeError::Io {
                what: "reading the ledger",
                path: p.display().to_string(),
                source,
            })
        }
    };
    serde_json::from_str(&text).map_err(|e| IntakeError::Invalid {
        path: p.display().to_string(),
        reason: e.to_string(),
    })
}

/// Which rows the owner approved, and with what decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Approval {
    All,
    /// Row number → decision (`None`: as proposed).
    Rows(Vec<(usize, Option<Decision>)>),
}

/// `--rows 1,3` and `--set 2=new` into one approval.
pub(crate) fn parse_approval(
    all: bool,
    rows: Option<&str>,
    sets: &[String],
) -> Result<Option<Approval>, IntakeError> {
    let usage = |m: String| IntakeError::Usage(m);
    if all && (rows.is_some() || !sets.is_empty()) {
        return Err(usage(
            "--all approves every row as proposed; give it alone".into(),
        ));
    }
    if all {
        return Ok(Some(Approval::All));
    }
    let mut out: Vec<(usize, Option<Decision>)> = Vec::new();
    for part in rows
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let n = part
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| usage(format!("--rows: {part:?} is not a row number")))?;
        out.push((n, None));
    }
    for s in sets {
        let (n, d) = s
            .split_once('=')
            .ok_or_else(|| usage(format!("--set {s:?}: write ROW=DECISION, e.g. 2=new")))?;
        let n = n
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| usage(format!("--set {s:?}: {n:?} is not a row number")))?;
        let d = Decision::parse(d).ok_or_else(|| {
            usage(format!(
                "--set {s:?}: the decision must be one of {}",
                Decision::ALL.map(Decision::as_str).join(", ")
            ))
        })?;
        out.retain(|(r, _)| *r != n);
        out.push((n, Some(d)));
    }
    Ok(if out.is_empty() {
        None
    } else {
        Some(Approval::Rows(out))
    })
}

/// What `approve` did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Approved {
    pub rows: usize,
    pub approved: usize,
    pub applied: usize,
    /// Items written or extended.
    pub written: Vec<String>,
    /// Drafted changes approved: each is the caller's to apply through the
    /// files API, then to record with [`record_draft_outcome`].
    pub drafts: Vec<ApprovedDraft>,
}

/// A drafted change an approval carries, for its caller to apply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ApprovedDraft {
    pub ledger_id: String,
    pub row: usize,
    /// The finding's message: its space is the draft's.
    pub message_id: i64,
    pub draft: Draft,
}

/// Applies the approved rows of the pending triage and appends every row
/// to the ledger.
pub(crate) fn approve(
    intake_dir: &Path,
    approval: &Approval,
    who: &str,
    gate: &IdentifierGate,
) -> Result<Approved, IntakeError> {
    let mut triage = pending(intake_dir)?.ok_or_else(|| {
        IntakeError::Usage(format!(
            "no triage is waiting in {}: run `mercury review intake` first",
            intake_dir.display()
        ))
    })?;
    let chosen: Vec<(usize, Option<Decision>)> = match approval {
        Approval::All => triage.rows.iter().map(|r| (r.row, None)).collect(),
        Approval::Rows(r) => r.clone(),
    };
    for (n, _) in &chosen {
        if !triage.rows.iter().any(|r| r.row == *n) {
            return Err(IntakeError::Usage(format!(
                "row {n} is not in the triage (it has {} rows)",
                triage.rows.len()
            )));
        }
    }
    let approved_as = |row: &TriageRow| {
        chosen
            .iter()
            .find(|(n, _)| *n == row.row)
            .map(|(_, d)| d.unwrap_or(row.proposed))
    };
    // Refused before anything is written: a dry pass of the loop below, with
    // the same `effect_of`, in which a `new` row stands for the item it will
    // write. An effect that attaches needs an item to attach to (for a
    // duplicate, the one the row it follows wrote or matched).
    let mut planned: Vec<(usize, Option<Decision>, Vec<String>)> = Vec::new();
    for row in &triage.rows {
        let n = row.row;
        let mut paths = row.paths.clone();
        let Some(decision) = approved_as(row) else {
            planned.push((n, None, paths));
            continue;
        };
        if decision == Decision::Duplicate && row.follows.is_none() {
            return Err(IntakeError::Usage(format!(
                "row {n} follows no earlier finding, so it cannot be a duplicate"
            )));
        }
        let (effect, target) = effect_of(row, decision, &planned);
        let written = match effect {
            Some(Decision::New) => Some(PLANNED_ITEM.to_owned()),
            Some(e @ (Decision::Attach | Decision::FixedNotDeployed | Decision::Revisit)) => {
                Some(target.ok_or_else(|| {
                    IntakeError::Usage(format!(
                        "row {n} matched no item to {}: approve it as new (--set {n}=new) or leave it out",
                        e.as_str()
                    ))
                })?)
            }
            None | Some(Decision::Reject | Decision::Duplicate) => None,
        };
        if let Some(p) = written.filter(|p| !paths.contains(p)) {
            paths.insert(0, p);
        }
        planned.push((n, final_decision(decision, effect), paths));
    }
    let mut ledger = read(intake_dir)?;
    let now = crate::clock::ms_to_rfc3339(crate::clock::now_ms());
    let mut out = Approved {
        rows: triage.rows.len(),
        approved: 0,
        applied: 0,
        written: Vec::new(),
        drafts: Vec::new(),
    };
    // (row, final decision, paths) of rows already handled, for duplicates.
    let mut done: Vec<(usize, Option<Decision>, Vec<String>)> = Vec::new();
    for row in &triage.rows {
        let approved = approved_as(row);
        let mut paths = row.paths.clone();
        let mut applied = false;
        let id = row_id();
        // A draft goes with an approval that leads to work on the finding.
        let draft = row.draft.clone().filter(|_| {
            matches!(
                approved,
                Some(
                    Decision::New
                        | Decision::Attach
                        | Decision::Revisit
                        | Decision::FixedNotDeployed
                )
            )
        });
        if let Some(d) = &draft {
            out.drafts.push(ApprovedDraft {
                ledger_id: id.clone(),
                row: row.row,
                message_id: row.finding.message_id,
                draft: d.clone(),
            });
        }
        if let Some(decision) = approved {
            out.approved += 1;
            let (effect, target) = effect_of(row, decision, &done);
            if let Some(p) = apply(intake_dir, row, effect, target.as_deref(), gate)? {
                out.written.push(p.clone());
                if !paths.contains(&p) {
                    paths.insert(0, p);
                }
            }
            applied = true;
            out.applied += 1;
            done.push((row.row, final_decision(decision, effect), paths.clone()));
        } else {
            done.push((row.row, None, paths.clone()));
        }
        ledger.rows.push(LedgerRow {
            id,
            fingerprint: row.fingerprint.clone(),
            bot: row.finding.bot.clone(),
            date: row.finding.date.clone(),
            message_id: row.finding.message_id,
            space: row.finding.space.clone(),
            kind: row.finding.kind,
            summary: row.finding.summary.clone(),
            proposed: row.proposed,
            approved,
            applied,
            who: who.to_owned(),
            when: now.clone(),
            paths,
            draft,
            rehearsal: row.rehearsal.clone(),
        });
    }
    write_ledger(intake_dir, &ledger, gate)?;
    triage.approved_at = Some(now);
    intake::write_triage(intake_dir, &triage, gate)?;
    Ok(out)
}

/// Records what applying a ledger row's draft did (`applied`, `stale`, or
/// why it was not applied). The caller holds the intake lock, as for
/// [`approve`].
pub(crate) fn record_draft_outcome(
    intake_dir: &Path,
    ledger_id: &str,
    outcome: &str,
    gate: &IdentifierGate,
) -> Result<(), IntakeError> {
    let mut ledger = read(intake_dir)?;
    let draft = ledger
        .rows
        .iter_mut()
        .find(|r| r.id == ledger_id)
        .and_then(|r| r.draft.as_mut())
        .ok_or_else(|| IntakeError::Usage(format!("ledger row {ledger_id} has no draft")))?;
    draft.outcome = Some(outcome.to_owned());
    write_ledger(intake_dir, &ledger, gate)
}

/// Whether the approval would carry a drafted change (its caller must be
/// able to apply it: a running host).
pub(crate) fn carries_drafts(triage: &Triage, approval: &Approval) -> Vec<usize> {
    triage
        .rows
        .iter()
        .filter(|r| r.draft.is_some())
        .filter(|r| match approval {
            Approval::All => r.proposed != Decision::Reject && r.proposed != Decision::Duplicate,
            Approval::Rows(chosen) => chosen.iter().any(|(n, d)| {
                *n == r.row
                    && !matches!(
                        d.unwrap_or(r.proposed),
                        Decision::Reject | Decision::Duplicate
                    )
            }),
        })
        .map(|r| r.row)
        .collect()
}

/// The item a planned `new` row stands for in `approve`'s dry pass.
const PLANNED_ITEM: &str = "(the item this row writes)";

/// What a handled row did, for the duplicates that follow it: a duplicate
/// did what it followed.
fn final_decision(decision: Decision, effect: Option<Decision>) -> Option<Decision> {
    if decision == Decision::Duplicate {
        effect
    } else {
        Some(decision)
    }
}

/// What an approved decision does, and to which item: a duplicate does what
/// the row it follows did (or, for an earlier ledger row, what that row's
/// decision does to its paths).
fn effect_of(
    row: &TriageRow,
    decision: Decision,
    done: &[(usize, Option<Decision>, Vec<String>)],
) -> (Option<Decision>, Option<String>) {
    if decision != Decision::Duplicate {
        return (Some(decision), row.paths.first().cloned());
    }
    let Some(f) = &row.follows else {
        return (None, None);
    };
    let (d, paths) = match f.row.and_then(|n| done.iter().find(|(r, _, _)| *r == n)) {
        Some((_, d, p)) => (*d, p.clone()),
        None => (f.decision, f.paths.clone()),
    };
    // Following a `new` means attaching to the item it wrote.
    let d = match d {
        Some(Decision::New) => Some(Decision::Attach),
        other => other,
    };
    (d, paths.first().cloned())
}

/// Carries out one decision; the path of the item written or extended.
fn apply(
    intake_dir: &Path,
    row: &TriageRow,
    effect: Option<Decision>,
    target: Option<&str>,
    gate: &IdentifierGate,
) -> Result<Option<String>, IntakeError> {
    match effect {
        None | Some(Decision::Reject) | Some(Decision::Duplicate) => Ok(None),
        Some(Decision::New) => write_new_item(intake_dir, row, gate).map(Some),
        Some(Decision::Attach | Decision::FixedNotDeployed | Decision::Revisit) => {
            let Some(rel) = target else {
                return Err(IntakeError::Usage(format!(
                    "row {} has no matched item to attach to: approve it as new (--set {}=new)",
                    row.row, row.row
                )));
            };
            append_reference(intake_dir, rel, row, gate).map(Some)
        }
    }
}

fn is_bug(kind: FindingKind) -> bool {
    !matches!(kind, FindingKind::Tone | FindingKind::Other)
}

/// `bugs/<slug>.md` or `ideas/<slug>.md`, pre-filled from the finding.
fn write_new_item(
    intake_dir: &Path,
    row: &TriageRow,
    gate: &IdentifierGate,
) -> Result<String, IntakeError> {
    let f = &row.finding;
    let kind = if is_bug(f.kind) {
        relate::ItemKind::Bug
    } else {
        relate::ItemKind::Idea
    };
    let dir = intake_dir.join(kind.dir());
    let base = slug(&f.summary);
    let mut name = format!("{base}.md");
    let mut n = 2;
    while dir.join(&name).exists() {
        name = format!("{base}-{}.md", letters_of(n));
        n += 1;
    }
    let body = format!(
        "# {title}\n\n\
         {fp}\n\n\
         - kind: {kind}\n- scope: {scope}\n- target layer: {layer}\n- severity: {sev}\n\
         - first seen: {bot} {date} [msg {msg}] in space {space}\n\n\
         ## Summary\n\n{summary}\n\n## Evidence\n\n{evidence}\n\n## Suggestion\n\n{suggestion}\n\n\
         ## Findings\n\n- {date} {bot} [msg {msg}]: {summary}\n",
        title = one_line(&f.summary),
        fp = relate::fingerprint_line(&row.fingerprint),
        kind = f.kind.as_str(),
        scope = f.scope.as_str(),
        layer = f.target_layer.as_str(),
        sev = f.severity,
        bot = f.bot,
        date = f.date,
        msg = f.message_id,
        space = f.space,
        summary = one_line(&f.summary),
        evidence = one_line(&f.evidence),
        suggestion = one_line(&f.suggestion),
    );
    let ids: BTreeSet<i64> = [f.message_id].into();
    intake::gate_text("new item", &body, &Value::Null, &ids, gate)?;
    intake::persist(&dir, &name, body.as_bytes())?;
    Ok(format!("{}/{name}", kind.dir()))
}

/// Appends `- <date> <bot> [msg N] (<decision>): <summary>` to an item.
fn append_reference(
    intake_dir: &Path,
    rel: &str,
    row: &TriageRow,
    gate: &IdentifierGate,
) -> Result<String, IntakeError> {
    // Only a path the intake itself listed: `<folder>/<name>.md`.
    let (folder, name) = rel
        .split_once('/')
        .filter(|(d, n)| {
            relate::ItemKind::ALL.iter().any(|k| k.dir() == *d)
                && n.ends_with(".md")
                && !n.contains('/')
                && !n.starts_with('.')
        })
        .ok_or_else(|| IntakeError::Usage(format!("{rel:?} is not a known item path")))?;
    let dir = intake_dir.join(folder);
    let path = dir.join(name);
    let meta = std::fs::symlink_metadata(&path).map_err(|source| IntakeError::Io {
        what: "reading the item",
        path: path.display().to_string(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(IntakeError::Usage(format!("{rel} is not a plain file")));
    }
    let mut body = std::fs::read_to_string(&path).map_err(|source| IntakeError::Io {
        what: "reading the item",
        path: path.display().to_string(),
        source,
    })?;
    if !body.contains("\n## Findings\n") {
        if !body.ends_with('\n') {
            body.push('\n');
        }
        body.push_str("\n## Findings\n\n");
    }
    let f = &row.finding;
    let line = format!(
        "- {} {} [msg {}] in space {} ({}): {} (fingerprint {})\n",
        f.date,
        f.bot,
        f.message_id,
        f.space,
        row.proposed.as_str(),
        one_line(&f.summary),
        row.fingerprint.short_id()
    );
    let ids: BTreeSet<i64> = [f.message_id].into();
    // The line is ours to gate; the operator's own text around it is theirs.
    intake::gate_text("item reference", &line, &Value::Null, &ids, gate)?;
    body.push_str(&line);
    intake::persist(&dir, name, body.as_bytes())?;
    Ok(rel.to_owned())
}

fn write_ledger(
    intake_dir: &Path,
    ledger: &Ledger,
    gate: &IdentifierGate,
) -> Result<(), IntakeError> {
    let json = serde_json::to_value(ledger).map_err(|e| IntakeError::Invalid {
        path: "ledger".into(),
        reason: e.to_string(),
    })?;
    // Message ids are JSON numbers (not gated); every string is.
    intake::gate_text("ledger", "", &json, &BTreeSet::new(), gate)?;
    let text = serde_json::to_string_pretty(&json).map_err(|e| IntakeError::Invalid {
        path: "ledger".into(),
        reason: e.to_string(),
    })?;
    intake::persist(intake_dir, "ledger.json", text.as_bytes())
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ").trim().to_owned()
}

/// A file name from a summary's words: at most six, joined with `-`.
fn slug(summary: &str) -> String {
    let words: Vec<String> = fingerprint::words(summary)
        .into_iter()
        .map(|w| {
            w.chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
        })
        .filter(|w| !w.is_empty() && !w.chars().any(|c| c.is_ascii_digit()))
        .take(6)
        .collect();
    if words.is_empty() {
        "finding".to_owned()
    } else {
        words.join("-")
    }
}

/// `2` → `b`, `27` → `ab`: suffixes without digits.
fn letters_of(mut n: usize) -> String {
    let mut out = Vec::new();
    while n > 0 {
        out.push(char::from(b'a' + ((n - 1) % 26) as u8));
        n = (n - 1) / 26;
    }
    out.iter().rev().collect()
}

fn row_id() -> String {
    let v: u64 = rand::random();
    (0..12)
        .map(|i| char::from(b'a' + ((v >> (4 * i)) & 0xf) as u8))
        .collect()
}

/// `triage` rows approved as asked: for the interactive prompt.
pub(crate) fn describe_row(r: &TriageRow) -> String {
    format!(
        "{}. {} {} [msg {}] {}: {} -> {} ({}){}",
        r.row,
        r.finding.bot,
        r.finding.date,
        r.finding.message_id,
        r.finding.kind.as_str(),
        one_line(&r.finding.summary),
        r.proposed.as_str(),
        r.reason,
        if r.paths.is_empty() {
            String::new()
        } else {
            format!(" [{}]", r.paths.join(", "))
        }
    )
}

/// The pending triage: the one not approved yet (`approve` applies it, a
/// new intake waits for it, the TTY prompt shows it).
pub(crate) fn pending(intake_dir: &Path) -> Result<Option<Triage>, IntakeError> {
    Ok(intake::read_triage(intake_dir)?.filter(|t| t.approved_at.is_none()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, summary: &str, proposed: Decision) -> TriageRow {
        let finding = intake::IntakeFinding {
            bot: "local".into(),
            date: "2026-09-28".into(),
            space: "family".into(),
            message_id: 10 + n as i64,
            kind: FindingKind::Tone,
            scope: crate::review::judge::Scope::Space,
            target_layer: crate::review::judge::TargetLayer::Character,
            severity: 1,
            summary: summary.into(),
            evidence: "e".into(),
            suggestion: "s".into(),
        };
        TriageRow {
            row: n,
            fingerprint: finding.fingerprint(),
            finding,
            proposed,
            reason: "r".into(),
            paths: Vec::new(),
            follows: None,
            draft: None,
            draft_note: None,
            rehearsal: None,
        }
    }

    #[test]
    fn review_ledger_refuses_an_impossible_approval_before_writing_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let gate = IdentifierGate::new(&crate::redaction::RedactionList::new()).unwrap();
        let triage = Triage {
            made_at: "2026-09-28T05:00:00Z".into(),
            taken_in: vec!["local/2026-09-28".into()],
            refused: Vec::new(),
            invalid_findings: 0,
            rows: vec![
                row(1, "a curt reply", Decision::New),
                row(2, "a rude greeting", Decision::New),
            ],
            approved_at: None,
            stopped: None,
            own_bot: None,
        };
        intake::write_triage(tmp.path(), &triage, &gate).unwrap();
        // Row 1 as new would be written first; row 2 cannot attach to nothing.
        let err = approve(
            tmp.path(),
            &Approval::Rows(vec![(1, None), (2, Some(Decision::Attach))]),
            "owner",
            &gate,
        )
        .unwrap_err();
        assert!(err.to_string().contains("row 2 matched no item"), "{err}");
        assert!(!tmp.path().join("ledger.json").exists());
        assert!(!tmp.path().join("ideas").exists(), "nothing applied");
        assert!(
            pending(tmp.path()).unwrap().is_some(),
            "the triage still waits"
        );
        // Approved as asked, both rows land in the ledger and the idea is written.
        let done = approve(tmp.path(), &Approval::All, "owner", &gate).unwrap();
        assert_eq!((done.rows, done.applied, done.written.len()), (2, 2, 2));
        assert_eq!(read(tmp.path()).unwrap().rows.len(), 2);
        assert!(pending(tmp.path()).unwrap().is_none());
    }

    #[test]
    fn review_ledger_only_a_row_approved_for_work_carries_its_draft() {
        let tmp = tempfile::tempdir().unwrap();
        let gate = IdentifierGate::new(&crate::redaction::RedactionList::new()).unwrap();
        let drafted = |n: usize, summary: &str| {
            let mut r = row(n, summary, Decision::New);
            r.draft = Some(Draft {
                file: "AGENTS.md".into(),
                base_hash: String::new(),
                edit: crate::review::draft::Edit {
                    remove: Vec::new(),
                    add: vec![format!("Line {n}.")],
                    after: 0,
                },
                diff: String::new(),
                reason: String::new(),
                outcome: None,
            });
            r
        };
        let triage = Triage {
            made_at: "2026-12-05T05:00:00Z".into(),
            taken_in: vec!["local/2026-12-05".into()],
            refused: Vec::new(),
            invalid_findings: 0,
            rows: vec![
                drafted(1, "a wrong capital"),
                drafted(2, "a rude greeting"),
                drafted(3, "a missed reminder"),
            ],
            approved_at: None,
            stopped: None,
            own_bot: None,
        };
        intake::write_triage(tmp.path(), &triage, &gate).unwrap();
        // Row 1 as proposed, row 2 rejected, row 3 left out.
        let approval = Approval::Rows(vec![(1, None), (2, Some(Decision::Reject))]);
        assert_eq!(carries_drafts(&triage, &approval), [1]);
        assert_eq!(carries_drafts(&triage, &Approval::All), [1, 2, 3]);
        let done = approve(tmp.path(), &approval, "owner", &gate).unwrap();
        assert_eq!(done.drafts.iter().map(|d| d.row).collect::<Vec<_>>(), [1]);
        let ledger = read(tmp.path()).unwrap();
        let with_draft: Vec<bool> = ledger.rows.iter().map(|r| r.draft.is_some()).collect();
        assert_eq!(with_draft, [true, false, false]);
        // The outcome lands on that row, and only a row with a draft takes one.
        record_draft_outcome(tmp.path(), &done.drafts[0].ledger_id, "applied", &gate).unwrap();
        let ledger = read(tmp.path()).unwrap();
        assert_eq!(
            ledger.rows[0].draft.as_ref().unwrap().outcome.as_deref(),
            Some("applied")
        );
        let other = ledger.rows[1].id.clone();
        assert!(record_draft_outcome(tmp.path(), &other, "applied", &gate).is_err());
    }

    #[test]
    fn review_ledger_a_duplicate_of_an_unapproved_new_row_is_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let gate = IdentifierGate::new(&crate::redaction::RedactionList::new()).unwrap();
        // Row 2 follows a ledger row that was proposed `new` but never
        // approved, so it wrote no item (a triage the intake made while it
        // still followed unapproved rows); row 1 would be written first.
        let mut dup = row(2, "a curt reply again", Decision::Duplicate);
        dup.follows = Some(intake::Follows {
            ledger_id: Some("abcdefghijkl".into()),
            row: None,
            decision: Some(Decision::New),
            paths: Vec::new(),
        });
        // Row 4 follows row 3 of this triage, a `new` left unapproved: it
        // does what row 3 did, which is nothing.
        let mut dup_of_unapproved = row(4, "a rude greeting again", Decision::Duplicate);
        dup_of_unapproved.follows = Some(intake::Follows {
            ledger_id: None,
            row: Some(3),
            decision: Some(Decision::New),
            paths: Vec::new(),
        });
        let triage = Triage {
            made_at: "2026-09-28T05:00:00Z".into(),
            taken_in: vec!["local/2026-09-28".into()],
            refused: Vec::new(),
            invalid_findings: 0,
            rows: vec![
                row(1, "a curt reply", Decision::New),
                dup,
                row(3, "a rude greeting", Decision::New),
                dup_of_unapproved,
            ],
            approved_at: None,
            stopped: None,
            own_bot: None,
        };
        intake::write_triage(tmp.path(), &triage, &gate).unwrap();
        let err = approve(tmp.path(), &Approval::All, "owner", &gate).unwrap_err();
        assert!(
            err.to_string().contains("row 2 matched no item to attach"),
            "{err}"
        );
        assert!(!tmp.path().join("ledger.json").exists());
        assert!(!tmp.path().join("ideas").exists(), "nothing applied");
        assert!(pending(tmp.path()).unwrap().is_some());

        let done = approve(
            tmp.path(),
            &Approval::Rows(vec![(1, None), (4, None)]),
            "owner",
            &gate,
        )
        .unwrap();
        assert_eq!((done.rows, done.approved, done.written.len()), (4, 2, 1));
        let ledger = read(tmp.path()).unwrap();
        assert_eq!(ledger.rows.len(), 4);
        assert!(ledger.rows[3].paths.is_empty(), "{:?}", ledger.rows[3]);
        let ideas = std::fs::read_dir(tmp.path().join("ideas")).unwrap().count();
        assert_eq!(ideas, 1, "only row 1 wrote an item");
    }

    #[test]
    fn review_ledger_approval_arguments() {
        assert_eq!(
            parse_approval(true, None, &[]).unwrap(),
            Some(Approval::All)
        );
        assert_eq!(parse_approval(false, None, &[]).unwrap(), None);
        assert_eq!(
            parse_approval(false, Some("1, 3"), &["3=new".into(), "2=reject".into()]).unwrap(),
            Some(Approval::Rows(vec![
                (1, None),
                (3, Some(Decision::New)),
                (2, Some(Decision::Reject))
            ]))
        );
        for (rows, sets) in [
            (Some("0"), vec![]),
            (Some("x"), vec![]),
            (None, vec!["2".to_owned()]),
            (None, vec!["2=maybe".to_owned()]),
        ] {
            assert!(
                parse_approval(false, rows, &sets).is_err(),
                "{rows:?} {sets:?}"
            );
        }
        assert!(parse_approval(true, Some("1"), &[]).is_err());
        assert_eq!(
            slug("The [PERSON_1] got 12 wrong capitals!"),
            "person-got-wrong-capital"
        );
        assert_eq!(
            (letters_of(2), letters_of(27)),
            ("b".to_owned(), "aa".to_owned())
        );
        assert!(row_id().bytes().all(|b| (b'a'..=b'p').contains(&b)));
    }
}
