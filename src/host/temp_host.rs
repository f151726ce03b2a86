//! `TempHost`: a real host on a throwaway data dir and a loopback listener
//! it binds itself (port 0), with a scripted model, for `mercury demo`,
//! `mercury bench` and the tests; built with [`TempHost::builder`].
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

/// How to build a [`TempHost`]: the scripted model's rules, the sandbox
/// backend and any other config keys, written through [`crate::config::set_keys`].
#[derive(Debug, Clone)]
pub struct TempHostBuilder {
    rules: String,
    keys: Vec<(String, serde_yaml_ng::Value)>,
    /// Secrets for the adapters (`MERCURY_TELEGRAM_BOT_TOKEN`), instead of this process's environment.
    env: Option<std::collections::BTreeMap<String, String>>,
    /// The rows on this PostgreSQL database instead of the data dir's file.
    postgres: Option<crate::host::InitPostgres>,
}

impl Default for TempHostBuilder {
    fn default() -> Self {
        Self {
            rules: r#"{"rules": [{"reply": "ok"}]}"#.to_owned(),
            keys: Vec::new(),
            env: None,
            postgres: None,
        }
    }
}

impl TempHostBuilder {
    /// The scripted model's rules file (a JSON text).
    pub fn model(mut self, rules: &str) -> Self {
        self.rules = rules.to_owned();
        self
    }

    /// `sandbox.backend`: `process`, `docker` or `auto`.
    pub fn sandbox(self, backend: &str) -> Self {
        self.set("sandbox.backend", serde_yaml_ng::Value::from(backend))
    }

    /// Any config key, as a dotted path (`sandbox.workspace_mb`).
    pub fn set(mut self, key: &str, value: serde_yaml_ng::Value) -> Self {
        self.keys.push((key.to_owned(), value));
        self
    }

    /// Keeps the rows in the empty PostgreSQL database at `url`.
    pub fn postgres(mut self, url: &str) -> Self {
        self.postgres = Some(crate::host::InitPostgres {
            url: url.to_owned(),
            password_file: None,
        });
        self
    }

    /// A `MERCURY_*` variable the host reads instead of this process's
    /// environment (which it then does not read at all).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Makes the data dir and the config; returns where they are, without
    /// starting a host (the child-process hosts of the crash tests start
    /// `mercury serve` on it themselves).
    pub async fn prepare(&self) -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
        let dir = tempfile::Builder::new().prefix("mercury-temp-").tempdir()?;
        let data = dir.path().join("data");
        crate::host::init_with(&data, "owner", self.postgres.as_ref()).await?;
        let model = dir.path().join("model.json");
        std::fs::write(&model, &self.rules)?;
        let mut keys: Vec<(&str, serde_yaml_ng::Value)> = vec![(
            "model",
            serde_yaml_ng::Value::from(format!("scripted:{}", model.display())),
        )];
        keys.extend(self.keys.iter().map(|(k, v)| (k.as_str(), v.clone())));
        crate::config::set_keys(&data.join("mercury.yaml"), &keys)
            .context("writing the temporary host's config")?;
        Ok((dir, data))
    }

    /// Starts the host in this process on a listener it binds itself
    /// (127.0.0.1, port 0), and waits until it answers.
    pub async fn start(self) -> anyhow::Result<TempHost> {
        let (dir, data) = self.prepare().await?;
        TempHost::serve_with_env(dir, data, self.env).await
    }
}

impl TempHost {
    pub fn builder() -> TempHostBuilder {
        TempHostBuilder::default()
    }

    /// Starts a host whose model is the scripted `rules` (a JSON text) and
    /// whose sandbox backend is `sandbox` (`process`, `docker` or `auto`).
    pub async fn start(rules: &str, sandbox: &str) -> anyhow::Result<TempHost> {
        Self::builder().model(rules).sandbox(sandbox).start().await
    }

    /// Serves the prepared data dir `data` (inside `dir`) in this process.
    pub async fn serve_in(dir: tempfile::TempDir, data: PathBuf) -> anyhow::Result<TempHost> {
        Self::serve_with_env(dir, data, None).await
    }

    async fn serve_with_env(
        dir: tempfile::TempDir,
        data: PathBuf,
        env: Option<std::collections::BTreeMap<String, String>>,
    ) -> anyhow::Result<TempHost> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (data, shutdown) = (data.clone(), shutdown.clone());
            let options = crate::host::ServeOptions {
                env,
                ..crate::host::ServeOptions::on(crate::host::settings_of(&data)?, listener)
            };
            async move { crate::host::serve_with(&data, options, shutdown).await }
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
            if host
                .task
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the temporary host did not start listening on {}", host.url)
    }

    /// The temporary directory holding the data dir (and the model file).
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
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
