//! Space links administration (D-006, D-007, D-013): global admins create,
//! update and revoke edges; `links.list` in a space shows the edges that
//! touch it, its inbound and outbound reach, and its audit trail.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, params, path_arg, Body, Json, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::restore::{self, Settled, Settlement};
use crate::links::{ActAsRoute, LinkLevel};
use crate::storage::links::{self, AuditRow, LinkChange, NewLink, SpaceLink};
use crate::storage::spaces::LinkRole;
use crate::storage::{conversations, spaces, StoreError};

/// Link administration, listings and the audit trail.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(audit))
        .routes(routes!(inspect, update, revoke))
}

/// None on purpose: links are administered by global admins (D-006), and a
/// link never reaches the target's own links (no chains, D-003).
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

/// An edge from `holder` to `target` (a space id, or `*` for every space).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateLink {
    #[schema(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    holder: String,
    /// A space id, or `*`.
    #[schema(pattern = r"^([a-z0-9][a-z0-9-]{0,62}|\*)$")]
    target: String,
    #[schema(pattern = "^(read|admin)$")]
    level: String,
    /// Also the edge back (a named target only).
    #[serde(default)]
    both: bool,
    /// Reach only this conversation of the target.
    conversation_id: Option<i64>,
    /// At most 2000 characters.
    disclosure: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LinksCreated {
    pub links: Vec<SpaceLink>,
}

/// A link after an update or revoke: what it had changed in the target and
/// was put back (`restored`), what was changed since and so kept (`kept`),
/// and the roles it had granted that no longer hold (`removed_roles`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LinkChanged {
    pub link: SpaceLink,
    pub removed_roles: Vec<LinkRole>,
    pub restored: Vec<Settled>,
    pub kept: Vec<Settled>,
}

/// Takes back what the link gave (its revoke, its downgrade to `read`, the
/// deletion of a space it touches): every change it made is settled (the
/// earlier value restored, or kept if changed since), and a role it granted
/// before changes were recorded (no earlier value known) is removed.
pub(crate) fn take_back(
    tx: &crate::storage::Conn,
    link: i64,
    by: &str,
) -> Result<(Settlement, Vec<LinkRole>), StoreError> {
    let granted = spaces::roles_of_link(tx, link)?;
    let settled = restore::settle(tx, link, by)?;
    // Rows still carrying the link have no recorded change: granted before
    // changes were recorded, so the only earlier value known is none.
    spaces::remove_link_roles(tx, link)?;
    let removed = granted
        .into_iter()
        .filter(|g| {
            !settled
                .kept
                .iter()
                .any(|k| k.kind == "role" && k.space_id == g.space_id && k.key == g.caller_id)
        })
        .collect();
    Ok((settled, removed))
}

/// One space this space reaches, or is reached by.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Reach {
    pub space: String,
    pub level: String,
    pub link_id: i64,
    pub conversation_id: Option<i64>,
    pub wildcard: bool,
    /// The other space's name (none for `*` or a deleted space).
    pub name: Option<String>,
}

/// The links touching this space (revoked ones included), and its active reach.
#[derive(Debug, Serialize, ToSchema)]
// No other key: what tells this answer from the `all=true` one in the document.
#[serde(deny_unknown_fields)]
pub(crate) struct SpaceLinks {
    pub space_id: String,
    pub links: Vec<SpaceLink>,
    pub inbound: Vec<Reach>,
    pub outbound: Vec<Reach>,
    /// The names of the spaces these links name, by id.
    pub space_names: BTreeMap<String, String>,
}

/// Every link of the instance (`?all=true`, global admins).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AllLinks {
    /// `true`.
    pub all: bool,
    pub links: Vec<SpaceLink>,
    pub space_names: BTreeMap<String, String>,
}

/// `GET /api/links`: this space's links, or every link with `all=true`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum LinkListing {
    Space(SpaceLinks),
    All(AllLinks),
}

/// Every audit row of the instance (`?all=true`, global admins).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AllAudit {
    /// `true`.
    pub all: bool,
    pub audit: Vec<AuditRow>,
}

/// `GET /api/links/audit`: this space's audit, or every row with `all=true`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum LinkAudit {
    Space(LinkAuditList),
    All(AllAudit),
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LinkDetail {
    pub link: SpaceLink,
    pub granted_roles: Vec<LinkRole>,
    /// Every change made through the link, with the value it replaced and,
    /// once the link was revoked or downgraded, what became of it.
    pub changes: Vec<LinkChange>,
}

#[derive(Debug, Serialize, ToSchema)]
// No other key: what tells this answer from the `all=true` one in the document.
#[serde(deny_unknown_fields)]
pub(crate) struct LinkAuditList {
    pub audit: Vec<AuditRow>,
}

const LINK_ID: &str = "The link";

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

#[utoipa::path(post, path = "/api/links", operation_id = "createLink", summary = "Create a space link (or a pair with both)", tag = "links", request_body = CreateLink,
    responses((status = 201, description = "Created (two with both)", body = LinksCreated),
        (status = 409, description = "Such a link exists", body = crate::api::error::ErrorBody)))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateLink>,
) -> ApiResult<(StatusCode, Json<LinksCreated>)> {
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
    Ok((StatusCode::CREATED, Json(LinksCreated { links: created })))
}

/// At least one of the two.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateLink {
    /// `read` or `admin` (a downgrade to read removes the roles it gave).
    level: Option<String>,
    disclosure: Option<String>,
}

#[utoipa::path(patch, path = "/api/links/{id}", operation_id = "updateLink", summary = "Change a link's level or disclosure", tag = "links",
    params(("id" = i64, Path, description = LINK_ID)), request_body = UpdateLink,
    responses((status = 200, description = "Updated", body = LinkChanged)))]
pub(crate) async fn update(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
    b: Body<UpdateLink>,
) -> ApiResult<Json<LinkChanged>> {
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
            // A read link cannot change anything: a downgrade takes back
            // what it changed, roles included.
            let (settled, removed) = if lvl == Some(LinkLevel::Read) {
                take_back(tx, id, &by)?
            } else {
                Default::default()
            };
            let mut row = audit_row(&by, "update", &link);
            row.detail = taken_back_detail(&settled, &removed);
            links::audit(tx, &row)?;
            Ok((link, settled, removed))
        })
        .await?;
    let (link, settled, removed_roles) = link;
    Ok(Json(LinkChanged {
        link,
        removed_roles,
        restored: settled.restored,
        kept: settled.kept,
    }))
}

/// The audit detail of a revoke or downgrade: what was restored and kept,
/// and the roles that went.
pub(crate) fn taken_back_detail(settled: &Settlement, removed: &[LinkRole]) -> Option<String> {
    let mut parts = Vec::new();
    if !removed.is_empty() {
        let list: Vec<String> = removed
            .iter()
            .map(|r| format!("{} in {}", r.caller_id, r.space_id))
            .collect();
        parts.push(format!("removed the roles it granted: {}", list.join(", ")));
    }
    parts.extend(settled.detail());
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[utoipa::path(delete, path = "/api/links/{id}", operation_id = "revokeLink", summary = "Revoke a space link", tag = "links",
    params(("id" = i64, Path, description = LINK_ID)),
    responses((status = 200, description = "Revoked, with the roles it gave", body = LinkChanged)))]
pub(crate) async fn revoke(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<LinkChanged>> {
    let id = path_arg(id)?;
    auth.require_global_admin()?;
    let by = auth.caller.caller_id.clone();
    let link = app
        .rt
        .store
        .write(move |tx| {
            let link = links::revoke(tx, id, &by)?;
            // Revoking a link takes back everything it gave (D-003): each
            // value it changed comes back, roles included.
            let (settled, removed) = take_back(tx, id, &by)?;
            let mut row = audit_row(&by, "revoke", &link);
            row.detail = taken_back_detail(&settled, &removed);
            links::audit(tx, &row)?;
            Ok((link, settled, removed))
        })
        .await?;
    let (link, settled, removed) = (link.0, link.1, link.2);
    Ok(Json(LinkChanged {
        link,
        removed_roles: removed,
        restored: settled.restored,
        kept: settled.kept,
    }))
}

fn reach_entry(l: &SpaceLink, other: &str) -> Reach {
    Reach {
        space: other.to_owned(),
        level: l.level.clone(),
        link_id: l.id,
        conversation_id: l.target_conversation_id,
        wildcard: l.target_space_id == "*",
        name: None,
    }
}

/// `?all=true` (global admins): every link of the instance.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Every link of the instance (global admins only).
    all: Option<bool>,
}

/// `?limit=N&all=true` of the link audit.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditListQuery {
    /// Rows to answer, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Every audit row of the instance (global admins only).
    all: Option<bool>,
}

/// The names of the spaces the links name (`*` and deleted spaces have none).
fn names_of(
    c: &crate::storage::Conn,
    links: &[SpaceLink],
) -> Result<BTreeMap<String, String>, StoreError> {
    let mut names = BTreeMap::new();
    for l in links {
        for id in [&l.holder_space_id, &l.target_space_id] {
            if id != "*" && !names.contains_key(id.as_str()) {
                if let Some(s) = spaces::get_space(c, id)? {
                    names.insert(id.clone(), s.name);
                }
            }
        }
    }
    Ok(names)
}

#[utoipa::path(get, path = "/api/links", operation_id = "listLinks", summary = "List the links touching this space", tag = "links", params(ListQuery),
    responses((status = 200, description = "The links touching this space, or with `all=true` every link", body = LinkListing)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<ListQuery>,
) -> ApiResult<Json<LinkListing>> {
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
        return Ok(Json(LinkListing::All(AllLinks {
            all: true,
            links: all,
            space_names: names,
        })));
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
        e.name = names.get(other).cloned();
        e
    };
    let active: Vec<&SpaceLink> = all.iter().filter(|l| l.revoked_at.is_none()).collect();
    let inbound: Vec<Reach> = active
        .iter()
        .filter(|l| l.holder_space_id != space)
        .map(|l| reach_entry(l, &l.holder_space_id))
        .collect();
    let outbound: Vec<Reach> = active
        .iter()
        .filter(|l| l.holder_space_id == space)
        .map(|l| reach_entry(l, &l.target_space_id))
        .collect();
    Ok(Json(LinkListing::Space(SpaceLinks {
        space_id: space,
        links: all,
        inbound,
        outbound,
        space_names: names,
    })))
}

#[utoipa::path(get, path = "/api/links/{id}", operation_id = "getLink", summary = "Show one link and the roles it gave", tag = "links",
    params(("id" = i64, Path, description = LINK_ID)),
    responses((status = 200, description = "The link and the roles it gave", body = LinkDetail)))]
pub(crate) async fn inspect(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<LinkDetail>> {
    let id = path_arg(id)?;
    let space = auth.require(Permission::LinksList)?.space.to_string();
    let (link, roles, changes) = app
        .rt
        .store
        .read(move |c| {
            Ok((
                links::get(c, id)?,
                spaces::roles_of_link(c, id)?,
                links::changes_of_link(c, id)?,
            ))
        })
        .await?;
    let link = link
        .filter(|l| {
            auth.caller.global_admin
                || l.holder_space_id == space
                || l.target_space_id == space
                || l.target_space_id == "*"
        })
        .ok_or_else(|| ApiError::not_found(format!("link {id} does not touch this space")))?;
    Ok(Json(LinkDetail {
        link,
        granted_roles: roles,
        changes,
    }))
}

#[utoipa::path(get, path = "/api/links/audit", operation_id = "linkAudit", summary = "The links' audit trail, newest first", tag = "links", params(AuditListQuery),
    responses((status = 200, description = "This space's link audit (with `all=true` every row), newest first", body = LinkAudit)))]
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<AuditListQuery>,
) -> ApiResult<Json<LinkAudit>> {
    let q = params(q)?;
    let limit = super::AuditQuery { limit: q.limit }.limit()?;
    // None: every row (a global admin's `all=true`).
    let space = if q.all == Some(true) {
        auth.require_global_admin()?;
        None
    } else {
        Some(auth.require(Permission::LinksList)?.space.to_string())
    };
    // Act-as rows linger to share a commit: what was asked before this
    // listing is in it.
    app.rt.store.flush_lingering().await?;
    Ok(Json(match space {
        None => {
            let rows = app
                .rt
                .store
                .read(move |c| links::audit_all(c, limit))
                .await?;
            LinkAudit::All(AllAudit { all: true, audit: rows })
        }
        Some(space) => {
            let rows = app
                .rt
                .store
                .read(move |c| links::audit_for(c, &space, limit))
                .await?;
            LinkAudit::Space(LinkAuditList { audit: rows })
        }
    }))
}
