//! Reading a space's history: search, and `recent` (a time range, oldest
//! first, paged with a cursor), plus the runs list and one run's trace.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::Json;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{params, path_arg, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::clock::{now_ms, parse_time_arg};
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::storage::messages::{self, Cursor};
use crate::storage::runs;

/// Search, the recent range, and the runs list.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/messages", get(search))
        .route("/api/messages/recent", get(recent))
        .route("/api/runs", get(runs))
        .route("/api/runs/{id}", get(run_trace))
}

/// Across a link: all three reads; the two message reads also serve a
/// conversation-filtered edge (restricted to its conversation).
pub const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::conversation_read("GET", "/api/messages"),
    ActAsRoute::conversation_read("GET", "/api/messages/recent"),
    ActAsRoute::new("GET", "/api/runs", Read),
    ActAsRoute::new("GET", "/api/runs/{id}", Read),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    q: String,
    limit: Option<u32>,
}

pub async fn search(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<SearchQuery>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let q = params(q)?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 200 {
        return Err(ApiError::bad_request("limit must be between 1 and 200"));
    }
    let space = ctx.space.to_string();
    let conv = auth.via.as_ref().and_then(|v| v.conversation);
    let found = app
        .rt
        .store
        .read(move |c| messages::search(c, &space, conv, &q.q, limit))
        .await?;
    Ok(Json(json!({ "messages": found })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    since: Option<String>,
    until: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

pub async fn recent(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<RecentQuery>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let q = params(q)?;
    let now = now_ms();
    let since = parse_time_arg(q.since.as_deref().unwrap_or("24h"), now)
        .map_err(|m| ApiError::bad_request(format!("since: {m}")))?;
    let until = match q.until.as_deref() {
        Some(u) => {
            parse_time_arg(u, now).map_err(|m| ApiError::bad_request(format!("until: {m}")))?
        }
        None => i64::MAX,
    };
    if until <= since {
        return Err(ApiError::bad_request("until must be later than since"));
    }
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let cursor = q.cursor.as_deref().map(Cursor::decode).transpose()?;
    let space = ctx.space.to_string();
    let conv = auth.via.as_ref().and_then(|v| v.conversation);
    let (page, next) = app
        .rt
        .store
        .read(move |c| messages::recent(c, &space, conv, since, until, limit, cursor))
        .await?;
    Ok(Json(json!({
        "space_id": ctx.space,
        "messages": page,
        "next_cursor": next.map(Cursor::encode),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    limit: Option<u32>,
}

pub async fn runs(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<RunsQuery>,
) -> ApiResult<Json<Value>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let limit = params(q)?.limit.unwrap_or(20).clamp(1, 500);
    let space = ctx.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| runs::list(c, &space, limit))
        .await?;
    Ok(Json(json!({ "runs": list })))
}

/// One run with its trace: which model calls and tool calls it made, with
/// each tool call's arguments and exit code (D-017: the trace shows which
/// command the agent chose).
#[derive(serde::Serialize)]
pub struct RunTrace {
    pub run: runs::Run,
    pub usage: runs::UsageTotals,
    pub steps: Vec<runs::RunStep>,
}

pub async fn run_trace(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<String>,
) -> ApiResult<Json<RunTrace>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let id = path_arg(id)?;
    let space = ctx.space.to_string();
    let found = app
        .rt
        .store
        .read(move |c| {
            let Some(run) = runs::get(c, &id)?.filter(|r| r.space_id == space) else {
                return Ok(None);
            };
            let usage = runs::usage_for_run(c, &run.id)?;
            let steps = runs::steps_for(c, &run.id)?;
            Ok(Some(RunTrace { run, usage, steps }))
        })
        .await?;
    found
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no such run in this space"))
}
