//! The operator's routes: `GET /metrics` (Prometheus text) and
//! `GET /api/status` (what `mercury status` prints), both for the owner and
//! the global admins only; and the router of the optional `metrics.bind`
//! listener, which serves `/metrics` alone without a token (bind it where
//! only the scraper reaches).
//!
//! Must never: answer anyone but a global admin on the API listener, or put
//! a caller id, a message or more than [`crate::telemetry::TOP_SPACES`]
//! spaces in a metric.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Auth;
use super::error::ApiResult;
use super::extract::Json;
use crate::app::App;
use crate::storage::stats;
use crate::telemetry::{Snapshot, TOP_SPACES};

/// The routes behind the token (merged under the auth step).
pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(metrics))
        .routes(routes!(status))
        .routes(routes!(doctor))
}

/// The `metrics.bind` listener: `/metrics` only, no token.
pub fn metrics_only(app: Arc<App>) -> Router {
    Router::new()
        .route("/metrics", get(open_metrics))
        .with_state(app)
}

async fn snapshot(app: &App) -> ApiResult<Snapshot> {
    let (total, top) = app
        .rt
        .store
        .read(|c| {
            let total = stats::pending_messages(c)?;
            let top = stats::pending_by_space(c, TOP_SPACES as i64)?;
            Ok((total, top))
        })
        .await?;
    Ok(Snapshot {
        queue_total: total,
        queue_top: top,
        active_spaces: i64::try_from(app.spaces.active_count()).unwrap_or(i64::MAX),
        spaces_held: app
            .rt
            .cluster
            .as_ref()
            .map(|seat| i64::try_from(seat.held_count()).unwrap_or(i64::MAX)),
        running_turns: i64::try_from(app.rt.live_run_ids().len()).unwrap_or(i64::MAX),
        judge_quota: app.rt.model_gate.per_minute(),
        judge_adaptations: app.rt.model_gate.adaptations(),
        judge_reserve_waits: app.rt.model_gate.reserve_waits(),
    })
}

async fn render(app: &App) -> ApiResult<Response> {
    // The chat adapters' health lives on their board; the gauge follows it.
    for (name, a) in app.adapters.statuses() {
        app.rt.metrics.set_adapter_up(&name, a.connected);
    }
    let now = snapshot(app).await?;
    let body = app.rt.metrics.encode(&now);
    Ok(([(CONTENT_TYPE, crate::telemetry::CONTENT_TYPE)], body).into_response())
}

#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", summary = "Prometheus metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text exposition (bounded labels)",
        content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Response> {
    auth.require_global_admin()?;
    render(&app).await
}

async fn open_metrics(State(app): State<Arc<App>>) -> ApiResult<Response> {
    render(&app).await
}

/// `GET /api/status`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Status {
    pub version: &'static str,
    pub uptime_secs: u64,
    /// The deployment's model chain (`model`; a space may set its own).
    pub model_chain: Vec<String>,
    /// Spaces on the host, and how many have a live actor now.
    pub spaces_total: i64,
    pub spaces_active: usize,
    /// The latest runs that failed in the last 24 hours (at most 5), newest
    /// first: `mrctl runs show RUN` with the space reads the trace.
    pub recent_failures: Vec<crate::storage::stats::FailedRun>,
    /// An enabled adapter is disconnected (`mercury status` exits 4).
    pub degraded: bool,
    pub queue: QueueStatus,
    /// Turns running now; each holds at most one container or sandbox.
    pub running_turns: usize,
    pub sandbox: SandboxStatus,
    pub adapters: Vec<AdapterStatus>,
    pub review: ReviewStatus,
    pub spend: SpendStatus,
    /// One of many hosts (`cluster.enabled`): this host and the deployment's.
    pub cluster: Option<ClusterStatus>,
}

/// This host among the deployment's (docs/scale-out.md).
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterStatus {
    pub host_id: String,
    /// Space leases this host holds now.
    pub spaces_held: usize,
    pub hosts: Vec<ClusterHost>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterHost {
    pub host_id: String,
    pub name: String,
    /// `up`, `silent` (no heartbeat within a lease) or `stopped`.
    pub state: &'static str,
    pub heartbeat_at: i64,
    pub spaces: i64,
    /// Deployment leases it holds (`review`, `adapter:telegram`).
    pub leases: Vec<String>,
}

async fn cluster_status(app: &App) -> ApiResult<Option<ClusterStatus>> {
    let Some(seat) = &app.rt.cluster else {
        return Ok(None);
    };
    let now = crate::clock::now_ms();
    let lease_ms = i64::try_from(app.rt.settings.cluster.lease_secs * 1000).unwrap_or(i64::MAX);
    let hosts = app
        .rt
        .store
        .read(move |c| crate::storage::leases::hosts(c, now))
        .await?;
    Ok(Some(ClusterStatus {
        host_id: seat.host_id.clone(),
        spaces_held: seat.held_count(),
        hosts: hosts
            .into_iter()
            .map(|h| ClusterHost {
                state: match h.stopped_at {
                    Some(_) => "stopped",
                    None if now - h.heartbeat_at > lease_ms => "silent",
                    None => "up",
                },
                host_id: h.host_id,
                name: h.name,
                heartbeat_at: h.heartbeat_at,
                spaces: h.spaces,
                leases: h.named,
            })
            .collect(),
    }))
}

/// Spent (settled and reserved) in the deployment's time zone.
#[derive(Debug, Serialize, ToSchema)]
pub struct SpendStatus {
    pub currency: String,
    pub today: f64,
    pub month: f64,
    /// `today` in the one currency format.
    pub today_text: String,
    pub month_text: String,
    /// The deployment's daily and monthly caps (0: none).
    pub daily_cap: f64,
    pub monthly_cap: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueueStatus {
    pub pending: i64,
    /// The busiest spaces (at most five): `[space, pending]`.
    #[schema(value_type = Vec<Vec<serde_json::Value>>)]
    pub top: Vec<(String, i64)>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxStatus {
    pub backend: &'static str,
    pub isolated: bool,
    /// Why tool calls are refused, when no backend is usable.
    pub unavailable: Option<String>,
    /// The container engines sandboxes start on (docker; empty otherwise):
    /// `sandbox.docker.hosts`, or the local one.
    pub engines: Vec<SandboxEngine>,
    /// The warm pool (`sandbox.warm`): how many it keeps, and how many
    /// are started and waiting for a turn now (0 and 0 when off).
    pub warm: WarmStatus,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WarmStatus {
    pub slots: usize,
    pub idle: usize,
}

/// One container engine as this host sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxEngine {
    /// As configured (`unix:///…`, `tcp://host:port`), or `local`.
    pub endpoint: String,
    /// On another machine: workspaces are copied in and back, not bound.
    pub remote: bool,
    /// It answered its last ping or start.
    pub healthy: bool,
    /// This host's sandboxes running on it now.
    pub running: usize,
    pub last_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdapterStatus {
    pub name: String,
    pub state: &'static str,
    /// `polling`, `webhook` or `gateway` (a chat adapter's).
    pub mode: Option<String>,
    /// When the last platform update was stored (ms since the epoch).
    pub last_update_at: Option<i64>,
    /// The last failure talking to the platform (no secret in it).
    pub last_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewStatus {
    pub enabled: bool,
    /// RFC 3339, UTC; absent when review is off.
    pub next_run: Option<String>,
    /// Why the digest has nowhere to go (no `review.owner`, or no DM of the
    /// owner on a chat platform); absent when it has a DM or review is off.
    pub digest_undeliverable: Option<String>,
    /// The judge's model chain as this host resolved it (`review.model`,
    /// else `model`, from its file and its environment): what `mercury
    /// review intake` verifies with when it finds this host running.
    pub judge_chain: Vec<String>,
}

#[utoipa::path(get, path = "/api/status", operation_id = "getStatus", summary = "The host's status (what mercury status prints)", tag = "ops",
    responses((status = 200, description = "What `mercury status` prints", body = Status)))]
async fn status(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Status>> {
    auth.require_global_admin()?;
    let now = snapshot(&app).await?;
    let s = &app.rt.settings;
    let mut adapters = Vec::new();
    if !s.webhook.url.is_empty() {
        adapters.push(AdapterStatus {
            name: "webhook".into(),
            state: "running",
            mode: None,
            last_update_at: None,
            last_error: None,
        });
    }
    for (name, a) in app.adapters.statuses() {
        adapters.push(AdapterStatus {
            name,
            // One of many hosts: another host holds the connection.
            state: if a.connected {
                "connected"
            } else if a.mode == "standby" {
                "standby"
            } else {
                "disconnected"
            },
            mode: Some(a.mode).filter(|m| !m.is_empty()),
            last_update_at: a.last_update_at,
            last_error: a.last_error,
        });
    }
    let since = crate::clock::now_ms() - 86_400_000;
    let (spaces_total, recent_failures) = app
        .rt
        .store
        .read(move |c| Ok((stats::spaces(c)?, stats::recent_failures(c, since, 5)?)))
        .await?;
    let recent_failures = recent_failures
        .into_iter()
        .map(|mut f| {
            f.error = f
                .error
                .as_deref()
                .map(crate::redaction::secrets::scrub_error);
            f
        })
        .collect();
    let degraded = adapters.iter().any(|a| a.state == "disconnected");
    let (today, month) = app.rt.spend.totals().await?;
    let spend = SpendStatus {
        currency: s.currency.clone(),
        today,
        month,
        today_text: app.rt.spend.format(today),
        month_text: app.rt.spend.format(month),
        daily_cap: s.budgets.global.daily,
        monthly_cap: s.budgets.global.monthly,
    };
    Ok(Json(Status {
        spend,
        version: env!("CARGO_PKG_VERSION"),
        uptime_secs: app.rt.metrics.uptime().as_secs(),
        model_chain: s.model_chain(),
        spaces_total,
        spaces_active: app.spaces.active_count(),
        recent_failures,
        degraded,
        queue: QueueStatus {
            pending: now.queue_total,
            top: now.queue_top,
        },
        running_turns: app.rt.live_run_ids().len(),
        sandbox: SandboxStatus {
            backend: app.rt.sandbox.name(),
            isolated: app.rt.sandbox.isolation() != crate::sandbox::Isolation::None,
            unavailable: app.rt.sandbox.unavailable_reason(),
            engines: app
                .rt
                .sandbox
                .engines()
                .into_iter()
                .map(|e| SandboxEngine {
                    endpoint: e.endpoint,
                    remote: e.remote,
                    healthy: e.healthy,
                    running: e.running,
                    last_error: e.last_error,
                })
                .collect(),
            warm: WarmStatus {
                slots: s.sandbox.warm,
                idle: app.rt.sandbox.warm_idle(),
            },
        },
        adapters,
        cluster: cluster_status(&app).await?,
        review: ReviewStatus {
            enabled: s.review.enabled,
            next_run: crate::actors::review_scheduler::next_fire(&s.review, chrono::Utc::now())
                .map(|t| t.to_rfc3339()),
            judge_chain: crate::review::scan::judge_chain(s),
            digest_undeliverable: if s.review.enabled {
                crate::review::digest::no_destination(&app.rt).await
            } else {
                None
            },
        },
    }))
}

/// One check the running host made of what it uses.
#[derive(Debug, Serialize, ToSchema)]
pub struct HostCheck {
    /// `ok`, `warn` or `fail`.
    pub level: &'static str,
    pub what: String,
    pub detail: String,
}

/// What `mercury doctor` adds when a host runs: its own view.
#[derive(Debug, Serialize, ToSchema)]
pub struct HostDoctor {
    pub checks: Vec<HostCheck>,
}

#[utoipa::path(get, path = "/api/doctor", operation_id = "getDoctor", summary = "The running host's checks of what it uses (keys, model endpoints, adapters, sandbox)", tag = "ops",
    responses((status = 200, description = "Each check, with its level", body = HostDoctor)))]
async fn doctor(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<HostDoctor>> {
    auth.require_global_admin()?;
    let s = &app.rt.settings;
    let mut checks = Vec::new();
    let mut push = |level: &'static str, what: &str, detail: String| {
        checks.push(HostCheck {
            level,
            what: what.to_owned(),
            detail: crate::redaction::secrets::scrub_error(&detail),
        });
    };
    let mut providers: Vec<String> = Vec::new();
    let mut keyless = 0;
    for (purpose, spec) in s.configured_specs() {
        let Some((provider, _)) = spec.split_once(':') else {
            continue;
        };
        if !app.rt.models.has_key_for(provider) {
            keyless += 1;
            push(
                "fail",
                "host model keys",
                format!("{spec} ({purpose}) has no key in the running host's environment"),
            );
        }
        if !providers.iter().any(|p| p == provider) {
            providers.push(provider.to_owned());
        }
    }
    if keyless == 0 {
        push(
            "ok",
            "host model keys",
            "every provider the host's chains name has a key".into(),
        );
    }
    for provider in &providers {
        match app.rt.models.probe(provider).await {
            None => {}
            Some(crate::model::EndpointProbe::Answered(d)) => push("ok", "host model endpoint", d),
            Some(crate::model::EndpointProbe::KeyRefused(d)) => push(
                "fail",
                "host model endpoint",
                format!("{d}: the key is refused"),
            ),
            Some(crate::model::EndpointProbe::Unreachable(d)) => {
                push("fail", "host model endpoint", d);
            }
        }
    }
    for (name, a) in app.adapters.statuses() {
        if a.connected {
            push("ok", "host adapters", format!("{name} connected"));
        } else {
            push(
                "fail",
                "host adapters",
                format!(
                    "{name} disconnected{}",
                    a.last_error.map(|e| format!(": {e}")).unwrap_or_default()
                ),
            );
        }
    }
    match app.rt.sandbox.unavailable_reason() {
        Some(why) => push(
            "fail",
            "host sandbox",
            format!("tool calls are refused: {why}"),
        ),
        None if app.rt.sandbox.isolation() == crate::sandbox::Isolation::None => push(
            "warn",
            "host sandbox",
            format!("{} does not isolate tool calls", app.rt.sandbox.name()),
        ),
        None => push(
            "ok",
            "host sandbox",
            format!("{} isolates tool calls", app.rt.sandbox.name()),
        ),
    }
    if let Some(probe) = &app.layer_check {
        for (what, level, detail) in probe.check().await {
            push(level, &what, detail);
        }
    }
    Ok(Json(HostDoctor { checks }))
}
