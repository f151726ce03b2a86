//! Counts over the host's tables that no table module owns: the queue depth
//! `/metrics` reports, whether a scheduled run already happened, and the
//! figures the benches wait on.
//!
//! Must never: write, or answer from anything but one statement's snapshot.

use super::{params, Conn, Query, StoreResult};

/// Messages still waiting for their turn.
pub fn pending_messages(conn: &Conn) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE status = 'pending'",
        params![],
        |r| r.get(0),
    )
}

/// The `limit` spaces with the most pending messages, most first (ties by
/// space id).
pub fn pending_by_space(conn: &Conn, limit: i64) -> StoreResult<Vec<(String, i64)>> {
    conn.query_all(
        "SELECT space_id, COUNT(*) FROM messages WHERE status = 'pending' \
         GROUP BY space_id ORDER BY 2 DESC, 1 LIMIT ?1",
        params![limit],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Spaces on the host.
/// How long each message after `after_id` took to be answered (ms from
/// its arrival to its reply): what `mercury bench cluster` waits for.
pub fn reply_latencies_after(conn: &Conn, after_id: i64) -> StoreResult<Vec<i64>> {
    conn.query_all(
        "SELECT r.created_at - m.created_at FROM messages r JOIN messages m ON m.id = r.reply_to
         WHERE m.id > ?1 AND r.role = 'assistant'",
        params![after_id],
        |r| r.get(0),
    )
}

/// The largest message id so far (0 when there is none).
pub fn last_message_id(conn: &Conn) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COALESCE(MAX(id), 0) FROM messages",
        params![],
        |r| r.get(0),
    )
}

pub fn spaces(conn: &Conn) -> StoreResult<i64> {
    conn.query_row("SELECT COUNT(*) FROM spaces", params![], |r| r.get(0))
}

/// One failed run, for `mercury status`.
#[derive(Debug, Clone, serde::Serialize, PartialEq, utoipa::ToSchema)]
pub struct FailedRun {
    pub run_id: String,
    pub space_id: String,
    pub kind: String,
    pub started_at: i64,
    pub error: Option<String>,
}

/// The `limit` latest runs that failed since `since_ms`, newest first.
pub fn recent_failures(conn: &Conn, since_ms: i64, limit: i64) -> StoreResult<Vec<FailedRun>> {
    conn.query_all(
        "SELECT id, space_id, kind, started_at, error FROM runs
         WHERE status = 'failed' AND started_at >= ?1 ORDER BY started_at DESC, id LIMIT ?2",
        params![since_ms, limit],
        |r| {
            Ok(FailedRun {
                run_id: r.get(0)?,
                space_id: r.get(1)?,
                kind: r.get(2)?,
                started_at: r.get(3)?,
                error: r.get(4)?,
            })
        },
    )
}

/// Runs of `kind` started at or after `since_ms`.
pub fn runs_of_kind_since(conn: &Conn, kind: &str, since_ms: i64) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM runs WHERE kind = ?1 AND started_at >= ?2",
        params![kind, since_ms],
        |r| r.get(0),
    )
}

/// Runs in `status`, of any kind.
pub fn runs_with_status(conn: &Conn, status: &str) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM runs WHERE status = ?1",
        params![status],
        |r| r.get(0),
    )
}

/// Runs of `kind` in `status`.
pub fn runs_of_kind_with_status(conn: &Conn, kind: &str, status: &str) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM runs WHERE kind = ?1 AND status = ?2",
        params![kind, status],
        |r| r.get(0),
    )
}

/// Token usage rows of `kind` (one per model call).
pub fn usage_rows_of_kind(conn: &Conn, kind: &str) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM token_usage WHERE kind = ?1",
        params![kind],
        |r| r.get(0),
    )
}

/// Messages whose sender id is namespaced by `platform` (`telegram:…`).
pub fn messages_from_platform(conn: &Conn, platform: &str) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE sender_id LIKE ?1",
        params![format!("{platform}:%")],
        |r| r.get(0),
    )
}

/// Active tasks with no next firing computed yet (a due time that is not
/// known).
pub fn active_tasks_without_due_time(conn: &Conn) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM tasks WHERE active = 1 AND next_run_at IS NULL",
        params![],
        |r| r.get(0),
    )
}
