//! Benchmarks run as `mercury bench <name>`: each measures one product path
//! beside a baseline on the same machine and prints medians and their ratio.
//! They assert nothing; the figures and their last values live in `docs/`.

pub mod ask;
pub mod links;
pub mod sandbox;

use std::time::Duration;

/// Nearest-rank percentile of durations sorted ascending (`p` in 0..=100).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
