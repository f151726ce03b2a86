//! Space links administration (D-006, D-007, D-013): global admins create,
//! update and revoke edges; `links.list` in a space shows the edges that
//! touch it, its inbound and outbound reach, and its audit trail.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, params, path_arg, Body, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::{ActAsRoute, LinkLevel};
use crate::storage::links::{self, AuditRow, NewLink, SpaceLink};
use crate::storage::spaces::LinkRole;
use crate::storage::{conversations, spaces, StoreError};

/// Link administration, listings and the audit trail.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/links", get(list).post(create))
        .route("/api/links/audit", get(audit))
        .route("/api/links/{id}", get(inspect).patch(update).delete(revoke))
}

/// None on purpose: links are administered by global admins (D-006), and a
/// link never reaches the target's own links (no chains, D-003).
pub const ACT_AS: &[ActAsRoute] = &[];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateLink {
    holder: String,
    target: String,
    level: String,
    #[serde(default)]
    both: bool,
    conversation_id: Option<i64>,
    disclosure: Option<String>,
}

fn level(raw: &str) -> ApiResult<LinkLevel> {
    LinkLevel::parse(raw)
        .ok_or_else(|| ApiError::bad_request(format!("level {raw:?} must be read or admin")))
}

fn disclosure(d: Option<String>) -> ApiResult<Option<String>> {
    match d {
        Some(d) if d.chars().count() > 2000 => Err(ApiError::bad_request(
            "disclosure is longer than 2000 characters",
        )),
        other => Ok(other),
    }
}

fn audit_row(caller: &str, action: &str, link: &SpaceLink) -> AuditRow {
    AuditRow {
        caller_id: caller.to_owned(),
        action: action.to_owned(),
        holder_space_id: Some(link.holder_space_id.clone()),
        target_space_id: Some(link.target_space_id.clone()),
        link_id: Some(link.id),
        level: Some(link.level.clone()),
        ..Default::default()
    }
}

pub async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateLink>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    let lvl = level(&b.level)?;
    let holder =
        SpaceId::parse(&b.holder).map_err(|e| ApiError::bad_request(format!("holder: {e}")))?;
    let wildcard = b.target == "*";
    if !wildcard {
        let target =
            SpaceId::parse(&b.target).map_err(|e| ApiError::bad_request(format!("target: {e}")))?;
        if target == holder {
            return Err(ApiError::bad_request("a space cannot be linked to itself"));
        }
    }
    if wildcard && b.conversation_id.is_some() {
        return Err(ApiError::bad_request(
            "a wildcard link (*) takes no conversation filter",
        ));
    }
    if wildcard && b.both {
        return Err(ApiError::bad_request("--both needs a named target, not *"));
    }
    if b.both && b.conversation_id.is_some() {
        return Err(ApiError::bad_request(
            "--both cannot carry a conversation filter (it narrows the target end only)",
        ));
    }
    let disclosure = disclosure(b.disclosure)?;
    let by = auth.caller.caller_id.clone();
    let (h, t) = (holder.to_string(), b.target.clone());
    let created = app
        .rt
        .store
        .write(move |tx| {
            for (what, id) in [("holder", &h), ("target", &t)] {
                if id != "*" && !spaces::space_exists(tx, id)? {
                    return Err(StoreError::NotFound(format!("{what} space {id}")));
                }
            }
            if let Some(conv) = b.conversation_id {
                let c = conversations::get(tx, conv)?
                    .ok_or_else(|| StoreError::NotFound(format!("conversation {conv}")))?;
                if c.space_id.as_deref() != Some(t.as_str()) {
                    return Err(StoreError::Invalid(format!(
                        "conversation {conv} does not belong to space {t}"
                    )));
                }
            }
            let mut pairs = vec![(h.clone(), t.clone())];
            if b.both {
                pairs.push((t.clone(), h.clone()));
            }
            // One active edge per holder, target and filter: a second
            // would make "revoke the link" ambiguous (D-003: one row each).
            for (holder, target) in &pairs {
                let conv = if *holder == h { b.conversation_id } else { None };
                if let Some(id) = links::active_duplicate(tx, holder, target, conv)? {
                    return Err(StoreError::Conflict(format!(
                        "link {id} already joins {holder} -> {target}{}; update or revoke it instead",
                        conv.map(|c| format!(" (conversation {c})")).unwrap_or_default()
                    )));
                }
            }
            let mut out = Vec::new();
            for (holder, target) in pairs {
                let link = links::insert(
                    tx,
                    &NewLink {
                        holder: &holder,
                        target: &target,
                        level: lvl.as_str(),
                        conversation: if holder == h { b.conversation_id } else { None },
                        disclosure: disclosure.as_deref(),
                        by: &by,
                    },
                )?;
                links::audit(tx, &audit_row(&by, "create", &link))?;
                out.push(link);
            }
            Ok(out)
        })
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "links": created }))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateLink {
    level: Option<String>,
    disclosure: Option<String>,
}

pub async fn update(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
    b: Body<UpdateLink>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    auth.require_global_admin()?;
    let b = body(b)?;
    if b.level.is_none() && b.disclosure.is_none() {
        return Err(ApiError::bad_request("give --level and/or --disclosure"));
    }
    let lvl = b.level.as_deref().map(level).transpose()?;
    let disclosure = disclosure(b.disclosure)?;
    let by = auth.caller.caller_id.clone();
    let link = app
        .rt
        .store
        .write(move |tx| {
            let link = links::update(
                tx,
                id,
                lvl.map(LinkLevel::as_str),
                disclosure.as_deref(),
                &by,
            )?;
            // A read link cannot grant roles: a downgrade takes back those it gave.
            let removed = if lvl == Some(LinkLevel::Read) {
                spaces::remove_link_roles(tx, id)?
            } else {
                Vec::new()
            };
            let mut row = audit_row(&by, "update", &link);
            row.detail = removed_detail(&removed);
            links::audit(tx, &row)?;
            Ok((link, removed))
        })
        .await?;
    let (link, removed) = link;
    Ok(Json(json!({ "link": link, "removed_roles": removed })))
}

fn removed_detail(removed: &[LinkRole]) -> Option<String> {
    (!removed.is_empty()).then(|| {
        let list: Vec<String> = removed
            .iter()
            .map(|r| format!("{} in {}", r.caller_id, r.space_id))
            .collect();
        format!("removed the roles it granted: {}", list.join(", "))
    })
}

pub async fn revoke(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    auth.require_global_admin()?;
    let by = auth.caller.caller_id.clone();
    let (link, removed) = app
        .rt
        .store
        .write(move |tx| {
            let link = links::revoke(tx, id, &by)?;
            // Revoking a link removes everything it gave (D-003), roles included.
            let removed = spaces::remove_link_roles(tx, id)?;
            let mut row = audit_row(&by, "revoke", &link);
            row.detail = removed_detail(&removed);
            links::audit(tx, &row)?;
            Ok((link, removed))
        })
        .await?;
    Ok(Json(json!({ "link": link, "removed_roles": removed })))
}

fn reach_entry(l: &SpaceLink, other: &str) -> Value {
    json!({"space": other, "level": l.level, "link_id": l.id, "conversation_id": l.target_conversation_id, "wildcard": l.target_space_id == "*"})
}

/// `?all=true` (global admins): every link, or every audit row, of the instance.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    all: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditListQuery {
    limit: Option<u32>,
    all: Option<bool>,
}

/// The names of the spaces the links name (`*` and deleted spaces have none).
fn names_of(c: &rusqlite::Connection, links: &[SpaceLink]) -> Result<Value, StoreError> {
    let mut names = serde_json::Map::new();
    for l in links {
        for id in [&l.holder_space_id, &l.target_space_id] {
            if id != "*" && !names.contains_key(id.as_str()) {
                if let Some(s) = spaces::get_space(c, id)? {
                    names.insert(id.clone(), Value::String(s.name));
                }
            }
        }
    }
    Ok(Value::Object(names))
}

pub async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<ListQuery>,
) -> ApiResult<Json<Value>> {
    if params(q)?.all == Some(true) {
        auth.require_global_admin()?;
        let (all, names) = app
            .rt
            .store
            .read(|c| {
                let all = links::all(c)?;
                let names = names_of(c, &all)?;
                Ok((all, names))
            })
            .await?;
        return Ok(Json(json!({"all": true, "links": all, "space_names": names})));
    }
    let space = auth.require(Permission::LinksList)?.space.to_string();
    let sp = space.clone();
    let (all, names) = app
        .rt
        .store
        .read(move |c| {
            let all = links::touching(c, &sp)?;
            let names = names_of(c, &all)?;
            Ok((all, names))
        })
        .await?;
    let reach_entry = |l: &SpaceLink, other: &str| {
        let mut e = reach_entry(l, other);
        e["name"] = names.get(other).cloned().unwrap_or(Value::Null);
        e
    };
    let active: Vec<&SpaceLink> = all.iter().filter(|l| l.revoked_at.is_none()).collect();
    let inbound: Vec<Value> = active
        .iter()
        .filter(|l| l.holder_space_id != space)
        .map(|l| reach_entry(l, &l.holder_space_id))
        .collect();
    let outbound: Vec<Value> = active
        .iter()
        .filter(|l| l.holder_space_id == space)
        .map(|l| reach_entry(l, &l.target_space_id))
        .collect();
    Ok(Json(
        json!({"space_id": space, "links": all, "inbound": inbound, "outbound": outbound, "space_names": names}),
    ))
}

pub async fn inspect(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    let space = auth.require(Permission::LinksList)?.space.to_string();
    let (link, roles) = app
        .rt
        .store
        .read(move |c| Ok((links::get(c, id)?, spaces::roles_of_link(c, id)?)))
        .await?;
    let link = link
        .filter(|l| {
            auth.caller.global_admin
                || l.holder_space_id == space
                || l.target_space_id == space
                || l.target_space_id == "*"
        })
        .ok_or_else(|| ApiError::not_found(format!("link {id} does not touch this space")))?;
    Ok(Json(json!({ "link": link, "granted_roles": roles })))
}

pub async fn audit(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<AuditListQuery>,
) -> ApiResult<Json<Value>> {
    let q = params(q)?;
    let limit = super::AuditQuery { limit: q.limit }.limit()?;
    if q.all == Some(true) {
        auth.require_global_admin()?;
        let rows = app
            .rt
            .store
            .read(move |c| links::audit_all(c, limit))
            .await?;
        return Ok(Json(json!({ "all": true, "audit": rows })));
    }
    let space = auth.require(Permission::LinksList)?.space.to_string();
    let rows = app
        .rt
        .store
        .read(move |c| links::audit_for(c, &space, limit))
        .await?;
    Ok(Json(json!({ "audit": rows })))
}
