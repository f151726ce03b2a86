//! `JudgePool`: runs judge batches for the review scan. Each batch runs in its
//! own task (the mailbox stays responsive) and waits for a background permit
//! of the model gate before every model call, so at most
//! `review.max_concurrency` judge calls run at once, no faster than
//! `review.calls_per_minute`, and behind live turns.
//!
//! Must never: call a model without a background permit, outlive its actor
//! with work in flight (stopping or failing the actor cancels every batch,
//! and the scan sees the batch skipped), or panic on a batch.

use std::sync::Arc;
use std::time::Duration;

use ractor::{call_t, Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::review::judge::{self, BatchVerdict, JudgeJob};
use crate::runtime::Runtime;

pub enum JudgePoolMsg {
    /// Judge one batch; the verdict is the reply.
    Judge(Box<JudgeJob>, RpcReplyPort<BatchVerdict>),
}

pub struct JudgePoolArgs {
    pub rt: Arc<Runtime>,
}

pub struct JudgePoolState {
    rt: Arc<Runtime>,
    /// Batches in flight; closed and drained when the actor stops.
    tasks: TaskTracker,
    /// Cancelled when this state is dropped (the actor stopped or failed):
    /// every batch in flight ends without a reply.
    cancel: CancellationToken,
    _cancel_on_drop: DropGuard,
}

pub struct JudgePool;

impl Actor for JudgePool {
    type Msg = JudgePoolMsg;
    type State = JudgePoolState;
    type Arguments = JudgePoolArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<JudgePoolMsg>,
        args: JudgePoolArgs,
    ) -> Result<JudgePoolState, ActorProcessingErr> {
        let cancel = CancellationToken::new();
        Ok(JudgePoolState {
            rt: args.rt,
            tasks: TaskTracker::new(),
            _cancel_on_drop: cancel.clone().drop_guard(),
            cancel,
        })
    }

    async fn handle(
        &self,
        _me: ActorRef<JudgePoolMsg>,
        msg: JudgePoolMsg,
        state: &mut JudgePoolState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JudgePoolMsg::Judge(job, reply) => {
                let (rt, cancel) = (state.rt.clone(), state.cancel.clone());
                state.tasks.spawn(async move {
                    tokio::select! {
                        biased;
                        // The reply port drops unanswered: the scan's call fails
                        // and it records the batch as skipped.
                        _ = cancel.cancelled() => {}
                        verdict = judge::judge_batch(&rt, &job) => {
                            let _ = reply.send(verdict);
                        }
                    }
                });
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<JudgePoolMsg>,
        state: &mut JudgePoolState,
    ) -> Result<(), ActorProcessingErr> {
        state.cancel.cancel();
        state.tasks.close();
        Ok(())
    }
}

/// The running judge pool, kept current by the supervisor across restarts.
pub type JudgePoolSlot = super::ActorSlot<JudgePoolMsg>;

#[async_trait::async_trait]
impl crate::review::BatchJudge for JudgePoolSlot {
    async fn judge(&self, job: JudgeJob, timeout: Duration) -> BatchVerdict {
        judge(self, job, timeout).await
    }
}

/// Hands one batch to the pool and waits for its verdict. Every failure to
/// get one (no pool, timeout, pool restarted) is a skipped batch with a
/// reason, never an error.
pub async fn judge(slot: &JudgePoolSlot, job: JudgeJob, timeout: Duration) -> BatchVerdict {
    let exchanges = job.batch.len();
    let Some(pool) = slot.get() else {
        return BatchVerdict::skipped(exchanges, "the judge pool is not running");
    };
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    match call_t!(pool, JudgePoolMsg::Judge, ms, Box::new(job)) {
        Ok(v) => v,
        Err(ractor::RactorErr::Timeout) => BatchVerdict::skipped(
            exchanges,
            format!(
                "the judge pool did not answer within {} s",
                timeout.as_secs()
            ),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "a judge batch was lost");
            BatchVerdict::skipped(exchanges, "the judge pool stopped during the batch")
        }
    }
}
