//! `mercury bench`: measurements of the host's own paths on this machine,
//! each printed beside a plain-SQLite baseline on a file with the store's
//! settings, so the ratio says what the host adds on top of the database.
//! Benches: `turns` (ingest throughput and per-turn orchestration overhead),
//! `sandbox` (container start to first exec), `links` (a read route direct
//! and through a space link), `ask` (copy + container ready beside `cp -a`)
//! `ext` (an MCP tool call beside a `shell` call), `review`, `adapters` (Telegram intake beside ingress alone) and `shadow`
//! (snapshot beside `cp -a`), `ui` (the dashboard's pages at 10,000 spaces and
//! 1,000,000 messages), `scale` (reads, memory and waking spaces on a
//! 10,000-space store); `docs/benchmarks.md` says how to read them.
//!
//! Must never: touch a real data dir (every bench works in a temp dir), call
//! a network model (the scripted model answers), or pass or fail on a
//! number (targets are reported, never asserted).

// A bench prints its figures.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub(crate) mod adapters;
pub(crate) mod ask;
pub(crate) mod cluster;
pub(crate) mod ext;
pub(crate) mod fake_provider;
pub(crate) mod links;
pub(crate) mod review;
pub(crate) mod review_quality;
pub(crate) mod sandbox;
pub(crate) mod scale;
pub(crate) mod shadow;
pub(crate) mod turns;
pub(crate) mod ui;

use std::path::Path;
use std::time::Duration;

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
    Ok(storage::baseline::plain_inserts(path, n)?)
}

/// One request's time to its whole answer; a non-2xx answer is an error.
pub(crate) async fn timed(req: reqwest::RequestBuilder) -> anyhow::Result<Duration> {
    let t = std::time::Instant::now();
    let resp = req.send().await?;
    let status = resp.status();
    let _ = resp.bytes().await?;
    anyhow::ensure!(status.is_success(), "bench request answered {status}");
    Ok(t.elapsed())
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
}
