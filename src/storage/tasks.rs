//! Scheduled tasks (cron or one-shot `at`) and their firings (`task_runs`).
//! Must never: store a task whose schedule does not parse, or a `next_run_at`
//! in the past for a new one-shot task (validated by the caller, checked here).

use super::{params, Conn, Optional, Query, Row, Tx};
use serde::Serialize;

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Task {
    pub id: i64,
    pub space_id: String,
    pub cron: Option<String>,
    pub at: Option<i64>,
    pub prompt: String,
    pub silent: bool,
    pub active: bool,
    pub next_run_at: Option<i64>,
    pub created_by: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// `active`, `paused`, or `done` (a one-shot task that fired: inactive,
    /// with no next run).
    pub state: &'static str,
}

const COLS: &str = "id, space_id, cron, at, prompt, silent, active, next_run_at, created_by, created_at, updated_at";

fn from_row(r: &Row<'_>) -> StoreResult<Task> {
    let (cron, active, next_run_at): (Option<String>, bool, Option<i64>) =
        (r.get(2)?, r.get(6)?, r.get(7)?);
    let state = match (active, &cron, next_run_at) {
        (true, _, _) => "active",
        (false, None, None) => "done",
        (false, _, _) => "paused",
    };
    Ok(Task {
        id: r.get(0)?,
        space_id: r.get(1)?,
        cron,
        at: r.get(3)?,
        prompt: r.get(4)?,
        silent: r.get(5)?,
        active,
        next_run_at,
        created_by: r.get(8)?,
        created_at: r.get(9)?,
        updated_at: r.get(10)?,
        state,
    })
}

pub struct NewTask<'a> {
    pub space_id: &'a str,
    pub cron: Option<&'a str>,
    pub at: Option<i64>,
    pub prompt: &'a str,
    pub silent: bool,
    pub next_run_at: i64,
    pub created_by: &'a str,
}

pub fn create(conn: &Conn, t: &NewTask<'_>) -> StoreResult<Task> {
    if t.cron.is_some() == t.at.is_some() {
        return Err(StoreError::Invalid(
            "a task needs exactly one of cron and at".into(),
        ));
    }
    let now = now_ms();
    let id: i64 = conn.query_row(
        "INSERT INTO tasks (space_id, cron, at, prompt, silent, active, next_run_at, created_by, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8, ?8) RETURNING id",
        params![t.space_id, t.cron, t.at, t.prompt, t.silent, t.next_run_at, t.created_by, now], |r| r.get(0))?;
    get(conn, t.space_id, id)?.ok_or_else(|| StoreError::NotFound("task just created".into()))
}

/// A task of this space (a task of another space is "not found").
pub fn get(conn: &Conn, space: &str, id: i64) -> StoreResult<Option<Task>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM tasks WHERE id = ?1 AND space_id = ?2"),
        params![id, space],
        from_row,
    )
    .optional()
}

pub fn list(conn: &Conn, space: &str) -> StoreResult<Vec<Task>> {
    conn.query_all(
        &format!("SELECT {COLS} FROM tasks WHERE space_id = ?1 ORDER BY id"),
        params![space],
        from_row,
    )
}

/// The tasks due at `now`. On PostgreSQL the rows are locked and rows
/// another host's scheduler has locked are skipped: many hosts tick, each
/// firing advances its task in the same transaction, so a due time fires
/// once per deployment.
pub fn due(conn: &Conn, now: i64) -> StoreResult<Vec<Task>> {
    let lock = match conn.dialect() {
        super::Dialect::Sqlite => "",
        super::Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
    };
    conn.query_all(&format!(
        "SELECT {COLS} FROM tasks WHERE active = 1 AND next_run_at IS NOT NULL AND next_run_at <= ?1 ORDER BY next_run_at, id{lock}"
    ), params![now], from_row)
}

/// The earliest `next_run_at` of any active task (the scheduler sleeps until then).
pub fn next_due_at(conn: &Conn) -> StoreResult<Option<i64>> {
    conn.query_row(
        "SELECT MIN(next_run_at) FROM tasks WHERE active = 1 AND next_run_at IS NOT NULL",
        params![],
        |r| r.get(0),
    )
}

pub fn set_active(
    conn: &Conn,
    space: &str,
    id: i64,
    active: bool,
    next_run_at: Option<i64>,
) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE tasks SET active = ?3, next_run_at = COALESCE(?4, next_run_at), updated_at = ?5 WHERE id = ?1 AND space_id = ?2",
        params![id, space, active, next_run_at, now_ms()],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("task {id}")));
    }
    Ok(())
}

/// Pauses or resumes task `id` of `space` by the one rule the API and the
/// dashboard share: a resumed cron task fires at its next time after `now`
/// on the space's clock (its `timezone` key, else `deployment_zone`), never
/// once for every time it missed, and a one-shot task whose time has passed
/// cannot be resumed. `Ok(Err(why))` is that refusal, with nothing written;
/// otherwise the task as it stands after the change, and the zone used.
pub fn switch(
    tx: &Tx<'_>,
    space: &str,
    id: i64,
    active: bool,
    now: i64,
    deployment_zone: &str,
) -> StoreResult<Result<(Task, chrono_tz::Tz), String>> {
    let tz = crate::schedule::zone(space_timezone(tx, space)?.as_deref(), deployment_zone);
    let task = get(tx, space, id)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
    let next = match (&task.cron, active) {
        (Some(c), true) => {
            match crate::schedule::parse_cron(c)
                .and_then(|c| crate::schedule::next_fire(&c, now, tz))
            {
                Ok(t) => Some(t),
                Err(e) => return Ok(Err(e)),
            }
        }
        _ => None,
    };
    if active && task.cron.is_none() && task.next_run_at.is_none_or(|t| t <= now) {
        return Ok(Err(format!(
            "task {id} was a one-shot task whose time has passed"
        )));
    }
    set_active(tx, space, id, active, next)?;
    let task = get(tx, space, id)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
    Ok(Ok((task, tz)))
}

/// Moves a fired task on: a cron task to its next fire time, a one-shot task to done (inactive, no next run).
pub fn advance(conn: &Conn, id: i64, next_run_at: Option<i64>) -> StoreResult<()> {
    conn.execute(
        // Typed where PostgreSQL cannot infer it (a bare `?2 IS NULL`).
        "UPDATE tasks SET next_run_at = ?2, active = CASE WHEN CAST(?2 AS BIGINT) IS NULL THEN 0 ELSE active END, updated_at = ?3 WHERE id = ?1",
        params![id, next_run_at, now_ms()],
    )?;
    Ok(())
}

/// The space's own `timezone` config key (its tasks' clock), if set.
pub fn space_timezone(conn: &Conn, space: &str) -> StoreResult<Option<String>> {
    super::spaces::kv_get(conn, super::spaces::KvTable::Config, space, "timezone")
        .map(|z| z.filter(|z| !z.trim().is_empty()))
}

pub fn delete(conn: &Conn, space: &str, id: i64) -> StoreResult<()> {
    let n = conn.execute(
        "DELETE FROM tasks WHERE id = ?1 AND space_id = ?2",
        params![id, space],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("task {id}")));
    }
    Ok(())
}

/// Records a firing; its run is attached when the turn starts ([`attach_run`]).
pub fn start_run(conn: &Conn, task: &Task) -> StoreResult<i64> {
    let id: i64 = conn.query_row(
        "INSERT INTO task_runs (task_id, space_id, run_id, status, started_at) VALUES (?1, ?2, NULL, 'queued', ?3) RETURNING id",
        params![task.id, task.space_id, now_ms()], |r| r.get(0))?;
    Ok(id)
}

/// Links a firing to the run serving it, in the transaction that starts the
/// run, so even a firing whose run is interrupted says which run that was.
pub fn attach_run(conn: &Conn, task_run_id: i64, run_id: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE task_runs SET run_id = ?2, status = 'running' WHERE id = ?1",
        params![task_run_id, run_id],
    )?;
    Ok(())
}

pub fn finish_run(
    conn: &Conn,
    task_run_id: i64,
    status: &str,
    error: Option<&str>,
) -> StoreResult<()> {
    conn.execute(
        "UPDATE task_runs SET status = ?2, error = ?3, finished_at = ?4 WHERE id = ?1",
        params![task_run_id, status, error, now_ms()],
    )?;
    Ok(())
}

/// Queues one firing of `task` (scheduled or run-now): a `task_runs` row and
/// a pending message from the task's creator. Returns the message id.
pub fn queue_firing(tx: &Tx<'_>, task: &Task) -> StoreResult<i64> {
    let task_run = start_run(tx, task)?;
    let id = super::messages::insert(
        tx,
        &super::messages::NewMessage {
            space_id: &task.space_id,
            sender_id: Some(&task.created_by),
            sender_name: Some("scheduled task"),
            role: "user",
            text: &task.prompt,
            created_at: crate::clock::now_ms(),
            status: Some("pending"),
            task_run_id: Some(task_run),
            ..Default::default()
        },
    )?
    .unwrap_or_default();
    Ok(id)
}
