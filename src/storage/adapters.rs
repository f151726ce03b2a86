//! Chat adapters' durable positions (`adapter_positions`): how far an
//! in-process adapter has read its platform (Telegram's next `getUpdates`
//! offset, Discord's gateway session and sequence).
//!
//! Must never: move a position in a transaction other than the one that
//! stored what it covers (the caller writes both together), or move it back.

use super::{params, Conn, Dialect, Query};

use super::StoreResult;
use crate::clock::now_ms;

/// The stored position of `adapter`, if it has one.
pub fn position(conn: &Conn, adapter: &str) -> StoreResult<Option<String>> {
    conn.query_opt(
        "SELECT position FROM adapter_positions WHERE adapter = ?1",
        params![adapter],
        |r| r.get(0),
    )
}

/// Records `position` for `adapter` (an upsert).
pub fn set_position(conn: &Conn, adapter: &str, position: &str) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO adapter_positions (adapter, position, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (adapter) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at",
        params![adapter, position, now_ms()],
    )?;
    Ok(())
}

/// Moves a numeric position forward only: `next` is stored unless the stored
/// one is already further (a replayed update never rewinds the offset).
pub fn advance_offset(conn: &Conn, adapter: &str, next: i64) -> StoreResult<()> {
    let current = position(conn, adapter)?.and_then(|p| p.parse::<i64>().ok());
    if current.is_none_or(|c| c < next) {
        set_position(conn, adapter, &next.to_string())?;
    }
    Ok(())
}

/// One conversation a backfill covers: its platform id, whether it is a
/// group, and the largest message id stored in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastSeen {
    pub conversation: String,
    pub is_group: bool,
    pub last_message_id: i64,
}

/// Each of `platform`'s conversations with the largest numeric platform
/// message id stored in it (Discord's snowflakes grow with time): where a
/// backfill after a lost session starts. Ids that are not numbers are left
/// out.
pub fn last_seen(conn: &Conn, platform: &str) -> StoreResult<Vec<LastSeen>> {
    let sql = match conn.dialect() {
        Dialect::Sqlite => {
            "SELECT c.external_id, c.kind, MAX(CAST(m.platform_message_id AS BIGINT))
             FROM conversations c JOIN messages m ON m.conversation_id = c.id
             WHERE c.platform = ?1 AND m.platform_message_id GLOB '[0-9]*'
               AND m.platform_message_id NOT GLOB '*[^0-9]*'
             GROUP BY c.id ORDER BY c.id"
        }
        // Snowflakes fit in BIGINT; longer digit strings are not ids.
        Dialect::Postgres => {
            "SELECT c.external_id, c.kind, MAX(CAST(m.platform_message_id AS BIGINT))
             FROM conversations c JOIN messages m ON m.conversation_id = c.id
             WHERE c.platform = ?1 AND m.platform_message_id ~ '^[0-9]{1,18}$'
             GROUP BY c.id ORDER BY c.id"
        }
    };
    conn.query_all(sql, params![platform], |r| {
        Ok(LastSeen {
            conversation: r.get(0)?,
            is_group: r.get::<_, String>(1)? == "group",
            last_message_id: r.get(2)?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_only_move_forward() {
        let conn = crate::storage::test_conn();
        assert_eq!(position(&conn, "telegram").unwrap(), None);
        advance_offset(&conn, "telegram", 10).unwrap();
        advance_offset(&conn, "telegram", 7).unwrap();
        assert_eq!(position(&conn, "telegram").unwrap().as_deref(), Some("10"));
        advance_offset(&conn, "telegram", 11).unwrap();
        assert_eq!(position(&conn, "telegram").unwrap().as_deref(), Some("11"));
    }

    #[test]
    fn last_seen_is_the_largest_numeric_id_per_conversation() {
        let conn = crate::storage::test_conn();
        conn.execute_batch(
            "INSERT INTO spaces (id, name, created_at, updated_at) VALUES ('s', 's', 0, 0);
             INSERT INTO conversations (platform, external_id, space_id, kind, first_seen_at, last_seen_at)
               VALUES ('discord', '70', 's', 'dm', 0, 0), ('discord', '71', 's', 'group', 0, 0),
                      ('telegram', '72', 's', 'dm', 0, 0);
             INSERT INTO messages (space_id, conversation_id, role, text, platform_message_id, created_at)
               VALUES ('s', 1, 'user', 'a', '900', 0), ('s', 1, 'user', 'b', '1000', 0),
                      ('s', 1, 'user', 'c', 'x12', 0), ('s', 2, 'ambient', 'd', '5', 0),
                      ('s', 3, 'user', 'e', '99999', 0);",
        )
        .unwrap();
        assert_eq!(
            last_seen(&conn, "discord").unwrap(),
            vec![
                LastSeen {
                    conversation: "70".into(),
                    is_group: false,
                    last_message_id: 1000
                },
                LastSeen {
                    conversation: "71".into(),
                    is_group: true,
                    last_message_id: 5
                },
            ]
        );
    }
}
