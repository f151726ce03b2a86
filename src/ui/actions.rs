//! What an operator does from a space's page every day: pause or resume a
//! task, mute or unmute a sender, stop the running turn. Each is one form
//! posting here, checked like every dashboard write (a live sign-in, its
//! CSRF token, the permission the API's route needs) and done the way the
//! API does it (the write through the space's actor, by the same storage
//! rule), then answered with a redirect back to the space's page.
//!
//! Must never: act without the permission the matching API route checks,
//! take the acting caller from the form, or echo form text back in the
//! redirect (the page's notice is one of a fixed set of words).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;
use axum::Form;
use serde::Deserialize;

use super::error::{UiError, UiResult};
use super::pages::see_other;
use super::session::{space_access, SpaceAccess, Viewer};
use crate::actors::{ApplyError, ControlAction, Refusal};
use crate::app::App;
use crate::clock::{now_ms, parse_duration_ms};
use crate::perms::Permission;
use crate::storage::{spaces, tasks};

/// What a space page says after an action: a fixed word, never form text.
pub(super) fn notice_of(did: &str) -> &'static str {
    match did {
        "paused" => "The task is paused.",
        "resumed" => "The task is resumed; it fires at its next time from now.",
        "muted" => "The sender is muted in this space.",
        "unmuted" => "The sender is no longer muted.",
        "stopped" => "The running turn was stopped.",
        "idle" => "No turn was running.",
        _ => "",
    }
}

fn back(space: &str, did: &str) -> Response {
    see_other(&format!("/ui/spaces/{space}?did={did}"))
}

fn refused(e: ApplyError<String>) -> UiError {
    match e {
        ApplyError::Refused(why) => UiError::BadRequest(why),
        ApplyError::Actor(e) => e.into(),
    }
}

/// A form that carries only its CSRF token.
#[derive(Deserialize)]
pub(super) struct Plain {
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/spaces/{space}/tasks/{id}/{pause|resume}`.
pub(super) async fn task_switch(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path((raw, id, action)): Path<(String, String, String)>,
    Form(form): Form<Plain>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let (active, perm, did) = match action.as_str() {
        "pause" => (false, Permission::TasksPause, "paused"),
        "resume" => (true, Permission::TasksResume, "resumed"),
        _ => return Err(UiError::NotFound("a task is paused or resumed".into())),
    };
    let id: i64 = id
        .parse()
        .map_err(|_| UiError::BadRequest(format!("{id:?} is not a task id")))?;
    let access = space_access(&app, &viewer, &raw).await?;
    access.require(perm)?;
    let space = access.space.to_string();
    let sp = space.clone();
    let deployment = app.rt.settings.timezone.clone();
    app.spaces
        .apply_with(&access.space, move |tx| {
            tasks::switch(tx, &sp, id, active, now_ms(), &deployment)?.map_err(Refusal::Refused)
        })
        .await
        .map_err(refused)?;
    Ok(back(&space, did))
}

/// The checks both mute forms make (as `POST /api/mutes` and `DELETE
/// /api/mutes/{caller}`): the form's token, `mutes.set`, a caller id.
async fn muting(
    app: &App,
    viewer: &Viewer,
    raw: &str,
    csrf: &str,
    caller: &str,
) -> UiResult<(SpaceAccess, String)> {
    viewer.check_csrf(csrf)?;
    let access = space_access(app, viewer, raw).await?;
    access.require(Permission::MutesSet)?;
    let caller = caller.trim().to_owned();
    crate::ids::validate_caller_id(&caller).map_err(UiError::BadRequest)?;
    Ok((access, caller))
}

#[derive(Deserialize)]
pub(super) struct MuteForm {
    #[serde(default)]
    csrf: String,
    caller_id: String,
    /// How long, as `mrctl mute --for` takes it (`30m`, `2h`, `1d`); empty: until unmuted.
    #[serde(default, rename = "for")]
    duration: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/spaces/{space}/mutes`: as `POST /api/mutes`.
pub(super) async fn mute(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<MuteForm>,
) -> UiResult<Response> {
    let (access, caller) = muting(&app, &viewer, &raw, &form.csrf, &form.caller_id).await?;
    let now = now_ms();
    let until = match form.duration.trim() {
        "" => None,
        d => {
            Some(now + parse_duration_ms(d).map_err(|m| UiError::BadRequest(format!("for: {m}")))?)
        }
    };
    let reason = form.reason.trim().to_owned();
    if reason.chars().count() > 500 || reason.chars().any(char::is_control) {
        return Err(UiError::BadRequest(
            "a reason is at most 500 characters on one line".into(),
        ));
    }
    let space = access.space.to_string();
    let sp = space.clone();
    let by = viewer.caller().to_owned();
    app.spaces
        .apply_with(&access.space, move |tx| {
            spaces::set_mute(
                tx,
                &sp,
                &caller,
                until,
                (!reason.is_empty()).then_some(reason.as_str()),
                &by,
            )
            .map_err(Refusal::Store)
        })
        .await
        .map_err(refused)?;
    Ok(back(&space, "muted"))
}

#[derive(Deserialize)]
pub(super) struct UnmuteForm {
    #[serde(default)]
    csrf: String,
    caller_id: String,
}

/// `POST /ui/spaces/{space}/unmute`: as `DELETE /api/mutes/{caller}`.
pub(super) async fn unmute(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<UnmuteForm>,
) -> UiResult<Response> {
    let (access, caller) = muting(&app, &viewer, &raw, &form.csrf, &form.caller_id).await?;
    let space = access.space.to_string();
    let sp = space.clone();
    app.spaces
        .apply_with(&access.space, move |tx| {
            spaces::delete_mute(tx, &sp, &caller).map_err(Refusal::Store)
        })
        .await
        .map_err(refused)?;
    Ok(back(&space, "unmuted"))
}

/// `POST /ui/spaces/{space}/stop`: as `POST /api/control/stop`.
pub(super) async fn stop(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<Plain>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let access = space_access(&app, &viewer, &raw).await?;
    access.require(Permission::Stop)?;
    let done = app
        .spaces
        .control(&access.space, ControlAction::Stop)
        .await?;
    let stopped = done
        .get("stopped")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Ok(back(
        access.space.as_str(),
        if stopped { "stopped" } else { "idle" },
    ))
}
