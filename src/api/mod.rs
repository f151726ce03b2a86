//! The HTTP API (axum): router, auth step, one error type, and one module per
//! resource under `routes/`. See `docs/api.md` for the route table.
//!
//! Must never: mutate a space outside that space's actor (writes go through
//! `SpaceDirectory::apply`), or answer a client error with a 5xx.

mod act_as;
mod ask_guard;
pub mod auth;
pub mod error;
mod routes;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::{middleware, Json, Router};
use serde_json::json;

pub use act_as::AuditChange;
pub use auth::{Auth, SpaceCtx};
pub use error::{ApiError, ApiResult};

use crate::actors::ActorError;
use crate::app::App;

impl From<crate::ingress::IngressError> for ApiError {
    fn from(e: crate::ingress::IngressError) -> Self {
        use crate::ingress::IngressError;
        match e {
            IngressError::Store(e) => e.into(),
            IngressError::Wake(e) => e.into(),
            other => ApiError::internal(other),
        }
    }
}

impl From<ActorError> for ApiError {
    fn from(e: ActorError) -> Self {
        match e {
            ActorError::Store(s) => s.into(),
            ActorError::Unavailable(m) => ApiError::unavailable(m),
            ActorError::Timeout(ms) => {
                ApiError::unavailable(format!("the space did not answer within {ms} ms"))
            }
            ActorError::Control(crate::actors::ControlError::Store(e)) => e.into(),
            ActorError::Control(crate::actors::ControlError::Compact(e)) => match e {
                crate::agent::compact::CompactError::Store(e) => e.into(),
                model @ crate::agent::compact::CompactError::Model(_) => ApiError::new(
                    axum::http::StatusCode::BAD_GATEWAY,
                    "model_failed",
                    model.to_string(),
                ),
            },
        }
    }
}

pub fn router(app: Arc<App>) -> Router {
    use routes::*;
    let api = Router::new()
        .route("/api/whoami", get(spaces::whoami))
        .route("/api/spaces", get(spaces::list).post(spaces::create))
        .route(
            "/api/spaces/current",
            get(spaces::current).delete(spaces::delete_current),
        )
        .route("/api/spaces/current/name", put(spaces::rename))
        .route("/api/conversations", get(conversations::list))
        .route("/api/conversations/{id}/link", post(conversations::link))
        .route(
            "/api/conversations/{id}/unlink",
            post(conversations::unlink),
        )
        .route("/api/messages", get(messages::search))
        .route("/api/messages/recent", get(messages::recent))
        .route(
            "/api/prefs",
            get(settings::prefs_list).put(settings::prefs_set),
        )
        .route("/api/prefs/{key}", delete(settings::prefs_delete))
        .route(
            "/api/config",
            get(settings::config_get).put(settings::config_set),
        )
        .route(
            "/api/model",
            get(settings::model_get).put(settings::model_set),
        )
        .route(
            "/api/mutes",
            get(settings::mutes_list).post(settings::mutes_set),
        )
        .route("/api/mutes/{caller}", delete(settings::mutes_delete))
        .route("/api/roles", get(roles::list).post(roles::grant))
        .route("/api/roles/{caller}", delete(roles::revoke))
        .route(
            "/api/permissions",
            get(roles::permissions_get).put(roles::permissions_set),
        )
        .route("/api/tasks", get(tasks::list).post(tasks::create))
        .route("/api/tasks/{id}", delete(tasks::delete))
        .route("/api/tasks/{id}/pause", post(tasks::pause))
        .route("/api/tasks/{id}/resume", post(tasks::resume))
        .route("/api/tasks/{id}/run", post(tasks::run_now))
        .route("/api/control/{action}", post(control::control))
        .route("/api/send", post(delivery::send))
        .route("/api/outbox", get(delivery::outbox))
        .route("/api/runs", get(messages::runs))
        .route("/api/tokens", get(tokens::list).post(tokens::create))
        .route("/api/tokens/{id}", delete(tokens::revoke))
        .route(
            "/api/identities",
            get(identities::list).post(identities::link),
        )
        .route("/api/identities/audit", get(identities::audit))
        .route("/api/identities/{platform_id}", delete(identities::unlink))
        .route("/api/links", get(links::list).post(links::create))
        .route("/api/links/audit", get(links::audit))
        .route(
            "/api/links/{id}",
            get(links::inspect)
                .patch(links::update)
                .delete(links::revoke),
        )
        .route("/api/ingress", post(delivery::ingress))
        .route("/api/chat", post(delivery::chat))
        .route("/api/ask", post(ask::ask))
        .route("/api/review/run", post(review::run));
    #[cfg(feature = "test-hooks")]
    let api = api.route("/api/test/panic", post(control::inject_panic));
    let api = api.route_layer(middleware::from_fn_with_state(
        app.clone(),
        auth::authenticate,
    ));
    let limit = app.rt.settings.http.body_limit_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        // Without these, axum answers 404/405 with an empty body, not our error shape.
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                ApiError::new(
                    axum::http::StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    format!("{method} is not allowed on {}", uri.path()),
                )
            },
        )
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(uri_limit))
        .with_state(app)
}

/// Longest request target (path and query) the API reads. Longer ones get a
/// 414 in the JSON error shape here; beyond hyper's own limit (64 KiB) hyper
/// answers 414 itself, before any of this code runs.
pub const MAX_URI_BYTES: usize = 8 * 1024;

async fn uri_limit(
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI_BYTES {
        return ApiError::new(
            axum::http::StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request path and query are longer than {MAX_URI_BYTES} bytes"),
        )
        .into_response();
    }
    next.run(req).await
}

async fn healthz(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "spaces_active": app.spaces.active_count(),
        "sandbox": app.rt.sandbox.name(),
    }))
}
