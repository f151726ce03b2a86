//! The rehearsal bench's own logic (issue 14): the data-dir guard a shadow
//! host starts behind, the shadow's own model credential, the snapshot of a
//! live data dir and its manifest, the refusals of `mercury shadow up`, and
//! the diff a rehearsal is judged on. Process supervision (`up`, `down`) is
//! the host's (`host::shadow`).
//!
//! Must never: write to the live data dir (the snapshot only reads it),
//! carry a live API token, admin id or model key into a shadow, or let a
//! shadow serve a data dir outside the shadow root.

pub mod credential;
pub mod diff;
pub mod guard;
pub mod manifest;
pub mod settings;
pub mod snapshot;
pub mod tap;
pub mod text_diff;

use std::path::{Path, PathBuf};

/// The errors of the shadow commands. `Refused` is an operator's "no" (exit
/// 2, one sentence); the others are failures while running (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ShadowError {
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Db {
        context: String,
        #[source]
        source: crate::storage::StoreError,
    },
    #[error(transparent)]
    Store(#[from] crate::storage::StoreError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Invalid(String),
}

pub type ShadowResult<T> = Result<T, ShadowError>;

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShadowError {
    let context = context.into();
    move |source| ShadowError::Io { context, source }
}

pub(crate) fn db_err(
    context: impl Into<String>,
) -> impl FnOnce(crate::storage::StoreError) -> ShadowError {
    let context = context.into();
    move |source| ShadowError::Db { context, source }
}

/// The shadow root: `explicit` (a flag or `MERCURY_SHADOW_ROOT`), else
/// `$HOME/mercury-shadow`. An empty home refuses: a root made relative to
/// wherever the command runs could be anywhere, even inside a live data dir.
pub fn root_from(explicit: Option<&Path>, home: Option<&str>) -> ShadowResult<PathBuf> {
    match explicit {
        Some(p) if p.is_absolute() => Ok(p.to_owned()),
        Some(p) => Err(ShadowError::Refused(format!(
            "the shadow root {} is not an absolute path",
            p.display()
        ))),
        None => match home {
            Some(h) if h.starts_with('/') => Ok(Path::new(h).join("mercury-shadow")),
            _ => Err(ShadowError::Refused(
                "HOME is not set to an absolute path, so there is no default shadow root (give --root or MERCURY_SHADOW_ROOT)".into(),
            )),
        },
    }
}
