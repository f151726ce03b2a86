//! Scheduled tasks of a space.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::Json;
use axum::routing::{self, get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, path_arg, text_field, Body, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::actors::Refusal;
use crate::app::App;
use crate::clock::now_ms;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::{Admin, Read};
use crate::schedule::{next_fire, parse_at, parse_cron};
use crate::storage::tasks::queue_firing;
use crate::storage::tasks::{self, NewTask};
use crate::storage::StoreError;

/// Scheduled tasks: list, create, delete, pause, resume, run now.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/tasks", get(list).post(create))
        .route("/api/tasks/{id}", routing::delete(delete))
        .route("/api/tasks/{id}/pause", post(pause))
        .route("/api/tasks/{id}/resume", post(resume))
        .route("/api/tasks/{id}/run", post(run_now))
}

/// Across a link: every route, the list at `read`, the rest at `admin`.
pub const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/tasks", Read),
    ActAsRoute::new("POST", "/api/tasks", Admin),
    ActAsRoute::new("DELETE", "/api/tasks/{id}", Admin),
    ActAsRoute::new("POST", "/api/tasks/{id}/pause", Admin),
    ActAsRoute::new("POST", "/api/tasks/{id}/resume", Admin),
    ActAsRoute::new("POST", "/api/tasks/{id}/run", Admin),
];

pub async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require(Permission::TasksList)?.space.to_string();
    let list = app.rt.store.read(move |c| tasks::list(c, &space)).await?;
    Ok(Json(json!({ "tasks": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    cron: Option<String>,
    at: Option<String>,
    prompt: String,
    #[serde(default)]
    silent: bool,
}

pub async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateTask>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let sid = auth.require(Permission::TasksCreate)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    let prompt = text_field("prompt", &b.prompt, 8000)?;
    let now = now_ms();
    let (cron, at, next) = match (&b.cron, &b.at) {
        (Some(c), None) => {
            let parsed = parse_cron(c).map_err(ApiError::bad_request)?;
            let next = next_fire(&parsed, now).map_err(ApiError::bad_request)?;
            (Some(c.trim().to_owned()), None, next)
        }
        (None, Some(a)) => {
            let t = parse_at(a, now).map_err(ApiError::bad_request)?;
            (None, Some(t), t)
        }
        _ => return Err(ApiError::bad_request("give exactly one of cron and at")),
    };
    let by = auth.caller.caller_id.clone();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
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
            Ok(json!({ "task": task }))
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
) -> ApiResult<Json<Value>> {
    let sid = auth.require(perm)?.space.clone();
    let space = sid.to_string();
    let out = app
        .spaces
        .apply_with(&sid, move |tx| {
            let task = tasks::get(tx, &space, id)?
                .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            // A resumed cron task fires at its next time from now, not at once for every miss.
            let next = match (&task.cron, active) {
                (Some(c), true) => Some(
                    parse_cron(c)
                        .and_then(|c| next_fire(&c, now_ms()))
                        .map_err(|e| Refusal::Refused(ApiError::bad_request(e)))?,
                ),
                _ => None,
            };
            if active && task.cron.is_none() && task.next_run_at.is_none_or(|t| t <= now_ms()) {
                return Err(Refusal::Refused(ApiError::bad_request(format!(
                    "task {id} was a one-shot task whose time has passed"
                ))));
            }
            tasks::set_active(tx, &space, id, active, next)?;
            let task = tasks::get(tx, &space, id)?;
            Ok(json!({ "task": task }))
        })
        .await?;
    Ok(Json(out))
}

pub async fn pause(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    set_active(&app, &auth, Permission::TasksPause, id, false).await
}

pub async fn resume(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    set_active(&app, &auth, Permission::TasksResume, id, true).await
}

pub async fn delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<Value>> {
    let id = path_arg(id)?;
    let sid = auth.require(Permission::TasksDelete)?.space.clone();
    let space = sid.to_string();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            tasks::delete(tx, &space, id)?;
            Ok(json!({"task_id": id, "deleted": true}))
        })
        .await?;
    Ok(Json(out))
}

pub async fn run_now(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let id = path_arg(id)?;
    let sid = auth.require(Permission::TasksCreate)?.space.clone();
    let space = sid.to_string();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let task = tasks::get(tx, &space, id)?
                .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            let message_id = queue_firing(tx, &task)?;
            Ok(json!({"task_id": id, "message_id": message_id}))
        })
        .await?;
    app.spaces.wake(&auth.space()?.space).await?;
    Ok((StatusCode::ACCEPTED, Json(out)))
}
