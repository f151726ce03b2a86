//! The retention sweep: at start-up and then every hour, one write deletes
//! what a busy deployment would otherwise keep forever: link audit rows
//! older than `links.audit_keep_days` and delivered (or acknowledged)
//! outbox items older than `outbox.keep_days`, and reply previews' ids
//! (`storage::previews`) as old, and the per-caller limit windows that
//! ended (`storage::caller_windows`). Run traces have their own
//! (`runs.keep_days`, with a turn's commit). What is kept, and why, is in
//! docs/operations.md ("What is kept, and for how long").
//!
//! Must never: delete an outbox item that has not been delivered, or run on
//! a shadow (its rows are the rehearsal's evidence, compared by `shadow diff`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::runtime::Runtime;
use crate::storage::{caller_windows, links, outbox, previews, StoreResult, Tx};

const EVERY: Duration = Duration::from_secs(3600);
const DAY_MS: i64 = 86_400_000;

/// What one sweep deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub audit_rows: u64,
    pub outbox_items: u64,
    pub reply_previews: u64,
    /// Per-caller limit windows that ended (several hosts only).
    pub caller_windows: u64,
}

/// One sweep at `now`, in `tx`.
pub fn sweep(tx: &Tx<'_>, settings: &crate::config::Settings, now: i64) -> StoreResult<Swept> {
    let days = |d: u32| now - i64::from(d) * DAY_MS;
    Ok(Swept {
        audit_rows: links::prune_audit(tx, days(settings.links.audit_keep_days))?,
        outbox_items: outbox::prune_delivered(tx, days(settings.outbox.keep_days))?,
        reply_previews: previews::prune(tx, days(settings.outbox.keep_days))?,
        caller_windows: caller_windows::prune(tx, now)?,
    })
}

pub async fn sweep_loop(rt: Arc<Runtime>, shutdown: CancellationToken) {
    if rt.outbound.is_shadow() {
        return;
    }
    loop {
        let settings = rt.settings.clone();
        match rt
            .store
            .write(move |tx| sweep(tx, &settings, now_ms()))
            .await
        {
            Ok(s) if s != Swept::default() => tracing::info!(
                audit_rows = s.audit_rows,
                outbox_items = s.outbox_items,
                reply_previews = s.reply_previews,
                caller_windows = s.caller_windows,
                "retention sweep deleted old rows"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "retention sweep failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}
