//! One of many hosts (issue 28): a request (API or dashboard) that needs a
//! space's actor while another host holds the space's lease is handed to
//! that host.
//!
//! The request is answered here first; only when the answer is the refusal
//! "another host runs this space" (an answer carrying
//! [`crate::cluster::RUNNER_HEADER`]: `ApiError::Elsewhere`,
//! `UiError::Elsewhere`, met before anything is written) is the same request (method, path,
//! query, headers, body) sent once to the holder's advertised URL, and the
//! holder's answer is the answer. Forwarding, not taking the lease: the
//! holder may be in the middle of a turn, and moving a space for one API
//! call would cancel it; a dead holder's lease expires and the next request
//! takes the space the ordinary way.
//!
//! Must never: forward a request twice (the holder answers a forwarded
//! request itself, whatever it holds), send anything but the caller's own
//! request to a URL the deployment's host table names, or forward when the
//! host is not one of many (no body is buffered then).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;
use crate::app::App;
use crate::cluster::RUNNER_HEADER as RUNNER;
use crate::storage::leases;

/// Set on a forwarded request (its value: the forwarding host's id), so
/// the holder answers it itself.
pub const FORWARDED: &str = "x-mercury-forwarded";

/// How long a forwarded request may take (a control action may call the model).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(330);

fn client() -> Option<&'static reqwest::Client> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(FORWARD_TIMEOUT)
                // The holder's own answer, redirects and all, is the answer.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .ok()
        })
        .as_ref()
}

pub async fn to_runner(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(seat) = app.rt.cluster.clone() else {
        return next.run(req).await;
    };
    if req.headers().contains_key(FORWARDED) {
        let mut answer = next.run(req).await;
        // The holder answers; a refusal from it is not forwarded again.
        answer.headers_mut().remove(RUNNER);
        return answer;
    }
    let (parts, body) = req.into_parts();
    let limit = app.rt.settings.http.body_limit_bytes;
    let Ok(bytes) = to_bytes(body, limit).await else {
        return ApiError::TooLarge("request body is larger than the limit".into()).into_response();
    };
    let local = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
    let mut answer = next.run(local).await;
    let Some(runner) = answer
        .headers_mut()
        .remove(RUNNER)
        .and_then(|v| v.to_str().ok().map(str::to_owned))
    else {
        return answer;
    };
    let host = runner.clone();
    let url = app.rt.store.read(move |c| leases::host_url(c, &host)).await;
    let Ok(Some(base)) = url else {
        return answer;
    };
    let Some(client) = client() else {
        return answer;
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut out = client.request(parts.method.clone(), format!("{base}{path}"));
    for (name, value) in &parts.headers {
        // Hop-by-hop and framing headers are the new connection's own.
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding" | FORWARDED
        ) {
            out = out.header(name, value);
        }
    }
    let sent = out
        .header(FORWARDED, seat.host_id.as_str())
        .body(bytes)
        .send()
        .await;
    let theirs = match sent {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(runner = %runner, error = %e, "could not forward a request to the space's host");
            return answer;
        }
    };
    let status = theirs.status();
    let headers = theirs.headers().clone();
    let Ok(body) = theirs.bytes().await else {
        return answer;
    };
    let mut forwarded = Response::new(Body::from(body));
    *forwarded.status_mut() = status;
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            forwarded.headers_mut().append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&runner) {
        forwarded
            .headers_mut()
            .insert(HeaderName::from_static("x-mercury-served-by"), v);
    }
    forwarded
}
