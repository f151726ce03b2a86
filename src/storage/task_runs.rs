//! What a task firing (`task_runs`) says about the reply it produced: the
//! turn's delivery asks whether the task that fired it is silent.
//!
//! Must never: write.

use super::{params, Conn, Query, StoreResult};

/// Whether the task behind the firing `task_run` is silent; `None` when
/// there is no such firing (or task).
pub fn task_is_silent(conn: &Conn, task_run: i64) -> StoreResult<Option<bool>> {
    conn.query_opt(
        "SELECT t.silent FROM tasks t JOIN task_runs r ON r.task_id = t.id WHERE r.id = ?1",
        params![task_run],
        |r| r.get(0),
    )
}
