//! Control of a space's agent: stop the running turn and drop the queue,
//! compact the history into a summary, clear the session.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{path_arg, Json, PathArg};
use crate::perms::Permission;
use crate::actors::ControlAction;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Admin;

/// Control actions (and, built with `test-hooks`, the panic injection).
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    let router = OpenApiRouter::new().routes(routes!(control));
    #[cfg(feature = "test-hooks")]
    let router = router.routes(routes!(inject_panic));
    router
}

/// Across a link: the control actions (stop, compact, clear), at `admin`.
pub(crate) const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/control/{action}", Admin)];

/// `stop`: the running turn was stopped (if any) and `dropped` queued
/// messages were dropped.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Stopped {
    pub stopped: bool,
    pub dropped: u64,
}

/// `clear`: the session starts after message `boundary`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Cleared {
    pub cleared: bool,
    pub boundary: i64,
}

/// `compact`: the history up to `boundary` became `summary` (or, with
/// `compacted: false`, there was nothing to compact: `reason`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Compacted {
    pub compacted: bool,
    pub boundary: i64,
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a control action did, by action.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum ControlOutcome {
    Stopped(Stopped),
    Cleared(Cleared),
    Compacted(Compacted),
}

#[utoipa::path(post, path = "/api/control/{action}", operation_id = "controlSession", summary = "Stop, compact or clear the space's session", tag = "control",
    params(("action" = String, Path, description = "stop, compact or clear")),
    responses((status = 200, description = "Done", body = ControlOutcome),
        (status = 502, description = "compact: the model did not answer", body = crate::api::error::ErrorBody)))]
pub(crate) async fn control(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    action: PathArg<String>,
) -> ApiResult<Json<ControlOutcome>> {
    let action = path_arg(action)?;
    let (action, perm) = match action.as_str() {
        "stop" => (ControlAction::Stop, Permission::Stop),
        "compact" => (ControlAction::Compact, Permission::Compact),
        "clear" => (ControlAction::Clear, Permission::Compact),
        other => {
            return Err(ApiError::not_found(format!(
                "unknown control action {other:?}; use stop, compact or clear"
            )))
        }
    };
    let space = auth.require(perm)?.space.clone();
    let done = app.spaces.control(&space, action).await?;
    // The actor answers JSON; its shape is the contract's, checked here.
    let outcome = serde_json::from_value(done).map_err(ApiError::internal)?;
    Ok(Json(outcome))
}

#[cfg(feature = "test-hooks")]
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Injected {
    pub injected: bool,
}

/// Test hook: panics the space's actor (compiled only with `test-hooks`).
#[cfg(feature = "test-hooks")]
#[utoipa::path(post, path = "/api/test/panic", operation_id = "testInjectPanic", summary = "Make the space's actor panic (test builds only)", tag = "test-hooks",
    responses((status = 200, description = "The space's actor panicked (and restarts)", body = Injected)))]
pub(crate) async fn inject_panic(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Injected>> {
    auth.require_global_admin()?;
    let space = auth.space()?.space.clone();
    app.spaces.inject_panic(&space).await?;
    Ok(Json(Injected { injected: true }))
}
