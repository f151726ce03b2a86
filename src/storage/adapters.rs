//! Chat adapters' durable positions (`adapter_positions`): how far an
//! in-process adapter has read its platform (Telegram's next `getUpdates`
//! offset, Discord's gateway session and sequence).
//!
//! Must never: move a position in a transaction other than the one that
//! stored what it covers (the caller writes both together), or move it back.

use rusqlite::{params, Connection, OptionalExtension};

use super::{Cached, StoreResult};
use crate::clock::now_ms;

/// The stored position of `adapter`, if it has one.
pub fn position(conn: &Connection, adapter: &str) -> StoreResult<Option<String>> {
    Ok(conn
        .query_row_cached(
            "SELECT position FROM adapter_positions WHERE adapter = ?1",
            [adapter],
            |r| r.get(0),
        )
        .optional()?)
}

/// Records `position` for `adapter` (an upsert).
pub fn set_position(conn: &Connection, adapter: &str, position: &str) -> StoreResult<()> {
    conn.execute_cached(
        "INSERT INTO adapter_positions (adapter, position, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (adapter) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at",
        params![adapter, position, now_ms()],
    )?;
    Ok(())
}

/// Moves a numeric position forward only: `next` is stored unless the stored
/// one is already further (a replayed update never rewinds the offset).
pub fn advance_offset(conn: &Connection, adapter: &str, next: i64) -> StoreResult<()> {
    let current = position(conn, adapter)?.and_then(|p| p.parse::<i64>().ok());
    if current.is_none_or(|c| c < next) {
        set_position(conn, adapter, &next.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_only_move_forward() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::storage::migrations::apply(&mut conn).unwrap();
        assert_eq!(position(&conn, "telegram").unwrap(), None);
        advance_offset(&conn, "telegram", 10).unwrap();
        advance_offset(&conn, "telegram", 7).unwrap();
        assert_eq!(position(&conn, "telegram").unwrap().as_deref(), Some("10"));
        advance_offset(&conn, "telegram", 11).unwrap();
        assert_eq!(position(&conn, "telegram").unwrap().as_deref(), Some("11"));
    }
}
