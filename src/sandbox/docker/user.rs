//! Who the container runs as: the host user's own uid:gid, or `nobody` when
//! the host runs as root, in which case the workspace is handed to `nobody`
//! first so the run can write it.
//!
//! Must never: run a container as root, or follow a link while handing the
//! workspace over (a symlink in the workspace must not hand a host file to
//! `nobody`).

use std::path::Path;

use crate::sandbox::SandboxError;

/// uid and gid of `nobody`, the container user when the host runs as root.
pub use crate::sandbox::NOBODY;

/// The `user` of the container. A non-root host runs the container as its
/// own uid:gid so files in the workspace stay the host user's. A root host
/// runs it as nobody, and hands the workspace to nobody so it is writable:
/// running an agent as root, even in a container, is not an option.
pub(super) async fn container_user(workspace: &Path) -> Result<String, SandboxError> {
    let (uid, gid) = crate::sandbox::effective_ids();
    if uid != 0 {
        return Ok(format!("{uid}:{gid}"));
    }
    let root = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || crate::sandbox::hand_tree_to(&root, NOBODY, NOBODY))
        .await
        .map_err(|e| {
            SandboxError::Engine(format!(
                "chown task for {} panicked: {e}",
                workspace.display()
            ))
        })??;
    Ok(format!("{NOBODY}:{NOBODY}"))
}

/// The `user` of a pooled container, created before any workspace is
/// known: the same rule as [`container_user`] (the workspace is handed
/// over at claim time, by `container_user` itself).
pub(super) fn pool_user() -> String {
    let (uid, gid) = crate::sandbox::effective_ids();
    if uid != 0 {
        return format!("{uid}:{gid}");
    }
    format!("{NOBODY}:{NOBODY}")
}
