//! Conversation review: `POST /api/review/run` starts a scan now (or joins
//! the running one) and answers with its summary when it ends. Global admins
//! only: a scan reads every space.
//!
//! `GET /api/review/reports` lists the reports on the box (daily and weekly,
//! by date) and `GET /api/review/reports/{name}` answers one `report.json`
//! (`name` is `YYYY-MM-DD` or `YYYY-MM-DD-weekly`): for global admins and
//! for `review.read` tokens, which another host's intake pulls with. The
//! reports were gated when written; they hold no identifier.
//!
//! Must never: start a scan for anyone else, hold the request past the
//! host's shutdown, or build a report path from anything but a parsed name.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{path_arg, Json, PathArg};
use crate::review::catalog::{self, ReportEntry, ReportKind, ReportName};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::review::scan::ScanSummary;

/// `POST /api/review/run`.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(run))
        .routes(routes!(reports))
        .routes(routes!(report))
        .routes(routes!(weekly))
        .routes(routes!(ledger))
        .routes(routes!(latest_digest))
}

/// `GET /api/review/digest`: the last digest, delivered or not (it stays
/// readable when the owner has no DM to take it).
#[utoipa::path(get, path = "/api/review/digest", operation_id = "getReviewDigest", summary = "The last review digest, delivered or not", tag = "review",
    responses((status = 200, description = "The last digest and where it went", body = crate::review::digest::LatestDigest),
        (status = 404, description = "No digest was made yet", body = crate::api::error::ErrorBody)))]
pub(crate) async fn latest_digest(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<crate::review::digest::LatestDigest>> {
    auth.require_global_admin()?;
    let dir = app.rt.paths.reviews.clone();
    tokio::task::spawn_blocking(move || crate::review::digest::read_latest(&dir))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no review digest was made yet (the first scan makes one)"))
}

/// `POST /api/review/weekly`: runs the weekly synthesis now and answers its
/// summary (global admins: it reads every space).
#[utoipa::path(post, path = "/api/review/weekly", operation_id = "runWeeklyReview", summary = "Run the weekly synthesis now", tag = "review",
    responses((status = 200, description = "The weekly synthesis ran", body = crate::review::weekly::WeeklySummary),
        (status = 503, description = "It could not run", body = crate::api::error::ErrorBody)))]
pub(crate) async fn weekly(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<crate::review::weekly::WeeklySummary>> {
    auth.require_global_admin()?;
    let rt = app.rt.clone();
    tokio::select! {
        _ = app.shutdown.cancelled() => Err(ApiError::unavailable(
            "the host is shutting down; the weekly synthesis was stopped",
        )),
        done = crate::review::weekly::run(rt) => done
            .map(Json)
            .map_err(|e| ApiError::unavailable(e.to_string())),
    }
}

/// `GET /api/review/ledger`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LedgerView {
    /// Rows by approved decision (`unapproved` when none).
    pub counts: std::collections::BTreeMap<String, u64>,
    pub rows: Vec<crate::review::ledger::LedgerRow>,
}

#[utoipa::path(get, path = "/api/review/ledger", operation_id = "reviewLedger", summary = "The review intake ledger", tag = "review",
    responses((status = 200, description = "The intake ledger", body = LedgerView)))]
pub(crate) async fn ledger(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<LedgerView>> {
    auth.require_global_admin()?;
    let dir = crate::review::ledger::intake_dir(&app.rt.paths.reviews, &app.rt.settings.review);
    let l = tokio::task::spawn_blocking(move || crate::review::ledger::read(&dir))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    Ok(Json(LedgerView {
        counts: crate::review::weekly::ledger_counts(&l),
        rows: l.rows,
    }))
}

/// `GET /api/review/reports`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReportList {
    /// Oldest first.
    pub reports: Vec<ReportEntry>,
}

/// `GET /api/review/reports/{name}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReportBody {
    pub date: String,
    pub kind: ReportKind,
    /// The report's `report.json`, as written.
    #[schema(value_type = Object)]
    pub report: Value,
}

#[utoipa::path(get, path = "/api/review/reports", operation_id = "listReviewReports", summary = "List the review reports, oldest first", tag = "review",
    responses((status = 200, description = "The reports on the box, oldest first", body = ReportList)))]
pub(crate) async fn reports(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<ReportList>> {
    auth.require_review_read()?;
    let dir = app.rt.paths.reviews.clone();
    let reports = tokio::task::spawn_blocking(move || catalog::list(&dir))
        .await
        .map_err(ApiError::internal)??;
    Ok(Json(ReportList { reports }))
}

#[utoipa::path(get, path = "/api/review/reports/{name}", operation_id = "getReviewReport", summary = "Read one review report", tag = "review",
    params(("name" = String, Path, description = "`YYYY-MM-DD`, `YYYY-MM-DD-daily` or `YYYY-MM-DD-weekly`")),
    responses((status = 200, description = "The report's report.json", body = ReportBody),
        (status = 400, description = "Not a report name", body = crate::api::error::ErrorBody),
        (status = 404, description = "No such report", body = crate::api::error::ErrorBody)))]
pub(crate) async fn report(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    name: PathArg<String>,
) -> ApiResult<Json<ReportBody>> {
    auth.require_review_read()?;
    let name = ReportName::parse(&path_arg(name)?)?;
    let dir = app.rt.paths.reviews.clone();
    let n = name.clone();
    let report = tokio::task::spawn_blocking(move || catalog::read(&dir, &n))
        .await
        .map_err(ApiError::internal)??;
    Ok(Json(ReportBody {
        date: name.date,
        kind: name.kind,
        report,
    }))
}

/// None on purpose: a scan reads every space, so it is for global admins only.
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

/// How long the request waits for the scan; after that it answers 202 with
/// the run id, and the report and digest still arrive when the scan ends.
pub(crate) const WAIT: Duration = Duration::from_secs(3600);

/// The scan goes on after the request stopped waiting.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ScanRunning {
    pub run_id: String,
    /// `running`.
    pub status: String,
}

/// The scan's summary when it ended, or that it is still running.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum ScanAnswer {
    Ended(Box<ScanSummary>),
    Running(ScanRunning),
}

#[utoipa::path(post, path = "/api/review/run", operation_id = "runReview", summary = "Scan the review window now", tag = "review",
    responses((status = 200, description = "The scan ended", body = ScanSummary),
        (status = 202, description = "Still running after the wait", body = ScanRunning)))]
pub(crate) async fn run(
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
