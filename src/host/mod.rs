//! The host process: `mercury init` (a fresh data dir with an owner token)
//! and `mercury serve` (storage, actors, sandbox, HTTP on TCP and a Unix
//! socket, graceful shutdown with a drain deadline).
//!
//! Must never: start on an invalid config, overwrite an existing data dir, or
//! write the owner's token anywhere but `global/owner.token` (mode 0600).

// Start-up refusals and warnings an operator must see whatever MERCURY_LOG filters; the demo's and shadow's own output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod backup;
pub mod cluster;
pub mod containers;
pub mod demo;
pub mod forward;
pub mod layer_probe;
pub mod listen;
pub mod promote;
pub mod retention;
pub mod shadow;
pub mod temp_host;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use ractor::Actor;
use tokio_util::sync::CancellationToken;

use crate::actors::review_scheduler::ReviewHandle;
use crate::actors::supervisor::SupervisorArgs;
use crate::actors::{RootSupervisor, SpaceDirectory, SpaceMap};
use crate::app::{App, CallerLimits};
use crate::config::{self, SandboxChoice, Settings};
use crate::ids::SpaceId;
use crate::ingress;
use crate::model::gate::{Admission, ModelGate};
use crate::model::scripted::ScriptedPolicy;
use crate::model::ProviderSettings;
use crate::runtime::{ModelRegistry, Runtime, TurnWaiters};
use crate::sandbox::{self, SandboxBackend};
use crate::storage::{messages, runs, tokens, Store};
use crate::workspace::data_dir;
use crate::workspace::DataPaths;

/// How `serve` runs, beyond the data dir's config.
#[derive(Debug)]
pub struct ServeOptions {
    /// What to serve with, already read and validated by the caller
    /// ([`settings_of`] reads `mercury.yaml` and the environment).
    pub settings: Settings,
    /// A listener the caller bound already (tests and the temp host bind
    /// port 0): used instead of binding `settings.bind`, so no port is guessed.
    pub tcp: Option<std::net::TcpListener>,
    /// Admission of background model calls; `Open` only for `mercury bench review`.
    pub review_admission: Admission,
    /// The `MERCURY_*` environment the adapters read their secrets from;
    /// `None`: this process's (a temp host's bench passes its own).
    pub env: Option<BTreeMap<String, String>>,
}

impl ServeOptions {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            tcp: None,
            review_admission: Admission::Gated,
            env: None,
        }
    }

    /// Serves on `listener` (bound by the caller).
    pub fn on(settings: Settings, listener: std::net::TcpListener) -> Self {
        Self {
            tcp: Some(listener),
            ..Self::new(settings)
        }
    }
}

/// The settings of the data dir at `data_dir`: its `mercury.yaml` with the
/// `MERCURY_*` environment on top, validated.
pub fn settings_of(data_dir: &Path) -> anyhow::Result<Settings> {
    load_settings(&DataPaths::new(data_dir))
}

/// Writes a fresh data dir. Refuses (exit code 2 at the CLI) if it exists.
pub async fn init(data_dir: &Path, owner: &str) -> anyhow::Result<PathBuf> {
    init_with(data_dir, owner, None).await
}

/// A new deployment's PostgreSQL database (`mercury init --storage-url`):
/// an empty database the data dir's config will name.
#[derive(Debug, Clone)]
pub struct InitPostgres {
    pub url: String,
    /// A file holding the password (kept out of the URL and the config).
    pub password_file: Option<PathBuf>,
}

/// [`init`], with the rows on `postgres` when given: the data dir then holds
/// the config (naming the database), the workspaces and the owner token,
/// and no `state.db`. The server is checked (reachable, empty) before
/// anything is created, so a refusal leaves nothing behind.
pub async fn init_with(
    data_dir: &Path,
    owner: &str,
    postgres: Option<&InitPostgres>,
) -> anyhow::Result<PathBuf> {
    crate::ids::validate_caller_id(owner).map_err(|m| anyhow::anyhow!("--owner: {m}"))?;
    let paths = DataPaths::new(data_dir);
    if paths.config.exists() || paths.db.exists() {
        bail!(
            "{} already holds a Mercury data dir; nothing was changed (choose another --data-dir)",
            data_dir.display()
        );
    }
    let server = match postgres {
        None => None,
        Some(pg) => {
            // The defaults (the config file is not there yet), with its storage.
            let mut settings = config::load(&paths.config, &Default::default())?;
            settings.storage.backend = config::StorageBackend::Postgres;
            settings.storage.url = pg.url.trim().to_owned();
            // Absolute, so the host finds it from any working directory.
            settings.storage.password_file = match &pg.password_file {
                None => String::new(),
                Some(p) => std::fs::canonicalize(p)
                    .with_context(|| format!("--storage-password-file {}", p.display()))?
                    .display()
                    .to_string(),
            };
            settings
                .validate()
                .map_err(|e| anyhow::anyhow!("--storage-url: {e}"))?;
            let at = store_location(&settings, &paths)?;
            let store = Store::open_at(&at)?;
            if let Some((table, rows)) = store
                .read(crate::storage::status::first_table_with_rows)
                .await?
            {
                bail!(
                    "the database {} is not empty (table {table} has {rows} rows): init a new deployment only on an empty database; nothing was changed",
                    store.describe()
                );
            }
            Some((settings.storage, store))
        }
    };
    // Every directory 0700 and every file 0600, whatever the umask: the
    // data dir holds all chat history and the owner's token. An existing
    // dir (the operator's, maybe a symlink to one) is made 0700 only when
    // empty; a non-empty one keeps its mode and `serve` warns about it.
    let existing = paths.root.is_dir();
    let empty = existing
        && std::fs::read_dir(&paths.root)
            .with_context(|| format!("reading {}", paths.root.display()))?
            .next()
            .is_none();
    if !existing {
        data_dir::private_dir(&paths.root)
            .with_context(|| format!("creating {}", paths.root.display()))?;
    } else if empty {
        std::fs::set_permissions(
            &paths.root,
            std::fs::Permissions::from_mode(data_dir::DIR_MODE),
        )
        .with_context(|| format!("setting the mode of {}", paths.root.display()))?;
    }
    for dir in [
        &paths.spaces,
        &paths.global,
        &paths.reviews,
        &data_dir::models_dir(&paths),
    ] {
        data_dir::private_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let storage = server
        .as_ref()
        .map(|(storage, _)| storage.clone())
        .unwrap_or_default();
    data_dir::private_file(&paths.config)
        .and_then(|mut f| f.write_all(config::template_with(owner, &storage).as_bytes()))
        .with_context(|| format!("writing {}", paths.config.display()))?;
    let store = match server {
        Some((_, store)) => store,
        None => {
            // SQLite gives the WAL and SHM files the mode of the database file.
            data_dir::private_file(&paths.db)
                .with_context(|| format!("creating {}", paths.db.display()))?;
            Store::open(&paths.db)?
        }
    };
    let owner_s = owner.to_owned();
    let (_, secret) = store
        .write(move |tx| {
            tokens::mint(
                tx,
                &tokens::NewToken {
                    caller_id: &owner_s,
                    kind: tokens::TokenKind::User,
                    space_id: None,
                    run_id: None,
                    label: Some("owner (mercury init)"),
                    created_by: Some(crate::ids::SYSTEM_CALLER),
                    expires_at: None,
                    role: None,
                    read_only: false,
                },
            )
        })
        .await?;
    let token_path = paths.owner_token();
    let mut f = data_dir::private_file(&token_path)
        .with_context(|| format!("writing {}", token_path.display()))?;
    f.write_all(secret.as_bytes())?;
    Ok(token_path)
}

/// The machine's hostname (a cluster host's default name).
/// The name this host goes by among several (`cluster.host_name`, else
/// the machine's).
fn cluster_host_name(settings: &Settings) -> String {
    match settings.cluster.host_name.trim() {
        "" => machine_name(),
        n => n.to_owned(),
    }
}

/// The label this host's sandboxes carry (`mercury.instance`): its data
/// dir's, and with several hosts its machine's name too (two machines may
/// use one data dir path and share an engine).
pub(crate) fn instance_id(paths: &DataPaths, settings: &Settings) -> std::io::Result<String> {
    if settings.cluster.enabled {
        sandbox::instance_id_for_host(&paths.root, &cluster_host_name(settings))
    } else {
        sandbox::instance_id_for(&paths.root)
    }
}

fn machine_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        })
        .unwrap_or_else(|| "host".into())
}

/// Where this deployment's store is: the data dir's `state.db`, or the
/// PostgreSQL database `storage.url` names (its password from
/// `storage.password_file` when set, so it is in no URL or process list).
pub fn store_location(
    settings: &Settings,
    paths: &DataPaths,
) -> anyhow::Result<crate::storage::Location> {
    Ok(crate::storage::Location::of(&settings.storage, &paths.db)?)
}

pub fn load_settings(paths: &DataPaths) -> anyhow::Result<Settings> {
    Ok(config::load(&paths.config, &config::process_env())?)
}

/// The model providers' settings of a config (also what `mercury review intake`
/// verifies with). The model keys: the live ones, or in shadow mode only the shadow's own
/// (M1.3c: `MERCURY_SHADOW_*_API_KEY` or the key file under the shadow
/// root); a shadow never reads a live key, even when its environment has one.
pub fn provider_settings(s: &Settings, env: &BTreeMap<String, String>) -> ProviderSettings {
    let key = |provider: &str, live_var: &str| {
        if s.shadow {
            let root = (!s.shadow_root.is_empty()).then(|| Path::new(&s.shadow_root));
            crate::shadow::credential::shadow_key(root, provider, env)
        } else {
            env.get(live_var).cloned()
        }
    };
    ProviderSettings {
        openai_base_url: s.providers.openai_base_url.clone(),
        openai_api_key: key("openai", "MERCURY_OPENAI_API_KEY"),
        anthropic_base_url: s.providers.anthropic_base_url.clone(),
        anthropic_api_key: key("anthropic", "MERCURY_ANTHROPIC_API_KEY"),
        request_timeout: Duration::from_secs(s.providers.request_timeout_secs),
        max_retries: s.providers.max_retries,
        retry_after_cap: Duration::from_secs(s.providers.retry_after_cap_secs),
        ..ProviderSettings::default()
    }
}

/// `<data_dir>/models/` and `models.scripted_roots`; the scripted specs
/// `mercury.yaml` names itself are the operator's own choice and stay allowed.
fn scripted_policy(s: &Settings, paths: &DataPaths) -> ScriptedPolicy {
    let mut roots = vec![crate::workspace::data_dir::models_dir(paths)];
    roots.extend(s.models.scripted_roots.iter().map(PathBuf::from));
    let configured = s
        .configured_specs()
        .into_iter()
        .filter_map(|(_, spec)| spec.strip_prefix("scripted:").map(str::to_owned));
    ScriptedPolicy::new(roots, configured)
}

/// Picks the sandbox backend the config asks for. Never falls back to an
/// unisolated one: `auto` is docker, else bubblewrap, else no tools at all.
async fn sandbox_backend(
    settings: &Settings,
    paths: &DataPaths,
) -> anyhow::Result<Arc<dyn SandboxBackend>> {
    use sandbox::process::ProcessBackend;
    let mrctl_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let bubblewrap = || async {
        let bwrap = match settings.sandbox.bwrap.as_str() {
            "" => ProcessBackend::find_bwrap(),
            path => Some(PathBuf::from(path)).filter(|p| p.is_file()),
        }
        .ok_or_else(|| "bubblewrap (`bwrap`) is not installed".to_string())?;
        let backend = ProcessBackend::bubblewrap(bwrap, mrctl_dir.clone());
        backend
            .probe()
            .await
            .map_err(|e| format!("bubblewrap does not work here: {e}"))?;
        Ok::<_, String>(backend)
    };
    let s = &settings.sandbox;
    match s.backend {
        SandboxChoice::Process => match bubblewrap().await {
            Ok(b) => Ok(Arc::new(b)),
            Err(e) if s.allow_unisolated => {
                tracing::warn!(reason = %e, "sandbox: process without bubblewrap, as sandbox.allow_unisolated asks: tools run as plain host processes, NOT isolated");
                say(true, &format!("WARNING: tools run as plain host processes, NOT isolated ({e}; sandbox.allow_unisolated: true)"));
                Ok(Arc::new(ProcessBackend::unisolated(mrctl_dir.clone())))
            }
            Err(e) => bail!(
                "sandbox: process was asked for, but {e}; install Debian's `bubblewrap`, or set \
                 sandbox.allow_unisolated: true to run tools as plain host processes (NOT isolated)"
            ),
        },
        SandboxChoice::Docker => crate::host::containers::docker_backend(settings, paths)
            .await
            .map_err(|e| anyhow::anyhow!("sandbox: docker was asked for, but {e:#}")),
        SandboxChoice::Auto => {
            let docker_err = match crate::host::containers::docker_backend(settings, paths).await {
                Ok(b) => return Ok(b),
                Err(e) => format!("{e:#}"),
            };
            match bubblewrap().await {
                Ok(b) => {
                    tracing::warn!(docker = %docker_err, "sandbox: auto: no usable Docker engine; tools run under bubblewrap");
                    Ok(Arc::new(b))
                }
                Err(bwrap_err) => {
                    let reason = format!("no Docker engine ({docker_err}) and {bwrap_err}");
                    tracing::error!(%reason, "sandbox: auto found no isolating backend: every tool call is refused");
                    say(
                        true,
                        &format!("no sandbox is available, tool calls are refused: {reason}"),
                    );
                    Ok(Arc::new(sandbox::Unavailable { reason }))
                }
            }
        }
    }
}

/// The host's shared services over an open store: models, sandbox backend,
/// instance id, with the model keys of this process's environment.
/// `mercury bench` builds its runtime here.
pub async fn build_runtime(
    paths: &DataPaths,
    settings: Settings,
    store: Store,
    review_admission: Admission,
) -> anyhow::Result<Arc<Runtime>> {
    build_runtime_with_env(
        paths,
        settings,
        store,
        review_admission,
        &config::process_env(),
        None,
    )
    .await
}

/// [`build_runtime`] with the model keys read from `env` (`serve_with`'s,
/// the same environment its warnings and the adapters' secrets come from).
async fn build_runtime_with_env(
    paths: &DataPaths,
    settings: Settings,
    store: Store,
    review_admission: Admission,
    env: &BTreeMap<String, String>,
    cluster: Option<Arc<crate::cluster::HostSeat>>,
) -> anyhow::Result<Arc<Runtime>> {
    let sandbox = sandbox_backend(&settings, paths).await?;
    let instance_id = instance_id(paths, &settings).context("deriving the instance id")?;
    let providers = provider_settings(&settings, env);
    for key in [&providers.openai_api_key, &providers.anthropic_api_key]
        .into_iter()
        .flatten()
    {
        crate::redaction::secrets::register(key);
    }
    // A provider URL's `user:password@` is a credential too.
    for base in [&providers.openai_base_url, &providers.anthropic_base_url] {
        if let Some(password) = url::Url::parse(base)
            .ok()
            .and_then(|u| u.password().map(str::to_owned))
        {
            crate::redaction::secrets::register(&password);
        }
    }
    let model_gate = Arc::new(
        ModelGate::with_admission(
            review_admission,
            settings.review.max_concurrency,
            settings.review.calls_per_minute,
        )
        .with_ceiling(settings.review.calls_per_minute_max)
        .with_throttles(providers.throttles.clone()),
    );
    let outbound = crate::runtime::Outbound::for_settings(&settings, paths);
    let settings = Arc::new(settings);
    let metrics: Arc<crate::telemetry::Metrics> = Arc::default();
    let spend = Arc::new(crate::spend::Spend::new(
        settings.clone(),
        store.clone(),
        instance_id.clone(),
        metrics.clone(),
    ));
    Ok(Arc::new(Runtime {
        outbound,
        spend,
        models: ModelRegistry::new(providers, scripted_policy(&settings, paths)),
        model_gate,
        settings,
        paths: paths.clone(),
        store,
        instance_id,
        sandbox,
        waiters: TurnWaiters::default(),
        live_runs: Mutex::new(Default::default()),
        ask_refusals: Mutex::new(Default::default()),
        cross_reads: Default::default(),
        metrics,
        steps_pruned_at: std::sync::atomic::AtomicI64::new(0),
        cluster,
        editors: Arc::default(),
        sources: Arc::default(),
    }))
}

/// Starts the root supervisor (which starts the task scheduler and the review
/// actors); space actors start on demand through the returned directory.
pub async fn start_actors(
    rt: &Arc<Runtime>,
) -> anyhow::Result<(
    ractor::ActorRef<crate::actors::SupervisorMsg>,
    tokio::task::JoinHandle<()>,
    SpaceDirectory,
    ReviewHandle,
)> {
    let map: SpaceMap = Arc::default();
    let review = ReviewHandle::default();
    let (supervisor, handle) = Actor::spawn(
        None,
        RootSupervisor,
        SupervisorArgs {
            rt: rt.clone(),
            spaces: map.clone(),
            review: review.clone(),
        },
    )
    .await
    .context("starting the root supervisor")?;
    let spaces = SpaceDirectory::new(supervisor.clone(), map);
    Ok((supervisor, handle, spaces, review))
}

/// The metrics listener's connection budget (at most; `http.max_connections`
/// if lower).
pub const METRICS_CONNECTIONS: usize = 64;

/// Set once a shadow host starts serving in this process: every line it
/// writes to stderr then starts with `shadow=1`.
static SHADOW_PROCESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `"shadow=1 "` in a shadow host's process, else empty.
/// Set when the log is JSON (`log.format: json`, never on a shadow, whose
/// log is text): the host's plain stderr lines then go through the log too,
/// so every line of its stderr is one JSON object.
static JSON_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line for the operator at start-up or shutdown: `mercury: <line>` on
/// stderr, or a log event of `mercury::startup` when the log is JSON.
pub fn say(warning: bool, line: &str) {
    if JSON_LOG.load(std::sync::atomic::Ordering::SeqCst) {
        if warning {
            tracing::warn!(target: "mercury::startup", "{line}");
        } else {
            tracing::info!(target: "mercury::startup", "{line}");
        }
    } else {
        eprintln!("mercury: {}{line}", log_tag());
    }
}

pub fn log_tag() -> &'static str {
    if SHADOW_PROCESS.load(std::sync::atomic::Ordering::SeqCst) {
        "shadow=1 "
    } else {
        ""
    }
}

/// An adapter that sends to the outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboundAdapter {
    Webhook,
    /// A chat platform of the adapters' registry, by name (`adapters.<name>`,
    /// started under the root supervisor).
    Chat(&'static str),
}

impl OutboundAdapter {
    pub fn name(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Chat(name) => name,
        }
    }
    /// The name capitalised (`Webhook`, `Telegram`), as the shadow
    /// transcript's refusals have always written it.
    pub fn label(self) -> String {
        let name = self.name();
        let mut chars = name.chars();
        chars.next().map_or_else(String::new, |c| {
            c.to_ascii_uppercase().to_string() + chars.as_str()
        })
    }
}

/// The one construction point of outbound adapters: what the config asks
/// for, or in shadow mode none at all (each one asked for is listed in the
/// transcript as refused).
pub fn outbound_adapters(
    settings: &Settings,
    outbound: &crate::runtime::Outbound,
) -> Vec<OutboundAdapter> {
    let mut wanted = Vec::new();
    if !settings.webhook.url.is_empty() {
        wanted.push(OutboundAdapter::Webhook);
    }
    for adapter in crate::adapters::registry::all() {
        if adapter.enabled(settings) {
            wanted.push(OutboundAdapter::Chat(adapter.name()));
        }
    }
    if outbound.is_shadow() {
        for a in wanted.drain(..) {
            outbound.record_refusal(
                None,
                "adapter",
                &format!(
                    "would have constructed the {} adapter (shadow mode)",
                    a.label()
                ),
            );
            tracing::info!(adapter = a.name(), "shadow mode: adapter not constructed");
        }
    }
    wanted
}

/// Runs the host on `data_dir` with its `settings` (as [`settings_of`] read
/// them) until SIGTERM/SIGINT (or `shutdown` is cancelled).
pub async fn serve(
    data_dir: &Path,
    settings: anyhow::Result<Settings>,
    bind_override: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut settings = settings?;
    if let Some(b) = bind_override {
        settings.bind = b;
        settings.validate()?;
    }
    serve_with(data_dir, ServeOptions::new(settings), shutdown).await
}

/// [`serve`] with every option.
pub async fn serve_with(
    data_dir: &Path,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let env = options.env.unwrap_or_else(config::process_env);
    let bound = options.tcp;
    let data_dir = std::fs::canonicalize(data_dir).with_context(|| {
        format!(
            "{} is not a data dir (run `mercury init` first)",
            data_dir.display()
        )
    })?;
    let settings = options.settings;
    let paths = DataPaths::of(&data_dir, &settings.storage);

    // On PostgreSQL the data dir holds the config and the workspaces, and
    // the rows are on the server.
    if settings.storage.backend == config::StorageBackend::Sqlite && !paths.db.exists() {
        bail!(
            "{} has no state.db: run `mercury init --data-dir {}` first",
            data_dir.display(),
            data_dir.display()
        );
    }
    // Before anything is written (even the lock): a shadow serves only under the shadow
    // root, and a snapshot only as a shadow (exit 2 at the CLI).
    crate::shadow::guard::check_data_dir(&settings, &data_dir)?;
    // Before anything is read or swept: a second host on this data dir stops
    // here (exit 2). Held until this function returns.
    let _lock = data_dir::lock(&paths)?;
    // Data dirs made before these existed get them now, private.
    for dir in [
        data_dir::models_dir(&paths),
        paths.reviews.clone(),
        paths.spaces.clone(),
    ] {
        data_dir::private_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if !settings.shadow && settings.log.format == config::LogFormat::Json {
        JSON_LOG.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    if settings.shadow {
        SHADOW_PROCESS.store(true, std::sync::atomic::Ordering::SeqCst);
    } else if let Err(e) = crate::shadow::settings::record(&data_dir, &env) {
        // What a later snapshot carries into its shadow (docs/shadow.md).
        tracing::warn!(error = %e, "cannot record the settings of the environment for shadows");
    }
    match data_dir::share_global(&paths)? {
        data_dir::GlobalShare::Published => {
            say(false, "global/owner.token: published to storage.shared_dir for the other hosts");
        }
        data_dir::GlobalShare::Adopted => {
            say(false, "global/owner.token: the deployment's, from storage.shared_dir");
        }
        data_dir::GlobalShare::Missing => say(
            true,
            "warning: neither global/owner.token nor storage.shared_dir's holds the owner token: local commands need MERCURY_TOKEN",
        ),
        data_dir::GlobalShare::Unchanged => {}
    }
    for loose in data_dir::loose_modes(&paths) {
        say(true, &format!("warning: {loose}"));
    }
    if settings.cluster.enabled && settings.storage.shared_dir.trim().is_empty() {
        say(
            true,
            "warning: cluster.enabled without storage.shared_dir: global/ and models/ (and reviews/ unless storage.reviews_dir names one) stay on this host (docs/scale-out.md)",
        );
    }
    if settings.shadow {
        eprintln!(
            "mercury: shadow=1 SHADOW MODE: nothing is delivered; every send goes to {}",
            crate::workspace::transcript::Transcript::of(&data_dir)
                .path()
                .display()
        );
    }
    for unknown in config::unknown_vars(&env) {
        tracing::warn!(variable = %unknown.name, closest = unknown.closest.as_deref().unwrap_or("-"), "{unknown}");
    }
    for key in settings.open_dm_policies() {
        tracing::warn!(
            key,
            "{key} is open: anyone who finds the bot is answered on the model's budget; pairing (the default) asks the owner first"
        );
    }
    config::check_scripted_files(&settings)?;
    if settings.shadow {
        // A shadow calls with its own key only (provider_settings).
        let specs: Vec<String> = settings
            .configured_specs()
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let root = (!settings.shadow_root.is_empty()).then(|| Path::new(&settings.shadow_root));
        for p in crate::shadow::credential::providers_without_key(&specs, root, &env) {
            let var = crate::shadow::credential::env_name(&p);
            tracing::warn!(provider = %p, variable = %var, "{p} is in the model chain but the shadow has no key of its own ({var} or `mercury shadow auth set-key {p}`): its calls will fail");
        }
    } else {
        for (spec, var) in config::missing_keys(&settings, &env) {
            tracing::warn!(model = %spec, variable = var, "{spec} is in the model chain but {var} is not set: its calls will fail (a local server that needs no key can ignore this)");
        }
    }
    // Before anything starts: an enabled adapter without its secret stops
    // here. A shadow constructs no adapter, so it needs (and reads) no secret.
    let adapter_secrets = if settings.shadow {
        crate::adapters::AdapterSecrets::default()
    } else {
        crate::adapters::AdapterSecrets::from_env(&settings, &env)?
    };
    let store = Store::open_at(&store_location(&settings, &paths)?)
        .with_context(|| "opening the store (storage.backend)")?;
    tracing::info!(backend = ?store.dialect(), at = %store.describe(), "store open");
    // What a killed host left: layers still mounted, ask copies.
    match crate::workspace::layer::sweep_scratch(&paths.scratch()) {
        Ok(0) => {}
        Ok(n) => tracing::warn!(entries = n, "removed the scratch left by the last stop"),
        Err(e) => tracing::error!(error = %e, "cannot clean the scratch directory"),
    }
    // And the API-socket relays of its sessions (src/sandbox/relay.rs).
    if let Ok(id) = instance_id(&paths, &settings) {
        match sandbox::sweep_relays(&id) {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                relays = n,
                "removed the socket relays left by the last stop"
            ),
            Err(e) => tracing::error!(error = %e, "cannot sweep the socket relays"),
        }
        // And its warm pool's directory (its containers go with the sweep).
        match sandbox::sweep_warm_roots(&id) {
            Ok(0) => {}
            Ok(n) => tracing::warn!(pools = n, "removed the warm pool left by the last stop"),
            Err(e) => tracing::error!(error = %e, "cannot sweep the warm pool's directory"),
        }
    }
    // One of many hosts: what other hosts run now is theirs, so a dead
    // predecessor's runs are closed space by space when a lease is claimed
    // (storage::leases::claim_space), never all at once here.
    let seat = if settings.cluster.enabled {
        store.one_write_per_transaction();
        let advertise = match settings.cluster.advertise_url.trim() {
            "" => format!(
                "http://{}",
                match &bound {
                    Some(l) => l.local_addr()?.to_string(),
                    None => settings.bind.clone(),
                }
            ),
            url => url.to_owned(),
        };
        let name = cluster_host_name(&settings);
        let instance = instance_id(&paths, &settings).context("deriving the instance id")?;
        let seat = crate::cluster::HostSeat::join(
            store.clone(),
            &name,
            &advertise,
            &instance,
            Duration::from_secs(settings.cluster.lease_secs),
        )
        .await
        .context("joining the deployment (cluster.enabled)")?;
        say(
            false,
            &format!(
                "cluster: joined as {} ({advertise}), leases of {} s",
                seat.host_id, settings.cluster.lease_secs
            ),
        );
        Some(Arc::new(seat))
    } else {
        let interrupted = store.write(|tx| runs::interrupt_stale(tx)).await?;
        if interrupted > 0 {
            tracing::warn!(
                runs = interrupted,
                "runs interrupted by the last stop were marked; their messages will be answered"
            );
        }
        // No run is live yet, so every run token left is a dead run's (a hard
        // kill skips the revocation a finished run does).
        let (revoked, deleted) = store.write(|tx| tokens::retire_run_tokens(tx)).await?;
        if revoked + deleted > 0 {
            tracing::warn!(
                revoked,
                deleted_ask = deleted,
                "run tokens of interrupted runs were retired"
            );
        }
        None
    };
    let rt = build_runtime_with_env(
        &paths,
        settings,
        store,
        options.review_admission,
        &env,
        seat,
    )
    .await?;
    // No model call is in flight yet: a reservation of this instance is a
    // crashed call's, and would hold budget it never spent.
    let released = rt.spend.release_left_behind().await?;
    if released > 0 {
        tracing::warn!(
            reservations = released,
            "spend reservations left by the last stop were released"
        );
    }
    warn_unpriced(&rt.settings);
    let (supervisor, sup_handle, spaces, review) = start_actors(&rt).await?;
    deliver_spend_notices(&rt, &spaces);
    let app = Arc::new(App {
        // Several hosts count a caller's turns together, in the store.
        limits: Arc::new(match rt.cluster {
            Some(_) => CallerLimits::shared(rt.settings.ingress.per_caller_per_minute),
            None => CallerLimits::new(rt.settings.ingress.per_caller_per_minute),
        }),
        spaces,
        rt: rt.clone(),
        shutdown: shutdown.clone(),
        review,
        adapters: Default::default(),
        layer_check: Some(Arc::new(HostLayerCheck {
            paths: paths.clone(),
            settings: rt.settings.clone(),
        })),
    });
    // Durable before acknowledged: whatever was pending when the host stopped
    // runs now (one of many hosts: what it may claim, found by its loop).
    let pending = match &rt.cluster {
        None => rt.store.read(messages::spaces_with_pending).await?,
        Some(_) => Vec::new(),
    };
    for space in pending {
        let Ok(id) = SpaceId::parse(&space) else {
            tracing::error!(space = %space, "a space with pending messages has an invalid id");
            continue;
        };
        if let Err(e) = app.spaces.wake(&id).await {
            tracing::error!(space = %space, error = %e, "cannot resume pending messages");
        }
    }
    // The one construction point: in shadow mode `outbound_adapters` is empty.
    let adapters = outbound_adapters(&rt.settings, &rt.outbound);
    if adapters
        .iter()
        .any(|a| matches!(a, OutboundAdapter::Chat(_)))
    {
        crate::adapters::start(&app, &supervisor, adapter_secrets).await?;
    }
    let background = tokio_util::task::TaskTracker::new();
    for &adapter in &adapters {
        match adapter {
            // Started above, under the root supervisor.
            OutboundAdapter::Chat(_) => {}
            OutboundAdapter::Webhook => {
                background.spawn(ingress::webhook::run(rt.clone(), shutdown.clone()));
                rt.metrics.set_adapter_up("webhook", true);
            }
        }
    }
    if !rt.settings.metrics.bind.is_empty() {
        let listener = tokio::net::TcpListener::bind(&rt.settings.metrics.bind)
            .await
            .with_context(|| format!("binding metrics.bind {}", rt.settings.metrics.bind))?;
        let router = crate::api::ops::metrics_only(app.clone());
        // A scraper needs few connections; its budget is its own.
        let limits = listen::ConnLimits::of(&rt.settings.http).capped(METRICS_CONNECTIONS);
        background.spawn(listen::serve(listener, router, limits, shutdown.clone()));
    }
    background.spawn(app.limits.clone().prune_loop(shutdown.clone()));
    // Extensions' scheduled calls (none on a shadow host).
    background.spawn(crate::extensions::jobs::run(rt.clone(), shutdown.clone()));
    background.spawn(crate::host::containers::sweep_loop(
        rt.clone(),
        shutdown.clone(),
    ));
    background.spawn(retention::sweep_loop(rt.clone(), shutdown.clone()));
    if let Some(seat) = &rt.cluster {
        background.spawn(cluster::run(
            rt.clone(),
            seat.clone(),
            app.spaces.clone(),
            shutdown.clone(),
        ));
    }
    // The dashboard's paths are its own (`/ui/…`); everything else is the API's.
    let router = crate::ui::router(app.clone())
        .merge(crate::api::router(app.clone()))
        // One of many hosts: a request for a space another host runs is
        // sent there whole (and authenticated there).
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            forward::to_runner,
        ));
    let tcp = match bound {
        Some(listener) => {
            listener
                .set_nonblocking(true)
                .context("the listener handed to serve")?;
            tokio::net::TcpListener::from_std(listener).context("the listener handed to serve")?
        }
        None => tokio::net::TcpListener::bind(&rt.settings.bind)
            .await
            .with_context(|| format!("binding {}", rt.settings.bind))?,
    };
    let _ = std::fs::remove_file(&paths.socket);
    let unix = tokio::net::UnixListener::bind(&paths.socket)
        .with_context(|| format!("binding {}", paths.socket.display()))?;
    // Containers run as another uid; the token, not the socket mode, is the gate.
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o666))?;
    say(
        false,
        &format!(
            "serving on http://{} and {}",
            tcp.local_addr()?,
            paths.socket.display()
        ),
    );
    say(
        false,
        &format!(
            "sandbox backend: {} ({}), workspace quota {} MB",
            rt.sandbox.name(),
            match rt.sandbox.isolation() {
                sandbox::Isolation::Container => "containers",
                sandbox::Isolation::Namespaces => "bubblewrap namespaces",
                sandbox::Isolation::None => "NOT isolated",
            },
            rt.settings.sandbox.workspace_mb
        ),
    );
    startup_summary(&rt, &tcp.local_addr()?.to_string(), &adapters);
    // Said now, not at the first scan: the operator is watching this start.
    if rt.settings.review.enabled {
        if let Some(why) = crate::review::digest::no_destination(&rt).await {
            tracing::warn!(target: "mercury::startup", "review digest: {why}");
        }
    }
    let drain = Duration::from_secs(rt.settings.http.drain_secs);
    // Each listener has its own connection budget: idle TCP clients cannot
    // starve api.sock, where run tokens and local operators connect.
    let limits = listen::ConnLimits::of(&rt.settings.http);
    let servers = async {
        tokio::join!(
            listen::serve(tcp, router.clone(), limits, shutdown.clone()),
            listen::serve(unix, router, limits, shutdown.clone()),
        )
    };
    if !listen::until_drained(servers, &shutdown, drain).await {
        tracing::warn!("drain deadline passed; closing remaining connections");
    }
    // Order: HTTP is closed, then actors (their running turns stay pending in
    // the database), then background loops; the writer thread ends last.
    rt.waiters.notify_all();
    supervisor.stop(Some("host shutting down".into()));
    let _ = tokio::time::timeout(Duration::from_secs(5), sup_handle).await;
    if let Some(seat) = &rt.cluster {
        // Its actors are stopped: the other hosts may take its spaces now.
        seat.leave().await;
    }
    background.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), background.wait()).await;
    // Lingering writes (act-as audit rows) reach the disk before the process ends.
    if let Err(e) = rt.store.flush_lingering().await {
        tracing::error!(error = %e, "lingering writes were not written at shutdown");
    }
    // The pool's idle containers (the next start's sweep removes any left).
    let _ = tokio::time::timeout(Duration::from_secs(10), rt.sandbox.shutdown()).await;
    let _ = std::fs::remove_file(&paths.socket);
    Ok(())
}

/// One INFO line an operator reads first: what this host runs with.
fn startup_summary(rt: &Runtime, bind: &str, constructed: &[OutboundAdapter]) {
    let s = &rt.settings;
    let sandbox_why = match (s.sandbox.backend, rt.sandbox.unavailable_reason()) {
        (_, Some(reason)) => format!("no isolating backend: {reason}"),
        (SandboxChoice::Auto, None) => format!("sandbox.backend auto chose {}", rt.sandbox.name()),
        (choice, None) => format!("sandbox.backend is {choice:?}").to_lowercase(),
    };
    let next_review = crate::actors::review_scheduler::next_fire(&s.review, chrono::Utc::now())
        .map_or_else(|| "-".to_owned(), |t| t.to_rfc3339());
    let adapters = if s.shadow {
        "none (shadow mode)".to_owned()
    } else if constructed.is_empty() {
        "none (pull from /api/outbox)".to_owned()
    } else {
        let names: Vec<&str> = constructed.iter().map(|a| a.name()).collect();
        names.join(",")
    };
    tracing::info!(
        target: "mercury::startup",
        version = env!("CARGO_PKG_VERSION"),
        bind,
        model_chain = %s.model_chain().join(","),
        sandbox = rt.sandbox.name(),
        sandbox_why = %sandbox_why,
        owner = %s.owner,
        review = if s.review.enabled { "on" } else { "off" },
        next_review = %next_review,
        adapters = %adapters,
        metrics_bind = if s.metrics.bind.is_empty() { "-" } else { s.metrics.bind.as_str() },
        "mercury started"
    );
}

/// `mercury doctor`'s turn-layer probe, run by the serving host itself.
struct HostLayerCheck {
    paths: DataPaths,
    settings: Arc<Settings>,
}

#[async_trait::async_trait]
impl crate::app::LayerCheck for HostLayerCheck {
    async fn check(&self) -> Vec<(String, &'static str, String)> {
        layer_probe::check(&self.paths, &self.settings)
            .await
            .into_iter()
            .map(|f| {
                let (level, detail) = match f.verdict {
                    layer_probe::Verdict::Ok(d) => ("ok", d),
                    layer_probe::Verdict::Warn(d) => ("warn", d),
                    layer_probe::Verdict::Fail(d) => ("fail", d),
                };
                (format!("host {}", f.what), level, detail)
            })
            .collect()
    }
}

/// Queues each owner notice of a spend cap (`Spend::take_notices`) to
/// `review.owner`'s DM, the review digest's channel. A task of its own: the
/// notice may come from a turn running inside the very space actor the DM's
/// outbox row must be written through.
fn deliver_spend_notices(rt: &Arc<Runtime>, spaces: &SpaceDirectory) {
    let Some(mut notices) = rt.spend.take_notices() else {
        return;
    };
    let (rt, spaces) = (rt.clone(), spaces.clone());
    tokio::spawn(async move {
        // What a stopped host owed first; a notice read here may also be
        // on the channel (written after start, before this read): once.
        let mut handed = std::collections::BTreeSet::new();
        let left = match rt.spend.pending_notices().await {
            Ok(left) => left,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the owner's spend notices left unsent");
                Vec::new()
            }
        };
        for notice in left {
            handed.insert((notice.key.clone(), notice.period_start));
            deliver_spend_notice(&rt, &spaces, &notice).await;
        }
        while let Some(notice) = notices.recv().await {
            if handed.insert((notice.key.clone(), notice.period_start)) {
                deliver_spend_notice(&rt, &spaces, &notice).await;
            }
        }
    });
}

/// Queues one notice in the owner's DM, then marks its row handled (a stop
/// in between sends it twice rather than never).
async fn deliver_spend_notice(
    rt: &Arc<Runtime>,
    spaces: &SpaceDirectory,
    notice: &crate::spend::PendingNotice,
) {
    let owner = rt.settings.review.owner.clone();
    let outcome =
        crate::review::digest::deliver(rt, spaces, &owner, notice.text.clone(), false).await;
    if !outcome.sent {
        tracing::warn!(
            reason = outcome.reason.as_deref().unwrap_or("-"),
            "the owner's spend notice was not sent: {}",
            notice.text
        );
    }
    if let Err(e) = rt.spend.notice_handled(notice).await {
        tracing::error!(error = %e, "cannot mark the owner's spend notice handled; it is sent again at the next start");
    }
}

/// The start-up warning for every configured model with no price.
fn warn_unpriced(s: &Settings) {
    let specs: Vec<String> = s.configured_specs().into_iter().map(|(_, v)| v).collect();
    for spec in crate::spend::unpriced(s, &specs) {
        if s.budgets.any_cap() && !s.budgets.allow_unpriced {
            tracing::warn!(model = %spec, "{spec} has no price (set prices.\"{spec}\"): a spend cap is set, so every call to it will be refused");
        } else {
            tracing::warn!(model = %spec, "{spec} has no price (set prices.\"{spec}\"): its calls are counted as free");
        }
    }
}

/// Cancels `token` on SIGTERM or SIGINT.
pub fn cancel_on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        say(false, "shutting down");
        token.cancel();
    });
}
