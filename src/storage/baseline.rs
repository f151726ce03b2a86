//! The plain-database baselines `mercury bench` measures the store against:
//! a table of its own, one single-row insert per transaction, in a fresh
//! SQLite file with the store's file settings, or in a throwaway database
//! on a PostgreSQL server ([`ScratchDatabase`]). The baseline is what the
//! database itself costs, without the store.
//!
//! Must never: touch a data dir's database (it only creates the file or
//! the database it is given), or drop a database it did not create.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{open_plain, params, Location, Store, StoreError, StoreResult};

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

/// `n` single-row inserts, one transaction each, in a new table of the
/// PostgreSQL database at `at` (a [`ScratchDatabase`]'s). Blocking.
pub fn plain_inserts_postgres(at: &Location, n: usize) -> StoreResult<(Duration, Vec<Duration>)> {
    let store = Store::open_unmigrated(at)?;
    off_runtime(|| {
        store.read_blocking(|c| {
            c.execute_batch(
                "CREATE TABLE plain (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                     conversation TEXT NOT NULL, text TEXT NOT NULL,
                                     created_at BIGINT NOT NULL)",
            )?;
            let mut each = Vec::with_capacity(n);
            let start = Instant::now();
            for i in 0..n {
                let t = Instant::now();
                c.execute_batch("BEGIN")?;
                c.execute(
                    "INSERT INTO plain (conversation, text, created_at) VALUES (?1, ?2, ?3)",
                    params![
                        format!("conv-{}", i % 100),
                        format!("message {i}"),
                        crate::clock::now_ms()
                    ],
                )?;
                c.execute_batch("COMMIT")?;
                each.push(t.elapsed());
            }
            Ok((start.elapsed(), each))
        })
    })
}

/// A database of a bench's own on a PostgreSQL server: created empty from
/// the server's address, dropped (its connections closed) when this goes.
pub struct ScratchDatabase {
    server: Location,
    name: String,
    /// The new database (the server's URL with its name, same password).
    pub location: Location,
}

impl ScratchDatabase {
    /// Creates `mercury_bench_<label>_<pid>_<n>` on the server `server`
    /// names (its user needs CREATEDB). Blocking.
    pub fn create(server: &Location, label: &str) -> StoreResult<ScratchDatabase> {
        let Location::Postgres { url, password } = server else {
            return Err(StoreError::Invalid(
                "a scratch database is made on a PostgreSQL server".into(),
            ));
        };
        if !label.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(StoreError::Invalid(format!("bad scratch label {label:?}")));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("mercury_bench_{label}_{}_{nanos}", std::process::id());
        let mut parsed = url::Url::parse(url)
            .map_err(|e| StoreError::Invalid(format!("the PostgreSQL URL: {e}")))?;
        parsed.set_path(&format!("/{name}"));
        let admin = Store::open_unmigrated(server)?;
        off_runtime(|| {
            admin.read_blocking(|c| c.execute_batch(&format!("CREATE DATABASE {name}")))
        })?;
        Ok(ScratchDatabase {
            server: server.clone(),
            name,
            location: Location::Postgres {
                url: parsed.to_string(),
                password: password.clone(),
            },
        })
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = Store::open_unmigrated(&self.server)
            .and_then(|admin| off_runtime(|| admin.read_blocking(|c| c.execute_batch(&sql))));
        if let Err(e) = dropped {
            tracing::warn!(database = %self.name, "the bench's scratch database was not dropped: {e}");
        }
    }
}

/// Runs `f` on a plain thread of its own, where every PostgreSQL statement
/// blocks on the pool's runtime directly (from a thread with a runtime's
/// context storage would move each statement to a thread of its own, and
/// the baseline would time those hand-offs).
fn off_runtime<T: Send>(f: impl FnOnce() -> StoreResult<T> + Send) -> StoreResult<T> {
    std::thread::scope(|s| s.spawn(f).join())
        .map_err(|_| StoreError::Join("a bench database thread panicked".into()))?
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
