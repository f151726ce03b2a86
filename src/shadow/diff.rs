//! `mercury shadow diff`: the snapshot as taken vs the shadow now — the
//! report a rehearsal is judged on. [`diff`] is the library call (its
//! [`DiffReport`] serialises to the JSON form later commands reuse);
//! [`render`] is the terminal report.
//!
//! The baseline is what the snapshot wrote aside before the shadow first
//! ran: `shadow/baseline.db` (the copied database) and
//! `shadow/baseline-files.json` (every workspace file by hash).
//!
//! Must never: open a workspace path but through the safe-path walk, show a
//! message line the review redactor has not passed, or write to either side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::Manifest;
use super::{io_err, sql_err, ShadowError, ShadowResult};
use crate::config::{self, ReviewConfig};
use crate::redaction::{RedactionList, Redactor};
use crate::storage::open_read_only;
use crate::storage::spaces::list_members;
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
                let h = Sha256::digest(format!("symlink:{}", target.to_string_lossy()).as_bytes());
                out.insert(rel, base16ct::lower::encode_string(&h));
            }
            EntryKind::Other => {}
        }
    }
    Ok(())
}

fn class_of(path: &str) -> &'static str {
    match path {
        "AGENTS.md" => "agents",
        "MEMORY.md" => "memory",
        p if p.starts_with("knowledge/") => "knowledge",
        _ => "other",
    }
}

/// The row tables the diff compares: (table, SQL giving space, key, value, by).
const ROW_TABLES: &[(&str, &str)] = &[
    (
        "space_config",
        "SELECT space_id, key, value, updated_by FROM space_config",
    ),
    (
        "space_preferences",
        "SELECT space_id, key, value, updated_by FROM space_preferences",
    ),
    (
        "tasks",
        "SELECT space_id, CAST(id AS TEXT), COALESCE(cron, 'at ' || at) || ' ' || CASE active WHEN 1 THEN 'active' ELSE 'paused' END || (CASE silent WHEN 1 THEN ' silent' ELSE '' END) || ': ' || prompt, created_by FROM tasks",
    ),
    (
        "space_roles",
        "SELECT space_id, caller_id, role, COALESCE(granted_by, '') FROM space_roles",
    ),
    (
        "mutes",
        "SELECT space_id, caller_id, COALESCE(CAST(until AS TEXT), 'forever') || COALESCE(' (' || reason || ')', ''), updated_by FROM mutes",
    ),
];

type Rows = BTreeMap<(String, String), RowValue>;

fn rows(db: &rusqlite::Connection, sql: &str) -> ShadowResult<Rows> {
    let mut stmt = db
        .prepare(sql)
        .map_err(sql_err("reading rows for the diff"))?;
    let it = stmt
        .query_map([], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                RowValue {
                    value: r.get(2)?,
                    updated_by: r.get(3)?,
                },
            ))
        })
        .map_err(sql_err("reading rows for the diff"))?;
    it.collect::<Result<_, _>>()
        .map_err(sql_err("reading rows for the diff"))
}

/// The shadow's runs, tokens and cost since its snapshot (what `down` prints,
/// without the rest of the diff).
pub fn runs_and_cost(
    now_db: &rusqlite::Connection,
    manifest: &Manifest,
    space: Option<&str>,
) -> ShadowResult<RunsAndCost> {
    let mut runs = RunsAndCost::default();
    let (sql_runs, sql_usage) = (
        "SELECT COUNT(*) FROM runs WHERE started_at > ?1 AND (?2 IS NULL OR space_id = ?2)",
        "SELECT COALESCE(SUM(tokens_in),0), COALESCE(SUM(tokens_out),0), COALESCE(SUM(cost),0.0) FROM token_usage WHERE id > ?1 AND (?2 IS NULL OR space_id = ?2)",
    );
    runs.runs = now_db
        .query_row(
            sql_runs,
            rusqlite::params![manifest.marks.run_started_at_ms, space],
            |r| r.get::<_, i64>(0),
        )
        .map_err(sql_err("counting the shadow's runs"))? as u64;
    let (i, o, c): (i64, i64, f64) = now_db
        .query_row(
            sql_usage,
            rusqlite::params![manifest.marks.token_usage_id, space],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(sql_err("summing the shadow's token usage"))?;
    runs.tokens_in = i as u64;
    runs.tokens_out = o as u64;
    runs.cost = c;
    Ok(runs)
}

/// [`runs_and_cost`] of the shadow data dir `dir`.
pub fn cost_of(dir: &Path) -> ShadowResult<RunsAndCost> {
    let manifest = Manifest::read(dir)?;
    runs_and_cost(&open_read_only(&dir.join("state.db"))?, &manifest, None)
}

/// The diff of the snapshot at `dir`, for one space or all.
pub fn diff(dir: &Path, space: Option<&str>) -> ShadowResult<DiffReport> {
    let manifest = Manifest::read(dir)?;
    let base_db = open_read_only(&dir.join(BASELINE_DB))?;
    let now_db = open_read_only(&dir.join("state.db"))?;
    let wanted = |s: &str| space.is_none_or(|w| w == s);

    let mut changes = Vec::new();
    for (table, sql) in ROW_TABLES {
        let before = rows(&base_db, sql)?;
        let after = rows(&now_db, sql)?;
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
    {
        let mut stmt = now_db
            .prepare(
                "SELECT space_id, role, text FROM messages WHERE id > ?1 AND (?2 IS NULL OR space_id = ?2) ORDER BY id",
            )
            .map_err(sql_err("reading the shadow's messages"))?;
        let it = stmt
            .query_map(rusqlite::params![mark, space], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(sql_err("reading the shadow's messages"))?;
        for row in it {
            let (s, role, text) = row.map_err(sql_err("reading the shadow's messages"))?;
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
    let mut messages = Vec::new();
    // The shadow's own file: the owner a review of it would redact.
    let review = config::load(&DataPaths::new(dir).config, &Default::default())?.review;
    for (s, (count, lines)) in per_space {
        let mut redactor = redactor_for(&now_db, &review, &s)?;
        messages.push(MessagesAdded {
            space: s,
            count,
            first_lines: lines
                .iter()
                .map(|l| redactor.redact_identifiers(l))
                .collect(),
        });
    }

    let runs = runs_and_cost(&now_db, &manifest, space)?;

    let base_files: TreeHashes = {
        let p = dir.join(BASELINE_FILES);
        let text =
            std::fs::read_to_string(&p).map_err(io_err(format!("reading {}", p.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| ShadowError::Invalid(format!("{}: {e}", p.display())))?
    };
    let now_files = tree_hashes(&dir.join("spaces"), space)?;
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
            files.push(FileChange {
                space: s.clone(),
                path: p.clone(),
                class: class_of(p).to_owned(),
                change,
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
    })
}

/// The review redactor over the space's members (names and sender ids),
/// the owner's id and names, by the review's rule
/// ([`RedactionList::of_review`]).
fn redactor_for(
    db: &rusqlite::Connection,
    review: &ReviewConfig,
    space: &str,
) -> ShadowResult<Redactor> {
    let members = list_members(db, space)?;
    let names = review.owner_names.iter().cloned().chain(
        members
            .iter()
            .filter_map(|m| m.display_name.clone())
            .filter(|n| !n.is_empty()),
    );
    let list = RedactionList::of_review(
        &review.owner,
        names,
        members.iter().map(|m| m.caller_id.clone()),
    );
    Redactor::new(list).map_err(|e| ShadowError::Invalid(format!("building the redactor: {e}")))
}

/// Writes the baseline the diff compares against (called by the snapshot).
pub fn write_baseline(dir: &Path) -> ShadowResult<PathBuf> {
    let shadow_dir = dir.join("shadow");
    crate::workspace::data_dir::private_dir(&shadow_dir)
        .map_err(io_err(format!("creating {}", shadow_dir.display())))?;
    let db = dir.join(BASELINE_DB);
    // The snapshot's database is a closed, compact file no host has opened
    // yet: a plain file copy is its exact state (and may be a reflink).
    let live_copy = dir.join("state.db");
    std::fs::copy(&live_copy, &db).map_err(io_err(format!("copying {}", live_copy.display())))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err(format!("setting the mode of {}", db.display())))?;
    }
    let hashes = tree_hashes(&dir.join("spaces"), None)?;
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
    let _ = writeln!(
        s,
        "\nruns: {}, tokens {} in / {} out, cost ${:.4}",
        r.runs.runs, r.runs.tokens_in, r.runs.tokens_out, r.runs.cost
    );
    let _ = writeln!(s, "\nworkspace files ({}):", r.files.len());
    if r.files.is_empty() {
        let _ = writeln!(s, "  (no change)");
    }
    for f in &r.files {
        let _ = writeln!(s, "  {:?} {}/{} [{}]", f.change, f.space, f.path, f.class);
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
