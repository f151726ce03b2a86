//! The one HTTP error type. Every failure a handler can meet is mapped here,
//! once, to a status and a JSON body `{"error":{"code","message"}}`.
//!
//! Must never: leak an internal error's details to the client (5xx bodies say
//! "internal error" and the detail goes to the log).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::storage::StoreError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error (see the host log)",
        )
    }
    pub fn missing_perm(perm: &str) -> Self {
        Self::forbidden(format!("requires the '{perm}' permission in this space"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} not found")),
            StoreError::Conflict(m) => ApiError::conflict(m),
            StoreError::Invalid(m) => ApiError::bad_request(m),
            other => ApiError::internal(other),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let message = r.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "too_large", "request body is larger than the limit")
        } else if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            ApiError::new(
                status,
                "bad_content_type",
                "send the body as JSON with content-type: application/json",
            )
        } else {
            // Syntax and data errors alike are the client's: 400 with serde's sentence.
            ApiError::bad_request(message)
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request(r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::bad_request(r.body_text())
    }
}
