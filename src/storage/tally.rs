//! A statement-by-statement tally for the benches (`mercury bench turns
//! --statements`): how many times each SQL statement ran while it was on,
//! and the time spent in it, so a path's cost can be split by statement.
//!
//! Off by default, and then it costs one relaxed atomic load per statement.
//! Must never: change what a statement does, or keep anything but the
//! statement's text (never a parameter: they carry chat text).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static TALLY: Mutex<Option<HashMap<String, Tallied>>> = Mutex::new(None);

/// One statement's share while the tally was on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tallied {
    /// The statement, its whitespace folded to single spaces.
    pub sql: String,
    pub count: u64,
    pub total: Duration,
}

/// Starts counting from zero (in this process, every store).
pub fn start() {
    *TALLY.lock().unwrap_or_else(PoisonError::into_inner) = Some(HashMap::new());
    ON.store(true, Ordering::SeqCst);
}

/// Stops counting; what was counted, the costliest first.
pub fn stop() -> Vec<Tallied> {
    ON.store(false, Ordering::SeqCst);
    let taken = TALLY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_default();
    let mut out: Vec<Tallied> = taken.into_values().collect();
    costliest_first(&mut out);
    out
}

/// Adds what another [`stop`] returned into `into` (one statement's counts
/// and times summed), the costliest first again: a bench that tallies a
/// side over blocks apart.
pub fn add(into: &mut Vec<Tallied>, more: Vec<Tallied>) {
    for t in more {
        match into.iter_mut().find(|s| s.sql == t.sql) {
            Some(s) => {
                s.count += t.count;
                s.total += t.total;
            }
            None => into.push(t),
        }
    }
    costliest_first(into);
}

fn costliest_first(list: &mut [Tallied]) {
    list.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.sql.cmp(&b.sql)));
}

/// What a read hand-off (off the async runtime to a reader and back) and a
/// write hand-off (to the writer thread, through its commit) are tallied
/// as, beside the statements inside them.
pub const READ_HANDOFF: &str = "(read hand-off: to a reader connection and back)";
pub const WRITE_HANDOFF: &str = "(write hand-off: to the writer and through its commit)";

/// Whether a tally is on (a hand-off measures itself only then).
pub(super) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Adds one hand-off of `label` that took `took`.
pub(super) fn record(label: &'static str, took: Duration) {
    let mut guard = TALLY.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(map) = guard.as_mut() {
        let entry = map.entry(label.to_owned()).or_insert_with(|| Tallied {
            sql: label.to_owned(),
            ..Tallied::default()
        });
        entry.count += 1;
        entry.total += took;
    }
}

/// Runs `f` (the statement `sql`), counted when the tally is on.
pub(super) fn timed<T>(sql: &str, f: impl FnOnce() -> T) -> T {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    let mut guard = TALLY.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(map) = guard.as_mut() {
        let entry = match map.get_mut(sql) {
            Some(e) => e,
            None => map.entry(sql.to_owned()).or_insert_with(|| Tallied {
                sql: sql.split_whitespace().collect::<Vec<_>>().join(" "),
                ..Tallied::default()
            }),
        };
        entry.count += 1;
        entry.total += took;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_counted_only_while_on_and_by_their_text() {
        // The tally is the process's: other tests' statements may land in
        // it too, so only this test's own texts are looked at.
        let ours = |all: &[Tallied]| -> Vec<Tallied> {
            all.iter()
                .filter(|t| t.sql.starts_with("SELECT 'tally-"))
                .cloned()
                .collect()
        };
        timed("SELECT 'tally-before'", || ());
        start();
        for _ in 0..3 {
            timed("SELECT\n  'tally-slow'", || {
                std::thread::sleep(Duration::from_millis(1));
            });
        }
        timed("SELECT 'tally-fast'", || ());
        let got = ours(&stop());
        timed("SELECT 'tally-after'", || ());
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].sql, "SELECT 'tally-slow'");
        assert_eq!(got[0].count, 3);
        assert!(got[0].total >= Duration::from_millis(3));
        assert_eq!(got[1].sql, "SELECT 'tally-fast'");
        assert!(ours(&stop()).is_empty(), "nothing after it stopped");
    }
}
