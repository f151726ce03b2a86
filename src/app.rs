//! `App`: the state every request handler and the ingress path reach — the
//! runtime (store, models, sandbox, settings), the space actors' directory,
//! the per-caller turn limits, the shutdown token and the review scheduler's
//! handle. Built once by `host::serve`; shared behind an `Arc`.
//!
//! Must never: be built anywhere but the composition root (`host`), or hold
//! a listener (the caller binds; see `host::serve`).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio_util::sync::CancellationToken;

use crate::actors::adapter::AdapterBoard;
use crate::actors::review_scheduler::ReviewHandle;
use crate::actors::SpaceDirectory;
use crate::ids::SpaceId;
use crate::runtime::Runtime;
use crate::storage::spaces::{self, Space};
use crate::storage::StoreError;
use crate::workspace::ensure_workspace;

pub struct App {
    pub rt: Arc<Runtime>,
    pub spaces: SpaceDirectory,
    /// Per-caller turn limits (in memory; shared with the writer thread).
    pub limits: Arc<CallerLimits>,
    /// Cancelled on SIGTERM/SIGINT; every background loop watches it.
    pub shutdown: CancellationToken,
    /// The review scheduler (`POST /api/review/run`).
    pub review: ReviewHandle,
    /// The chat adapters' health and webhook inboxes (`/healthz`, the
    /// Telegram webhook route).
    pub adapters: AdapterBoard,
    /// The host's own turn-layer probe (`GET /api/doctor`): the composition
    /// root owns it; `None` where no host built this `App`.
    pub layer_check: Option<Arc<dyn LayerCheck>>,
}

/// Builds a turn's layer for real as this process (its user, capabilities
/// and mount namespace: the service's), for `mercury doctor`.
#[async_trait::async_trait]
pub trait LayerCheck: Send + Sync {
    /// `(what, level, detail)` per finding; level `ok`, `warn` or `fail`.
    async fn check(&self) -> Vec<(String, &'static str, String)>;
}

/// Why a space was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateSpaceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The row exists; its workspace could not be made (the host's fault,
    /// not the request's: logged, never sent).
    #[error("cannot create the workspace of space {space}: {source}")]
    Workspace {
        space: SpaceId,
        source: std::io::Error,
    },
}

impl App {
    /// Creates a space row and its workspace.
    pub async fn create_space(
        &self,
        id: &SpaceId,
        name: &str,
        tags: &[String],
    ) -> Result<Space, CreateSpaceError> {
        let (sid, name, tags) = (id.to_string(), name.to_owned(), tags.to_vec());
        let space = self
            .rt
            .store
            .write(move |tx| spaces::create_space(tx, &sid, &name, &tags))
            .await?;
        ensure_workspace(&self.rt.paths, id).map_err(|source| CreateSpaceError::Workspace {
            space: id.clone(),
            source,
        })?;
        Ok(space)
    }
}

/// Per-caller turn limits, one keyed limiter per quota (spaces may override
/// it). One host counts in memory; the hosts of a deployment count in the
/// store (`storage::caller_windows`), in the message row's transaction, so
/// a caller meets one limit whichever host their messages reach.
pub struct CallerLimits {
    default_per_minute: u32,
    limiters: Mutex<HashMap<u32, Arc<DefaultKeyedRateLimiter<String>>>>,
    in_store: bool,
}

impl CallerLimits {
    pub fn new(default_per_minute: u32) -> Self {
        Self {
            default_per_minute,
            limiters: Mutex::new(HashMap::new()),
            in_store: false,
        }
    }

    /// Limits the hosts of one deployment share, counted in the store.
    pub fn shared(default_per_minute: u32) -> Self {
        Self {
            in_store: true,
            ..Self::new(default_per_minute)
        }
    }

    /// Counts one turn of `caller` in `space` and says whether it is within
    /// the quota, in `tx` (the message row's) when the limits are shared.
    pub fn allow_in(
        &self,
        tx: &crate::storage::Tx<'_>,
        space: &str,
        caller: &str,
        per_minute: Option<u32>,
    ) -> crate::storage::StoreResult<bool> {
        if !self.in_store {
            return Ok(self.allow(space, caller, per_minute));
        }
        let q = per_minute.unwrap_or(self.default_per_minute);
        crate::storage::caller_windows::take(tx, space, caller, q, crate::clock::now_ms())
    }

    /// True if the caller may start another turn in the space now.
    pub fn allow(&self, space: &str, caller: &str, per_minute: Option<u32>) -> bool {
        let q = per_minute.unwrap_or(self.default_per_minute).max(1);
        let limiter = {
            let Ok(mut map) = self.limiters.lock() else {
                return true;
            };
            map.entry(q)
                .or_insert_with(|| {
                    let n = NonZeroU32::new(q).unwrap_or(NonZeroU32::MIN);
                    Arc::new(RateLimiter::keyed(Quota::per_minute(n)))
                })
                .clone()
        };
        limiter.check_key(&format!("{space}\u{0}{caller}")).is_ok()
    }

    /// Forgets every caller whose quota has refilled (it would be allowed as
    /// if never seen), so the keyed limiters do not grow with every caller
    /// that ever wrote. Returns how many callers are still remembered.
    pub fn prune(&self) -> usize {
        let Ok(map) = self.limiters.lock() else {
            return 0;
        };
        map.values()
            .map(|l| {
                l.retain_recent();
                l.shrink_to_fit();
                l.len()
            })
            .sum()
    }

    /// Prunes once a minute until `shutdown`.
    pub async fn prune_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    let kept = self.prune();
                    tracing::debug!(callers = kept, "per-caller limits pruned");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_forgets_callers_whose_quota_refilled_and_keeps_the_others() {
        // 60,000 a minute refills in a millisecond; 1 a minute does not.
        let limits = CallerLimits::new(60_000);
        assert!(limits.allow("s", "a", None));
        assert!(limits.allow("s", "b", None));
        assert!(limits.allow("s", "slow", Some(1)));
        assert!(!limits.allow("s", "slow", Some(1)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(limits.prune(), 1, "only the slow caller is still limited");
        // Pruned callers start fresh; the slow one is still held back.
        assert!(limits.allow("s", "a", None));
        assert!(!limits.allow("s", "slow", Some(1)));
    }
}
