//! Process backend: tool calls run as child processes of the host, for
//! machines with no container engine. Two modes:
//!
//! - **bubblewrap** (the default wherever `bwrap` works): each exec runs
//!   under `bwrap` with new user, mount, pid, network, ipc and uts
//!   namespaces, all capabilities dropped, as uid/gid 65534 inside (and
//!   `nobody` on the host when the host is root: `root_drop`); it sees
//!   `/usr` read-only, a sized `/tmp`, its own `/proc` and `/dev`, the
//!   workspace at `/work` (the only writable host directory), and, when
//!   given, `mrctl` and the API socket under `/run/mercury/`. No network.
//!   No cgroup: CPU and pids are not bounded here, memory only as an
//!   address-space rlimit.
//! - **unisolated**: plain child processes with the host user's rights,
//!   network and files. Only built when `sandbox.backend: process` and
//!   `sandbox.allow_unisolated: true` are both set, and said at every start.
//!
//! Both: a clean environment (only `PATH`, `HOME` and the spec's variables),
//! capped output, and a timeout that kills the command's whole process group
//! (under bubblewrap, the pid namespace dies with it).
//!
//! Must never: pass the host's own environment to a command, leave a
//! command's processes running after its exec returns or after `close`, or
//! fall back to unisolated on its own.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::root_drop::{host_is_root, RootDrop, NOBODY};
use super::{
    CappedBuffer, ExecOutput, ExecRequest, Isolation, SandboxBackend, SandboxError, SandboxSession,
    SandboxSpec, SpawnRequest, SpawnedProcess, CONTAINER_API_SOCKET, CONTAINER_WORKDIR,
};

/// Directories searched after `extra_path`, in the usual order.
const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where `mrctl` appears inside a bubblewrap session.
const SANDBOX_BIN: &str = "/run/mercury/bin";

/// The uid and gid a bubblewrap session's commands see themselves as.
const SANDBOX_UID: &str = "65534";

const PROOF_TIMEOUT: Duration = Duration::from_secs(30);

/// How a process backend confines its commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessMode {
    /// Under the `bwrap` binary at this path.
    Bubblewrap(PathBuf),
    /// Not at all (explicit opt-in only).
    Unisolated,
}

/// Runs sessions as host child processes; see the module doc for what each
/// mode protects.
#[derive(Clone, Debug)]
pub struct ProcessBackend {
    extra_path: Option<PathBuf>,
    mode: ProcessMode,
}

impl ProcessBackend {
    /// Commands under bubblewrap. `extra_path` holds the host's `mrctl`.
    pub fn bubblewrap(bwrap: PathBuf, extra_path: Option<PathBuf>) -> Self {
        Self {
            extra_path,
            mode: ProcessMode::Bubblewrap(bwrap),
        }
    }

    /// Plain host processes; `extra_path` is searched first, so the host's
    /// own `mrctl` is found.
    pub fn unisolated(extra_path: Option<PathBuf>) -> Self {
        tracing::warn!(
            "sandbox backend `process` without bubblewrap (sandbox.allow_unisolated: true): \
             agent tool calls run as host processes with this user's rights, network and \
             files; turns are NOT isolated"
        );
        Self {
            extra_path,
            mode: ProcessMode::Unisolated,
        }
    }

    pub fn mode(&self) -> &ProcessMode {
        &self.mode
    }

    /// The `bwrap` binary, if one is installed in a usual place.
    pub fn find_bwrap() -> Option<PathBuf> {
        ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    }

    /// Runs `true` in a throwaway bubblewrap session: a kernel without user
    /// namespaces for this user fails here, at start-up, not in a turn.
    pub async fn probe(&self) -> Result<(), SandboxError> {
        let dir = tempfile::tempdir().map_err(|source| SandboxError::Io {
            path: "a temporary directory for the bubblewrap probe".into(),
            source,
        })?;
        let session = self
            .start(SandboxSpec {
                instance_id: "probe".into(),
                space_id: "probe".into(),
                run_id: "probe".into(),
                kind: super::RunKind::Live,
                workspace: super::WorkspaceMount::HostPath(dir.path().to_path_buf()),
                api: None,
                ro_binds: Vec::new(),
                env: Vec::new(),
                limits: super::SandboxLimits::default(),
            })
            .await?;
        let out = session.proof().await;
        session.close().await?;
        out.map(|_| ())
    }

    fn path_var(&self) -> String {
        match (&self.mode, &self.extra_path) {
            (ProcessMode::Bubblewrap(_), _) => format!("{SANDBOX_BIN}:{STANDARD_PATH}"),
            (ProcessMode::Unisolated, Some(dir)) => format!("{}:{STANDARD_PATH}", dir.display()),
            (ProcessMode::Unisolated, None) => STANDARD_PATH.to_string(),
        }
    }

    /// The `bwrap` arguments that come before a command.
    fn bwrap_prefix(&self, spec: &SandboxSpec, workspace: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push =
            |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        let hostname = format!("mercury-{}", short(&spec.run_id));
        let tmp_size = spec.limits.tmp_bytes.max(1 << 20).to_string();
        push(&[
            os("--unshare-all"),
            os("--die-with-parent"),
            os("--new-session"),
            os("--cap-drop"),
            os("ALL"),
            os("--uid"),
            os(SANDBOX_UID),
            os("--gid"),
            os(SANDBOX_UID),
            os("--hostname"),
            hostname.as_ref(),
            os("--ro-bind"),
            os("/usr"),
            os("/usr"),
        ]);
        // Merged-/usr systems have /bin → usr/bin: recreate the links;
        // others get the directories read-only.
        for dir in ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"] {
            match std::fs::symlink_metadata(dir) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(dir) {
                        push(&[os("--symlink"), target.as_os_str(), os(dir)]);
                    }
                }
                Ok(m) if m.is_dir() => push(&[os("--ro-bind"), os(dir), os(dir)]),
                _ => {}
            }
        }
        push(&[
            os("--proc"),
            os("/proc"),
            os("--dev"),
            os("/dev"),
            os("--size"),
            tmp_size.as_ref(),
            os("--tmpfs"),
            os("/tmp"),
            os("--bind"),
            workspace.as_os_str(),
            os(CONTAINER_WORKDIR),
        ]);
        if let Some(mrctl) = self.extra_path.as_ref().map(|d| d.join("mrctl")) {
            if mrctl.is_file() {
                let inside = format!("{SANDBOX_BIN}/mrctl");
                push(&[os("--ro-bind"), mrctl.as_os_str(), inside.as_ref()]);
            }
        }
        if let Some(api) = &spec.api {
            push(&[
                os("--bind"),
                api.socket().as_os_str(),
                os(CONTAINER_API_SOCKET),
            ]);
        }
        for (host, inside) in &spec.ro_binds {
            push(&[os("--ro-bind"), host.as_os_str(), inside.as_ref()]);
        }
        push(&[os("--chdir"), os(CONTAINER_WORKDIR), os("--")]);
        a
    }
}

fn short(run_id: &str) -> String {
    run_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .rev()
        .take(12)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

#[async_trait]
impl SandboxBackend for ProcessBackend {
    fn name(&self) -> &'static str {
        match self.mode {
            ProcessMode::Bubblewrap(_) => "bwrap",
            ProcessMode::Unisolated => "process",
        }
    }

    fn isolation(&self) -> Isolation {
        match self.mode {
            ProcessMode::Bubblewrap(_) => Isolation::Namespaces,
            ProcessMode::Unisolated => Isolation::None,
        }
    }

    fn socket_inside(&self, host: &Path) -> String {
        match self.mode {
            ProcessMode::Bubblewrap(_) => CONTAINER_API_SOCKET.to_string(),
            ProcessMode::Unisolated => host.display().to_string(),
        }
    }

    async fn prepare_workspace(&self, live: &Path) -> Result<(), SandboxError> {
        // Commands act as the host user (mapped to 65534 inside, without
        // capabilities), or as nobody on a root host (see `root_drop`): the
        // workspace goes to whoever that is, links changed themselves,
        // never followed.
        let root = live.to_path_buf();
        let to_nobody = matches!(self.mode, ProcessMode::Bubblewrap(_)) && host_is_root();
        tokio::task::spawn_blocking(move || {
            let (uid, gid) = if to_nobody {
                (NOBODY, NOBODY)
            } else {
                super::effective_ids()
            };
            super::hand_tree_to(&root, uid, gid)
        })
        .await
        .map_err(|e| SandboxError::Engine(format!("workspace ownership task: {e}")))?
    }

    async fn start(&self, spec: SandboxSpec) -> Result<Box<dyn SandboxSession>, SandboxError> {
        // This host's processes: a synced workspace is the same directory.
        let host_dir = spec.workspace.host_dir();
        let workspace = std::fs::canonicalize(host_dir).map_err(|source| SandboxError::Io {
            path: host_dir.display().to_string(),
            source,
        })?;
        if !workspace.is_dir() {
            return Err(SandboxError::Io {
                path: workspace.display().to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "workspace is not a directory",
                ),
            });
        }
        let (workdir, prefix, id, relay) = match &self.mode {
            ProcessMode::Bubblewrap(bwrap) => {
                // A relay of the socket, never the host's own: a bind's
                // path shows in the session's mountinfo.
                let relay = match &spec.api {
                    Some(api) => Some(super::relay::SocketRelay::start(
                        api.socket(),
                        &spec.instance_id,
                    )?),
                    None => None,
                };
                let mut shaped = spec.clone();
                shaped.api = relay
                    .as_ref()
                    .map(|r| super::ApiEndpoint::UnixSocket(r.path().to_owned()));
                let mut prefix = vec![bwrap.clone().into_os_string()];
                prefix.extend(self.bwrap_prefix(&shaped, &workspace));
                (
                    CONTAINER_WORKDIR.to_string(),
                    prefix,
                    format!("bwrap:mercury-{}", short(&spec.run_id)),
                    relay,
                )
            }
            ProcessMode::Unisolated => {
                tracing::warn!(run = %spec.run_id, "this run's tools are NOT isolated (sandbox.allow_unisolated)");
                let w = workspace.display().to_string();
                (w.clone(), Vec::new(), format!("process:{w}"), None)
            }
        };
        Ok(Box::new(ProcessSession {
            id,
            workdir: workdir.clone(),
            home: workdir,
            path_var: self.path_var(),
            env: spec.env,
            workspace,
            prefix,
            memory_bytes: match self.mode {
                ProcessMode::Bubblewrap(_) => Some(spec.limits.memory_bytes),
                ProcessMode::Unisolated => None,
            },
            groups: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
            _relay: relay,
        }))
    }
}

/// bwrap's options, NUL-separated, in a sealed-off memory file read from its
/// start (`bwrap --args FD`); the prefix's closing `--` stays on the command
/// line, before the program.
fn bwrap_args_file(args: &[OsString]) -> std::io::Result<std::fs::File> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let name = c"mercury-bwrap-args";
    // SAFETY: a valid name; the result is checked before use.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let options = match args.split_last() {
        Some((last, rest)) if last == "--" => rest,
        _ => args,
    };
    for a in options {
        file.write_all(a.as_bytes())?;
        file.write_all(b"\0")?;
    }
    file.rewind()?;
    Ok(file)
}

/// One run's session: a working directory and an environment; each exec is
/// a fresh child in its own process group.
#[derive(Debug)]
pub struct ProcessSession {
    id: String,
    /// Where commands run, as they see it (`/work` under bubblewrap).
    workdir: String,
    home: String,
    workspace: PathBuf,
    /// `bwrap` and its arguments, put before every command (empty: unisolated).
    prefix: Vec<OsString>,
    /// Address-space limit of a bubblewrap session's commands.
    memory_bytes: Option<i64>,
    path_var: String,
    env: Vec<(String, String)>,
    /// Process groups of execs in flight. An exec adds its group when it
    /// spawns and removes it when it returns (or is dropped); `close` kills
    /// whatever is still listed, i.e. execs whose caller gave up on them.
    groups: Mutex<HashSet<u32>>,
    closed: AtomicBool,
    /// The session's API socket; lives as long as the session.
    _relay: Option<super::relay::SocketRelay>,
}

impl ProcessSession {
    fn groups(&self) -> MutexGuard<'_, HashSet<u32>> {
        // A poisoned set is still the right set of pids to kill.
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The command of one exec, and the descriptor of bwrap's arguments
    /// (keep it open until the command is spawned).
    fn command(
        &self,
        req: &ExecRequest,
    ) -> Result<Option<(tokio::process::Command, Option<std::fs::File>)>, SandboxError> {
        self.command_with(req, &[])
    }

    /// [`Self::command`] with host directories bound read-only at the same
    /// path (bubblewrap only; unisolated commands see the host anyway).
    fn command_with(
        &self,
        req: &ExecRequest,
        ro_mounts: &[PathBuf],
    ) -> Result<Option<(tokio::process::Command, Option<std::fs::File>)>, SandboxError> {
        let Some((program, args)) = req.argv.split_first() else {
            return Ok(None);
        };
        let (mut cmd, args_file, root_drop) = match self.prefix.split_first() {
            Some((bwrap, bwrap_args)) => {
                // The mounts go before the closing `--chdir /work --`.
                let mut bwrap_args = bwrap_args.to_vec();
                let at = bwrap_args.len().saturating_sub(3);
                for m in ro_mounts.iter().rev() {
                    for a in [
                        m.as_os_str(),
                        m.as_os_str(),
                        std::ffi::OsStr::new("--ro-bind"),
                    ] {
                        bwrap_args.insert(at, a.to_os_string());
                    }
                }
                // bwrap's arguments name host paths (the layer, the socket)
                // and bwrap is pid 1 inside: read from a descriptor, they
                // never show in its /proc/1/cmdline.
                let root_drop = if host_is_root() {
                    Some(RootDrop::stage(&mut bwrap_args, NOBODY, NOBODY)?)
                } else {
                    None
                };
                let file = bwrap_args_file(&bwrap_args).map_err(|source| SandboxError::Io {
                    path: "bwrap's argument descriptor".into(),
                    source,
                })?;
                let fd = file.as_raw_fd();
                let mut c = tokio::process::Command::new(bwrap);
                c.arg("--args").arg(fd.to_string()).arg("--").arg(program);
                // SAFETY: fcntl is async-signal-safe; the child's copy of the
                // descriptor is made inheritable, the host's is untouched.
                unsafe {
                    c.pre_exec(move || {
                        if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                (c, Some(file), root_drop)
            }
            None => (tokio::process::Command::new(program), None, None),
        };
        // bwrap refuses to start with capabilities unless it is setuid
        // ("Unexpected capabilities but not setuid"), and a command needs
        // none: a host granted ambient ones (the shipped unit's
        // CAP_SYS_ADMIN and CAP_DAC_OVERRIDE, for the turn's layer) keeps
        // them to itself. A non-root child then execs with no capability.
        // SAFETY: prctl is a plain system call, async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        if let Some(limit) = self.memory_bytes.filter(|m| *m > 0) {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs
            // between fork and exec here.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit as libc::rlim_t,
                        rlim_max: limit as libc::rlim_t,
                    };
                    libc::setrlimit(libc::RLIMIT_AS, &lim);
                    Ok(())
                });
            }
        }
        cmd.args(args)
            .current_dir(&self.workspace)
            .env_clear()
            .env("PATH", &self.path_var)
            .env("HOME", &self.home)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if req.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Backstop for a dropped exec future; the group kill below is
            // what reaches grandchildren.
            .kill_on_drop(true)
            // Its own group, so one signal reaches everything it spawned.
            .process_group(0);
        // Last: it drops root, after which the steps above could not run.
        if let Some(drop) = root_drop {
            drop.install(&mut cmd);
        }
        Ok(Some((cmd, args_file)))
    }
}

#[async_trait]
impl SandboxSession for ProcessSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn workdir(&self) -> &str {
        &self.workdir
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::Gone(format!("session {} is closed", self.id)));
        }
        let Some((mut cmd, _args_file)) = self.command(&req)? else {
            return Err(SandboxError::Io {
                path: self.workdir.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        };
        let program = &req.argv[0];
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            // Same outcome a shell (and a docker exec) gives: the agent
            // mistyped a command, which is not an infrastructure failure.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(not_runnable(127, program, "command not found"))
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Ok(not_runnable(126, program, "permission denied"))
            }
            Err(source) => {
                return Err(SandboxError::Io {
                    path: format!("{program} (in {})", self.workdir),
                    source,
                })
            }
        };
        let guard = child.id().map(|pgid| GroupGuard::new(pgid, self));

        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let pgid = guard.as_ref().map(|g| g.pgid);
        let run = async {
            let writer = async {
                if let (Some(mut pipe), Some(bytes)) = (stdin, req.stdin.as_deref()) {
                    // A command that exits without reading breaks the pipe;
                    // that is its business.
                    let _ = pipe.write_all(bytes).await;
                }
                // The pipe is dropped here: the command sees end of file.
            };
            let waiter = async {
                let status = child.wait().await;
                // Leftover background processes would keep the output pipes
                // open (and outlive the exec); they go with their command.
                if let Some(pgid) = pgid {
                    kill_group(pgid).await;
                }
                status
            };
            let ((), out, err, status) = tokio::join!(
                writer,
                read_capped(stdout, req.output_cap),
                read_capped(stderr, req.output_cap),
                waiter
            );
            (out, err, status)
        };

        let (out, err, status) = match tokio::time::timeout(req.timeout, run).await {
            Ok(done) => done,
            Err(_) => {
                tracing::warn!(session = %self.id, timeout = ?req.timeout, "exec timed out; killing its process group");
                if let Some(pgid) = pgid {
                    kill_group(pgid).await;
                }
                // The direct child, in case `kill` could not run.
                let _ = child.kill().await;
                if let Some(guard) = guard {
                    guard.disarm();
                }
                return Err(SandboxError::Timeout(req.timeout));
            }
        };
        if let Some(guard) = guard {
            guard.disarm();
        }
        let status = status.map_err(|source| SandboxError::Io {
            path: format!("{program} (in {})", self.workdir),
            source,
        })?;
        // Shell convention for a death by signal, as docker reports it too.
        let exit_code = status
            .code()
            .map(i64::from)
            .or_else(|| status.signal().map(|s| 128 + i64::from(s)))
            .unwrap_or(-1);
        let truncated = out.truncated() || err.truncated();
        Ok(ExecOutput {
            exit_code,
            stdout: out.into_string(),
            stderr: err.into_string(),
            truncated,
        })
    }

    async fn spawn(&self, req: SpawnRequest) -> Result<SpawnedProcess, SandboxError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::Gone(format!("session {} is closed", self.id)));
        }
        let exec = ExecRequest {
            argv: req.argv.clone(),
            // Some: the command's stdin is a pipe.
            stdin: Some(Vec::new()),
            timeout: Duration::MAX,
            output_cap: 0,
        };
        let Some((mut cmd, _args_file)) = self.command_with(&exec, &req.ro_mounts)? else {
            return Err(SandboxError::Io {
                path: self.workdir.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        };
        let program = &req.argv[0];
        let mut child = cmd.spawn().map_err(|source| SandboxError::Io {
            path: format!("{program} (in {})", self.workdir),
            source,
        })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(SandboxError::Gone(format!("{program}: no pipes")));
        };
        // Its stderr is drained and dropped: a server that logs must not
        // block on a full pipe.
        if let Some(mut err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut err, &mut sink).await;
            });
        }
        let pgid = child.id();
        if let Some(pgid) = pgid {
            self.groups().insert(pgid);
        }
        Ok(SpawnedProcess {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            handle: Box::new(SpawnedGroup {
                pgid,
                _child: child,
            }),
        })
    }

    /// `process:<pid of a shell>`: shows a command really ran, on this host.
    /// It proves nothing about isolation, because there is none.
    /// Under bubblewrap: `bwrap:<hostname>`, read inside the session's own
    /// uts namespace (the host's name would mean no namespace).
    async fn proof(&self) -> Result<String, SandboxError> {
        if !self.prefix.is_empty() {
            let out = self
                .exec(ExecRequest {
                    argv: vec!["cat".into(), "/proc/sys/kernel/hostname".into()],
                    stdin: None,
                    timeout: PROOF_TIMEOUT,
                    output_cap: 4096,
                })
                .await?;
            let name = out.stdout.trim();
            let want = self.id.trim_start_matches("bwrap:");
            if out.exit_code != 0 || name != want {
                return Err(SandboxError::Io {
                    path: self.workdir.clone(),
                    source: std::io::Error::other(format!(
                        "bubblewrap did not start a namespaced command (exit {}, hostname {name:?}): {}",
                        out.exit_code,
                        out.stderr.trim()
                    )),
                });
            }
            return Ok(format!("bwrap:{name}"));
        }
        let out = self
            .exec(ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "echo $$".into()],
                stdin: None,
                timeout: PROOF_TIMEOUT,
                output_cap: 4096,
            })
            .await?;
        let pid = out.stdout.trim();
        if out.exit_code != 0 || pid.is_empty() {
            return Err(SandboxError::Io {
                path: self.workdir.clone(),
                source: std::io::Error::other(format!(
                    "proof shell exited {}: {}",
                    out.exit_code,
                    out.stderr.trim()
                )),
            });
        }
        Ok(format!("process:{pid}"))
    }

    async fn close(&self) -> Result<(), SandboxError> {
        self.closed.store(true, Ordering::SeqCst);
        let leftovers: Vec<u32> = self.groups().drain().collect();
        for pgid in leftovers {
            kill_group(pgid).await;
        }
        Ok(())
    }
}

impl Drop for ProcessSession {
    fn drop(&mut self) {
        for pgid in self.groups().drain() {
            kill_group_detached(pgid);
        }
    }
}

/// A spawned process's group, killed when the handle is dropped (the
/// session's `close` kills it too: it is listed with the session).
struct SpawnedGroup {
    pgid: Option<u32>,
    _child: tokio::process::Child,
}

impl Drop for SpawnedGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            kill_group_detached(pgid);
        }
    }
}

/// Registers an exec's process group with its session for the exec's
/// lifetime; dropping it early (the caller cancelled the exec) kills the
/// group so nothing outlives a cancelled command.
struct GroupGuard<'a> {
    pgid: u32,
    session: &'a ProcessSession,
    /// Cleared once the exec itself has killed the group.
    armed: bool,
}

impl<'a> GroupGuard<'a> {
    fn new(pgid: u32, session: &'a ProcessSession) -> Self {
        session.groups().insert(pgid);
        Self {
            pgid,
            session,
            armed: true,
        }
    }

    /// The exec finished and killed its group itself: just unregister.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard<'_> {
    fn drop(&mut self) {
        // Not listed any more means `close` already killed it.
        if self.session.groups().remove(&self.pgid) && self.armed {
            kill_group_detached(self.pgid);
        }
    }
}

fn not_runnable(code: i64, program: &str, why: &str) -> ExecOutput {
    ExecOutput {
        exit_code: code,
        stdout: String::new(),
        stderr: format!("{program}: {why}\n"),
        truncated: false,
    }
}

/// Drains a pipe to its end, keeping the first `cap` bytes: stopping early
/// would block the command on a full pipe.
async fn read_capped<R: AsyncRead + Unpin>(pipe: Option<R>, cap: usize) -> CappedBuffer {
    let mut buffer = CappedBuffer::new(cap);
    let Some(mut pipe) = pipe else {
        return buffer;
    };
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return buffer,
            Ok(n) => buffer.push(&chunk[..n]),
        }
    }
}

/// SIGKILL to a whole process group through the `kill` utility: std has no
/// signal API and `nix`/`libc` are not dependencies. Without `kill` on the
/// host only the direct child is killed (by `kill_on_drop` or the timeout
/// path), and grandchildren may survive; that limit is logged.
async fn kill_group(pgid: u32) {
    let status = tokio::process::Command::new(kill_program())
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if let Err(e) = status {
        tracing::warn!(pgid, error = %e, "cannot run `kill` to stop a process group; grandchildren may survive");
    }
}

/// [`kill_group`] from synchronous code (drops): spawned and not awaited;
/// tokio reaps the `kill` process. Outside a runtime it runs to completion.
fn kill_group_detached(pgid: u32) {
    let args = ["-KILL".to_string(), "--".to_string(), format!("-{pgid}")];
    if tokio::runtime::Handle::try_current().is_ok() {
        let spawned = tokio::process::Command::new(kill_program())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Err(e) = spawned {
            tracing::warn!(pgid, error = %e, "cannot run `kill` to stop a process group");
        }
    } else {
        let _ = std::process::Command::new(kill_program())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// An absolute path when a usual one exists, so a command cannot shadow
/// `kill` through the host's `PATH`.
fn kill_program() -> &'static Path {
    for candidate in ["/usr/bin/kill", "/bin/kill"] {
        let path = Path::new(candidate);
        if path.exists() {
            return path;
        }
    }
    Path::new("kill")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::{RunKind, SandboxLimits};
    use super::*;

    fn spec(workspace: &Path, env: &[(&str, &str)]) -> SandboxSpec {
        SandboxSpec {
            instance_id: "test".into(),
            space_id: "space".into(),
            run_id: "run".into(),
            kind: RunKind::Live,
            workspace: super::super::WorkspaceMount::HostPath(workspace.to_path_buf()),
            api: None,
            ro_binds: Vec::new(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            limits: SandboxLimits::default(),
        }
    }

    fn req(argv: &[&str]) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(std::string::ToString::to_string).collect(),
            stdin: None,
            timeout: Duration::from_secs(30),
            output_cap: 64 * 1024,
        }
    }

    #[tokio::test]
    async fn echo_and_exit_codes() {
        let dir = tempfile::tempdir().expect("dir");
        let backend = ProcessBackend::unisolated(None);
        assert_eq!(backend.name(), "process");
        let session = backend.start(spec(dir.path(), &[])).await.expect("start");
        let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(session.id(), format!("process:{}", canonical.display()));
        assert_eq!(session.workdir(), canonical.display().to_string());

        let out = session.exec(req(&["echo", "hello"])).await.expect("echo");
        assert_eq!(
            (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
            (0, "hello\n", "")
        );
        let out = session
            .exec(req(&["sh", "-c", "echo bad >&2; exit 4"]))
            .await
            .expect("sh");
        assert_eq!((out.exit_code, out.stderr.as_str()), (4, "bad\n"));
        let out = session
            .exec(req(&["no-such-command-anywhere"]))
            .await
            .expect("missing command is an outcome, not an error");
        assert_eq!(out.exit_code, 127);
        session.close().await.expect("close");
        session.close().await.expect("close twice");
        assert!(matches!(
            session.exec(req(&["true"])).await,
            Err(SandboxError::Gone(_))
        ));
    }

    #[tokio::test]
    async fn cwd_is_the_workspace_and_files_land_there() {
        let dir = tempfile::tempdir().expect("dir");
        let session = ProcessBackend::unisolated(None)
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let out = session
            .exec(req(&["sh", "-c", "pwd; echo made > made.txt"]))
            .await
            .expect("exec");
        assert_eq!(out.stdout.trim(), session.workdir());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("made.txt")).expect("file"),
            "made\n"
        );
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn env_is_only_path_home_and_the_spec() {
        let dir = tempfile::tempdir().expect("dir");
        let extra = tempfile::tempdir().expect("extra path dir");
        let session = ProcessBackend::unisolated(Some(extra.path().to_path_buf()))
            .start(spec(
                dir.path(),
                &[("MERCURY_RUN_TOKEN", "t-1"), ("MERCURY_SPACE", "s")],
            ))
            .await
            .expect("start");
        // `env` itself is a host binary: it prints exactly what it received.
        let out = session.exec(req(&["env"])).await.expect("env");
        let mut keys: Vec<&str> = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        keys.sort();
        assert_eq!(keys, ["HOME", "MERCURY_RUN_TOKEN", "MERCURY_SPACE", "PATH"]);
        assert!(out
            .stdout
            .contains(&format!("HOME={}\n", session.workdir())));
        let path_line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("PATH="))
            .expect("PATH");
        assert!(
            path_line.starts_with(&format!("PATH={}:", extra.path().display())),
            "extra path must come first: {path_line}"
        );
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn the_extra_path_finds_a_host_mrctl() {
        let dir = tempfile::tempdir().expect("dir");
        let bin = tempfile::tempdir().expect("bin");
        let mrctl = bin.path().join("mrctl");
        std::fs::write(&mrctl, "#!/bin/sh\necho \"mrctl $*\"\n").expect("write");
        std::fs::set_permissions(&mrctl, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let session = ProcessBackend::unisolated(Some(bin.path().to_path_buf()))
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let out = session
            .exec(req(&["mrctl", "whoami"]))
            .await
            .expect("mrctl");
        assert_eq!(out.stdout, "mrctl whoami\n", "{out:?}");
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn stdin_is_written_then_closed_and_output_is_capped() {
        let dir = tempfile::tempdir().expect("dir");
        let session = ProcessBackend::unisolated(None)
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let mut request = req(&["wc", "-c"]);
        request.stdin = Some(vec![b'x'; 1 << 20]);
        let out = session.exec(request).await.expect("wc");
        assert_eq!(out.stdout.trim(), (1u32 << 20).to_string());

        let mut request = req(&["cat"]);
        request.stdin = Some(vec![b'y'; 100_000]);
        request.output_cap = 10;
        let out = session.exec(request).await.expect("cat");
        assert_eq!(out.stdout, "yyyyyyyyyy");
        assert!(out.truncated);
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().expect("dir");
        let session = ProcessBackend::unisolated(None)
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let marker = dir.path().join("grandchild-survived");
        let script = format!("(sleep 3; touch {}) & sleep 30", marker.display());
        let mut request = req(&["sh", "-c", &script]);
        request.timeout = Duration::from_millis(500);
        let started = Instant::now();
        let err = session.exec(request).await.expect_err("times out");
        assert!(matches!(err, SandboxError::Timeout(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!marker.exists(), "a grandchild outlived the timeout");
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn background_leftovers_die_with_their_exec() {
        let dir = tempfile::tempdir().expect("dir");
        let session = ProcessBackend::unisolated(None)
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let marker = dir.path().join("leftover-survived");
        // The background job holds stdout open; the exec must still return
        // promptly, and the job must not live on.
        let script = format!("(sleep 2; touch {}) & echo started", marker.display());
        let started = Instant::now();
        let out = session
            .exec(req(&["sh", "-c", &script]))
            .await
            .expect("exec");
        assert_eq!(out.stdout, "started\n");
        assert!(started.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!marker.exists(), "a background job outlived its exec");
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn proof_names_a_process() {
        let dir = tempfile::tempdir().expect("dir");
        let session = ProcessBackend::unisolated(None)
            .start(spec(dir.path(), &[]))
            .await
            .expect("start");
        let proof = session.proof().await.expect("proof");
        let pid = proof.strip_prefix("process:").expect("prefix");
        assert!(pid.parse::<u32>().is_ok(), "{proof}");
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn a_missing_workspace_is_an_io_error_with_its_path() {
        let err = ProcessBackend::unisolated(None)
            .start(spec(Path::new("/nonexistent/workspace"), &[]))
            .await
            .err()
            .expect("must fail");
        assert!(matches!(err, SandboxError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/workspace"), "{err}");
    }

    fn bwrap() -> ProcessBackend {
        let path = ProcessBackend::find_bwrap()
            .expect("bubblewrap must be installed (deploy/setup.sh installs it)");
        ProcessBackend::bubblewrap(path, None)
    }

    #[tokio::test]
    async fn bubblewrap_confines_files_network_and_processes() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("ws");
        let canary = dir.path().join("canary.txt");
        std::fs::write(&canary, "CANARY").expect("canary");
        std::os::unix::fs::symlink(&canary, ws.join("link")).expect("link");
        let backend = bwrap();
        assert_eq!(backend.isolation(), Isolation::Namespaces);
        backend.prepare_workspace(&ws).await.expect("prepare");
        let session = backend
            .start(spec(&ws, &[("A", "1")]))
            .await
            .expect("start");
        assert!(session
            .proof()
            .await
            .expect("proof")
            .starts_with("bwrap:mercury-"));
        assert_eq!(session.workdir(), "/work");
        let script = format!(
            "cat link; cat {c}; cat ../canary.txt; ls /etc /root /var 2>&1; echo w > made; \
             cat /proc/net/dev | wc -l; ps 2>/dev/null | wc -l; id -u; env | sort",
            c = canary.display()
        );
        let out = session
            .exec(req(&["sh", "-c", &script]))
            .await
            .expect("exec");
        assert!(!out.stdout.contains("CANARY"), "{out:?}");
        assert_eq!(
            std::fs::read_to_string(ws.join("made")).expect("made"),
            "w\n"
        );
        // Only the loopback device exists in the network namespace.
        assert!(out.stdout.contains("\n3\n"), "{out:?}");
        assert!(out.stdout.contains("65534\n"), "{out:?}");
        let env: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.contains('='))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert_eq!(env, ["A", "HOME", "PATH", "PWD"], "{out:?}");
        session.close().await.expect("close");
    }

    #[tokio::test]
    async fn bubblewrap_tmp_is_sized_and_a_timeout_kills_the_namespace() {
        let dir = tempfile::tempdir().expect("dir");
        let mut sp = spec(dir.path(), &[]);
        sp.limits.tmp_bytes = 1 << 20;
        let session = bwrap().start(sp).await.expect("start");
        let out = session
            .exec(req(&[
                "sh",
                "-c",
                "dd if=/dev/zero of=/tmp/big bs=1M count=4 2>&1; ls -l /tmp/big",
            ]))
            .await
            .expect("dd");
        assert!(out.stdout.contains("No space left"), "{out:?}");
        let marker = dir.path().join("survived");
        let mut r = req(&["sh", "-c", "(sleep 3; touch /work/survived) & sleep 30"]);
        r.timeout = Duration::from_millis(500);
        assert!(matches!(
            session.exec(r).await,
            Err(SandboxError::Timeout(_))
        ));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            !marker.exists(),
            "a process outlived its bubblewrap namespace"
        );
        session.close().await.expect("close");
    }
}
