//! `TaskScheduler`: fires due tasks. Each firing becomes a `task_runs` row and
//! a pending message in the task's space, in one transaction, and the space
//! actor is woken; the turn itself runs through the space actor like any other.
//!
//! Must never: run a turn itself, or fire a task twice for one due time (the
//! task is advanced in the same transaction that queues the firing). Missed
//! fires during downtime collapse into one.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::SpaceDirectory;
use crate::clock::now_ms;
use crate::ids::SpaceId;
use crate::runtime::Runtime;
use crate::schedule::{next_fire, parse_cron, zone};
use crate::storage::tasks;
use crate::storage::StoreResult;

pub enum SchedulerMsg {
    /// Periodic: fire every task that is due.
    Tick,
}

pub struct SchedulerArgs {
    pub rt: Arc<Runtime>,
    pub spaces: SpaceDirectory,
}

pub struct SchedulerState {
    rt: Arc<Runtime>,
    spaces: SpaceDirectory,
}

pub struct TaskScheduler;

impl Actor for TaskScheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SchedulerMsg>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || SchedulerMsg::Tick);
        Ok(SchedulerState {
            rt: args.rt,
            spaces: args.spaces,
        })
    }

    async fn handle(
        &self,
        _me: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SchedulerMsg::Tick => {
                let deployment = state.rt.settings.timezone.clone();
                let fired = state
                    .rt
                    .store
                    .write(move |tx| fire_due(tx, &deployment))
                    .await;
                match fired {
                    Ok(spaces) => {
                        for space in spaces {
                            // Stored ids were checked when their space was made.
                            let Ok(id) = SpaceId::parse(&space) else {
                                tracing::error!(space = %space, "a task's space has an invalid id");
                                continue;
                            };
                            if let Err(e) = state.spaces.wake(&id).await {
                                tracing::warn!(space = %space, error = %e, "could not wake a space for its task");
                            }
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "task scheduler tick failed"),
                }
            }
        }
        Ok(())
    }
}

/// Queues every due task and advances it (a cron task to its next time on
/// its space's clock); returns the spaces to wake.
fn fire_due(tx: &crate::storage::Tx<'_>, deployment: &str) -> StoreResult<Vec<String>> {
    let now = now_ms();
    let mut woke = Vec::new();
    for task in tasks::due(tx, now)? {
        let next = match task.cron.as_deref().map(parse_cron) {
            Some(Ok(c)) => {
                let own = tasks::space_timezone(tx, &task.space_id)?;
                next_fire(&c, now, zone(own.as_deref(), deployment)).ok()
            }
            Some(Err(e)) => {
                tracing::error!(task = task.id, error = %e, "stored cron no longer parses; pausing the task");
                None
            }
            None => None,
        };
        tasks::advance(tx, task.id, next)?;
        tasks::queue_firing(tx, &task)?;
        if !woke.contains(&task.space_id) {
            woke.push(task.space_id.clone());
        }
    }
    Ok(woke)
}
