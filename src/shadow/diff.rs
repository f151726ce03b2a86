//! `mercury shadow diff`: the snapshot as taken vs the shadow now — the
//! report a rehearsal is judged on. [`diff`] is the library call (its
//! [`DiffReport`] serialises to the JSON form later commands reuse);
//! [`render`] is the terminal report.
//!
//! The baseline is what the snapshot wrote aside before the shadow first
//! ran: `shadow/baseline.db` (the copied tables the diff compares, and the
//! spaces and members its redaction names) and
//! `shadow/baseline-files.json` (every workspace file by hash).
//!
//! Every string of the report a person could be named in (row keys, values
//! and authors, message lines, held sends, refusals, space ids, paths) goes
//! through the review's redactor and then its gate ([`redacted`]); a line
//! the gate still flags is withheld whole. [`raw_allowed`] decides who may
//! see the report as stored (`--raw`): a global admin of the shadow, by its
//! token.
//!
//! Must never: open a workspace path but through the safe-path walk, print a
//! line of the report the review redactor and gate have not passed unless
//! `--raw` was asked for by a global admin, or write to either side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::manifest::Manifest;
use super::tap::Baseline;
use super::{db_err, io_err, ShadowError, ShadowResult};
use crate::config::{self, ReviewConfig};
use crate::redaction::{kind_list, IdentifierGate, RedactionList, Redactor};
use crate::storage::spaces::list_members;
use crate::storage::tokens::{self, TokenKind};
use crate::storage::{open_read_only_conn, rehearsal, Conn};
use crate::workspace::safe::{EntryKind, WorkspaceRoot};
use crate::workspace::transcript::{Transcript, TranscriptEntry, TranscriptKind};
use crate::workspace::DataPaths;

pub const BASELINE_DB: &str = "shadow/baseline.db";
pub const BASELINE_FILES: &str = "shadow/baseline-files.json";

/// (space, path inside the workspace) → sha256 (a symlink: of its target text).
pub type TreeHashes = BTreeMap<String, BTreeMap<String, String>>;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RowValue {
    pub value: String,
    pub updated_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RowChange {
    pub table: String,
    pub space: String,
    pub key: String,
    pub before: Option<RowValue>,
    pub after: Option<RowValue>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MessagesAdded {
    pub space: String,
    pub count: u64,
    /// The first lines of the first few, redacted.
    pub first_lines: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunsAndCost {
    pub runs: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// The shadow's deployment currency (its `mercury.yaml`), which `cost`
    /// is in: printed in the one currency format (docs/spend.md).
    #[serde(default = "default_currency")]
    pub currency: String,
}

fn default_currency() -> String {
    crate::config::Settings::default().currency
}

impl RunsAndCost {
    /// `cost` in the one currency format.
    pub fn cost_text(&self) -> String {
        crate::spend::format_amount(self.cost, &self.currency)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FileChangeKind {
    Added,
    Removed,
    Changed,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileChange {
    pub space: String,
    pub path: String,
    /// `agents`, `memory`, `knowledge` or `other`.
    pub class: String,
    pub change: FileChangeKind,
    /// For `AGENTS.md`, `MEMORY.md` and `knowledge/`: the changed lines
    /// (`shadow::text_diff::line_diff`), or one line saying why there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diff: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiffReport {
    pub snapshot: String,
    pub space: Option<String>,
    pub rows: Vec<RowChange>,
    pub messages: Vec<MessagesAdded>,
    pub runs: RunsAndCost,
    pub files: Vec<FileChange>,
    pub sends: Vec<TranscriptEntry>,
    pub refusals: Vec<TranscriptEntry>,
    /// True when the report is as stored (`--raw`), false when every line
    /// went through the review's redactor and gate.
    #[serde(default)]
    pub raw: bool,
    /// One page of every added message, when asked for (`--messages-page N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_page: Option<MessagePage>,
}

/// Messages per page of `--messages-page`.
pub const MESSAGES_PER_PAGE: usize = 50;

/// One page of the messages the shadow added, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MessagePage {
    /// 1-based.
    pub page: usize,
    pub pages: usize,
    pub total: usize,
    /// `<space> <role>: <first line, at most 200 characters>`.
    pub lines: Vec<String>,
}

/// Every file of every workspace under `spaces_dir` (of the one named
/// `only`, when given), by hash, read through the safe-path walk (nothing
/// followed; FIFOs and devices skipped).
pub fn tree_hashes(spaces_dir: &Path, only: Option<&str>) -> ShadowResult<TreeHashes> {
    let root = WorkspaceRoot::open(spaces_dir)
        .map_err(|e| ShadowError::Invalid(format!("{}: {e}", spaces_dir.display())))?;
    let mut out = TreeHashes::new();
    for e in root
        .entries()
        .map_err(io_err(format!("listing {}", spaces_dir.display())))?
    {
        if e.kind != EntryKind::Dir || only.is_some_and(|o| e.name != *o) {
            continue;
        }
        let space = e.name.to_string_lossy().into_owned();
        let dir = root
            .child_dir(&e.name)
            .map_err(io_err(format!("opening spaces/{space}")))?;
        let mut files = BTreeMap::new();
        walk(&dir, "", &mut files)?;
        out.insert(space, files);
    }
    Ok(out)
}

/// A link's entry in [`tree_hashes`]: the hash of its target text, marked
/// so that no file's content can hash the same.
pub(super) fn link_hash(target: &std::ffi::OsStr) -> String {
    crate::workspace::files::hash_bytes(format!("symlink:{}", target.to_string_lossy()).as_bytes())
}

fn walk(dir: &WorkspaceRoot, prefix: &str, out: &mut BTreeMap<String, String>) -> ShadowResult<()> {
    for e in dir.entries().map_err(io_err(format!("listing {prefix}")))? {
        let name = e.name.to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        match e.kind {
            EntryKind::Dir => {
                let child = dir
                    .child_dir(&e.name)
                    .map_err(io_err(format!("opening {rel}")))?;
                walk(&child, &rel, out)?;
            }
            EntryKind::File => {
                let hash = crate::workspace::files::hash_file(dir, &name)
                    .map_err(|er| ShadowError::Invalid(format!("reading {rel}: {er}")))?;
                out.insert(rel, hash);
            }
            EntryKind::Symlink => {
                let target = dir
                    .readlink(&e.name)
                    .map_err(io_err(format!("reading the link {rel}")))?;
                out.insert(rel, link_hash(&target));
            }
            EntryKind::Other => {}
        }
    }
    Ok(())
}

/// One diffed file's changed lines, the snapshot's text against the
/// shadow's now (an added file against nothing, a removed one to nothing).
fn content_diff(
    dir: &Path,
    base: Option<&super::text_diff::Texts>,
    space: &str,
    path: &str,
    change: FileChangeKind,
) -> Vec<String> {
    use super::text_diff::{line_diff, read_text};
    let before = match change {
        FileChangeKind::Added => Some(String::new()),
        _ => match base {
            None => {
                return vec!["(no text kept: the snapshot was taken before content diffs)".into()]
            }
            Some(b) => b.get(space).and_then(|m| m.get(path)).cloned(),
        },
    };
    let after = match change {
        FileChangeKind::Removed => Some(String::new()),
        _ => read_text(&dir.join("spaces"), space, path),
    };
    match (before, after) {
        (Some(b), Some(a)) => line_diff(&b, &a),
        _ => vec!["(not diffed: larger than 256 KiB, or not UTF-8 text)".into()],
    }
}

fn class_of(path: &str) -> &'static str {
    match path {
        "AGENTS.md" => "agents",
        "MEMORY.md" => "memory",
        p if p.starts_with("knowledge/") => "knowledge",
        _ => "other",
    }
}

type Rows = BTreeMap<(String, String), RowValue>;

fn rows(db: &Conn, table: &str) -> ShadowResult<Rows> {
    Ok(rehearsal::diff_rows(db, table)
        .map_err(db_err("reading rows for the diff"))?
        .into_iter()
        .map(|(key, value, updated_by)| (key, RowValue { value, updated_by }))
        .collect())
}

/// The shadow's runs, tokens and cost since its snapshot (what `down` prints,
/// without the rest of the diff).
pub fn runs_and_cost(
    now_db: &Conn,
    manifest: &Manifest,
    space: Option<&str>,
    currency: &str,
) -> ShadowResult<RunsAndCost> {
    let runs = rehearsal::runs_started_after(now_db, manifest.marks.run_started_at_ms, space)
        .map_err(db_err("counting the shadow's runs"))?;
    let (i, o, c) = rehearsal::usage_after(now_db, manifest.marks.token_usage_id, space)
        .map_err(db_err("summing the shadow's token usage"))?;
    Ok(RunsAndCost {
        runs: runs as u64,
        tokens_in: i as u64,
        tokens_out: o as u64,
        cost: c,
        currency: currency.to_owned(),
    })
}

/// [`runs_and_cost`] of the shadow data dir `dir`.
pub fn cost_of(dir: &Path) -> ShadowResult<RunsAndCost> {
    let manifest = Manifest::read(dir)?;
    runs_and_cost(
        &open_read_only_conn(&dir.join("state.db"))?,
        &manifest,
        None,
        &crate::config::currency_of(&crate::workspace::DataPaths::new(dir).config)?,
    )
}

/// Every workspace file of the snapshot at `dir` by hash, as it was taken.
pub fn baseline_files(dir: &Path) -> ShadowResult<TreeHashes> {
    let p = dir.join(BASELINE_FILES);
    let text = std::fs::read_to_string(&p).map_err(io_err(format!("reading {}", p.display())))?;
    serde_json::from_str(&text).map_err(|e| ShadowError::Invalid(format!("{}: {e}", p.display())))
}

/// The diff of the snapshot at `dir`, for one space or all.
pub fn diff(dir: &Path, space: Option<&str>) -> ShadowResult<DiffReport> {
    diff_paged(dir, space, None)
}

/// [`diff`] with page `page` (1-based) of every added message.
pub fn diff_paged(
    dir: &Path,
    space: Option<&str>,
    page: Option<usize>,
) -> ShadowResult<DiffReport> {
    let manifest = Manifest::read(dir)?;
    let base_db = open_read_only_conn(&dir.join(BASELINE_DB))?;
    let now_db = open_read_only_conn(&dir.join("state.db"))?;
    let wanted = |s: &str| space.is_none_or(|w| w == s);

    let mut changes = Vec::new();
    for table in rehearsal::DIFF_TABLES {
        let before = rows(&base_db, table)?;
        let after = rows(&now_db, table)?;
        let mut keys: Vec<&(String, String)> = before.keys().chain(after.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let (b, a) = (before.get(k), after.get(k));
            if b != a && wanted(&k.0) {
                changes.push(RowChange {
                    table: (*table).to_owned(),
                    space: k.0.clone(),
                    key: k.1.clone(),
                    before: b.cloned(),
                    after: a.cloned(),
                });
            }
        }
    }

    let mark = manifest.marks.message_id;
    let mut per_space: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
    let mut message_page = None;
    {
        let added = rehearsal::messages_after(&now_db, mark, space)
            .map_err(db_err("reading the shadow's messages"))?;
        if let Some(page) = page {
            let total = added.len();
            let pages = total.div_ceil(MESSAGES_PER_PAGE).max(1);
            if page == 0 || page > pages {
                return Err(ShadowError::Refused(format!(
                    "--messages-page {page}: there are {pages} page(s) of {MESSAGES_PER_PAGE} ({total} messages added)"
                )));
            }
            let lines = added
                .iter()
                .skip((page - 1) * MESSAGES_PER_PAGE)
                .take(MESSAGES_PER_PAGE)
                .map(|(s, role, text)| {
                    let first: String = text
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .chars()
                        .take(200)
                        .collect();
                    format!("{s} {role}: {first}")
                })
                .collect();
            message_page = Some(MessagePage {
                page,
                pages,
                total,
                lines,
            });
        }
        for (s, role, text) in added {
            let e = per_space.entry(s).or_default();
            e.0 += 1;
            if e.1.len() < 5 {
                let first: String = text
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(100)
                    .collect();
                e.1.push(format!("{role}: {first}"));
            }
        }
    }
    let messages = per_space
        .into_iter()
        .map(|(space, (count, first_lines))| MessagesAdded {
            space,
            count,
            first_lines,
        })
        .collect();

    let runs = runs_and_cost(
        &now_db,
        &manifest,
        space,
        &crate::config::currency_of(&crate::workspace::DataPaths::new(dir).config)?,
    )?;

    let base_files = baseline_files(dir)?;
    let now_files = tree_hashes(&dir.join("spaces"), space)?;
    let base_text = super::text_diff::read_baseline_text(dir)?;
    let mut files = Vec::new();
    let empty = BTreeMap::new();
    let mut spaces: Vec<&String> = base_files.keys().chain(now_files.keys()).collect();
    spaces.sort();
    spaces.dedup();
    for s in spaces.into_iter().filter(|s| wanted(s)) {
        let (b, a) = (
            base_files.get(s).unwrap_or(&empty),
            now_files.get(s).unwrap_or(&empty),
        );
        let mut paths: Vec<&String> = b.keys().chain(a.keys()).collect();
        paths.sort();
        paths.dedup();
        for p in paths {
            let change = match (b.get(p), a.get(p)) {
                (None, Some(_)) => FileChangeKind::Added,
                (Some(_), None) => FileChangeKind::Removed,
                (Some(x), Some(y)) if x != y => FileChangeKind::Changed,
                _ => continue,
            };
            let diff = if super::text_diff::is_diffed(p) {
                content_diff(dir, base_text.as_ref(), s, p, change)
            } else {
                Vec::new()
            };
            files.push(FileChange {
                space: s.clone(),
                path: p.clone(),
                class: class_of(p).to_owned(),
                change,
                diff,
            });
        }
    }

    let transcript = Transcript::of(dir)
        .read_all()
        .map_err(io_err("reading the shadow transcript"))?;
    let (mut sends, mut refusals) = (Vec::new(), Vec::new());
    for e in transcript {
        if let Some(s) = &e.space {
            if !wanted(s) {
                continue;
            }
        }
        match e.kind {
            TranscriptKind::Send => sends.push(e),
            TranscriptKind::Refusal => refusals.push(e),
        }
    }
    Ok(DiffReport {
        snapshot: manifest.id,
        space: space.map(str::to_owned),
        rows: changes,
        messages,
        runs,
        files,
        sends,
        refusals,
        raw: true,
        message_page,
    })
}

/// The diff of the snapshot at `dir` with every line through the review's
/// redactor and gate: what `mercury shadow diff` prints.
pub fn diff_redacted(
    dir: &Path,
    space: Option<&str>,
    page: Option<usize>,
) -> ShadowResult<DiffReport> {
    let report = diff_paged(dir, space, page)?;
    let list = redaction_list(dir, &report)?;
    redacted(report, &list)
}

/// The review's list for the whole diff, by the review's rule
/// ([`RedactionList::of_review`]): the shadow's `review.owner_names` and
/// owner, and every member of every space on either side (display names and
/// caller ids), plus each caller id a changed row names (a role, a mute, an
/// author), so one numbering covers the report. Only namespaced caller
/// ids are taken: `owner`, the console's, names no one.
fn redaction_list(dir: &Path, report: &DiffReport) -> ShadowResult<RedactionList> {
    // The shadow's own file: the owner a review of it would redact.
    let review: ReviewConfig =
        config::load(&DataPaths::new(dir).config, &Default::default())?.review;
    let mut names: Vec<String> = review.owner_names.clone();
    let mut ids: Vec<String> = Vec::new();
    for db in [dir.join(BASELINE_DB), dir.join("state.db")] {
        let conn = open_read_only_conn(&db)?;
        let spaces = rehearsal::space_ids(&conn)
            .map_err(db_err("listing the spaces for the diff's redaction"))?;
        for s in spaces {
            for m in list_members(&crate::storage::open_read_only_conn(&db)?, &s)? {
                names.extend(m.display_name.filter(|n| !n.is_empty()));
                ids.push(m.caller_id);
            }
        }
    }
    for c in &report.rows {
        if matches!(c.table.as_str(), "space_roles" | "mutes") {
            ids.push(c.key.clone());
        }
        for v in [&c.before, &c.after].into_iter().flatten() {
            ids.push(v.updated_by.clone());
        }
    }
    names.sort();
    names.dedup();
    // A person's caller id is namespaced (`whatsapp:…`, `telegram:…`,
    // `api:…`); a bare one is the host's own console caller (`owner`), a
    // role word rather than anyone's identifier.
    ids.retain(|id| id.contains([':', '@']));
    Ok(RedactionList::of_review(&review.owner, names, ids))
}

/// One line through the redactor, then the gate: a line still flagged is
/// withheld whole (its kinds named, never its value).
struct LineFilter {
    redactor: Redactor,
    gate: IdentifierGate,
}

impl LineFilter {
    fn line(&mut self, text: &str) -> String {
        let out = self.redactor.redact_identifiers(text);
        match self.gate.check(&out) {
            Ok(()) => out,
            Err(e) => format!("[withheld by the identifier gate: {}]", kind_list(&e.kinds)),
        }
    }

    fn opt(&mut self, text: &Option<String>) -> Option<String> {
        text.as_deref().map(|t| self.line(t))
    }
}

/// `report` with every string through the review's redactor and gate.
pub fn redacted(report: DiffReport, list: &RedactionList) -> ShadowResult<DiffReport> {
    let redactor = Redactor::new(list.clone())
        .map_err(|e| ShadowError::Invalid(format!("building the redactor: {e}")))?;
    let gate = redactor.identifier_gate();
    let mut f = LineFilter { redactor, gate };
    let rows = report
        .rows
        .into_iter()
        .map(|c| {
            let mut side = |v: Option<RowValue>| {
                v.map(|v| RowValue {
                    value: f.line(&v.value),
                    updated_by: f.line(&v.updated_by),
                })
            };
            let (before, after) = (side(c.before), side(c.after));
            RowChange {
                table: c.table,
                space: f.line(&c.space),
                key: f.line(&c.key),
                before,
                after,
            }
        })
        .collect();
    let messages = report
        .messages
        .into_iter()
        .map(|m| MessagesAdded {
            space: f.line(&m.space),
            count: m.count,
            first_lines: m.first_lines.iter().map(|l| f.line(l)).collect(),
        })
        .collect();
    let files = report
        .files
        .into_iter()
        .map(|x| FileChange {
            space: f.line(&x.space),
            path: f.line(&x.path),
            diff: x.diff.iter().map(|l| f.line(l)).collect(),
            ..x
        })
        .collect();
    let mut entry = |e: TranscriptEntry| TranscriptEntry {
        space: f.opt(&e.space),
        platform: f.opt(&e.platform),
        external_id: f.opt(&e.external_id),
        text: f.line(&e.text),
        source: f.line(&e.source),
        ..e
    };
    let sends = report.sends.into_iter().map(&mut entry).collect();
    let refusals = report.refusals.into_iter().map(&mut entry).collect();
    Ok(DiffReport {
        snapshot: report.snapshot,
        space: report.space.as_deref().map(|s| f.line(s)),
        rows,
        messages,
        runs: report.runs,
        files,
        sends,
        refusals,
        raw: false,
        message_page: report.message_page.map(|p| MessagePage {
            lines: p.lines.iter().map(|l| f.line(l)).collect(),
            ..p
        }),
    })
}

/// May the holder of `token` read the diff of `dir` as stored? Only a
/// global admin of the shadow (its owner, or a caller in its `admins`), by a
/// user token of the shadow's own database with no scope: the rule the API
/// applies to its global-admin routes. A refusal is one sentence.
pub fn raw_allowed(dir: &Path, token: Option<&str>) -> ShadowResult<()> {
    let refused = |why: &str| {
        Err(ShadowError::Refused(format!(
            "--raw prints held sends and changed rows unredacted, so it needs a global admin's token of this shadow in MERCURY_TOKEN: {why}"
        )))
    };
    let Some(token) = token.map(str::trim).filter(|t| !t.is_empty()) else {
        return refused("none was given");
    };
    let settings = config::load(&DataPaths::new(dir).config, &Default::default())?;
    let conn = crate::storage::open_read_only_conn(&dir.join("state.db"))?;
    let Some(grant) = tokens::resolve(&conn, token, crate::clock::now_ms())? else {
        return refused("the shadow knows no such token (a live token is never one of its own)");
    };
    if grant.kind != TokenKind::User
        || grant.scope.is_some()
        || !settings.is_global_admin(&grant.caller_id)
    {
        return refused("the token is not a global admin's");
    }
    Ok(())
}

/// Takes the baseline of the snapshot at `dir` again, after the caller
/// changed the copy on purpose before its shadow first runs (a rehearsal's
/// cut history and applied draft), so the diff shows only what the shadow
/// did. No copy runs here, so the workspaces are read once more for their
/// hashes and kept texts.
pub fn rebase(dir: &Path) -> ShadowResult<PathBuf> {
    for f in [BASELINE_DB, BASELINE_FILES, super::text_diff::BASELINE_TEXT] {
        let p = dir.join(f);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("removing {}", p.display()))(e)),
        }
    }
    let spaces = dir.join("spaces");
    let hashes = tree_hashes(&spaces, None)?;
    let mut texts = super::text_diff::TextKeeper::default();
    for (space, paths) in &hashes {
        for path in paths.keys().filter(|p| super::text_diff::is_diffed(p)) {
            if let Some(text) = super::text_diff::read_text(&spaces, space, path) {
                texts.offer(space, path, text.into_bytes());
            }
        }
    }
    write_baseline(dir, Baseline { hashes, texts })
}

/// Writes the baseline the diff compares against (called by the snapshot),
/// with the hashes and texts its copy of the workspaces gathered.
pub fn write_baseline(dir: &Path, baseline: Baseline) -> ShadowResult<PathBuf> {
    let shadow_dir = dir.join("shadow");
    crate::workspace::data_dir::private_dir(&shadow_dir)
        .map_err(io_err(format!("creating {}", shadow_dir.display())))?;
    let db = dir.join(BASELINE_DB);
    // The snapshot's database is a closed file no host has opened yet: the
    // tables the diff compares are taken from it as they are, into a file
    // created private (it names members).
    crate::workspace::data_dir::private_file(&db)
        .map_err(io_err(format!("creating {}", db.display())))?;
    let live_copy = dir.join("state.db");
    rehearsal::write_diff_baseline(&live_copy, &db).map_err(db_err("writing the diff baseline"))?;
    let Baseline { hashes, texts } = baseline;
    super::text_diff::write_baseline_text(dir, texts)?;
    let json = serde_json::to_string(&hashes).map_err(|e| ShadowError::Invalid(e.to_string()))?;
    let p = dir.join(BASELINE_FILES);
    crate::workspace::data_dir::private_file(&p)
        .and_then(|mut f| std::io::Write::write_all(&mut f, json.as_bytes()))
        .map_err(io_err(format!("writing {}", p.display())))?;
    Ok(db)
}

/// The terminal report.
pub fn render(r: &DiffReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let scope = r
        .space
        .as_deref()
        .map(|x| format!(" (space {x})"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "shadow diff: snapshot {} vs the shadow now{scope}",
        r.snapshot
    );
    if r.raw {
        let _ = writeln!(
            s,
            "raw: every line below is as stored, not redacted (--raw, global admin)"
        );
    } else {
        let _ = writeln!(
            s,
            "every line below passed the review's redactor and identifier gate"
        );
    }
    let _ = writeln!(s, "\nrows ({}):", r.rows.len());
    if r.rows.is_empty() {
        let _ = writeln!(s, "  (no change)");
    }
    for c in &r.rows {
        let side = |v: &Option<RowValue>| match v {
            Some(v) => format!("{:?} by {}", v.value, v.updated_by),
            None => "(none)".to_owned(),
        };
        let _ = writeln!(
            s,
            "  {} {} {}: {} -> {}",
            c.space,
            c.table,
            c.key,
            side(&c.before),
            side(&c.after)
        );
    }
    let total: u64 = r.messages.iter().map(|m| m.count).sum();
    let _ = writeln!(s, "\nmessages added ({total}):");
    for m in &r.messages {
        let _ = writeln!(s, "  {}: {}", m.space, m.count);
        for l in &m.first_lines {
            let _ = writeln!(s, "    {l}");
        }
    }
    if let Some(p) = &r.message_page {
        let _ = writeln!(
            s,
            "\nmessages added, page {} of {} ({} in all):",
            p.page, p.pages, p.total
        );
        for l in &p.lines {
            let _ = writeln!(s, "  {l}");
        }
        if p.page < p.pages {
            let _ = writeln!(s, "  (next: --messages-page {})", p.page + 1);
        }
    }
    let _ = writeln!(
        s,
        "\nruns: {}, tokens {} in / {} out, cost {}",
        r.runs.runs,
        r.runs.tokens_in,
        r.runs.tokens_out,
        r.runs.cost_text()
    );
    let _ = writeln!(s, "\nworkspace files ({}):", r.files.len());
    if r.files.is_empty() {
        let _ = writeln!(s, "  (no change)");
    }
    for f in &r.files {
        let _ = writeln!(s, "  {:?} {}/{} [{}]", f.change, f.space, f.path, f.class);
        for l in &f.diff {
            let _ = writeln!(s, "      {l}");
        }
    }
    let _ = writeln!(s, "\nsends held in the transcript ({}):", r.sends.len());
    for e in &r.sends {
        let first: String = e
            .text
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(100)
            .collect();
        let _ = writeln!(
            s,
            "  [{}] {} -> {}:{}: {first}",
            e.source,
            e.space.as_deref().unwrap_or("-"),
            e.platform.as_deref().unwrap_or("-"),
            e.conversation
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
        );
    }
    let _ = writeln!(s, "\nrefused outside actions ({}):", r.refusals.len());
    for e in &r.refusals {
        let _ = writeln!(s, "  [{}] {}", e.source, e.text);
    }
    s
}
