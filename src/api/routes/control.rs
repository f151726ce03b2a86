//! Control of a space's agent: stop the running turn and drop the queue,
//! compact the history into a summary, clear the session.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::Json;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

use super::{path_arg, PathArg};
use crate::perms::Permission;
use crate::actors::ControlAction;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Admin;

/// Control actions (and, built with `test-hooks`, the panic injection).
pub fn router() -> Router<Arc<App>> {
    let router = Router::new().route("/api/control/{action}", post(control));
    #[cfg(feature = "test-hooks")]
    let router = router.route("/api/test/panic", post(inject_panic));
    router
}

/// Across a link: the control actions (stop, compact, clear), at `admin`.
pub const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/control/{action}", Admin)];

pub async fn control(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    action: PathArg<String>,
) -> ApiResult<Json<Value>> {
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
    Ok(Json(app.spaces.control(&space, action).await?))
}

/// Test hook: panics the space's actor (compiled only with `test-hooks`).
#[cfg(feature = "test-hooks")]
pub async fn inject_panic(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    auth.require_global_admin()?;
    let space = auth.space()?.space.clone();
    app.spaces.inject_panic(&space).await?;
    Ok(Json(serde_json::json!({"injected": true})))
}
