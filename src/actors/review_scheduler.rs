//! `ReviewScheduler`: starts review scans, at `review.daily_at` in
//! `review.timezone` when `review.enabled`, and on demand (`run-now`). One
//! scan at a time: a run-now while a scan runs joins that scan.
//!
//! The scan runs in its own task so the mailbox stays responsive; it is
//! cancelled with this actor's state (stop or failure), and start-up marks a
//! run left `running` by a crash `interrupted`. A day whose fire time passed
//! while the host was down is caught up once: the scheduler fires when no
//! review run has started since that day's fire time.
//!
//! Must never: run two scans at once, fire twice for one day, or keep a scan
//! running after the actor is gone.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use ractor::{call_t, Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::parse_daily_at;
use crate::review::catalog::{ReportKind, ReportName};
use crate::review::scan::{self, ScanContext, ScanTicket, ScanTrigger, RUN_KIND};
use crate::review::ReviewError;

/// The deployment lease whose holder runs the scheduled review (issue 28).
pub const REVIEW_LEASE: &str = "review";

/// How often the scheduler looks at the clock.
pub const TICK: Duration = Duration::from_secs(15);
/// How long a run-now request waits for the scheduler to start (or join) a scan.
pub const RUN_NOW_TIMEOUT_MS: u64 = 10_000;

pub enum ReviewSchedulerMsg {
    /// Look at the clock: fire the daily scan if it is due.
    Tick,
    /// Start a scan now (or join the running one) for this caller.
    RunNow(String, RpcReplyPort<ScanTicket>),
    /// The scan with this run id has ended.
    ScanEnded(String),
}

pub struct ReviewSchedulerArgs {
    pub ctx: ScanContext,
}

struct RunningScan {
    ticket: ScanTicket,
    /// Cancels the scan if this state is dropped (the actor stopped or failed).
    _cancel_on_drop: DropGuard,
}

pub struct ReviewSchedulerState {
    ctx: ScanContext,
    running: Option<RunningScan>,
    /// The local date the daily scan last fired (or was found done) for.
    fired_for: Option<NaiveDate>,
    /// The day the weekly synthesis last fired (`review.weekly_at`).
    weekly_fired_for: Option<NaiveDate>,
}

pub struct ReviewScheduler;

impl Actor for ReviewScheduler {
    type Msg = ReviewSchedulerMsg;
    type State = ReviewSchedulerState;
    type Arguments = ReviewSchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReviewSchedulerMsg>,
        args: ReviewSchedulerArgs,
    ) -> Result<ReviewSchedulerState, ActorProcessingErr> {
        myself.send_interval(TICK, || ReviewSchedulerMsg::Tick);
        let _ = myself.cast(ReviewSchedulerMsg::Tick);
        Ok(ReviewSchedulerState {
            ctx: args.ctx,
            running: None,
            fired_for: None,
            weekly_fired_for: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ReviewSchedulerMsg>,
        msg: ReviewSchedulerMsg,
        state: &mut ReviewSchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReviewSchedulerMsg::Tick => {
                // One of many hosts: the daily scan and the weekly synthesis
                // run on the host holding the deployment's review lease.
                let ours = match &state.ctx.rt.cluster {
                    Some(seat) if state.ctx.rt.settings.review.enabled => {
                        seat.hold_named(REVIEW_LEASE).await
                    }
                    Some(_) => false,
                    None => true,
                };
                if ours {
                    weekly_tick(state);
                    tick(&myself, state).await;
                }
            }
            ReviewSchedulerMsg::RunNow(caller, reply) => {
                let ticket = match &state.running {
                    Some(r) => r.ticket.clone(),
                    None => start(&myself, state, ScanTrigger::RunNow { caller }),
                };
                let _ = reply.send(ticket);
            }
            ReviewSchedulerMsg::ScanEnded(run_id) => {
                if state.running.as_ref().map(|r| r.ticket.run_id.as_str()) == Some(run_id.as_str())
                {
                    state.running = None;
                }
            }
        }
        Ok(())
    }
}

fn start(
    myself: &ActorRef<ReviewSchedulerMsg>,
    state: &mut ReviewSchedulerState,
    trigger: ScanTrigger,
) -> ScanTicket {
    let run_id = crate::ids::RunId::new().to_string();
    let (ticket, done) = ScanTicket::new(run_id.clone());
    let cancel = CancellationToken::new();
    state.running = Some(RunningScan {
        ticket: ticket.clone(),
        _cancel_on_drop: cancel.clone().drop_guard(),
    });
    let (ctx, me) = (state.ctx.clone(), myself.clone());
    tokio::spawn(async move {
        let summary = scan::run(&ctx, &run_id, &trigger, cancel).await;
        let _ = done.send(Some(Arc::new(summary)));
        let _ = me.cast(ReviewSchedulerMsg::ScanEnded(run_id));
    });
    ticket
}

/// Fires the weekly synthesis once on `review.weekly_at`'s day after its
/// time, unless that day's weekly report exists already (a restart).
fn weekly_tick(state: &mut ReviewSchedulerState) {
    let review = &state.ctx.rt.settings.review;
    if !review.enabled || review.weekly_at.trim().is_empty() {
        return;
    }
    let Ok((weekday, at)) = crate::config::parse_weekly_at(&review.weekly_at) else {
        return;
    };
    let now = Utc::now();
    let (date, fire) = todays_fire(now, at, &review.tz());
    if chrono::Datelike::weekday(&date) != weekday
        || now < fire
        || state.weekly_fired_for == Some(date)
    {
        return;
    }
    state.weekly_fired_for = Some(date);
    let report = ReportName {
        date: date.format("%Y-%m-%d").to_string(),
        kind: ReportKind::Weekly,
    }
    .dir(&state.ctx.rt.paths.reviews)
    .join("report.json");
    if report.exists() {
        return;
    }
    let rt = state.ctx.rt.clone();
    tracing::info!(date = %date, at = %review.weekly_at, "weekly review synthesis due");
    tokio::spawn(async move {
        match crate::review::weekly::run(rt).await {
            Ok(s) => {
                tracing::info!(report = %s.report_path, clusters = s.clusters, "weekly review written");
            }
            Err(e) => tracing::error!(error = %e, "weekly review failed"),
        }
    });
}

async fn tick(myself: &ActorRef<ReviewSchedulerMsg>, state: &mut ReviewSchedulerState) {
    let review = &state.ctx.rt.settings.review;
    if !review.enabled || state.running.is_some() {
        return;
    }
    // Validated at start-up; a failure here means "never fire".
    let Ok(at) = parse_daily_at(&review.daily_at) else {
        return;
    };
    let now = Utc::now();
    let (date, fire) = todays_fire(now, at, &review.tz());
    if now < fire || state.fired_for == Some(date) {
        return;
    }
    let since = fire.timestamp_millis();
    let done_already = state
        .ctx
        .rt
        .store
        .read(move |c| Ok(crate::storage::stats::runs_of_kind_since(c, RUN_KIND, since)? > 0))
        .await;
    match done_already {
        Ok(true) => state.fired_for = Some(date),
        Ok(false) => {
            tracing::info!(date = %date, at = %review.daily_at, timezone = %review.timezone, "daily review scan due");
            state.fired_for = Some(date);
            start(myself, state, ScanTrigger::Schedule);
        }
        Err(e) => tracing::error!(error = %e, "cannot check for today's review run"),
    }
}

/// Today's local date in `tz` and the instant of today's fire time. A fire
/// time that does not exist that day (a DST gap) moves to the first instant
/// after the gap; an ambiguous one takes the earlier instant.
pub fn todays_fire<Z: TimeZone>(
    now: DateTime<Utc>,
    (h, m): (u32, u32),
    tz: &Z,
) -> (NaiveDate, DateTime<Utc>) {
    let date = now.with_timezone(tz).date_naive();
    let local = date.and_hms_opt(h, m, 0).unwrap_or_default();
    let fire = (0..=2)
        .find_map(|hours| {
            tz.from_local_datetime(&(local + chrono::Duration::hours(hours)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(now);
    (date, fire)
}

/// When the daily scan fires next after `now`; `None` when review is off
/// (or its time of day does not parse, which start-up refuses, as it refuses
/// a zone that does not parse: `ReviewConfig::tz` would read that as UTC).
pub fn next_fire(
    review: &crate::config::ReviewConfig,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if !review.enabled {
        return None;
    }
    let at = parse_daily_at(&review.daily_at).ok()?;
    let tz = review.tz();
    let (_, today) = todays_fire(now, at, &tz);
    if today > now {
        return Some(today);
    }
    Some(todays_fire(now + chrono::Duration::hours(24), at, &tz).1)
}

/// How the API reaches the review scheduler; kept current by the supervisor.
pub type ReviewHandle = super::ActorSlot<ReviewSchedulerMsg>;

impl ReviewHandle {
    /// Starts a scan now (or joins the running one).
    pub async fn run_now(&self, caller: &str) -> Result<ScanTicket, ReviewError> {
        // Right after start-up, or while the supervisor restarts it, the
        // scheduler may be a moment away: wait for it a little.
        let mut actor = self.get();
        for _ in 0..50 {
            if actor.as_ref().map(|a| a.get_status()) == Some(ractor::ActorStatus::Running) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            actor = self.get();
        }
        let actor = actor.ok_or_else(|| {
            ReviewError::Unavailable("the review scheduler is not running".into())
        })?;
        call_t!(
            actor,
            ReviewSchedulerMsg::RunNow,
            RUN_NOW_TIMEOUT_MS,
            caller.to_owned()
        )
        .map_err(|e| ReviewError::Unavailable(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn review_fire_time_is_local_to_the_timezone() {
        let tz: chrono_tz::Tz = "Europe/Amsterdam".parse().unwrap();
        // 03:30 UTC on 2026-09-28 is 05:30 in Amsterdam (CEST): 04:00 local was 02:00 UTC.
        let (date, fire) = todays_fire(utc("2026-09-28T03:30:00Z"), (4, 0), &tz);
        assert_eq!(date.to_string(), "2026-09-28");
        assert_eq!(fire, utc("2026-09-28T02:00:00Z"));
        // 23:30 UTC is already the next local day.
        let (date, fire) = todays_fire(utc("2026-09-28T23:30:00Z"), (4, 0), &tz);
        assert_eq!(date.to_string(), "2026-09-29");
        assert_eq!(fire, utc("2026-09-29T02:00:00Z"));
        let (_, fire) = todays_fire(utc("2026-09-28T10:00:00Z"), (4, 0), &chrono_tz::UTC);
        assert_eq!(fire, utc("2026-09-28T04:00:00Z"));
    }

    #[test]
    fn review_fire_time_in_a_dst_gap_moves_past_it() {
        let tz: chrono_tz::Tz = "Europe/Amsterdam".parse().unwrap();
        // 2026-03-29: clocks jump from 02:00 to 03:00 local; 02:30 does not exist.
        let (_, fire) = todays_fire(utc("2026-03-29T12:00:00Z"), (2, 30), &tz);
        assert_eq!(fire, utc("2026-03-29T01:30:00Z"));
    }
}
