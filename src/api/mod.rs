//! The HTTP API (axum): router, auth step, one error type, and one module per
//! resource under `routes/`, each with its router and its act-as entries
//! (merged here; their union is [`ACT_AS_ROUTES`]). See `docs/api.md` for the
//! route table.
//!
//! Must never: mutate a space outside that space's actor (writes go through
//! `SpaceDirectory::apply`), or answer a client error with a 5xx.

mod act_as;
mod ask_guard;
pub mod auth;
pub mod error;
pub mod ops;
mod platform_webhooks;
mod routes;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::{middleware, Json, Router};
use serde_json::json;

pub use act_as::{AuditChange, ACT_AS_ROUTES};
pub use auth::{Auth, SpaceCtx};
pub use error::{ApiError, ApiResult};

use crate::app::App;

pub fn router(app: Arc<App>) -> Router {
    let api = routes::RESOURCES
        .iter()
        .fold(Router::new(), |api, resource| {
            api.merge((resource.router)())
        })
        .merge(ops::router());
    let api = api.route_layer(middleware::from_fn_with_state(
        app.clone(),
        auth::authenticate,
    ));
    let limit = app.rt.settings.http.body_limit_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        // Authenticated by the platform's secret header, not a bearer token.
        .merge(platform_webhooks::router())
        .merge(api)
        // Without these, axum answers 404/405 with an empty body, not our error shape.
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
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
        return ApiError::UriTooLong(format!(
            "the request path and query are longer than {MAX_URI_BYTES} bytes"
        ))
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
        "adapters": app.adapters.statuses(),
        "shadow": app.rt.outbound.is_shadow(),
        "mode": if app.rt.outbound.is_shadow() { "shadow" } else { "live" },
    }))
}
