//! Bounded, iterative walks over a workspace tree: measuring it
//! ([`usage`]), copying it ([`copy_tree`]) and removing it ([`remove_tree`]).
//!
//! A workspace is shaped by the agent, so by whoever chats with it: a turn
//! can make a tree 8,000 directories deep or 200,000 entries wide in a
//! second. A walk that recursed once per level overflowed the host's stack
//! and aborted the whole process, so every walk here keeps its own stack on
//! the heap, refuses a tree past [`WalkLimits`] with a sentence (measure and
//! copy), and holds one descriptor per level it is in, never one per entry.
//! Removal is the exception to the limits (whatever a turn made must be
//! removable): it holds a single descriptor and climbs back with `..`,
//! checking each step against the device and inode it came from.
//!
//! The cost a workspace is charged ([`Usage::cost`]) is what it would take
//! on the host's disk at the most: every entry (file, directory, link) a
//! 4 KiB block, and every regular file its apparent size rounded up to
//! 4 KiB. Apparent, not allocated: a sparse file the merge would write out
//! dense is charged its full length; each name of a hard link is charged as
//! the copy the merge makes of it.
//!
//! Must never: recurse, follow a symbolic link, open anything but through
//! [`WorkspaceRoot`]'s link-free building blocks, or leave the tree it was
//! given (removal climbs only to the directory it descended from).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;

use super::safe::{EntryKind, WorkspaceRoot};

/// What every entry of a workspace is charged, and the unit file sizes are
/// rounded up to.
pub const BLOCK: u64 = 4096;

/// How large a tree a walk accepts (`workspace.max_depth`,
/// `workspace.max_entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkLimits {
    /// Directories nested below the root, at most.
    pub max_depth: usize,
    /// Entries (files, directories, links, anything) in the whole tree.
    pub max_entries: u64,
}

impl Default for WalkLimits {
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_entries: 100_000,
        }
    }
}

impl From<&crate::config::WorkspaceConfig> for WalkLimits {
    fn from(c: &crate::config::WorkspaceConfig) -> Self {
        Self {
            max_depth: c.max_depth,
            max_entries: c.max_entries,
        }
    }
}

/// What a tree holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Apparent sizes of its regular files, each name counted.
    pub bytes: u64,
    /// Entries below the root.
    pub entries: u64,
    /// What it is charged against the quota (see the module header).
    pub cost: u64,
}

/// The charge of one regular file of `size` bytes (its entry included).
pub fn file_cost(size: u64) -> u64 {
    BLOCK.saturating_add(size.div_ceil(BLOCK).saturating_mul(BLOCK))
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error(
        "the workspace is nested deeper than workspace.max_depth = {limit} directories \
         (at {at:?})"
    )]
    TooDeep { limit: usize, at: String },
    #[error("the workspace holds more than workspace.max_entries = {limit} entries")]
    TooMany { limit: u64 },
    #[error("{what} {at:?}: {source}")]
    Io {
        what: &'static str,
        at: String,
        #[source]
        source: io::Error,
    },
}

impl WalkError {
    fn io(what: &'static str, at: &RelPath, source: io::Error) -> Self {
        Self::Io {
            what,
            at: at.shown(),
            source,
        }
    }
}

impl From<WalkError> for io::Error {
    fn from(e: WalkError) -> Self {
        match e {
            WalkError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// A path relative to the walk's root, for messages only.
#[derive(Debug, Clone, Default)]
struct RelPath(Vec<OsString>);

impl RelPath {
    fn child(&self, name: &OsStr) -> Self {
        let mut v = self.0.clone();
        v.push(name.to_owned());
        Self(v)
    }

    /// The whole path, `/`-separated, each name as lossy UTF-8 (how the
    /// shadow diff names a workspace file).
    fn joined(&self) -> String {
        let names: Vec<String> = self
            .0
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        names.join("/")
    }

    /// At most 200 characters: a deep path is shown by its end.
    fn shown(&self) -> String {
        let joined: Vec<u8> = self
            .0
            .iter()
            .map(|c| c.as_bytes())
            .collect::<Vec<_>>()
            .join(&b'/');
        let s = String::from_utf8_lossy(&joined);
        let count = s.chars().count();
        if count <= 200 {
            return s.into_owned();
        }
        let tail: String = s.chars().skip(count - 200).collect();
        format!("…{tail}")
    }
}

/// Counts one directory's entries into `u`; returns its subdirectories.
fn account(
    dir: &WorkspaceRoot,
    at: &RelPath,
    limits: WalkLimits,
    u: &mut Usage,
) -> Result<Vec<OsString>, WalkError> {
    let mut subdirs = Vec::new();
    for e in dir
        .entries()
        .map_err(|err| WalkError::io("listing", at, err))?
    {
        u.entries += 1;
        if u.entries > limits.max_entries {
            return Err(WalkError::TooMany {
                limit: limits.max_entries,
            });
        }
        match e.kind {
            EntryKind::File => {
                u.bytes = u.bytes.saturating_add(e.size);
                u.cost = u.cost.saturating_add(file_cost(e.size));
            }
            EntryKind::Dir => {
                u.cost = u.cost.saturating_add(BLOCK);
                subdirs.push(e.name);
            }
            EntryKind::Symlink | EntryKind::Other => u.cost = u.cost.saturating_add(BLOCK),
        }
    }
    subdirs.reverse();
    Ok(subdirs)
}

/// Measures everything below `root`, refusing a tree past `limits`.
pub fn usage(root: &WorkspaceRoot, limits: WalkLimits) -> Result<Usage, WalkError> {
    let mut u = Usage::default();
    let top = RelPath::default();
    let first = account(root, &top, limits, &mut u)?;
    // One frame per level: its directory, where it is, what is left to visit.
    let mut stack: Vec<(Option<WorkspaceRoot>, RelPath, Vec<OsString>)> = vec![(None, top, first)];
    loop {
        let depth = stack.len();
        let Some((dir, at, pending)) = stack.last_mut() else {
            break;
        };
        let Some(name) = pending.pop() else {
            stack.pop();
            continue;
        };
        let child_at = at.child(&name);
        if depth > limits.max_depth {
            return Err(WalkError::TooDeep {
                limit: limits.max_depth,
                at: child_at.shown(),
            });
        }
        let parent = dir.as_ref().unwrap_or(root);
        let child = match parent.child_dir(&name) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(WalkError::io("opening", &child_at, e)),
        };
        let subdirs = account(&child, &child_at, limits, &mut u)?;
        stack.push((Some(child), child_at, subdirs));
    }
    Ok(u)
}

/// What a copy shows its caller as it goes, so a caller that needs each
/// file's content (the shadow snapshot's hashes and texts, issue 32) reads
/// every file once, in the copy, instead of again afterwards.
pub trait CopyTap {
    /// A regular file at `rel` (its path in the tree, `/`-separated, each
    /// name as lossy UTF-8) starts; its bytes follow in order.
    fn file(&mut self, rel: &str);
    /// A buffer for the copy to read the file's next bytes into: one the
    /// tap is done with (its length as it was), or a new one; the copy
    /// sizes it.
    fn buffer(&mut self) -> Vec<u8>;
    /// The next bytes of that file, `buf[..len]`, as the copy wrote them;
    /// the buffer is the tap's from here (kept or handed out again by
    /// [`CopyTap::buffer`]), so no byte is copied twice to reach it.
    fn bytes(&mut self, buf: Vec<u8>, len: usize);
    /// That file is copied whole.
    fn file_done(&mut self);
    /// A symbolic link at `rel`, copied as a link to `target`.
    fn symlink(&mut self, rel: &str, target: &OsStr);
}

/// The most a tapped copy reads at once.
const TAP_CHUNK: usize = 256 * 1024;

/// Copies the whole tree of `src` into `dst` (an empty directory):
/// directories, regular files (mode and owner kept, setuid and setgid
/// dropped) and symlinks as symlinks (their target is data, never resolved).
/// FIFOs, sockets and devices are dropped. Refuses a tree past `limits`
/// (what was copied so far stays in `dst`, for its owner to remove).
/// Returns the bytes copied.
pub fn copy_tree(
    src: &WorkspaceRoot,
    dst: &WorkspaceRoot,
    limits: WalkLimits,
) -> Result<u64, WalkError> {
    copy_tree_tapped(src, dst, limits, None)
}

/// [`copy_tree`], showing `tap` every file's bytes and every link as they
/// are copied. Without a tap a file is copied by the kernel
/// (`copy_file_range`, through `io::copy`); with one, through a buffer the
/// tap reads.
pub fn copy_tree_tapped(
    src: &WorkspaceRoot,
    dst: &WorkspaceRoot,
    limits: WalkLimits,
    mut tap: Option<&mut dyn CopyTap>,
) -> Result<u64, WalkError> {
    struct Frame {
        src: Option<WorkspaceRoot>,
        dst: Option<WorkspaceRoot>,
        at: RelPath,
        pending: Vec<super::safe::Entry>,
        /// The directory's own metadata, applied once its children are in
        /// (writing a child would change its mtime again).
        meta: Option<super::safe::Entry>,
    }
    let listing = |dir: &WorkspaceRoot, at: &RelPath, count: &mut u64| {
        let mut entries = dir.entries().map_err(|e| WalkError::io("listing", at, e))?;
        *count += entries.len() as u64;
        if *count > limits.max_entries {
            return Err(WalkError::TooMany {
                limit: limits.max_entries,
            });
        }
        entries.reverse();
        Ok(entries)
    };
    let mut count = 0u64;
    let mut bytes = 0u64;
    // The buffer read into and not yet handed to the tap (the end of a
    // file reads nothing into it): the next file's first.
    let mut spare = Vec::new();
    let top = RelPath::default();
    let first = listing(src, &top, &mut count)?;
    let mut stack = vec![Frame {
        src: None,
        dst: None,
        at: top,
        pending: first,
        meta: None,
    }];
    loop {
        let depth = stack.len();
        let Some(frame) = stack.last_mut() else {
            break;
        };
        let Some(e) = frame.pending.pop() else {
            if let Some(f) = stack.pop() {
                if let (Some(d), Some(m)) = (f.dst.as_ref(), f.meta.as_ref()) {
                    d.set_meta(None, m);
                }
            }
            continue;
        };
        let from = frame.src.as_ref().unwrap_or(src);
        let to = frame.dst.as_ref().unwrap_or(dst);
        let at = frame.at.child(&e.name);
        match e.kind {
            EntryKind::Dir => {
                if depth > limits.max_depth {
                    return Err(WalkError::TooDeep {
                        limit: limits.max_depth,
                        at: at.shown(),
                    });
                }
                to.mkdir(&e.name, 0o700)
                    .map_err(|err| WalkError::io("creating", &at, err))?;
                let s = from
                    .child_dir(&e.name)
                    .map_err(|err| WalkError::io("opening", &at, err))?;
                let d = to
                    .child_dir(&e.name)
                    .map_err(|err| WalkError::io("opening the copy of", &at, err))?;
                let pending = listing(&s, &at, &mut count)?;
                stack.push(Frame {
                    src: Some(s),
                    dst: Some(d),
                    at,
                    pending,
                    meta: Some(e),
                });
            }
            EntryKind::File => {
                let f = from
                    .child_file(&e.name)
                    .map_err(|err| WalkError::io("opening", &at, err))?;
                let mut t = to
                    .create_new(&e.name, 0o600)
                    .map_err(|err| WalkError::io("creating", &at, err))?;
                bytes += match tap.as_deref_mut() {
                    None => io::copy(&mut &f, &mut t),
                    Some(tap) => copy_through(&f, &mut t, &at, tap, &mut spare),
                }
                .map_err(|err| WalkError::io("copying", &at, err))?;
                to.set_meta(Some(&t), &e);
            }
            EntryKind::Symlink => {
                let target = from
                    .readlink(&e.name)
                    .map_err(|err| WalkError::io("reading the link", &at, err))?;
                if let Some(tap) = tap.as_deref_mut() {
                    tap.symlink(&at.joined(), &target);
                }
                to.symlink(&target, &e.name)
                    .map_err(|err| WalkError::io("creating the link", &at, err))?;
            }
            EntryKind::Other => {}
        }
    }
    Ok(bytes)
}

/// One file through the tap's buffers: each chunk is read into one,
/// written to the copy, and handed to the tap. `spare` is a buffer read
/// into but not handed over (a file's end), kept for the next file.
fn copy_through(
    from: &std::fs::File,
    to: &mut std::fs::File,
    at: &RelPath,
    tap: &mut dyn CopyTap,
    spare: &mut Vec<u8>,
) -> io::Result<u64> {
    use std::io::{Read, Write};
    tap.file(&at.joined());
    let mut total = 0u64;
    let mut reader = from;
    loop {
        if spare.is_empty() {
            *spare = tap.buffer();
            // A buffer new to the tap is zeroed once; a returned one keeps
            // its length and is only ever read into.
            spare.resize(TAP_CHUNK, 0);
        }
        let n = match reader.read(spare.as_mut_slice()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&spare[..n])?;
        tap.bytes(std::mem::take(spare), n);
        total += n as u64;
    }
    tap.file_done();
    Ok(total)
}

/// Removes `name` from `parent`: a file or link is unlinked, a directory is
/// emptied and removed however deep or wide it is. A missing name is
/// `NotFound`.
pub fn remove_tree(parent: &WorkspaceRoot, name: &OsStr) -> io::Result<()> {
    let Some(top) = parent.stat_entry(name)? else {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    };
    if top.kind != EntryKind::Dir {
        return parent.unlink(name, false);
    }
    /// A directory being emptied: its name in its parent, its identity (so
    /// climbing back with `..` is checked), the subdirectories left.
    struct Level {
        name: OsString,
        id: (u64, u64),
        subdirs: Vec<OsString>,
    }
    let mut cur = parent.child_dir(name)?;
    let mut levels = vec![Level {
        name: name.to_owned(),
        id: cur.identity()?,
        subdirs: clear_files(&cur)?,
    }];
    while let Some(level) = levels.last_mut() {
        if let Some(sub) = level.subdirs.pop() {
            let child = match cur.child_dir(&sub) {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let id = child.identity()?;
            let subdirs = clear_files(&child)?;
            cur = child;
            levels.push(Level {
                name: sub,
                id,
                subdirs,
            });
            continue;
        }
        let Some(done) = levels.pop() else { break };
        let Some(up) = levels.last() else {
            return parent.unlink(&done.name, true);
        };
        let above = cur.dotdot()?;
        if above.identity()? != up.id {
            return Err(io::Error::other(
                "the tree changed while it was being removed (`..` is not the directory it was entered from)",
            ));
        }
        above.unlink(&done.name, true)?;
        cur = above;
    }
    Ok(())
}

/// Unlinks every non-directory of `dir`; returns its subdirectories.
fn clear_files(dir: &WorkspaceRoot) -> io::Result<Vec<OsString>> {
    let mut subdirs = Vec::new();
    for e in dir.entries()? {
        match e.kind {
            EntryKind::Dir => subdirs.push(e.name),
            _ => match dir.unlink(&e.name, false) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                _ => {}
            },
        }
    }
    Ok(subdirs)
}

/// Removes a directory (or file) the host built the path of itself, such as
/// a tombstone or a scratch directory, however deep the tree below it is.
/// A missing path is `Ok(false)`.
pub fn remove_path(path: &std::path::Path) -> io::Result<bool> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "{} has no parent to remove it from",
            path.display()
        )));
    };
    let parent = WorkspaceRoot::open(parent).map_err(io::Error::other)?;
    match remove_tree(&parent, name) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::path::Path;

    /// `depth` nested directories named `d` below `root`, made from
    /// descriptors (a path that deep is far past PATH_MAX).
    pub(crate) fn deep_tree(root: &Path, depth: usize) {
        let c = CString::new(root.as_os_str().as_bytes()).unwrap();
        let mut fd = unsafe {
            OwnedFd::from_raw_fd(libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY))
        };
        let d = CString::new("d").unwrap();
        for _ in 0..depth {
            assert_eq!(
                unsafe { libc::mkdirat(fd.as_raw_fd(), d.as_ptr(), 0o755) },
                0
            );
            let next = unsafe {
                libc::openat(
                    fd.as_raw_fd(),
                    d.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                )
            };
            assert!(next >= 0);
            fd = unsafe { OwnedFd::from_raw_fd(next) };
        }
        let f = CString::new("bottom.txt").unwrap();
        let file = unsafe {
            libc::openat(
                fd.as_raw_fd(),
                f.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY,
                0o644,
            )
        };
        assert!(file >= 0);
        unsafe { libc::close(file) };
    }

    /// `n` empty files spread over directories of 1,000.
    pub(crate) fn wide_tree(root: &Path, n: usize) {
        for i in 0..n {
            let dir = root.join(format!("w{}", i / 1000));
            if i % 1000 == 0 {
                std::fs::create_dir(&dir).unwrap();
            }
            std::fs::File::create(dir.join(i.to_string())).unwrap();
        }
    }

    /// Runs `f` on a thread with a stack far smaller than one frame per
    /// level of a 10,000-deep tree would need: a recursive walk overflows.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_tree_ten_thousand_deep_is_refused_by_measure_and_copy_and_removed_whole() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        deep_tree(&ws, 10_000);
        let copy = t.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        let (ws2, copy2) = (ws.clone(), copy.clone());
        let (measured, copied, removed) = on_small_stack(move || {
            let root = WorkspaceRoot::open(&ws2).unwrap();
            let measured = usage(&root, WalkLimits::default());
            let copied = copy_tree(
                &root,
                &WorkspaceRoot::open(&copy2).unwrap(),
                WalkLimits::default(),
            );
            let removed = remove_path(&ws2);
            (measured, copied, removed)
        });
        assert!(
            matches!(measured, Err(WalkError::TooDeep { limit: 64, .. })),
            "{measured:?}"
        );
        let Err(e) = copied else {
            panic!("a 10,000-deep tree was copied")
        };
        assert!(e.to_string().contains("workspace.max_depth = 64"), "{e}");
        assert!(removed.unwrap());
        assert!(!ws.exists());
        // What the refused copy made is removable too.
        assert!(on_small_stack(move || remove_path(&copy)).unwrap());
    }

    #[test]
    fn a_tree_of_two_hundred_thousand_entries_is_refused_and_removed_whole() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        wide_tree(&ws, 200_000);
        let root = WorkspaceRoot::open(&ws).unwrap();
        assert!(matches!(
            usage(&root, WalkLimits::default()),
            Err(WalkError::TooMany { limit: 100_000 })
        ));
        let copy = t.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        assert!(matches!(
            copy_tree(
                &root,
                &WorkspaceRoot::open(&copy).unwrap(),
                WalkLimits::default()
            ),
            Err(WalkError::TooMany { .. })
        ));
        let wide = WalkLimits {
            max_depth: 64,
            max_entries: 300_000,
        };
        let u = usage(&root, wide).unwrap();
        assert_eq!(u.entries, 200_200);
        assert_eq!(u.cost, 200_200 * BLOCK);
        assert!(remove_path(&ws).unwrap());
        assert!(remove_path(&copy).unwrap());
        assert!(!ws.exists() && !copy.exists());
    }

    #[test]
    fn sparse_files_and_hard_links_are_charged_at_full_length_for_each_name() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let sparse = std::fs::File::create(ws.join("sparse")).unwrap();
        sparse.set_len(50 << 30).unwrap();
        std::fs::write(ws.join("five"), vec![1u8; 5 << 20]).unwrap();
        for i in 0..40 {
            std::fs::hard_link(ws.join("five"), ws.join(format!("link{i}"))).unwrap();
        }
        std::fs::create_dir(ws.join("empty")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("l")).unwrap();
        let u = usage(&WorkspaceRoot::open(&ws).unwrap(), WalkLimits::default()).unwrap();
        assert_eq!(u.entries, 44);
        assert_eq!(u.bytes, (50 << 30) + 41 * (5 << 20));
        assert_eq!(
            u.cost,
            file_cost(50 << 30) + 41 * file_cost(5 << 20) + 2 * BLOCK
        );
        assert_eq!(file_cost(0), BLOCK);
        assert_eq!(file_cost(1), 2 * BLOCK);
        assert_eq!(file_cost(BLOCK), 2 * BLOCK);
    }

    #[test]
    fn removal_never_climbs_past_where_it_started_and_keeps_link_targets() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir_all(ws.join("a/b/c")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("a/b/out")).unwrap();
        std::fs::write(ws.join("a/b/c/f"), "f").unwrap();
        let root = WorkspaceRoot::open(&ws).unwrap();
        remove_tree(&root, OsStr::new("a")).unwrap();
        assert!(!ws.join("a").exists());
        assert!(ws.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"k");
        assert_eq!(
            remove_tree(&root, OsStr::new("a")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
