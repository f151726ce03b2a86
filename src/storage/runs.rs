//! Runs (one agent turn, task firing, ask or review each) and their token
//! usage. A run row is written when the run starts and closed when it ends,
//! so a crash leaves a `running` row that start-up marks `interrupted`.

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::StoreResult;
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Run {
    pub id: String,
    pub space_id: String,
    pub kind: String,
    pub status: String,
    pub caller_id: Option<String>,
    pub trigger_message_id: Option<i64>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub container_id: Option<String>,
    pub sandbox_proof: Option<String>,
    pub error: Option<String>,
}

const COLS: &str = "id, space_id, kind, status, caller_id, trigger_message_id, started_at, finished_at, container_id, sandbox_proof, error";

fn from_row(r: &Row<'_>) -> StoreResult<Run> {
    Ok(Run {
        id: r.get(0)?,
        space_id: r.get(1)?,
        kind: r.get(2)?,
        status: r.get(3)?,
        caller_id: r.get(4)?,
        trigger_message_id: r.get(5)?,
        started_at: r.get(6)?,
        finished_at: r.get(7)?,
        container_id: r.get(8)?,
        sandbox_proof: r.get(9)?,
        error: r.get(10)?,
    })
}

pub fn start(
    conn: &Conn,
    id: &str,
    space: &str,
    kind: &str,
    caller: Option<&str>,
    trigger: Option<i64>,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO runs (id, space_id, kind, status, caller_id, trigger_message_id, started_at) VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6)",
        params![id, space, kind, caller, trigger, now_ms()],
    )?;
    Ok(())
}

pub fn set_sandbox(conn: &Conn, id: &str, container_id: &str, proof: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE runs SET container_id = ?2, sandbox_proof = ?3 WHERE id = ?1",
        params![id, container_id, proof],
    )?;
    Ok(())
}

pub fn finish(conn: &Conn, id: &str, status: &str, error: Option<&str>) -> StoreResult<()> {
    conn.execute(
        "UPDATE runs SET status = ?2, error = ?3, finished_at = ?4 WHERE id = ?1",
        params![id, status, error, now_ms()],
    )?;
    Ok(())
}

pub fn get(conn: &Conn, id: &str) -> StoreResult<Option<Run>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM runs WHERE id = ?1"),
        params![id],
        from_row,
    )
    .optional()
}

pub fn list(conn: &Conn, space: &str, limit: u32) -> StoreResult<Vec<Run>> {
    conn.query_all(
        &format!(
        "SELECT {COLS} FROM runs WHERE space_id = ?1 ORDER BY started_at DESC, id DESC LIMIT ?2"
    ),
        params![space, limit],
        from_row,
    )
}

/// The latest run that message `message_id` of `space` started (a finding
/// of the review links its exchange to this run's trace).
pub fn latest_for_message(conn: &Conn, space: &str, message_id: i64) -> StoreResult<Option<Run>> {
    conn.query_row(
        &format!(
            "SELECT {COLS} FROM runs WHERE space_id = ?1 AND trigger_message_id = ?2 ORDER BY started_at DESC, id DESC LIMIT 1"
        ),
        params![space, message_id],
        from_row,
    )
    .optional()
}

/// The `error` of a run a host crash interrupted (left `running`, marked at
/// the next start), as opposed to a run whose actor was stopped.
pub const CRASHED: &str = "host stopped during the run";

/// Runs left `running` by a crash; marked `interrupted` at start-up.
pub fn interrupt_stale(conn: &Conn) -> StoreResult<usize> {
    conn.execute(
        "UPDATE runs SET status = 'interrupted', error = ?2, finished_at = ?1 WHERE status = 'running'",
        params![now_ms(), CRASHED],
    )
}

/// Run per turn: searches `runs_trigger_message`.
pub(crate) const CRASHED_ATTEMPTS_SQL: &str =
    "SELECT id FROM runs WHERE trigger_message_id = ?1 AND status = 'interrupted' AND error = ?2
     ORDER BY started_at";

/// The runs of a message that a host crash interrupted, oldest first: its
/// turn attempts that never reached an end.
pub fn crashed_attempts(conn: &Conn, message_id: i64) -> StoreResult<Vec<String>> {
    conn.query_all(CRASHED_ATTEMPTS_SQL, params![message_id, CRASHED], |r| {
        r.get(0)
    })
}

pub struct UsageRow<'a> {
    pub run_id: Option<&'a str>,
    pub space_id: &'a str,
    pub model: &'a str,
    pub kind: &'a str,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
}

pub fn record_usage(conn: &Conn, u: &UsageRow<'_>) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO token_usage (run_id, space_id, model, kind, tokens_in, tokens_out, cost, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![u.run_id, u.space_id, u.model, u.kind, u.tokens_in as i64, u.tokens_out as i64, u.cost, now_ms()],
    )?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, PartialEq, Default, utoipa::ToSchema)]
pub struct UsageTotals {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
}

pub fn usage_for_run(conn: &Conn, run_id: &str) -> StoreResult<UsageTotals> {
    conn.query_row(
        "SELECT COALESCE(SUM(tokens_in),0), COALESCE(SUM(tokens_out),0), COALESCE(SUM(cost),0.0) FROM token_usage WHERE run_id = ?1",
        params![run_id],
        |r| {
            Ok(UsageTotals {
                tokens_in: r.get::<_, i64>(0)? as u64,
                tokens_out: r.get::<_, i64>(1)? as u64,
                cost: r.get(2)?,
            })
        },)
}

/// One step of a run's trace (`run_steps`): a model call or a tool call.
#[derive(Debug, Clone, Serialize, PartialEq, Default, utoipa::ToSchema)]
pub struct RunStep {
    /// 1, 2, … in the order the turn took them.
    pub seq: u32,
    /// `model` or `tool`.
    pub kind: String,
    /// The model spec that answered (or was tried), or the tool's name.
    pub name: String,
    /// A tool call's arguments (compact JSON, capped).
    pub arguments: Option<String>,
    /// A tool call's exit code (file tools: 0 done, 1 refused).
    pub exit_code: Option<i64>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub duration_ms: u64,
    /// How long the tool's whole output was, in bytes.
    pub output_bytes: Option<u64>,
    /// The start of that output (`runs.step_output_bytes`).
    pub output: Option<String>,
    /// Why the step failed (a model that did not answer, a bad tool call).
    pub error: Option<String>,
    pub started_at: i64,
    /// The other spaces the step reached across space links (a tool call's
    /// `mrctl --space X …`), sorted; empty: only the run's own space.
    pub source_spaces: Vec<String>,
    /// Whose data the step carries, as served through a link (the run's
    /// space, or the spaces it reached); not stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_space: Option<String>,
    /// Served through a link: the arguments, output and error came from a
    /// space the reader has no link to and were left out. Not stored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub withheld: bool,
}

/// Records a run's steps (once, when the run is committed).
pub fn record_steps(conn: &Conn, run_id: &str, steps: &[RunStep]) -> StoreResult<()> {
    for s in steps {
        conn.execute(
            "INSERT INTO run_steps (run_id, seq, kind, name, arguments, exit_code, tokens_in, tokens_out, duration_ms, output_bytes, output, error, started_at, source_spaces)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            params![
                run_id,
                s.seq,
                s.kind,
                s.name,
                s.arguments,
                s.exit_code,
                s.tokens_in as i64,
                s.tokens_out as i64,
                s.duration_ms as i64,
                s.output_bytes.map(|b| b as i64),
                s.output,
                s.error,
                s.started_at,
                (!s.source_spaces.is_empty()).then(|| s.source_spaces.join(","))
            ],
        )?;
    }
    Ok(())
}

/// A run's steps, in order.
pub fn steps_for(conn: &Conn, run_id: &str) -> StoreResult<Vec<RunStep>> {
    conn.query_all("SELECT seq, kind, name, arguments, exit_code, tokens_in, tokens_out, duration_ms, output_bytes, output, error, started_at, source_spaces
         FROM run_steps WHERE run_id = ?1 ORDER BY seq", params![run_id], |r| {
        Ok(RunStep {
            seq: r.get(0)?,
            kind: r.get(1)?,
            name: r.get(2)?,
            arguments: r.get(3)?,
            exit_code: r.get(4)?,
            tokens_in: r.get::<_, i64>(5)? as u64,
            tokens_out: r.get::<_, i64>(6)? as u64,
            duration_ms: r.get::<_, i64>(7)? as u64,
            output_bytes: r.get::<_, Option<i64>>(8)?.map(|b| b as u64),
            output: r.get(9)?,
            error: r.get(10)?,
            started_at: r.get(11)?,
            source_spaces: r
                .get::<_, Option<String>>(12)?
                .map(|s| s.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            ..Default::default()
        })
    })
}

/// One tool step of a run a user message started, as the review's trace
/// summary reads it: the output only of a failed step.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowToolStep {
    pub run_id: String,
    pub seq: u32,
    pub name: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    /// Kept only when the step failed (an error, or a non-zero exit code).
    pub failed_output: Option<String>,
}

/// The tool steps of every run started by a user message of `space` in
/// `[since, until)` (the review reader's window), by run and step number:
/// one read per space instead of one per exchange.
pub fn tool_steps_in_window(
    conn: &Conn,
    space: &str,
    since: i64,
    until: i64,
) -> StoreResult<Vec<WindowToolStep>> {
    conn.query_all(
        "SELECT s.run_id, s.seq, s.name, s.exit_code, s.error,
                CASE WHEN s.error IS NOT NULL OR COALESCE(s.exit_code, 0) <> 0 THEN s.output END
         FROM run_steps s
         WHERE s.kind = 'tool' AND s.run_id IN (
             SELECT m.run_id FROM messages m
             WHERE m.space_id = ?1 AND m.role = 'user' AND m.run_id IS NOT NULL
               AND m.created_at >= ?2 AND m.created_at < ?3)
         ORDER BY s.run_id, s.seq",
        params![space, since, until],
        |r| {
            Ok(WindowToolStep {
                run_id: r.get(0)?,
                seq: r.get(1)?,
                name: r.get(2)?,
                exit_code: r.get(3)?,
                error: r.get(4)?,
                failed_output: r.get(5)?,
            })
        },
    )
}

/// Deletes the steps recorded before `before_ms` (`runs.keep_days`).
pub fn prune_steps(conn: &Conn, before_ms: i64) -> StoreResult<usize> {
    conn.execute(
        "DELETE FROM run_steps WHERE started_at < ?1",
        params![before_ms],
    )
}

/// Whether the identity mapping of the sender whose message started run
/// `id` holds (`messages.trusted_identity`); false for a run no message started.
pub fn trigger_identity_trusted(conn: &Conn, id: &str) -> StoreResult<bool> {
    Ok(conn
        .query_row(
            "SELECT m.trusted_identity FROM runs r JOIN messages m ON m.id = r.trigger_message_id WHERE r.id = ?1",
            params![id],
            |r| r.get(0),)
        .optional()?
        .unwrap_or(false))
}
