//! Pairing requests (issue 23's sender policy) on the dashboard: the
//! pending requests, each approved or denied by the same path as
//! `POST /api/pairings/{code}/approve|deny` (`ingress::policy::decide_request`).
//! Instance-wide, like the API's: global admins only.
//!
//! Must never: show a pending request to anyone but a global admin, or
//! decide one on a GET or without the sign-in's CSRF token.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::Form;
use serde::Deserialize;

use super::error::{UiError, UiResult};
use super::pages::{page, see_other, when, Chrome};
use super::session::Viewer;
use crate::app::App;
use crate::clock::now_ms;
use crate::ingress::policy;
use crate::storage::pairings::{self, Decision};

const WHAT: &str = "pairing requests";

struct RequestRow {
    code: String,
    platform: String,
    sender: String,
    name: String,
    asked: String,
    expires: String,
}

#[derive(Template)]
#[template(path = "ui/pairings.html")]
struct PairingsPage {
    chrome: Chrome,
    notice: &'static str,
    requests: Vec<RequestRow>,
}

#[derive(Deserialize)]
pub(super) struct PairingsQuery {
    #[serde(default)]
    did: String,
}

/// `GET /ui/pairings`.
pub(super) async fn list(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    axum::extract::Query(q): axum::extract::Query<PairingsQuery>,
) -> UiResult<Response> {
    viewer.require_admin(WHAT)?;
    let now = now_ms();
    let pending = app.rt.store.read(move |c| pairings::list(c, now)).await?;
    page(&PairingsPage {
        chrome: Chrome::of(&viewer),
        notice: match q.did.as_str() {
            "approved" => "Approved: the sender is allowed and was told once.",
            "denied" => "Denied: the sender gets nothing from now on.",
            _ => "",
        },
        requests: pending
            .into_iter()
            .map(|p| RequestRow {
                code: p.code,
                platform: p.platform,
                sender: p.sender,
                name: p.name.unwrap_or_default(),
                asked: when(p.created_at),
                expires: when(p.expires_at),
            })
            .collect(),
    })
}

#[derive(Deserialize)]
pub(super) struct DecideForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/pairings/{code}/{approve|deny}`.
pub(super) async fn decide(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path((code, action)): Path<(String, String)>,
    Form(form): Form<DecideForm>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    viewer.require_admin(WHAT)?;
    let (decision, did) = match action.as_str() {
        "approve" => (Decision::Allowed, "approved"),
        "deny" => (Decision::Denied, "denied"),
        _ => return Err(UiError::NotFound("a request is approved or denied".into())),
    };
    let code = policy::parse_code(&code).map_err(UiError::BadRequest)?;
    let by = viewer.caller().to_owned();
    let outbound = app.rt.outbound.clone();
    let wanted = code.clone();
    app.rt
        .store
        .write(move |tx| policy::decide_request(tx, &outbound, &wanted, decision, &by))
        .await?
        .ok_or_else(|| {
            UiError::NotFound(format!(
                "no pending pairing request {code} (it may have expired or been decided)"
            ))
        })?;
    Ok(see_other(&format!("/ui/pairings?did={did}")))
}
