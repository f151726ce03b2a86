//! The docker backend's side of [`SandboxLifecycle`]: the agent and runtime
//! images on each engine, and an instance's running containers.
//!
//! Must never: pull an image, build one when told to refuse, or count a
//! container that does not carry the instance's `mercury.instance` label.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bollard::query_parameters::ListContainersOptionsBuilder;

use super::DockerBackend;
use crate::sandbox::image::{build_agent_image, ensure_agent_image, image_exists};
use crate::sandbox::lifecycle::{LifecycleError, SandboxLifecycle, WhenAbsent};
use crate::sandbox::runtime_image::build_runtime_image;
use crate::sandbox::{SandboxBackend, SandboxError, WarmSpec, LABEL_INSTANCE};

#[async_trait]
impl SandboxLifecycle for DockerBackend {
    fn endpoints(&self) -> Vec<String> {
        self.clients().map(|(e, _)| e.to_owned()).collect()
    }

    async fn ensure_agent_image(
        &self,
        tag: &str,
        mrctl: &Path,
        when_absent: WhenAbsent,
    ) -> Result<(), LifecycleError> {
        // Every engine gets the same content-addressed image, built from
        // this host's files (no registry is assumed reachable); one that
        // joins later gets it the same way.
        self.remember_image(tag, (when_absent == WhenAbsent::Build).then_some(mrctl));
        for (endpoint, docker) in self.clients() {
            match when_absent {
                WhenAbsent::Refuse => {
                    if !image_exists(&docker, tag).await? {
                        return Err(LifecycleError::ShadowNeverBuilds {
                            tag: tag.to_owned(),
                            endpoint: endpoint.to_owned(),
                        });
                    }
                }
                WhenAbsent::Build => {
                    ensure_agent_image(&docker, tag, mrctl)
                        .await
                        .map_err(|source| LifecycleError::AgentImage {
                            endpoint: endpoint.to_owned(),
                            source,
                        })?;
                }
            }
        }
        Ok(())
    }

    async fn build_agent_image(&self, tag: &str, mrctl: &Path) -> Result<(), SandboxError> {
        for (_, docker) in self.clients() {
            build_agent_image(&docker, tag, mrctl).await?;
        }
        Ok(())
    }

    async fn build_runtime_image(
        &self,
        tag: &str,
        paths: &[PathBuf],
    ) -> Result<usize, SandboxError> {
        let mut entries = 0;
        for (_, docker) in self.clients() {
            entries = build_runtime_image(&docker, tag, paths).await?;
        }
        Ok(entries)
    }

    async fn image_present(&self, image: &str) -> Result<bool, SandboxError> {
        for (_, docker) in self.clients() {
            if !image_exists(&docker, image).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn running_sandboxes(&self, instance_id: &str) -> Result<Vec<String>, SandboxError> {
        if instance_id.trim().is_empty() {
            // An empty label filter would match every container.
            return Err(SandboxError::Engine(
                "refusing to list containers without an instance id".into(),
            ));
        }
        let filter = format!("{LABEL_INSTANCE}={instance_id}");
        let filters = HashMap::from([
            ("label", vec![filter.as_str()]),
            ("status", vec!["running", "created", "restarting"]),
        ]);
        let mut ids = Vec::new();
        for (endpoint, docker) in self.clients() {
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let listed = docker.list_containers(Some(options)).await.map_err(|e| {
                SandboxError::Engine(format!(
                    "listing running containers of instance {instance_id} on {endpoint}: {e}"
                ))
            })?;
            ids.extend(listed.into_iter().filter_map(|c| {
                let ours = c
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_INSTANCE))
                    .is_some_and(|v| v == instance_id);
                ours.then_some(c.id).flatten()
            }));
        }
        Ok(ids)
    }

    fn serving(&self, image: String) -> Arc<dyn SandboxBackend> {
        Arc::new(self.clone().with_image(image))
    }

    fn serving_warm(
        &self,
        image: String,
        warm: WarmSpec,
    ) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
        Ok(Arc::new(self.clone().with_image(image).warm(warm)?))
    }
}
