//! A long-lived process of a run (an extension's `stdio` MCP server) in its
//! own container beside the run's: the run's create body with the process's
//! image and command, attached before it starts so no byte of its output is
//! missed, and removed with its handle or the session's `close`.
//!
//! Why a sibling and not an exec: the agent image holds no language runtime,
//! so a server written in Python needs its own image; a container cannot
//! switch images, but it can share the run's workspace bind, limits, user,
//! environment, labels and its lack of network, which the copied body gives.
//!
//! Must never: start from an image the engine does not already have (no
//! pull: no registry is reachable, and a pulled image would be unreviewed
//! code), mount anything beyond the run's mounts and the request's
//! read-only ones, or leave the container behind once its handle is gone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use bollard::container::LogOutput;
use bollard::models::{HostConfigLogConfig, Mount, MountType};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::remove_container;
use super::session::DockerSession;
use crate::sandbox::{SandboxError, SpawnRequest, SpawnedProcess};

/// Numbers the spawned containers of one process, so names never collide
/// when one run starts several servers.
static NEXT: AtomicU32 = AtomicU32::new(1);

/// Label telling a spawned process's container from its run's own (the
/// orphan sweep treats both alike: same instance, same run).
pub(super) const LABEL_SPAWNED: &str = "mercury.spawned";

impl DockerSession {
    pub(super) fn spawned_ids(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        // A poisoned list is still the right list of containers to remove.
        self.spawned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) async fn spawn_sibling(
        &self,
        req: SpawnRequest,
    ) -> Result<SpawnedProcess, SandboxError> {
        if req.argv.is_empty() {
            return Err(SandboxError::Engine("empty command to spawn".into()));
        }
        let image = match &req.image {
            Some(image) => image.clone(),
            None => self.sibling.body.image.clone().unwrap_or_default(),
        };
        let name = format!(
            "{}-p{}",
            self.sibling.name,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let body = sibling_body(&self.sibling.body, &image, &req)?;
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        // The engine API's create never pulls: an absent image is its 404.
        let id = match self.docker.create_container(Some(options), body).await {
            Ok(created) => created.id,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                return Err(SandboxError::Image(format!(
                    "the image {image} is not on this engine; build it first (`mercury ext image {image} --path …`, docs/extensions.md): nothing is pulled"
                )))
            }
            Err(e) => {
                return Err(SandboxError::Engine(format!(
                    "creating container {name}: {e}"
                )))
            }
        };
        // Recorded before anything else can fail, so `close` removes it.
        self.spawned_ids().push(id.clone());
        let guard = SpawnedContainer {
            docker: self.docker.clone(),
            id: id.clone(),
        };
        let attach = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stdout(true)
            .stderr(false)
            .stream(true)
            .logs(false)
            .build();
        let attached = self
            .docker
            .attach_container(&id, Some(attach))
            .await
            .map_err(|e| SandboxError::Engine(format!("attaching to container {name}: {e}")))?;
        self.docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| SandboxError::Engine(format!("starting container {name}: {e}")))?;
        tracing::debug!(container = %id, argv = ?req.argv, %image, "spawned process container started");
        let stdout = attached.output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(Ok(message))
                }
                Ok(_) => None,
                Err(e) => Some(Err(std::io::Error::other(e))),
            }
        });
        Ok(SpawnedProcess {
            stdin: Box::new(attached.input),
            stdout: Box::new(tokio_util::io::StreamReader::new(Box::pin(stdout))),
            handle: Box::new(guard),
        })
    }
}

/// The run's body with `image` and the request's command: interactive stdin,
/// no log kept by the engine (the stream is the protocol, already capped by
/// the caller), the request's directories bound read-only at their own path.
fn sibling_body(
    run: &bollard::models::ContainerCreateBody,
    image: &str,
    req: &SpawnRequest,
) -> Result<bollard::models::ContainerCreateBody, SandboxError> {
    let mut body = run.clone();
    body.image = Some(image.to_owned());
    body.cmd = Some(req.argv.clone());
    body.entrypoint = Some(Vec::new());
    body.open_stdin = Some(true);
    body.stdin_once = Some(true);
    body.attach_stdin = Some(true);
    body.attach_stdout = Some(true);
    body.attach_stderr = Some(false);
    let mut labels = body.labels.take().unwrap_or_default();
    labels.insert(LABEL_SPAWNED.to_owned(), "1".to_owned());
    body.labels = Some(labels);
    let mut host = body.host_config.take().unwrap_or_default();
    let mut mounts = host.mounts.take().unwrap_or_default();
    for dir in &req.ro_mounts {
        mounts.push(read_only_bind(dir)?);
    }
    host.mounts = Some(mounts);
    host.log_config = Some(HostConfigLogConfig {
        typ: Some("none".into()),
        config: Some(HashMap::new()),
    });
    body.host_config = Some(host);
    Ok(body)
}

fn read_only_bind(dir: &Path) -> Result<Mount, SandboxError> {
    let real = std::fs::canonicalize(dir).map_err(|source| SandboxError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(Mount {
        target: Some(dir.display().to_string()),
        source: Some(real.display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    })
}

/// Removes its container when dropped (the process dies with it).
struct SpawnedContainer {
    docker: Docker,
    id: String,
}

impl Drop for SpawnedContainer {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let docker = self.docker.clone();
            let id = std::mem::take(&mut self.id);
            runtime.spawn(async move {
                if let Err(e) = remove_container(&docker, &id).await {
                    tracing::warn!(container = %id, error = %e, "removing a spawned process's container failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_body() -> bollard::models::ContainerCreateBody {
        bollard::models::ContainerCreateBody {
            image: Some("mercury-agent:t".into()),
            cmd: Some(vec!["/bin/sleep".into(), "infinity".into()]),
            labels: Some(HashMap::from([("mercury.run".into(), "r1".into())])),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some("none".into()),
                mounts: Some(vec![Mount {
                    target: Some("/work".into()),
                    source: Some("/ws".into()),
                    typ: Some(MountType::BIND),
                    read_only: Some(false),
                    ..Default::default()
                }]),
                memory: Some(1 << 27),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_sibling_keeps_the_runs_shape_and_changes_only_image_command_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let req = SpawnRequest {
            argv: vec!["/opt/v/bin/python".into(), "-m".into(), "server".into()],
            ro_mounts: vec![dir.path().to_owned()],
            image: Some("mercury-ext-x:1".into()),
        };
        let body = sibling_body(&run_body(), "mercury-ext-x:1", &req).unwrap();
        assert_eq!(body.image.as_deref(), Some("mercury-ext-x:1"));
        assert_eq!(body.cmd, Some(req.argv.clone()));
        assert_eq!(body.open_stdin, Some(true));
        assert_eq!(body.stdin_once, Some(true));
        let labels = body.labels.unwrap();
        assert_eq!(labels["mercury.run"], "r1");
        assert_eq!(labels[LABEL_SPAWNED], "1");
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.memory, Some(1 << 27));
        let mounts = host.mounts.unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].target.as_deref(), Some("/work"));
        assert_eq!(mounts[1].read_only, Some(true));
        assert_eq!(
            mounts[1].target.as_deref(),
            Some(dir.path().to_str().unwrap())
        );
        assert_eq!(host.log_config.and_then(|l| l.typ).as_deref(), Some("none"));
    }

    #[test]
    fn a_missing_read_only_directory_is_an_error_not_an_empty_mount() {
        let req = SpawnRequest {
            argv: vec!["/x".into()],
            ro_mounts: vec!["/no/such/dir/here".into()],
            image: None,
        };
        let err = sibling_body(&run_body(), "i:1", &req).unwrap_err();
        assert!(err.to_string().contains("/no/such/dir/here"), "{err}");
    }
}
