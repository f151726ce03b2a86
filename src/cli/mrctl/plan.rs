//! Arguments to a request, as a pure function ([`plan`]), with the local
//! checks that catch malformed input before anything is sent.

use hyper::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Map, Value};

use super::*;
use crate::clock;

/// Input the server would refuse anyway, caught before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(super) struct UsageError(pub String);

/// What to do with the answer beyond showing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Then {
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
pub(super) struct RequestPlan {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: Vec<(&'static str, String)>,
    pub(super) body: Option<Value>,
    pub(super) then: Then,
    /// Extra request headers (`If-Match`).
    pub(super) headers: Vec<(&'static str, String)>,
}

impl RequestPlan {
    pub(super) fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            then: Then::Show,
            headers: Vec::new(),
        }
    }
    /// `If-Match: HASH` (a file hash as the files API gives it: hex).
    pub(super) fn if_match(mut self, hash: Option<&str>) -> Result<Self, UsageError> {
        if let Some(h) = hash {
            let h = h.trim().trim_matches('"');
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(UsageError(format!(
                    "--if-match {h:?} is not a file hash (hex, as `files ls` shows it)"
                )));
            }
            self.headers.push(("if-match", h.to_owned()));
        }
        Ok(self)
    }
    pub(super) fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }
    pub(super) fn post(path: impl Into<String>) -> Self {
        Self::new(Method::POST, path)
    }
    pub(super) fn put(path: impl Into<String>) -> Self {
        Self::new(Method::PUT, path)
    }
    pub(super) fn delete(path: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path)
    }
    pub(super) fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }
    pub(super) fn query(mut self, key: &'static str, value: Option<String>) -> Self {
        if let Some(v) = value {
            self.query.push((key, v));
        }
        self
    }
    pub(super) fn then(mut self, then: Then) -> Self {
        self.then = then;
        self
    }
    pub(super) fn set_query(&mut self, key: &'static str, value: String) {
        self.query.retain(|(k, _)| *k != key);
        self.query.push((key, value));
    }

    /// Path and query string as sent on the request line.
    pub(super) fn target(&self) -> String {
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
pub(super) fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
    let mut map = Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            map.insert(k.to_owned(), v);
        }
    }
    Value::Object(map)
}

pub(super) fn plan(cli: &Cli) -> Result<RequestPlan, UsageError> {
    if let Some(space) = &cli.space {
        check_space_id("--space", space)?;
    }
    if let Some(space) = &cli.in_space {
        check_space_id("--in", space)?;
    }
    let p = match &cli.command {
        Command::Whoami => RequestPlan::get("/api/whoami"),
        Command::Ui(UiCmd::Login) => RequestPlan::post("/ui/login-links"),
        Command::Completions { .. } | Command::Man { .. } | Command::Bridge { .. } => {
            return Err(UsageError("this command makes no request".into()))
        }
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
            MessagesCmd::Show { id, context } => {
                let id = number_id("message", id)?;
                RequestPlan::get(format!("/api/messages/{id}"))
                    .query("context", context.map(|c| c.to_string()))
            }
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
                RequestPlan::delete(format!("/api/tasks/{}", number_id("task", id)?))
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
        Command::Ext(cmd) => match cmd {
            ExtCmd::List => RequestPlan::get("/api/extensions"),
            ExtCmd::Enable { name } => {
                non_empty("the extension's name", name)?;
                RequestPlan::post(format!("/api/extensions/{}/enable", encode(name)))
            }
            ExtCmd::Disable { name } => {
                non_empty("the extension's name", name)?;
                RequestPlan::post(format!("/api/extensions/{}/disable", encode(name)))
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
                scope,
                trusted_identities,
            } => {
                non_empty("the caller id", caller)?;
                if *trusted_identities && *kind != TokenKind::Adapter {
                    return Err(UsageError(
                        "--trusted-identities applies to --kind adapter only".into(),
                    ));
                }
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
                    ("scope", scope.as_ref().map(|s| json!(s.trim()))),
                    (
                        "trusted_identities",
                        trusted_identities.then_some(json!(true)),
                    ),
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
        Command::Pairing(cmd) => match cmd {
            PairingCmd::List => RequestPlan::get("/api/pairings"),
            PairingCmd::Approve { code } => {
                non_empty("the pairing code", code)?;
                RequestPlan::post(format!("/api/pairings/{}/approve", encode(code.trim())))
            }
            PairingCmd::Deny { code } => {
                non_empty("the pairing code", code)?;
                RequestPlan::post(format!("/api/pairings/{}/deny", encode(code.trim())))
            }
        },
        Command::Senders(cmd) => match cmd {
            SendersCmd::List => RequestPlan::get("/api/senders"),
            SendersCmd::Forget { sender } => {
                non_empty("the sender", sender)?;
                RequestPlan::post("/api/senders/forget").body(json!({ "sender": sender.trim() }))
            }
            SendersCmd::Allow {
                sender,
                conversation,
            }
            | SendersCmd::Deny {
                sender,
                conversation,
            } => {
                let path = match cmd {
                    SendersCmd::Allow { .. } => "/api/senders/allow",
                    _ => "/api/senders/deny",
                };
                let body =
                    match (sender, conversation) {
                        (Some(s), None) => {
                            non_empty("the sender", s)?;
                            json!({ "sender": s.trim() })
                        }
                        (None, Some(c)) => {
                            non_empty("the conversation", c)?;
                            json!({ "conversation": c.trim() })
                        }
                        _ => return Err(UsageError(
                            "name a sender (telegram:42) or --conversation PLATFORM:ID, not both"
                                .into(),
                        )),
                    };
                RequestPlan::post(path).body(body)
            }
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
        Command::Runs(RunsCmd::Show { id }) => {
            non_empty("the run id", id)?;
            RequestPlan::get(format!("/api/runs/{}", encode(id)))
        }
        Command::Files(cmd) => match cmd {
            FilesCmd::Ls { path } => RequestPlan::get("/api/files").query("path", path.clone()),
            FilesCmd::Cat { path } | FilesCmd::Edit { path } => RequestPlan::get(file_route(path)?),
            FilesCmd::Put {
                path,
                if_match,
                content,
                ..
            } => {
                let content = content.as_ref().ok_or_else(|| {
                    UsageError("the content to write was not read (give --from FILE or -)".into())
                })?;
                RequestPlan::put(file_route(path)?)
                    .body(json!({ "content": content }))
                    .if_match(if_match.as_deref())?
            }
            FilesCmd::Rm { path, if_match } => {
                RequestPlan::delete(file_route(path)?).if_match(if_match.as_deref())?
            }
        },
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
            LinksCmd::List { all } => {
                RequestPlan::get("/api/links").query("all", all.then(|| "true".to_owned()))
            }
            LinksCmd::Inspect { id } => RequestPlan::get(format!("/api/links/{id}")),
            LinksCmd::Audit { limit, all } => RequestPlan::get("/api/links/audit")
                .query("limit", limit.map(|l| l.to_string()))
                .query("all", all.then(|| "true".to_owned())),
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
        Command::Review(ReviewCmd::Reports) => RequestPlan::get("/api/review/reports"),
        Command::Review(ReviewCmd::Report { date }) => {
            non_empty("the report date", date)?;
            RequestPlan::get(format!("/api/review/reports/{}", encode(date.trim())))
        }
        Command::Review(ReviewCmd::Ledger) => RequestPlan::get("/api/review/ledger"),
        Command::Review(ReviewCmd::WeeklyNow) => RequestPlan::post("/api/review/weekly"),
        Command::Review(ReviewCmd::Digest) => RequestPlan::get("/api/review/digest"),
        Command::Budget(BudgetCmd::Show) => RequestPlan::get("/api/budget"),
        Command::Budget(BudgetCmd::Set {
            daily,
            monthly,
            timezone,
        }) => {
            if daily.is_none() && monthly.is_none() && timezone.is_none() {
                return Err(UsageError(
                    "give at least one of --daily, --monthly or --timezone".into(),
                ));
            }
            let mut body = serde_json::Map::new();
            for (key, raw) in [("daily", daily), ("monthly", monthly)] {
                if let Some(raw) = raw {
                    body.insert(key.into(), budget_amount(key, raw)?);
                }
            }
            if let Some(tz) = timezone {
                let tz = tz.trim();
                let v = if tz == "default" {
                    Value::Null
                } else if tz.parse::<chrono_tz::Tz>().is_ok() {
                    json!(tz)
                } else {
                    return Err(UsageError(format!(
                        "--timezone {tz:?} is not an IANA time zone name (e.g. Europe/Paris) or `default`"
                    )));
                };
                body.insert("timezone".into(), v);
            }
            RequestPlan::put("/api/budget").body(Value::Object(body))
        }
        Command::Cost { since, .. } => {
            if let Some(raw) = since {
                crate::clock::parse_time_arg(raw, crate::clock::now_ms()).map_err(UsageError)?;
            }
            RequestPlan::get("/api/cost").query("since", since.clone())
        }
    };
    Ok(p)
}

/// `--daily 2.00`: an amount of at least 0, or `default` (the config's cap).
fn budget_amount(flag: &str, raw: &str) -> Result<Value, UsageError> {
    let raw = raw.trim();
    if raw == "default" {
        return Ok(Value::Null);
    }
    match raw.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok(json!(v)),
        _ => Err(UsageError(format!(
            "--{flag} {raw:?} is not an amount (a number of at least 0, 0 for no cap, or `default`)"
        ))),
    }
}

/// `/api/files/<path>`, each segment encoded (so `/` stays the separator
/// and nothing in a name can become a query or a fragment).
pub(super) fn file_route(path: &str) -> Result<String, UsageError> {
    non_empty("the file path", path)?;
    let segments: Vec<String> = path.split('/').map(encode).collect();
    Ok(format!("/api/files/{}", segments.join("/")))
}

pub(super) fn task_action(id: &str, action: &str) -> Result<RequestPlan, UsageError> {
    let id = number_id("task", id)?;
    Ok(RequestPlan::post(format!("/api/tasks/{id}/{action}")))
}

pub(super) fn non_empty(what: &str, value: &str) -> Result<(), UsageError> {
    if value.trim().is_empty() {
        Err(UsageError(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}

/// A numeric id (tasks, messages): a typo is a usage error here, in words,
/// rather than the server's path-parse answer.
pub(super) fn number_id(what: &str, id: &str) -> Result<i64, UsageError> {
    id.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| UsageError(format!("{what} id must be a number (got {id:?})")))
}

/// The server's own space-id rule (`SpaceId::parse`), so a typo fails here
/// with a clear sentence instead of a round trip.
pub(super) fn check_space_id(what: &str, id: &str) -> Result<(), UsageError> {
    crate::ids::SpaceId::parse(id).map(|_| ()).map_err(|_| {
        UsageError(format!(
            "{what} {id:?} is not a space id: use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit"
        ))
    })
}

pub(super) fn check_cron(expr: &str) -> Result<(), UsageError> {
    let n = expr.split_whitespace().count();
    if n == 5 {
        Ok(())
    } else {
        Err(UsageError(format!(
            "--cron {expr:?} has {n} fields; it needs 5 (minute hour day-of-month month day-of-week), e.g. \"0 9 * * 1-5\""
        )))
    }
}

pub(super) fn check_model_spec(spec: &str) -> Result<(), UsageError> {
    match spec.split_once(':') {
        Some((kind, rest)) if !kind.trim().is_empty() && !rest.trim().is_empty() => Ok(()),
        _ => Err(UsageError(format!(
            "model spec {spec:?} is not PROVIDER:MODEL (e.g. openai:gpt-4o, anthropic:MODEL, scripted:PATH)"
        ))),
    }
}

pub(super) fn check_time(flag: &str, raw: &str) -> Result<(), UsageError> {
    if is_rfc3339(raw) {
        Ok(())
    } else {
        Err(UsageError(format!(
            "{flag} {raw:?} is not an RFC 3339 time (e.g. 2026-11-29T10:00:00Z)"
        )))
    }
}

pub(super) fn check_time_or_duration(flag: &str, raw: &str) -> Result<(), UsageError> {
    // The server reads `since`/`until` with this very function.
    match clock::parse_time_arg(raw, clock::now_ms()) {
        Ok(_) => Ok(()),
        Err(_) => Err(UsageError(format!(
            "{flag} {raw:?} is neither an RFC 3339 time (2026-11-29T10:00:00Z) nor a duration (24h)"
        ))),
    }
}

pub(super) fn check_positive_duration(flag: &str, raw: &str) -> Result<(), UsageError> {
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

/// The server's duration grammar ([`clock::parse_duration_ms`], which reads
/// `for` and `expires_in`), in seconds; `None` where the server would refuse.
pub(super) fn duration_secs(raw: &str) -> Option<u64> {
    clock::parse_duration_ms(raw)
        .ok()
        .and_then(|ms| u64::try_from(ms / 1000).ok())
}

/// Whether the server will read `raw` as an RFC 3339 time ([`clock::parse_rfc3339_ms`]).
pub(super) fn is_rfc3339(raw: &str) -> bool {
    clock::parse_rfc3339_ms(raw).is_ok()
}

/// RFC 3986 unreserved characters: everything else is percent-encoded.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything but RFC 3986 unreserved characters (UTF-8
/// bytes, upper-case hex), so caller ids such as `whatsapp:1@s.whatsapp.net`
/// stay one path segment and query values cannot smuggle `&` or `#`.
pub(super) fn encode(raw: &str) -> String {
    // "." and ".." are path navigation to some proxies; encoded they stay data.
    if !raw.is_empty() && raw.bytes().all(|b| b == b'.') {
        return "%2E".repeat(raw.len());
    }
    utf8_percent_encode(raw, UNRESERVED).to_string()
}
