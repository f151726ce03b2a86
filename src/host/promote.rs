//! `mercury shadow promote --file SPACE/PATH`: one rehearsed workspace file
//! into the live workspace, through the live host's own audited file write
//! (`PUT`/`DELETE /api/files/{path}`), under the precondition that the live
//! file is still what the snapshot saw: `If-Match` its hash then, or
//! `If-None-Match: *` for a file the rehearsal added.
//!
//! Must never: write the live data dir itself (the live host writes, audits
//! and serialises with its turns), open a shadow path but through the
//! safe-path walk, or overwrite a live file that changed since the snapshot.

use std::path::Path;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::Method;
use serde::Serialize;

use crate::client::{self, Connection, Endpoint};
use crate::shadow::manifest::Manifest;
use crate::shadow::{snapshot, text_diff, ShadowError, ShadowResult};
use crate::workspace::DataPaths;

/// What a promotion did in the live workspace.
#[derive(Debug, Serialize)]
pub struct Promoted {
    pub space: String,
    pub path: String,
    /// `written` or `deleted`.
    pub action: &'static str,
    /// The live file's hash before (`None`: it did not exist) and after.
    pub before: Option<String>,
    pub after: Option<String>,
}

const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Promotes `file` (`SPACE/PATH`) of the snapshot `which` under `root`.
/// `token` is the live host's (else its owner token file is read).
pub async fn promote_file(
    root: &Path,
    which: &str,
    file: &str,
    token: Option<String>,
) -> ShadowResult<Promoted> {
    let refused = |m: String| ShadowError::Refused(m);
    let (space, rel) = file.split_once('/').ok_or_else(|| {
        refused(format!(
            "{file:?} must be SPACE/PATH, as `mercury shadow diff` lists it"
        ))
    })?;
    crate::ids::SpaceId::parse(space).map_err(|e| refused(format!("{file:?}: {e}")))?;
    let rel =
        crate::workspace::files::file_path(rel).map_err(|e| refused(format!("{file:?}: {e}")))?;
    let dir = snapshot::resolve(root, which)?;
    let manifest = Manifest::read(&dir)?;
    let base = crate::shadow::diff::baseline_files(&dir)?;
    let seen = base.get(space).and_then(|m| m.get(&rel)).cloned();
    let now = shadow_hash(&dir.join("spaces"), space, &rel)
        .map_err(|e| refused(format!("{file} in the shadow: {e}")))?;
    if now.is_some() && now == seen {
        return Err(refused(format!(
            "{file} is as the snapshot took it: the rehearsal did not change it, nothing to promote"
        )));
    }
    if now.is_none() && seen.is_none() {
        return Err(refused(format!(
            "{file} is neither in the snapshot nor in the shadow (see `mercury shadow diff`)"
        )));
    }
    let live = DataPaths::new(Path::new(&manifest.live_data_dir));
    let token = match token {
        Some(t) => t,
        None => std::fs::read_to_string(live.owner_token())
            .map(|t| t.trim().to_owned())
            .map_err(|e| {
                refused(format!(
                    "cannot read the live host's owner token {} ({e}); run as the live data dir's owner or set MERCURY_TOKEN",
                    live.owner_token().display()
                ))
            })?,
    };
    let conn = Connection::new(Endpoint::Unix(live.socket.clone()))
        .with_token(token)
        .with_space(space);
    let route = format!(
        "/api/files/{}",
        rel.split('/')
            .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
            .collect::<Vec<_>>()
            .join("/")
    );
    let mut headers = Vec::new();
    match &seen {
        Some(h) => headers.push(("if-match", h.clone())),
        None => headers.push(("if-none-match", "*".to_owned())),
    }
    let (method, body, action) = if now.is_some() {
        let text = text_diff::read_text(&dir.join("spaces"), space, &rel).ok_or_else(|| {
            refused(format!(
                "{file} is not a text file of at most 256 KiB: promote it by hand"
            ))
        })?;
        (
            Method::PUT,
            Some(serde_json::json!({ "content": text })),
            "written",
        )
    } else {
        (Method::DELETE, None, "deleted")
    };
    let answer = client::request_with_headers(&conn, method, &route, body, &headers)
        .await
        .map_err(|e| refused(format!("the live host at {}: {e}", live.socket.display())))?;
    match answer {
        (200, v) => Ok(Promoted {
            space: space.to_owned(),
            path: rel,
            action,
            before: v["before_hash"].as_str().map(str::to_owned).or(seen),
            after: v["hash"].as_str().map(str::to_owned),
        }),
        (412, v) => Err(refused(format!(
            "the live {file} changed since the snapshot ({}); nothing was written: snapshot again and rehearse on what is live now",
            v["error"]["message"].as_str().unwrap_or("precondition failed")
        ))),
        (code, v) => Err(refused(format!(
            "the live host answered {code}: {}; nothing was promoted",
            v["error"]["message"].as_str().unwrap_or("no message")
        ))),
    }
}

/// The hash of the shadow's file (the files API's hash, as the baseline
/// has it), read through the safe-path walk; `None` when there is none.
fn shadow_hash(
    spaces: &Path,
    space: &str,
    rel: &str,
) -> Result<Option<String>, crate::workspace::files::FilesError> {
    use crate::workspace::files::FilesError;
    use crate::workspace::safe::{SafePathError, WorkspaceRoot};
    let found = WorkspaceRoot::open(spaces)
        .and_then(|root| root.open_dir(space))
        .map_err(FilesError::from)
        .and_then(|ws| crate::workspace::files::hash_file(&ws, rel));
    match found {
        Ok(h) => Ok(Some(h)),
        Err(FilesError::Path(SafePathError::NotFound(_))) => Ok(None),
        Err(e) => Err(e),
    }
}
