//! `ModelGate`: who may call the model when. Live turns always go first;
//! background work (the review judge) is admitted through a bounded pool of
//! slots, a rate limiter, and only while no live call is in flight.
//!
//! Owns the admission rules, nothing else: it never calls a model itself.
//!
//! Must never: make a live turn wait (taking a live permit is a counter
//! increment), or let background work run unbounded while the gate is
//! `Gated` (every background permit holds a slot and passed the limiter).
//!
//! Live-first is a deferral, not a ban: a background caller waits for the
//! live calls in flight to finish, but at most [`ModelGate::max_defer`] per
//! permit, so a bot that is never idle still gets its daily review done (at
//! the limiter's pace, one slot at a time).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How long one background permit may be deferred for live calls.
pub const DEFAULT_MAX_DEFER: Duration = Duration::from_secs(10);

/// How background calls are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Slots of `review.max_concurrency`, `review.calls_per_minute`, live first.
    Gated,
    /// No slots, no limiter, no deferral: only for `mercury bench review`, to
    /// measure what the gate buys.
    Open,
}

pub struct ModelGate {
    admission: Admission,
    /// Live model calls in flight. Incremented by [`ModelGate::live`],
    /// decremented when the permit drops.
    live_in_flight: AtomicUsize,
    /// Signalled whenever `live_in_flight` drops to zero; background callers
    /// waiting for live calls to finish listen on it. Never closed.
    live_idle: Notify,
    /// Background slots: one per concurrent judge call (`review.max_concurrency`).
    /// Acquired by [`ModelGate::background`], released when the permit drops.
    /// Never closed.
    slots: Arc<Semaphore>,
    max_slots: usize,
    /// Background call rate (`review.calls_per_minute`, burst of one so calls
    /// are spread evenly). Only background callers consult it.
    limiter: DefaultDirectRateLimiter,
    max_defer: Duration,
    /// Background permits that found a live call in flight and held back.
    deferrals: AtomicU64,
    /// Total time those permits held back, in microseconds.
    deferred_micros: AtomicU64,
}

impl std::fmt::Debug for ModelGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGate")
            .field("admission", &self.admission)
            .field("live_in_flight", &self.live_in_flight())
            .field("max_slots", &self.max_slots)
            .finish()
    }
}

/// Held by a live turn for the duration of one model call.
#[must_use = "the live permit counts the call only while it is held"]
pub struct LivePermit<'a> {
    gate: &'a ModelGate,
}

impl Drop for LivePermit<'_> {
    fn drop(&mut self) {
        if self.gate.live_in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.gate.live_idle.notify_waiters();
        }
    }
}

/// Held by a background caller for the duration of one model call.
#[must_use = "the background slot is released when the permit drops"]
pub struct BackgroundPermit {
    _slot: Option<OwnedSemaphorePermit>,
}

impl ModelGate {
    /// A gated gate: `max_concurrency` background slots, `calls_per_minute`
    /// background calls (both clamped to at least one).
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
        let rate = NonZeroU32::new(calls_per_minute).unwrap_or(NonZeroU32::MIN);
        Self {
            admission,
            live_in_flight: AtomicUsize::new(0),
            live_idle: Notify::new(),
            slots: Arc::new(Semaphore::new(slots)),
            max_slots: slots,
            limiter: RateLimiter::direct(Quota::per_minute(rate).allow_burst(NonZeroU32::MIN)),
            max_defer: DEFAULT_MAX_DEFER,
            deferrals: AtomicU64::new(0),
            deferred_micros: AtomicU64::new(0),
        }
    }

    /// Changes how long a background permit may be deferred for live calls.
    pub fn with_max_defer(mut self, max_defer: Duration) -> Self {
        self.max_defer = max_defer;
        self
    }

    pub fn admission(&self) -> Admission {
        self.admission
    }

    pub fn max_defer(&self) -> Duration {
        self.max_defer
    }

    /// Background calls that may run at once; `None` when the gate is open.
    pub fn background_slots(&self) -> Option<usize> {
        match self.admission {
            Admission::Gated => Some(self.max_slots),
            Admission::Open => None,
        }
    }

    pub fn live_in_flight(&self) -> usize {
        self.live_in_flight.load(Ordering::Acquire)
    }

    /// A live model call starts. Never waits.
    pub fn live(&self) -> LivePermit<'_> {
        self.live_in_flight.fetch_add(1, Ordering::AcqRel);
        LivePermit { gate: self }
    }

    /// Waits until a background call may start: a free slot, then the
    /// limiter, then no live call in flight (deferred at most `max_defer`).
    pub async fn background(&self) -> BackgroundPermit {
        if self.admission == Admission::Open {
            return BackgroundPermit { _slot: None };
        }
        // The semaphore is owned by the gate and never closed, so acquiring
        // cannot fail; if it ever did, running without a slot beats
        // deadlocking the scan, and the limiter still bounds the rate.
        let slot = self.slots.clone().acquire_owned().await.ok();
        self.limiter.until_ready().await;
        if self.live_in_flight() > 0 {
            let held = Instant::now();
            let _ = tokio::time::timeout(self.max_defer, self.live_idle()).await;
            self.deferrals.fetch_add(1, Ordering::Relaxed);
            let micros = u64::try_from(held.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.deferred_micros.fetch_add(micros, Ordering::Relaxed);
        }
        BackgroundPermit { _slot: slot }
    }

    /// Since start: how many background permits held back for live calls,
    /// and for how long in total (for the scan's log line).
    pub fn deferrals(&self) -> (u64, Duration) {
        (
            self.deferrals.load(Ordering::Relaxed),
            Duration::from_micros(self.deferred_micros.load(Ordering::Relaxed)),
        )
    }

    /// Resolves when no live call is in flight.
    async fn live_idle(&self) {
        loop {
            let idle = self.live_idle.notified();
            tokio::pin!(idle);
            // Register before checking, so a drop to zero in between is seen.
            idle.as_mut().enable();
            if self.live_in_flight() == 0 {
                return;
            }
            idle.await;
        }
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
    async fn background_waits_for_live_calls_to_finish() {
        let gate = Arc::new(ModelGate::new(1, 6000));
        let live = gate.live();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _p = gate.background().await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "background ran while a live call was in flight"
        );
        let released = Instant::now();
        drop(live);
        let admitted = waiter.await.unwrap();
        assert!(admitted >= released);
    }

    #[tokio::test]
    async fn background_deferral_is_bounded() {
        let gate = ModelGate::new(1, 6000).with_max_defer(Duration::from_millis(50));
        let _live = gate.live();
        let started = Instant::now();
        let _p = tokio::time::timeout(Duration::from_secs(5), gate.background())
            .await
            .expect("a background permit must not wait for ever behind live calls");
        assert!(started.elapsed() >= Duration::from_millis(50));
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
