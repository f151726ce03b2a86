//! Identity mappings (issue 11): a global admin maps a platform sender
//! (`telegram:123456`) to an operator (`owner`), so that sender's turns act
//! with the operator's rights; every link and unlink is audited.
//!
//! A mapping holds only for messages of the platform's in-process adapter or
//! of an adapter token minted with `--trusted-identities` (any other adapter
//! token can name any sender id).
//!
//! Must never: map an operator id, a non-platform id or a platform id many
//! people share (Telegram's anonymous admin, channel and service ids) as the
//! platform side, or let anyone but a global admin change or read the mappings.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, params, path_arg, AuditQuery, Body, Json, Params, PathArg};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids;
use crate::links::ActAsRoute;
use crate::storage::identities::{self, Identity, IdentityAudit};

/// The identity mappings and their audit.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list, link))
        .routes(routes!(audit))
        .routes(routes!(unlink))
}

/// None on purpose: the mappings are instance-wide and for global admins only.
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

/// Maps a platform sender (`telegram:123456`) to an operator (`owner`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LinkIdentity {
    #[schema(pattern = r"^[a-z0-9-]{1,32}:.+$", max_length = 200)]
    platform_id: String,
    #[schema(min_length = 1, max_length = 200)]
    caller_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IdentityReply {
    pub identity: Identity,
    /// Set when the operator id was never seen on this host (no token, no
    /// role, not the owner or an admin): a typo maps the sender to nobody.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Whether `caller` is an operator this host knows: the owner, a global
/// admin, the holder of a token, or granted a role in some space.
fn operator_known(
    c: &crate::storage::Conn,
    settings: &crate::config::Settings,
    caller: &str,
) -> crate::storage::StoreResult<bool> {
    if settings.owner == caller || settings.admins.iter().any(|a| a == caller) {
        return Ok(true);
    }
    if crate::storage::tokens::list(c)?.iter().any(|t| t.caller_id == caller) {
        return Ok(true);
    }
    for space in crate::storage::spaces::list_spaces(c)? {
        if crate::storage::spaces::list_roles(c, &space.id)?
            .iter()
            .any(|r| r.caller_id == caller)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A mapping as removed: `caller_id` is the operator it mapped to.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Unlinked {
    pub platform_id: String,
    pub caller_id: String,
    pub unlinked: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IdentityList {
    pub identities: Vec<Identity>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IdentityAuditList {
    pub audit: Vec<IdentityAudit>,
}

fn platform_id(raw: &str) -> ApiResult<()> {
    ids::validate_caller_id(raw).map_err(ApiError::bad_request)?;
    if ids::platform_of(raw).is_none() {
        return Err(ApiError::bad_request(format!(
            "{raw:?} is not a platform id: write it as <platform>:<sender id>, e.g. telegram:123456"
        )));
    }
    Ok(())
}

#[utoipa::path(post, path = "/api/identities", operation_id = "linkIdentity", summary = "Map a platform sender to an operator", tag = "identities", request_body = LinkIdentity,
    responses((status = 201, description = "Mapped", body = IdentityReply),
        (status = 409, description = "The platform id is mapped already", body = crate::api::error::ErrorBody)))]
pub(crate) async fn link(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<LinkIdentity>,
) -> ApiResult<(StatusCode, Json<IdentityReply>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    platform_id(&b.platform_id)?;
    ids::refuse_shared_placeholder(&b.platform_id, "mapped to an operator")
        .map_err(ApiError::bad_request)?;
    ids::validate_operator_id(&b.caller_id).map_err(ApiError::bad_request)?;
    let by = auth.caller.caller_id.clone();
    let settings = app.rt.settings.clone();
    let (identity, known) = app
        .rt
        .store
        .write(move |tx| {
            let known = operator_known(tx, &settings, &b.caller_id)?;
            Ok((identities::link(tx, &b.platform_id, &b.caller_id, &by)?, known))
        })
        .await?;
    let warning = (!known).then(|| {
        format!(
            "operator {:?} was never seen on this host (no token, no role, not the owner or an \
             admin): check the spelling; the mapping is stored",
            identity.caller_id
        )
    });
    Ok((StatusCode::CREATED, Json(IdentityReply { identity, warning })))
}

#[utoipa::path(delete, path = "/api/identities/{platform_id}", operation_id = "unlinkIdentity", summary = "Remove a platform sender's mapping", tag = "identities",
    params(("platform_id" = String, Path, description = "`<platform>:<sender id>`",
        pattern = r"^[a-z0-9-]{1,32}:.+$", max_length = 200)),
    responses((status = 200, description = "Unmapped", body = Unlinked)))]
pub(crate) async fn unlink(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<String>,
) -> ApiResult<Json<Unlinked>> {
    let id = path_arg(id)?;
    auth.require_global_admin()?;
    platform_id(&id)?;
    let by = auth.caller.caller_id.clone();
    let p = id.clone();
    let was = app
        .rt
        .store
        .write(move |tx| identities::unlink(tx, &p, &by))
        .await?;
    Ok(Json(Unlinked {
        platform_id: id,
        caller_id: was,
        unlinked: true,
    }))
}

#[utoipa::path(get, path = "/api/identities", operation_id = "listIdentities", summary = "List every identity mapping", tag = "identities",
    responses((status = 200, description = "Every mapping", body = IdentityList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<IdentityList>> {
    auth.require_global_admin()?;
    let list = app.rt.store.read(identities::list).await?;
    Ok(Json(IdentityList { identities: list }))
}

#[utoipa::path(get, path = "/api/identities/audit", operation_id = "identityAudit", summary = "The identity mappings' audit trail, newest first", tag = "identities", params(AuditQuery),
    responses((status = 200, description = "The mappings' audit, newest first", body = IdentityAuditList)))]
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<AuditQuery>,
) -> ApiResult<Json<IdentityAuditList>> {
    auth.require_global_admin()?;
    let limit = params(q)?.limit()?;
    let rows = app
        .rt
        .store
        .read(move |c| identities::audit_log(c, limit))
        .await?;
    Ok(Json(IdentityAuditList { audit: rows }))
}
