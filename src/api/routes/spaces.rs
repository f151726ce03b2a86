//! whoami and the spaces resource.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, audited, body, name_field, Body, Json};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::storage::links::{self as link_store, AuditRow};
use crate::storage::spaces::{self, DeletedCounts, LinkRole, Space};
use crate::storage::tokens::TokenKind;
use crate::workspace::DataPaths;

/// whoami and the spaces resource.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(whoami))
        .routes(routes!(list, create))
        .routes(routes!(current, delete_current))
        .routes(routes!(rename))
}

/// Across a link: whoami, the target's own record, and a rename. Absent on
/// purpose: the spaces list and create (instance-wide) and
/// `DELETE /api/spaces/current` (D-005 lists rename, not delete).
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/whoami", Read),
    ActAsRoute::new("GET", "/api/spaces/current", Read),
    ActAsRoute::admin_write("PUT", "/api/spaces/current/name"),
];

/// Who the token is, and its role and permissions in the space it names.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WhoAmI {
    pub caller_id: String,
    pub token_kind: TokenKind,
    pub global_admin: bool,
    /// The platform id this caller was mapped from (`null`: none). Absent
    /// through a link, where the caller's own identity is not the point.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub identity: Option<Option<String>>,
    pub space_id: Option<String>,
    /// True on a shadow copy (docs/shadow.md).
    pub shadow: bool,
    /// `null` through a link: the caller holds the link's level there, not a role.
    pub role: Option<String>,
    pub permissions: Vec<String>,
    /// Set when the request acts in this space through a space link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<ViaLink>,
}

/// The link a request acts through.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ViaLink {
    pub holder: String,
    /// `read` or `admin`.
    pub level: String,
    pub link_id: i64,
    pub conversation_id: Option<i64>,
}

#[utoipa::path(get, path = "/api/whoami", operation_id = "whoami", summary = "Who the token is, in which space, with which permissions", tag = "spaces",
    responses((status = 200, description = "The caller", body = WhoAmI)))]
pub(crate) async fn whoami(State(app): State<Arc<App>>, Extension(auth): Extension<Auth>) -> Json<WhoAmI> {
    let shadow = app.rt.outbound.is_shadow();
    // Through a link the caller holds the link's level, not a role of the
    // target: show that and where it comes from, not the target's admin set.
    if let (Some(s), Some(via)) = (&auth.space, &auth.via) {
        return Json(WhoAmI {
            caller_id: auth.caller.caller_id.clone(),
            token_kind: auth.caller.kind,
            global_admin: auth.caller.global_admin,
            identity: None,
            space_id: Some(s.space.to_string()),
            shadow,
            role: None,
            permissions: Vec::new(),
            via: Some(ViaLink {
                holder: via.holder.to_string(),
                level: via.level.as_str().to_owned(),
                link_id: via.edge_id,
                conversation_id: via.conversation,
            }),
        });
    }
    let (space, role, perms) = match &auth.space {
        Some(s) => (
            Some(s.space.to_string()),
            Some(s.role.clone()),
            s.perms.iter().map(std::string::ToString::to_string).collect::<Vec<_>>(),
        ),
        None => (None, None, Vec::new()),
    };
    Json(WhoAmI {
        caller_id: auth.caller.caller_id.clone(),
        token_kind: auth.caller.kind,
        global_admin: auth.caller.global_admin,
        identity: Some(auth.caller.identity.clone()),
        space_id: space,
        shadow,
        role,
        permissions: perms,
        via: None,
    })
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SpaceList {
    pub spaces: Vec<Space>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SpaceReply {
    pub space: Space,
}

#[utoipa::path(get, path = "/api/spaces", operation_id = "listSpaces", summary = "List the spaces the caller may see", tag = "spaces",
    responses((status = 200, description = "Every space for a global admin; else the spaces where the caller holds a role", body = SpaceList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<SpaceList>> {
    // Every space for a global admin; for anyone else only the spaces where
    // they hold a role (the list itself must not reveal other spaces).
    let list = if auth.caller.global_admin {
        app.rt.store.read(spaces::list_spaces).await?
    } else {
        let caller = auth.caller.caller_id.clone();
        app.rt
            .store
            .read(move |c| spaces::spaces_of_caller(c, &caller))
            .await?
    };
    Ok(Json(SpaceList { spaces: list }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSpace {
    /// 1-63 of `a-z`, `0-9` and `-`, starting with a letter or digit.
    #[schema(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    id: String,
    /// At most 200 characters, no control character (default: the id).
    #[schema(max_length = 200)]
    name: Option<String>,
    /// Each 1-40 characters without commas.
    #[serde(default)]
    tags: Vec<String>,
}

#[utoipa::path(post, path = "/api/spaces", operation_id = "createSpace", summary = "Create a space", tag = "spaces", request_body = CreateSpace,
    responses((status = 201, description = "Created", body = SpaceReply),
        (status = 409, description = "The space exists", body = crate::api::error::ErrorBody)))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateSpace>,
) -> ApiResult<(StatusCode, Json<SpaceReply>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    let id = SpaceId::parse(&b.id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let name = match &b.name {
        Some(n) => name_field("name", n, 200)?,
        None => id.to_string(),
    };
    for t in &b.tags {
        if t.is_empty() || t.len() > 40 || t.contains(',') {
            return Err(ApiError::bad_request(format!(
                "tag {t:?} must be 1-40 characters without commas"
            )));
        }
    }
    let space = app.create_space(&id, &name, &b.tags).await?;
    Ok((StatusCode::CREATED, Json(SpaceReply { space })))
}

#[utoipa::path(get, path = "/api/spaces/current", operation_id = "getCurrentSpace", summary = "Show the space of the request", tag = "spaces",
    responses((status = 200, description = "The space of the request", body = SpaceReply)))]
pub(crate) async fn current(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<SpaceReply>> {
    let ctx = auth.space()?;
    let id = ctx.space.to_string();
    let space = app
        .rt
        .store
        .read(move |c| spaces::get_space(c, &id))
        .await?
        .ok_or_else(|| ApiError::not_found("space not found"))?;
    Ok(Json(SpaceReply { space }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rename {
    /// At most 200 characters, no control character.
    #[schema(min_length = 1, max_length = 200)]
    name: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Renamed {
    pub space_id: String,
    pub name: String,
}

#[utoipa::path(put, path = "/api/spaces/current/name", operation_id = "renameCurrentSpace", summary = "Rename the space of the request", tag = "spaces", request_body = Rename,
    responses((status = 200, description = "Renamed", body = Renamed)))]
pub(crate) async fn rename(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<Rename>,
) -> ApiResult<(Extension<AuditChange>, Json<Renamed>)> {
    let ctx = auth.require(Permission::SpacesRename)?;
    let name = name_field("name", &body(b)?.name, 200)?;
    let sid = ctx.space.clone();
    let id = sid.to_string();
    let (before, out) = apply(&app, &sid, move |tx| {
        let before = spaces::get_space(tx, &id)?.map(|s| s.name);
        spaces::rename_space(tx, &id, &name)?;
        Ok((before, Renamed { space_id: id, name }))
    })
    .await?;
    Ok(audited(json!({ "name": before }), out))
}

/// What deleting a space removed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SpaceDeleted {
    pub space_id: String,
    pub deleted: bool,
    pub removed: DeletedCounts,
    pub links_revoked: Vec<i64>,
    pub roles_removed: Vec<LinkRole>,
    pub workspace_removed: bool,
}

/// Deletes the space: its rows, every link where it is holder or target
/// (revoked and audited, with the roles those links granted), and its
/// workspace, so a space re-created with the same id starts from the
/// templates with no link and no file of the old one.
#[utoipa::path(delete, path = "/api/spaces/current", operation_id = "deleteCurrentSpace", summary = "Delete the space of the request and everything in it", tag = "spaces",
    responses((status = 200, description = "Deleted, with every link touching it revoked", body = SpaceDeleted)))]
pub(crate) async fn delete_current(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<SpaceDeleted>> {
    let ctx = auth.require(Permission::SpacesDelete)?;
    let space = ctx.space.clone();
    let id = space.to_string();
    let by = auth.caller.caller_id.clone();
    let mut out = apply(&app, &space, move |tx| {
            let removed = spaces::delete_space(tx, &id)?;
            let mut revoked = Vec::new();
            let mut roles = Vec::new();
            for link in link_store::revoke_touching(tx, &id, &by)? {
                // What the link changed in the other space comes back too.
                let (settled, removed) = super::links::take_back(tx, link.id, &by)?;
                roles.extend(removed);
                let detail = std::iter::once(format!("space {id} was deleted"))
                    .chain(settled.detail())
                    .collect::<Vec<_>>()
                    .join("; ");
                link_store::audit(
                    tx,
                    &AuditRow {
                        caller_id: by.clone(),
                        action: "revoke".into(),
                        holder_space_id: Some(link.holder_space_id.clone()),
                        target_space_id: Some(link.target_space_id.clone()),
                        link_id: Some(link.id),
                        level: Some(link.level.clone()),
                        detail: Some(detail),
                        ..Default::default()
                    },
                )?;
                revoked.push(link.id);
            }
            Ok(SpaceDeleted {
                space_id: id,
                deleted: true,
                removed,
                links_revoked: revoked,
                roles_removed: roles,
                workspace_removed: false,
            })
        })
        .await?;
    let buried = bury_workspace(&app.rt.paths, &space).map_err(|e| {
        ApiError::internal(format!(
            "space {space} was deleted but its workspace could not be removed: {e}"
        ))
    })?;
    out.workspace_removed = buried;
    Ok(Json(out))
}

/// Moves `spaces/<id>` out of `spaces/` (a rename moves the entry itself:
/// never what a symlink points at), then removes it iteratively, following
/// no link, however deep a turn made it (`workspace::walk::remove_path`). If
/// the removal fails, the tombstone stays under `<data dir>/tombstones/`,
/// where no space can inherit it.
fn bury_workspace(paths: &DataPaths, space: &SpaceId) -> std::io::Result<bool> {
    let dir = paths.workspace(space);
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let graves = paths.root.join("tombstones");
    std::fs::create_dir_all(&graves)?;
    let grave = graves.join(format!("{space}-{}", uuid::Uuid::now_v7().simple()));
    std::fs::rename(&dir, &grave)?;
    if let Err(e) = crate::workspace::walk::remove_path(&grave) {
        tracing::warn!(space = %space, error = %e, grave = %grave.display(), "a deleted space's workspace stays as a tombstone");
    }
    Ok(true)
}
