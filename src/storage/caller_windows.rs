//! Per-caller turn limits counted in the store (`caller_windows`), for a
//! deployment of several hosts: a caller who writes through two hosts (a
//! webhook may reach either) must meet one limit, not one per host. A
//! fixed one-minute window per (space, caller), taken in the transaction
//! that stores the message, so a message whose row rolls back takes
//! nothing. One host alone counts in memory instead (`app::CallerLimits`).
//!
//! Must never: let a window's count go past its quota without refusing
//! (the check and the count are one statement), or keep a window longer
//! than the retention sweep's two minutes.

use super::{params, StoreResult, Tx};

/// The window's length.
pub const WINDOW_MS: i64 = 60_000;

/// Counts one turn of `caller` in `space` at `now_ms`; true while the
/// window's count is within `per_minute`. Called in the message row's
/// transaction.
pub fn take(
    tx: &Tx<'_>,
    space: &str,
    caller: &str,
    per_minute: u32,
    now_ms: i64,
) -> StoreResult<bool> {
    let start = now_ms - now_ms.rem_euclid(WINDOW_MS);
    let used: i64 = tx.query_row(
        "INSERT INTO caller_windows (space_id, caller_id, window_start, used) VALUES (?1, ?2, ?3, 1)
         ON CONFLICT (space_id, caller_id) DO UPDATE SET
           used = CASE WHEN caller_windows.window_start = excluded.window_start
                       THEN caller_windows.used + 1 ELSE 1 END,
           window_start = excluded.window_start
         RETURNING used",
        params![space, caller, start],
        |r| r.get(0),
    )?;
    Ok(used <= i64::from(per_minute.max(1)))
}

/// Deletes the windows that ended before `before_ms`; how many.
pub fn prune(tx: &Tx<'_>, before_ms: i64) -> StoreResult<u64> {
    let n = tx.execute(
        "DELETE FROM caller_windows WHERE window_start < ?1",
        params![before_ms - WINDOW_MS],
    )?;
    Ok(n as u64)
}
