//! The outbox: replies waiting to be delivered to a platform, pulled by an
//! adapter (`GET /api/outbox?after=`) or pushed by the webhook adapter.
//! Rows are kept after delivery (with `delivered_at`), so nothing is lost.

use rusqlite::{params, Connection};
use serde::Serialize;

use super::{Cached, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct OutboxItem {
    pub id: i64,
    pub space_id: String,
    pub conversation_id: Option<i64>,
    pub platform: String,
    pub external_id: String,
    pub message_id: Option<i64>,
    pub text: String,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
    pub attempts: i64,
}

/// After the column list; shared with the query-plan test (`storage::migrations`).
pub(crate) const UNDELIVERED_TAIL: &str =
    "FROM outbox WHERE delivered_at IS NULL AND attempts < ?1 ORDER BY id LIMIT ?2";

const COLS: &str = "id, space_id, conversation_id, platform, external_id, message_id, text, created_at, delivered_at, attempts";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OutboxItem> {
    Ok(OutboxItem {
        id: r.get(0)?,
        space_id: r.get(1)?,
        conversation_id: r.get(2)?,
        platform: r.get(3)?,
        external_id: r.get(4)?,
        message_id: r.get(5)?,
        text: r.get(6)?,
        created_at: r.get(7)?,
        delivered_at: r.get(8)?,
        attempts: r.get(9)?,
    })
}

pub fn enqueue(
    conn: &Connection,
    space: &str,
    conversation_id: Option<i64>,
    platform: &str,
    external_id: &str,
    message_id: Option<i64>,
    text: &str,
) -> StoreResult<i64> {
    conn.execute_cached(
        "INSERT INTO outbox (space_id, conversation_id, platform, external_id, message_id, text, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![space, conversation_id, platform, external_id, message_id, text, now_ms()],
    )?;
    Ok(conn.last_insert_rowid())
}

/// Items after `after_id`; only `platform`'s when given (an adapter token
/// sees its own platform's replies, never another's).
pub fn after(
    conn: &Connection,
    after_id: i64,
    limit: u32,
    platform: Option<&str>,
) -> StoreResult<Vec<OutboxItem>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLS} FROM outbox WHERE id > ?1 AND (?3 IS NULL OR platform = ?3) ORDER BY id LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![after_id, limit, platform], from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn undelivered(
    conn: &Connection,
    max_attempts: u32,
    limit: u32,
) -> StoreResult<Vec<OutboxItem>> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {COLS} {UNDELIVERED_TAIL}"))?;
    let rows = stmt.query_map(params![max_attempts, limit], from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn mark_delivered(conn: &Connection, id: i64) -> StoreResult<()> {
    conn.execute_cached(
        "UPDATE outbox SET delivered_at = ?2, attempts = attempts + 1 WHERE id = ?1",
        params![id, now_ms()],
    )?;
    Ok(())
}

pub fn mark_failed(conn: &Connection, id: i64, error: &str) -> StoreResult<()> {
    conn.execute_cached(
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1",
        params![id, error],
    )?;
    Ok(())
}
