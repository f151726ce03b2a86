//! Reading a space's history: search, `recent` (a time range, oldest
//! first, paged with a cursor), one message by id with its neighbours (what a
//! review finding's `[msg N]` cites), plus the runs list and one run's trace.

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
        .routes(routes!(show))
        .routes(routes!(runs))
        .routes(routes!(run_trace))
}

/// Across a link: every read; the three message reads also serve a
/// conversation-filtered edge (restricted to its conversation).
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::conversation_read("GET", "/api/messages"),
    ActAsRoute::conversation_read("GET", "/api/messages/recent"),
    ActAsRoute::conversation_read("GET", "/api/messages/{id}"),
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

#[utoipa::path(get, path = "/api/messages", operation_id = "searchMessages", summary = "Full-text search of the space's messages", tag = "messages", params(SearchQuery),
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

#[utoipa::path(get, path = "/api/messages/recent", operation_id = "recentMessages", summary = "A page of the space's messages in a time range", tag = "messages", params(RecentQuery),
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
pub(crate) struct ShowQuery {
    /// How many messages of the same conversation to give before and after
    /// it: 0 to 50 (default 0).
    #[param(minimum = 0, maximum = 50)]
    context: Option<u32>,
}

/// The most `context` may ask for on each side.
const MAX_CONTEXT: u32 = 50;

/// How far back the context before a message is looked for.
const CONTEXT_WINDOW_MS: i64 = 7 * 24 * 3600 * 1000;

/// One message and its neighbours, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageInContext {
    pub space_id: String,
    /// The message asked for; it is the one of `messages` with this id.
    pub message_id: i64,
    /// Up to `context` messages of its conversation before it, the message,
    /// and up to `context` after it.
    pub messages: Vec<Message>,
}

#[utoipa::path(get, path = "/api/messages/{id}", operation_id = "getMessage", summary = "Show one message by id, with its neighbours", tag = "messages",
    params(("id" = i64, Path, description = "The message (the N of a review finding's `[msg N]`)"), ShowQuery),
    responses((status = 200, description = "The message and its context", body = MessageInContext),
        (status = 404, description = "No such message in this space (or in the link's conversation)", body = crate::api::error::ErrorBody)))]
pub(crate) async fn show(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
    q: Params<ShowQuery>,
) -> ApiResult<Json<MessageInContext>> {
    let ctx = auth.require(Permission::MessagesRead)?;
    let id = path_arg(id).map_err(|_| ApiError::bad_request("message id must be a number"))?;
    let context = params(q)?.context.unwrap_or(0);
    if context > MAX_CONTEXT {
        return Err(ApiError::bad_request(format!(
            "context must be between 0 and {MAX_CONTEXT}"
        )));
    }
    let space = ctx.space.to_string();
    // A conversation-scoped link reaches only its conversation's messages.
    let scope = auth.via.as_ref().and_then(|v| v.conversation);
    let found = app
        .rt
        .store
        .read(move |c| {
            let Some(msg) = messages::get(c, id)?.filter(|m| {
                m.space_id == space && scope.is_none_or(|s| m.conversation_id == Some(s))
            }) else {
                return Ok(None);
            };
            let conv = msg.conversation_id;
            let at = Cursor {
                created_at: msg.created_at,
                id: msg.id,
            };
            // Before: the last `context` of the window up to the message,
            // paged forward (the store's range read is oldest first).
            let mut before: std::collections::VecDeque<Message> = Default::default();
            if context > 0 {
                let since = msg.created_at.saturating_sub(CONTEXT_WINDOW_MS);
                let mut cursor = None;
                'pages: loop {
                    let (page, next) = messages::recent(
                        c,
                        &space,
                        conv,
                        since,
                        msg.created_at.saturating_add(1),
                        500,
                        cursor,
                    )?;
                    for m in page {
                        if (m.created_at, m.id) >= (at.created_at, at.id) {
                            break 'pages;
                        }
                        before.push_back(m);
                        if before.len() > context as usize {
                            before.pop_front();
                        }
                    }
                    match next {
                        Some(n) => cursor = Some(n),
                        None => break,
                    }
                }
            }
            let after = if context > 0 {
                messages::recent(c, &space, conv, i64::MIN, i64::MAX, context, Some(at))?.0
            } else {
                Vec::new()
            };
            let mut all: Vec<Message> = before.into_iter().collect();
            all.push(msg);
            all.extend(after);
            Ok(Some(all))
        })
        .await?;
    let messages = found.ok_or_else(|| ApiError::not_found("no such message in this space"))?;
    Ok(Json(MessageInContext {
        space_id: ctx.space.to_string(),
        message_id: id,
        messages,
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

#[utoipa::path(get, path = "/api/runs", operation_id = "listRuns", summary = "List the space's latest agent runs", tag = "messages", params(RunsQuery),
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

#[utoipa::path(get, path = "/api/runs/{id}", operation_id = "getRun", summary = "Show one run and its trace", tag = "messages",
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
