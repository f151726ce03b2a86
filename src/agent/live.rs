//! A live or task turn from its pending message to its committed reply:
//! the next pending message is taken and its run opened in one write
//! ([`open_next`]), the turn runs ([`super::run_turn`]), and its
//! outcome is written in one transaction (the message settles, the reply and
//! its outbox item appear, the run and the task firing close).
//!
//! Must never: reply twice to one message (the reply is written only if the
//! message is still pending), or commit anything for a turn whose actor died
//! (it is left pending for the successor).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{prompt::PromptInputs, LayerPlan, TurnOutcome, TurnRequest, TurnStatus};
use crate::clock::now_ms;
use crate::config::split_chain;
use crate::ids::{RunId, SpaceId};
use crate::model::Purpose;
use crate::perms::Permission;
use crate::runtime::Runtime;
use crate::sandbox::RunKind;
use crate::storage::messages::{self, Message, NewMessage};
use crate::storage::spaces::{self, KvTable};
use crate::storage::{conversations, outbox, runs, task_runs, tasks, Conn, StoreResult, Tx};

/// The model chain of a space: its own (`space_config.model`) or the default.
pub(crate) fn model_chain(conn: &Conn, rt: &Runtime, space: &str) -> StoreResult<Vec<String>> {
    Ok(
        match spaces::kv_get(conn, KvTable::Config, space, "model")? {
            Some(chain) if !split_chain(&chain).is_empty() => split_chain(&chain),
            _ => rt.settings.model_chain(),
        },
    )
}

/// How often a commit deletes expired run traces, at most.
const PRUNE_EVERY_MS: i64 = 3_600_000;

/// A turn whose run is open: its message and what the opening write read
/// for it.
pub(crate) struct OpenedTurn {
    pub message: Message,
    run_id: RunId,
    kind: RunKind,
    caller: String,
    chain: Vec<String>,
    links_paragraph: bool,
    trigger: spaces::TriggerRule,
    crashed: Vec<String>,
    preread: super::TurnPreread,
    carried: (Vec<crate::storage::attachments::Attachment>, Option<String>),
}

/// Takes the space's next pending message and opens its run, in one write:
/// the run row, and everything the turn reads before its model call (the
/// caller's role, the spend caps, the extensions, the prompt's rows). `None`
/// when nothing is pending. One write instead of a look, a write and the
/// prompt's read: each hand-off off the runtime is a large part of a turn's
/// overhead (docs/benchmarks.md), and the writer's pages are warm.
pub(crate) async fn open_next(
    rt: &Arc<Runtime>,
    space: &SpaceId,
) -> StoreResult<Option<OpenedTurn>> {
    let run_id = RunId::new();
    let (rt2, space_s, run_s) = (rt.clone(), space.to_string(), run_id.to_string());
    let fence = rt.fence(space.as_str());
    let limit = rt.settings.turn.history_limit;
    rt.store
        .write(move |tx| {
            let Some(message) = messages::next_pending(tx, &space_s)? else {
                return Ok(None);
            };
            if let Some(f) = &fence {
                crate::storage::leases::hold(tx, f)?;
            }
            let mid = message.id;
            let kind = if message.task_run_id.is_some() {
                RunKind::Task
            } else {
                RunKind::Live
            };
            let caller_s = message
                .sender_id
                .clone()
                .unwrap_or_else(|| crate::ids::SYSTEM_CALLER.into());
            // Counted before this attempt is: the attempts a crash cut
            // short (each left its run `running`, marked at restart).
            let crashed = runs::crashed_attempts(tx, mid)?;
            runs::start(
                tx,
                &run_s,
                &space_s,
                kind.as_str(),
                Some(&caller_s),
                Some(mid),
            )?;
            if let Some(f) = &fence {
                crate::storage::leases::set_run_host(tx, &run_s, &f.host)?;
            }
            if let Some(task_run) = message.task_run_id {
                tasks::attach_run(tx, task_run, &run_s)?;
            }
            // A mapped platform sender acts as its operator (issue 11), when
            // its message came through an origin mappings hold for (issue 23).
            let acting = match crate::ids::platform_of(&caller_s) {
                Some(_) if crate::storage::messages::identity_trusted(tx, mid)? => {
                    crate::storage::identities::operator_for(tx, &caller_s)?
                        .unwrap_or_else(|| caller_s.clone())
                }
                _ => caller_s.clone(),
            };
            let global = rt2.settings.is_global_admin(&acting);
            let role = crate::perms::resolve_role(tx, &space_s, &acting, global)?;
            let links_paragraph = crate::perms::role_permissions(tx, &space_s, &role)?
                .contains(&Permission::LinksAct);
            // The same rule ingress applied to let the message in.
            let trigger = spaces::trigger_rule(tx, &rt2.settings.trigger, &space_s)?;
            // Read here, the turn need not read them again: the spend
            // seam need not reserve when no cap covers the turn, and a
            // space without extensions costs no further read.
            // A global admin in a direct conversation reads why a turn
            // failed; in a group the others would read it too.
            let reason_to_caller = global
                && match message.conversation_id {
                    Some(c) => conversations::get(tx, c)?.is_some_and(|c| c.kind == "dm"),
                    None => false,
                };
            let preread = super::TurnPreread {
                reason_to_caller,
                space_budget: crate::storage::spend::space_caps(tx, &space_s)?,
                extensions: std::sync::Mutex::new(Some(crate::extensions::TurnExtensions::read(
                    tx, &space_s, &role,
                )?)),
                web_fetch: super::web_fetch_set(tx, &space_s)?,
                prompt_rows: std::sync::Mutex::new(Some(super::prompt::PromptRows::read(
                    tx, &space_s, mid, limit,
                )?)),
                role,
            };
            // What the message carried, and the platform that fetches it.
            let attached = crate::storage::attachments::of_message(tx, mid)?;
            let platform = match (attached.is_empty(), message.conversation_id) {
                (false, Some(c)) => conversations::get(tx, c)?.map(|c| c.platform),
                _ => None,
            };
            Ok(Some(OpenedTurn {
                chain: model_chain(tx, &rt2, &space_s)?,
                message,
                run_id,
                kind,
                caller: caller_s,
                links_paragraph,
                trigger,
                crashed,
                preread,
                carried: (attached, platform),
            }))
        })
        .await
}

/// Runs the turn [`open_next`] opened and commits it.
pub(crate) async fn run_opened(
    rt: &Arc<Runtime>,
    space: &SpaceId,
    opened: OpenedTurn,
    cancel: CancellationToken,
    stop_requested: Arc<AtomicBool>,
) {
    let OpenedTurn {
        message,
        run_id,
        kind,
        caller,
        chain,
        links_paragraph,
        trigger,
        crashed,
        preread,
        carried,
    } = opened;
    let max_crashes = rt.settings.turn.max_crash_retries as usize;
    if crashed.len() >= max_crashes {
        // This message's turn took the host down every time it ran: answer
        // it with the failure reply instead of running it into a crash again.
        let reason = format!(
            "the turn of this message was interrupted by a host crash {} times \
             (turn.max_crash_retries = {max_crashes}); it is not run again (interrupted runs: {})",
            crashed.len(),
            crashed.join(", ")
        );
        tracing::error!(space = %space, message = message.id, run_id = %run_id,
            interrupted_runs = %crashed.join(","), "a message that crashed the host is answered with the failure reply");
        let outcome = TurnOutcome {
            status: TurnStatus::Failed,
            reply: Some(rt.settings.turn.failure_reply.clone()),
            error: Some(reason),
            tokens_in: 0,
            tokens_out: 0,
            cost: 0.0,
            steps: Vec::new(),
            discarded: Default::default(),
            files_out: Vec::new(),
        };
        if let Err(e) = commit(rt, &message, &run_id, outcome).await {
            tracing::error!(space = %space, message = message.id, error = %e, "cannot fail a crash-looping message");
        }
        return;
    }
    let workspace = rt.paths.workspace(space);
    let received = super::attachments::take_in(rt, &message, carried).await;
    let mut user_text =
        super::prompt::strip_trigger(&message.text, &trigger.patterns, trigger.case_sensitive)
            .to_owned();
    for line in &received.lines {
        user_text.push('\n');
        user_text.push_str(line);
    }
    let req = TurnRequest {
        space_id: space.clone(),
        run_id: run_id.clone(),
        kind,
        caller_id: caller,
        // The model reads the request, not the word that addressed it, and
        // a line about each attachment.
        user_text,
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
        preread: Some(preread),
        layer: LayerPlan::MergeOnSuccess,
        stream: None,
        images: received.images,
    };
    let preview = super::preview::ReplyPreview::start(rt, &message).await;
    let req = TurnRequest {
        stream: preview.as_ref().map(|p| super::StreamTo(p.sink())),
        ..req
    };
    let outcome = super::run_turn(rt, req, cancel).await;
    // Before the commit: its reply is delivered as the preview's last edit.
    if let Some(preview) = preview {
        preview.finish().await;
    }
    if outcome.status == TurnStatus::Stopped && !stop_requested.load(Ordering::SeqCst) {
        // The actor died under the turn: leave the message pending for the
        // restarted actor and only close the run.
        let run_s = run_id.to_string();
        let steps = outcome.steps;
        let fence = rt.fence(space.as_str());
        let closed = rt
            .store
            .write(move |tx| {
                if let Some(f) = &fence {
                    // Taken over: the new holder closed this run already.
                    crate::storage::leases::hold(tx, f)?;
                }
                runs::record_steps(tx, &run_s, &steps)?;
                runs::finish(
                    tx,
                    &run_s,
                    "interrupted",
                    Some("space actor stopped during the turn"),
                )
            })
            .await;
        if let Err(e) = closed {
            // The run stays `running` until a restart marks it; the
            // message is still pending either way.
            tracing::error!(space = %space, run_id = %run_id, error = %e, "cannot close the run its actor abandoned");
        }
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
    let keep_ms = i64::from(rt.settings.runs.keep_days) * 86_400_000;
    // Expired traces are deleted by the first commit after start and then
    // at most once an hour, not by every turn's write.
    let now = now_ms();
    let prune = rt
        .steps_pruned_at
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            (now - last >= PRUNE_EVERY_MS).then_some(now)
        })
        .is_ok();
    let outbound = rt.outbound.clone();
    let fence = rt.fence(&message.space_id);
    rt.store
        .write(move |tx| {
            // Only the space's lease holder commits (a host that lost it
            // while paused commits nothing; the holder answers the message).
            if let Some(f) = &fence {
                crate::storage::leases::hold(tx, f)?;
            }
            // The trace is kept whatever became of the reply; old traces go
            // (`runs.keep_days`) in the same write, an indexed delete.
            runs::record_steps(tx, &run_id, &outcome.steps)?;
            if prune {
                runs::prune_steps(tx, now - keep_ms)?;
            }
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
                    // Marks a failed turn's reply (the failure or capped
                    // sentence), which the prompt history leaves out.
                    status: (outcome.status == TurnStatus::Failed).then_some("failed"),
                    ..Default::default()
                },
            )?;
            deliver(tx, &outbound, &message, reply_id, reply, &outcome.files_out)?;
            Ok(())
        })
        .await
}

/// Queues a reply for its platform: the message's own conversation, or for a
/// non-silent task the space's most recently active conversation. Console
/// conversations are answered in the HTTP response instead. In shadow mode
/// the send is a transcript line ([`crate::runtime::Outbound`]).
fn deliver(
    tx: &Tx<'_>,
    outbound: &crate::runtime::Outbound,
    message: &Message,
    reply_id: Option<i64>,
    text: &str,
    files: &[String],
) -> StoreResult<()> {
    let conversation = match (message.conversation_id, message.task_run_id) {
        (Some(c), _) => conversations::get(tx, c)?,
        (None, Some(task_run)) => {
            // A firing that cannot be read is treated as silent: nothing
            // is sent where it was perhaps not wanted.
            let silent = task_runs::task_is_silent(tx, task_run)
                .ok()
                .flatten()
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
        let queued = outbound.enqueue(
            tx,
            &crate::runtime::OutboundSend {
                space: &message.space_id,
                conversation_id: Some(c.id),
                platform: &c.platform,
                external_id: &c.external_id,
                message_id: reply_id,
                text,
                source: "reply",
            },
        )?;
        // The files the turn wrote under outbox/ go with the reply.
        if let Some(id) = queued {
            outbox::attach_files(tx, id, files)?;
        }
    }
    Ok(())
}
