//! The rehearsal bench on the dashboard: the snapshots under the shadow
//! root, the shadow that runs (if one does), and a snapshot's diff against
//! the live bot it was taken from, rendered side by side (rows before →
//! after, files with the changed lines of their text, the messages the
//! shadow added, the sends it held and the writes it refused). Read-only,
//! global admins only; taking, starting and promoting stay `mercury shadow`
//! commands on the host's own shell.
//!
//! Must never: show a diff that has not been through the review's
//! redactor and gate (`shadow::diff::diff_redacted`, what `mercury shadow
//! diff` prints without `--raw`), or open a path under the root it did not
//! build from a checked snapshot id.

use std::path::PathBuf;
use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;

use super::error::{blocking, UiError, UiResult};
use super::pages::{page, when, Chrome};
use super::session::Viewer;
use crate::app::App;
use crate::shadow::diff::{self, DiffReport, FileChangeKind};
use crate::shadow::manifest::{self, Manifest};
use crate::shadow::{snapshot, ShadowError};

const WHAT: &str = "rehearsals";

impl From<ShadowError> for UiError {
    fn from(e: ShadowError) -> Self {
        match e {
            ShadowError::Refused(m) | ShadowError::Invalid(m) => UiError::BadRequest(m),
            e => UiError::Internal(e.to_string()),
        }
    }
}

/// The shadow root this host's operator uses: `shadow_root` when set, else
/// `$HOME/mercury-shadow`, as `mercury shadow` finds it.
pub(super) fn root(app: &App) -> UiResult<PathBuf> {
    let set = app.rt.settings.shadow_root.trim();
    let explicit = (!set.is_empty()).then(|| std::path::Path::new(set));
    let home = std::env::var("HOME").ok();
    Ok(crate::shadow::root_from(explicit, home.as_deref())?)
}

struct SnapshotRow {
    id: String,
    created: String,
    label: String,
    bytes: String,
    running: bool,
}

struct RunningRow {
    snapshot: String,
    url: String,
    pid: u32,
    started: String,
}

#[derive(Template)]
#[template(path = "ui/rehearsal.html")]
struct RehearsalPage {
    chrome: Chrome,
    root: String,
    this_is_shadow: bool,
    snapshots: Vec<SnapshotRow>,
    running: Option<RunningRow>,
}

fn size(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

/// `GET /ui/rehearsal`.
pub(super) async fn overview(State(app): State<Arc<App>>, viewer: Viewer) -> UiResult<Response> {
    viewer.require_admin(WHAT)?;
    let root = root(&app)?;
    let at = root.clone();
    let (manifests, running) = blocking::<_, UiError>(move || {
        let mut out = Vec::new();
        for id in snapshot::list(&at)? {
            // A snapshot whose manifest cannot be read is listed by its id.
            out.push((id.clone(), Manifest::read(&at.join(&id)).ok()));
        }
        Ok((out, manifest::running(&at)?))
    })
    .await?;
    let running_id = running.as_ref().map(|r| r.snapshot.clone());
    page(&RehearsalPage {
        chrome: Chrome::of(&viewer),
        root: root.display().to_string(),
        this_is_shadow: app.rt.outbound.is_shadow(),
        snapshots: manifests
            .into_iter()
            .rev()
            .map(|(id, m)| SnapshotRow {
                running: running_id.as_deref() == Some(id.as_str()),
                created: m
                    .as_ref()
                    .map(|m| when(m.created_at_ms))
                    .unwrap_or_default(),
                label: m.as_ref().and_then(|m| m.label.clone()).unwrap_or_default(),
                bytes: m
                    .as_ref()
                    .map(|m| size(m.db_bytes + m.files_bytes))
                    .unwrap_or_default(),
                id,
            })
            .collect(),
        running: running.map(|r| RunningRow {
            snapshot: r.snapshot,
            url: r.url,
            pid: r.pid,
            started: when(r.started_at_ms),
        }),
    })
}

struct RowLine {
    table: String,
    space: String,
    key: String,
    before: String,
    before_by: String,
    after: String,
    after_by: String,
}

struct FileBlock {
    name: String,
    class: String,
    change: &'static str,
    /// (css class, line): `hunk`, `del`, `add` or `note`.
    lines: Vec<(&'static str, String)>,
}

struct HeldLine {
    space: String,
    to: String,
    source: String,
    text: String,
}

#[derive(Template)]
#[template(path = "ui/rehearsal_diff.html")]
struct DiffPage {
    chrome: Chrome,
    id: String,
    space: String,
    rows: Vec<RowLine>,
    files: Vec<FileBlock>,
    added: Vec<(String, u64)>,
    page_lines: Vec<String>,
    page: usize,
    pages: usize,
    total: usize,
    runs: String,
    sends: Vec<HeldLine>,
    refusals: Vec<HeldLine>,
}

#[derive(Deserialize)]
pub(super) struct DiffQuery {
    #[serde(default)]
    space: String,
    page: Option<usize>,
}

fn held(entries: Vec<crate::workspace::transcript::TranscriptEntry>) -> Vec<HeldLine> {
    entries
        .into_iter()
        .map(|e| HeldLine {
            space: e.space.unwrap_or_default(),
            to: match (e.platform, e.external_id) {
                (Some(p), Some(x)) => format!("{p} {x}"),
                (Some(p), None) => p,
                _ => String::new(),
            },
            source: e.source,
            text: e.text,
        })
        .collect()
}

fn lines_of(diff: Vec<String>) -> Vec<(&'static str, String)> {
    diff.into_iter()
        .map(|l| {
            let class = if l.starts_with("@@") {
                "hunk"
            } else if l.starts_with("- ") || l == "-" {
                "del"
            } else if l.starts_with("+ ") || l == "+" {
                "add"
            } else {
                "note"
            };
            (class, l)
        })
        .collect()
}

fn render(chrome: Chrome, r: DiffReport, space: String) -> DiffPage {
    let (page_lines, page, pages, total) = match r.message_page {
        Some(p) => (p.lines, p.page, p.pages, p.total),
        None => (Vec::new(), 0, 0, 0),
    };
    DiffPage {
        chrome,
        runs: format!(
            "{} run(s), {} tokens in, {} out, cost {}",
            r.runs.runs,
            r.runs.tokens_in,
            r.runs.tokens_out,
            r.runs.cost_text()
        ),
        id: r.snapshot,
        space,
        rows: r
            .rows
            .into_iter()
            .map(|c| RowLine {
                before: c
                    .before
                    .as_ref()
                    .map(|v| v.value.clone())
                    .unwrap_or_else(|| "(none)".into()),
                before_by: c.before.map(|v| v.updated_by).unwrap_or_default(),
                after: c
                    .after
                    .as_ref()
                    .map(|v| v.value.clone())
                    .unwrap_or_else(|| "(none)".into()),
                after_by: c.after.map(|v| v.updated_by).unwrap_or_default(),
                table: c.table,
                space: c.space,
                key: c.key,
            })
            .collect(),
        files: r
            .files
            .into_iter()
            .map(|f| FileBlock {
                name: format!("{}/{}", f.space, f.path),
                class: f.class,
                change: match f.change {
                    FileChangeKind::Added => "added",
                    FileChangeKind::Removed => "removed",
                    FileChangeKind::Changed => "changed",
                },
                lines: lines_of(f.diff),
            })
            .collect(),
        added: r.messages.into_iter().map(|m| (m.space, m.count)).collect(),
        page_lines,
        page,
        pages,
        total,
        sends: held(r.sends),
        refusals: held(r.refusals),
    }
}

/// `GET /ui/rehearsal/{id}?space=&page=`: the redacted diff.
pub(super) async fn diff_page(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(q): Query<DiffQuery>,
) -> UiResult<Response> {
    viewer.require_admin(WHAT)?;
    let space = q.space.trim().to_owned();
    if !space.is_empty() {
        crate::ids::SpaceId::parse(&space).map_err(|e| UiError::BadRequest(e.to_string()))?;
    }
    let root = root(&app)?;
    let only = space.clone();
    let page_no = q.page.unwrap_or(1);
    let report = blocking::<_, UiError>(move || {
        // `resolve` refuses an id with a separator or a leading dot, and one
        // that is not a snapshot under the root.
        let dir = snapshot::resolve(&root, &id).map_err(|e| match e {
            ShadowError::Refused(m) => UiError::NotFound(m),
            e => e.into(),
        })?;
        let only = (!only.is_empty()).then_some(only.as_str());
        Ok(diff::diff_redacted(&dir, only, Some(page_no))?)
    })
    .await?;
    page(&render(Chrome::of(&viewer), report, space))
}
