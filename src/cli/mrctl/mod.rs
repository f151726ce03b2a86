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
//! Exit codes: 0 success, 1 the server said no, 2 usage, setup, connection
//! or token (a 401), 3 it ran but ended failed or blocked (a failed chat
//! turn, a failed ask, a blocked review).

use std::io::{Read, Write};
use std::process::ExitCode;

use clap::Parser;
use serde_json::{json, Value};

use crate::client::{request_with_headers, ClientError, Connection};

mod args;
mod bridge;
mod files;
mod guide;
mod plan;
mod render;

pub use args::*;
use plan::*;
use render::*;

/// `messages recent --all` stops after this many pages even if the server keeps
/// handing out cursors, so a server bug cannot make the client loop forever.
const MAX_PAGES: usize = 10_000;

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
    /// A local file (`files put --from`, `files edit`'s copy or editor).
    #[error("{0}")]
    Local(String),
    /// The request went through but what it ran ended failed or blocked.
    #[error("{0}")]
    Ended(String),
}

fn exit_code(failure: &Failure) -> u8 {
    match failure {
        // A bad token is a setup problem, like a wrong URL.
        Failure::Api { status: 401, .. } => 2,
        Failure::Ended(_) => 3,
        Failure::Api { .. } | Failure::Missing(_) => 1,
        Failure::Usage(_)
        | Failure::Client(_)
        | Failure::Stdin(_)
        | Failure::Output(_)
        | Failure::Local(_) => 2,
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
    let rewritten = guide::rewrite_header_message(&message);
    // A missing working space (or holder) is how mrctl was called, not a
    // refusal: a usage error, exit 2, like a malformed id (issue 25).
    if status == 400 && rewritten != message && guide::is_missing_space(&message) {
        return Failure::Usage(UsageError(rewritten));
    }
    message = rewritten;
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
    let headers: Vec<(&str, String)> = plan.headers.iter().map(|(k, v)| (*k, v.clone())).collect();
    let (status, value) = request_with_headers(
        conn,
        plan.method.clone(),
        &plan.target(),
        plan.body.clone(),
        &headers,
    )
    .await?;
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
    match &cli.command {
        Command::Completions { shell } => {
            guide::completions(*shell, out);
            return Ok(());
        }
        Command::Man { dir } => {
            let n = guide::man_pages(dir).map_err(Failure::Output)?;
            let _ = writeln!(err, "wrote {n} man pages to {}", dir.display());
            return Ok(());
        }
        _ => {}
    }
    read_stdin_args(&mut cli, stdin)?;
    files::read_put_content(&mut cli, stdin)?;
    // Planned before the connection is set up: a usage error needs no token.
    let plan = plan(&cli)?;
    let env = with_data_dir(env);
    let mut conn = Connection::from_env(&env, cli.token_file.as_deref(), cli.space.clone())?;
    if let Some(space) = &cli.in_space {
        conn.space = Some(space.clone());
    }
    if let Command::Files(FilesCmd::Edit { path }) = &cli.command {
        let text = files::edit(&conn, &plan, path, &env).await?;
        return write_all(out, &text);
    }
    let value = if plan.then == Then::FollowCursor {
        call_all_pages(&conn, &plan).await?
    } else {
        call(&conn, &plan).await?
    };
    let mut value = pick(&plan.then, value)?;
    if let (Command::Ui(UiCmd::Login), crate::client::Endpoint::Http { .. }) =
        (&cli.command, &conn.endpoint)
    {
        // The host answers with a path: only this side knows the URL it was reached at.
        let path = value["path"].as_str().unwrap_or_default().to_owned();
        value["url"] = Value::String(format!("{}{path}", conn.endpoint.describe()));
    }
    let (text, note) = if cli.json {
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
        (format!("{pretty}\n"), None)
    } else {
        let (text, note) = render(&cli.command, &value);
        let text = guide::with_header(&cli.command, text);
        (
            tag_source(&cli.command, &value, text),
            note.or_else(|| guide::paging_hint(&cli.command, &value)),
        )
    };
    write_all(out, &text)?;
    if let Some(note) = note {
        // A note is for the person, not for a pipe; losing it is not worth failing over.
        let _ = writeln!(err, "{note}");
    }
    match guide::ended_badly(&cli.command, &value) {
        Some(why) => Err(Failure::Ended(why)),
        None => Ok(()),
    }
}

/// `mercury`'s default data dir, which mrctl reads the same way.
const DEFAULT_DATA_DIR: &str = "./mercury-data";

/// The environment as the connection reads it, with what the data dir says
/// filled in: MERCURY_DATA_DIR defaults to `./mercury-data` (like `mercury`),
/// and when neither MERCURY_SOCKET nor MERCURY_URL is set the host is reached
/// at the data dir's `api.sock` when it exists, else at the `bind` of its
/// `mercury.yaml` (MERCURY_BIND beats the file, as it does for the host). A
/// wildcard bind (`0.0.0.0`, `::`) is reached on loopback.
fn with_data_dir(env: &dyn Fn(&str) -> Option<String>) -> impl Fn(&str) -> Option<String> + '_ {
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let dir = set("MERCURY_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.to_owned());
    let paths = crate::workspace::DataPaths::new(std::path::Path::new(dir.trim()));
    let mut found: Option<(&'static str, String)> = None;
    if set("MERCURY_SOCKET").is_none() && set("MERCURY_URL").is_none() {
        if paths.socket.exists() {
            found = Some(("MERCURY_SOCKET", paths.socket.display().to_string()));
        } else if let Some(bind) = set("MERCURY_BIND").or_else(|| config_bind(&paths.config)) {
            found = bind_url(&bind).map(|url| ("MERCURY_URL", url));
        }
    }
    move |k: &str| {
        if k == "MERCURY_DATA_DIR" {
            return Some(dir.clone());
        }
        match &found {
            Some((name, value)) if *name == k => Some(value.clone()),
            _ => env(k),
        }
    }
}

/// The top-level `bind` of a data dir's `mercury.yaml`, if it has one.
fn config_bind(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    doc.get("bind")?.as_str().map(str::to_owned)
}

/// `http://ADDR:PORT` for a `bind` value; a wildcard address becomes loopback.
fn bind_url(bind: &str) -> Option<String> {
    let addr: std::net::SocketAddr = bind.trim().parse().ok()?;
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        }
        ip => ip,
    };
    Some(format!(
        "http://{}",
        std::net::SocketAddr::new(ip, addr.port())
    ))
}

/// Text that came from another space through a link (`source_space` in the
/// answer, D-014) says so on every line of the human output; `ask` already
/// opens with its `[space]` label.
fn tag_source(cmd: &Command, v: &Value, text: String) -> String {
    let Some(source) = field(v, "source_space").as_str() else {
        return text;
    };
    // `ask` opens with its label; `runs show` tags each step with its own
    // source (a step may carry a third space's data, issue 23).
    if matches!(
        cmd,
        Command::Ask { .. } | Command::Runs(RunsCmd::Show { .. })
    ) {
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
    let json = cli.json;
    match execute(cli, env, stdin, out, err).await {
        Ok(()) => 0,
        Err(failure) => {
            let code = exit_code(&failure);
            if json {
                let (status, api_code) = match &failure {
                    Failure::Api { status, code, .. } => (Some(*status), code.clone()),
                    _ => (None, None),
                };
                let body = json!({"error": {
                    "message": failure.to_string(),
                    "exit_code": code,
                    "status": status,
                    "code": api_code,
                }});
                let _ = writeln!(err, "{body}");
            } else {
                let _ = writeln!(err, "mrctl: {failure}");
            }
            code
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
    if let Command::Bridge { listen } = &cli.command {
        return ExitCode::from(runtime.block_on(bridge::serve(listen)));
    }
    let env = |k: &str| std::env::var(k).ok();
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let code = runtime.block_on(run(cli, &env, &mut stdin, &mut stdout, &mut stderr));
    ExitCode::from(code)
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

    use hyper::Method;

    use crate::client::{request, Endpoint};

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
        let mut cli = parse(args);
        if let Err(e) = files::read_put_content(&mut cli, &mut std::io::empty()) {
            panic!("{args:?}: {e}");
        }
        match plan(&cli) {
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
                vec!["tokens", "create", "bridge", "--kind", "adapter", "--platform", "telegram", "--trusted-identities"],
                Method::POST,
                "/api/tokens",
                Some(json!({"caller_id": "bridge", "kind": "adapter", "platform": "telegram", "trusted_identities": true})),
            ),
            (vec!["pairing", "list"], Method::GET, "/api/pairings", None),
            (vec!["pairing", "approve", "K7QM4XPA"], Method::POST, "/api/pairings/K7QM4XPA/approve", None),
            (vec!["pairing", "deny", "K7QM4XPA"], Method::POST, "/api/pairings/K7QM4XPA/deny", None),
            (vec!["senders", "list"], Method::GET, "/api/senders", None),
            (
                vec!["senders", "allow", "telegram:42"],
                Method::POST,
                "/api/senders/allow",
                Some(json!({"sender": "telegram:42"})),
            ),
            (
                vec!["senders", "deny", "--conversation", "telegram:-1001"],
                Method::POST,
                "/api/senders/deny",
                Some(json!({"conversation": "telegram:-1001"})),
            ),
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
            (vec!["runs", "show", "r 1"], Method::GET, "/api/runs/r%201", None),
            (vec!["review", "run-now"], Method::POST, "/api/review/run", None),
            (vec!["files", "ls"], Method::GET, "/api/files", None),
            (vec!["files", "ls", "knowledge"], Method::GET, "/api/files?path=knowledge", None),
            (vec!["files", "cat", "knowledge/a b.md"], Method::GET, "/api/files/knowledge/a%20b.md", None),
            (vec!["files", "cat", "../x"], Method::GET, "/api/files/%2E%2E/x", None),
            (vec!["files", "edit", "AGENTS.md"], Method::GET, "/api/files/AGENTS.md", None),
            (
                vec!["files", "put", "AGENTS.md", "--text", "be kind"],
                Method::PUT,
                "/api/files/AGENTS.md",
                Some(json!({"content": "be kind"})),
            ),
            (vec!["files", "rm", "notes/x.md"], Method::DELETE, "/api/files/notes/x.md", None),
            (vec!["links", "list", "--all"], Method::GET, "/api/links?all=true", None),
            (vec!["links", "audit", "--all"], Method::GET, "/api/links/audit?all=true", None),
            (vec!["review", "reports"], Method::GET, "/api/review/reports", None),
            (vec!["review", "report", "2026-09-28-weekly"], Method::GET, "/api/review/reports/2026-09-28-weekly", None),
            (vec!["review", "ledger"], Method::GET, "/api/review/ledger", None),
            (vec!["review", "weekly-now"], Method::POST, "/api/review/weekly", None),
        ];
        for (args, method, target, body) in cases {
            let p = planned(&args);
            assert_eq!(p.method, method, "{args:?}");
            assert_eq!(p.target(), target, "{args:?}");
            assert_eq!(p.body, body, "{args:?}");
        }
    }

    #[test]
    fn files_writes_carry_if_match_and_bad_hashes_are_usage_errors() {
        let p = planned(&["files", "rm", "a.md", "--if-match", "\"ABC123\""]);
        assert_eq!(p.headers, vec![("if-match", "ABC123".to_owned())]);
        let p = planned(&["files", "put", "a.md", "--text", "x", "--if-match", "abc"]);
        assert_eq!(p.headers, vec![("if-match", "abc".to_owned())]);
        assert!(usage_err(&["files", "rm", "a.md", "--if-match", "not-hex"])
            .contains("not a file hash"));
        assert!(usage_err(&["files", "cat", ""]).contains("must not be empty"));
        clap_rejects(&["files", "put", "a.md"]);
        clap_rejects(&["files", "put", "a.md", "--text", "x", "--from", "f"]);
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
            planned(&["prefs", "delete", ".."]).target(),
            "/api/prefs/%2E%2E"
        );
        // A task id is a number before it is a path segment at all.
        assert!(usage_err(&["tasks", "run", ".."]).starts_with("task id must be a number"));
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
    fn percent_encoding_of_reserved_unicode_and_space() {
        assert_eq!(encode(":/?#[]@"), "%3A%2F%3F%23%5B%5D%40");
        assert_eq!(encode("!$&'()*+,;="), "%21%24%26%27%28%29%2A%2B%2C%3B%3D");
        // A space is %20, never `+`; a `+` is data.
        assert_eq!(encode("a b+c"), "a%20b%2Bc");
        assert_eq!(encode("\t\n\u{7f}"), "%09%0A%7F");
        assert_eq!(encode("日本 🙂"), "%E6%97%A5%E6%9C%AC%20%F0%9F%99%82");
        assert_eq!(encode("käse.brot"), "k%C3%A4se.brot");
        assert_eq!(encode(""), "");
        assert_eq!(encode("..."), "%2E%2E%2E");
    }

    /// The hand-written encoder the crate replaced, kept as the reference the
    /// crate must match byte for byte.
    fn encode_by_hand(raw: &str) -> String {
        if !raw.is_empty() && raw.bytes().all(|b| b == b'.') {
            return "%2E".repeat(raw.len());
        }
        let mut out = String::new();
        for b in raw.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn percent_encoding_matches_the_old_encoder(raw in "\\PC*|[.]{1,3}|[ -~]{0,40}") {
            proptest::prop_assert_eq!(encode(&raw), encode_by_hand(&raw));
        }
    }

    #[test]
    fn durations_are_exactly_the_servers() {
        for raw in [
            "2h", "1h30m", " 90s ", "0s", "", "24", "h", "1hm", "-2h", "1.5h", "3x",
        ] {
            assert_eq!(
                duration_secs(raw).is_some(),
                crate::clock::parse_duration_ms(raw).is_ok(),
                "{raw:?}"
            );
        }
        // The old grammar counted seconds in a u64, so it let through
        // durations the server (milliseconds in an i64) refuses as too long.
        assert_eq!(duration_secs("10000000000000000s"), None);
        assert!(
            usage_err(&["mutes", "set", "tg:5", "--for", "10000000000000000s"])
                .contains("not a duration")
        );
    }

    #[test]
    fn rfc3339_is_the_servers_reading() {
        // The old shape check took any day up to 31; the server refuses a day
        // the month does not have, so mrctl now refuses it before sending.
        assert!(!is_rfc3339("2026-02-30T10:00:00Z"));
        assert!(!is_rfc3339("2026-04-31T10:00:00Z"));
        assert!(
            usage_err(&["mutes", "set", "tg:5", "--until", "2026-02-30T10:00:00Z"])
                .contains("RFC 3339")
        );
        assert!(is_rfc3339("2028-02-29T10:00:00Z"));
        // chrono (so the server) takes U+2212 MINUS SIGN in the offset; the
        // old check refused what the server would have accepted.
        assert!(is_rfc3339("2026-11-29T10:00:00\u{2212}05:00"));
        assert!(is_rfc3339("2026-11-29T23:59:60Z"));
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
        // Issue 25: a malformed id is said in words, before any request.
        for cmd in ["pause", "resume", "run", "delete"] {
            assert!(
                usage_err(&["tasks", cmd, "abc"]).starts_with("task id must be a number"),
                "{cmd}"
            );
        }
        assert!(usage_err(&["messages", "show", "x1"]).starts_with("message id must be a number"));
        assert!(usage_err(&["--in", "Bad Space", "whoami"]).contains("--in"));
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
        let unauthorized = Failure::Api {
            status: 401,
            code: None,
            message: "bad token".into(),
        };
        assert_eq!(exit_code(&unauthorized), 2, "a token problem is setup");
        assert_eq!(
            exit_code(&Failure::Ended("the turn ended failed".into())),
            3
        );
    }

    #[test]
    fn header_errors_say_what_to_set() {
        let f = api_failure(
            400,
            &json!({"error": {"message": "this route needs the x-mercury-space header naming a space"}}),
        );
        assert!(f.to_string().contains("set MERCURY_SPACE="), "{f}");
        assert!(!f.to_string().contains("x-mercury"), "{f}");
        let f = api_failure(
            400,
            &json!({"error": {"message": "acting in another space needs a holder: send x-mercury-space (or use a run token)"}}),
        );
        assert!(f.to_string().contains("--space acts through a link"), "{f}");
        // Issue 25: a missing working space is a usage error (exit 2), a
        // refusal stays 1.
        assert_eq!(exit_code(&f), 2);
        let f = api_failure(
            400,
            &json!({"error": {"message": "this route needs the x-mercury-space header naming a space"}}),
        );
        assert_eq!(exit_code(&f), 2);
        assert!(f.to_string().contains("--in <space id>"), "{f}");
        let f = api_failure(
            400,
            &json!({"error": {"message": "limit must be between 1 and 200"}}),
        );
        assert_eq!(exit_code(&f), 1);
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
    fn times_render_as_rfc3339() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_ms(1_000_000_000_999), "2001-09-09T01:46:40Z");
        assert_eq!(format_ms(-86_400_000), "1969-12-31T00:00:00Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59Z");
        assert_eq!(format_ms(253_402_300_799_999), "9999-12-31T23:59:59Z");
        // Past 9999 the old maths printed an unsigned five-digit year (neither
        // RFC 3339 nor ISO 8601); chrono writes ISO 8601's signed expanded year.
        assert_eq!(format_ms(253_402_300_800_000), "+10000-01-01T00:00:00Z");
        // Beyond chrono's calendar there is no date: the number is shown as is.
        assert_eq!(format_ms(i64::MAX), "9223372036854775807");
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
        // A trace through a link: each step tagged with its own source, a
        // withheld step's arguments and output left out (issue 23).
        let show = parse(&["runs", "show", "r1"]).command;
        let v = json!({"run": {"id": "r1", "space_id": "c", "kind": "live", "status": "done"},
                       "usage": {"tokens_in": 1, "tokens_out": 1}, "source_space": "c",
                       "steps": [
            {"seq": 1, "kind": "tool", "name": "mrctl", "arguments": null, "exit_code": 0, "duration_ms": 1,
             "output_bytes": 9, "output": "[output from another space withheld]", "source_spaces": ["s"],
             "source_space": "s", "withheld": true},
            {"seq": 2, "kind": "tool", "name": "shell", "arguments": "{}", "exit_code": 0, "duration_ms": 1,
             "output_bytes": 2, "output": "ok", "source_spaces": [], "source_space": "c"}]});
        let (out, _) = render(&show, &v);
        let out = tag_source(&show, &v, out);
        assert!(out.starts_with("[from c] run: r1\n"), "{out}");
        assert!(out.contains("[from s] #1 tool mrctl [arguments withheld] exit 0 (1 ms, 9 bytes out)\n[from s]     [output from another space withheld]\n"), "{out}");
        assert!(
            out.contains("[from c] #2 tool shell {} exit 0 (1 ms, 2 bytes out)\n[from c]     ok\n"),
            "{out}"
        );
        let revoke = parse(&["links", "revoke", "4"]).command;
        let (out, _) = render(
            &revoke,
            &json!({"link": {"id": 4, "holder_space_id": "m", "target_space_id": "c", "level": "admin", "revoked_at": 1},
                    "removed_roles": [],
                    "restored": [{"space_id": "c", "kind": "permissions", "key": "role.member.permissions",
                                  "value": "messages.read,prompt", "replaced": "prompt", "reason": null}],
                    "kept": [{"space_id": "c", "kind": "preference", "key": "tone", "value": "x",
                              "replaced": null, "reason": "changed since by a direct write"}]}),
        );
        assert_eq!(
            out,
            "link 4 m -> c (admin), revoked\n\
             restored permissions of member in c: messages.read,prompt (was prompt)\n\
             kept preference tone in c: x (changed since by a direct write)\n"
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
        // Issue 25: a shadow's send is held, not queued.
        let send = parse(&["send", "hi"]).command;
        let (text, _) = render(
            &send,
            &json!({"outbox_id": null, "conversation_id": 4, "shadow": true}),
        );
        assert!(text.starts_with("held (shadow copy"), "{text}");
        let (text, _) = render(
            &send,
            &json!({"outbox_id": 7, "conversation_id": 4, "shadow": false}),
        );
        assert_eq!(text, "queued as outbox item 7 in conversation 4\n");
        // `review report DATE` renders a daily report for a person.
        let report = parse(&["review", "report", "2026-09-28"]).command;
        let (text, _) = render(
            &report,
            &json!({"date": "2026-09-28", "kind": "daily", "report": {
                "window_since": "2026-09-27T03:00:00Z", "window_until": "2026-09-28T03:00:00Z",
                "findings": [{"space": "family", "message_id": 12, "reply_id": 13, "kind": "wrong_answer",
                    "scope": "space", "target_layer": "memory", "severity": 3,
                    "summary": "Named the wrong capital.", "evidence": "Lyon", "suggestion": "Paris"}],
                "footer": {"exchanges_judged": 9, "spaces_judged": 2, "judge_calls": 5, "cost": 0.01, "currency": "USD"}
            }}),
        );
        assert!(text.starts_with("Conversation review 2026-09-28 (daily)\nwindow: 2026-09-27T03:00:00Z to 2026-09-28T03:00:00Z\nfindings: 1\n"), "{text}");
        assert!(text.contains("1. wrong_answer (severity 3, space, memory) in family at [msg 12] (reply [msg 13])\n   Named the wrong capital.\n   evidence: Lyon\n   suggestion: Paris\n"), "{text}");
        assert!(
            text.contains("9 exchanges in 2 spaces judged, 5 judge calls"),
            "{text}"
        );
        assert!(!text.contains('{'), "not JSON: {text}");
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

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k: &str| map.get(k).cloned()
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

    /// Issue 25 item 4: `--in SPACE` names the working space (beating
    /// MERCURY_SPACE) while `--space` still acts through a link; with only
    /// MERCURY_DATA_DIR set the host is found at the data dir's `api.sock`,
    /// else at its `bind`, and the owner token is read from it.
    #[tokio::test]
    async fn in_names_the_working_space_and_the_data_dir_finds_the_host(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // A data dir whose mercury.yaml binds a wildcard address: reached on loopback.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen: Seen = Arc::default();
        let app = test_app(seen.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("global"))?;
        std::fs::write(dir.path().join("global/owner.token"), "owner-tok\n")?;
        std::fs::write(
            dir.path().join("mercury.yaml"),
            format!("# the operator's file\nbind: 0.0.0.0:{port}\n"),
        )?;
        let data = dir.path().to_str().ok_or("utf8")?;
        let env = [("MERCURY_DATA_DIR", data), ("MERCURY_SPACE", "family")];
        let o = invoke(&["--json", "--in", "work", "prefs", "list"], &env, "").await;
        let echo = json_out(&o);
        assert_eq!(echo["space"], "work", "--in beats MERCURY_SPACE");
        assert_eq!(echo["act_as"], Value::Null, "--in is not a link");
        assert_eq!(echo["authorization"], "Bearer owner-tok");
        assert_eq!(echo["host"], format!("127.0.0.1:{port}"));
        // --space keeps its meaning beside --in.
        let o = invoke(
            &[
                "--json", "--in", "family", "--space", "work", "prefs", "list",
            ],
            &env,
            "",
        )
        .await;
        let echo = json_out(&o);
        assert_eq!(
            (echo["space"].clone(), echo["act_as"].clone()),
            (json!("family"), json!("work"))
        );
        // A malformed --in is a usage error before any request.
        let before = seen.lock().map_err(|_| "poisoned")?.len();
        let o = invoke(&["--in", "No Such", "prefs", "list"], &env, "").await;
        assert_eq!(o.code, 2, "{}", o.err);
        assert!(o.err.contains("--in"), "{}", o.err);
        assert_eq!(seen.lock().map_err(|_| "poisoned")?.len(), before);

        // The data dir's api.sock, when there is one, is preferred to its bind.
        let sock = dir.path().join("api.sock");
        let unix = tokio::net::UnixListener::bind(&sock)?;
        let sock_seen: Seen = Arc::default();
        let app = test_app(sock_seen.clone());
        tokio::spawn(async move {
            let _ = axum::serve(unix, app).await;
        });
        let o = invoke(&["--json", "--in", "work", "whoami"], &env, "").await;
        assert_eq!(json_out(&o)["path"], "/api/whoami");
        assert_eq!(sock_seen.lock().map_err(|_| "poisoned")?.len(), 1);
        // MERCURY_URL still beats the data dir.
        let url = format!("http://127.0.0.1:{port}");
        let env2 = [("MERCURY_DATA_DIR", data), ("MERCURY_URL", url.as_str())];
        let o = invoke(&["--json", "--in", "work", "whoami"], &env2, "").await;
        json_out(&o);
        assert_eq!(sock_seen.lock().map_err(|_| "poisoned")?.len(), 1);
        Ok(())
    }

    #[test]
    fn the_data_dir_defaults_to_mercury_data() {
        let env = env_of(&[]);
        let env = with_data_dir(&env);
        assert_eq!(env("MERCURY_DATA_DIR").as_deref(), Some("./mercury-data"));
        assert_eq!(
            bind_url("0.0.0.0:8787").as_deref(),
            Some("http://127.0.0.1:8787")
        );
        assert_eq!(bind_url("[::]:9").as_deref(), Some("http://[::1]:9"));
        assert_eq!(
            bind_url("10.0.0.2:80").as_deref(),
            Some("http://10.0.0.2:80")
        );
        assert_eq!(bind_url("nonsense"), None);
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
