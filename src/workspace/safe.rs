//! The one safe-path function: every host-side open, read, write, copy,
//! hash or listing of a path inside a workspace goes through
//! [`WorkspaceRoot`].
//!
//! A workspace is written by the agent, and the agent is driven by chat
//! participants, so any name in it may be a symbolic link to a host file, a
//! FIFO that blocks a reader forever, or a device. The host resolves a
//! workspace path only from a directory descriptor of the workspace root,
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//! where the kernel has it, else by walking component by component with
//! `O_NOFOLLOW`. Files are opened `O_NONBLOCK` and checked to be regular
//! before a byte is read.
//!
//! Must never: follow a symbolic link (at any component), accept an absolute
//! path or a `..` component, read or write anything but a regular file, or
//! leave a half-written file under its final name (writes are temp + rename).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use super::walk::{Usage, WalkError, WalkLimits};

/// Why a workspace path was refused or could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SafePathError {
    #[error(
        "{0:?} is not a relative path inside the workspace (no absolute path, no `..`, no NUL, \
         no newline or other control character)"
    )]
    BadPath(String),
    #[error(
        "{0:?} goes through a symbolic link or leaves the workspace; links are never followed"
    )]
    Escapes(String),
    #[error("{0:?} is not a regular file")]
    NotRegular(String),
    #[error("{0:?} is a directory")]
    IsDirectory(String),
    #[error("{0:?} does not exist")]
    NotFound(String),
    #[error("{path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl SafePathError {
    fn io(path: &str, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::EXDEV) => Self::Escapes(path.to_owned()),
            Some(libc::ENOENT) => Self::NotFound(path.to_owned()),
            Some(libc::ENOTDIR) => Self::Escapes(path.to_owned()),
            Some(libc::EISDIR) => Self::IsDirectory(path.to_owned()),
            _ => Self::Io {
                path: path.to_owned(),
                source,
            },
        }
    }
}

pub type SafeResult<T> = Result<T, SafePathError>;

/// What a directory entry is, read without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket or device: never opened by the host.
    Other,
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub name: OsString,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds and nanoseconds of the last modification.
    pub mtime: (i64, i64),
    /// Device number (a character device 0:0 is an overlay whiteout).
    pub rdev: u64,
}

/// How paths are resolved; `Walk` is the fallback for kernels without
/// `openat2` and is forced in tests so both are exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    Openat2,
    Walk,
}

/// 0: not probed yet, 1: openat2 works, 2: fall back to the walk.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// A workspace (or any host-built directory holding agent-written files),
/// held open by descriptor: every path below it is resolved from here.
#[derive(Debug)]
pub struct WorkspaceRoot {
    dir: OwnedFd,
    path: PathBuf,
    resolver: Option<Resolver>,
}

impl WorkspaceRoot {
    /// Opens a directory the host built the path of itself. Its last
    /// component must not be a symbolic link either.
    pub fn open(path: &Path) -> SafeResult<Self> {
        let shown = path.display().to_string();
        let c = cstring(path.as_os_str(), &shown)?;
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let fd = owned(fd).map_err(|e| SafePathError::io(&shown, e))?;
        Ok(Self {
            dir: fd,
            path: path.to_owned(),
            resolver: None,
        })
    }

    /// Forces one resolver (tests).
    pub fn with_resolver(mut self, resolver: Resolver) -> Self {
        self.resolver = Some(resolver);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a regular file for reading.
    pub fn open_file(&self, rel: &str) -> SafeResult<File> {
        let comps = components(rel)?;
        if comps.is_empty() {
            return Err(SafePathError::IsDirectory(rel.to_owned()));
        }
        let fd = self.resolve(
            rel,
            &comps,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        )?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| SafePathError::io(rel, e))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Ok(File::from(fd)),
            libc::S_IFDIR => Err(SafePathError::IsDirectory(rel.to_owned())),
            _ => Err(SafePathError::NotRegular(rel.to_owned())),
        }
    }

    /// Reads at most `cap` bytes of a regular file; `Ok(None)` when it
    /// does not exist. The flag says whether the file was longer.
    pub fn read_capped(&self, rel: &str, cap: usize) -> SafeResult<Option<(Vec<u8>, bool)>> {
        let file = match self.open_file(rel) {
            Ok(f) => f,
            Err(SafePathError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.take(cap as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| SafePathError::io(rel, e))?;
        let longer = bytes.len() > cap;
        bytes.truncate(cap);
        Ok(Some((bytes, longer)))
    }

    /// Opens a directory below the root as a root of its own.
    pub fn open_dir(&self, rel: &str) -> SafeResult<WorkspaceRoot> {
        let comps = components(rel)?;
        let fd = if comps.is_empty() {
            dup(self.dir.as_raw_fd()).map_err(|e| SafePathError::io(rel, e))?
        } else {
            self.resolve(
                rel,
                &comps,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            )?
        };
        Ok(WorkspaceRoot {
            dir: fd,
            path: self.path.join(rel),
            resolver: self.resolver,
        })
    }

    /// Entries of a directory (not recursive, sorted by name), each described
    /// without following it.
    pub fn list(&self, rel: &str) -> SafeResult<Vec<Entry>> {
        let dir = self.open_dir(rel)?;
        dir.entries().map_err(|e| SafePathError::io(rel, e))
    }

    /// Writes a regular file atomically (temp file + rename in the same
    /// directory), creating missing parent directories. An existing symlink
    /// at the name is replaced, never followed; a directory there is an error.
    pub fn write_atomic(&self, rel: &str, bytes: &[u8]) -> SafeResult<()> {
        let (parent, name) = self.parent_of(rel, true)?;
        if let Ok(st) = fstatat(parent.dir.as_raw_fd(), &name) {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                return Err(SafePathError::IsDirectory(rel.to_owned()));
            }
        }
        let owner = fstat(parent.dir.as_raw_fd()).map_err(|e| SafePathError::io(rel, e))?;
        let (tmp_name, mut file) = parent
            .create_temp(0o644)
            .map_err(|e| SafePathError::io(rel, e))?;
        let written = (|| {
            file.write_all(bytes)?;
            // The file belongs to whoever owns its directory (the sandbox
            // user, for a workspace handed to it), not to the host.
            chown_fd(file.as_raw_fd(), owner.st_uid, owner.st_gid);
            file.sync_all()?;
            parent.rename_in(&tmp_name, &name)
        })();
        if let Err(e) = written {
            let _ = parent.unlink(&tmp_name, false);
            return Err(SafePathError::io(rel, e));
        }
        Ok(())
    }

    /// Removes a file, symlink or (recursively) directory; a missing one is
    /// `Ok(false)`.
    pub fn remove(&self, rel: &str) -> SafeResult<bool> {
        let (parent, name) = self.parent_of(rel, false)?;
        match parent.remove_entry(&name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(SafePathError::io(rel, e)),
        }
    }

    /// What everything below the root holds and is charged (see
    /// [`super::walk`]), refusing a tree past `limits`.
    pub fn usage(&self, limits: WalkLimits) -> Result<Usage, WalkError> {
        super::walk::usage(self, limits)
    }

    /// Copies the whole tree into `dst` (an empty directory), refusing a
    /// tree past `limits`; see [`super::walk::copy_tree`]. Returns the bytes
    /// copied.
    pub fn copy_tree_into(
        &self,
        dst: &WorkspaceRoot,
        limits: WalkLimits,
    ) -> Result<u64, WalkError> {
        super::walk::copy_tree(self, dst, limits)
    }

    /// [`copy_tree_into`](Self::copy_tree_into), showing `tap` each file's
    /// bytes and each link as they are copied (see [`super::walk::CopyTap`]).
    pub fn copy_tree_into_tapped(
        &self,
        dst: &WorkspaceRoot,
        limits: WalkLimits,
        tap: &mut dyn super::walk::CopyTap,
    ) -> Result<u64, WalkError> {
        super::walk::copy_tree_tapped(self, dst, limits, Some(tap))
    }

    // ----- building blocks (also used by the overlay merge) -----

    /// The parent directory of `rel` (created when `create` is set) and the
    /// last component.
    pub(crate) fn parent_of(
        &self,
        rel: &str,
        create: bool,
    ) -> SafeResult<(WorkspaceRoot, OsString)> {
        let comps = components(rel)?;
        let Some((name, dirs)) = comps.split_last() else {
            return Err(SafePathError::BadPath(rel.to_owned()));
        };
        let mut cur = self.open_dir("")?;
        for d in dirs {
            let made = create
                && match cur.mkdir(d, 0o755) {
                    Ok(()) => true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                    Err(e) => return Err(SafePathError::io(rel, e)),
                };
            let parent_owner = if made {
                Some(fstat(cur.dir.as_raw_fd()).map_err(|e| SafePathError::io(rel, e))?)
            } else {
                None
            };
            cur = cur.child_dir(d).map_err(|e| SafePathError::io(rel, e))?;
            // A directory belongs to whoever owns the one it is made in (the
            // sandbox user, for a workspace handed to it), as a file does:
            // a root-owned one would be closed to the sandbox.
            if let Some(owner) = parent_owner {
                chown_fd(cur.dir.as_raw_fd(), owner.st_uid, owner.st_gid);
            }
        }
        Ok((cur, (*name).to_owned()))
    }

    fn resolve(&self, rel: &str, comps: &[&OsStr], flags: i32) -> SafeResult<OwnedFd> {
        let flags = flags | libc::O_CLOEXEC;
        let resolver = self.resolver.unwrap_or_else(default_resolver);
        if resolver == Resolver::Openat2 {
            match openat2_beneath(self.dir.as_raw_fd(), rel, flags) {
                Ok(fd) => return Ok(fd),
                Err(e) if unsupported(&e) => OPENAT2.store(2, Ordering::Relaxed),
                Err(e) => return Err(SafePathError::io(rel, e)),
            }
        }
        // Fallback: one component at a time, never following a link.
        let mut cur = dup(self.dir.as_raw_fd()).map_err(|e| SafePathError::io(rel, e))?;
        let last = comps.len() - 1;
        for (i, c) in comps.iter().enumerate() {
            let f = if i == last {
                flags | libc::O_NOFOLLOW
            } else {
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
            };
            cur = openat(cur.as_raw_fd(), c, f).map_err(|e| SafePathError::io(rel, e))?;
        }
        Ok(cur)
    }

    pub(crate) fn entries(&self) -> io::Result<Vec<Entry>> {
        // /proc/self/fd/N names exactly this open directory, whatever has
        // been renamed or swapped since it was opened.
        let listing = std::fs::read_dir(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))?;
        let mut out = Vec::new();
        for item in listing {
            let name = item?.file_name();
            let st = match fstatat(self.dir.as_raw_fd(), &name) {
                Ok(st) => st,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push(entry_of(name, &st));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub(crate) fn stat_entry(&self, name: &OsStr) -> io::Result<Option<Entry>> {
        match fstatat(self.dir.as_raw_fd(), name) {
            Ok(st) => Ok(Some(entry_of(name.to_owned(), &st))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn child_dir(&self, name: &OsStr) -> io::Result<WorkspaceRoot> {
        let fd = openat(
            self.dir.as_raw_fd(),
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?;
        Ok(WorkspaceRoot {
            dir: fd,
            path: self.path.join(name),
            resolver: self.resolver,
        })
    }

    pub(crate) fn child_file(&self, name: &OsStr) -> io::Result<File> {
        let fd = openat(
            self.dir.as_raw_fd(),
            name,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )?;
        let st = fstat(fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::other("not a regular file"));
        }
        Ok(File::from(fd))
    }

    pub(crate) fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = cstring_io(name)?;
        // SAFETY: valid descriptor and NUL-terminated name; result checked.
        let r = unsafe { libc::mkdirat(self.dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
        check(r)
    }

    pub(crate) fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let fd = openat_mode(
            self.dir.as_raw_fd(),
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )?;
        Ok(File::from(fd))
    }

    /// A new file with a unique temporary name in this directory.
    pub(crate) fn create_temp(&self, mode: u32) -> io::Result<(OsString, File)> {
        for _ in 0..16 {
            let name = temp_name();
            match self.create_new(&name, mode) {
                Ok(f) => return Ok((name, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("no free temporary name"))
    }

    pub(crate) fn rename_in(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (a, b) = (cstring_io(from)?, cstring_io(to)?);
        let fd = self.dir.as_raw_fd();
        // SAFETY: valid descriptor and names; result checked.
        check(unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) })
    }

    pub(crate) fn symlink(&self, target: &OsStr, name: &OsStr) -> io::Result<()> {
        let (t, n) = (cstring_io(target)?, cstring_io(name)?);
        // SAFETY: valid descriptor and names; result checked.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.dir.as_raw_fd(), n.as_ptr()) })
    }

    pub(crate) fn readlink(&self, name: &OsStr) -> io::Result<OsString> {
        let c = cstring_io(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: the buffer is as long as we say; result checked.
        let n = unsafe {
            libc::readlinkat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(OsString::from_vec(buf))
    }

    pub(crate) fn unlink(&self, name: &OsStr, dir: bool) -> io::Result<()> {
        let c = cstring_io(name)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid descriptor and name; result checked.
        check(unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), flags) })
    }

    /// Removes an entry of this directory, a directory with all it holds
    /// (iteratively, however deep: [`super::walk::remove_tree`]).
    pub(crate) fn remove_entry(&self, name: &OsStr) -> io::Result<()> {
        super::walk::remove_tree(self, name)
    }

    /// A second handle on this same directory.
    pub(crate) fn try_clone(&self) -> io::Result<WorkspaceRoot> {
        Ok(WorkspaceRoot {
            dir: dup(self.dir.as_raw_fd())?,
            path: self.path.clone(),
            resolver: self.resolver,
        })
    }

    /// The device and inode of this directory.
    pub(crate) fn identity(&self) -> io::Result<(u64, u64)> {
        let st = fstat(self.dir.as_raw_fd())?;
        Ok((st.st_dev, st.st_ino))
    }

    /// This directory's parent, by `..` (which is never a link). Only for a
    /// tree nothing else changes; callers check [`Self::identity`].
    pub(crate) fn dotdot(&self) -> io::Result<WorkspaceRoot> {
        let fd = openat(
            self.dir.as_raw_fd(),
            OsStr::new(".."),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?;
        Ok(WorkspaceRoot {
            dir: fd,
            path: self.path.join(".."),
            resolver: self.resolver,
        })
    }

    /// Moves `from` of this directory to `to` of `dst` (same filesystem).
    pub(crate) fn rename_to(
        &self,
        from: &OsStr,
        dst: &WorkspaceRoot,
        to: &OsStr,
    ) -> io::Result<()> {
        let (a, b) = (cstring_io(from)?, cstring_io(to)?);
        // SAFETY: valid descriptors and names; result checked.
        check(unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                a.as_ptr(),
                dst.dir.as_raw_fd(),
                b.as_ptr(),
            )
        })
    }

    /// Gives a file (`Some`) or this directory (`None`) the owner, mode and
    /// modification time of `like`. Best effort: a host that may not chown
    /// keeps its own ownership. A file never keeps a setuid or setgid bit:
    /// what a turn wrote must not become a program that runs as its owner.
    pub(crate) fn set_meta(&self, file: Option<&File>, like: &Entry) {
        let fd = file.map_or(self.dir.as_raw_fd(), std::os::fd::AsRawFd::as_raw_fd);
        chown_fd(fd, like.uid, like.gid);
        let mode = match file {
            Some(_) => like.mode & 0o1777,
            None => like.mode & 0o7777,
        };
        // SAFETY: a valid descriptor; failures are ignored on purpose.
        unsafe {
            libc::fchmod(fd, mode as libc::mode_t);
            let times = [
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                libc::timespec {
                    tv_sec: like.mtime.0 as libc::time_t,
                    tv_nsec: like.mtime.1 as _,
                },
            ];
            libc::futimens(fd, times.as_ptr());
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }
}

/// A fresh name for something about to be renamed into place.
pub(crate) fn temp_name() -> OsString {
    OsString::from(format!(".mercury-tmp-{:016x}", rand::random::<u64>()))
}

/// Checks a workspace-relative path: no absolute path, no `..`, no NUL and
/// no other control character (a newline in a name forges lines in every
/// listing, log and prompt that shows it); `.` components are dropped. An
/// empty list means the root itself.
pub fn components(rel: &str) -> SafeResult<Vec<&OsStr>> {
    if rel.chars().any(char::is_control) || rel.starts_with('/') {
        return Err(SafePathError::BadPath(rel.to_owned()));
    }
    let mut out = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(SafePathError::BadPath(rel.to_owned())),
        }
    }
    Ok(out)
}

fn default_resolver() -> Resolver {
    match OPENAT2.load(Ordering::Relaxed) {
        2 => Resolver::Walk,
        _ => Resolver::Openat2,
    }
}

fn unsupported(e: &io::Error) -> bool {
    // ENOSYS: an old kernel; EPERM: a seccomp filter that does not know it.
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::E2BIG)
    )
}

fn openat2_beneath(dir: RawFd, rel: &str, flags: i32) -> io::Result<OwnedFd> {
    let c = CString::new(rel).map_err(io::Error::other)?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a valid descriptor, path and a correctly sized
    // `open_how`; the return value is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned(fd as i32)
}

fn openat(dir: RawFd, name: &OsStr, flags: i32) -> io::Result<OwnedFd> {
    openat_mode(dir, name, flags, 0)
}

fn openat_mode(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstring_io(name)?;
    // SAFETY: valid descriptor and NUL-terminated name; result checked.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags, mode as libc::c_uint) };
    owned(fd)
}

fn owned(fd: i32) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this process owns and nobody else closes.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: duplicating a descriptor we hold; result checked.
    owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter; result checked.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn fstatat(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstring_io(name)?;
    // SAFETY: as above; AT_SYMLINK_NOFOLLOW describes a link, not its target.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn chown_fd(fd: RawFd, uid: u32, gid: u32) {
    // SAFETY: a valid descriptor; EPERM on a non-root host is expected.
    unsafe {
        libc::fchown(fd, uid, gid);
    }
}

fn entry_of(name: OsString, st: &libc::stat) -> Entry {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    Entry {
        name,
        kind,
        size: st.st_size as u64,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        rdev: st.st_rdev,
    }
}

fn check(r: i32) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cstring(s: &OsStr, shown: &str) -> SafeResult<CString> {
    CString::new(s.as_bytes()).map_err(|_| SafePathError::BadPath(shown.to_owned()))
}

fn cstring_io(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir_all(ws.join("knowledge")).unwrap();
        let canary = t.path().join("canary.txt");
        std::fs::write(&canary, "CANARY-SECRET").unwrap();
        std::fs::write(ws.join("AGENTS.md"), "hello").unwrap();
        std::os::unix::fs::symlink(&canary, ws.join("MEMORY.md")).unwrap();
        std::os::unix::fs::symlink(&canary, ws.join("knowledge/link.md")).unwrap();
        std::os::unix::fs::symlink(t.path(), ws.join("outside")).unwrap();
        std::os::unix::fs::symlink("../canary.txt", ws.join("rel.md")).unwrap();
        (t, ws, canary)
    }

    fn both(ws: &Path) -> Vec<WorkspaceRoot> {
        vec![
            WorkspaceRoot::open(ws)
                .unwrap()
                .with_resolver(Resolver::Openat2),
            WorkspaceRoot::open(ws)
                .unwrap()
                .with_resolver(Resolver::Walk),
        ]
    }

    #[test]
    fn no_symlink_is_followed_by_either_resolver() {
        let (_t, ws, _c) = setup();
        for root in both(&ws) {
            assert_eq!(
                root.read_capped("AGENTS.md", 100).unwrap().unwrap().0,
                b"hello"
            );
            for bad in [
                "MEMORY.md",
                "knowledge/link.md",
                "outside/canary.txt",
                "rel.md",
            ] {
                let err = root.read_capped(bad, 100).unwrap_err();
                assert!(matches!(err, SafePathError::Escapes(_)), "{bad}: {err:?}");
            }
            for bad in [
                "../canary.txt",
                "/etc/passwd",
                "knowledge/../../canary.txt",
                "a\0b",
            ] {
                assert!(matches!(
                    root.read_capped(bad, 100),
                    Err(SafePathError::BadPath(_))
                ));
            }
        }
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let (_t, ws, _c) = setup();
        let fifo = CString::new(ws.join("pipe").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        for root in both(&ws) {
            assert!(matches!(
                root.read_capped("pipe", 10),
                Err(SafePathError::NotRegular(_))
            ));
        }
    }

    #[test]
    fn writes_replace_a_symlink_instead_of_writing_through_it() {
        let (_t, ws, canary) = setup();
        let root = WorkspaceRoot::open(&ws).unwrap();
        root.write_atomic("MEMORY.md", b"new").unwrap();
        assert_eq!(std::fs::read(&canary).unwrap(), b"CANARY-SECRET");
        assert_eq!(std::fs::read(ws.join("MEMORY.md")).unwrap(), b"new");
        assert!(root.write_atomic("outside/x", b"y").is_err());
        root.write_atomic("notes/a/b.txt", b"z").unwrap();
        assert_eq!(std::fs::read(ws.join("notes/a/b.txt")).unwrap(), b"z");
        assert!(!std::fs::read_dir(&ws).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".mercury-tmp")));
    }

    #[test]
    fn copies_keep_links_as_links_and_drop_fifos() {
        let (t, ws, _c) = setup();
        let fifo = CString::new(ws.join("pipe").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let dst = t.path().join("copy");
        std::fs::create_dir(&dst).unwrap();
        let n = WorkspaceRoot::open(&ws)
            .unwrap()
            .copy_tree_into(&WorkspaceRoot::open(&dst).unwrap(), WalkLimits::default())
            .unwrap();
        assert_eq!(n, 5);
        assert!(std::fs::symlink_metadata(dst.join("MEMORY.md"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!dst.join("pipe").exists());
        assert!(!dst.join("canary.txt").exists());
    }

    #[test]
    fn removal_never_leaves_the_tree() {
        let (t, ws, canary) = setup();
        let root = WorkspaceRoot::open(&ws).unwrap();
        assert!(root.remove("outside").unwrap());
        assert!(canary.exists() && t.path().exists());
        assert!(root.remove("knowledge").unwrap());
        assert!(canary.exists());
        assert!(!root.remove("knowledge").unwrap());
    }
}
