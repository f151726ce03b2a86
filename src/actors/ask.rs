//! `AskSandbox`: one `ask` (spec D-016), a short-lived supervised actor.
//!
//! It asks the target's `SpaceActor` for a consistent copy of the workspace
//! between two turns, runs one turn of the target's agent on that copy (the
//! target's instructions, memory, preferences, history and model; a container
//! labelled `mercury.kind=ask`), and answers with the reply, the list of
//! refused writes and the cost. Then it stops; the copy goes with it.
//!
//! Must never: write in the target (no message, no run row, no token row is
//! left; only token usage, kind `ask`, is recorded), show the turn anything
//! of the holder's conversation but the message, or keep the copy.

use std::path::PathBuf;
use std::sync::Arc;

use ractor::{call_t, Actor, ActorProcessingErr, ActorRef};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{SpaceDirectory, SpaceMsg, CONTROL_TIMEOUT_MS};
use crate::agent::{self, prompt::PromptInputs, TurnRequest};
use crate::ids::{RunId, SpaceId};
use crate::model::Purpose;
use crate::runtime::{AskRefusal, Runtime};
use crate::sandbox::RunKind;
use crate::storage::tokens;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AskOutcome {
    pub space_id: String,
    pub run_id: String,
    pub status: String,
    pub reply: Option<String>,
    pub error: Option<String>,
    pub refusals: Vec<AskRefusal>,
    /// What the turn wrote in its throwaway copy: never in the target's
    /// workspace (listed so the asker sees what the agent tried).
    pub discarded: crate::agent::Discarded,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// The currency of `cost`.
    pub currency: String,
    /// The turn's trace (model and tool calls): it comes back to the asker
    /// and is stored nowhere, like the rest of the ask.
    pub steps: Vec<crate::storage::runs::RunStep>,
}

pub struct AskArgs {
    pub rt: Arc<Runtime>,
    pub spaces: SpaceDirectory,
    pub target: SpaceId,
    pub message: String,
    /// `member` or `admin`: the role of the turn's run token.
    pub role: String,
    pub caller_id: String,
    pub reply: oneshot::Sender<Result<AskOutcome, AskError>>,
}

/// Why an ask did not run.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Said to the client (503): the host's sandbox cannot hold an ask.
    #[error("ask needs an isolating sandbox (docker or bubblewrap); this host's backend is `{0}`")]
    NotIsolated(&'static str),
    #[error(transparent)]
    Space(#[from] super::ActorError),
    /// The view over the target's workspace could not be laid (host paths:
    /// logged, never sent).
    #[error("the space did not give a view: {0}")]
    View(String),
    #[error(transparent)]
    Store(#[from] crate::storage::StoreError),
}

pub enum AskMsg {
    /// Sent to itself at start: run the ask, answer, then stop.
    Run,
}

pub struct AskSandbox;

impl Actor for AskSandbox {
    type Msg = AskMsg;
    type State = Option<AskArgs>;
    type Arguments = AskArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AskMsg>,
        args: AskArgs,
    ) -> Result<Option<AskArgs>, ActorProcessingErr> {
        let _ = myself.cast(AskMsg::Run);
        Ok(Some(args))
    }

    async fn handle(
        &self,
        myself: ActorRef<AskMsg>,
        msg: AskMsg,
        state: &mut Option<AskArgs>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AskMsg::Run => {
                if let Some(args) = state.take() {
                    let result = run_ask(&args).await;
                    let _ = args.reply.send(result);
                }
                myself.stop(Some("ask done".into()));
            }
        }
        Ok(())
    }
}

async fn run_ask(args: &AskArgs) -> Result<AskOutcome, AskError> {
    let rt = &args.rt;
    if !rt.sandbox.isolation().isolates() {
        return Err(AskError::NotIsolated(rt.sandbox.name()));
    }
    let run_id = RunId::new();
    let actor = args.spaces.actor(&args.target).await?;
    // The view is a layer over the live workspace whose upper is never
    // merged: dropped (unmounted, removed) on every path out of here.
    let view = call_t!(
        actor,
        SpaceMsg::Snapshot,
        CONTROL_TIMEOUT_MS,
        format!("ask-{run_id}")
    )
    .map_err(|e| AskError::View(e.to_string()))?
    .map_err(|e| AskError::View(e.to_string()))?;
    let copy: PathBuf = view.layer.merged().to_path_buf();
    let history_before = view.history_before;
    let space = args.target.to_string();
    let chain = {
        let (rt2, space) = (rt.clone(), space.clone());
        rt.store
            .read(move |c| crate::agent::live::model_chain(c, &rt2, &space))
            .await?
    };
    let req = TurnRequest {
        space_id: args.target.clone(),
        run_id: run_id.clone(),
        kind: RunKind::Ask,
        caller_id: args.caller_id.clone(),
        user_text: args.message.clone(),
        workspace: copy.clone(),
        prompt: PromptInputs {
            space_id: space.clone(),
            files_dir: copy,
            history_before: Some(history_before),
            links_paragraph: false,
        },
        purpose: Purpose::Ask,
        model_chain: chain,
        token_role: Some(args.role.clone()),
        preread: None,
        layer: agent::LayerPlan::Throwaway(view.layer),
        // An ask answers its asker, never a platform.
        stream: None,
        images: Vec::new(),
    };
    let outcome = agent::run_turn(rt, req, CancellationToken::new()).await;
    let run_s = run_id.to_string();
    if let Err(e) = rt
        .store
        .write(move |tx| tokens::delete_run(tx, &run_s))
        .await
    {
        tracing::error!(error = %e, "could not delete the ask run token");
    }
    Ok(AskOutcome {
        space_id: space,
        run_id: run_id.to_string(),
        status: outcome.status.as_str().to_owned(),
        reply: outcome.reply,
        error: outcome.error,
        refusals: rt.take_refusals(run_id.as_str()),
        discarded: outcome.discarded,
        tokens_in: outcome.tokens_in,
        tokens_out: outcome.tokens_out,
        cost: outcome.cost,
        currency: rt.settings.currency.clone(),
        steps: outcome.steps,
    })
}
