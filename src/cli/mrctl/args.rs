//! `mrctl`'s argument grammar: one subcommand per API route.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, Subcommand, ValueEnum};

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
    pub(super) fn as_str(self) -> &'static str {
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
    pub(super) fn as_str(self) -> &'static str {
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
        /// Limit a user token to one scope: `review.read` (read review reports only).
        #[arg(long)]
        scope: Option<String>,
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
    /// The review reports on the host, daily and weekly, oldest first.
    Reports,
    /// One report's JSON: DATE is YYYY-MM-DD (the daily) or YYYY-MM-DD-weekly.
    Report { date: String },
    /// The intake ledger: every triaged row and its decisions.
    Ledger,
    /// Run the weekly synthesis now and wait for its report.
    WeeklyNow,
}

#[derive(Debug, Subcommand)]
pub enum RunsCmd {
    List {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
}
