//! `mrctl`'s argument grammar: one subcommand per API route.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, Subcommand, ValueEnum};

/// Command-line client for the Mercury API.
///
/// Connection: MERCURY_SOCKET (a Unix socket path) or MERCURY_URL, else the
/// data dir's api.sock, else its mercury.yaml `bind` (the data dir is
/// MERCURY_DATA_DIR, default ./mercury-data like `mercury`), else
/// http://127.0.0.1:8787. Token: --token-file, else MERCURY_TOKEN, else
/// <data dir>/global/owner.token. Space: --in SPACE (else MERCURY_SPACE) names
/// the space a command works in (inside a turn, the run token names it).
#[derive(Debug, Parser)]
#[command(
    name = "mrctl",
    version,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Print the server's JSON answer as is (pretty-printed); errors become
    /// `{"error": {...}}` on stderr.
    #[arg(long, global = true)]
    pub json: bool,

    /// Read the API token from this file (else MERCURY_TOKEN, else $MERCURY_DATA_DIR/global/owner.token).
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Act in SPACE through a space link held by the working space (--in or
    /// MERCURY_SPACE, the holder); the link's level decides what is allowed.
    #[arg(long, global = true, value_name = "SPACE")]
    pub space: Option<String>,

    /// The space the command works in (beats MERCURY_SPACE).
    #[arg(long = "in", global = true, value_name = "SPACE")]
    pub in_space: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

/// The examples and exit codes under `mrctl --help`.
pub const EXAMPLES: &str = "\
Examples:
  mrctl --in family whoami                     who am I in the space family
  mrctl --in family prefs list                 (MERCURY_SPACE=family does the same)
  MERCURY_SPACE=family mrctl chat 'what is on today?'
  MERCURY_SPACE=family mrctl tasks create --cron '0 9 * * 1-5' --prompt 'standup notes'
  MERCURY_SPACE=family mrctl tasks list
  mrctl links create family work --level read --disclosure 'told in #general'
  MERCURY_SPACE=family mrctl links list
  MERCURY_SPACE=family mrctl --space work messages recent --since 24h
  MERCURY_SPACE=family mrctl --space work ask 'what did we decide about the release?'
  mrctl completions bash > /etc/bash_completion.d/mrctl

--in SPACE (or MERCURY_SPACE) is the space a command works in. --space TARGET acts
in TARGET through a space link held by that space (the holder): both are needed,
and the link decides what is allowed.

The host is found through MERCURY_SOCKET or MERCURY_URL, else the data dir
(MERCURY_DATA_DIR, default ./mercury-data): its api.sock, else its `bind`.

Exit status: 0 done; 1 the server refused; 2 usage, connection or token (401);
3 it ran but ended failed or blocked (a failed chat turn, a failed ask, a blocked review).";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show who the token belongs to, the space, the role and its permissions.
    Whoami,
    /// Inside a sandbox on an engine elsewhere: listen at PATH and carry
    /// each connection over stdin/stdout to the host (started by the host,
    /// never by hand).
    #[command(hide = true)]
    Bridge {
        /// The socket to listen on inside the sandbox.
        #[arg(long, value_name = "PATH")]
        listen: PathBuf,
    },
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
    /// Extensions the operator installed: list them, enable or disable one here.
    #[command(subcommand)]
    Ext(ExtCmd),
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
    /// Strangers' pending pairing requests: approve or deny them (global admins).
    #[command(subcommand)]
    Pairing(PairingCmd),
    /// Who may talk to the bot: allow or deny a sender or a group (global admins).
    #[command(subcommand)]
    Senders(SendersCmd),
    /// Run an agent turn with this prompt and print the reply (exit 3 if the turn failed).
    #[command(
        after_help = "Example: MERCURY_SPACE=family mrctl chat 'what is on the shopping list?'"
    )]
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
    /// Ask another space's agent, on a throwaway copy of its workspace:
    /// nothing it does is kept (use with --space TARGET; exit 3 if it failed).
    #[command(
        after_help = "Example: MERCURY_SPACE=family mrctl --space work ask 'when is the release?' --as member"
    )]
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
    /// Spend caps: show them, set a space's own (global admins; the space from MERCURY_SPACE).
    #[command(subcommand)]
    Budget(BudgetCmd),
    /// What the model calls cost, by space, day, purpose and model (global admins).
    #[command(after_help = "Example: mrctl cost --since 7d --by model")]
    Cost {
        /// From when: an RFC 3339 time or a duration before now (7d);
        /// default the start of this month.
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only one breakdown.
        #[arg(long, value_enum)]
        by: Option<CostBy>,
    },
    /// Workspace files of the space (AGENTS.md, MEMORY.md, knowledge/...).
    #[command(subcommand)]
    Files(FilesCmd),
    /// The web dashboard at /ui/.
    #[command(subcommand)]
    Ui(UiCmd),
    /// Print a shell completion script (bash, zsh or fish) to stdout.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Write man pages (mrctl.1 and one per subcommand) into a directory.
    Man {
        /// Where the pages go (created if absent), e.g. deploy/man.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum UiCmd {
    /// Print a one-time sign-in link to the dashboard for this token's user
    /// (it signs in once, within 5 minutes).
    Login,
}

#[derive(Debug, Subcommand)]
pub enum FilesCmd {
    /// List a directory of the workspace (default: its top).
    Ls {
        /// A directory inside the workspace, e.g. knowledge.
        path: Option<String>,
    },
    /// Print a file.
    Cat {
        /// A file inside the workspace, e.g. MEMORY.md.
        path: String,
    },
    /// Write a file from a local file (`--from FILE`, `-` for stdin) or from `--text`.
    #[command(group(ArgGroup::new("source").required(true).args(["from", "text"])))]
    Put {
        /// The file to write, inside the workspace.
        path: String,
        /// Read the new content from this local file (`-`: stdin).
        #[arg(long, value_name = "FILE")]
        from: Option<String>,
        /// The whole new content, given inline (handy inside a turn's tool call).
        #[arg(long, value_name = "TEXT")]
        text: Option<String>,
        /// Write only if the file still has this hash (from `ls` or `cat --json`).
        #[arg(long, value_name = "HASH")]
        if_match: Option<String>,
        /// Filled from --from before the request is planned.
        #[arg(skip)]
        content: Option<String>,
    },
    /// Delete a file.
    Rm {
        /// The file to delete, inside the workspace.
        path: String,
        /// Delete only if the file still has this hash.
        #[arg(long, value_name = "HASH")]
        if_match: Option<String>,
    },
    /// Open a copy of a file in $EDITOR, then write it back if it did not change meanwhile.
    Edit {
        /// The file to edit, inside the workspace (it must exist; `put` makes new ones).
        path: String,
    },
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
    #[command(
        after_help = "Example: mrctl links create family work --level read --disclosure 'told in #general on 1 May'"
    )]
    Create {
        /// The space that gets the reach.
        holder: String,
        /// The space reached, or '*' for every space.
        target: String,
        /// read: look at the target; admin: also act there.
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
        /// The link's id (see `links list`).
        id: i64,
        /// The new level.
        #[arg(long, value_enum)]
        level: Option<LinkLevelArg>,
        /// How and when the target side was told.
        #[arg(long)]
        disclosure: Option<String>,
    },
    /// Revoke a link; global admins.
    Revoke {
        /// The link's id (see `links list`).
        id: i64,
    },
    /// Links touching this space, with its inbound and outbound reach.
    List {
        /// Every link of the instance (global admins).
        #[arg(long)]
        all: bool,
    },
    /// One link.
    Inspect {
        /// The link's id (see `links list`).
        id: i64,
    },
    /// The audit trail of links touching this space, newest first.
    Audit {
        /// At most this many rows (1-1000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// The audit trail of the whole instance (global admins).
        #[arg(long)]
        all: bool,
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
        /// A display name (default: the id).
        #[arg(long)]
        name: Option<String>,
        /// Comma-separated tags.
        #[arg(long, value_delimiter = ',')]
        tags: Vec<String>,
    },
    /// Show the space named by MERCURY_SPACE (or the run token).
    Current,
    /// Rename the current space.
    Rename {
        /// The new display name.
        name: String,
    },
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
        /// The conversation's id (see `conversations list`).
        id: String,
        /// The space that gets its messages.
        #[arg(value_name = "SPACE")]
        space_id: String,
    },
    /// Detach a conversation from its space.
    Unlink {
        /// The conversation's id (see `conversations list`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum MessagesCmd {
    /// One message by id (the N of a review report's `[msg N]`), with --context
    /// N messages of its conversation before and after it.
    #[command(after_help = "Example: MERCURY_SPACE=family mrctl messages show 1234 --context 3")]
    Show {
        /// The message's id (`[msg N]` in the output of recent, search and review reports).
        id: String,
        /// Also this many messages before and after it (0-50).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=50))]
        context: Option<u32>,
    },
    /// Full-text search, newest first.
    Search {
        /// Words to find (SQLite FTS syntax).
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
    /// Every preference of the space.
    List,
    /// One preference's value, bare (for `$(mrctl prefs get lang)`).
    Get {
        /// The preference's name.
        key: String,
    },
    /// Set a preference.
    Set {
        /// The preference's name.
        key: String,
        /// Its value.
        value: String,
    },
    /// Delete a preference.
    Delete {
        /// The preference's name.
        key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Show every key (with its description), or one key's value.
    Get {
        /// One key (e.g. trigger.match); none: every key.
        key: Option<String>,
    },
    /// Set a key of the space's settings.
    Set {
        /// The key (see `config get`).
        key: String,
        /// Its value.
        value: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TasksCmd {
    /// Every task of the space: its cron and the zone it is read in, its state (active, paused, done), its next run.
    List,
    /// Schedule a prompt: repeating (--cron) or once (--at).
    #[command(
        after_help = "Examples:\n  mrctl tasks create --cron '0 9 * * 1-5' --prompt 'summarise yesterday'\n  mrctl tasks create --at 2030-01-01T08:00:00Z --prompt 'happy new year' --silent"
    )]
    #[command(group(ArgGroup::new("when").required(true).args(["cron", "at"])))]
    Create {
        /// Five-field cron expression (minute hour day month weekday), read on
        /// the space's clock: its `timezone` (mrctl config set timezone
        /// Europe/Amsterdam), else the deployment's `timezone` (UTC by default).
        #[arg(long, value_name = "EXPR")]
        cron: Option<String>,
        /// RFC 3339 time in the future, with its offset (2030-01-01T08:00:00+01:00).
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        /// What the agent is asked when the task fires.
        #[arg(long, value_name = "TEXT")]
        prompt: String,
        /// Run without posting the reply to the conversation.
        #[arg(long)]
        silent: bool,
    },
    /// Stop a task from firing until it is resumed.
    Pause {
        /// The task's id (see `tasks list`).
        id: String,
    },
    /// Let a paused task fire again.
    Resume {
        /// The task's id (see `tasks list`).
        id: String,
    },
    /// Fire the task now.
    Run {
        /// The task's id (see `tasks list`).
        id: String,
    },
    /// Delete a task.
    Delete {
        /// The task's id (see `tasks list`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RolesCmd {
    /// Every granted role in the space.
    List,
    /// Grant a role to a caller in the space.
    Grant {
        /// The caller id (e.g. telegram:12345 or an operator's id).
        caller: String,
        /// Role to grant (server default: member).
        #[arg(long)]
        role: Option<String>,
    },
    /// Take a caller's granted role away.
    Revoke {
        /// The caller id.
        caller: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PermissionsCmd {
    /// Every role's permissions, or one role's.
    Show {
        /// Only this role.
        #[arg(long)]
        role: Option<String>,
    },
    /// Replace a role's permissions with a comma-separated list.
    Set {
        /// The role.
        role: String,
        /// Comma-separated permissions (e.g. chat,tasks.write).
        permissions: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum MutesCmd {
    /// Every muted caller of the space.
    List,
    /// Mute a caller (indefinitely unless --for or --until).
    Set {
        /// The caller id.
        caller: String,
        /// A duration such as 2h or 7d.
        #[arg(long = "for", value_name = "DURATION", conflicts_with = "until")]
        for_: Option<String>,
        /// An RFC 3339 time.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Why (shown in `mutes list`).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Unmute a caller.
    Delete {
        /// The caller id.
        caller: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ExtCmd {
    /// Every installed extension, and whether the space enabled it.
    List,
    /// Offer an installed extension's tools to the space's agent (ext.manage).
    Enable {
        /// The extension's name.
        name: String,
    },
    /// Stop offering them (ext.manage).
    Disable {
        /// The extension's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelCmd {
    /// The space's chain and where it comes from.
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
        /// Whose token it is (a caller id).
        caller: String,
        /// user: an operator's token; adapter: a platform bridge's.
        #[arg(long, value_enum, default_value_t = TokenKind::User)]
        kind: TokenKind,
        /// The one platform an adapter token may post and pull for (required with --kind adapter).
        #[arg(long)]
        platform: Option<String>,
        /// A note shown in `tokens list`.
        #[arg(long)]
        label: Option<String>,
        /// A duration such as 30d.
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
        /// Limit a user token to one scope: `review.read` (read review reports only).
        #[arg(long)]
        scope: Option<String>,
        /// Adapter tokens: the identity mappings (`identities link`) of the
        /// senders it posts hold. Only for a bridge that reads sender ids from
        /// the platform itself: it could otherwise post as any mapped sender.
        #[arg(long)]
        trusted_identities: bool,
    },
    /// Every token (never the secrets).
    List,
    /// Revoke a token.
    Revoke {
        /// The token's id (see `tokens list`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum IdentitiesCmd {
    /// Let a platform sender (telegram:123456) act with an operator's rights (owner).
    Link {
        /// The platform sender, e.g. telegram:123456.
        platform_id: String,
        /// The operator it acts as.
        caller: String,
    },
    /// Remove a mapping.
    Unlink {
        /// The platform sender, e.g. telegram:123456.
        platform_id: String,
    },
    /// Every mapping.
    List,
    /// The audit trail of mappings, newest first.
    Audit {
        /// At most this many rows (1-1000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PairingCmd {
    /// Pending requests: code, platform, sender, name, created, expires.
    List,
    /// Allow the request's sender; it is told to write again.
    Approve {
        /// The 8-character code the stranger was sent.
        code: String,
    },
    /// Deny the request's sender: nothing from it is answered from now on.
    Deny {
        /// The 8-character code the stranger was sent.
        code: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum SendersCmd {
    /// Allow a sender's DMs (telegram:42), or a group with --conversation.
    Allow {
        /// The platform sender, e.g. telegram:42.
        #[arg(
            required_unless_present = "conversation",
            conflicts_with = "conversation"
        )]
        sender: Option<String>,
        /// A group as a whole, <platform>:<conversation id> (see `conversations list`).
        #[arg(long, value_name = "PLATFORM:ID")]
        conversation: Option<String>,
    },
    /// Deny a sender (nothing from it is answered), or a group with --conversation.
    Deny {
        /// The platform sender, e.g. telegram:42.
        #[arg(
            required_unless_present = "conversation",
            conflicts_with = "conversation"
        )]
        sender: Option<String>,
        /// A group as a whole, <platform>:<conversation id>.
        #[arg(long, value_name = "PLATFORM:ID")]
        conversation: Option<String>,
    },
    /// Every allow and deny decision.
    List,
    /// Delete one person's messages, memberships and pairing rows everywhere
    ///
    /// A deletion request: their messages and direct conversations,
    /// memberships, roles, mutes, runs, what their messages carried (with
    /// the files kept in inbox/) and pairing rows, in every space. A deny
    /// decision about them stays. Names the review reports that cite
    /// what was deleted.
    Forget {
        /// The platform sender, e.g. telegram:42.
        sender: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReviewCmd {
    /// Scan the review window now and wait for the report (set MERCURY_TIMEOUT_SECS for long scans).
    RunNow,
    /// The review reports on the host, daily and weekly, oldest first.
    Reports,
    /// One report, rendered (its JSON with --json): DATE is YYYY-MM-DD (the daily) or YYYY-MM-DD-weekly.
    Report {
        /// YYYY-MM-DD for a daily report, YYYY-MM-DD-weekly for a weekly one.
        date: String,
    },
    /// The intake ledger: every triaged row and its decisions.
    Ledger,
    /// Run the weekly synthesis now and wait for its report.
    WeeklyNow,
    /// The last digest the owner was sent (or would have been: it is kept
    /// when no DM could take it), and where it went.
    Digest,
}

#[derive(Debug, Subcommand)]
pub enum BudgetCmd {
    /// The caps in force and what each used this period (the space's too, with MERCURY_SPACE).
    Show,
    /// Set the space's own caps (the space in MERCURY_SPACE); 0 is no cap, `default` the config's.
    #[command(
        after_help = "Example: MERCURY_SPACE=family mrctl budget set --daily 2.00 --monthly 20"
    )]
    Set {
        /// Amount per day in the deployment's currency (0: no cap; `default`: budgets.space).
        #[arg(long, value_name = "AMOUNT")]
        daily: Option<String>,
        /// Amount per calendar month (0: no cap; `default`: budgets.space).
        #[arg(long, value_name = "AMOUNT")]
        monthly: Option<String>,
        /// The space's own time zone for its periods (`default`: the deployment's).
        #[arg(long, value_name = "ZONE")]
        timezone: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CostBy {
    Space,
    Day,
    Purpose,
    Model,
}

#[derive(Debug, Subcommand)]
pub enum RunsCmd {
    /// Recent runs of the space, newest first.
    List {
        /// At most this many.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
    /// One run and its trace: each model call, and each tool call with its arguments and exit code.
    Show {
        /// The run's id (from `runs list`, or a turn's answer).
        id: String,
    },
}
