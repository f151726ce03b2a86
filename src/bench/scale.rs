//! `mercury bench scale` (issue 32, item 6): a 10,000-space,
//! 1,000,000-message store built through the product's storage (its bench
//! seed, in large transactions; not through HTTP), a host on it, then:
//! `messages recent` direct and through a space link (p50/p99, each path
//! in its own sequential blocks), the host's idle RSS, and for each wave of
//! spaces woken at once (one `POST /api/chat` turn each, a scripted reply,
//! no tool) the turns per second, their p99, the RSS with every woken
//! actor alive, and the RSS after they stopped (`spaces.idle_stop_secs`).
//!
//! The host runs in this process, so RSS is this process's (`VmRSS`). The
//! targets are absolute (issue 32): `messages recent` p99 ≤ 5 ms; 10,000
//! live space actors ≤ 100 MB RSS; memory returned when actors stop.
//!
//! Must never: touch a data dir it did not create, or reach anything but
//! 127.0.0.1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use super::{percentile, timed};
use crate::host::temp_host::TempHost;

pub(crate) struct ScaleOptions {
    pub spaces: usize,
    pub messages: usize,
    /// Spaces woken at once in each wave, in order.
    pub waves: Vec<usize>,
    /// `messages recent` requests per path.
    pub requests: usize,
    /// Turns in flight while a wave wakes its spaces.
    pub concurrency: usize,
    /// `spaces.idle_stop_secs` of the host: how soon a woken actor stops.
    pub idle_stop_secs: u64,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        Self {
            spaces: 10_000,
            messages: 1_000_000,
            waves: vec![1_000, 3_000, 10_000],
            requests: 400,
            concurrency: 32,
            // Longer than a 10,000-space wave takes (about 20 s here), so
            // every woken actor is still alive when the wave ends.
            idle_stop_secs: 30,
        }
    }
}

pub(crate) struct Wave {
    pub spaces: usize,
    pub seconds: f64,
    pub p99: Duration,
    pub rss_alive_kb: u64,
    pub rss_after_kb: u64,
    /// `mercury_active_spaces` of `/metrics` right after the wave and after
    /// the idle stop (`None`: not read).
    pub active_alive: Option<f64>,
    pub active_after: Option<f64>,
}

pub(crate) struct ScaleReport {
    pub spaces: usize,
    pub messages: usize,
    pub build_seconds: f64,
    pub db_bytes: u64,
    pub idle_rss_kb: u64,
    pub direct: Vec<Duration>,
    pub linked: Vec<Duration>,
    pub waves: Vec<Wave>,
}

/// This process's resident set, in KiB.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn space(i: usize) -> String {
    format!("scale-{i:05}")
}

pub(crate) async fn run(opts: &ScaleOptions) -> anyhow::Result<ScaleReport> {
    let (dir, data) = TempHost::builder()
        .model(r#"{"rules":[{"reply":"ok"}]}"#)
        .sandbox("process")
        .set(
            "spaces.idle_stop_secs",
            Yaml::Number(opts.idle_stop_secs.into()),
        )
        .prepare()
        .await?;
    let db = data.join("state.db");
    let started = Instant::now();
    let (spaces, messages) = (opts.spaces, opts.messages);
    let seeded = db.clone();
    tokio::task::spawn_blocking(move || {
        crate::storage::seed::scale_store(&seeded, spaces, messages, crate::clock::now_ms())
    })
    .await
    .context("seeding")??;
    let build_seconds = started.elapsed().as_secs_f64();
    let db_bytes = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    let host = TempHost::serve_in(dir, data).await?;
    // A management space whose admin reads the first space through a link.
    let target = space(1);
    let alice = super::links::reader_through_link(&host, &target, "read").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss_kb = rss_kb();

    let client = reqwest::Client::builder().build()?;
    let url = format!("{}/api/messages/recent?since=1h&limit=50", host.url);
    let direct = || {
        client
            .get(&url)
            .bearer_auth(&host.owner_token)
            .header("x-mercury-space", &target)
    };
    let linked = || {
        client
            .get(&url)
            .bearer_auth(&alice)
            .header("x-mercury-space", "mgmt")
            .header("x-mercury-act-as", &target)
    };
    for _ in 0..20 {
        timed(direct()).await?;
        timed(linked()).await?;
    }
    let (mut d, mut l) = (Vec::new(), Vec::new());
    let block = opts.requests.div_ceil(4);
    for through_link in [false, true, true, false] {
        for _ in 0..block {
            if through_link {
                l.push(timed(linked()).await?);
            } else {
                d.push(timed(direct()).await?);
            }
        }
    }
    d.sort();
    l.sort();

    let mut waves = Vec::new();
    for &n in &opts.waves {
        let n = n.min(opts.spaces);
        let chat = format!("{}/api/chat", host.url);
        let gate = Arc::new(tokio::sync::Semaphore::new(opts.concurrency.max(1)));
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let mut lat = Vec::with_capacity(n);
        for i in 0..n {
            // A request is made only once a slot is free, so the client
            // holds `concurrency` requests, not the whole wave's: the RSS
            // measured is the host's, not a queue of the bench's own.
            let permit = gate.clone().acquire_owned().await?;
            while let Some(r) = tasks.try_join_next() {
                lat.push(r.context("a wave's request")??);
            }
            let (client, chat, token) = (client.clone(), chat.clone(), host.owner_token.clone());
            tasks.spawn(async move {
                let _permit = permit;
                timed(
                    client
                        .post(&chat)
                        .bearer_auth(token)
                        .header("x-mercury-space", space(i))
                        .json(&json!({"text": "hello"})),
                )
                .await
            });
        }
        while let Some(r) = tasks.join_next().await {
            lat.push(r.context("a wave's request")??);
        }
        let seconds = t.elapsed().as_secs_f64();
        let rss_alive_kb = rss_kb();
        let active_alive = active_spaces(&client, &host).await;
        lat.sort();
        // Every woken actor idles out (the gauge says when), then its
        // memory should be back.
        let deadline = Instant::now() + Duration::from_secs(opts.idle_stop_secs * 3 + 5);
        while Instant::now() < deadline
            && active_spaces(&client, &host).await.is_some_and(|n| n > 0.0)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        waves.push(Wave {
            spaces: n,
            seconds,
            p99: percentile(&lat, 99.0),
            rss_alive_kb,
            rss_after_kb: rss_kb(),
            active_alive,
            active_after: active_spaces(&client, &host).await,
        });
    }
    host.stop().await?;
    Ok(ScaleReport {
        spaces: opts.spaces,
        messages: opts.messages,
        build_seconds,
        db_bytes,
        idle_rss_kb,
        direct: d,
        linked: l,
        waves,
    })
}

/// The host's `mercury_active_spaces` gauge (space actors alive).
async fn active_spaces(client: &reqwest::Client, host: &TempHost) -> Option<f64> {
    let text = client
        .get(format!("{}/metrics", host.url))
        .bearer_auth(&host.owner_token)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("mercury_active_spaces "))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn gauge(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.0}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn print(r: &ScaleReport) {
    println!(
        "bench scale: {} spaces, {} messages built through storage in {:.1} s ({:.0} MB database)",
        r.spaces,
        r.messages,
        r.build_seconds,
        r.db_bytes as f64 / 1e6
    );
    println!(
        "  messages recent (limit 50), each path in its own sequential blocks: direct p50 {:.3} ms p99 {:.3} ms | through a link p50 {:.3} ms p99 {:.3} ms (target p99 <= 5 ms)",
        ms(percentile(&r.direct, 50.0)),
        ms(percentile(&r.direct, 99.0)),
        ms(percentile(&r.linked, 50.0)),
        ms(percentile(&r.linked, 99.0)),
    );
    println!("  idle RSS {:.1} MB", r.idle_rss_kb as f64 / 1024.0);
    for w in &r.waves {
        let per = (w.rss_alive_kb.saturating_sub(r.idle_rss_kb)) as f64 / w.spaces.max(1) as f64;
        println!(
            "  woke {:>6} spaces (one chat turn each): {:.0} turns/s, p99 {:.1} ms, RSS with {} actors alive {:.1} MB (~{per:.1} KB a space over idle), with {} alive after the idle stop {:.1} MB (target: 10,000 alive <= 100 MB; memory back after)",
            w.spaces,
            w.spaces as f64 / w.seconds.max(1e-9),
            ms(w.p99),
            gauge(w.active_alive),
            w.rss_alive_kb as f64 / 1024.0,
            gauge(w.active_after),
            w.rss_after_kb as f64 / 1024.0,
        );
    }
}
