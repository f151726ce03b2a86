//! Messages in and out: platform ingress (adapter token), console chat,
//! operator sends, and the outbox pull for adapters.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, params, text_field, Body, Json, Params};
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
use crate::storage::outbox::{self, OutboxItem};
use crate::storage::{conversations, StoreError};

/// Ingress, console chat, operator sends and the outbox.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(ingress))
        .routes(routes!(chat))
        .routes(routes!(send))
        .routes(routes!(outbox))
        .routes(routes!(outbox_ack))
}

/// Across a link: an operator send, at `admin`. Absent on purpose: ingress and
/// the outbox (adapters, instance-wide) and `POST /api/chat` (a turn through a
/// link would write the target's history; `ask` is the way).
pub(crate) const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/send", Admin)];

/// What became of a platform message.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Ingested {
    /// The ingress decision: `queued`, `duplicate`, `ambient`, `muted`,
    /// `rate_limited`, `unlinked`, `pairing` (a stranger's DM: its pairing
    /// code is in the outbox, nothing else stored) or `refused` (the sender
    /// policy let nothing in).
    pub status: String,
    pub duplicate: bool,
    pub message_id: Option<i64>,
    pub space_id: Option<String>,
}

#[utoipa::path(post, path = "/api/ingress", operation_id = "postIngress", summary = "Take in a message from a platform bridge", tag = "delivery", request_body = IngressMessage,
    responses((status = 202, description = "Taken in", body = Ingested),
        (status = 200, description = "A duplicate of a message already taken in", body = Ingested)))]
pub(crate) async fn ingress(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<IngressMessage>,
) -> ApiResult<(StatusCode, Json<Ingested>)> {
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
    let origin = ingress::Origin::Token {
        trusted_identities: auth.caller.trusted_identities,
    };
    let res = crate::ingress::ingest(&app, m, origin).await?;
    let status = match res.status {
        IngestStatus::Duplicate => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    Ok((
        status,
        Json(Ingested {
            status: res.status.as_str().to_owned(),
            duplicate: res.status == IngestStatus::Duplicate,
            message_id: res.message_id,
            space_id: res.space_id,
        }),
    ))
}

/// A console message (at most 32,000 characters) in a console
/// conversation (1-128 characters; default: the caller's id).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatBody {
    #[schema(min_length = 1, max_length = 32000)]
    text: String,
    #[schema(min_length = 1, max_length = 128)]
    conversation: Option<String>,
}

/// The turn's outcome.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatReply {
    pub message_id: i64,
    /// The message's status: `done`, `failed`, `dropped`, …
    pub status: String,
    pub run_id: Option<String>,
    pub reply: Option<String>,
}

#[utoipa::path(post, path = "/api/chat", operation_id = "chat", summary = "Run an agent turn and answer with its reply", tag = "delivery", request_body = ChatBody,
    responses((status = 200, description = "The turn ended", body = ChatReply),
        (status = 409, description = "The caller's console conversation was linked to another space", body = crate::api::error::ErrorBody),
        (status = 429, description = "The caller is slowed down", body = crate::api::error::ErrorBody)))]
pub(crate) async fn chat(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<ChatBody>,
) -> ApiResult<Json<ChatReply>> {
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
    let caller = auth.caller.caller_id.clone();
    let (sp, limits) = (space.clone(), app.limits.clone());
    let stored = app
        .rt
        .store
        .write(move |tx| ingress::chat_tx(tx, &limits, &sp, &caller, &conversation, &text))
        .await?;
    let Some(message_id) = stored else {
        return Err(ApiError::SlowDown(ingress::SLOW_DOWN_REPLY.into()));
    };
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
    Ok(Json(ChatReply {
        message_id,
        status,
        run_id: msg.and_then(|m| m.run_id),
        reply: reply.map(|r| r.text),
    }))
}

/// An operator message (at most 32,000 characters) to a platform
/// conversation of the space (default: its first).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendBody {
    #[schema(min_length = 1, max_length = 32000)]
    text: String,
    conversation_id: Option<i64>,
}

/// The message as stored and queued for its adapter.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Sent {
    /// The outbox item (`null` on a shadow copy: nothing is queued to go out).
    pub outbox_id: Option<i64>,
    pub conversation_id: i64,
    pub message_id: Option<i64>,
    /// True on a shadow copy: the send went to the transcript, not out.
    pub shadow: bool,
}

#[utoipa::path(post, path = "/api/send", operation_id = "sendMessage", summary = "Queue a message to a conversation of the space", tag = "delivery", request_body = SendBody,
    responses((status = 202, description = "Queued for delivery", body = Sent)))]
pub(crate) async fn send(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<SendBody>,
) -> ApiResult<(StatusCode, Json<Sent>)> {
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
            Ok(Sent {
                outbox_id: oid,
                conversation_id: conv.id,
                message_id: mid,
                shadow: outbound.is_shadow(),
            })
        })
        .await?;
    Ok((StatusCode::ACCEPTED, Json(out)))
}

/// Whose outbox items a caller pulls and acknowledges: an adapter only its
/// platform's, a global admin every platform's (None); anyone else none.
fn outbox_platform(auth: &Auth) -> ApiResult<Option<String>> {
    if auth.caller.kind == TokenKind::Adapter {
        return auth.caller.platform.clone().map(Some).ok_or_else(|| {
            ApiError::forbidden(
                "this adapter token is bound to no platform; mint one with `mrctl tokens create NAME --kind adapter --platform P`",
            )
        });
    }
    if auth.caller.global_admin {
        return Ok(None);
    }
    Err(ApiError::forbidden(
        "the outbox is for adapter tokens and global admins",
    ))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct OutboxQuery {
    /// Items after this id (`next_after` of the previous pull; default 0).
    after: Option<i64>,
    /// Clamped to 1-1000 (default 100).
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutboxPage {
    pub items: Vec<OutboxItem>,
    /// Give it as `after` for the next pull.
    pub next_after: i64,
}

#[utoipa::path(get, path = "/api/outbox", operation_id = "listOutbox", summary = "Replies waiting to be delivered", tag = "delivery", params(OutboxQuery),
    responses((status = 200, description = "Replies to deliver", body = OutboxPage)))]
pub(crate) async fn outbox(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<OutboxQuery>,
) -> ApiResult<Json<OutboxPage>> {
    let platform = outbox_platform(&auth)?;
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
    let items = app
        .rt
        .store
        .read(move |c| outbox::after(c, after, limit, platform.as_deref()))
        .await?;
    let next = items.last().map_or(after, |i| i.id);
    Ok(Json(OutboxPage {
        items,
        next_after: next,
    }))
}

/// `POST /api/outbox/ack`: the pulling adapter delivered everything up to
/// `up_to` (the `next_after` of its last pull).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckBody {
    up_to: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Acked {
    /// Items marked delivered now (ones already delivered are not counted).
    pub acknowledged: u64,
    pub up_to: i64,
}

#[utoipa::path(post, path = "/api/outbox/ack", operation_id = "ackOutbox", summary = "Mark pulled replies delivered, up to an id", tag = "delivery", request_body = AckBody,
    responses((status = 200, description = "Marked delivered; a later pull starts after them", body = Acked)))]
pub(crate) async fn outbox_ack(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<AckBody>,
) -> ApiResult<Json<Acked>> {
    let platform = outbox_platform(&auth)?;
    let up_to = body(b)?.up_to;
    if app.rt.outbound.is_shadow() {
        return Err(ApiError::forbidden(
            "this host is a shadow: nothing is delivered from it (see shadow/transcript.jsonl)",
        ));
    }
    let acknowledged = app
        .rt
        .store
        .write(move |tx| outbox::ack(tx, up_to, platform.as_deref(), crate::clock::now_ms()))
        .await?;
    Ok(Json(Acked { acknowledged, up_to }))
}
