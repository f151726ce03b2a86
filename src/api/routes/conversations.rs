//! Conversations: list the space's chats, link a chat to a space, unlink it.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::Json;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, params, path_arg, Body, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::storage::{conversations, spaces};

/// The space's conversations, and linking a chat to a space.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/conversations", get(list))
        .route("/api/conversations/{id}/link", post(link))
        .route("/api/conversations/{id}/unlink", post(unlink))
}

/// Across a link: the list (also for a conversation-filtered edge; `?all=true`
/// is 403 through a link, D-005). Relinking a conversation is absent on purpose.
pub const ACT_AS: &[ActAsRoute] = &[ActAsRoute::conversation_read("GET", "/api/conversations")];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    all: bool,
}

pub async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<ListQuery>,
) -> ApiResult<Json<Value>> {
    let q = params(q)?;
    if q.all && auth.via.is_some() {
        // D-005: the instance-wide views are out of a link's reach.
        return Err(ApiError::forbidden(
            "?all=true lists every space's conversations and cannot be used across a space link",
        ));
    }
    let scope = if q.all {
        auth.require_global_admin()?;
        None
    } else {
        Some(auth.require(Permission::SpacesList)?.space.to_string())
    };
    let only = auth.via.as_ref().and_then(|v| v.conversation);
    let list: Vec<_> = app
        .rt
        .store
        .read(move |c| conversations::list(c, scope.as_deref()))
        .await?
        .into_iter()
        .filter(|c| only.is_none_or(|id| c.id == id))
        .collect();
    Ok(Json(json!({ "conversations": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkBody {
    space_id: String,
}

pub async fn link(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
    b: Body<LinkBody>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    let ctx = auth.require(Permission::SpacesRename)?;
    let target =
        SpaceId::parse(&body(b)?.space_id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if target != ctx.space && !auth.caller.global_admin {
        return Err(ApiError::forbidden(
            "only a global admin may link a conversation to another space",
        ));
    }
    let t = target.to_string();
    let out = app
        .spaces
        .apply(&target, move |tx| {
            if !spaces::space_exists(tx, &t)? {
                return Err(crate::storage::StoreError::NotFound(format!("space {t}")));
            }
            conversations::get(tx, id)?.ok_or_else(|| {
                crate::storage::StoreError::NotFound(format!("conversation {id}"))
            })?;
            conversations::set_space(tx, id, Some(&t))?;
            Ok(json!({"conversation_id": id, "space_id": t}))
        })
        .await?;
    Ok(Json(out))
}

pub async fn unlink(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    let ctx = auth.require(Permission::SpacesRename)?;
    let sid = ctx.space.clone();
    let space = sid.to_string();
    let global = auth.caller.global_admin;
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let conv = conversations::get(tx, id)?.ok_or_else(|| {
                crate::storage::StoreError::NotFound(format!("conversation {id}"))
            })?;
            if conv.space_id.as_deref() != Some(space.as_str()) && !global {
                return Err(crate::storage::StoreError::NotFound(format!(
                    "conversation {id} in this space"
                )));
            }
            conversations::set_space(tx, id, None)?;
            Ok(json!({"conversation_id": id, "space_id": null}))
        })
        .await?;
    Ok(Json(out))
}
