//! Conversation review on the dashboard: the daily and weekly reports (each
//! finding linked to its exchange and the run that answered it), recall
//! and precision week by week, the ledger's counts, and the pending intake
//! triage with one approval form that has the effect of `mercury review
//! approve` (the same `review::ledger::approve`, under the same intake
//! lock). Global admins only, as the review routes of the API.
//!
//! Must never: show a report or the triage to anyone else, approve on a GET
//! or without the sign-in's CSRF token, or rewrite the ledger while an
//! intake or another approval holds the intake lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Form;
use serde::Deserialize;
use serde_json::Value;

use super::error::{blocking, UiError, UiResult};
use super::pages::{page, see_other, Chrome};
use super::session::Viewer;
use crate::app::App;
use crate::ids::SpaceId;
use crate::review::catalog::{self, ReportKind, ReportName};
use crate::review::draft::{self, DraftOutcome};
use crate::review::intake::{Decision, IntakeError};
use crate::review::ledger::{self, Approval};
use crate::storage::{messages, runs};

const WHAT: &str = "review reports and the intake";
/// Weekly reports shown in the recall and precision table.
const WEEKS: usize = 12;

fn intake_dir(app: &App) -> PathBuf {
    ledger::intake_dir(&app.rt.paths.reviews, &app.rt.settings.review)
}

impl From<IntakeError> for UiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Usage(m) => UiError::BadRequest(m),
            e => UiError::Internal(e.to_string()),
        }
    }
}

impl From<catalog::CatalogError> for UiError {
    fn from(e: catalog::CatalogError) -> Self {
        match e {
            e @ catalog::CatalogError::BadName(_) => UiError::BadRequest(e.to_string()),
            e @ catalog::CatalogError::NotFound { .. } => UiError::NotFound(e.to_string()),
            e => UiError::Internal(e.to_string()),
        }
    }
}

struct ReportLink {
    name: String,
    date: String,
    kind: &'static str,
}

struct WeekRow {
    name: String,
    date: String,
    recall: String,
    precision: String,
}

struct TriageLine {
    row: usize,
    bot: String,
    date: String,
    space: String,
    message_id: i64,
    kind: &'static str,
    summary: String,
    proposed: &'static str,
    reason: String,
    paths: String,
    /// A drafted fix's diff (empty: none), or why none was drafted.
    draft: String,
    draft_note: String,
    /// The rehearsal's verdict (`mercury review rehearse`), when one ran.
    rehearsal: String,
}

#[derive(Template)]
#[template(path = "ui/review.html")]
struct ReviewPage {
    chrome: Chrome,
    notice: String,
    reports: Vec<ReportLink>,
    weeks: Vec<WeekRow>,
    counts: Vec<(String, u64)>,
    triage_made: String,
    triage: Vec<TriageLine>,
    decisions: Vec<&'static str>,
}

#[derive(Deserialize)]
pub(super) struct ReviewQuery {
    /// `approved-N-of-M`: what the last approval did (numbers only).
    #[serde(default)]
    did: String,
    /// `A-of-D`: drafts applied of those approved (numbers only).
    #[serde(default)]
    drafts: String,
}

fn ratio(v: Option<&Value>) -> String {
    v.and_then(Value::as_f64)
        .map_or_else(|| "-".to_owned(), |x| format!("{:.0} %", x * 100.0))
}

/// `GET /ui/review`.
pub(super) async fn overview(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Query(q): Query<ReviewQuery>,
) -> UiResult<Response> {
    viewer.require_admin(WHAT)?;
    let reviews = app.rt.paths.reviews.clone();
    let dir = intake_dir(&app);
    let (mut entries, weeks, ledger, pending) = blocking::<_, UiError>(move || {
        let entries = catalog::list(&reviews)?;
        let mut weeks = Vec::new();
        for e in entries
            .iter()
            .rev()
            .filter(|e| e.kind == ReportKind::Weekly)
            .take(WEEKS)
        {
            let name = ReportName::parse(&e.name)?;
            // A weekly report that cannot be read is shown without figures.
            let r = catalog::read(&reviews, &name).unwrap_or(Value::Null);
            weeks.push(WeekRow {
                name: e.name.clone(),
                date: e.date.clone(),
                recall: ratio(r.pointer("/recall/estimate")),
                precision: ratio(r.pointer("/verdicts/precision/value")),
            });
        }
        Ok((entries, weeks, ledger::read(&dir)?, ledger::pending(&dir)?))
    })
    .await?;
    entries.reverse();
    let notice = match q
        .did
        .strip_prefix("approved-")
        .and_then(|r| r.split_once("-of-"))
    {
        Some((a, n)) if a.parse::<u32>().is_ok() && n.parse::<u32>().is_ok() => {
            format!("{a} of {n} row(s) approved and applied; every row is in the ledger.")
        }
        _ => String::new(),
    };
    let notice = match q.drafts.split_once("-of-") {
        Some((a, n)) if a.parse::<u32>().is_ok() && n.parse::<u32>().is_ok() => format!(
            "{notice} {a} of {n} drafted fix(es) applied; the ledger says what became of each."
        ),
        _ => notice,
    };
    let (triage_made, triage) = match pending {
        Some(t) => (
            t.made_at,
            t.rows
                .into_iter()
                .map(|r| TriageLine {
                    row: r.row,
                    bot: r.finding.bot,
                    date: r.finding.date,
                    space: r.finding.space,
                    message_id: r.finding.message_id,
                    kind: r.finding.kind.as_str(),
                    summary: r.finding.summary,
                    proposed: r.proposed.as_str(),
                    reason: r.reason,
                    paths: r.paths.join(", "),
                    draft: r.draft.map(|d| d.diff).unwrap_or_default(),
                    rehearsal: r.rehearsal.map(|x| x.verdict).unwrap_or_default(),
                    draft_note: r.draft_note.unwrap_or_default(),
                })
                .collect(),
        ),
        None => (String::new(), Vec::new()),
    };
    page(&ReviewPage {
        chrome: Chrome::of(&viewer),
        notice,
        reports: entries
            .into_iter()
            .map(|e| ReportLink {
                kind: e.kind.as_str(),
                name: e.name,
                date: e.date,
            })
            .collect(),
        weeks,
        counts: crate::review::weekly::ledger_counts(&ledger)
            .into_iter()
            .collect(),
        triage_made,
        triage,
        decisions: Decision::ALL.iter().map(|d| d.as_str()).collect(),
    })
}

struct FindingRow {
    space: String,
    message_id: i64,
    run: Option<String>,
    /// The trace step the finding cites (the run page's `#step-N`).
    step: Option<u64>,
    kind: String,
    severity: String,
    summary: String,
    evidence: String,
    suggestion: String,
}

/// One bar of a trend chart, in the SVG's own units.
struct Bar {
    x: u64,
    y: u64,
    h: u64,
    n: u64,
}

/// A weekly cluster's findings per week, as text and as a bar chart.
struct TrendRow {
    summary: String,
    quiet: bool,
    counts: String,
    bars: Vec<Bar>,
}

/// Bar width plus gap, and the chart's height.
const BAR_STEP: u64 = 10;
const CHART_HEIGHT: u64 = 24;

impl TrendRow {
    /// From a cluster of a weekly `report.json`; `None` without `weeks`
    /// (a weekly written before trends).
    fn of(c: &Value, quiet: bool) -> Option<Self> {
        let weeks: Vec<u64> = c
            .get("weeks")?
            .as_array()?
            .iter()
            .take(crate::review::trend::WEEKS)
            .map(|n| n.as_u64().unwrap_or(0))
            .collect();
        let max = weeks.iter().copied().max().unwrap_or(0).max(1);
        let bars = weeks
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                // Any finding shows as at least two units high.
                let h = if n == 0 {
                    0
                } else {
                    (n * CHART_HEIGHT / max).max(2)
                };
                Bar {
                    x: i as u64 * BAR_STEP,
                    y: CHART_HEIGHT - h,
                    h,
                    n,
                }
            })
            .collect();
        Some(TrendRow {
            summary: text(c, "summary"),
            quiet,
            counts: crate::review::trend::line(&weeks),
            bars,
        })
    }
}

#[derive(Template)]
#[template(path = "ui/report.html")]
struct ReportPage {
    chrome: Chrome,
    /// A weekly report's clusters per week (this week's, then the quiet).
    trends: Vec<TrendRow>,
    chart_width: u64,
    chart_height: u64,
    name: String,
    kind: &'static str,
    findings: Vec<FindingRow>,
    /// The weekly report's clusters (`summary`, count), or a daily's footer lines.
    lines: Vec<(String, String)>,
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// `GET /ui/review/reports/{name}`.
pub(super) async fn report(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
) -> UiResult<Response> {
    viewer.require_admin(WHAT)?;
    let name = ReportName::parse(&raw)?;
    let reviews = app.rt.paths.reviews.clone();
    let n = name.clone();
    let report = blocking::<_, UiError>(move || Ok(catalog::read(&reviews, &n)?)).await?;
    let findings: Vec<(String, i64, Value)> = report
        .get("findings")
        .and_then(Value::as_array)
        .map(|all| {
            all.iter()
                .map(|f| {
                    (
                        text(f, "space"),
                        f.get("message_id").and_then(Value::as_i64).unwrap_or(0),
                        f.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let wanted: Vec<(String, i64)> = findings.iter().map(|(s, m, _)| (s.clone(), *m)).collect();
    let run_of: HashMap<(String, i64), String> = app
        .rt
        .store
        .read(move |c| {
            let mut out = HashMap::new();
            for (space, message) in wanted {
                if let Some(r) = runs::latest_for_message(c, &space, message)? {
                    out.insert((space, message), r.id);
                }
            }
            Ok(out)
        })
        .await?;
    let mut trends = Vec::new();
    for (key, quiet) in [("clusters", false), ("quiet", true)] {
        for c in report
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            trends.extend(TrendRow::of(c, quiet));
        }
    }
    let mut lines = Vec::new();
    if let Some(clusters) = report.get("clusters").and_then(Value::as_array) {
        for c in clusters {
            let members = c
                .get("members")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            lines.push((text(c, "summary"), format!("{members} finding(s)")));
        }
    }
    if let Some(footer) = report.get("footer").and_then(Value::as_object) {
        for (k, v) in footer {
            match v {
                Value::String(t) => lines.push((k.clone(), t.clone())),
                Value::Number(n) => lines.push((k.clone(), n.to_string())),
                _ => {}
            }
        }
    }
    page(&ReportPage {
        chrome: Chrome::of(&viewer),
        trends,
        chart_width: crate::review::trend::WEEKS as u64 * BAR_STEP,
        chart_height: CHART_HEIGHT,
        name: raw,
        kind: name.kind.as_str(),
        findings: findings
            .into_iter()
            .map(|(space, message_id, f)| FindingRow {
                // A cited step names its run; else the run the message started.
                run: f["trace"]["run_id"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| run_of.get(&(space.clone(), message_id)).cloned()),
                step: f["trace"]["step"].as_u64(),
                kind: text(&f, "kind"),
                severity: text(&f, "severity"),
                summary: text(&f, "summary"),
                evidence: text(&f, "evidence"),
                suggestion: text(&f, "suggestion"),
                space,
                message_id,
            })
            .collect(),
        lines,
    })
}

/// The approval form: `csrf`, then `row-N` = `skip`, `proposed` or a
/// decision word for each triage row; or `all=1` for every row as proposed.
#[derive(Deserialize)]
pub(super) struct ApproveForm {
    #[serde(flatten)]
    fields: HashMap<String, String>,
}

fn approval_of(fields: &HashMap<String, String>) -> UiResult<Approval> {
    if fields.get("all").is_some_and(|v| v == "1") {
        return Ok(Approval::All);
    }
    let mut rows = Vec::new();
    for (k, v) in fields {
        let Some(n) = k.strip_prefix("row-") else {
            continue;
        };
        let n: usize = n
            .parse()
            .map_err(|_| UiError::BadRequest(format!("{k:?} is not a triage row")))?;
        match v.as_str() {
            "skip" | "" => {}
            "proposed" => rows.push((n, None)),
            word => {
                let d = Decision::parse(word)
                    .ok_or_else(|| UiError::BadRequest(format!("{word:?} is not a decision")))?;
                rows.push((n, Some(d)));
            }
        }
    }
    if rows.is_empty() {
        return Err(UiError::BadRequest(
            "choose a decision for at least one row (or approve all as proposed)".into(),
        ));
    }
    rows.sort_by_key(|(n, _)| *n);
    Ok(Approval::Rows(rows))
}

/// `POST /ui/review/approve`.
pub(super) async fn approve(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Form(form): Form<ApproveForm>,
) -> UiResult<Response> {
    let csrf = form.fields.get("csrf").cloned().unwrap_or_default();
    viewer.check_csrf(&csrf)?;
    viewer.require_admin(WHAT)?;
    let approval = approval_of(&form.fields)?;
    let gate = ledger::intake_gate(&app.rt.settings.review).map_err(UiError::Internal)?;
    let dir = intake_dir(&app);
    let paths = app.rt.paths.clone();
    let who = viewer.caller().to_owned();
    let (d, p) = (dir.clone(), paths.clone());
    let done = blocking::<_, UiError>(move || {
        let _lock = crate::workspace::data_dir::lock_intake(&p)
            .map_err(|e| UiError::Unavailable(format!("{e}; approve when it ends")))?;
        Ok(ledger::approve(&d, &approval, &who, &gate)?)
    })
    .await?;
    // Drafts go through their space's one writer, then their outcomes into
    // the ledger (under the lock again).
    let mut outcomes = Vec::new();
    let mut applied_drafts = 0;
    for d in &done.drafts {
        let applied = apply_draft(&app, d).await;
        applied_drafts += usize::from(applied == DraftOutcome::Applied);
        outcomes.push((d.ledger_id.clone(), applied.outcome(&d.draft.file)));
    }
    let drafts = if outcomes.is_empty() {
        String::new()
    } else {
        format!("&drafts={applied_drafts}-of-{}", outcomes.len())
    };
    if !outcomes.is_empty() {
        let gate = ledger::intake_gate(&app.rt.settings.review).map_err(UiError::Internal)?;
        blocking::<_, UiError>(move || {
            let _lock = crate::workspace::data_dir::lock_intake(&paths)
                .map_err(|e| UiError::Unavailable(format!("{e}; approve when it ends")))?;
            for (id, outcome) in outcomes {
                ledger::record_draft_outcome(&dir, &id, &outcome, &gate)?;
            }
            Ok(())
        })
        .await?;
    }
    Ok(see_other(&format!(
        "/ui/review?did=approved-{}-of-{}{drafts}",
        done.applied, done.rows
    )))
}

/// How long applying a draft waits behind a turn of its space.
const DRAFT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Applies one approved draft in this host: its space from its message,
/// then, in that space's writer, the file read, checked against the
/// draft's base and written under `If-Match` (as `PUT /api/files` does).
async fn apply_draft(app: &App, d: &ledger::ApprovedDraft) -> DraftOutcome {
    let id = d.message_id;
    let space = match app.rt.store.read(move |c| messages::get(c, id)).await {
        Ok(Some(m)) => m.space_id,
        _ => return DraftOutcome::Refused("its message is not in this host's store"),
    };
    let Ok(space) = SpaceId::parse(&space) else {
        return DraftOutcome::Refused("its space id is not one this host makes");
    };
    let draft = d.draft.clone();
    let (quota, limits) = (
        app.rt.settings.sandbox.workspace_mb,
        (&app.rt.settings.workspace).into(),
    );
    let max = app.rt.settings.files.max_bytes;
    let job = move |live: &std::path::Path| draft::apply_in(live, &draft, max, quota, limits);
    app.spaces
        .workspace_write(&space, DRAFT_WAIT, job)
        .await
        .unwrap_or(DraftOutcome::Refused("the space was busy or is gone"))
}
