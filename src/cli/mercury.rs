//! The `mercury` command line: `init`, `serve`, `demo`, `image build`,
//! `bench turns|sandbox|links|ask|review|review-quality|adapters|scale|…`,
//! `review redact|gate|intake|approve|rehearse`. Data goes to stdout,
//! diagnostics to stderr.
//!
//! Exit codes: 0 success, 1 failure while running, 2 usage or refusal
//! (e.g. `init` on an existing data dir), 3 `review gate` found identifiers
//! or `status` found no host running (see `cli::ops` for status and doctor).
//!
//! The log goes to stderr: `MERCURY_LOG` is its filter (default `info`; `warn` for `bench`),
//! `log.format` (`MERCURY_LOG_FORMAT`) text or json; colour only on a terminal.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "mercury",
    version,
    about = "Self-hosted chat-bot agent orchestrator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a data dir: mercury.yaml, state.db, spaces/, global/ and the owner's token.
    Init {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// Caller id of the owner (a global admin).
        #[arg(long, default_value = "owner")]
        owner: String,
        /// Keep the rows in this empty PostgreSQL database instead of the
        /// data dir's state.db (postgres://USER@HOST:5432/DB?sslmode=require).
        #[arg(long)]
        storage_url: Option<String>,
        /// A file holding the PostgreSQL password (kept out of the URL).
        #[arg(long, requires = "storage_url")]
        storage_password_file: Option<PathBuf>,
    },
    /// Run the host (exit 2 if another host holds the data dir's lock).
    Serve {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// ADDR:PORT to listen on (overrides `bind` in mercury.yaml).
        #[arg(long)]
        bind: Option<String>,
    },
    /// A first run, question by question: provider, base URL, model, key (a
    /// test call), a Telegram bot and its owner, the systemd unit. Every
    /// answer can be a flag instead (--yes asks nothing; exit 2 bad input,
    /// 1 the test call failed and nothing was written).
    Onboard(crate::cli::onboard::OnboardArgs),
    /// Archive a data dir while its host serves: the database (one
    /// consistent copy), workspaces, model files, review reports and
    /// mercury.yaml, secrets left out unless --with-secrets (exit 2 refused).
    Backup {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// The archive to write (a new file, 0600; never overwritten).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
        /// Keep the API tokens, dashboard sign-ins and global/owner.token.
        #[arg(long)]
        with_secrets: bool,
    },
    /// Make a new data dir from a `mercury backup` archive (a backup without
    /// secrets gets a new owner token; exit 2 refused).
    Restore {
        /// The archive `mercury backup` wrote.
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
        /// The data dir to make: new, or an empty directory.
        #[arg(long, env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Is the host running? Version, uptime, model, spaces, queue, turns, adapters,
    /// next review, spend, failed runs (exit 0 running, 3 not running, 4 an
    /// enabled adapter disconnected, 2 usage, 1 error).
    Status {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// Print the host's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check what a host needs: config, Docker engine, image, bubblewrap,
    /// model keys, a real turn layer seen by the sandbox, data-dir modes, free disk
    /// (exit 0 fine, 1 a check failed, 2 usage).
    Doctor {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Run a short scripted conversation against a real host on a temp data dir.
    Demo {
        /// Keep the temp data dir and print its path.
        #[arg(long)]
        keep: bool,
    },
    /// The agent image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Benchmarks: a product path beside its baseline, medians and ratio.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Conversation review tools.
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// The store: status, and moving a data dir up to PostgreSQL (docs/storage.md).
    Storage {
        #[command(subcommand)]
        command: crate::cli::storage::StorageCommand,
    },
    /// Many hosts on one database: who holds what (docs/scale-out.md).
    Cluster {
        #[command(subcommand)]
        command: crate::cli::cluster::ClusterCommand,
    },
    /// Extensions: install, list and remove them (docs/extensions.md).
    Ext {
        #[command(subcommand)]
        command: crate::cli::ext::ExtCommand,
    },
    /// The rehearsal bench: a shadow copy of a live bot (docs/shadow.md).
    Shadow {
        #[command(subcommand)]
        command: crate::cli::shadow::ShadowCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Build the agent image (FROM scratch: the host's dash, coreutils, grep, sed, find,
    /// hostname and mrctl; see docs/sandbox.md) through the Docker engine, or on every
    /// engine of a data dir's `sandbox.docker.hosts`.
    Build {
        /// The mrctl binary to put in the image (default: the one beside this binary).
        #[arg(long)]
        mrctl: Option<PathBuf>,
        /// Build on every engine this data dir's config names (each must answer);
        /// without it, the local engine.
        #[arg(long, env = "MERCURY_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The review pipeline's recall and precision on the planted-finding set
    /// (tests/review-quality) with its scripted judge.
    ReviewQuality,
    /// Ingest throughput and per-turn orchestration overhead, beside plain SQLite inserts.
    Turns {
        /// Ingest calls to make (about one in ten is a replay).
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// No-tool turns to measure (after 20 warm-up turns).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        turns: u64,
        /// Ingest calls in flight at once.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
        concurrency: u64,
        /// Conversations (each its own space) the messages are spread over.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        conversations: u64,
        /// `postgres`: measure on PostgreSQL too, beside SQLite, on throwaway
        /// databases of the server --postgres-url names.
        #[arg(long, default_value = "sqlite", value_parser = ["sqlite", "postgres"])]
        storage: String,
        /// A PostgreSQL server whose user may create databases
        /// (postgres://USER@HOST:5432/postgres); with --storage postgres.
        #[arg(long, env = "MERCURY_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// A file holding that server's password.
        #[arg(long)]
        password_file: Option<PathBuf>,
        /// Also print each phase's statements: how many per message (or
        /// turn) and the time in each (counting adds its own cost: the
        /// phase's other figures are then not comparable with a plain run).
        #[arg(long)]
        statements: bool,
    },
    /// Container create to first exec answered (bollard) beside `docker run --rm IMAGE true`.
    Sandbox {
        /// Measured runs of each path (after one warm-up run).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
        runs: u16,
    },
    /// An extension's MCP tool call (mcp-server-time over stdio, cold and warm) beside a `shell` call, in one sandbox session.
    Ext {
        /// Measured calls of each kind (after one warm-up).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
        runs: u16,
        /// The sandbox backend the turn and its server run under.
        #[arg(long, value_enum, default_value = "bubblewrap")]
        backend: crate::bench::ext::ExtBackend,
        /// docker: the server's runtime image (`mercury ext image`, docs/extensions.md).
        #[arg(long, default_value = "mercury-ext-time:2026.10.19")]
        image: String,
    },
    /// Messages/s taken in through the Telegram adapter (against a local fake Bot API) beside ingress alone.
    Adapters {
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        messages: u64,
        /// Group chats the messages are spread over.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        chats: u64,
    },
    /// The dashboard's pages (/ui/), p50/p99, at 10,000 spaces and 1,000,000 messages.
    Ui {
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        spaces: u64,
        #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
        messages: u64,
        /// Requests per page.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        requests: u64,
    },
    /// A 10,000-space, 1,000,000-message store: `messages recent` direct and
    /// through a link, idle RSS, and waves of spaces woken at once.
    Scale {
        #[arg(long, default_value_t = 10_000)]
        spaces: usize,
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
        /// Spaces woken at once per wave (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [1_000, 3_000, 10_000])]
        waves: Vec<usize>,
    },
    /// Messages a second and the answer's p99 with 1, 2 and 3 hosts on one
    /// PostgreSQL database (docs/scale-out.md).
    Cluster {
        /// An empty PostgreSQL database: postgres://USER@HOST:5432/DB.
        #[arg(long)]
        storage_url: String,
        /// Host counts, one run each (the first is the baseline).
        #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3], value_parser = clap::value_parser!(u64).range(1..=8))]
        hosts: Vec<u64>,
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        spaces: u64,
        /// Messages per space and run.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000))]
        per_space: u64,
        /// The scripted model's fixed latency (ms).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=60_000))]
        latency_ms: u64,
        /// Posts in flight at once.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4_096))]
        concurrency: u64,
    },
    /// The same read routes direct and through a space link (act-as), side by side.
    Links {
        /// Requests per route and side.
        #[arg(long, default_value_t = 400)]
        requests: usize,
        /// Also print each route's statements and hand-offs per request, direct and act-as
        /// (counting adds its own cost: the figures are then not comparable with a plain run)
        #[arg(long)]
        statements: bool,
    },
    /// `ask` start (workspace copy + container ready) on a 100 MB / 10,000-file workspace beside `cp -a`.
    Ask {
        #[arg(long, default_value_t = 10_000)]
        files: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// `mercury shadow snapshot` of a generated data dir beside `cp -a` of it.
    /// Default: 100,000 messages over 100 spaces (~170 MB); `--full` is the
    /// issue's 1M messages over 1,000 spaces (~1 GB).
    Shadow {
        #[arg(long)]
        full: bool,
        #[arg(long)]
        messages: Option<usize>,
        #[arg(long)]
        spaces: Option<usize>,
        /// Snapshot / `cp -a` pairs, interleaved; the median pair is the figure.
        #[arg(long, default_value_t = crate::bench::shadow::DEFAULT_PAIRS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=50))]
        pairs: usize,
    },
    /// Live reply p99 while a review scan runs, against no scan, with the
    /// model gate's limiter and pool on and off; judge tokens per exchange,
    /// batched against one per call.
    Review {
        #[arg(long, default_value_t = 10_000)]
        exchanges: usize,
        #[arg(long, default_value_t = 100)]
        spaces: usize,
        /// Live replies per measurement.
        #[arg(long, default_value_t = 300)]
        live_samples: usize,
        #[arg(long, default_value_t = 20)]
        live_latency_ms: u64,
        #[arg(long, default_value_t = 20)]
        judge_latency_ms: u64,
        /// Defaults: the review.* defaults of mercury.yaml.
        #[arg(long)]
        batch_size: Option<u32>,
        #[arg(long)]
        max_concurrency: Option<u32>,
        #[arg(long)]
        calls_per_minute: Option<u32>,
        /// The fake provider's budget, shared by live and judge calls: requests a minute.
        #[arg(long, default_value_t = 3600)]
        provider_rpm: u64,
        /// …and tokens a minute (0: no token limit).
        #[arg(long, default_value_t = 0)]
        provider_tpm: u64,
    },
}

#[derive(Subcommand, Debug)]
enum ReviewCommand {
    /// Redact identifiers from stdin, line by line, to stdout.
    Redact {
        /// A name to redact (whole, first name, surname parts); repeatable.
        #[arg(long = "name")]
        names: Vec<String>,
        /// A file of names, one per line.
        #[arg(long)]
        names_file: Option<PathBuf>,
    },
    /// Exit 0 if stdin holds no identifier, 3 (naming the kinds) if it does.
    Gate {
        #[arg(long = "name")]
        names: Vec<String>,
        #[arg(long)]
        names_file: Option<PathBuf>,
    },
    /// Pull the daily reports of each bot, re-gate them, and triage their
    /// findings into `<intake_dir>/triage.md` (nothing is applied).
    Intake {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// `[NAME=]DATA_DIR` or `[NAME=]http://HOST:PORT` (repeatable; default: this data dir).
        #[arg(long = "from")]
        from: Vec<String>,
        /// Only reports of this date (YYYY-MM-DD) or later.
        #[arg(long)]
        since: Option<String>,
        /// The review.read token for URL sources (default: MERCURY_INTAKE_TOKEN).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Apply the approved rows of the pending triage; every row goes to ledger.json.
    Approve {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// Approve every row as proposed.
        #[arg(long)]
        all: bool,
        /// Approve these rows as proposed, e.g. 1,3.
        #[arg(long)]
        rows: Option<String>,
        /// Approve a row with another decision, e.g. 2=new (repeatable).
        #[arg(long = "set")]
        sets: Vec<String>,
        /// Who approves (recorded in the ledger).
        #[arg(long, default_value = "owner")]
        by: String,
    },
    /// Replay a triage row's flagged message in shadows of the live bot,
    /// three times as it is and three with the row's drafted change, and
    /// attach the judge's verdicts to the row (the live bot is not touched).
    Rehearse {
        /// The triage row, as `approve --rows` names it.
        row: usize,
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// The shadow root (default: $HOME/mercury-shadow).
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
}

pub fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    // `serve` reads its config once, before logging starts: every log line
    // of a shadow host carries `shadow=1` and the log has its format from
    // the first line (an unreadable config is reported by `serve` itself).
    let settings = match &cli.command {
        Command::Serve { data_dir, .. } => Some(crate::host::settings_of(data_dir)),
        _ => None,
    };
    let loaded = settings.as_ref().and_then(|r| r.as_ref().ok());
    // A bench's hosts log at `warn` unless MERCURY_LOG says otherwise: a
    // line per request (or per turn) would bury the figures it prints.
    let default_filter = if matches!(cli.command, Command::Bench { .. }) {
        "warn"
    } else {
        "info,ractor=warn"
    };
    init_tracing(
        log_format(loaded),
        loaded.is_some_and(|s| s.shadow),
        default_filter,
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mercury: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli, settings))
}

/// What `mercury init` prints after it made the data dir: the commands of
/// the README's quick start, for this data dir.
fn init_next_steps(data_dir: &std::path::Path) -> String {
    let d = data_dir.display();
    format!(
        "\nnext steps:\n\
         \x20 1. a model key: export MERCURY_OPENAI_API_KEY=sk-... (or MERCURY_ANTHROPIC_API_KEY; \
         docs/models.md)\n\
         \x20 2. start the host: mercury serve --data-dir {d}\n\
         \x20 3. in another shell: export MERCURY_DATA_DIR={d}\n\
         \x20    mrctl spaces create family --name Family\n\
         \x20    mrctl --in family chat hello\n\
         \x20 4. check it: mercury doctor --data-dir {d}; mercury status --data-dir {d}\n\
         \x20 chat platforms (Telegram, Discord, ...): docs/adapters.md\n"
    )
}

/// The exit status when stdout was closed under us (`mercury shadow diff
/// --json | head`): 128 + SIGPIPE, what a C tool killed by the signal gives.
pub const EXIT_CLOSED_STDOUT: i32 = 141;

/// `println!` panics when stdout is a closed pipe (the process ignores
/// SIGPIPE, as Rust programs do, so a host's sockets never kill it). Every
/// command's output goes through `println!`, so the one place to make a
/// closed stdout a quiet exit instead of a panic message is the panic hook;
/// every other panic is reported as before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(EXIT_CLOSED_STDOUT);
        }
        report(info);
    }));
}

/// `log.format` of the config `serve` runs with; for other commands,
/// `MERCURY_LOG_FORMAT`.
fn log_format(serve: Option<&crate::config::Settings>) -> crate::config::LogFormat {
    match serve {
        Some(s) => s.log.format,
        None => match std::env::var("MERCURY_LOG_FORMAT").as_deref() {
            Ok("json") => crate::config::LogFormat::Json,
            _ => crate::config::LogFormat::Text,
        },
    }
}

fn init_tracing(format: crate::config::LogFormat, shadow: bool, default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("MERCURY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // The secrets of this process's environment are scrubbed from the first
    // line on; a host adds the ones it reads elsewhere (key files) itself.
    for (name, value) in crate::config::process_env() {
        if is_secret_var(&name) {
            crate::redaction::secrets::register(&value);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| ScrubbedStderr);
    // Escape codes only for a person at a terminal, never in a journal or a file.
    let ansi = std::io::stderr().is_terminal();
    let _ = match (format, shadow) {
        // A shadow host's every log line starts with `shadow=1` (issue 14), so
        // its log is always text: a prefix would break a JSON line.
        (_, true) => builder
            .with_ansi(ansi)
            .event_format(ShadowTag(tracing_subscriber::fmt::format().with_ansi(ansi)))
            .try_init(),
        (crate::config::LogFormat::Json, false) => builder.json().with_ansi(false).try_init(),
        (crate::config::LogFormat::Text, false) => builder.with_ansi(ansi).try_init(),
    };
}

/// A `MERCURY_*` variable holding a credential: a model key (live or a
/// shadow's own) or an adapter's token.
fn is_secret_var(name: &str) -> bool {
    name.ends_with("_API_KEY") || name.ends_with("_BOT_TOKEN") || name.ends_with("_SECRET")
}

/// The log's stderr: every event is formatted into one buffer and written
/// with one `write_all`, so each write is scrubbed whole
/// ([`crate::redaction::secrets::scrub`]).
struct ScrubbedStderr;

impl std::io::Write for ScrubbedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(crate::redaction::secrets::scrub(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Prefixes every event line with `shadow=1`.
struct ShadowTag<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for ShadowTag<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "shadow=1 ")?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Runs `cli`; `settings` is `serve`'s config, read once by [`main`].
async fn run(cli: Cli, settings: Option<anyhow::Result<crate::config::Settings>>) -> ExitCode {
    match cli.command {
        Command::Init {
            data_dir,
            owner,
            storage_url,
            storage_password_file,
        } => match crate::host::init_with(
            &data_dir,
            &owner,
            storage_url
                .map(|url| crate::host::InitPostgres {
                    url,
                    password_file: storage_password_file,
                })
                .as_ref(),
        )
        .await
        {
            Ok(token) => {
                println!("initialised {}", data_dir.display());
                println!("owner token written to {} (mode 0600)", token.display());
                print!("{}", init_next_steps(&data_dir));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury init: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Serve { data_dir, bind } => {
            let token = CancellationToken::new();
            crate::host::cancel_on_signals(token.clone());
            let settings = settings.unwrap_or_else(|| crate::host::settings_of(&data_dir));
            match crate::host::serve(&data_dir, settings, bind, token).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mercury serve: {}{e:#}", crate::host::log_tag());
                    // Another host holds the data dir, or the shadow guard
                    // refused it: a usage error, not a crash.
                    let locked = matches!(
                        e.downcast_ref::<crate::workspace::data_dir::DataDirError>(),
                        Some(crate::workspace::data_dir::DataDirError::Locked { .. })
                    );
                    let refused = matches!(
                        e.downcast_ref::<crate::shadow::ShadowError>(),
                        Some(crate::shadow::ShadowError::Refused(_))
                    );
                    ExitCode::from(if locked || refused { 2 } else { 1 })
                }
            }
        }
        Command::Status { data_dir, json } => crate::cli::ops::status(&data_dir, json).await,
        Command::Onboard(args) => crate::cli::onboard::run(args).await,
        Command::Backup {
            data_dir,
            to,
            with_secrets,
        } => {
            let run = tokio::task::spawn_blocking(move || {
                crate::host::backup::backup(&data_dir, &to, with_secrets)
            })
            .await;
            match run {
                Ok(Ok(r)) => {
                    println!(
                        "backed up to {} ({} bytes; {})",
                        r.file.display(),
                        r.bytes,
                        if r.with_secrets {
                            "with its secrets: keep it as safe as the data dir"
                        } else {
                            "without secrets: a restore mints a new owner token"
                        }
                    );
                    ExitCode::SUCCESS
                }
                Ok(Err(e)) => backup_exit("backup", &e),
                Err(e) => {
                    eprintln!("mercury backup: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Restore { from, data_dir } => {
            match crate::host::backup::restore(&from, &data_dir).await {
                Ok(r) => {
                    println!(
                        "restored {} spaces into {} (backup of {}, {}){}",
                        r.spaces,
                        r.data_dir.display(),
                        r.backup.source_data_dir,
                        r.backup.created_at,
                        if r.new_owner_token {
                            "; a new owner token is in global/owner.token"
                        } else {
                            ""
                        }
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => backup_exit("restore", &e),
            }
        }
        Command::Doctor { data_dir } => crate::cli::ops::doctor(&data_dir).await,
        Command::Demo { keep } => match crate::host::demo::run(keep).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mercury demo: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Image {
            command: ImageCommand::Build { mrctl, data_dir },
        } => match crate::host::containers::build_image_cli(mrctl, data_dir.as_deref()).await {
            Ok(tag) => {
                println!("{tag}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury image build: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Bench {
            command:
                BenchCommand::Ext {
                    runs,
                    backend,
                    image,
                },
        } => match crate::bench::ext::run(usize::from(runs), backend, &image).await {
            Ok(figures) => {
                print!("{}", crate::bench::ext::report(&figures));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury bench ext: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Bench {
            command: BenchCommand::Sandbox { runs },
        } => match crate::bench::sandbox::run(usize::from(runs)).await {
            Ok(figures) => {
                print!("{}", crate::bench::sandbox::report(&figures));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury bench sandbox: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Bench {
            command: BenchCommand::Adapters { messages, chats },
        } => {
            let opts = crate::bench::adapters::AdaptersOptions {
                messages: usize::try_from(messages).unwrap_or(usize::MAX),
                chats: usize::try_from(chats).unwrap_or(usize::MAX),
            };
            match crate::bench::adapters::run(&opts).await {
                Ok(figs) => {
                    crate::bench::adapters::print(&figs);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench adapters: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command:
                BenchCommand::Ui {
                    spaces,
                    messages,
                    requests,
                },
        } => {
            let opts = crate::bench::ui::UiBenchOptions {
                spaces: spaces as usize,
                messages: messages as usize,
                requests: requests as usize,
            };
            match crate::bench::ui::run(&opts).await {
                Ok((seeded, figs)) => {
                    crate::bench::ui::print(&opts, seeded, &figs);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench ui: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command:
                BenchCommand::Scale {
                    spaces,
                    messages,
                    waves,
                },
        } => {
            let opts = crate::bench::scale::ScaleOptions {
                spaces,
                messages,
                waves,
                ..Default::default()
            };
            match crate::bench::scale::run(&opts).await {
                Ok(r) => {
                    crate::bench::scale::print(&r);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench scale: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command:
                BenchCommand::Cluster {
                    storage_url,
                    hosts,
                    spaces,
                    per_space,
                    latency_ms,
                    concurrency,
                },
        } => {
            let as_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
            let opts = crate::bench::cluster::ClusterOptions {
                url: storage_url,
                hosts: hosts.into_iter().map(as_usize).collect(),
                spaces: as_usize(spaces),
                per_space: as_usize(per_space),
                latency_ms,
                concurrency: as_usize(concurrency),
            };
            match crate::bench::cluster::run(&opts).await {
                Ok(r) => {
                    crate::bench::cluster::print(&r);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench cluster: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command:
                BenchCommand::Links {
                    requests,
                    statements,
                },
        } => {
            let opts = crate::bench::links::LinksOptions {
                requests,
                statements,
                ..Default::default()
            };
            match crate::bench::links::run(&opts).await {
                Ok(figs) => {
                    crate::bench::links::print(&figs);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench links: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command: BenchCommand::Ask { files, runs },
        } => {
            let opts = crate::bench::ask::AskOptions {
                files,
                runs,
                ..Default::default()
            };
            match crate::bench::ask::run(&opts).await {
                Ok(mut figs) => {
                    crate::bench::ask::print(&mut figs);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench ask: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command: BenchCommand::ReviewQuality,
        } => match crate::bench::review_quality::run().await {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury bench review-quality: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Review {
            command:
                ReviewCommand::Intake {
                    data_dir,
                    from,
                    since,
                    token_file,
                },
        } => {
            crate::cli::review_intake::intake(
                &data_dir,
                &from,
                since.as_deref(),
                token_file.as_deref(),
            )
            .await
        }
        Command::Review {
            command:
                ReviewCommand::Approve {
                    data_dir,
                    all,
                    rows,
                    sets,
                    by,
                },
        } => crate::cli::review_intake::approve(&data_dir, all, rows.as_deref(), &sets, &by).await,
        Command::Review {
            command:
                ReviewCommand::Rehearse {
                    row,
                    data_dir,
                    root,
                },
        } => crate::cli::review_rehearse::rehearse(&data_dir, row, root.as_deref()).await,
        Command::Review { command } => review(command),
        Command::Bench {
            command:
                BenchCommand::Shadow {
                    full,
                    messages,
                    spaces,
                    pairs,
                },
        } => {
            let base = if full {
                crate::bench::shadow::ShadowBenchOptions::full()
            } else {
                crate::bench::shadow::ShadowBenchOptions::default()
            };
            let opts = crate::bench::shadow::ShadowBenchOptions {
                messages: messages.unwrap_or(base.messages),
                spaces: spaces.unwrap_or(base.spaces).max(1),
                pairs,
                ..base
            };
            match crate::bench::shadow::run(&opts).await {
                Ok(f) => {
                    print!("{}", crate::bench::shadow::report(&opts, &f));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench shadow: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Shadow { command } => crate::cli::shadow::run(command).await,
        Command::Storage { command } => crate::cli::storage::run(command).await,
        Command::Cluster { command } => crate::cli::cluster::run(command).await,
        Command::Ext { command } => crate::cli::ext::run(command).await,
        Command::Bench {
            command:
                BenchCommand::Review {
                    exchanges,
                    spaces,
                    live_samples,
                    live_latency_ms,
                    judge_latency_ms,
                    batch_size,
                    max_concurrency,
                    calls_per_minute,
                    provider_rpm,
                    provider_tpm,
                },
        } => {
            let defaults = crate::bench::review::BenchOptions::default();
            let opts = crate::bench::review::BenchOptions {
                exchanges,
                spaces,
                live_samples,
                live_latency_ms,
                judge_latency_ms,
                batch_size: batch_size.unwrap_or(defaults.batch_size).max(1),
                max_concurrency: max_concurrency.unwrap_or(defaults.max_concurrency).max(1),
                calls_per_minute: calls_per_minute.unwrap_or(defaults.calls_per_minute).max(1),
                provider_rpm,
                provider_tpm,
                ..defaults
            };
            match crate::bench::review::run(opts).await {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench review: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Bench {
            command:
                BenchCommand::Turns {
                    messages,
                    turns,
                    concurrency,
                    conversations,
                    storage,
                    postgres_url,
                    password_file,
                    statements,
                },
        } => {
            let postgres = match (storage.as_str(), postgres_url) {
                ("postgres", Some(url)) => {
                    Some(crate::bench::turns::PostgresServer { url, password_file })
                }
                ("postgres", None) => {
                    eprintln!("mercury bench turns: --storage postgres needs --postgres-url (or MERCURY_BENCH_POSTGRES_URL): a server whose user may create databases");
                    return ExitCode::from(2);
                }
                _ => None,
            };
            // The ranges above keep every value within usize on any target.
            let opts = crate::bench::turns::TurnsOptions {
                messages: messages as usize,
                turns: turns as usize,
                concurrency: concurrency as usize,
                conversations: conversations as usize,
                postgres,
                statements,
            };
            match crate::bench::turns::run(&opts).await {
                Ok(report) => {
                    println!("{report}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mercury bench turns: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn names_list(
    names: Vec<String>,
    file: Option<PathBuf>,
) -> Result<crate::redaction::RedactionList, String> {
    let mut all = names;
    if let Some(f) = file {
        all.extend(
            crate::redaction::load_names_file(&f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?,
        );
    }
    Ok(crate::redaction::RedactionList::new().with_names(all))
}

fn review(cmd: ReviewCommand) -> ExitCode {
    use crate::redaction as redact;
    match cmd {
        ReviewCommand::Redact { names, names_file } => {
            let list = match names_list(names, names_file) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("mercury review redact: {e}");
                    return ExitCode::from(2);
                }
            };
            match redact::redact_lines(std::io::stdin().lock(), std::io::stdout().lock(), &list) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mercury review redact: {e}");
                    ExitCode::from(1)
                }
            }
        }
        ReviewCommand::Intake { .. }
        | ReviewCommand::Approve { .. }
        | ReviewCommand::Rehearse { .. } => {
            // Dispatched (async) in `run` before this.
            ExitCode::from(1)
        }
        ReviewCommand::Gate { names, names_file } => {
            let list = match names_list(names, names_file) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("mercury review gate: {e}");
                    return ExitCode::from(2);
                }
            };
            match redact::gate_text(std::io::stdin().lock(), &list) {
                Ok(Ok(())) => ExitCode::SUCCESS,
                Ok(Err(found)) => {
                    eprintln!("mercury review gate: {found}");
                    ExitCode::from(3)
                }
                Err(e) => {
                    eprintln!("mercury review gate: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn backup_exit(cmd: &str, e: &crate::host::backup::BackupError) -> ExitCode {
    eprintln!("mercury {cmd}: {e}");
    ExitCode::from(
        if matches!(e, crate::host::backup::BackupError::Refused(_)) {
            2
        } else {
            1
        },
    )
}
