//! How a root host's bubblewrap runs its commands as `nobody` on the host.
//!
//! bubblewrap maps the sandbox's uid to the uid that started it: started by
//! a root host, a turn's processes were host root without capabilities, and
//! the files they left were root-owned with whatever modes they chose. So a
//! root host starts bwrap as [`NOBODY`]. bwrap then resolves every bind
//! source with nobody's rights, and the sources (the turn's layer, the API
//! socket's relay, `mrctl`, an extension's files) sit under directories
//! nobody cannot enter, the 0700 data dir first. Opening those to nobody is
//! not an option, so the forked child, still root, stages them: it takes a
//! private mount namespace, opens every source, covers `/tmp` (in that
//! namespace only) with a small tmpfs, binds each source there through its
//! descriptor, and only then drops to nobody and execs bwrap, whose options
//! name the staged copies. No other process sees the staging mounts.
//!
//! Must never: open the data dir to another uid, allocate between fork and
//! exec, exec bwrap still as root, or leave a bind source unstaged (an
//! option it does not know is refused, not passed through).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

use super::SandboxError;

/// The host uid and gid a root host's sandboxed commands run as (docker's
/// container user on a root host is the same).
pub const NOBODY: u32 = 65534;

/// Covered by the staging tmpfs in the child's private mount namespace.
const STAGE_DIR: &str = "/tmp";

/// More binds than this is a programming error, not a turn's doing.
const MAX_STAGED: usize = 32;

/// System directories bound at their own path; nobody may read them anyway.
const SYSTEM_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];

/// Whether this host runs as root, so its bubblewrap must drop to [`NOBODY`].
pub(super) fn host_is_root() -> bool {
    super::effective_ids().0 == 0
}

/// The binds to stage and the ids to drop to, made before the fork.
#[derive(Debug)]
pub(super) struct RootDrop {
    uid: u32,
    gid: u32,
    sources: Vec<CString>,
    targets: Vec<CString>,
}

impl RootDrop {
    /// Rewrites the bind sources in bwrap's options (`args`, without the
    /// program and its own `--args`) to staged paths, and returns what the
    /// child must stage.
    pub(super) fn stage(args: &mut [OsString], uid: u32, gid: u32) -> Result<Self, SandboxError> {
        let refuse = |why: String| SandboxError::Engine(format!("staging bwrap's binds: {why}"));
        let mut sources = Vec::new();
        let mut targets = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let option = args[i].to_string_lossy().into_owned();
            let arity = match option.as_str() {
                "--" => break,
                "--unshare-all" | "--die-with-parent" | "--new-session" => 0,
                "--cap-drop" | "--uid" | "--gid" | "--hostname" | "--size" | "--chdir"
                | "--proc" | "--dev" | "--tmpfs" | "--perms" => 1,
                "--symlink" => 2,
                "--bind" | "--ro-bind" => {
                    let Some(source) = args.get(i + 1).cloned() else {
                        return Err(refuse(format!("{option} without a source")));
                    };
                    let system = SYSTEM_DIRS.iter().any(|d| source.as_os_str() == *d);
                    if !system {
                        if sources.len() == MAX_STAGED {
                            return Err(refuse(format!("more than {MAX_STAGED} binds")));
                        }
                        // A missing source would surface as the child's bare
                        // errno ("command not found"): say it here instead.
                        std::fs::symlink_metadata(&source).map_err(|e| SandboxError::Io {
                            path: source.to_string_lossy().into_owned(),
                            source: e,
                        })?;
                        let target = format!("{STAGE_DIR}/bind-{}", sources.len());
                        sources.push(cstring(source.as_bytes(), &refuse)?);
                        targets.push(cstring(target.as_bytes(), &refuse)?);
                        args[i + 1] = OsString::from(target);
                    }
                    2
                }
                other => return Err(refuse(format!("unknown option `{other}`"))),
            };
            i += 1 + arity;
        }
        Ok(Self {
            uid,
            gid,
            sources,
            targets,
        })
    }

    /// Adds the staging and the drop as the command's last step before exec.
    pub(super) fn install(self, cmd: &mut tokio::process::Command) {
        // SAFETY: the closure only makes system calls on memory prepared
        // before the fork (no allocation, no lock); see `stage_in_child`.
        unsafe {
            cmd.pre_exec(move || self.stage_in_child());
        }
    }

    /// Runs in the forked child, before exec.
    fn stage_in_child(&self) -> std::io::Result<()> {
        use libc::{c_char, c_void};
        let check = |rc: libc::c_int| {
            if rc < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(rc)
            }
        };
        let null = std::ptr::null::<c_char>();
        let mut fds = [-1 as libc::c_int; MAX_STAGED];
        // SAFETY: plain system calls on NUL-terminated strings built before
        // the fork and on stack buffers; results are checked.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null::<c_void>(),
            ))?;
            for (fd, source) in fds.iter_mut().zip(&self.sources) {
                *fd = check(libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC))?;
            }
            check(libc::mount(
                c"tmpfs".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=64k,nr_inodes=64,mode=0755".as_ptr().cast::<c_void>(),
            ))?;
            for (fd, target) in fds.iter().zip(&self.targets) {
                let mut st: libc::stat = std::mem::zeroed();
                check(libc::fstat(*fd, &mut st))?;
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    check(libc::mkdir(target.as_ptr(), 0o755))?;
                } else {
                    let made = check(libc::open(
                        target.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    ))?;
                    libc::close(made);
                }
                // The descriptor's magic link reaches the source without
                // walking the directories above it.
                let link = proc_fd_path(*fd);
                check(libc::mount(
                    link.as_ptr().cast::<c_char>(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null::<c_void>(),
                ))?;
            }
            for fd in fds.iter().filter(|fd| **fd >= 0) {
                libc::close(*fd);
            }
            check(libc::chdir(c"/".as_ptr()))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(self.gid))?;
            check(libc::setuid(self.uid))?;
            if libc::getuid() != self.uid || libc::geteuid() != self.uid {
                return Err(std::io::Error::from_raw_os_error(libc::EPERM));
            }
        }
        Ok(())
    }
}

fn cstring(bytes: &[u8], refuse: &dyn Fn(String) -> SandboxError) -> Result<CString, SandboxError> {
    CString::new(bytes).map_err(|_| refuse("a path holds a NUL byte".into()))
}

/// `/proc/self/fd/N` NUL-terminated, on the stack (no allocation after fork).
fn proc_fd_path(fd: libc::c_int) -> [u8; 32] {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut buf = [0u8; 32];
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (k, d) in digits[..len].iter().rev().enumerate() {
        buf[PREFIX.len() + k] = *d;
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_bind_but_the_system_dirs_is_staged_and_unknown_options_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("ws");
        let ws = ws.to_string_lossy().into_owned();
        let mut args = os(&[
            "--unshare-all",
            "--uid",
            "65534",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--bind",
            &ws,
            "/work",
            "--ro-bind",
            &ws,
            "/opt/x",
            "--chdir",
            "/work",
            "--",
        ]);
        let drop = RootDrop::stage(&mut args, NOBODY, NOBODY).expect("stage");
        assert_eq!(drop.sources.len(), 2);
        assert_eq!(args[4], "/usr");
        assert_eq!(args[10], "/tmp/bind-0");
        assert_eq!(args[11], "/work");
        assert_eq!(args[13], "/tmp/bind-1");
        assert_eq!(args[14], "/opt/x");

        let mut unknown = os(&["--bind-try", &ws, "/work"]);
        let err = RootDrop::stage(&mut unknown, NOBODY, NOBODY).expect_err("unknown option");
        assert!(err.to_string().contains("--bind-try"), "{err}");
        let mut missing = os(&["--bind", "/nonexistent/mercury", "/work"]);
        assert!(RootDrop::stage(&mut missing, NOBODY, NOBODY).is_err());
    }

    #[test]
    fn the_proc_fd_path_is_written_without_allocation() {
        let p = proc_fd_path(1234);
        let end = p.iter().position(|b| *b == 0).expect("nul");
        assert_eq!(&p[..end], b"/proc/self/fd/1234");
        let p = proc_fd_path(0);
        let end = p.iter().position(|b| *b == 0).expect("nul");
        assert_eq!(&p[..end], b"/proc/self/fd/0");
    }
}
