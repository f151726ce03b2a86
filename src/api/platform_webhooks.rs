//! Calls from chat platforms to a webhook-mode adapter:
//! `POST /api/adapters/telegram/webhook`, `GET|POST
//! /api/adapters/whatsapp/webhook` and `POST /api/adapters/slack/events`.
//! Not behind the bearer-token step: the platform proves itself with a
//! secret. Telegram sends back the one the adapter gave it
//! (`X-Telegram-Bot-Api-Secret-Token`), checked before the body is read;
//! WhatsApp signs the body (`X-Hub-Signature-256`, HMAC-SHA256 under the app
//! secret) and Slack signs its timestamp and the body (`X-Slack-Signature`
//! under the signing secret): a call without the header is refused before
//! the body is read, and the signature is checked on the raw bytes before
//! they are parsed. Bodies are read up to `http.unauthenticated_body_bytes`.
//!
//! Must never: read (or wait for) a byte of the body of a call that lacks
//! the secret, parse a body whose signature is wrong, read more than the
//! unauthenticated limit, compare a secret in time that depends on where it
//! differs, or answer 2xx before the adapter has stored the update (the
//! platform would not resend it).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::Json;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiResult};
use crate::actors::adapter::WebhookCall;
use crate::app::App;

pub(super) const TELEGRAM_SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

pub(super) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(telegram))
        .routes(routes!(whatsapp_verify, whatsapp))
        .routes(routes!(slack))
}

/// Equal secrets, compared through their digests so the time taken does not
/// depend on how much of a guess was right.
fn same_secret(given: &[u8], expected: &str) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A Telegram `Update`, posted by Telegram to a webhook-mode adapter.
#[utoipa::path(post, path = "/api/adapters/telegram/webhook", operation_id = "telegramWebhook", summary = "Telegram webhook (checked with its secret token)", tag = "adapters",
    params(("x-telegram-bot-api-secret-token" = String, Header,
        description = "The secret the adapter gave setWebhook; checked before the body is read")),
    request_body(content = Object, description = "A Telegram Update (Bot API JSON)"),
    responses(
        (status = 200, description = "The update is stored", body = Object),
        (status = 400, description = "Not a JSON update", body = super::error::ErrorBody),
        (status = 401, description = "Missing or wrong secret", body = super::error::ErrorBody),
        (status = 413, description = "Body over http.unauthenticated_body_bytes", body = super::error::ErrorBody),
        (status = 404, description = "The adapter is not in webhook mode", body = super::error::ErrorBody),
        (status = 503, description = "Not stored; Telegram resends", body = super::error::ErrorBody),
    ))]
async fn telegram(State(app): State<Arc<App>>, request: Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    match take_telegram(&app, request).await {
        Ok(answer) => answer.into_response(),
        Err(e) => {
            // A refusal may come before the body was read: the connection
            // cannot carry another request, and the client must not reuse it.
            let mut answer = e.into_response();
            answer.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            answer
        }
    }
}

/// A refusal that may come before the body was read: the connection cannot
/// carry another request, and the client must not reuse it.
fn closing(e: ApiError) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut answer = e.into_response();
    answer.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    answer
}

/// The handshake of a WhatsApp webhook subscription: Meta sends the verify
/// token it was given and a challenge to echo.
#[utoipa::path(get, path = "/api/adapters/whatsapp/webhook", operation_id = "whatsappWebhookVerify", summary = "WhatsApp webhook subscription check (hub.verify_token)", tag = "adapters",
    params(
        ("hub.mode" = String, Query, description = "`subscribe`"),
        ("hub.verify_token" = String, Query, description = "MERCURY_WHATSAPP_VERIFY_TOKEN"),
        ("hub.challenge" = String, Query, description = "Echoed when the token is right"),
    ),
    responses(
        (status = 200, description = "The challenge, as text", body = String),
        (status = 403, description = "Wrong mode or token", body = super::error::ErrorBody),
        (status = 404, description = "The WhatsApp adapter is not running", body = super::error::ErrorBody),
    ))]
async fn whatsapp_verify(
    State(app): State<Arc<App>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> ApiResult<String> {
    let Some(inbox) = app.adapters.webhook(crate::adapters::whatsapp::ADAPTER) else {
        return Err(ApiError::not_found("the whatsapp adapter is not running"));
    };
    let expected = inbox.verify_token.unwrap_or_default();
    let given = q.get("hub.verify_token").map(String::as_bytes);
    let token_ok = !expected.is_empty() && given.is_some_and(|g| same_secret(g, &expected));
    if q.get("hub.mode").map(String::as_str) != Some("subscribe") || !token_ok {
        return Err(ApiError::Forbidden(
            "wrong hub.mode or hub.verify_token".into(),
        ));
    }
    let challenge = q.get("hub.challenge").cloned().unwrap_or_default();
    if challenge.len() > 256
        || challenge
            .chars()
            .any(|c| !c.is_ascii_alphanumeric() && c != '-' && c != '_')
    {
        return Err(ApiError::bad_request(
            "hub.challenge is not a challenge Meta sends",
        ));
    }
    Ok(challenge)
}

/// A WhatsApp Cloud API notification (messages, statuses), signed by Meta.
#[utoipa::path(post, path = "/api/adapters/whatsapp/webhook", operation_id = "whatsappWebhook", summary = "WhatsApp webhook (checked with its body signature)", tag = "adapters",
    params(("x-hub-signature-256" = String, Header,
        description = "sha256=<hex HMAC-SHA256 of the raw body under the app secret>; checked before the body is parsed")),
    request_body(content = Object, description = "A webhook notification (Graph API JSON)"),
    responses(
        (status = 200, description = "The notification is stored", body = Object),
        (status = 400, description = "Signed, but not JSON", body = super::error::ErrorBody),
        (status = 401, description = "Missing or wrong signature", body = super::error::ErrorBody),
        (status = 413, description = "Body over http.unauthenticated_body_bytes", body = super::error::ErrorBody),
        (status = 404, description = "The WhatsApp adapter is not running", body = super::error::ErrorBody),
        (status = 503, description = "Not stored; Meta redelivers", body = super::error::ErrorBody),
    ))]
async fn whatsapp(State(app): State<Arc<App>>, request: Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    match take_whatsapp(&app, request).await {
        Ok(answer) => answer.into_response(),
        Err(e) => closing(e),
    }
}

async fn take_whatsapp(app: &Arc<App>, request: Request) -> ApiResult<Json<Value>> {
    use crate::adapters::whatsapp::{signature_ok, ADAPTER, SIGNATURE_HEADER};
    let Some(inbox) = app.adapters.webhook(ADAPTER) else {
        return Err(ApiError::not_found("the whatsapp adapter is not running"));
    };
    let unsigned = || ApiError::Unauthorized("missing or wrong X-Hub-Signature-256".into());
    let signature = request
        .headers()
        .get(SIGNATURE_HEADER)
        .map(|v| v.as_bytes().to_vec())
        .ok_or_else(unsigned)?;
    let limit = app.rt.settings.http.unauthenticated_limit();
    let body = read_limited(request, limit).await?;
    // The raw bytes, before any parsing: a forged body is never read as JSON.
    if !signature_ok(&inbox.secret, Some(&signature), &body) {
        return Err(unsigned());
    }
    let body: Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::bad_request("the body is not a JSON notification"))?;
    let (done, stored) = oneshot::channel();
    inbox
        .calls
        .send(WebhookCall { body, done })
        .await
        .map_err(|_| ApiError::Unavailable("the whatsapp adapter is restarting".into()))?;
    match stored.await {
        Ok(Ok(())) => Ok(Json(json!({}))),
        _ => Err(ApiError::Unavailable(
            "the notification was not stored; send it again".into(),
        )),
    }
}

/// A Slack Events API request (`adapters.slack.mode: events`): the
/// `url_verification` handshake, or an event, signed by Slack.
#[utoipa::path(post, path = "/api/adapters/slack/events", operation_id = "slackEvents", summary = "Slack Events API (checked with its signature and timestamp)", tag = "adapters",
    params(
        ("x-slack-signature" = String, Header,
            description = "v0=<hex HMAC-SHA256 of v0:<timestamp>:<raw body> under the signing secret>; checked before the body is parsed"),
        ("x-slack-request-timestamp" = String, Header,
            description = "Unix seconds; refused when more than five minutes from now"),
    ),
    request_body(content = Object, description = "An Events API body (url_verification or event_callback)"),
    responses(
        (status = 200, description = "The event is stored, or the handshake's challenge", body = Object),
        (status = 400, description = "Signed, but not JSON", body = super::error::ErrorBody),
        (status = 401, description = "Missing or wrong signature, or a stale timestamp", body = super::error::ErrorBody),
        (status = 413, description = "Body over http.unauthenticated_body_bytes", body = super::error::ErrorBody),
        (status = 404, description = "The Slack adapter is not running in events mode", body = super::error::ErrorBody),
        (status = 503, description = "Not stored; Slack retries", body = super::error::ErrorBody),
    ))]
async fn slack(State(app): State<Arc<App>>, request: Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    match take_slack(&app, request).await {
        Ok(answer) => answer.into_response(),
        Err(e) => closing(e),
    }
}

async fn take_slack(app: &Arc<App>, request: Request) -> ApiResult<Json<Value>> {
    use crate::adapters::slack::{events, ADAPTER};
    let Some(inbox) = app.adapters.webhook(ADAPTER) else {
        return Err(ApiError::not_found(
            "the slack adapter is not running in events mode",
        ));
    };
    let unsigned = || {
        ApiError::Unauthorized(
            "missing or wrong X-Slack-Signature, or X-Slack-Request-Timestamp more than five minutes from now"
                .into(),
        )
    };
    let headers = request.headers();
    let header = |name: &str| headers.get(name).map(|v| v.as_bytes().to_vec());
    let (signature, timestamp) = (
        header(events::SIGNATURE_HEADER),
        header(events::TIMESTAMP_HEADER),
    );
    let (Some(signature), Some(timestamp)) = (signature, timestamp) else {
        return Err(unsigned());
    };
    let limit = app.rt.settings.http.unauthenticated_limit();
    let body = read_limited(request, limit).await?;
    let now = crate::clock::now_ms() / 1000;
    // The raw bytes, before any parsing: a forged body is never read as JSON.
    if !events::signature_ok(&inbox.secret, &timestamp, &signature, &body, now) {
        return Err(unsigned());
    }
    let body: Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::bad_request("the body is not a JSON event"))?;
    if body["type"].as_str() == Some("url_verification") {
        let challenge = body["challenge"].as_str().unwrap_or_default();
        if challenge.is_empty() || challenge.len() > 256 {
            return Err(ApiError::bad_request(
                "url_verification carries no challenge Slack sends",
            ));
        }
        return Ok(Json(json!({ "challenge": challenge })));
    }
    let (done, stored) = oneshot::channel();
    inbox
        .calls
        .send(WebhookCall { body, done })
        .await
        .map_err(|_| ApiError::Unavailable("the slack adapter is restarting".into()))?;
    match stored.await {
        Ok(Ok(())) => Ok(Json(json!({}))),
        _ => Err(ApiError::Unavailable(
            "the event was not stored; send it again".into(),
        )),
    }
}

async fn take_telegram(app: &Arc<App>, request: Request) -> ApiResult<Json<Value>> {
    let Some(inbox) = app.adapters.webhook("telegram") else {
        return Err(ApiError::not_found(
            "the telegram adapter is not running in webhook mode",
        ));
    };
    let given = request
        .headers()
        .get(TELEGRAM_SECRET_HEADER)
        .map(reqwest::header::HeaderValue::as_bytes);
    if !given.is_some_and(|g| same_secret(g, &inbox.secret)) {
        return Err(ApiError::Unauthorized(
            "missing or wrong X-Telegram-Bot-Api-Secret-Token".into(),
        ));
    }
    let limit = app.rt.settings.http.unauthenticated_limit();
    let body = read_limited(request, limit).await?;
    let body: Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::bad_request("the body is not a JSON update"))?;
    let (done, stored) = oneshot::channel();
    inbox
        .calls
        .send(WebhookCall { body, done })
        .await
        .map_err(|_| ApiError::Unavailable("the telegram adapter is restarting".into()))?;
    match stored.await {
        Ok(Ok(())) => Ok(Json(json!({}))),
        // Telegram resends on a non-2xx answer.
        _ => Err(ApiError::Unavailable(
            "the update was not stored; send it again".into(),
        )),
    }
}

/// The body of `request`, at most `limit` bytes (a declared length over it
/// is refused before a byte is read).
async fn read_limited(request: Request, limit: usize) -> ApiResult<axum::body::Bytes> {
    let too_large = || {
        ApiError::TooLarge(format!(
            "the body is larger than {limit} bytes (http.unauthenticated_body_bytes)"
        ))
    };
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match http_body_util::Limited::new(request.into_body(), limit)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(_) => Err(ApiError::bad_request("the body could not be read")),
    }
}
