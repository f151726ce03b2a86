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
//! 6. one audit row, written by a guard that runs however the request ends
//!    (a client that went away included): for an `admin` route whose effect
//!    is a space write (`ActAsRoute::audit_with_write`) the row is inserted
//!    in that write's own transaction and completed afterwards; for any
//!    other `admin` route it is committed before the handler runs (and
//!    completed afterwards); for a read it is written once, at the end.
//!    What is written at the end lingers up to `storage::LINGER` to share a
//!    commit with the rows and writes of the same moment; the audit listing
//!    flushes it first, so nobody reads the audit without it.
//!
//! Steps 1, 3 and 4 read the store once: the holder context, the target's
//! existence and admin set and the edges come from one statement
//! (`storage::links::act_as_view`) in the auth step's read. No grant is
//! kept between requests (D-003), so a revoke answers the very next one.
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
use crate::links::audit::{AuditSlot, Outcome};
use crate::links::{self, strip_invisible, ActAsRoute, LinkLevel, NoGrant};
use crate::perms::{self, Permission, ROLE_ADMIN, ROLE_MEMBER, ROLE_NONE};
use crate::redaction::{RedactionList, Redactor};
use crate::storage::links::{self as link_store, AuditRow, RoleNames};
use crate::storage::Store;

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

/// What the act-as step needs about the target, read in the same
/// statement as the holder context (one read per request).
pub(super) struct ActAsLookup {
    exists: bool,
    edges: Vec<links::LinkGrant>,
    target_perms: perms::PermSet,
}

/// The holder context of an act-as request and its [`ActAsLookup`], from one
/// statement; `None` when the holder does not exist. `forced` is a role
/// that wins over any stored one (a global admin's `admin`, an ask token's
/// fixed role). Nothing is cached: every request reads the edges anew.
pub(super) fn read(
    c: &crate::storage::Conn,
    holder: &SpaceId,
    caller: &str,
    target: &SpaceId,
    forced: Option<&str>,
) -> crate::storage::StoreResult<Option<(SpaceCtx, ActAsLookup)>> {
    let target_key = perms::override_key(ROLE_ADMIN);
    let view = link_store::act_as_view(
        c,
        holder.as_str(),
        caller,
        target.as_str(),
        &RoleNames {
            forced,
            member: ROLE_MEMBER,
            none: ROLE_NONE,
            target_key: &target_key,
        },
    )?;
    if !view.holder_exists {
        return Ok(None);
    }
    let holder_perms = perms::permissions_from(&view.holder_role, view.holder_override.as_deref());
    Ok(Some((
        SpaceCtx {
            space: holder.clone(),
            role: view.holder_role,
            perms: holder_perms,
        },
        ActAsLookup {
            exists: view.target_exists,
            edges: links::grants_of(&view.edges),
            target_perms: perms::permissions_from(ROLE_ADMIN, view.target_override.as_deref()),
        },
    )))
}

/// Writes (or completes) the act-as audit row however the request ends: if
/// the request future is dropped before [`AuditGuard::finish`] (the client
/// went away), `Drop` records status 499.
struct AuditGuard {
    store: Store,
    /// The request's row, until the guard has queued its completion.
    slot: Option<AuditSlot>,
}

/// The status recorded when the client closed the connection first.
const CLIENT_GONE: i64 = 499;

impl AuditGuard {
    fn finish(mut self, status: i64, change: Option<AuditChange>) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let text = |v: Option<Value>| v.map(|v| v.to_string());
        let (before, after) = change
            .map(|c| (text(c.before), text(c.after)))
            .unwrap_or_default();
        queue(
            &self.store,
            slot,
            Outcome {
                status,
                detail: None,
                before,
                after,
            },
        );
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let outcome = Outcome {
                status: CLIENT_GONE,
                detail: Some("the client closed the request before the answer".into()),
                ..Default::default()
            };
            queue(&self.store, slot, outcome);
        }
    }
}

/// Queues the row's completion as a lingering write: the answer never waits
/// for it, `Drop` cannot await, and rows of the same moment share a commit
/// (one per request was most of what an act-as read cost over a direct one).
/// Every write the handler awaited is committed already; a write still in
/// flight when the client went away finds the row closed and leaves it be.
fn queue(store: &Store, slot: AuditSlot, outcome: Outcome) {
    store.write_lingering("space-link audit row", move |tx| {
        slot.write_outcome(tx, outcome)
    });
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
                .write_lingering("space-link audit row", move |tx| {
                    link_store::audit(tx, &row).map(|_| ())
                });
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
    // Step 6 (first half): the row is owed by the guard from here on. An
    // admin route's row is in the store no later than its effect: taken
    // into the effect's own transaction where the effect is a space write,
    // else committed before the handler runs. A read's row is written once.
    let slot = AuditSlot::new(audit);
    let guard = AuditGuard {
        store: app.rt.store.clone(),
        slot: Some(slot.clone()),
    };
    if route.level == LinkLevel::Admin && !route.audit_with_write {
        let ahead = slot.clone();
        if let Err(e) = app.rt.store.write(move |tx| ahead.write_ahead(tx)).await {
            // No effect without its row: the handler does not run, and the
            // row (if the store takes it now) says why.
            let e = ApiError::from(e);
            guard.finish(i64::from(e.status().as_u16()), None);
            return Err(e);
        }
    }
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
    let response = if route.audit_with_write {
        slot.scope(next.run(req)).await
    } else {
        next.run(req).await
    };
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
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, 64 << 20).await else {
        return ApiError::internal("could not read a response to tag").into_response();
    };
    // One pass over the bytes where it gives the same answer as the tree
    // (issue 32: parsing and re-serialising cost an act-as read more than
    // its storage did); the tree otherwise; a body that is not JSON as is.
    match tag_in_one_pass(&bytes, source).or_else(|| tag_tree(&bytes, source)) {
        Some(tagged) => {
            parts.headers.remove(axum::http::header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(tagged))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

/// The answer parsed into a tree, every string value stripped, and
/// `source_space` set on it and on each object of its `messages`; `None`
/// when it is not JSON.
fn tag_tree(bytes: &[u8], source: &str) -> Option<Vec<u8>> {
    let mut v = serde_json::from_slice::<Value>(bytes).ok()?;
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
    Some(serde_json::to_vec(&v).unwrap_or_default())
}

/// An open container while [`tag_in_one_pass`] walks an answer.
struct Open {
    object: bool,
    /// An object that gets `source_space` before it closes: the answer
    /// itself, and each object of its top-level `messages` array.
    tagged: bool,
    /// The top-level `messages` array.
    messages: bool,
    /// An object whose next string is a key.
    expect_key: bool,
    /// An object with at least one member.
    members: bool,
}

/// [`tag_text`]'s tree walk done on the JSON text in one pass (the same JSON
/// value; keys keep the handler's order instead of the tree's sorted one):
/// invisible
/// characters dropped from every string value (never from a key, as the tree
/// walk does), `"source_space"` added last to the top-level object and to
/// each object of its `messages` array. `None` where the pass could differ
/// from the tree (a `\u` escape, which the tree would decode; a
/// `source_space` already there, which the tree would replace; an answer
/// that is not one object) or the text is not well formed: the caller then
/// takes the tree. Every API answer is compact `serde_json` output, which
/// writes every character at or above U+0080 as itself.
fn tag_in_one_pass(bytes: &[u8], source: &str) -> Option<Vec<u8>> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let tag = format!("\"source_space\":{}", serde_json::to_string(source).ok()?);
    let mut out = Vec::with_capacity(bytes.len() + 32 * (1 + bytes.len() / 256));
    let mut stack: Vec<Open> = Vec::new();
    // The key being read at the top level, and the last one read there.
    let (mut in_string, mut is_key, mut key_start, mut top_key) = (false, false, 0, &b""[..]);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => {
                    if bytes.get(i + 1) == Some(&b'u') {
                        return None;
                    }
                    out.extend_from_slice(bytes.get(i..i + 2)?);
                    i += 2;
                    continue;
                }
                b'"' => {
                    in_string = false;
                    if is_key {
                        let key = &bytes[key_start..i];
                        if key == b"source_space" {
                            return None;
                        }
                        if stack.len() == 1 {
                            top_key = key;
                        }
                    }
                    out.push(b);
                }
                0x80.. => {
                    let len = match b {
                        0xF0.. => 4,
                        0xE0.. => 3,
                        _ => 2,
                    };
                    let ch = std::str::from_utf8(bytes.get(i..i + len)?)
                        .ok()?
                        .chars()
                        .next()?;
                    if is_key || !links::is_invisible(ch) {
                        out.extend_from_slice(&bytes[i..i + len]);
                    }
                    i += len;
                    continue;
                }
                _ => out.push(b),
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                is_key = false;
                if let Some(top) = stack.last_mut() {
                    if top.object && top.expect_key {
                        is_key = true;
                        top.members = true;
                        key_start = i + 1;
                    }
                }
            }
            b'{' | b'[' => {
                let parent = stack.last();
                let in_messages = parent.is_some_and(|p| p.messages);
                let top_messages = stack.len() == 1 && top_key == b"messages";
                stack.push(Open {
                    object: b == b'{',
                    tagged: b == b'{' && (parent.is_none() || in_messages),
                    messages: b == b'[' && top_messages,
                    expect_key: b == b'{',
                    members: false,
                });
            }
            b'}' | b']' => {
                let open = stack.pop()?;
                if open.object != (b == b'}') {
                    return None;
                }
                if open.tagged {
                    if open.members {
                        out.push(b',');
                    }
                    out.extend_from_slice(tag.as_bytes());
                }
            }
            b':' => stack.last_mut()?.expect_key = false,
            b',' => {
                if let Some(top) = stack.last_mut() {
                    top.expect_key = top.object;
                }
            }
            _ => {}
        }
        out.push(b);
        i += 1;
    }
    (!in_string && stack.is_empty()).then_some(out)
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
    fn the_one_pass_tags_and_strips_as_the_tree_does() {
        let cases = [
            serde_json::json!({"preferences": [{"key": "tone", "value": "wa\u{200B}rm"}]}),
            serde_json::json!({"messages": [
                {"id": 1, "text": "ig\u{200B}nore\u{202E} it\u{E0041}", "n": 1.5e3},
                {}, 7, "x\u{FEFF}", [{"a": 1}]], "next": null}),
            serde_json::json!({}),
            serde_json::json!({"messages": []}),
            serde_json::json!({"k\u{200B}ey": "v\u{200B}", "nested": {"messages": [{"a": "\u{00AD}b"}]},
                "q": "say \"hi\" \\ ok", "e": "\n\t", "ü": "日本\u{2060}語"}),
            serde_json::json!({"messages": {"inner": [{"x": 1}]}, "list": [true, false, null, -1, 0.1]}),
        ];
        for case in cases {
            // Compact serde_json output, as every API answer is.
            let bytes = serde_json::to_vec(&case).unwrap();
            let fast = tag_in_one_pass(&bytes, "client").expect("the pass takes it");
            let slow = tag_tree(&bytes, "client").unwrap();
            // The same JSON value (the tree writes keys sorted, the pass
            // keeps the handler's order and adds its tag last).
            let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
            assert_eq!(parse(&fast), parse(&slow), "{case}");
        }
        // Where the pass could differ, it steps aside for the tree.
        for unsure in [
            &br#"{"a":"\u200b"}"#[..],
            br#"{"source_space":"x"}"#,
            br#"[1,2]"#,
            br#"{"a":"#,
            br#""just a string""#,
        ] {
            assert!(tag_in_one_pass(unsure, "client").is_none());
        }
    }

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
