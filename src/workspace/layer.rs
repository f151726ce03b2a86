//! The per-turn workspace layer: an overlay whose lower is the space's
//! workspace and whose upper lives on a tmpfs sized to what the workspace
//! quota (`sandbox.workspace_mb`) has left. Tools see the merged view.
//!
//! Why an overlay: the mount itself bounds what a turn can write (a full
//! tmpfs answers `ENOSPC`; nothing reaches the host disk), a failed or
//! stopped turn leaves the workspace exactly as it was (its upper is thrown
//! away), a successful turn's changes are merged in one pass after its
//! sandbox is gone, and an `ask` gets its private copy in O(1) (an upper
//! that is never merged).
//!
//! Must never: merge while a sandbox can still write the upper, follow a
//! symlink while merging (every step goes through [`WorkspaceRoot`]), keep a
//! turn's writes past the quota, or leave a mount behind (drop unmounts;
//! [`sweep_scratch`] unmounts what a killed host left).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::safe::{Entry, EntryKind, WorkspaceRoot};
use super::walk::{remove_path, WalkError, WalkLimits};

/// Room above the allowance so a turn that goes over is seen going over
/// (rather than every write stopping exactly at the line).
const HEADROOM: u64 = 1 << 20;

/// Inodes the tmpfs holds beyond the entries the workspace may still gain:
/// the overlay's own work directory, whiteouts and copied-up parents.
const INODE_HEADROOM: u64 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(
        "this turn went past the workspace quota (sandbox.workspace_mb = {quota_mb}): it wrote \
         {written} bytes where {allowance} were left; nothing it wrote was kept"
    )]
    OverQuota {
        quota_mb: u64,
        allowance: u64,
        written: u64,
    },
    #[error(
        "after this turn the workspace would be charged {cost} bytes ({bytes} bytes of files at \
         their full length, {entries} entries at 4 KiB each), past its quota \
         (sandbox.workspace_mb = {quota_mb}); nothing it wrote was kept"
    )]
    WorkspaceOverQuota {
        quota_mb: u64,
        cost: u64,
        bytes: u64,
        entries: u64,
    },
    #[error("this turn's workspace is too large to keep: {0}; nothing it wrote was kept")]
    Limit(WalkError),
    #[error("cannot set up the turn's bounded workspace: {0}")]
    Setup(String),
    #[error(
        "cannot merge the turn's changes into the workspace: {0}; the workspace was left as it \
         was before the turn"
    )]
    Commit(String),
    #[error(
        "cannot merge the turn's changes into the workspace ({error}), and undoing the partial \
         merge failed too ({undo}): the workspace may hold part of the turn"
    )]
    CommitUndo { error: String, undo: String },
}

/// How much a layer may hold.
#[derive(Debug, Clone, Copy)]
pub enum LayerBudget {
    /// A turn whose changes are merged: what the quota leaves after what the
    /// workspace already uses (measured at mount, within `limits`).
    RemainingOf { quota_mb: u64, limits: WalkLimits },
    /// A throwaway (an ask): the whole quota, without measuring (O(1)).
    Throwaway { quota_mb: u64, limits: WalkLimits },
}

/// One path a turn changed in its layer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct LayerChange {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub kind: ChangeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created or rewritten (a file or a symlink).
    Written,
    Deleted,
}

/// One turn's (or one ask's) overlay over a workspace.
#[derive(Debug)]
pub struct TurnLayer {
    live: PathBuf,
    scratch: PathBuf,
    /// The tmpfs holding `upper/` and `work/`.
    layer: PathBuf,
    merged: PathBuf,
    quota_mb: u64,
    limits: WalkLimits,
    /// Bytes the turn may add to the workspace.
    allowance: u64,
    mounted: bool,
}

impl TurnLayer {
    /// Mounts a layer over `live` under `<scratch_root>/<name>/`.
    pub fn mount(
        live: &Path,
        scratch_root: &Path,
        name: &str,
        budget: LayerBudget,
    ) -> Result<Self, LayerError> {
        let setup =
            |what: &str, e: &dyn std::fmt::Display| LayerError::Setup(format!("{what}: {e}"));
        let root = WorkspaceRoot::open(live).map_err(|e| setup("opening the workspace", &e))?;
        let (quota_mb, limits, allowance, inodes) = match budget {
            LayerBudget::RemainingOf { quota_mb, limits } => {
                let used = root.usage(limits).map_err(|e| match e {
                    WalkError::Io { .. } => setup("measuring the workspace", &e),
                    limit => LayerError::Limit(limit),
                })?;
                (
                    quota_mb,
                    limits,
                    (quota_mb << 20).saturating_sub(used.cost),
                    limits.max_entries.saturating_sub(used.entries),
                )
            }
            LayerBudget::Throwaway { quota_mb, limits } => {
                (quota_mb, limits, quota_mb << 20, limits.max_entries)
            }
        };
        std::fs::create_dir_all(scratch_root)
            .map_err(|e| setup("creating the scratch root", &e))?;
        let _ = std::fs::set_permissions(scratch_root, std::fs::Permissions::from_mode(0o700));
        let scratch = scratch_root.join(name);
        std::fs::create_dir(&scratch).map_err(|e| setup("creating the scratch directory", &e))?;
        let mut me = Self {
            live: live.to_owned(),
            layer: scratch.join("layer"),
            merged: scratch.join("merged"),
            scratch,
            quota_mb,
            limits,
            allowance,
            mounted: false,
        };
        std::fs::create_dir(&me.layer).map_err(|e| setup("creating the layer", &e))?;
        std::fs::create_dir(&me.merged).map_err(|e| setup("creating the merged view", &e))?;
        me.mounted = true;
        // nr_inodes: directories and empty files cost a tmpfs no bytes, so
        // its size alone would let a turn make a million of them.
        mount(
            "tmpfs",
            &me.layer,
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            &format!(
                "size={},nr_inodes={},mode=0700",
                allowance + HEADROOM,
                inodes + INODE_HEADROOM
            ),
        )
        .map_err(|e| setup("mounting the quota tmpfs (needs root or CAP_SYS_ADMIN)", &e))?;
        let upper = me.layer.join("upper");
        let work = me.layer.join("work");
        std::fs::create_dir(&upper).map_err(|e| setup("creating the upper directory", &e))?;
        std::fs::create_dir(&work).map_err(|e| setup("creating the overlay work directory", &e))?;
        // The merged root shows the upper's owner and mode: make them the
        // workspace's, so the sandbox user may write where it could before.
        let meta = std::fs::metadata(live).map_err(|e| setup("reading the workspace", &e))?;
        std::os::unix::fs::chown(&upper, Some(meta.uid()), Some(meta.gid()))
            .map_err(|e| setup("giving the upper directory the workspace's owner", &e))?;
        std::fs::set_permissions(
            &upper,
            std::fs::Permissions::from_mode(meta.mode() & 0o7777),
        )
        .map_err(|e| setup("giving the upper directory the workspace's mode", &e))?;
        // noexec: a turn may write files, not programs of its own to run
        // (a bind of this mount into a container or bubblewrap keeps it).
        // The layers are named by descriptor: overlay shows its options
        // as given in every mountinfo that can see the mount (a container's
        // and bubblewrap's included), and a host path there would tell a
        // turn where the data dir lives. `/proc/self/fd/N` is resolved to
        // the directory at mount time and shown as just that.
        let open =
            |p: &Path| std::fs::File::open(p).map_err(|e| setup("opening a layer directory", &e));
        // The lower is the workspace already held open, link-free, above.
        let (upper_fd, work_fd) = (open(&upper)?, open(&work)?);
        mount(
            "overlay",
            &me.merged,
            "overlay",
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            &format!(
                "lowerdir=/proc/self/fd/{},upperdir=/proc/self/fd/{},workdir=/proc/self/fd/{}",
                root.raw_fd(),
                upper_fd.as_raw_fd(),
                work_fd.as_raw_fd()
            ),
        )
        .map_err(|e| setup("mounting the overlay", &e))?;
        Ok(me)
    }

    /// The directory tools work in.
    pub fn merged(&self) -> &Path {
        &self.merged
    }

    /// Bytes written into the upper so far (whole copied-up files count).
    pub fn written(&self) -> u64 {
        statvfs_used(&self.layer).unwrap_or(u64::MAX)
    }

    /// Fails once the turn has written past what the quota leaves.
    pub fn check_quota(&self) -> Result<(), LayerError> {
        let written = self.written();
        if written > self.allowance {
            return Err(LayerError::OverQuota {
                quota_mb: self.quota_mb,
                allowance: self.allowance,
                written,
            });
        }
        Ok(())
    }

    /// Measures the workspace as the merge would leave it (the merged
    /// view, whole): within the limits and the quota, or refused. Nothing
    /// has reached the workspace yet when this fails.
    fn check_merged(&self) -> Result<(), LayerError> {
        let merged = WorkspaceRoot::open(&self.merged)
            .map_err(|e| LayerError::Commit(format!("opening the merged view: {e}")))?;
        let after = merged.usage(self.limits).map_err(|e| match e {
            WalkError::Io { .. } => LayerError::Commit(format!("measuring the merged view: {e}")),
            limit => LayerError::Limit(limit),
        })?;
        if after.cost > self.quota_mb << 20 {
            return Err(LayerError::WorkspaceOverQuota {
                quota_mb: self.quota_mb,
                cost: after.cost,
                bytes: after.bytes,
                entries: after.entries,
            });
        }
        Ok(())
    }

    /// Merges the turn's changes into the workspace and removes the layer.
    /// Call only once nothing can write the merged view any more. All or
    /// nothing: on any failure the workspace is as it was before the turn.
    pub fn commit(self) -> Result<(), LayerError> {
        self.commit_with(&mut OpBudget::unlimited())
    }

    fn commit_with(mut self, ops: &mut OpBudget) -> Result<(), LayerError> {
        let checked = self.check_quota().and_then(|()| self.check_merged());
        if let Err(e) = checked {
            self.teardown();
            return Err(e);
        }
        let result = self.merge(ops);
        self.teardown();
        result
    }

    fn merge(&mut self, ops: &mut OpBudget) -> Result<(), LayerError> {
        let open = |p: &Path, what: &str| {
            WorkspaceRoot::open(p).map_err(|e| LayerError::Commit(format!("opening {what}: {e}")))
        };
        let upper = open(&self.layer.join("upper"), "the turn's upper layer")?;
        let live = open(&self.live, "the workspace")?;
        // Unmount first: a lower changed under its own mounted overlay
        // gives that overlay an undefined view.
        unmount(&self.merged).map_err(|e| LayerError::Commit(format!("unmounting: {e}")))?;
        // Replaced and deleted entries are moved here, not removed, so a
        // failure can put them back; it goes with the scratch directory.
        let trash_path = self.scratch.join("trash");
        std::fs::create_dir(&trash_path)
            .map_err(|e| LayerError::Commit(format!("creating the merge's trash: {e}")))?;
        let trash = open(&trash_path, "the merge's trash")?;
        let mut journal = Journal::new(trash);
        match merge_tree(&upper, &live, &mut journal, self.limits, ops) {
            Ok(()) => Ok(()),
            Err(e) => match journal.undo(&live) {
                Ok(()) => Err(LayerError::Commit(e.to_string())),
                Err(undo) => {
                    tracing::error!(workspace = %self.live.display(), error = %e, undo = %undo,
                        "a failed merge could not be undone");
                    Err(LayerError::CommitUndo {
                        error: e.to_string(),
                        undo: undo.to_string(),
                    })
                }
            },
        }
    }

    /// What the turn changed in its copy, read from the upper layer (for an
    /// `ask`, whose copy is thrown away: what it would have written). Files
    /// and symlinks written, entries deleted (whiteouts), sorted; at most
    /// `max`, and `true` when there were more. Call once nothing can write
    /// the upper; every step is a no-follow open below the layer.
    pub fn changes(&self, max: usize) -> io::Result<(Vec<LayerChange>, bool)> {
        let upper = WorkspaceRoot::open(&self.layer.join("upper"))
            .map_err(|e| io::Error::other(format!("opening the upper layer: {e}")))?;
        let mut out = Vec::new();
        let mut more = false;
        let mut stack = vec![(upper, String::new(), 0usize)];
        while let Some((dir, prefix, depth)) = stack.pop() {
            for e in dir.entries()? {
                let path = format!("{prefix}{}", e.name.to_string_lossy());
                let change = match e.kind {
                    EntryKind::Other if is_whiteout(&e) => Some(ChangeKind::Deleted),
                    EntryKind::File | EntryKind::Symlink => Some(ChangeKind::Written),
                    EntryKind::Dir if depth < self.limits.max_depth => {
                        stack.push((dir.child_dir(&e.name)?, format!("{path}/"), depth + 1));
                        None
                    }
                    EntryKind::Dir | EntryKind::Other => None,
                };
                if let Some(kind) = change {
                    if out.len() == max {
                        more = true;
                        break;
                    }
                    out.push(LayerChange { path, kind });
                }
            }
            if more {
                break;
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok((out, more))
    }

    /// Throws the turn's changes away.
    pub fn discard(mut self) {
        self.teardown();
    }

    fn teardown(&mut self) {
        if self.mounted {
            for p in [&self.merged, &self.layer] {
                if let Err(e) = unmount(p) {
                    if e.raw_os_error() != Some(libc::EINVAL) {
                        tracing::error!(path = %p.display(), error = %e, "cannot unmount a turn layer");
                    }
                }
            }
            self.mounted = false;
        }
        // Iterative: the trash may hold whatever tree a turn replaced.
        if let Err(e) = remove_path(&self.scratch) {
            tracing::error!(path = %self.scratch.display(), error = %e, "cannot remove a turn's scratch directory");
        }
    }
}

impl Drop for TurnLayer {
    fn drop(&mut self) {
        if self.mounted || self.scratch.exists() {
            self.teardown();
        }
    }
}

/// How many merge steps may still run; tests stop a merge midway with it.
#[derive(Debug)]
struct OpBudget(Option<usize>);

impl OpBudget {
    fn unlimited() -> Self {
        Self(None)
    }

    fn spend(&mut self) -> io::Result<()> {
        match &mut self.0 {
            None => Ok(()),
            Some(0) => Err(io::Error::other("the merge was stopped midway (test)")),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
        }
    }
}

/// One step of a merge, as it is undone.
#[derive(Debug)]
enum Undo {
    /// `name` did not exist in directory `dir` before: remove it.
    Created { dir: usize, name: OsString },
    /// The old `name` of `dir` was moved to the trash as `slot`: put it back.
    Moved {
        dir: usize,
        name: OsString,
        slot: OsString,
    },
    /// Directory `dir` existed and was merged into: its owner, mode and
    /// modification time before.
    Meta { dir: usize, was: Entry },
}

/// Everything a merge did, so a failure midway can put the workspace back
/// as it was. Directories are named by their path from the workspace root
/// (`dirs`), not held open: a merge may touch a hundred thousand of them.
#[derive(Debug)]
struct Journal {
    trash: WorkspaceRoot,
    dirs: Vec<Vec<OsString>>,
    steps: Vec<Undo>,
    slots: u64,
}

impl Journal {
    fn new(trash: WorkspaceRoot) -> Self {
        Self {
            trash,
            dirs: vec![Vec::new()],
            steps: Vec::new(),
            slots: 0,
        }
    }

    fn subdir(&mut self, parent: usize, name: &OsStr) -> usize {
        let mut path = self.dirs.get(parent).cloned().unwrap_or_default();
        path.push(name.to_owned());
        self.dirs.push(path);
        self.dirs.len() - 1
    }

    /// Moves `name` of `live` (directory `dir`) into the trash, O(1)
    /// whatever it holds.
    fn move_away(&mut self, live: &WorkspaceRoot, dir: usize, name: &OsStr) -> io::Result<()> {
        self.slots += 1;
        let slot = OsString::from(self.slots.to_string());
        live.rename_to(name, &self.trash, &slot)?;
        self.steps.push(Undo::Moved {
            dir,
            name: name.to_owned(),
            slot,
        });
        Ok(())
    }

    /// Renames `tmp` (already journalled as created) to `name`, moving an
    /// entry already there away first.
    fn place(
        &mut self,
        live: &WorkspaceRoot,
        dir: usize,
        tmp: &OsStr,
        name: &OsStr,
    ) -> io::Result<()> {
        if live.stat_entry(name)?.is_some() {
            self.move_away(live, dir, name)?;
        }
        live.rename_in(tmp, name)?;
        self.steps.push(Undo::Created {
            dir,
            name: name.to_owned(),
        });
        Ok(())
    }

    fn open_dir(&self, live: &WorkspaceRoot, dir: usize) -> io::Result<WorkspaceRoot> {
        let mut cur = live.try_clone()?;
        for c in self.dirs.get(dir).map(Vec::as_slice).unwrap_or_default() {
            cur = cur.child_dir(c)?;
        }
        Ok(cur)
    }

    /// Undoes every step, newest first.
    fn undo(&mut self, live: &WorkspaceRoot) -> io::Result<()> {
        while let Some(step) = self.steps.pop() {
            match step {
                Undo::Created { dir, name } => {
                    let d = match self.open_dir(live, dir) {
                        Ok(d) => d,
                        // Its directory is gone: so is the entry.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    };
                    match d.remove_entry(&name) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
                Undo::Moved { dir, name, slot } => {
                    let d = self.open_dir(live, dir)?;
                    if d.stat_entry(&name)?.is_some() {
                        d.remove_entry(&name)?;
                    }
                    self.trash.rename_to(&slot, &d, &name)?;
                }
                Undo::Meta { dir, was } => {
                    let d = self.open_dir(live, dir)?;
                    d.set_meta(None, &was);
                }
            }
        }
        Ok(())
    }
}

/// Applies the upper tree onto the live one, iteratively: whiteouts delete,
/// opaque directories replace, files and symlinks are renamed into place
/// (atomic per file), owner, mode and mtime kept. Every step is journalled.
fn merge_tree(
    upper: &WorkspaceRoot,
    live: &WorkspaceRoot,
    journal: &mut Journal,
    limits: WalkLimits,
    ops: &mut OpBudget,
) -> io::Result<()> {
    struct Frame {
        upper: WorkspaceRoot,
        live: WorkspaceRoot,
        dir: usize,
        pending: Vec<Entry>,
        /// The upper directory's metadata, applied once its children are in.
        meta: Option<Entry>,
    }
    let listing = |dir: &WorkspaceRoot| -> io::Result<Vec<Entry>> {
        let mut e = dir.entries()?;
        e.reverse();
        Ok(e)
    };
    if let Some(root) = live.stat_entry(OsStr::new("."))? {
        journal.steps.push(Undo::Meta { dir: 0, was: root });
    }
    let mut stack = vec![Frame {
        upper: upper.try_clone()?,
        live: live.try_clone()?,
        dir: 0,
        pending: listing(upper)?,
        meta: None,
    }];
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else {
            break;
        };
        let Some(e) = top.pending.pop() else {
            if let Some(done) = stack.pop() {
                if let Some(m) = done.meta.as_ref() {
                    done.live.set_meta(None, m);
                }
            }
            continue;
        };
        ops.spend()?;
        let name = e.name.as_os_str();
        match e.kind {
            EntryKind::Other if is_whiteout(&e) => {
                if top.live.stat_entry(name)?.is_some() {
                    journal.move_away(&top.live, top.dir, name)?;
                }
            }
            EntryKind::Other => {}
            EntryKind::Dir => {
                if depth > limits.max_depth {
                    return Err(io::Error::other(format!(
                        "the turn's tree is nested deeper than workspace.max_depth = {}",
                        limits.max_depth
                    )));
                }
                let up = top.upper.child_dir(name)?;
                let replace = is_opaque(&up);
                let child = journal.subdir(top.dir, name);
                match top.live.stat_entry(name)? {
                    Some(old) if old.kind == EntryKind::Dir && !replace => {
                        journal.steps.push(Undo::Meta {
                            dir: child,
                            was: old,
                        });
                    }
                    found => {
                        if found.is_some() {
                            journal.move_away(&top.live, top.dir, name)?;
                        }
                        top.live.mkdir(name, 0o700)?;
                        journal.steps.push(Undo::Created {
                            dir: top.dir,
                            name: name.to_owned(),
                        });
                    }
                }
                let sub = top.live.child_dir(name)?;
                let pending = listing(&up)?;
                stack.push(Frame {
                    upper: up,
                    live: sub,
                    dir: child,
                    pending,
                    meta: Some(e),
                });
            }
            EntryKind::File => {
                let from = top.upper.child_file(name)?;
                let (tmp, mut to) = top.live.create_temp(0o600)?;
                journal.steps.push(Undo::Created {
                    dir: top.dir,
                    name: tmp.clone(),
                });
                io::copy(&mut &from, &mut to)?;
                top.live.set_meta(Some(&to), &e);
                to.sync_all()?;
                journal.place(&top.live, top.dir, &tmp, name)?;
            }
            EntryKind::Symlink => {
                let target = top.upper.readlink(name)?;
                let tmp = super::safe::temp_name();
                top.live.symlink(&target, &tmp)?;
                journal.steps.push(Undo::Created {
                    dir: top.dir,
                    name: tmp.clone(),
                });
                journal.place(&top.live, top.dir, &tmp, name)?;
            }
        }
    }
    Ok(())
}

/// An overlay whiteout: a character device numbered 0:0.
fn is_whiteout(e: &Entry) -> bool {
    e.mode & libc::S_IFMT == libc::S_IFCHR && e.rdev == 0
}

/// An opaque directory hides everything below it in the lower layer.
fn is_opaque(dir: &WorkspaceRoot) -> bool {
    ["trusted.overlay.opaque", "user.overlay.opaque"]
        .iter()
        .any(|attr| {
            let Ok(name) = CString::new(*attr) else {
                return false;
            };
            let mut buf = [0u8; 4];
            // SAFETY: a valid descriptor, name and buffer; result checked.
            let n = unsafe {
                libc::fgetxattr(
                    dir.raw_fd(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            n > 0 && buf[0] == b'y'
        })
}

/// Unmounts everything mounted below `scratch_root` (deepest first) and
/// removes what is in it: the layers and copies a killed host left behind.
/// Returns how many entries were removed.
pub fn sweep_scratch(scratch_root: &Path) -> io::Result<usize> {
    let root = match std::fs::canonicalize(scratch_root) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut points: Vec<PathBuf> = mount_points()?
        .into_iter()
        .filter(|p| p.starts_with(&root) && p != &root)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in &points {
        unmount(p)?;
    }
    let mut removed = 0;
    for entry in std::fs::read_dir(&root)? {
        let path = entry?.path();
        // Iterative, link-free: whatever tree a turn left there.
        remove_path(&path)?;
        removed += 1;
    }
    Ok(removed)
}

/// Mount points of this mount namespace, from `/proc/self/mountinfo`.
pub fn mount_points() -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .collect())
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mount(
    src: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let c = |s: &[u8]| CString::new(s).map_err(io::Error::other);
    let (src, tgt, fs, data) = (
        c(src.as_bytes())?,
        c(target.as_os_str().as_bytes())?,
        c(fstype.as_bytes())?,
        c(data.as_bytes())?,
    );
    // SAFETY: valid NUL-terminated strings; the result is checked.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fs.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn unmount(target: &Path) -> io::Result<()> {
    let t = CString::new(target.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: a valid path; MNT_DETACH so a container still holding a bind
    // of it cannot keep the host from going on.
    let r = unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn statvfs_used(path: &Path) -> io::Result<u64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: zeroed statvfs is a valid out-parameter; result checked.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    fn tree(root: &Path) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = walkdir::WalkDir::new(root)
            .follow_links(false)
            .min_depth(1)
            .into_iter()
            .map(|e| {
                let e = e.unwrap();
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                let what = if e.file_type().is_symlink() {
                    format!("-> {}", std::fs::read_link(e.path()).unwrap().display())
                } else if e.file_type().is_dir() {
                    "dir".into()
                } else {
                    String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned()
                };
                (rel, what)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_committed_layer_applies_writes_deletes_and_replacements() {
        assert!(
            is_root(),
            "the layer tests need root (as CI and the dev machines run)"
        );
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        std::fs::create_dir_all(live.join("old/deep")).unwrap();
        std::fs::write(live.join("keep.txt"), "keep").unwrap();
        std::fs::write(live.join("gone.txt"), "gone").unwrap();
        std::fs::write(live.join("old/deep/x"), "x").unwrap();
        std::fs::write(live.join("edit.txt"), "v1").unwrap();
        let layer = TurnLayer::mount(
            &live,
            &t.path().join("tmp"),
            "turn-1",
            LayerBudget::RemainingOf {
                quota_mb: 16,
                limits: WalkLimits::default(),
            },
        )
        .unwrap();
        let m = layer.merged().to_owned();
        std::fs::remove_file(m.join("gone.txt")).unwrap();
        std::fs::remove_dir_all(m.join("old")).unwrap();
        std::fs::create_dir(m.join("old")).unwrap();
        std::fs::write(m.join("old/new"), "n").unwrap();
        std::fs::write(m.join("edit.txt"), "v2").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", m.join("link")).unwrap();
        std::fs::create_dir_all(m.join("a/b")).unwrap();
        std::fs::write(m.join("a/b/c.md"), "c").unwrap();
        assert_eq!(std::fs::read(live.join("edit.txt")).unwrap(), b"v1");
        layer.commit().unwrap();
        assert_eq!(
            tree(&live),
            vec![
                ("a".into(), "dir".into()),
                ("a/b".into(), "dir".into()),
                ("a/b/c.md".into(), "c".into()),
                ("edit.txt".into(), "v2".into()),
                ("keep.txt".into(), "keep".into()),
                ("link".into(), "-> /etc/passwd".into()),
                ("old".into(), "dir".into()),
                ("old/new".into(), "n".into()),
            ]
        );
        assert_eq!(std::fs::read_dir(t.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_throwaway_copy_lists_what_it_wrote_and_deleted_and_leaves_the_workspace() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        std::fs::create_dir_all(live.join("notes")).unwrap();
        for f in ["keep.txt", "gone.txt", "notes/old.md"] {
            std::fs::write(live.join(f), "v1").unwrap();
        }
        let before = tree(&live);
        let layer = TurnLayer::mount(
            &live,
            &t.path().join("tmp"),
            "ask-list",
            LayerBudget::Throwaway {
                quota_mb: 4,
                limits: WalkLimits::default(),
            },
        )
        .unwrap();
        let m = layer.merged().to_owned();
        std::fs::remove_file(m.join("gone.txt")).unwrap();
        std::fs::write(m.join("notes/old.md"), "v2").unwrap();
        std::fs::create_dir_all(m.join("a/b")).unwrap();
        std::fs::write(m.join("a/b/new\nline.txt"), "n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", m.join("link")).unwrap();
        let (changes, more) = layer.changes(10).unwrap();
        let listed: Vec<(String, ChangeKind)> =
            changes.into_iter().map(|c| (c.path, c.kind)).collect();
        assert_eq!(
            listed,
            vec![
                ("a/b/new\nline.txt".to_owned(), ChangeKind::Written),
                ("gone.txt".to_owned(), ChangeKind::Deleted),
                ("link".to_owned(), ChangeKind::Written),
                ("notes/old.md".to_owned(), ChangeKind::Written),
            ]
        );
        assert!(!more);
        let (two, more) = layer.changes(2).unwrap();
        assert_eq!((two.len(), more), (2, true));
        layer.discard();
        assert_eq!(tree(&live), before);
    }

    #[test]
    fn a_turn_past_the_quota_keeps_nothing() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(live.join("a.txt"), "a").unwrap();
        let before = tree(&live);
        let layer = TurnLayer::mount(
            &live,
            &t.path().join("tmp"),
            "turn-2",
            LayerBudget::RemainingOf {
                quota_mb: 1,
                limits: WalkLimits::default(),
            },
        )
        .unwrap();
        let big = vec![7u8; 3 << 20];
        // The tmpfs stops the write itself: nothing past quota + headroom.
        assert!(std::fs::write(layer.merged().join("big"), &big).is_err());
        assert!(matches!(
            layer.check_quota(),
            Err(LayerError::OverQuota { .. })
        ));
        assert!(matches!(layer.commit(), Err(LayerError::OverQuota { .. })));
        assert_eq!(tree(&live), before);
    }

    #[test]
    fn sweep_unmounts_and_removes_what_a_killed_host_left() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        std::fs::create_dir_all(&live).unwrap();
        let scratch = t.path().join("tmp");
        let layer = TurnLayer::mount(
            &live,
            &scratch,
            "ask-1",
            LayerBudget::Throwaway {
                quota_mb: 4,
                limits: WalkLimits::default(),
            },
        )
        .unwrap();
        std::fs::write(layer.merged().join("f"), "x").unwrap();
        std::mem::forget(layer); // as if the host had been SIGKILLed
        assert_eq!(sweep_scratch(&scratch).unwrap(), 1);
        assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
        assert!(!mount_points()
            .unwrap()
            .iter()
            .any(|p| p.starts_with(&scratch)));
        assert!(!live.join("f").exists());
    }

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    /// Every entry below `root` with what it holds, its mode and owner.
    fn full_tree(root: &Path) -> Vec<(String, String, u32, u32)> {
        let mut out: Vec<_> = walkdir::WalkDir::new(root)
            .follow_links(false)
            .min_depth(1)
            .into_iter()
            .map(|e| {
                let e = e.unwrap();
                let meta = e.path().symlink_metadata().unwrap();
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                let what = if e.file_type().is_symlink() {
                    format!("-> {}", std::fs::read_link(e.path()).unwrap().display())
                } else if e.file_type().is_dir() {
                    "dir".into()
                } else {
                    String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned()
                };
                (rel, what, meta.mode(), meta.uid())
            })
            .collect();
        out.sort();
        out
    }

    fn budget(quota_mb: u64) -> LayerBudget {
        LayerBudget::RemainingOf {
            quota_mb,
            limits: WalkLimits::default(),
        }
    }

    /// A workspace every kind of merge step has something to do in.
    fn busy_workspace(live: &Path) {
        std::fs::create_dir_all(live.join("old/deep")).unwrap();
        std::fs::create_dir_all(live.join("dir2/sub")).unwrap();
        std::fs::write(live.join("dir2/sub/f"), "f").unwrap();
        std::fs::write(live.join("keep.txt"), "keep").unwrap();
        std::fs::write(live.join("gone.txt"), "gone").unwrap();
        std::fs::write(live.join("old/deep/x"), "x").unwrap();
        std::fs::write(live.join("edit.txt"), "v1").unwrap();
        std::fs::set_permissions(
            live.join("edit.txt"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::os::unix::fs::symlink("keep.txt", live.join("link")).unwrap();
    }

    /// One turn's worth of every change: edits, deletes, a directory
    /// replaced by a file and by a new directory, new trees, links.
    fn busy_turn(m: &Path) {
        std::fs::write(m.join("edit.txt"), "v2").unwrap();
        std::fs::remove_file(m.join("gone.txt")).unwrap();
        std::fs::remove_dir_all(m.join("old")).unwrap();
        std::fs::create_dir(m.join("old")).unwrap();
        std::fs::write(m.join("old/new"), "n").unwrap();
        std::fs::remove_dir_all(m.join("dir2")).unwrap();
        std::fs::write(m.join("dir2"), "now a file").unwrap();
        std::fs::remove_file(m.join("link")).unwrap();
        std::os::unix::fs::symlink("edit.txt", m.join("link")).unwrap();
        std::fs::create_dir_all(m.join("a/b")).unwrap();
        std::fs::write(m.join("a/b/c.md"), "c").unwrap();
    }

    #[test]
    fn a_merge_stopped_at_any_step_leaves_the_workspace_as_it_was() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        busy_workspace(&live);
        let before = full_tree(&live);
        let mut failures = 0;
        for stop in 0.. {
            let layer = TurnLayer::mount(
                &live,
                &t.path().join("tmp"),
                &format!("turn-{stop}"),
                budget(16),
            )
            .unwrap();
            busy_turn(layer.merged());
            match layer.commit_with(&mut OpBudget(Some(stop))) {
                Err(e) => {
                    assert!(matches!(e, LayerError::Commit(_)), "{e}");
                    assert_eq!(full_tree(&live), before, "stopped after {stop} steps");
                    failures += 1;
                }
                Ok(()) => break,
            }
            assert!(stop < 100, "the merge never finished");
        }
        assert!(failures >= 9, "only {failures} steps were tried");
        let after = full_tree(&live);
        assert!(
            after.contains(&("dir2".into(), "now a file".into(), 0o100644, 0)),
            "{after:?}"
        );
        assert!(after.iter().any(|e| e.0 == "a/b/c.md" && e.1 == "c"));
        assert!(!after
            .iter()
            .any(|e| e.0.starts_with("gone") || e.0 == "old/deep"));
        assert_eq!(std::fs::read_dir(t.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_merge_that_runs_out_of_disk_midway_is_undone() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let small = t.path().join("small");
        std::fs::create_dir(&small).unwrap();
        mount("tmpfs", &small, "tmpfs", 0, "size=3m").unwrap();
        let _unmount = Unmount(small.clone());
        let live = small.join("ws");
        std::fs::create_dir(&live).unwrap();
        std::fs::write(live.join("AGENTS.md"), "be nice").unwrap();
        std::fs::write(live.join("c.txt"), "c").unwrap();
        std::fs::write(live.join("a.bin"), vec![1u8; 1 << 20]).unwrap();
        let before = full_tree(&live);
        let layer = TurnLayer::mount(&live, &small.join("tmp"), "turn", budget(16)).unwrap();
        let m = layer.merged().to_owned();
        std::fs::write(m.join("AGENTS.md"), "be mean").unwrap();
        std::fs::remove_file(m.join("c.txt")).unwrap();
        std::fs::write(m.join("z.bin"), vec![2u8; 5 << 19]).unwrap();
        let err = layer.commit().unwrap_err();
        assert!(
            matches!(err, LayerError::Commit(ref m) if m.contains("No space left")),
            "{err}"
        );
        assert!(err.to_string().contains("left as it was before the turn"));
        assert_eq!(full_tree(&live), before);
        assert_eq!(std::fs::read_dir(small.join("tmp")).unwrap().count(), 0);
    }

    /// A small ext4 filesystem on a loop device, unmounted on drop.
    struct LoopFs {
        mnt: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl LoopFs {
        fn new(mb: u64) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let img = dir.path().join("fs.img");
            std::fs::File::create(&img)
                .unwrap()
                .set_len(mb << 20)
                .unwrap();
            let st = std::process::Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&img)
                .status()
                .unwrap();
            assert!(st.success(), "mkfs.ext4");
            let mnt = dir.path().join("mnt");
            std::fs::create_dir(&mnt).unwrap();
            let st = std::process::Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&mnt)
                .status()
                .unwrap();
            assert!(st.success(), "mount -o loop (needs root and a loop device)");
            Self { mnt, _dir: dir }
        }

        fn used(&self) -> u64 {
            statvfs_used(&self.mnt).unwrap()
        }
    }

    impl Drop for LoopFs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.mnt).status();
        }
    }

    struct Unmount(PathBuf);

    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = unmount(&self.0);
        }
    }

    #[test]
    fn sparse_files_hard_links_floods_and_deep_trees_never_reach_a_small_disk() {
        assert!(is_root(), "the layer tests need root");
        let fs = LoopFs::new(64);
        let live = fs.mnt.join("ws");
        std::fs::create_dir(&live).unwrap();
        std::fs::write(live.join("AGENTS.md"), "be nice").unwrap();
        let scratch = fs.mnt.join("tmp");
        let before = full_tree(&live);
        let limits = WalkLimits {
            max_depth: 64,
            max_entries: 2_000,
        };
        let quota = LayerBudget::RemainingOf {
            quota_mb: 20,
            limits,
        };
        let used_before = fs.used();
        // The turn's writes; then what the commit must say.
        type Turn = fn(&Path);
        let turns: [(&str, Turn); 4] = [
            ("sparse", |m| {
                std::fs::File::create(m.join("sparse"))
                    .unwrap()
                    .set_len(50 << 30)
                    .unwrap();
            }),
            ("links", |m| {
                std::fs::write(m.join("five"), vec![1u8; 5 << 20]).unwrap();
                for i in 0..40 {
                    std::fs::hard_link(m.join("five"), m.join(format!("l{i}"))).unwrap();
                }
            }),
            ("flood", |m| {
                let made = (0..5_000)
                    .take_while(|i| std::fs::create_dir(m.join(format!("d{i}"))).is_ok())
                    .count();
                assert!(made < 5_000, "the tmpfs has no inode limit");
            }),
            ("deep", |m| {
                let mut p = m.to_path_buf();
                for _ in 0..100 {
                    p.push("d");
                }
                std::fs::create_dir_all(&p).unwrap();
            }),
        ];
        for (name, turn) in turns {
            let layer = TurnLayer::mount(&live, &scratch, name, quota).unwrap();
            turn(layer.merged());
            let err = layer.commit().unwrap_err();
            match name {
                "sparse" | "links" => {
                    assert!(
                        matches!(err, LayerError::WorkspaceOverQuota { .. }),
                        "{name}: {err}"
                    );
                }
                "flood" => assert!(
                    matches!(err, LayerError::Limit(WalkError::TooMany { limit: 2_000 })),
                    "{name}: {err}"
                ),
                _ => assert!(
                    matches!(err, LayerError::Limit(WalkError::TooDeep { limit: 64, .. })),
                    "{name}: {err}"
                ),
            }
            assert_eq!(full_tree(&live), before, "{name}");
            // Nothing of the turn is on the disk (a little slack for ext4's
            // own bookkeeping, far below one of the turn's files).
            assert!(
                fs.used() <= used_before + (256 << 10),
                "{name}: {} bytes more",
                fs.used() - used_before
            );
        }
        // A workspace already at its quota takes no more, dense or sparse.
        std::fs::write(live.join("full.bin"), vec![3u8; 19 << 20]).unwrap();
        let before = full_tree(&live);
        for (name, turn) in [
            (
                "dense",
                (|m: &Path| std::fs::write(m.join("more"), vec![4u8; 2 << 20]).unwrap()) as Turn,
            ),
            ("sparse-at-quota", |m| {
                std::fs::File::create(m.join("hole"))
                    .unwrap()
                    .set_len(8 << 20)
                    .unwrap();
            }),
        ] {
            let layer = TurnLayer::mount(&live, &scratch, name, quota).unwrap();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| turn(layer.merged())));
            let err = layer.commit().unwrap_err();
            assert!(
                matches!(
                    err,
                    LayerError::OverQuota { .. } | LayerError::WorkspaceOverQuota { .. }
                ),
                "{name}: {err}"
            );
            assert_eq!(full_tree(&live), before, "{name}");
        }
    }

    #[test]
    fn setuid_and_setgid_bits_never_survive_a_merge() {
        assert!(is_root(), "the layer tests need root");
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("ws");
        std::fs::create_dir(&live).unwrap();
        let layer = TurnLayer::mount(&live, &t.path().join("tmp"), "turn", budget(4)).unwrap();
        let f = layer.merged().join("prog");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o6755)).unwrap();
        layer.commit().unwrap();
        let mode = std::fs::metadata(live.join("prog")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755);
    }
}
