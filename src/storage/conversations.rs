//! Conversations: platform chats discovered from traffic, and which space each
//! feeds. Must never: link a conversation to a space that does not exist.

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Conversation {
    pub id: i64,
    pub platform: String,
    pub external_id: String,
    pub space_id: Option<String>,
    pub kind: String,
    pub title: Option<String>,
    pub first_seen_at: i64,
    pub last_seen_at: i64,
}

const COLS: &str = "id, platform, external_id, space_id, kind, title, first_seen_at, last_seen_at";

fn from_row(r: &Row<'_>) -> StoreResult<Conversation> {
    Ok(Conversation {
        id: r.get(0)?,
        platform: r.get(1)?,
        external_id: r.get(2)?,
        space_id: r.get(3)?,
        kind: r.get(4)?,
        title: r.get(5)?,
        first_seen_at: r.get(6)?,
        last_seen_at: r.get(7)?,
    })
}

pub fn find(conn: &Conn, platform: &str, external_id: &str) -> StoreResult<Option<Conversation>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM conversations WHERE platform = ?1 AND external_id = ?2"),
        params![platform, external_id],
        from_row,
    )
    .optional()
}

pub fn get(conn: &Conn, id: i64) -> StoreResult<Option<Conversation>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM conversations WHERE id = ?1"),
        params![id],
        from_row,
    )
    .optional()
}

/// Inserts or refreshes `last_seen_at` (and the title when one is given).
pub fn upsert(
    conn: &Conn,
    platform: &str,
    external_id: &str,
    kind: &str,
    title: Option<&str>,
) -> StoreResult<Conversation> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO conversations (platform, external_id, kind, title, first_seen_at, last_seen_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)
         ON CONFLICT (platform, external_id) DO UPDATE SET last_seen_at = excluded.last_seen_at,
           title = COALESCE(excluded.title, conversations.title)",
        params![platform, external_id, kind, title, now],
    )?;
    find(conn, platform, external_id)?
        .ok_or_else(|| StoreError::NotFound(format!("conversation {platform}:{external_id}")))
}

pub fn list(conn: &Conn, space: Option<&str>) -> StoreResult<Vec<Conversation>> {
    conn.query_all(&format!(
        "SELECT {COLS} FROM conversations WHERE (?1 IS NULL OR space_id = ?1) ORDER BY last_seen_at DESC, id"
    ), params![space], from_row)
}

pub fn set_space(conn: &Conn, id: i64, space: Option<&str>) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE conversations SET space_id = ?2 WHERE id = ?1",
        params![id, space],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("conversation {id}")));
    }
    Ok(())
}

/// The DM conversation of a caller: the most recently seen `dm` conversation
/// in which that caller has written. Platform senders are stored in their
/// platform's namespace (`whatsapp:316…@s.whatsapp.net`); a caller given
/// without the prefix matches the sender of that conversation's platform.
pub fn dm_of(conn: &Conn, caller: &str) -> StoreResult<Option<Conversation>> {
    conn
        .query_row(
            "SELECT c.id, c.platform, c.external_id, c.space_id, c.kind, c.title, c.first_seen_at, c.last_seen_at
             FROM conversations c
             WHERE c.kind = 'dm' AND EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id
               AND (m.sender_id = ?1 OR m.sender_id = c.platform || ':' || ?1))
             ORDER BY c.last_seen_at DESC LIMIT 1",
            params![caller],
            from_row,)
        .optional()
}
