//! The HTTP API (axum): router, auth step, one error type, and one module per
//! resource under `routes/`, each with its router and its act-as entries
//! (merged here; their union is [`ACT_AS_ROUTES`]). See `docs/api.md` for the
//! route table. The same routers carry the OpenAPI document served at
//! `GET /api/openapi.json` (see `openapi.rs` and docs/api.md).
//!
//! Must never: mutate a space outside that space's actor (writes go through
//! `SpaceDirectory::apply`), or answer a client error with a 5xx.

mod act_as;
mod ask_guard;
pub mod auth;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod ops;
mod platform_webhooks;
mod routes;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Extension};
use axum::{middleware, Router};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use extract::Json;

pub use act_as::{AuditChange, ACT_AS_ROUTES};
pub use auth::{Auth, SpaceCtx};
pub use error::{ApiError, ApiResult};

use crate::app::App;

/// The routers and the document they carry: `public` needs no token,
/// `api` is every resource's routes (behind the auth step).
struct Parts {
    public: Router<Arc<App>>,
    api: Router<Arc<App>>,
    doc: utoipa::openapi::OpenApi,
}

fn parts() -> Parts {
    let (api, api_doc) = routes::RESOURCES
        .iter()
        .fold(OpenApiRouter::new(), |api, resource| {
            api.merge((resource.router)())
        })
        .merge(ops::router())
        .split_for_parts();
    let (public, public_doc) = OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
        // Authenticated by the platform's secret header, not a bearer token.
        .merge(platform_webhooks::router())
        .split_for_parts();
    Parts {
        public,
        api,
        doc: openapi::contract(api_doc, public_doc),
    }
}

/// The OpenAPI document of [`router`], as `GET /api/openapi.json` serves it.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    parts().doc
}

pub fn router(app: Arc<App>) -> Router {
    let Parts { public, api, doc } = parts();
    let api = api.route_layer(middleware::from_fn_with_state(
        app.clone(),
        auth::authenticate,
    ));
    // No token on these: whatever they read is read for anyone.
    let public = public
        .layer(Extension(Arc::new(doc)))
        .layer(DefaultBodyLimit::max(
            app.rt.settings.http.unauthenticated_limit(),
        ));
    let limit = app.rt.settings.http.body_limit_bytes;
    Router::new()
        .merge(public)
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
        .layer(middleware::from_fn(json_errors))
        .with_state(app)
}

/// The last word on every answer: an error answer that is not already in
/// the JSON error shape (an extractor's or a layer's own rejection, in
/// plain text or empty) is replaced by one with the same status.
async fn json_errors(
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let answer = next.run(req).await;
    let status = answer.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return answer;
    }
    let json = answer
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json {
        return answer;
    }
    error::for_status(status)
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

/// The host is up.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
    pub version: String,
    /// Space actors running now.
    pub spaces_active: u64,
    /// The sandbox backend: `docker`, `bubblewrap` or `process`.
    pub sandbox: String,
    /// Each in-process chat adapter's state, by name (docs/adapters.md).
    #[schema(value_type = Object)]
    pub adapters: std::collections::BTreeMap<String, crate::actors::adapter::AdapterStatus>,
    /// True on a shadow copy (docs/shadow.md): nothing it sends leaves the host.
    pub shadow: bool,
    /// `live` or `shadow`.
    pub mode: String,
}

#[utoipa::path(get, path = "/healthz", operation_id = "health", summary = "Whether the host is up", tag = "host",
    responses((status = 200, description = "The host is up", body = Health)))]
async fn healthz(axum::extract::State(app): axum::extract::State<Arc<App>>) -> Json<Health> {
    let shadow = app.rt.outbound.is_shadow();
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        spaces_active: app.spaces.active_count() as u64,
        sandbox: app.rt.sandbox.name().to_owned(),
        adapters: app.adapters.statuses(),
        shadow,
        mode: if shadow { "shadow" } else { "live" }.into(),
    })
}

/// This document. No token: it describes the API, it gives no access.
#[utoipa::path(get, path = "/api/openapi.json", operation_id = "getOpenApi", summary = "This OpenAPI document", tag = "host",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi_json(
    Extension(doc): Extension<Arc<utoipa::openapi::OpenApi>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    axum::Json(&*doc).into_response()
}
