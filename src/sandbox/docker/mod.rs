//! Docker backend: one labelled, locked-down container per run; every tool
//! call is a `docker exec` in it.
//!
//! Owns: the container's shape (labels, name, mounts, limits, user, env), the
//! exec protocol (stdin, capped demultiplexed output, timeout, exit code), the
//! removal of a run's container, the orphan sweep, and its side of the
//! sandbox lifecycle (images on each engine, an instance's running
//! containers).
//!
//! Must never: mount anything but the workspace (and the API socket when
//! given, and the read-only directories the spec or a spawn request names;
//! on an engine elsewhere, only its own tmpfs volumes), bind a host path
//! into a container on an engine that is not this host's, give the
//! container a network, add a host environment variable to
//! the container, touch a container without this instance's
//! `mercury.instance` label, or sweep when the instance id is empty.
//!
//! Layout: this file holds [`DockerBackend`] (start: validate the spec,
//! place it on an engine, create, start) and the removal of a container;
//! `connect` reaches and negotiates the engines; `lifecycle` implements
//! [`crate::sandbox::lifecycle::SandboxLifecycle`];
//! `engines` the engine list, placement and health; `synced` the workspace
//! copied to and from an engine elsewhere; `bridge` the API carried over an
//! exec stream there; `shape` builds the
//! create body (pure); `user` picks the container user and hands a root
//! host's workspace to `nobody`; `session` is the exec session; `sweep` the
//! orphan sweep; `spawn` a long-lived process's own container beside the
//! run's (an extension's stdio server); `tests` the tests against a real
//! engine.

mod bridge;
mod connect;
mod engines;
mod lifecycle;
mod session;
mod shape;
mod spawn;
mod sweep;
mod synced;
mod user;
mod warm;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;

pub use engines::EngineTls;
pub use session::DockerSession;
pub use sweep::sweep_orphans;
pub use user::NOBODY;
pub use warm::sweep_warm_roots;

use engines::Engine;

use crate::sandbox::relay::SocketRelay;
use crate::sandbox::{
    EngineView, Isolation, SandboxBackend, SandboxError, SandboxSession, SandboxSpec, WarmSpec,
    WorkspaceMount, LABEL_INSTANCE, LABEL_RUN,
};

/// The agent image as start-up made it ready (see
/// [`DockerBackend::remember_image`]).
#[derive(Clone, Debug)]
struct ImageRecipe {
    tag: String,
    /// Built from this `mrctl` when absent; `None`: must be present.
    mrctl: Option<PathBuf>,
}

/// Starts one container per run from the agent image, on the least busy
/// healthy engine of its list (`engines`).
#[derive(Clone, Debug)]
pub struct DockerBackend {
    /// Never empty.
    engines: Arc<Vec<Arc<Engine>>>,
    image: String,
    /// How the agent image was made ready at start-up, so an engine that
    /// joins later gets it the same way (shared by every clone).
    recipe: Arc<Mutex<Option<ImageRecipe>>>,
    /// Containers started ahead for this image (`sandbox.warm`); `None`
    /// when off.
    pool: Option<Arc<warm::WarmPool>>,
}

impl DockerBackend {
    /// Wraps an already connected client of this host's engine (shared
    /// with the sweep, or tests).
    pub fn with_client(docker: Docker, image: String) -> Self {
        Self::with_engines(vec![Engine::new(docker, "local".into(), false)], image)
    }

    /// Engines already connected and negotiated, in their configured order.
    pub(super) fn with_engines(engines: Vec<Engine>, image: String) -> Self {
        Self {
            engines: Arc::new(engines.into_iter().map(Arc::new).collect()),
            image,
            recipe: Arc::new(Mutex::new(None)),
            pool: None,
        }
    }

    /// The first joined engine's client: the image, sweep and doctor of a
    /// single engine host.
    pub fn docker(&self) -> Docker {
        self.engines
            .iter()
            .find(|e| e.joined())
            .unwrap_or(&self.engines[0])
            .client()
    }

    /// Every joined engine's client, in the configured order.
    pub fn clients(&self) -> impl Iterator<Item = (&str, Docker)> {
        self.engines
            .iter()
            .filter(|e| e.joined())
            .map(|e| (e.endpoint(), e.client()))
    }

    pub fn engines(&self) -> Vec<EngineView> {
        self.engines.iter().map(|e| e.view()).collect()
    }

    /// Pings every engine, recording which answer (placement skips the
    /// others until they answer again). An engine left out at start-up
    /// joins here once it answers, after the image is made ready on it.
    pub async fn check_engines(&self) -> Vec<EngineView> {
        for e in self.engines.iter() {
            match e.check().await {
                Ok(engines::Checked::Answered) => {}
                Ok(engines::Checked::Joined) => {
                    match self.ready_joined(e).await {
                        Ok(()) => {
                            e.mark(Ok(()));
                            tracing::warn!(engine = e.endpoint(), "a sandbox engine left out at start-up answers now and takes sandboxes");
                        }
                        Err(err) => {
                            e.mark(Err(&err.to_string()));
                            tracing::error!(engine = e.endpoint(), error = %err, "a sandbox engine answers but cannot serve");
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(engine = e.endpoint(), error = %err, "a sandbox engine is down");
                }
            }
        }
        self.engines()
    }

    /// An engine that just joined gets what the others got at start-up:
    /// the agent image, built from this host's files when start-up built
    /// it, else it must already be there.
    async fn ready_joined(&self, engine: &Engine) -> Result<(), SandboxError> {
        let recipe = self.recipe.lock().ok().and_then(|r| r.clone());
        let docker = engine.client();
        let image = match &recipe {
            Some(r) => r.tag.clone(),
            None => self.image.clone(),
        };
        if image.is_empty() {
            return Ok(());
        }
        if let Some(ImageRecipe {
            mrctl: Some(mrctl), ..
        }) = &recipe
        {
            crate::sandbox::image::ensure_agent_image(&docker, &image, mrctl).await?;
            return Ok(());
        }
        if crate::sandbox::image::image_exists(&docker, &image).await? {
            Ok(())
        } else {
            Err(SandboxError::Image(format!(
                "{image} is not on {} (build it there with `mercury image build --data-dir`)",
                engine.endpoint()
            )))
        }
    }

    /// Remembers how start-up made the agent image ready: `mrctl` to build
    /// it from, or `None` when it must be present already.
    pub(crate) fn remember_image(&self, tag: &str, mrctl: Option<&Path>) {
        if let Ok(mut r) = self.recipe.lock() {
            *r = Some(ImageRecipe {
                tag: tag.to_owned(),
                mrctl: mrctl.map(Path::to_path_buf),
            });
        }
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// The same engines, starting `image` (cold: a pool is of one image).
    pub fn with_image(self, image: String) -> Self {
        Self {
            image,
            pool: None,
            ..self
        }
    }

    /// The same backend, keeping `warm.slots` containers of its image
    /// started (and paused) ahead on this machine's engines, each claimed by
    /// one run of `warm.instance_id` with `warm.limits` and destroyed with
    /// its session. Fails when the pool's tmpfs cannot be mounted (the host
    /// may not mount: it needs the same rights as a turn's layer).
    pub fn warm(self, warm: WarmSpec) -> Result<Self, SandboxError> {
        let pool = warm::WarmPool::start(warm, self.image.clone(), Arc::clone(&self.engines))?;
        Ok(Self {
            pool: Some(pool),
            ..self
        })
    }

    /// Creates the container; a same-named container left by an earlier
    /// attempt at this very run (crash, restart) is replaced, anything else
    /// with that name is an error.
    async fn create(
        docker: &Docker,
        name: &str,
        spec: &SandboxSpec,
        body: ContainerCreateBody,
    ) -> Result<String, SandboxError> {
        let options = || Some(CreateContainerOptionsBuilder::default().name(name).build());
        match docker.create_container(options(), body.clone()).await {
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
        let existing = docker.inspect_container(name, None).await.map_err(|e| {
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
        remove_container(docker, name).await?;
        docker
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

    fn isolation(&self) -> Isolation {
        Isolation::Container
    }

    fn engines(&self) -> Vec<EngineView> {
        DockerBackend::engines(self)
    }

    async fn check_health(&self) -> Vec<EngineView> {
        self.check_engines().await
    }

    async fn sweep_orphans(
        &self,
        instance_id: &str,
        live_runs: &(dyn Fn() -> std::collections::HashSet<String> + Send + Sync),
    ) -> Result<usize, SandboxError> {
        // This process's pooled containers are no orphans; a killed
        // predecessor's are (their slots are not in this pool).
        let spared = || {
            let mut runs = live_runs();
            if let Some(pool) = &self.pool {
                runs.extend(pool.alive());
            }
            runs
        };
        let mut removed = 0;
        let mut failed = Vec::new();
        let mut tried = 0;
        // One not joined yet is swept once it joins (its health check).
        for e in self.engines.iter().filter(|e| e.joined()) {
            tried += 1;
            match sweep_orphans(&e.client(), instance_id, &spared).await {
                Ok(ids) => removed += ids.len(),
                // One engine down does not keep the others unswept.
                Err(err) => failed.push(format!("{}: {err}", e.endpoint())),
            }
        }
        if tried > 0 && failed.len() == tried {
            return Err(SandboxError::Engine(failed.join("; ")));
        }
        for f in &failed {
            tracing::error!(error = %f, "orphan sweep failed on an engine");
        }
        Ok(removed)
    }

    async fn prepare_workspace(&self, live: &Path) -> Result<(), SandboxError> {
        user::container_user(live).await.map(|_| ())
    }

    fn warm_idle(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.idle_count())
    }

    async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.shutdown().await;
        }
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
        if let Some(pool) = self.pool.as_ref().filter(|p| p.fits(&spec)) {
            if let Some(claimed) = pool.claim(&spec).await {
                return claimed.map(|s| Box::new(s) as Box<dyn SandboxSession>);
            }
        }
        // The refill waits while a run waits on the engine.
        let _cold = self.pool.as_ref().map(warm::WarmPool::cold_start);
        let placed = engines::place(&self.engines)
            .ok_or_else(|| SandboxError::NoEngine("no Docker engine is configured".into()))?;
        let engine = Arc::clone(&placed.0);
        let synced = engine.remote() || matches!(spec.workspace, WorkspaceMount::Synced(_));
        let docker = engine.client();
        let started = if synced {
            self.start_synced(&docker, &spec).await
        } else {
            self.start_bound(&docker, &spec).await
        };
        match started {
            Ok(session) => Ok(Box::new(session.placed(placed))),
            Err(e) => {
                if matches!(e, SandboxError::NoEngine(_)) {
                    engine.mark(Err(&e.to_string()));
                }
                Err(e)
            }
        }
    }
}

impl DockerBackend {
    /// A container on this host's engine: the workspace and a relay of the
    /// API socket bound in.
    async fn start_bound(
        &self,
        docker: &Docker,
        spec: &SandboxSpec,
    ) -> Result<DockerSession, SandboxError> {
        let (workspace, user, relay) = bound_parts(spec).await?;
        let reach = shape::Reach::Bound {
            workspace: &workspace,
            api_socket: relay.as_ref().map(SocketRelay::path),
        };
        let (id, sibling) = self.create_shaped(docker, spec, reach, user).await?;
        Self::run(docker, &id, &sibling.name).await?;
        tracing::debug!(container = %id, run = %spec.run_id, "sandbox container started");
        Ok(DockerSession::new(docker.clone(), id, relay, sibling))
    }

    /// Creates the run's container shaped by `reach`; its id, and the shape
    /// a spawned sibling copies.
    async fn create_shaped(
        &self,
        docker: &Docker,
        spec: &SandboxSpec,
        reach: shape::Reach<'_>,
        user: String,
    ) -> Result<(String, session::SiblingShape), SandboxError> {
        let name = shape::container_name(&spec.instance_id, &spec.run_id);
        let body = shape::create_body(&self.image, spec, reach, user);
        let id = Self::create(docker, &name, spec, body.clone()).await?;
        Ok((id, session::SiblingShape { name, body }))
    }

    /// A container on an engine elsewhere: nothing of this host bound; the
    /// workspace copied in now and back after every command, the skills
    /// copied in, the API carried over an exec stream.
    async fn start_synced(
        &self,
        docker: &Docker,
        spec: &SandboxSpec,
    ) -> Result<DockerSession, SandboxError> {
        let work = synced::SyncedWork::new(canonical(spec.workspace.host_dir())?, &spec.limits);
        let user = format!("{NOBODY}:{NOBODY}");
        let (id, sibling) = self
            .create_shaped(docker, spec, shape::Reach::Synced, user)
            .await?;
        let ready = async {
            Self::run(docker, &id, &sibling.name).await?;
            work.push(docker, &id).await?;
            for (host, inside) in &spec.ro_binds {
                let rel = Path::new(inside)
                    .strip_prefix(shape::SYNCED_RUN_DIR)
                    .map_err(|_| {
                        SandboxError::Engine(format!(
                            "{inside} is not under {}: a synced sandbox keeps skills there",
                            shape::SYNCED_RUN_DIR
                        ))
                    })?;
                // Owned by root inside: the run's user reads, never writes.
                synced::upload(docker, &id, host, (0, 0), rel, shape::SYNCED_RUN_DIR).await?;
            }
            Ok::<_, SandboxError>(())
        };
        if let Err(e) = ready.await {
            let _ = remove_container(docker, &id).await;
            return Err(e);
        }
        tracing::debug!(container = %id, run = %spec.run_id, "synced sandbox container started");
        let session = DockerSession::new(docker.clone(), id, None, sibling).synced(work);
        match &spec.api {
            Some(api) => session.bridge_api(api.socket()).await,
            None => Ok(session),
        }
    }

    /// Starts a created container; one that cannot start is removed.
    async fn run(docker: &Docker, id: &str, name: &str) -> Result<(), SandboxError> {
        if let Err(e) = docker
            .start_container(id, None::<StartContainerOptions>)
            .await
        {
            // Never leave a created-but-dead container behind.
            let _ = remove_container(docker, id).await;
            return Err(SandboxError::Engine(format!(
                "starting container {name} ({id}): {e}"
            )));
        }
        Ok(())
    }
}

/// Force-removes a container and its anonymous volumes. Returns whether it
/// existed; "no such container" counts as done so `close` stays idempotent,
/// and "removal already in progress" (another remover got there first: a
/// spawned process's handle, dropped as the turn closes its servers) waits
/// until the container is gone, so a closed session has left nothing behind
/// when `close` returns.
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
        }) if message.contains("already in progress") => {
            removal_done(docker, id).await?;
            Ok(true)
        }
        Err(e) => Err(SandboxError::Engine(format!(
            "removing container {id}: {e}"
        ))),
    }
}

/// How long [`remove_container`] waits for another remover to finish.
const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often the engine is asked again while a container's state catches up.
const ENGINE_POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// Asks `settled` every [`ENGINE_POLL`] until it answers true or `budget`
/// has passed; whether it did. The engine reports some changes before its
/// container state shows them (an exec's end before the container's death,
/// a removal another caller started before the container is gone).
async fn settles_within<F, Fut>(
    budget: std::time::Duration,
    mut settled: F,
) -> Result<bool, SandboxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, SandboxError>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        if settled().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(ENGINE_POLL).await;
    }
}

/// Waits until the engine no longer knows container `id`.
async fn removal_done(docker: &Docker, id: &str) -> Result<(), SandboxError> {
    let gone = settles_within(REMOVAL_WAIT, || async {
        match docker.inspect_container(id, None).await {
            Ok(_) => Ok(false),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(true),
            Err(e) => Err(SandboxError::Engine(format!(
                "waiting for container {id} to be removed: {e}"
            ))),
        }
    })
    .await?;
    if gone {
        Ok(())
    } else {
        Err(SandboxError::Engine(format!(
            "container {id} was still being removed after {} s",
            REMOVAL_WAIT.as_secs()
        )))
    }
}

fn canonical(path: &Path) -> Result<PathBuf, SandboxError> {
    std::fs::canonicalize(path).map_err(|source| SandboxError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// What a session with its workspace bound in needs before its container
/// (cold or pooled): the workspace's canonical path, the user that owns
/// it, and a relay of the API socket. The container binds the relay, never
/// the host's own socket: a bind's path shows in the container's mountinfo.
pub(super) async fn bound_parts(
    spec: &SandboxSpec,
) -> Result<(PathBuf, String, Option<SocketRelay>), SandboxError> {
    let workspace = canonical(spec.workspace.host_dir())?;
    if let Some(api) = &spec.api {
        std::fs::metadata(api.socket()).map_err(|source| SandboxError::Io {
            path: api.socket().display().to_string(),
            source,
        })?;
    }
    let user = user::container_user(&workspace).await?;
    let relay = match &spec.api {
        Some(api) => Some(SocketRelay::start(api.socket(), &spec.instance_id)?),
        None => None,
    };
    Ok((workspace, user, relay))
}

#[cfg(test)]
mod tests;
