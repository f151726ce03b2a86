//! `mercury bench turns`: ingest throughput through the real ingress path,
//! and the orchestration overhead of a turn that calls no tool, each beside
//! a baseline of the same number of plain SQLite inserts.
//!
//! Ingest: each message goes through `ingress::ingest_tx` in one writer
//! transaction, which is what `POST /api/ingress` runs after auth:
//! conversation upsert, auto-created space (and its workspace), the dedupe
//! probe, member row, mute, trigger and rate checks, the message row. One
//! message in ten repeats an earlier platform message id, so the dedupe path
//! is part of the mix. `concurrency` tasks submit at once, as concurrent
//! requests would. HTTP parsing and the token check are not included.
//!
//! Turn overhead: a DM stored through the same path, then its space actor is
//! woken; the time from "stored" to "turn ended" (run row opened and closed,
//! prompt built, model called, usage row, run token revoked, reply row and
//! outbox item committed) is one sample. Turns run one at a time, with a
//! scripted model that answers at once, so the samples are the host's own
//! cost. Warm-up turns (actor start, first prompt) are not counted.
//!
//! With `--storage postgres` both measurements run twice, on SQLite and on
//! throwaway databases of the given PostgreSQL server (each phase and each
//! baseline its own, dropped after), and the figures print side by side.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::task::JoinSet;

use super::{ms, percentile, plain_inserts};
use crate::app::CallerLimits;
use crate::config::SandboxChoice;
use crate::host;
use crate::ids::SpaceId;
use crate::ingress::{self, IngestResult, IngestStatus, IngressMessage};
use crate::storage::baseline::ScratchDatabase;
use crate::storage::tally::{self, Tallied};
use crate::storage::{Location, Store};
use crate::workspace::{ensure_workspace, DataPaths};

/// Turns run and thrown away before the measured ones.
pub(crate) const WARMUP_TURNS: usize = 20;

#[derive(Debug, Clone)]
pub(crate) struct TurnsOptions {
    /// Ingest calls (about one in ten is a replay).
    pub messages: usize,
    /// Measured turns.
    pub turns: usize,
    /// Ingest calls in flight at once.
    pub concurrency: usize,
    /// Conversations the messages are spread over (each gets a space).
    pub conversations: usize,
    /// A PostgreSQL server to measure beside SQLite.
    pub postgres: Option<PostgresServer>,
    /// Tally each phase's statements (`storage::tally`).
    pub statements: bool,
}

/// Where the PostgreSQL half runs: a server whose user may create databases.
#[derive(Debug, Clone)]
pub(crate) struct PostgresServer {
    pub url: String,
    pub password_file: Option<std::path::PathBuf>,
}

impl PostgresServer {
    fn location(&self) -> anyhow::Result<Location> {
        let password = match &self.password_file {
            None => None,
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading --password-file {}", f.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
            ),
        };
        Ok(Location::Postgres {
            url: self.url.clone(),
            password,
        })
    }
}

/// The backend one half of the figures ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl Default for TurnsOptions {
    fn default() -> Self {
        Self {
            messages: 5000,
            turns: 1000,
            concurrency: 16,
            conversations: 100,
            postgres: None,
            statements: false,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct IngestFigures {
    pub messages: usize,
    pub duplicates: usize,
    pub conversations: usize,
    pub concurrency: usize,
    pub elapsed: Duration,
    pub baseline: Duration,
    /// With `--statements`: what the ingest ran, the costliest first.
    pub statements: Vec<Tallied>,
}

impl IngestFigures {
    pub(crate) fn per_second(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    pub(crate) fn baseline_per_second(&self) -> f64 {
        self.messages as f64 / self.baseline.as_secs_f64().max(1e-9)
    }
    pub(crate) fn ratio(&self) -> f64 {
        self.elapsed.as_secs_f64() / self.baseline.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TurnFigures {
    pub turns: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
    pub baseline_p50: Duration,
    pub baseline_p99: Duration,
    /// With `--statements`: what the measured turns ran.
    pub statements: Vec<Tallied>,
}

#[derive(Debug, Clone)]
pub(crate) struct TurnsReport {
    pub backend: Backend,
    pub ingest: IngestFigures,
    pub turns: TurnFigures,
}

/// SQLite's figures, and PostgreSQL's beside them when asked for.
#[derive(Debug, Clone)]
pub(crate) struct TurnsComparison {
    pub sqlite: TurnsReport,
    pub postgres: Option<TurnsReport>,
}

impl fmt::Display for TurnsComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.sqlite)?;
        let Some(pg) = &self.postgres else {
            return Ok(());
        };
        writeln!(f)?;
        writeln!(f)?;
        write!(f, "{pg}")?;
        writeln!(f)?;
        writeln!(f)?;
        let (s, p) = (&self.sqlite, pg);
        writeln!(f, "postgres beside sqlite (the same run, the same machine)")?;
        writeln!(
            f,
            "        ingest          {:>9.0} msg/s beside {:>9.0} msg/s  ratio {:.2}x the messages per second",
            p.ingest.per_second(),
            s.ingest.per_second(),
            p.ingest.per_second() / s.ingest.per_second().max(1e-9)
        )?;
        writeln!(
            f,
            "        turn overhead   p50 {} beside {}  ratio {:.2}x",
            ms(p.turns.p50),
            ms(s.turns.p50),
            ratio(p.turns.p50, s.turns.p50)
        )?;
        write!(
            f,
            "                        p99 {} beside {}  ratio {:.2}x",
            ms(p.turns.p99),
            ms(s.turns.p99),
            ratio(p.turns.p99, s.turns.p99)
        )
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

impl fmt::Display for TurnsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let build = if cfg!(debug_assertions) {
            "debug build (unoptimised: build with --release for real figures)"
        } else {
            "release build"
        };
        let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
        let (i, t) = (&self.ingest, &self.turns);
        writeln!(
            f,
            "mercury bench turns: {build}, {cpus} CPUs, storage {}",
            self.backend.name()
        )?;
        let base = match self.backend {
            Backend::Sqlite => "same file settings",
            Backend::Postgres => "a table on the same server",
        };
        writeln!(
            f,
            "ingest  {} messages ({} replays) over {} conversations, {} at a time",
            i.messages, i.duplicates, i.conversations, i.concurrency
        )?;
        writeln!(
            f,
            "        ingress path    {:>8.3} s  {:>9.0} msg/s",
            i.elapsed.as_secs_f64(),
            i.per_second()
        )?;
        writeln!(
            f,
            "        plain inserts   {:>8.3} s  {:>9.0} msg/s  ({} one-row transactions, {base})",
            i.baseline.as_secs_f64(),
            i.baseline_per_second(),
            i.messages
        )?;
        writeln!(
            f,
            "        ratio           {:.2}x the plain inserts' time",
            i.ratio()
        )?;
        writeln!(
            f,
            "turns   {} no-tool turns one at a time (scripted model, 0 ms), after {WARMUP_TURNS} warm-up turns",
            t.turns
        )?;
        writeln!(
            f,
            "        overhead        p50 {}  p99 {}  mean {}",
            ms(t.p50),
            ms(t.p99),
            ms(t.mean)
        )?;
        writeln!(
            f,
            "        plain insert    p50 {}  p99 {}  ({} one-row transactions)",
            ms(t.baseline_p50),
            ms(t.baseline_p99),
            t.turns
        )?;
        writeln!(
            f,
            "        ratio           p50 {:.1}x  p99 {:.1}x",
            ratio(t.p50, t.baseline_p50),
            ratio(t.p99, t.baseline_p99)
        )?;
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        write!(
            f,
            "targets ingest >= 5000 msg/s: {} ({:.0} msg/s); p50 overhead <= 1 ms: {} ({})",
            met(i.per_second() >= 5000.0),
            i.per_second(),
            met(t.p50 <= Duration::from_millis(1)),
            ms(t.p50)
        )?;
        write_statements(f, "ingest", "message", i.messages, &i.statements)?;
        write_statements(f, "turns", "turn", t.turns, &t.statements)
    }
}

/// A phase's statements (`--statements`): per unit of work, how many of
/// each and their mean time, the costliest first.
pub(super) fn write_statements(
    f: &mut fmt::Formatter<'_>,
    phase: &str,
    unit: &str,
    units: usize,
    statements: &[Tallied],
) -> fmt::Result {
    if statements.is_empty() {
        return Ok(());
    }
    let per = |n: u64| n as f64 / units.max(1) as f64;
    let (handoffs, statements): (Vec<&Tallied>, Vec<&Tallied>) = statements
        .iter()
        .partition(|s| s.sql == tally::READ_HANDOFF || s.sql == tally::WRITE_HANDOFF);
    let count: u64 = statements.iter().map(|s| s.count).sum();
    let total: Duration = statements.iter().map(|s| s.total).sum();
    writeln!(f)?;
    writeln!(
        f,
        "statements of {phase}: {:.1} per {unit}, {} per {unit} inside them (counted; counting adds its own cost)",
        per(count),
        ms(total / u32::try_from(units.max(1)).unwrap_or(u32::MAX))
    )?;
    for h in &handoffs {
        let mean = h.total / u32::try_from(h.count.max(1)).unwrap_or(u32::MAX);
        writeln!(
            f,
            "   {:>11.2} {:>9}          {}",
            per(h.count),
            ms(mean),
            h.sql
        )?;
    }
    writeln!(f, "   per {unit:<7} mean       share  statement")?;
    for s in statements {
        let mean = s.total / u32::try_from(s.count.max(1)).unwrap_or(u32::MAX);
        let share = s.total.as_secs_f64() / total.as_secs_f64().max(1e-12) * 100.0;
        let mut sql = s.sql.clone();
        if sql.len() > 100 {
            let cut = (0..=100)
                .rev()
                .find(|&i| sql.is_char_boundary(i))
                .unwrap_or(0);
            sql.truncate(cut);
            sql.push('…');
        }
        writeln!(
            f,
            "   {:>11.2} {:>9} {:>6.1}%  {sql}",
            per(s.count),
            ms(mean),
            share
        )?;
    }
    Ok(())
}

/// Runs both measurements in a temp dir (and, when asked, again on
/// PostgreSQL) and returns the figures.
pub(crate) async fn run(opts: &TurnsOptions) -> anyhow::Result<TurnsComparison> {
    if opts.messages == 0 || opts.turns == 0 || opts.concurrency == 0 || opts.conversations == 0 {
        bail!("--messages, --turns, --concurrency and --conversations must be at least 1");
    }
    let dir = tempfile::Builder::new()
        .prefix("mercury-bench-")
        .tempdir()
        .context("creating a temp dir")?;
    let sqlite = TurnsReport {
        backend: Backend::Sqlite,
        ingest: ingest_phase(dir.path(), opts, None).await?,
        turns: turn_phase(dir.path(), opts, None).await?,
    };
    let postgres = match &opts.postgres {
        None => None,
        Some(server) => Some(TurnsReport {
            backend: Backend::Postgres,
            ingest: ingest_phase(dir.path(), opts, Some(server)).await?,
            turns: turn_phase(dir.path(), opts, Some(server)).await?,
        }),
    };
    Ok(TurnsComparison { sqlite, postgres })
}

/// A new data dir for the phase `label` under `dir` (its rows on a scratch
/// database of `server` when given, dropped when the returned handle goes):
/// where it is, and that handle.
async fn fresh_host(
    dir: &Path,
    server: Option<&PostgresServer>,
    label: &'static str,
) -> anyhow::Result<(std::path::PathBuf, Option<ScratchDatabase>)> {
    let backend = if server.is_some() {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    let data = dir.join(format!("{label}-{}", backend.name()));
    let scratch = match server {
        None => None,
        Some(server) => {
            let at = server.location()?;
            Some(
                tokio::task::spawn_blocking(move || ScratchDatabase::create(&at, label))
                    .await
                    .context("the scratch database task panicked")??,
            )
        }
    };
    let init = match &scratch {
        Some(ScratchDatabase {
            location: Location::Postgres { url, .. },
            ..
        }) => Some(host::InitPostgres {
            url: url.clone(),
            password_file: server.and_then(|s| s.password_file.clone()),
        }),
        _ => None,
    };
    host::init_with(&data, "owner", init.as_ref()).await?;
    Ok((data, scratch))
}

/// The plain-insert baseline on the half's own backend.
async fn baseline(
    dir: &Path,
    name: &str,
    n: usize,
    server: Option<&PostgresServer>,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    match server {
        None => {
            let path = dir.join(format!("{name}.db"));
            tokio::task::spawn_blocking(move || plain_inserts(&path, n))
                .await
                .context("the baseline task panicked")?
        }
        Some(server) => {
            let at = server.location()?;
            tokio::task::spawn_blocking(move || {
                let db = ScratchDatabase::create(&at, "plain")?;
                Ok(crate::storage::baseline::plain_inserts_postgres(
                    &db.location,
                    n,
                )?)
            })
            .await
            .context("the baseline task panicked")?
        }
    }
}

/// The ingress path, as `Host::ingest` runs it before waking the space.
async fn store_inbound(
    store: &Store,
    paths: &DataPaths,
    settings: &Arc<crate::config::Settings>,
    limits: &Arc<CallerLimits>,
    m: IngressMessage,
) -> anyhow::Result<IngestResult> {
    let (s, l) = (settings.clone(), limits.clone());
    let res = store
        .write(move |tx| {
            ingress::ingest_tx(
                tx,
                &s,
                &crate::runtime::Outbound::Live,
                &l,
                &m,
                ingress::Origin::Adapter,
            )
        })
        .await?;
    if let (true, Some(space)) = (res.created_space, &res.space_id) {
        ensure_workspace(paths, &SpaceId::parse(space)?)?;
    }
    Ok(res)
}

fn message(conversation: String, sender: String, n: usize) -> IngressMessage {
    IngressMessage {
        platform: "bench".into(),
        conversation,
        sender_id: sender,
        sender_name: Some("Bench".into()),
        text: format!("message {n}"),
        message_id: format!("m-{n}"),
        is_group: false,
        mentions_bot: false,
        reply_to_bot: false,
        title: None,
    }
}

async fn ingest_phase(
    dir: &Path,
    opts: &TurnsOptions,
    server: Option<&PostgresServer>,
) -> anyhow::Result<IngestFigures> {
    let (data, _scratch) = fresh_host(dir, server, "ingest").await?;
    let paths = DataPaths::new(&data);
    let mut settings = host::load_settings(&paths)?;
    // The bench's senders are strangers to a fresh data dir: `open` lets them
    // in, so the path measured is the one a bot's own users take.
    settings.ingress.dm_policy = crate::config::DmPolicy::Open;
    let store = Store::open_at(&host::store_location(&settings, &paths)?)?;
    let settings = Arc::new(settings);
    // No caller is limited here: the limiter's check is measured, its "no" is not.
    let limits = Arc::new(CallerLimits::new(u32::MAX));
    let mut lanes: Vec<Vec<IngressMessage>> = vec![Vec::new(); opts.concurrency];
    for i in 0..opts.messages {
        // Every tenth call repeats the platform id of a message five before it.
        let n = if i % 10 == 9 { i - 5 } else { i };
        let c = n % opts.conversations;
        lanes[i % opts.concurrency].push(message(format!("conv-{c}"), format!("user-{c}"), n));
    }
    if opts.statements {
        tally::start();
    }
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for lane in lanes {
        let (store, paths, settings, limits) = (
            store.clone(),
            paths.clone(),
            settings.clone(),
            limits.clone(),
        );
        tasks.spawn(async move {
            let mut duplicates = 0;
            for m in lane {
                let res = store_inbound(&store, &paths, &settings, &limits, m).await?;
                match res.status {
                    IngestStatus::Duplicate => duplicates += 1,
                    IngestStatus::Queued => {}
                    other => bail!("a bench message was {}, not queued", other.as_str()),
                }
            }
            Ok::<usize, anyhow::Error>(duplicates)
        });
    }
    let mut duplicates = 0;
    while let Some(r) = tasks.join_next().await {
        duplicates += r.context("an ingest task panicked")??;
    }
    let elapsed = start.elapsed();
    let statements = if opts.statements {
        tally::stop()
    } else {
        Vec::new()
    };
    drop(store);
    let (baseline, _) = baseline(dir, "plain-ingest", opts.messages, server).await?;
    Ok(IngestFigures {
        messages: opts.messages,
        duplicates,
        conversations: opts.conversations,
        concurrency: opts.concurrency,
        elapsed,
        baseline,
        statements,
    })
}

async fn turn_phase(
    dir: &Path,
    opts: &TurnsOptions,
    server: Option<&PostgresServer>,
) -> anyhow::Result<TurnFigures> {
    let (data, _scratch) = fresh_host(dir, server, "turns").await?;
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"rules": [{"purpose": "turn", "reply": "ok"}]}"#)
        .context("writing the bench model")?;
    let paths = DataPaths::new(&std::fs::canonicalize(&data)?);
    let mut settings = host::load_settings(&paths)?;
    settings.model = format!("scripted:{}", model.display());
    // No tool is called, so no sandbox starts; `process` avoids probing Docker.
    settings.sandbox.backend = SandboxChoice::Process;
    settings.ingress.per_caller_per_minute = u32::MAX;
    settings.ingress.dm_policy = crate::config::DmPolicy::Open;
    settings.validate()?;
    let store = Store::open_at(&host::store_location(&settings, &paths)?)?;
    let rt = host::build_runtime(
        &paths,
        settings,
        store,
        crate::model::gate::Admission::Gated,
    )
    .await?;
    let (supervisor, sup_handle, spaces, _review) = host::start_actors(&rt).await?;
    let limits = Arc::new(CallerLimits::new(u32::MAX));
    let total = WARMUP_TURNS + opts.turns;
    let mut samples = Vec::with_capacity(opts.turns);
    for n in 0..total {
        if n == WARMUP_TURNS && opts.statements {
            tally::start();
        }
        let m = message("bench-dm".into(), "bench-user".into(), n);
        let (s, l, rt2) = (rt.settings.clone(), limits.clone(), rt.clone());
        // The waiter is registered inside the storing transaction, so a turn
        // that starts before `wake` (the actor looks for pending work after
        // each turn) cannot end unseen.
        let (res, done) = rt
            .store
            .write(move |tx| {
                let res =
                    ingress::ingest_tx(tx, &s, &rt2.outbound, &l, &m, ingress::Origin::Adapter)?;
                let done = res.message_id.map(|id| rt2.waiters.register(id));
                Ok((res, done))
            })
            .await?;
        let stored = Instant::now();
        let (Some(space), Some(done), IngestStatus::Queued) = (&res.space_id, done, res.status)
        else {
            bail!("bench turn {n} was not queued ({})", res.status.as_str());
        };
        let id = SpaceId::parse(space)?;
        if res.created_space {
            ensure_workspace(&paths, &id)?;
        }
        spaces.wake(&id).await?;
        tokio::time::timeout(Duration::from_secs(60), done)
            .await
            .with_context(|| format!("bench turn {n} did not end within 60 s"))?
            .with_context(|| format!("bench turn {n}: the host dropped its waiter"))?;
        if n >= WARMUP_TURNS {
            samples.push(stored.elapsed());
        }
    }
    let statements = if opts.statements {
        tally::stop()
    } else {
        Vec::new()
    };
    let done: i64 = rt
        .store
        .read(|c| crate::storage::stats::runs_with_status(c, "done"))
        .await?;
    supervisor.stop(Some("bench finished".into()));
    let _ = tokio::time::timeout(Duration::from_secs(5), sup_handle).await;
    if done != total as i64 {
        bail!("only {done} of {total} bench turns ended done; the figures would measure failures");
    }
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    drop(rt);
    let (_, mut base) = baseline(dir, "plain-turns", opts.turns, server).await?;
    base.sort();
    Ok(TurnFigures {
        turns: opts.turns,
        p50: percentile(&samples, 50.0),
        p99: percentile(&samples, 99.0),
        mean,
        baseline_p50: percentile(&base, 50.0),
        baseline_p99: percentile(&base, 99.0),
        statements,
    })
}
