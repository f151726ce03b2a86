//! `mrctl`: the command-line client of the Mercury HTTP API (docs/api.md).
//!
//! Owns: the `mrctl` argument grammar (one subcommand per API route), the
//! mapping of those arguments to a request (`plan`, a pure function), and the
//! human-readable rendering of the answers. The HTTP/1 transport is
//! [`crate::client`].
//!
//! Used by operators on the host and by agents inside a sandboxed turn, where
//! `MERCURY_SOCKET` points at the mounted `api.sock` and `MERCURY_TOKEN` holds
//! the run token, so the container needs no network.
//!
//! Must never: print or log the API token (not in errors, not in `Debug`);
//! decide anything the server decides (permissions, defaults, existence):
//! local checks only catch malformed input early; follow redirects or talk to
//! anything but the one configured address; read the token from a flag value
//! (it would show in `ps`), only from a file or the environment.
//!
//! Exit codes: 0 success, 1 the server said no, 2 usage, setup or connection
//! problem.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, Parser, Subcommand, ValueEnum};
use hyper::Method;
use serde_json::{json, Map, Value};

/// `messages recent --all` stops after this many pages even if the server keeps
/// handing out cursors, so a server bug cannot make the client loop forever.
const MAX_PAGES: usize = 10_000;

use crate::client::{request, ClientError, Connection};

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

/// Command-line client for the Mercury API.
///
/// Connection: MERCURY_SOCKET (a Unix socket path) or MERCURY_URL (default
/// http://127.0.0.1:8787). Token: --token-file, else MERCURY_TOKEN, else
/// $MERCURY_DATA_DIR/global/owner.token. Space: MERCURY_SPACE.
#[derive(Debug, Parser)]
#[command(
    name = "mrctl",
    version,
    after_help = "Exit status: 0 success, 1 the server refused, 2 usage, token or connection problem."
)]
pub struct Cli {
    /// Print the server's JSON answer as is (pretty-printed).
    #[arg(long, global = true)]
    pub json: bool,

    /// Read the API token from this file (else MERCURY_TOKEN, else $MERCURY_DATA_DIR/global/owner.token).
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Act in another space through a space link (sends x-mercury-act-as).
    #[arg(long, global = true, value_name = "SPACE")]
    pub space: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show who the token belongs to, the space, the role and its permissions.
    Whoami,
    /// List, create, rename and delete spaces.
    #[command(subcommand)]
    Spaces(SpacesCmd),
    /// List conversations and link them to spaces.
    #[command(subcommand)]
    Conversations(ConversationsCmd),
    /// Search and page through the space's messages.
    #[command(subcommand)]
    Messages(MessagesCmd),
    /// The space's preferences (free-form key/value notes).
    #[command(subcommand)]
    Prefs(PrefsCmd),
    /// The space's settings (trigger, rate limit).
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Scheduled prompts.
    #[command(subcommand)]
    Tasks(TasksCmd),
    /// Roles granted in the space.
    #[command(subcommand)]
    Roles(RolesCmd),
    /// Which permissions each role has in the space.
    #[command(subcommand)]
    Permissions(PermissionsCmd),
    /// Callers the bot ignores in the space.
    #[command(subcommand)]
    Mutes(MutesCmd),
    /// The model chain the space's turns use.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Stop, compact or clear the space's session.
    #[command(subcommand)]
    Control(ControlCmd),
    /// Queue a message to a conversation of the space.
    Send {
        /// The message text.
        text: String,
        /// Conversation id (default: the space's only or most recent conversation).
        #[arg(long, value_name = "ID")]
        conversation: Option<i64>,
    },
    /// Mint, list and revoke API tokens (global admins).
    #[command(subcommand)]
    Tokens(TokensCmd),
    /// Map platform senders to operators (global admins).
    #[command(subcommand)]
    Identities(IdentitiesCmd),
    /// Run an agent turn with this prompt and print the reply.
    Chat {
        /// The prompt; `-` reads it from stdin.
        text: String,
        /// Which API conversation to continue.
        #[arg(long, value_name = "ID")]
        conversation: Option<String>,
    },
    /// Agent runs of the space.
    #[command(subcommand)]
    Runs(RunsCmd),
    /// Space links: which spaces this one may reach or is reached by.
    #[command(subcommand)]
    Links(LinksCmd),
    /// Run one turn of the space's agent on a throwaway copy (use with --space X).
    Ask {
        /// The message the agent answers; `-` reads it from stdin.
        message: String,
        /// The role the turn runs as.
        #[arg(long = "as", value_enum, default_value = "member")]
        as_role: AskRole,
    },
    /// Conversation review (global admins).
    #[command(subcommand)]
    Review(ReviewCmd),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AskRole {
    Member,
    Admin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LinkLevelArg {
    Read,
    Admin,
}

impl LinkLevelArg {
    fn as_str(self) -> &'static str {
        match self {
            LinkLevelArg::Read => "read",
            LinkLevelArg::Admin => "admin",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum LinksCmd {
    /// Create a link HOLDER -> TARGET (TARGET may be '*'); global admins.
    Create {
        holder: String,
        target: String,
        #[arg(long, value_enum)]
        level: LinkLevelArg,
        /// Also create TARGET -> HOLDER with the same level, in one transaction.
        #[arg(long)]
        both: bool,
        /// Reach only this conversation of the target.
        #[arg(long, value_name = "ID")]
        conversation: Option<i64>,
        /// How and when the target side was told.
        #[arg(long)]
        disclosure: Option<String>,
    },
    /// Change a link's level or disclosure; global admins.
    Update {
        id: i64,
        #[arg(long, value_enum)]
        level: Option<LinkLevelArg>,
        #[arg(long)]
        disclosure: Option<String>,
    },
    /// Revoke a link; global admins.
    Revoke { id: i64 },
    /// Links touching this space, with its inbound and outbound reach.
    List,
    /// One link.
    Inspect { id: i64 },
    /// The audit trail of links touching this space, newest first.
    Audit {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SpacesCmd {
    /// List the spaces (id, name, tags).
    List,
    /// Create a space (global admins).
    Create {
        /// 1-63 characters of a-z, 0-9 and '-'.
        id: String,
        #[arg(long)]
        name: Option<String>,
        /// Comma-separated tags.
        #[arg(long, value_delimiter = ',')]
        tags: Vec<String>,
    },
    /// Show the space named by MERCURY_SPACE (or the run token).
    Current,
    /// Rename the current space.
    Rename { name: String },
    /// Delete the current space and everything in it.
    Delete,
}

#[derive(Debug, Subcommand)]
pub enum ConversationsCmd {
    /// List the conversations of the space.
    List {
        /// Every space's conversations (global admins).
        #[arg(long)]
        all: bool,
    },
    /// Route a conversation's messages to a space.
    Link {
        id: String,
        #[arg(value_name = "SPACE")]
        space_id: String,
    },
    /// Detach a conversation from its space.
    Unlink { id: String },
}

#[derive(Debug, Subcommand)]
pub enum MessagesCmd {
    /// Full-text search, newest first.
    Search {
        query: String,
        /// At most this many (1-200).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: Option<u32>,
    },
    /// Messages in a time window, oldest first.
    Recent {
        /// RFC 3339 time or a duration before now (server default: 24h).
        #[arg(long)]
        since: Option<String>,
        /// RFC 3339 time or a duration before now (server default: now).
        #[arg(long)]
        until: Option<String>,
        /// Page size (1-1000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// Continue from a `next_cursor` the server gave out.
        #[arg(long)]
        cursor: Option<String>,
        /// Follow `next_cursor` until the window is exhausted.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PrefsCmd {
    List,
    Get { key: String },
    Set { key: String, value: String },
    Delete { key: String },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Show every key (with its description), or one key's value.
    Get {
        key: Option<String>,
    },
    Set {
        key: String,
        value: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TasksCmd {
    List,
    /// Schedule a prompt: repeating (--cron) or once (--at).
    #[command(group(ArgGroup::new("when").required(true).args(["cron", "at"])))]
    Create {
        /// Five-field cron expression (minute hour day month weekday).
        #[arg(long, value_name = "EXPR")]
        cron: Option<String>,
        /// RFC 3339 time in the future.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        /// What the agent is asked when the task fires.
        #[arg(long, value_name = "TEXT")]
        prompt: String,
        /// Run without posting the reply to the conversation.
        #[arg(long)]
        silent: bool,
    },
    Pause {
        id: String,
    },
    Resume {
        id: String,
    },
    /// Fire the task now.
    Run {
        id: String,
    },
    Delete {
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RolesCmd {
    List,
    Grant {
        caller: String,
        /// Role to grant (server default: admin).
        #[arg(long)]
        role: Option<String>,
    },
    Revoke {
        caller: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PermissionsCmd {
    /// Every role's permissions, or one role's.
    Show {
        #[arg(long)]
        role: Option<String>,
    },
    /// Replace a role's permissions with a comma-separated list.
    Set { role: String, permissions: String },
}

#[derive(Debug, Subcommand)]
pub enum MutesCmd {
    List,
    /// Mute a caller (indefinitely unless --for or --until).
    Set {
        caller: String,
        /// A duration such as 2h or 7d.
        #[arg(long = "for", value_name = "DURATION", conflicts_with = "until")]
        for_: Option<String>,
        /// An RFC 3339 time.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    Delete {
        caller: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelCmd {
    Get,
    /// Set the chain (first spec first, the rest as fallbacks), or --default.
    Set {
        /// `openai:MODEL`, `anthropic:MODEL` or `scripted:PATH`.
        #[arg(
            value_name = "SPEC",
            required_unless_present = "use_default",
            conflicts_with = "use_default"
        )]
        specs: Vec<String>,
        /// Go back to the host's default chain.
        #[arg(long = "default")]
        use_default: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ControlCmd {
    /// Stop the running turn and drop queued messages.
    Stop,
    /// Summarise the session so far and start from the summary.
    Compact,
    /// Start a fresh session.
    Clear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenKind {
    User,
    Adapter,
}

impl TokenKind {
    fn as_str(self) -> &'static str {
        match self {
            TokenKind::User => "user",
            TokenKind::Adapter => "adapter",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum TokensCmd {
    /// Mint a token; it is printed once, alone on stdout.
    Create {
        caller: String,
        #[arg(long, value_enum, default_value_t = TokenKind::User)]
        kind: TokenKind,
        /// The one platform an adapter token may post and pull for (required with --kind adapter).
        #[arg(long)]
        platform: Option<String>,
        #[arg(long)]
        label: Option<String>,
        /// A duration such as 30d.
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
    },
    List,
    Revoke {
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum IdentitiesCmd {
    /// Let a platform sender (telegram:123456) act with an operator's rights (owner).
    Link { platform_id: String, caller: String },
    /// Remove a mapping.
    Unlink { platform_id: String },
    /// Every mapping.
    List,
    /// The audit trail of mappings, newest first.
    Audit {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReviewCmd {
    /// Scan the review window now and wait for the report (set MERCURY_TIMEOUT_SECS for long scans).
    RunNow,
}

#[derive(Debug, Subcommand)]
pub enum RunsCmd {
    List {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
}

// ---------------------------------------------------------------------------
// Planning: arguments -> request (pure)
// ---------------------------------------------------------------------------

/// Input the server would refuse anyway, caught before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// What to do with the answer beyond showing it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Then {
    Show,
    /// Fetch pages while the server hands out a new `next_cursor`.
    FollowCursor,
    /// The API has no single-preference route: pick the key from the list.
    PickPref(String),
    /// Same for config keys.
    PickConfig(String),
}

/// One request, as the arguments ask for it. `path` is already
/// percent-encoded; `query` values are encoded by [`RequestPlan::target`].
#[derive(Debug, Clone, PartialEq)]
struct RequestPlan {
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
    then: Then,
}

impl RequestPlan {
    fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            then: Then::Show,
        }
    }
    fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }
    fn post(path: impl Into<String>) -> Self {
        Self::new(Method::POST, path)
    }
    fn put(path: impl Into<String>) -> Self {
        Self::new(Method::PUT, path)
    }
    fn delete(path: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path)
    }
    fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }
    fn query(mut self, key: &'static str, value: Option<String>) -> Self {
        if let Some(v) = value {
            self.query.push((key, v));
        }
        self
    }
    fn then(mut self, then: Then) -> Self {
        self.then = then;
        self
    }
    fn set_query(&mut self, key: &'static str, value: String) {
        self.query.retain(|(k, _)| *k != key);
        self.query.push((key, value));
    }

    /// Path and query string as sent on the request line.
    fn target(&self) -> String {
        let mut t = self.path.clone();
        for (i, (k, v)) in self.query.iter().enumerate() {
            t.push(if i == 0 { '?' } else { '&' });
            t.push_str(&encode(k));
            t.push('=');
            t.push_str(&encode(v));
        }
        t
    }
}

/// Builds a JSON object from the fields that are present, so optional flags
/// the user did not give are left out and the server's defaults apply.
fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
    let mut map = Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            map.insert(k.to_owned(), v);
        }
    }
    Value::Object(map)
}

fn plan(cli: &Cli) -> Result<RequestPlan, UsageError> {
    if let Some(space) = &cli.space {
        check_space_id("--space", space)?;
    }
    let p = match &cli.command {
        Command::Whoami => RequestPlan::get("/api/whoami"),
        Command::Spaces(cmd) => match cmd {
            SpacesCmd::List => RequestPlan::get("/api/spaces"),
            SpacesCmd::Create { id, name, tags } => {
                check_space_id("space id", id)?;
                let tags: Vec<&str> = tags
                    .iter()
                    .map(|t| t.trim())
                    .filter(|t| !t.is_empty())
                    .collect();
                let body = object(vec![
                    ("id", Some(json!(id))),
                    ("name", name.as_ref().map(|n| json!(n))),
                    ("tags", (!tags.is_empty()).then(|| json!(tags))),
                ]);
                RequestPlan::post("/api/spaces").body(body)
            }
            SpacesCmd::Current => RequestPlan::get("/api/spaces/current"),
            SpacesCmd::Rename { name } => {
                non_empty("the new name", name)?;
                RequestPlan::put("/api/spaces/current/name").body(json!({ "name": name }))
            }
            SpacesCmd::Delete => RequestPlan::delete("/api/spaces/current"),
        },
        Command::Conversations(cmd) => match cmd {
            ConversationsCmd::List { all } => {
                RequestPlan::get("/api/conversations").query("all", all.then(|| "true".to_owned()))
            }
            ConversationsCmd::Link { id, space_id } => {
                non_empty("the conversation id", id)?;
                check_space_id("space id", space_id)?;
                RequestPlan::post(format!("/api/conversations/{}/link", encode(id)))
                    .body(json!({ "space_id": space_id }))
            }
            ConversationsCmd::Unlink { id } => {
                non_empty("the conversation id", id)?;
                RequestPlan::post(format!("/api/conversations/{}/unlink", encode(id)))
            }
        },
        Command::Messages(cmd) => match cmd {
            MessagesCmd::Search { query, limit } => {
                non_empty("the search query", query)?;
                RequestPlan::get("/api/messages")
                    .query("q", Some(query.clone()))
                    .query("limit", limit.map(|l| l.to_string()))
            }
            MessagesCmd::Recent {
                since,
                until,
                limit,
                cursor,
                all,
            } => {
                for (flag, value) in [("--since", since), ("--until", until)] {
                    if let Some(v) = value {
                        check_time_or_duration(flag, v)?;
                    }
                }
                RequestPlan::get("/api/messages/recent")
                    .query("since", since.clone())
                    .query("until", until.clone())
                    .query("limit", limit.map(|l| l.to_string()))
                    .query("cursor", cursor.clone())
                    .then(if *all { Then::FollowCursor } else { Then::Show })
            }
        },
        Command::Prefs(cmd) => match cmd {
            PrefsCmd::List => RequestPlan::get("/api/prefs"),
            PrefsCmd::Get { key } => {
                non_empty("the key", key)?;
                RequestPlan::get("/api/prefs").then(Then::PickPref(key.clone()))
            }
            PrefsCmd::Set { key, value } => {
                non_empty("the key", key)?;
                // Values are stored as text, so they are sent as text even when they look like numbers.
                RequestPlan::put("/api/prefs").body(json!({ "key": key, "value": value }))
            }
            PrefsCmd::Delete { key } => {
                non_empty("the key", key)?;
                RequestPlan::delete(format!("/api/prefs/{}", encode(key)))
            }
        },
        Command::Config(cmd) => match cmd {
            ConfigCmd::Get { key: None } => RequestPlan::get("/api/config"),
            ConfigCmd::Get { key: Some(key) } => {
                non_empty("the key", key)?;
                RequestPlan::get("/api/config").then(Then::PickConfig(key.clone()))
            }
            ConfigCmd::Set { key, value } => {
                non_empty("the key", key)?;
                RequestPlan::put("/api/config").body(json!({ "key": key, "value": value }))
            }
        },
        Command::Tasks(cmd) => match cmd {
            TasksCmd::List => RequestPlan::get("/api/tasks"),
            TasksCmd::Create {
                cron,
                at,
                prompt,
                silent,
            } => {
                non_empty("--prompt", prompt)?;
                match (cron, at) {
                    (Some(c), None) => check_cron(c)?,
                    (None, Some(t)) => check_time("--at", t)?,
                    // clap enforces exactly one; this keeps plan() total for hand-built Cli values.
                    _ => {
                        return Err(UsageError(
                            "give exactly one of --cron EXPR and --at TIME".into(),
                        ))
                    }
                }
                let body = object(vec![
                    ("cron", cron.as_ref().map(|c| json!(c.trim()))),
                    ("at", at.as_ref().map(|t| json!(t.trim()))),
                    ("prompt", Some(json!(prompt))),
                    ("silent", silent.then_some(json!(true))),
                ]);
                RequestPlan::post("/api/tasks").body(body)
            }
            TasksCmd::Pause { id } => task_action(id, "pause")?,
            TasksCmd::Resume { id } => task_action(id, "resume")?,
            TasksCmd::Run { id } => task_action(id, "run")?,
            TasksCmd::Delete { id } => {
                non_empty("the task id", id)?;
                RequestPlan::delete(format!("/api/tasks/{}", encode(id)))
            }
        },
        Command::Roles(cmd) => match cmd {
            RolesCmd::List => RequestPlan::get("/api/roles"),
            RolesCmd::Grant { caller, role } => {
                non_empty("the caller id", caller)?;
                if let Some(r) = role {
                    non_empty("--role", r)?;
                }
                let body = object(vec![
                    ("caller_id", Some(json!(caller))),
                    ("role", role.as_ref().map(|r| json!(r))),
                ]);
                RequestPlan::post("/api/roles").body(body)
            }
            RolesCmd::Revoke { caller } => {
                non_empty("the caller id", caller)?;
                RequestPlan::delete(format!("/api/roles/{}", encode(caller)))
            }
        },
        Command::Permissions(cmd) => match cmd {
            PermissionsCmd::Show { role } => {
                RequestPlan::get("/api/permissions").query("role", role.clone())
            }
            PermissionsCmd::Set { role, permissions } => {
                non_empty("the role", role)?;
                // An empty list is allowed: it takes every permission away from the role.
                let perms: Vec<&str> = permissions
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .collect();
                RequestPlan::put("/api/permissions")
                    .body(json!({ "role": role, "permissions": perms }))
            }
        },
        Command::Mutes(cmd) => match cmd {
            MutesCmd::List => RequestPlan::get("/api/mutes"),
            MutesCmd::Set {
                caller,
                for_,
                until,
                reason,
            } => {
                non_empty("the caller id", caller)?;
                if let Some(d) = for_ {
                    check_positive_duration("--for", d)?;
                }
                if let Some(t) = until {
                    check_time("--until", t)?;
                }
                let body = object(vec![
                    ("caller_id", Some(json!(caller))),
                    ("for", for_.as_ref().map(|d| json!(d.trim()))),
                    ("until", until.as_ref().map(|t| json!(t.trim()))),
                    ("reason", reason.as_ref().map(|r| json!(r))),
                ]);
                RequestPlan::post("/api/mutes").body(body)
            }
            MutesCmd::Delete { caller } => {
                non_empty("the caller id", caller)?;
                RequestPlan::delete(format!("/api/mutes/{}", encode(caller)))
            }
        },
        Command::Model(cmd) => match cmd {
            ModelCmd::Get => RequestPlan::get("/api/model"),
            ModelCmd::Set { specs, use_default } => {
                if *use_default {
                    // The API's way of saying "back to the default" is an empty chain.
                    RequestPlan::put("/api/model").body(json!({ "chain": [] }))
                } else {
                    if specs.is_empty() {
                        return Err(UsageError(
                            "give at least one model SPEC, or --default".into(),
                        ));
                    }
                    for s in specs {
                        check_model_spec(s)?;
                    }
                    RequestPlan::put("/api/model").body(json!({ "chain": specs }))
                }
            }
        },
        Command::Control(cmd) => RequestPlan::post(match cmd {
            ControlCmd::Stop => "/api/control/stop",
            ControlCmd::Compact => "/api/control/compact",
            ControlCmd::Clear => "/api/control/clear",
        }),
        Command::Send { text, conversation } => {
            non_empty("the message text", text)?;
            let body = object(vec![
                ("text", Some(json!(text))),
                ("conversation_id", conversation.map(|c| json!(c))),
            ]);
            RequestPlan::post("/api/send").body(body)
        }
        Command::Tokens(cmd) => match cmd {
            TokensCmd::Create {
                caller,
                kind,
                platform,
                label,
                expires_in,
            } => {
                non_empty("the caller id", caller)?;
                if let Some(d) = expires_in {
                    check_positive_duration("--expires-in", d)?;
                }
                match (kind, platform) {
                    (TokenKind::Adapter, None) => {
                        return Err(UsageError(
                            "an adapter token is bound to one platform: add --platform NAME".into(),
                        ))
                    }
                    (TokenKind::User, Some(_)) => {
                        return Err(UsageError(
                            "--platform applies to --kind adapter only".into(),
                        ))
                    }
                    _ => {}
                }
                let body = object(vec![
                    ("caller_id", Some(json!(caller))),
                    ("kind", Some(json!(kind.as_str()))),
                    ("platform", platform.as_ref().map(|p| json!(p))),
                    ("label", label.as_ref().map(|l| json!(l))),
                    ("expires_in", expires_in.as_ref().map(|d| json!(d.trim()))),
                ]);
                RequestPlan::post("/api/tokens").body(body)
            }
            TokensCmd::List => RequestPlan::get("/api/tokens"),
            TokensCmd::Revoke { id } => {
                non_empty("the token id", id)?;
                RequestPlan::delete(format!("/api/tokens/{}", encode(id)))
            }
        },
        Command::Identities(cmd) => match cmd {
            IdentitiesCmd::Link {
                platform_id,
                caller,
            } => {
                non_empty("the platform id", platform_id)?;
                non_empty("the caller id", caller)?;
                RequestPlan::post("/api/identities")
                    .body(json!({"platform_id": platform_id, "caller_id": caller}))
            }
            IdentitiesCmd::Unlink { platform_id } => {
                non_empty("the platform id", platform_id)?;
                RequestPlan::delete(format!("/api/identities/{}", encode(platform_id)))
            }
            IdentitiesCmd::List => RequestPlan::get("/api/identities"),
            IdentitiesCmd::Audit { limit } => RequestPlan::get("/api/identities/audit")
                .query("limit", limit.map(|l| l.to_string())),
        },
        Command::Chat { text, conversation } => {
            non_empty("the prompt", text)?;
            let body = object(vec![
                ("text", Some(json!(text))),
                ("conversation", conversation.as_ref().map(|c| json!(c))),
            ]);
            RequestPlan::post("/api/chat").body(body)
        }
        Command::Runs(RunsCmd::List { limit }) => {
            RequestPlan::get("/api/runs").query("limit", limit.map(|l| l.to_string()))
        }
        Command::Links(cmd) => match cmd {
            LinksCmd::Create {
                holder,
                target,
                level,
                both,
                conversation,
                disclosure,
            } => {
                check_space_id("holder", holder)?;
                if target != "*" {
                    check_space_id("target", target)?;
                }
                RequestPlan::post("/api/links").body(object(vec![
                    ("holder", Some(json!(holder))),
                    ("target", Some(json!(target))),
                    ("level", Some(json!(level.as_str()))),
                    ("both", both.then_some(json!(true))),
                    ("conversation_id", conversation.map(|c| json!(c))),
                    ("disclosure", disclosure.as_ref().map(|d| json!(d))),
                ]))
            }
            LinksCmd::Update {
                id,
                level,
                disclosure,
            } => {
                if level.is_none() && disclosure.is_none() {
                    return Err(UsageError(
                        "links update needs --level and/or --disclosure".into(),
                    ));
                }
                RequestPlan::new(Method::PATCH, format!("/api/links/{id}")).body(object(vec![
                    ("level", level.map(|l| json!(l.as_str()))),
                    ("disclosure", disclosure.as_ref().map(|d| json!(d))),
                ]))
            }
            LinksCmd::Revoke { id } => RequestPlan::new(Method::DELETE, format!("/api/links/{id}")),
            LinksCmd::List => RequestPlan::get("/api/links"),
            LinksCmd::Inspect { id } => RequestPlan::get(format!("/api/links/{id}")),
            LinksCmd::Audit { limit } => {
                RequestPlan::get("/api/links/audit").query("limit", limit.map(|l| l.to_string()))
            }
        },
        Command::Ask { message, as_role } => {
            // `-` is read from stdin by the caller before sending.
            non_empty("the message", message)?;
            let role = match as_role {
                AskRole::Member => "member",
                AskRole::Admin => "admin",
            };
            RequestPlan::post("/api/ask").body(json!({"message": message, "as": role}))
        }
        Command::Review(ReviewCmd::RunNow) => RequestPlan::post("/api/review/run"),
    };
    Ok(p)
}

fn task_action(id: &str, action: &str) -> Result<RequestPlan, UsageError> {
    non_empty("the task id", id)?;
    Ok(RequestPlan::post(format!(
        "/api/tasks/{}/{action}",
        encode(id)
    )))
}

fn non_empty(what: &str, value: &str) -> Result<(), UsageError> {
    if value.trim().is_empty() {
        Err(UsageError(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}

/// Same rule as the server's space ids, so a typo fails here with a clear
/// sentence instead of a round trip.
fn check_space_id(what: &str, id: &str) -> Result<(), UsageError> {
    let b = id.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(UsageError(format!(
            "{what} {id:?} is not a space id: use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit"
        )))
    }
}

fn check_cron(expr: &str) -> Result<(), UsageError> {
    let n = expr.split_whitespace().count();
    if n == 5 {
        Ok(())
    } else {
        Err(UsageError(format!(
            "--cron {expr:?} has {n} fields; it needs 5 (minute hour day-of-month month day-of-week), e.g. \"0 9 * * 1-5\""
        )))
    }
}

fn check_model_spec(spec: &str) -> Result<(), UsageError> {
    match spec.split_once(':') {
        Some((kind, rest)) if !kind.trim().is_empty() && !rest.trim().is_empty() => Ok(()),
        _ => Err(UsageError(format!(
            "model spec {spec:?} is not PROVIDER:MODEL (e.g. openai:gpt-4o, anthropic:MODEL, scripted:PATH)"
        ))),
    }
}

fn check_time(flag: &str, raw: &str) -> Result<(), UsageError> {
    if is_rfc3339(raw) {
        Ok(())
    } else {
        Err(UsageError(format!(
            "{flag} {raw:?} is not an RFC 3339 time (e.g. 2026-11-29T10:00:00Z)"
        )))
    }
}

fn check_time_or_duration(flag: &str, raw: &str) -> Result<(), UsageError> {
    if is_rfc3339(raw) || duration_secs(raw).is_some() {
        Ok(())
    } else {
        Err(UsageError(format!(
            "{flag} {raw:?} is neither an RFC 3339 time (2026-11-29T10:00:00Z) nor a duration (24h)"
        )))
    }
}

fn check_positive_duration(flag: &str, raw: &str) -> Result<(), UsageError> {
    match duration_secs(raw) {
        Some(s) if s > 0 => Ok(()),
        Some(_) => Err(UsageError(format!(
            "{flag} {raw:?} must be longer than zero"
        ))),
        None => Err(UsageError(format!(
            "{flag} {raw:?} is not a duration (use e.g. 90s, 15m, 2h, 7d, 2w or 1h30m)"
        ))),
    }
}

/// The server's duration grammar: one or more `<digits><unit>` with unit
/// s, m, h, d or w (`1h30m`). Returns seconds; `None` if malformed or too long.
fn duration_secs(raw: &str) -> Option<u64> {
    let s = raw.trim();
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            number = Some(
                number
                    .unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(u64::from(d))?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return None,
        };
        // A unit with no number before it ("h", "1hm") is malformed.
        total = total.checked_add(number.take()?.checked_mul(unit)?)?;
    }
    // Trailing digits without a unit ("24") are malformed too.
    if number.is_some() {
        return None;
    }
    Some(total)
}

/// Shape check for `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`. The server does
/// the real parsing; this only catches "tomorrow" or a missing offset early.
fn is_rfc3339(raw: &str) -> bool {
    let b = raw.trim().as_bytes();
    let num = |from: usize, len: usize| -> Option<u32> {
        let part = b.get(from..from + len)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let at = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    let fields = (
        num(0, 4),
        num(5, 2),
        num(8, 2),
        num(11, 2),
        num(14, 2),
        num(17, 2),
    );
    let (Some(_), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = fields else {
        return false;
    };
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return false;
    }
    if !((1..=12).contains(&mo) && (1..=31).contains(&d) && h <= 23 && mi <= 59 && s <= 60) {
        return false;
    }
    let mut i = 19;
    if at(i, b".") {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z' | b'z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i + 6 == b.len()
                && num(i + 1, 2).is_some_and(|oh| oh <= 23)
                && at(i + 3, b":")
                && num(i + 4, 2).is_some_and(|om| om <= 59)
        }
        _ => false,
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so caller
/// ids such as `whatsapp:1@s.whatsapp.net` stay one path segment and query
/// values cannot smuggle `&` or `#`.
pub fn encode(raw: &str) -> String {
    // "." and ".." are path navigation to some proxies; encoded they stay data.
    if !raw.is_empty() && raw.bytes().all(|b| b == b'.') {
        return "%2E".repeat(raw.len());
    }
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Running a command
// ---------------------------------------------------------------------------

/// Why an invocation failed; decides the exit code.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Usage(#[from] UsageError),
    #[error("{0}")]
    Client(#[from] ClientError),
    /// The server answered with a 4xx/5xx.
    #[error("{message} (HTTP {status}{})", code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
    Api {
        status: u16,
        code: Option<String>,
        message: String,
    },
    /// The answer was fine but did not contain what was asked for (prefs/config get KEY).
    #[error("{0}")]
    Missing(String),
    #[error("cannot read stdin: {0}")]
    Stdin(std::io::Error),
    #[error("cannot write the output: {0}")]
    Output(std::io::Error),
}

fn exit_code(failure: &Failure) -> u8 {
    match failure {
        Failure::Api { .. } | Failure::Missing(_) => 1,
        Failure::Usage(_) | Failure::Client(_) | Failure::Stdin(_) | Failure::Output(_) => 2,
    }
}

/// Turns a non-2xx answer into a [`Failure::Api`] with the server's sentence.
fn api_failure(status: u16, body: &Value) -> Failure {
    let err = body.get("error");
    let code = err
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut message = match err.and_then(|e| e.get("message")).and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => match body {
            Value::String(s) if !s.is_empty() => s.chars().take(500).collect(),
            _ => format!("the server answered with status {status}"),
        },
    };
    if status == 401 {
        message.push_str("; check the token (--token-file, MERCURY_TOKEN or $MERCURY_DATA_DIR/global/owner.token)");
    }
    Failure::Api {
        status,
        code,
        message,
    }
}

async fn call(conn: &Connection, plan: &RequestPlan) -> Result<Value, Failure> {
    let (status, value) =
        request(conn, plan.method.clone(), &plan.target(), plan.body.clone()).await?;
    if (200..300).contains(&status) {
        Ok(value)
    } else {
        Err(api_failure(status, &value))
    }
}

/// Fetches every page of `messages recent`, returning one answer of the same shape.
async fn call_all_pages(conn: &Connection, plan: &RequestPlan) -> Result<Value, Failure> {
    let mut plan = plan.clone();
    let mut messages = Vec::new();
    let mut last_cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = call(conn, &plan).await?;
        let batch = page
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let empty = batch.is_empty();
        messages.extend(batch);
        let next = page
            .get("next_cursor")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        match next {
            // A repeated cursor would fetch the same page forever.
            Some(c) if !empty && last_cursor.as_deref() != Some(c) => {
                last_cursor = Some(c.to_owned());
                plan.set_query("cursor", c.to_owned());
            }
            _ => break,
        }
    }
    Ok(json!({ "messages": messages, "next_cursor": null }))
}

/// Narrows a list answer to one entry for `prefs get KEY` / `config get KEY`.
fn pick(then: &Then, value: Value) -> Result<Value, Failure> {
    let find = |list: &str, key: &str| {
        value
            .get(list)
            .and_then(Value::as_array)
            .and_then(|items| {
                items
                    .iter()
                    .find(|i| i.get("key").and_then(Value::as_str) == Some(key))
            })
            .cloned()
    };
    match then {
        Then::Show | Then::FollowCursor => Ok(value),
        Then::PickPref(key) => find("preferences", key)
            .ok_or_else(|| Failure::Missing(format!("no preference {key:?} in this space"))),
        Then::PickConfig(key) => {
            if let Some(entry) = find("config", key) {
                return Ok(entry);
            }
            let known: Vec<&str> = value
                .get("available")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|i| i.get("key").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            if known.is_empty() || known.contains(&key.as_str()) {
                Err(Failure::Missing(format!(
                    "config key {key:?} is not set in this space (the default applies)"
                )))
            } else {
                Err(Failure::Missing(format!(
                    "unknown config key {key:?}; the keys are: {}",
                    known.join(", ")
                )))
            }
        }
    }
}

/// Replaces a `-` prompt with stdin, before planning, so `plan` stays pure.
fn read_stdin_args(cli: &mut Cli, stdin: &mut dyn Read) -> Result<(), Failure> {
    let text = match &mut cli.command {
        Command::Chat { text, .. } => Some(text),
        Command::Ask { message, .. } => Some(message),
        _ => None,
    };
    if let Some(text) = text {
        if text == "-" {
            let mut buf = String::new();
            stdin.read_to_string(&mut buf).map_err(Failure::Stdin)?;
            let trimmed = buf.trim_end_matches(['\n', '\r']);
            if trimmed.trim().is_empty() {
                return Err(UsageError("the prompt read from stdin is empty".into()).into());
            }
            *text = trimmed.to_owned();
        }
    }
    Ok(())
}

async fn execute(
    mut cli: Cli,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), Failure> {
    read_stdin_args(&mut cli, stdin)?;
    // Planned before the connection is set up: a usage error needs no token.
    let plan = plan(&cli)?;
    let conn = Connection::from_env(env, cli.token_file.as_deref(), cli.space.clone())?;
    let value = if plan.then == Then::FollowCursor {
        call_all_pages(&conn, &plan).await?
    } else {
        call(&conn, &plan).await?
    };
    let value = pick(&plan.then, value)?;
    let (text, note) = if cli.json {
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
        (format!("{pretty}\n"), None)
    } else {
        let (text, note) = render(&cli.command, &value);
        (tag_source(&cli.command, &value, text), note)
    };
    write_all(out, &text)?;
    if let Some(note) = note {
        // A note is for the person, not for a pipe; losing it is not worth failing over.
        let _ = writeln!(err, "{note}");
    }
    Ok(())
}

/// Text that came from another space through a link (`source_space` in the
/// answer, D-014) says so on every line of the human output; `ask` already
/// opens with its `[space]` label.
fn tag_source(cmd: &Command, v: &Value, text: String) -> String {
    let Some(source) = field(v, "source_space").as_str() else {
        return text;
    };
    if matches!(cmd, Command::Ask { .. }) {
        return text;
    }
    if text.is_empty() {
        return format!("[from {source}] (nothing)\n");
    }
    text.lines()
        .map(|l| format!("[from {source}] {l}\n"))
        .collect()
}

fn write_all(out: &mut dyn Write, text: &str) -> Result<(), Failure> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // `mrctl ... | head` closing the pipe early is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Output(e)),
    }
}

/// Runs one parsed invocation; returns the exit code. Output goes to `out`,
/// error sentences to `err` as `mrctl: <sentence>`.
async fn run(
    cli: Cli,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match execute(cli, env, stdin, out, err).await {
        Ok(()) => 0,
        Err(failure) => {
            let _ = writeln!(err, "mrctl: {failure}");
            exit_code(&failure)
        }
    }
}

/// The `mrctl` binary: `fn main() -> ExitCode { mercury::cli::mrctl::main() }`.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mrctl: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let env = |k: &str| std::env::var(k).ok();
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let code = runtime.block_on(run(cli, &env, &mut stdin, &mut stdout, &mut stderr));
    ExitCode::from(code)
}

// ---------------------------------------------------------------------------
// Human-readable output
// ---------------------------------------------------------------------------

static NULL: Value = Value::Null;

fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&NULL)
}

/// A value as one table cell: strings bare, lists comma-joined, absent as `-`.
/// Tabs and newlines become spaces so a cell cannot break the table.
fn cell(v: &Value) -> String {
    let s = match v {
        Value::Null => "-".to_owned(),
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".to_owned(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    };
    s.replace(['\t', '\n', '\r'], " ")
}

/// Timestamps arrive as epoch milliseconds (storage's unit) or as text; both print as RFC 3339.
fn time_cell(v: &Value) -> String {
    match v.as_i64() {
        Some(ms) => format_ms(ms),
        None => cell(v),
    }
}

fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date, computed on 400-year
/// eras (each exactly 146097 days) with years starting in March so the leap
/// day falls at the end.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn row(cells: &[String]) -> String {
    let mut line = cells.join("\t");
    line.push('\n');
    line
}

fn message_line(m: &Value) -> String {
    let sender = [
        field(m, "sender_name"),
        field(m, "sender_id"),
        field(m, "role"),
    ]
    .into_iter()
    .find_map(|v| v.as_str().filter(|s| !s.is_empty()))
    .unwrap_or("?");
    let text = field(m, "text").as_str().unwrap_or_default();
    // Continuation lines are indented so each message still starts with `[`.
    format!(
        "[{}] {sender}: {}\n",
        time_cell(field(m, "created_at")),
        text.replace('\n', "\n    ")
    )
}

fn kv_lines(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

/// The human form of an answer: text for stdout and an optional note for stderr.
fn render(cmd: &Command, v: &Value) -> (String, Option<String>) {
    let mut note = None;
    let out = match cmd {
        Command::Whoami => {
            let kind = cell(field(v, "token_kind"));
            let admin = if field(v, "global_admin").as_bool() == Some(true) {
                " (global admin)"
            } else {
                ""
            };
            let perms = items(v, "permissions");
            let via = field(v, "via");
            if via.is_object() {
                kv_lines(&[
                    ("caller", cell(field(v, "caller_id"))),
                    ("token", format!("{kind}{admin}")),
                    ("space", cell(field(v, "space_id"))),
                    (
                        "via",
                        format!(
                            "link {} from {} ({})",
                            cell(field(via, "link_id")),
                            cell(field(via, "holder")),
                            cell(field(via, "level"))
                        ),
                    ),
                ])
            } else {
                let mut pairs = vec![("caller", cell(field(v, "caller_id")))];
                if let Some(p) = field(v, "identity").as_str() {
                    pairs.push(("identity", p.to_owned()));
                }
                pairs.extend([
                    ("token", format!("{kind}{admin}")),
                    ("space", cell(field(v, "space_id"))),
                    ("role", cell(field(v, "role"))),
                    (
                        "permissions",
                        if perms.is_empty() {
                            "(none)".to_owned()
                        } else {
                            perms.iter().map(cell).collect::<Vec<_>>().join(", ")
                        },
                    ),
                ]);
                kv_lines(&pairs)
            }
        }
        Command::Spaces(cmd) => match cmd {
            SpacesCmd::List => items(v, "spaces")
                .iter()
                .map(|s| {
                    row(&[
                        cell(field(s, "id")),
                        cell(field(s, "name")),
                        cell(field(s, "tags")),
                    ])
                })
                .collect(),
            SpacesCmd::Create { .. } => {
                let s = field(v, "space");
                format!(
                    "created space {} ({})\n",
                    cell(field(s, "id")),
                    cell(field(s, "name"))
                )
            }
            SpacesCmd::Current => {
                let s = field(v, "space");
                kv_lines(&[
                    ("id", cell(field(s, "id"))),
                    ("name", cell(field(s, "name"))),
                    ("tags", cell(field(s, "tags"))),
                    ("created", time_cell(field(s, "created_at"))),
                    ("updated", time_cell(field(s, "updated_at"))),
                ])
            }
            SpacesCmd::Rename { .. } => {
                format!(
                    "space {} is now named {}\n",
                    cell(field(v, "space_id")),
                    cell(field(v, "name"))
                )
            }
            SpacesCmd::Delete => {
                let removed: Vec<String> = field(v, "removed")
                    .as_object()
                    .map(|m| m.iter().map(|(k, n)| format!("{k} {}", cell(n))).collect())
                    .unwrap_or_default();
                let detail = if removed.is_empty() {
                    String::new()
                } else {
                    format!("; removed {}", removed.join(", "))
                };
                format!("deleted space {}{detail}\n", cell(field(v, "space_id")))
            }
        },
        Command::Conversations(cmd) => match cmd {
            ConversationsCmd::List { .. } => items(v, "conversations")
                .iter()
                .map(|c| {
                    row(&[
                        cell(field(c, "id")),
                        cell(field(c, "platform")),
                        cell(field(c, "external_id")),
                        cell(field(c, "space_id")),
                        cell(field(c, "kind")),
                        cell(field(c, "title")),
                    ])
                })
                .collect(),
            ConversationsCmd::Link { .. } => format!(
                "conversation {} is linked to space {}\n",
                cell(field(v, "conversation_id")),
                cell(field(v, "space_id"))
            ),
            ConversationsCmd::Unlink { .. } => {
                format!(
                    "conversation {} is not linked to any space\n",
                    cell(field(v, "conversation_id"))
                )
            }
        },
        Command::Messages(_) => items(v, "messages").iter().map(message_line).collect(),
        Command::Prefs(cmd) => match cmd {
            PrefsCmd::List => items(v, "preferences")
                .iter()
                .map(|p| row(&[cell(field(p, "key")), cell(field(p, "value"))]))
                .collect(),
            // The bare value, so `$(mrctl prefs get k)` works.
            PrefsCmd::Get { .. } => format!(
                "{}\n",
                field(v, "value")
                    .as_str()
                    .map_or_else(|| cell(field(v, "value")), str::to_owned)
            ),
            PrefsCmd::Set { .. } => {
                format!("{} = {}\n", cell(field(v, "key")), cell(field(v, "value")))
            }
            PrefsCmd::Delete { .. } => format!("deleted preference {}\n", cell(field(v, "key"))),
        },
        Command::Config(cmd) => match cmd {
            ConfigCmd::Get { key: Some(_) } => {
                format!(
                    "{}\n",
                    field(v, "value")
                        .as_str()
                        .map_or_else(|| cell(field(v, "value")), str::to_owned)
                )
            }
            ConfigCmd::Get { key: None } => render_config(v),
            ConfigCmd::Set { .. } => {
                format!("{} = {}\n", cell(field(v, "key")), cell(field(v, "value")))
            }
        },
        Command::Tasks(cmd) => match cmd {
            TasksCmd::List => items(v, "tasks").iter().map(task_row).collect(),
            TasksCmd::Create { .. } | TasksCmd::Pause { .. } | TasksCmd::Resume { .. } => {
                task_row(field(v, "task"))
            }
            TasksCmd::Run { .. } => format!(
                "task {} fired as message {}\n",
                cell(field(v, "task_id")),
                cell(field(v, "message_id"))
            ),
            TasksCmd::Delete { .. } => format!("deleted task {}\n", cell(field(v, "task_id"))),
        },
        Command::Roles(cmd) => match cmd {
            RolesCmd::List => items(v, "roles")
                .iter()
                .map(|r| {
                    row(&[
                        cell(field(r, "caller_id")),
                        cell(field(r, "role")),
                        cell(field(r, "granted_by")),
                    ])
                })
                .collect(),
            RolesCmd::Grant { .. } => format!(
                "{} now has the role {}\n",
                cell(field(v, "caller_id")),
                cell(field(v, "role"))
            ),
            RolesCmd::Revoke { .. } => {
                if field(v, "revoked").as_bool() == Some(true) {
                    format!("revoked the role of {}\n", cell(field(v, "caller_id")))
                } else {
                    format!("{} had no granted role\n", cell(field(v, "caller_id")))
                }
            }
        },
        Command::Permissions(_) => match field(v, "roles").as_object() {
            Some(roles) => roles
                .iter()
                .map(|(role, perms)| row(&[role.clone(), cell(perms)]))
                .collect(),
            None => row(&[cell(field(v, "role")), cell(field(v, "permissions"))]),
        },
        Command::Mutes(cmd) => match cmd {
            MutesCmd::List => items(v, "mutes").iter().map(mute_row).collect(),
            MutesCmd::Set { .. } => mute_row(field(v, "mute")),
            MutesCmd::Delete { .. } => {
                if field(v, "deleted").as_bool() == Some(true) {
                    format!("unmuted {}\n", cell(field(v, "caller_id")))
                } else {
                    format!("{} was not muted\n", cell(field(v, "caller_id")))
                }
            }
        },
        Command::Model(cmd) => {
            let chain = items(v, "chain").iter().map(cell).collect::<Vec<_>>();
            match (cmd, chain.is_empty()) {
                (ModelCmd::Set { .. }, true) => {
                    "model chain reset to the host default\n".to_owned()
                }
                (ModelCmd::Set { .. }, false) => format!("model chain: {}\n", chain.join(", ")),
                (ModelCmd::Get, _) => format!(
                    "{} (from the {} setting)\n",
                    chain.join(", "),
                    cell(field(v, "source"))
                ),
            }
        }
        Command::Control(cmd) => match cmd {
            ControlCmd::Stop => {
                let dropped = field(v, "dropped").as_u64().unwrap_or(0);
                let head = if field(v, "stopped").as_bool() == Some(true) {
                    "stopped the running turn"
                } else {
                    "no turn was running"
                };
                format!("{head}; dropped {dropped} queued message(s)\n")
            }
            ControlCmd::Compact => {
                if field(v, "compacted").as_bool() == Some(true) {
                    format!(
                        "compacted the session; summary:\n{}\n",
                        field(v, "summary").as_str().unwrap_or("-")
                    )
                } else {
                    "nothing to compact\n".to_owned()
                }
            }
            ControlCmd::Clear => "cleared the session\n".to_owned(),
        },
        Command::Send { .. } => format!(
            "queued as outbox item {} in conversation {}\n",
            cell(field(v, "outbox_id")),
            cell(field(v, "conversation_id"))
        ),
        Command::Tokens(cmd) => match cmd {
            TokensCmd::Create { .. } => {
                // The token alone on stdout so `mrctl tokens create x > file` captures just it.
                note = Some(format!(
                    "token {} for {} ({}); it is shown only this once",
                    cell(field(v, "id")),
                    cell(field(v, "caller_id")),
                    cell(field(v, "kind"))
                ));
                format!("{}\n", cell(field(v, "token")))
            }
            TokensCmd::List => items(v, "tokens")
                .iter()
                .map(|t| {
                    let state = if field(t, "revoked_at").is_null() {
                        "active".to_owned()
                    } else {
                        format!("revoked {}", time_cell(field(t, "revoked_at")))
                    };
                    row(&[
                        cell(field(t, "id")),
                        cell(field(t, "caller_id")),
                        cell(field(t, "kind")),
                        cell(field(t, "label")),
                        time_cell(field(t, "created_at")),
                        time_cell(field(t, "expires_at")),
                        state,
                    ])
                })
                .collect(),
            TokensCmd::Revoke { .. } => format!("revoked token {}\n", cell(field(v, "id"))),
        },
        Command::Identities(cmd) => match cmd {
            IdentitiesCmd::Link { .. } => {
                let i = field(v, "identity");
                format!(
                    "{} now acts as {}\n",
                    cell(field(i, "platform_id")),
                    cell(field(i, "caller_id"))
                )
            }
            IdentitiesCmd::Unlink { .. } => format!(
                "{} no longer acts as {}\n",
                cell(field(v, "platform_id")),
                cell(field(v, "caller_id"))
            ),
            IdentitiesCmd::List => items(v, "identities")
                .iter()
                .map(|i| {
                    row(&[
                        cell(field(i, "platform_id")),
                        cell(field(i, "caller_id")),
                        cell(field(i, "created_by")),
                        time_cell(field(i, "created_at")),
                    ])
                })
                .collect(),
            IdentitiesCmd::Audit { .. } => items(v, "audit")
                .iter()
                .map(|a| {
                    row(&[
                        time_cell(field(a, "at")),
                        cell(field(a, "by")),
                        cell(field(a, "action")),
                        cell(field(a, "platform_id")),
                        cell(field(a, "caller_id")),
                    ])
                })
                .collect(),
        },
        Command::Chat { .. } => match field(v, "reply").as_str() {
            Some(reply) => format!("{reply}\n"),
            None => {
                note = Some(format!(
                    "the turn ended with status {} and no reply (run {})",
                    cell(field(v, "status")),
                    cell(field(v, "run_id"))
                ));
                String::new()
            }
        },
        Command::Links(cmd) => match cmd {
            LinksCmd::List => {
                let reach = |key: &str, arrow: &str| -> String {
                    items(v, key)
                        .iter()
                        .map(|r| {
                            row(&[
                                arrow.to_owned(),
                                cell(field(r, "space")),
                                cell(field(r, "level")),
                                format!("link {}", cell(field(r, "link_id"))),
                            ])
                        })
                        .collect()
                };
                format!(
                    "{}{}",
                    reach("outbound", "reaches"),
                    reach("inbound", "reached by")
                )
            }
            LinksCmd::Audit { .. } => items(v, "audit")
                .iter()
                .map(|a| {
                    row(&[
                        time_cell(field(a, "at")),
                        cell(field(a, "caller_id")),
                        cell(field(a, "action")),
                        format!(
                            "{} -> {}",
                            cell(field(a, "holder_space_id")),
                            cell(field(a, "target_space_id"))
                        ),
                        cell(field(a, "method")),
                        cell(field(a, "route")),
                        cell(field(a, "status")),
                    ])
                })
                .collect(),
            LinksCmd::Revoke { .. } | LinksCmd::Update { .. } => {
                let l = field(v, "link");
                let mut out = format!(
                    "link {} {} -> {} ({}){}\n",
                    cell(field(l, "id")),
                    cell(field(l, "holder_space_id")),
                    cell(field(l, "target_space_id")),
                    cell(field(l, "level")),
                    if field(l, "revoked_at").is_null() {
                        ""
                    } else {
                        ", revoked"
                    }
                );
                for r in items(v, "removed_roles") {
                    out.push_str(&format!(
                        "removed role {} of {} in {}\n",
                        cell(field(r, "role")),
                        cell(field(r, "caller_id")),
                        cell(field(r, "space_id"))
                    ));
                }
                out
            }
            _ => format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()),
        },
        Command::Ask { .. } => render_ask(v),
        Command::Runs(_) => items(v, "runs")
            .iter()
            .map(|r| {
                let ended = [field(r, "finished_at"), field(r, "ended_at")]
                    .into_iter()
                    .find(|x| !x.is_null())
                    .unwrap_or(&NULL);
                row(&[
                    cell(field(r, "id")),
                    cell(field(r, "kind")),
                    cell(field(r, "status")),
                    time_cell(field(r, "started_at")),
                    time_cell(ended),
                ])
            })
            .collect(),
        Command::Review(ReviewCmd::RunNow) => render_review_run(v),
    };
    (out, note)
}

/// `ask`: the reply labelled with the space, then the refusals, then the cost.
fn render_ask(v: &Value) -> String {
    let source = match field(v, "source_space") {
        Value::Null => field(v, "space_id"),
        s => s,
    };
    let mut out = format!(
        "[{}] {}\n",
        cell(source),
        field(v, "reply").as_str().unwrap_or("(no reply)")
    );
    let refusals = items(v, "refusals");
    if refusals.is_empty() {
        out.push_str("\nrefused writes: none\n");
    } else {
        out.push_str("\nrefused writes:\n");
        for r in refusals {
            out.push_str(&format!(
                "- {}\n",
                field(r, "summary").as_str().unwrap_or_default()
            ));
        }
    }
    out.push_str(&format!(
        "\ntokens: {} in, {} out; cost: {}\n",
        cell(field(v, "tokens_in")),
        cell(field(v, "tokens_out")),
        cell(field(v, "cost"))
    ));
    out
}

/// `review run-now`: the outcome, the report path and the footer counts.
fn render_review_run(v: &Value) -> String {
    let status = cell(field(v, "status"));
    if status == "running" {
        return format!(
            "review run {} is still running; the report and the digest follow when it ends\n",
            cell(field(v, "run_id"))
        );
    }
    let mut pairs = vec![("run", cell(field(v, "run_id"))), ("status", status)];
    if !field(v, "error").is_null() {
        pairs.push(("reason", cell(field(v, "error"))));
    }
    pairs.extend([
        ("report", cell(field(v, "report_path"))),
        ("findings", cell(field(v, "findings"))),
        ("spaces judged", cell(field(v, "spaces_judged"))),
        ("exchanges judged", cell(field(v, "exchanges_judged"))),
        ("judge calls", cell(field(v, "judge_calls"))),
    ]);
    let skipped: Vec<String> = items(v, "skipped")
        .iter()
        .map(|s| format!("{} ({})", cell(field(s, "what")), cell(field(s, "reason"))))
        .collect();
    if !skipped.is_empty() {
        pairs.push(("skipped", skipped.join("; ")));
    }
    let digest = field(v, "digest");
    pairs.push((
        "digest",
        if field(digest, "sent").as_bool() == Some(true) {
            format!("queued (outbox {})", cell(field(digest, "outbox_id")))
        } else {
            format!("not sent: {}", cell(field(digest, "reason")))
        },
    ));
    kv_lines(&pairs)
}

/// One table for `config get`: every available key with its value in this
/// space (or `(default)`) and its description, plus any set key the server
/// did not list as available.
fn render_config(v: &Value) -> String {
    let set = items(v, "config");
    let value_of = |key: &str| {
        set.iter()
            .find(|e| field(e, "key").as_str() == Some(key))
            .map(|e| cell(field(e, "value")))
    };
    let available = items(v, "available");
    let mut out = String::new();
    for a in available {
        let key = field(a, "key").as_str().unwrap_or_default();
        let value = value_of(key).unwrap_or_else(|| "(default)".to_owned());
        out.push_str(&row(&[
            key.to_owned(),
            value,
            cell(field(a, "description")),
        ]));
    }
    for e in set {
        let key = field(e, "key").as_str().unwrap_or_default();
        if !available
            .iter()
            .any(|a| field(a, "key").as_str() == Some(key))
        {
            out.push_str(&row(&[key.to_owned(), cell(field(e, "value"))]));
        }
    }
    out
}

fn task_row(t: &Value) -> String {
    let schedule = match field(t, "cron").as_str() {
        Some(c) => format!("cron {c}"),
        None => format!("at {}", time_cell(field(t, "at"))),
    };
    let mut state = if field(t, "active").as_bool() == Some(false) {
        "paused".to_owned()
    } else {
        "active".to_owned()
    };
    if field(t, "silent").as_bool() == Some(true) {
        state.push_str(",silent");
    }
    row(&[
        cell(field(t, "id")),
        schedule,
        state,
        format!("next {}", time_cell(field(t, "next_run_at"))),
        cell(field(t, "prompt")),
    ])
}

fn mute_row(m: &Value) -> String {
    let until = field(m, "until");
    let until = if until.is_null() {
        "indefinitely".to_owned()
    } else {
        format!("until {}", time_cell(until))
    };
    row(&[cell(field(m, "caller_id")), until, cell(field(m, "reason"))])
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::client::{build_request, Endpoint, DEFAULT_URL};

    use axum::body::Bytes as AxumBytes;
    use axum::http::{HeaderMap, Method as AxumMethod, StatusCode, Uri};
    use axum::Json;

    fn parse(args: &[&str]) -> Cli {
        let mut full = vec!["mrctl"];
        full.extend_from_slice(args);
        match Cli::try_parse_from(full) {
            Ok(cli) => cli,
            Err(e) => panic!("{args:?} did not parse: {e}"),
        }
    }

    fn planned(args: &[&str]) -> RequestPlan {
        match plan(&parse(args)) {
            Ok(p) => p,
            Err(e) => panic!("{args:?} did not plan: {e}"),
        }
    }

    fn usage_err(args: &[&str]) -> String {
        match plan(&parse(args)) {
            Ok(p) => panic!("{args:?} planned {p:?}"),
            Err(e) => e.0,
        }
    }

    fn clap_rejects(args: &[&str]) {
        let mut full = vec!["mrctl"];
        full.extend_from_slice(args);
        match Cli::try_parse_from(full) {
            Ok(cli) => panic!("{args:?} parsed: {cli:?}"),
            Err(e) => assert_eq!(e.exit_code(), 2, "{args:?}: {e}"),
        }
    }

    #[test]
    fn every_subcommand_maps_to_its_route() {
        let cases: Vec<(Vec<&str>, Method, &str, Option<Value>)> = vec![
            (vec!["whoami"], Method::GET, "/api/whoami", None),
            (vec!["spaces", "list"], Method::GET, "/api/spaces", None),
            (
                vec!["spaces", "create", "family", "--name", "Family", "--tags", "home, kids,"],
                Method::POST,
                "/api/spaces",
                Some(json!({"id": "family", "name": "Family", "tags": ["home", "kids"]})),
            ),
            (vec!["spaces", "create", "w1"], Method::POST, "/api/spaces", Some(json!({"id": "w1"}))),
            (vec!["spaces", "current"], Method::GET, "/api/spaces/current", None),
            (vec!["spaces", "rename", "Work"], Method::PUT, "/api/spaces/current/name", Some(json!({"name": "Work"}))),
            (vec!["spaces", "delete"], Method::DELETE, "/api/spaces/current", None),
            (vec!["conversations", "list"], Method::GET, "/api/conversations", None),
            (vec!["conversations", "list", "--all"], Method::GET, "/api/conversations?all=true", None),
            (
                vec!["conversations", "link", "12", "family"],
                Method::POST,
                "/api/conversations/12/link",
                Some(json!({"space_id": "family"})),
            ),
            (vec!["conversations", "unlink", "12"], Method::POST, "/api/conversations/12/unlink", None),
            (
                vec!["messages", "search", "dinner plans", "--limit", "5"],
                Method::GET,
                "/api/messages?q=dinner%20plans&limit=5",
                None,
            ),
            (vec!["messages", "recent"], Method::GET, "/api/messages/recent", None),
            (
                vec!["messages", "recent", "--since", "24h", "--until", "2026-11-29T10:00:00+01:00", "--limit", "50", "--cursor", "17-3"],
                Method::GET,
                "/api/messages/recent?since=24h&until=2026-11-29T10%3A00%3A00%2B01%3A00&limit=50&cursor=17-3",
                None,
            ),
            (vec!["prefs", "list"], Method::GET, "/api/prefs", None),
            (vec!["prefs", "get", "lang"], Method::GET, "/api/prefs", None),
            (vec!["prefs", "set", "lang", "42"], Method::PUT, "/api/prefs", Some(json!({"key": "lang", "value": "42"}))),
            (vec!["prefs", "delete", "a/b"], Method::DELETE, "/api/prefs/a%2Fb", None),
            (vec!["config", "get"], Method::GET, "/api/config", None),
            (vec!["config", "get", "trigger.match"], Method::GET, "/api/config", None),
            (
                vec!["config", "set", "rate_limit.per_minute", "10"],
                Method::PUT,
                "/api/config",
                Some(json!({"key": "rate_limit.per_minute", "value": "10"})),
            ),
            (vec!["tasks", "list"], Method::GET, "/api/tasks", None),
            (
                vec!["tasks", "create", "--cron", "0 9 * * 1-5", "--prompt", "standup"],
                Method::POST,
                "/api/tasks",
                Some(json!({"cron": "0 9 * * 1-5", "prompt": "standup"})),
            ),
            (
                vec!["tasks", "create", "--at", "2030-01-01T08:00:00Z", "--prompt", "wake", "--silent"],
                Method::POST,
                "/api/tasks",
                Some(json!({"at": "2030-01-01T08:00:00Z", "prompt": "wake", "silent": true})),
            ),
            (vec!["tasks", "pause", "3"], Method::POST, "/api/tasks/3/pause", None),
            (vec!["tasks", "resume", "3"], Method::POST, "/api/tasks/3/resume", None),
            (vec!["tasks", "run", "3"], Method::POST, "/api/tasks/3/run", None),
            (vec!["tasks", "delete", "3"], Method::DELETE, "/api/tasks/3", None),
            (vec!["roles", "list"], Method::GET, "/api/roles", None),
            (
                vec!["roles", "grant", "whatsapp:1@s.whatsapp.net"],
                Method::POST,
                "/api/roles",
                Some(json!({"caller_id": "whatsapp:1@s.whatsapp.net"})),
            ),
            (
                vec!["roles", "grant", "tg:5", "--role", "member"],
                Method::POST,
                "/api/roles",
                Some(json!({"caller_id": "tg:5", "role": "member"})),
            ),
            (
                vec!["roles", "revoke", "whatsapp:1@s.whatsapp.net"],
                Method::DELETE,
                "/api/roles/whatsapp%3A1%40s.whatsapp.net",
                None,
            ),
            (vec!["permissions", "show"], Method::GET, "/api/permissions", None),
            (vec!["permissions", "show", "--role", "member"], Method::GET, "/api/permissions?role=member", None),
            (
                vec!["permissions", "set", "member", "prompt, messages.read,,"],
                Method::PUT,
                "/api/permissions",
                Some(json!({"role": "member", "permissions": ["prompt", "messages.read"]})),
            ),
            (vec!["mutes", "list"], Method::GET, "/api/mutes", None),
            (vec!["mutes", "set", "tg:5"], Method::POST, "/api/mutes", Some(json!({"caller_id": "tg:5"}))),
            (
                vec!["mutes", "set", "tg:5", "--for", "2h", "--reason", "spam"],
                Method::POST,
                "/api/mutes",
                Some(json!({"caller_id": "tg:5", "for": "2h", "reason": "spam"})),
            ),
            (
                vec!["mutes", "set", "tg:5", "--until", "2030-01-01T00:00:00Z"],
                Method::POST,
                "/api/mutes",
                Some(json!({"caller_id": "tg:5", "until": "2030-01-01T00:00:00Z"})),
            ),
            (vec!["mutes", "delete", "tg:5"], Method::DELETE, "/api/mutes/tg%3A5", None),
            (vec!["model", "get"], Method::GET, "/api/model", None),
            (
                vec!["model", "set", "openai:gpt-4o", "anthropic:claude-x"],
                Method::PUT,
                "/api/model",
                Some(json!({"chain": ["openai:gpt-4o", "anthropic:claude-x"]})),
            ),
            (vec!["model", "set", "--default"], Method::PUT, "/api/model", Some(json!({"chain": []}))),
            (vec!["control", "stop"], Method::POST, "/api/control/stop", None),
            (vec!["control", "compact"], Method::POST, "/api/control/compact", None),
            (vec!["control", "clear"], Method::POST, "/api/control/clear", None),
            (vec!["send", "hello"], Method::POST, "/api/send", Some(json!({"text": "hello"}))),
            (
                vec!["send", "hello", "--conversation", "7"],
                Method::POST,
                "/api/send",
                Some(json!({"text": "hello", "conversation_id": 7})),
            ),
            (
                vec!["tokens", "create", "bridge", "--kind", "adapter", "--platform", "whatsapp", "--label", "wa", "--expires-in", "30d"],
                Method::POST,
                "/api/tokens",
                Some(json!({"caller_id": "bridge", "kind": "adapter", "platform": "whatsapp", "label": "wa", "expires_in": "30d"})),
            ),
            (
                vec!["identities", "link", "telegram:123456", "owner"],
                Method::POST,
                "/api/identities",
                Some(json!({"platform_id": "telegram:123456", "caller_id": "owner"})),
            ),
            (
                vec!["identities", "unlink", "telegram:123456"],
                Method::DELETE,
                "/api/identities/telegram%3A123456",
                None,
            ),
            (vec!["identities", "list"], Method::GET, "/api/identities", None),
            (
                vec!["tokens", "create", "alice"],
                Method::POST,
                "/api/tokens",
                Some(json!({"caller_id": "alice", "kind": "user"})),
            ),
            (vec!["tokens", "list"], Method::GET, "/api/tokens", None),
            (vec!["tokens", "revoke", "tok_1"], Method::DELETE, "/api/tokens/tok_1", None),
            (vec!["chat", "hi there"], Method::POST, "/api/chat", Some(json!({"text": "hi there"}))),
            (
                vec!["chat", "hi", "--conversation", "ops"],
                Method::POST,
                "/api/chat",
                Some(json!({"text": "hi", "conversation": "ops"})),
            ),
            (vec!["runs", "list"], Method::GET, "/api/runs", None),
            (vec!["runs", "list", "--limit", "3"], Method::GET, "/api/runs?limit=3", None),
            (vec!["review", "run-now"], Method::POST, "/api/review/run", None),
        ];
        for (args, method, target, body) in cases {
            let p = planned(&args);
            assert_eq!(p.method, method, "{args:?}");
            assert_eq!(p.target(), target, "{args:?}");
            assert_eq!(p.body, body, "{args:?}");
        }
    }

    #[test]
    fn follow_ups_are_planned() {
        assert_eq!(
            planned(&["messages", "recent", "--all"]).then,
            Then::FollowCursor
        );
        assert_eq!(planned(&["messages", "recent"]).then, Then::Show);
        assert_eq!(
            planned(&["prefs", "get", "lang"]).then,
            Then::PickPref("lang".into())
        );
        assert_eq!(
            planned(&["config", "get", "trigger.match"]).then,
            Then::PickConfig("trigger.match".into())
        );
        let mut p = planned(&["messages", "recent", "--cursor", "a", "--limit", "2"]);
        p.set_query("cursor", "b".into());
        assert_eq!(p.target(), "/api/messages/recent?limit=2&cursor=b");
    }

    #[test]
    fn global_flags_parse_anywhere() {
        let cli = parse(&[
            "spaces",
            "list",
            "--json",
            "--space",
            "family",
            "--token-file",
            "/t",
        ]);
        assert!(cli.json);
        assert_eq!(cli.space.as_deref(), Some("family"));
        assert_eq!(cli.token_file.as_deref(), Some(Path::new("/t")));
        let cli = parse(&["--json", "whoami"]);
        assert!(cli.json);
    }

    #[test]
    fn percent_encoding_keeps_ids_one_segment() {
        assert_eq!(
            encode("whatsapp:1@s.whatsapp.net"),
            "whatsapp%3A1%40s.whatsapp.net"
        );
        assert_eq!(encode("a b/c?d#e&f=g%"), "a%20b%2Fc%3Fd%23e%26f%3Dg%25");
        assert_eq!(encode("Az09-._~"), "Az09-._~");
        assert_eq!(encode("é"), "%C3%A9");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(encode("."), "%2E");
        assert_eq!(encode("a.b"), "a.b");
        assert_eq!(
            planned(&["tasks", "run", ".."]).target(),
            "/api/tasks/%2E%2E/run"
        );
    }

    #[test]
    fn durations_follow_the_server_grammar() {
        assert_eq!(duration_secs("2h"), Some(7_200));
        assert_eq!(duration_secs("1h30m"), Some(5_400));
        assert_eq!(duration_secs("7d"), Some(604_800));
        assert_eq!(duration_secs("2w"), Some(1_209_600));
        assert_eq!(duration_secs(" 90s "), Some(90));
        for bad in [
            "",
            "24",
            "h",
            "3x",
            "1hm",
            "-2h",
            "1.5h",
            "99999999999999999999s",
        ] {
            assert_eq!(duration_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rfc3339_shape_check() {
        for good in [
            "2026-11-29T10:00:00Z",
            "2026-11-29t10:00:00z",
            "2026-11-29T10:00:00.123+01:00",
            "2026-11-29 10:00:00-05:30",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        for bad in [
            "tomorrow",
            "2026-11-29",
            "2026-11-29T10:00:00",
            "2026-13-29T10:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:00:00.Z",
            "2026-11-29T10:00:00+0100",
            "2026-11-29T10:00:00Zjunk",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        assert!(usage_err(&["mutes", "set", "tg:5", "--for", "2"]).contains("not a duration"));
        assert!(usage_err(&["mutes", "set", "tg:5", "--for", "0h"]).contains("longer than zero"));
        assert!(usage_err(&["mutes", "set", "tg:5", "--until", "tomorrow"]).contains("RFC 3339"));
        assert!(
            usage_err(&["tokens", "create", "a", "--expires-in", "forever"])
                .contains("--expires-in")
        );
        assert!(usage_err(&["messages", "recent", "--since", "yesterday"]).contains("--since"));
        assert!(
            usage_err(&["tasks", "create", "--cron", "0 9 * *", "--prompt", "x"])
                .contains("4 fields")
        );
        assert!(usage_err(&["tasks", "create", "--at", "soon", "--prompt", "x"]).contains("--at"));
        assert!(
            usage_err(&["tasks", "create", "--cron", "0 9 * * *", "--prompt", " "])
                .contains("--prompt")
        );
        assert!(usage_err(&["spaces", "create", "Bad_Id"]).contains("not a space id"));
        assert!(usage_err(&["spaces", "create", "--", "-x"]).contains("not a space id"));
        assert!(usage_err(&["conversations", "link", "1", "NOPE"]).contains("not a space id"));
        assert!(usage_err(&["whoami", "--space", "Other Space"]).contains("--space"));
        assert!(usage_err(&["model", "set", "gpt-4o"]).contains("PROVIDER:MODEL"));
        assert!(usage_err(&["send", ""]).contains("must not be empty"));
    }

    #[test]
    fn clap_enforces_exclusive_and_required_flags() {
        clap_rejects(&["tasks", "create", "--prompt", "x"]);
        clap_rejects(&[
            "tasks",
            "create",
            "--cron",
            "* * * * *",
            "--at",
            "2030-01-01T00:00:00Z",
            "--prompt",
            "x",
        ]);
        clap_rejects(&["tasks", "create", "--cron", "* * * * *"]);
        clap_rejects(&[
            "mutes",
            "set",
            "x",
            "--for",
            "2h",
            "--until",
            "2030-01-01T00:00:00Z",
        ]);
        clap_rejects(&["model", "set"]);
        clap_rejects(&["model", "set", "openai:x", "--default"]);
        clap_rejects(&["messages", "search", "x", "--limit", "0"]);
        clap_rejects(&["messages", "search", "x", "--limit", "201"]);
        clap_rejects(&["messages", "recent", "--limit", "1001"]);
        clap_rejects(&["tokens", "create", "x", "--kind", "run"]);
        clap_rejects(&["send", "x", "--conversation", "abc"]);
        clap_rejects(&["ingress"]);
        clap_rejects(&[]);
    }

    #[test]
    fn exit_codes_by_failure_kind() {
        let api = Failure::Api {
            status: 403,
            code: Some("forbidden".into()),
            message: "requires the 'prompt' permission in this space".into(),
        };
        assert_eq!(exit_code(&api), 1);
        assert_eq!(
            api.to_string(),
            "requires the 'prompt' permission in this space (HTTP 403, forbidden)"
        );
        assert_eq!(exit_code(&Failure::Missing("x".into())), 1);
        assert_eq!(exit_code(&Failure::Usage(UsageError("x".into()))), 2);
        assert_eq!(
            exit_code(&Failure::Client(ClientError::Config("x".into()))),
            2
        );
        let refused = ClientError::Connect {
            addr: "http://127.0.0.1:1".into(),
            hint: "check MERCURY_URL",
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(exit_code(&Failure::Client(refused)), 2);
        let timeout = ClientError::Timeout {
            addr: "x".into(),
            secs: 1,
        };
        assert_eq!(exit_code(&Failure::Client(timeout)), 2);
    }

    #[test]
    fn api_failures_carry_the_server_sentence() {
        let f = api_failure(
            404,
            &json!({"error": {"code": "not_found", "message": "space nope not found"}}),
        );
        assert_eq!(f.to_string(), "space nope not found (HTTP 404, not_found)");
        let f = api_failure(502, &Value::String("Bad Gateway".into()));
        assert_eq!(f.to_string(), "Bad Gateway (HTTP 502)");
        let f = api_failure(500, &Value::Null);
        assert_eq!(
            f.to_string(),
            "the server answered with status 500 (HTTP 500)"
        );
        assert!(api_failure(
            401,
            &json!({"error": {"code": "unauthorized", "message": "bad token"}})
        )
        .to_string()
        .contains("MERCURY_TOKEN"));
    }

    #[test]
    fn urls_parse_to_endpoints() {
        let ep = |raw: &str| match Endpoint::parse_url(raw) {
            Ok(e) => e,
            Err(e) => panic!("{raw}: {e}"),
        };
        let http = |host: &str, port, base: &str| Endpoint::Http {
            host: host.into(),
            port,
            base_path: base.into(),
        };
        assert_eq!(ep("http://127.0.0.1:8787"), http("127.0.0.1", 8787, ""));
        assert_eq!(ep("http://localhost/"), http("localhost", 80, ""));
        assert_eq!(ep("HTTP://host:1/mercury/"), http("host", 1, "/mercury"));
        assert_eq!(ep("http://[::1]:9000"), http("::1", 9000, ""));
        assert_eq!(ep("http://[::1]:9000").describe(), "http://[::1]:9000");
        for bad in [
            "https://x",
            "ftp://x",
            "x:80",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "http://u:p@h",
            "http://h/?q",
            "http://[::1",
        ] {
            assert!(Endpoint::parse_url(bad).is_err(), "{bad}");
        }
        match Endpoint::parse_url("https://x") {
            Err(e) => assert!(e.to_string().contains("MERCURY_SOCKET"), "{e}"),
            Ok(e) => panic!("{e:?}"),
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    fn conn_from(
        pairs: &[(&str, &str)],
        token_file: Option<&Path>,
    ) -> Result<Connection, ClientError> {
        Connection::from_env(&env_of(pairs), token_file, None)
    }

    #[test]
    fn connection_settings_come_from_the_environment() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("global"))?;
        std::fs::write(dir.path().join("global/owner.token"), "  owner-secret\n")?;
        let file = dir.path().join("my.token");
        std::fs::write(&file, "file-secret\n")?;
        let data_dir = dir.path().to_str().ok_or("utf8")?;

        // Defaults: the owner token from the data dir, the default URL, no space.
        let c = conn_from(&[("MERCURY_DATA_DIR", data_dir)], None)?;
        assert_eq!(c.token.as_deref(), Some("owner-secret"));
        assert_eq!(c.endpoint, Endpoint::parse_url(DEFAULT_URL)?);
        assert_eq!(c.space, None);
        assert_eq!(c.timeout, Duration::from_secs(600));

        // MERCURY_TOKEN beats the data dir; --token-file beats both.
        let env = [
            ("MERCURY_DATA_DIR", data_dir),
            ("MERCURY_TOKEN", " env-secret "),
            ("MERCURY_SPACE", "family"),
        ];
        let c = conn_from(&env, None)?;
        assert_eq!(c.token.as_deref(), Some("env-secret"));
        assert_eq!(c.space.as_deref(), Some("family"));
        assert_eq!(
            conn_from(&env, Some(&file))?.token.as_deref(),
            Some("file-secret")
        );

        // The socket beats the URL.
        let c = conn_from(
            &[
                ("MERCURY_TOKEN", "t"),
                ("MERCURY_SOCKET", "/x/api.sock"),
                ("MERCURY_URL", "http://h:1"),
            ],
            None,
        )?;
        assert_eq!(c.endpoint, Endpoint::Unix(PathBuf::from("/x/api.sock")));
        let c = conn_from(
            &[
                ("MERCURY_TOKEN", "t"),
                ("MERCURY_SOCKET", ""),
                ("MERCURY_TIMEOUT_SECS", "5"),
            ],
            None,
        )?;
        assert!(matches!(c.endpoint, Endpoint::Http { .. }));
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert!(conn_from(
            &[("MERCURY_TOKEN", "t"), ("MERCURY_TIMEOUT_SECS", "0")],
            None
        )
        .is_err());
        Ok(())
    }

    #[test]
    fn missing_token_says_where_it_looked() -> Result<(), Box<dyn std::error::Error>> {
        let err = conn_from(&[], None)
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(
            err.contains("--token-file")
                && err.contains("MERCURY_TOKEN")
                && err.contains("MERCURY_DATA_DIR"),
            "{err}"
        );
        let dir = tempfile::tempdir()?;
        let data_dir = dir.path().to_str().ok_or("utf8")?;
        let err = conn_from(&[("MERCURY_DATA_DIR", data_dir)], None)
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(
            err.contains("owner.token") && err.contains("does not exist"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = conn_from(&[("MERCURY_TOKEN", "t")], Some(&missing))
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(err.contains("nope"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n")?;
        let err = conn_from(&[], Some(&empty))
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(err.contains("empty"), "{err}");
        Ok(())
    }

    #[test]
    fn the_token_never_shows() {
        let conn = Connection::new(Endpoint::Unix("/s".into())).with_token("sekret-123");
        assert!(!format!("{conn:?}").contains("sekret"));
        let conn = conn.with_token("bad\ntoken-sekret");
        match build_request(&conn, Method::GET, "/api/whoami", None) {
            Err(e) => assert!(!e.to_string().contains("sekret"), "{e}"),
            Ok(_) => panic!("a newline in the token must be refused"),
        }
    }

    #[test]
    fn times_render_as_rfc3339() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_ms(1_000_000_000_999), "2001-09-09T01:46:40Z");
        assert_eq!(format_ms(-86_400_000), "1969-12-31T00:00:00Z");
        assert_eq!(
            time_cell(&json!("2026-01-01T00:00:00Z")),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(time_cell(&Value::Null), "-");
    }

    #[test]
    fn human_output_shapes() {
        let (out, _) = render(
            &parse(&["spaces", "list"]).command,
            &json!({"spaces": [{"id": "family", "name": "Family", "tags": ["home", "kids"]}, {"id": "w", "name": "W", "tags": []}]}),
        );
        assert_eq!(out, "family\tFamily\thome,kids\nw\tW\t-\n");

        let (out, _) = render(
            &Command::Whoami,
            &json!({"caller_id": "tg:1", "token_kind": "user", "global_admin": true, "space_id": "family", "role": "admin", "permissions": ["prompt", "send"]}),
        );
        assert_eq!(out, "caller: tg:1\ntoken: user (global admin)\nspace: family\nrole: admin\npermissions: prompt, send\n");

        let (out, _) = render(
            &Command::Whoami,
            &json!({"caller_id": "alice", "token_kind": "user", "global_admin": false, "space_id": "t", "role": null, "permissions": [],
                    "via": {"holder": "h", "level": "read", "link_id": 4, "conversation_id": null}, "source_space": "t"}),
        );
        assert_eq!(
            out,
            "caller: alice\ntoken: user\nspace: t\nvia: link 4 from h (read)\n"
        );
        let cmd = parse(&["messages", "recent"]).command;
        let v = json!({"messages": [{"created_at": 0, "sender_name": "Ann", "text": "hi"}], "source_space": "t"});
        let (out, _) = render(&cmd, &v);
        assert_eq!(
            tag_source(&cmd, &v, out),
            "[from t] [1970-01-01T00:00:00Z] Ann: hi\n"
        );
        let ask = parse(&["ask", "hi"]).command;
        let v = json!({"space_id": "x", "source_space": "x", "reply": "yo", "refusals": [], "tokens_in": 1, "tokens_out": 1, "cost": 0});
        let (out, _) = render(&ask, &v);
        assert!(tag_source(&ask, &v, out).starts_with("[x] yo\n"));

        let (out, _) = render(
            &parse(&["messages", "recent"]).command,
            &json!({"messages": [
                {"created_at": 0, "sender_name": "Ann", "sender_id": "tg:1", "role": "user", "text": "hi\nthere"},
                {"created_at": "2026-01-01T00:00:00Z", "sender_name": null, "sender_id": null, "role": "assistant", "text": "hello"}
            ], "next_cursor": null}),
        );
        assert_eq!(
            out,
            "[1970-01-01T00:00:00Z] Ann: hi\n    there\n[2026-01-01T00:00:00Z] assistant: hello\n"
        );

        let (out, note) = render(
            &parse(&["chat", "x"]).command,
            &json!({"reply": "Hi!", "run_id": "r", "status": "ok"}),
        );
        assert_eq!((out.as_str(), note), ("Hi!\n", None));
        let (out, note) = render(
            &parse(&["chat", "x"]).command,
            &json!({"reply": null, "run_id": "r", "status": "failed"}),
        );
        assert!(out.is_empty() && note.is_some_and(|n| n.contains("failed")));

        let (out, note) = render(
            &parse(&["tokens", "create", "a"]).command,
            &json!({"id": "t1", "token": "mrc_abc", "caller_id": "a", "kind": "user"}),
        );
        assert_eq!(out, "mrc_abc\n");
        assert!(note.is_some_and(|n| n.contains("t1") && !n.contains("mrc_abc")));

        let (out, _) = render(
            &parse(&["config", "get"]).command,
            &json!({"config": [{"key": "trigger.match", "value": "always"}, {"key": "x.y", "value": "1"}],
                    "available": [{"key": "trigger.match", "description": "when"}, {"key": "rate_limit.per_minute", "description": "rate"}]}),
        );
        assert_eq!(
            out,
            "trigger.match\talways\twhen\nrate_limit.per_minute\t(default)\trate\nx.y\t1\n"
        );

        let (out, _) = render(
            &parse(&["permissions", "show"]).command,
            &json!({"roles": {"admin": ["a", "b"], "member": ["prompt"]}, "available": []}),
        );
        assert_eq!(out, "admin\ta,b\nmember\tprompt\n");

        let (out, _) = render(
            &parse(&["tasks", "list"]).command,
            &json!({"tasks": [{"id": 3, "cron": "0 9 * * *", "at": null, "active": false, "silent": true, "next_run_at": null, "prompt": "standup"}]}),
        );
        assert_eq!(out, "3\tcron 0 9 * * *\tpaused,silent\tnext -\tstandup\n");
    }

    #[test]
    fn picks_one_pref_or_config_key() {
        let prefs = json!({"preferences": [{"key": "lang", "value": "de"}]});
        assert!(
            matches!(pick(&Then::PickPref("lang".into()), prefs.clone()), Ok(v) if v["value"] == "de")
        );
        assert!(matches!(
            pick(&Then::PickPref("nope".into()), prefs),
            Err(Failure::Missing(_))
        ));
        let config = json!({"config": [], "available": [{"key": "trigger.match"}]});
        match pick(&Then::PickConfig("trigger.match".into()), config.clone()) {
            Err(Failure::Missing(m)) => assert!(m.contains("default"), "{m}"),
            other => panic!("{other:?}"),
        }
        match pick(&Then::PickConfig("bogus".into()), config) {
            Err(Failure::Missing(m)) => assert!(m.contains("trigger.match"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    // ---- round trips against a real server ----

    /// What the test server saw of the last plain request.
    type Seen = Arc<Mutex<Vec<Value>>>;

    fn header(headers: &HeaderMap, name: &str) -> Value {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map_or(Value::Null, |s| json!(s))
    }

    fn test_app(seen: Seen) -> axum::Router {
        let handler = move |method: AxumMethod, uri: Uri, headers: HeaderMap, body: AxumBytes| {
            let seen = seen.clone();
            async move {
                let query = uri.query().unwrap_or_default().to_owned();
                let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let echo = json!({
                    "method": method.as_str(),
                    "path": uri.path(),
                    "query": query,
                    "authorization": header(&headers, "authorization"),
                    "space": header(&headers, "x-mercury-space"),
                    "act_as": header(&headers, "x-mercury-act-as"),
                    "content_type": header(&headers, "content-type"),
                    "host": header(&headers, "host"),
                    "body": parsed,
                });
                if let Ok(mut s) = seen.lock() {
                    s.push(echo.clone());
                }
                let (status, answer) = match (method.as_str(), uri.path()) {
                    ("GET", "/api/spaces") => (
                        StatusCode::FORBIDDEN,
                        json!({"error": {"code": "forbidden", "message": "requires the 'spaces.list' permission in this space"}}),
                    ),
                    ("GET", "/api/messages/recent") if query.contains("cursor=c1") => (
                        StatusCode::OK,
                        json!({"messages": [{"created_at": 2000, "sender_name": "Bo", "text": "two"}], "next_cursor": null}),
                    ),
                    ("GET", "/api/messages/recent") => (
                        StatusCode::OK,
                        json!({"messages": [{"created_at": 1000, "sender_name": "Al", "text": "one"}], "next_cursor": "c1"}),
                    ),
                    ("POST", "/api/chat") => (
                        StatusCode::OK,
                        json!({"reply": format!("you said: {}", parsed["text"].as_str().unwrap_or_default()), "run_id": "r1", "message_id": 9, "status": "ok"}),
                    ),
                    _ => (StatusCode::OK, echo),
                };
                (status, Json(answer))
            }
        };
        axum::Router::new().fallback(handler)
    }

    struct Outcome {
        code: u8,
        out: String,
        err: String,
    }

    async fn invoke(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Outcome {
        let cli = parse(args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut input = stdin.as_bytes();
        let code = run(cli, &env_of(env), &mut input, &mut out, &mut err).await;
        Outcome {
            code,
            out: String::from_utf8_lossy(&out).into_owned(),
            err: String::from_utf8_lossy(&err).into_owned(),
        }
    }

    fn json_out(o: &Outcome) -> Value {
        assert_eq!(o.code, 0, "stderr: {}", o.err);
        match serde_json::from_str(&o.out) {
            Ok(v) => v,
            Err(e) => panic!("not JSON ({e}): {}", o.out),
        }
    }

    async fn tcp_server() -> Result<(String, Seen), std::io::Error> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let seen: Seen = Arc::default();
        let app = test_app(seen.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((url, seen))
    }

    #[tokio::test]
    async fn round_trip_over_tcp_sends_token_space_act_as_and_json(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (url, _seen) = tcp_server().await?;
        let env = [
            ("MERCURY_URL", url.as_str()),
            ("MERCURY_TOKEN", "tok-1"),
            ("MERCURY_SPACE", "family"),
        ];

        let o = invoke(
            &[
                "--json",
                "roles",
                "grant",
                "whatsapp:1@s.whatsapp.net",
                "--role",
                "member",
            ],
            &env,
            "",
        )
        .await;
        let echo = json_out(&o);
        assert_eq!(echo["method"], "POST");
        assert_eq!(echo["path"], "/api/roles");
        assert_eq!(echo["authorization"], "Bearer tok-1");
        assert_eq!(echo["space"], "family");
        assert_eq!(echo["act_as"], Value::Null);
        assert_eq!(echo["content_type"], "application/json");
        assert_eq!(echo["host"], url.trim_start_matches("http://"));
        assert_eq!(
            echo["body"],
            json!({"caller_id": "whatsapp:1@s.whatsapp.net", "role": "member"})
        );

        let o = invoke(
            &[
                "--json",
                "--space",
                "work",
                "mutes",
                "delete",
                "whatsapp:1@s.whatsapp.net",
            ],
            &env,
            "",
        )
        .await;
        let echo = json_out(&o);
        assert_eq!(echo["method"], "DELETE");
        assert_eq!(echo["path"], "/api/mutes/whatsapp%3A1%40s.whatsapp.net");
        assert_eq!(echo["act_as"], "work");
        assert_eq!(echo["space"], "family");
        assert_eq!(echo["content_type"], Value::Null);

        let o = invoke(
            &["--json", "messages", "search", "a&b c", "--limit", "3"],
            &env,
            "",
        )
        .await;
        assert_eq!(json_out(&o)["query"], "q=a%26b%20c&limit=3");
        Ok(())
    }

    #[tokio::test]
    async fn round_trip_over_a_unix_socket() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let sock = dir.path().join("api.sock");
        let listener = tokio::net::UnixListener::bind(&sock)?;
        let seen: Seen = Arc::default();
        let app = test_app(seen.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let sock_str = sock.to_str().ok_or("utf8")?;
        // The URL is deliberately unreachable: the socket must win.
        let env = [
            ("MERCURY_SOCKET", sock_str),
            ("MERCURY_URL", "http://127.0.0.1:1"),
            ("MERCURY_TOKEN", "run-tok"),
            ("MERCURY_SPACE", "family"),
        ];
        let o = invoke(&["--json", "prefs", "set", "lang", "de"], &env, "").await;
        let echo = json_out(&o);
        assert_eq!(echo["method"], "PUT");
        assert_eq!(echo["path"], "/api/prefs");
        assert_eq!(echo["authorization"], "Bearer run-tok");
        assert_eq!(echo["space"], "family");
        assert_eq!(echo["body"], json!({"key": "lang", "value": "de"}));

        // Human chat output with the prompt from stdin.
        let o = invoke(&["chat", "-"], &env, "what's up?\n").await;
        assert_eq!(
            (o.code, o.out.as_str(), o.err.as_str()),
            (0, "you said: what's up?\n", "")
        );
        let bodies: Vec<Value> = seen
            .lock()
            .map_err(|_| "poisoned")?
            .iter()
            .map(|e| e["body"].clone())
            .collect();
        assert_eq!(bodies.last(), Some(&json!({"text": "what's up?"})));

        // The `request` API on its own, as the host's tests would use it.
        let conn = Connection::new(Endpoint::Unix(sock.clone()))
            .with_token("t2")
            .with_space("s2");
        let (status, echo) = request(&conn, Method::GET, "/api/whoami", None).await?;
        assert_eq!(status, 200);
        assert_eq!(echo["authorization"], "Bearer t2");
        assert_eq!(echo["space"], "s2");
        Ok(())
    }

    #[tokio::test]
    async fn recent_all_follows_the_cursor() -> Result<(), Box<dyn std::error::Error>> {
        let (url, seen) = tcp_server().await?;
        let env = [("MERCURY_URL", url.as_str()), ("MERCURY_TOKEN", "t")];
        let o = invoke(&["messages", "recent", "--all", "--since", "2h"], &env, "").await;
        assert_eq!(o.code, 0, "{}", o.err);
        assert_eq!(
            o.out,
            "[1970-01-01T00:00:01Z] Al: one\n[1970-01-01T00:00:02Z] Bo: two\n"
        );
        let queries: Vec<Value> = seen
            .lock()
            .map_err(|_| "poisoned")?
            .iter()
            .map(|e| e["query"].clone())
            .collect();
        assert_eq!(
            queries,
            vec![json!("since=2h"), json!("since=2h&cursor=c1")]
        );

        let o = invoke(&["--json", "messages", "recent", "--all"], &env, "").await;
        let v = json_out(&o);
        assert_eq!(v["messages"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["next_cursor"], Value::Null);
        Ok(())
    }

    #[tokio::test]
    async fn a_refusal_exits_1_with_the_server_message() -> Result<(), Box<dyn std::error::Error>> {
        let (url, _seen) = tcp_server().await?;
        let o = invoke(
            &["spaces", "list"],
            &[("MERCURY_URL", url.as_str()), ("MERCURY_TOKEN", "t")],
            "",
        )
        .await;
        assert_eq!(o.code, 1);
        assert_eq!(o.out, "");
        assert_eq!(
            o.err,
            "mrctl: requires the 'spaces.list' permission in this space (HTTP 403, forbidden)\n"
        );
        Ok(())
    }

    #[tokio::test]
    async fn connection_refused_exits_2_naming_the_address(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // Bind then drop, so the port is (almost certainly) closed.
        let port = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await?
            .local_addr()?
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let o = invoke(
            &["whoami"],
            &[("MERCURY_URL", url.as_str()), ("MERCURY_TOKEN", "t")],
            "",
        )
        .await;
        assert_eq!(o.code, 2);
        assert!(
            o.err
                .starts_with("mrctl: cannot reach the Mercury server at "),
            "{}",
            o.err
        );
        assert!(
            o.err.contains(&url)
                && o.err.contains("MERCURY_URL")
                && o.err.contains("mercury serve"),
            "{}",
            o.err
        );

        let dir = tempfile::tempdir()?;
        let sock = dir.path().join("absent.sock");
        let o = invoke(
            &["whoami"],
            &[
                ("MERCURY_SOCKET", sock.to_str().ok_or("utf8")?),
                ("MERCURY_TOKEN", "t"),
            ],
            "",
        )
        .await;
        assert_eq!(o.code, 2);
        assert!(
            o.err.contains("absent.sock") && o.err.contains("MERCURY_SOCKET"),
            "{}",
            o.err
        );
        Ok(())
    }

    #[tokio::test]
    async fn usage_and_token_problems_exit_2_before_any_request() {
        // No server at this address: reaching it would be a different error.
        let env = [("MERCURY_URL", "http://127.0.0.1:1")];
        let o = invoke(&["mutes", "set", "x", "--for", "soon"], &env, "").await;
        assert_eq!(o.code, 2);
        assert!(
            o.err.starts_with("mrctl: --for \"soon\" is not a duration"),
            "{}",
            o.err
        );
        let o = invoke(&["whoami"], &env, "").await;
        assert_eq!(o.code, 2);
        assert!(o.err.starts_with("mrctl: no API token"), "{}", o.err);
        let o = invoke(&["chat", "-"], &[("MERCURY_TOKEN", "t")], "\n").await;
        assert_eq!(o.code, 2);
        assert!(o.err.contains("stdin is empty"), "{}", o.err);
    }

    #[tokio::test]
    async fn a_slow_server_times_out() -> Result<(), Box<dyn std::error::Error>> {
        // Accepts but never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let mut conn =
            Connection::new(Endpoint::parse_url(&format!("http://{addr}"))?).with_token("t");
        conn.timeout = Duration::from_millis(200);
        match request(&conn, Method::GET, "/api/whoami", None).await {
            Err(ClientError::Timeout { .. }) => Ok(()),
            other => Err(format!("expected a timeout, got {other:?}").into()),
        }
    }
}
