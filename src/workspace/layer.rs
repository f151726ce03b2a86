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

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::safe::{Entry, EntryKind, WorkspaceRoot};

/// Room above the allowance so a turn that goes over is seen going over
/// (rather than every write stopping exactly at the line).
const HEADROOM: u64 = 1 << 20;

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
    #[error("cannot set up the turn's bounded workspace: {0}")]
    Setup(String),
    #[error("cannot merge the turn's changes into the workspace: {0}")]
    Commit(String),
}

/// How much a layer may hold.
#[derive(Debug, Clone, Copy)]
pub enum LayerBudget {
    /// A turn whose changes are merged: what the quota leaves after what the
    /// workspace already uses (measured at mount).
    RemainingOf { quota_mb: u64 },
    /// A throwaway (an ask): the whole quota, without measuring (O(1)).
    Throwaway { quota_mb: u64 },
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
        let (quota_mb, allowance) = match budget {
            LayerBudget::RemainingOf { quota_mb } => {
                let used = root
                    .usage()
                    .map_err(|e| setup("measuring the workspace", &e))?;
                (quota_mb, (quota_mb << 20).saturating_sub(used))
            }
            LayerBudget::Throwaway { quota_mb } => (quota_mb, quota_mb << 20),
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
            allowance,
            mounted: false,
        };
        for p in [&me.live, &me.layer, &me.merged] {
            check_option_safe(p)?;
        }
        std::fs::create_dir(&me.layer).map_err(|e| setup("creating the layer", &e))?;
        std::fs::create_dir(&me.merged).map_err(|e| setup("creating the merged view", &e))?;
        me.mounted = true;
        mount(
            "tmpfs",
            &me.layer,
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            &format!("size={},mode=0700", allowance + HEADROOM),
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
        let (lower_fd, upper_fd, work_fd) = (open(live)?, open(&upper)?, open(&work)?);
        mount(
            "overlay",
            &me.merged,
            "overlay",
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            &format!(
                "lowerdir=/proc/self/fd/{},upperdir=/proc/self/fd/{},workdir=/proc/self/fd/{}",
                lower_fd.as_raw_fd(),
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

    /// Merges the turn's changes into the workspace and removes the layer.
    /// Call only once nothing can write the merged view any more.
    pub fn commit(mut self) -> Result<(), LayerError> {
        self.check_quota()?;
        let merge = || -> io::Result<()> {
            let upper = WorkspaceRoot::open(&self.layer.join("upper")).map_err(io::Error::other)?;
            let live = WorkspaceRoot::open(&self.live).map_err(io::Error::other)?;
            // Unmount first: a lower changed under its own mounted overlay
            // gives that overlay an undefined view.
            unmount(&self.merged)?;
            merge_dir(&upper, &live)
        };
        let result = merge().map_err(|e| LayerError::Commit(e.to_string()));
        self.teardown();
        result
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
        if let Err(e) = std::fs::remove_dir_all(&self.scratch) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::error!(path = %self.scratch.display(), error = %e, "cannot remove a turn's scratch directory");
            }
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

/// Applies one upper directory onto the matching live directory: whiteouts
/// delete, opaque directories replace, files and symlinks are renamed into
/// place (atomic per file), owner, mode and mtime kept.
fn merge_dir(upper: &WorkspaceRoot, live: &WorkspaceRoot) -> io::Result<()> {
    for e in upper.entries()? {
        let name = e.name.as_os_str();
        match e.kind {
            EntryKind::Other if is_whiteout(&e) => remove_if_there(live, name)?,
            EntryKind::Other => {}
            EntryKind::Dir => {
                let up = upper.child_dir(name)?;
                let replace = is_opaque(&up);
                match live.stat_entry(name)? {
                    Some(old) if old.kind == EntryKind::Dir && !replace => {}
                    Some(_) => {
                        live.remove_entry(name)?;
                        live.mkdir(name, 0o700)?;
                    }
                    None => live.mkdir(name, 0o700)?,
                }
                let sub = live.child_dir(name)?;
                merge_dir(&up, &sub)?;
                sub.set_meta(None, &e);
            }
            EntryKind::File => {
                let from = upper.child_file(name)?;
                let (tmp, mut to) = live.create_temp(0o600)?;
                io::copy(&mut &from, &mut to)?;
                live.set_meta(Some(&to), &e);
                to.sync_all()?;
                replace_with(live, &tmp, name)?;
            }
            EntryKind::Symlink => {
                let target = upper.readlink(name)?;
                let tmp = super::safe::temp_name();
                live.symlink(&target, &tmp)?;
                replace_with(live, &tmp, name)?;
            }
        }
    }
    Ok(())
}

fn replace_with(live: &WorkspaceRoot, tmp: &OsStr, name: &OsStr) -> io::Result<()> {
    if let Some(old) = live.stat_entry(name)? {
        if old.kind == EntryKind::Dir {
            live.remove_entry(name)?;
        }
    }
    live.rename_in(tmp, name).inspect_err(|_| {
        let _ = live.unlink(tmp, false);
    })
}

fn remove_if_there(live: &WorkspaceRoot, name: &OsStr) -> io::Result<()> {
    match live.remove_entry(name) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
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
        // Symlink-safe: remove_dir_all never follows a link it meets.
        match std::fs::symlink_metadata(&path)?.is_dir() {
            true => std::fs::remove_dir_all(&path)?,
            false => std::fs::remove_file(&path)?,
        }
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

/// Overlay mount options are a comma- and colon-separated list: a path
/// holding either (or a backslash) cannot be passed safely.
fn check_option_safe(p: &Path) -> Result<(), LayerError> {
    if p.as_os_str()
        .as_bytes()
        .iter()
        .any(|c| matches!(c, b',' | b':' | b'\\' | b'\n'))
    {
        return Err(LayerError::Setup(format!(
            "the path {} holds ',', ':' or '\\', which overlay mount options cannot carry; \
             use a data dir without them",
            p.display()
        )));
    }
    Ok(())
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
            LayerBudget::RemainingOf { quota_mb: 16 },
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
            LayerBudget::RemainingOf { quota_mb: 1 },
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
            LayerBudget::Throwaway { quota_mb: 4 },
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
}
