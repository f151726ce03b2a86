//! The shared fixture: a real host on a temp data dir and a loopback port,
//! with a scripted model, plus small HTTP and database helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mercury::storage::{conversations, inspect, Conn, Store, StoreResult, Tx};
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tempfile::TempDir;

use crate::pg::PgDatabase;
use tokio_util::sync::CancellationToken;

pub(crate) struct HostOptions {
    /// The scripted model's rules (`{"rules": [...]}`).
    pub model: Value,
    /// `process` or `docker`.
    pub sandbox: &'static str,
    /// Extra config keys as dotted paths, e.g. ("ingress.auto_space", false).
    pub config: Vec<(&'static str, Yaml)>,
    /// Extra environment of a child-process host (`start_process` only: an
    /// in-process host shares the test's environment).
    pub env: Vec<(&'static str, String)>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            model: json!({"rules": [{"reply": "ok"}]}),
            sandbox: "process",
            config: Vec::new(),
            env: Vec::new(),
        }
    }
}

pub(crate) struct TestHost {
    pub dir: TestDir,
    pub data: PathBuf,
    pub url: String,
    pub owner_token: String,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    child: Option<Child>,
    /// The child-process host's extra environment, kept for restarts.
    env: Vec<(&'static str, String)>,
    /// Where a captured child-process host's stderr goes.
    stderr_file: Option<PathBuf>,
    /// The test's own store on the host's database, opened on first use.
    store: std::sync::OnceLock<Store>,
    /// A cluster's shared directory (`storage.shared_dir`, kept by its first host).
    shared: Option<TempDir>,
}

/// Runs `f` in a write of `store` and waits for its commit, from any
/// context (a test's async body or a plain helper): the write is awaited on
/// a thread of its own.
pub(crate) fn write_to<T: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&Tx<'_>) -> StoreResult<T> + Send + 'static,
) -> T {
    let store = store.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime for the write")
            .block_on(store.write(f))
    })
    .join()
    .expect("the write's thread")
    .expect("a write of the database")
}

pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Creates a data dir and its config through the temp host's builder (the
/// one config writer, `mercury::config::set_keys`). `bind` is set to a free
/// port for hosts run as a child process, which cannot be handed a listener;
/// an in-process host ignores it and serves a listener bound to port 0.
/// `mercury serve` on a prepared data dir without the environment variable
/// `var`, which must refuse to start: its stderr.
pub(crate) async fn serve_refused_without(opts: &HostOptions, var: &str) -> String {
    let (_dir, data, _) = prepare(opts).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mercury"))
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .env_remove(var)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "started without {var}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `mercury status --data-dir <host's>`: its stdout.
pub(crate) async fn mercury_status(host: &TestHost) -> String {
    mercury_status_exit(host).await.0
}

/// `mercury status --data-dir <host's>`: its stdout and exit code.
pub(crate) async fn mercury_status_exit(host: &TestHost) -> (String, Option<i32>) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["status", "--data-dir"])
        .arg(&host.data)
        .output()
        .await
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// A test host's directory (the data dir is inside it), and its
/// PostgreSQL database when this run keeps the rows there
/// (`MERCURY_TEST_STORAGE=postgres`, the nextest profile `postgres`).
pub(crate) struct TestDir {
    tmp: TempDir,
    // Dropped after the temp dir: the host has stopped by then.
    pg: Option<PgDatabase>,
}

impl TestDir {
    pub(crate) fn path(&self) -> &Path {
        self.tmp.path()
    }
}

/// Whether this run's hosts keep their rows on PostgreSQL.
pub(crate) fn on_postgres() -> bool {
    std::env::var("MERCURY_TEST_STORAGE").as_deref() == Ok("postgres")
}

pub(crate) async fn prepare(opts: &HostOptions) -> (TestDir, PathBuf, u16) {
    let port = free_port();
    let mut builder = mercury::host::temp_host::TempHost::builder()
        .model(&opts.model.to_string())
        .sandbox(opts.sandbox)
        .set("bind", Yaml::String(format!("127.0.0.1:{port}")));
    for (k, v) in &opts.config {
        builder = builder.set(k, v.clone());
    }
    let pg = on_postgres().then(PgDatabase::create);
    if let Some(db) = &pg {
        builder = builder.postgres(&db.url());
    }
    let (tmp, data) = builder.prepare().await.expect("prepare the data dir");
    (TestDir { tmp, pg }, data, port)
}

impl TestHost {
    /// A host running inside this test process.
    pub(crate) async fn start(opts: HostOptions) -> TestHost {
        assert!(
            opts.env.is_empty(),
            "HostOptions::env applies to start_process only"
        );
        let (dir, data, _) = prepare(&opts).await;
        // The caller binds: no port is guessed for an in-process host.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (data, shutdown) = (data.clone(), shutdown.clone());
            let settings = mercury::host::settings_of(&data).expect("settings");
            let options = mercury::host::ServeOptions::on(settings, listener);
            async move { mercury::host::serve_with(&data, options, shutdown).await }
        });
        let host = Self::finish(dir, data, port, shutdown, Some(task), None);
        host.wait_ready().await;
        host
    }

    /// A host running inside this test process on a data dir prepared
    /// (and maybe rewritten) by the caller: the upgrade tests.
    pub(crate) async fn start_on(dir: TestDir, data: PathBuf) -> TestHost {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (data, shutdown) = (data.clone(), shutdown.clone());
            let settings = mercury::host::settings_of(&data).expect("settings");
            let options = mercury::host::ServeOptions::on(settings, listener);
            async move { mercury::host::serve_with(&data, options, shutdown).await }
        });
        let host = Self::finish(dir, data, port, shutdown, Some(task), None);
        host.wait_ready().await;
        host
    }

    /// A host running as a child process (`mercury serve`), for crash tests.
    pub(crate) async fn start_process(opts: HostOptions) -> TestHost {
        let (dir, data, port) = prepare(&opts).await;
        let child = spawn_serve(&data, &opts.env, None);
        let mut host = Self::finish(dir, data, port, CancellationToken::new(), None, Some(child));
        host.env = opts.env;
        host.wait_ready().await;
        host
    }

    /// [`Self::start_process`] under `ulimit -n nofile` (systemd's default
    /// is 1024), its stderr captured like [`Self::start_process_captured`].
    pub(crate) async fn start_process_with_nofile(opts: HostOptions, nofile: u64) -> TestHost {
        let (dir, data, port) = prepare(&opts).await;
        let file = dir.path().join("host.stderr");
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "ulimit -n {nofile} && exec \"$0\" serve --data-dir \"$1\""
            ))
            .arg(env!("CARGO_BIN_EXE_mercury"))
            .arg(&data)
            .env("MERCURY_LOG", "warn")
            .envs(opts.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&file).expect("the stderr file"));
        let child = c.spawn().expect("spawn mercury serve under ulimit");
        let mut host = Self::finish(dir, data, port, CancellationToken::new(), None, Some(child));
        host.env = opts.env;
        host.stderr_file = Some(file);
        host.wait_ready().await;
        host
    }

    /// [`Self::start_process`] with the host's stderr written to a file
    /// (read it with [`Self::stderr`]); its log level is `opts.env`'s
    /// `MERCURY_LOG`, else `warn`.
    pub(crate) async fn start_process_captured(opts: HostOptions) -> TestHost {
        let (dir, data, port) = prepare(&opts).await;
        let file = dir.path().join("host.stderr");
        let child = spawn_serve(&data, &opts.env, Some(&file));
        let mut host = Self::finish(dir, data, port, CancellationToken::new(), None, Some(child));
        host.env = opts.env;
        host.stderr_file = Some(file);
        host.wait_ready().await;
        host
    }

    /// What the captured child-process host wrote to stderr so far.
    /// The cluster's `storage.shared_dir` (on its first host).
    pub(crate) fn shared_dir(&self) -> &Path {
        self.shared
            .as_ref()
            .expect("the first host of a cluster")
            .path()
    }

    pub(crate) fn stderr(&self) -> String {
        let file = self.stderr_file.as_ref().expect("a captured host");
        std::fs::read_to_string(file).unwrap_or_default()
    }

    fn finish(
        dir: TestDir,
        data: PathBuf,
        port: u16,
        shutdown: CancellationToken,
        task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
        child: Option<Child>,
    ) -> TestHost {
        // A cluster host that joins gets it when it starts (start_cluster).
        let owner_token = std::fs::read_to_string(data.join("global/owner.token"))
            .unwrap_or_default()
            .trim()
            .to_string();
        TestHost {
            dir,
            data,
            url: format!("http://127.0.0.1:{port}"),
            owner_token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            shutdown,
            task,
            child,
            env: Vec::new(),
            stderr_file: None,
            store: std::sync::OnceLock::new(),
            shared: None,
        }
    }

    /// Waits for `/healthz`. Generous: a restart sweeps containers and the
    /// machine may be loaded; readiness is waited for, never timed.
    pub(crate) async fn wait_ready(&self) {
        for _ in 0..1200 {
            if let Ok(r) = self.http.get(format!("{}/healthz", self.url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("host did not become ready at {}", self.url);
    }

    /// `n` hosts of one deployment (issue 28): one PostgreSQL database,
    /// one shared workspaces directory, each host a child process with its
    /// own data dir and port. The first is initialised; the others join it
    /// the way docs/scale-out.md says (its `mercury.yaml` copied, the owner
    /// token taken from `storage.shared_dir`, their own `bind` and
    /// `cluster.host_name`: `h1`, `h2`, …).
    pub(crate) async fn start_cluster(n: usize, opts: HostOptions) -> Vec<TestHost> {
        let db = PgDatabase::create();
        let shared = TempDir::new().expect("the shared workspaces dir");
        let mut builder = mercury::host::temp_host::TempHost::builder()
            .model(&opts.model.to_string())
            .sandbox(opts.sandbox)
            .postgres(&db.url())
            .set("cluster.enabled", Yaml::Bool(true))
            .set(
                "storage.shared_dir",
                Yaml::String(shared.path().display().to_string()),
            );
        for (k, v) in &opts.config {
            builder = builder.set(k, v.clone());
        }
        let (tmp, first) = builder.prepare().await.expect("prepare the first host");
        let mut dirs = vec![(TestDir { tmp, pg: Some(db) }, first.clone())];
        for _ in 1..n {
            let tmp = TempDir::new().expect("a host's dir");
            let data = tmp.path().join("data");
            std::fs::create_dir_all(&data).expect("its data dir");
            std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .expect("a private dir");
            // The config alone: the owner token comes from the shared dir.
            std::fs::copy(first.join("mercury.yaml"), data.join("mercury.yaml")).expect("copy");
            dirs.push((TestDir { tmp, pg: None }, data));
        }
        let mut hosts: Vec<TestHost> = Vec::new();
        for (i, (dir, data)) in dirs.into_iter().enumerate() {
            let port = free_port();
            let mut env = opts.env.clone();
            env.push(("MERCURY_BIND", format!("127.0.0.1:{port}")));
            env.push(("MERCURY_CLUSTER_HOST_NAME", format!("h{}", i + 1)));
            let child = spawn_serve(&data, &env, None);
            let mut host =
                Self::finish(dir, data, port, CancellationToken::new(), None, Some(child));
            host.env = env;
            host.wait_ready().await;
            if i > 0 {
                // Its owner token is the deployment's, from the shared dir.
                host.owner_token = std::fs::read_to_string(host.data.join("global/owner.token"))
                    .expect("the joining host took global/owner.token from storage.shared_dir")
                    .trim()
                    .to_owned();
                assert_eq!(host.owner_token, hosts[0].owner_token);
            }
            hosts.push(host);
        }
        // Kept until the hosts are gone (the first host's dir holds the
        // database; this one the workspaces).
        hosts[0].shared = Some(shared);
        hosts
    }

    /// Kills the child-process host with SIGKILL (crash test).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("kill");
            c.wait().expect("wait");
        }
    }

    /// Starts the child-process host again on the same data dir.
    pub(crate) async fn restart_process(&mut self) {
        self.child = Some(spawn_serve(&self.data, &self.env, None));
        self.wait_ready().await;
    }

    /// Stops an in-process host and hands back its data dir, to start it
    /// again (maybe reconfigured) with [`Self::start_on`].
    pub(crate) async fn stop_keeping(mut self) -> (TestDir, PathBuf) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
        let data = self.data.clone();
        let dir = std::mem::replace(
            &mut self.dir,
            TestDir {
                tmp: TempDir::new().expect("a temp dir"),
                pg: None,
            },
        );
        (dir, data)
    }

    pub(crate) async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let _ = c.wait();
        }
    }

    /// Sends a request with these headers; returns the status and the JSON
    /// body (Null if none).
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{}", self.url, path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A request in `space` (when given).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        space: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let headers: Vec<(&str, &str)> =
            space.map(|s| ("x-mercury-space", s)).into_iter().collect();
        self.send(method, path, token, &headers, body).await
    }

    /// A request in `holder` that acts in `target` through a space link.
    pub(crate) async fn act_as(
        &self,
        method: Method,
        path: &str,
        token: &str,
        holder: &str,
        target: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let headers = [("x-mercury-space", holder), ("x-mercury-act-as", target)];
        self.send(method, path, Some(token), &headers, body).await
    }

    /// Gives `space` a platform conversation `external` (a first message
    /// through ingress with a fresh adapter token, then linked by the owner);
    /// returns the conversation id. Later messages to it land in `space`.
    pub(crate) async fn platform_conversation(&self, external: &str, space: &str) -> i64 {
        // The first sender is allowed first, so the conversation exists under
        // any sender policy (a stranger's DM would leave no row).
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/senders/allow",
                None,
                Some(json!({"sender": "test:first"})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let adapter = self.token(&format!("adapter:{external}"), "adapter").await;
        let (st, v) = self
            .ingest(
                &adapter,
                external,
                "test:first",
                "hello",
                &format!("{external}-first"),
                false,
            )
            .await;
        assert_eq!(st, 202, "{v}");
        let id = self
            .read(|c| conversations::list(c, None))
            .into_iter()
            .find(|c| c.external_id == external)
            .expect("the conversation was stored")
            .id;
        // Its first message's turn ends here, not in the middle of the
        // caller's before/after comparison (a slower backend shows the race).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.read(|c| inspect::pending_in_conversation(c, id)) > 0
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let (st, v) = self
            .owner(
                Method::POST,
                &format!("/api/conversations/{id}/link"),
                Some(space),
                Some(json!({"space_id": space})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        id
    }

    /// Chats in `space` as the owner (`POST /api/chat`) and expects 200.
    pub(crate) async fn chat(&self, space: &str, text: &str) -> Value {
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/chat",
                Some(space),
                Some(json!({"text": text})),
            )
            .await;
        assert_eq!(st, 200, "chat {text:?} in {space}: {v}");
        v
    }

    /// Grants `role` to `caller` in `space` (as the owner).
    pub(crate) async fn grant(&self, space: &str, caller: &str, role: &str) {
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/roles",
                Some(space),
                Some(json!({"caller_id": caller, "role": role})),
            )
            .await;
        assert_eq!(st, 200, "grant {role} to {caller} in {space}: {v}");
    }

    /// Creates a space link as the owner; returns the first edge's id.
    pub(crate) async fn link(&self, holder: &str, target: &str, level: &str) -> i64 {
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/links",
                None,
                Some(json!({"holder": holder, "target": target, "level": level})),
            )
            .await;
        assert_eq!(st, 201, "link {holder}->{target}: {v}");
        v["links"][0]["id"].as_i64().unwrap()
    }

    /// Every row of every table (but `except`) that mentions `space` in any
    /// column, as text: a fingerprint of what a space holds in the database.
    pub(crate) fn rows_mentioning(&self, space: &str, except: &[&str]) -> Vec<String> {
        let space = space.to_owned();
        let except: Vec<String> = except.iter().map(|e| (*e).to_owned()).collect();
        self.read(move |c| {
            let mut out = Vec::new();
            for n in inspect::tables(c)? {
                if except.contains(&n) {
                    continue;
                }
                for vals in inspect::rows_as_text(c, &n)? {
                    if vals.contains(&space) {
                        out.push(format!("{n}: {}", vals.join(" | ")));
                    }
                }
            }
            Ok(out)
        })
    }

    /// (relative path, sha256) of every file under the space's workspace.
    /// A file a running turn wrote: turns write in their layer
    /// (`tmp/turn-<run>/merged/`) until they commit.
    pub(crate) fn in_turn_layer(&self, name: &str) -> Option<PathBuf> {
        std::fs::read_dir(self.data.join("tmp"))
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("turn-"))
            .map(|e| e.path().join("merged").join(name))
            .find(|p| p.exists())
    }

    /// Mount points below the data dir (turn layers left mounted).
    pub(crate) fn mounts_below_data(&self) -> Vec<String> {
        let data = std::fs::canonicalize(&self.data).unwrap_or(self.data.clone());
        mercury::workspace::layer::mount_points()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.starts_with(&data))
            .map(|p| p.display().to_string())
            .collect()
    }

    pub(crate) fn workspace_hashes(&self, space: &str) -> Vec<(String, String)> {
        use sha2::{Digest, Sha256};
        let root = self.data.join("spaces").join(space);
        let mut out: Vec<(String, String)> = walkdir::WalkDir::new(&root)
            .into_iter()
            .map(Result::unwrap)
            .filter(|e| e.file_type().is_file())
            .map(|e| {
                let rel = e.path().strip_prefix(&root).unwrap().display().to_string();
                let hash = base16ct::lower::encode_string(&Sha256::digest(
                    std::fs::read(e.path()).unwrap(),
                ));
                (rel, hash)
            })
            .collect();
        out.sort();
        out
    }

    pub(crate) async fn owner(
        &self,
        method: Method,
        path: &str,
        space: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call(method, path, Some(&self.owner_token.clone()), space, body)
            .await
    }

    pub(crate) async fn create_space(&self, id: &str) {
        let (st, v) = self
            .owner(Method::POST, "/api/spaces", None, Some(json!({"id": id})))
            .await;
        assert_eq!(st, 201, "create space {id}: {v}");
    }

    /// Mints a token for `caller` of kind user/adapter through the API (an
    /// adapter is bound to the platform `test`, which `ingest` posts for).
    pub(crate) async fn token(&self, caller: &str, kind: &str) -> String {
        if kind == "adapter" {
            return self.adapter_token(caller, "test").await;
        }
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/tokens",
                None,
                Some(json!({"caller_id": caller, "kind": kind})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// Mints an adapter token bound to `platform`.
    pub(crate) async fn adapter_token(&self, caller: &str, platform: &str) -> String {
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/tokens",
                None,
                Some(json!({"caller_id": caller, "kind": "adapter", "platform": platform})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// Mints an adapter token bound to `platform` whose senders' identity
    /// mappings hold (`--trusted-identities`).
    pub(crate) async fn trusted_adapter_token(&self, caller: &str, platform: &str) -> String {
        let (st, v) = self
            .owner(
                Method::POST,
                "/api/tokens",
                None,
                Some(
                    json!({"caller_id": caller, "kind": "adapter", "platform": platform,
                            "trusted_identities": true}),
                ),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(v["trusted_identities"], true, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// The host's database through storage: a store opened where its
    /// config says (its `state.db`, or its PostgreSQL database), once per
    /// test host, as a second process of the same deployment would open it.
    pub(crate) fn store(&self) -> &Store {
        self.store.get_or_init(|| {
            let paths = mercury::workspace::DataPaths::new(&self.data);
            let settings = mercury::host::load_settings(&paths).expect("the host's settings");
            let at = mercury::host::store_location(&settings, &paths).expect("its store");
            Store::open_at(&at).expect("open the store")
        })
    }

    /// Runs `f` on one of the store's read connections (a short blocking
    /// read; from the test's async body too, which storage allows for).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Conn) -> StoreResult<T>) -> T {
        self.store()
            .read_blocking(f)
            .expect("a read of the database")
    }

    /// Runs `f` in a write of the store (seeding rows the way a second
    /// process would), waiting for its commit from any context.
    pub(crate) fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> StoreResult<T> + Send + 'static,
    ) -> T {
        write_to(self.store(), f)
    }

    /// A test's own counting statement (`SELECT COUNT(*) …`).
    pub(crate) fn count(&self, sql: &str) -> i64 {
        self.read(|c| inspect::count(c, sql))
    }

    /// Total rows of every table (to prove a request wrote nothing).
    pub(crate) fn all_row_counts(&self) -> Vec<(String, i64)> {
        self.read(|c| {
            inspect::tables(c)?
                .into_iter()
                .map(|n| Ok((n.clone(), inspect::row_count(c, &n)?)))
                .collect()
        })
    }

    /// `mrctl` as a process, with this host's URL and the given token.
    pub(crate) fn mrctl(&self, token: &str, space: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mrctl"));
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("MERCURY_URL", &self.url)
            .env("MERCURY_TOKEN", token)
            .stdin(Stdio::null());
        if let Some(s) = space {
            c.env("MERCURY_SPACE", s);
        }
        c
    }

    /// Posts a platform message with an adapter token.
    pub(crate) async fn ingest(
        &self,
        adapter: &str,
        conversation: &str,
        sender: &str,
        text: &str,
        message_id: &str,
        is_group: bool,
    ) -> (u16, Value) {
        self.call(
            Method::POST,
            "/api/ingress",
            Some(adapter),
            None,
            Some(json!({
                "platform": "test", "conversation": conversation, "sender_id": sender,
                "sender_name": "Tester", "text": text, "message_id": message_id, "is_group": is_group
            })),
        )
        .await
    }

    /// Waits until `sql` (a COUNT) reaches `want`, up to `secs`.
    pub(crate) async fn wait_count(&self, sql: &str, want: i64, secs: u64) -> i64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let n = self.count(sql);
            if n >= want || std::time::Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl TestHost {
    /// Sends a signal (`TERM`, `INT`, `KILL`) to the child-process host.
    pub(crate) fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("a child-process host").id();
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(st.success(), "kill -{sig} {pid} failed");
    }

    /// Waits up to `secs` for the child-process host to exit; its exit status
    /// (None if it is still running then).
    pub(crate) async fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let c = self.child.as_mut().expect("a child-process host");
            if let Some(st) = c.try_wait().expect("try_wait") {
                self.child = None;
                return Some(st);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_serve(data: &Path, env: &[(&'static str, String)], stderr: Option<&Path>) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env("MERCURY_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    match stderr {
        Some(path) => c.stderr(std::fs::File::create(path).expect("the stderr file")),
        None => c.stderr(Stdio::inherit()),
    };
    c.spawn().expect("spawn mercury serve")
}

/// The block of a bench's output that `--statements` prints for `name`
/// (`statements of {name}: …` up to the next blank line).
pub(crate) fn statements_section(out: &str, name: &str) -> String {
    let start = out
        .find(&format!("statements of {name}: "))
        .unwrap_or_else(|| panic!("no {name} statements in:\n{out}"));
    out[start..]
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}
