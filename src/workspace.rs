//! Space workspaces on disk: `<data_dir>/spaces/<space id>/` with `AGENTS.md`,
//! `MEMORY.md` and `knowledge/`, created from templates with the space.
//!
//! Must never: overwrite a file that exists (an operator may have edited it),
//! or build a path from an unvalidated space id.

use std::io;
use std::path::{Path, PathBuf};

use crate::ids::SpaceId;

pub mod data_dir;
pub mod files;
pub mod layer;
pub mod safe;
pub mod transcript;
pub mod walk;

pub const AGENTS_TEMPLATE: &str = "# Instructions for this space\n\n\
You are the assistant of this space. Be concise and helpful.\n\
Edit this file to give the agent of this space its own instructions.\n";

pub const MEMORY_TEMPLATE: &str = "# Memory\n\nFacts worth remembering in this space go here.\n";

/// Paths of a data directory.
#[derive(Debug, Clone)]
pub struct DataPaths {
    pub root: PathBuf,
    pub config: PathBuf,
    pub db: PathBuf,
    pub spaces: PathBuf,
    pub global: PathBuf,
    pub socket: PathBuf,
    pub reviews: PathBuf,
    /// The scripted models' rules files (`models/`).
    pub models: PathBuf,
    /// The deployment's shared directory (`storage.shared_dir`), when it
    /// has one: where `global/` is published for every host.
    pub shared: Option<PathBuf>,
}

impl DataPaths {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            config: root.join("mercury.yaml"),
            db: root.join("state.db"),
            spaces: root.join("spaces"),
            global: root.join("global"),
            socket: root.join("api.sock"),
            reviews: root.join("reviews"),
            models: root.join("models"),
            shared: None,
        }
    }

    /// The same data dir with what a deployment shares under `dir`
    /// (`storage.shared_dir`): `spaces/`, `reviews/` and `models/` live
    /// there, and `global/` is published there ([`Self::shared_global`]).
    /// `with_workspaces` and `with_reviews` applied after it win.
    pub fn with_shared(mut self, dir: &Path) -> Self {
        self.spaces = dir.join("spaces");
        self.reviews = dir.join("reviews");
        self.models = dir.join("models");
        self.shared = Some(dir.to_owned());
        self
    }

    /// The data dir as `storage` places its parts: `shared_dir` first,
    /// then `workspaces_dir` and `reviews_dir` where they are set.
    pub fn of(root: &Path, storage: &crate::config::StorageConfig) -> Self {
        let mut paths = Self::new(root);
        if let Some(dir) = non_empty(&storage.shared_dir) {
            paths = paths.with_shared(dir);
        }
        if let Some(dir) = non_empty(&storage.workspaces_dir) {
            paths = paths.with_workspaces(dir);
        }
        if let Some(dir) = non_empty(&storage.reviews_dir) {
            paths = paths.with_reviews(dir);
        }
        paths
    }

    /// `<shared_dir>/global`: the canonical copy of `global/` when the
    /// deployment has a shared directory.
    pub fn shared_global(&self) -> Option<PathBuf> {
        self.shared.as_ref().map(|d| d.join("global"))
    }

    /// The same data dir with the workspaces elsewhere
    /// (`storage.workspaces_dir`: one directory many hosts share).
    pub fn with_workspaces(mut self, dir: &Path) -> Self {
        self.spaces = dir.to_owned();
        self
    }

    /// The same data dir with the review's reports elsewhere
    /// (`storage.reviews_dir`: one directory many hosts share).
    pub fn with_reviews(mut self, dir: &Path) -> Self {
        self.reviews = dir.to_owned();
        self
    }

    pub fn workspace(&self, space: &SpaceId) -> PathBuf {
        self.spaces.join(space.as_str())
    }

    /// Turn layers and ask copies (`tmp/`); emptied at every start.
    pub fn scratch(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn owner_token(&self) -> PathBuf {
        self.global.join("owner.token")
    }
}

fn non_empty(setting: &str) -> Option<&Path> {
    match setting.trim() {
        "" => None,
        dir => Some(Path::new(dir)),
    }
}

/// Creates the workspace of a space from the templates, keeping what exists.
pub fn ensure_workspace(paths: &DataPaths, space: &SpaceId) -> io::Result<PathBuf> {
    let dir = paths.workspace(space);
    // Readable by the host user only (the docker backend may hand it to the
    // sandbox uid later); exact modes, whatever the umask.
    crate::workspace::data_dir::private_dir(&dir)?;
    crate::workspace::data_dir::private_dir(&dir.join("knowledge"))?;
    for (name, body) in [
        ("AGENTS.md", AGENTS_TEMPLATE),
        ("MEMORY.md", MEMORY_TEMPLATE),
    ] {
        match crate::workspace::data_dir::private_file(&dir.join(name)) {
            Ok(mut f) => io::Write::write_all(&mut f, body.as_bytes())?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

/// Reads a workspace file the prompt needs through the safe-path function:
/// a missing file is empty; a symlink, FIFO or other non-regular file is
/// never followed or opened (the prompt says it was ignored); the size is
/// capped so a runaway `MEMORY.md` cannot blow the prompt.
pub fn read_capped(workspace: &std::path::Path, name: &str, cap: usize) -> String {
    let read = safe::WorkspaceRoot::open(workspace).and_then(|root| root.read_capped(name, cap));
    match read {
        Ok(Some((bytes, _))) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(None) => String::new(),
        // A space whose workspace was never made (a space seeded straight
        // into storage, as the benches do) has no prompt files: the same as
        // a missing file, and not worth a warning on every turn.
        Err(safe::SafePathError::NotFound(_)) => {
            tracing::debug!(workspace = %workspace.display(), "no workspace: no prompt files");
            String::new()
        }
        Err(e) => {
            tracing::warn!(workspace = %workspace.display(), error = %e, "a prompt file was not read");
            format!("({name} was not read: it is not a regular file of the workspace)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read_capped;

    #[test]
    fn a_missing_workspace_has_no_prompt_files_and_a_linked_one_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        assert_eq!(read_capped(&ws, "AGENTS.md", 100), "");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(ws.join("AGENTS.md"), "be brief").unwrap();
        assert_eq!(read_capped(&ws, "AGENTS.md", 100), "be brief");
        assert_eq!(read_capped(&ws, "MEMORY.md", 100), "");
        // A workspace root that is a symbolic link is never followed, even
        // to a real workspace: the prompt says so instead.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&ws, &link).unwrap();
        let refused = read_capped(&link, "AGENTS.md", 100);
        assert!(refused.contains("was not read"), "{refused}");
        assert!(!refused.contains("be brief"), "{refused}");
    }
}
