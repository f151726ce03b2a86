//! Reading a space's history: search, and `recent` (a time range, oldest
//! first, paged with a cursor), plus the runs list and one run's trace.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{params, path_arg, Json, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::clock::{now_ms, parse_time_arg};
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::storage::messages::{self, Cursor, Message};
use crate::links::traces;
use crate::storage::runs::{self, Run};

/// Search, the recent range, and the runs list.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(search))
        .routes(routes!(recent))
        .routes(routes!(runs))
        .routes(routes!(run_trace))
}

/// Across a link: all three reads; the two message reads also serve a
/// conversation-filtered edge (restricted to its conversation).
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::conversation_read("GET", "/api/messages"),
    ActAsRoute::conversation_read("GET", "/api/messages/recent"),
    ActAsRoute::new("GET", "/api/runs", Read),
    ActAsRoute::new("GET", "/api/runs/{id}", Read),
];

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct SearchQuery {
    /// The words to look for.
    q: String,
    /// 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageList {
    pub messages: Vec<Message>,
}

#[utoipa::path(get, path = "/api/messages", tag = "messages", params(SearchQuery),
    responses((status = 200, description = "Matching messages of the space", body = MessageList)))]
pub(crate) async fn search(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<SearchQuery>,
) -> ApiResult<Json<MessageList>> {
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
    Ok(Json(MessageList { messages: found }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RecentQuery {
    /// A duration back from now (`24h`, the default) or an RFC 3339 time.
    since: Option<String>,
    /// As `since`; default: now.
    until: Option<String>,
    /// 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// A page of the time range, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RecentPage {
    pub space_id: String,
    pub messages: Vec<Message>,
    /// Give it as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/messages/recent", tag = "messages", params(RecentQuery),
    responses((status = 200, description = "A page of the range", body = RecentPage)))]
pub(crate) async fn recent(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<RecentQuery>,
) -> ApiResult<Json<RecentPage>> {
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
    Ok(Json(RecentPage {
        space_id: ctx.space.to_string(),
        messages: page,
        next_cursor: next.map(Cursor::encode),
    }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunsQuery {
    /// Runs to answer, newest first (clamped to 1-500, default 20).
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunList {
    pub runs: Vec<Run>,
}

#[utoipa::path(get, path = "/api/runs", tag = "messages", params(RunsQuery),
    responses((status = 200, description = "The space's latest runs", body = RunList)))]
pub(crate) async fn runs(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<RunsQuery>,
) -> ApiResult<Json<RunList>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let limit = params(q)?.limit.unwrap_or(20).clamp(1, 500);
    let space = ctx.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| runs::list(c, &space, limit))
        .await?;
    Ok(Json(RunList { runs: list }))
}

/// One run with its trace: which model calls and tool calls it made, with
/// each tool call's arguments and exit code (D-017: the trace shows which
/// command the agent chose).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunTrace {
    pub run: runs::Run,
    pub usage: runs::UsageTotals,
    /// The currency of `usage.cost`.
    pub currency: String,
    pub steps: Vec<runs::RunStep>,
}

#[utoipa::path(get, path = "/api/runs/{id}", tag = "messages",
    params(("id" = String, Path, description = "The run")),
    responses((status = 200, description = "The run, its usage and its steps", body = RunTrace),
        (status = 404, description = "No such run in this space", body = crate::api::error::ErrorBody)))]
pub(crate) async fn run_trace(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<String>,
) -> ApiResult<Json<RunTrace>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let id = path_arg(id)?;
    let space = ctx.space.to_string();
    let holder = auth.via.as_ref().map(|v| v.holder.to_string());
    let currency = app.rt.settings.currency.clone();
    let found = app
        .rt
        .store
        .read(move |c| {
            let Some(run) = runs::get(c, &id)?.filter(|r| r.space_id == space) else {
                return Ok(None);
            };
            let usage = runs::usage_for_run(c, &run.id)?;
            let mut steps = runs::steps_for(c, &run.id)?;
            // Through a link: a step's data from a space the holder has no
            // link to is withheld, the rest tagged with its source (issue 23).
            if let Some(holder) = &holder {
                traces::withhold_steps(c, holder, &run.space_id, &mut steps)?;
            }
            Ok(Some(RunTrace {
                run,
                usage,
                currency,
                steps,
            }))
        })
        .await?;
    found
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no such run in this space"))
}
