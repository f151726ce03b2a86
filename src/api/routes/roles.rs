//! Roles and permissions of a space.

use std::sync::Arc;

use std::collections::BTreeMap;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, body, params, path_arg, Body, Json, Params, PathArg};
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::actors::Refusal;
use crate::app::App;
use crate::links::restore;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::perms::{self, Permission};
use crate::storage::links::ChangeKind;
use crate::storage::spaces::{self, KvTable, RoleGrant};
use crate::storage::{Conn, StoreError};

/// Roles and the permission sets of a space.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list, grant))
        .routes(routes!(revoke))
        .routes(routes!(permissions_get, permissions_set))
}

/// Across a link: every route, reads at `read`, writes at `admin`.
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/roles", Read),
    ActAsRoute::new("GET", "/api/permissions", Read),
    ActAsRoute::admin_write("POST", "/api/roles"),
    ActAsRoute::admin_write("DELETE", "/api/roles/{caller}"),
    ActAsRoute::admin_write("PUT", "/api/permissions"),
];

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RoleList {
    pub roles: Vec<RoleGrant>,
}

#[utoipa::path(get, path = "/api/roles", operation_id = "listRoles", summary = "List the roles granted in the space", tag = "roles",
    responses((status = 200, description = "The roles granted in the space", body = RoleList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<RoleList>> {
    let space = auth.require(Permission::RolesList)?.space.to_string();
    let roles = app
        .rt
        .store
        .read(move |c| spaces::list_roles(c, &space))
        .await?;
    Ok(Json(RoleList { roles }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrantBody {
    #[schema(min_length = 1, max_length = 200)]
    caller_id: String,
    /// Default `member` (least privilege: `admin` must be asked for).
    role: Option<String>,
}

/// A role as granted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Granted {
    pub caller_id: String,
    pub role: String,
}

/// A role as revoked (`revoked`: there was one).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Revoked {
    pub caller_id: String,
    pub revoked: bool,
}

/// The rule of issue 11 (D-003: every access is one visible row): a role or
/// permission change made through a link never gives the acting caller, or
/// any caller of the holder, a role in the target. `callers` are the acting
/// caller and the holder's callers (with the operators their platform ids are
/// mapped to); `Some(message)` when the change would reach one of them.
fn link_self_grant(
    c: &Conn,
    auth: &Auth,
    target: &str,
    grantee: Option<&str>,
    role: Option<&str>,
) -> Result<Option<String>, StoreError> {
    let Some(via) = &auth.via else {
        return Ok(None);
    };
    let mut callers = spaces::callers_of(c, via.holder.as_str())?;
    callers.push(auth.caller.caller_id.clone());
    if let Some(p) = &auth.caller.identity {
        callers.push(p.clone());
    }
    let mapped: Vec<String> = callers
        .iter()
        .filter_map(|id| crate::storage::identities::operator_for(c, id).transpose())
        .collect::<Result<_, _>>()?;
    callers.extend(mapped);
    let rule = "a role or permission change through a space link never gives the acting caller or a caller of the holder space a role in the target";
    if let Some(g) = grantee {
        let g_op = crate::storage::identities::operator_for(c, g)?;
        if callers.iter().any(|x| x == g || Some(x) == g_op.as_ref()) {
            return Ok(Some(format!(
                "{rule}: {g:?} is a caller of {} (or the caller itself)",
                via.holder
            )));
        }
    }
    if let Some(role) = role {
        for x in &callers {
            if perms::resolve_role(c, target, x, false)? == role {
                return Ok(Some(format!(
                    "{rule}: {x:?} of {} holds the role {role:?} in {target}",
                    via.holder
                )));
            }
        }
    }
    Ok(None)
}

/// The sentence of the reach rule (issue 23): through a link, no role of the
/// target gains a permission that manages reach.
fn reach_refusal(what: &str) -> String {
    let list: Vec<&str> = Permission::manages_reach()
        .iter()
        .map(|p| p.as_str())
        .collect();
    format!(
        "through a space link no role of the target may gain a permission that manages reach ({}): {what}; \
         a global admin or an admin of the target can make this change directly",
        list.join(", ")
    )
}

#[utoipa::path(post, path = "/api/roles", operation_id = "grantRole", summary = "Grant a role to a caller in the space", tag = "roles", request_body = GrantBody,
    responses((status = 200, description = "Granted", body = Granted)))]
pub(crate) async fn grant(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<GrantBody>,
) -> ApiResult<(Extension<AuditChange>, Json<Granted>)> {
    let ctx = auth.require(Permission::RolesGrant)?.clone();
    let b = body(b)?;
    crate::ids::validate_caller_id(&b.caller_id).map_err(ApiError::bad_request)?;
    crate::ids::refuse_shared_placeholder(&b.caller_id, "granted a role")
        .map_err(ApiError::bad_request)?;
    let role = b.role.unwrap_or_else(|| perms::ROLE_MEMBER.into());
    perms::validate_role_name(&role).map_err(ApiError::bad_request)?;
    let sid = ctx.space.clone();
    let space = sid.to_string();
    let by = auth.caller.caller_id.clone();
    let granter_perms = ctx.perms.clone();
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = app
        .spaces
        .apply_with(&sid, move |tx| {
            if let Some(why) = link_self_grant(tx, &auth, &space, Some(&b.caller_id), None)? {
                return Err(Refusal::Refused(ApiError::Forbidden(why)));
            }
            // A grant never hands out more than the granter holds.
            let wanted = perms::role_permissions(tx, &space, &role)?;
            if let Some(extra) = wanted.iter().find(|p| !granter_perms.contains(*p)) {
                return Err(Refusal::Refused(ApiError::Forbidden(format!(
                    "you cannot grant the role {role:?}: it holds '{extra}', which you do not"
                ))));
            }
            if link.is_some() {
                let held = perms::role_permissions(
                    tx,
                    &space,
                    &perms::resolve_role(tx, &space, &b.caller_id, false)?,
                )?;
                if let Some(p) = wanted.iter().find(|p| p.is_reach() && !held.contains(*p)) {
                    return Err(Refusal::Refused(ApiError::Forbidden(reach_refusal(
                        &format!("{:?} would gain '{p}' with the role {role:?}", b.caller_id),
                    ))));
                }
            }
            let before = spaces::stored_role(tx, &space, &b.caller_id)?;
            restore::note_role_write(tx, link, &space, &b.caller_id, Some(&role))?;
            spaces::set_role(tx, &space, &b.caller_id, &role, &by, link)?;
            Ok((
                before,
                Granted {
                    caller_id: b.caller_id,
                    role,
                },
            ))
        })
        .await?;
    let change = AuditChange {
        before: Some(json!({ "role": before })),
        after: Some(json!({"role": out.role, "caller_id": out.caller_id})),
    };
    Ok((Extension(change), Json(out)))
}

#[utoipa::path(delete, path = "/api/roles/{caller}", operation_id = "revokeRole", summary = "Take a caller's granted role away", tag = "roles",
    params(("caller" = String, Path, description = "The caller whose role goes")),
    responses((status = 200, description = "Revoked (or had none)", body = Revoked)))]
pub(crate) async fn revoke(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    caller: PathArg<String>,
) -> ApiResult<(Extension<AuditChange>, Json<Revoked>)> {
    let caller = path_arg(caller)?;
    let sid = auth.require(Permission::RolesRevoke)?.space.clone();
    let space = sid.to_string();
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = apply(&app, &sid, move |tx| {
        let before = spaces::stored_role(tx, &space, &caller)?;
        if before.is_some() {
            restore::note_role_write(tx, link, &space, &caller, None)?;
        }
        let revoked = spaces::revoke_role(tx, &space, &caller)?;
        Ok((
            before,
            Revoked {
                caller_id: caller,
                revoked,
            },
        ))
    })
    .await?;
    let change = AuditChange {
        before: Some(json!({ "role": before })),
        after: Some(json!({"role": null})),
    };
    Ok((Extension(change), Json(out)))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PermQuery {
    /// Only this role's permissions.
    role: Option<String>,
}

/// One role's permission set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RolePermissions {
    pub role: String,
    pub permissions: Vec<String>,
}

/// Every role of the space with its permission set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SpacePermissions {
    pub roles: BTreeMap<String, Vec<String>>,
    /// Every permission there is.
    pub available: Vec<String>,
}

/// `?role=R`: that role's set; else every role's.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum PermissionsView {
    Role(RolePermissions),
    Space(SpacePermissions),
}

fn names<'a>(perms: impl IntoIterator<Item = &'a Permission>) -> Vec<String> {
    perms.into_iter().map(|p| p.as_str().to_owned()).collect()
}

#[utoipa::path(get, path = "/api/permissions", operation_id = "getPermissions", summary = "Show each role's permissions in the space", tag = "roles", params(PermQuery),
    responses((status = 200, description = "Permission sets", body = PermissionsView)))]
pub(crate) async fn permissions_get(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<PermQuery>,
) -> ApiResult<Json<PermissionsView>> {
    let space = auth.require(Permission::PermissionsGet)?.space.to_string();
    let q = params(q)?;
    let out = app
        .rt
        .store
        .read(move |c| {
            // The built-in permissions, then the enabled extensions' `ext.<name>`.
            let held = |role: &str| -> crate::storage::StoreResult<Vec<String>> {
                let mut all = names(&perms::role_permissions(c, &space, role)?);
                all.extend(crate::extensions::held_permissions(c, &space, role)?);
                Ok(all)
            };
            if let Some(role) = q.role {
                let permissions = held(&role)?;
                return Ok(PermissionsView::Role(RolePermissions { role, permissions }));
            }
            let mut roles = BTreeMap::new();
            for role in perms::roles_in_space(c, &space)? {
                let p = held(&role)?;
                roles.insert(role, p);
            }
            Ok(PermissionsView::Space(SpacePermissions {
                roles,
                available: names(Permission::ALL),
            }))
        })
        .await?;
    Ok(Json(out))
}

/// Sets a role's permission set in this space (only permissions the caller
/// holds; never the `admin` role's, which always holds every permission).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PermBody {
    role: String,
    permissions: Vec<String>,
}

#[utoipa::path(put, path = "/api/permissions", operation_id = "setPermissions", summary = "Replace a role's permissions in the space", tag = "roles", request_body = PermBody,
    responses((status = 200, description = "The role's set now", body = RolePermissions)))]
pub(crate) async fn permissions_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<PermBody>,
) -> ApiResult<(Extension<AuditChange>, Json<RolePermissions>)> {
    let ctx = auth.require(Permission::PermissionsSet)?.clone();
    let b = body(b)?;
    perms::validate_role_name(&b.role).map_err(ApiError::bad_request)?;
    // Found by the API fuzz: narrowing `admin` locked a space for good.
    // Every global admin is `admin` in every space, so an `admin` without
    // `permissions.set` (or `spaces.delete`) left no caller able to undo it.
    if b.role == perms::ROLE_ADMIN {
        return Err(ApiError::bad_request(
            "the admin role always holds every permission (it is how global admins manage a space);              give a narrower set to another role and grant that",
        ));
    }
    let unknown: Vec<&str> = b
        .permissions
        .iter()
        .map(String::as_str)
        .filter(|p| Permission::parse(p).is_none() && !crate::extensions::is_permission_name(p))
        .collect();
    if !unknown.is_empty() {
        let valid: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
        return Err(ApiError::bad_request(format!(
            "unknown permission(s): {}; valid ones: {}",
            unknown.join(", "),
            valid.join(", ")
        )));
    }
    let wanted: Vec<Permission> = b
        .permissions
        .iter()
        .filter_map(|p| Permission::parse(p))
        .collect();
    if let Some(p) = wanted.iter().find(|p| !ctx.perms.contains(p)) {
        return Err(ApiError::forbidden(format!(
            "you cannot give '{p}', which you do not hold"
        )));
    }
    let mut list: Vec<String> = b.permissions.clone();
    list.sort();
    list.dedup();
    let sid = ctx.space.clone();
    let space = sid.to_string();
    let by = auth.caller.caller_id.clone();
    let role = b.role.clone();
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = app
        .spaces
        .apply_with(&sid, move |tx| {
            if let Some(why) = link_self_grant(tx, &auth, &space, None, Some(&role))? {
                return Err(Refusal::Refused(ApiError::Forbidden(why)));
            }
            let before = perms::role_permissions(tx, &space, &role)?;
            if link.is_some() {
                if let Some(p) = wanted.iter().find(|p| p.is_reach() && !before.contains(*p)) {
                    return Err(Refusal::Refused(ApiError::Forbidden(reach_refusal(
                        &format!("the role {role:?} would gain '{p}'"),
                    ))));
                }
            }
            let key = perms::override_key(&role);
            let value = list.join(",");
            restore::note_kv_write(tx, link, &space, ChangeKind::Permissions, &key, Some(&value))?;
            spaces::kv_set(tx, KvTable::Config, &space, &key, &value, &by)?;
            Ok((
                names(&before),
                RolePermissions {
                    role,
                    permissions: list,
                },
            ))
        })
        .await?;
    let change = AuditChange {
        before: Some(json!({"role": out.role, "permissions": before})),
        after: Some(json!({"role": out.role, "permissions": out.permissions})),
    };
    Ok((Extension(change), Json(out)))
}
