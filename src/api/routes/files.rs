//! Workspace files of a space (issue 18, spec D-005, D-011): list a
//! directory, read, write and delete one file. Space-scoped like every other
//! route, so `mrctl --space X files …` reaches X's files through the act-as
//! step unchanged.
//!
//! Reads run on the live workspace through the safe-path function; writes
//! and deletes go through the space's actor (one writer, between turns),
//! atomically, under an optional `If-Match: <hash>` (412 when stale) and
//! within the workspace quota (413, nothing written).
//!
//! Must never: open a path any other way than [`crate::workspace::files`]
//! (so never through a link, never a FIFO, never outside the workspace), or
//! write from a turn into its own workspace (that turn's overlay would not
//! see it; the `write_file` tool is the way there).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, params, path_arg, Body, Json, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::{Admin, Read};
use crate::storage::tokens::TokenKind;
use crate::workspace::files::{self, FileChange, FileContent, FileEntry, FilesError};
use crate::workspace::safe::SafePathError;
use crate::workspace::walk::WalkError;

/// How long a write waits behind a turn of the space before it is dropped
/// unwritten (a turn's tool calls time out after 60 s by default).
const WRITE_WAIT: Duration = Duration::from_secs(60);

pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(read, write, remove))
}

/// Across a link: list and get are reads (D-005 "list and read workspace
/// files"); put and delete need an `admin` link and are audited with the
/// path and the before/after hash.
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/files", Read),
    ActAsRoute::new("GET", "/api/files/{*path}", Read),
    ActAsRoute::new("PUT", "/api/files/{*path}", Admin),
    ActAsRoute::new("DELETE", "/api/files/{*path}", Admin),
];

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileList {
    pub space_id: String,
    pub path: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileRead {
    pub space_id: String,
    #[serde(flatten)]
    pub file: FileContent,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileWritten {
    pub space_id: String,
    #[serde(flatten)]
    pub change: FileChange,
    /// Whether the write made a new file.
    pub created: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileDeleted {
    pub space_id: String,
    #[serde(flatten)]
    pub change: FileChange,
    pub deleted: bool,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// A directory of the workspace, relative (default: its root).
    path: Option<String>,
}

/// The whole new text of the file (at most `files.max_bytes` bytes).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteBody {
    content: String,
}

impl From<FilesError> for ApiError {
    fn from(e: FilesError) -> Self {
        match e {
            FilesError::Path(p) => match p {
                SafePathError::BadPath(_) | SafePathError::NotRegular(_) => {
                    ApiError::bad_request(p.to_string())
                }
                SafePathError::IsDirectory(_) => ApiError::bad_request(p.to_string()),
                SafePathError::Escapes(_) => ApiError::forbidden(p.to_string()),
                SafePathError::NotFound(_) => ApiError::not_found(p.to_string()),
                SafePathError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                    ApiError::TooLarge("the disk or the workspace is full; nothing was written".into())
                }
                io @ SafePathError::Io { .. } => ApiError::internal(io),
            },
            e @ (FilesError::TooLarge { .. }
            | FilesError::OverQuota { .. }
            | FilesError::TooManyEntries { .. }) => ApiError::TooLarge(e.to_string()),
            FilesError::Limit(e @ WalkError::Io { .. }) => ApiError::internal(e),
            FilesError::Limit(e) => ApiError::TooLarge(format!("{e}; nothing was written")),
            e @ FilesError::NotText(_) => ApiError::BadContentType(e.to_string()),
            e @ (FilesError::Stale { .. }
            | FilesError::StaleMissing(_)
            | FilesError::Exists { .. }) => ApiError::PreconditionFailed(e.to_string()),
            e @ (FilesError::Empty | FilesError::NotADirectory(_)) => {
                ApiError::bad_request(e.to_string())
            }
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FilesError> + Send + 'static,
) -> ApiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => Ok(r?),
        Err(e) => Err(ApiError::internal(format!("a files task failed: {e}"))),
    }
}

/// `If-Match: <hash>` (quotes, as in an ETag, are dropped), or
/// `If-None-Match: *` (the file must not exist yet); not both.
fn if_match(headers: &HeaderMap) -> ApiResult<Option<String>> {
    if let Some(v) = headers.get(axum::http::header::IF_NONE_MATCH) {
        if v.to_str().ok().map(str::trim) != Some("*") {
            return Err(ApiError::bad_request(
                "If-None-Match takes only * (write only if the file does not exist)",
            ));
        }
        if headers.contains_key(axum::http::header::IF_MATCH) {
            return Err(ApiError::bad_request(
                "give If-Match or If-None-Match, not both",
            ));
        }
        return Ok(Some(files::ABSENT.to_owned()));
    }
    match headers.get(axum::http::header::IF_MATCH) {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| ApiError::bad_request("If-Match must be plain text"))?
                .trim()
                .trim_matches('"')
                .to_owned();
            if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ApiError::bad_request(
                    "If-Match must be a file hash as the files API gives it (hex)",
                ));
            }
            Ok(Some(s.to_ascii_lowercase()))
        }
    }
}

/// A turn's run token writing its own space would wait for itself.
fn refuse_own_turn(auth: &Auth) -> ApiResult<()> {
    if auth.caller.kind == TokenKind::Run && auth.via.is_none() {
        return Err(ApiError::conflict(
            "a turn writes its own workspace with the write_file tool; the files API writes between turns",
        ));
    }
    Ok(())
}

#[utoipa::path(get, path = "/api/files", operation_id = "listFiles", summary = "List a directory of the space's workspace", tag = "files", params(ListQuery),
    responses((status = 200, description = "The directory's entries", body = FileList),
        (status = 400, description = "Not a directory path of the workspace", body = crate::api::error::ErrorBody),
        (status = 404, description = "No such directory", body = crate::api::error::ErrorBody)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<ListQuery>,
) -> ApiResult<Json<FileList>> {
    let ctx = auth.require(Permission::FilesRead)?;
    let dir = params(q)?.path.unwrap_or_default();
    let ws = app.rt.paths.workspace(&ctx.space);
    let d = dir.clone();
    let entries = blocking(move || files::list(&ws, &d)).await?;
    Ok(Json(FileList {
        space_id: ctx.space.to_string(),
        path: dir,
        entries,
    }))
}

#[utoipa::path(get, path = "/api/files/{*path}", operation_id = "readFile", summary = "Read a file of the space's workspace", tag = "files",
    params(("path" = String, Path, description = "A file of the workspace, relative")),
    responses((status = 200, description = "The file, whole", body = FileRead),
        (status = 404, description = "No such file", body = crate::api::error::ErrorBody),
        (status = 413, description = "Larger than files.max_bytes", body = crate::api::error::ErrorBody),
        (status = 415, description = "Not a text file", body = crate::api::error::ErrorBody)))]
pub(crate) async fn read(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    p: PathArg<String>,
) -> ApiResult<Json<FileRead>> {
    let ctx = auth.require(Permission::FilesRead)?;
    let rel = files::file_path(&path_arg(p)?)?;
    let ws = app.rt.paths.workspace(&ctx.space);
    let max = app.rt.settings.files.max_bytes;
    let file = blocking(move || files::read(&ws, &rel, max)).await?;
    Ok(Json(FileRead {
        space_id: ctx.space.to_string(),
        file,
    }))
}

fn audit_of(change: &FileChange) -> AuditChange {
    AuditChange {
        before: Some(serde_json::json!({"path": change.path, "hash": change.before_hash})),
        after: Some(serde_json::json!({"path": change.path, "hash": change.hash, "size": change.size})),
    }
}

#[utoipa::path(put, path = "/api/files/{*path}", operation_id = "writeFile", summary = "Write a file of the space's workspace (audited, If-Match)", tag = "files", request_body = WriteBody,
    params(("path" = String, Path, description = "A file of the workspace, relative"),
        ("If-Match" = Option<String>, Header, description = "The hash the file must still have (hex)"),
        ("If-None-Match" = Option<String>, Header, description = "* : write only if the file does not exist")),
    responses((status = 200, description = "Written", body = FileWritten),
        (status = 409, description = "A turn's own token, or a turn kept the space busy", body = crate::api::error::ErrorBody),
        (status = 412, description = "The file's hash is not If-Match", body = crate::api::error::ErrorBody),
        (status = 413, description = "Larger than files.max_bytes or the workspace quota", body = crate::api::error::ErrorBody)))]
pub(crate) async fn write(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    headers: HeaderMap,
    p: PathArg<String>,
    b: Body<WriteBody>,
) -> ApiResult<(Extension<AuditChange>, Json<FileWritten>)> {
    let ctx = auth.require(Permission::FilesWrite)?.clone();
    refuse_own_turn(&auth)?;
    let rel = files::file_path(&path_arg(p)?)?;
    let expect = if_match(&headers)?;
    let content = body(b)?.content;
    let max = app.rt.settings.files.max_bytes;
    if content.len() > max {
        return Err(FilesError::TooLarge {
            path: rel,
            size: content.len() as u64,
            max,
        }
        .into());
    }
    let quota = app.rt.settings.sandbox.workspace_mb;
    let limits = (&app.rt.settings.workspace).into();
    let change = app
        .spaces
        .workspace_write(&ctx.space, WRITE_WAIT, move |live| {
            files::write(
                live,
                &rel,
                content.as_bytes(),
                expect.as_deref(),
                quota,
                limits,
            )
        })
        .await??;
    Ok((
        Extension(audit_of(&change)),
        Json(FileWritten {
            space_id: ctx.space.to_string(),
            created: change.before_hash.is_none(),
            change,
        }),
    ))
}

#[utoipa::path(delete, path = "/api/files/{*path}", operation_id = "deleteFile", summary = "Delete a file of the space's workspace (audited, If-Match)", tag = "files",
    params(("path" = String, Path, description = "A file of the workspace, relative"),
        ("If-Match" = Option<String>, Header, description = "The hash the file must still have (hex)")),
    responses((status = 200, description = "Deleted", body = FileDeleted),
        (status = 404, description = "No such file", body = crate::api::error::ErrorBody),
        (status = 409, description = "A turn's own token, or a turn kept the space busy", body = crate::api::error::ErrorBody),
        (status = 412, description = "The file's hash is not If-Match", body = crate::api::error::ErrorBody)))]
pub(crate) async fn remove(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    headers: HeaderMap,
    p: PathArg<String>,
) -> ApiResult<(Extension<AuditChange>, Json<FileDeleted>)> {
    let ctx = auth.require(Permission::FilesWrite)?.clone();
    refuse_own_turn(&auth)?;
    let rel = files::file_path(&path_arg(p)?)?;
    let expect = if_match(&headers)?;
    let change = app
        .spaces
        .workspace_write(&ctx.space, WRITE_WAIT, move |live| {
            files::delete(live, &rel, expect.as_deref())
        })
        .await??;
    Ok((
        Extension(audit_of(&change)),
        Json(FileDeleted {
            space_id: ctx.space.to_string(),
            change,
            deleted: true,
        }),
    ))
}
