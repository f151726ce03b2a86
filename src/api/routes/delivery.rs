//! Messages in and out: platform ingress (adapter token), console chat,
//! operator sends, and the outbox pull for adapters.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, params, text_field, Body, Params};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::actors::Refusal;
use crate::app::App;
use crate::clock::now_ms;
use crate::ingress::{self, IngestStatus, IngressMessage};
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Admin;
use crate::storage::messages::{self, NewMessage};
use crate::storage::tokens::TokenKind;
use crate::storage::{conversations, outbox, StoreError};

/// Ingress, console chat, operator sends and the outbox.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/ingress", post(ingress))
        .route("/api/chat", post(chat))
        .route("/api/send", post(send))
        .route("/api/outbox", get(outbox))
}

/// Across a link: an operator send, at `admin`. Absent on purpose: ingress and
/// the outbox (adapters, instance-wide) and `POST /api/chat` (a turn through a
/// link would write the target's history; `ask` is the way).
pub const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/send", Admin)];

pub async fn ingress(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<IngressMessage>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    if auth.caller.kind != TokenKind::Adapter {
        return Err(ApiError::forbidden(
            "only an adapter token may post platform messages",
        ));
    }
    let m = body(b)?;
    m.validate().map_err(ApiError::bad_request)?;
    // An adapter speaks for the one platform it was minted for.
    match auth.caller.platform.as_deref() {
        Some(p) if p == m.platform => {}
        Some(p) => {
            return Err(ApiError::forbidden(format!(
                "this adapter token is bound to platform {p:?}, not {:?}",
                m.platform
            )))
        }
        None => {
            return Err(ApiError::forbidden(
                "this adapter token is bound to no platform; mint one with `mrctl tokens create NAME --kind adapter --platform P`",
            ))
        }
    }
    let res = crate::ingress::ingest(&app, m).await?;
    let status = match res.status {
        IngestStatus::Duplicate => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    Ok((
        status,
        Json(json!({
            "status": res.status.as_str(),
            "duplicate": res.status == IngestStatus::Duplicate,
            "message_id": res.message_id,
            "space_id": res.space_id,
        })),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatBody {
    text: String,
    conversation: Option<String>,
}

pub async fn chat(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<ChatBody>,
) -> ApiResult<Json<Value>> {
    let sid = auth.require(Permission::Prompt)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    let text = text_field("text", &b.text, 32_000)?;
    let conversation = b
        .conversation
        .unwrap_or_else(|| auth.caller.caller_id.clone());
    if conversation.is_empty() || conversation.len() > 128 {
        return Err(ApiError::bad_request(
            "conversation must be 1-128 characters",
        ));
    }
    if !app.limits.allow(&space, &auth.caller.caller_id, None) {
        return Err(ApiError::SlowDown(
            ingress::SLOW_DOWN_REPLY.into(),
        ));
    }
    let caller = auth.caller.caller_id.clone();
    let sp = space.clone();
    let message_id = app
        .rt
        .store
        .write(move |tx| ingress::chat_tx(tx, &sp, &caller, &conversation, &text))
        .await?;
    let done = app.rt.waiters.register(message_id);
    app.spaces.wake(&sid).await?;
    let wait = Duration::from_secs(app.rt.settings.turn.timeout_secs + 30);
    let _ = tokio::time::timeout(wait, done).await;
    let (msg, reply) = app
        .rt
        .store
        .read(move |c| {
            Ok((
                messages::get(c, message_id)?,
                messages::reply_for(c, message_id)?,
            ))
        })
        .await?;
    let status = msg
        .as_ref()
        .and_then(|m| m.status.clone())
        .unwrap_or_default();
    if status == "pending" {
        return Err(ApiError::unavailable(format!(
            "the turn has not finished yet; its reply will be stored for message {message_id}"
        )));
    }
    Ok(Json(json!({
        "message_id": message_id,
        "status": status,
        "run_id": msg.and_then(|m| m.run_id),
        "reply": reply.map(|r| r.text),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendBody {
    text: String,
    conversation_id: Option<i64>,
}

pub async fn send(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<SendBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let sid = auth.require(Permission::Send)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    let text = text_field("text", &b.text, 32_000)?;
    let by = auth.caller.caller_id.clone();
    let outbound = app.rt.outbound.clone();
    let out = app
        .spaces
        .apply_with(&sid, move |tx| {
            let convs: Vec<_> = conversations::list(tx, Some(&space))?
                .into_iter()
                .filter(|c| c.platform != "console")
                .collect();
            let conv = match b.conversation_id {
                Some(id) => convs.into_iter().find(|c| c.id == id).ok_or_else(|| {
                    StoreError::NotFound(format!("conversation {id} in this space"))
                })?,
                None => convs.into_iter().next().ok_or_else(|| {
                    Refusal::Refused(ApiError::bad_request(
                        "this space has no platform conversation to send to",
                    ))
                })?,
            };
            let mid = messages::insert(
                tx,
                &NewMessage {
                    space_id: &space,
                    conversation_id: Some(conv.id),
                    sender_id: Some(&by),
                    sender_name: Some("Mercury"),
                    role: "assistant",
                    text: &text,
                    created_at: now_ms(),
                    ..Default::default()
                },
            )?;
            // In shadow mode the send is a transcript line and `outbox_id` null.
            let oid = outbound.enqueue(
                tx,
                &crate::runtime::OutboundSend {
                    space: &space,
                    conversation_id: Some(conv.id),
                    platform: &conv.platform,
                    external_id: &conv.external_id,
                    message_id: mid,
                    text: &text,
                    source: "send",
                },
            )?;
            Ok(json!({
                "outbox_id": oid,
                "conversation_id": conv.id,
                "message_id": mid,
                "shadow": outbound.is_shadow(),
            }))
        })
        .await?;
    Ok((StatusCode::ACCEPTED, Json(out)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxQuery {
    after: Option<i64>,
    limit: Option<u32>,
}

pub async fn outbox(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<OutboxQuery>,
) -> ApiResult<Json<Value>> {
    if auth.caller.kind != TokenKind::Adapter && !auth.caller.global_admin {
        return Err(ApiError::forbidden(
            "the outbox is for adapter tokens and global admins",
        ));
    }
    let q = params(q)?;
    // A shadow delivers nothing: the outbox it copied holds the live bot's
    // undelivered replies, which must never reach a person from here.
    if app.rt.outbound.is_shadow() {
        app.rt.outbound.record_refusal(
            None,
            "outbox",
            "would have handed outbox items to an adapter for delivery",
        );
        return Err(ApiError::forbidden(
            "this host is a shadow: nothing is delivered from it (see shadow/transcript.jsonl)",
        ));
    }
    let after = q.after.unwrap_or(0);
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    // An adapter sees only its platform's replies; a global admin sees all.
    let platform = if auth.caller.kind == TokenKind::Adapter {
        Some(auth.caller.platform.clone().ok_or_else(|| {
            ApiError::forbidden(
                "this adapter token is bound to no platform; mint one with `mrctl tokens create NAME --kind adapter --platform P`",
            )
        })?)
    } else {
        None
    };
    let items = app
        .rt
        .store
        .read(move |c| outbox::after(c, after, limit, platform.as_deref()))
        .await?;
    let next = items.last().map_or(after, |i| i.id);
    Ok(Json(json!({"items": items, "next_after": next})))
}
