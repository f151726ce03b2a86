//! `ModelGate`: who may call the model when. Live turns (and tasks) always
//! go first and never wait; background work (the review judge) is admitted
//! through a bounded pool of slots and a governor rate limiter whose quota
//! adapts, so the judge takes whatever of the provider's budget live traffic
//! leaves (work-conserving) and gives it back as soon as live traffic needs it.
//!
//! Owns the admission rules, nothing else: it never calls a model itself.
//!
//! Must never: make a live turn wait (taking a live permit is a counter
//! increment), let background work run unbounded while the gate is `Gated`
//! (every background permit holds a slot and passed the limiter), or let the
//! quota leave `[floor, ceiling]`.
//!
//! The quota (background calls a minute) starts at the floor
//! (`review.calls_per_minute`, so a bot that is never idle still gets its
//! review done) and moves between it and the ceiling
//! (`review.calls_per_minute_max`):
//! - **down, by half**, when a provider answered 429 or 529 to any call
//!   (the [`ThrottleSignal`] the HTTP clients share with the gate), and no
//!   step up for [`HOLD_AFTER_DOWN`];
//! - **down, by a fifth**, when live calls queue: a live call that overlapped
//!   judge calls took over [`QUEUE_FACTOR`] times the recent live calls that
//!   ran alone (a local model serving one request at a time shows it so);
//! - **up**, at most once per [`STEP`], when a background caller found the
//!   limiter binding: by half when no live call ran in the last step (the
//!   provider is idle as far as this host knows), by a quarter otherwise
//!   (the provider may still have budget: only its 429 says it has none);
//!   but once a throttle was seen, fast only up to four fifths of the quota
//!   it came at, and above that by a two-hundredth a step (so the next probe
//!   of the budget comes some ten seconds later, not every few).
//!
//! So above the floor the judge probes the provider's budget and settles
//! just under what is left; a probe past it costs the calls of that moment
//! one rate-limit answer (retried by the client after the provider's own
//! `Retry-After`), after which the quota halves at once, and the slow last
//! fifth makes such probes rare (a live call pays for each one it meets).
//!
//! Where a provider states its budget on its answers, the judge need not
//! probe: a background call that passed the limiter also waits while what
//! is left of any fresh stated budget is down to the live calls' reserve
//! ([`LIVE_RESERVE`] of its rate), never longer than one call at the floor's
//! pace, so live calls find the budget they need without a 429.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Least time between two steps up of the quota.
pub const STEP: Duration = Duration::from_millis(250);

/// No step up for this long after a throttle.
pub const HOLD_AFTER_DOWN: Duration = Duration::from_secs(2);

/// A live call that overlapped judge calls and took this many times the
/// recent lone live calls counts as queued behind them.
pub const QUEUE_FACTOR: f64 = 3.0;

/// Default ceiling when none is configured.
pub const DEFAULT_CEILING: u32 = 3_000;

/// How background calls are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Slots of `review.max_concurrency` and the adaptive quota, live first.
    Gated,
    /// No slots, no limiter: only for `mercury bench review`, to measure
    /// what the gate buys.
    Open,
}

/// What the HTTP providers told this host about their rate limits: the
/// rate-limit answers (429, 529) they gave, and the budget they stated in
/// their answers' headers. Shared by every client of one host and its model
/// gate; cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct ThrottleSignal(Arc<ProviderSignals>);

#[derive(Debug, Default)]
struct ProviderSignals {
    throttles: AtomicU64,
    /// The last stated budget per provider family (OpenAI-style headers,
    /// Anthropic's): one key each per host.
    stated: Mutex<[Option<StatedBudget>; 2]>,
}

/// Which header family a stated budget came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetFamily {
    /// `x-ratelimit-{limit,remaining}-{requests,tokens}` (OpenAI and the
    /// servers that copy its API).
    OpenAi,
    /// `anthropic-ratelimit-{requests,tokens}-{limit,remaining}`.
    Anthropic,
}

/// One limit as a provider stated it: its size a minute and what is left.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatedLimit {
    pub per_minute: f64,
    pub remaining: f64,
}

/// A provider's stated budget, as read off one answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatedBudget {
    pub family: BudgetFamily,
    pub requests: Option<StatedLimit>,
    pub tokens: Option<StatedLimit>,
    pub at: Instant,
}

impl ThrottleSignal {
    pub fn note(&self) {
        self.0.throttles.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.0.throttles.load(Ordering::Relaxed)
    }

    /// Keeps the newest stated budget of its family.
    pub fn note_stated(&self, budget: StatedBudget) {
        let slot = match budget.family {
            BudgetFamily::OpenAi => 0,
            BudgetFamily::Anthropic => 1,
        };
        let mut stated = self
            .0
            .stated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stated[slot].is_none_or(|old| old.at <= budget.at) {
            stated[slot] = Some(budget);
        }
    }

    /// How long a background call should wait so that live calls keep
    /// their reserve of every fresh stated budget; `None` when it may go.
    ///
    /// Each limit refills at its size a minute; what is left now is the
    /// stated remainder plus the refill since it was stated. A background
    /// call needs one request (and the tokens reserve) above the reserve.
    fn reserve_shortfall(&self, now: Instant) -> Option<Duration> {
        let stated = *self
            .0
            .stated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut wait: Option<Duration> = None;
        for budget in stated.into_iter().flatten() {
            let age = now.saturating_duration_since(budget.at);
            if age > STATED_FRESH {
                continue;
            }
            let limits = [(budget.requests, 1.0), (budget.tokens, 0.0)];
            for (limit, need) in limits {
                let Some(limit) = limit else { continue };
                let per_second = limit.per_minute / 60.0;
                if !(per_second.is_finite() && per_second > 0.0) {
                    continue;
                }
                let reserve = (per_second * LIVE_RESERVE.as_secs_f64()).max(1.0);
                let left = (limit.remaining + per_second * age.as_secs_f64()).min(limit.per_minute);
                let short = reserve + need - left;
                if short > 0.0 {
                    let this = Duration::from_secs_f64((short / per_second).min(60.0));
                    wait = Some(wait.map_or(this, |w| w.max(this)));
                }
            }
        }
        wait
    }
}

/// The share of each stated budget kept for live calls, as the time it
/// takes to refill: background calls wait while less than this much of a
/// provider's stated rate is left, so a live call arriving then finds it.
pub const LIVE_RESERVE: Duration = Duration::from_millis(250);

/// A stated budget older than this is not trusted (no answer came since:
/// nothing is being spent, or the provider stopped stating it).
pub const STATED_FRESH: Duration = Duration::from_secs(2);

/// Shortest and longest sleep between two looks at the stated budget.
const RESERVE_TICK: (Duration, Duration) = (Duration::from_millis(2), STEP);

/// The background quota and what moves it.
struct AdaptiveQuota {
    per_minute: u32,
    floor: u32,
    ceiling: u32,
    limiter: Arc<DefaultDirectRateLimiter>,
    changed_at: Instant,
    hold_until: Instant,
    throttles_seen: u64,
    /// The quota when the last throttle came: where the budget ran out.
    found: Option<u32>,
}

impl AdaptiveQuota {
    fn new(floor: u32, ceiling: u32) -> Self {
        let floor = floor.max(1);
        let now = Instant::now();
        Self {
            per_minute: floor,
            floor,
            ceiling: ceiling.max(floor),
            limiter: Arc::new(limiter(floor)),
            changed_at: now,
            hold_until: now,
            throttles_seen: 0,
            found: None,
        }
    }

    /// Sets the quota (clamped); a new limiter only when it changed.
    fn set(&mut self, per_minute: u32, now: Instant) -> bool {
        let next = per_minute.clamp(self.floor, self.ceiling);
        self.changed_at = now;
        if next == self.per_minute {
            return false;
        }
        self.per_minute = next;
        self.limiter = Arc::new(limiter(next));
        true
    }
}

/// Burst of one, so calls are spread evenly.
fn limiter(per_minute: u32) -> DefaultDirectRateLimiter {
    let rate = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
    RateLimiter::direct(Quota::per_minute(rate).allow_burst(NonZeroU32::MIN))
}

pub struct ModelGate {
    admission: Admission,
    /// Live model calls in flight. Incremented by [`ModelGate::live`],
    /// decremented when the permit drops.
    live_in_flight: AtomicUsize,
    /// Background calls in flight (holding a permit).
    background_in_flight: Arc<AtomicUsize>,
    /// Background slots: one per concurrent judge call (`review.max_concurrency`).
    /// Never closed.
    slots: Arc<Semaphore>,
    max_slots: usize,
    quota: Mutex<AdaptiveQuota>,
    throttles: ThrottleSignal,
    /// When the gate was made: the origin of the microsecond stamps below.
    epoch: Instant,
    /// When the last live call started, in microseconds since `epoch` + 1
    /// (0: none yet).
    last_live_start: AtomicU64,
    /// Recent live calls that ran with no judge call in flight: an average
    /// of their durations in microseconds (0: none yet).
    lone_live_micros: AtomicU64,
    /// Steps down, and live calls seen queued (for the scan's log line).
    downs: AtomicU64,
    queued: AtomicU64,
    /// Background calls held back for the live calls' reserve.
    reserve_waits: AtomicU64,
}

impl std::fmt::Debug for ModelGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGate")
            .field("admission", &self.admission)
            .field("live_in_flight", &self.live_in_flight())
            .field("max_slots", &self.max_slots)
            .field("per_minute", &self.per_minute())
            .finish()
    }
}

/// Held by a live turn for the duration of one model call.
#[must_use = "the live permit counts the call only while it is held"]
pub struct LivePermit<'a> {
    gate: &'a ModelGate,
    started: Instant,
    /// Whether a judge call was in flight when this one started.
    overlapped: bool,
}

impl Drop for LivePermit<'_> {
    fn drop(&mut self) {
        let gate = self.gate;
        gate.live_in_flight.fetch_sub(1, Ordering::AcqRel);
        let overlapped = self.overlapped || gate.background_in_flight.load(Ordering::Acquire) > 0;
        gate.live_finished(self.started.elapsed(), overlapped);
    }
}

/// Held by a background caller for the duration of one model call.
#[must_use = "the background slot is released when the permit drops"]
pub struct BackgroundPermit {
    _slot: Option<OwnedSemaphorePermit>,
    in_flight: Option<Arc<AtomicUsize>>,
}

impl Drop for BackgroundPermit {
    fn drop(&mut self) {
        if let Some(n) = &self.in_flight {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl ModelGate {
    /// A gated gate: `max_concurrency` background slots, a quota starting at
    /// `calls_per_minute` (its floor) with the default ceiling.
    pub fn new(max_concurrency: u32, calls_per_minute: u32) -> Self {
        Self::build(Admission::Gated, max_concurrency, calls_per_minute)
    }

    /// No admission control for background calls (bench only).
    pub fn open() -> Self {
        Self::build(Admission::Open, 1, 1)
    }

    pub fn with_admission(
        admission: Admission,
        max_concurrency: u32,
        calls_per_minute: u32,
    ) -> Self {
        Self::build(admission, max_concurrency, calls_per_minute)
    }

    fn build(admission: Admission, max_concurrency: u32, calls_per_minute: u32) -> Self {
        let slots = max_concurrency.max(1) as usize;
        Self {
            admission,
            live_in_flight: AtomicUsize::new(0),
            background_in_flight: Arc::new(AtomicUsize::new(0)),
            slots: Arc::new(Semaphore::new(slots)),
            max_slots: slots,
            quota: Mutex::new(AdaptiveQuota::new(
                calls_per_minute,
                DEFAULT_CEILING.max(calls_per_minute),
            )),
            throttles: ThrottleSignal::default(),
            epoch: Instant::now(),
            last_live_start: AtomicU64::new(0),
            lone_live_micros: AtomicU64::new(0),
            downs: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            reserve_waits: AtomicU64::new(0),
        }
    }

    /// The quota's ceiling (`review.calls_per_minute_max`; at least the floor).
    pub fn with_ceiling(self, ceiling: u32) -> Self {
        {
            let mut q = self.lock();
            q.ceiling = ceiling.max(q.floor);
        }
        self
    }

    /// The providers' throttle signal this gate listens to.
    pub fn with_throttles(mut self, throttles: ThrottleSignal) -> Self {
        let seen = throttles.count();
        self.lock().throttles_seen = seen;
        self.throttles = throttles;
        self
    }

    fn lock(&self) -> MutexGuard<'_, AdaptiveQuota> {
        // A poisoned quota is still a quota within its bounds.
        self.quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// Background calls that may run at once; `None` when the gate is open.
    pub fn background_slots(&self) -> Option<usize> {
        match self.admission {
            Admission::Gated => Some(self.max_slots),
            Admission::Open => None,
        }
    }

    /// The background quota now, in calls a minute.
    pub fn per_minute(&self) -> u32 {
        self.lock().per_minute
    }

    /// The quota's floor: the slowest background calls are ever admitted.
    pub fn floor_per_minute(&self) -> u32 {
        self.lock().floor
    }

    pub fn live_in_flight(&self) -> usize {
        self.live_in_flight.load(Ordering::Acquire)
    }

    fn micros_since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A live model call starts. Never waits.
    pub fn live(&self) -> LivePermit<'_> {
        self.live_in_flight.fetch_add(1, Ordering::AcqRel);
        self.last_live_start.store(
            self.micros_since_epoch().saturating_add(1),
            Ordering::Relaxed,
        );
        LivePermit {
            gate: self,
            started: Instant::now(),
            overlapped: self.background_in_flight.load(Ordering::Acquire) > 0,
        }
    }

    /// A live call ended: a lone one updates the baseline; one that ran
    /// beside judge calls and took far longer than it means live calls
    /// queue behind them.
    fn live_finished(&self, took: Duration, overlapped: bool) {
        if self.admission == Admission::Open {
            return;
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let lone = self.lone_live_micros.load(Ordering::Relaxed);
        if !overlapped {
            // An average over about the last eight lone calls.
            let next = if lone == 0 {
                micros
            } else {
                lone - lone / 8 + micros / 8
            };
            self.lone_live_micros.store(next.max(1), Ordering::Relaxed);
            return;
        }
        if lone > 0 && micros as f64 > lone as f64 * QUEUE_FACTOR {
            self.queued.fetch_add(1, Ordering::Relaxed);
            let mut q = self.lock();
            let now = Instant::now();
            let next = q.per_minute - q.per_minute / 5;
            if q.set(next, now) {
                self.downs.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until a background call may start: a free slot, then the
    /// limiter at the quota of the moment.
    pub async fn background(&self) -> BackgroundPermit {
        if self.admission == Admission::Open {
            return BackgroundPermit {
                _slot: None,
                in_flight: None,
            };
        }
        // The semaphore is owned by the gate and never closed, so acquiring
        // cannot fail; if it ever did, running without a slot beats
        // deadlocking the scan, and the limiter still bounds the rate.
        let slot = self.slots.clone().acquire_owned().await.ok();
        let limiter = self.adapt(false);
        if limiter.check().is_err() {
            // The quota binds: the judge could use more than it gets. Look
            // again every step while waiting, so a quota far below what the
            // provider allows climbs at the step's pace, not at its own.
            loop {
                let limiter = self.adapt(true);
                if tokio::time::timeout(STEP, limiter.until_ready())
                    .await
                    .is_ok()
                {
                    break;
                }
            }
        }
        self.keep_live_reserve().await;
        self.background_in_flight.fetch_add(1, Ordering::AcqRel);
        BackgroundPermit {
            _slot: slot,
            in_flight: Some(self.background_in_flight.clone()),
        }
    }

    /// Waits while a provider's stated budget is down to the live calls'
    /// reserve, but never longer than one call at the floor's pace takes,
    /// so the floor still holds when live traffic uses the whole budget.
    async fn keep_live_reserve(&self) {
        let started = Instant::now();
        let patience = Duration::from_secs(60) / self.floor_per_minute().max(1);
        let mut held = false;
        while let Some(short) = self.throttles.reserve_shortfall(Instant::now()) {
            if started.elapsed() >= patience {
                return;
            }
            if !held {
                held = true;
                self.reserve_waits.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(short.clamp(RESERVE_TICK.0, RESERVE_TICK.1)).await;
        }
    }

    /// Applies the throttle signal and, when `pressed` (the limiter binds),
    /// a step up; returns the limiter of the resulting quota.
    fn adapt(&self, pressed: bool) -> Arc<DefaultDirectRateLimiter> {
        let now = Instant::now();
        let throttles = self.throttles.count();
        let mut q = self.lock();
        if throttles > q.throttles_seen {
            q.throttles_seen = throttles;
            q.found = Some(q.per_minute);
            let next = q.per_minute / 2;
            if q.set(next, now) {
                self.downs.fetch_add(1, Ordering::Relaxed);
            }
            q.hold_until = now + HOLD_AFTER_DOWN;
        } else if pressed && now >= q.hold_until && now.duration_since(q.changed_at) >= STEP {
            let last_live = self.last_live_start.load(Ordering::Relaxed);
            let since_live = self
                .micros_since_epoch()
                .saturating_sub(last_live.saturating_sub(1));
            let idle = self.live_in_flight() == 0
                && (last_live == 0 || since_live >= STEP.as_micros() as u64);
            let near = q.found.map(|found| u64::from(found) * 4 / 5);
            let next = match near {
                Some(near) if u64::from(q.per_minute) >= near => {
                    q.per_minute.saturating_add((q.per_minute / 200).max(1))
                }
                _ => {
                    let step = if idle {
                        q.per_minute / 2
                    } else {
                        q.per_minute / 4
                    };
                    let fast = q.per_minute.saturating_add(step.max(1));
                    near.map_or(fast, |near| {
                        fast.min(u32::try_from(near).unwrap_or(u32::MAX))
                            .max(q.per_minute + 1)
                    })
                }
            };
            q.set(next, now);
        }
        q.limiter.clone()
    }

    /// Since start: steps down of the quota, and live calls seen queued
    /// behind judge calls (for the scan's log line).
    pub fn adaptations(&self) -> (u64, u64) {
        (
            self.downs.load(Ordering::Relaxed),
            self.queued.load(Ordering::Relaxed),
        )
    }

    /// Since start: background calls held back for the live reserve.
    pub fn reserve_waits(&self) -> u64 {
        self.reserve_waits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn live_permits_never_wait_and_count_in_flight() {
        let gate = ModelGate::new(1, 1);
        let a = gate.live();
        let b = gate.live();
        assert_eq!(gate.live_in_flight(), 2);
        drop(a);
        assert_eq!(gate.live_in_flight(), 1);
        drop(b);
        assert_eq!(gate.live_in_flight(), 0);
    }

    #[tokio::test]
    async fn background_runs_beside_live_calls_work_conserving() {
        let gate = ModelGate::new(1, 6000);
        let _live = gate.live();
        let _p = tokio::time::timeout(Duration::from_millis(500), gate.background())
            .await
            .expect("a judge call is not held back while a live call runs");
    }

    #[tokio::test]
    async fn a_waiting_judge_call_sees_the_quota_climb_at_the_steps_pace() {
        // 6 a minute: the second call would wait 10 s at the floor.
        let gate = ModelGate::new(1, 6).with_ceiling(600);
        drop(gate.background().await);
        let started = Instant::now();
        drop(
            tokio::time::timeout(Duration::from_secs(3), gate.background())
                .await
                .expect("the quota climbs while the call waits"),
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(gate.per_minute() > 6, "{}", gate.per_minute());
    }

    #[tokio::test]
    async fn a_throttle_halves_the_quota_down_to_the_floor_and_holds_it() {
        let throttles = ThrottleSignal::default();
        let gate = ModelGate::new(4, 100)
            .with_ceiling(1000)
            .with_throttles(throttles.clone());
        gate.lock().set(800, Instant::now());
        throttles.note();
        drop(gate.background().await);
        assert_eq!(gate.per_minute(), 400);
        // Each new throttle halves again; the floor holds.
        for want in [200, 100, 100] {
            throttles.note();
            drop(gate.adapt(false));
            assert_eq!(gate.per_minute(), want);
        }
        assert_eq!(gate.adaptations().0, 3, "only real changes count as steps");
        // Within the hold, a binding limiter does not step up.
        gate.lock().changed_at = Instant::now() - STEP * 2;
        drop(gate.adapt(true));
        assert_eq!(gate.per_minute(), 100);
    }

    #[tokio::test]
    async fn a_binding_limiter_steps_up_by_half_when_idle_by_a_quarter_beside_live_calls() {
        let gate = ModelGate::new(1, 100).with_ceiling(190);
        let past = Instant::now() - STEP * 2;
        gate.lock().changed_at = past;
        drop(gate.adapt(true));
        assert_eq!(gate.per_minute(), 150, "idle provider: up by half");
        // At most one step per STEP.
        drop(gate.adapt(true));
        assert_eq!(gate.per_minute(), 150);
        // Not pressed: no step, however long since the last.
        gate.lock().changed_at = past;
        drop(gate.adapt(false));
        assert_eq!(gate.per_minute(), 150);
        let live = gate.live();
        drop(gate.adapt(true));
        assert_eq!(gate.per_minute(), 187, "beside live calls: up by a quarter");
        drop(live);
        // The ceiling holds.
        gate.lock().changed_at = past;
        gate.last_live_start.store(0, Ordering::Relaxed);
        drop(gate.adapt(true));
        assert_eq!(gate.per_minute(), 190);
    }

    #[tokio::test]
    async fn after_a_throttle_the_quota_climbs_fast_to_four_fifths_then_by_a_two_hundredth() {
        let throttles = ThrottleSignal::default();
        let gate = ModelGate::new(1, 10)
            .with_ceiling(10_000)
            .with_throttles(throttles.clone());
        gate.lock().set(1000, Instant::now());
        throttles.note();
        drop(gate.adapt(false));
        assert_eq!(gate.per_minute(), 500);
        let mut seen = Vec::new();
        for _ in 0..6 {
            {
                let mut q = gate.lock();
                q.hold_until = Instant::now();
                q.changed_at = Instant::now() - STEP * 2;
            }
            gate.last_live_start.store(0, Ordering::Relaxed);
            drop(gate.adapt(true));
            seen.push(gate.per_minute());
        }
        // Idle: up by half, but not past 800 (four fifths of where the
        // budget ran out); then a two-hundredth a step.
        assert_eq!(seen, vec![750, 800, 804, 808, 812, 816]);
    }

    #[tokio::test]
    async fn a_live_call_queued_behind_judge_calls_steps_the_quota_down() {
        let gate = ModelGate::new(2, 100).with_ceiling(1000);
        gate.lock().set(500, Instant::now());
        // Lone live calls of about 10 ms set the baseline.
        for _ in 0..4 {
            gate.live_finished(Duration::from_millis(10), false);
        }
        // Beside a judge call but not slower: nothing changes.
        gate.live_finished(Duration::from_millis(20), true);
        assert_eq!(gate.per_minute(), 500);
        // Four times slower beside a judge call: down by a fifth.
        gate.live_finished(Duration::from_millis(40), true);
        assert_eq!(gate.per_minute(), 400);
        assert_eq!(gate.adaptations(), (1, 1));
        // Overlap is seen through the permits themselves.
        let judge = gate.background().await;
        let live = gate.live();
        assert!(live.overlapped);
        drop(live);
        drop(judge);
    }

    #[tokio::test]
    async fn background_slots_bound_concurrency() {
        let gate = Arc::new(ModelGate::new(2, 60_000));
        let first = gate.background().await;
        let _second = gate.background().await;
        let third = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _p = gate.background().await;
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!third.is_finished(), "a third call got in with two slots");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("the third call gets the freed slot")
            .unwrap();
    }

    #[tokio::test]
    async fn the_limiter_spaces_background_calls() {
        // 600 a minute with a burst of one: a call every 100 ms.
        let gate = ModelGate::new(4, 600);
        let started = Instant::now();
        for _ in 0..3 {
            let _p = gate.background().await;
        }
        assert!(
            started.elapsed() >= Duration::from_millis(190),
            "{:?}",
            started.elapsed()
        );
    }

    fn stated(per_minute: f64, remaining: f64, age: Duration) -> StatedBudget {
        StatedBudget {
            family: BudgetFamily::OpenAi,
            requests: Some(StatedLimit {
                per_minute,
                remaining,
            }),
            tokens: None,
            at: Instant::now() - age,
        }
    }

    #[tokio::test]
    async fn a_background_call_waits_while_a_stated_budget_is_down_to_the_live_reserve() {
        let throttles = ThrottleSignal::default();
        // A floor of one a minute: the patience (one call at the floor's
        // pace) is a minute, longer than anything waited here.
        let gate = ModelGate::new(1, 1).with_throttles(throttles.clone());
        // 1,200 a minute is 20 a second: a reserve of 5, so a judge call
        // needs 6 left; none is, so it waits about 300 ms of refill.
        throttles.note_stated(stated(1200.0, 0.0, Duration::ZERO));
        let started = Instant::now();
        drop(gate.background().await);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert!(gate.reserve_waits() > 0);
    }

    #[tokio::test]
    async fn a_stated_budget_with_room_or_gone_stale_holds_nothing_back() {
        let throttles = ThrottleSignal::default();
        throttles.note_stated(stated(1200.0, 6.0, Duration::ZERO));
        assert_eq!(throttles.reserve_shortfall(Instant::now()), None);
        // Down to the reserve: a wait of the refill for one more.
        throttles.note_stated(stated(1200.0, 5.0, Duration::ZERO));
        let short = throttles.reserve_shortfall(Instant::now()).unwrap();
        assert!(short <= Duration::from_millis(50), "{short:?}");
        // An older reading never replaces a newer one.
        throttles.note_stated(stated(1200.0, 600.0, Duration::from_millis(500)));
        assert!(throttles.reserve_shortfall(Instant::now()).is_some());
        // Stale: no answer came for longer than STATED_FRESH.
        throttles.note_stated(stated(1200.0, 0.0, Duration::ZERO));
        let later = Instant::now() + STATED_FRESH + Duration::from_millis(1);
        assert_eq!(throttles.reserve_shortfall(later), None);
        // The tightest family decides.
        throttles.note_stated(StatedBudget {
            family: BudgetFamily::Anthropic,
            requests: None,
            tokens: Some(StatedLimit {
                per_minute: 60_000.0,
                remaining: 0.0,
            }),
            at: Instant::now(),
        });
        let both = throttles.reserve_shortfall(Instant::now()).unwrap();
        // Tokens: a reserve of 250, 1,000 a second: 250 ms; requests: 300 ms.
        assert!(both >= Duration::from_millis(280), "{both:?}");
    }

    #[tokio::test]
    async fn the_live_reserve_never_holds_a_call_past_the_floors_pace() {
        let throttles = ThrottleSignal::default();
        // A floor of 600 a minute: at most 100 ms of waiting for the reserve.
        let gate = ModelGate::new(1, 600).with_throttles(throttles.clone());
        // One a minute left to refill: two seconds short.
        throttles.note_stated(stated(60.0, 0.0, Duration::ZERO));
        let started = Instant::now();
        drop(gate.background().await);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(90) && waited < Duration::from_millis(1500),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn an_open_gate_admits_everything_at_once() {
        let gate = ModelGate::open();
        let _live = gate.live();
        let permits: Vec<_> =
            futures_util::future::join_all((0..50).map(|_| gate.background())).await;
        assert_eq!(permits.len(), 50);
        assert_eq!(gate.background_slots(), None);
    }
}
