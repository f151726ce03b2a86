//! How a dashboard request fails: each failure is one status and an HTML
//! page saying why in the client's words.
//!
//! Must never: show an internal error's detail (it goes to the log), or
//! answer a request without a sign-in with anything but the sign-in page.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};

use super::pages::Chrome;
use crate::storage::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// No live sign-in: the browser is sent to the sign-in page.
    #[error("not signed in")]
    SignedOut,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// The form's CSRF token is missing or is not this sign-in's.
    #[error("this form was not sent from this sign-in's own page (missing or wrong CSRF token)")]
    Csrf,
    /// The file changed since the editing page was loaded.
    #[error("{0}")]
    Stale(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unavailable(String),
    /// One of many hosts: another host (this id) runs the space; the
    /// host's forwarding step sends the request there.
    #[error("this space is served by another host of this deployment right now; try again")]
    Elsewhere(String),
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("rendering a page: {0}")]
    Render(#[from] askama::Error),
    #[error("{0}")]
    Internal(String),
}

pub(super) type UiResult<T> = Result<T, UiError>;

/// Runs file or report I/O off the async runtime; its error becomes the
/// page's (a task that panicked is an internal error).
pub(super) async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> UiResult<T>
where
    T: Send + 'static,
    E: Into<UiError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(UiError::Internal(format!("a dashboard task failed: {e}"))),
    }
}

impl From<crate::actors::ActorError> for UiError {
    fn from(e: crate::actors::ActorError) -> Self {
        use crate::actors::{ActorError, ControlError, SpawnError};
        match e {
            ActorError::Store(s)
            | ActorError::Spawn(SpawnError::Store(s))
            | ActorError::Control(ControlError::Store(s)) => UiError::Store(s),
            ActorError::Spawn(SpawnError::NoSuchSpace(id)) => {
                UiError::NotFound(format!("space {id} does not exist"))
            }
            ActorError::Spawn(SpawnError::LeasedElsewhere { host, .. }) => UiError::Elsewhere(host),
            e @ (ActorError::Unavailable(_) | ActorError::Busy(_) | ActorError::Timeout(_)) => {
                UiError::Unavailable(format!("{e}; try again"))
            }
            e => UiError::Internal(e.to_string()),
        }
    }
}

#[derive(Template)]
#[template(path = "ui/error.html")]
struct ErrorPage<'a> {
    chrome: Chrome,
    status: String,
    message: &'a str,
}

impl UiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::SignedOut => StatusCode::SEE_OTHER,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden(_) | Self::Csrf => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Stale(_) => StatusCode::PRECONDITION_FAILED,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unavailable(_) | Self::Elsewhere(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(StoreError::NotFound(_)) => StatusCode::NOT_FOUND,
            Self::Store(StoreError::Invalid(_)) => StatusCode::BAD_REQUEST,
            Self::Store(_) | Self::Render(_) | Self::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        if let Self::SignedOut = self {
            return Redirect::to("/ui/login").into_response();
        }
        let status = self.status();
        let runner = match &self {
            Self::Elsewhere(host) => axum::http::HeaderValue::from_str(host).ok(),
            _ => None,
        };
        let message = if status.is_server_error() && runner.is_none() {
            tracing::error!(error = %self, "dashboard request failed");
            "Something went wrong on the host; the log says what.".to_owned()
        } else {
            self.to_string()
        };
        let page = ErrorPage {
            chrome: Chrome::default(),
            status: format!(
                "{} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            ),
            message: &message,
        };
        let mut answer = match page.render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => (status, message).into_response(),
        };
        if let Some(host) = runner {
            answer
                .headers_mut()
                .insert(crate::cluster::RUNNER_HEADER, host);
        }
        answer
    }
}
