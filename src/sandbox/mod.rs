//! Sandbox backends: where an agent's tool calls execute.
//!
//! Owns the [`SandboxBackend`] trait (start a session for one run) and the
//! [`SandboxSession`] trait (exec a command, prove where it ran, close), with
//! three implementations: `docker` (bollard, one labelled container per run),
//! `process` (a child process under bubblewrap namespaces, or, only when
//! configured explicitly, an unisolated child that says so at every start),
//! and [`Unavailable`], which refuses every tool call with a sentence.
//! Beside it, [`lifecycle::SandboxLifecycle`]: the engines around the
//! sessions (images, an instance's running sandboxes), so no module outside
//! this one names the engine (only `sandbox` knows it is Docker).
//!
//! Must never: pass a host credential into a session (the caller hands over
//! exactly the environment the session gets), sweep a container that does not
//! carry this instance's label, or leave a container behind after `close`.
//!
//! This module is self-contained: it refers to nothing outside `crate::sandbox`
//! but the engines' settings (`config::DockerEnginesConfig`), which
//! [`lifecycle::connect`] reads.

pub mod docker;
pub mod frames;
pub mod image;
pub mod lifecycle;
pub mod process;
mod relay;
mod root_drop;
pub mod runtime_image;
mod sync;

pub use docker::sweep_warm_roots;
pub use lifecycle::{instance_id_for, instance_id_for_host};
pub use relay::sweep_relays;
pub use root_drop::NOBODY;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

/// Container label keys. Orphan sweeps filter on [`LABEL_INSTANCE`], always.
pub const LABEL_INSTANCE: &str = "mercury.instance";
pub const LABEL_SPACE: &str = "mercury.space";
pub const LABEL_RUN: &str = "mercury.run";
pub const LABEL_KIND: &str = "mercury.kind";

/// Where the workspace appears inside a docker session.
pub const CONTAINER_WORKDIR: &str = "/work";
/// Where the host API socket appears inside a docker or bubblewrap session.
pub const CONTAINER_API_SOCKET: &str = "/run/mercury/api.sock";

/// An engine sessions start on, as `/api/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EngineView {
    /// As configured (`unix:///var/run/docker.sock`, `tcp://10.0.0.7:2376`),
    /// or `local`.
    pub endpoint: String,
    /// On another machine: its workspaces are synced, not bound.
    pub remote: bool,
    pub healthy: bool,
    /// Sessions running on it now.
    pub running: usize,
    pub last_error: Option<String>,
}

/// What keeps a session's commands from the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// A container: own filesystem, no network, cgroup limits.
    Container,
    /// Bubblewrap: user, mount, pid, network, ipc and uts namespaces; only
    /// the workspace writable.
    Namespaces,
    /// Plain host processes (explicit opt-in), or no sandbox at all.
    None,
}

impl Isolation {
    pub fn isolates(self) -> bool {
        self != Isolation::None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    Live,
    Task,
    Ask,
    Review,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Live => "live",
            RunKind::Task => "task",
            RunKind::Ask => "ask",
            RunKind::Review => "review",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxLimits {
    pub memory_bytes: i64,
    /// CPU quota in billionths of a CPU (Docker's `NanoCpus`).
    pub nano_cpus: i64,
    pub pids: i64,
    pub tmp_bytes: i64,
    /// The most a synced workspace may hold (its tmpfs's size, and the
    /// bound on what is copied back).
    pub workspace_bytes: i64,
    /// Entries and depth a synced workspace may hold, as the layer allows.
    pub workspace_entries: u64,
    pub workspace_depth: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 << 20,
            nano_cpus: 1_000_000_000,
            pids: 256,
            tmp_bytes: 64 << 20,
            workspace_bytes: 1 << 30,
            workspace_entries: 100_000,
            workspace_depth: 64,
        }
    }
}

/// Everything a backend needs to start one run's session.
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// `mercury.instance` label value (derived from the canonical data dir).
    pub instance_id: String,
    pub space_id: String,
    pub run_id: String,
    pub kind: RunKind,
    /// The host directory the session works in (the turn's layer, or a
    /// throwaway copy the caller made) and how it reaches the session.
    pub workspace: WorkspaceMount,
    /// The host API the session's `mrctl` reaches at [`CONTAINER_API_SOCKET`].
    pub api: Option<ApiEndpoint>,
    /// The session's whole environment (run token, space id, socket path).
    /// Nothing from the host's own environment is added by a backend.
    pub env: Vec<(String, String)>,
    pub limits: SandboxLimits,
    /// Host directories bound read-only at the given absolute path inside
    /// (the enabled extensions' skills, under `/run/mercury/skills/`).
    pub ro_binds: Vec<(PathBuf, String)>,
}

/// A pool of sandboxes started ahead of the turns that will claim them
/// (`sandbox.warm`): each serves exactly one run and is then destroyed.
/// Only a spec of this instance with these limits claims one; any other
/// spec starts cold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmSpec {
    /// How many idle sandboxes to keep ready (at least 1).
    pub slots: usize,
    /// The `mercury.instance` label every pooled sandbox carries.
    pub instance_id: String,
    pub limits: SandboxLimits,
}

/// How a session's working directory is made of a host directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceMount {
    /// Bound in place, so every write lands in the host directory at once.
    /// A backend whose engine runs on another machine cannot bind a host
    /// path: it syncs the directory instead, as for [`WorkspaceMount::Synced`].
    HostPath(PathBuf),
    /// Copied into the session when it starts and back into the host
    /// directory after every command (bounded, never following a link the
    /// session made; `sync`), so the caller's merge sees the same tree a bind
    /// would have left. The session's copy is a sized tmpfs of its own.
    Synced(PathBuf),
}

impl WorkspaceMount {
    /// The host directory, however it reaches the session.
    pub fn host_dir(&self) -> &std::path::Path {
        match self {
            WorkspaceMount::HostPath(p) | WorkspaceMount::Synced(p) => p,
        }
    }
}

/// How a session's commands reach the host's API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiEndpoint {
    /// The API's Unix socket on this host. A local backend binds (a relay
    /// of) it at [`CONTAINER_API_SOCKET`]; a backend on another machine,
    /// whose sandbox has no network, carries each connection over an exec
    /// stream into the container (`mrctl bridge`), to the same path inside.
    UnixSocket(PathBuf),
}

impl ApiEndpoint {
    pub fn socket(&self) -> &std::path::Path {
        match self {
            ApiEndpoint::UnixSocket(p) => p,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Bytes written to the command's stdin, then stdin is closed.
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Bytes kept of stdout and of stderr each; the rest is dropped and
    /// `truncated` is set.
    pub output_cap: usize,
}

/// A long-lived process in a session whose stdin and stdout the caller
/// speaks over (an extension's `stdio` MCP server).
#[derive(Clone, Debug)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    /// Host directories bound read-only at the same path inside.
    pub ro_mounts: Vec<PathBuf>,
    /// The image a container backend starts the process from (its own
    /// container beside the run's, same workspace, limits and labels); the
    /// run's image when `None`. A backend without images ignores it.
    pub image: Option<String>,
}

/// A spawned process: its pipes, and a handle that kills it (and all it
/// started) when dropped. `close` of its session kills it too.
pub struct SpawnedProcess {
    pub stdin: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    pub handle: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for SpawnedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnedProcess")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("no container engine answers: {0}")]
    NoEngine(String),
    #[error("container engine: {0}")]
    Engine(String),
    #[error("command timed out after {0:?}")]
    Timeout(Duration),
    #[error("the sandbox is gone (removed or killed from outside): {0}")]
    Gone(String),
    #[error("agent image: {0}")]
    Image(String),
    #[error("no sandbox is available ({0}); tool calls are refused")]
    Unavailable(String),
    #[error("sandbox i/o on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[async_trait]
pub trait SandboxBackend: Send + Sync {
    /// `docker`, `bwrap`, `process` (unisolated) or `none`.
    fn name(&self) -> &'static str;
    fn isolation(&self) -> Isolation;
    /// Where the API socket at `host` appears to a session's commands.
    fn socket_inside(&self, host: &std::path::Path) -> String {
        let _ = host;
        CONTAINER_API_SOCKET.to_string()
    }
    /// Readies a live workspace (ownership) before a turn's layer is laid
    /// over it, so nothing has to change through the layer itself.
    async fn prepare_workspace(&self, live: &std::path::Path) -> Result<(), SandboxError> {
        let _ = live;
        Ok(())
    }
    async fn start(&self, spec: SandboxSpec) -> Result<Box<dyn SandboxSession>, SandboxError>;
    /// The engines sessions start on and what is known of each (none for
    /// a backend without engines).
    fn engines(&self) -> Vec<EngineView> {
        Vec::new()
    }
    /// Checks every engine now and returns what was found.
    async fn check_health(&self) -> Vec<EngineView> {
        self.engines()
    }
    /// Removes the sessions of `instance_id` that a crash or restart left
    /// behind on every engine (those whose run is not in `live_runs()`,
    /// asked after each engine's listing), and returns how many. A backend
    /// whose sessions die with the host has nothing to sweep.
    async fn sweep_orphans(
        &self,
        instance_id: &str,
        live_runs: &(dyn Fn() -> std::collections::HashSet<String> + Send + Sync),
    ) -> Result<usize, SandboxError> {
        let _ = (instance_id, live_runs);
        Ok(0)
    }
    /// Why no tool can run at all (the [`Unavailable`] backend).
    fn unavailable_reason(&self) -> Option<String> {
        None
    }
    /// Sandboxes started ahead and waiting to be claimed (`sandbox.warm`);
    /// 0 for a backend without a pool.
    fn warm_idle(&self) -> usize {
        0
    }
    /// Stops refilling any pool and removes its idle sandboxes (the host
    /// is stopping). Sessions already started are their runs' to close.
    async fn shutdown(&self) {}
}

/// The backend of a host with no usable sandbox: `auto` found neither a
/// container engine nor bubblewrap. Every tool call is refused with the
/// reason; turns that call no tool still answer.
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub reason: String,
}

#[async_trait]
impl SandboxBackend for Unavailable {
    fn name(&self) -> &'static str {
        "none"
    }
    fn isolation(&self) -> Isolation {
        Isolation::None
    }
    async fn start(&self, _spec: SandboxSpec) -> Result<Box<dyn SandboxSession>, SandboxError> {
        Err(SandboxError::Unavailable(self.reason.clone()))
    }
    fn unavailable_reason(&self) -> Option<String> {
        Some(self.reason.clone())
    }
}

#[async_trait]
pub trait SandboxSession: Send + Sync {
    /// Container id, or `process:<workspace>` for the process backend.
    fn id(&self) -> &str;
    /// Working directory of commands, as the session sees it (`/work` in docker).
    fn workdir(&self) -> &str;
    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError>;
    /// Starts a long-lived process with piped stdin and stdout, under the
    /// session's isolation and limits. Backends that cannot say so.
    async fn spawn(&self, req: SpawnRequest) -> Result<SpawnedProcess, SandboxError> {
        let _ = req;
        Err(SandboxError::Unavailable(
            "this sandbox backend cannot run an extension's stdio server (use the bubblewrap backend)".into(),
        ))
    }
    /// The host directory was written outside the session (a file tool):
    /// a session that works on a copy of it takes the change in before its
    /// next command.
    fn host_changed(&self) {}
    /// A fact read from inside the session that proves where it ran
    /// (docker: the hostname, which equals the short container id).
    async fn proof(&self) -> Result<String, SandboxError>;
    /// Removes the container (docker) or kills leftover children (process).
    /// Idempotent: closing twice, or after the container vanished, is `Ok`.
    async fn close(&self) -> Result<(), SandboxError>;
}

/// The effective uid and gid of this process.
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail and take no arguments.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// lchown-s a workspace tree to `uid:gid` unless its root already has them
/// (then the tree was handed over before). Links are changed themselves,
/// never followed, so a symlink in the workspace cannot hand a host file
/// over. Shared by the docker backend (to `nobody` on a root host) and
/// bubblewrap (back to the host user).
pub(crate) fn hand_tree_to(root: &std::path::Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    use std::os::unix::fs::MetadataExt;
    let io_err = |path: &std::path::Path, source: std::io::Error| SandboxError::Io {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::symlink_metadata(root).map_err(|e| io_err(root, e))?;
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(root).to_path_buf();
            io_err(&path, std::io::Error::from(e))
        })?;
        std::os::unix::fs::lchown(entry.path(), Some(uid), Some(gid))
            .map_err(|e| io_err(entry.path(), e))?;
    }
    Ok(())
}

/// Keeps the first `cap` bytes of one output stream and remembers whether
/// anything was dropped. Shared by both backends so `ExecRequest::output_cap`
/// means the same thing everywhere; callers keep draining the stream after
/// the cap so the command never blocks on a full pipe.
#[derive(Debug)]
pub(crate) struct CappedBuffer {
    bytes: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl CappedBuffer {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            bytes: Vec::new(),
            cap,
            truncated: false,
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// Lossy UTF-8; a multi-byte character cut in half by the cap is dropped
    /// rather than shown as a replacement character.
    pub(crate) fn into_string(mut self) -> String {
        if self.truncated {
            if let Err(e) = std::str::from_utf8(&self.bytes) {
                if e.error_len().is_none() {
                    self.bytes.truncate(e.valid_up_to());
                }
            }
        }
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}
