//! Space workspaces on disk: `<data_dir>/spaces/<space id>/` with `AGENTS.md`,
//! `MEMORY.md` and `knowledge/`, created from templates with the space.
//!
//! Must never: overwrite a file that exists (an operator may have edited it),
//! or build a path from an unvalidated space id.

use std::io;
use std::path::{Path, PathBuf};

use crate::ids::SpaceId;

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
        }
    }

    pub fn workspace(&self, space: &SpaceId) -> PathBuf {
        self.spaces.join(space.as_str())
    }

    pub fn owner_token(&self) -> PathBuf {
        self.global.join("owner.token")
    }
}

/// Creates the workspace of a space from the templates, keeping what exists.
pub fn ensure_workspace(paths: &DataPaths, space: &SpaceId) -> io::Result<PathBuf> {
    let dir = paths.workspace(space);
    // Readable by the host user only (the docker backend may hand it to the
    // sandbox uid later); exact modes, whatever the umask.
    crate::data_dir::private_dir(&dir)?;
    crate::data_dir::private_dir(&dir.join("knowledge"))?;
    for (name, body) in [
        ("AGENTS.md", AGENTS_TEMPLATE),
        ("MEMORY.md", MEMORY_TEMPLATE),
    ] {
        match crate::data_dir::private_file(&dir.join(name)) {
            Ok(mut f) => io::Write::write_all(&mut f, body.as_bytes())?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

/// Copies a directory tree (files, directories, symlinks as symlinks; never
/// following one) into `dst`, which must exist and be empty.
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<u64> {
    let mut bytes = 0;
    for entry in walkdir::WalkDir::new(src).follow_links(false).min_depth(1) {
        let entry = entry.map_err(io::Error::other)?;
        let rel = entry.path().strip_prefix(src).map_err(io::Error::other)?;
        let to = dst.join(rel);
        let ft = entry.file_type();
        if ft.is_dir() {
            std::fs::create_dir(&to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &to)?;
        } else if ft.is_file() {
            bytes += std::fs::copy(entry.path(), &to)?;
        }
    }
    Ok(bytes)
}

/// Reads a workspace file the prompt needs; a missing file is empty, and the
/// size is capped so a runaway `MEMORY.md` cannot blow the prompt.
pub fn read_capped(path: &Path, cap: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let slice = &bytes[..bytes.len().min(cap)];
            String::from_utf8_lossy(slice).into_owned()
        }
        Err(_) => String::new(),
    }
}
