//! Docker backend: one labelled, locked-down container per run; every tool
//! call is a `docker exec` in it.
//!
//! Owns: the container's shape (labels, name, mounts, limits, user, env), the
//! exec protocol (stdin, capped demultiplexed output, timeout, exit code), the
//! removal of a run's container, the orphan sweep, and the instance id that
//! ties containers to one data dir.
//!
//! Must never: mount anything but the workspace (and the API socket when
//! given), give the container a network, add a host environment variable to
//! the container, touch a container without this instance's
//! `mercury.instance` label, or sweep when the instance id is empty.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{
    CappedBuffer, ExecOutput, ExecRequest, SandboxBackend, SandboxError, SandboxSession,
    SandboxSpec, CONTAINER_API_SOCKET, CONTAINER_WORKDIR, LABEL_INSTANCE, LABEL_KIND, LABEL_RUN,
    LABEL_SPACE,
};

/// uid and gid of `nobody`, the container user when the host runs as root.
pub const NOBODY: u32 = 65534;

/// Container command: it only keeps the container alive; tools run via exec.
const KEEPALIVE_CMD: [&str; 2] = ["/bin/sleep", "infinity"];

/// Budget for the `hostname` exec behind [`SandboxSession::proof`].
const PROOF_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a finished exec stream is re-inspected until the engine has
/// recorded the exit code (it can lag the end of the stream by a moment).
const EXIT_POLL: Duration = Duration::from_millis(10);

/// How long a command that died by a signal waits to learn whether its
/// container died too (see `DockerSession::stops_within`). Only such commands
/// pay it; a container that did die usually shows it within milliseconds.
const DEATH_SETTLE: Duration = Duration::from_secs(2);
const DEATH_POLL: Duration = Duration::from_millis(25);

/// The instance id for a data dir: the first 16 hex of sha256 of its
/// canonical path. Two hosts on one engine with different data dirs never
/// sweep each other's containers; one data dir keeps its id across restarts.
pub fn instance_id_for(data_dir: &Path) -> io::Result<String> {
    let canonical = std::fs::canonicalize(data_dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("canonicalizing data dir {}: {e}", data_dir.display()),
        )
    })?;
    let digest = Sha256::digest(canonical.as_os_str().as_bytes());
    let hex = base16ct::lower::encode_string(&digest);
    Ok(hex.get(..16).unwrap_or(&hex).to_string())
}

/// Starts one container per run from the agent image.
#[derive(Clone, Debug)]
pub struct DockerBackend {
    docker: Docker,
    image: String,
}

impl DockerBackend {
    /// Connects to the local engine (`DOCKER_HOST` or the default socket) and
    /// negotiates the API version: bollard speaks a newer API than many
    /// installed engines accept.
    pub async fn connect(image: String) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| {
            SandboxError::NoEngine(format!(
                "cannot set up a client for the local Docker engine (DOCKER_HOST or /var/run/docker.sock): {e}"
            ))
        })?;
        Self::negotiate(docker, image, "the local Docker engine").await
    }

    /// Like [`DockerBackend::connect`], for an engine at an explicit Unix socket.
    pub async fn connect_socket(socket: &Path, image: String) -> Result<Self, SandboxError> {
        let where_ = format!("the Docker engine at {}", socket.display());
        let path = socket.to_str().ok_or_else(|| {
            SandboxError::NoEngine(format!("{where_}: the socket path is not UTF-8"))
        })?;
        let docker =
            Docker::connect_with_socket(path, 120, bollard::API_DEFAULT_VERSION).map_err(|e| {
                SandboxError::NoEngine(format!("cannot set up a client for {where_}: {e}"))
            })?;
        Self::negotiate(docker, image, &where_).await
    }

    /// Wraps an already connected client (shared with the sweep, or tests).
    pub fn with_client(docker: Docker, image: String) -> Self {
        Self { docker, image }
    }

    async fn negotiate(docker: Docker, image: String, where_: &str) -> Result<Self, SandboxError> {
        let docker = docker.negotiate_version().await.map_err(|e| {
            SandboxError::NoEngine(format!(
                "{where_} does not answer (is the daemon running, and may this user use its socket?): {e}"
            ))
        })?;
        Ok(Self { docker, image })
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// Checks the engine still answers.
    pub async fn ping(&self) -> Result<(), SandboxError> {
        self.docker.ping().await.map(|_| ()).map_err(|e| {
            SandboxError::NoEngine(format!("the Docker engine stopped answering: {e}"))
        })
    }

    fn create_body(
        &self,
        spec: &SandboxSpec,
        workspace: &Path,
        user: String,
    ) -> ContainerCreateBody {
        let labels = HashMap::from([
            (LABEL_INSTANCE.to_string(), spec.instance_id.clone()),
            (LABEL_SPACE.to_string(), spec.space_id.clone()),
            (LABEL_RUN.to_string(), spec.run_id.clone()),
            (LABEL_KIND.to_string(), spec.kind.as_str().to_string()),
        ]);
        // `mounts` rather than `binds`: a bind string breaks on ':' in a path,
        // and a missing source is an error here instead of a fresh directory.
        let mut mounts = vec![bind_mount(workspace, CONTAINER_WORKDIR)];
        if let Some(socket) = &spec.api_socket {
            mounts.push(bind_mount(socket, CONTAINER_API_SOCKET));
        }
        let limits = &spec.limits;
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(KEEPALIVE_CMD.iter().map(|s| s.to_string()).collect()),
            labels: Some(labels),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user: Some(user),
            working_dir: Some(CONTAINER_WORKDIR.to_string()),
            tty: Some(false),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                network_mode: Some("none".into()),
                memory: Some(limits.memory_bytes),
                // Equal to memory: no swap on top of the memory limit.
                memory_swap: Some(limits.memory_bytes),
                nano_cpus: Some(limits.nano_cpus),
                pids_limit: Some(limits.pids),
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_string(),
                    format!("rw,nosuid,nodev,noexec,size={},mode=1777", limits.tmp_bytes),
                )])),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                // Kept until `close` so a failed run can still be inspected
                // and so removal is ours, not a race with the engine.
                auto_remove: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Creates the container; a same-named container left by an earlier
    /// attempt at this very run (crash, restart) is replaced, anything else
    /// with that name is an error.
    async fn create(
        &self,
        name: &str,
        spec: &SandboxSpec,
        body: ContainerCreateBody,
    ) -> Result<String, SandboxError> {
        let options = || Some(CreateContainerOptionsBuilder::default().name(name).build());
        match self.docker.create_container(options(), body.clone()).await {
            Ok(created) => return Ok(created.id),
            Err(BollardError::DockerResponseServerError {
                status_code: 409, ..
            }) => {}
            Err(e) => {
                return Err(SandboxError::Engine(format!(
                    "creating container {name}: {e}"
                )))
            }
        }
        let existing = self
            .docker
            .inspect_container(name, None)
            .await
            .map_err(|e| {
                SandboxError::Engine(format!("inspecting conflicting container {name}: {e}"))
            })?;
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        let ours = labels.get(LABEL_INSTANCE) == Some(&spec.instance_id)
            && labels.get(LABEL_RUN) == Some(&spec.run_id);
        if !ours {
            return Err(SandboxError::Engine(format!(
                "a container named {name} exists and is not this run's; refusing to touch it"
            )));
        }
        tracing::warn!(
            container = name,
            "replacing a leftover container of the same run"
        );
        remove_container(&self.docker, name).await?;
        self.docker
            .create_container(options(), body)
            .await
            .map(|created| created.id)
            .map_err(|e| {
                SandboxError::Engine(format!(
                    "creating container {name} after removing its leftover: {e}"
                ))
            })
    }
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn isolation(&self) -> super::Isolation {
        super::Isolation::Container
    }

    async fn prepare_workspace(&self, live: &Path) -> Result<(), SandboxError> {
        container_user(live).await.map(|_| ())
    }

    async fn start(&self, spec: SandboxSpec) -> Result<Box<dyn SandboxSession>, SandboxError> {
        // A container without an instance id could never be swept.
        if spec.instance_id.trim().is_empty() {
            return Err(SandboxError::Engine(
                "refusing to start a container without an instance id".into(),
            ));
        }
        if let Some((key, _)) = spec
            .env
            .iter()
            .find(|(k, _)| k.is_empty() || k.contains('='))
        {
            return Err(SandboxError::Engine(format!(
                "invalid environment variable name {key:?} for run {}",
                spec.run_id
            )));
        }
        let workspace = canonical(&spec.workspace)?;
        if let Some(socket) = &spec.api_socket {
            std::fs::metadata(socket).map_err(|source| SandboxError::Io {
                path: socket.display().to_string(),
                source,
            })?;
        }
        let user = container_user(&workspace).await?;
        let name = container_name(&spec.instance_id, &spec.run_id);
        let body = self.create_body(&spec, &workspace, user);
        let id = self.create(&name, &spec, body).await?;

        if let Err(e) = self
            .docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
        {
            // Never leave a created-but-dead container behind.
            let _ = remove_container(&self.docker, &id).await;
            return Err(SandboxError::Engine(format!(
                "starting container {name} ({id}): {e}"
            )));
        }
        tracing::debug!(container = %id, run = %spec.run_id, "sandbox container started");
        Ok(Box::new(DockerSession {
            docker: self.docker.clone(),
            id,
            closed: AtomicBool::new(false),
        }))
    }
}

/// One run's container. Dropping it without `close` asks the runtime to
/// remove the container in the background; the orphan sweep at start-up is
/// what guarantees it.
#[derive(Debug)]
pub struct DockerSession {
    docker: Docker,
    id: String,
    closed: AtomicBool,
}

#[async_trait]
impl SandboxSession for DockerSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn workdir(&self) -> &str {
        CONTAINER_WORKDIR
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        if req.argv.is_empty() {
            return Err(SandboxError::Engine(format!(
                "empty command for container {}",
                self.id
            )));
        }
        let timeout = req.timeout;
        match tokio::time::timeout(timeout, self.exec_inner(req)).await {
            Ok(result) => result,
            Err(_) => {
                // The container is this run's alone and the caller fails the
                // run on a timeout, so killing it is the surest way to stop
                // the command and everything it spawned.
                tracing::warn!(container = %self.id, ?timeout, "exec timed out; killing the container");
                self.kill().await;
                Err(SandboxError::Timeout(timeout))
            }
        }
    }

    async fn proof(&self) -> Result<String, SandboxError> {
        let out = self
            .exec(ExecRequest {
                argv: vec!["hostname".into()],
                stdin: None,
                timeout: PROOF_TIMEOUT,
                output_cap: 4096,
            })
            .await?;
        if out.exit_code != 0 {
            return Err(SandboxError::Engine(format!(
                "hostname exited {} in container {}: {}",
                out.exit_code,
                self.id,
                out.stderr.trim()
            )));
        }
        Ok(out.stdout.trim().to_string())
    }

    async fn close(&self) -> Result<(), SandboxError> {
        remove_container(&self.docker, &self.id).await?;
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl DockerSession {
    async fn exec_inner(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let id = &self.id;
        let config = CreateExecOptions {
            cmd: Some(req.argv.clone()),
            attach_stdin: Some(req.stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            working_dir: Some(CONTAINER_WORKDIR.to_string()),
            ..Default::default()
        };
        let exec_id = self
            .docker
            .create_exec(id, config)
            .await
            .map_err(|e| self.classify(e, "creating exec"))?
            .id;
        let started = self
            .docker
            .start_exec(
                &exec_id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| self.classify(e, "starting exec"))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(SandboxError::Engine(format!(
                "exec in container {id} started detached"
            )));
        };

        // Written concurrently with reading: a command that answers before it
        // has read all of its input would otherwise deadlock on full pipes.
        let stdin = req.stdin;
        let writer = async {
            if let Some(bytes) = stdin {
                // A command that exits without reading its input breaks the
                // pipe; that is the command's business, not an engine error.
                let _ = input.write_all(&bytes).await;
                // Half-closes the hijacked connection: the engine closes the
                // command's stdin, so `cat` and friends see end of file.
                let _ = input.shutdown().await;
            }
        };
        let reader = async {
            let mut stdout = CappedBuffer::new(req.output_cap);
            let mut stderr = CappedBuffer::new(req.output_cap);
            while let Some(item) = output.next().await {
                match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        stdout.push(&message)
                    }
                    Ok(LogOutput::StdErr { message }) => stderr.push(&message),
                    Ok(LogOutput::StdIn { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok((stdout, stderr))
        };
        let ((), read) = tokio::join!(writer, reader);
        let (stdout, stderr) = match read {
            Ok(streams) => streams,
            Err(e) => return Err(self.stream_error(e).await),
        };

        let exit_code = loop {
            let info = self
                .docker
                .inspect_exec(&exec_id)
                .await
                .map_err(|e| self.classify(e, "inspecting exec"))?;
            if info.running != Some(true) {
                break info.exit_code;
            }
            tokio::time::sleep(EXIT_POLL).await;
        };
        // No code, or death by signal, may mean the container itself died
        // under the command (killed from outside, OOM of the whole cgroup).
        if exit_code.is_none_or(|code| code >= 128) && self.stops_within(DEATH_SETTLE).await? {
            return Err(SandboxError::Gone(format!(
                "container {id} stopped while running {:?}",
                req.argv
            )));
        }
        let exit_code = exit_code.ok_or_else(|| {
            SandboxError::Engine(format!(
                "exec {exec_id} in container {id} ended without an exit code"
            ))
        })?;
        let truncated = stdout.truncated() || stderr.truncated();
        Ok(ExecOutput {
            exit_code,
            stdout: stdout.into_string(),
            stderr: stderr.into_string(),
            truncated,
        })
    }

    /// 404 (removed) and 409 (not running, paused) mean the container can no
    /// longer run commands: that is `Gone`, which the caller handles
    /// differently from an engine hiccup.
    fn classify(&self, e: BollardError, doing: &str) -> SandboxError {
        match e {
            BollardError::DockerResponseServerError {
                status_code: 404, ..
            } => SandboxError::Gone(format!("container {} no longer exists ({doing})", self.id)),
            BollardError::DockerResponseServerError {
                status_code: 409,
                message,
            } => SandboxError::Gone(format!(
                "container {} cannot run commands ({doing}): {message}",
                self.id
            )),
            other => SandboxError::Engine(format!("{doing} in container {}: {other}", self.id)),
        }
    }

    async fn stream_error(&self, e: BollardError) -> SandboxError {
        match self.is_running().await {
            Ok(false) => SandboxError::Gone(format!(
                "container {} stopped while an exec was streaming: {e}",
                self.id
            )),
            _ => SandboxError::Engine(format!(
                "reading exec output from container {}: {e}",
                self.id
            )),
        }
    }

    /// Whether the container is seen stopped within `budget`. The engine
    /// ends an exec's stream (and records its exit code) before it updates
    /// the state of a container that was killed under it, so one look right
    /// after the exec would still see it running.
    async fn stops_within(&self, budget: Duration) -> Result<bool, SandboxError> {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            if !self.is_running().await? {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(DEATH_POLL).await;
        }
    }

    async fn is_running(&self) -> Result<bool, SandboxError> {
        match self.docker.inspect_container(&self.id, None).await {
            Ok(info) => Ok(info.state.and_then(|s| s.running) == Some(true)),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(SandboxError::Engine(format!(
                "inspecting container {}: {e}",
                self.id
            ))),
        }
    }

    async fn kill(&self) {
        let options = KillContainerOptionsBuilder::default()
            .signal("KILL")
            .build();
        if let Err(e) = self.docker.kill_container(&self.id, Some(options)).await {
            // Already stopped or removed is the outcome we wanted.
            tracing::debug!(container = %self.id, error = %e, "kill after timeout did not apply");
        }
    }
}

impl Drop for DockerSession {
    fn drop(&mut self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        // Best effort only: there may be no runtime left to run the removal.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let docker = self.docker.clone();
            let id = std::mem::take(&mut self.id);
            tracing::warn!(container = %id, "sandbox session dropped without close; removing its container");
            runtime.spawn(async move {
                if let Err(e) = remove_container(&docker, &id).await {
                    tracing::warn!(container = %id, error = %e, "removing a dropped session's container failed");
                }
            });
        }
    }
}

/// Removes this instance's containers whose run is not among `live_runs()`;
/// returns the removed container ids.
///
/// The engine filters on `mercury.instance=<instance_id>` and every result is
/// checked again here, so a container without our label is never touched.
/// An empty instance id is refused: it would mean "no filter".
///
/// `live_runs` is asked only after the listing: a run is live before it
/// creates its container, so every listed container of a run that is still
/// going is in that later set. A set taken before the listing would miss a
/// run that started in between and sweep its brand-new container (the
/// start-up sweep runs while resumed turns start).
pub async fn sweep_orphans(
    docker: &Docker,
    instance_id: &str,
    live_runs: impl Fn() -> HashSet<String>,
) -> Result<Vec<String>, SandboxError> {
    if instance_id.trim().is_empty() {
        return Err(SandboxError::Engine(
            "refusing to sweep containers without an instance id".into(),
        ));
    }
    let filter = format!("{LABEL_INSTANCE}={instance_id}");
    let filters = HashMap::from([("label", vec![filter.as_str()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let containers = docker.list_containers(Some(options)).await.map_err(|e| {
        SandboxError::Engine(format!("listing containers of instance {instance_id}: {e}"))
    })?;

    let live_runs = live_runs();
    let mut removed = Vec::new();
    for container in containers {
        let Some(id) = container.id else { continue };
        let labels = container.labels.unwrap_or_default();
        if labels.get(LABEL_INSTANCE).map(String::as_str) != Some(instance_id) {
            continue;
        }
        if labels
            .get(LABEL_RUN)
            .is_some_and(|run| live_runs.contains(run))
        {
            continue;
        }
        tracing::info!(container = %id, run = ?labels.get(LABEL_RUN), "removing orphaned sandbox container");
        if remove_container(docker, &id).await? {
            removed.push(id);
        }
    }
    Ok(removed)
}

/// Force-removes a container and its anonymous volumes. Returns whether it
/// existed; "no such container" and "removal already in progress" count as
/// done so `close` stays idempotent.
async fn remove_container(docker: &Docker, id: &str) -> Result<bool, SandboxError> {
    let options = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(true),
        Err(BollardError::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(BollardError::DockerResponseServerError {
            status_code: 409,
            message,
        }) if message.contains("already in progress") => Ok(true),
        Err(e) => Err(SandboxError::Engine(format!(
            "removing container {id}: {e}"
        ))),
    }
}

fn bind_mount(source: &Path, target: &str) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(false),
        ..Default::default()
    }
}

/// `mercury-<first 8 of instance id>-<run id>`, with characters Docker does
/// not allow in names replaced by `-`.
fn container_name(instance_id: &str, run_id: &str) -> String {
    let short: String = instance_id.chars().take(8).collect();
    format!("mercury-{short}-{run_id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn canonical(path: &Path) -> Result<PathBuf, SandboxError> {
    std::fs::canonicalize(path).map_err(|source| SandboxError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The `user` of the container. A non-root host runs the container as its
/// own uid:gid so files in the workspace stay the host user's. A root host
/// runs it as nobody, and hands the workspace to nobody so it is writable:
/// running an agent as root, even in a container, is not an option.
async fn container_user(workspace: &Path) -> Result<String, SandboxError> {
    let (uid, gid) = effective_ids()?;
    if uid != 0 {
        return Ok(format!("{uid}:{gid}"));
    }
    let root = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || hand_to_nobody(&root))
        .await
        .map_err(|e| {
            SandboxError::Engine(format!(
                "chown task for {} panicked: {e}",
                workspace.display()
            ))
        })??;
    Ok(format!("{NOBODY}:{NOBODY}"))
}

/// The effective uid and gid of this process, read without libc: a process's
/// `/proc/<pid>` directory is owned by its effective ids.
fn effective_ids() -> Result<(u32, u32), SandboxError> {
    let meta = std::fs::metadata("/proc/self").map_err(|source| SandboxError::Io {
        path: "/proc/self (to read the effective uid)".into(),
        source,
    })?;
    Ok((meta.uid(), meta.gid()))
}

/// lchown-s the workspace tree to nobody unless its root already is. Links
/// are changed themselves, never followed, so a symlink in the workspace
/// cannot hand a host file to nobody.
fn hand_to_nobody(root: &Path) -> Result<(), SandboxError> {
    let io_err = |path: &Path, source: io::Error| SandboxError::Io {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::symlink_metadata(root).map_err(|e| io_err(root, e))?;
    if meta.uid() == NOBODY && meta.gid() == NOBODY {
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(root).to_path_buf();
            io_err(&path, io::Error::from(e))
        })?;
        std::os::unix::fs::lchown(entry.path(), Some(NOBODY), Some(NOBODY))
            .map_err(|e| io_err(entry.path(), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::hash::{BuildHasher, Hasher};
    use std::panic::AssertUnwindSafe;
    use std::sync::Arc;

    use futures_util::FutureExt;

    use super::super::image::{agent_image_tag, ensure_agent_image};
    use super::super::{RunKind, SandboxLimits};
    use super::*;

    const MIB: i64 = 1 << 20;

    /// A real dynamically linked host binary in the mrctl slot: proves the
    /// image carries a working loader and libc (the debug-build case).
    fn stand_in_mrctl() -> PathBuf {
        std::fs::canonicalize("/usr/bin/true").expect("coreutils true exists on the test host")
    }

    fn random_hex() -> String {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos(),
        );
        hasher.write_u32(std::process::id());
        format!("{:016x}", hasher.finish())
    }

    async fn engine() -> Docker {
        Docker::connect_with_local_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("a Docker engine must answer for these tests")
    }

    /// One test's world: its own instance id (so tests run in parallel and
    /// never see each other's containers) and its own workspace.
    #[derive(Clone)]
    struct Fixture {
        docker: Docker,
        backend: DockerBackend,
        instance: String,
        workspace: Arc<tempfile::TempDir>,
        /// Containers made outside this instance's label (sweep tests); they
        /// are removed with the rest at the end.
        extra: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Fixture {
        async fn new() -> Self {
            let docker = engine().await;
            let tag = agent_image_tag("test", &stand_in_mrctl()).expect("tag");
            let image = ensure_agent_image(&docker, &tag, &stand_in_mrctl())
                .await
                .expect("agent image");
            Self {
                backend: DockerBackend::with_client(docker.clone(), image),
                docker,
                instance: random_hex(),
                workspace: Arc::new(tempfile::tempdir().expect("workspace")),
                extra: Arc::default(),
            }
        }

        fn spec(&self, run: &str) -> SandboxSpec {
            SandboxSpec {
                instance_id: self.instance.clone(),
                space_id: "space-1".into(),
                run_id: run.into(),
                kind: RunKind::Task,
                workspace: self.workspace.path().to_path_buf(),
                api_socket: None,
                env: vec![
                    ("MERCURY_RUN_TOKEN".into(), "tok-123".into()),
                    ("MERCURY_SPACE".into(), "space-1".into()),
                ],
                limits: SandboxLimits {
                    memory_bytes: 128 * MIB,
                    nano_cpus: 500_000_000,
                    pids: 64,
                    tmp_bytes: 8 * MIB,
                },
            }
        }

        async fn ours(&self) -> Vec<String> {
            let filter = format!("{LABEL_INSTANCE}={}", self.instance);
            let filters = HashMap::from([("label", vec![filter.as_str()])]);
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            self.docker
                .list_containers(Some(options))
                .await
                .expect("list")
                .into_iter()
                .filter_map(|c| c.id)
                .collect()
        }

        fn track(&self, id: &str) {
            self.extra.lock().expect("extra ids").push(id.to_string());
        }

        async fn remove_all(&self) {
            let extra = self.extra.lock().expect("extra ids").clone();
            for id in self.ours().await.into_iter().chain(extra) {
                let _ = remove_container(&self.docker, &id).await;
            }
        }

        /// Runs `body`, then removes every container of this instance even
        /// when `body` panicked, then re-raises the panic.
        async fn run<F, Fut>(self, body: F)
        where
            F: FnOnce(Fixture) -> Fut,
            Fut: Future<Output = ()>,
        {
            let outcome = AssertUnwindSafe(body(self.clone())).catch_unwind().await;
            self.remove_all().await;
            if let Err(panic) = outcome {
                std::panic::resume_unwind(panic);
            }
        }
    }

    fn req(argv: &[&str]) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: None,
            timeout: Duration::from_secs(30),
            output_cap: 64 * 1024,
        }
    }

    #[test]
    fn instance_id_is_16_hex_and_stable_for_one_dir() {
        let dir = tempfile::tempdir().expect("dir");
        let id = instance_id_for(dir.path()).expect("id");
        assert_eq!(id.len(), 16);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        // The same dir through a different spelling is the same instance.
        let dotted = dir.path().join(".");
        assert_eq!(instance_id_for(&dotted).expect("id"), id);
        let other = tempfile::tempdir().expect("other");
        assert_ne!(instance_id_for(other.path()).expect("other id"), id);
        assert!(instance_id_for(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn container_name_uses_short_instance_and_run_and_only_legal_characters() {
        assert_eq!(
            container_name("0123456789abcdef", "run-1"),
            "mercury-01234567-run-1"
        );
        assert_eq!(container_name("abc", "r/1 x"), "mercury-abc-r-1-x");
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_is_no_engine() {
        let err = DockerBackend::connect_socket(Path::new("/nonexistent/docker.sock"), "x".into())
            .await
            .expect_err("no engine there");
        assert!(matches!(err, SandboxError::NoEngine(_)), "{err:?}");
        assert!(
            err.to_string().contains("/nonexistent/docker.sock"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn connect_with_local_defaults_answers_ping() {
        let backend = DockerBackend::connect("unused".into())
            .await
            .expect("engine");
        backend.ping().await.expect("ping");
        assert_eq!(backend.name(), "docker");
    }

    #[tokio::test]
    async fn start_refuses_an_empty_instance_id() {
        let fx = Fixture::new().await;
        fx.clone()
            .run(|fx| async move {
                let mut spec = fx.spec("r-empty");
                spec.instance_id = String::new();
                let err = fx.backend.start(spec).await.err().expect("must refuse");
                assert!(err.to_string().contains("instance id"), "{err}");
            })
            .await;
    }

    #[tokio::test]
    async fn echo_stderr_and_exit_code_come_back() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-echo")).await.expect("start");
                assert_eq!(session.workdir(), "/work");
                let out = session
                    .exec(req(&["echo", "hello", "world"]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 0);
                assert_eq!(out.stdout, "hello world\n");
                assert_eq!(out.stderr, "");
                assert!(!out.truncated);

                let out = session
                    .exec(req(&["sh", "-c", "echo oops >&2; pwd; exit 3"]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 3);
                assert_eq!(out.stdout, "/work\n");
                assert_eq!(out.stderr, "oops\n");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_missing_command_is_an_exit_code_not_an_error() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-missing")).await.expect("start");
                let out = session
                    .exec(req(&["no-such-command-anywhere"]))
                    .await
                    .expect("an outcome, not an error");
                assert!(matches!(out.exit_code, 126 | 127), "{out:?}");
                // The session is still usable.
                assert_eq!(
                    session.exec(req(&["true"])).await.expect("true").exit_code,
                    0
                );
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn stdin_is_written_then_closed() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-stdin")).await.expect("start");
                let mut request = req(&["cat"]);
                request.stdin = Some(b"line one\nline two\n".to_vec());
                let out = session.exec(request).await.expect("cat");
                assert_eq!(out.stdout, "line one\nline two\n");
                assert_eq!(out.exit_code, 0);

                // More than any pipe buffer: needs writing and reading at once.
                let mut request = req(&["wc", "-c"]);
                request.stdin = Some(vec![b'x'; 3 << 20]);
                let out = session.exec(request).await.expect("wc");
                assert_eq!(out.stdout.trim(), (3u64 << 20).to_string());
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_file_written_inside_appears_in_the_host_workspace() {
        Fixture::new()
            .await
            .run(|fx| async move {
                std::fs::write(fx.workspace.path().join("from-host.txt"), "host says hi")
                    .expect("seed");
                let session = fx.backend.start(fx.spec("r-files")).await.expect("start");
                let out = session
                    .exec(req(&[
                        "sh",
                        "-c",
                        "cat from-host.txt && mkdir -p sub && echo written > sub/out.txt",
                    ]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 0, "{}", out.stderr);
                assert_eq!(out.stdout, "host says hi");
                let host = std::fs::read_to_string(fx.workspace.path().join("sub/out.txt"))
                    .expect("file on host");
                assert_eq!(host, "written\n");

                // The root filesystem is read-only; /tmp is a writable tmpfs.
                let out = session
                    .exec(req(&[
                        "sh",
                        "-c",
                        "touch /etc/x; echo $?; touch /tmp/x && echo tmp-ok",
                    ]))
                    .await
                    .expect("exec");
                assert!(out.stdout.starts_with('1'), "{out:?}");
                assert!(out.stdout.contains("tmp-ok"), "{out:?}");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn output_beyond_the_cap_is_dropped_and_flagged() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-cap")).await.expect("start");
                let mut request =
                    req(&["sh", "-c", "head -c 200000 /bin/sh | base64; echo done >&2"]);
                request.output_cap = 1000;
                let out = session.exec(request).await.expect("exec");
                assert_eq!(out.exit_code, 0);
                assert_eq!(out.stdout.len(), 1000);
                assert!(out.truncated);
                assert_eq!(out.stderr, "done\n");

                let mut request = req(&["echo", "short"]);
                request.output_cap = 1000;
                assert!(!session.exec(request).await.expect("exec").truncated);
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_timeout_kills_the_container_and_close_leaves_none() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-timeout")).await.expect("start");
                let mut request = req(&["sleep", "30"]);
                request.timeout = Duration::from_millis(1500);
                let started = std::time::Instant::now();
                let err = session.exec(request).await.expect_err("must time out");
                assert!(matches!(err, SandboxError::Timeout(_)), "{err:?}");
                assert!(started.elapsed() < Duration::from_secs(20));

                let info = fx
                    .docker
                    .inspect_container(session.id(), None)
                    .await
                    .expect("inspect");
                assert_ne!(info.state.and_then(|s| s.running), Some(true));
                let err = session
                    .exec(req(&["true"]))
                    .await
                    .expect_err("container is dead");
                assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");

                session.close().await.expect("close");
                assert!(fx.ours().await.is_empty(), "container left behind");
                session.close().await.expect("close twice");
            })
            .await;
    }

    #[tokio::test]
    async fn a_container_killed_from_outside_makes_exec_gone() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-killed")).await.expect("start");
                session.exec(req(&["true"])).await.expect("alive");
                fx.docker
                    .kill_container(
                        session.id(),
                        None::<bollard::query_parameters::KillContainerOptions>,
                    )
                    .await
                    .expect("kill");
                let err = session.exec(req(&["echo", "hi"])).await.expect_err("gone");
                assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");

                // Removed from outside: still Gone, and close is still Ok.
                remove_container(&fx.docker, session.id())
                    .await
                    .expect("remove");
                let err = session.exec(req(&["echo", "hi"])).await.expect_err("gone");
                assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");
                session.close().await.expect("close after removal");
            })
            .await;
    }

    #[tokio::test]
    async fn a_command_killed_by_a_signal_in_a_live_container_is_an_exit_code() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx
                    .backend
                    .start(fx.spec("r-self-kill"))
                    .await
                    .expect("start");
                let out = session
                    .exec(req(&["sh", "-c", "kill -9 $$"]))
                    .await
                    .expect("an outcome: the container is alive");
                assert_eq!(out.exit_code, 137, "{out:?}");
                assert_eq!(
                    session
                        .exec(req(&["true"]))
                        .await
                        .expect("still usable")
                        .exit_code,
                    0
                );
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_container_killed_while_its_exec_runs_makes_that_exec_gone() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx
                    .backend
                    .start(fx.spec("r-killed-mid"))
                    .await
                    .expect("start");
                let session: Arc<dyn SandboxSession> = Arc::from(session);
                let running = tokio::spawn({
                    let session = session.clone();
                    async move {
                        session
                            .exec(req(&["sh", "-c", "touch started; sleep 600"]))
                            .await
                    }
                });
                let marker = fx.workspace.path().join("started");
                for _ in 0..600 {
                    if marker.exists() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert!(marker.exists(), "the exec never started");
                fx.docker
                    .kill_container(
                        session.id(),
                        None::<bollard::query_parameters::KillContainerOptions>,
                    )
                    .await
                    .expect("kill");
                let result = tokio::time::timeout(Duration::from_secs(60), running)
                    .await
                    .expect("the exec ends with its container")
                    .expect("exec task");
                // Not "exit code 137" from a live sandbox: the sandbox died.
                assert!(matches!(result, Err(SandboxError::Gone(_))), "{result:?}");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn inspect_shows_labels_limits_lockdown_user_and_exact_mounts() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let sock_dir = tempfile::tempdir().expect("socket dir");
                let sock = sock_dir.path().join("api.sock");
                let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind socket");
                let mut spec = fx.spec("r-inspect");
                spec.api_socket = Some(sock.clone());
                spec.kind = RunKind::Ask;
                let session = fx.backend.start(spec).await.expect("start");
                let info = fx
                    .docker
                    .inspect_container(session.id(), None)
                    .await
                    .expect("inspect");

                assert_eq!(
                    info.name.as_deref(),
                    Some(format!("/mercury-{}-r-inspect", &fx.instance[..8]).as_str())
                );
                let config = info.config.expect("config");
                let labels = config.labels.expect("labels");
                assert_eq!(labels[LABEL_INSTANCE], fx.instance);
                assert_eq!(labels[LABEL_SPACE], "space-1");
                assert_eq!(labels[LABEL_RUN], "r-inspect");
                assert_eq!(labels[LABEL_KIND], "ask");
                assert_eq!(
                    config.cmd,
                    Some(vec!["/bin/sleep".to_string(), "infinity".to_string()])
                );
                let user = config.user.expect("user");
                assert!(
                    !user.is_empty() && user != "0" && !user.starts_with("0:") && user != "root"
                );
                if effective_ids().expect("ids").0 == 0 {
                    assert_eq!(user, "65534:65534");
                }
                assert_eq!(config.working_dir.as_deref(), Some("/work"));

                let host = info.host_config.expect("host config");
                assert_eq!(host.network_mode.as_deref(), Some("none"));
                assert_eq!(host.readonly_rootfs, Some(true));
                assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
                assert_eq!(
                    host.security_opt,
                    Some(vec!["no-new-privileges".to_string()])
                );
                assert_eq!(host.memory, Some(128 * MIB));
                assert_eq!(host.memory_swap, Some(128 * MIB));
                assert_eq!(host.nano_cpus, Some(500_000_000));
                assert_eq!(host.pids_limit, Some(64));
                assert_eq!(host.auto_remove, Some(false));
                let tmpfs = host.tmpfs.expect("tmpfs");
                assert!(
                    tmpfs["/tmp"].contains(&format!("size={}", 8 * MIB)),
                    "{tmpfs:?}"
                );

                let mut mounts: Vec<(String, String)> = info
                    .mounts
                    .expect("mounts")
                    .into_iter()
                    .map(|m| {
                        (
                            m.destination.unwrap_or_default(),
                            m.source.unwrap_or_default(),
                        )
                    })
                    .collect();
                mounts.sort();
                let workspace = std::fs::canonicalize(fx.workspace.path()).expect("canonical");
                let sock = std::fs::canonicalize(&sock).expect("canonical socket");
                assert_eq!(
                    mounts,
                    vec![
                        (
                            "/run/mercury/api.sock".to_string(),
                            sock.display().to_string()
                        ),
                        ("/work".to_string(), workspace.display().to_string()),
                    ]
                );
                let out = session
                    .exec(req(&["sh", "-c", "test -S /run/mercury/api.sock && id -u"]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 0, "{out:?}");
                assert_ne!(out.stdout.trim(), "0");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn environment_is_only_the_spec_env_plus_engine_defaults() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-env")).await.expect("start");
                let info = fx
                    .docker
                    .inspect_container(session.id(), None)
                    .await
                    .expect("inspect");
                let mut config_env = info.config.and_then(|c| c.env).unwrap_or_default();
                // The engine adds a default PATH to images that set none.
                config_env.retain(|kv| !kv.starts_with("PATH="));
                config_env.sort();
                assert_eq!(
                    config_env,
                    vec![
                        "MERCURY_RUN_TOKEN=tok-123".to_string(),
                        "MERCURY_SPACE=space-1".to_string()
                    ]
                );

                let out = session.exec(req(&["env"])).await.expect("env");
                let mut keys: Vec<&str> = out
                    .stdout
                    .lines()
                    .filter_map(|l| l.split_once('=').map(|(k, _)| k))
                    .collect();
                keys.sort();
                // PATH and HOSTNAME come from the engine, HOME from the
                // runtime (nobody's home); nothing from this host.
                let allowed = [
                    "HOME",
                    "HOSTNAME",
                    "MERCURY_RUN_TOKEN",
                    "MERCURY_SPACE",
                    "PATH",
                ];
                assert!(
                    keys.iter().all(|k| allowed.contains(k)),
                    "unexpected env: {keys:?}"
                );
                assert!(out.stdout.contains("MERCURY_RUN_TOKEN=tok-123\n"));
                assert!(
                    !out.stdout.contains("CARGO"),
                    "host env leaked: {}",
                    out.stdout
                );
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn proof_is_the_hostname_and_a_prefix_of_the_container_id() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-proof")).await.expect("start");
                let proof = session.proof().await.expect("proof");
                assert_eq!(proof.len(), 12, "{proof}");
                assert!(
                    session.id().starts_with(&proof),
                    "{proof} vs {}",
                    session.id()
                );
                let info = fx
                    .docker
                    .inspect_container(session.id(), None)
                    .await
                    .expect("inspect");
                assert_eq!(info.config.and_then(|c| c.hostname), Some(proof));
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_dynamic_mrctl_runs_inside_the_image() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let session = fx.backend.start(fx.spec("r-mrctl")).await.expect("start");
                let out = session
                    .exec(req(&["mrctl", "--version"]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 0, "{out:?}");
                assert!(out.stdout.contains("coreutils"), "{out:?}");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn a_root_host_hands_the_workspace_to_nobody() {
        if effective_ids().expect("ids").0 != 0 {
            return; // Non-root hosts run the container as themselves; nothing to chown.
        }
        Fixture::new()
            .await
            .run(|fx| async move {
                let nested = fx.workspace.path().join("a/b");
                std::fs::create_dir_all(&nested).expect("mkdir");
                std::fs::write(nested.join("f"), "x").expect("write");
                std::os::unix::fs::symlink("/etc/hostname", fx.workspace.path().join("link"))
                    .expect("symlink");
                let session = fx.backend.start(fx.spec("r-chown")).await.expect("start");
                for path in [
                    fx.workspace.path().to_path_buf(),
                    nested.clone(),
                    nested.join("f"),
                ] {
                    let meta = std::fs::symlink_metadata(&path).expect("meta");
                    assert_eq!(
                        (meta.uid(), meta.gid()),
                        (NOBODY, NOBODY),
                        "{}",
                        path.display()
                    );
                }
                let link =
                    std::fs::symlink_metadata(fx.workspace.path().join("link")).expect("link");
                assert_eq!(link.uid(), NOBODY);
                // The link's target on the host was not handed over.
                assert_eq!(std::fs::metadata("/etc/hostname").expect("target").uid(), 0);
                let out = session
                    .exec(req(&["sh", "-c", "echo ok > a/b/f && cat a/b/f"]))
                    .await
                    .expect("exec");
                assert_eq!(out.stdout, "ok\n", "{out:?}");
                session.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn starting_the_same_run_again_replaces_its_leftover() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let first = fx.backend.start(fx.spec("r-again")).await.expect("first");
                let first_id = first.id().to_string();
                std::mem::forget(first); // a crash: no close, no drop
                let second = fx.backend.start(fx.spec("r-again")).await.expect("second");
                assert_ne!(second.id(), first_id);
                assert_eq!(fx.ours().await, vec![second.id().to_string()]);
                second.close().await.expect("close");
            })
            .await;
    }

    /// A bare container from the agent image, outside any session.
    async fn bare_container(
        docker: &Docker,
        image: &str,
        labels: HashMap<String, String>,
    ) -> String {
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(KEEPALIVE_CMD.iter().map(|s| s.to_string()).collect()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = docker
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                body,
            )
            .await
            .expect("create")
            .id;
        docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .expect("start");
        id
    }

    #[tokio::test]
    async fn sweep_removes_only_this_instances_dead_runs() {
        Fixture::new()
            .await
            .run(|fx| async move {
                let foreign = bare_container(
                    &fx.docker,
                    fx.backend.image(),
                    HashMap::from([
                        (LABEL_INSTANCE.to_string(), random_hex()),
                        (LABEL_RUN.to_string(), "r-dead".to_string()),
                    ]),
                )
                .await;
                fx.track(&foreign);
                let unlabelled =
                    bare_container(&fx.docker, fx.backend.image(), HashMap::new()).await;
                fx.track(&unlabelled);

                let dead = fx.backend.start(fx.spec("r-dead")).await.expect("dead run");
                let live = fx.backend.start(fx.spec("r-live")).await.expect("live run");
                let dead_id = dead.id().to_string();
                std::mem::forget(dead); // as after a crash: no close, no drop

                let live_runs = HashSet::from(["r-live".to_string()]);
                let removed = sweep_orphans(&fx.docker, &fx.instance, || live_runs.clone())
                    .await
                    .expect("sweep");
                assert_eq!(removed, vec![dead_id]);
                assert_eq!(fx.ours().await, vec![live.id().to_string()]);
                for id in [&foreign, &unlabelled] {
                    let info = fx
                        .docker
                        .inspect_container(id, None)
                        .await
                        .expect("untouched");
                    assert_eq!(info.state.and_then(|s| s.running), Some(true));
                }
                // Nothing left to sweep the second time.
                assert!(
                    sweep_orphans(&fx.docker, &fx.instance, || live_runs.clone())
                        .await
                        .expect("sweep again")
                        .is_empty()
                );
                live.close().await.expect("close");
            })
            .await;
    }

    #[tokio::test]
    async fn sweep_without_an_instance_id_is_refused() {
        let docker = engine().await;
        for empty in ["", "   "] {
            let err = sweep_orphans(&docker, empty, HashSet::new)
                .await
                .expect_err("must refuse");
            assert!(err.to_string().contains("instance id"), "{err}");
        }
    }
}
