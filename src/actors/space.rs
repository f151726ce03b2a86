//! `SpaceActor`: the one writer of a space. It runs the space's turns one at
//! a time, in message order, applies API writes in order, and answers control
//! actions (stop, compact, clear).
//!
//! The durable queue is the `messages` table (`status = 'pending'`); the actor
//! only holds the turn in flight. A turn runs in its own task so the mailbox
//! stays responsive (a `stop` must reach a running turn).
//!
//! Must never: reply twice to one message (the reply is written only if the
//! message is still pending, in the same transaction), or commit anything for
//! a turn whose actor died (the turn is abandoned and re-run by the successor).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{json, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::agent::{self, prompt::PromptInputs, TurnOutcome, TurnRequest, TurnStatus};
use crate::clock::now_ms;
use crate::config::split_chain;
use crate::ids::{RunId, SpaceId};
use crate::model::{ChatMessage, Purpose, Role};
use crate::runtime::Runtime;
use crate::sandbox::RunKind;
use crate::storage::messages::{self, Message, NewMessage};
use crate::storage::spaces::{self, KvTable};
use crate::storage::{conversations, outbox, runs, tasks, StoreError, StoreResult};
use crate::workspace::layer::{LayerBudget, TurnLayer};

pub type SpaceWrite =
    Box<dyn FnOnce(&rusqlite::Transaction<'_>) -> Result<Value, StoreError> + Send>;

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
    Control(
        ControlAction,
        RpcReplyPort<Result<Value, super::ControlError>>,
    ),
    /// Copy the workspace into `dest` between two turns (never during one) and
    /// answer with the id below which history belongs to the copy (`ask`).
    /// An ask's view of the workspace (a throwaway layer named by the
    /// string), laid between two turns.
    Snapshot(String, RpcReplyPort<Result<AskView, String>>),
    /// Periodic: stop the actor when it has been idle long enough.
    IdleCheck,
    /// Test hook: make the handler panic, to exercise supervision.
    #[cfg(feature = "test-hooks")]
    InjectPanic,
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
    waiting_snapshots: Vec<(String, RpcReplyPort<Result<AskView, String>>)>,
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
        let idle = Duration::from_secs(args.rt.settings.spaces.idle_stop_secs);
        let tick = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
        myself.send_interval(tick, || SpaceMsg::IdleCheck);
        // Pick up whatever was pending before this actor (re)started.
        let _ = myself.cast(SpaceMsg::Wake);
        Ok(SpaceState {
            rt: args.rt,
            space: args.space,
            running: None,
            last_activity: Instant::now(),
            waiting_snapshots: Vec::new(),
        })
    }

    async fn handle(
        &self,
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
                for (dest, reply) in std::mem::take(&mut state.waiting_snapshots) {
                    let _ = reply.send(snapshot(state, dest).await);
                }
                start_next_turn(&myself, state).await;
            }
            SpaceMsg::Apply(write, reply) => {
                state.last_activity = Instant::now();
                let res = state.rt.store.write(move |tx| write(tx)).await;
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
            SpaceMsg::IdleCheck => {
                let idle = Duration::from_secs(state.rt.settings.spaces.idle_stop_secs);
                if state.running.is_none() && state.last_activity.elapsed() >= idle {
                    let space = state.space.to_string();
                    let pending = state
                        .rt
                        .store
                        .read(move |c| messages::pending(c, &space))
                        .await;
                    if matches!(pending, Ok(ref p) if p.is_empty()) {
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
async fn snapshot(state: &SpaceState, name: String) -> Result<AskView, String> {
    let rt = &state.rt;
    let space = state.space.to_string();
    let history_before = rt
        .store
        .read(move |c| messages::max_id(c, &space))
        .await
        .map_err(|e| e.to_string())?
        + 1;
    let live = rt.paths.workspace(&state.space);
    rt.sandbox
        .prepare_workspace(&live)
        .await
        .map_err(|e| e.to_string())?;
    let scratch = rt.paths.scratch();
    let budget = LayerBudget::Throwaway {
        quota_mb: rt.settings.sandbox.workspace_mb,
    };
    let layer =
        tokio::task::spawn_blocking(move || TurnLayer::mount(&live, &scratch, &name, budget))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    Ok(AskView {
        history_before,
        layer,
    })
}

async fn start_next_turn(myself: &ActorRef<SpaceMsg>, state: &mut SpaceState) {
    if state.running.is_some() {
        return;
    }
    let space = state.space.to_string();
    let next = match state
        .rt
        .store
        .read(move |c| messages::pending(c, &space))
        .await
    {
        Ok(p) => p.into_iter().next(),
        Err(e) => {
            tracing::error!(space = %state.space, error = %e, "cannot read pending messages");
            return;
        }
    };
    let Some(message) = next else { return };
    let cancel = CancellationToken::new();
    let stop_requested = Arc::new(AtomicBool::new(false));
    state.running = Some(RunningTurn {
        message_id: message.id,
        cancel: cancel.clone(),
        stop_requested: stop_requested.clone(),
        _abandon_on_drop: cancel.clone().drop_guard(),
    });
    let rt = state.rt.clone();
    let space = state.space.clone();
    let me = myself.clone();
    tokio::spawn(async move {
        let message_id = message.id;
        run_and_commit(&rt, &space, message, cancel, stop_requested).await;
        rt.waiters.notify(message_id);
        let _ = me.cast(SpaceMsg::TurnEnded { message_id });
    });
}

/// The model chain of a space: its own (`space_config.model`) or the default.
pub fn model_chain(
    conn: &rusqlite::Connection,
    rt: &Runtime,
    space: &str,
) -> StoreResult<Vec<String>> {
    Ok(
        match spaces::kv_get(conn, KvTable::Config, space, "model")? {
            Some(chain) if !split_chain(&chain).is_empty() => split_chain(&chain),
            _ => rt.settings.model_chain(),
        },
    )
}

async fn run_and_commit(
    rt: &Arc<Runtime>,
    space: &SpaceId,
    message: Message,
    cancel: CancellationToken,
    stop_requested: Arc<AtomicBool>,
) {
    let run_id = RunId::new();
    let kind = if message.task_run_id.is_some() {
        RunKind::Task
    } else {
        RunKind::Live
    };
    let caller = message
        .sender_id
        .clone()
        .unwrap_or_else(|| crate::ids::SYSTEM_CALLER.into());
    let prep = {
        let (rt2, space_s, run_s, caller_s, mid) = (
            rt.clone(),
            space.to_string(),
            run_id.to_string(),
            caller.clone(),
            message.id,
        );
        let task_run = message.task_run_id;
        rt.store
            .write(move |tx| {
                runs::start(
                    tx,
                    &run_s,
                    &space_s,
                    kind.as_str(),
                    Some(&caller_s),
                    Some(mid),
                )?;
                if let Some(task_run) = task_run {
                    tasks::attach_run(tx, task_run, &run_s)?;
                }
                // A mapped platform sender acts as its operator (issue 11).
                let acting = match crate::ids::platform_of(&caller_s) {
                    Some(_) => crate::storage::identities::operator_for(tx, &caller_s)?
                        .unwrap_or_else(|| caller_s.clone()),
                    None => caller_s.clone(),
                };
                let global = rt2.settings.is_global_admin(&acting);
                let role = crate::perms::resolve_role(tx, &space_s, &acting, global)?;
                let links_act =
                    crate::perms::role_permissions(tx, &space_s, &role)?.contains("links.act");
                Ok((model_chain(tx, &rt2, &space_s)?, links_act))
            })
            .await
    };
    let (chain, links_paragraph) = match prep {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(space = %space, error = %e, "cannot start a run");
            return;
        }
    };
    let workspace = rt.paths.workspace(space);
    let req = TurnRequest {
        space_id: space.to_string(),
        run_id: run_id.clone(),
        kind,
        caller_id: caller,
        trigger_message_id: Some(message.id),
        user_text: message.text.clone(),
        workspace: workspace.clone(),
        prompt: PromptInputs {
            space_id: space.to_string(),
            files_dir: workspace,
            history_before: Some(message.id),
            links_paragraph,
        },
        purpose: Purpose::Turn,
        model_chain: chain,
        token_role: None,
        layer: agent::LayerPlan::MergeOnSuccess,
    };
    let outcome = agent::run_turn(rt, req, cancel).await;
    if outcome.status == TurnStatus::Stopped && !stop_requested.load(Ordering::SeqCst) {
        // The actor died under the turn: leave the message pending for the
        // restarted actor and only close the run.
        let run_s = run_id.to_string();
        let _ = rt
            .store
            .write(move |tx| {
                runs::finish(
                    tx,
                    &run_s,
                    "interrupted",
                    Some("space actor stopped during the turn"),
                )
            })
            .await;
        return;
    }
    if let Err(e) = commit(rt, &message, &run_id, outcome).await {
        tracing::error!(space = %space, message = message.id, error = %e, "cannot commit the turn");
    }
}

/// Writes the outcome of a live or task turn in one transaction: the user
/// message settles, the reply row and its outbox item appear, the run and the
/// task firing close.
async fn commit(
    rt: &Arc<Runtime>,
    message: &Message,
    run_id: &RunId,
    outcome: TurnOutcome,
) -> StoreResult<()> {
    let message = message.clone();
    let run_id = run_id.to_string();
    rt.store
        .write(move |tx| {
            let status = outcome.status.as_str();
            if !messages::settle(tx, message.id, status, &run_id)? {
                runs::finish(
                    tx,
                    &run_id,
                    "superseded",
                    Some("the message was answered by another run"),
                )?;
                return Ok(());
            }
            runs::finish(tx, &run_id, status, outcome.error.as_deref())?;
            if let Some(task_run) = message.task_run_id {
                tasks::finish_run(tx, task_run, status, outcome.error.as_deref())?;
            }
            let Some(reply) = outcome.reply.as_deref() else {
                return Ok(());
            };
            let reply_id = messages::insert(
                tx,
                &NewMessage {
                    space_id: &message.space_id,
                    conversation_id: message.conversation_id,
                    sender_id: Some("mercury"),
                    sender_name: Some("Mercury"),
                    role: "assistant",
                    text: reply,
                    created_at: now_ms(),
                    run_id: Some(&run_id),
                    reply_to: Some(message.id),
                    ..Default::default()
                },
            )?;
            deliver(tx, &message, reply_id, reply)?;
            Ok(())
        })
        .await
}

/// Queues a reply for its platform: the message's own conversation, or for a
/// non-silent task the space's most recently active conversation. Console
/// conversations are answered in the HTTP response instead.
fn deliver(
    tx: &rusqlite::Transaction<'_>,
    message: &Message,
    reply_id: Option<i64>,
    text: &str,
) -> StoreResult<()> {
    let conversation = match (message.conversation_id, message.task_run_id) {
        (Some(c), _) => conversations::get(tx, c)?,
        (None, Some(task_run)) => {
            let silent: bool = tx
                .query_row(
                    "SELECT t.silent FROM tasks t JOIN task_runs r ON r.task_id = t.id WHERE r.id = ?1",
                    [task_run],
                    |r| r.get(0),
                )
                .unwrap_or(true);
            if silent {
                None
            } else {
                conversations::list(tx, Some(&message.space_id))?
                    .into_iter()
                    .find(|c| c.platform != "console")
            }
        }
        (None, None) => None,
    };
    if let Some(c) = conversation.filter(|c| c.platform != "console") {
        outbox::enqueue(
            tx,
            &message.space_id,
            Some(c.id),
            &c.platform,
            &c.external_id,
            reply_id,
            text,
        )?;
    }
    Ok(())
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
        ControlAction::Compact => compact(state).await,
    }
}

/// Summarises the history above the boundary through the model, then moves
/// the boundary so later turns see the summary instead of the old messages.
async fn compact(state: &mut SpaceState) -> Result<Value, super::ControlError> {
    let rt = state.rt.clone();
    let space = state.space.to_string();
    let limit = rt.settings.turn.history_limit.max(100);
    let (history, prev_summary, chain, boundary) = {
        let (rt2, space) = (rt.clone(), space.clone());
        rt.store
            .read(move |c| {
                let (b, summary) = spaces::session_boundary(c, &space)?;
                let h = messages::history(c, &space, b, i64::MAX, limit)?;
                let chain = model_chain(c, &rt2, &space)?;
                let max = messages::max_id(c, &space)?;
                Ok((h, summary, chain, max))
            })
            .await?
    };
    if history.is_empty() {
        return Ok(
            json!({"compacted": false, "boundary": boundary, "summary": null, "reason": "nothing to compact"}),
        );
    }
    let mut transcript = String::new();
    if let Some(s) = prev_summary {
        transcript.push_str(&format!("Earlier summary: {s}\n"));
    }
    for m in &history {
        transcript.push_str(&format!("{}: {}\n", m.role, m.text));
    }
    let messages = vec![
        ChatMessage::text(
            Role::System,
            "Summarise this conversation for your own later use: facts, decisions, open questions. Plain text, short.",
        ),
        ChatMessage::text(Role::User, transcript),
    ];
    let answer = agent::complete_with_chain(&rt, &chain, Purpose::Compact, &messages, &[])
        .await
        .map_err(super::ControlError::Model)?;
    let (space2, spec, summary, usage, cost) = (
        space.clone(),
        answer.spec,
        answer.response.text.clone(),
        answer.response.usage,
        answer.cost,
    );
    rt.store
        .write(move |tx| {
            spaces::set_session_boundary(tx, &space2, boundary, Some(&summary))?;
            runs::record_usage(
                tx,
                &runs::UsageRow {
                    run_id: None,
                    space_id: &space2,
                    model: &spec,
                    kind: "compact",
                    tokens_in: usage.input_tokens,
                    tokens_out: usage.output_tokens,
                    cost,
                },
            )
        })
        .await?;
    Ok(json!({"compacted": true, "boundary": boundary, "summary": answer.response.text}))
}
