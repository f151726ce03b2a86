//! One module per resource. Each exports its `router()` and its `ACT_AS`
//! entries (what of it may be called across a space link, D-011), and is
//! listed once in [`RESOURCES`]: the API serves the merge of the routers, and
//! the act-as allowlist is the union of the lists. Handlers read top to
//! bottom: extract, check the permission with `Auth::require`, read from
//! storage or write through the space's actor, answer JSON.
//!
//! Every handler carries `#[utoipa::path(...)]` and is registered with
//! `.routes(routes!(handler))`: the route and its entry in
//! `GET /api/openapi.json` come from that one annotation, so a route cannot
//! be served without being documented (tests/it/openapi.rs refuses a plain
//! `.route(` here). Answers are typed structs beside their handlers, deriving
//! `ToSchema`.
//!
//! Must never: register a route outside its resource's `router()`, or allow
//! a route across a link anywhere but in its own resource's `ACT_AS`.

use std::sync::Arc;

use axum::extract::Extension;
use serde::Serialize;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;

pub(super) use super::extract::{Json, Path, Query};

use super::error::{ApiError, ApiResult};
use super::AuditChange;
use crate::actors::{ApplyError, Refusal};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::storage::StoreError;

/// One resource: its routes and the entries of the act-as allowlist that
/// belong to them. Listed together so a route and its act-as policy are
/// registered in one place.
pub(super) struct Resource {
    /// The resource's routes with their OpenAPI paths (one source for both).
    pub router: fn() -> OpenApiRouter<Arc<App>>,
    pub act_as: &'static [ActAsRoute],
}

/// Declares each resource module and lists it in [`RESOURCES`], so a
/// resource module cannot exist without being served and allowlisted.
macro_rules! resources {
    ($($name:ident),* $(,)?) => {
        $(pub(crate) mod $name;)*

        /// Every resource the API serves.
        pub(crate) const RESOURCES: &[Resource] = &[$(Resource {
            router: $name::router,
            act_as: $name::ACT_AS,
        }),*];
    };
}

resources![
    spaces,
    conversations,
    messages,
    settings,
    roles,
    tasks,
    control,
    delivery,
    tokens,
    identities,
    pairing,
    links,
    ask,
    review,
    files,
    spend,
    extensions,
];

/// A JSON body, taken as a `Result` so a handler checks the caller's
/// permission before it looks at the body (a 403 stays a 403 whatever the body).
pub(super) type Body<T> = Result<Json<T>, ApiError>;
pub(super) type Params<T> = Result<Query<T>, ApiError>;
/// A path segment (`/api/tasks/{id}`); a bad one is a 400 in our error shape.
pub(super) type PathArg<T> = Result<Path<T>, ApiError>;

pub(super) fn body<T>(b: Body<T>) -> ApiResult<T> {
    Ok(b?.0)
}

pub(super) fn params<T>(q: Params<T>) -> ApiResult<T> {
    Ok(q?.0)
}

pub(super) fn path_arg<T>(p: PathArg<T>) -> ApiResult<T> {
    Ok(p?.0)
}

/// Non-empty, bounded free text from a client.
pub(super) fn text_field(name: &str, value: &str, max: usize) -> ApiResult<String> {
    let v = value.trim();
    if v.is_empty() {
        return Err(super::ApiError::bad_request(format!(
            "{name} must not be empty"
        )));
    }
    if v.chars().count() > max {
        return Err(super::ApiError::bad_request(format!(
            "{name} is longer than {max} characters"
        )));
    }
    Ok(v.to_owned())
}

/// A write's answer with the audit's before/after (D-008): `before` is what
/// the write replaced, and the answer itself is the after.
pub(super) fn audited<T: Serialize>(before: Value, after: T) -> (Extension<AuditChange>, Json<T>) {
    let change = AuditChange {
        before: Some(before),
        after: serde_json::to_value(&after).ok(),
    };
    (Extension(change), Json(after))
}

/// Runs `write` in the space's actor (`SpaceDirectory::apply_with`, one
/// transaction) and answers its typed result; a store error rolls it back.
pub(super) async fn apply<T, F>(app: &App, space: &SpaceId, write: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce(&crate::storage::Tx<'_>) -> Result<T, StoreError> + Send + 'static,
{
    app.spaces
        .apply_with(space, move |tx| {
            write(tx).map_err(Refusal::<std::convert::Infallible>::Store)
        })
        .await
        .map_err(|e| match e {
            ApplyError::Refused(never) => match never {},
            ApplyError::Actor(e) => e.into(),
        })
}

/// A one-line name from a client (space names, sender names, titles, labels):
/// non-empty, at most `max` characters, no control character (NUL, newline, …).
pub(super) fn name_field(name: &str, value: &str, max: usize) -> ApiResult<String> {
    let v = text_field(name, value, max)?;
    if v.chars().any(char::is_control) {
        return Err(super::ApiError::bad_request(format!(
            "{name} must not contain control characters"
        )));
    }
    Ok(v)
}

/// `?limit=N` of an audit listing (identities, links): 1 to 1000, default 50.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditQuery {
    /// Rows to answer, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

impl AuditQuery {
    pub(super) fn limit(&self) -> ApiResult<u32> {
        match self.limit.unwrap_or(50) {
            n @ 1..=1000 => Ok(n),
            _ => Err(ApiError::bad_request("limit must be between 1 and 1000")),
        }
    }
}
