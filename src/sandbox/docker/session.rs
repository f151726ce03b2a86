//! The exec session in one run's container: the exec protocol (stdin written
//! while capped, demultiplexed output is read, timeout, exit code), telling a
//! dead container (`Gone`) from an engine hiccup, the hostname proof, and
//! close.
//!
//! Must never: leave a timed-out command running (the container is killed),
//! report a command as finished in a live sandbox when its container died
//! under it, or fail a second `close`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::KillContainerOptionsBuilder;
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::remove_container;
use crate::sandbox::{
    CappedBuffer, ExecOutput, ExecRequest, SandboxError, SandboxSession, CONTAINER_WORKDIR,
};

/// Budget for the `hostname` exec behind [`SandboxSession::proof`].
const PROOF_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a finished exec stream is re-inspected until the engine has
/// recorded the exit code (it can lag the end of the stream by a moment).
const EXIT_POLL: Duration = Duration::from_millis(10);

/// How long a command that died by a signal waits to learn whether its
/// container died too (see `DockerSession::stops_within`). Only such commands
/// pay it; a container that did die usually shows it within milliseconds.
const DEATH_SETTLE: Duration = Duration::from_secs(2);

/// One run's container. Dropping it without `close` asks the runtime to
/// remove the container in the background; the orphan sweep at start-up is
/// what guarantees it.
#[derive(Debug)]
pub struct DockerSession {
    pub(super) docker: Docker,
    id: String,
    closed: AtomicBool,
    /// The container's API socket; lives as long as the session.
    _relay: Option<crate::sandbox::relay::SocketRelay>,
    /// What a spawned process's own container copies (see `spawn`).
    pub(super) sibling: SiblingShape,
    /// Containers of spawned processes still to remove at `close`.
    pub(super) spawned: std::sync::Mutex<Vec<String>>,
    /// The workspace copied in and back (an engine elsewhere); `None` when
    /// it is bound.
    synced: Option<super::synced::SyncedWork>,
    /// The API carried over an exec stream (an engine elsewhere).
    pub(super) bridge: Option<super::bridge::ApiBridge>,
    /// Counts this sandbox against its engine until the session is gone.
    _placed: Option<super::engines::Placed>,
    /// The run's environment, given to every exec: a pooled container was
    /// created before its run, with no environment of its own. `None`
    /// when the container was created with it.
    exec_env: Option<Vec<String>>,
    /// The pool slot a pooled container came from: its mounts of this
    /// run's layer, socket and skills, undone after the container is gone.
    slot: std::sync::Mutex<Option<super::warm::ClaimedSlot>>,
}

/// The run container's name and create body: a spawned process's container
/// is this body with another image and command, so it has the same
/// workspace, mounts, limits, user, environment and labels by construction.
#[derive(Debug, Clone)]
pub(super) struct SiblingShape {
    pub(super) name: String,
    pub(super) body: bollard::models::ContainerCreateBody,
}

impl DockerSession {
    /// The session of the started container `id`.
    pub(super) fn new(
        docker: Docker,
        id: String,
        relay: Option<crate::sandbox::relay::SocketRelay>,
        sibling: SiblingShape,
    ) -> Self {
        Self {
            docker,
            id,
            closed: AtomicBool::new(false),
            _relay: relay,
            sibling,
            spawned: std::sync::Mutex::new(Vec::new()),
            synced: None,
            bridge: None,
            _placed: None,
            exec_env: None,
            slot: std::sync::Mutex::new(None),
        }
    }

    /// A pooled container claimed by one run: `env` is the run's, given to
    /// each exec; `slot` is undone when the container is removed.
    pub(super) fn claimed(mut self, slot: super::warm::ClaimedSlot, env: Vec<String>) -> Self {
        self.exec_env = Some(env);
        self.slot = std::sync::Mutex::new(Some(slot));
        self
    }

    pub(super) fn placed(mut self, placed: super::engines::Placed) -> Self {
        self._placed = Some(placed);
        self
    }

    pub(super) fn synced(mut self, work: super::synced::SyncedWork) -> Self {
        self.synced = Some(work);
        self
    }

    pub(super) fn container(&self) -> &str {
        &self.id
    }
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
        // A synced workspace the host changed since (a file tool) goes in
        // again first; what the command changed comes back before its
        // output is returned, so the turn's next step sees it.
        if let Some(work) = self.synced.as_ref().filter(|w| w.is_stale()) {
            work.push(&self.docker, &self.id).await?;
        }
        let out = self.exec_timed(req).await?;
        if let Some(work) = &self.synced {
            work.pull(&self.docker, &self.id).await?;
        }
        Ok(out)
    }

    async fn proof(&self) -> Result<String, SandboxError> {
        // `hostname` changes no file: nothing to copy back.
        let out = self
            .exec_timed(ExecRequest {
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

    fn host_changed(&self) {
        if let Some(work) = &self.synced {
            work.mark_stale();
        }
    }

    async fn spawn(
        &self,
        req: crate::sandbox::SpawnRequest,
    ) -> Result<crate::sandbox::SpawnedProcess, SandboxError> {
        if self.synced.is_some() {
            // A sibling container would get a workspace volume of its own.
            return Err(SandboxError::Unavailable(
                "an extension's stdio server needs an engine on this host (sandbox.docker.hosts: a unix:// engine); this sandbox runs on an engine elsewhere".into(),
            ));
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::Gone(format!(
                "container {} is closed",
                self.id
            )));
        }
        self.spawn_sibling(req).await
    }

    async fn close(&self) -> Result<(), SandboxError> {
        // Spawned processes' containers first: they share the workspace.
        let spawned = std::mem::take(&mut *self.spawned_ids());
        for id in spawned {
            remove_container(&self.docker, &id).await?;
        }
        remove_container(&self.docker, &self.id).await?;
        self.closed.store(true, Ordering::SeqCst);
        // Only now: the container that saw the layer is gone.
        drop(self.take_slot());
        Ok(())
    }
}

impl DockerSession {
    /// One command within its timeout, the workspace left as it is.
    async fn exec_timed(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
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

    async fn exec_inner(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let id = &self.id;
        let config = CreateExecOptions {
            cmd: Some(req.argv.clone()),
            attach_stdin: Some(req.stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            working_dir: Some(CONTAINER_WORKDIR.to_string()),
            env: self.exec_env.clone(),
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
                        stdout.push(&message);
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
        super::settles_within(budget, || async { Ok(!self.is_running().await?) }).await
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

impl DockerSession {
    fn take_slot(&self) -> Option<super::warm::ClaimedSlot> {
        // A poisoned lock still holds the right slot to undo.
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Drop for DockerSession {
    fn drop(&mut self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        // The slot's mounts go now (lazily: the container may still hold
        // them until its removal below).
        drop(self.take_slot());
        // Best effort only: there may be no runtime left to run the removal.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let docker = self.docker.clone();
            let spawned = std::mem::take(&mut *self.spawned_ids());
            for id in spawned {
                let docker = docker.clone();
                runtime.spawn(async move { remove_container(&docker, &id).await });
            }
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
