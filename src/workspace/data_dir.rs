//! The data dir's own protections: the one-host lock (`<data_dir>/lock`) and
//! the file modes that keep chat history, tokens and workspaces from other
//! local users (dirs 0700, files 0600, set exactly, whatever the umask).
//!
//! Must never: let two hosts serve one data dir (they would share the API
//! socket and sweep each other's containers), loosen a mode it finds, or
//! follow a symlink where it creates or locks a file.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::DataPaths;

/// Mode of every directory the host creates in the data dir.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the host creates in the data dir (`state.db`, its WAL
/// and SHM inherit it from the database file).
pub const FILE_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error(
        "{path} is held by another {holder} (pid {}): one at a time per data dir",
        pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
    )]
    Locked {
        path: String,
        pid: Option<u32>,
        /// The command that holds it (`mercury serve`, `mercury review intake`).
        holder: &'static str,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `<data_dir>/models/` (or the shared directory's): where a space's
/// `scripted:` rules files live.
pub fn models_dir(paths: &DataPaths) -> PathBuf {
    paths.models.clone()
}

/// `<data_dir>/lock`.
pub fn lock_path(paths: &DataPaths) -> PathBuf {
    paths.root.join("lock")
}

/// The exclusive `flock` on `<data_dir>/lock`, held while this value lives
/// (the kernel drops it when the process dies, however it dies). The file
/// holds the holder's pid, for the message a second host prints.
#[derive(Debug)]
pub struct HostLock {
    _file: File,
}

/// Takes the lock without waiting; [`DataDirError::Locked`] names the pid
/// of the host that holds it.
pub fn lock(paths: &DataPaths) -> Result<HostLock, DataDirError> {
    lock_file(lock_path(paths), "mercury serve")
}

/// `<data_dir>/intake.lock`: one `mercury review intake` per data dir, so
/// the reservations its instance left open can only be a crashed run's.
pub fn intake_lock_path(paths: &DataPaths) -> PathBuf {
    paths.root.join("intake.lock")
}

/// The intake's own lock, taken the way [`lock`] takes the host's.
pub fn lock_intake(paths: &DataPaths) -> Result<HostLock, DataDirError> {
    lock_file(intake_lock_path(paths), "mercury review intake")
}

fn lock_file(path: PathBuf, holder: &'static str) -> Result<HostLock, DataDirError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err(&path))?;
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut text = String::new();
            let _ = file.take(32).read_to_string(&mut text);
            return Err(DataDirError::Locked {
                path: path.display().to_string(),
                pid: text.trim().parse().ok(),
                holder,
            });
        }
        return Err(io_err(&path)(e));
    }
    file.set_len(0).map_err(io_err(&path))?;
    file.rewind().map_err(io_err(&path))?;
    writeln!(file, "{}", std::process::id()).map_err(io_err(&path))?;
    file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
        .map_err(io_err(&path))?;
    Ok(HostLock { _file: file })
}

/// Creates `dir` with mode 0700 (missing parents get the usual mode: they
/// are outside what this host owns); a directory that exists keeps its mode (an operator's or the sandbox's choice, warned about
/// by [`loose_modes`]).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // A symlink or a file where a directory belongs is not ours to use.
            if std::fs::symlink_metadata(dir)?.is_dir() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", dir.display()),
                ))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => match dir.parent() {
            Some(parent) if parent != dir => {
                std::fs::create_dir_all(parent)?;
                private_dir(dir)
            }
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// Creates a new file with mode 0600 (never an existing one, never through
/// a symlink).
pub fn private_file(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// What [`share_global`] did with the owner token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalShare {
    /// No shared directory, or nothing to do.
    Unchanged,
    /// This host's token was the first: published to the shared directory.
    Published,
    /// The shared directory's token replaced (or became) this host's copy.
    Adopted,
    /// Neither this host nor the shared directory has one.
    Missing,
}

/// Keeps `global/owner.token` one for the deployment: the shared
/// directory's copy is the deployment's, and this host's `global/` holds
/// it for the commands run on this machine (`mrctl`, `mercury doctor`
/// read the data dir). A host that has one while the shared directory has
/// none publishes it (the first host of a deployment); two hosts racing
/// to publish agree on the first file written.
pub fn share_global(paths: &DataPaths) -> Result<GlobalShare, DataDirError> {
    let Some(shared) = paths.shared_global() else {
        return Ok(GlobalShare::Unchanged);
    };
    private_dir(&shared).map_err(io_err(&shared))?;
    let shared_token = shared.join("owner.token");
    let local_token = paths.owner_token();
    let local = read_private(&local_token)?;
    let mut published = false;
    let deployment = match read_private(&shared_token)? {
        Some(t) => t,
        None => match &local {
            None => return Ok(GlobalShare::Missing),
            Some(mine) => match private_file(&shared_token) {
                Ok(mut f) => {
                    f.write_all(mine).map_err(io_err(&shared_token))?;
                    f.sync_all().map_err(io_err(&shared_token))?;
                    published = true;
                    mine.clone()
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_private(&shared_token)?
                    .ok_or_else(|| {
                        io_err(&shared_token)(io::Error::new(
                            io::ErrorKind::NotFound,
                            "another host published it and it is gone",
                        ))
                    })?,
                Err(e) => return Err(io_err(&shared_token)(e)),
            },
        },
    };
    if local.as_ref() == Some(&deployment) {
        return Ok(if published {
            GlobalShare::Published
        } else {
            GlobalShare::Unchanged
        });
    }
    // Written beside, then renamed: a reader never sees half a token.
    private_dir(&paths.global).map_err(io_err(&paths.global))?;
    // A fresh temporary name (created 0600, never through a link), so no
    // leftover of an earlier attempt is in the way.
    let global = &paths.global;
    let mut staged = tempfile::Builder::new()
        .prefix(".owner.token.")
        .tempfile_in(global)
        .map_err(io_err(global))?;
    staged.write_all(&deployment).map_err(io_err(global))?;
    staged.as_file().sync_all().map_err(io_err(global))?;
    staged
        .persist(&local_token)
        .map_err(|e| io_err(&local_token)(e.error))?;
    Ok(GlobalShare::Adopted)
}

/// A regular file's bytes (`None` when there is none), never through a
/// symlink, at most a few KiB (a token, not a dump).
fn read_private(path: &Path) -> Result<Option<Vec<u8>>, DataDirError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    if !file.metadata().map_err(io_err(path))?.is_file() {
        return Err(io_err(path)(io::Error::new(
            io::ErrorKind::InvalidData,
            "is not a regular file",
        )));
    }
    let mut bytes = Vec::new();
    file.take(4096)
        .read_to_end(&mut bytes)
        .map_err(io_err(path))?;
    Ok(Some(bytes))
}

/// One path whose mode lets another local user in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LooseMode {
    pub path: PathBuf,
    pub mode: u32,
    pub wanted: u32,
}

impl std::fmt::Display for LooseMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} has mode {:o}: group or other users can reach it (want {:o}; chmod {:o} {})",
            self.path.display(),
            self.mode,
            self.wanted,
            self.wanted,
            self.path.display()
        )
    }
}

/// Bytes free to an unprivileged writer on the file system holding `path`
/// (`statvfs`); `None` if it cannot be asked.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The field types differ between targets (u32 or u64).
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (st.f_bavail as u64, st.f_frsize as u64);
    Some(blocks.saturating_mul(size))
}

/// Paths of the data dir that group or other users can read, write or
/// enter: the data dir, `state.db` and its WAL/SHM, `mercury.yaml`,
/// `global/` and its files, `spaces/` and every workspace, `models/`,
/// `reviews/`, `lock`. The API socket is meant to be 0666 and is skipped.
pub fn loose_modes(paths: &DataPaths) -> Vec<LooseMode> {
    let mut wanted: Vec<(PathBuf, u32)> = vec![
        (paths.root.clone(), DIR_MODE),
        (paths.db.clone(), FILE_MODE),
        (with_suffix(&paths.db, "-wal"), FILE_MODE),
        (with_suffix(&paths.db, "-shm"), FILE_MODE),
        (paths.config.clone(), FILE_MODE),
        (paths.global.clone(), DIR_MODE),
        (paths.spaces.clone(), DIR_MODE),
        (models_dir(paths), DIR_MODE),
        (paths.reviews.clone(), DIR_MODE),
        (lock_path(paths), FILE_MODE),
    ];
    for dir in [&paths.global, &paths.spaces] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let mode = if dir == &paths.spaces {
                DIR_MODE
            } else {
                FILE_MODE
            };
            wanted.push((entry.path(), mode));
        }
    }
    wanted
        .into_iter()
        .filter_map(|(path, want)| {
            // symlink_metadata: a link is reported as what it is, not followed.
            let mode = std::fs::symlink_metadata(&path).ok()?.permissions().mode() & 0o7777;
            (mode & 0o077 != 0).then_some(LooseMode {
                path,
                mode,
                wanted: want,
            })
        })
        .collect()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_owner_token_is_published_by_the_first_host_and_adopted_by_the_others() {
        let shared = tempfile::tempdir().unwrap();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = DataPaths::new(a.path()).with_shared(shared.path());
        let second = DataPaths::new(b.path()).with_shared(shared.path());
        assert_eq!(share_global(&first).unwrap(), GlobalShare::Missing);
        private_dir(&first.global).unwrap();
        private_file(&first.owner_token())
            .unwrap()
            .write_all(b"tok-1")
            .unwrap();
        assert_eq!(share_global(&first).unwrap(), GlobalShare::Published);
        assert_eq!(share_global(&first).unwrap(), GlobalShare::Unchanged);
        assert_eq!(share_global(&second).unwrap(), GlobalShare::Adopted);
        assert_eq!(std::fs::read(second.owner_token()).unwrap(), b"tok-1");
        let mode = std::fs::metadata(second.owner_token())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, FILE_MODE);
        // The deployment's copy wins over a stale one of this host.
        std::fs::write(second.owner_token(), b"stale").unwrap();
        assert_eq!(share_global(&second).unwrap(), GlobalShare::Adopted);
        assert_eq!(std::fs::read(second.owner_token()).unwrap(), b"tok-1");
        // Never through a symlink planted in the shared directory.
        let c = tempfile::tempdir().unwrap();
        let planted = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(planted.path().join("global")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", planted.path().join("global/owner.token"))
            .unwrap();
        let third = DataPaths::new(c.path()).with_shared(planted.path());
        assert!(share_global(&third).is_err());
        assert!(!third.owner_token().exists());
    }

    #[test]
    fn a_second_lock_names_the_holder_and_the_first_survives() {
        let dir = tempfile::tempdir().unwrap();
        let paths = DataPaths::new(dir.path());
        let first = lock(&paths).unwrap();
        match lock(&paths) {
            Err(DataDirError::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("second lock: {other:?}"),
        }
        let mode = std::fs::metadata(lock_path(&paths))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, FILE_MODE);
        drop(first);
        lock(&paths).expect("the lock is free once its holder is gone");
    }

    #[test]
    fn private_dirs_and_files_ignore_the_umask_bits_they_do_not_need() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        private_dir(&nested).unwrap();
        let mode = std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, DIR_MODE);
        let f = nested.join("f");
        private_file(&f).unwrap();
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            FILE_MODE
        );
        assert!(
            private_file(&f).is_err(),
            "an existing file is never reused"
        );
        std::os::unix::fs::symlink(&f, nested.join("link")).unwrap();
        assert!(private_dir(&nested.join("link")).is_err());
    }
}
