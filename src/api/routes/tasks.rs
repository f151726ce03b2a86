//! Scheduled tasks of a space.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, body, path_arg, text_field, Body, Json, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::actors::Refusal;
use crate::app::App;
use crate::clock::now_ms;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::{Admin, Read};
use crate::schedule::{next_fire, parse_at, parse_cron, zone};
use crate::storage::tasks::queue_firing;
use crate::storage::tasks::{self, NewTask, Task};
use crate::storage::StoreError;

/// Scheduled tasks: list, create, delete, pause, resume, run now.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(delete))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(run_now))
}

/// Across a link: every route, the list at `read`, the rest at `admin`.
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/tasks", Read),
    ActAsRoute::admin_write("POST", "/api/tasks"),
    ActAsRoute::admin_write("DELETE", "/api/tasks/{id}"),
    ActAsRoute::admin_write("POST", "/api/tasks/{id}/pause"),
    ActAsRoute::admin_write("POST", "/api/tasks/{id}/resume"),
    ActAsRoute::new("POST", "/api/tasks/{id}/run", Admin),
];

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskList {
    pub tasks: Vec<Task>,
    /// The IANA zone the space's cron expressions are read in (its
    /// `timezone` config key, else the deployment's `timezone`).
    pub timezone: String,
}

/// Moves every active cron task of `space` to its next time on the clock of
/// `tz` (the space's zone just changed), in the caller's transaction.
pub(super) fn reschedule(
    tx: &crate::storage::Tx<'_>,
    space: &str,
    tz: chrono_tz::Tz,
) -> Result<usize, StoreError> {
    let now = now_ms();
    let mut moved = 0;
    for task in tasks::list(tx, space)? {
        let Some(expr) = task.cron.as_deref().filter(|_| task.active) else {
            continue;
        };
        // A stored cron was parsed at creation; one that no longer does is
        // left for the scheduler, which pauses it and says so.
        if let Ok(next) = parse_cron(expr).and_then(|c| next_fire(&c, now, tz)) {
            tasks::advance(tx, task.id, Some(next))?;
            moved += 1;
        }
    }
    Ok(moved)
}

/// The zone a space's cron times are read in (see [`TaskList::timezone`]).
async fn zone_of(app: &App, space: &str) -> ApiResult<chrono_tz::Tz> {
    let sp = space.to_owned();
    let own = app
        .rt
        .store
        .read(move |c| tasks::space_timezone(c, &sp))
        .await?;
    Ok(zone(own.as_deref(), &app.rt.settings.timezone))
}

/// One task as it stands after the change.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskReply {
    pub task: Task,
    /// The zone its cron expression is read in (see [`TaskList::timezone`]).
    pub timezone: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskDeleted {
    pub task_id: i64,
    pub deleted: bool,
}

/// A firing queued now; the turn's reply arrives as for any message.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskQueued {
    pub task_id: i64,
    pub message_id: i64,
}

const TASK_ID: &str = "The task";

#[utoipa::path(get, path = "/api/tasks", operation_id = "listTasks", summary = "List the space's scheduled tasks", tag = "tasks",
    responses((status = 200, description = "The space's tasks", body = TaskList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<TaskList>> {
    let space = auth.require(Permission::TasksList)?.space.to_string();
    let tz = zone_of(&app, &space).await?;
    let list = app.rt.store.read(move |c| tasks::list(c, &space)).await?;
    Ok(Json(TaskList {
        tasks: list,
        timezone: tz.name().to_owned(),
    }))
}

/// Exactly one of `cron` (a 5-field cron line) and `at` (a duration from
/// now or an RFC 3339 time); `prompt` at most 8000 characters.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateTask {
    cron: Option<String>,
    at: Option<String>,
    #[schema(min_length = 1, max_length = 8000)]
    prompt: String,
    /// Run without posting the reply.
    #[serde(default)]
    silent: bool,
}

#[utoipa::path(post, path = "/api/tasks", operation_id = "createTask", summary = "Schedule a prompt (cron or once)", tag = "tasks", request_body = CreateTask,
    responses((status = 201, description = "Created", body = TaskReply)))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateTask>,
) -> ApiResult<(StatusCode, Json<TaskReply>)> {
    let sid = auth.require(Permission::TasksCreate)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    let prompt = text_field("prompt", &b.prompt, 8000)?;
    let now = now_ms();
    let (cron, at, next) = match (&b.cron, &b.at) {
        (Some(c), None) => {
            let parsed = parse_cron(c).map_err(ApiError::bad_request)?;
            let tz = zone_of(&app, &space).await?;
            let next = next_fire(&parsed, now, tz).map_err(ApiError::bad_request)?;
            (Some(c.trim().to_owned()), None, next)
        }
        (None, Some(a)) => {
            let t = parse_at(a, now).map_err(ApiError::bad_request)?;
            (None, Some(t), t)
        }
        _ => return Err(ApiError::bad_request("give exactly one of cron and at")),
    };
    let by = auth.caller.caller_id.clone();
    let zone_name = zone_of(&app, &space).await?.name().to_owned();
    let out = apply(&app, &sid, move |tx| {
            let task = tasks::create(
                tx,
                &NewTask {
                    space_id: &space,
                    cron: cron.as_deref(),
                    at,
                    prompt: &prompt,
                    silent: b.silent,
                    next_run_at: next,
                    created_by: &by,
                },
            )?;
            Ok(TaskReply {
                task,
                timezone: zone_name,
            })
        })
        .await?;
    Ok((StatusCode::CREATED, Json(out)))
}

async fn set_active(
    app: &App,
    auth: &Auth,
    perm: Permission,
    id: i64,
    active: bool,
) -> ApiResult<Json<TaskReply>> {
    let sid = auth.require(perm)?.space.clone();
    let space = sid.to_string();
    let deployment = app.rt.settings.timezone.clone();
    let out = app
        .spaces
        .apply_with(&sid, move |tx| {
            let (task, tz) = tasks::switch(tx, &space, id, active, now_ms(), &deployment)?
                .map_err(|why| Refusal::Refused(ApiError::bad_request(why)))?;
            Ok(TaskReply {
                task,
                timezone: tz.name().to_owned(),
            })
        })
        .await?;
    Ok(Json(out))
}

#[utoipa::path(post, path = "/api/tasks/{id}/pause", operation_id = "pauseTask", summary = "Pause a task", tag = "tasks",
    params(("id" = i64, Path, description = TASK_ID)),
    responses((status = 200, description = "Paused", body = TaskReply)))]
pub(crate) async fn pause(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<TaskReply>> {
    let id = path_arg(id)?;
    set_active(&app, &auth, Permission::TasksPause, id, false).await
}

#[utoipa::path(post, path = "/api/tasks/{id}/resume", operation_id = "resumeTask", summary = "Resume a paused task", tag = "tasks",
    params(("id" = i64, Path, description = TASK_ID)),
    responses((status = 200, description = "Resumed at its next time from now", body = TaskReply)))]
pub(crate) async fn resume(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<TaskReply>> {
    let id = path_arg(id)?;
    set_active(&app, &auth, Permission::TasksResume, id, true).await
}

#[utoipa::path(delete, path = "/api/tasks/{id}", operation_id = "deleteTask", summary = "Delete a task", tag = "tasks",
    params(("id" = i64, Path, description = TASK_ID)),
    responses((status = 200, description = "Deleted", body = TaskDeleted)))]
pub(crate) async fn delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<TaskDeleted>> {
    let id = path_arg(id)?;
    let sid = auth.require(Permission::TasksDelete)?.space.clone();
    let space = sid.to_string();
    let out = apply(&app, &sid, move |tx| {
        tasks::delete(tx, &space, id)?;
        Ok(TaskDeleted {
            task_id: id,
            deleted: true,
        })
    })
    .await?;
    Ok(Json(out))
}

#[utoipa::path(post, path = "/api/tasks/{id}/run", operation_id = "runTask", summary = "Fire a task now", tag = "tasks",
    params(("id" = i64, Path, description = TASK_ID)),
    responses((status = 202, description = "A firing is queued", body = TaskQueued)))]
pub(crate) async fn run_now(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<(StatusCode, Json<TaskQueued>)> {
    let id = path_arg(id)?;
    let sid = auth.require(Permission::TasksCreate)?.space.clone();
    let space = sid.to_string();
    let out = apply(&app, &sid, move |tx| {
            let task = tasks::get(tx, &space, id)?
                .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            let message_id = queue_firing(tx, &task)?;
            Ok(TaskQueued {
                task_id: id,
                message_id,
            })
        })
        .await?;
    app.spaces.wake(&auth.space()?.space).await?;
    Ok((StatusCode::ACCEPTED, Json(out)))
}
