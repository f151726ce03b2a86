//! The web dashboard (issue 27), served under `/ui/` on the host's own
//! listener: HTML rendered on the server from askama templates compiled
//! into the binary (escaped by default), a small embedded stylesheet and
//! script, live numbers over server-sent events. Every page reads without
//! the script. See docs/dashboard.md.
//!
//! Must never: render text a chat participant controls as HTML (messages,
//! names, files, tool output are all escaped), serve a page without the
//! CSP and nosniff headers, change state on a GET or on a POST without the
//! sign-in's CSRF token, or decide access any other way than the API does
//! (`crate::perms`).

mod actions;
mod error;
mod pages;
mod pairing;
mod rehearsal;
mod review;
mod session;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::header::{self, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

pub use error::UiError;

use crate::app::App;

/// The Content-Security-Policy of every answer: only this host's own
/// stylesheet and script, no inline script, never framed.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const CSS: &str = include_str!("static/ui.css");
const JS: &str = include_str!("static/ui.js");

/// The dashboard's routes, merged into the host's router beside the API.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::overview))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/link/{secret}", get(pages::login_link))
        .route("/ui/login-links", post(pages::mint_link))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/signins", get(pages::signins))
        .route("/ui/signins/{id}/revoke", post(pages::revoke_signin))
        .route("/ui/events", get(pages::events))
        .route("/ui/spaces", get(pages::spaces))
        .route("/ui/spaces/{space}", get(pages::space))
        .route("/ui/spaces/{space}/chat", post(pages::chat))
        .route(
            "/ui/spaces/{space}/files/{name}",
            get(pages::file).post(pages::save_file),
        )
        .route("/ui/spaces/{space}/runs", get(pages::runs))
        .route(
            "/ui/spaces/{space}/tasks/{id}/{action}",
            post(actions::task_switch),
        )
        .route("/ui/spaces/{space}/mutes", post(actions::mute))
        .route("/ui/spaces/{space}/unmute", post(actions::unmute))
        .route("/ui/spaces/{space}/stop", post(actions::stop))
        .route("/ui/runs/{run}", get(pages::run))
        .route("/ui/links", get(pages::links_page))
        .route("/ui/pairings", get(pairing::list))
        .route("/ui/rehearsal", get(rehearsal::overview))
        .route("/ui/rehearsal/{id}", get(rehearsal::diff_page))
        .route("/ui/review", get(review::overview))
        .route("/ui/review/reports/{name}", get(review::report))
        .route("/ui/review/approve", post(review::approve))
        .route("/ui/pairings/{code}/{action}", post(pairing::decide))
        .route(
            "/ui/static/ui.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/ui/static/ui.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        // The API's router has the one fallback; a path of ours it would not know is ours to answer.
        .route(
            "/ui/{*rest}",
            get(|| async { UiError::NotFound("no such page".into()) }),
        )
        .layer(DefaultBodyLimit::max(app.rt.settings.http.body_limit_bytes))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Every answer under `/ui/`, error pages included.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut answer = next.run(req).await;
    let h = answer.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    answer
}
