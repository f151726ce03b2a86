//! A workspace copied into a sandbox on another machine and back: the tar
//! archive that goes in (`pack`) and the one that comes back, applied to the
//! host directory (`apply`), so the caller's bounded, all-or-nothing merge of
//! the turn's layer sees the same tree a bind mount would have left.
//!
//! Owns: what an archive from a sandbox may hold (directories, regular files,
//! symlinks as links, and hardlinks to a file earlier in the same archive,
//! kept as copies), its bounds (bytes, entries, depth), and writing it into
//! the host directory.
//!
//! Must never: write outside the host directory, write through a link (a
//! symlink the sandbox made is a link in the copy, never a way out of it),
//! keep a device, fifo or socket, or take more of an archive than its
//! bounds. Everything the archive holds is checked before the first byte is
//! written; an archive that fails a check changes nothing.
//! Nothing else writes the host directory while a session runs (the turn's
//! file tools run between commands, on the same task), so a parent checked
//! once stays what it was.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::sandbox::SandboxError;

/// What one synced workspace may hold (the layer's own bounds).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncBounds {
    pub bytes: u64,
    pub entries: u64,
    pub depth: usize,
}

impl SyncBounds {
    /// The most an archive of a tree within these bounds can take: each
    /// entry's header blocks (a long name adds two more) and padding.
    pub(crate) fn archive_bytes(&self) -> u64 {
        self.bytes
            .saturating_add(self.entries.saturating_add(1).saturating_mul(3 * 1024))
            .saturating_add(64 * 1024)
    }
}

/// What an apply changed in the host directory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    pub written: u64,
    pub removed: u64,
}

fn io_err(path: &Path, source: io::Error) -> SandboxError {
    SandboxError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn refused(why: String) -> SandboxError {
    SandboxError::Engine(format!(
        "the sandbox's workspace was not taken back: {why}; nothing it wrote was kept"
    ))
}

/// The quota as the operator set it (`sandbox.workspace_mb`).
fn quota(bounds: &SyncBounds) -> String {
    format!(
        "past its quota (sandbox.workspace_mb = {})",
        bounds.bytes >> 20
    )
}

/// Writes `local` as a tar archive into `out`: directories, regular files
/// and symlinks (as links), owned by `owner` inside, permission bits only.
/// Anything else (a fifo, a socket) stays behind.
pub(crate) fn pack(
    local: &Path,
    owner: (u32, u32),
    prefix: &Path,
    out: &mut File,
) -> Result<(), SandboxError> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let walk = walkdir::WalkDir::new(local)
        .follow_links(false)
        .min_depth(1)
        .sort_by_file_name();
    for entry in walk {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(local).to_path_buf();
            io_err(&path, io::Error::from(e))
        })?;
        let rel = entry
            .path()
            .strip_prefix(local)
            .map_err(|e| refused(format!("{}: {e}", entry.path().display())))?;
        let name = prefix.join(rel);
        let meta = entry
            .path()
            .symlink_metadata()
            .map_err(|e| io_err(entry.path(), e))?;
        let mut header = tar::Header::new_gnu();
        header.set_uid(u64::from(owner.0));
        header.set_gid(u64::from(owner.1));
        header.set_mode(meta.mode() & 0o777);
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        let ft = meta.file_type();
        let appended = if ft.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder.append_data(&mut header, &name, io::empty())
        } else if ft.is_file() {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(entry.path())
                .map_err(|e| io_err(entry.path(), e))?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            // Exactly the length the header says, even if the file grew.
            builder.append_data(&mut header, &name, file.take(meta.len()))
        } else if ft.is_symlink() {
            let target = fs::read_link(entry.path()).map_err(|e| io_err(entry.path(), e))?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, &name, &target)
        } else {
            tracing::debug!(path = %entry.path().display(), "not a file, directory or link; not synced");
            continue;
        };
        appended.map_err(|e| io_err(entry.path(), e))?;
    }
    builder
        .into_inner()
        .and_then(Write::flush)
        .map_err(|e| io_err(local, e))
}

/// One checked entry of an archive from a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    Dir {
        mode: u32,
    },
    /// Its bytes are `size` bytes at `at` in the archive file.
    File {
        mode: u32,
        at: u64,
        size: u64,
    },
    Link {
        target: PathBuf,
    },
}

/// The archive's entries, checked: relative paths of normal components
/// only, every parent a directory of the same archive, only directories,
/// files and symlinks (a hardlink becomes a copy of the file it names),
/// within `bounds`.
fn check(
    archive: &mut File,
    bounds: &SyncBounds,
) -> Result<BTreeMap<PathBuf, Wanted>, SandboxError> {
    archive
        .seek(SeekFrom::Start(0))
        .map_err(|e| refused(format!("rewinding the archive: {e}")))?;
    let mut wanted: BTreeMap<PathBuf, Wanted> = BTreeMap::new();
    let mut bytes = 0u64;
    let mut tar = tar::Archive::new(&mut *archive);
    let entries = tar
        .entries()
        .map_err(|e| refused(format!("an unreadable archive: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| refused(format!("an unreadable archive entry: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| refused(format!("an entry without a readable name: {e}")))?
            .into_owned();
        let rel = relative(&raw)?;
        if rel.as_os_str().is_empty() {
            continue; // the workspace's own directory
        }
        if rel.components().count() > bounds.depth {
            return Err(refused(format!(
                "{} is nested deeper than workspace.max_depth = {}",
                rel.display(),
                bounds.depth
            )));
        }
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !matches!(wanted.get(parent), Some(Wanted::Dir { .. })) {
                return Err(refused(format!(
                    "{} is not inside a directory of the workspace",
                    rel.display()
                )));
            }
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let kind = entry.header().entry_type();
        let item = match kind {
            tar::EntryType::Directory => Wanted::Dir { mode },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.size();
                bytes = bytes.saturating_add(size);
                Wanted::File {
                    mode,
                    at: entry.raw_file_position(),
                    size,
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| refused(format!("{}: an unreadable link: {e}", rel.display())))?
                    .ok_or_else(|| refused(format!("{}: a link to nothing", rel.display())))?
                    .into_owned();
                Wanted::Link { target }
            }
            tar::EntryType::Link => {
                // A hardlink names a file earlier in the archive: it is kept
                // as a copy of that file, never as a second name of it.
                let target = entry
                    .link_name()
                    .map_err(|e| refused(format!("{}: an unreadable link: {e}", rel.display())))?
                    .ok_or_else(|| refused(format!("{}: a link to nothing", rel.display())))?;
                let target = relative(&target)?;
                match wanted.get(&target) {
                    Some(Wanted::File { at, size, .. }) => {
                        bytes = bytes.saturating_add(*size);
                        Wanted::File {
                            mode,
                            at: *at,
                            size: *size,
                        }
                    }
                    _ => {
                        return Err(refused(format!(
                            "{} is a hardlink to {}, which is not a file of the workspace",
                            rel.display(),
                            target.display()
                        )))
                    }
                }
            }
            other => {
                return Err(refused(format!(
                    "{} is a {other:?}; only files, directories and links are kept",
                    rel.display()
                )))
            }
        };
        if wanted.insert(rel.clone(), item).is_some() {
            return Err(refused(format!("{} appears twice", rel.display())));
        }
        if wanted.len() as u64 > bounds.entries {
            return Err(refused(format!(
                "more entries than workspace.max_entries = {}",
                bounds.entries
            )));
        }
        if bytes > bounds.bytes {
            return Err(refused(format!(
                "more than {} bytes of files, {}",
                bounds.bytes,
                quota(bounds)
            )));
        }
    }
    Ok(wanted)
}

/// The entry's path below the workspace: `./`, `work/` or nothing before
/// it, then normal components only.
fn relative(raw: &Path) -> Result<PathBuf, SandboxError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            _ => {
                return Err(refused(format!(
                    "the entry {} leaves the workspace",
                    raw.display()
                )))
            }
        }
    }
    Ok(out)
}

/// Makes `local` hold exactly what `archive` (a tar of the sandbox's
/// working directory, as `GET /containers/{id}/archive` gives it) holds:
/// changed files rewritten, missing ones removed, identical ones untouched
/// (so a layer over `local` records only what the sandbox changed).
pub(crate) fn apply(
    archive: &mut File,
    local: &Path,
    bounds: &SyncBounds,
) -> Result<Applied, SandboxError> {
    let wanted = check(archive, bounds)?;
    let mut done = Applied::default();
    // One pair of buffers for every comparison of this apply.
    let mut bufs = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    // Parents sort before their children, so every parent is a directory
    // of ours by the time a child is written.
    for (rel, item) in &wanted {
        let path = local.join(rel);
        let have = match path.symlink_metadata() {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path, e)),
        };
        if same(archive, &path, have.as_ref(), item, &mut bufs)? {
            continue;
        }
        if let (Some(m), Wanted::Dir { mode }) = (&have, item) {
            if m.is_dir() {
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
                    .map_err(|e| io_err(&path, e))?;
                continue;
            }
        }
        if let Some(m) = &have {
            remove(&path, m.is_dir())?;
        }
        match item {
            Wanted::Dir { mode } => {
                fs::create_dir(&path).map_err(|e| io_err(&path, e))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
                    .map_err(|e| io_err(&path, e))?;
            }
            Wanted::File { mode, at, size } => {
                // O_EXCL | O_NOFOLLOW: a name that appeared since is an
                // error, never a way through.
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(*mode)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|e| io_err(&path, e))?;
                archive
                    .seek(SeekFrom::Start(*at))
                    .map_err(|e| io_err(&path, e))?;
                let copied = io::copy(&mut (&mut *archive).take(*size), &mut out)
                    .map_err(|e| io_err(&path, e))?;
                if copied != *size {
                    return Err(refused(format!("{} is cut short", rel.display())));
                }
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
                    .map_err(|e| io_err(&path, e))?;
            }
            Wanted::Link { target } => {
                std::os::unix::fs::symlink(target, &path).map_err(|e| io_err(&path, e))?;
            }
        }
        done.written += 1;
    }
    // What the sandbox removed: anything here the archive does not hold.
    let mut walk = walkdir::WalkDir::new(local)
        .follow_links(false)
        .min_depth(1)
        .into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(local).to_path_buf();
            io_err(&path, io::Error::from(e))
        })?;
        let rel = entry.path().strip_prefix(local).unwrap_or(entry.path());
        if wanted.contains_key(rel) {
            continue;
        }
        // Not followed (follow_links is off): a link is a link here.
        let is_dir = entry.file_type().is_dir();
        if is_dir {
            walk.skip_current_dir();
        }
        remove(entry.path(), is_dir)?;
        done.removed += 1;
    }
    Ok(done)
}

/// Whether the host's entry already is what the archive holds.
fn same(
    archive: &mut File,
    path: &Path,
    have: Option<&fs::Metadata>,
    item: &Wanted,
    (a, b): &mut (Vec<u8>, Vec<u8>),
) -> Result<bool, SandboxError> {
    let Some(m) = have else { return Ok(false) };
    match item {
        Wanted::Dir { mode } => Ok(m.is_dir() && m.mode() & 0o777 == *mode),
        Wanted::Link { target } => Ok(m.file_type().is_symlink()
            && fs::read_link(path).map_err(|e| io_err(path, e))? == *target),
        Wanted::File { mode, at, size } => {
            if !m.is_file() || m.len() != *size || m.mode() & 0o777 != *mode {
                return Ok(false);
            }
            let mut ours = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| io_err(path, e))?;
            archive
                .seek(SeekFrom::Start(*at))
                .map_err(|e| io_err(path, e))?;
            let mut theirs = (&mut *archive).take(*size);
            loop {
                let n = theirs.read(a).map_err(|e| io_err(path, e))?;
                if n == 0 {
                    return Ok(true);
                }
                ours.read_exact(&mut b[..n]).map_err(|e| io_err(path, e))?;
                if a[..n] != b[..n] {
                    return Ok(false);
                }
            }
        }
    }
}

/// Removes one entry without following it: a directory with what it holds
/// (`remove_dir_all` never follows a link inside), anything else by name.
fn remove(path: &Path, is_dir: bool) -> Result<(), SandboxError> {
    if is_dir {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
    .map_err(|e| io_err(path, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    const BOUNDS: SyncBounds = SyncBounds {
        bytes: 1 << 20,
        entries: 100,
        depth: 8,
    };

    /// An archive as an engine gives it back: `./` first, then entries.
    fn archive(build: impl FnOnce(&mut tar::Builder<&mut File>)) -> File {
        let mut f = tempfile::tempfile().unwrap();
        {
            let mut b = tar::Builder::new(&mut f);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, "./", io::empty()).unwrap();
            build(&mut b);
            b.finish().unwrap();
        }
        f
    }

    fn file(b: &mut tar::Builder<&mut File>, name: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        b.append_data(&mut h, name, body).unwrap();
    }

    fn dir(b: &mut tar::Builder<&mut File>, name: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, name, io::empty()).unwrap();
    }

    fn link(b: &mut tar::Builder<&mut File>, kind: tar::EntryType, name: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, name, target).unwrap();
    }

    /// A raw header with any name at all (the builder refuses `..`).
    fn raw(b: &mut tar::Builder<&mut File>, kind: tar::EntryType, name: &[u8], body: &[u8]) {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append(&h, body).unwrap();
    }

    fn listing(root: &Path) -> Vec<String> {
        walkdir::WalkDir::new(root)
            .min_depth(1)
            .sort_by_file_name()
            .into_iter()
            .map(|e| {
                let e = e.unwrap();
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                if e.path_is_symlink() {
                    format!("{rel} -> {}", fs::read_link(e.path()).unwrap().display())
                } else if e.file_type().is_dir() {
                    format!("{rel}/")
                } else {
                    format!("{rel} = {}", fs::read_to_string(e.path()).unwrap())
                }
            })
            .collect()
    }

    #[test]
    fn a_packed_tree_applied_elsewhere_is_the_same_tree_links_kept_as_links() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir(src.path().join("notes")).unwrap();
        fs::write(src.path().join("notes/a.md"), "alpha").unwrap();
        fs::write(src.path().join("AGENTS.md"), "be kind").unwrap();
        symlink("/etc/passwd", src.path().join("outside")).unwrap();
        let mut tar = tempfile::tempfile().unwrap();
        pack(src.path(), (65534, 65534), Path::new(""), &mut tar).unwrap();
        let dst = tempfile::tempdir().unwrap();
        let done = apply(&mut tar, dst.path(), &BOUNDS).unwrap();
        assert_eq!(listing(dst.path()), listing(src.path()));
        assert_eq!(done.written, 4);
        // Applying the same archive again changes nothing.
        let again = apply(&mut tar, dst.path(), &BOUNDS).unwrap();
        assert_eq!(again, Applied::default());
    }

    #[test]
    fn apply_rewrites_changed_files_removes_missing_ones_and_leaves_the_rest() {
        let dst = tempfile::tempdir().unwrap();
        fs::write(dst.path().join("same.txt"), "same").unwrap();
        fs::write(dst.path().join("changed.txt"), "old").unwrap();
        fs::create_dir(dst.path().join("gone")).unwrap();
        fs::write(dst.path().join("gone/x"), "x").unwrap();
        fs::write(dst.path().join("gone.txt"), "bye").unwrap();
        let before = fs::metadata(dst.path().join("same.txt")).unwrap().ino();
        let mut tar = archive(|b| {
            file(b, "./same.txt", b"same");
            file(b, "./changed.txt", b"new");
            file(b, "./added.txt", b"hello");
        });
        let done = apply(&mut tar, dst.path(), &BOUNDS).unwrap();
        assert_eq!(
            listing(dst.path()),
            vec!["added.txt = hello", "changed.txt = new", "same.txt = same"]
        );
        assert_eq!(
            done,
            Applied {
                written: 2,
                removed: 2
            }
        );
        assert_eq!(
            fs::metadata(dst.path().join("same.txt")).unwrap().ino(),
            before,
            "an identical file is left alone"
        );
    }

    #[test]
    fn a_link_the_sandbox_made_is_never_written_through() {
        let outside = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        // The link first, then a file "inside" it: refused before any write.
        let target = outside.path().display().to_string();
        let mut tar = archive(|b| {
            link(b, tar::EntryType::Symlink, "./escape", &target);
            file(b, "./escape/planted", b"pwned");
        });
        let err = apply(&mut tar, dst.path(), &BOUNDS).unwrap_err();
        assert!(err.to_string().contains("not inside a directory"), "{err}");
        assert!(!outside.path().join("planted").exists());
        assert_eq!(listing(dst.path()), Vec::<String>::new(), "nothing written");
        // A link already in the host directory is replaced, not followed.
        symlink(outside.path().join("victim"), dst.path().join("f")).unwrap();
        fs::write(outside.path().join("victim"), "host data").unwrap();
        let mut tar = archive(|b| file(b, "./f", b"sandbox data"));
        apply(&mut tar, dst.path(), &BOUNDS).unwrap();
        assert_eq!(
            fs::read_to_string(outside.path().join("victim")).unwrap(),
            "host data"
        );
        assert_eq!(listing(dst.path()), vec!["f = sandbox data"]);
    }

    #[test]
    fn entries_that_leave_the_workspace_or_are_not_files_are_refused_whole() {
        type Build = Box<dyn Fn(&mut tar::Builder<&mut File>)>;
        let cases: Vec<(&str, Build)> = vec![
            (
                "leaves",
                Box::new(|b| raw(b, tar::EntryType::Regular, b"../up.txt", b"x")),
            ),
            (
                "leaves",
                Box::new(|b| raw(b, tar::EntryType::Regular, b"/etc/cron.d/x", b"x")),
            ),
            (
                "Fifo",
                Box::new(|b| raw(b, tar::EntryType::Fifo, b"./p", b"")),
            ),
            (
                "Char",
                Box::new(|b| raw(b, tar::EntryType::Char, b"./tty", b"")),
            ),
            (
                "leaves",
                Box::new(|b| link(b, tar::EntryType::Link, "./h", "/etc/passwd")),
            ),
            (
                "not a file of the workspace",
                Box::new(|b| link(b, tar::EntryType::Link, "./h", "./missing")),
            ),
            (
                "appears twice",
                Box::new(|b| {
                    file(b, "./a", b"1");
                    file(b, "./a", b"2");
                }),
            ),
        ];
        for (why, build) in cases {
            let dst = tempfile::tempdir().unwrap();
            fs::write(dst.path().join("keep"), "kept").unwrap();
            let mut tar = archive(|b| {
                file(b, "./new", b"n");
                build(b);
            });
            let err = apply(&mut tar, dst.path(), &BOUNDS).unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
            assert_eq!(listing(dst.path()), vec!["keep = kept"], "{why}");
        }
    }

    #[test]
    fn a_hardlink_to_a_file_of_the_archive_is_an_independent_copy() {
        let dst = tempfile::tempdir().unwrap();
        let mut tar = archive(|b| {
            file(b, "./a", b"shared");
            link(b, tar::EntryType::Link, "./b", "./a");
        });
        apply(&mut tar, dst.path(), &BOUNDS).unwrap();
        assert_eq!(listing(dst.path()), vec!["a = shared", "b = shared"]);
        let (a, b) = (
            fs::metadata(dst.path().join("a")).unwrap(),
            fs::metadata(dst.path().join("b")).unwrap(),
        );
        assert_ne!(a.ino(), b.ino());
    }

    #[test]
    fn an_archive_past_the_bounds_is_refused_before_any_write() {
        let tight = SyncBounds {
            bytes: 10,
            entries: 3,
            depth: 2,
        };
        let too_big = archive(|b| {
            file(b, "./a", b"12345");
            file(b, "./b", b"678901");
        });
        let too_many = archive(|b| {
            for n in ["./a", "./b", "./c", "./d"] {
                file(b, n, b"");
            }
        });
        let too_deep = archive(|b| {
            dir(b, "./a/");
            dir(b, "./a/b/");
            file(b, "./a/b/c", b"");
        });
        for (mut tar, why) in [
            (too_big, "bytes"),
            (too_many, "workspace.max_entries = 3"),
            (too_deep, "workspace.max_depth = 2"),
        ] {
            let dst = tempfile::tempdir().unwrap();
            let err = apply(&mut tar, dst.path(), &tight).unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
            assert_eq!(listing(dst.path()), Vec::<String>::new(), "{why}");
        }
    }
}
