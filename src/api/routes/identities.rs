//! Identity mappings (issue 11): a global admin maps a platform sender
//! (`telegram:123456`) to an operator (`owner`), so that sender's turns act
//! with the operator's rights; every link and unlink is audited.
//!
//! Must never: map an operator id or a non-platform id as the platform side,
//! or let anyone but a global admin change or read the mappings.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::{delete, get};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, params, path_arg, Body, Params, PathArg};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids;
use crate::links::ActAsRoute;
use crate::storage::identities;

/// The identity mappings and their audit.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/identities", get(list).post(link))
        .route("/api/identities/audit", get(audit))
        .route("/api/identities/{platform_id}", delete(unlink))
}

/// None on purpose: the mappings are instance-wide and for global admins only.
pub const ACT_AS: &[ActAsRoute] = &[];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkIdentity {
    platform_id: String,
    caller_id: String,
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

pub async fn link(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<LinkIdentity>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    platform_id(&b.platform_id)?;
    ids::validate_operator_id(&b.caller_id).map_err(ApiError::bad_request)?;
    let by = auth.caller.caller_id.clone();
    let identity = app
        .rt
        .store
        .write(move |tx| identities::link(tx, &b.platform_id, &b.caller_id, &by))
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "identity": identity }))))
}

pub async fn unlink(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<String>,
) -> ApiResult<Json<Value>> {
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
    Ok(Json(
        json!({"platform_id": id, "caller_id": was, "unlinked": true}),
    ))
}

pub async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    auth.require_global_admin()?;
    let list = app.rt.store.read(identities::list).await?;
    Ok(Json(json!({ "identities": list })))
}

pub async fn audit(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<super::AuditQuery>,
) -> ApiResult<Json<Value>> {
    auth.require_global_admin()?;
    let limit = params(q)?.limit()?;
    let rows = app
        .rt
        .store
        .read(move |c| identities::audit_log(c, limit))
        .await?;
    Ok(Json(json!({ "audit": rows })))
}
