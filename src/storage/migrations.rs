//! Numbered schema migrations. Each entry runs once, in order, inside one
//! transaction with the `user_version` bump, so a failed migration leaves the
//! schema as it was. Never edit a released entry: add a new one.

use super::{params, Conn, Dialect, Query};

use super::StoreResult;

const MIGRATIONS: &[&str] = &[
    // 1: core host tables.
    r#"
CREATE TABLE spaces (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  tags TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE TABLE conversations (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  platform TEXT NOT NULL,
  external_id TEXT NOT NULL,
  space_id TEXT REFERENCES spaces(id) ON DELETE SET NULL,
  kind TEXT NOT NULL CHECK (kind IN ('dm','group')),
  title TEXT,
  first_seen_at INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  UNIQUE (platform, external_id)
);
CREATE TABLE members (
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  caller_id TEXT NOT NULL,
  display_name TEXT,
  first_seen_at INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, caller_id)
);
CREATE TABLE space_roles (
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  caller_id TEXT NOT NULL,
  role TEXT NOT NULL,
  granted_by TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, caller_id)
);
CREATE TABLE messages (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  conversation_id INTEGER REFERENCES conversations(id) ON DELETE SET NULL,
  sender_id TEXT,
  sender_name TEXT,
  role TEXT NOT NULL CHECK (role IN ('user','assistant','ambient','system')),
  text TEXT NOT NULL,
  platform_message_id TEXT,
  created_at INTEGER NOT NULL,
  run_id TEXT,
  -- user rows: pending until a turn answers them (durable queue), then done/failed/skipped
  status TEXT,
  reply_to INTEGER,
  -- set when a scheduled task fired this message
  task_run_id INTEGER
);
CREATE UNIQUE INDEX messages_platform_id ON messages (conversation_id, platform_message_id)
  WHERE platform_message_id IS NOT NULL;
CREATE INDEX messages_space_created ON messages (space_id, created_at, id);
CREATE INDEX messages_pending ON messages (space_id, id) WHERE status = 'pending';
CREATE TABLE space_config (
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  updated_by TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, key)
);
CREATE TABLE space_preferences (
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  updated_by TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, key)
);
CREATE TABLE tasks (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  cron TEXT,
  at INTEGER,
  prompt TEXT NOT NULL,
  silent INTEGER NOT NULL DEFAULT 0,
  active INTEGER NOT NULL DEFAULT 1,
  next_run_at INTEGER,
  created_by TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  CHECK ((cron IS NULL) <> (at IS NULL))
);
CREATE INDEX tasks_due ON tasks (active, next_run_at);
CREATE TABLE task_runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  task_id INTEGER NOT NULL,
  space_id TEXT NOT NULL,
  run_id TEXT,
  status TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  error TEXT
);
CREATE TABLE mutes (
  space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
  caller_id TEXT NOT NULL,
  until INTEGER,
  reason TEXT,
  updated_by TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, caller_id)
);
CREATE TABLE runs (
  id TEXT PRIMARY KEY,
  space_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  status TEXT NOT NULL,
  caller_id TEXT,
  trigger_message_id INTEGER,
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  container_id TEXT,
  sandbox_proof TEXT,
  error TEXT
);
CREATE INDEX runs_space ON runs (space_id, started_at);
CREATE TABLE token_usage (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT,
  space_id TEXT NOT NULL,
  model TEXT NOT NULL,
  kind TEXT NOT NULL,
  tokens_in INTEGER NOT NULL,
  tokens_out INTEGER NOT NULL,
  cost REAL NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE api_tokens (
  id TEXT PRIMARY KEY,
  token_hash TEXT NOT NULL UNIQUE,
  caller_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('user','run','adapter')),
  space_id TEXT,
  run_id TEXT,
  label TEXT,
  created_by TEXT,
  created_at INTEGER NOT NULL,
  expires_at INTEGER,
  revoked_at INTEGER
);
CREATE TABLE session_state (
  space_id TEXT PRIMARY KEY REFERENCES spaces(id) ON DELETE CASCADE,
  boundary_message_id INTEGER NOT NULL DEFAULT 0,
  summary TEXT,
  updated_at INTEGER NOT NULL
);
CREATE TABLE outbox (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  space_id TEXT NOT NULL,
  conversation_id INTEGER,
  platform TEXT NOT NULL,
  external_id TEXT NOT NULL,
  message_id INTEGER,
  text TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  delivered_at INTEGER,
  attempts INTEGER NOT NULL DEFAULT 0,
  last_error TEXT
);
"#,
    // 2: space links (directed edges between spaces) and their audit trail.
    // No foreign keys to `spaces`: audit rows and link history outlive a
    // deleted space, and a level outside read/admin must be storable (it denies).
    r#"
CREATE TABLE space_links (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  holder_space_id TEXT NOT NULL,
  target_space_id TEXT NOT NULL,
  level TEXT NOT NULL,
  target_conversation_id INTEGER,
  disclosure TEXT,
  created_by TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  updated_by TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  revoked_by TEXT,
  revoked_at INTEGER
);
CREATE INDEX space_links_holder ON space_links (holder_space_id, target_space_id) WHERE revoked_at IS NULL;
CREATE TABLE space_link_audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  caller_id TEXT NOT NULL,
  action TEXT NOT NULL,
  holder_space_id TEXT,
  target_space_id TEXT,
  link_id INTEGER,
  level TEXT,
  method TEXT,
  route TEXT,
  body_summary TEXT,
  status INTEGER,
  detail TEXT
);
CREATE INDEX space_link_audit_spaces ON space_link_audit (holder_space_id, target_space_id, id);
"#,
    // 3: run tokens of `ask` turns carry a fixed role and refuse every write.
    r#"
ALTER TABLE api_tokens ADD COLUMN role TEXT;
ALTER TABLE api_tokens ADD COLUMN read_only INTEGER NOT NULL DEFAULT 0;
"#,
    // 4: indexes the hot paths were missing. Without them the prompt's
    // history sorted every message of the space on every turn, the console's
    // reply lookup, a turn's run-token revocation and the webhook's poll
    // scanned whole tables, so each got slower as the database grew.
    r#"
CREATE INDEX messages_space_id ON messages (space_id, id);
CREATE INDEX messages_reply_to ON messages (reply_to) WHERE reply_to IS NOT NULL;
CREATE INDEX api_tokens_run ON api_tokens (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX outbox_undelivered ON outbox (id) WHERE delivered_at IS NULL;
"#,
    // 5: identities and link bookkeeping (issue 11). Adapter tokens are bound
    // to one platform; a platform sender gains an operator's rights only
    // through an `identities` row a global admin wrote (audited); a role
    // granted through a link remembers the link, so revoking it removes the
    // role; act-as audit rows carry the concrete path, the run and the
    // before/after of an update.
    r#"
ALTER TABLE api_tokens ADD COLUMN platform TEXT;
CREATE TABLE identities (
  platform_id TEXT PRIMARY KEY,
  caller_id TEXT NOT NULL,
  created_by TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE identity_audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  by_caller TEXT NOT NULL,
  action TEXT NOT NULL,
  platform_id TEXT NOT NULL,
  caller_id TEXT
);
ALTER TABLE space_roles ADD COLUMN link_id INTEGER;
CREATE INDEX space_roles_link ON space_roles (link_id) WHERE link_id IS NOT NULL;
ALTER TABLE space_link_audit ADD COLUMN path TEXT;
ALTER TABLE space_link_audit ADD COLUMN run_id TEXT;
ALTER TABLE space_link_audit ADD COLUMN before_value TEXT;
ALTER TABLE space_link_audit ADD COLUMN after_value TEXT;
"#,
    // issue 18: run traces (one row per model call and tool call of a run).
    r#"
CREATE TABLE run_steps (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('model','tool')),
  name TEXT NOT NULL,
  arguments TEXT,
  exit_code INTEGER,
  tokens_in INTEGER NOT NULL DEFAULT 0,
  tokens_out INTEGER NOT NULL DEFAULT 0,
  duration_ms INTEGER NOT NULL DEFAULT 0,
  output_bytes INTEGER,
  output TEXT,
  error TEXT,
  started_at INTEGER NOT NULL,
  UNIQUE (run_id, seq)
);
CREATE INDEX run_steps_started ON run_steps (started_at);
"#,
    // 7: token scopes (issue 15). A scoped token may call only the routes
    // of its scope (`review.read`: reading review reports), whatever its
    // caller could otherwise do.
    r#"
ALTER TABLE api_tokens ADD COLUMN scope TEXT;
"#,
    // 8: chat adapters (issue 16): each in-process adapter's durable position
    // (Telegram's getUpdates offset, Discord's gateway session), written in
    // the same transaction as the message row it follows; and a per-platform
    // index of undelivered replies (each adapter reads only its own).
    r#"
CREATE TABLE adapter_positions (
  adapter TEXT PRIMARY KEY,
  position TEXT NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX outbox_undelivered_platform ON outbox (platform, id) WHERE delivered_at IS NULL;
"#,
    // 9: a message's turn attempts (issue 22): every turn reads the runs a
    // crash cut short for its message before it runs.
    r#"
CREATE INDEX runs_trigger_message ON runs (trigger_message_id, started_at);
"#,
    // 10: the sender policy (issue 23). `pairings`: strangers' pending
    // requests (capped and expiring, so never a flood); `allowed_senders`:
    // the operator's allow and deny decisions, per platform sender or per
    // conversation. Upgrade rule: every platform sender already a member of
    // a space is seeded as allowed, so an existing bot keeps answering the
    // people it answered (linked conversations stay answered by reading
    // `conversations.space_id`). A message remembers whether its origin may
    // carry identity mappings (the in-process adapter, or an adapter token
    // minted with `--trusted-identities`); rows from before this are not.
    r#"
CREATE TABLE pairings (
  code TEXT PRIMARY KEY,
  platform TEXT NOT NULL,
  sender TEXT NOT NULL,
  name TEXT,
  conversation TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  UNIQUE (platform, sender)
);
CREATE INDEX pairings_expires ON pairings (expires_at);
CREATE TABLE allowed_senders (
  kind TEXT NOT NULL CHECK (kind IN ('sender','conversation')),
  platform TEXT NOT NULL,
  -- a sender: its caller id (`telegram:42`); a conversation: the platform's id of it
  subject TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('allowed','denied')),
  decided_by TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (kind, platform, subject)
);
INSERT OR IGNORE INTO allowed_senders (kind, platform, subject, status, decided_by, created_at)
  SELECT DISTINCT 'sender', substr(caller_id, 1, instr(caller_id, ':') - 1), caller_id,
    'allowed', 'upgrade', CAST(strftime('%s','now') AS INTEGER) * 1000
  FROM members
  WHERE instr(caller_id, ':') > 1 AND length(caller_id) > instr(caller_id, ':')
    AND substr(caller_id, 1, instr(caller_id, ':') - 1) NOT IN ('console', 'api')
    AND caller_id NOT IN ('telegram:1087968824', 'telegram:136817688', 'telegram:777000');
ALTER TABLE messages ADD COLUMN trusted_identity INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_tokens ADD COLUMN trusted_identities INTEGER NOT NULL DEFAULT 0;
"#,
    // 11: what a space link changed, and where a run step's data came from
    // (issue 23). Every change made through a link (a config key, a
    // preference, a role's permission set, a caller's role) is one row with
    // the value it replaced, so revoking or downgrading the link restores it
    // unless a direct write changed it since (`superseded`). A run step that
    // read another space across a link names that space, so a trace read
    // through a link can withhold what the reader has no link to.
    r#"
CREATE TABLE link_changes (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  link_id INTEGER NOT NULL,
  space_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('config','preference','permissions','role')),
  key TEXT NOT NULL,
  before_value TEXT,
  before_by TEXT,
  before_link_id INTEGER,
  after_value TEXT,
  at INTEGER NOT NULL,
  superseded INTEGER NOT NULL DEFAULT 0,
  settled_at INTEGER,
  outcome TEXT
);
CREATE INDEX link_changes_open ON link_changes (link_id, id) WHERE settled_at IS NULL;
CREATE INDEX link_changes_key ON link_changes (space_id, kind, key) WHERE settled_at IS NULL;
ALTER TABLE run_steps ADD COLUMN source_spaces TEXT;
"#,
    // 12: spend (issue 26). One ledger row per model call: a reservation of
    // the call's worst case before it (state 0), settled to its cost after
    // (1) or released (2). Amounts are billionths of the deployment's
    // currency. `shadow` keeps a shadow's calls off the live budget;
    // `instance` lets a host release only the reservations it left behind.
    // A space's own caps; one row per notice sent (a cap's owner notice, a
    // conversation's capped answer) and the period it was sent for.
    r#"
CREATE TABLE spend_ledger (
  id INTEGER PRIMARY KEY,
  at INTEGER NOT NULL,
  instance TEXT NOT NULL,
  shadow INTEGER NOT NULL,
  space_id TEXT,
  purpose TEXT NOT NULL,
  model TEXT NOT NULL,
  state INTEGER NOT NULL,
  amount INTEGER NOT NULL,
  tokens_in INTEGER NOT NULL,
  tokens_out INTEGER NOT NULL
);
CREATE INDEX spend_ledger_at ON spend_ledger (shadow, at);
CREATE INDEX spend_ledger_space ON spend_ledger (space_id, at);
CREATE INDEX spend_ledger_open ON spend_ledger (instance) WHERE state = 0;
CREATE TABLE space_budgets (
  space_id TEXT PRIMARY KEY,
  daily REAL,
  monthly REAL,
  timezone TEXT,
  updated_at INTEGER NOT NULL
);
CREATE TABLE spend_notices (
  key TEXT NOT NULL,
  period_start INTEGER NOT NULL,
  at INTEGER NOT NULL,
  PRIMARY KEY (key, period_start)
);
"#,
    // 13: chat platforms II (issue 30). When each platform conversation's
    // person last wrote (WhatsApp answers freely only within 24 hours of
    // it), written with the message row that moves it.
    r#"
CREATE TABLE chat_windows (
  platform TEXT NOT NULL,
  conversation TEXT NOT NULL,
  last_inbound_at INTEGER NOT NULL,
  PRIMARY KEY (platform, conversation)
);
"#,
    // 14: the dashboard's sign-ins (issue 27). A sign-in is a cookie's
    // hash, the user token it was made from (revoking the token ends it),
    // its CSRF secret and its expiry; a one-time link (`mrctl ui login`) is
    // a hash that one sign-in consumes, within minutes of its making.
    r#"
CREATE TABLE ui_signins (
  id TEXT PRIMARY KEY,
  secret_hash TEXT NOT NULL UNIQUE,
  caller_id TEXT NOT NULL,
  token_id TEXT NOT NULL,
  csrf TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  revoked_at INTEGER,
  agent TEXT NOT NULL
);
CREATE INDEX ui_signins_caller ON ui_signins (caller_id, created_at);
CREATE TABLE ui_login_links (
  secret_hash TEXT PRIMARY KEY,
  caller_id TEXT NOT NULL,
  token_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  used_at INTEGER
);
"#,
    // 15: extensions (issue 29). What the operator installed (the manifest's
    // text as `mercury ext add` checked it, and the tool catalog its servers
    // answered, cached until the next install), which spaces enabled which
    // extension, and each extension's key/value store per space.
    r#"
CREATE TABLE extensions (
  name TEXT PRIMARY KEY,
  manifest TEXT NOT NULL,
  installed_at INTEGER NOT NULL,
  catalog TEXT
);
CREATE TABLE space_extensions (
  space_id TEXT NOT NULL,
  name TEXT NOT NULL,
  enabled_by TEXT NOT NULL,
  enabled_at INTEGER NOT NULL,
  PRIMARY KEY (space_id, name)
);
CREATE TABLE extension_state (
  extension TEXT NOT NULL,
  space_id TEXT NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (extension, space_id, key)
);
"#,
    // 16: the owner's spend notices outlive the host (issue 26). A notice
    // row carries its text and the instance that owes it; it is handled
    // once the digest's channel took it, so a host stopped in between
    // sends it at its next start instead of losing it.
    r#"
ALTER TABLE spend_notices ADD COLUMN text TEXT;
ALTER TABLE spend_notices ADD COLUMN instance TEXT;
ALTER TABLE spend_notices ADD COLUMN handled_at INTEGER;
CREATE INDEX spend_notices_pending ON spend_notices (instance, handled_at);
"#,
    // 17: many hosts on one database (issue 28). A host's row and heartbeat,
    // the lease that makes one host a space's only runner (its epoch fences
    // a host that lost it), the deployment's named leases (the review scan,
    // the adapters with one upstream connection), and the host a run ran on.
    r#"
CREATE TABLE cluster_hosts (
  host_id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  api_url TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  heartbeat_at INTEGER NOT NULL,
  stopped_at INTEGER
);
CREATE TABLE space_leases (
  space_id TEXT PRIMARY KEY,
  host_id TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX space_leases_host ON space_leases (host_id);
CREATE TABLE deployment_leases (
  name TEXT PRIMARY KEY,
  host_id TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
);
ALTER TABLE runs ADD COLUMN host_id TEXT;
"#,
    // 18: streamed replies (issue 30). The platform message that shows a
    // reply while its turn runs, by the message it answers: written as soon
    // as the platform gave its id, so the final reply (after a restart too)
    // edits that message instead of sending a second one.
    r#"
CREATE TABLE reply_previews (
  message_id INTEGER NOT NULL PRIMARY KEY,
  platform TEXT NOT NULL,
  external_id TEXT NOT NULL,
  platform_message_id TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX reply_previews_created ON reply_previews (created_at);
"#,
    // 19: attachments (issue 30). A picture, voice note or file that came
    // with a message, stored as the platform's reference in the message's
    // own transaction; the space's actor fetches it at turn time into the
    // workspace's inbox/ (`path`) or refuses it with a sentence (`error`);
    // a voice note's text, once transcribed, is kept (`transcript`). The
    // files a turn wrote under outbox/ are sent with its reply (`outbox_files`,
    // workspace paths, deleted with their outbox item).
    r#"
CREATE TABLE attachments (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  message_id INTEGER NOT NULL,
  kind TEXT NOT NULL,
  reference TEXT NOT NULL,
  name TEXT,
  mime TEXT,
  size INTEGER,
  status TEXT NOT NULL DEFAULT 'pending',
  path TEXT,
  error TEXT,
  transcript TEXT,
  created_at INTEGER NOT NULL
);
CREATE INDEX attachments_message ON attachments (message_id);
CREATE TABLE outbox_files (
  outbox_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  path TEXT NOT NULL,
  PRIMARY KEY (outbox_id, seq)
);
"#,
    // 20: per-caller turn limits shared by the hosts of a deployment
    // (issue 28): a fixed one-minute window per space and caller, counted
    // in the message row's transaction.
    r#"
CREATE TABLE caller_windows (
  space_id TEXT NOT NULL,
  caller_id TEXT NOT NULL,
  window_start INTEGER NOT NULL,
  used INTEGER NOT NULL,
  PRIMARY KEY (space_id, caller_id)
);
"#,
    // 21: the label a host's sandboxes carry (issue 28), so a surviving
    // host can remove a dead one's containers from an engine they share.
    r#"
ALTER TABLE cluster_hosts ADD COLUMN instance_id TEXT;
"#,
    // 22: a direct write supersedes only the open link changes on its key
    // not superseded yet; this index finds just those, so the write does
    // not read every change a link ever made on the key.
    r#"
CREATE INDEX link_changes_key_live ON link_changes (space_id, kind, key)
  WHERE settled_at IS NULL AND superseded = 0;
"#,
];

/// PostgreSQL's text of migrations whose SQLite text uses functions it does
/// not have (by position in [`MIGRATIONS`]); the rest are translated by
/// [`postgres_ddl`].
fn postgres_override(index: usize) -> Option<&'static str> {
    match index {
        // 10: the same tables; the upgrade seed reads `members` with
        // PostgreSQL's string functions (a new PostgreSQL database has no
        // members yet, and `mercury storage copy` brings the seeded rows).
        9 => Some(
            r#"
CREATE TABLE pairings (
  code TEXT PRIMARY KEY,
  platform TEXT NOT NULL,
  sender TEXT NOT NULL,
  name TEXT,
  conversation TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  UNIQUE (platform, sender)
);
CREATE INDEX pairings_expires ON pairings (expires_at);
CREATE TABLE allowed_senders (
  kind TEXT NOT NULL CHECK (kind IN ('sender','conversation')),
  platform TEXT NOT NULL,
  subject TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('allowed','denied')),
  decided_by TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (kind, platform, subject)
);
INSERT INTO allowed_senders (kind, platform, subject, status, decided_by, created_at)
  SELECT DISTINCT 'sender', split_part(caller_id, ':', 1), caller_id,
    'allowed', 'upgrade', CAST(EXTRACT(EPOCH FROM now()) AS BIGINT) * 1000
  FROM members
  WHERE strpos(caller_id, ':') > 1 AND length(caller_id) > strpos(caller_id, ':')
    AND split_part(caller_id, ':', 1) NOT IN ('console', 'api')
    AND caller_id NOT IN ('telegram:1087968824', 'telegram:136817688', 'telegram:777000')
ON CONFLICT DO NOTHING;
ALTER TABLE messages ADD COLUMN trusted_identity BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_tokens ADD COLUMN trusted_identities BIGINT NOT NULL DEFAULT 0;
"#,
        ),
        _ => None,
    }
}

/// SQLite's DDL in PostgreSQL's types: 64-bit integers everywhere (SQLite's
/// INTEGER is 64-bit), identity columns for AUTOINCREMENT keys, doubles for
/// REAL, BYTEA for BLOB.
pub(super) fn postgres_ddl(sql: &str) -> String {
    // SQLite's `INTEGER PRIMARY KEY` is the rowid, numbered by the database
    // with or without AUTOINCREMENT: an identity column either way.
    let sql = sql
        .replace(
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        )
        .replace(
            "INTEGER PRIMARY KEY",
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        );
    let mut out = String::with_capacity(sql.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(match word.as_str() {
            "INTEGER" => "BIGINT",
            "REAL" => "DOUBLE PRECISION",
            "BLOB" => "BYTEA",
            w => w,
        });
        word.clear();
    };
    for c in sql.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// The migration text `index` as the connection's backend runs it.
fn migration_sql(dialect: Dialect, index: usize) -> String {
    let sql = MIGRATIONS[index];
    match dialect {
        Dialect::Sqlite => sql.to_owned(),
        Dialect::Postgres => match postgres_override(index) {
            Some(pg) => pg.to_owned(),
            None => postgres_ddl(sql),
        },
    }
}

/// How many migrations the database has had.
pub(super) fn version(conn: &Conn) -> StoreResult<i64> {
    match conn.dialect() {
        Dialect::Sqlite => conn.query_row("PRAGMA user_version", params![], |r| r.get(0)),
        Dialect::Postgres => {
            let exists: bool = conn.query_row(
                "SELECT to_regclass('mercury_schema') IS NOT NULL",
                params![],
                |r| r.get(0),
            )?;
            if !exists {
                return Ok(0);
            }
            Ok(conn
                .query_opt("SELECT MAX(version) FROM mercury_schema", params![], |r| {
                    r.get::<usize, Option<i64>>(0)
                })?
                .flatten()
                .unwrap_or(0))
        }
    }
}

/// How many migrations today's release has.
pub(super) fn latest() -> i64 {
    MIGRATIONS.len() as i64
}

pub(super) fn apply(conn: &Conn) -> StoreResult<()> {
    apply_up_to(conn, MIGRATIONS.len())
}

/// The schema as release `version` left it (the first `version` entries):
/// the upgrade tests write a data dir as an earlier host did. Each entry runs
/// in one transaction with its version bump; on PostgreSQL an advisory lock
/// makes hosts starting together apply each one once.
pub(super) fn apply_up_to(conn: &Conn, version: usize) -> StoreResult<()> {
    let dialect = conn.dialect();
    if dialect == Dialect::Postgres {
        conn.execute_batch("CREATE TABLE IF NOT EXISTS mercury_schema (version BIGINT NOT NULL)")?;
    }
    for index in 0..version.min(MIGRATIONS.len()) {
        let number = index as i64 + 1;
        match dialect {
            Dialect::Sqlite => {
                if number <= self::version(conn)? {
                    continue;
                }
                conn.execute_batch("BEGIN")?;
                let done = conn
                    .execute_batch(&migration_sql(dialect, index))
                    .and_then(|()| conn.execute_batch(&format!("PRAGMA user_version = {number}")))
                    .and_then(|()| conn.execute_batch("COMMIT"));
                if let Err(e) = done {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(e);
                }
            }
            Dialect::Postgres => {
                conn.execute_batch("BEGIN")?;
                let done = (|| {
                    conn.execute_batch("SELECT pg_advisory_xact_lock(7304001)")?;
                    if number > self::version(conn)? {
                        conn.execute_batch(&migration_sql(dialect, index))?;
                        conn.execute(
                            "INSERT INTO mercury_schema (version) VALUES (?1)",
                            params![number],
                        )?;
                    }
                    conn.execute_batch("COMMIT")
                })();
                if let Err(e) = done {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn migrations_apply_once_and_are_idempotent() {
        let conn = crate::storage::test_conn();
        super::apply(&conn).unwrap();
        assert_eq!(
            super::version(&conn).unwrap(),
            super::MIGRATIONS.len() as i64
        );
    }

    #[test]
    fn postgres_ddl_widens_integers_and_keeps_names() {
        let ddl = super::postgres_ddl(
            "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER, integer_like TEXT, r REAL, b BLOB); CREATE TABLE u (id INTEGER PRIMARY KEY)",
        );
        assert_eq!(
            ddl,
            "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, n BIGINT, integer_like TEXT, r DOUBLE PRECISION, b BYTEA); CREATE TABLE u (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY)"
        );
    }

    /// The queries run for every message or turn must search an index: a
    /// scan or a sort of the whole table makes every turn slower than the
    /// last as the database grows.
    #[test]
    fn hot_queries_search_an_index() {
        use crate::storage::{messages, outbox, tokens};
        let conn = crate::storage::test_conn();
        let conn = conn.as_sqlite().unwrap();
        let queries = [
            format!("SELECT * {}", messages::HISTORY_TAIL),
            format!("SELECT * {}", messages::PENDING_TAIL),
            format!("SELECT * {}", messages::REPLY_FOR_TAIL),
            format!("SELECT * {}", outbox::UNDELIVERED_TAIL),
            tokens::REVOKE_RUN_SQL.to_string(),
            crate::storage::runs::CRASHED_ATTEMPTS_SQL.to_string(),
            crate::storage::links::SUPERSEDE_SQL.to_string(),
        ];
        for sql in queries {
            let n = sql.matches('?').count();
            let params: Vec<i64> = vec![1; n];
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params), |r| r.get(3))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let text = plan.join("; ");
            assert!(
                text.contains("USING") && text.contains("INDEX"),
                "{sql}: {text}"
            );
            assert!(!text.contains("TEMP B-TREE"), "{sql} sorts: {text}");
            let scan_without_index = plan
                .iter()
                .any(|p| p.starts_with("SCAN") && !p.contains("INDEX"));
            assert!(!scan_without_index, "{sql} scans: {text}");
        }
    }
}
