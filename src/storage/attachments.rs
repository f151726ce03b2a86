//! Attachments: a picture, voice note or file that came with a message.
//! An adapter stores the platform's reference (a Telegram `file_id`, a
//! Discord attachment URL) in the message's own transaction, so nothing is
//! fetched before the message is durable; the space's actor fetches it at
//! turn time and settles the row: `kept` with its workspace path, or
//! `refused` with the sentence that says why.
//!
//! Must never: hold an attachment's bytes (they live in the workspace's
//! `inbox/`, charged to its quota), or attach a reference to a message of
//! another conversation.

use super::{params, Conn, Query, Row, StoreResult};
use crate::clock::now_ms;

/// What an adapter read from its platform about one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAttachment {
    /// `image`, `voice`, `audio`, `video` or `file`.
    pub kind: String,
    /// How the platform's adapter fetches it (never a local path).
    pub reference: String,
    /// The file name the sender gave, if any (their text, not a path).
    pub name: Option<String>,
    pub mime: Option<String>,
    /// The size the platform declared, if it did.
    pub size: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub id: i64,
    pub message_id: i64,
    pub kind: String,
    pub reference: String,
    pub name: Option<String>,
    pub mime: Option<String>,
    pub size: Option<i64>,
    /// `pending`, `kept` or `refused`.
    pub status: String,
    /// Where it was kept, relative to the workspace (`inbox/…`).
    pub path: Option<String>,
    /// Why it was refused.
    pub error: Option<String>,
    /// What a voice note or audio file says, once transcribed.
    pub transcript: Option<String>,
}

const COLS: &str =
    "id, message_id, kind, reference, name, mime, size, status, path, error, transcript";

fn from_row(r: &Row<'_>) -> StoreResult<Attachment> {
    Ok(Attachment {
        id: r.get(0)?,
        message_id: r.get(1)?,
        kind: r.get(2)?,
        reference: r.get(3)?,
        name: r.get(4)?,
        mime: r.get(5)?,
        size: r.get(6)?,
        status: r.get(7)?,
        path: r.get(8)?,
        error: r.get(9)?,
        transcript: r.get(10)?,
    })
}

/// Stores `list` with the message `platform_message_id` of the chat
/// `external_id` on `platform` (the row ingress just wrote in this
/// transaction); how many. None when ingress stored no row (a refused
/// sender): there is nothing to attach them to.
pub fn attach(
    conn: &Conn,
    platform: &str,
    external_id: &str,
    platform_message_id: &str,
    list: &[NewAttachment],
) -> StoreResult<usize> {
    if list.is_empty() {
        return Ok(0);
    }
    let Some(message) = conn.query_opt(
        "SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id \
         WHERE c.platform = ?1 AND c.external_id = ?2 AND m.platform_message_id = ?3",
        params![platform, external_id, platform_message_id],
        |r| r.get::<_, i64>(0),
    )?
    else {
        return Ok(0);
    };
    // A platform that gives the same message twice stores its list once.
    if !of_message(conn, message)?.is_empty() {
        return Ok(0);
    }
    let now = now_ms();
    for a in list {
        conn.execute(
            "INSERT INTO attachments (message_id, kind, reference, name, mime, size, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![message, a.kind, a.reference, a.name, a.mime, a.size, now],
        )?;
    }
    Ok(list.len())
}

/// The attachments of `message`, in the order they came.
pub fn of_message(conn: &Conn, message: i64) -> StoreResult<Vec<Attachment>> {
    conn.query_all(
        &format!("SELECT {COLS} FROM attachments WHERE message_id = ?1 ORDER BY id"),
        params![message],
        from_row,
    )
}

/// Settles one attachment: kept at `path`, or refused for `error`.
pub fn settle(conn: &Conn, id: i64, path: Option<&str>, error: Option<&str>) -> StoreResult<()> {
    let status = if path.is_some() { "kept" } else { "refused" };
    conn.execute(
        "UPDATE attachments SET status = ?2, path = ?3, error = ?4 WHERE id = ?1",
        params![id, status, path, error],
    )?;
    Ok(())
}

/// Keeps what a kept voice note or audio file says.
pub fn set_transcript(conn: &Conn, id: i64, text: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE attachments SET transcript = ?2 WHERE id = ?1",
        params![id, text],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{conversations, messages};

    #[test]
    fn attachments_join_their_message_once_and_settle() {
        let conn = crate::storage::test_conn();
        crate::storage::spaces::create_space(&conn, "s", "s", &[]).unwrap();
        let c = conversations::upsert(&conn, "telegram", "42", "dm", None).unwrap();
        let id = messages::insert(
            &conn,
            &messages::NewMessage {
                space_id: "s",
                conversation_id: Some(c.id),
                role: "user",
                text: "[image]",
                platform_message_id: Some("101"),
                created_at: 1,
                ..Default::default()
            },
        )
        .unwrap()
        .unwrap();
        let photo = NewAttachment {
            kind: "image".into(),
            reference: "file-1".into(),
            name: None,
            mime: Some("image/jpeg".into()),
            size: Some(10),
        };
        assert_eq!(
            attach(&conn, "telegram", "42", "101", std::slice::from_ref(&photo)).unwrap(),
            1
        );
        // Given again (a redelivery), or for a message this chat never had.
        assert_eq!(
            attach(&conn, "telegram", "42", "101", std::slice::from_ref(&photo)).unwrap(),
            0
        );
        assert_eq!(
            attach(&conn, "telegram", "43", "101", std::slice::from_ref(&photo)).unwrap(),
            0
        );
        let got = of_message(&conn, id).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].status, "pending");
        settle(&conn, got[0].id, Some("inbox/1-1.jpg"), None).unwrap();
        let kept = of_message(&conn, id).unwrap().remove(0);
        assert_eq!(
            (kept.status.as_str(), kept.path.as_deref()),
            ("kept", Some("inbox/1-1.jpg"))
        );
        settle(&conn, kept.id, None, Some("too large")).unwrap();
        let refused = of_message(&conn, id).unwrap().remove(0);
        assert_eq!(
            (refused.status.as_str(), refused.error.as_deref()),
            ("refused", Some("too large"))
        );
    }
}
