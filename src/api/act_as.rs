//! The act-as step (spec D-011): after the caller is verified in the holder
//! space, a request carrying `x-mercury-act-as: <target>` is checked once and
//! then served in the target, unchanged, by the ordinary route.
//!
//! 1. `links.act` in the holder, or 403;
//! 2. the target exists (a lookup, never a create), else the same 403;
//! 3. method + route on `ACT_AS_ROUTES`, else 400;
//! 4. a grant from `resolve_link_grant`, capped at `read` for a caller who is
//!    not admin in the holder; none, or `read` on an `admin` entry, is 403;
//! 5. the context becomes the target with the target's `admin` permission
//!    set and `via` = holder, level, edge;
//! 6. one audit row after the handler returns (or after a refusal at 4).
//!
//! Must never: write anything in the target (no member row, no message; the
//! target's role resolution is not even called), or let a response carry
//! another space's text without stripping invisible characters and tagging it.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::auth::{Auth, SpaceCtx, Via};
use super::error::ApiError;
use crate::host::Host;
use crate::ids::SpaceId;
use crate::links::{self, strip_invisible, ActAsRoute, LinkLevel};
use crate::perms::{self, ROLE_ADMIN};
use crate::review::redact::{RedactionList, Redactor};
use crate::storage::links::{self as link_store, AuditRow};
use crate::storage::spaces;

fn no_grant(target: &str) -> ApiError {
    ApiError::forbidden(format!(
        "no space link from this space grants access to space {target:?}"
    ))
}

/// What the act-as step needs from the database, read in the same
/// connection checkout as the caller's token (one read per request).
pub struct ActAsLookup {
    exists: bool,
    grant: Option<links::LinkGrant>,
    target_perms: perms::PermSet,
}

/// Reads the target's existence, the grant and the target's admin set.
pub fn lookup(
    c: &rusqlite::Connection,
    holder: &str,
    target: &str,
) -> crate::storage::StoreResult<ActAsLookup> {
    if !spaces::space_exists(c, target)? {
        return Ok(ActAsLookup {
            exists: false,
            grant: None,
            target_perms: Default::default(),
        });
    }
    Ok(ActAsLookup {
        exists: true,
        grant: links::resolve_link_grant(c, holder, target)?,
        target_perms: perms::role_permissions(c, target, ROLE_ADMIN)?,
    })
}

pub async fn act_as(
    host: Arc<Host>,
    auth: Auth,
    target_raw: String,
    lookup: Option<ActAsLookup>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let holder = auth.space.clone().ok_or_else(|| {
        ApiError::bad_request(
            "acting in another space needs a holder: send x-mercury-space (or use a run token)",
        )
    })?;
    // Step 1.
    if !holder.perms.contains("links.act") {
        return Err(ApiError::missing_perm("links.act"));
    }
    // Step 2: an invalid or unknown target gets the same answer as "no link".
    let Ok(target) = SpaceId::parse(&target_raw) else {
        return Err(no_grant(&target_raw));
    };
    if target == holder.space {
        return Err(ApiError::bad_request(
            "x-mercury-act-as names the holder space itself; drop the header",
        ));
    }
    // Step 3.
    let method = req.method().as_str().to_owned();
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let route: Option<&'static ActAsRoute> = links::find_route(&method, &path);
    let ActAsLookup {
        exists,
        grant,
        target_perms,
    } = lookup.ok_or_else(|| no_grant(target.as_str()))?;
    if !exists {
        return Err(no_grant(target.as_str()));
    }
    let Some(route) = route else {
        return Err(ApiError::bad_request(format!(
            "{method} {path} cannot be used across a space link (see ACT_AS_ROUTES in docs/links.md)"
        )));
    };
    // Step 4, audited from here on.
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, host.rt.settings.http.body_limit_bytes)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "request body is larger than the limit",
            )
        })?;
    let mut audit = AuditRow {
        caller_id: auth.caller.caller_id.clone(),
        action: "act".into(),
        holder_space_id: Some(holder.space.to_string()),
        target_space_id: Some(target.to_string()),
        method: Some(method.clone()),
        route: Some(path.clone()),
        body_summary: summarize_body(&bytes),
        ..Default::default()
    };
    let decision = decide(&holder, grant.as_ref(), route, target.as_str());
    let grant = match decision {
        Ok(g) => g,
        Err((e, level)) => {
            audit.link_id = grant.as_ref().map(|g| g.edge_id);
            audit.level = level.map(|l| l.as_str().to_owned());
            audit.status = Some(i64::from(e.status.as_u16()));
            audit.detail = Some(e.message.clone());
            write_audit(&host, audit).await;
            return Err(e);
        }
    };
    audit.link_id = Some(grant.edge_id);
    audit.level = Some(grant.level.as_str().to_owned());
    // Step 5.
    let mut req = Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut().insert(Auth {
        caller: auth.caller.clone(),
        space: Some(SpaceCtx {
            space: target.clone(),
            role: ROLE_ADMIN.into(),
            perms: target_perms,
        }),
        via: Some(Via {
            holder: holder.space.clone(),
            level: grant.level,
            edge_id: grant.edge_id,
            conversation: grant.conversation,
        }),
    });
    let response = next.run(req).await;
    audit.status = Some(i64::from(response.status().as_u16()));
    write_audit(&host, audit).await;
    // D-014: third-party text is stripped and tagged with its source space.
    if route.carries_text && response.status().is_success() {
        return Ok(tag_text(response, target.as_str()).await);
    }
    Ok(response)
}

struct Granted {
    edge_id: i64,
    level: LinkLevel,
    conversation: Option<i64>,
}

type Refusal = (ApiError, Option<LinkLevel>);

fn decide(
    holder: &SpaceCtx,
    grant: Option<&links::LinkGrant>,
    route: &ActAsRoute,
    target: &str,
) -> Result<Granted, Refusal> {
    let grant = grant.ok_or((no_grant(target), None))?;
    // D-004: a link never turns a non-admin of the holder into an admin of the target.
    let level = if holder.role == ROLE_ADMIN {
        grant.level
    } else {
        grant.level.min(LinkLevel::Read)
    };
    if route.level == LinkLevel::Admin && level != LinkLevel::Admin {
        return Err((
            ApiError::forbidden(format!(
                "this needs an admin link into {target:?}; yours gives {}",
                level.as_str()
            )),
            Some(level),
        ));
    }
    if let Some(conv) = grant.conversation {
        if !route.conversation_scoped {
            return Err((
                ApiError::forbidden(format!(
                    "your link into {target:?} reaches only its conversation {conv}"
                )),
                Some(level),
            ));
        }
    }
    Ok(Granted {
        edge_id: grant.edge_id,
        level,
        conversation: grant.conversation,
    })
}

/// Queues the audit row on the writer (in order with every other write)
/// without holding the response for its commit.
async fn write_audit(host: &Host, row: AuditRow) {
    host.rt
        .store
        .write_detached("space-link audit row", move |tx| {
            link_store::audit(tx, &row).map(|_| ())
        })
        .await;
}

/// A short, redacted view of a request body for the audit: top-level keys,
/// values cut to 60 characters, identifiers replaced, secrets hidden.
pub fn summarize_body(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return None;
    }
    let mut redactor = Redactor::new(RedactionList::new()).ok()?;
    let summary = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                let shown = if matches!(k.as_str(), "token" | "secret" | "password" | "api_key") {
                    "[hidden]".to_string()
                } else {
                    let raw = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let cut: String = raw.chars().take(60).collect();
                    if raw.chars().count() > 60 {
                        format!("{cut}…")
                    } else {
                        cut
                    }
                };
                format!("{k}={shown}")
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => format!("({} bytes, not a JSON object)", bytes.len()),
    };
    Some(redactor.redact_identifiers(&summary))
}

async fn tag_text(response: Response, source: &str) -> Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, 64 << 20).await else {
        return ApiError::internal("could not read a response to tag").into_response();
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    strip_in_place(&mut v);
    if let Value::Object(map) = &mut v {
        map.insert("source_space".into(), Value::String(source.to_owned()));
        if let Some(Value::Array(items)) = map.get_mut("messages") {
            for item in items {
                if let Value::Object(m) = item {
                    m.insert("source_space".into(), Value::String(source.to_owned()));
                }
            }
        }
    }
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        Body::from(serde_json::to_vec(&v).unwrap_or_default()),
    )
}

fn strip_in_place(v: &mut Value) {
    match v {
        Value::String(s) if s.chars().any(links::is_invisible) => *s = strip_invisible(s),
        Value::Array(a) => a.iter_mut().for_each(strip_in_place),
        Value::Object(m) => m.values_mut().for_each(strip_in_place),
        _ => {}
    }
}
