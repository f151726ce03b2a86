//! The database half of `mercury shadow snapshot`: a transactionally
//! consistent copy of the live file, then the copy's tokens swapped for the
//! shadow's own. SQLite-backend functions: they work on database files by
//! path (`VACUUM INTO`, `secure_delete`), which only the
//! SQLite backend has.
//!
//! Must never: write to the live file (it is opened read-only), or leave a
//! live token hash readable in the copy's file (`secure_delete` overwrites
//! deleted rows, and the pages they free, with zeros).

use std::path::Path;
use std::time::Duration;

use super::{open_read_only, params, Conn, StoreError, StoreResult, Tx};

/// The high-water marks of the copy: the diff later counts what came after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyMarks {
    pub message_id: i64,
    pub token_usage_id: i64,
    pub run_started_at_ms: i64,
}

/// Copies the database at `live` into the new file `target` while the live
/// host serves (the live writer is never paused). SQLite backend.
pub fn copy_into(live: &Path, target: &str) -> StoreResult<()> {
    let src = open_read_only(live)?;
    // Longer than the store's own: a large live write may hold the lock.
    src.busy_timeout(Duration::from_secs(30))?;
    src.execute("VACUUM INTO ?1", rusqlite::params![target])?;
    Ok(())
}

/// The marks of the copy at `path`, then every API token of it dropped and
/// `mint` run in the same transaction (the shadow's own owner token).
/// SQLite backend.
pub fn replace_tokens<T>(
    path: &Path,
    mint: impl FnOnce(&Tx<'_>) -> StoreResult<T>,
) -> StoreResult<(CopyMarks, T)> {
    let db = rusqlite::Connection::open(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    // Deleted rows stay in free pages unless overwritten: the live token
    // hashes must not be readable from the copy's file. `secure_delete`
    // zeroes the deleted cells and every page they free, which is what a
    // `VACUUM` after the delete used to buy, at the price of rebuilding the
    // whole file a second time (the copy is `VACUUM INTO`'s, with no free
    // page of the live file in it).
    db.pragma_update(None, "secure_delete", "ON")?;
    let conn = Conn::sqlite(db);
    let max = |sql: &str| -> StoreResult<i64> { conn.query_row(sql, params![], |r| r.get(0)) };
    let marks = CopyMarks {
        message_id: max("SELECT COALESCE(MAX(id), 0) FROM messages")?,
        token_usage_id: max("SELECT COALESCE(MAX(id), 0) FROM token_usage")?,
        run_started_at_ms: max("SELECT COALESCE(MAX(started_at), 0) FROM runs")?,
    };
    conn.execute_batch("BEGIN")?;
    // Not one live credential crosses (nor a dashboard sign-in's or link's hash).
    let swapped = conn
        .execute("DELETE FROM api_tokens", params![])
        .and_then(|_| conn.execute("DELETE FROM ui_signins", params![]))
        .and_then(|_| conn.execute("DELETE FROM ui_login_links", params![]))
        .and_then(|_| mint(&Tx::new(&conn)));
    match swapped {
        Ok(minted) => {
            conn.execute_batch("COMMIT")?;
            Ok((marks, minted))
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Cuts a space's history in a replay copy's file at `path` (never a live
/// file) just before message `from_id`, and closes the file before it
/// returns, so a plain copy of it afterwards (the diff's baseline) holds
/// the cut. How many messages went. SQLite backend.
pub fn cut_history(path: &Path, space: &str, from_id: i64) -> StoreResult<u64> {
    let db = rusqlite::Connection::open(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let conn = Conn::sqlite(db);
    super::messages::cut_history(&conn, space, from_id)
}
