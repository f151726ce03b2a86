//! The sender policy's operator side (issue 23): pending pairing requests
//! (`/api/pairings`) and the allow and deny decisions about senders and
//! conversations (`/api/senders`). Instance-wide, like the identity
//! mappings: global admins only.
//!
//! Must never: allow a platform id many people share (Telegram's anonymous
//! admin, channel and service ids), approve an expired request, or be
//! reachable across a space link.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, body, path_arg, Body, Json, PathArg};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::clock::now_ms;
use crate::ids;
use crate::ingress::policy;
use crate::links::ActAsRoute;
use crate::review::catalog::{self, ReportEntry};
use crate::storage::forget::{self, InstanceForgotten, SpaceForgotten};
use crate::storage::pairings::{self, Decision, Pairing, RuleKind, SenderRule};

/// Pairing requests and sender decisions.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list_pairings))
        .routes(routes!(approve))
        .routes(routes!(deny))
        .routes(routes!(list_senders))
        .routes(routes!(allow_sender))
        .routes(routes!(deny_sender))
        .routes(routes!(forget_sender))
}

/// None on purpose: who may talk to the bot is instance-wide, for global admins only.
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PairingList {
    /// Pending requests, oldest first: `code`, `platform`, `sender`, `name`,
    /// `created_at`, `expires_at` (ms since the epoch).
    pub pairings: Vec<Pairing>,
}

/// A request decided: the request as it was and the decision it left.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PairingDecided {
    pub pairing: Pairing,
    pub rule: SenderRule,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SenderList {
    /// Every decision: senders (`telegram:42`) and conversations (groups).
    pub senders: Vec<SenderRule>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SenderDecided {
    pub rule: SenderRule,
}

/// One sender (`telegram:42`) or one conversation (`telegram:-1001234`, a
/// group as a whole): exactly one of the two.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SenderBody {
    /// A platform sender's caller id, `<platform>:<sender id>`.
    #[schema(pattern = r"^[a-z0-9-]{1,32}:.+$", max_length = 200)]
    sender: Option<String>,
    /// A conversation, `<platform>:<conversation id>` (see `mrctl conversations list`).
    #[schema(pattern = r"^[a-z0-9-]{1,32}:.+$", max_length = 290)]
    conversation: Option<String>,
}

/// A code as typed: 8 characters of the pairing alphabet, any case.
fn code_arg(raw: &str) -> ApiResult<String> {
    policy::parse_code(raw).map_err(ApiError::bad_request)
}

/// The (kind, platform, subject) a body names, checked.
fn subject(b: SenderBody, what: &str) -> ApiResult<(RuleKind, String, String)> {
    let (kind, raw) = match (b.sender, b.conversation) {
        (Some(s), None) => (RuleKind::Sender, s),
        (None, Some(c)) => (RuleKind::Conversation, c),
        _ => {
            return Err(ApiError::bad_request(
                "name exactly one of sender (telegram:42) or conversation (telegram:-1001234)",
            ))
        }
    };
    let Some((platform, rest)) = raw.split_once(':') else {
        return Err(ApiError::bad_request(format!(
            "{raw:?} must be <platform>:<id>, e.g. telegram:42"
        )));
    };
    ids::validate_platform(platform)
        .map_err(|m| ApiError::bad_request(format!("{raw:?}: {m}")))?;
    match kind {
        RuleKind::Sender => {
            ids::validate_caller_id(&raw).map_err(ApiError::bad_request)?;
            if ids::platform_of(&raw).is_none() {
                return Err(ApiError::bad_request(format!(
                    "{raw:?} is not a platform sender: write it as <platform>:<sender id>"
                )));
            }
            ids::refuse_shared_placeholder(&raw, what).map_err(ApiError::bad_request)?;
        }
        RuleKind::Conversation => {
            if rest.trim().is_empty() || rest.len() > 256 || rest.chars().any(char::is_control) {
                return Err(ApiError::bad_request(
                    "a conversation id must be 1-256 characters without control characters",
                ));
            }
        }
    }
    let subject = match kind {
        RuleKind::Sender => raw.clone(),
        RuleKind::Conversation => rest.to_owned(),
    };
    Ok((kind, platform.to_owned(), subject))
}

#[utoipa::path(get, path = "/api/pairings", operation_id = "listPairings", summary = "List pending pairing requests", tag = "senders",
    responses((status = 200, description = "Pending pairing requests", body = PairingList)))]
pub(crate) async fn list_pairings(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<PairingList>> {
    auth.require_global_admin()?;
    let now = now_ms();
    let pairings = app
        .rt
        .store
        .read(move |c| pairings::list(c, now))
        .await?;
    Ok(Json(PairingList { pairings }))
}

/// Takes request `code` and records `decision` for its sender; an approved
/// stranger is told once.
async fn decide_request(
    app: &App,
    auth: &Auth,
    code: String,
    decision: Decision,
) -> ApiResult<PairingDecided> {
    auth.require_global_admin()?;
    let by = auth.caller.caller_id.clone();
    let outbound = app.rt.outbound.clone();
    let wanted = code.clone();
    let done = app
        .rt
        .store
        .write(move |tx| policy::decide_request(tx, &outbound, &wanted, decision, &by))
        .await?
        .map(|(pairing, rule)| PairingDecided { pairing, rule });
    done.ok_or_else(|| {
        ApiError::not_found(format!(
            "no pending pairing request {code} (it may have expired or been decided; see `mrctl pairing list`)"
        ))
    })
}

#[utoipa::path(post, path = "/api/pairings/{code}/approve", operation_id = "approvePairing", summary = "Approve a pairing request", tag = "senders",
    params(("code" = String, Path, description = "The request's 8-character code", min_length = 8, max_length = 8)),
    responses((status = 200, description = "Approved: the sender is allowed", body = PairingDecided),
        (status = 404, description = "No such pending request", body = crate::api::error::ErrorBody)))]
pub(crate) async fn approve(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    code: PathArg<String>,
) -> ApiResult<Json<PairingDecided>> {
    auth.require_global_admin()?;
    let code = code_arg(&path_arg(code)?)?;
    Ok(Json(decide_request(&app, &auth, code, Decision::Allowed).await?))
}

#[utoipa::path(post, path = "/api/pairings/{code}/deny", operation_id = "denyPairing", summary = "Deny a pairing request", tag = "senders",
    params(("code" = String, Path, description = "The request's 8-character code", min_length = 8, max_length = 8)),
    responses((status = 200, description = "Denied: the sender gets nothing from now on", body = PairingDecided),
        (status = 404, description = "No such pending request", body = crate::api::error::ErrorBody)))]
pub(crate) async fn deny(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    code: PathArg<String>,
) -> ApiResult<Json<PairingDecided>> {
    auth.require_global_admin()?;
    let code = code_arg(&path_arg(code)?)?;
    Ok(Json(decide_request(&app, &auth, code, Decision::Denied).await?))
}

#[utoipa::path(get, path = "/api/senders", operation_id = "listSenders", summary = "List every sender allow and deny decision", tag = "senders",
    responses((status = 200, description = "Every allow and deny decision", body = SenderList)))]
pub(crate) async fn list_senders(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<SenderList>> {
    auth.require_global_admin()?;
    let senders = app.rt.store.read(pairings::rules).await?;
    Ok(Json(SenderList { senders }))
}

async fn decide_subject(
    app: &App,
    auth: &Auth,
    b: SenderBody,
    decision: Decision,
) -> ApiResult<SenderDecided> {
    let what = match decision {
        Decision::Allowed => "allowed as a sender",
        Decision::Denied => "denied as a sender",
    };
    let (kind, platform, subject) = subject(b, what)?;
    let by = auth.caller.caller_id.clone();
    let rule = app
        .rt
        .store
        .write(move |tx| pairings::decide(tx, kind, &platform, &subject, decision, &by))
        .await?;
    Ok(SenderDecided { rule })
}

#[utoipa::path(post, path = "/api/senders/allow", operation_id = "allowSender", summary = "Allow a sender or a group", tag = "senders", request_body = SenderBody,
    responses((status = 200, description = "Allowed", body = SenderDecided)))]
pub(crate) async fn allow_sender(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<SenderBody>,
) -> ApiResult<Json<SenderDecided>> {
    auth.require_global_admin()?;
    let b = body(b)?;
    Ok(Json(decide_subject(&app, &auth, b, Decision::Allowed).await?))
}

#[utoipa::path(post, path = "/api/senders/deny", operation_id = "denySender", summary = "Deny a sender or a group", tag = "senders", request_body = SenderBody,
    responses((status = 200, description = "Denied: nothing from it is answered", body = SenderDecided)))]
pub(crate) async fn deny_sender(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<SenderBody>,
) -> ApiResult<Json<SenderDecided>> {
    auth.require_global_admin()?;
    let b = body(b)?;
    Ok(Json(decide_subject(&app, &auth, b, Decision::Denied).await?))
}

/// One person, by their platform sender id.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForgetBody {
    /// A platform sender's caller id, `<platform>:<sender id>`.
    #[schema(pattern = r"^[a-z0-9-]{1,32}:.+$", max_length = 200)]
    sender: String,
}

/// What was deleted, where, and what is left for the operator to read.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SenderForgotten {
    pub sender: String,
    /// Each space that held a row of theirs, and what it no longer holds.
    pub spaces: Vec<SpaceForgotten>,
    pub instance: InstanceForgotten,
    /// The review reports that cite a deleted message: their evidence may
    /// quote the person (read, then delete them by hand).
    pub reports: Vec<ReportEntry>,
}

#[utoipa::path(post, path = "/api/senders/forget", operation_id = "forgetSender", summary = "Delete one person's messages, memberships and pairing rows in every space", tag = "senders", request_body = ForgetBody,
    responses((status = 200, description = "Forgotten: what was deleted, and the reports citing it", body = SenderForgotten)))]
pub(crate) async fn forget_sender(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<ForgetBody>,
) -> ApiResult<Json<SenderForgotten>> {
    auth.require_global_admin()?;
    let b = body(b)?;
    let (_, platform, sender) = subject(
        SenderBody {
            sender: Some(b.sender),
            conversation: None,
        },
        "forgotten",
    )?;
    let who = sender.clone();
    let held = app
        .rt
        .store
        .read(move |conn| forget::spaces_of(conn, &who))
        .await?;
    // Each space in its own writer's order; a failure part way leaves the
    // spaces not reached as they were, and forgetting again finishes them.
    let mut spaces = Vec::with_capacity(held.len());
    for space in held {
        let sid = ids::SpaceId::parse(&space).map_err(|e| {
            ApiError::internal(format!("a stored space id is invalid: {space:?}: {e}"))
        })?;
        let inbox_files = forget_kept_files(&app, &sid, &sender, &platform).await?;
        let (who, platform) = (sender.clone(), platform.clone());
        let mut forgotten = apply(&app, &sid, move |tx| {
            forget::forget_in_space(tx, &space, &who, &platform)
        })
        .await?;
        forgotten.inbox_files = inbox_files;
        spaces.push(forgotten);
    }
    let direct: Vec<i64> = spaces
        .iter()
        .flat_map(|s| s.direct_conversations.iter().copied())
        .collect();
    let (who, p) = (sender.clone(), platform.clone());
    let instance = app
        .rt
        .store
        .write(move |tx| forget::forget_instance(tx, &who, &p, &direct))
        .await?;
    let cited: std::collections::BTreeSet<i64> = spaces
        .iter()
        .flat_map(|s| s.message_ids.iter().copied())
        .collect();
    let dir = app.rt.paths.reviews.clone();
    let reports = tokio::task::spawn_blocking(move || catalog::citing(&dir, &cited))
        .await
        .map_err(|e| ApiError::internal(format!("the report scan stopped: {e}")))?
        .map_err(|e| ApiError::internal(format!("reading the review reports: {e}")))?;
    tracing::info!(
        by = %auth.caller.caller_id,
        sender = %sender,
        spaces = spaces.len(),
        messages = spaces.iter().map(|s| s.messages).sum::<usize>(),
        reports = reports.len(),
        "a sender was forgotten"
    );
    Ok(Json(SenderForgotten {
        sender,
        spaces,
        instance,
        reports,
    }))
}

/// Deletes from `space`'s workspace the files kept of what the person's
/// messages carried (through the space's actor, between turns); a file
/// already gone counts as deleted. The number deleted.
async fn forget_kept_files(
    app: &Arc<App>,
    space: &ids::SpaceId,
    sender: &str,
    platform: &str,
) -> ApiResult<usize> {
    let (s, who, p) = (space.to_string(), sender.to_owned(), platform.to_owned());
    let paths = app
        .rt
        .store
        .read(move |conn| forget::kept_files(conn, &s, &who, &p))
        .await?;
    if paths.is_empty() {
        return Ok(0);
    }
    let wait = std::time::Duration::from_secs(60);
    let deleted = app
        .spaces
        .workspace_write(space, wait, move |live| {
            let mut n = 0;
            for rel in &paths {
                match crate::workspace::files::delete(live, rel, None) {
                    Ok(_) => n += 1,
                    Err(crate::workspace::files::FilesError::Path(
                        crate::workspace::safe::SafePathError::NotFound(_),
                    )) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(n)
        })
        .await??;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_taken_in_any_case_and_checked() {
        assert_eq!(code_arg("k7qm4xpa").unwrap(), "K7QM4XPA");
        for bad in ["", "K7QM4XP", "K7QM4XPA9", "K0QM4XPA", "K7QM4XP!"] {
            assert!(code_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn senders_and_conversations_are_checked() {
        let s = |sender: Option<&str>, conversation: Option<&str>| SenderBody {
            sender: sender.map(str::to_owned),
            conversation: conversation.map(str::to_owned),
        };
        let (k, p, subj) = subject(s(Some("telegram:42"), None), "allowed").unwrap();
        assert_eq!((k, p.as_str(), subj.as_str()), (RuleKind::Sender, "telegram", "telegram:42"));
        let (k, _, subj) = subject(s(None, Some("telegram:-1001")), "allowed").unwrap();
        assert_eq!((k, subj.as_str()), (RuleKind::Conversation, "-1001"));
        for bad in [
            s(None, None),
            s(Some("telegram:1"), Some("telegram:2")),
            s(Some("owner"), None),
            s(Some("telegram:1087968824"), None),
            s(Some("console:x"), None),
        ] {
            assert!(subject(bad, "allowed").is_err());
        }
    }
}
