//! `TempHost`: a real host on a throwaway data dir and a free loopback port,
//! with a scripted model, for `mercury demo` and `mercury bench`.
//!
//! Must never: touch a real data dir, or outlive its value (dropping it stops
//! the host; `stop` waits for it).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use hyper::Method;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::client::{request, Connection, Endpoint};

pub struct TempHost {
    /// `None` once `stop_and_keep` handed the directory over.
    dir: Option<tempfile::TempDir>,
    pub data: PathBuf,
    pub url: String,
    pub owner_token: String,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TempHost {
    /// Starts a host whose model is the scripted `rules` (a JSON text) and
    /// whose sandbox backend is `sandbox` (`process`, `docker` or `auto`).
    pub async fn start(rules: &str, sandbox: &str) -> anyhow::Result<TempHost> {
        let dir = tempfile::Builder::new().prefix("mercury-temp-").tempdir()?;
        let data = dir.path().join("data");
        crate::host::init(&data, "owner").await?;
        let model = dir.path().join("model.json");
        std::fs::write(&model, rules)?;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let config = std::fs::read_to_string(data.join("mercury.yaml"))?
            .replace(
                "model: \"openai:gpt-4o-mini\"",
                &format!("model: \"scripted:{}\"", model.display()),
            )
            .replace(
                "bind: \"127.0.0.1:8787\"",
                &format!("bind: \"127.0.0.1:{port}\""),
            )
            .replace("  backend: auto ", &format!("  backend: {sandbox} "));
        std::fs::write(data.join("mercury.yaml"), config)?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (data, shutdown) = (data.clone(), shutdown.clone());
            async move { crate::host::serve(&data, None, shutdown).await }
        });
        let owner_token = std::fs::read_to_string(data.join("global/owner.token"))?
            .trim()
            .to_owned();
        let host = TempHost {
            dir: Some(dir),
            data,
            url: format!("http://127.0.0.1:{port}"),
            owner_token,
            shutdown,
            task: Some(task),
        };
        let probe = host.connection(None);
        for _ in 0..200 {
            if request(&probe, Method::GET, "/healthz", None).await.is_ok() {
                return Ok(host);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the temporary host did not start listening on {}", host.url)
    }

    /// An API connection with the owner's token and an optional space.
    pub fn connection(&self, space: Option<&str>) -> Connection {
        Connection {
            // The URL is ours and well formed; parse_url cannot fail on it.
            endpoint: Endpoint::parse_url(&self.url).unwrap_or(Endpoint::Http {
                host: "127.0.0.1".into(),
                port: 0,
                base_path: String::new(),
            }),
            token: Some(self.owner_token.clone()),
            space: space.map(str::to_owned),
            act_as: None,
            timeout: Duration::from_secs(600),
        }
    }

    /// Sends a request and insists on a 2xx answer.
    pub async fn ok(
        &self,
        conn: &Connection,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let (st, v) = request(conn, method.clone(), path, body)
            .await
            .with_context(|| format!("{method} {path}"))?;
        if !(200..300).contains(&st) {
            bail!("{method} {path} answered {st}: {v}");
        }
        Ok(v)
    }

    /// Stops the host and keeps its directory; returns the data dir.
    pub async fn stop_and_keep(mut self) -> anyhow::Result<PathBuf> {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            t.await.context("host task")??;
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        Ok(self.data.clone())
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            t.await.context("host task")??;
        }
        Ok(())
    }
}

impl Drop for TempHost {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
