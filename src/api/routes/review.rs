//! Conversation review: `POST /api/review/run` starts a scan now (or joins
//! the running one) and answers with its summary when it ends. Global admins
//! only: a scan reads every space.
//!
//! Must never: start a scan for anyone else, or hold the request past the
//! host's shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;

/// `POST /api/review/run`.
pub fn router() -> Router<Arc<App>> {
    Router::new().route("/api/review/run", post(run))
}

/// None on purpose: a scan reads every space, so it is for global admins only.
pub const ACT_AS: &[ActAsRoute] = &[];

/// How long the request waits for the scan; after that it answers 202 with
/// the run id, and the report and digest still arrive when the scan ends.
pub const WAIT: Duration = Duration::from_secs(3600);

pub async fn run(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require_global_admin()?;
    let ticket = app
        .review
        .run_now(&auth.caller.caller_id)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let run_id = ticket.run_id.clone();
    tokio::select! {
        _ = app.shutdown.cancelled() => Err(ApiError::unavailable(
            "the host is shutting down; the scan was stopped",
        )),
        done = tokio::time::timeout(WAIT, ticket.finished()) => match done {
            Ok(Some(summary)) => {
                let body = serde_json::to_value(&*summary).map_err(ApiError::internal)?;
                Ok((StatusCode::OK, Json(body)))
            }
            Ok(None) => Err(ApiError::unavailable(
                "the scan stopped before it finished (its actor restarted or the host is stopping)",
            )),
            Err(_) => Ok((
                StatusCode::ACCEPTED,
                Json(json!({"run_id": run_id, "status": "running"})),
            )),
        },
    }
}
