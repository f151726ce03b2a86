//! The sandbox lifecycle: what happens to the engines around the sessions
//! rather than inside one. Owns the [`SandboxLifecycle`] trait (the images a
//! session starts from, an instance's running sandboxes, the serving
//! backend made of the connected engines), the one constructor
//! ([`connect`]) that reaches the engines `sandbox.docker` names, and the
//! instance id that ties sandboxes to one data dir.
//!
//! Why a seam beside [`SandboxBackend`]: start-up, `mercury image build`,
//! `shadow up` and `doctor` ask these questions of whichever engine the host
//! uses, so they talk to this trait and only `crate::sandbox` knows the
//! engine is Docker (the one with a Kubernetes backend, docs/scale-out.md,
//! implements it too).
//!
//! Must never: pull an image (no registry is assumed reachable; images are
//! built from this host's files), build an image when asked to refuse
//! instead (a shadow never loads the live box with a build), or list a
//! sandbox that does not carry the given instance's label.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::config::DockerEnginesConfig;
use crate::sandbox::docker::{DockerBackend, EngineTls};
use crate::sandbox::{SandboxBackend, SandboxError, WarmSpec};

/// What [`SandboxLifecycle::ensure_agent_image`] does with an engine that
/// lacks the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenAbsent {
    /// Build it from this host's files.
    Build,
    /// Refuse with a sentence naming `mercury image build` (shadow mode:
    /// a build would load the live box while it serves).
    Refuse,
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("the agent image on engine {endpoint}")]
    AgentImage {
        endpoint: String,
        #[source]
        source: SandboxError,
    },
    #[error("shadow mode never builds the agent image {tag} (engine {endpoint}); build it with `mercury image build`")]
    ShadowNeverBuilds { tag: String, endpoint: String },
}

/// The engines a host's sandboxes run on, as a whole: what exists on them
/// and what runs there, beside the sessions [`SandboxBackend`] starts.
#[async_trait]
pub trait SandboxLifecycle: Send + Sync {
    /// Makes sure the agent image `tag` is on every engine, each checked in
    /// the configured order; an absent one is built from `mrctl` and this
    /// host's tools, or refused, as `when_absent` says.
    async fn ensure_agent_image(
        &self,
        tag: &str,
        mrctl: &Path,
        when_absent: WhenAbsent,
    ) -> Result<(), LifecycleError>;
    /// Builds (or rebuilds) the agent image `tag` on every engine
    /// (`mercury image build`).
    async fn build_agent_image(&self, tag: &str, mrctl: &Path) -> Result<(), SandboxError>;
    /// Builds an extension's runtime image `tag` from host `paths` on every
    /// engine (`mercury ext image`); the number of entries it holds.
    async fn build_runtime_image(
        &self,
        tag: &str,
        paths: &[PathBuf],
    ) -> Result<usize, SandboxError>;
    /// Whether `image` is on every engine (doctor, `shadow up`).
    async fn image_present(&self, image: &str) -> Result<bool, SandboxError>;
    /// The ids of `instance_id`'s sandboxes running or being started now
    /// (a turn in progress), on every engine.
    async fn running_sandboxes(&self, instance_id: &str) -> Result<Vec<String>, SandboxError>;
    /// The backend that starts sessions from `image` on these engines.
    fn serving(&self, image: String) -> Arc<dyn SandboxBackend>;
    /// The engines that have joined (answered and negotiated), as
    /// configured (`unix:///…`, `tcp://…`; `local` for the local engine by
    /// default).
    fn endpoints(&self) -> Vec<String>;
    /// [`SandboxLifecycle::serving`] with a pool of sandboxes started ahead
    /// (`sandbox.warm`). An engine kind without a pool serves cold.
    fn serving_warm(
        &self,
        image: String,
        warm: WarmSpec,
    ) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
        let _ = warm;
        Ok(self.serving(image))
    }
}

/// Connects the engines of `engines` (`sandbox.docker.hosts`, with the TLS
/// client certificates of its `tcp://` ones), or the local engine when the
/// list is empty; every engine has negotiated its API version.
pub async fn connect(
    engines: &DockerEnginesConfig,
) -> Result<Arc<dyn SandboxLifecycle>, SandboxError> {
    if engines.hosts.is_empty() {
        return Ok(Arc::new(DockerBackend::connect(String::new()).await?));
    }
    Ok(Arc::new(
        DockerBackend::connect_hosts(&engines.hosts, tls_of(engines).as_ref(), String::new())
            .await?,
    ))
}

/// Like [`connect`], but every engine of the list must answer now: what
/// `mercury image build` and `mercury ext image` do to each engine would
/// otherwise silently skip one.
pub async fn connect_every(
    engines: &DockerEnginesConfig,
) -> Result<Arc<dyn SandboxLifecycle>, SandboxError> {
    if engines.hosts.is_empty() {
        return connect(engines).await;
    }
    let backend =
        DockerBackend::connect_hosts(&engines.hosts, tls_of(engines).as_ref(), String::new())
            .await?;
    let down: Vec<String> = backend
        .engines()
        .into_iter()
        .filter(|e| !e.healthy)
        .map(|e| {
            e.last_error
                .unwrap_or_else(|| format!("{} does not answer", e.endpoint))
        })
        .collect();
    if !down.is_empty() {
        return Err(SandboxError::NoEngine(format!(
            "every engine of sandbox.docker.hosts must answer: {}",
            down.join("; ")
        )));
    }
    Ok(Arc::new(backend))
}

fn tls_of(engines: &DockerEnginesConfig) -> Option<EngineTls> {
    (!engines.tls.ca.trim().is_empty()).then(|| EngineTls {
        ca: engines.tls.ca.clone().into(),
        cert: engines.tls.cert.clone().into(),
        key: engines.tls.key.clone().into(),
    })
}

/// The local engine alone (`DOCKER_HOST` or the default socket), whatever
/// `sandbox.docker.hosts` says: the checks a command makes on this machine.
pub async fn connect_local() -> Result<Arc<dyn SandboxLifecycle>, SandboxError> {
    connect(&DockerEnginesConfig::default()).await
}

/// The instance id for a data dir: the first 16 hex of sha256 of its
/// canonical path. Two hosts on one engine with different data dirs never
/// sweep each other's sandboxes; one data dir keeps its id across restarts.
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

/// The instance id of one host of several (`cluster.enabled`): the data
/// dir's path and the machine's name (`cluster.host_name`), since two
/// machines of a deployment may well use the same data dir path and share
/// an engine, and each must sweep only its own sandboxes. Stable across the
/// host's restarts, like [`instance_id_for`].
pub fn instance_id_for_host(data_dir: &Path, host_name: &str) -> io::Result<String> {
    let path = instance_id_for(data_dir)?;
    let digest = Sha256::digest(format!("{path}\0{host_name}").as_bytes());
    let hex = base16ct::lower::encode_string(&digest);
    Ok(hex.get(..16).unwrap_or(&hex).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_machines_with_one_data_dir_path_have_two_instance_ids() {
        let dir = tempfile::tempdir().unwrap();
        let a = instance_id_for_host(dir.path(), "mercury-a").unwrap();
        let b = instance_id_for_host(dir.path(), "mercury-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, instance_id_for_host(dir.path(), "mercury-a").unwrap());
        assert_ne!(a, instance_id_for(dir.path()).unwrap());
        assert!(a.len() == 16 && a.bytes().all(|c| c.is_ascii_hexdigit()));
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
    fn a_refused_build_says_how_to_build_and_a_failed_one_names_its_engine() {
        let refused = LifecycleError::ShadowNeverBuilds {
            tag: "mercury-agent:1-abc".into(),
            endpoint: "local".into(),
        };
        assert_eq!(
            refused.to_string(),
            "shadow mode never builds the agent image mercury-agent:1-abc (engine local); \
             build it with `mercury image build`"
        );
        let failed = anyhow::Error::from(LifecycleError::AgentImage {
            endpoint: "tcp://10.0.0.7:2376".into(),
            source: SandboxError::Image("building x failed".into()),
        });
        assert_eq!(
            format!("{failed:#}"),
            "the agent image on engine tcp://10.0.0.7:2376: agent image: building x failed"
        );
    }
}
