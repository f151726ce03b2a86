//! Connecting to the engine: the local default or an explicit socket, the
//! API version negotiation and the liveness ping.
//!
//! Must never: hand out a client that has not negotiated its API version
//! (bollard speaks a newer API than many engines accept).

use std::path::Path;

use bollard::Docker;

use super::engines::{client_for, Engine, EngineTls};
use super::DockerBackend;
use crate::sandbox::SandboxError;

/// The client once it has agreed an API version with its engine.
async fn negotiated(docker: Docker, where_: &str) -> Result<Docker, SandboxError> {
    docker.negotiate_version().await.map_err(|e| {
        SandboxError::NoEngine(format!(
            "{where_} does not answer (is the daemon running, and may this user use its socket?): {e}"
        ))
    })
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

    async fn negotiate(docker: Docker, image: String, where_: &str) -> Result<Self, SandboxError> {
        Ok(Self::with_client(negotiated(docker, where_).await?, image))
    }

    /// The engines of `sandbox.docker.hosts`. One that does not answer now
    /// is kept unjoined (said in the log) as long as one answers: a host
    /// serves on the engines it has, and the health check joins the others
    /// when they answer; all down is an error.
    pub async fn connect_hosts(
        hosts: &[String],
        tls: Option<&EngineTls>,
        image: String,
    ) -> Result<Self, SandboxError> {
        let mut engines = Vec::new();
        let mut down = Vec::new();
        for endpoint in hosts {
            let (client, remote) = client_for(endpoint, tls)?;
            match negotiated(client.clone(), endpoint).await {
                Ok(docker) => engines.push(Engine::new(docker, endpoint.clone(), remote)),
                Err(e) => {
                    tracing::error!(engine = %endpoint, error = %e, "a sandbox engine does not answer; it joins when it does (sandbox.sweep_interval_secs)");
                    engines.push(Engine::unjoined(
                        client,
                        endpoint.clone(),
                        remote,
                        e.to_string(),
                    ));
                    down.push(e.to_string());
                }
            }
        }
        if engines.iter().all(|e| !e.joined()) {
            return Err(SandboxError::NoEngine(if down.is_empty() {
                "sandbox.docker.hosts is empty".into()
            } else {
                down.join("; ")
            }));
        }
        Ok(Self::with_engines(engines, image))
    }

    /// Checks the first engine still answers.
    pub async fn ping(&self) -> Result<(), SandboxError> {
        self.docker().ping().await.map(|_| ()).map_err(|e| {
            SandboxError::NoEngine(format!("the Docker engine stopped answering: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
