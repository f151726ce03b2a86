//! Reply previews: the platform message that shows a live reply while its
//! turn runs (`turn.stream`), by the message it answers. The row is written
//! once the platform gave the preview's id; the outbox item of the final
//! reply is delivered as an edit of that message (found through the reply's
//! `reply_to`), so a restart mid-turn ends in an edit, never a second
//! message. Rows go with the outbox's retention.
//!
//! Must never: hold the reply's text (the stored reply is the final text
//! only, in `messages`).

use super::{params, Conn, Optional, StoreResult};

/// The preview of the reply to `message`: where it was sent and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub platform: String,
    pub external_id: String,
    pub platform_message_id: String,
}

/// Records the preview of the reply to `message` (the first one stays: a
/// retried turn edits the message its first attempt sent).
pub fn record(conn: &Conn, message: i64, preview: &Preview, now: i64) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO reply_previews (message_id, platform, external_id, platform_message_id, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (message_id) DO NOTHING",
        params![
            message,
            preview.platform,
            preview.external_id,
            preview.platform_message_id,
            now
        ],
    )?;
    Ok(())
}

/// The preview of the reply to `message`, if one was sent.
pub fn of_message(conn: &Conn, message: i64) -> StoreResult<Option<Preview>> {
    conn.query_row(
        "SELECT platform, external_id, platform_message_id FROM reply_previews WHERE message_id = ?1",
        params![message],
        |r| {
            Ok(Preview {
                platform: r.get(0)?,
                external_id: r.get(1)?,
                platform_message_id: r.get(2)?,
            })
        },
    )
    .optional()
}

/// Deletes the previews recorded before `before`; how many.
pub fn prune(conn: &Conn, before: i64) -> StoreResult<u64> {
    let n = conn.execute(
        "DELETE FROM reply_previews WHERE created_at < ?1",
        params![before],
    )?;
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_preview_of_a_message_stays_and_old_ones_are_pruned() {
        let conn = crate::storage::test_conn();
        let first = Preview {
            platform: "telegram".into(),
            external_id: "42".into(),
            platform_message_id: "5001".into(),
        };
        record(&conn, 7, &first, 1_000).unwrap();
        let second = Preview {
            platform_message_id: "5002".into(),
            ..first.clone()
        };
        record(&conn, 7, &second, 2_000).unwrap();
        assert_eq!(of_message(&conn, 7).unwrap(), Some(first));
        assert_eq!(of_message(&conn, 8).unwrap(), None);
        assert_eq!(prune(&conn, 1_000).unwrap(), 0);
        assert_eq!(prune(&conn, 1_001).unwrap(), 1);
        assert_eq!(of_message(&conn, 7).unwrap(), None);
    }
}
