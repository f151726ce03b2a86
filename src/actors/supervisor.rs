//! `RootSupervisor`: parent of every space actor, the task scheduler, the
//! review scheduler, the judge pool, each `ask`'s `AskSandbox` and the chat
//! adapters (given to it as [`SupervisedChild`]ren by the host).
//!
//! An ask is one turn on a throwaway copy: it is started here so it dies with
//! the tree, and never restarted (a failed ask answers its caller with an
//! error; running it again would be a second turn nobody asked for).
//!
//! ractor's default supervisor handler stops the parent when a child dies;
//! this one restarts a failed child instead, within a restart budget and with
//! a growing backoff, and keeps the space map pointing at the live reference.
//! Pending work lives in the database, so a restarted space actor picks up
//! exactly what its predecessor had queued.
//!
//! Must never: block on a child (children are spawned, never called), or
//! restart a space without limit (a crash loop is cut off by the budget).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};

use super::adapter::SupervisedChild;
use super::ask::{AskArgs, AskSandbox};
use super::judge_pool::{JudgePool, JudgePoolArgs, JudgePoolMsg, JudgePoolSlot};
use super::review_scheduler::{
    ReviewHandle, ReviewScheduler, ReviewSchedulerArgs, ReviewSchedulerMsg,
};
use super::scheduler::{SchedulerArgs, SchedulerMsg, TaskScheduler};
use super::space::{SpaceActor, SpaceArgs, SpaceMsg};
use super::{SpaceDirectory, SpaceMap};
use crate::ids::SpaceId;
use crate::runtime::Runtime;
use crate::storage::leases::Claim;
use crate::storage::spaces;

/// Restarts allowed per child within [`RESTART_WINDOW`].
pub const RESTART_BUDGET: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

pub enum SupervisorMsg {
    /// Start the actor of an existing space (or return the running one).
    /// Sent by `SpaceDirectory::actor`; the reply carries the live reference.
    SpawnSpace(
        SpaceId,
        RpcReplyPort<Result<ActorRef<SpaceMsg>, super::SpawnError>>,
    ),
    /// Start one `AskSandbox` (spec D-016) as a child. Sent by
    /// `SpaceDirectory::spawn_ask`; the reply says it started, and the ask's
    /// own outcome goes back through the oneshot in its arguments.
    SpawnAsk(Box<AskArgs>, RpcReplyPort<Result<(), super::SpawnError>>),
    /// Start `child` and restart it whenever it fails (within the budget).
    Supervise(
        Arc<dyn SupervisedChild>,
        RpcReplyPort<Result<(), SuperviseError>>,
    ),
    /// Periodic: ask every live space actor to stop if it has idled long
    /// enough ([`super::space::idle_tick`]).
    IdleSweep,
}

/// Why [`SupervisorMsg::Supervise`] did not start its child.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("{name} did not start: {source}")]
    Spawn {
        name: String,
        #[source]
        source: ActorProcessingErr,
    },
}

pub struct SupervisorArgs {
    pub rt: Arc<Runtime>,
    pub spaces: SpaceMap,
    /// Pointed at the review scheduler whenever it (re)starts.
    pub review: ReviewHandle,
}

pub struct SupervisorState {
    rt: Arc<Runtime>,
    spaces: SpaceMap,
    by_actor: HashMap<ActorId, SpaceId>,
    /// Running asks, by actor, with their target (for the log when one fails).
    asks: HashMap<ActorId, SpaceId>,
    restarts: HashMap<String, Vec<Instant>>,
    scheduler: Option<ActorRef<SchedulerMsg>>,
    directory: Option<SpaceDirectory>,
    review_scheduler: Option<ActorRef<ReviewSchedulerMsg>>,
    review: ReviewHandle,
    judge_pool: Option<ActorRef<JudgePoolMsg>>,
    /// Pointed at the judge pool whenever it (re)starts; scans read it.
    judge_pool_slot: JudgePoolSlot,
    /// Children started by [`SupervisorMsg::Supervise`], by their actor.
    supervised: HashMap<ActorId, Arc<dyn SupervisedChild>>,
}

pub struct RootSupervisor;

/// The children there is exactly one of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Singleton {
    TaskScheduler,
    ReviewScheduler,
    JudgePool,
}

impl Singleton {
    fn name(self) -> &'static str {
        match self {
            Singleton::TaskScheduler => "task scheduler",
            Singleton::ReviewScheduler => "review scheduler",
            Singleton::JudgePool => "judge pool",
        }
    }
}

impl RootSupervisor {
    async fn spawn_space(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        space: &SpaceId,
    ) -> Result<ActorRef<SpaceMsg>, super::SpawnError> {
        if let Some(a) = state.spaces.lock().ok().and_then(|m| m.get(space).cloned()) {
            if super::alive(&a) {
                return Ok(a);
            }
        }
        let sid = space.to_string();
        let exists = state
            .rt
            .store
            .read(move |c| spaces::space_exists(c, &sid))
            .await?;
        if !exists {
            return Err(super::SpawnError::NoSuchSpace(space.to_string()));
        }
        // One of many hosts: the space's actor runs where its lease is.
        if let Some(seat) = &state.rt.cluster {
            match seat.claim(space.as_str()).await? {
                Claim::Held(_) => {}
                Claim::Elsewhere { host, .. } => {
                    // Its holder hears it now rather than at its next look.
                    let s = space.to_string();
                    state
                        .rt
                        .store
                        .write_detached("a wake-up for another host", move |tx| {
                            crate::storage::leases::notify_wake(tx, &s)
                        })
                        .await;
                    return Err(super::SpawnError::LeasedElsewhere {
                        space: space.to_string(),
                        host,
                    });
                }
            }
        }
        let spawned = Actor::spawn_linked(
            None,
            SpaceActor,
            SpaceArgs {
                rt: state.rt.clone(),
                space: space.clone(),
            },
            myself.get_cell(),
        )
        .await;
        let (actor, _) = match spawned {
            Ok(a) => a,
            Err(e) => {
                if let Some(seat) = &state.rt.cluster {
                    if let Some(fence) = seat.forget(space.as_str()) {
                        seat.release(fence).await;
                    }
                }
                return Err(super::SpawnError::Start {
                    space: space.to_string(),
                    reason: e.to_string(),
                });
            }
        };
        state.by_actor.insert(actor.get_id(), space.clone());
        if let Ok(mut m) = state.spaces.lock() {
            m.insert(space.clone(), actor.clone());
        }
        Ok(actor)
    }

    async fn spawn_scheduler(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(directory) = state.directory.clone() else {
            return Ok(());
        };
        let (sched, _) = Actor::spawn_linked(
            None,
            TaskScheduler,
            SchedulerArgs {
                rt: state.rt.clone(),
                spaces: directory,
            },
            myself.get_cell(),
        )
        .await?;
        state.scheduler = Some(sched);
        Ok(())
    }

    async fn spawn_judge_pool(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (pool, _) = Actor::spawn_linked(
            None,
            JudgePool,
            JudgePoolArgs {
                rt: state.rt.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        state.judge_pool_slot.set(Some(pool.clone()));
        state.judge_pool = Some(pool);
        Ok(())
    }

    async fn spawn_review_scheduler(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(directory) = state.directory.clone() else {
            return Ok(());
        };
        let (sched, _) = Actor::spawn_linked(
            None,
            ReviewScheduler,
            ReviewSchedulerArgs {
                ctx: crate::review::scan::ScanContext {
                    rt: state.rt.clone(),
                    spaces: Arc::new(directory),
                    pool: Arc::new(state.judge_pool_slot.clone()),
                },
            },
            myself.get_cell(),
        )
        .await?;
        state.review.set(Some(sched.clone()));
        state.review_scheduler = Some(sched);
        Ok(())
    }

    /// Which singleton child `cell` is, if any.
    fn singleton(state: &SupervisorState, cell: &ActorCell) -> Option<Singleton> {
        let id = Some(cell.get_id());
        if state.scheduler.as_ref().map(|s| s.get_id()) == id {
            Some(Singleton::TaskScheduler)
        } else if state.review_scheduler.as_ref().map(|s| s.get_id()) == id {
            Some(Singleton::ReviewScheduler)
        } else if state.judge_pool.as_ref().map(|s| s.get_id()) == id {
            Some(Singleton::JudgePool)
        } else {
            None
        }
    }

    /// Restarts a failed singleton child within its budget. A failed restart
    /// is logged, never propagated: the supervisor must not die with its child.
    async fn restart_singleton(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        which: Singleton,
        err: &str,
    ) {
        let name = which.name();
        let (ok, n) = Self::within_budget(state, &format!("({name})"));
        tracing::error!(error = %err, restarts = n, "{name} failed");
        if !ok {
            tracing::error!(
                "{name}: restart budget exhausted; it stays down until the host restarts"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50 * n as u64)).await;
        let res = match which {
            Singleton::TaskScheduler => Self::spawn_scheduler(myself, state).await,
            Singleton::ReviewScheduler => Self::spawn_review_scheduler(myself, state).await,
            Singleton::JudgePool => Self::spawn_judge_pool(myself, state).await,
        };
        if let Err(e) = res {
            tracing::error!(error = %e, "could not restart the {name}");
        }
    }

    async fn spawn_supervised(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        child: Arc<dyn SupervisedChild>,
    ) -> Result<(), ActorProcessingErr> {
        let cell = child.spawn(myself.get_cell()).await?;
        state.supervised.insert(cell.get_id(), child);
        Ok(())
    }

    /// Restarts a failed supervised child within its budget; like a
    /// singleton, a failed restart is logged and never propagated.
    async fn restart_supervised(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        child: Arc<dyn SupervisedChild>,
        err: &str,
    ) {
        let name = child.name();
        let (ok, n) = Self::within_budget(state, &format!("({name})"));
        tracing::error!(error = %err, restarts = n, "{name} failed");
        if !ok {
            tracing::error!(
                "{name}: restart budget exhausted; it stays down until the host restarts"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50 * n as u64)).await;
        if let Err(e) = Self::spawn_supervised(myself, state, child).await {
            tracing::error!(error = %e, "could not restart the {name}");
        }
    }

    fn forget(state: &mut SupervisorState, cell: &ActorCell) -> Option<SpaceId> {
        let space = state.by_actor.remove(&cell.get_id())?;
        if let Ok(mut m) = state.spaces.lock() {
            if m.get(&space).map(|a| a.get_id()) == Some(cell.get_id()) {
                m.remove(&space);
            }
        }
        // One of many hosts: a stopped actor's space may run elsewhere now.
        // The fence is taken here, in the supervisor's order, so a release
        // that lands late cannot give up a newer claim of the same space.
        if let Some(seat) = state.rt.cluster.clone() {
            if let Some(fence) = seat.forget(space.as_str()) {
                tokio::spawn(async move { seat.release(fence).await });
            }
        }
        Some(space)
    }

    /// True if `key` may restart now; records the restart.
    fn within_budget(state: &mut SupervisorState, key: &str) -> (bool, usize) {
        let now = Instant::now();
        let list = state.restarts.entry(key.to_owned()).or_default();
        list.retain(|t| now.duration_since(*t) < RESTART_WINDOW);
        list.push(now);
        (list.len() <= RESTART_BUDGET, list.len())
    }
}

impl Actor for RootSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        Ok(SupervisorState {
            rt: args.rt,
            spaces: args.spaces,
            by_actor: HashMap::new(),
            asks: HashMap::new(),
            restarts: HashMap::new(),
            scheduler: None,
            directory: None,
            review_scheduler: None,
            review: args.review,
            judge_pool: None,
            judge_pool_slot: JudgePoolSlot::default(),
            supervised: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        state.directory = Some(SpaceDirectory::new(myself.clone(), state.spaces.clone()));
        let tick = super::space::idle_tick(state.rt.settings.spaces.idle_stop_secs);
        myself.send_interval(tick, || SupervisorMsg::IdleSweep);
        Self::spawn_scheduler(&myself, state).await?;
        Self::spawn_judge_pool(&myself, state).await?;
        Self::spawn_review_scheduler(&myself, state).await
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::SpawnSpace(space, reply) => {
                let res = Self::spawn_space(&myself, state, &space).await;
                let _ = reply.send(res);
            }
            SupervisorMsg::SpawnAsk(args, reply) => {
                let target = args.target.clone();
                let res = Actor::spawn_linked(None, AskSandbox, *args, myself.get_cell())
                    .await
                    .map(|(ask, _)| {
                        state.asks.insert(ask.get_id(), target.clone());
                    })
                    .map_err(|e| super::SpawnError::Start {
                        space: target.to_string(),
                        reason: e.to_string(),
                    });
                let _ = reply.send(res);
            }
            SupervisorMsg::Supervise(child, reply) => {
                let name = child.name();
                let res = Self::spawn_supervised(&myself, state, child)
                    .await
                    .map_err(|source| SuperviseError::Spawn { name, source });
                let _ = reply.send(res);
            }
            SupervisorMsg::IdleSweep => {
                let live: Vec<ActorRef<SpaceMsg>> = match state.spaces.lock() {
                    Ok(m) => m.values().cloned().collect(),
                    Err(_) => Vec::new(),
                };
                for actor in live {
                    // An actor stopping right now has closed its mailbox:
                    // nothing is lost by not reaching it.
                    let _ = actor.cast(SpaceMsg::IdleCheck);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if state.asks.remove(&cell.get_id()).is_some() {
                    // An ask that answered and stopped: nothing to do.
                } else if let Some(child) = state.supervised.remove(&cell.get_id()) {
                    tracing::debug!(reason = ?reason, "{} stopped", child.name());
                } else if let Some(space) = Self::forget(state, &cell) {
                    tracing::debug!(space = %space, reason = ?reason, "space actor stopped");
                    if state.by_actor.is_empty() {
                        // The last space actor is gone (idle stops after a
                        // burst): its memory goes back to the system.
                        state.by_actor.shrink_to_fit();
                        return_freed_memory();
                    }
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some(target) = state.asks.remove(&cell.get_id()) {
                    // Its caller's oneshot is dropped with it: the route answers 500.
                    tracing::error!(target = %target, error = %err, "ask sandbox failed; not restarted");
                } else if let Some(which) = Self::singleton(state, &cell) {
                    Self::restart_singleton(&myself, state, which, &err.to_string()).await;
                } else if let Some(child) = state.supervised.remove(&cell.get_id()) {
                    Self::restart_supervised(&myself, state, child, &err.to_string()).await;
                } else if let Some(space) = Self::forget(state, &cell) {
                    let (ok, n) = Self::within_budget(state, space.as_str());
                    tracing::error!(space = %space, error = %err, restarts = n, "space actor failed");
                    if ok {
                        tokio::time::sleep(Duration::from_millis(50 * n as u64)).await;
                        if let Err(e) = Self::spawn_space(&myself, state, &space).await {
                            tracing::error!(space = %space, error = %e, "could not restart the space actor");
                        }
                    } else {
                        tracing::error!(space = %space, "restart budget exhausted; the space restarts on its next message");
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SupervisorMsg>,
        _state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Otherwise children are killed and skip their own clean-up.
        myself
            .stop_children_and_wait(
                Some("supervisor stopping".into()),
                Some(Duration::from_secs(5)),
            )
            .await;
        Ok(())
    }
}

/// Hands the allocator's free memory back to the system (issue 32: memory
/// returned when the space actors stop). glibc keeps what is freed in its
/// arenas, so a burst of 10,000 space actors left its RSS behind after
/// they all stopped; elsewhere the allocator decides.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases free memory
    // of the allocator's own arenas; it may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
