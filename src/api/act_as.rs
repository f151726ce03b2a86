//! The act-as step (spec D-011): after the caller is verified in the holder
//! space, a request carrying `x-mercury-act-as: <target>` is checked once and
//! then served in the target, unchanged, by the ordinary route.
//!
//! 1. `links.act` in the holder, or 403;
//! 2. method + route on [`ACT_AS_ROUTES`] (the union of the resources'
//!    `ACT_AS` lists), else 400 (before the target is looked at, so the
//!    answer is the same for an unknown target);
//! 3. the target exists (a lookup, never a create), else the same 403 as 4;
//! 4. a grant from the edges that apply to this request
//!    (`links::grant_for_request`), capped at `read` for a caller who is not
//!    admin in the holder; none, or too low a level, is 403;
//! 5. the context becomes the target with the target's `admin` permission
//!    set and `via` = holder, level, edge;
//! 6. one audit row: for an `admin` route it is committed before the handler
//!    runs (and completed afterwards); for a read it is written by a guard
//!    that runs however the request ends, a client that went away included.
//!
//! Must never: write anything in the target (no member row, no message; the
//! target's role resolution is not even called), or let a response carry
//! another space's text without stripping invisible characters and tagging it.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::auth::{Auth, SpaceCtx, Via};
use super::error::ApiError;
use super::routes::{Resource, RESOURCES};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::{self, strip_invisible, ActAsRoute, LinkLevel, NoGrant};
use crate::perms::{self, Permission, ROLE_ADMIN};
use crate::redaction::{RedactionList, Redactor};
use crate::storage::links::{self as link_store, AuditRow};
use crate::storage::{spaces, Store};

/// Every route that may be called across a link (D-011): the union of the
/// resources' `ACT_AS` lists, assembled at compile time. Anything else is
/// 400, whatever the target (so the answer says nothing about whether it
/// exists). Every successful answer is stripped of invisible characters and
/// tagged with `source_space` (D-014): all of them can carry the target's
/// text. What each resource leaves out, and why, is said beside its list.
pub const ACT_AS_ROUTES: &[ActAsRoute] = &UNION;

const UNION: [ActAsRoute; entry_count(RESOURCES)] = union_of(RESOURCES);

const fn entry_count(resources: &[Resource]) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < resources.len() {
        n += resources[i].act_as.len();
        i += 1;
    }
    n
}

const fn union_of<const N: usize>(resources: &[Resource]) -> [ActAsRoute; N] {
    let mut out = [ActAsRoute::new("", "", LinkLevel::Admin); N];
    let (mut k, mut i) = (0, 0);
    while i < resources.len() {
        let list = resources[i].act_as;
        let mut j = 0;
        while j < list.len() {
            out[k] = list[j];
            k += 1;
            j += 1;
        }
        i += 1;
    }
    // A compile error, not a runtime one: N is `entry_count(resources)`.
    assert!(k == N, "the act-as union is not filled");
    out
}

/// The allowlist entry for this method and route pattern.
pub(super) fn find_route(method: &str, path: &str) -> Option<&'static ActAsRoute> {
    ACT_AS_ROUTES
        .iter()
        .find(|r| r.method == method && r.path == path)
}

fn no_grant(target: &str) -> ApiError {
    ApiError::forbidden(format!(
        "no space link from this space grants access to space {target:?}"
    ))
}

/// What a route tells the audit about an update it made (D-008: before/after
/// where the route knows them). A handler puts it in its response's extensions.
#[derive(Debug, Clone, Default)]
pub struct AuditChange {
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// What the act-as step needs from the database, read in the same
/// connection checkout as the caller's token (one read per request).
pub(super) struct ActAsLookup {
    exists: bool,
    edges: Vec<links::LinkGrant>,
    target_perms: perms::PermSet,
}

/// Reads the target's existence, the edges and the target's admin set.
pub(super) fn lookup(
    c: &crate::storage::Conn,
    holder: &str,
    target: &str,
) -> crate::storage::StoreResult<ActAsLookup> {
    if !spaces::space_exists(c, target)? {
        return Ok(ActAsLookup {
            exists: false,
            edges: Vec::new(),
            target_perms: Default::default(),
        });
    }
    Ok(ActAsLookup {
        exists: true,
        edges: links::active_grants(c, holder, target)?,
        target_perms: perms::role_permissions(c, target, ROLE_ADMIN)?,
    })
}

/// Writes (or completes) the act-as audit row however the request ends: if
/// the request future is dropped before [`AuditGuard::finish`] (the client
/// went away), `Drop` records status 499.
struct AuditGuard {
    store: Store,
    /// The row already committed before the handler ran (admin routes).
    committed: Option<i64>,
    /// The row still to write (read routes).
    pending: Option<AuditRow>,
}

/// The status recorded when the client closed the connection first.
const CLIENT_GONE: i64 = 499;

impl AuditGuard {
    fn finish(mut self, status: i64, change: Option<AuditChange>) {
        let (committed, pending) = (self.committed.take(), self.pending.take());
        queue(&self.store, committed, pending, status, None, change);
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        let (committed, pending) = (self.committed.take(), self.pending.take());
        if committed.is_none() && pending.is_none() {
            return;
        }
        queue(
            &self.store,
            committed,
            pending,
            CLIENT_GONE,
            Some("the client closed the request before the answer"),
            None,
        );
    }
}

fn queue(
    store: &Store,
    committed: Option<i64>,
    pending: Option<AuditRow>,
    status: i64,
    detail: Option<&'static str>,
    change: Option<AuditChange>,
) {
    let text = |v: Option<Value>| v.map(|v| v.to_string());
    let (before, after) = change
        .map(|c| (text(c.before), text(c.after)))
        .unwrap_or_default();
    let store = store.clone();
    let job = async move {
        store
            .write_detached("space-link audit row", move |tx| {
                match (committed, pending) {
                    (Some(id), _) => link_store::audit_finish(
                        tx,
                        id,
                        status,
                        detail,
                        before.as_deref(),
                        after.as_deref(),
                    ),
                    (None, Some(mut row)) => {
                        row.status = Some(status);
                        row.detail = detail.map(str::to_owned).or(row.detail);
                        row.before_value = before;
                        row.after_value = after;
                        link_store::audit(tx, &row).map(|_| ())
                    }
                    (None, None) => Ok(()),
                }
            })
            .await;
    };
    // Drop cannot await: the queueing runs as its own task.
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn(job);
        }
        Err(_) => tracing::error!("an act-as audit row was lost: no runtime to queue it on"),
    }
}

pub(super) async fn act_as(
    app: Arc<App>,
    auth: Auth,
    target_raw: String,
    lookup: Option<ActAsLookup>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Counted and logged however the request ends: the route's level
    // (`none` off the allowlist) and the status the caller got.
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let level = find_route(&method, &route).map_or("none", |r| r.level.as_str());
    let holder = auth.space.as_ref().map(|s| s.space.to_string());
    let caller = auth.caller.caller_id.clone();
    let metrics = app.rt.metrics.clone();
    let result = act_as_checked(app, auth, target_raw.clone(), lookup, req, next).await;
    let status = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.status().as_u16(),
    };
    metrics.act_as(level, status);
    // DEBUG: the audit row is the record (D-008); a line per read at INFO
    // would grow the journal with every act-as request of a busy deployment.
    tracing::debug!(
        target: "mercury::act_as",
        holder = holder.as_deref().unwrap_or("-"),
        target_space = %target_raw,
        caller = %caller,
        method = %method,
        route = %route,
        level,
        status,
        "act-as request"
    );
    result
}

async fn act_as_checked(
    app: Arc<App>,
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
    if !holder.perms.contains(&Permission::LinksAct) {
        return Err(ApiError::missing_perm(Permission::LinksAct));
    }
    let target_ok = SpaceId::parse(&target_raw).ok();
    if target_ok.as_ref() == Some(&holder.space) {
        return Err(ApiError::bad_request(
            "x-mercury-act-as names the holder space itself; drop the header",
        ));
    }
    // Step 2, before anything about the target is known: an off-allowlist
    // route answers the same for an unknown, an unlinked and a linked target.
    let method = req.method().as_str().to_owned();
    let pattern = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let concrete = req.uri().path().to_owned();
    let Some(route) = find_route(&method, &pattern) else {
        return Err(ApiError::bad_request(format!(
            "{method} {pattern} cannot be used across a space link (see ACT_AS_ROUTES in docs/links.md)"
        )));
    };
    // Step 3: an invalid or unknown target gets the same answer as "no link".
    let Some(target) = target_ok else {
        return Err(no_grant(&target_raw));
    };
    let ActAsLookup {
        exists,
        edges,
        target_perms,
    } = lookup.ok_or_else(|| no_grant(target.as_str()))?;
    if !exists {
        return Err(no_grant(target.as_str()));
    }
    // Step 4, audited from here on.
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, app.rt.settings.http.body_limit_bytes)
        .await
        .map_err(|_| ApiError::TooLarge("request body is larger than the limit".into()))?;
    let mut audit = AuditRow {
        caller_id: auth.caller.caller_id.clone(),
        action: "act".into(),
        holder_space_id: Some(holder.space.to_string()),
        target_space_id: Some(target.to_string()),
        method: Some(method.clone()),
        route: Some(pattern.clone()),
        path: Some(concrete),
        run_id: auth.caller.run_id.clone(),
        body_summary: summarize_body(&bytes),
        detail: auth
            .caller
            .identity
            .as_ref()
            .map(|p| format!("platform identity {p}")),
        ..Default::default()
    };
    let grant = match decide(&holder, &edges, route, target.as_str()) {
        Ok(g) => g,
        Err((e, best)) => {
            audit.link_id = best.as_ref().map(|g| g.edge_id);
            audit.level = best.map(|g| g.level.as_str().to_owned());
            audit.status = Some(i64::from(e.status().as_u16()));
            audit.detail = Some(e.message().to_owned());
            let row = audit;
            app.rt
                .store
                .write_detached("space-link audit row", move |tx| {
                    link_store::audit(tx, &row).map(|_| ())
                })
                .await;
            return Err(e);
        }
    };
    audit.link_id = Some(grant.edge_id);
    audit.level = Some(grant.level.as_str().to_owned());
    // A run's step that reaches another space carries that space's data:
    // its trace row names the source (issue 23), counted before any answer.
    if let Some(run) = &auth.caller.run_id {
        app.rt.cross_reads.note(run, target.as_str());
    }
    // Step 6 (first half): an admin route's row is committed before its
    // effect can happen; a read's row is owed by the guard.
    let guard = if route.level == LinkLevel::Admin {
        let row = audit;
        let id = app
            .rt
            .store
            .write(move |tx| link_store::audit(tx, &row))
            .await?;
        AuditGuard {
            store: app.rt.store.clone(),
            committed: Some(id),
            pending: None,
        }
    } else {
        AuditGuard {
            store: app.rt.store.clone(),
            committed: None,
            pending: Some(audit),
        }
    };
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
    let change = response.extensions().get::<AuditChange>().cloned();
    guard.finish(i64::from(response.status().as_u16()), change);
    // D-014: every answer can carry the target's text: stripped and tagged.
    if response.status().is_success() {
        return Ok(tag_text(response, target.as_str()).await);
    }
    Ok(response)
}

type Refusal = (ApiError, Option<links::LinkGrant>);

fn decide(
    holder: &SpaceCtx,
    edges: &[links::LinkGrant],
    route: &ActAsRoute,
    target: &str,
) -> Result<links::LinkGrant, Refusal> {
    // D-004: a link never turns a non-admin of the holder into an admin of the target.
    let cap = if holder.role == ROLE_ADMIN {
        LinkLevel::Admin
    } else {
        LinkLevel::Read
    };
    links::grant_for_request(edges, route.level, route.conversation_scoped, cap).map_err(|why| {
        match why {
            NoGrant::NoEdge => (no_grant(target), None),
            NoGrant::TooLow(best) => (
                ApiError::forbidden(format!(
                    "this needs an admin link into {target:?}; yours gives {}",
                    best.level.as_str()
                )),
                Some(best),
            ),
            NoGrant::OnlyConversation(best) => (
                ApiError::forbidden(format!(
                    "your link into {target:?} reaches only its conversation {}",
                    best.conversation.unwrap_or_default()
                )),
                Some(best),
            ),
        }
    })
}

/// A short, redacted view of a request body for the audit: top-level keys,
/// values cut to 60 characters, identifiers replaced, secrets hidden.
pub(super) fn summarize_body(bytes: &[u8]) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allowlisted_route_is_unique() {
        for (i, a) in ACT_AS_ROUTES.iter().enumerate() {
            for b in &ACT_AS_ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {}",
                    a.method,
                    a.path
                );
            }
        }
        assert_eq!(
            find_route("POST", "/api/ask").map(|r| r.level),
            Some(LinkLevel::Admin)
        );
        assert!(find_route("GET", "/api/spaces").is_none());
    }
}
