//! One module per resource. Each exports its `router()` and its `ACT_AS`
//! entries (what of it may be called across a space link, D-011), and is
//! listed once in [`RESOURCES`]: the API serves the merge of the routers, and
//! the act-as allowlist is the union of the lists. Handlers read top to
//! bottom: extract, check the permission with `Auth::require`, read from
//! storage or write through the space's actor, answer JSON.
//!
//! Must never: register a route outside its resource's `router()`, or allow
//! a route across a link anywhere but in its own resource's `ACT_AS`.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Extension, Json, Path, Query};
use axum::Router;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::AuditChange;
use crate::app::App;
use crate::links::ActAsRoute;

/// One resource: its routes and the entries of the act-as allowlist that
/// belong to them. Listed together so a route and its act-as policy are
/// registered in one place.
pub struct Resource {
    pub router: fn() -> Router<Arc<App>>,
    pub act_as: &'static [ActAsRoute],
}

/// Declares each resource module and lists it in [`RESOURCES`], so a
/// resource module cannot exist without being served and allowlisted.
macro_rules! resources {
    ($($name:ident),* $(,)?) => {
        $(pub mod $name;)*

        /// Every resource the API serves.
        pub const RESOURCES: &[Resource] = &[$(Resource {
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
    links,
    ask,
    review,
    files,
];

/// A JSON body, with axum's rejection mapped to our error shape.
pub type Body<T> = Result<Json<T>, JsonRejection>;
pub type Params<T> = Result<Query<T>, QueryRejection>;
/// A path segment (`/api/tasks/{id}`); a bad one is a 400 in our error shape,
/// not axum's plain-text rejection.
pub type PathArg<T> = Result<Path<T>, PathRejection>;

pub fn body<T>(b: Body<T>) -> ApiResult<T> {
    Ok(b?.0)
}

pub fn params<T>(q: Params<T>) -> ApiResult<T> {
    Ok(q?.0)
}

pub fn path_arg<T>(p: PathArg<T>) -> ApiResult<T> {
    Ok(p?.0)
}

/// Non-empty, bounded free text from a client.
pub fn text_field(name: &str, value: &str, max: usize) -> ApiResult<String> {
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

/// Splits a write's answer into the client's JSON and the audit's
/// before/after (D-008): `out["before"]` is taken out for the audit, and the
/// rest of the answer is the after.
pub fn audited(mut out: Value) -> (Extension<AuditChange>, Json<Value>) {
    let before = out.as_object_mut().and_then(|m| m.remove("before"));
    let change = AuditChange {
        before,
        after: Some(out.clone()),
    };
    (Extension(change), Json(out))
}

/// A one-line name from a client (space names, sender names, titles, labels):
/// non-empty, at most `max` characters, no control character (NUL, newline, …).
pub fn name_field(name: &str, value: &str, max: usize) -> ApiResult<String> {
    let v = text_field(name, value, max)?;
    if v.chars().any(char::is_control) {
        return Err(super::ApiError::bad_request(format!(
            "{name} must not contain control characters"
        )));
    }
    Ok(v)
}

/// `?limit=N` of an audit listing (identities, links): 1 to 1000, default 50.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    limit: Option<u32>,
}

impl AuditQuery {
    pub fn limit(&self) -> ApiResult<u32> {
        match self.limit.unwrap_or(50) {
            n @ 1..=1000 => Ok(n),
            _ => Err(ApiError::bad_request("limit must be between 1 and 1000")),
        }
    }
}
