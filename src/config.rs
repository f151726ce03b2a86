//! Settings: `mercury.yaml` overridden by `MERCURY_*` environment variables,
//! validated once at start-up into [`Settings`].
//!
//! Every key has a default; the env name of a key is `MERCURY_` plus its path
//! upper-cased with `.` → `_` (`review.enabled` ↔ `MERCURY_REVIEW_ENABLED`).
//! Secrets (model API keys) are read from the environment only and are never
//! written to the file or passed to a sandbox.
//!
//! Must never: accept a value it cannot use (an invalid value stops start-up
//! with a message naming the key), or treat the string `false` as true.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

pub mod platforms;
pub mod web;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("config key {key}: {message}")]
    Key { key: String, message: String },
}

fn key_err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Key {
        key: key.to_owned(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address the HTTP API listens on.
    pub bind: String,
    /// Default model chain of every space: specs tried in order.
    pub model: String,
    /// Caller ids that are global admins besides the owner.
    pub admins: Vec<String>,
    /// The owner's caller id (written by `mercury init`).
    pub owner: String,
    pub providers: ProviderConfig,
    /// Price per million tokens, by model spec: `{input: 0.15, output: 0.6}`,
    /// in `currency`; overrides the built-in table (`src/spend/price_table.rs`).
    pub prices: BTreeMap<String, Price>,
    /// The deployment's currency (a label: prices and caps are in it). The
    /// built-in prices are USD and apply only while this is `USD`.
    pub currency: String,
    /// The deployment's IANA time zone: budget periods roll over at its
    /// midnight; `review.timezone` falls back to it.
    pub timezone: String,
    /// Spend caps (docs/spend.md).
    pub budgets: BudgetsConfig,
    pub sandbox: SandboxConfig,
    pub turn: TurnConfig,
    pub ingress: IngressConfig,
    pub trigger: TriggerConfig,
    pub spaces: SpacesConfig,
    pub webhook: WebhookConfig,
    pub review: ReviewConfig,
    pub http: HttpConfig,
    pub models: ModelsConfig,
    pub files: FilesConfig,
    pub workspace: WorkspaceConfig,
    pub runs: RunsConfig,
    pub links: LinksConfig,
    pub outbox: OutboxConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub adapters: AdaptersConfig,
    pub storage: StorageConfig,
    pub cluster: ClusterConfig,
    /// The host's `web_fetch` tool: egress policy and caps.
    pub web: web::WebConfig,
    /// Installed extensions, host-wide.
    pub extensions: ExtensionsConfig,
    /// Shadow mode (issue 14): nothing leaves the host; every outbound send
    /// goes to `<data_dir>/shadow/transcript.jsonl`. `MERCURY_SHADOW` takes
    /// only `1` or `true`.
    pub shadow: bool,
    /// The shadow root (`shadow.root` in the issue; `MERCURY_SHADOW_ROOT`): a
    /// shadow serves only a data dir strictly under it.
    pub shadow_root: String,
}

/// Where the deployment keeps its state (docs/storage.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// `sqlite` (the data dir's `state.db`, the default) or `postgres`.
    pub backend: StorageBackend,
    /// PostgreSQL's connection URL (`postgres://user@host:5432/db?sslmode=require`);
    /// `MERCURY_STORAGE_URL`. Only with `backend: postgres`.
    pub url: String,
    /// A file holding the PostgreSQL password, so it is not in the URL;
    /// empty: the URL's own (or none).
    pub password_file: String,
    /// Where the spaces' workspaces live; empty: `<data dir>/spaces`. Many
    /// hosts of one deployment point it at one shared directory (issue 28,
    /// docs/scale-out.md).
    pub workspaces_dir: String,
    /// Where the review's reports, digests and ledger live; empty:
    /// `<data dir>/reviews`. Many hosts point it at one shared directory,
    /// so every host serves the reports the scan wrote on one of them.
    pub reviews_dir: String,
    /// One directory every host of a deployment mounts: `spaces/`,
    /// `reviews/` and `models/` live under it (unless `workspaces_dir` or
    /// `reviews_dir` say otherwise) and `global/` (the owner token) is
    /// published there for every host; empty: none.
    pub shared_dir: String,
}

/// Many hosts on one PostgreSQL database (docs/scale-out.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This host is one of many: spaces are leased, not assumed.
    pub enabled: bool,
    /// The name `mercury cluster status` shows (empty: the machine's hostname).
    pub host_name: String,
    /// The URL other hosts reach this one's API at (empty: `http://<bind>`).
    pub advertise_url: String,
    /// Seconds a lease lasts without a heartbeat: how long a dead host's
    /// spaces wait before another host takes them.
    pub lease_secs: u64,
    /// How often a host looks for pending messages it may run (ms).
    pub poll_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            host_name: String::new(),
            advertise_url: String::new(),
            lease_secs: 15,
            poll_ms: 500,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum StorageBackend {
    #[default]
    Sqlite,
    Postgres,
}

/// A daily and a monthly cap in the deployment's currency; 0 is no cap.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct CapPair {
    pub daily: f64,
    pub monthly: f64,
}

impl CapPair {
    pub fn is_set(&self) -> bool {
        self.daily > 0.0 || self.monthly > 0.0
    }
}

/// One cap pair per kind of model call (`spend::SpendPurpose`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PurposeCaps {
    /// Live turns answering a chat message.
    pub turn: CapPair,
    /// Scheduled task turns.
    pub task: CapPair,
    /// `ask` turns run in another space's sandbox.
    pub ask: CapPair,
    /// History compaction.
    pub compact: CapPair,
    /// The review judge (daily scan and weekly synthesis).
    pub judge: CapPair,
    /// The review intake's verify calls.
    pub intake: CapPair,
}

/// Spend caps (issue 26, docs/spend.md). Every cap is in `currency`; 0 is no cap.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetsConfig {
    /// The whole deployment's spend.
    pub global: CapPair,
    /// Every space's own cap unless `mrctl budget set` gave it one.
    pub space: CapPair,
    /// Caps per kind of call, over the whole deployment.
    pub purposes: PurposeCaps,
    /// A model with no price may be called under a cap (counted as free).
    pub allow_unpriced: bool,
    /// What a turn stopped by a cap answers, once per period per conversation;
    /// empty: nothing.
    pub capped_reply: String,
}

/// The default `budgets.capped_reply`.
pub const DEFAULT_CAPPED_REPLY: &str =
    "I have reached my spending limit for now and will answer again when it resets.";

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            global: CapPair::default(),
            space: CapPair::default(),
            purposes: PurposeCaps::default(),
            allow_unpriced: false,
            capped_reply: DEFAULT_CAPPED_REPLY.into(),
        }
    }
}

/// The workspace file routes (`/api/files`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Largest file the routes read or write; beyond it they answer 413.
    pub max_bytes: usize,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self { max_bytes: 1 << 20 }
    }
}

/// How large a workspace tree may grow (besides `sandbox.workspace_mb`):
/// every walk over a workspace (measuring, merging, copying) refuses a tree
/// past these, and a turn that makes one fails and keeps nothing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkspaceConfig {
    /// Directories nested below the workspace root, at most.
    pub max_depth: usize,
    /// Entries (files, directories, links) in one workspace, at most.
    pub max_entries: u64,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_entries: 100_000,
        }
    }
}

/// Extensions, host-wide (docs/extensions.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ExtensionsConfig {
    /// On a shadow host: the `http` servers (`<extension>.<server>`) its
    /// turns may call (read-only tools only); every other one is refused.
    /// A live host ignores it.
    pub shadow_http: Vec<String>,
}

/// Run traces (`run_steps`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunsConfig {
    /// Steps older than this many days are deleted.
    pub keep_days: u32,
    /// Output text kept per step (the size is always recorded).
    pub step_output_bytes: usize,
}

/// Space links: how long their audit is kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LinksConfig {
    /// Audit rows (every act-as request, D-008) older than this many days are
    /// deleted by the host's hourly retention sweep.
    pub audit_keep_days: u32,
}

impl Default for LinksConfig {
    fn default() -> Self {
        Self {
            audit_keep_days: 365,
        }
    }
}

/// The outbox: how long a delivered reply is kept (an undelivered one
/// always is).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    pub keep_days: u32,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self { keep_days: 7 }
    }
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            keep_days: 30,
            step_output_bytes: 2048,
        }
    }
}

/// Prometheus `/metrics`: always on the API (owner and global admins'
/// tokens); also without a token on `bind` when it is set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// ADDR:PORT of a listener serving `/metrics` alone, no token; empty: none.
    pub bind: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One human-readable line per event (no colour unless stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The host's log on stderr; the level filter is `MERCURY_LOG` (e.g. `info`,
/// `debug`, `info,mercury::ingress=debug`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
}

/// The in-process chat adapters (`src/adapters`). Their secrets come from the
/// environment only (`MERCURY_TELEGRAM_BOT_TOKEN`,
/// `MERCURY_DISCORD_BOT_TOKEN`, each platform's [`platforms::Platform::secret_vars`]),
/// never from this file.
///
/// Telegram's and Discord's sections are typed here; every other registered
/// platform declares its own section ([`platforms::Platform::section_defaults`])
/// and reads it from [`AdaptersConfig::more`]. An unknown key is still refused:
/// the file is merged onto the defaults, which hold every registered section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AdaptersConfig {
    /// The largest attachment (picture, voice note, file) fetched into a
    /// workspace's `inbox/`, in MB; a larger one is refused with a sentence.
    pub max_attachment_mb: u64,
    pub telegram: TelegramConfig,
    pub discord: DiscordConfig,
    /// The sections of the platforms not typed above, by platform name.
    #[serde(flatten)]
    pub more: BTreeMap<String, Value>,
}

impl Default for AdaptersConfig {
    fn default() -> Self {
        Self {
            max_attachment_mb: 20,
            telegram: TelegramConfig::default(),
            discord: DiscordConfig::default(),
            more: platforms::all()
                .into_iter()
                .filter_map(|p| p.section_defaults().map(|d| (p.name().to_owned(), d)))
                .collect(),
        }
    }
}

impl AdaptersConfig {
    /// The section `adapters.<platform>` of a platform not typed above.
    pub fn section(&self, platform: &str) -> Option<&Value> {
        self.more.get(platform)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiscordConfig {
    pub enabled: bool,
    /// The REST API's base URL, version included (a test's fake).
    pub api_base_url: String,
    /// The gateway's URL (`ws://` or `wss://`), without query.
    pub gateway_url: String,
    /// Ask for the privileged MESSAGE_CONTENT intent: guild messages that do
    /// not mention the bot keep their text (stored as context). It must be
    /// switched on in the Developer Portal too, or Discord closes the session.
    pub message_content: bool,
    /// This platform's `ingress.dm_policy`; `None`: that one.
    pub dm_policy: Option<DmPolicy>,
    /// The origins (`https://host[:port]`) attachment URLs may point at; a
    /// message's attachment elsewhere is refused, never fetched.
    pub attachment_origins: Vec<String>,
}

/// Is `url` a gateway URL the gateway client can take as it is (it panics
/// on one it cannot parse): `ws://` or `wss://`, a host, no query.
pub fn is_gateway_url(url: &str) -> bool {
    let ws = url.trim_end_matches('/');
    (ws.starts_with("ws://") || ws.starts_with("wss://"))
        && !ws.contains(['?', '#'])
        && format!("{ws}/?v=10&encoding=json")
            .parse::<http::Uri>()
            .is_ok_and(|u| u.host().is_some_and(|h| !h.is_empty()))
}

impl Default for DiscordConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            api_base_url: "https://discord.com/api/v10".into(),
            gateway_url: "wss://gateway.discord.gg".into(),
            message_content: true,
            dm_policy: None,
            attachment_origins: vec![
                "https://cdn.discordapp.com".into(),
                "https://media.discordapp.net".into(),
            ],
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TelegramMode {
    /// `getUpdates` long polling: nothing has to reach the host from outside.
    Polling,
    /// `setWebhook`: Telegram POSTs to `/api/adapters/telegram/webhook`.
    Webhook,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelegramConfig {
    pub enabled: bool,
    pub mode: TelegramMode,
    /// The Bot API's base URL (a local Bot API server, or a test's fake).
    pub api_base_url: String,
    /// Webhook mode: the public https URL Telegram calls, routed to this
    /// host's `/api/adapters/telegram/webhook`.
    pub webhook_url: String,
    /// Seconds one `getUpdates` long poll waits for an update.
    pub poll_timeout_secs: u32,
    /// This platform's `ingress.dm_policy`; `None`: that one.
    pub dm_policy: Option<DmPolicy>,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            mode: TelegramMode::Polling,
            api_base_url: "https://api.telegram.org".into(),
            webhook_url: String::new(),
            poll_timeout_secs: 25,
            dm_policy: None,
        }
    }
}

/// Where `scripted:PATH` files may live besides `<data_dir>/models/`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Absolute directories; a space's chain may name scripted files under them.
    pub scripted_roots: Vec<String>,
    /// The model specs that take pictures as image parts (others get a
    /// picture as a file in the workspace's `inbox/` and a line about it).
    pub vision: Vec<String>,
    /// `openai:MODEL` of an OpenAI-compatible `/audio/transcriptions` at
    /// `providers.openai_base_url` that voice notes and audio files are
    /// transcribed with; empty: they are kept as files only.
    pub transcription: String,
    /// Charged to the space's budget for each transcription.
    pub transcription_cost: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub openai_base_url: String,
    pub anthropic_base_url: String,
    pub request_timeout_secs: u64,
    pub max_retries: u32,
    pub retry_after_cap_secs: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

/// The most containers `sandbox.warm` may keep ready: each holds an
/// engine's container (a shim process, a cgroup) for as long as it waits.
pub const MAX_WARM: usize = 16;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SandboxChoice {
    Auto,
    Docker,
    Process,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// `auto` (docker when the engine answers, else bubblewrap, else no tools),
    /// `docker` or `process` (bubblewrap; unisolated only with `allow_unisolated`).
    pub backend: SandboxChoice,
    /// `process` without bubblewrap runs tools as plain host processes only
    /// when this is set too; `auto` never does.
    pub allow_unisolated: bool,
    /// The `bwrap` binary; empty: the usual places (`/usr/bin/bwrap`, …).
    pub bwrap: String,
    /// Size limit of a workspace, enforced by each turn's overlay (a tmpfs
    /// holding what the turn writes).
    pub workspace_mb: u64,
    /// Agent image; empty means the content-addressed tag `mercury image build` makes.
    pub image: String,
    pub memory_mb: i64,
    pub cpus: f64,
    pub pids: i64,
    pub tmp_mb: i64,
    /// Seconds between orphan sweeps (and engine health checks).
    pub sweep_interval_secs: u64,
    /// Containers kept created, started and paused ahead of the turns that
    /// claim them, each used for one turn and destroyed (docs/sandbox.md,
    /// "Warm sandboxes"); 0 (the default) starts every sandbox cold.
    pub warm: usize,
    /// The Docker engines sandboxes start on (docs/scale-out.md).
    pub docker: DockerEnginesConfig,
}

/// `sandbox.docker`: where the docker backend's containers run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DockerEnginesConfig {
    /// `unix:///path/docker.sock` (this machine: the workspace is bound) or
    /// `tcp://host:port` (elsewhere: the workspace is copied in and back,
    /// the API carried over an exec stream). Empty: the local engine
    /// (`DOCKER_HOST` or `/var/run/docker.sock`).
    pub hosts: Vec<String>,
    /// Client certificates for the `tcp://` engines (all three, or none).
    pub tls: DockerTlsConfig,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DockerTlsConfig {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TurnConfig {
    pub max_steps: u32,
    pub timeout_secs: u64,
    pub tool_timeout_secs: u64,
    pub output_cap_bytes: usize,
    pub history_limit: u32,
    pub max_tokens: u32,
    /// What a chat participant reads when a turn fails; the reason stays in
    /// `runs.error` and the log, never in the reply.
    pub failure_reply: String,
    /// A message whose turn a host crash interrupted this many times is
    /// answered with `failure_reply` and marked failed instead of run again
    /// (a message must never crash-loop the host).
    pub max_crash_retries: u32,
    /// A live reply on a platform that edits sent messages (Telegram,
    /// Discord, Slack) is shown while the model writes it: a first message,
    /// edited as the text grows, ending in exactly the final reply.
    pub stream: bool,
    /// A turn that answers within this many milliseconds sends its reply
    /// whole, with no preview before it.
    pub stream_after_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    /// A new conversation gets its own space (else it waits for `mrctl conversations link`).
    pub auto_space: bool,
    /// Turns a caller may start per minute in a space before "slow down".
    pub per_caller_per_minute: u32,
    /// Who may start a DM with the bot (`adapters.<platform>.dm_policy` overrides it).
    pub dm_policy: DmPolicy,
    /// Seconds a stranger's pairing request stays pending.
    pub pairing_ttl_secs: u64,
    /// Pending pairing requests at most; past it new strangers get nothing.
    pub pairing_max_pending: u64,
}

/// Who may start a DM with the bot (docs/adapters.md, "The sender policy").
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DmPolicy {
    /// A stranger gets a pairing code and no answer until an operator approves it.
    Pairing,
    /// A stranger gets nothing; only allowed senders are answered.
    Allowlist,
    /// Anyone who finds the bot is answered (and spends its model budget).
    Open,
}

impl DmPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DmPolicy::Pairing => "pairing",
            DmPolicy::Allowlist => "allowlist",
            DmPolicy::Open => "open",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TriggerConfig {
    /// Default group trigger: `mention`, `prefix` or `always`.
    #[serde(rename = "match")]
    pub mode: String,
    /// Comma-separated trigger words.
    pub patterns: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SpacesConfig {
    /// A space actor with nothing to do stops after this many seconds.
    pub idle_stop_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Outbound replies are POSTed here; empty disables the webhook adapter.
    pub url: String,
    pub max_attempts: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewConfig {
    pub enabled: bool,
    pub daily_at: String,
    pub timezone: String,
    pub window_hours: u32,
    pub batch_size: u32,
    pub max_concurrency: u32,
    /// The judge's quota floor: calls a minute it always gets, however busy
    /// live traffic is (the quota starts here).
    pub calls_per_minute: u32,
    /// The quota's ceiling: it climbs toward it while the provider has
    /// budget to spare (docs/review.md); below the floor it is the floor, so
    /// a deployment that raised only `calls_per_minute` keeps working.
    pub calls_per_minute_max: u32,
    /// Caller id that receives the digest.
    pub owner: String,
    /// Names redacted besides members' display names.
    pub owner_names: Vec<String>,
    pub spaces_include: Vec<String>,
    pub spaces_exclude: Vec<String>,
    pub include_clients: bool,
    /// Model spec of the judge; empty means the default `model`.
    pub model: String,
    /// The operator's review directory (intake, triage, ledger, known
    /// items); empty means `<data_dir>/reviews/intake`.
    pub intake_dir: String,
    /// When the weekly synthesis fires: `DDD HH:MM` (e.g. `mon 05:00`) in
    /// `timezone`; empty: only `mrctl review weekly-now`.
    pub weekly_at: String,
    /// Unflagged exchanges the weekly recall spot check re-judges.
    pub recall_sample: u32,
    /// Model spec of the weekly judge; empty means the daily judge's.
    pub weekly_model: String,
    /// Findings `mercury review intake` takes from one report, and from one
    /// source in one intake; a report past either is refused by name.
    pub intake_max_findings: u32,
    /// Verify calls one intake makes at most; it stops there and says so.
    pub intake_max_calls: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub body_limit_bytes: usize,
    /// Seconds in-flight requests get after SIGTERM before the host exits anyway.
    pub drain_secs: u64,
    /// Seconds a client has to finish a request's headers once it started
    /// sending them; then the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a connection may stay silent with no request in flight.
    pub idle_timeout_secs: u64,
    /// Open connections per listener (the TCP API, `api.sock` and the
    /// metrics listener each have their own budget); past it a new client
    /// waits in the kernel's backlog.
    pub max_connections: usize,
    /// Largest body a route without a bearer token reads (the platforms'
    /// webhook calls); never more than `body_limit_bytes`
    /// ([`HttpConfig::unauthenticated_limit`]).
    pub unauthenticated_body_bytes: usize,
}

impl HttpConfig {
    /// What a route without a token reads at most: the smaller of the two limits.
    pub fn unauthenticated_limit(&self) -> usize {
        self.unauthenticated_body_bytes.min(self.body_limit_bytes)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8787".into(),
            model: "openai:gpt-4o-mini".into(),
            admins: Vec::new(),
            owner: "owner".into(),
            providers: ProviderConfig::default(),
            prices: BTreeMap::new(),
            currency: "USD".into(),
            timezone: "UTC".into(),
            budgets: BudgetsConfig::default(),
            sandbox: SandboxConfig::default(),
            turn: TurnConfig::default(),
            ingress: IngressConfig::default(),
            trigger: TriggerConfig::default(),
            spaces: SpacesConfig::default(),
            webhook: WebhookConfig::default(),
            review: ReviewConfig::default(),
            http: HttpConfig::default(),
            models: ModelsConfig::default(),
            files: FilesConfig::default(),
            workspace: WorkspaceConfig::default(),
            runs: RunsConfig::default(),
            links: LinksConfig::default(),
            outbox: OutboxConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
            adapters: AdaptersConfig::default(),
            storage: StorageConfig::default(),
            cluster: ClusterConfig::default(),
            web: web::WebConfig::default(),
            extensions: ExtensionsConfig::default(),
            shadow: false,
            shadow_root: String::new(),
        }
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            openai_base_url: "https://api.openai.com/v1".into(),
            anthropic_base_url: "https://api.anthropic.com".into(),
            request_timeout_secs: 120,
            max_retries: 3,
            retry_after_cap_secs: 30,
        }
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            backend: SandboxChoice::Auto,
            allow_unisolated: false,
            bwrap: String::new(),
            workspace_mb: 1024,
            image: String::new(),
            memory_mb: 512,
            cpus: 1.0,
            pids: 256,
            tmp_mb: 64,
            sweep_interval_secs: 300,
            warm: 0,
            docker: DockerEnginesConfig::default(),
        }
    }
}

impl Default for TurnConfig {
    fn default() -> Self {
        Self {
            max_steps: 8,
            timeout_secs: 300,
            tool_timeout_secs: 60,
            output_cap_bytes: 16 * 1024,
            history_limit: 40,
            max_tokens: 2048,
            failure_reply: DEFAULT_FAILURE_REPLY.into(),
            max_crash_retries: 2,
            stream: false,
            stream_after_ms: 1000,
        }
    }
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            auto_space: true,
            per_caller_per_minute: 20,
            dm_policy: DmPolicy::Pairing,
            pairing_ttl_secs: 3600,
            pairing_max_pending: 20,
        }
    }
}

impl Default for TriggerConfig {
    fn default() -> Self {
        Self {
            mode: "mention".into(),
            patterns: "@mercury,mercury".into(),
        }
    }
}

impl Default for SpacesConfig {
    fn default() -> Self {
        Self {
            idle_stop_secs: 300,
        }
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            max_attempts: 5,
        }
    }
}

impl BudgetsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.purposes;
        let pairs = [
            ("budgets.global", self.global),
            ("budgets.space", self.space),
            ("budgets.purposes.turn", p.turn),
            ("budgets.purposes.task", p.task),
            ("budgets.purposes.ask", p.ask),
            ("budgets.purposes.compact", p.compact),
            ("budgets.purposes.judge", p.judge),
            ("budgets.purposes.intake", p.intake),
        ];
        for (key, pair) in pairs {
            for (leaf, v) in [("daily", pair.daily), ("monthly", pair.monthly)] {
                if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
                    return Err(key_err(
                        &format!("{key}.{leaf}"),
                        "must be an amount between 0 (no cap) and 1000000000",
                    ));
                }
            }
        }
        if self.capped_reply.len() > 2000 {
            return Err(key_err(
                "budgets.capped_reply",
                "must be at most 2000 bytes",
            ));
        }
        Ok(())
    }

    /// Whether any cap at all is set in the file (a space's own cap is in the store).
    pub fn any_cap(&self) -> bool {
        let p = &self.purposes;
        [
            self.global,
            self.space,
            p.turn,
            p.task,
            p.ask,
            p.compact,
            p.judge,
            p.intake,
        ]
        .iter()
        .any(CapPair::is_set)
    }
}

impl ReviewConfig {
    /// `review.timezone` (validated at start-up); UTC if it does not parse.
    pub(crate) fn tz(&self) -> chrono_tz::Tz {
        self.timezone.parse().unwrap_or(chrono_tz::UTC)
    }

    /// The local date of `now` in `review.timezone`: the day a review is for.
    pub(crate) fn today(&self, now: chrono::DateTime<chrono::Utc>) -> chrono::NaiveDate {
        now.with_timezone(&self.tz()).date_naive()
    }
}

impl Default for ReviewConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            daily_at: "04:00".into(),
            timezone: String::new(),
            window_hours: 24,
            batch_size: 10,
            max_concurrency: 1,
            calls_per_minute: 30,
            calls_per_minute_max: 3000,
            owner: String::new(),
            owner_names: Vec::new(),
            spaces_include: Vec::new(),
            spaces_exclude: Vec::new(),
            include_clients: false,
            model: String::new(),
            intake_dir: String::new(),
            weekly_at: String::new(),
            recall_sample: 50,
            weekly_model: String::new(),
            intake_max_findings: 200,
            intake_max_calls: 500,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit_bytes: 1 << 20,
            drain_secs: 10,
            header_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_connections: 512,
            unauthenticated_body_bytes: 256 << 10,
        }
    }
}

/// The default `turn.failure_reply`.
pub const DEFAULT_FAILURE_REPLY: &str =
    "Sorry, something went wrong and I could not answer this time. Please try again later.";

/// Trigger words of a comma-separated `trigger.patterns`, longest first (so
/// `@mercury` wins over `mercury`).
pub fn trigger_patterns(raw: &str) -> Vec<String> {
    let mut patterns: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    patterns.sort_by_key(|p| std::cmp::Reverse(p.len()));
    patterns
}

/// The file `mercury init` writes: every key with its default and a comment.
/// A test checks that it parses back to `Settings::default()` (with the owner).
pub fn template(owner: &str) -> String {
    template_with(owner, &StorageConfig::default())
}

/// The template with `storage`'s values in its storage section (what
/// `mercury init --storage-url` writes), comments and all.
pub fn template_with(owner: &str, storage: &StorageConfig) -> String {
    let quoted = |v: &str| serde_json::Value::from(v).to_string();
    let storage_backend = match storage.backend {
        StorageBackend::Sqlite => "sqlite",
        StorageBackend::Postgres => "postgres",
    };
    let storage_url = quoted(&storage.url);
    let storage_password_file = quoted(&storage.password_file);
    format!(
        r#"# Mercury configuration. Every key is shown with its default, its unit and what it does.
# Each key can be overridden by an environment variable: MERCURY_ + the key path
# upper-cased, dots to underscores (review.enabled -> MERCURY_REVIEW_ENABLED).
# Model API keys are read from MERCURY_OPENAI_API_KEY / MERCURY_ANTHROPIC_API_KEY only.
# The log level filter is MERCURY_LOG (e.g. info, debug, info,mercury::ingress=debug).

bind: "127.0.0.1:8787"          # ADDR:PORT of the HTTP API (also served on <data dir>/api.sock)
# Default model chain: specs tried in order, comma-separated.
# Forms: openai:MODEL, anthropic:MODEL, scripted:PATH (replays a rules file).
model: "openai:gpt-4o-mini"     # comma-separated model specs
owner: "{owner}"                # caller id of the owner, a global admin
admins: []                      # list of caller ids: more global admins
providers:                      # model providers
  openai_base_url: "https://api.openai.com/v1"   # URL; any OpenAI-compatible server (Ollama, vLLM, ...)
  anthropic_base_url: "https://api.anthropic.com" # URL
  request_timeout_secs: 120     # seconds per model request
  max_retries: 3                # count; retries on 429/5xx, with jitter
  retry_after_cap_secs: 30      # seconds: longest wait a Retry-After may ask for
# Price per million tokens by model spec, for token_usage.cost, e.g.
#   "openai:gpt-4o-mini": {{input: 0.15, output: 0.6}}
# Built-in prices (USD, from a pinned litellm release: docs/spend.md) cover common
# openai: and anthropic: models; entries here override them.
prices: {{}}                      # map of spec -> {{input, output}} in currency per million tokens
currency: "USD"                 # label of the currency prices and caps are in (built-in prices only for USD)
timezone: "UTC"                 # IANA time zone: budget periods roll over at its midnight
budgets:                        # spend caps (docs/spend.md); every amount in currency, 0 = no cap
  global:                       # the whole deployment
    daily: 0.0                  # amount per day
    monthly: 0.0                # amount per calendar month
  space:                        # each space, unless `mrctl budget set` gave it its own
    daily: 0.0                  # amount per day
    monthly: 0.0                # amount per calendar month
  purposes:                     # per kind of call, over the whole deployment
    turn: {{daily: 0.0, monthly: 0.0}}     # live turns
    task: {{daily: 0.0, monthly: 0.0}}     # scheduled task turns
    ask: {{daily: 0.0, monthly: 0.0}}      # ask turns
    compact: {{daily: 0.0, monthly: 0.0}}  # history compaction
    judge: {{daily: 0.0, monthly: 0.0}}    # the review judge
    intake: {{daily: 0.0, monthly: 0.0}}   # the review intake's verify calls
  allow_unpriced: false         # true|false: a model with no price may be called under a cap
  # What a turn stopped by a cap answers, once per period per conversation; empty: nothing.
  capped_reply: "I have reached my spending limit for now and will answer again when it resets."
sandbox:                        # where shell and mrctl tool calls run
  backend: auto                 # auto (docker, else bubblewrap, else no tools) | docker | process (bubblewrap)
  allow_unisolated: false       # true|false; process without bubblewrap: plain host processes (NOT isolation)
  bwrap: ""                     # path of bwrap; empty: /usr/bin/bwrap and the usual places
  workspace_mb: 1024            # MB: workspace size limit, enforced by each turn's overlay
  image: ""                     # image tag; empty: the image `mercury image build` makes
  memory_mb: 512                # MB of memory per container
  cpus: 1.0                     # CPUs per container (fractions allowed)
  pids: 256                     # count: processes per container
  tmp_mb: 64                    # MB of /tmp per container
  sweep_interval_secs: 300      # seconds between orphan container sweeps (this instance's label only) and engine health checks
  warm: 0                       # count, 0-16: docker containers started and paused ahead, one per turn, never reused; 0: off
  docker:                       # the Docker engines containers run on (docs/scale-out.md)
    hosts: []                   # unix:///path/docker.sock (this machine: bound) | tcp://host:port (elsewhere: workspace synced); empty: the local engine
    tls:                        # client certificates for the tcp:// engines: all three paths, or none
      ca: ""                    # path of the CA certificate (PEM)
      cert: ""                  # path of this host's certificate (PEM)
      key: ""                   # path of this host's key (PEM)
turn:                           # one agent turn
  max_steps: 8                  # count: model calls per turn
  timeout_secs: 300             # seconds a whole turn may take
  tool_timeout_secs: 60         # seconds one tool call may take
  output_cap_bytes: 16384       # bytes of tool output kept per stream
  history_limit: 40             # count: recent messages in the prompt
  max_tokens: 2048              # tokens per model answer
  # What a chat participant reads when a turn fails (the reason goes to runs.error and the log).
  failure_reply: "Sorry, something went wrong and I could not answer this time. Please try again later."
  max_crash_retries: 2          # count: host crashes during one message's turn before it is failed, not run again
  stream: false                 # true|false: show a reply while it is written, on platforms that edit messages (docs/adapters.md)
  stream_after_ms: 1000         # milliseconds: a turn that answers sooner sends its reply whole, with no preview
ingress:                        # inbound platform messages
  auto_space: true              # true|false: a new conversation gets its own space
  per_caller_per_minute: 20     # messages per minute per caller, then "slow down"
  dm_policy: pairing            # pairing | allowlist | open: who may DM the bot (docs/adapters.md)
  pairing_ttl_secs: 3600        # seconds a stranger's pairing request stays pending
  pairing_max_pending: 20       # count: pending pairing requests; past it new strangers get nothing
trigger:                        # when a group message addresses the bot
  match: mention                # groups: mention | prefix | always (DMs always trigger)
  patterns: "@mercury,mercury"  # comma-separated trigger words (a leading one is cut from the prompt)
spaces:                         # space actors
  idle_stop_secs: 300           # seconds: an idle space actor stops; it restarts on demand
webhook:                        # the webhook adapter
  url: ""                       # URL each outbound reply is POSTed to; empty: pull from /api/outbox
  max_attempts: 5               # count: delivery attempts per reply
review:                         # the daily conversation review
  enabled: false                # true|false
  daily_at: "04:00"             # HH:MM local time in review.timezone
  timezone: ""                  # IANA time zone name; empty: the top-level timezone
  window_hours: 24              # hours of conversation each scan reads
  batch_size: 10                # count: exchanges per judge call
  max_concurrency: 1            # count: judge calls at once
  calls_per_minute: 30          # judge calls per minute at least (the adaptive quota's floor)
  calls_per_minute_max: 3000    # judge calls per minute at most, while live traffic leaves the provider budget (never below calls_per_minute)
  owner: ""                     # caller id that gets the digest DM
  owner_names: []               # list of names redacted from reports besides members' names
  spaces_include: []            # list of space ids; empty: every space
  spaces_exclude: []            # list of space ids
  include_clients: false        # true|false: spaces tagged `client` are skipped unless true
  model: ""                     # judge model spec; empty: the default model
  intake_dir: ""                # path of the intake's review directory; empty: <data dir>/reviews/intake
  weekly_at: ""                 # weekly synthesis day and HH:MM, e.g. "mon 05:00"; empty: only mrctl review weekly-now
  recall_sample: 50             # count: unflagged exchanges the weekly recall spot check re-judges
  weekly_model: ""              # weekly judge model spec; empty: the daily judge's
  intake_max_findings: 200      # count: findings the intake takes from one report and from one source
  intake_max_calls: 500         # count: verify calls one intake makes, then it stops and says so
http:                           # the HTTP API
  body_limit_bytes: 1048576     # bytes: largest request body
  drain_secs: 10                # seconds in-flight requests get after SIGTERM
  header_timeout_secs: 10       # seconds a client has to finish a request's headers, then closed
  idle_timeout_secs: 60         # seconds a connection may be silent with no request in flight
  max_connections: 512          # connections per listener (TCP API, api.sock and metrics each); keep LimitNOFILE above 2x this + 1024
  unauthenticated_body_bytes: 262144  # bytes: largest body of a route without a token (webhook calls); at most body_limit_bytes
models:                         # model files
  # A space's chain may name scripted:PATH only for files under <data dir>/models/
  # or these absolute directories (and only a global admin may set one).
  scripted_roots: []            # list of absolute directories
  vision: []                    # list of model specs that take pictures as image parts (openai:gpt-4o, anthropic:…)
  transcription: ""             # openai:MODEL transcribing voice notes (POST to providers.openai_base_url + /audio/transcriptions); empty: kept as files only
  transcription_cost: 0.0       # amount: charged per transcription to the space's budget
metrics:                        # Prometheus /metrics (always on the API with an owner or global admin token)
  bind: ""                      # ADDR:PORT of a listener serving /metrics without a token; empty: none
log:                            # the host's log on stderr
  format: text                  # text | json (one object per line)
files:                          # the workspace file routes (/api/files)
  max_bytes: 1048576            # bytes: largest file /api/files reads or writes (413 beyond)
workspace:                      # how large a workspace tree may grow (besides sandbox.workspace_mb)
  max_depth: 64                 # count: directories nested below a workspace's root
  max_entries: 100000           # count: files, directories and links in one workspace
runs:                           # run traces
  keep_days: 30                 # days: run traces (run_steps) older than this are deleted
  step_output_bytes: 2048       # bytes: output text kept per traced step
links:                          # space links
  audit_keep_days: 365          # days: link audit rows (every act-as request) older than this are deleted
outbox:                         # replies waiting for (or handed to) an adapter
  keep_days: 7                  # days: delivered or acknowledged replies older than this are deleted; undelivered ones are kept
web:                            # the host's web_fetch tool (off per space until `mrctl config set web.fetch on`)
  allow: []                     # names (wiki.corp, *.corp.example), IPs or CIDRs let past the loopback/private/link-local refusal
  deny: []                      # names, IPs or CIDRs always refused (matched after DNS)
  max_bytes: 2097152            # bytes: one response body read at most (the rest is cut off)
  timeout_secs: 20              # seconds: one fetch, DNS, redirects and body included
  max_redirects: 5              # count: redirects followed, each checked like the first URL
  fetch_cost: 0.0               # amount: charged per fetch to the space's budget
extensions:                     # installed extensions (docs/extensions.md)
  shadow_http: []               # on a shadow: <extension>.<server> http servers its turns may call
adapters:                       # in-process chat adapters (docs/adapters.md)
  max_attachment_mb: 20         # MB: largest picture, voice note or file fetched into a workspace's inbox/ (larger: refused with a sentence)
  # Telegram. The bot token is read from MERCURY_TELEGRAM_BOT_TOKEN only.
  telegram:
    enabled: false              # true|false
    mode: polling               # polling (getUpdates) | webhook (setWebhook, secret checked on every call)
    api_base_url: "https://api.telegram.org"  # URL of the Bot API (a local Bot API server, a test's fake)
    webhook_url: ""             # URL: webhook mode's public https URL of /api/adapters/telegram/webhook
    poll_timeout_secs: 25       # seconds one getUpdates long poll waits (at most 50)
    dm_policy: null             # pairing | allowlist | open; null: ingress.dm_policy
  # Discord. The bot token is read from MERCURY_DISCORD_BOT_TOKEN only.
  discord:
    enabled: false              # true|false
    api_base_url: "https://discord.com/api/v10"  # URL of the REST API, version included (a test's fake)
    gateway_url: "wss://gateway.discord.gg"       # URL (ws:// or wss://) of the gateway, no query
    message_content: true       # true|false: the privileged MESSAGE_CONTENT intent (unmentioned guild messages keep their text)
    dm_policy: null             # pairing | allowlist | open; null: ingress.dm_policy
    attachment_origins: ["https://cdn.discordapp.com", "https://media.discordapp.net"]  # where attachment URLs may point (others are refused)
  # WhatsApp (Cloud API). Secrets from MERCURY_WHATSAPP_ACCESS_TOKEN,
  # MERCURY_WHATSAPP_APP_SECRET and MERCURY_WHATSAPP_VERIFY_TOKEN only.
  whatsapp:
    enabled: false              # true|false
    graph_base_url: "https://graph.facebook.com/v21.0"  # URL of the Graph API, version included (a test's fake)
    phone_number_id: ""         # the business phone number's id (digits, App Dashboard > WhatsApp > API Setup)
    window_template: ""         # name of an approved template sent outside the 24-hour window; "" sends nothing
    window_template_language: en_US  # the template's language code
    dm_policy: null             # pairing | allowlist | open; null: ingress.dm_policy
    media_origins: ["https://lookaside.fbsbx.com"]  # where a media object's download URL may point (fetched with the access token)
  # Slack (Socket Mode). Tokens from MERCURY_SLACK_APP_TOKEN (xapp-) and MERCURY_SLACK_BOT_TOKEN (xoxb-) only.
  slack:
    enabled: false              # true|false
    api_base_url: "https://slack.com/api"  # URL of the Web API (a test's fake)
    dm_policy: null             # pairing | allowlist | open; null: ingress.dm_policy
    file_origins: ["https://files.slack.com"]  # where a message's files may be downloaded from, with the bot token

storage:                        # where the state lives (docs/storage.md)
  backend: {storage_backend}               # sqlite (<data dir>/state.db) | postgres
  url: {storage_url}                       # postgres://USER@HOST:5432/DB?sslmode=require (only with postgres)
  password_file: {storage_password_file}             # a file holding the PostgreSQL password (not in the URL)
  workspaces_dir: ""            # path; empty: <data dir>/spaces (many hosts: one shared directory)
  reviews_dir: ""               # path; empty: <data dir>/reviews (many hosts: one shared directory)
  shared_dir: ""                # path; many hosts: spaces/, reviews/, models/ and global/ in one shared directory

cluster:                        # many hosts on one PostgreSQL database (docs/scale-out.md)
  enabled: false                # true|false: spaces are leased to one host at a time
  host_name: ""                 # name in mercury cluster status; empty: the hostname
  advertise_url: ""             # URL the other hosts reach this API at; empty: http://<bind>
  lease_secs: 15                # seconds: a dead host's spaces move after this
  poll_ms: 500                  # milliseconds between looks for pending messages

# Shadow mode (docs/shadow.md): no platform adapter, no webhook post; every
# outbound send goes to <data dir>/shadow/transcript.jsonl. MERCURY_SHADOW takes
# only 1 or true. A shadow refuses to start unless its data dir is under shadow_root.
shadow: false                   # true|false: a shadow copy (only under shadow_root)
shadow_root: ""                 # absolute path the shadows' data dirs must lie under
"#
    )
}

/// Sets dotted keys (`sandbox.backend`) in the config file at `path`,
/// keeping every other key and comment-free YAML, and checks the result is a
/// valid config before writing it. The one way code (the temp host, the
/// tests) edits a `mercury.yaml`: no string replacement.
pub fn set_keys(path: &Path, keys: &[(&str, Value)]) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut root: Value = serde_yaml_ng::from_str(&text).map_err(|e| ConfigError::Yaml {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    for (key, value) in keys {
        set_dotted(&mut root, key, value.clone())?;
    }
    let settings = from_value(root.clone(), &BTreeMap::new())?;
    let out = serde_yaml_ng::to_string(&root).map_err(|e| key_err("(file)", e.to_string()))?;
    std::fs::write(path, out).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(settings)
}

fn set_dotted(root: &mut Value, dotted: &str, value: Value) -> Result<(), ConfigError> {
    if root.is_null() {
        *root = Value::Mapping(Default::default());
    }
    let parts: Vec<&str> = dotted.split('.').collect();
    let mut cur = root;
    for (i, part) in parts.iter().enumerate() {
        let map = cur
            .as_mapping_mut()
            .ok_or_else(|| key_err(dotted, "a parent of this key is not a mapping"))?;
        let key = Value::String((*part).to_owned());
        if i + 1 == parts.len() {
            map.insert(key, value);
            return Ok(());
        }
        cur = map
            .entry(key)
            .or_insert_with(|| Value::Mapping(Default::default()));
    }
    Err(key_err(dotted, "an empty key"))
}

/// The currency label `path` names (the default's when it names none or the
/// file is absent), without validating the rest: a shadow's report labels
/// its cost with it, and a key the operator's shell would set is no reason
/// to refuse that.
pub fn currency_of(path: &Path) -> Result<String, ConfigError> {
    let fallback = || Settings::default().currency;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fallback()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let file: Value = serde_yaml_ng::from_str(&text).map_err(|e| ConfigError::Yaml {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(match file.get("currency").and_then(Value::as_str) {
        Some(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => fallback(),
    })
}

/// Reads `path` (absent file = all defaults), applies `env`, validates.
pub fn load(path: &Path, env: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
    let file: Value = match std::fs::read_to_string(path) {
        Ok(text) => serde_yaml_ng::from_str(&text).map_err(|e| ConfigError::Yaml {
            path: path.display().to_string(),
            message: e.to_string(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.display().to_string(),
                source,
            })
        }
    };
    from_value(file, env)
}

pub fn from_value(file: Value, env: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
    let defaults = serde_yaml_ng::to_value(Settings::default())
        .map_err(|e| key_err("(defaults)", e.to_string()))?;
    let mut merged = defaults.clone();
    merge(&mut merged, file, "")?;
    apply_env(&mut merged, &defaults, env)?;
    let mut settings: Settings = serde_yaml_ng::from_value(merged).map_err(|e| {
        // serde_yaml_ng names the path in its message; keep it whole.
        key_err("(file)", e.to_string())
    })?;
    if settings.review.timezone.trim().is_empty() {
        settings.review.timezone = settings.timezone.clone();
    }
    settings.validate()?;
    Ok(settings)
}

fn merge(base: &mut Value, over: Value, path: &str) -> Result<(), ConfigError> {
    match (base, over) {
        (_, Value::Null) => Ok(()),
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                let key = k
                    .as_str()
                    .ok_or_else(|| key_err(path, "keys must be strings"))?
                    .to_owned();
                let full = join(path, &key);
                match b.get_mut(k.clone()) {
                    Some(slot) if slot.is_mapping() && path != "prices" && key != "prices" => {
                        merge(slot, v, &full)?;
                    }
                    Some(slot) => *slot = v,
                    None => {
                        // A typo's nearest sibling, by the same measure as
                        // an unknown variable's (issue 25).
                        let siblings: Vec<String> = b
                            .keys()
                            .filter_map(|k| k.as_str())
                            .map(str::to_owned)
                            .collect();
                        let why = match nearest_key(&key, &siblings) {
                            Some(near) => {
                                format!("unknown key; did you mean {}?", join(path, &near))
                            }
                            None => "unknown key".to_owned(),
                        };
                        return Err(key_err(&full, why));
                    }
                }
            }
            Ok(())
        }
        (b, o) => {
            *b = o;
            Ok(())
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

pub fn env_name(path: &str) -> String {
    format!("MERCURY_{}", path.to_uppercase().replace('.', "_"))
}

/// Sets in `merged` every key the environment sets: the walk is
/// [`collect_env`]'s, so what a host applies and what it records are one list.
fn apply_env(
    merged: &mut Value,
    defaults: &Value,
    env: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    let mut sets = Vec::new();
    collect_env(defaults, "", env, &mut sets)?;
    for (key, value) in sets {
        let mut slot = Some(&mut *merged);
        for part in key.split('.') {
            slot = slot.and_then(|v| v.get_mut(part));
        }
        if let Some(slot) = slot {
            *slot = value;
        }
    }
    Ok(())
}

/// The config keys `env` sets (`MERCURY_<KEY>`) and the values a host reads
/// from them, in key order: what a host's environment adds to its file (a
/// shadow snapshot records them, docs/shadow.md).
pub fn env_keys(env: &BTreeMap<String, String>) -> Result<Vec<(String, Value)>, ConfigError> {
    let defaults = serde_yaml_ng::to_value(Settings::default())
        .map_err(|e| key_err("(defaults)", e.to_string()))?;
    let mut out = Vec::new();
    collect_env(&defaults, "", env, &mut out)?;
    Ok(out)
}

fn collect_env(
    defaults: &Value,
    path: &str,
    env: &BTreeMap<String, String>,
    out: &mut Vec<(String, Value)>,
) -> Result<(), ConfigError> {
    let Value::Mapping(dmap) = defaults else {
        return Ok(());
    };
    for (k, dv) in dmap {
        let Some(key) = k.as_str() else { continue };
        let full = join(path, key);
        if dv.is_mapping() && full != "prices" {
            collect_env(dv, &full, env, out)?;
            continue;
        }
        if let Some(raw) = env.get(&env_name(&full)) {
            out.push((full.clone(), parse_env_value(&full, dv, raw)?));
        }
    }
    Ok(())
}

fn parse_env_value(key: &str, default: &Value, raw: &str) -> Result<Value, ConfigError> {
    let raw = raw.trim();
    // Shadow mode protects people: a typo must not quietly mean "live".
    if key == "shadow" {
        return match raw {
            "1" | "true" => Ok(Value::Bool(true)),
            _ => Err(key_err(
                key,
                format!("MERCURY_SHADOW must be 1 or true (unset it for a live host), not {raw:?}"),
            )),
        };
    }
    Ok(match default {
        Value::Bool(_) => Value::Bool(match raw.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" | "" => false,
            _ => {
                return Err(key_err(
                    key,
                    format!("{} must be true or false, not {raw:?}", env_name(key)),
                ))
            }
        }),
        Value::Number(n) if n.is_f64() => Value::Number(
            raw.parse::<f64>()
                .map_err(|_| {
                    key_err(
                        key,
                        format!("{} must be a number, not {raw:?}", env_name(key)),
                    )
                })?
                .into(),
        ),
        Value::Number(_) => Value::Number(
            raw.parse::<u64>()
                .map_err(|_| {
                    key_err(
                        key,
                        format!("{} must be a whole number, not {raw:?}", env_name(key)),
                    )
                })?
                .into(),
        ),
        Value::Sequence(_) => Value::Sequence(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        ),
        Value::Mapping(_) => serde_yaml_ng::from_str(raw).map_err(|e| {
            key_err(
                key,
                format!("{} must be a YAML mapping: {e}", env_name(key)),
            )
        })?,
        _ => Value::String(raw.to_owned()),
    })
}

impl Settings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.bind
            .parse::<SocketAddr>()
            .map_err(|_| key_err("bind", format!("{:?} is not ADDR:PORT", self.bind)))?;
        if self.model_chain().is_empty() {
            return Err(key_err("model", "at least one model spec is needed"));
        }
        for (key, spec) in self.configured_specs() {
            check_model_spec(&spec).map_err(|m| key_err(key, m))?;
        }
        crate::ids::validate_operator_id(&self.owner).map_err(|m| key_err("owner", m))?;
        for a in &self.admins {
            crate::ids::validate_operator_id(a).map_err(|m| key_err("admins", m))?;
        }
        match self.storage.backend {
            // A shadow's rows are its own file's: a server it could reach
            // might be the live deployment's (docs/storage.md).
            StorageBackend::Postgres if self.shadow => {
                return Err(key_err(
                    "storage.backend",
                    "a shadow (shadow: true) keeps its state in its own state.db: storage.backend must be sqlite",
                ))
            }
            StorageBackend::Postgres if self.storage.url.trim().is_empty() => {
                return Err(key_err(
                    "storage.url",
                    "storage.backend is postgres, so storage.url (MERCURY_STORAGE_URL) must name the database: postgres://USER@HOST:5432/DB",
                ))
            }
            StorageBackend::Postgres
                if !(self.storage.url.starts_with("postgres://")
                    || self.storage.url.starts_with("postgresql://")) =>
            {
                return Err(key_err(
                    "storage.url",
                    "must be a postgres:// URL (postgres://USER@HOST:5432/DB)",
                ))
            }
            StorageBackend::Sqlite if !self.storage.url.trim().is_empty() => {
                return Err(key_err(
                    "storage.url",
                    "is set but storage.backend is sqlite: set storage.backend: postgres to use it, or remove the URL",
                ))
            }
            _ => {}
        }
        for (key, dir) in [
            ("storage.workspaces_dir", &self.storage.workspaces_dir),
            ("storage.reviews_dir", &self.storage.reviews_dir),
            ("storage.shared_dir", &self.storage.shared_dir),
        ] {
            // A relative one would move with the working directory of
            // whichever command reads it.
            let dir = dir.trim();
            if !dir.is_empty() && !Path::new(dir).is_absolute() {
                return Err(key_err(
                    key,
                    "must be an absolute path (it is mounted on every host at the same place)",
                ));
            }
        }
        if self.cluster.enabled {
            if self.storage.backend != StorageBackend::Postgres {
                return Err(key_err(
                    "cluster.enabled",
                    "many hosts share one PostgreSQL database: set storage.backend: postgres first",
                ));
            }
            if !(2..=3600).contains(&self.cluster.lease_secs) {
                return Err(key_err("cluster.lease_secs", "must be 2..=3600 seconds"));
            }
            if !(50..=60_000).contains(&self.cluster.poll_ms) {
                return Err(key_err(
                    "cluster.poll_ms",
                    "must be 50..=60000 milliseconds",
                ));
            }
        }
        if !matches!(self.trigger.mode.as_str(), "mention" | "prefix" | "always") {
            return Err(key_err(
                "trigger.match",
                "must be mention, prefix or always",
            ));
        }
        let positive = [
            ("turn.max_steps", u64::from(self.turn.max_steps)),
            ("turn.timeout_secs", self.turn.timeout_secs),
            ("turn.tool_timeout_secs", self.turn.tool_timeout_secs),
            ("turn.history_limit", u64::from(self.turn.history_limit)),
            ("turn.max_tokens", u64::from(self.turn.max_tokens)),
            (
                "ingress.per_caller_per_minute",
                u64::from(self.ingress.per_caller_per_minute),
            ),
            ("review.batch_size", u64::from(self.review.batch_size)),
            (
                "review.max_concurrency",
                u64::from(self.review.max_concurrency),
            ),
            (
                "review.calls_per_minute",
                u64::from(self.review.calls_per_minute),
            ),
            (
                "review.calls_per_minute_max",
                u64::from(self.review.calls_per_minute_max),
            ),
            ("review.window_hours", u64::from(self.review.window_hours)),
            ("http.body_limit_bytes", self.http.body_limit_bytes as u64),
            ("http.header_timeout_secs", self.http.header_timeout_secs),
            ("http.idle_timeout_secs", self.http.idle_timeout_secs),
            ("http.max_connections", self.http.max_connections as u64),
            (
                "http.unauthenticated_body_bytes",
                self.http.unauthenticated_body_bytes as u64,
            ),
            ("files.max_bytes", self.files.max_bytes as u64),
            (
                "turn.max_crash_retries",
                u64::from(self.turn.max_crash_retries),
            ),
            (
                "review.intake_max_findings",
                u64::from(self.review.intake_max_findings),
            ),
            (
                "review.intake_max_calls",
                u64::from(self.review.intake_max_calls),
            ),
            ("workspace.max_depth", self.workspace.max_depth as u64),
            ("workspace.max_entries", self.workspace.max_entries),
            ("runs.keep_days", u64::from(self.runs.keep_days)),
            (
                "links.audit_keep_days",
                u64::from(self.links.audit_keep_days),
            ),
            ("outbox.keep_days", u64::from(self.outbox.keep_days)),
            (
                "sandbox.sweep_interval_secs",
                self.sandbox.sweep_interval_secs,
            ),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(key_err(key, "must be greater than 0"));
            }
        }
        if self.http.max_connections > MAX_CONNECTIONS_CEILING {
            return Err(key_err(
                "http.max_connections",
                format!("must be at most {MAX_CONNECTIONS_CEILING}"),
            ));
        }
        if !(60..=30 * 86_400).contains(&self.ingress.pairing_ttl_secs) {
            return Err(key_err(
                "ingress.pairing_ttl_secs",
                "must be between 60 and 2592000 (30 days)",
            ));
        }
        if !(1..=10_000).contains(&self.ingress.pairing_max_pending) {
            return Err(key_err(
                "ingress.pairing_max_pending",
                "must be between 1 and 10000",
            ));
        }
        if self.turn.failure_reply.trim().is_empty() {
            return Err(key_err("turn.failure_reply", "must not be empty"));
        }
        if self.workspace.max_depth > 4096 {
            return Err(key_err("workspace.max_depth", "must be at most 4096"));
        }
        if self.workspace.max_entries > 10_000_000 {
            return Err(key_err("workspace.max_entries", "must be at most 10000000"));
        }
        if self.turn.output_cap_bytes < 256 {
            return Err(key_err("turn.output_cap_bytes", "must be at least 256"));
        }
        if self.sandbox.memory_mb < 16 || self.sandbox.pids < 8 || self.sandbox.tmp_mb < 1 {
            return Err(key_err(
                "sandbox",
                "memory_mb ≥ 16, pids ≥ 8 and tmp_mb ≥ 1 are needed",
            ));
        }
        if self.sandbox.workspace_mb < 1 || self.sandbox.workspace_mb > 1 << 20 {
            return Err(key_err(
                "sandbox.workspace_mb",
                "must be between 1 and 1048576 (MB)",
            ));
        }
        for host in &self.sandbox.docker.hosts {
            let ok = match (host.strip_prefix("unix://"), host.strip_prefix("tcp://")) {
                (Some(path), _) => path.starts_with('/'),
                (_, Some(addr)) => !addr.is_empty() && !addr.contains('/'),
                _ => false,
            };
            if !ok {
                return Err(key_err(
                    "sandbox.docker.hosts",
                    format!("{host:?} is neither unix:///path/to/docker.sock nor tcp://host:port"),
                ));
            }
        }
        let tls = &self.sandbox.docker.tls;
        let given = [&tls.ca, &tls.cert, &tls.key]
            .iter()
            .filter(|p| !p.trim().is_empty())
            .count();
        if given != 0 && given != 3 {
            return Err(key_err(
                "sandbox.docker.tls",
                "give ca, cert and key together, or none",
            ));
        }
        if self.sandbox.warm > MAX_WARM {
            return Err(key_err(
                "sandbox.warm",
                format!(
                    "must be between 0 (off) and {MAX_WARM} containers kept ready, got {}",
                    self.sandbox.warm
                ),
            ));
        }
        if !(self.sandbox.cpus > 0.0 && self.sandbox.cpus <= 64.0) {
            return Err(key_err("sandbox.cpus", "must be between 0 and 64"));
        }
        parse_daily_at(&self.review.daily_at).map_err(|m| key_err("review.daily_at", m))?;
        if !self.review.weekly_at.trim().is_empty() {
            parse_weekly_at(&self.review.weekly_at).map_err(|m| key_err("review.weekly_at", m))?;
        }
        self.timezone
            .parse::<chrono_tz::Tz>()
            .map_err(|_| key_err("timezone", format!("unknown time zone {:?}", self.timezone)))?;
        if self.currency.trim().is_empty() || self.currency.len() > 12 {
            return Err(key_err("currency", "must be a short label such as USD"));
        }
        self.budgets.validate()?;
        for (spec, p) in &self.prices {
            if !(p.input.is_finite() && p.output.is_finite() && p.input >= 0.0 && p.output >= 0.0) {
                return Err(key_err(
                    "prices",
                    format!("{spec:?}: input and output must be numbers of at least 0"),
                ));
            }
        }
        self.review.timezone.parse::<chrono_tz::Tz>().map_err(|_| {
            key_err(
                "review.timezone",
                format!("unknown time zone {:?}", self.review.timezone),
            )
        })?;
        if let Some(r) = self
            .models
            .scripted_roots
            .iter()
            .find(|r| !r.starts_with('/'))
        {
            return Err(key_err(
                "models.scripted_roots",
                format!("{r:?} is not an absolute path"),
            ));
        }
        let t = &self.models.transcription;
        if !t.is_empty()
            && t.strip_prefix("openai:")
                .is_none_or(|m| m.trim().is_empty())
        {
            return Err(key_err(
                "models.transcription",
                format!("{t:?} is not openai:MODEL (an OpenAI-compatible /audio/transcriptions)"),
            ));
        }
        if !self.models.transcription_cost.is_finite() || self.models.transcription_cost < 0.0 {
            return Err(key_err(
                "models.transcription_cost",
                "must be a number of at least 0",
            ));
        }
        if !self.metrics.bind.is_empty() && self.metrics.bind.parse::<SocketAddr>().is_err() {
            return Err(key_err(
                "metrics.bind",
                format!("{:?} is not ADDR:PORT", self.metrics.bind),
            ));
        }
        let tg = &self.adapters.telegram;
        if !(tg.api_base_url.starts_with("http://") || tg.api_base_url.starts_with("https://")) {
            return Err(key_err(
                "adapters.telegram.api_base_url",
                "must start with http:// or https://",
            ));
        }
        if tg.enabled
            && tg.mode == TelegramMode::Webhook
            && !tg.webhook_url.starts_with("https://")
            && !tg.webhook_url.starts_with("http://")
        {
            return Err(key_err(
                "adapters.telegram.webhook_url",
                "webhook mode needs the public URL Telegram calls (https://…/api/adapters/telegram/webhook)",
            ));
        }
        if tg.poll_timeout_secs > 50 {
            return Err(key_err(
                "adapters.telegram.poll_timeout_secs",
                "must be at most 50",
            ));
        }
        let dc = &self.adapters.discord;
        let https = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        if !https(&dc.api_base_url) || dc.api_base_url.contains(['?', '#']) {
            return Err(key_err(
                "adapters.discord.api_base_url",
                "must start with http:// or https:// and hold no query",
            ));
        }
        if !is_gateway_url(&dc.gateway_url) {
            return Err(key_err(
                "adapters.discord.gateway_url",
                "must be a ws:// or wss:// URL with a host and no query",
            ));
        }
        for p in platforms::all() {
            p.check(self).map_err(|(key, why)| key_err(&key, why))?;
        }
        self.web.check().map_err(|(key, why)| key_err(&key, why))?;
        for s in &self.extensions.shadow_http {
            let ok = s
                .split_once('.')
                .is_some_and(|(e, v)| !e.is_empty() && !v.is_empty() && !v.contains('.'));
            if !ok {
                return Err(key_err(
                    "extensions.shadow_http",
                    format!("{s:?} is not <extension>.<server>"),
                ));
            }
        }
        if !(self.shadow_root.is_empty() || self.shadow_root.starts_with('/')) {
            return Err(key_err(
                "shadow_root",
                format!("{:?} is not an absolute path", self.shadow_root),
            ));
        }
        let url = &self.webhook.url;
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(key_err(
                "webhook.url",
                "must start with http:// or https://",
            ));
        }
        Ok(())
    }

    /// The default model chain, split on commas.
    pub fn model_chain(&self) -> Vec<String> {
        split_chain(&self.model)
    }

    /// Every model spec this file names, with the key that names it: the
    /// default chain, the daily judge and the weekly judge (each checked,
    /// keyed and allowed as scripted the same way).
    pub fn configured_specs(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = self
            .model_chain()
            .into_iter()
            .map(|m| ("model", m))
            .collect();
        for (key, spec) in [
            ("review.model", &self.review.model),
            ("review.weekly_model", &self.review.weekly_model),
        ] {
            if !spec.is_empty() {
                out.push((key, spec.clone()));
            }
        }
        out
    }

    /// The deployment's time zone (validated at start-up; UTC if it does not parse).
    pub fn tz(&self) -> chrono_tz::Tz {
        self.timezone.parse().unwrap_or(chrono_tz::UTC)
    }

    /// The sender policy of `platform`'s DMs: its adapter's own, else `ingress.dm_policy`.
    pub fn dm_policy(&self, platform: &str) -> DmPolicy {
        platforms::find(platform)
            .and_then(|p| p.dm_policy(self))
            .unwrap_or(self.ingress.dm_policy)
    }

    /// Where `open` is in force: the keys that say so (warned at every start).
    pub fn open_dm_policies(&self) -> Vec<String> {
        let mut keys = Vec::new();
        if self.ingress.dm_policy == DmPolicy::Open {
            keys.push("ingress.dm_policy".to_owned());
        }
        for p in platforms::all() {
            if p.dm_policy(self) == Some(DmPolicy::Open) {
                keys.push(format!("adapters.{}.dm_policy", p.name()));
            }
        }
        keys
    }

    pub fn is_global_admin(&self, caller: &str) -> bool {
        caller == self.owner || self.admins.iter().any(|a| a == caller)
    }
}

pub fn split_chain(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Checks the form of a model spec without touching the file or network.
pub fn check_model_spec(spec: &str) -> Result<(), String> {
    match spec.split_once(':') {
        Some(("openai" | "anthropic" | "scripted", rest)) if !rest.trim().is_empty() => Ok(()),
        _ => Err(format!(
            "{spec:?} is not a model spec (use openai:MODEL, anthropic:MODEL or scripted:PATH)"
        )),
    }
}

/// `HH:MM` → (hour, minute).
pub fn parse_daily_at(raw: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{raw:?} is not a time of day (use HH:MM, e.g. 04:00)");
    let (h, m) = raw.split_once(':').ok_or_else(bad)?;
    let h: u32 = h.parse().map_err(|_| bad())?;
    let m: u32 = m.parse().map_err(|_| bad())?;
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok((h, m))
}

/// The largest `http.max_connections`: each connection is a descriptor, and
/// three listeners' budgets must fit under the process's `LimitNOFILE`.
pub const MAX_CONNECTIONS_CEILING: usize = 100_000;

/// `MERCURY_*` variables that are not config keys: secrets, the log filter,
/// the data dir, and mrctl's and the sandbox's own.
pub const OTHER_ENV: &[&str] = &[
    "MERCURY_OPENAI_API_KEY",
    "MERCURY_ANTHROPIC_API_KEY",
    "MERCURY_LOG",
    "MERCURY_DATA_DIR",
    "MERCURY_MRCTL",
    "MERCURY_URL",
    "MERCURY_TOKEN",
    "MERCURY_RUN_TOKEN",
    "MERCURY_SPACE",
    "MERCURY_SOCKET",
    "MERCURY_TIMEOUT_SECS",
];

/// Every config key's variable name, in the order of the file (a section's
/// most important key first).
pub fn key_env_names() -> Vec<String> {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) if path != "prices" => {
                for (k, v) in m {
                    if let Some(k) = k.as_str() {
                        walk(v, &join(path, k), out);
                    }
                }
            }
            _ => out.push(env_name(path)),
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_yaml_ng::to_value(Settings::default()) {
        walk(&v, "", &mut out);
    }
    out
}

/// A `MERCURY_*` variable that is neither a key nor one of [`OTHER_ENV`]:
/// probably a typo, which would otherwise be ignored without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    pub name: String,
    /// The closest known name, when one is close enough to be meant.
    pub closest: Option<String>,
}

impl std::fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.closest {
            Some(c) => write!(
                f,
                "{} is not a Mercury variable (did you mean {c}?); it is ignored",
                self.name
            ),
            None => write!(f, "{} is not a Mercury variable; it is ignored", self.name),
        }
    }
}

pub fn unknown_vars(env: &BTreeMap<String, String>) -> Vec<UnknownVar> {
    let mut known = key_env_names();
    known.extend(OTHER_ENV.iter().map(|s| (*s).to_owned()));
    for p in platforms::all() {
        known.extend(p.secret_vars().iter().map(|s| (*s).to_owned()));
    }
    env.keys()
        .filter(|k| k.starts_with("MERCURY_") && !known.contains(k))
        .map(|name| UnknownVar {
            name: name.clone(),
            closest: closest(name, &known),
        })
        .collect()
}

/// A section's name (`MERCURY_SANDBOX`) means its first key; otherwise the
/// nearest name by edit distance, if it is within a third of the length.
fn closest(name: &str, known: &[String]) -> Option<String> {
    let section = format!("{name}_");
    if let Some(k) = known.iter().find(|k| k.starts_with(&section)) {
        return Some(k.clone());
    }
    let tail = name.trim_start_matches("MERCURY_");
    known
        .iter()
        .map(|k| {
            (
                strsim::damerau_levenshtein(tail, k.trim_start_matches("MERCURY_")),
                k,
            )
        })
        .filter(|(d, _)| *d <= (tail.chars().count() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone())
}

/// The sibling nearest to an unknown YAML key by edit distance, if it is
/// within a third of the key's length (at least 2).
fn nearest_key(key: &str, siblings: &[String]) -> Option<String> {
    siblings
        .iter()
        .map(|s| (strsim::damerau_levenshtein(key, s), s))
        .filter(|(d, _)| *d <= (key.chars().count() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, s)| s.clone())
}

/// The provider of a model spec that needs an API key, and that key's variable.
pub fn key_var_of(spec: &str) -> Option<(&'static str, &'static str)> {
    match spec.split_once(':').map(|(p, _)| p) {
        Some("openai") => Some(("openai", "MERCURY_OPENAI_API_KEY")),
        Some("anthropic") => Some(("anthropic", "MERCURY_ANTHROPIC_API_KEY")),
        _ => None,
    }
}

/// The configured specs ([`Settings::configured_specs`]) that have no API
/// key in `env`: each `(spec, variable)` once.
pub fn missing_keys(s: &Settings, env: &BTreeMap<String, String>) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    for (_, spec) in s.configured_specs() {
        if let Some((_, var)) = key_var_of(&spec) {
            let set = env.get(var).is_some_and(|v| !v.trim().is_empty());
            if !set && !out.iter().any(|(s, _)| *s == spec) {
                out.push((spec, var));
            }
        }
    }
    out
}

/// `scripted:PATH` specs that `mercury.yaml` (or its variables) names
/// ([`Settings::configured_specs`]) whose file does not exist: start-up
/// refuses them rather than failing every turn.
pub fn check_scripted_files(s: &Settings) -> Result<(), ConfigError> {
    for (key, spec) in s.configured_specs() {
        if let Some(path) = spec.strip_prefix("scripted:") {
            if !Path::new(path.trim()).is_file() {
                return Err(key_err(
                    key,
                    format!("the scripted model file {path:?} does not exist"),
                ));
            }
        }
    }
    Ok(())
}

/// `mon 05:00`: a weekday (three letters) and a time of day.
pub fn parse_weekly_at(raw: &str) -> Result<(chrono::Weekday, (u32, u32)), String> {
    let bad = || format!("{raw:?} is not a weekly time (use DDD HH:MM, e.g. mon 05:00)");
    let (day, time) = raw.trim().split_once(' ').ok_or_else(bad)?;
    let day = match day.to_ascii_lowercase().as_str() {
        "mon" => chrono::Weekday::Mon,
        "tue" => chrono::Weekday::Tue,
        "wed" => chrono::Weekday::Wed,
        "thu" => chrono::Weekday::Thu,
        "fri" => chrono::Weekday::Fri,
        "sat" => chrono::Weekday::Sat,
        "sun" => chrono::Weekday::Sun,
        _ => return Err(bad()),
    };
    Ok((day, parse_daily_at(time.trim()).map_err(|_| bad())?))
}

/// The process environment's `MERCURY_*` variables.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("MERCURY_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadows_currency_is_read_from_its_file_and_defaults_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mercury.yaml");
        assert_eq!(currency_of(&path).unwrap(), "USD");
        std::fs::write(&path, "currency: EUR\nport: 1\n").unwrap();
        assert_eq!(currency_of(&path).unwrap(), "EUR");
        std::fs::write(&path, "port: [\n").unwrap();
        assert!(matches!(currency_of(&path), Err(ConfigError::Yaml { .. })));
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn review_weekly_at_parses_a_weekday_and_a_time() {
        assert_eq!(
            parse_weekly_at("mon 05:00"),
            Ok((chrono::Weekday::Mon, (5, 0)))
        );
        assert_eq!(
            parse_weekly_at("Sun 23:59"),
            Ok((chrono::Weekday::Sun, (23, 59)))
        );
        for bad in ["monday 05:00", "mon", "05:00", "mon 25:00"] {
            assert!(parse_weekly_at(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn template_parses_back_to_the_defaults() {
        let v: Value = serde_yaml_ng::from_str(&template("owner")).unwrap();
        // An empty review.timezone is the top-level one, filled in at load.
        let mut want = Settings::default();
        want.review.timezone = want.timezone.clone();
        assert_eq!(from_value(v, &env(&[])).unwrap(), want);
    }

    #[test]
    fn budgets_are_checked_and_review_timezone_falls_back() {
        let v: Value = serde_yaml_ng::from_str("timezone: Europe/Paris").unwrap();
        let s = from_value(v, &env(&[])).unwrap();
        assert_eq!(s.review.timezone, "Europe/Paris");
        let v: Value =
            serde_yaml_ng::from_str("timezone: Europe/Paris\nreview: {timezone: Asia/Tokyo}")
                .unwrap();
        assert_eq!(
            from_value(v, &env(&[])).unwrap().review.timezone,
            "Asia/Tokyo"
        );
        let e = from_value(Value::Null, &env(&[("MERCURY_BUDGETS_GLOBAL_DAILY", "-1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("budgets.global.daily"), "{e}");
        let s = from_value(
            Value::Null,
            &env(&[("MERCURY_BUDGETS_SPACE_MONTHLY", "20")]),
        )
        .unwrap();
        assert_eq!(s.budgets.space.monthly, 20.0);
        let e = from_value(Value::Null, &env(&[("MERCURY_TIMEZONE", "Mars/Olympus")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("timezone"), "{e}");
    }

    #[test]
    fn unknown_variables_get_the_closest_key() {
        let got = unknown_vars(&env(&[
            ("MERCURY_SANDBOX", "docker"),
            ("MERCURY_REVEIW_ENABLED", "true"),
            ("MERCURY_FROBNICATE", "1"),
            ("MERCURY_MODEL", "openai:x"),
            ("MERCURY_LOG", "debug"),
            ("MERCURY_LOG_FORMAT", "json"),
        ]));
        let pairs: Vec<(&str, Option<&str>)> = got
            .iter()
            .map(|u| (u.name.as_str(), u.closest.as_deref()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("MERCURY_FROBNICATE", None),
                ("MERCURY_REVEIW_ENABLED", Some("MERCURY_REVIEW_ENABLED")),
                ("MERCURY_SANDBOX", Some("MERCURY_SANDBOX_BACKEND")),
            ]
        );
        assert!(got[2]
            .to_string()
            .contains("did you mean MERCURY_SANDBOX_BACKEND?"));
    }

    #[test]
    fn keys_and_scripted_files_are_checked() {
        let mut s = Settings {
            model: "openai:a,anthropic:b,scripted:/nonexistent/m.json".into(),
            ..Settings::default()
        };
        let missing = missing_keys(&s, &env(&[("MERCURY_OPENAI_API_KEY", "k")]));
        assert_eq!(
            missing,
            vec![("anthropic:b".to_string(), "MERCURY_ANTHROPIC_API_KEY")]
        );
        let e = check_scripted_files(&s).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/m.json"), "{e}");
        s.model = "openai:a".into();
        assert!(check_scripted_files(&s).is_ok());
    }

    #[test]
    fn every_template_key_has_a_comment() {
        let text = template("owner");
        let lines: Vec<&str> = text.lines().collect();
        let mut keys = 0;
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if t.starts_with('#') || !t.contains(':') {
                continue;
            }
            keys += 1;
            let commented_above = i > 0 && lines[i - 1].trim_start().starts_with('#');
            assert!(
                line.contains(" # ") || commented_above,
                "line {} has no comment: {line}",
                i + 1
            );
        }
        assert!(keys > 50, "{keys} keys");
    }

    #[test]
    fn dm_policy_defaults_to_pairing_and_each_platform_may_override_it() {
        let s = Settings::default();
        assert_eq!(s.dm_policy("telegram"), DmPolicy::Pairing);
        assert!(s.open_dm_policies().is_empty());
        let v: Value = serde_yaml_ng::from_str(
            "adapters:\n  telegram:\n    dm_policy: open\n  discord:\n    dm_policy: allowlist",
        )
        .unwrap();
        let s = from_value(v, &env(&[("MERCURY_INGRESS_DM_POLICY", "allowlist")])).unwrap();
        assert_eq!(s.dm_policy("telegram"), DmPolicy::Open);
        assert_eq!(s.dm_policy("discord"), DmPolicy::Allowlist);
        assert_eq!(s.dm_policy("whatsapp"), DmPolicy::Allowlist);
        assert_eq!(
            s.open_dm_policies(),
            vec!["adapters.telegram.dm_policy".to_owned()]
        );
        let s = from_value(
            Value::Null,
            &env(&[("MERCURY_ADAPTERS_DISCORD_DM_POLICY", "open")]),
        )
        .unwrap();
        assert_eq!(s.dm_policy("discord"), DmPolicy::Open);
        assert!(from_value(
            Value::Null,
            &env(&[("MERCURY_INGRESS_DM_POLICY", "closed")])
        )
        .is_err());
        assert!(from_value(
            Value::Null,
            &env(&[("MERCURY_INGRESS_PAIRING_MAX_PENDING", "0")])
        )
        .is_err());
    }

    #[test]
    fn env_overrides_file_and_false_means_false() {
        let v: Value =
            serde_yaml_ng::from_str("review:\n  enabled: true\nmodel: openai:a").unwrap();
        let s = from_value(
            v,
            &env(&[
                ("MERCURY_REVIEW_ENABLED", "false"),
                ("MERCURY_MODEL", "scripted:/x"),
            ]),
        )
        .unwrap();
        assert!(!s.review.enabled);
        assert_eq!(s.model, "scripted:/x");
    }

    #[test]
    fn invalid_values_name_their_key() {
        let e = from_value(Value::Null, &env(&[("MERCURY_REVIEW_ENABLED", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("review.enabled"), "{e}");
        let e = from_value(Value::Null, &env(&[("MERCURY_MODEL", "gpt")])).unwrap_err();
        assert!(e.to_string().contains("model"), "{e}");
        let v: Value = serde_yaml_ng::from_str("review:\n  colour: red").unwrap();
        let e = from_value(v, &env(&[])).unwrap_err();
        assert!(e.to_string().contains("review.colour"), "{e}");
        let e = from_value(Value::Null, &env(&[("MERCURY_REVIEW_DAILY_AT", "25:00")])).unwrap_err();
        assert!(e.to_string().contains("review.daily_at"), "{e}");
    }

    #[test]
    fn the_warm_pool_is_off_by_default_and_bounded_with_a_sentence() {
        assert_eq!(Settings::default().sandbox.warm, 0);
        let s = from_value(Value::Null, &env(&[("MERCURY_SANDBOX_WARM", "4")])).unwrap();
        assert_eq!(s.sandbox.warm, 4);
        let e = from_value(Value::Null, &env(&[("MERCURY_SANDBOX_WARM", "17")])).unwrap_err();
        assert!(
            e.to_string().contains("sandbox.warm")
                && e.to_string().contains("between 0 (off) and 16")
                && e.to_string().contains("got 17"),
            "{e}"
        );
        let e = from_value(Value::Null, &env(&[("MERCURY_SANDBOX_WARM", "-1")])).unwrap_err();
        assert!(e.to_string().contains("sandbox.warm"), "{e}");
    }

    #[test]
    fn a_cluster_needs_postgres_and_sane_lease_and_poll_times() {
        let e = from_value(Value::Null, &env(&[("MERCURY_CLUSTER_ENABLED", "true")])).unwrap_err();
        assert!(
            e.to_string().contains("cluster.enabled") && e.to_string().contains("postgres"),
            "{e}"
        );
        let pg = [
            ("MERCURY_CLUSTER_ENABLED", "true"),
            ("MERCURY_STORAGE_BACKEND", "postgres"),
            ("MERCURY_STORAGE_URL", "postgres://m@db:5432/m"),
        ];
        let s = from_value(Value::Null, &env(&pg)).unwrap();
        assert_eq!((s.cluster.lease_secs, s.cluster.poll_ms), (15, 500));
        for (var, bad, key) in [
            ("MERCURY_CLUSTER_LEASE_SECS", "1", "cluster.lease_secs"),
            ("MERCURY_CLUSTER_POLL_MS", "10", "cluster.poll_ms"),
        ] {
            let mut vars = pg.to_vec();
            vars.push((var, bad));
            let e = from_value(Value::Null, &env(&vars)).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn http_listener_limits_are_typed_and_validated() {
        let s = from_value(
            Value::Null,
            &env(&[
                ("MERCURY_HTTP_HEADER_TIMEOUT_SECS", "3"),
                ("MERCURY_HTTP_MAX_CONNECTIONS", "40"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (s.http.header_timeout_secs, s.http.max_connections),
            (3, 40)
        );
        for (var, bad) in [
            ("MERCURY_HTTP_HEADER_TIMEOUT_SECS", "0"),
            ("MERCURY_HTTP_IDLE_TIMEOUT_SECS", "0"),
            ("MERCURY_HTTP_MAX_CONNECTIONS", "0"),
            ("MERCURY_HTTP_MAX_CONNECTIONS", "1000000"),
            ("MERCURY_HTTP_UNAUTHENTICATED_BODY_BYTES", "0"),
        ] {
            let e = from_value(Value::Null, &env(&[(var, bad)])).unwrap_err();
            let key = var.trim_start_matches("MERCURY_HTTP_").to_lowercase();
            assert!(
                e.to_string().contains(&format!("http.{key}")),
                "{var}={bad}: {e}"
            );
        }
    }

    #[test]
    fn shadow_flag_takes_only_one_or_true() {
        for on in ["1", "true"] {
            let s = from_value(Value::Null, &env(&[("MERCURY_SHADOW", on)])).unwrap();
            assert!(s.shadow, "{on}");
        }
        for bad in ["yes", "on", "TRUE", "0", "false", "", "ture"] {
            let e = from_value(Value::Null, &env(&[("MERCURY_SHADOW", bad)])).unwrap_err();
            assert!(e.to_string().contains("config key shadow"), "{bad}: {e}");
            assert!(e.to_string().contains("MERCURY_SHADOW"), "{bad}: {e}");
        }
        assert!(!from_value(Value::Null, &env(&[])).unwrap().shadow);
        let v: Value = serde_yaml_ng::from_str("shadow: true\nshadow_root: /srv/sh").unwrap();
        let s = from_value(v, &env(&[])).unwrap();
        assert!(s.shadow && s.shadow_root == "/srv/sh");
        let v: Value = serde_yaml_ng::from_str(
            "shadow: true\nshadow_root: /srv/sh\nstorage:\n  backend: postgres\n  url: postgres://m@db/m",
        )
        .unwrap();
        let e = from_value(v, &BTreeMap::new()).unwrap_err();
        assert!(
            e.to_string().contains("storage.backend must be sqlite"),
            "{e}"
        );
        let v: Value = serde_yaml_ng::from_str("shadow_root: rel/dir").unwrap();
        let e = from_value(v, &env(&[])).unwrap_err();
        assert!(e.to_string().contains("shadow_root"), "{e}");
    }

    #[test]
    fn an_unknown_yaml_key_gets_a_did_you_mean() {
        let v: Value = serde_yaml_ng::from_str("reveiw:\n  owner: me\n").unwrap();
        let e = from_value(v, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("did you mean review?"), "{e}");
        let v: Value = serde_yaml_ng::from_str("review:\n  ownr: me\n").unwrap();
        let e = from_value(v, &env(&[])).unwrap_err().to_string();
        assert!(
            e.contains("review.ownr") && e.contains("did you mean review.owner?"),
            "{e}"
        );
        let v: Value = serde_yaml_ng::from_str("zzzzzzzz: 1\n").unwrap();
        let e = from_value(v, &env(&[])).unwrap_err().to_string();
        assert!(
            e.contains("unknown key") && !e.contains("did you mean"),
            "{e}"
        );
    }

    #[test]
    fn env_keys_are_what_the_environment_sets() {
        let keys = env_keys(&env(&[
            ("MERCURY_PROVIDERS_OPENAI_BASE_URL", "http://proxy/v1"),
            ("MERCURY_PROVIDERS_MAX_RETRIES", "5"),
            ("MERCURY_OPENAI_API_KEY", "sk-not-a-config-key"),
        ]))
        .unwrap();
        assert_eq!(
            keys,
            vec![
                (
                    "providers.openai_base_url".to_owned(),
                    Value::from("http://proxy/v1")
                ),
                ("providers.max_retries".to_owned(), Value::from(5u64)),
            ]
        );
    }
}
