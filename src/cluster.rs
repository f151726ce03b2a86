//! This host's seat in a deployment of many hosts on one PostgreSQL
//! database (issue 28, `cluster.enabled`): its id, the space leases it
//! holds with their epochs, and the named leases it keeps.
//!
//! A host claims a space's lease before it starts the space's actor, renews
//! every lease on a heartbeat, and gives a space up when its actor stops.
//! The epoch it got at the claim is the fence of every write only the
//! space's runner may make ([`HostSeat::fence`]), checked inside that
//! write's transaction ([`crate::storage::leases::hold`]).
//!
//! Must never: report a space as held that the database does not say is
//! held (the in-memory map only ever lags behind a loss, which the fence
//! catches), or start a space's actor without its lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::now_ms;
use crate::storage::leases::{self, Claim, Fence};
use crate::storage::{Store, StoreResult};

/// The header of an answer refused because another host runs the space:
/// that host's id (the host's forwarding step reads it, and removes it).
pub const RUNNER_HEADER: &str = "x-mercury-runner";

/// This host in the deployment.
pub struct HostSeat {
    /// Unique per process start: a restarted host is a new host, so nothing
    /// its predecessor held passes its fence.
    pub host_id: String,
    /// The operator's name for the machine (`cluster.host_name`).
    pub name: String,
    lease: Duration,
    store: Store,
    /// Space → the epoch this host claimed it at.
    held: Mutex<HashMap<String, i64>>,
}

impl HostSeat {
    /// Joins the deployment: a new host id and its row.
    pub async fn join(
        store: Store,
        name: &str,
        api_url: &str,
        instance_id: &str,
        lease: Duration,
    ) -> StoreResult<HostSeat> {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let host_id = format!("{name}-{}", &suffix[..8]);
        let (h, n, u, i) = (
            host_id.clone(),
            name.to_owned(),
            api_url.to_owned(),
            instance_id.to_owned(),
        );
        store
            .write(move |tx| leases::join_host(tx, &h, &n, &u, &i, now_ms()))
            .await?;
        Ok(HostSeat {
            host_id,
            name: name.to_owned(),
            lease,
            store,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The instance ids of hosts that are gone, not this host's: their
    /// sandboxes left on a shared engine are nobody's (a host silent for
    /// twice the lease counts as gone).
    pub async fn dead_instances(&self, own: &str) -> StoreResult<Vec<String>> {
        let stale = self.lease_ms().saturating_mul(2);
        let own = own.to_owned();
        self.store
            .read(move |c| leases::dead_instances(c, now_ms(), stale))
            .await
            .map(|ids| ids.into_iter().filter(|i| *i != own).collect())
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX / 4)
    }

    /// How often the heartbeat renews: three times a lease, so one missed
    /// beat (a slow database) does not lose anything.
    pub fn heartbeat_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(200))
    }

    /// The fence of `space`'s writes, if this host holds it.
    pub fn fence(&self, space: &str) -> Option<Fence> {
        let epoch = *self.held.lock().ok()?.get(space)?;
        Some(Fence {
            space: space.to_owned(),
            host: self.host_id.clone(),
            epoch,
        })
    }

    /// Spaces this host holds now.
    pub fn held_count(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }

    /// Claims `space`; on success this host may start its actor.
    pub async fn claim(&self, space: &str) -> StoreResult<Claim> {
        let (s, h, ms) = (space.to_owned(), self.host_id.clone(), self.lease_ms());
        let claim = self
            .store
            .write(move |tx| leases::claim_space(tx, &s, &h, now_ms(), ms))
            .await?;
        if let Claim::Held(epoch) = claim {
            if let Ok(mut held) = self.held.lock() {
                held.insert(space.to_owned(), epoch);
            }
        }
        Ok(claim)
    }

    /// Forgets `space` here (its actor stopped); the fence to release.
    pub fn forget(&self, space: &str) -> Option<Fence> {
        let fence = self.fence(space)?;
        if let Ok(mut held) = self.held.lock() {
            held.remove(space);
        }
        Some(fence)
    }

    /// Gives up the lease `fence` names, if it is still that one.
    pub async fn release(&self, fence: Fence) {
        let space = fence.space.clone();
        if let Err(e) = self
            .store
            .write(move |tx| leases::release_space(tx, &fence))
            .await
        {
            // It expires on its own within the lease time.
            tracing::warn!(space = %space, error = %e, "could not release a space lease");
        }
    }

    /// Renews every lease this host holds; the spaces it lost (another host
    /// took them while this one could not renew), now forgotten here.
    pub async fn renew(&self) -> StoreResult<Vec<String>> {
        // Only what was held before the renewal can have been lost by it: a
        // claim made meanwhile is not in its answer and is not a loss.
        let before: Vec<(String, i64)> = self
            .held
            .lock()
            .map(|h| h.iter().map(|(s, e)| (s.clone(), *e)).collect())
            .unwrap_or_default();
        let (h, ms) = (self.host_id.clone(), self.lease_ms());
        let still = self
            .store
            .write(move |tx| leases::renew(tx, &h, now_ms(), ms))
            .await?;
        let mut lost = Vec::new();
        if let Ok(mut held) = self.held.lock() {
            for (space, epoch) in before {
                if still.iter().any(|(s, e)| *s == space && *e == epoch) {
                    continue;
                }
                if held.get(&space) == Some(&epoch) {
                    held.remove(&space);
                    lost.push(space);
                }
            }
        }
        Ok(lost)
    }

    /// Takes or keeps the named lease `name`; true while this host holds it.
    pub async fn hold_named(&self, name: &str) -> bool {
        let (n, h, ms) = (name.to_owned(), self.host_id.clone(), self.lease_ms());
        match self
            .store
            .write(move |tx| leases::hold_named(tx, &n, &h, now_ms(), ms))
            .await
        {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "could not claim a deployment lease");
                false
            }
        }
    }

    /// Spaces with pending messages this host may run now.
    pub async fn runnable_pending(&self) -> StoreResult<Vec<String>> {
        let h = self.host_id.clone();
        self.store
            .read(move |c| leases::runnable_pending(c, &h, now_ms()))
            .await
    }

    /// Leaves the deployment cleanly: every lease given up at once.
    pub async fn leave(&self) {
        if let Ok(mut held) = self.held.lock() {
            held.clear();
        }
        let h = self.host_id.clone();
        if let Err(e) = self
            .store
            .write(move |tx| leases::leave(tx, &h, now_ms()))
            .await
        {
            tracing::warn!(error = %e, "could not give up this host's leases; they expire on their own");
        }
    }
}
