//! whoami and the spaces resource.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, text_field, Body};
use crate::api::{ApiError, ApiResult, Auth};
use crate::host::Host;
use crate::ids::SpaceId;
use crate::storage::spaces;

pub async fn whoami(Extension(auth): Extension<Auth>) -> Json<Value> {
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
        "space_id": space,
        "role": role,
        "permissions": perms,
    }))
}

pub async fn list(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    // A global admin holds admin in every space, so needs no space header to
    // list them; anyone else needs `spaces.list` in the space they name.
    if !auth.caller.global_admin {
        auth.require("spaces.list")?;
    }
    let all = host.rt.store.read(spaces::list_spaces).await?;
    Ok(Json(json!({ "spaces": all })))
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
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateSpace>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    let id = SpaceId::parse(&b.id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let name = match &b.name {
        Some(n) => text_field("name", n, 200)?,
        None => id.to_string(),
    };
    for t in &b.tags {
        if t.is_empty() || t.len() > 40 || t.contains(',') {
            return Err(ApiError::bad_request(format!(
                "tag {t:?} must be 1-40 characters without commas"
            )));
        }
    }
    let space = host.create_space(&id, &name, &b.tags).await?;
    Ok((StatusCode::CREATED, Json(json!({ "space": space }))))
}

pub async fn current(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.space()?;
    let id = ctx.space.to_string();
    let space = host
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
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    b: Body<Rename>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require("spaces.rename")?;
    let name = text_field("name", &body(b)?.name, 200)?;
    let id = ctx.space.to_string();
    let out = host
        .spaces
        .apply(&id.clone(), move |tx| {
            spaces::rename_space(tx, &id, &name)?;
            Ok(json!({"space_id": id, "name": name}))
        })
        .await?;
    Ok(Json(out))
}

pub async fn delete_current(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require("spaces.delete")?;
    let id = ctx.space.to_string();
    let out = host
        .spaces
        .apply(&id.clone(), move |tx| {
            let removed = spaces::delete_space(tx, &id)?;
            Ok(json!({"space_id": id, "deleted": true, "removed": removed}))
        })
        .await?;
    Ok(Json(out))
}
