//! `mercury bench review`: does a scan stall live replies?
//!
//! Starts a real host on a temp data dir, its live and judge models served
//! by one fake OpenAI-compatible provider with a requests- and tokens-per-
//! minute budget they share (the contended resource in production is the
//! key's rate limit, not the host's CPU; past it the fake answers 429),
//! seeds a window of exchanges, and measures the p99 of live `POST /api/chat`
//! round trips with no scan, then while scans run, first with the model gate
//! as configured (slots and the adaptive quota) and then with it open, side
//! by side, with the judge's calls a second during each: the scan's share of
//! its open-gate throughput. It also compares the judge's tokens per
//! exchange when exchanges are batched against one exchange per call.
//!
//! It prints ratios against its own baselines and asserts nothing: timings
//! depend on the machine, so no test checks them.
//!
//! Must never: touch a data dir it did not create, or reach anything but
//! 127.0.0.1.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;
use tokio_util::sync::CancellationToken;

use super::fake_provider::{Budget, FakeModel, FakeProvider};
use crate::client::{request, Connection, Endpoint};
use crate::clock::now_ms;
use crate::model::gate::Admission;
use crate::model::scripted::ScriptedProvider;
use crate::model::ModelProvider;
use crate::redaction::{RedactionList, Redactor};
use crate::review::judge;
use crate::review::reader::{ExchangeReader, Window};
use crate::storage::messages::{self, NewMessage};
use crate::storage::stats;
use crate::storage::{spaces, Store};

#[derive(Debug, Clone)]
pub(crate) struct BenchOptions {
    pub exchanges: usize,
    pub spaces: usize,
    pub live_samples: usize,
    pub live_latency_ms: u64,
    pub judge_latency_ms: u64,
    pub batch_size: u32,
    pub max_concurrency: u32,
    pub calls_per_minute: u32,
    /// Exchanges used for the tokens-per-exchange comparison.
    pub token_sample: usize,
    /// The fake provider's budget (requests, tokens a minute; 0: none).
    pub provider_rpm: u64,
    pub provider_tpm: u64,
    /// After the first scan starts, how long the gate may settle before the
    /// loaded measurement.
    pub settle: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        let review = crate::config::ReviewConfig::default();
        Self {
            exchanges: 10_000,
            spaces: 100,
            live_samples: 300,
            live_latency_ms: 20,
            judge_latency_ms: 20,
            batch_size: review.batch_size,
            max_concurrency: review.max_concurrency,
            calls_per_minute: review.calls_per_minute,
            token_sample: 500,
            provider_rpm: 3600,
            provider_tpm: 0,
            settle: Duration::from_secs(3),
        }
    }
}

/// Live round trips of one admission mode: without, then with a scan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Phase {
    pub idle_p99_ms: f64,
    pub scan_p99_ms: f64,
    pub idle_p50_ms: f64,
    pub scan_p50_ms: f64,
    /// p99 of the second idle run over the first: how much two runs with no
    /// scan differ on this machine.
    pub noise_floor: f64,
    /// Judge calls made while the live replies were measured.
    pub judge_calls: u64,
    /// Those calls a second of the loaded measurement.
    pub judge_per_second: f64,
    /// Rate-limit answers of the fake provider during it, to live and to
    /// judge calls.
    pub live_429: u64,
    pub judge_429: u64,
    /// Scans that ran to their end during the measurement.
    pub scans_finished: u64,
}

impl Phase {
    pub(crate) fn ratio(&self) -> f64 {
        if self.idle_p99_ms > 0.0 {
            self.scan_p99_ms / self.idle_p99_ms
        } else {
            f64::NAN
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BenchReport {
    pub options: BenchOptions,
    pub gated: Phase,
    pub open: Phase,
    pub tokens_per_exchange_batched: f64,
    pub tokens_per_exchange_single: f64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "mercury bench review: {} exchanges in {} spaces; {} live replies per measurement",
            o.exchanges, o.spaces, o.live_samples
        )?;
        writeln!(
            f,
            "fake provider: live {} ms, judge {} ms; budget {} requests/min, {} tokens/min (0: none), shared\n\
             review: batch_size {}, max_concurrency {}, calls_per_minute {} (the quota's floor); settle {:?} before measuring\n",
            o.live_latency_ms,
            o.judge_latency_ms,
            o.provider_rpm,
            o.provider_tpm,
            o.batch_size,
            o.max_concurrency,
            o.calls_per_minute,
            o.settle
        )?;
        writeln!(f, "{:<34}{:>20}{:>20}", "", "gate (adaptive)", "gate open")?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, a: String, b: String| {
            writeln!(f, "{name:<34}{a:>20}{b:>20}")
        };
        let (g, p) = (&self.gated, &self.open);
        row(
            f,
            "live p50, no scan (ms)",
            format!("{:.1}", g.idle_p50_ms),
            format!("{:.1}", p.idle_p50_ms),
        )?;
        row(
            f,
            "live p50, scan running (ms)",
            format!("{:.1}", g.scan_p50_ms),
            format!("{:.1}", p.scan_p50_ms),
        )?;
        row(
            f,
            "live p99, no scan (ms)",
            format!("{:.1}", g.idle_p99_ms),
            format!("{:.1}", p.idle_p99_ms),
        )?;
        row(
            f,
            "live p99, scan running (ms)",
            format!("{:.1}", g.scan_p99_ms),
            format!("{:.1}", p.scan_p99_ms),
        )?;
        row(
            f,
            "p99 ratio (target <= 1.05)",
            format!("{:.3}", g.ratio()),
            format!("{:.3}", p.ratio()),
        )?;
        row(
            f,
            "noise floor (idle again / idle)",
            format!("{:.3}", g.noise_floor),
            format!("{:.3}", p.noise_floor),
        )?;
        row(
            f,
            "judge calls during measurement",
            g.judge_calls.to_string(),
            p.judge_calls.to_string(),
        )?;
        row(
            f,
            "judge calls/s during it",
            format!("{:.1}", g.judge_per_second),
            format!("{:.1}", p.judge_per_second),
        )?;
        row(
            f,
            "429s to live / judge calls",
            format!("{} / {}", g.live_429, g.judge_429),
            format!("{} / {}", p.live_429, p.judge_429),
        )?;
        row(
            f,
            "scans finished during it",
            g.scans_finished.to_string(),
            p.scans_finished.to_string(),
        )?;
        let share = if p.judge_per_second > 0.0 {
            g.judge_per_second / p.judge_per_second
        } else {
            f64::NAN
        };
        writeln!(
            f,
            "\nlive p99 ratio with the gate: {:.3} (target <= 1.05); scan throughput share of open: {:.2} (target >= 0.50)",
            g.ratio(),
            share
        )?;
        let ratio = self.tokens_per_exchange_batched / self.tokens_per_exchange_single;
        writeln!(
            f,
            "\njudge tokens per exchange: batched ({}) {:.1}, one per call {:.1}, ratio {:.3}",
            o.batch_size, self.tokens_per_exchange_batched, self.tokens_per_exchange_single, ratio
        )
    }
}

pub(crate) async fn run(opts: BenchOptions) -> anyhow::Result<BenchReport> {
    if opts.exchanges == 0 || opts.spaces == 0 || opts.live_samples == 0 {
        bail!("--exchanges, --spaces and --live-samples must be greater than 0");
    }
    let dir = tempfile::Builder::new()
        .prefix("mercury-bench-review-")
        .tempdir()?;
    let data = dir.path().join("data");
    crate::host::init(&data, "owner").await?;
    let fake = FakeProvider::start(
        std::collections::BTreeMap::from([
            (
                "live".to_owned(),
                FakeModel {
                    latency: Duration::from_millis(opts.live_latency_ms),
                    reply: "ok".into(),
                },
            ),
            (
                "judge".to_owned(),
                FakeModel {
                    latency: Duration::from_millis(opts.judge_latency_ms),
                    reply: "{\"findings\": []}".into(),
                },
            ),
        ]),
        Budget {
            rpm: opts.provider_rpm,
            tpm: opts.provider_tpm,
        },
    )
    .await?;
    eprintln!(
        "seeding {} exchanges in {} spaces…",
        opts.exchanges, opts.spaces
    );
    seed(&data.join("state.db"), &opts).await?;
    eprintln!("measuring with the limiter and pool on…");
    let gated = phase(&data, &fake, &opts, Admission::Gated).await?;
    eprintln!("measuring with the gate open…");
    let open = phase(&data, &fake, &opts, Admission::Open).await?;
    let sample = {
        let (db, opts2) = (data.join("state.db"), opts.clone());
        tokio::task::spawn_blocking(move || token_sample(&db, &opts2)).await??
    };
    let batched = tokens_per_exchange(&sample, opts.batch_size as usize).await?;
    let single = tokens_per_exchange(&sample, 1).await?;
    Ok(BenchReport {
        options: opts,
        gated,
        open,
        tokens_per_exchange_batched: batched,
        tokens_per_exchange_single: single,
    })
}

/// `exchanges` user messages with replies (and an ambient line every few)
/// spread over the last 23 hours, in `spaces` spaces, plus `bench-live`.
async fn seed(db: &Path, opts: &BenchOptions) -> anyhow::Result<()> {
    let store = Store::open(db)?;
    let opts = opts.clone();
    store
        .write(move |tx| {
            spaces::create_space(tx, "bench-live", "live replies", &[])?;
            let now = now_ms();
            let span = 23 * 3_600_000i64;
            let per_space = opts.exchanges.div_ceil(opts.spaces);
            for s in 0..opts.spaces {
                let space = format!("bench-{s}");
                spaces::create_space(tx, &space, &space, &[])?;
                let people = [
                    (format!("wa:3161{s:03}0001@s.whatsapp.net"), "Anna de Vries"),
                    (format!("wa:3161{s:03}0002@s.whatsapp.net"), "Bram Jansen"),
                ];
                for (id, name) in &people {
                    spaces::touch_member(tx, &space, id, Some(name))?;
                }
                for i in 0..per_space.min(opts.exchanges.saturating_sub(s * per_space)) {
                    let at = now - span + (span * (i as i64)) / (per_space as i64).max(1);
                    let (id, name) = &people[i % 2];
                    if i % 5 == 0 {
                        messages::insert(
                            tx,
                            &NewMessage {
                                space_id: &space,
                                sender_id: Some(&people[(i + 1) % 2].0),
                                sender_name: Some(people[(i + 1) % 2].1),
                                role: "ambient",
                                text: "shall we meet at 18:30? my number is +31 6 1234 5678",
                                created_at: at,
                                ..Default::default()
                            },
                        )?;
                    }
                    let user = messages::insert(
                        tx,
                        &NewMessage {
                            space_id: &space,
                            sender_id: Some(id),
                            sender_name: Some(name),
                            role: "user",
                            text: &format!(
                                "@mercury question {i}: what should {} bring on Friday? mail me at anna{i}@example.org",
                                people[(i + 1) % 2].1
                            ),
                            created_at: at + 1,
                            status: Some("done"),
                            ..Default::default()
                        },
                    )?;
                    messages::insert(
                        tx,
                        &NewMessage {
                            space_id: &space,
                            sender_id: Some("mercury"),
                            sender_name: Some("Mercury"),
                            role: "assistant",
                            text: &format!("Answer {i}: bring the slides and the cake, as discussed on 2026-09-01."),
                            created_at: at + 2,
                            reply_to: user,
                            ..Default::default()
                        },
                    )?;
                }
            }
            Ok(())
        })
        .await?;
    Ok(())
}

/// The bench's settings, written through the one config writer.
fn write_config(
    data: &Path,
    fake: &FakeProvider,
    opts: &BenchOptions,
) -> anyhow::Result<crate::config::Settings> {
    let num = |n: u64| Yaml::Number(n.into());
    let keys = [
        ("model", Yaml::String("openai:live".into())),
        ("review.model", Yaml::String("openai:judge".into())),
        (
            "providers.openai_base_url",
            Yaml::String(fake.base_url.clone()),
        ),
        // A live call refused past the budget waits the provider's
        // Retry-After and asks again, as many times as it takes here, so a
        // bench run measures the delay instead of failing on it.
        ("providers.max_retries", num(20)),
        ("sandbox.backend", Yaml::String("process".into())),
        // The live client is one caller asking as fast as it can.
        ("ingress.per_caller_per_minute", num(1_000_000)),
        ("review.enabled", Yaml::Bool(false)),
        ("review.batch_size", num(opts.batch_size as u64)),
        ("review.max_concurrency", num(opts.max_concurrency as u64)),
        ("review.calls_per_minute", num(opts.calls_per_minute as u64)),
    ];
    crate::config::set_keys(&data.join("mercury.yaml"), &keys)?;
    crate::host::settings_of(data)
}

/// A host on the bench's data dir, in-process.
struct BenchHost {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    conn: Connection,
}

impl BenchHost {
    async fn start(
        data: &Path,
        fake: &FakeProvider,
        opts: &BenchOptions,
        admission: Admission,
    ) -> anyhow::Result<Self> {
        // The caller binds: the port is the listener's, never guessed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let settings = write_config(data, fake, opts)?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (data, shutdown) = (data.to_owned(), shutdown.clone());
            let options = crate::host::ServeOptions {
                review_admission: admission,
                ..crate::host::ServeOptions::on(settings, listener)
            };
            async move { crate::host::serve_with(&data, options, shutdown).await }
        });
        let token = std::fs::read_to_string(data.join("global/owner.token"))?;
        let host = Self {
            shutdown,
            task,
            conn: Connection {
                endpoint: Endpoint::parse_url(&format!("http://127.0.0.1:{port}"))?,
                token: Some(token.trim().to_owned()),
                space: Some("bench-live".into()),
                act_as: None,
                timeout: Duration::from_secs(3600),
            },
        };
        for _ in 0..200 {
            if request(&host.conn, Method::GET, "/api/whoami", None)
                .await
                .is_ok()
            {
                // Warm-up: the space actor, the read pool, the model registry.
                live_round_trips(&host.conn, 10).await?;
                return Ok(host);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        host.stop().await?;
        bail!("the bench host did not start listening")
    }

    /// Stops the host; a scan still running is cancelled with it.
    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(joined) => joined.context("bench host task")?,
            Err(_) => bail!("the bench host did not stop within 30 s"),
        }
    }
}

/// Live round trips with no scan, then with scans running back to back, then
/// (on a fresh host) with no scan again: the baseline is both idle runs, so a
/// machine whose load drifts during the bench does not skew the ratio, and
/// the two idle runs against each other give the noise floor.
async fn phase(
    data: &Path,
    fake: &FakeProvider,
    opts: &BenchOptions,
    admission: Admission,
) -> anyhow::Result<Phase> {
    let host = BenchHost::start(data, fake, opts, admission).await?;
    let loaded = measure(data, fake, &host.conn, opts).await;
    host.stop().await?;
    let m = loaded?;
    let (idle_before, loaded) = (m.idle, m.loaded);
    let host = BenchHost::start(data, fake, opts, admission).await?;
    let idle_after = live_round_trips(&host.conn, opts.live_samples).await;
    host.stop().await?;
    let idle_after = idle_after?;
    let idle: Vec<f64> = idle_before.iter().chain(&idle_after).copied().collect();
    Ok(Phase {
        idle_p99_ms: percentile(&idle, 0.99),
        scan_p99_ms: percentile(&loaded, 0.99),
        idle_p50_ms: percentile(&idle, 0.50),
        scan_p50_ms: percentile(&loaded, 0.50),
        noise_floor: percentile(&idle_after, 0.99) / percentile(&idle_before, 0.99),
        judge_calls: m.judge_calls,
        judge_per_second: m.judge_calls as f64 / m.seconds.max(1e-9),
        live_429: m.live_429,
        judge_429: m.judge_429,
        scans_finished: m.scans_finished,
    })
}

/// One measurement: idle round trips, then round trips while scans run.
struct Measured {
    idle: Vec<f64>,
    loaded: Vec<f64>,
    /// During the loaded part: judge calls, its length, the fake's 429s.
    judge_calls: u64,
    seconds: f64,
    live_429: u64,
    judge_429: u64,
    scans_finished: u64,
}

/// Idle round trips, then round trips while scans run; judge calls and
/// finished scans during the second part.
async fn measure(
    data: &Path,
    fake: &FakeProvider,
    conn: &Connection,
    opts: &BenchOptions,
) -> anyhow::Result<Measured> {
    let idle = live_round_trips(conn, opts.live_samples).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicU64::new(0));
    let scans = tokio::spawn({
        let (conn, stop, finished) = (conn.clone(), stop.clone(), finished.clone());
        async move {
            // Back to back, so a scan is running for the whole measurement.
            while !stop.load(Ordering::Relaxed) {
                match request(&conn, Method::POST, "/api/review/run", None).await {
                    Ok((200, v)) if v["status"] == "done" => {
                        finished.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((st, v)) => {
                        eprintln!("bench: run-now answered {st}: {v}");
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    });
    wait_for_scan(data).await?;
    // Live traffic goes on while the gate finds its level.
    let settle_until = Instant::now() + opts.settle;
    while Instant::now() < settle_until {
        live_round_trips(conn, 10).await?;
    }
    let calls_before = judge_calls(data)?;
    let refused_before = fake.counts().refused;
    let started = Instant::now();
    let loaded = live_round_trips(conn, opts.live_samples).await?;
    let seconds = started.elapsed().as_secs_f64();
    let calls = judge_calls(data)? - calls_before;
    let refused = fake.counts().refused;
    stop.store(true, Ordering::Relaxed);
    scans.abort();
    let delta = |model: &str| {
        refused.get(model).copied().unwrap_or(0) - refused_before.get(model).copied().unwrap_or(0)
    };
    Ok(Measured {
        idle,
        loaded,
        judge_calls: calls.max(0) as u64,
        seconds,
        live_429: delta("live"),
        judge_429: delta("judge"),
        scans_finished: finished.load(Ordering::Relaxed),
    })
}

/// Waits until a review run is recorded as running (the scan has begun).
async fn wait_for_scan(data: &Path) -> anyhow::Result<()> {
    for _ in 0..400 {
        let running = read_db(data, |c| {
            stats::runs_of_kind_with_status(c, "review", "running")
        })?;
        if running > 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("no review scan started within 10 s")
}

fn judge_calls(data: &Path) -> anyhow::Result<i64> {
    read_db(data, |c| stats::usage_rows_of_kind(c, judge::USAGE_KIND))
}

fn read_db<T>(
    data: &Path,
    f: impl FnOnce(&crate::storage::Conn) -> crate::storage::StoreResult<T>,
) -> anyhow::Result<T> {
    let conn = crate::storage::open_read_only_conn(&data.join("state.db"))?;
    Ok(f(&conn)?)
}

/// `n` sequential chat round trips in `bench-live`, in milliseconds.
async fn live_round_trips(conn: &Connection, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let (st, v) = request(
            conn,
            Method::POST,
            "/api/chat",
            Some(json!({"text": format!("ping {i}")})),
        )
        .await?;
        if st != 200 {
            bail!("live chat answered {st}: {v}");
        }
        out.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(out)
}

/// The `p` quantile (nearest rank).
pub(crate) fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Up to `token_sample` redacted exchanges of the seeded spaces.
fn token_sample(db: &Path, opts: &BenchOptions) -> anyhow::Result<Vec<judge::JudgeExchange>> {
    let reader = ExchangeReader::open(db, Window::hours_before(now_ms(), 24))?;
    let spaces: Vec<String> = reader
        .active_spaces()?
        .into_iter()
        .filter(|s| s != "bench-live")
        .collect();
    let ids = reader.identifiers(&spaces)?;
    let mut redactor = Redactor::new(
        RedactionList::new()
            .with_names(ids.names)
            .with_sender_ids(ids.sender_ids),
    )?;
    let mut sample = Vec::new();
    for space in &spaces {
        if sample.len() >= opts.token_sample {
            break;
        }
        for e in reader.read_space(space)?.exchanges {
            sample.push(crate::review::scan::redact_for_judge(&mut redactor, &e));
        }
    }
    sample.truncate(opts.token_sample.max(1));
    if sample.is_empty() {
        bail!("no exchanges to compare tokens on");
    }
    Ok(sample)
}

/// Judge tokens (the scripted estimate, in and out) per exchange when the
/// sample goes to the judge `size` exchanges per call.
async fn tokens_per_exchange(sample: &[judge::JudgeExchange], size: usize) -> anyhow::Result<f64> {
    let provider = ScriptedProvider::parse(
        "bench judge",
        &json!({"rules": [{"purpose": "judge", "reply": "{\"findings\": []}"}]}).to_string(),
    )?;
    let mut total = 0u64;
    for batch in sample.chunks(size.max(1)) {
        let req = judge::build_request("bench", batch, 2048);
        let resp = provider.complete(&req).await?;
        total += resp.usage.input_tokens + resp.usage.output_tokens;
    }
    Ok(total as f64 / sample.len().max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_bench_percentile_is_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.99), 99.0);
        assert_eq!(percentile(&s, 0.50), 50.0);
        assert_eq!(percentile(&[5.0], 0.99), 5.0);
        assert!(percentile(&[], 0.99).is_nan());
    }
}
