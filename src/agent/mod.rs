//! The agent turn, host side: prompt assembly, the model/tool loop, usage
//! accounting, and the sandbox session the tools run in.
//!
//! Owns one turn from "a user message needs an answer" to "here is the reply
//! (or the reason there is none)". It does not decide what happens to the
//! reply: the caller (a space actor, an ask sandbox) commits it.
//!
//! A turn's tools work on a layer over the workspace (see
//! [`crate::workspace::layer`]): laid at the first tool call, merged into the
//! workspace only when the turn succeeds within the quota, thrown away
//! otherwise. File tools run on the host through the safe-path function;
//! `shell` and `mrctl` run in the sandbox.
//!
//! Must never: start a container for a turn that calls no tool, leave a
//! container, a layer or a live run token behind when it ends (success,
//! failure, timeout or cancellation), merge a layer while its sandbox still
//! runs, or put a host credential in the sandbox env.

mod attachments;
pub(crate) mod compact;
pub(crate) mod live;
mod preview;
pub(crate) mod prompt;
pub(crate) mod tools;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::extensions::{
    ExtTool, HookAnswer, HookPoint, Mode as ExtMode, Transport, TurnExtensions,
};
use crate::ids::{RunId, SpaceId};
use crate::model::{ChatMessage, ModelRequest, ModelResponse, Purpose, Role};
use crate::runtime::Runtime;
use crate::sandbox::{
    ApiEndpoint, RunKind, SandboxError, SandboxLimits, SandboxSession, SandboxSpec, WorkspaceMount,
};
use crate::storage::{runs, tokens};
use crate::workspace::layer::{LayerBudget, LayerError, TurnLayer};

/// What a turn is asked to do.
/// What happens to the layer a turn's tools write in.
#[derive(Debug)]
pub(crate) enum LayerPlan {
    /// A live or task turn: a layer is laid over `workspace` at the first
    /// tool call and merged into it if the turn succeeds.
    MergeOnSuccess,
    /// An ask: the view (`workspace` is its merged directory) is already
    /// laid; it is thrown away when the turn ends.
    Throwaway(TurnLayer),
}

/// What a live or task turn's opening transaction read with the run's
/// start, so the turn does not read it again (one round trip each).
#[derive(Debug)]
pub(crate) struct TurnPreread {
    /// The role the turn acts with: the mapped operator's for a mapped
    /// sender, as the run's links paragraph is decided.
    pub role: String,
    /// The caller is a global admin in a direct conversation: a failed
    /// turn's reply says why, and where its trace is.
    pub reason_to_caller: bool,
    /// The space's own spend caps (`None`: it has none of its own).
    pub space_budget: Option<crate::storage::spend::SpaceBudget>,
    /// The enabled extensions, taken once by the turn.
    pub extensions: std::sync::Mutex<Option<crate::extensions::EnabledRead>>,
    /// The space turned `web_fetch` on.
    pub web_fetch: bool,
    /// The prompt's rows, taken once by the turn.
    pub prompt_rows: std::sync::Mutex<Option<prompt::PromptRows>>,
}

#[derive(Debug)]
pub(crate) struct TurnRequest {
    pub space_id: SpaceId,
    pub run_id: RunId,
    pub kind: RunKind,
    /// The caller whose role the run token carries (the triggering user, or
    /// the task's creator).
    pub caller_id: String,
    /// The message being answered (the history before it is read from the store).
    pub user_text: String,
    /// Where tools run (the live workspace, or a throwaway copy).
    pub workspace: PathBuf,
    /// Prompt inputs are read from here (always the space's own files).
    pub prompt: prompt::PromptInputs,
    pub purpose: Purpose,
    /// Model chain to try, in order.
    pub model_chain: Vec<String>,
    /// A fixed role for the run token (ask turns); `None`: the caller's own role.
    pub token_role: Option<String>,
    /// What the run's opening transaction already read (`None`: nothing;
    /// the turn reads it itself).
    pub preread: Option<TurnPreread>,
    pub layer: LayerPlan,
    /// Shown the answer while each model call writes it (a live reply's
    /// preview); `None`: the answer is taken whole.
    pub stream: Option<StreamTo>,
    /// The pictures that came with the message, for a model that takes them.
    pub images: Vec<crate::model::ImagePart>,
}

/// Where a turn's model calls stream their text.
#[derive(Clone)]
pub(crate) struct StreamTo(pub crate::model::TextSink);

impl std::fmt::Debug for StreamTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamTo(..)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnStatus {
    Done,
    Failed,
    Stopped,
}

impl TurnStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Done => "done",
            TurnStatus::Failed => "failed",
            TurnStatus::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TurnOutcome {
    pub status: TurnStatus,
    /// The text to deliver: the model's answer, or a visible failure reply.
    pub reply: Option<String>,
    pub error: Option<String>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// The turn's trace: every model call and tool call, in order. A live
    /// turn's is stored with its commit; an ask's goes back to the asker.
    pub steps: Vec<runs::RunStep>,
    /// A throwaway layer's changes, read before it was dropped (an ask's
    /// writes to its copy, which never reach the workspace); empty for a
    /// turn that merges.
    pub discarded: Discarded,
    /// The files a merged turn wrote under `outbox/`, sent with its reply.
    pub files_out: Vec<String>,
}

/// At most this many files a turn wrote under `outbox/` go with its reply.
pub(crate) const FILES_OUT_MAX: usize = 10;

/// The files `changes` wrote directly under `outbox/`, in path order.
fn files_out(changes: &[crate::workspace::layer::LayerChange]) -> Vec<String> {
    let mut out: Vec<String> = changes
        .iter()
        .filter(|c| c.kind == crate::workspace::layer::ChangeKind::Written)
        .filter(|c| {
            c.path
                .strip_prefix("outbox/")
                .is_some_and(|name| !name.is_empty() && !name.contains('/'))
        })
        .map(|c| c.path.clone())
        .collect();
    out.sort();
    out.truncate(FILES_OUT_MAX);
    out
}

/// What a throwaway copy held when it was thrown away.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Discarded {
    pub changes: Vec<crate::workspace::layer::LayerChange>,
    /// More changes than [`DISCARDED_MAX`] were made; the rest are not listed.
    pub more: bool,
}

/// How many of a throwaway copy's changes are listed.
pub(crate) const DISCARDED_MAX: usize = 200;

#[derive(Debug, thiserror::Error)]
enum TurnError {
    #[error("{0}")]
    Model(String),
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("storage: {0}")]
    Store(#[from] crate::storage::StoreError),
    #[error("the turn used all {0} steps without a final answer")]
    StepsExhausted(u32),
    #[error("the turn timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Layer(#[from] LayerError),
    /// A spend cap stopped the turn before its next model call.
    #[error("{0}")]
    Capped(crate::spend::CapHit),
}

/// The lazily started sandbox and layer of one turn, closed by [`run_turn`]
/// on every exit path.
struct SessionSlot {
    session: tokio::sync::Mutex<Option<Box<dyn SandboxSession>>>,
    /// The layer tools write in (`None` until the first tool call of a
    /// merging turn).
    layer: std::sync::Mutex<Option<TurnLayer>>,
    /// Set before the turn's run token is minted (with its sandbox); a turn
    /// that called no tool has no token and skips the revoking write.
    token_minted: AtomicBool,
    /// The enabled extensions' skills, read-only in the sandbox at their
    /// fixed paths: the same skills the prompt offers, from the turn's one
    /// read of its extensions (set before any tool can start the sandbox).
    skill_binds: std::sync::Mutex<Vec<(std::path::PathBuf, String)>>,
}

/// Whether this host still runs `space` (always, on a single host).
async fn still_holds(rt: &Runtime, space: &crate::ids::SpaceId) -> bool {
    let Some(fence) = rt.fence(space.as_str()) else {
        return true;
    };
    match rt
        .store
        .read(move |c| crate::storage::leases::hold(c, &fence))
        .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(space = %space, error = %e, "cannot confirm the space's lease");
            false
        }
    }
}

/// Runs one turn of a run its caller opened (and left `running`); the
/// caller closes it together with the reply, in one transaction.
pub(crate) async fn run_turn(
    rt: &Arc<Runtime>,
    mut req: TurnRequest,
    cancel: CancellationToken,
) -> TurnOutcome {
    let (layer, merge) = match std::mem::replace(&mut req.layer, LayerPlan::MergeOnSuccess) {
        LayerPlan::MergeOnSuccess => (None, true),
        LayerPlan::Throwaway(layer) => (Some(layer), false),
    };
    let slot = SessionSlot {
        session: tokio::sync::Mutex::new(None),
        layer: std::sync::Mutex::new(layer),
        token_minted: AtomicBool::new(false),
        skill_binds: std::sync::Mutex::new(Vec::new()),
    };
    let mut acc = Accounting::default();
    let started = std::time::Instant::now();
    if let Ok(mut live) = rt.live_runs.lock() {
        live.insert(req.run_id.to_string());
    }
    let timeout = Duration::from_secs(rt.settings.turn.timeout_secs);
    let result = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        r = tokio::time::timeout(timeout, turn_loop(rt, &req, &slot, &mut acc)) => {
            Some(r.unwrap_or(Err(TurnError::Timeout(timeout))))
        }
    };
    // Every exit path comes through here: close the sandbox, then settle
    // the layer (nothing can write it any more), then kill the token.
    if let Some(session) = slot.session.lock().await.take() {
        if let Err(e) = session.close().await {
            tracing::error!(run = %req.run_id, error = %e, "could not remove the turn's sandbox");
        }
    }
    // One of many hosts: a host that lost the space's lease while the turn
    // ran (paused, cut off) merges nothing; the message stays pending for
    // the host that holds it now. The commit checks again, in its own
    // transaction (the window between the two is a merge's length).
    let result = if merge && matches!(result, Some(Ok(_))) && !still_holds(rt, &req.space_id).await
    {
        tracing::warn!(run = %req.run_id, space = %req.space_id, "the space's lease was lost during the turn; its workspace changes are dropped");
        None
    } else {
        result
    };
    let layer = slot.layer.lock().ok().and_then(|mut l| l.take());
    let mut discarded = Discarded::default();
    let mut sent_files = Vec::new();
    let result = match (layer, result) {
        (Some(layer), Some(Ok(text))) if merge => {
            let committed = tokio::task::spawn_blocking(move || {
                // Read before the merge: the upper layer is what this turn wrote.
                let written = layer
                    .changes(DISCARDED_MAX)
                    .map(|(c, _)| files_out(&c))
                    .unwrap_or_default();
                layer.commit().map(|()| written)
            })
            .await;
            match committed {
                Ok(Ok(written)) => {
                    sent_files = written;
                    Some(Ok(text))
                }
                Ok(Err(e)) => Some(Err(TurnError::Layer(e))),
                Err(e) => Some(Err(TurnError::Layer(LayerError::Commit(e.to_string())))),
            }
        }
        (Some(layer), result) => {
            let listed = tokio::task::spawn_blocking(move || {
                // A merging turn that failed wrote nothing anyone asked about.
                let listed = (!merge).then(|| layer.changes(DISCARDED_MAX));
                layer.discard();
                listed
            })
            .await;
            match listed {
                Ok(Some(Ok((changes, more)))) => discarded = Discarded { changes, more },
                Ok(Some(Err(e))) => {
                    tracing::warn!(run = %req.run_id, error = %e, "cannot list a throwaway copy's changes");
                }
                Ok(None) | Err(_) => {}
            }
            result
        }
        (None, result) => result,
    };
    let sandboxed = slot.token_minted.load(Ordering::SeqCst);
    let run_id = req.run_id.to_string();
    if sandboxed {
        if let Err(e) = rt
            .store
            .write(move |tx| tokens::revoke_run(tx, &run_id))
            .await
        {
            tracing::error!(run = %req.run_id, error = %e, "could not revoke the run token");
        }
    }
    if let Ok(mut live) = rt.live_runs.lock() {
        live.remove(req.run_id.as_str());
    }
    attach_late_reads(rt, &req, &mut acc);
    let (status, reply, error) = match result {
        None => (TurnStatus::Stopped, None, Some("stopped".to_string())),
        Some(Ok(text)) => (TurnStatus::Done, Some(text), None),
        Some(Err(TurnError::Capped(hit))) => {
            // The configured sentence, once per period per conversation;
            // after that a capped turn stays silent.
            let answer = &rt.settings.budgets.capped_reply;
            let reply = if !answer.trim().is_empty()
                && rt
                    .spend
                    .first_capped_reply(req.space_id.as_str(), &hit)
                    .await
            {
                Some(answer.clone())
            } else {
                None
            };
            (TurnStatus::Failed, reply, Some(hit.to_string()))
        }
        Some(Err(e)) => {
            let msg = crate::redaction::secrets::scrub_error(&e.to_string());
            tracing::warn!(run = %req.run_id, space = %req.space_id, error = %msg, "turn failed");
            // The reason is for runs.error and the log; the participant
            // reads the configured generic sentence (a model error can
            // carry a provider's body, a path or a script's name).
            let mut reply = rt.settings.turn.failure_reply.clone();
            if req.preread.as_ref().is_some_and(|p| p.reason_to_caller) {
                reply.push_str(&format!(
                    "\n\n(You are a global admin, so the reason: {msg}. The trace: mrctl runs show {})",
                    req.run_id
                ));
            }
            (TurnStatus::Failed, Some(reply), Some(msg))
        }
    };
    let took = started.elapsed();
    rt.metrics.turn(req.kind.as_str(), status.as_str(), took);
    // The one line per turn an operator greps for (docs/operations.md).
    tracing::info!(
        target: "mercury::turn",
        space = %req.space_id,
        run = %req.run_id,
        kind = req.kind.as_str(),
        status = status.as_str(),
        ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        tokens_in = acc.tokens_in,
        tokens_out = acc.tokens_out,
        cost = %rt.spend.format(acc.cost),
        sandbox = if sandboxed { rt.sandbox.name() } else { "none" },
        "turn"
    );
    let mut steps = acc.steps;
    for step in &mut steps {
        step.error = step
            .error
            .as_deref()
            .map(crate::redaction::secrets::scrub_error);
    }
    TurnOutcome {
        status,
        reply,
        error,
        tokens_in: acc.tokens_in,
        tokens_out: acc.tokens_out,
        cost: acc.cost,
        steps,
        discarded,
        files_out: sent_files,
    }
}

#[derive(Default)]
struct Accounting {
    tokens_in: u64,
    tokens_out: u64,
    cost: f64,
    steps: Vec<runs::RunStep>,
}

impl Accounting {
    fn push_step(&mut self, mut step: runs::RunStep) {
        step.seq = self.steps.len() as u32 + 1;
        self.steps.push(step);
    }
}

/// Reads made after a tool call returned (a process it left running) came
/// from that call: they join the last tool step, so the trace never shows
/// another space's data without naming it.
fn attach_late_reads(rt: &Runtime, req: &TurnRequest, acc: &mut Accounting) {
    let late = rt.cross_reads.take(req.run_id.as_str());
    if late.is_empty() {
        return;
    }
    if let Some(last) = acc.steps.iter_mut().rev().find(|s| s.kind == "tool") {
        for space in late {
            if !last.source_spaces.contains(&space) {
                last.source_spaces.push(space);
            }
        }
        last.source_spaces.sort();
    }
}

/// At most `cap` bytes of `text`, cut at a character boundary.
fn capped(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_owned();
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What a tool call left in the trace (the model reads `output`).
struct ToolResult {
    output: String,
    exit_code: Option<i64>,
    error: Option<String>,
}

async fn turn_loop(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
    acc: &mut Accounting,
) -> Result<String, TurnError> {
    let mut tool_specs = tools::tool_specs();
    if web_fetch_on(rt, req).await? {
        tool_specs.push(crate::extensions::web::spec());
    }
    let exts = load_extensions(rt, req, slot).await?;
    let mut fragments = Vec::new();
    // From the read the turn already made, not a read of its own.
    let skills = exts
        .as_ref()
        .map_or_else(Vec::new, |e| e.skills(&rt.paths.root.join("extensions")));
    fragments.extend(crate::extensions::skills_prompt(&skills));
    if let Ok(mut binds) = slot.skill_binds.lock() {
        *binds = skills
            .into_iter()
            .map(|sk| {
                let inside = sk.inside();
                (sk.host_dir, inside)
            })
            .collect();
    }
    if let Some(exts) = &exts {
        tool_specs.extend(exts.specs().cloned());
        let args = serde_json::json!({"space": req.space_id.as_str(), "message": req.user_text});
        for (ext, answer) in
            run_hooks(rt, req, slot, exts, HookPoint::BeforeTurn, args, acc).await?
        {
            match answer {
                HookAnswer::Block(reason) => {
                    exts.close().await;
                    return Ok(format!("{ext} blocked this turn: {reason}"));
                }
                HookAnswer::Fragment(f) => {
                    fragments.push(format!("# From the {ext} extension\n{f}"));
                }
                HookAnswer::Nothing => {}
            }
        }
    }
    let result = turn_steps(rt, req, slot, acc, &tool_specs, exts.as_ref(), &fragments).await;
    if let (Some(exts), Ok(reply)) = (&exts, &result) {
        let args = serde_json::json!({"space": req.space_id.as_str(), "message": req.user_text, "reply": reply});
        run_hooks(rt, req, slot, exts, HookPoint::AfterTurn, args, acc).await?;
    }
    // Before the sandbox closes: a stdio server ends with its connection.
    if let Some(exts) = &exts {
        exts.close().await;
    }
    result
}

/// Runs every enabled extension's hook at `point`, each a step of the
/// trace. A hook that fails or overruns its time is logged and skipped; in
/// an ask or a shadow an http hook is skipped (it could act outside).
#[allow(clippy::too_many_arguments)]
async fn run_hooks(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
    exts: &TurnExtensions,
    point: HookPoint,
    args: serde_json::Value,
    acc: &mut Accounting,
) -> Result<Vec<(String, HookAnswer)>, TurnError> {
    let cap = rt.settings.turn.output_cap_bytes;
    let may_act = !rt.outbound.is_shadow() && req.kind != RunKind::Ask;
    let mut out = Vec::new();
    for hook in exts.hooks(point) {
        let started_at = now_ms();
        let clock = std::time::Instant::now();
        let label = match point {
            HookPoint::BeforeTurn => "before_turn",
            HookPoint::AfterTurn => "after_turn",
        };
        // A tool step (run_steps.kind is model or tool) named `<ext>.<point>`,
        // which no tool name can be.
        let mut step = runs::RunStep {
            kind: "tool".into(),
            name: format!("{}.{label}", hook.extension),
            arguments: Some(capped(
                &crate::model::scripted::canonical_json(&args),
                rt.settings.runs.step_output_bytes,
            )),
            started_at,
            ..Default::default()
        };
        let answer = if hook.transport == Transport::Http && !may_act {
            // A hook may act outside: the shadow's own list of http
            // servers covers its read-only tools only, never a hook.
            Err("skipped: an ask or a shadow calls no http hook".to_string())
        } else if hook.transport == Transport::Stdio {
            if rt.sandbox.unavailable_reason().is_some() {
                Err("skipped: no sandbox on this host".to_string())
            } else {
                let guard = ensure_session(rt, req, slot).await?;
                exts.run_hook(&hook, args.clone(), guard.as_deref(), cap)
                    .await
                    .map_err(|e| e.to_string())
            }
        } else {
            exts.run_hook(&hook, args.clone(), None, cap)
                .await
                .map_err(|e| e.to_string())
        };
        step.duration_ms = clock.elapsed().as_millis() as u64;
        match answer {
            Ok(a) => {
                step.output = Some(capped(
                    &format!("{a:?}"),
                    rt.settings.runs.step_output_bytes,
                ));
                out.push((hook.extension.clone(), a));
            }
            Err(e) => {
                tracing::warn!(run = %req.run_id, extension = %hook.extension, hook = label, error = %e, "a hook failed and was skipped");
                step.error = Some(e);
            }
        }
        acc.push_step(step);
    }
    Ok(out)
}

/// The extensions the space enabled, their tools listed (a stdio server's
/// inside the turn's sandbox, started for it) when no catalog is kept yet.
async fn load_extensions(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
) -> Result<Option<TurnExtensions>, TurnError> {
    let preread = req.preread.as_ref().and_then(|p| {
        let taken = p.extensions.lock().ok().and_then(|mut e| e.take());
        taken.map(|e| (p.role.as_str(), e))
    });
    let loaded = match preread {
        Some((_, enabled)) if enabled.is_empty() => return Ok(None),
        Some((role, enabled)) => Ok(TurnExtensions::from_read(enabled, role)),
        None => {
            let role = match &req.token_role {
                Some(r) => r.clone(),
                None => {
                    let (space, caller) = (req.space_id.to_string(), req.caller_id.clone());
                    let global = rt.settings.is_global_admin(&caller);
                    rt.store
                        .read(move |c| crate::perms::resolve_role(c, &space, &caller, global))
                        .await?
                }
            };
            TurnExtensions::load(&rt.store, req.space_id.as_str(), &role).await
        }
    };
    let mut exts = match loaded {
        Ok(e) if e.is_empty() => return Ok(None),
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(space = %req.space_id, error = %e, "cannot read the space's extensions; none are offered");
            return Ok(None);
        }
    };
    if exts.unlisted().is_empty() {
        return Ok(Some(exts));
    }
    let deadline = Duration::from_secs(rt.settings.turn.tool_timeout_secs);
    let named = rt.settings.extensions.shadow_http.as_slice();
    let shadow = rt.outbound.is_shadow().then_some(named);
    let needs_sandbox = exts
        .unlisted()
        .iter()
        .any(|(e, s)| exts.transport(e, s) == Some(Transport::Stdio));
    if needs_sandbox && rt.sandbox.unavailable_reason().is_none() {
        let guard = ensure_session(rt, req, slot).await?;
        exts.list_unlisted(&rt.store, guard.as_deref(), shadow, deadline)
            .await;
    } else {
        exts.list_unlisted(&rt.store, None, shadow, deadline).await;
    }
    Ok(Some(exts))
}

/// The turn's sandbox session, started now (with its layer and run token)
/// if no tool has needed it yet.
async fn ensure_session<'a>(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &'a SessionSlot,
) -> Result<tokio::sync::MutexGuard<'a, Option<Box<dyn SandboxSession>>>, TurnError> {
    let workdir = ensure_layer(rt, req, slot).await?;
    let mut guard = slot.session.lock().await;
    if guard.is_none() {
        slot.token_minted.store(true, Ordering::SeqCst);
        let skill_binds = slot
            .skill_binds
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        *guard = Some(start_sandbox(rt, req, &workdir, skill_binds).await?);
    }
    Ok(guard)
}

async fn turn_steps(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
    acc: &mut Accounting,
    tool_specs: &[crate::model::ToolSpec],
    exts: Option<&TurnExtensions>,
    fragments: &[String],
) -> Result<String, TurnError> {
    let rows = req
        .preread
        .as_ref()
        .and_then(|p| p.prompt_rows.lock().ok().and_then(|mut r| r.take()));
    let mut messages = prompt::build(rt, &req.prompt, &req.user_text, rows).await?;
    if let Some(asked) = messages.last_mut() {
        asked.images = req.images.clone();
    }
    // Hooks' fragments join the system prompt, before the history.
    let at = usize::from(messages.first().is_some_and(|m| m.role == Role::System));
    for (i, f) in fragments.iter().enumerate() {
        messages.insert(at + i, ChatMessage::text(Role::System, f.clone()));
    }
    let steps = rt.settings.turn.max_steps;
    for _ in 0..steps {
        let response = call_model(rt, req, &messages, tool_specs, acc).await?;
        if response.tool_calls.is_empty() {
            return Ok(response.text);
        }
        messages.push(ChatMessage {
            tool_calls: response.tool_calls.clone(),
            ..ChatMessage::text(Role::Assistant, response.text.clone())
        });
        for call in &response.tool_calls {
            let started_at = now_ms();
            let clock = std::time::Instant::now();
            let cap = rt.settings.runs.step_output_bytes;
            let mut step = runs::RunStep {
                kind: "tool".into(),
                name: call.name.clone(),
                arguments: Some(capped(
                    &crate::model::scripted::canonical_json(&call.arguments),
                    cap,
                )),
                started_at,
                ..Default::default()
            };
            attach_late_reads(rt, req, acc);
            let web = call.name == crate::extensions::web::TOOL_NAME
                && tool_specs.iter().any(|t| t.name == call.name);
            let result = match exts.and_then(|e| e.tool(&call.name).map(|t| (e, t))) {
                Some((exts, tool)) => run_ext_tool(rt, req, slot, exts, tool, call).await,
                None if web => run_web_fetch(rt, req, call, acc).await,
                None => run_one_tool(rt, req, slot, call).await,
            };
            step.duration_ms = clock.elapsed().as_millis() as u64;
            step.source_spaces = rt.cross_reads.take(req.run_id.as_str());
            let result = match result {
                Ok(r) => r,
                Err(e) => {
                    step.error = Some(e.to_string());
                    acc.push_step(step);
                    return Err(e);
                }
            };
            step.exit_code = result.exit_code;
            step.error = result.error;
            step.output_bytes = Some(result.output.len() as u64);
            step.output = Some(capped(&result.output, cap));
            acc.push_step(step);
            check_quota(slot)?;
            messages.push(ChatMessage::tool_result(call, result.output));
        }
    }
    Err(TurnError::StepsExhausted(steps))
}

/// Whether the space's admin turned `web_fetch` on (`web.fetch` = `on`).
async fn web_fetch_on(rt: &Arc<Runtime>, req: &TurnRequest) -> Result<bool, TurnError> {
    if let Some(p) = &req.preread {
        return Ok(p.web_fetch);
    }
    let space = req.space_id.to_string();
    Ok(rt.store.read(move |c| web_fetch_set(c, &space)).await?)
}

/// Whether `space` turned `web_fetch` on (`mrctl config set web_fetch on`).
pub(crate) fn web_fetch_set(
    c: &crate::storage::Conn,
    space: &str,
) -> crate::storage::StoreResult<bool> {
    let v = crate::storage::spaces::kv_get(
        c,
        crate::storage::spaces::KvTable::Config,
        space,
        crate::extensions::web::CONFIG_KEY,
    )?;
    Ok(v.as_deref() == Some("on"))
}

/// Runs one `web_fetch` on the host: charged to the space's budget first
/// (`web.fetch_cost`, through the spend seam's caps), then fetched under
/// the egress policy. It only reads, so an ask and a shadow run it too.
async fn run_web_fetch(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    call: &crate::model::ToolCall,
    acc: &mut Accounting,
) -> Result<ToolResult, TurnError> {
    let refused = |output: String| ToolResult {
        error: Some(output.trim_start_matches("error: ").to_owned()),
        output,
        exit_code: None,
    };
    let Some(url) = call.arguments.get("url").and_then(|u| u.as_str()) else {
        return Ok(refused(
            "error: web_fetch needs {\"url\": \"http://…\"}".to_owned(),
        ));
    };
    let charge = crate::spend::Charge {
        space: Some(req.space_id.to_string()),
        purpose: spend_purpose(req.kind),
    };
    let reservation = match rt
        .spend
        .reserve_tool(
            &charge,
            crate::extensions::web::TOOL_NAME,
            rt.settings.web.fetch_cost,
        )
        .await
    {
        Ok(r) => r,
        Err(crate::spend::SpendError::Capped(hit)) => {
            return Ok(refused(format!(
                "error: web_fetch: {} of {} is reached; nothing was fetched",
                hit.cap,
                crate::spend::format_amount(hit.limit, &hit.currency)
            )))
        }
        Err(crate::spend::SpendError::Store(e)) => return Err(TurnError::Store(e)),
        Err(e) => return Ok(refused(format!("error: web_fetch: {e}"))),
    };
    let fetched = crate::extensions::web::fetch(&rt.settings.web, url).await;
    // A fetch that gave no page (refused, cut off in time) costs nothing,
    // as a model call that failed does not.
    match rt.spend.end_tool(reservation, fetched.is_ok()).await {
        Ok(cost) => acc.cost += cost,
        Err(crate::spend::SpendError::Store(e)) => return Err(TurnError::Store(e)),
        Err(e) => {
            tracing::warn!(run = %req.run_id, error = %e, "cannot end web_fetch's reservation");
        }
    }
    let cap = rt.settings.turn.output_cap_bytes;
    Ok(match fetched {
        Ok(page) => ToolResult {
            output: crate::extensions::strip_and_cap(&page.render(), cap),
            exit_code: Some(0),
            error: None,
        },
        Err(e) => refused(format!("error: web_fetch: {e}")),
    })
}

/// Runs one extension tool call: refused where the turn must not act, a
/// stdio server's inside the turn's sandbox, an http server's by the host.
async fn run_ext_tool(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
    exts: &TurnExtensions,
    tool: &ExtTool,
    call: &crate::model::ToolCall,
) -> Result<ToolResult, TurnError> {
    let refused = |output: String| ToolResult {
        error: Some(output.trim_start_matches("error: ").to_owned()),
        output,
        exit_code: None,
    };
    let mode = if rt.outbound.is_shadow() {
        ExtMode::Shadow
    } else if req.kind == RunKind::Ask {
        ExtMode::Ask
    } else {
        ExtMode::Acting
    };
    let transport = exts
        .transport(&tool.extension, &tool.server)
        .unwrap_or(Transport::Stdio);
    if let Some(why) = exts.forbidden(tool) {
        return Ok(refused(format!("error: {why}")));
    }
    let named = rt
        .settings
        .extensions
        .shadow_http
        .contains(&format!("{}.{}", tool.extension, tool.server));
    if let Some(why) = crate::extensions::refusal(tool, transport, mode, named) {
        let args = capped(
            &crate::model::scripted::canonical_json(&call.arguments),
            200,
        );
        match mode {
            ExtMode::Ask => rt.record_refusal(
                req.run_id.as_str(),
                crate::runtime::AskRefusal {
                    method: "MCP".into(),
                    route: tool.exposed.clone(),
                    summary: format!("would have called {} with {args}", tool.exposed),
                },
            ),
            _ => rt.outbound.record_refusal(
                Some(req.space_id.as_str()),
                "extension",
                &format!("would have called {} with {args}", tool.exposed),
            ),
        }
        return Ok(refused(format!("error: {why}")));
    }
    let deadline = Duration::from_secs(rt.settings.turn.tool_timeout_secs);
    let cap = rt.settings.turn.output_cap_bytes;
    let answer = if transport == Transport::Stdio {
        if let Some(reason) = rt.sandbox.unavailable_reason() {
            return Ok(refused(format!(
                "error: no sandbox is available on this host ({reason}); tool calls are refused."
            )));
        }
        let guard = ensure_session(rt, req, slot).await?;
        exts.call(
            tool,
            call.arguments.clone(),
            guard.as_deref(),
            deadline,
            cap,
        )
        .await
    } else {
        exts.call(tool, call.arguments.clone(), None, deadline, cap)
            .await
    };
    Ok(match answer {
        Ok((text, is_error)) => ToolResult {
            output: if text.is_empty() {
                "(no output)".into()
            } else {
                text
            },
            exit_code: Some(i64::from(is_error)),
            error: None,
        },
        Err(e) => refused(format!("error: {}: {e}", tool.exposed)),
    })
}

/// Runs one tool call: file tools on the host through the safe-path
/// function, the others in the sandbox; both on the turn's layer.
async fn run_one_tool(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
    call: &crate::model::ToolCall,
) -> Result<ToolResult, TurnError> {
    let cap = rt.settings.turn.output_cap_bytes;
    let refused = |output: String| ToolResult {
        error: Some(output.trim_start_matches("error: ").to_owned()),
        output,
        exit_code: None,
    };
    let plan = match tools::plan(
        call,
        Duration::from_secs(rt.settings.turn.tool_timeout_secs),
        cap,
    ) {
        Ok(plan) => plan,
        Err(tools::BadToolCall(m)) => return Ok(refused(format!("error: {m}"))),
    };
    if let Some(reason) = rt.sandbox.unavailable_reason() {
        return Ok(refused(format!(
            "error: no sandbox is available on this host ({reason}); tool calls are refused. \
             Answer without tools."
        )));
    }
    let workdir = ensure_layer(rt, req, slot).await?;
    match plan {
        tools::ToolPlan::File(op) => {
            let writes = op.writes();
            let output = tokio::task::spawn_blocking(move || tools::run_file_op(&workdir, op, cap))
                .await
                .map_err(|e| TurnError::Sandbox(SandboxError::Engine(format!("file tool: {e}"))))?;
            // A sandbox working on a copy of the layer takes the change in
            // before its next command.
            if writes {
                if let Some(session) = slot.session.lock().await.as_deref() {
                    session.host_changed();
                }
            }
            // File tools say "error: …" when they refuse: exit code 1.
            let exit_code = Some(if output.starts_with("error:") { 1 } else { 0 });
            Ok(ToolResult {
                output,
                exit_code,
                error: None,
            })
        }
        tools::ToolPlan::Exec(exec) => {
            let guard = ensure_session(rt, req, slot).await?;
            let session = guard.as_deref().ok_or_else(|| {
                TurnError::Sandbox(SandboxError::Gone("session slot empty".into()))
            })?;
            let out = session.exec(exec).await?;
            Ok(ToolResult {
                output: tools::render_output(&out),
                exit_code: Some(out.exit_code),
                error: None,
            })
        }
    }
}

/// The directory tools work in: the layer's merged view, laid now if this
/// is the first tool call of a merging turn.
async fn ensure_layer(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    slot: &SessionSlot,
) -> Result<PathBuf, TurnError> {
    if let Some(l) = slot
        .layer
        .lock()
        .ok()
        .and_then(|l| l.as_ref().map(|l| l.merged().to_path_buf()))
    {
        return Ok(l);
    }
    rt.sandbox.prepare_workspace(&req.workspace).await?;
    let (live, scratch, name) = (
        req.workspace.clone(),
        rt.paths.scratch(),
        format!("turn-{}", req.run_id),
    );
    let budget = LayerBudget::RemainingOf {
        quota_mb: rt.settings.sandbox.workspace_mb,
        limits: (&rt.settings.workspace).into(),
    };
    let layer =
        tokio::task::spawn_blocking(move || TurnLayer::mount(&live, &scratch, &name, budget))
            .await
            .map_err(|e| TurnError::Layer(LayerError::Setup(e.to_string())))??;
    let merged = layer.merged().to_path_buf();
    match slot.layer.lock() {
        Ok(mut l) => *l = Some(layer),
        Err(_) => {
            return Err(TurnError::Layer(LayerError::Setup(
                "layer slot poisoned".into(),
            )))
        }
    }
    Ok(merged)
}

fn check_quota(slot: &SessionSlot) -> Result<(), TurnError> {
    match slot.layer.lock() {
        Ok(l) => match l.as_ref() {
            Some(layer) => Ok(layer.check_quota()?),
            None => Ok(()),
        },
        Err(_) => Err(TurnError::Layer(LayerError::Setup(
            "layer slot poisoned".into(),
        ))),
    }
}

/// Tries each model of the chain in order; records usage for every answer.
async fn call_model(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    messages: &[ChatMessage],
    tool_specs: &[crate::model::ToolSpec],
    acc: &mut Accounting,
) -> Result<ModelResponse, TurnError> {
    let started_at = now_ms();
    let clock = std::time::Instant::now();
    let charge = crate::spend::Charge {
        space: Some(req.space_id.to_string()),
        purpose: spend_purpose(req.kind),
    };
    // The usage row commits with the spend settlement: one write per call.
    let record: crate::spend::AlsoRecord = {
        let (run_id, space, kind) = (
            req.run_id.to_string(),
            req.space_id.to_string(),
            req.kind.as_str(),
        );
        Arc::new(move |tx, s| {
            runs::record_usage(
                tx,
                &runs::UsageRow {
                    run_id: Some(&run_id),
                    space_id: &space,
                    model: &s.spec,
                    kind,
                    tokens_in: s.tokens_in,
                    tokens_out: s.tokens_out,
                    cost: s.cost,
                },
            )
        })
    };
    let ctx = crate::spend::CallContext {
        space_budget: req.preread.as_ref().map(|p| p.space_budget.clone()),
        also: Some(record),
        stream: req.stream.as_ref().map(|s| s.0.clone()),
    };
    let answer = match complete_with_chain(
        rt,
        &req.model_chain,
        req.purpose,
        &charge,
        messages,
        tool_specs,
        ctx,
    )
    .await
    {
        Ok(a) => a,
        Err(e) => {
            acc.push_step(runs::RunStep {
                kind: "model".into(),
                name: req.model_chain.join(","),
                duration_ms: clock.elapsed().as_millis() as u64,
                error: Some(e.to_string()),
                started_at,
                ..Default::default()
            });
            return Err(match e {
                ChainError::Capped(hit) => TurnError::Capped(hit),
                ChainError::Failed(e) => TurnError::Model(e),
            });
        }
    };
    acc.push_step(runs::RunStep {
        kind: "model".into(),
        name: answer.spec.clone(),
        tokens_in: answer.response.usage.input_tokens,
        tokens_out: answer.response.usage.output_tokens,
        duration_ms: clock.elapsed().as_millis() as u64,
        started_at,
        ..Default::default()
    });
    acc.tokens_in += answer.response.usage.input_tokens;
    acc.tokens_out += answer.response.usage.output_tokens;
    acc.cost += answer.cost;
    Ok(answer.response)
}

/// The spend purpose of a turn of `kind`.
fn spend_purpose(kind: RunKind) -> crate::spend::SpendPurpose {
    use crate::spend::SpendPurpose;
    match kind {
        RunKind::Live => SpendPurpose::Turn,
        RunKind::Task => SpendPurpose::Task,
        RunKind::Ask => SpendPurpose::Ask,
        RunKind::Review => SpendPurpose::Judge,
    }
}

/// An answer from a model chain: which spec gave it and what it cost.
pub(crate) struct ChainAnswer {
    pub response: ModelResponse,
    pub spec: String,
    pub cost: f64,
}

/// Why a chain gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChainError {
    /// A cap stopped the first call it covered: the rest of the chain is not
    /// tried (the cap covers them too).
    #[error("{0}")]
    Capped(crate::spend::CapHit),
    /// The one sentence every caller stores or serves, scrubbed.
    #[error("{0}")]
    Failed(String),
}

/// Tries each spec of `chain` in order until one answers (live work: it
/// counts against the model gate so background review calls hold back),
/// each call through the spend seam. `ctx.also` (the caller's usage row)
/// is written with the answering call's settlement; without it, recording
/// the usage is the caller's, so it can share a transaction of its own.
pub(crate) async fn complete_with_chain(
    rt: &Arc<Runtime>,
    chain: &[String],
    purpose: Purpose,
    charge: &crate::spend::Charge,
    messages: &[ChatMessage],
    tools: &[crate::model::ToolSpec],
    ctx: crate::spend::CallContext,
) -> Result<ChainAnswer, ChainError> {
    let mut failures = Vec::new();
    for spec in chain {
        let model = match rt.models.get(spec) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{spec}: {e}"));
                continue;
            }
        };
        let mut messages = messages.to_vec();
        // A model that takes no pictures reads the line about the file.
        if !rt.settings.models.vision.iter().any(|v| v == spec) {
            for m in &mut messages {
                m.images.clear();
            }
        }
        let request = ModelRequest {
            model: model.model.clone(),
            purpose,
            messages,
            tools: tools.to_vec(),
            max_tokens: rt.settings.turn.max_tokens,
        };
        // Counted as live while the call runs; taking the permit never waits.
        let live = rt.model_gate.live();
        let started = std::time::Instant::now();
        let answer = rt
            .spend
            .call_in(charge, spec, &model, &request, ctx.clone())
            .await;
        drop(live);
        match answer {
            Ok(metered) => {
                let usage = metered.response.usage;
                rt.metrics.model_call(
                    spec,
                    true,
                    started.elapsed(),
                    (usage.input_tokens, usage.output_tokens),
                );
                return Ok(ChainAnswer {
                    response: metered.response,
                    spec: spec.clone(),
                    cost: metered.cost,
                });
            }
            Err(crate::spend::SpendError::Capped(hit)) => return Err(ChainError::Capped(hit)),
            // The ledger (or the usage row with it) could not be written: the
            // next spec would be called and fail alike, or pay twice.
            Err(crate::spend::SpendError::Store(e)) => {
                return Err(ChainError::Failed(crate::redaction::secrets::scrub_error(
                    &format!("the model call could not be recorded ({spec}: {e})"),
                )))
            }
            Err(crate::spend::SpendError::Model(e)) => {
                rt.metrics
                    .model_call(spec, false, started.elapsed(), (0, 0));
                failures.push(format!("{spec}: {e}"));
            }
            Err(e) => failures.push(format!("{spec}: {e}")),
        }
    }
    if failures.is_empty() {
        failures.push("no model configured".into());
    }
    // The one sentence every caller stores or serves (runs.error, the
    // trace, a compaction's 502): a provider may echo the key or its URL.
    Err(ChainError::Failed(crate::redaction::secrets::scrub_error(
        &format!("the model did not answer ({})", failures.join("; ")),
    )))
}

/// A turn's sandbox limits from `sandbox.*` and `workspace.*`: also what a
/// warm pool's containers are made with, so a turn's spec fits them.
pub fn sandbox_limits(settings: &crate::config::Settings) -> SandboxLimits {
    let s = &settings.sandbox;
    SandboxLimits {
        memory_bytes: s.memory_mb << 20,
        nano_cpus: (s.cpus * 1e9) as i64,
        pids: s.pids,
        tmp_bytes: s.tmp_mb << 20,
        workspace_bytes: i64::try_from(s.workspace_mb << 20).unwrap_or(i64::MAX),
        workspace_entries: settings.workspace.max_entries,
        workspace_depth: settings.workspace.max_depth,
    }
}

async fn start_sandbox(
    rt: &Arc<Runtime>,
    req: &TurnRequest,
    workdir: &std::path::Path,
    skill_binds: Vec<(std::path::PathBuf, String)>,
) -> Result<Box<dyn SandboxSession>, TurnError> {
    let (caller, space, run_id) = (
        req.caller_id.clone(),
        req.space_id.to_string(),
        req.run_id.to_string(),
    );
    // An ask turn acts with a fixed role and may not write anything (D-016).
    let read_only = req.kind == RunKind::Ask;
    let token_role = req.token_role.clone();
    let expires = now_ms() + (rt.settings.turn.timeout_secs as i64 + 60) * 1000;
    let (_id, secret) = rt
        .store
        .write(move |tx| {
            tokens::mint(
                tx,
                &tokens::NewToken {
                    caller_id: &caller,
                    kind: tokens::TokenKind::Run,
                    space_id: Some(&space),
                    run_id: Some(&run_id),
                    label: Some("agent turn"),
                    created_by: Some(crate::ids::SYSTEM_CALLER),
                    expires_at: Some(expires),
                    role: token_role.as_deref(),
                    read_only,
                },
            )
        })
        .await?;
    let socket_inside = rt.sandbox.socket_inside(&rt.paths.socket);
    let spec = SandboxSpec {
        instance_id: rt.instance_id.clone(),
        space_id: req.space_id.to_string(),
        run_id: req.run_id.to_string(),
        kind: req.kind,
        workspace: WorkspaceMount::HostPath(workdir.to_path_buf()),
        api: Some(ApiEndpoint::UnixSocket(rt.paths.socket.clone())),
        // The whole environment of the sandbox: nothing else from the host.
        env: vec![
            ("MERCURY_TOKEN".into(), secret),
            ("MERCURY_SPACE".into(), req.space_id.to_string()),
            ("MERCURY_SOCKET".into(), socket_inside),
        ],
        // The enabled extensions' skills, read-only at a fixed path.
        ro_binds: skill_binds,
        limits: sandbox_limits(&rt.settings),
    };
    let started = std::time::Instant::now();
    let session = rt.sandbox.start(spec).await?;
    let proof = match session.proof().await {
        Ok(p) => p,
        Err(e) => {
            let _ = session.close().await;
            return Err(e.into());
        }
    };
    rt.metrics
        .sandbox_start(rt.sandbox.name(), started.elapsed());
    let (run_id, cid) = (req.run_id.to_string(), session.id().to_string());
    rt.store
        .write(move |tx| runs::set_sandbox(tx, &run_id, &cid, &proof))
        .await?;
    Ok(session)
}
