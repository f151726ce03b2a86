//! The outbox: replies waiting to be delivered to a platform, pulled by an
//! adapter (`GET /api/outbox?after=`) or pushed by the webhook adapter.
//! Rows are kept after delivery (with `delivered_at`) for `outbox.keep_days`,
//! then deleted by the host's retention sweep; an undelivered row is never
//! deleted, so nothing waiting to go out is lost. A pulling adapter marks
//! what it delivered with `POST /api/outbox/ack {up_to}`.

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::StoreResult;
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
/// `?3`: a platform to leave out (`NULL`: none; `platform` is never NULL).
pub(crate) const UNDELIVERED_TAIL: &str =
    "FROM outbox WHERE delivered_at IS NULL AND attempts < ?1 \
     AND platform IS NOT ?3 ORDER BY id LIMIT ?2";

const COLS: &str = "id, space_id, conversation_id, platform, external_id, message_id, text, created_at, delivered_at, attempts";

fn from_row(r: &Row<'_>) -> StoreResult<OutboxItem> {
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
    conn: &Conn,
    space: &str,
    conversation_id: Option<i64>,
    platform: &str,
    external_id: &str,
    message_id: Option<i64>,
    text: &str,
) -> StoreResult<i64> {
    let id: i64 = conn.query_row(
        "INSERT INTO outbox (space_id, conversation_id, platform, external_id, message_id, text, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
        params![space, conversation_id, platform, external_id, message_id, text, now_ms()], |r| r.get(0))?;
    Ok(id)
}

/// Undelivered items after `after_id`; only `platform`'s when given (an
/// adapter token sees its own platform's replies, never another's). An item
/// acknowledged (or delivered by an in-process adapter) is not handed out
/// again, so an adapter restarting from `after=0` gets only what is still
/// owed.
pub fn after(
    conn: &Conn,
    after_id: i64,
    limit: u32,
    platform: Option<&str>,
) -> StoreResult<Vec<OutboxItem>> {
    conn.query_all(&format!(
        "SELECT {COLS} FROM outbox WHERE delivered_at IS NULL AND id > ?1 AND (?3 IS NULL OR platform = ?3) ORDER BY id LIMIT ?2"
    ), params![after_id, limit, platform], from_row)
}

/// Marks every undelivered item up to `up_to` (of `platform`, when given)
/// delivered at `now`; how many it marked.
pub fn ack(conn: &Conn, up_to: i64, platform: Option<&str>, now: i64) -> StoreResult<u64> {
    let n = conn.execute(
        "UPDATE outbox SET delivered_at = ?3, attempts = attempts + 1 WHERE delivered_at IS NULL AND id <= ?1 AND (?2 IS NULL OR platform = ?2)",
        params![up_to, platform, now],
    )?;
    Ok(n as u64)
}

/// Deletes the items delivered before `before` (never an undelivered one);
/// how many it deleted.
pub fn prune_delivered(conn: &Conn, before: i64) -> StoreResult<u64> {
    conn.execute(
        "DELETE FROM outbox_files WHERE outbox_id IN \
         (SELECT id FROM outbox WHERE delivered_at IS NOT NULL AND delivered_at < ?1)",
        params![before],
    )?;
    let n = conn.execute(
        "DELETE FROM outbox WHERE delivered_at IS NOT NULL AND delivered_at < ?1",
        params![before],
    )?;
    Ok(n as u64)
}

pub fn mark_delivered(conn: &Conn, id: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE outbox SET delivered_at = ?2, attempts = attempts + 1 WHERE id = ?1",
        params![id, now_ms()],
    )?;
    Ok(())
}

pub fn mark_failed(conn: &Conn, id: i64, error: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1",
        params![id, error],
    )?;
    Ok(())
}

/// Undelivered items, oldest first, without `skip`'s: the webhook adapter
/// leaves the replies of a platform an in-process adapter delivers to it.
pub fn undelivered_except(
    conn: &Conn,
    skip: Option<&str>,
    max_attempts: u32,
    limit: u32,
) -> StoreResult<Vec<OutboxItem>> {
    conn.query_all(
        &format!("SELECT {COLS} {UNDELIVERED_TAIL}"),
        params![max_attempts, limit, skip],
        from_row,
    )
}

/// Undelivered items of one platform, oldest first (an in-process adapter
/// delivers only its own platform's replies).
pub fn undelivered_for(
    conn: &Conn,
    platform: &str,
    max_attempts: u32,
    limit: u32,
) -> StoreResult<Vec<OutboxItem>> {
    conn.query_all(
        &format!(
            "SELECT {COLS} FROM outbox INDEXED BY outbox_undelivered_platform
         WHERE platform = ?1 AND delivered_at IS NULL AND attempts < ?2 ORDER BY id LIMIT ?3"
        ),
        params![platform, max_attempts, limit],
        from_row,
    )
}

/// The platform messages an item's delivery refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryRefs {
    /// The message the reply answers (a reply is threaded under it).
    pub answered: Option<String>,
    /// The preview that showed the reply while it was written, in the
    /// item's own chat: the reply is delivered as its edit.
    pub edit_of: Option<String>,
    /// Files of the space's workspace (`outbox/…`) sent with the reply.
    pub files: Vec<String>,
}

/// Sends `files` (workspace paths) with outbox item `id`.
pub fn attach_files(conn: &Conn, id: i64, files: &[String]) -> StoreResult<()> {
    for (seq, path) in files.iter().enumerate() {
        conn.execute(
            "INSERT INTO outbox_files (outbox_id, seq, path) VALUES (?1, ?2, ?3)",
            params![id, seq as i64, path],
        )?;
    }
    Ok(())
}

/// What `item` refers to on its platform (nothing for an item that is no
/// reply: a send, a digest).
pub fn delivery_refs(conn: &Conn, item: &OutboxItem) -> StoreResult<DeliveryRefs> {
    let files = conn.query_all(
        "SELECT path FROM outbox_files WHERE outbox_id = ?1 ORDER BY seq",
        params![item.id],
        |r| r.get(0),
    )?;
    let Some(reply) = item.message_id else {
        return Ok(DeliveryRefs {
            files,
            ..Default::default()
        });
    };
    let refs: DeliveryRefs = conn
        .query_row(
            "SELECT q.platform_message_id, p.platform_message_id FROM messages r \
             JOIN messages q ON q.id = r.reply_to \
             LEFT JOIN reply_previews p ON p.message_id = r.reply_to AND p.platform = ?2 AND p.external_id = ?3 \
             WHERE r.id = ?1",
            params![reply, item.platform, item.external_id],
            |r| {
                Ok(DeliveryRefs {
                    answered: r.get(0)?,
                    edit_of: r.get(1)?,
                    files: Vec::new(),
                })
            },
        )
        .optional()?
        .unwrap_or_default();
    Ok(DeliveryRefs { files, ..refs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_adapter_sees_only_its_platforms_undelivered_items() {
        let conn = crate::storage::test_conn();
        let tg = enqueue(&conn, "s", None, "telegram", "42", None, "a").unwrap();
        let wh = enqueue(&conn, "s", None, "whatsapp", "x@s.whatsapp.net", None, "b").unwrap();
        let ids = |v: Vec<OutboxItem>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        assert_eq!(
            ids(undelivered_for(&conn, "telegram", 5, 10).unwrap()),
            vec![tg]
        );
        assert_eq!(
            ids(undelivered_except(&conn, Some("telegram"), 5, 10).unwrap()),
            vec![wh]
        );
        assert_eq!(
            ids(undelivered_except(&conn, None, 5, 10).unwrap()),
            vec![tg, wh]
        );
        mark_delivered(&conn, tg).unwrap();
        assert!(undelivered_for(&conn, "telegram", 5, 10)
            .unwrap()
            .is_empty());
    }
}
