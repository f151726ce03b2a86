//! `POST /api/ask` (D-016): one turn of another space's agent on a throwaway
//! copy, reached only through an `admin` space link (`mrctl --space X ask`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::Json;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{body, text_field, Body};
use crate::actors::ask::{AskArgs, AskError};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Admin;

/// `POST /api/ask`.
pub fn router() -> Router<Arc<App>> {
    Router::new().route("/api/ask", post(ask))
}

/// `ask` exists to be called across a link (D-016), at `admin`.
pub const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/ask", Admin)];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskBody {
    message: String,
    #[serde(rename = "as")]
    as_role: Option<String>,
}

pub async fn ask(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<AskBody>,
) -> ApiResult<Json<Value>> {
    if auth.via.is_none() {
        return Err(ApiError::bad_request(
            "ask runs another space's agent: call it through a space link (mrctl --space X ask \"...\")",
        ));
    }
    let target = auth.space()?.space.clone();
    let b = body(b)?;
    let message = text_field("message", &b.message, 32_000)?;
    let role = match b.as_role.as_deref().unwrap_or("member") {
        r @ ("member" | "admin") => r.to_owned(),
        other => {
            return Err(ApiError::bad_request(format!(
                "as {other:?} must be member or admin"
            )))
        }
    };
    let (tx, rx) = oneshot::channel();
    let args = AskArgs {
        rt: app.rt.clone(),
        spaces: app.spaces.clone(),
        target,
        message,
        role,
        caller_id: auth.caller.caller_id.clone(),
        reply: tx,
    };
    app.spaces.spawn_ask(args).await?;
    let wait = Duration::from_secs(app.rt.settings.turn.timeout_secs * 2 + 60);
    let outcome = tokio::time::timeout(wait, rx)
        .await
        .map_err(|_| ApiError::unavailable("the ask did not finish in time"))?
        .map_err(|_| ApiError::internal("the ask sandbox stopped without an answer"))?
        .map_err(|e| match e {
            AskError::NotIsolated(_) => ApiError::unavailable(e.to_string()),
            AskError::Space(e) => e.into(),
            AskError::Store(e) => e.into(),
            view @ AskError::View(_) => ApiError::internal(view),
        })?;
    Ok(Json(json!(outcome)))
}
