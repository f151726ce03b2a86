//! The loops of a host that is one of many (`cluster.enabled`): the
//! heartbeat that renews its leases and stops the actors of spaces it lost,
//! the look for pending messages it may run (stored by any host, or left by
//! a dead one), and for the turns this host's callers wait on that another
//! host ran (`POST /api/chat`, the dashboard, the adapters' typing).
//!
//! A host that stores work for a space another host runs says so on
//! `NOTIFY mercury_wake` and the holder wakes the space at once; the look
//! every `cluster.poll_ms` finds what a lost notification (a dropped
//! connection) and a dead host left.
//!
//! Must never: keep running a space whose lease the database gave to
//! another host (its actor is stopped at the first heartbeat that sees it).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::actors::SpaceDirectory;
use crate::cluster::HostSeat;
use crate::ids::SpaceId;
use crate::runtime::Runtime;
use crate::storage::{leases, messages};

/// Runs the loops until `shutdown`.
pub async fn run(
    rt: Arc<Runtime>,
    seat: Arc<HostSeat>,
    spaces: SpaceDirectory,
    shutdown: CancellationToken,
) {
    let poll = Duration::from_millis(rt.settings.cluster.poll_ms);
    let heard = rt.store.listen(leases::WAKE_CHANNEL);
    tokio::join!(
        heartbeat(seat.clone(), spaces.clone(), shutdown.clone()),
        woken_by_others(seat.clone(), spaces.clone(), heard, shutdown.clone()),
        look_for_work(seat, spaces, poll, shutdown.clone()),
        settled_elsewhere(rt, poll, shutdown),
    );
}

/// Wakes a space this host runs when another host stored work for it
/// (`NOTIFY mercury_wake`); a space held elsewhere is its holder's.
async fn woken_by_others(
    seat: Arc<HostSeat>,
    spaces: SpaceDirectory,
    heard: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
    shutdown: CancellationToken,
) {
    let Some(mut heard) = heard else {
        return;
    };
    loop {
        let space = tokio::select! {
            _ = shutdown.cancelled() => return,
            s = heard.recv() => match s {
                Some(s) => s,
                None => return,
            },
        };
        if seat.fence(&space).is_none() {
            continue;
        }
        if let Ok(id) = SpaceId::parse(&space) {
            if let Err(e) = spaces.wake(&id).await {
                tracing::warn!(space = %space, error = %e, "cannot run a space's pending messages");
            }
        }
    }
}

/// Wakes this host's waiters whose message another host answered (this
/// host's actor would have told them itself).
async fn settled_elsewhere(rt: Arc<Runtime>, poll: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
        let waited = rt.waiters.waited();
        if waited.is_empty() {
            continue;
        }
        match rt
            .store
            .read(move |c| messages::settled_among(c, &waited))
            .await
        {
            Ok(done) => {
                for id in done {
                    rt.waiters.notify(id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look up the turns waited for"),
        }
    }
}

async fn heartbeat(seat: Arc<HostSeat>, spaces: SpaceDirectory, shutdown: CancellationToken) {
    let every = seat.heartbeat_every();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match seat.renew().await {
            Ok(lost) => {
                for space in lost {
                    tracing::warn!(space = %space, host = %seat.host_id, "this host lost the space's lease (another host took it); its actor stops");
                    if let Ok(id) = SpaceId::parse(&space) {
                        spaces.stop_space(&id, "lease lost");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster heartbeat failed; leases expire unless the next one succeeds");
            }
        }
    }
}

async fn look_for_work(
    seat: Arc<HostSeat>,
    spaces: SpaceDirectory,
    poll: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match seat.runnable_pending().await {
            Ok(found) => {
                for space in found {
                    let Ok(id) = SpaceId::parse(&space) else {
                        continue;
                    };
                    if let Err(e) = spaces.wake(&id).await {
                        tracing::warn!(space = %space, error = %e, "cannot run a space's pending messages");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for pending messages"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}
