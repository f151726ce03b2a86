//! Actors (ractor): the root supervisor, one `SpaceActor` per active space,
//! the task scheduler, the review scheduler, the judge pool and one
//! `AskSandbox` per ask. Each file holds one actor's protocol (its message
//! enum), its state and its lifecycle; what the work is lives below (a turn
//! in `agent`, a scan in `review`).
//!
//! ```text
//! RootSupervisor            restarts a failed child: at most 5 a minute, growing backoff
//! ├── SpaceActor(space)     one per active space; on demand, stopped when idle
//! ├── TaskScheduler         due tasks → durable firings → the space's actor
//! ├── ReviewScheduler       the daily scan (and run-now)
//! ├── JudgePool             bounded, rate-limited judge calls, live turns first
//! ├── AskSandbox            one per ask; supervised, never restarted
//! └── adapters              each chat adapter (`crate::adapters`), as a `SupervisedChild`
//! ```
//!
//! [`SpaceDirectory`] is how the rest of the host reaches a space's actor: it
//! starts one on demand and retries once through the supervisor when a
//! reference has died. Must never: call an actor without a timeout.

pub mod adapter;
pub mod ask;
pub mod judge_pool;
pub mod review_scheduler;
pub mod scheduler;
pub mod space;
pub mod supervisor;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ractor::{call_t, ActorRef};
use serde_json::Value;

pub use space::{ControlAction, SpaceMsg, SpaceWrite, WorkspaceJob};
pub use supervisor::{RootSupervisor, SupervisorMsg};

use crate::ids::SpaceId;
use crate::storage::StoreError;

/// How long an API request waits for a space actor to apply a write.
pub const APPLY_TIMEOUT_MS: u64 = 30_000;
/// How long a control action may take (compact calls the model).
pub const CONTROL_TIMEOUT_MS: u64 = 310_000;
/// How long starting a space actor may take.
pub const SPAWN_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error("space actor unavailable: {0}")]
    Unavailable(String),
    #[error("space actor did not answer within {0} ms")]
    Timeout(u64),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// A workspace write waited this long behind a running turn and was
    /// dropped unwritten.
    #[error("a turn kept the space busy for {0} ms; nothing was written")]
    Busy(u64),
}

/// What a write given to [`SpaceDirectory::apply_with`] returns when it
/// does not succeed: a store failure (`?` on storage calls) or its own refusal.
#[derive(Debug)]
pub enum Refusal<E> {
    Store(StoreError),
    Refused(E),
}

impl<E> From<StoreError> for Refusal<E> {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

/// Why [`SpaceDirectory::apply_with`] did not apply a write.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError<E> {
    /// The write's own rule refused it (nothing was written).
    #[error("refused")]
    Refused(E),
    #[error(transparent)]
    Actor(#[from] ActorError),
}

/// Why the supervisor did not start a space's actor.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{0}")]
    BadId(String),
    #[error("space {0} does not exist")]
    NoSuchSpace(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the actor of space {space}: {reason}")]
    Start { space: String, reason: String },
    /// One of many hosts: another host holds the space's lease and runs it.
    #[error("space {space} runs on host {host}")]
    LeasedElsewhere { space: String, host: String },
}

/// Why a control action (stop, clear, compact) failed inside the space actor.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The database refused a write or read: an internal failure, logged,
    /// never shown to the client.
    #[error("control action: {0}")]
    Store(#[from] StoreError),
    /// Compaction failed: its store access or its model call.
    #[error(transparent)]
    Compact(#[from] crate::agent::compact::CompactError),
}

/// The current reference to a supervised actor that may be restarted: the
/// supervisor `set`s it at every (re)start, callers `get` it per call.
pub struct ActorSlot<M> {
    current: Arc<Mutex<Option<ActorRef<M>>>>,
}

impl<M> Clone for ActorSlot<M> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
        }
    }
}

impl<M> Default for ActorSlot<M> {
    fn default() -> Self {
        Self {
            current: Arc::new(Mutex::new(None)),
        }
    }
}

impl<M> ActorSlot<M> {
    pub fn set(&self, actor: Option<ActorRef<M>>) {
        if let Ok(mut slot) = self.current.lock() {
            *slot = actor;
        }
    }

    pub fn get(&self) -> Option<ActorRef<M>> {
        self.current.lock().ok().and_then(|s| s.clone())
    }
}

/// Whether `actor` takes messages: running, or still starting. ractor's
/// `spawn` answers before the actor's loop marks it `Running`, so an actor
/// just started reads `Starting` for a moment; taking that for dead started
/// a second actor of the same space (two turns at once).
pub(crate) fn alive<M>(actor: &ActorRef<M>) -> bool {
    ractor::ACTIVE_STATES.contains(&actor.get_status())
}

/// The live space actors, by space id. Written only by the supervisor.
pub type SpaceMap = Arc<Mutex<HashMap<SpaceId, ActorRef<SpaceMsg>>>>;

#[derive(Clone)]
pub struct SpaceDirectory {
    supervisor: ActorRef<SupervisorMsg>,
    actors: SpaceMap,
}

impl SpaceDirectory {
    pub fn new(supervisor: ActorRef<SupervisorMsg>, actors: SpaceMap) -> Self {
        Self { supervisor, actors }
    }

    /// Starts an `AskSandbox` under the root supervisor. Its outcome comes
    /// back through the oneshot in `args`.
    pub async fn spawn_ask(&self, args: ask::AskArgs) -> Result<(), ActorError> {
        let res = call_t!(
            self.supervisor,
            SupervisorMsg::SpawnAsk,
            SPAWN_TIMEOUT_MS,
            Box::new(args)
        )
        .map_err(|e| ActorError::Unavailable(e.to_string()))?;
        Ok(res?)
    }

    pub fn active_count(&self) -> usize {
        self.actors.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// The space's actor, started if it is not running. The space must exist.
    pub async fn actor(&self, space: &SpaceId) -> Result<ActorRef<SpaceMsg>, ActorError> {
        if let Some(a) = self.actors.lock().ok().and_then(|m| m.get(space).cloned()) {
            if alive(&a) {
                return Ok(a);
            }
        }
        let res = call_t!(
            self.supervisor,
            SupervisorMsg::SpawnSpace,
            SPAWN_TIMEOUT_MS,
            space.clone()
        )
        .map_err(|e| ActorError::Unavailable(e.to_string()))?;
        Ok(res?)
    }

    /// Tells the space there is pending work. Pending work is in the database,
    /// so a lost wake-up is recovered when the actor next starts.
    pub async fn wake(&self, space: &SpaceId) -> Result<(), ActorError> {
        for _ in 0..2 {
            let actor = match self.actor(space).await {
                Ok(a) => a,
                // Its runner was told (`NOTIFY`), and finds the message at
                // its next look anyway: the row is stored, nothing is lost.
                Err(ActorError::Spawn(SpawnError::LeasedElsewhere { .. })) => return Ok(()),
                Err(e) => return Err(e),
            };
            if actor.cast(SpaceMsg::Wake).is_ok() {
                return Ok(());
            }
        }
        Err(ActorError::Unavailable(format!(
            "space {space} did not accept work"
        )))
    }

    /// Runs a write in the space's order (one writer per space).
    pub async fn apply<F>(&self, space: &SpaceId, write: F) -> Result<Value, ActorError>
    where
        F: FnOnce(&crate::storage::Tx<'_>) -> Result<Value, StoreError> + Send + 'static,
    {
        let actor = self.actor(space).await?;
        // An act-as request's audit row rides in its first space write's
        // transaction (no effect without its row, one commit for both).
        let boxed: SpaceWrite = Box::new(crate::links::audit::with_request_row(write));
        let res =
            call_t!(actor, SpaceMsg::Apply, APPLY_TIMEOUT_MS, boxed).map_err(|e| match e {
                ractor::RactorErr::Timeout => ActorError::Timeout(APPLY_TIMEOUT_MS),
                other => ActorError::Unavailable(other.to_string()),
            })?;
        Ok(res?)
    }

    /// [`SpaceDirectory::apply`] for a write with a refusal of its own: a
    /// `Refusal::Refused(e)` rolls the write back and comes back as
    /// [`ApplyError::Refused`], kept apart from the store's and the actor's
    /// failures (so a route maps its own refusal, and only it, to its status).
    pub async fn apply_with<T, E, F>(&self, space: &SpaceId, write: F) -> Result<T, ApplyError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&crate::storage::Tx<'_>) -> Result<T, Refusal<E>> + Send + 'static,
    {
        let slot: Arc<Mutex<Option<Result<T, E>>>> = Arc::new(Mutex::new(None));
        let put = slot.clone();
        let keep = move |r: Result<T, E>| {
            if let Ok(mut s) = put.lock() {
                *s = Some(r);
            }
        };
        let outcome = self
            .apply(space, move |tx| match write(tx) {
                Ok(v) => {
                    keep(Ok(v));
                    Ok(Value::Null)
                }
                Err(Refusal::Store(e)) => Err(e),
                Err(Refusal::Refused(e)) => {
                    keep(Err(e));
                    // Any error rolls the write's savepoint back.
                    Err(StoreError::Invalid("refused".into()))
                }
            })
            .await;
        let kept = slot.lock().ok().and_then(|mut s| s.take());
        match (outcome, kept) {
            (Ok(_), Some(Ok(v))) => Ok(v),
            (Err(_), Some(Err(e))) => Err(ApplyError::Refused(e)),
            (Err(e), _) => Err(ApplyError::Actor(e)),
            (Ok(_), _) => Err(ApplyError::Actor(ActorError::Unavailable(
                "the write's result was lost".into(),
            ))),
        }
    }

    /// Runs a blocking workspace write (given the live workspace path) in the
    /// space's order, between turns. If a turn keeps the space busy past
    /// `wait`, the write is dropped unrun ([`ActorError::Busy`]): once it has
    /// started it is always waited for, so the answer never says "not
    /// written" about a write that happened.
    pub async fn workspace_write<T, F>(
        &self,
        space: &SpaceId,
        wait: std::time::Duration,
        job: F,
    ) -> Result<T, ActorError>
    where
        T: Send + 'static,
        F: FnOnce(&std::path::Path) -> T + Send + 'static,
    {
        #[derive(PartialEq)]
        enum Stage {
            Queued,
            Started,
            Abandoned,
        }
        let stage = Arc::new(Mutex::new(Stage::Queued));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mine = stage.clone();
        // In a mutex so the boxed job is `Sync` whatever `F` is.
        let job = Mutex::new(Some((job, tx)));
        let boxed: WorkspaceJob = Box::new(move |live| {
            match mine.lock() {
                Ok(mut s) if *s == Stage::Queued => *s = Stage::Started,
                _ => return,
            }
            if let Some((job, tx)) = job.lock().ok().and_then(|mut j| j.take()) {
                let _ = tx.send(job(live));
            }
        });
        let actor = self.actor(space).await?;
        actor
            .cast(SpaceMsg::Workspace(boxed))
            .map_err(|e| ActorError::Unavailable(e.to_string()))?;
        let lost = || ActorError::Unavailable("the space stopped before the write ran".into());
        let mut rx = rx;
        match tokio::time::timeout(wait, &mut rx).await {
            Ok(r) => r.map_err(|_| lost()),
            Err(_) => {
                let started = match stage.lock() {
                    Ok(mut s) if *s == Stage::Queued => {
                        *s = Stage::Abandoned;
                        false
                    }
                    _ => true,
                };
                if started {
                    rx.await.map_err(|_| lost())
                } else {
                    Err(ActorError::Busy(wait.as_millis() as u64))
                }
            }
        }
    }

    pub async fn control(
        &self,
        space: &SpaceId,
        action: ControlAction,
    ) -> Result<Value, ActorError> {
        let actor = self.actor(space).await?;
        let res =
            call_t!(actor, SpaceMsg::Control, CONTROL_TIMEOUT_MS, action).map_err(|e| match e {
                ractor::RactorErr::Timeout => ActorError::Timeout(CONTROL_TIMEOUT_MS),
                other => ActorError::Unavailable(other.to_string()),
            })?;
        Ok(res?)
    }

    /// Stops the actor of `space` if it runs here (its lease was lost: the
    /// running turn is cancelled and commits nothing).
    pub fn stop_space(&self, space: &SpaceId, why: &str) {
        let actor = self.actors.lock().ok().and_then(|m| m.get(space).cloned());
        if let Some(a) = actor {
            a.stop(Some(why.to_owned()));
        }
    }

    /// Stops every space actor (shutdown); their running turns are abandoned
    /// and stay pending in the database.
    pub fn stop_all(&self) {
        let all: Vec<_> = self
            .actors
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for a in all {
            a.stop(Some("host shutting down".into()));
        }
    }

    #[cfg(feature = "test-hooks")]
    pub async fn inject_panic(&self, space: &SpaceId) -> Result<(), ActorError> {
        let actor = self.actor(space).await?;
        actor
            .cast(SpaceMsg::InjectPanic)
            .map_err(|e| ActorError::Unavailable(e.to_string()))
    }
}

#[async_trait::async_trait]
impl crate::review::SpaceWriter for SpaceDirectory {
    async fn write_in_space(
        &self,
        space: &SpaceId,
        write: crate::review::SpaceWrite,
    ) -> Result<Value, crate::review::SpaceWriteError> {
        self.apply(space, write)
            .await
            .map_err(|e| crate::review::SpaceWriteError(e.to_string()))
    }
}
