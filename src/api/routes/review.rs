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
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Json;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::review::scan::ScanSummary;

/// `POST /api/review/run`.
pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(run))
}

/// None on purpose: a scan reads every space, so it is for global admins only.
pub const ACT_AS: &[ActAsRoute] = &[];

/// How long the request waits for the scan; after that it answers 202 with
/// the run id, and the report and digest still arrive when the scan ends.
pub const WAIT: Duration = Duration::from_secs(3600);

/// The scan goes on after the request stopped waiting.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScanRunning {
    pub run_id: String,
    /// `running`.
    pub status: String,
}

/// The scan's summary when it ended, or that it is still running.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ScanAnswer {
    Ended(Box<ScanSummary>),
    Running(ScanRunning),
}

#[utoipa::path(post, path = "/api/review/run", tag = "review",
    responses((status = 200, description = "The scan ended", body = ScanSummary),
        (status = 202, description = "Still running after the wait", body = ScanRunning)))]
pub async fn run(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<(StatusCode, Json<ScanAnswer>)> {
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
                let summary = Box::new((*summary).clone());
                Ok((StatusCode::OK, Json(ScanAnswer::Ended(summary))))
            }
            Ok(None) => Err(ApiError::unavailable(
                "the scan stopped before it finished (its actor restarted or the host is stopping)",
            )),
            Err(_) => Ok((
                StatusCode::ACCEPTED,
                Json(ScanAnswer::Running(ScanRunning { run_id, status: "running".into() })),
            )),
        },
    }
}
