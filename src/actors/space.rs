//! `SpaceActor`: the one writer of a space. It runs the space's turns one at
//! a time, in message order, applies API writes in order, and answers control
//! actions (stop, compact, clear).
//!
//! The durable queue is the `messages` table (`status = 'pending'`); the actor
//! only holds the turn in flight. A turn runs in its own task so the mailbox
//! stays responsive (a `stop` must reach a running turn).
//!
//! This file holds the actor's protocol, state and lifecycle; what a turn
//! does and how it is committed is `agent::live`, compaction `agent::compact`.
//!
//! Must never: run two turns of a space at once, or let a turn outlive its
//! actor unnoticed (a `DropGuard` cancels it; the successor re-runs the
//! message, which is still pending).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{json, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::agent;
use crate::ids::SpaceId;
use crate::runtime::Runtime;
use crate::storage::messages;
use crate::storage::spaces;
use crate::storage::StoreError;
use crate::workspace::layer::{LayerBudget, TurnLayer};

pub use crate::storage::SpaceWrite;

/// A write of workspace files (the files API), given the live workspace's
/// path. Blocking: the actor runs it off the async runtime, between two
/// turns (a turn's overlay must not see its lower change under it).
pub type WorkspaceJob = Box<dyn FnOnce(&std::path::Path) + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlAction {
    Stop,
    Compact,
    Clear,
}

pub enum SpaceMsg {
    /// There may be pending messages: start the next turn if idle.
    Wake,
    /// The turn for this message has ended (committed or abandoned).
    TurnEnded { message_id: i64 },
    /// A write from the API, applied in this space's order.
    Apply(SpaceWrite, RpcReplyPort<Result<Value, StoreError>>),
    /// A control action (stop, clear, compact) for the space.
    Control(
        ControlAction,
        RpcReplyPort<Result<Value, super::ControlError>>,
    ),
    /// Lay an ask's view of the workspace (a throwaway layer named by the
    /// string) between two turns, never during one; the answer carries the
    /// id below which history belongs to the view.
    Snapshot(String, RpcReplyPort<Result<AskView, SnapshotError>>),
    /// A workspace file write, run while no turn runs (queued behind a
    /// running turn). The job carries its own answer channel.
    Workspace(WorkspaceJob),
    /// Periodic (the supervisor's sweep, [`idle_tick`]): stop the actor
    /// when it has been idle long enough.
    IdleCheck,
    /// Test hook: make the handler panic, to exercise supervision.
    #[cfg(feature = "test-hooks")]
    InjectPanic,
}

/// How often the supervisor asks every live space actor whether it has
/// been idle for `spaces.idle_stop_secs`: a quarter of it, within bounds.
/// One sweep for all actors rather than a timer task of each (about half a
/// kilobyte of every live actor).
pub fn idle_tick(idle_stop_secs: u64) -> Duration {
    (Duration::from_secs(idle_stop_secs) / 4)
        .clamp(Duration::from_millis(250), Duration::from_secs(30))
}

pub struct SpaceArgs {
    pub rt: Arc<Runtime>,
    pub space: SpaceId,
}

struct RunningTurn {
    message_id: i64,
    cancel: CancellationToken,
    /// Set before `cancel` when an operator stopped the turn; a cancel
    /// without it means the actor died and the turn must not commit.
    stop_requested: Arc<AtomicBool>,
    /// Cancels the turn if this state is dropped (the actor failed or stopped).
    _abandon_on_drop: DropGuard,
}

pub struct SpaceState {
    rt: Arc<Runtime>,
    space: SpaceId,
    running: Option<RunningTurn>,
    last_activity: Instant,
    /// Snapshots asked for while a turn ran; served before the next turn starts.
    waiting_snapshots: Vec<(String, RpcReplyPort<Result<AskView, SnapshotError>>)>,
    /// Workspace writes asked for while a turn ran; run before the next turn.
    waiting_files: Vec<WorkspaceJob>,
}

pub struct SpaceActor;

impl Actor for SpaceActor {
    type Msg = SpaceMsg;
    type State = SpaceState;
    type Arguments = SpaceArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SpaceMsg>,
        args: SpaceArgs,
    ) -> Result<SpaceState, ActorProcessingErr> {
        // Pick up whatever was pending before this actor (re)started.
        let _ = myself.cast(SpaceMsg::Wake);
        Ok(SpaceState {
            rt: args.rt,
            space: args.space,
            running: None,
            last_activity: Instant::now(),
            waiting_snapshots: Vec::new(),
            waiting_files: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SpaceMsg>,
        msg: SpaceMsg,
        state: &mut SpaceState,
    ) -> Result<(), ActorProcessingErr> {
        // Boxed per message: ractor keeps each actor's message loop future
        // for the actor's whole life, and with this handler's future inline
        // (every branch's awaits) it was some 4.5 KB of every idle space
        // actor (heaptrack, 10,000 actors alive); boxed, the loop holds a
        // pointer and the handler's state exists only while it runs.
        Box::pin(handle_message(myself, msg, state)).await
    }
}

async fn handle_message(
    myself: ActorRef<SpaceMsg>,
    msg: SpaceMsg,
    state: &mut SpaceState,
) -> Result<(), ActorProcessingErr> {
    match msg {
        SpaceMsg::Wake => {
            state.last_activity = Instant::now();
            start_next_turn(&myself, state).await;
        }
        SpaceMsg::TurnEnded { message_id } => {
            state.last_activity = Instant::now();
            if state.running.as_ref().map(|r| r.message_id) == Some(message_id) {
                state.running = None;
            }
            for job in std::mem::take(&mut state.waiting_files) {
                run_workspace_job(state, job).await;
            }
            for (dest, reply) in std::mem::take(&mut state.waiting_snapshots) {
                let _ = reply.send(snapshot(state, dest).await);
            }
            start_next_turn(&myself, state).await;
        }
        SpaceMsg::Apply(write, reply) => {
            state.last_activity = Instant::now();
            // One of many hosts: the space's writes commit only while
            // this host holds its lease.
            let fence = state.rt.fence(state.space.as_str());
            let res = state
                .rt
                .store
                .write(move |tx| {
                    if let Some(f) = &fence {
                        crate::storage::leases::hold(tx, f)?;
                    }
                    write(tx)
                })
                .await;
            let _ = reply.send(res);
        }
        SpaceMsg::Control(action, reply) => {
            state.last_activity = Instant::now();
            let res = control(state, action).await;
            let _ = reply.send(res);
        }
        SpaceMsg::Snapshot(dest, reply) => {
            state.last_activity = Instant::now();
            if state.running.is_some() {
                state.waiting_snapshots.push((dest, reply));
            } else {
                let _ = reply.send(snapshot(state, dest).await);
            }
        }
        SpaceMsg::Workspace(job) => {
            state.last_activity = Instant::now();
            if state.running.is_some() {
                state.waiting_files.push(job);
            } else {
                run_workspace_job(state, job).await;
            }
        }
        SpaceMsg::IdleCheck => {
            let idle = Duration::from_secs(state.rt.settings.spaces.idle_stop_secs);
            if state.running.is_none() && state.last_activity.elapsed() >= idle {
                let space = state.space.to_string();
                let next = state
                    .rt
                    .store
                    .read(move |c| messages::next_pending(c, &space))
                    .await;
                if matches!(next, Ok(None)) {
                    myself.stop(Some("idle".into()));
                }
            }
        }
        #[cfg(feature = "test-hooks")]
        SpaceMsg::InjectPanic => {
            panic!("test hook: injected panic in space {}", state.space);
        }
    }
    Ok(())
}

/// What an ask works on: a layer over the workspace laid while no turn
/// runs, and the history id it is consistent with.
#[derive(Debug)]
pub struct AskView {
    pub history_before: i64,
    pub layer: TurnLayer,
}

/// Lays a throwaway layer over the workspace while no turn runs; the actor
/// starts no turn until it is mounted, so the view matches the history id.
/// Why an ask's view could not be laid (host paths inside: logged, not sent).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error(transparent)]
    Layer(#[from] crate::workspace::layer::LayerError),
    #[error("the mount task failed: {0}")]
    Task(String),
}

async fn snapshot(state: &SpaceState, name: String) -> Result<AskView, SnapshotError> {
    let rt = &state.rt;
    let space = state.space.to_string();
    let history_before = rt.store.read(move |c| messages::max_id(c, &space)).await? + 1;
    let live = rt.paths.workspace(&state.space);
    rt.sandbox.prepare_workspace(&live).await?;
    let scratch = rt.paths.scratch();
    let budget = LayerBudget::Throwaway {
        quota_mb: rt.settings.sandbox.workspace_mb,
        limits: (&rt.settings.workspace).into(),
    };
    let layer =
        tokio::task::spawn_blocking(move || TurnLayer::mount(&live, &scratch, &name, budget))
            .await
            .map_err(|e| SnapshotError::Task(e.to_string()))??;
    Ok(AskView {
        history_before,
        layer,
    })
}

/// Runs one workspace write to its end before the actor handles anything
/// else (so no turn starts while it writes).
async fn run_workspace_job(state: &SpaceState, job: WorkspaceJob) {
    let live = state.rt.paths.workspace(&state.space);
    if let Err(e) = tokio::task::spawn_blocking(move || job(&live)).await {
        tracing::error!(space = %state.space, error = %e, "a workspace write panicked");
    }
}

async fn start_next_turn(myself: &ActorRef<SpaceMsg>, state: &mut SpaceState) {
    if state.running.is_some() {
        return;
    }
    // The look for the next message and the opening of its run are one
    // write (`agent::live::open_next`).
    let opened = match agent::live::open_next(&state.rt, &state.space).await {
        Ok(Some(opened)) => opened,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(space = %state.space, error = %e, "cannot start the next turn");
            return;
        }
    };
    let message_id = opened.message.id;
    let cancel = CancellationToken::new();
    let stop_requested = Arc::new(AtomicBool::new(false));
    state.running = Some(RunningTurn {
        message_id,
        cancel: cancel.clone(),
        stop_requested: stop_requested.clone(),
        _abandon_on_drop: cancel.clone().drop_guard(),
    });
    let rt = state.rt.clone();
    let space = state.space.clone();
    let me = myself.clone();
    tokio::spawn(async move {
        agent::live::run_opened(&rt, &space, opened, cancel, stop_requested).await;
        rt.waiters.notify(message_id);
        let _ = me.cast(SpaceMsg::TurnEnded { message_id });
    });
}

async fn control(
    state: &mut SpaceState,
    action: ControlAction,
) -> Result<Value, super::ControlError> {
    let space = state.space.to_string();
    match action {
        ControlAction::Stop => {
            let running = state.running.as_ref().map(|r| {
                r.stop_requested.store(true, Ordering::SeqCst);
                r.cancel.cancel();
                r.message_id
            });
            let stopped = running.is_some();
            let dropped = state
                .rt
                .store
                .write(move |tx| messages::drop_pending(tx, &space, running))
                .await?;
            for id in &dropped {
                state.rt.waiters.notify(*id);
            }
            Ok(json!({"stopped": stopped, "dropped": dropped.len()}))
        }
        ControlAction::Clear => {
            let boundary = state
                .rt
                .store
                .write(move |tx| {
                    let b = messages::max_id(tx, &space)?;
                    spaces::set_session_boundary(tx, &space, b, None)?;
                    Ok(b)
                })
                .await?;
            Ok(json!({"cleared": true, "boundary": boundary}))
        }
        ControlAction::Compact => {
            Ok(agent::compact::compact(&state.rt, state.space.as_str()).await?)
        }
    }
}
