//! Docker backend: one labelled, locked-down container per run; every tool
//! call is a `docker exec` in it.
//!
//! Owns: the container's shape (labels, name, mounts, limits, user, env), the
//! exec protocol (stdin, capped demultiplexed output, timeout, exit code), the
//! removal of a run's container, the orphan sweep, and the instance id that
//! ties containers to one data dir.
//!
//! Must never: mount anything but the workspace (and the API socket when
//! given, and the read-only directories the spec or a spawn request names),
//! give the container a network, add a host environment variable to
//! the container, touch a container without this instance's
//! `mercury.instance` label, or sweep when the instance id is empty.
//!
//! Layout: this file holds [`DockerBackend`] (start: validate the spec,
//! create, start) and the removal of a container; `connect` reaches and
//! negotiates the engine and derives the instance id; `shape` builds the
//! create body (pure); `user` picks the container user and hands a root
//! host's workspace to `nobody`; `session` is the exec session; `sweep` the
//! orphan sweep; `spawn` a long-lived process's own container beside the
//! run's (an extension's stdio server); `tests` the tests against a real
//! engine.

mod connect;
mod session;
mod shape;
mod spawn;
mod sweep;
mod user;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;

pub use connect::instance_id_for;
pub use session::DockerSession;
pub use sweep::sweep_orphans;
pub use user::NOBODY;

use crate::sandbox::relay::SocketRelay;
use crate::sandbox::{
    Isolation, SandboxBackend, SandboxError, SandboxSession, SandboxSpec, LABEL_INSTANCE, LABEL_RUN,
};

/// Starts one container per run from the agent image.
#[derive(Clone, Debug)]
pub struct DockerBackend {
    docker: Docker,
    image: String,
}

impl DockerBackend {
    /// Wraps an already connected client (shared with the sweep, or tests).
    pub fn with_client(docker: Docker, image: String) -> Self {
        Self { docker, image }
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn image(&self) -> &str {
        &self.image
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

    fn isolation(&self) -> Isolation {
        Isolation::Container
    }

    async fn prepare_workspace(&self, live: &Path) -> Result<(), SandboxError> {
        user::container_user(live).await.map(|_| ())
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
        let user = user::container_user(&workspace).await?;
        let name = shape::container_name(&spec.instance_id, &spec.run_id);
        // The container binds a relay of the socket, never the host's own:
        // a bind's path shows in the container's mountinfo.
        let relay = match &spec.api_socket {
            Some(socket) => Some(SocketRelay::start(socket, &spec.instance_id)?),
            None => None,
        };
        let mut shaped = spec.clone();
        shaped.api_socket = relay.as_ref().map(|r| r.path().to_owned());
        let body = shape::create_body(&self.image, &shaped, &workspace, user);
        let id = self.create(&name, &spec, body.clone()).await?;

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
        Ok(Box::new(DockerSession::new(
            self.docker.clone(),
            id,
            relay,
            session::SiblingShape { name, body },
        )))
    }
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

fn canonical(path: &Path) -> Result<PathBuf, SandboxError> {
    std::fs::canonicalize(path).map_err(|source| SandboxError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests;
