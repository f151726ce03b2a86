//! An extension's runtime image: built `FROM scratch` through the engine API
//! from host paths the operator names (a pinned virtualenv, the interpreter's
//! standard library), with the interpreter the links lead to and the shared
//! libraries every ELF file in them loads, as `mercury ext image` asks.
//!
//! Why: the agent image holds no language runtime on purpose, so a `stdio`
//! MCP server written in Python runs, under the docker backend, in its own
//! image; none can be pulled (no registry is reachable), so it is assembled
//! from what the host already has, as the agent image is.
//!
//! Must never: copy a path the operator did not name, except the targets of
//! links inside the named paths and the libraries ldd lists; follow a link
//! while walking (a link is copied as a link, its target added by its own
//! path); or hold a device, socket or fifo.

use std::collections::{BTreeSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use bollard::Docker;

use super::image::{build_labelled, context_of, image_path, read_file, shared_libraries, RootFs};

use super::SandboxError;

/// The runtime image's Dockerfile: its root filesystem, run as `nobody` in
/// `/work`, as the agent image does.
pub const RUNTIME_DOCKERFILE: &str = "# An extension's runtime image, built by `mercury ext image` from host paths.\nFROM scratch\nCOPY rootfs/ /\nUSER 65534:65534\nWORKDIR /work\n";

/// Paths at most this many entries in all: a named `/` or `/usr` is a
/// mistake, not a runtime.
const MAX_ENTRIES: usize = 200_000;

/// Builds `tag` from `paths` (absolute, no `..`); replaces an image of that
/// tag. Returns the number of files, links and directories it holds.
pub async fn build_runtime_image(
    docker: &Docker,
    tag: &str,
    paths: &[PathBuf],
) -> Result<usize, SandboxError> {
    let paths = paths.to_vec();
    let (context, entries) = tokio::task::spawn_blocking(move || {
        let rootfs = assemble(&paths)?;
        let n = rootfs.entries.len();
        Ok::<_, SandboxError>((context_of(RUNTIME_DOCKERFILE, &rootfs)?, n))
    })
    .await
    .map_err(|e| SandboxError::Image(format!("assembling the runtime image panicked: {e}")))??;
    build_labelled(docker, tag, context, ("mercury.image", "extension-runtime")).await?;
    Ok(entries)
}

/// The root filesystem of `paths`, their links' targets and their ELF files'
/// libraries, plus `nobody` and the mount points the sandbox uses.
fn assemble(paths: &[PathBuf]) -> Result<RootFs, SandboxError> {
    let mut rootfs = RootFs::default();
    check_paths(paths)?;
    let mut queue: VecDeque<PathBuf> = paths.iter().cloned().collect();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut elves: Vec<PathBuf> = Vec::new();
    while let Some(path) = queue.pop_front() {
        if !seen.insert(path.clone()) {
            continue;
        }
        if seen.len() > MAX_ENTRIES {
            return Err(SandboxError::Image(format!(
                "more than {MAX_ENTRIES} entries: name the runtime's own directories, not a whole tree"
            )));
        }
        let in_image = image_path(&path).ok_or_else(|| {
            SandboxError::Image(format!("{} cannot be placed in the image", path.display()))
        })?;
        let meta = std::fs::symlink_metadata(&path).map_err(|source| SandboxError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|source| SandboxError::Io {
                path: path.display().to_string(),
                source,
            })?;
            let text = target.to_str().ok_or_else(|| {
                SandboxError::Image(format!(
                    "{}: a link target that is not UTF-8",
                    path.display()
                ))
            })?;
            rootfs.link(&in_image, text);
            // A link whose target is gone is copied as it is (dangling on
            // the host too); one that resolves brings its target along.
            if let Some(resolved) = resolve(&path, &target) {
                if std::fs::symlink_metadata(&resolved).is_ok() {
                    queue.push_back(resolved);
                }
            }
        } else if kind.is_dir() {
            rootfs.dir(&in_image, meta.permissions().mode() & 0o7777);
            let mut children: Vec<PathBuf> = std::fs::read_dir(&path)
                .map_err(|source| SandboxError::Io {
                    path: path.display().to_string(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            children.sort();
            queue.extend(children);
        } else if kind.is_file() {
            let data = read_file(&path)?;
            if data.starts_with(b"\x7fELF") {
                elves.push(path.clone());
            }
            rootfs.file(&in_image, data, meta.permissions().mode() & 0o7777);
        }
        // Devices, sockets and fifos are left out: a runtime needs none.
    }
    let mut libraries: BTreeSet<PathBuf> = BTreeSet::new();
    for elf in &elves {
        // A shared object ldd cannot resolve (a plugin needing an optional
        // library) is left as the host has it: it fails where it would fail.
        if let Ok(libs) = shared_libraries(elf) {
            libraries.extend(libs);
        }
    }
    for library in libraries {
        if seen.contains(&library) {
            continue;
        }
        if let Some(in_image) = image_path(&library) {
            rootfs.host_file(&in_image, &library)?;
        }
    }
    rootfs.sandbox_base();
    Ok(rootfs)
}

/// Refuses, before any engine work, a path that is not plain absolute (no
/// `.`, no `..`, not `/`) or does not exist.
pub fn check_paths(paths: &[PathBuf]) -> Result<(), SandboxError> {
    for p in paths {
        if !is_plain_absolute(p) {
            return Err(SandboxError::Image(format!(
                "--path {} must be absolute, without '.' or '..'",
                p.display()
            )));
        }
        std::fs::symlink_metadata(p).map_err(|source| SandboxError::Io {
            path: p.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)))
        && p.components().count() > 1
}

/// The absolute, lexically normalised path a link at `link` pointing to
/// `target` names; `None` if it climbs above `/`.
fn resolve(link: &Path, target: &Path) -> Option<PathBuf> {
    let joined = if target.is_absolute() {
        target.to_path_buf()
    } else {
        link.parent()?.join(target)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(part) => out.push(part),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::image::RootEntry;

    #[test]
    fn links_are_kept_as_links_and_bring_their_targets_along() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let venv = root.join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        std::fs::write(root.join("outside/interp"), b"#!interp").unwrap();
        std::fs::write(root.join("outside/not-named"), b"secret").unwrap();
        std::os::unix::fs::symlink(root.join("outside/interp"), venv.join("bin/python")).unwrap();
        std::os::unix::fs::symlink("python", venv.join("bin/python3")).unwrap();
        std::os::unix::fs::symlink("/no/such/target", venv.join("bin/dangling")).unwrap();
        let rootfs = assemble(std::slice::from_ref(&venv)).unwrap();
        let key = |p: &Path| image_path(p).unwrap();
        match &rootfs.entries[&key(&venv.join("bin/python"))] {
            RootEntry::Link { target } => {
                assert_eq!(target, root.join("outside/interp").to_str().unwrap());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            &rootfs.entries[&key(&venv.join("bin/python3"))],
            RootEntry::Link { target } if target == "python"
        ));
        assert!(matches!(
            &rootfs.entries[&key(&root.join("outside/interp"))],
            RootEntry::File { data, .. } if data == b"#!interp"
        ));
        assert!(!rootfs
            .entries
            .contains_key(&key(&root.join("outside/not-named"))));
        assert!(rootfs.entries.contains_key("etc/passwd"));
        assert!(matches!(
            rootfs.entries["tmp"],
            RootEntry::Dir { mode: 0o1777 }
        ));
    }

    #[test]
    fn an_elf_file_brings_its_libraries_and_loader() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy("/bin/true", bin.join("true")).unwrap();
        let rootfs = assemble(&[bin]).unwrap();
        assert!(
            rootfs.entries.keys().any(|k| k.contains("libc.so")),
            "{:?}",
            rootfs.entries.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn relative_dotted_missing_and_root_paths_are_refused() {
        for p in ["relative", "/tmp/../etc", "/", "/no/such/path/at/all"] {
            assert!(assemble(&[PathBuf::from(p)]).is_err(), "{p} was accepted");
        }
    }

    #[test]
    fn resolve_normalises_and_refuses_to_climb_above_root() {
        assert_eq!(
            resolve(Path::new("/a/b/link"), Path::new("../c/./d")),
            Some(PathBuf::from("/a/c/d"))
        );
        assert_eq!(
            resolve(Path::new("/a/link"), Path::new("/x/y")),
            Some(PathBuf::from("/x/y"))
        );
        assert_eq!(resolve(Path::new("/link"), Path::new("../../x")), None);
    }
}
