//! The request extractors every handler uses: [`Json`], [`Query`] and
//! [`Path`], axum's own underneath, rejecting with [`ApiError`] so a bad
//! body, query or path segment is a 4xx in the one JSON error shape (never
//! axum's plain-text rejection). [`Json`] is also the handlers' answer type.
//!
//! Must never: answer a client's malformed input with a 5xx, or put more of
//! the input in the error than serde's own sentence.

use axum::extract::{FromRequest, FromRequestParts};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::ApiError;

/// A JSON body in, or a JSON answer out. A body that is not JSON, has a
/// wrong type or an unknown field is a 400; a body over the limit a 413; one
/// without `content-type: application/json` a 415 (see `error.rs`).
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// A query string (`?limit=10`); one that does not parse is a 400.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

/// The path's parameters (`/api/tasks/{id}`); a segment that does not parse
/// (`/api/tasks/abc/pause`) is a 400.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);
