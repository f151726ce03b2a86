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
}

impl App {
    /// Creates a space row and its workspace.
    pub async fn create_space(
        &self,
        id: &SpaceId,
        name: &str,
        tags: &[String],
    ) -> Result<Space, StoreError> {
        let (sid, name, tags) = (id.to_string(), name.to_owned(), tags.to_vec());
        let space = self
            .rt
            .store
            .write(move |tx| spaces::create_space(tx, &sid, &name, &tags))
            .await?;
        ensure_workspace(&self.rt.paths, id)
            .map_err(|e| StoreError::Invalid(format!("cannot create the workspace: {e}")))?;
        Ok(space)
    }
}

/// Per-caller turn limits, one keyed limiter per quota (spaces may override it).
pub struct CallerLimits {
    default_per_minute: u32,
    limiters: Mutex<HashMap<u32, Arc<DefaultKeyedRateLimiter<String>>>>,
}

impl CallerLimits {
    pub fn new(default_per_minute: u32) -> Self {
        Self {
            default_per_minute,
            limiters: Mutex::new(HashMap::new()),
        }
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
}
