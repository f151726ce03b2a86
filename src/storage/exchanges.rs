//! The message reads the review's exchange reader pages through that the
//! `messages` module does not answer: which spaces spoke in a window, who
//! spoke, and one exchange by its user message's id.
//!
//! Must never: write, or hold a statement across calls (each call is one
//! short statement, so the host's writer never waits on a review).

use super::{params, Conn, Query, StoreResult};

/// Spaces with at least one message in `since_ms <= created_at < until_ms`.
pub fn active_spaces(conn: &Conn, since_ms: i64, until_ms: i64) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT DISTINCT space_id FROM messages WHERE created_at >= ?1 AND created_at < ?2",
        params![since_ms, until_ms],
        |r| r.get(0),
    )
}

/// Every distinct (sender id, sender name) of the window.
pub fn senders(
    conn: &Conn,
    since_ms: i64,
    until_ms: i64,
) -> StoreResult<Vec<(Option<String>, Option<String>)>> {
    conn.query_all(
        "SELECT DISTINCT sender_id, sender_name FROM messages
         WHERE created_at >= ?1 AND created_at < ?2",
        params![since_ms, until_ms],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// `(space, text)` of the user message `id`, if it is one.
pub fn user_message(conn: &Conn, id: i64) -> StoreResult<Option<(String, String)>> {
    conn.query_opt(
        "SELECT space_id, text FROM messages WHERE id = ?1 AND role = 'user'",
        params![id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// The text of the first assistant reply to the message `id`.
pub fn first_reply(conn: &Conn, id: i64) -> StoreResult<Option<String>> {
    conn.query_opt(
        "SELECT text FROM messages WHERE reply_to = ?1 AND role = 'assistant' ORDER BY id LIMIT 1",
        params![id],
        |r| r.get(0),
    )
}
