//! Roles and permissions of a space.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, params, path_arg, Body, Params, PathArg};
use crate::api::{ApiError, ApiResult, Auth};
use crate::host::Host;
use crate::perms::{self, ALL_PERMISSIONS};
use crate::storage::spaces::{self, KvTable};
use crate::storage::StoreError;

pub async fn list(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require("roles.list")?.space.to_string();
    let roles = host
        .rt
        .store
        .read(move |c| spaces::list_roles(c, &space))
        .await?;
    Ok(Json(json!({ "roles": roles })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    caller_id: String,
    role: Option<String>,
}

pub async fn grant(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    b: Body<GrantBody>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require("roles.grant")?.clone();
    let b = body(b)?;
    crate::ids::validate_caller_id(&b.caller_id).map_err(ApiError::bad_request)?;
    let role = b.role.unwrap_or_else(|| perms::ROLE_ADMIN.into());
    perms::validate_role_name(&role).map_err(ApiError::bad_request)?;
    let space = ctx.space.to_string();
    let by = auth.caller.caller_id.clone();
    let granter_perms = ctx.perms.clone();
    let out = host
        .spaces
        .apply(&space.clone(), move |tx| {
            // A grant never hands out more than the granter holds.
            let wanted = perms::role_permissions(tx, &space, &role)?;
            if let Some(extra) = wanted.iter().find(|p| !granter_perms.contains(*p)) {
                return Err(StoreError::Invalid(format!(
                    "you cannot grant the role {role:?}: it holds '{extra}', which you do not"
                )));
            }
            spaces::set_role(tx, &space, &b.caller_id, &role, &by)?;
            Ok(json!({"caller_id": b.caller_id, "role": role}))
        })
        .await
        .map_err(|e| match ApiError::from(e) {
            e if e.code == "bad_request" => ApiError::forbidden(e.message),
            e => e,
        })?;
    Ok(Json(out))
}

pub async fn revoke(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    caller: PathArg<String>,
) -> ApiResult<Json<Value>> {
    let caller = path_arg(caller)?;
    let space = auth.require("roles.revoke")?.space.to_string();
    let out = host
        .spaces
        .apply(&space.clone(), move |tx| {
            let revoked = spaces::revoke_role(tx, &space, &caller)?;
            Ok(json!({"caller_id": caller, "revoked": revoked}))
        })
        .await?;
    Ok(Json(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermQuery {
    role: Option<String>,
}

pub async fn permissions_get(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    q: Params<PermQuery>,
) -> ApiResult<Json<Value>> {
    let space = auth.require("permissions.get")?.space.to_string();
    let q = params(q)?;
    let out = host
        .rt
        .store
        .read(move |c| {
            if let Some(role) = q.role {
                let p = perms::role_permissions(c, &space, &role)?;
                return Ok(json!({"role": role, "permissions": p}));
            }
            let mut roles = serde_json::Map::new();
            for role in perms::roles_in_space(c, &space)? {
                let p = perms::role_permissions(c, &space, &role)?;
                roles.insert(role, json!(p));
            }
            Ok(json!({"roles": roles, "available": ALL_PERMISSIONS}))
        })
        .await?;
    Ok(Json(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermBody {
    role: String,
    permissions: Vec<String>,
}

pub async fn permissions_set(
    State(host): State<Arc<Host>>,
    Extension(auth): Extension<Auth>,
    b: Body<PermBody>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require("permissions.set")?.clone();
    let b = body(b)?;
    perms::validate_role_name(&b.role).map_err(ApiError::bad_request)?;
    let unknown: Vec<&str> = b
        .permissions
        .iter()
        .map(String::as_str)
        .filter(|p| !perms::is_known(p))
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "unknown permission(s): {}; valid ones: {}",
            unknown.join(", "),
            ALL_PERMISSIONS.join(", ")
        )));
    }
    if let Some(p) = b
        .permissions
        .iter()
        .find(|p| !ctx.perms.contains(p.as_str()))
    {
        return Err(ApiError::forbidden(format!(
            "you cannot give '{p}', which you do not hold"
        )));
    }
    let mut list: Vec<String> = b.permissions.clone();
    list.sort();
    list.dedup();
    let space = ctx.space.to_string();
    let by = auth.caller.caller_id.clone();
    let role = b.role.clone();
    let out = host
        .spaces
        .apply(&space.clone(), move |tx| {
            spaces::kv_set(
                tx,
                KvTable::Config,
                &space,
                &perms::override_key(&role),
                &list.join(","),
                &by,
            )?;
            Ok(json!({"role": role, "permissions": list}))
        })
        .await?;
    Ok(Json(out))
}
