//! `mercury bench cluster` (issue 28): messages a second and the answer's
//! p99 with 1, 2 and 3 hosts on one PostgreSQL database, side by side, the
//! one-host run the baseline of the others.
//!
//! Each run starts its hosts as `mercury serve` processes of this binary
//! (their own data dirs, one shared workspaces dir, `cluster.enabled`), a
//! scripted model with a fixed latency, and posts the same load through
//! every host's ingress round-robin (each run on spaces of its own); it
//! ends when every message is answered. Messages a second are counted from
//! the first post to the last reply; the p99 is of each message's arrival
//! to its reply, read from the replies' rows.
//!
//! Must never: touch a database that is not empty at the start (`mercury
//! init` refuses it), or reach anything but 127.0.0.1 and that database.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use crate::host::temp_host::TempHost;
use crate::storage::{stats, Location, Store};

pub(crate) struct ClusterOptions {
    /// An empty PostgreSQL database (`postgres://…`).
    pub url: String,
    /// Host counts, one run each, in order (the first is the baseline).
    pub hosts: Vec<usize>,
    pub spaces: usize,
    pub per_space: usize,
    /// The scripted model's fixed latency.
    pub latency_ms: u64,
    /// Posts in flight at once.
    pub concurrency: usize,
}

pub(crate) struct ClusterRun {
    pub hosts: usize,
    pub messages: usize,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// One `mercury serve` child, stopped (SIGTERM, then SIGKILL) on drop.
struct HostProcess(Child);

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: kill(2) with this child's own pid and a signal number.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) async fn run(opts: &ClusterOptions) -> anyhow::Result<Vec<ClusterRun>> {
    let shared = tempfile::Builder::new()
        .prefix("mercury-bench-cluster-")
        .tempdir()?;
    let rules = json!({"rules": [{"reply": "ok", "latency_ms": opts.latency_ms}]});
    let (first_dir, first) = TempHost::builder()
        .model(&rules.to_string())
        .sandbox("process")
        .postgres(&opts.url)
        .set("cluster.enabled", Yaml::Bool(true))
        .set(
            "storage.workspaces_dir",
            Yaml::String(shared.path().join("spaces").display().to_string()),
        )
        .set("cluster.poll_ms", Yaml::Number(100.into()))
        .set("ingress.dm_policy", Yaml::String("open".into()))
        .set(
            "ingress.per_caller_per_minute",
            Yaml::Number(100_000.into()),
        )
        .prepare()
        .await
        .context("preparing the first host (the database must be empty)")?;
    let most = opts.hosts.iter().copied().max().unwrap_or(1);
    let mut data_dirs = vec![first.clone()];
    let mut keep = vec![first_dir];
    for _ in 1..most {
        let dir = tempfile::Builder::new()
            .prefix("mercury-bench-host-")
            .tempdir()?;
        let data = dir.path().join("data");
        crate::workspace::data_dir::private_dir(&data)?;
        crate::workspace::data_dir::private_dir(&data.join("global"))?;
        std::fs::copy(first.join("mercury.yaml"), data.join("mercury.yaml"))?;
        std::fs::copy(
            first.join("global/owner.token"),
            data.join("global/owner.token"),
        )?;
        data_dirs.push(data);
        keep.push(dir);
    }
    let owner = std::fs::read_to_string(first.join("global/owner.token"))?
        .trim()
        .to_owned();
    let store = Store::open_at(&Location::Postgres {
        url: opts.url.clone(),
        password: None,
    })?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut token: Option<String> = None;
    let mut out = Vec::new();
    for (round, &n) in opts.hosts.iter().enumerate() {
        let mut procs = Vec::new();
        let mut urls = Vec::new();
        for (i, data) in data_dirs.iter().take(n).enumerate() {
            let port = free_port()?;
            let child = Command::new(&exe)
                .arg("serve")
                .arg("--data-dir")
                .arg(data)
                .env("MERCURY_LOG", "error")
                .env("MERCURY_BIND", format!("127.0.0.1:{port}"))
                .env("MERCURY_CLUSTER_HOST_NAME", format!("bench{}", i + 1))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                // A host's errors are the bench's to show.
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting mercury serve")?;
            procs.push(HostProcess(child));
            urls.push(format!("http://127.0.0.1:{port}"));
        }
        for url in &urls {
            wait_ready(&client, url).await?;
        }
        let adapter = match &token {
            Some(t) => t.clone(),
            None => {
                let v: serde_json::Value = client
                    .post(format!("{}/api/tokens", urls[0]))
                    .bearer_auth(&owner)
                    .json(&json!({"caller_id": "bench", "kind": "adapter", "platform": "bench"}))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let t = v["token"]
                    .as_str()
                    .context("the token answer has no token")?
                    .to_owned();
                token = Some(t.clone());
                t
            }
        };
        let after = store.read(stats::last_message_id).await?;
        let total = opts.spaces * opts.per_space;
        let started = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(opts.concurrency.max(1)));
        let mut posts = tokio::task::JoinSet::new();
        for m in 0..opts.per_space {
            for s in 0..opts.spaces {
                let permit = gate.clone().acquire_owned().await?;
                let url = urls[(s + m) % urls.len()].clone();
                let (client, adapter) = (client.clone(), adapter.clone());
                posts.spawn(async move {
                    let _permit = permit;
                    client
                        .post(format!("{url}/api/ingress"))
                        .bearer_auth(adapter)
                        .json(&json!({
                            "platform": "bench", "conversation": format!("r{round}-s{s}"),
                            "sender_id": format!("bench:{s}"), "sender_name": "Bench",
                            "text": format!("message {m}"), "message_id": format!("r{round}-{s}-{m}"),
                            "is_group": false,
                        }))
                        .send()
                        .await?
                        .error_for_status()?;
                    anyhow::Ok(())
                });
            }
        }
        while let Some(r) = posts.join_next().await {
            r??;
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        let latencies = loop {
            let l = store
                .read(move |c| stats::reply_latencies_after(c, after))
                .await?;
            if l.len() >= total {
                break l;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {total} messages answered after 10 minutes",
                l.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        let mut sorted: Vec<Duration> = latencies
            .iter()
            .map(|ms| Duration::from_millis(u64::try_from(*ms).unwrap_or(0)))
            .collect();
        sorted.sort();
        out.push(ClusterRun {
            hosts: n,
            messages: total,
            per_second: total as f64 / seconds,
            p50: super::percentile(&sorted, 50.0),
            p99: super::percentile(&sorted, 99.0),
        });
        drop(procs);
    }
    drop(keep);
    Ok(out)
}

async fn wait_ready(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    for _ in 0..600 {
        if let Ok(r) = client.get(format!("{url}/healthz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("the host at {url} did not become ready")
}

pub(crate) fn print(runs: &[ClusterRun]) {
    let base = runs.first().map(|r| (r.per_second, r.p99));
    println!("hosts  messages  msgs/s   p50 ms   p99 ms   msgs/s vs 1st  p99 vs 1st");
    for r in runs {
        let (rate, p99) = match base {
            Some((b_rate, b_p99)) if b_rate > 0.0 && !b_p99.is_zero() => (
                r.per_second / b_rate,
                r.p99.as_secs_f64() / b_p99.as_secs_f64(),
            ),
            _ => (1.0, 1.0),
        };
        println!(
            "{:>5}  {:>8}  {:>6.1}  {:>7.0}  {:>7.0}  {:>13.2}  {:>10.2}",
            r.hosts,
            r.messages,
            r.per_second,
            r.p50.as_secs_f64() * 1000.0,
            r.p99.as_secs_f64() * 1000.0,
            rate,
            p99
        );
    }
}
