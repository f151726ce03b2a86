//! `POST /api/ask` (D-016): one turn of another space's agent on a throwaway
//! copy, reached only through an `admin` space link (`mrctl --space X ask`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use serde::Deserialize;
use tokio::sync::oneshot;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, text_field, Body, Json};
use crate::actors::ask::{AskArgs, AskError, AskOutcome};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Admin;

/// `POST /api/ask`.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(ask))
}

/// `ask` exists to be called across a link (D-016), at `admin`.
pub(crate) const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("POST", "/api/ask", Admin)];

/// One message (at most 32,000 characters) for the target's agent.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AskBody {
    #[schema(min_length = 1, max_length = 32000)]
    message: String,
    /// The turn's role in the target: `member` (default) or `admin`.
    #[serde(rename = "as")]
    as_role: Option<String>,
}

#[utoipa::path(post, path = "/api/ask", operation_id = "askSpace", summary = "Run one turn of the space's agent on a throwaway copy of its workspace", tag = "ask", request_body = AskBody,
    responses((status = 200, description = "The turn's outcome", body = AskOutcome)))]
pub(crate) async fn ask(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<AskBody>,
) -> ApiResult<Json<AskOutcome>> {
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
    // The ask's steps come back to the holder: what the turn read through
    // the target's own links is withheld unless the holder has a link there.
    let mut outcome = outcome;
    if let Some(via) = &auth.via {
        let (holder, space) = (via.holder.to_string(), outcome.space_id.clone());
        let mut steps = std::mem::take(&mut outcome.steps);
        outcome.steps = app
            .rt
            .store
            .read(move |c| {
                crate::links::traces::withhold_steps(c, &holder, &space, &mut steps)?;
                Ok(steps)
            })
            .await?;
    }
    Ok(Json(outcome))
}
