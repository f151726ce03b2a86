//! The workspace file operations behind `/api/files` (issue 18): list a
//! directory with each file's hash, read one file whole (capped), and write
//! or delete one under an optional `If-Match` hash and within the workspace
//! quota. Blocking; the API runs reads off the async runtime and writes
//! through the space's actor, between turns.
//!
//! Everything goes through [`WorkspaceRoot`], so a path is refused (and
//! nothing is read) when it is absolute, has a `..`, passes a symbolic link,
//! or names a FIFO, socket, device or directory.
//!
//! Must never: follow a link, read more than the cap, write anything when a
//! check fails (the hash, the quota), or leave a half-written file.

use std::io::Read;
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::safe::{components, EntryKind, SafePathError, WorkspaceRoot};
use super::walk::{file_cost, WalkError, WalkLimits, BLOCK};

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error(transparent)]
    Path(#[from] SafePathError),
    #[error("{path:?} is {size} bytes; the files API carries at most {max} (files.max_bytes)")]
    TooLarge { path: String, size: u64, max: usize },
    #[error("{0:?} is not UTF-8 text; the files API carries text files only")]
    NotText(String),
    #[error(
        "{path:?} has changed since it was read (its hash is now {current}); nothing was written"
    )]
    Stale { path: String, current: String },
    #[error("{0:?} does not exist, so it cannot match If-Match; nothing was written")]
    StaleMissing(String),
    #[error(
        "{path:?} exists (its hash is {current}), and If-None-Match: * asked that it did not; nothing was written"
    )]
    Exists { path: String, current: String },
    #[error(
        "writing {path:?} ({size} bytes) would take the workspace to {total} bytes, past its \
         quota of {quota_mb} MB (sandbox.workspace_mb); nothing was written"
    )]
    OverQuota {
        path: String,
        size: u64,
        total: u64,
        quota_mb: u64,
    },
    #[error("a path to a file is needed")]
    Empty,
    #[error("{0:?} is a file, not a directory: read it with GET /api/files/<path>")]
    NotADirectory(String),
    #[error(
        "writing {path:?} would give the workspace more than workspace.max_entries = {limit} \
         entries; nothing was written"
    )]
    TooManyEntries { path: String, limit: u64 },
    #[error("the workspace cannot take a write: {0}")]
    Limit(WalkError),
}

pub type FilesResult<T> = Result<T, FilesError>;

/// One entry of a listing.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` (never followed) or `other` (FIFO, socket, device).
    #[schema(value_type = String)]
    pub kind: &'static str,
    pub size: u64,
    /// sha256 of a regular file's bytes (lower-case hex); none for the rest.
    pub hash: Option<String>,
    /// Last modification, milliseconds since the epoch.
    pub modified: i64,
}

/// A file read whole.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct FileContent {
    pub path: String,
    pub content: String,
    pub size: u64,
    pub hash: String,
    pub modified: i64,
}

/// What a write or a delete did.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct FileChange {
    pub path: String,
    /// The hash before (none: the file did not exist).
    pub before_hash: Option<String>,
    /// The hash after (none: the file was deleted).
    pub hash: Option<String>,
    pub size: u64,
}

/// The sha256 of some bytes, lower-case hex (the `hash` of the API).
pub fn hash_bytes(bytes: &[u8]) -> String {
    let mut h = ContentHash::default();
    h.update(bytes);
    h.finish()
}

/// The API's `hash` of bytes met in pieces (a file read in chunks, a copy
/// that hashes what it writes): [`hash_bytes`] of them all.
#[derive(Default)]
pub struct ContentHash(Sha256);

impl ContentHash {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> String {
        base16ct::lower::encode_string(&self.0.finalize())
    }
}

/// A path to a file: relative, no `..`, not empty; `.` components dropped.
pub fn file_path(raw: &str) -> FilesResult<String> {
    let comps = components(raw)?;
    if comps.is_empty() {
        return Err(FilesError::Empty);
    }
    Ok(comps
        .iter()
        .map(|c| c.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/"))
}

fn modified_ms(mtime: (i64, i64)) -> i64 {
    mtime.0 * 1000 + mtime.1 / 1_000_000
}

/// The entries of `dir` (`""` or `.` is the workspace itself).
pub fn list(workspace: &Path, dir: &str) -> FilesResult<Vec<FileEntry>> {
    let root = WorkspaceRoot::open(workspace)?;
    let dir_root = match root.open_dir(dir) {
        Ok(d) => d,
        // ENOTDIR reads as "leaves the workspace"; say so when it is a plain
        // file (opened through the same link-free resolution, never read).
        Err(SafePathError::Escapes(p)) if root.open_file(dir).is_ok() => {
            return Err(FilesError::NotADirectory(p))
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for e in dir_root.list("")? {
        let name = e.name.to_string_lossy().into_owned();
        let (kind, hash) = match e.kind {
            EntryKind::File => ("file", hash_file(&dir_root, &name).ok()),
            EntryKind::Dir => ("dir", None),
            EntryKind::Symlink => ("symlink", None),
            EntryKind::Other => ("other", None),
        };
        out.push(FileEntry {
            name,
            kind,
            size: e.size,
            hash,
            modified: modified_ms(e.mtime),
        });
    }
    Ok(out)
}

/// What identifies one version of a file's bytes without reading them:
/// device, inode, size, modification and change time. The change time is
/// set by the kernel on every write (a turn may forge the mtime, never the
/// ctime), so a key that matches is the same bytes.
type VersionKey = (u64, u64, u64, i64, i64, i64, i64);

/// Hashes already computed, by [`VersionKey`]: a listing hashes a file
/// once per version, not once per listing. Emptied when full.
static HASHES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<VersionKey, String>>,
> = std::sync::LazyLock::new(Default::default);

/// Versions remembered at most.
const HASHES_KEPT: usize = 16_384;

/// The sha256 of a regular file below `root`, streamed, or remembered from
/// an earlier read of the same version (the `hash` of the API; the shadow's
/// diff hashes its trees with it too).
pub(crate) fn hash_file(root: &WorkspaceRoot, rel: &str) -> FilesResult<String> {
    use std::os::unix::fs::MetadataExt;
    let mut file = root.open_file(rel)?;
    let key = file.metadata().ok().map(|m| {
        (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    });
    if let (Some(k), Ok(cache)) = (key, HASHES.lock()) {
        if let Some(h) = cache.get(&k) {
            return Ok(h.clone());
        }
    }
    let hash = hash_stream(&mut file, rel)?;
    if let (Some(k), Ok(mut cache)) = (key, HASHES.lock()) {
        if cache.len() >= HASHES_KEPT {
            cache.clear();
        }
        cache.insert(k, hash.clone());
    }
    Ok(hash)
}

fn hash_stream(file: &mut std::fs::File, rel: &str) -> FilesResult<String> {
    let mut hasher = ContentHash::default();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| SafePathError::Io {
            path: rel.to_owned(),
            source: e,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finish())
}

/// Reads one regular file whole, refusing it beyond `max` bytes.
pub fn read(workspace: &Path, rel: &str, max: usize) -> FilesResult<FileContent> {
    let root = WorkspaceRoot::open(workspace)?;
    let file = root.open_file(rel)?;
    let io = |e| SafePathError::Io {
        path: rel.to_owned(),
        source: e,
    };
    let meta = file.metadata().map_err(io)?;
    let too_large = |size| FilesError::TooLarge {
        path: rel.to_owned(),
        size,
        max,
    };
    if meta.len() > max as u64 {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > max {
        // It grew between the stat and the read.
        return Err(too_large(bytes.len() as u64));
    }
    let hash = hash_bytes(&bytes);
    let size = bytes.len() as u64;
    let content = String::from_utf8(bytes).map_err(|_| FilesError::NotText(rel.to_owned()))?;
    use std::os::unix::fs::MetadataExt;
    Ok(FileContent {
        path: rel.to_owned(),
        content,
        size,
        hash,
        modified: modified_ms((meta.mtime(), meta.mtime_nsec())),
    })
}

/// The hash and size of the regular file at `rel`, `None` if nothing is there.
fn current(root: &WorkspaceRoot, rel: &str) -> FilesResult<Option<(String, u64)>> {
    let file = match root.open_file(rel) {
        Ok(f) => f,
        Err(SafePathError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let size = file
        .metadata()
        .map_err(|e| SafePathError::Io {
            path: rel.to_owned(),
            source: e,
        })?
        .len();
    drop(file);
    Ok(Some((hash_file(root, rel)?, size)))
}

/// The `if_match` that means "only if there is no such file" (the API's
/// `If-None-Match: *`); never a hash, which is hex.
pub const ABSENT: &str = "*";

fn check_match(rel: &str, now: Option<&(String, u64)>, if_match: Option<&str>) -> FilesResult<()> {
    match (if_match, now) {
        (None, _) => Ok(()),
        (Some(ABSENT), None) => Ok(()),
        (Some(ABSENT), Some((hash, _))) => Err(FilesError::Exists {
            path: rel.to_owned(),
            current: hash.clone(),
        }),
        (Some(want), Some((hash, _))) if want == hash => Ok(()),
        (Some(_), Some((hash, _))) => Err(FilesError::Stale {
            path: rel.to_owned(),
            current: hash.clone(),
        }),
        (Some(_), None) => Err(FilesError::StaleMissing(rel.to_owned())),
    }
}

/// Writes `bytes` at `rel` (temp + rename), if the file still has the hash
/// `if_match` (when given) and the workspace stays within `quota_mb` and
/// `limits`, charged as a turn's merge is ([`crate::workspace::walk`]).
pub fn write(
    workspace: &Path,
    rel: &str,
    bytes: &[u8],
    if_match: Option<&str>,
    quota_mb: u64,
    limits: WalkLimits,
) -> FilesResult<FileChange> {
    let root = WorkspaceRoot::open(workspace)?;
    let now = current(&root, rel)?;
    check_match(rel, now.as_ref(), if_match)?;
    let used = root.usage(limits).map_err(FilesError::Limit)?;
    // A new file adds an entry, and so does each parent it needs.
    let new_entries = match &now {
        Some(_) => 0,
        None => missing_parents(&root, rel) + 1,
    };
    if used.entries + new_entries > limits.max_entries {
        return Err(FilesError::TooManyEntries {
            path: rel.to_owned(),
            limit: limits.max_entries,
        });
    }
    let old = now.as_ref().map_or(0, |(_, s)| file_cost(*s));
    let total = used.cost.saturating_sub(old)
        + file_cost(bytes.len() as u64)
        + new_entries.saturating_sub(1) * BLOCK;
    if total > quota_mb << 20 {
        return Err(FilesError::OverQuota {
            path: rel.to_owned(),
            size: bytes.len() as u64,
            total,
            quota_mb,
        });
    }
    root.write_atomic(rel, bytes)?;
    Ok(FileChange {
        path: rel.to_owned(),
        before_hash: now.map(|(h, _)| h),
        hash: Some(hash_bytes(bytes)),
        size: bytes.len() as u64,
    })
}

/// How many directories on the way to `rel` do not exist yet.
fn missing_parents(root: &WorkspaceRoot, rel: &str) -> u64 {
    let Ok(comps) = components(rel) else { return 0 };
    let dirs = comps.len().saturating_sub(1);
    let mut path = String::new();
    for (i, c) in comps.iter().take(dirs).enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&c.to_string_lossy());
        if root.open_dir(&path).is_err() {
            return (dirs - i) as u64;
        }
    }
    0
}

/// Deletes the regular file at `rel`, if it still has the hash `if_match`.
pub fn delete(workspace: &Path, rel: &str, if_match: Option<&str>) -> FilesResult<FileChange> {
    let root = WorkspaceRoot::open(workspace)?;
    let Some(now) = current(&root, rel)? else {
        return Err(SafePathError::NotFound(rel.to_owned()).into());
    };
    check_match(rel, Some(&now), if_match)?;
    // `current` proved a regular file under a link-free path; `remove`
    // unlinks the name without following anything.
    root.remove(rel)?;
    Ok(FileChange {
        path: rel.to_owned(),
        before_hash: Some(now.0),
        hash: None,
        size: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_check_the_hash_and_the_quota_before_touching_anything() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path();
        std::fs::write(ws.join("a.md"), "one").unwrap();
        let h = hash_bytes(b"one");
        assert!(matches!(
            write(ws, "a.md", b"two", Some("0000"), 1, WalkLimits::default()),
            Err(FilesError::Stale { .. })
        ));
        assert_eq!(std::fs::read(ws.join("a.md")).unwrap(), b"one");
        let big = vec![b'x'; (1 << 20) + 1];
        assert!(matches!(
            write(ws, "b.md", &big, None, 1, WalkLimits::default()),
            Err(FilesError::OverQuota { .. })
        ));
        assert!(!ws.join("b.md").exists());
        let c = write(ws, "a.md", b"two", Some(&h), 1, WalkLimits::default()).unwrap();
        assert_eq!(c.before_hash.as_deref(), Some(h.as_str()));
        assert_eq!(c.hash, Some(hash_bytes(b"two")));
        assert!(matches!(
            delete(ws, "a.md", Some(&h)),
            Err(FilesError::Stale { .. })
        ));
        delete(ws, "a.md", c.hash.as_deref()).unwrap();
        assert!(!ws.join("a.md").exists());
        assert!(matches!(file_path("."), Err(FilesError::Empty)));
        assert_eq!(file_path("./k/./n.md").unwrap(), "k/n.md");
    }
}
