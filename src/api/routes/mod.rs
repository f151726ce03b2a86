//! One module per resource. Handlers read top to bottom: extract, check the
//! permission with `Auth::require`, read from storage or write through the
//! space's actor, answer JSON.

pub mod ask;
pub mod control;
pub mod conversations;
pub mod delivery;
pub mod links;
pub mod messages;
pub mod review;
pub mod roles;
pub mod settings;
pub mod spaces;
pub mod tasks;
pub mod tokens;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Json, Path, Query};

use super::error::ApiResult;

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
