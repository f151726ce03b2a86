//! The one HTTP error type. Every failure a handler can meet is mapped here,
//! once, to a status and a JSON body `{"error":{"code","message"}}`.
//!
//! Must never: leak an internal error's details to the client (5xx bodies say
//! "internal error" and the detail goes to the log), or serve a message the
//! secret scrubber has not seen.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::perms::Permission;
use crate::storage::StoreError;

/// Every way a request can fail, as the client sees it. Each variant is one
/// status and one stable `code`; the message is the client's sentence.
/// `Internal` carries nothing: its detail was logged where it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    BadRequest(String),
    Unauthorized(String),
    Forbidden(String),
    NotFound(String),
    MethodNotAllowed(String),
    Conflict(String),
    /// An `If-Match` that no longer holds (412).
    PreconditionFailed(String),
    TooLarge(String),
    UriTooLong(String),
    BadContentType(String),
    SlowDown(String),
    Unavailable(String),
    /// One of many hosts: the space runs on the host named (its id); the
    /// host's forwarding step hands the request to it (`host::forward`).
    Elsewhere(String),
    /// An upstream model did not answer (its chain's own sentence).
    ModelFailed(String),
    Internal,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest(message.into())
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::Unauthorized(message.into())
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::Forbidden(message.into())
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound(message.into())
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict(message.into())
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable(message.into())
    }
    /// Logs `detail` and answers 500 without it.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::Internal
    }
    pub fn missing_perm(perm: Permission) -> Self {
        Self::forbidden(format!("requires the '{perm}' permission in this space"))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            Self::BadContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::SlowDown(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) | Self::Elsewhere(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::ModelFailed(_) => StatusCode::BAD_GATEWAY,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Conflict(_) => "conflict",
            Self::PreconditionFailed(_) => "precondition_failed",
            Self::TooLarge(_) => "too_large",
            Self::UriTooLong(_) => "uri_too_long",
            Self::BadContentType(_) => "bad_content_type",
            Self::SlowDown(_) => "slow_down",
            Self::Unavailable(_) | Self::Elsewhere(_) => "unavailable",
            Self::ModelFailed(_) => "model_failed",
            Self::Internal => "internal",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::BadRequest(m)
            | Self::Unauthorized(m)
            | Self::Forbidden(m)
            | Self::NotFound(m)
            | Self::MethodNotAllowed(m)
            | Self::Conflict(m)
            | Self::PreconditionFailed(m)
            | Self::TooLarge(m)
            | Self::UriTooLong(m)
            | Self::BadContentType(m)
            | Self::SlowDown(m)
            | Self::Unavailable(m)
            | Self::ModelFailed(m) => m,
            Self::Elsewhere(_) => {
                "this space is served by another host of this deployment right now; try again"
            }
            Self::Internal => "internal error (see the host log)",
        }
    }
}

/// The body of every error answer, documented once in the OpenAPI
/// document (`#/components/schemas/ErrorBody`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, one per kind of failure: `bad_request`, `unauthorized`,
    /// `forbidden`, `not_found`, `method_not_allowed`, `conflict`,
    /// `too_large`, `uri_too_long`, `bad_content_type`, `slow_down`,
    /// `unavailable`, `model_failed`, `internal`.
    #[schema(value_type = String)]
    pub code: &'static str,
    /// A sentence for the client (never internal detail).
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Served errors are scrubbed here, once: a model's or a platform's
        // sentence may carry a key, a token or a URL's userinfo.
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: crate::redaction::secrets::scrub_error(self.message()),
            },
        };
        let mut answer = (self.status(), Json(body)).into_response();
        if let Self::Elsewhere(host) = &self {
            if let Ok(v) = axum::http::HeaderValue::from_str(host) {
                answer
                    .headers_mut()
                    .insert(crate::cluster::RUNNER_HEADER, v);
            }
        }
        answer
    }
}

/// The JSON error answer of a bare `status` (what a layer or an extractor
/// answered in plain text): the status kept, its `code` and a sentence.
pub fn for_status(status: StatusCode) -> Response {
    let known = match status {
        StatusCode::BAD_REQUEST => Some(ApiError::bad_request("the request could not be read")),
        StatusCode::UNAUTHORIZED => Some(ApiError::unauthorized("a valid token is needed")),
        StatusCode::FORBIDDEN => Some(ApiError::forbidden("not allowed")),
        StatusCode::NOT_FOUND => Some(ApiError::not_found("no such route")),
        StatusCode::METHOD_NOT_ALLOWED => Some(ApiError::MethodNotAllowed(
            "this method is not allowed on this route".into(),
        )),
        StatusCode::PAYLOAD_TOO_LARGE => Some(ApiError::TooLarge(
            "request body is larger than the limit".into(),
        )),
        StatusCode::URI_TOO_LONG => {
            Some(ApiError::UriTooLong("the request path is too long".into()))
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Some(ApiError::BadContentType(
            "send the body as JSON with content-type: application/json".into(),
        )),
        StatusCode::TOO_MANY_REQUESTS => Some(ApiError::SlowDown("too many requests".into())),
        StatusCode::SERVICE_UNAVAILABLE => Some(ApiError::unavailable("try again later")),
        StatusCode::INTERNAL_SERVER_ERROR => Some(ApiError::Internal),
        _ => None,
    };
    if let Some(e) = known {
        return e.into_response();
    }
    let code = if status == StatusCode::REQUEST_TIMEOUT {
        "timeout"
    } else if status.is_server_error() {
        "internal"
    } else {
        "bad_request"
    };
    let message = status
        .canonical_reason()
        .unwrap_or("the request failed")
        .to_owned();
    let body = ErrorBody {
        error: ErrorDetail { code, message },
    };
    (status, Json(body)).into_response()
}

impl From<crate::ingress::IngressError> for ApiError {
    fn from(e: crate::ingress::IngressError) -> Self {
        use crate::ingress::IngressError;
        match e {
            IngressError::Store(e) => e.into(),
            IngressError::Wake(e) => e.into(),
            other => ApiError::internal(other),
        }
    }
}

impl From<crate::actors::ActorError> for ApiError {
    fn from(e: crate::actors::ActorError) -> Self {
        use crate::actors::{ActorError, ControlError, SpawnError};
        use crate::agent::compact::CompactError;
        match e {
            ActorError::Store(s) => s.into(),
            ActorError::Unavailable(m) => ApiError::unavailable(m),
            ActorError::Busy(ms) => ApiError::unavailable(format!(
                "a turn kept the space busy for {ms} ms; nothing was written, try again"
            )),
            ActorError::Timeout(ms) => {
                ApiError::unavailable(format!("the space did not answer within {ms} ms"))
            }
            ActorError::Spawn(SpawnError::NoSuchSpace(id)) => {
                ApiError::not_found(format!("space {id} does not exist"))
            }
            ActorError::Spawn(SpawnError::BadId(m)) => ApiError::bad_request(m),
            ActorError::Spawn(SpawnError::Store(e)) => e.into(),
            ActorError::Spawn(start @ SpawnError::Start { .. }) => ApiError::internal(start),
            ActorError::Spawn(SpawnError::LeasedElsewhere { host, .. }) => {
                ApiError::Elsewhere(host)
            }
            ActorError::Control(ControlError::Store(e)) => e.into(),
            ActorError::Control(ControlError::Compact(CompactError::Store(e))) => e.into(),
            ActorError::Control(ControlError::Compact(model @ CompactError::Model(_))) => {
                ApiError::ModelFailed(model.to_string())
            }
        }
    }
}

/// A write whose own refusal is already an `ApiError` (its status chosen
/// where the rule is); the actor's and the store's failures map as usual.
impl From<crate::actors::ApplyError<ApiError>> for ApiError {
    fn from(e: crate::actors::ApplyError<ApiError>) -> Self {
        match e {
            crate::actors::ApplyError::Refused(api) => api,
            crate::actors::ApplyError::Actor(e) => e.into(),
        }
    }
}

impl From<crate::app::CreateSpaceError> for ApiError {
    fn from(e: crate::app::CreateSpaceError) -> Self {
        match e {
            crate::app::CreateSpaceError::Store(e) => e.into(),
            workspace @ crate::app::CreateSpaceError::Workspace { .. } => {
                ApiError::internal(workspace)
            }
        }
    }
}

/// A bad report name is the client's; a report that cannot be read is ours.
impl From<crate::review::catalog::CatalogError> for ApiError {
    fn from(e: crate::review::catalog::CatalogError) -> Self {
        match e {
            crate::review::catalog::CatalogError::BadName(_) => {
                ApiError::bad_request(e.to_string())
            }
            crate::review::catalog::CatalogError::NotFound { .. } => {
                ApiError::not_found(e.to_string())
            }
            crate::review::catalog::CatalogError::Io { .. }
            | crate::review::catalog::CatalogError::Invalid { .. } => ApiError::internal(e),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} not found")),
            StoreError::Conflict(m) => ApiError::conflict(m),
            StoreError::Invalid(m) => ApiError::bad_request(m),
            StoreError::Fenced(_) => ApiError::unavailable(
                "the space moved to another host of this deployment; nothing was written, try again",
            ),
            e if e.is_contended() => ApiError::unavailable(
                "the database gave this write up for another host's (a deadlock or a conflict); nothing was written, send it again",
            ),
            other => ApiError::internal(other),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let message = r.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge("request body is larger than the limit".into())
        } else if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            ApiError::BadContentType(
                "send the body as JSON with content-type: application/json".into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_are_logged_never_sent() {
        let e = ApiError::internal("UNIQUE constraint failed: secret_table.secret_column");
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            (e.code(), e.message()),
            ("internal", "internal error (see the host log)")
        );
        let e: ApiError = StoreError::NotCommitted("disk I/O error at /srv/state.db".into()).into();
        assert_eq!(e, ApiError::Internal);
    }

    #[test]
    fn client_errors_keep_their_sentence_and_a_stable_code() {
        for (e, status, code) in [
            (ApiError::bad_request("b"), 400, "bad_request"),
            (ApiError::unauthorized("u"), 401, "unauthorized"),
            (ApiError::forbidden("f"), 403, "forbidden"),
            (ApiError::not_found("n"), 404, "not_found"),
            (ApiError::conflict("c"), 409, "conflict"),
            (ApiError::TooLarge("t".into()), 413, "too_large"),
            (ApiError::SlowDown("s".into()), 429, "slow_down"),
            (ApiError::unavailable("u"), 503, "unavailable"),
            (ApiError::ModelFailed("m".into()), 502, "model_failed"),
        ] {
            assert_eq!((e.status().as_u16(), e.code()), (status, code));
            assert_eq!(e.message().len(), 1);
        }
    }
}
