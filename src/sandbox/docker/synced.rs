//! A workspace synced into a container on an engine elsewhere: the whole
//! tree copied in at start (and again after a host-side file tool changed
//! it), and copied back after every command, bounded, into the host
//! directory the caller merges from (`crate::sandbox::sync`).
//!
//! Must never: read more of a container's archive than the workspace's
//! bounds allow, or report a command done whose changes did not come back
//! (a failed copy-back is the command's error, so the turn fails whole).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::sandbox::sync::{self, SyncBounds};
use crate::sandbox::{SandboxError, SandboxLimits, CONTAINER_WORKDIR, NOBODY};

/// The host side of one synced workspace.
#[derive(Debug)]
pub(super) struct SyncedWork {
    local: PathBuf,
    bounds: SyncBounds,
    /// The host directory changed since the container's copy was made
    /// (true until the first copy in).
    stale: AtomicBool,
}

fn engine(doing: &str, id: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Engine(format!("{doing} container {id}: {e}"))
}

/// A temporary file beside `local` (the layer's own scratch, on this host),
/// else in the system's temporary directory.
fn scratch_file(local: &Path) -> Result<std::fs::File, SandboxError> {
    let dir = local.parent().unwrap_or(Path::new("/tmp"));
    tempfile::tempfile_in(dir)
        .or_else(|_| tempfile::tempfile())
        .map_err(|source| SandboxError::Io {
            path: dir.display().to_string(),
            source,
        })
}

/// Copies `local` into the container at `dest`, each entry under `prefix`
/// and owned by `owner` inside.
pub(super) async fn upload(
    docker: &Docker,
    id: &str,
    local: &Path,
    owner: (u32, u32),
    prefix: &Path,
    dest: &str,
) -> Result<(), SandboxError> {
    let (dir, pre) = (local.to_path_buf(), prefix.to_path_buf());
    let file = tokio::task::spawn_blocking(move || {
        let mut file = scratch_file(&dir)?;
        sync::pack(&dir, owner, &pre, &mut file)?;
        use std::io::Seek;
        file.rewind().map_err(|source| SandboxError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        Ok::<_, SandboxError>(file)
    })
    .await
    .map_err(|e| engine("packing the workspace for", id, e))??;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let options = UploadToContainerOptionsBuilder::default()
        .path(dest)
        .no_overwrite_dir_non_dir("true")
        .build();
    docker
        .upload_to_container(id, Some(options), bollard::body_try_stream(stream))
        .await
        .map_err(|e| engine(&format!("copying {} into", local.display()), id, e))
}

impl SyncedWork {
    /// `local` (canonical), within the bounds the session's limits give.
    pub(super) fn new(local: PathBuf, limits: &SandboxLimits) -> Self {
        Self {
            local,
            bounds: SyncBounds {
                bytes: u64::try_from(limits.workspace_bytes).unwrap_or(0),
                entries: limits.workspace_entries,
                depth: limits.workspace_depth,
            },
            stale: AtomicBool::new(true),
        }
    }

    /// The first copy in: the whole host directory, owned by the container
    /// user.
    pub(super) async fn push(&self, docker: &Docker, id: &str) -> Result<(), SandboxError> {
        upload(
            docker,
            id,
            &self.local,
            (NOBODY, NOBODY),
            Path::new(""),
            CONTAINER_WORKDIR,
        )
        .await?;
        self.stale.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Copies the container's working directory back into the host
    /// directory: downloaded into a scratch file no larger than the bounds
    /// allow, checked whole, then applied.
    pub(super) async fn pull(&self, docker: &Docker, id: &str) -> Result<(), SandboxError> {
        let cap = self.bounds.archive_bytes();
        let file = scratch_file(&self.local)?;
        let mut out = tokio::fs::File::from_std(file);
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(&format!("{CONTAINER_WORKDIR}/."))
            .build();
        let mut stream = docker.download_from_container(id, Some(options));
        let mut taken = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| engine("copying the workspace back from", id, e))?;
            taken = taken.saturating_add(chunk.len() as u64);
            if taken > cap {
                return Err(SandboxError::Engine(format!(
                    "the workspace of container {id} came back as more than {cap} bytes of archive, past its quota (sandbox.workspace_mb = {}); nothing it wrote was kept",
                    self.bounds.bytes >> 20
                )));
            }
            out.write_all(&chunk)
                .await
                .map_err(|e| engine("storing the archive of", id, e))?;
        }
        out.flush()
            .await
            .map_err(|e| engine("storing the archive of", id, e))?;
        let mut file = out.into_std().await;
        let (local, bounds) = (self.local.clone(), self.bounds);
        let applied = tokio::task::spawn_blocking(move || sync::apply(&mut file, &local, &bounds))
            .await
            .map_err(|e| engine("applying the workspace of", id, e))??;
        tracing::debug!(container = %id, written = applied.written, removed = applied.removed, "synced workspace copied back");
        Ok(())
    }

    pub(super) fn mark_stale(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }
}
