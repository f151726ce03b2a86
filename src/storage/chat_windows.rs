//! When each platform conversation's person last wrote (`chat_windows`):
//! WhatsApp lets a business answer freely only within 24 hours of that
//! (its customer-service window). Also how an adapter gives up an outbox
//! item the platform will never take (outside that window), so it is not
//! tried again.
//!
//! Must never: move a window back (a replayed or late message never
//! shortens it), or mark a given-up item delivered.

use super::{params, Query, StoreResult};

/// Records that `conversation`'s person wrote at `at_ms` (kept if later
/// than the stored one). Called in the transaction of the message's row.
pub fn touch(
    conn: &super::Tx<'_>,
    platform: &str,
    conversation: &str,
    at_ms: i64,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO chat_windows (platform, conversation, last_inbound_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (platform, conversation) DO UPDATE SET last_inbound_at = excluded.last_inbound_at
         WHERE excluded.last_inbound_at > chat_windows.last_inbound_at",
        params![platform, conversation, at_ms],
    )?;
    Ok(())
}

/// When `conversation`'s person last wrote (ms since the epoch), if ever.
pub fn last_inbound(
    conn: &super::Conn,
    platform: &str,
    conversation: &str,
) -> StoreResult<Option<i64>> {
    conn.query_opt(
        "SELECT last_inbound_at FROM chat_windows WHERE platform = ?1 AND conversation = ?2",
        params![platform, conversation],
        |r| r.get(0),
    )
}

/// Leaves outbox item `id` undelivered for good: its attempts set to
/// `max_attempts` (no adapter takes it again) and `reason` kept as its error.
pub fn give_up(conn: &super::Tx<'_>, id: i64, reason: &str, max_attempts: u32) -> StoreResult<()> {
    conn.execute(
        "UPDATE outbox SET attempts = ?3, last_error = ?2 WHERE id = ?1 AND delivered_at IS NULL",
        params![id, reason, max_attempts],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_only_move_forward_and_given_up_items_are_not_taken_again() {
        let conn = crate::storage::test_conn();
        let tx = crate::storage::Tx::new(&conn);
        assert_eq!(last_inbound(&tx, "whatsapp", "1555").unwrap(), None);
        touch(&tx, "whatsapp", "1555", 2000).unwrap();
        touch(&tx, "whatsapp", "1555", 1000).unwrap();
        assert_eq!(last_inbound(&tx, "whatsapp", "1555").unwrap(), Some(2000));
        touch(&tx, "whatsapp", "1555", 3000).unwrap();
        assert_eq!(last_inbound(&tx, "whatsapp", "1555").unwrap(), Some(3000));
        let id =
            crate::storage::outbox::enqueue(&tx, "s", None, "whatsapp", "1555", None, "x").unwrap();
        give_up(&tx, id, "outside the window", 5).unwrap();
        assert!(
            crate::storage::outbox::undelivered_for(&tx, "whatsapp", 5, 10)
                .unwrap()
                .is_empty()
        );
    }
}
