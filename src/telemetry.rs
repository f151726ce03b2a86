//! The host's Prometheus metrics: one [`Metrics`] per runtime, counted where
//! the work happens (turns, model calls, sandbox starts, judge calls, act-as
//! requests, ingress decisions) and sampled at scrape time for what is a
//! state (queue depth, active spaces, held-back judge calls, adapters).
//!
//! Label values come from small fixed sets (kind, status, provider,
//! decision, level, HTTP status, adapter name) and the few busiest spaces of
//! the queue: never a caller, a message or one label per space, so 10,000
//! spaces cost the same as one.
//!
//! Must never: take a label value from chat text or a caller id, or grow a
//! family without bound (the per-space queue family is cleared and refilled
//! with at most [`TOP_SPACES`] spaces on every scrape).

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How many of the busiest spaces get their own queue-depth series.
pub(crate) const TOP_SPACES: usize = 5;

/// The content type of the text exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindStatus {
    kind: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderOutcome {
    provider: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderDirection {
    provider: String,
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Backend {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PurposeModel {
    purpose: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelStatus {
    level: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Space {
    space: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Adapter {
    adapter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Version {
    version: String,
}

type Seconds = Family<Kind, Histogram, fn() -> Histogram>;

/// 5 ms to about 20 minutes: a tool-less turn, a slow model, a long turn.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 18))
}

/// What a scrape samples from the host's state (see [`Metrics::encode`]).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Pending messages in every space.
    pub queue_total: i64,
    /// The busiest spaces' pending messages, at most [`TOP_SPACES`].
    pub queue_top: Vec<(String, i64)>,
    pub active_spaces: i64,
    /// One of many hosts: the space leases this host holds.
    pub spaces_held: Option<i64>,
    /// Turns running now (each may hold a container or a bubblewrap sandbox).
    pub running_turns: i64,
    /// The model gate: its background quota now (calls a minute), and since
    /// start its steps down and the live calls it saw queued behind judge calls.
    pub judge_quota: u32,
    pub judge_adaptations: (u64, u64),
    /// Since start: judge calls held back for the live calls' reserve of a
    /// provider's stated budget.
    pub judge_reserve_waits: u64,
}

pub struct Metrics {
    registry: Registry,
    started: Instant,
    turns: Family<KindStatus, Counter>,
    turn_seconds: Seconds,
    model_calls: Family<ProviderOutcome, Counter>,
    model_seconds: Family<ProviderOutcome, Histogram, fn() -> Histogram>,
    model_tokens: Family<ProviderDirection, Counter>,
    sandbox_start_seconds: Family<Backend, Histogram, fn() -> Histogram>,
    judge_calls: Family<Outcome, Counter>,
    /// Settled cost, by purpose and model spec (never by space: bounded labels).
    cost: Family<PurposeModel, Counter<f64, AtomicU64>>,
    judge_quota: Gauge,
    judge_quota_downs: Counter,
    live_queued: Counter,
    judge_reserve_waits: Counter,
    /// What the gate had reported at the last scrape (the counters above
    /// advance by the difference, so they stay counters).
    adaptations_seen: Mutex<(u64, u64, u64)>,
    act_as: Family<LevelStatus, Counter>,
    ingress: Family<Decision, Counter>,
    queue_depth: Gauge,
    queue_depth_top: Family<Space, Gauge>,
    active_spaces: Gauge,
    spaces_held: Gauge,
    running_turns: Gauge,
    adapter_up: Family<Adapter, Gauge>,
    uptime: Gauge<f64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mercury");
        let m = Self {
            registry: Registry::default(),
            started: Instant::now(),
            turns: Family::default(),
            turn_seconds: Family::new_with_constructor(latency),
            model_calls: Family::default(),
            model_seconds: Family::new_with_constructor(latency),
            model_tokens: Family::default(),
            sandbox_start_seconds: Family::new_with_constructor(latency),
            judge_calls: Family::default(),
            cost: Family::default(),
            judge_quota: Gauge::default(),
            judge_quota_downs: Counter::default(),
            live_queued: Counter::default(),
            judge_reserve_waits: Counter::default(),
            adaptations_seen: Mutex::new((0, 0, 0)),
            act_as: Family::default(),
            ingress: Family::default(),
            queue_depth: Gauge::default(),
            queue_depth_top: Family::default(),
            active_spaces: Gauge::default(),
            spaces_held: Gauge::default(),
            running_turns: Gauge::default(),
            adapter_up: Family::default(),
            uptime: Gauge::default(),
        };
        let build: Family<Version, Gauge> = Family::default();
        build
            .get_or_create(&Version {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        registry.register("build_info", "The running version", build);
        registry.register(
            "turns",
            "Agent turns ended, by kind (live, task, ask) and status",
            m.turns.clone(),
        );
        registry.register(
            "turn_duration_seconds",
            "Wall time of agent turns, by kind",
            m.turn_seconds.clone(),
        );
        registry.register(
            "model_calls",
            "Model calls, by provider and outcome (ok, error)",
            m.model_calls.clone(),
        );
        registry.register(
            "model_call_duration_seconds",
            "Latency of model calls, by provider and outcome",
            m.model_seconds.clone(),
        );
        registry.register(
            "model_tokens",
            "Tokens of model calls, by provider and direction (input, output)",
            m.model_tokens.clone(),
        );
        registry.register(
            "sandbox_start_duration_seconds",
            "Time to start a turn's sandbox and read its proof, by backend",
            m.sandbox_start_seconds.clone(),
        );
        registry.register(
            "judge_calls",
            "Review judge model calls, by outcome (ok, error)",
            m.judge_calls.clone(),
        );
        registry.register(
            "cost",
            "Settled cost of model calls in the deployment's currency, by purpose and model",
            m.cost.clone(),
        );
        registry.register(
            "judge_quota_per_minute",
            "The model gate's background (judge) quota now, in calls a minute",
            m.judge_quota.clone(),
        );
        registry.register(
            "judge_quota_downs",
            "Steps down of the judge quota (a provider's 429/529, or live calls queued)",
            m.judge_quota_downs.clone(),
        );
        registry.register(
            "live_queued_behind_judge",
            "Live model calls that ran beside judge calls and took far longer than lone ones",
            m.live_queued.clone(),
        );
        registry.register(
            "judge_reserve_waits",
            "Judge calls held back because a provider's stated budget was down to the live calls' reserve",
            m.judge_reserve_waits.clone(),
        );
        registry.register(
            "act_as_requests",
            "Requests across a space link, by the route's level and the HTTP status",
            m.act_as.clone(),
        );
        registry.register(
            "ingress_messages",
            "Inbound platform messages, by decision (queued, duplicate, rate_limited, ambient, muted, unlinked)",
            m.ingress.clone(),
        );
        registry.register(
            "queue_depth",
            "Messages waiting for a turn, all spaces",
            m.queue_depth.clone(),
        );
        registry.register(
            "queue_depth_top_spaces",
            "Messages waiting for a turn in the busiest spaces only (at most 5 series)",
            m.queue_depth_top.clone(),
        );
        registry.register(
            "active_spaces",
            "Space actors running now",
            m.active_spaces.clone(),
        );
        registry.register(
            "cluster_spaces_held",
            "One of many hosts: the space leases this host holds (0 on a single host)",
            m.spaces_held.clone(),
        );
        registry.register(
            "running_turns",
            "Turns running now",
            m.running_turns.clone(),
        );
        registry.register(
            "adapter_up",
            "Platform adapters by name: 1 running, 0 configured but down",
            m.adapter_up.clone(),
        );
        registry.register(
            "uptime_seconds",
            "Seconds since the host started",
            m.uptime.clone(),
        );
        Self { registry, ..m }
    }

    /// One turn ended.
    pub fn turn(&self, kind: &str, status: &str, took: Duration) {
        self.turns
            .get_or_create(&KindStatus {
                kind: kind.into(),
                status: status.into(),
            })
            .inc();
        self.turn_seconds
            .get_or_create(&Kind { kind: kind.into() })
            .observe(took.as_secs_f64());
    }

    /// One model call ended; `spec` is the chain entry (`openai:gpt-4o`),
    /// of which only the provider becomes a label.
    pub fn model_call(&self, spec: &str, ok: bool, took: Duration, tokens: (u64, u64)) {
        let provider = provider_of(spec);
        let labels = ProviderOutcome {
            provider: provider.clone(),
            outcome: if ok { "ok" } else { "error" }.into(),
        };
        self.model_calls.get_or_create(&labels).inc();
        self.model_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        for (direction, n) in [("input", tokens.0), ("output", tokens.1)] {
            self.model_tokens
                .get_or_create(&ProviderDirection {
                    provider: provider.clone(),
                    direction: direction.into(),
                })
                .inc_by(n);
        }
    }

    /// A model call settled at `amount` of the deployment's currency.
    pub fn cost(&self, purpose: &str, model: &str, amount: f64) {
        if amount.is_finite() && amount > 0.0 {
            self.cost
                .get_or_create(&PurposeModel {
                    purpose: purpose.into(),
                    model: model.into(),
                })
                .inc_by(amount);
        }
    }

    pub fn sandbox_start(&self, backend: &str, took: Duration) {
        self.sandbox_start_seconds
            .get_or_create(&Backend {
                backend: backend.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// One judge model call ended: `ok` or `error`.
    pub fn judge_call(&self, outcome: &str) {
        self.judge_calls
            .get_or_create(&Outcome {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn act_as(&self, level: &str, status: u16) {
        self.act_as
            .get_or_create(&LevelStatus {
                level: level.into(),
                status: status.to_string(),
            })
            .inc();
    }

    pub fn ingress(&self, decision: &str) {
        self.ingress
            .get_or_create(&Decision {
                decision: decision.into(),
            })
            .inc();
    }

    /// An adapter's state: `true` running, `false` configured but down.
    pub fn set_adapter_up(&self, adapter: &str, up: bool) {
        self.adapter_up
            .get_or_create(&Adapter {
                adapter: adapter.into(),
            })
            .set(i64::from(up));
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The text exposition of every metric, with `now` sampled in.
    pub fn encode(&self, now: &Snapshot) -> String {
        self.queue_depth.set(now.queue_total);
        self.queue_depth_top.clear();
        for (space, n) in now.queue_top.iter().take(TOP_SPACES) {
            self.queue_depth_top
                .get_or_create(&Space {
                    space: space.clone(),
                })
                .set(*n);
        }
        self.active_spaces.set(now.active_spaces);
        self.spaces_held.set(now.spaces_held.unwrap_or(0));
        self.running_turns.set(now.running_turns);
        self.judge_quota.set(i64::from(now.judge_quota));
        if let Ok(mut seen) = self.adaptations_seen.lock() {
            let (downs, queued) = now.judge_adaptations;
            self.judge_quota_downs.inc_by(downs.saturating_sub(seen.0));
            self.live_queued.inc_by(queued.saturating_sub(seen.1));
            let waits = now.judge_reserve_waits;
            self.judge_reserve_waits
                .inc_by(waits.saturating_sub(seen.2));
            *seen = (downs.max(seen.0), queued.max(seen.1), waits.max(seen.2));
        }
        self.uptime.set(self.started.elapsed().as_secs_f64());
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `openai:gpt-4o` → `openai`; anything unexpected → `other` (a label never
/// carries a model name or a path).
fn provider_of(spec: &str) -> String {
    match spec.split(':').next() {
        Some(p @ ("openai" | "anthropic" | "scripted")) => p.into(),
        _ => "other".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_series_stay_bounded_and_labels_carry_no_path() {
        let m = Metrics::new();
        m.model_call(
            "scripted:/secret/path.json",
            true,
            Duration::from_millis(3),
            (5, 7),
        );
        let top: Vec<(String, i64)> = (0..50).map(|i| (format!("s{i}"), 50 - i)).collect();
        let out = m.encode(&Snapshot {
            queue_total: 1275,
            queue_top: top,
            ..Default::default()
        });
        assert_eq!(
            out.matches("mercury_queue_depth_top_spaces{").count(),
            TOP_SPACES
        );
        assert!(out.contains("mercury_queue_depth 1275"), "{out}");
        assert!(!out.contains("/secret"), "{out}");
        assert!(out
            .contains("mercury_model_tokens_total{provider=\"scripted\",direction=\"output\"} 7"));
        let again = m.encode(&Snapshot {
            queue_top: vec![("only".into(), 1)],
            ..Default::default()
        });
        assert_eq!(again.matches("mercury_queue_depth_top_spaces{").count(), 1);
    }

    #[test]
    fn judge_quota_series_follow_the_gate() {
        let m = Metrics::new();
        let snap = |quota, downs, queued| Snapshot {
            judge_quota: quota,
            judge_adaptations: (downs, queued),
            judge_reserve_waits: downs * 10,
            ..Default::default()
        };
        m.encode(&snap(120, 2, 1));
        let out = m.encode(&snap(60, 3, 1));
        assert!(
            out.contains("mercury_judge_reserve_waits_total 30"),
            "{out}"
        );
        assert!(out.contains("mercury_judge_quota_per_minute 60"), "{out}");
        assert!(out.contains("mercury_judge_quota_downs_total 3"), "{out}");
        assert!(
            out.contains("mercury_live_queued_behind_judge_total 1"),
            "{out}"
        );
    }
}
