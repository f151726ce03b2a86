//! Who the container runs as: the host user's own uid:gid, or `nobody` when
//! the host runs as root, in which case the workspace is handed to `nobody`
//! first so the run can write it.
//!
//! Must never: run a container as root, or follow a link while handing the
//! workspace over (a symlink in the workspace must not hand a host file to
//! `nobody`).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::sandbox::SandboxError;

/// uid and gid of `nobody`, the container user when the host runs as root.
pub const NOBODY: u32 = 65534;

/// The `user` of the container. A non-root host runs the container as its
/// own uid:gid so files in the workspace stay the host user's. A root host
/// runs it as nobody, and hands the workspace to nobody so it is writable:
/// running an agent as root, even in a container, is not an option.
pub(super) async fn container_user(workspace: &Path) -> Result<String, SandboxError> {
    let (uid, gid) = effective_ids()?;
    if uid != 0 {
        return Ok(format!("{uid}:{gid}"));
    }
    let root = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || hand_to_nobody(&root))
        .await
        .map_err(|e| {
            SandboxError::Engine(format!(
                "chown task for {} panicked: {e}",
                workspace.display()
            ))
        })??;
    Ok(format!("{NOBODY}:{NOBODY}"))
}

/// The effective uid and gid of this process, read without libc: a process's
/// `/proc/<pid>` directory is owned by its effective ids.
pub(super) fn effective_ids() -> Result<(u32, u32), SandboxError> {
    let meta = std::fs::metadata("/proc/self").map_err(|source| SandboxError::Io {
        path: "/proc/self (to read the effective uid)".into(),
        source,
    })?;
    Ok((meta.uid(), meta.gid()))
}

/// lchown-s the workspace tree to nobody unless its root already is. Links
/// are changed themselves, never followed, so a symlink in the workspace
/// cannot hand a host file to nobody.
fn hand_to_nobody(root: &Path) -> Result<(), SandboxError> {
    let io_err = |path: &Path, source: io::Error| SandboxError::Io {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::symlink_metadata(root).map_err(|e| io_err(root, e))?;
    if meta.uid() == NOBODY && meta.gid() == NOBODY {
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(root).to_path_buf();
            io_err(&path, io::Error::from(e))
        })?;
        std::os::unix::fs::lchown(entry.path(), Some(NOBODY), Some(NOBODY))
            .map_err(|e| io_err(entry.path(), e))?;
    }
    Ok(())
}
