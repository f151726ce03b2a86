//! Messages: the history of each space, and the durable queue of user
//! messages waiting for a turn (`status = 'pending'`).
//!
//! Must never: store the same platform message twice (a unique index on
//! conversation + platform message id), or mark a user message answered
//! without the reply row in the same transaction.

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::{StoreError, StoreResult};

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Message {
    pub id: i64,
    pub space_id: String,
    pub conversation_id: Option<i64>,
    pub sender_id: Option<String>,
    pub sender_name: Option<String>,
    pub role: String,
    pub text: String,
    pub platform_message_id: Option<String>,
    pub created_at: i64,
    pub run_id: Option<String>,
    pub status: Option<String>,
    pub reply_to: Option<i64>,
    pub task_run_id: Option<i64>,
}

/// The parts of the hot queries after the column list, shared with the
/// query-plan test (`storage::migrations`), which checks each one searches
/// an index instead of scanning or sorting the whole table.
pub(crate) const REPLY_FOR_TAIL: &str =
    "FROM messages WHERE reply_to = ?1 AND role = 'assistant' ORDER BY id LIMIT 1";
// Named explicitly: with `messages_space_id` beside it the planner, having no
// statistics, would pick that one and filter every message of the space.
pub(crate) const PENDING_TAIL: &str =
    "FROM messages INDEXED BY messages_pending WHERE space_id = ?1 AND status = 'pending' ORDER BY id";
// A failed turn's reply row has status 'failed': the canned sentence the
// participant read is not something the model said, so its history leaves it out.
pub(crate) const HISTORY_TAIL: &str = "FROM messages WHERE space_id = ?1 AND id > ?2 AND id < ?3
           AND role IN ('user','assistant','ambient')
           AND (role <> 'assistant' OR status IS NULL OR status <> 'failed')
         ORDER BY id DESC LIMIT ?4";

const COLS: &str = "id, space_id, conversation_id, sender_id, sender_name, role, text, platform_message_id, created_at, run_id, status, reply_to, task_run_id";

fn from_row(r: &Row<'_>) -> StoreResult<Message> {
    Ok(Message {
        id: r.get(0)?,
        space_id: r.get(1)?,
        conversation_id: r.get(2)?,
        sender_id: r.get(3)?,
        sender_name: r.get(4)?,
        role: r.get(5)?,
        text: r.get(6)?,
        platform_message_id: r.get(7)?,
        created_at: r.get(8)?,
        run_id: r.get(9)?,
        status: r.get(10)?,
        reply_to: r.get(11)?,
        task_run_id: r.get(12)?,
    })
}

#[derive(Debug, Clone, Default)]
pub struct NewMessage<'a> {
    pub space_id: &'a str,
    pub conversation_id: Option<i64>,
    pub sender_id: Option<&'a str>,
    pub sender_name: Option<&'a str>,
    pub role: &'a str,
    pub text: &'a str,
    pub platform_message_id: Option<&'a str>,
    pub created_at: i64,
    pub run_id: Option<&'a str>,
    pub status: Option<&'a str>,
    pub reply_to: Option<i64>,
    pub task_run_id: Option<i64>,
    /// The message came through an origin whose senders' identity mappings
    /// hold (the platform's in-process adapter, or an adapter token minted
    /// with `--trusted-identities`).
    pub trusted_identity: bool,
}

/// True if this platform message id is already stored for the conversation.
pub fn insert_probe(
    conn: &Conn,
    conversation_id: i64,
    platform_message_id: &str,
) -> StoreResult<bool> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM messages WHERE conversation_id = ?1 AND platform_message_id = ?2",
            params![conversation_id, platform_message_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// Inserts a message. `Ok(None)` when the platform message id was already
/// stored for this conversation (a replay): nothing is written.
pub fn insert(conn: &Conn, m: &NewMessage<'_>) -> StoreResult<Option<i64>> {
    if let (Some(conv), Some(pid)) = (m.conversation_id, m.platform_message_id) {
        let seen: Option<i64> = conn
            .query_row(
                "SELECT id FROM messages WHERE conversation_id = ?1 AND platform_message_id = ?2",
                params![conv, pid],
                |r| r.get(0),
            )
            .optional()?;
        if seen.is_some() {
            return Ok(None);
        }
    }
    let id: i64 = conn.query_row(
        "INSERT INTO messages (space_id, conversation_id, sender_id, sender_name, role, text, platform_message_id, created_at, run_id, status, reply_to, task_run_id, trusted_identity)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) RETURNING id",
        params![
            m.space_id,
            m.conversation_id,
            m.sender_id,
            m.sender_name,
            m.role,
            m.text,
            m.platform_message_id,
            m.created_at,
            m.run_id,
            m.status,
            m.reply_to,
            m.task_run_id,
            m.trusted_identity
        ], |r| r.get(0))?;
    Ok(Some(id))
}

/// Whether the identity mapping of message `id`'s sender holds (see
/// [`NewMessage::trusted_identity`]); false for an unknown message.
pub fn identity_trusted(conn: &Conn, id: i64) -> StoreResult<bool> {
    Ok(conn
        .query_row(
            "SELECT trusted_identity FROM messages WHERE id = ?1",
            params![id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(false))
}

pub fn get(conn: &Conn, id: i64) -> StoreResult<Option<Message>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM messages WHERE id = ?1"),
        params![id],
        from_row,
    )
    .optional()
}

/// The reply written for a user message, if its turn has finished.
pub fn reply_for(conn: &Conn, user_message_id: i64) -> StoreResult<Option<Message>> {
    conn.query_row(
        &format!("SELECT {COLS} {REPLY_FOR_TAIL}"),
        params![user_message_id],
        from_row,
    )
    .optional()
}

/// User messages still waiting for a turn, oldest first.
pub fn pending(conn: &Conn, space: &str) -> StoreResult<Vec<Message>> {
    conn.query_all(
        &format!("SELECT {COLS} {PENDING_TAIL}"),
        params![space],
        from_row,
    )
}

/// The space's oldest pending message: the next one its actor answers.
pub fn next_pending(conn: &Conn, space: &str) -> StoreResult<Option<Message>> {
    conn.query_opt(
        &format!("SELECT {COLS} {PENDING_TAIL} LIMIT 1"),
        params![space],
        from_row,
    )
}

/// Spaces with pending messages (start-up recovery).
/// Which of `ids` are no longer pending (their turn ended), at most 500
/// asked at once.
pub fn settled_among(conn: &Conn, ids: &[i64]) -> StoreResult<Vec<i64>> {
    let ids = &ids[..ids.len().min(500)];
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let marks: Vec<String> = (1..=ids.len()).map(|i| format!("?{i}")).collect();
    let params: Vec<&dyn super::ToParam> = ids.iter().map(|i| i as &dyn super::ToParam).collect();
    conn.query_all(
        &format!(
            "SELECT id FROM messages WHERE id IN ({}) AND status <> 'pending'",
            marks.join(", ")
        ),
        &params,
        |r| r.get(0),
    )
}

pub fn spaces_with_pending(conn: &Conn) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT DISTINCT space_id FROM messages WHERE status = 'pending' ORDER BY space_id",
        params![],
        |r| r.get(0),
    )
}

pub fn set_status(conn: &Conn, id: i64, status: &str, run_id: Option<&str>) -> StoreResult<()> {
    conn.execute(
        "UPDATE messages SET status = ?2, run_id = COALESCE(?3, run_id) WHERE id = ?1",
        params![id, status, run_id],
    )?;
    Ok(())
}

/// Marks every pending message of a space `dropped` (control stop) except
/// `keep` (the message whose turn is running: it settles as `stopped` when
/// that turn ends); returns the dropped ids.
pub fn drop_pending(conn: &Conn, space: &str, keep: Option<i64>) -> StoreResult<Vec<i64>> {
    let keep = keep.unwrap_or(-1);
    let ids: Vec<i64> = conn.query_all(
        "SELECT id FROM messages INDEXED BY messages_pending
         WHERE space_id = ?1 AND status = 'pending' AND id <> ?2",
        params![space, keep],
        |r| r.get(0),
    )?;
    conn.execute(
        "UPDATE messages INDEXED BY messages_pending SET status = 'dropped'
         WHERE space_id = ?1 AND status = 'pending' AND id <> ?2",
        params![space, keep],
    )?;
    Ok(ids)
}

/// Moves a pending message to a final status; false if it was not pending
/// any more (another turn answered it), so the caller must not reply twice.
pub fn settle(conn: &Conn, id: i64, status: &str, run_id: &str) -> StoreResult<bool> {
    Ok(conn.execute(
        "UPDATE messages SET status = ?2, run_id = ?3 WHERE id = ?1 AND status = 'pending'",
        params![id, status, run_id],
    )? == 1)
}

/// Recent history above the session boundary, oldest first, at most `limit`
/// rows, excluding `before_id` and later (the message being answered).
pub fn history(
    conn: &Conn,
    space: &str,
    boundary: i64,
    before_id: i64,
    limit: u32,
) -> StoreResult<Vec<Message>> {
    let mut out = conn.query_all(
        &format!("SELECT {COLS} {HISTORY_TAIL}"),
        params![space, boundary, before_id, limit],
        from_row,
    )?;
    out.reverse();
    Ok(out)
}

/// Deletes `space`'s messages from `from_id` on: a rehearsal copy's
/// history cut just before the message it replays (`mercury review
/// rehearse`, never on a live store); how many it deleted.
pub fn cut_history(conn: &Conn, space: &str, from_id: i64) -> StoreResult<u64> {
    let n = conn.execute(
        "DELETE FROM messages WHERE space_id = ?1 AND id >= ?2",
        params![space, from_id],
    )?;
    Ok(n as u64)
}

pub fn max_id(conn: &Conn, space: &str) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COALESCE(MAX(id), 0) FROM messages WHERE space_id = ?1",
        params![space],
        |r| r.get(0),
    )
}

/// Newest-first substring search.
pub fn search(
    conn: &Conn,
    space: &str,
    conversation: Option<i64>,
    query: &str,
    limit: u32,
) -> StoreResult<Vec<Message>> {
    let pattern = format!(
        "%{}%",
        query
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    // SQLite's LIKE ignores ASCII case; PostgreSQL's ILIKE is the same match.
    let like = match conn.dialect() {
        super::Dialect::Sqlite => "LIKE",
        super::Dialect::Postgres => "ILIKE",
    };
    conn.query_all(
        &format!(
            "SELECT {COLS} FROM messages WHERE space_id = ?1 AND text {like} ?2 ESCAPE '\\'
           AND (?4 IS NULL OR conversation_id = ?4) ORDER BY id DESC LIMIT ?3"
        ),
        params![space, pattern, limit, conversation],
        from_row,
    )
}

/// A position in the (created_at, id) order, opaque to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub created_at: i64,
    pub id: i64,
}

impl Cursor {
    pub fn encode(self) -> String {
        format!("{}-{}", self.created_at, self.id)
    }

    pub fn decode(raw: &str) -> StoreResult<Cursor> {
        let bad = || StoreError::Invalid(format!("cursor {raw:?} is not one this server gave out"));
        let (a, b) = raw.split_once('-').ok_or_else(bad)?;
        Ok(Cursor {
            created_at: a.parse().map_err(|_| bad())?,
            id: b.parse().map_err(|_| bad())?,
        })
    }
}

/// Messages with `since <= created_at < until`, oldest first, after `cursor`.
/// Returns the page and the cursor of the next page (if more rows may follow).
#[allow(clippy::too_many_arguments)]
pub fn recent(
    conn: &Conn,
    space: &str,
    conversation: Option<i64>,
    since: i64,
    until: i64,
    limit: u32,
    cursor: Option<Cursor>,
) -> StoreResult<(Vec<Message>, Option<Cursor>)> {
    let (ca, cid) = cursor.map_or((i64::MIN, i64::MIN), |c| (c.created_at, c.id));
    let mut page = conn.query_all(
        &format!(
            "SELECT {COLS} FROM messages
         WHERE space_id = ?1 AND created_at >= ?2 AND created_at < ?3
           AND (created_at > ?4 OR (created_at = ?4 AND id > ?5))
           AND (?7 IS NULL OR conversation_id = ?7)
         ORDER BY created_at, id LIMIT ?6"
        ),
        params![
            space,
            since,
            until,
            ca,
            cid,
            i64::from(limit) + 1,
            conversation
        ],
        from_row,
    )?;
    let more = page.len() > limit as usize;
    page.truncate(limit as usize);
    let next = if more {
        page.last().map(|m| Cursor {
            created_at: m.created_at,
            id: m.id,
        })
    } else {
        None
    };
    Ok((page, next))
}
