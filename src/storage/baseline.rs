//! The plain-SQLite baseline `mercury bench` measures the store against: a
//! table of its own in a fresh file with the store's file settings, one
//! single-row insert per transaction. SQLite-backend functions: the
//! baseline is what the SQLite file itself costs, without the store.
//!
//! Must never: touch a data dir's database (it only creates the file it is
//! given).

use std::path::Path;
use std::time::{Duration, Instant};

use super::{open_plain, StoreResult};

/// `n` single-row inserts, one IMMEDIATE transaction each (as the store
/// commits one message per transaction), on a fresh file at `path` opened
/// with the store's own settings. The total time and each insert's time.
pub fn plain_inserts(path: &Path, n: usize) -> StoreResult<(Duration, Vec<Duration>)> {
    let mut conn = open_plain(path)?;
    conn.execute_batch(
        "CREATE TABLE plain (id INTEGER PRIMARY KEY, conversation TEXT NOT NULL,
                             text TEXT NOT NULL, created_at INTEGER NOT NULL)",
    )?;
    let mut each = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "INSERT INTO plain (conversation, text, created_at) VALUES (?1, ?2, ?3)",
        )?
        .execute(rusqlite::params![
            format!("conv-{}", i % 100),
            format!("message {i}"),
            crate::clock::now_ms()
        ])?;
        tx.commit()?;
        each.push(t.elapsed());
    }
    Ok((start.elapsed(), each))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_writes_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.db");
        let (_, each) = plain_inserts(&path, 25).unwrap();
        assert_eq!(each.len(), 25);
        let conn = rusqlite::Connection::open(&path).unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM plain", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 25);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal", "same file settings as the store");
    }
}
