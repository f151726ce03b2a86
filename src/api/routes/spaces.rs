//! whoami and the spaces resource.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::{get, put};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{audited, body, name_field, Body};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::{Admin, Read};
use crate::storage::links::{self as link_store, AuditRow};
use crate::storage::spaces;
use crate::workspace::DataPaths;

/// whoami and the spaces resource.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/whoami", get(whoami))
        .route("/api/spaces", get(list).post(create))
        .route("/api/spaces/current", get(current).delete(delete_current))
        .route("/api/spaces/current/name", put(rename))
}

/// Across a link: whoami, the target's own record, and a rename. Absent on
/// purpose: the spaces list and create (instance-wide) and
/// `DELETE /api/spaces/current` (D-005 lists rename, not delete).
pub const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/whoami", Read),
    ActAsRoute::new("GET", "/api/spaces/current", Read),
    ActAsRoute::new("PUT", "/api/spaces/current/name", Admin),
];

pub async fn whoami(State(app): State<Arc<App>>, Extension(auth): Extension<Auth>) -> Json<Value> {
    let shadow = app.rt.outbound.is_shadow();
    // Through a link the caller holds the link's level, not a role of the
    // target: show that and where it comes from, not the target's admin set.
    if let (Some(s), Some(via)) = (&auth.space, &auth.via) {
        return Json(json!({
            "caller_id": auth.caller.caller_id,
            "token_kind": auth.caller.kind,
            "global_admin": auth.caller.global_admin,
            "space_id": s.space,
            "shadow": shadow,
            "role": null,
            "permissions": [],
            "via": {
                "holder": via.holder,
                "level": via.level,
                "link_id": via.edge_id,
                "conversation_id": via.conversation,
            },
        }));
    }
    let (space, role, perms) = match &auth.space {
        Some(s) => (
            Some(s.space.to_string()),
            Some(s.role.clone()),
            s.perms.iter().copied().collect::<Vec<_>>(),
        ),
        None => (None, None, Vec::new()),
    };
    Json(json!({
        "caller_id": auth.caller.caller_id,
        "token_kind": auth.caller.kind,
        "global_admin": auth.caller.global_admin,
        "identity": auth.caller.identity,
        "space_id": space,
        "shadow": shadow,
        "role": role,
        "permissions": perms,
    }))
}

pub async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
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
    Ok(Json(json!({ "spaces": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSpace {
    id: String,
    name: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
}

pub async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateSpace>,
) -> ApiResult<(StatusCode, Json<Value>)> {
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
    Ok((StatusCode::CREATED, Json(json!({ "space": space }))))
}

pub async fn current(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.space()?;
    let id = ctx.space.to_string();
    let space = app
        .rt
        .store
        .read(move |c| spaces::get_space(c, &id))
        .await?
        .ok_or_else(|| ApiError::not_found("space not found"))?;
    Ok(Json(json!({ "space": space })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    name: String,
}

pub async fn rename(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<Rename>,
) -> ApiResult<(Extension<AuditChange>, Json<Value>)> {
    let ctx = auth.require(Permission::SpacesRename)?;
    let name = name_field("name", &body(b)?.name, 200)?;
    let sid = ctx.space.clone();
    let id = sid.to_string();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let before = spaces::get_space(tx, &id)?.map(|s| s.name);
            spaces::rename_space(tx, &id, &name)?;
            Ok(json!({"space_id": id, "name": name, "before": {"name": before}}))
        })
        .await?;
    Ok(audited(out))
}

/// Deletes the space: its rows, every link where it is holder or target
/// (revoked and audited, with the roles those links granted), and its
/// workspace, so a space re-created with the same id starts from the
/// templates with no link and no file of the old one.
pub async fn delete_current(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require(Permission::SpacesDelete)?;
    let space = ctx.space.clone();
    let id = space.to_string();
    let by = auth.caller.caller_id.clone();
    let mut out = app
        .spaces
        .apply(&space, move |tx| {
            let removed = spaces::delete_space(tx, &id)?;
            let mut revoked = Vec::new();
            let mut roles = Vec::new();
            for link in link_store::revoke_touching(tx, &id, &by)? {
                roles.extend(spaces::remove_link_roles(tx, link.id)?);
                link_store::audit(
                    tx,
                    &AuditRow {
                        caller_id: by.clone(),
                        action: "revoke".into(),
                        holder_space_id: Some(link.holder_space_id.clone()),
                        target_space_id: Some(link.target_space_id.clone()),
                        link_id: Some(link.id),
                        level: Some(link.level.clone()),
                        detail: Some(format!("space {id} was deleted")),
                        ..Default::default()
                    },
                )?;
                revoked.push(link.id);
            }
            Ok(json!({"space_id": id, "deleted": true, "removed": removed,
                      "links_revoked": revoked, "roles_removed": roles}))
        })
        .await?;
    let buried = bury_workspace(&app.rt.paths, &space).map_err(|e| {
        ApiError::internal(format!(
            "space {space} was deleted but its workspace could not be removed: {e}"
        ))
    })?;
    if let Value::Object(m) = &mut out {
        m.insert("workspace_removed".into(), json!(buried));
    }
    Ok(Json(out))
}

/// Moves `spaces/<id>` out of `spaces/` (a rename moves the entry itself:
/// never what a symlink points at), then removes it; `remove_dir_all` does
/// not follow symlinks either. If the removal fails, the tombstone stays
/// under `<data dir>/tombstones/`, where no space can inherit it.
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
    let meta = std::fs::symlink_metadata(&grave)?;
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(&grave)
    } else {
        std::fs::remove_file(&grave)
    };
    if let Err(e) = removed {
        tracing::warn!(space = %space, error = %e, grave = %grave.display(), "a deleted space's workspace stays as a tombstone");
    }
    Ok(true)
}
