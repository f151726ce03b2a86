//! `mercury bench`: measurements of the host's own paths on this machine,
//! each printed beside a plain-SQLite baseline on a file with the store's
//! settings, so the ratio says what the host adds on top of the database.
//! Benches: `turns` (ingest throughput and per-turn orchestration overhead),
//! `sandbox` (container start to first exec), `links` (a read route direct
//! and through a space link), `ask` (copy + container ready beside `cp -a`)
//! `review`, `adapters` (Telegram intake beside ingress alone) and `shadow`
//! (snapshot beside `cp -a`); `docs/benchmarks.md` says how to read them.
//!
//! Must never: touch a real data dir (every bench works in a temp dir), call
//! a network model (the scripted model answers), or pass or fail on a
//! number (targets are reported, never asserted).

// A bench prints its figures.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub(crate) mod adapters;
pub(crate) mod ask;
pub(crate) mod links;
pub(crate) mod review;
pub(crate) mod review_quality;
pub(crate) mod sandbox;
pub(crate) mod shadow;
pub(crate) mod turns;

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::params;

use crate::storage;

/// Nearest-rank percentile of durations sorted ascending (`p` in 0..=100).
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The baseline: `n` single-row inserts, one transaction each (as the store
/// commits one message per transaction), on a fresh file opened with the
/// store's own settings. Returns the total time and each insert's time.
pub(crate) fn plain_inserts(path: &Path, n: usize) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let mut conn = storage::open_plain(path)?;
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
        .execute(params![
            format!("conv-{}", i % 100),
            format!("message {i}"),
            crate::clock::now_ms()
        ])?;
        tx.commit()?;
        each.push(t.elapsed());
    }
    Ok((start.elapsed(), each))
}

/// Milliseconds with three decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&v[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

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
