//! `mercury status` (asks the running host through its socket) and
//! `mercury doctor` (checks what a host needs, without starting one).
//!
//! Exit codes, `status`: 0 the host runs and answered, 1 it answered with an
//! error, 2 usage (no data dir, no owner token), 3 no host is running.
//! `doctor`: 0 every check passed (warnings allowed), 1 a check failed,
//! 2 usage (no data dir).
//!
//! Must never: print a token, or change anything in the data dir (doctor's
//! turn-layer probe lives under `tmp/`, the scratch, and is removed).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use reqwest::Method;
use serde_json::Value;

use crate::client::{self, ClientError, Connection, Endpoint};
use crate::config::{self, SandboxChoice, Settings};
use crate::host::layer_probe::Verdict;
use crate::workspace::{data_dir, DataPaths};

/// `mercury status`.
/// The data dir's own host, over `api.sock`, as its owner (the owner token
/// file): how `status`, `doctor` and the intake ask the running host.
pub(crate) fn owner_connection(paths: &DataPaths) -> std::io::Result<Connection> {
    let token = std::fs::read_to_string(paths.owner_token())?;
    Ok(Connection::new(Endpoint::Unix(paths.socket.clone())).with_token(token.trim()))
}

pub async fn status(data: &Path, json: bool) -> ExitCode {
    let paths = DataPaths::new(data);
    // A PostgreSQL deployment's data dir has a config and no state.db.
    if !paths.db.exists() && !paths.config.exists() {
        eprintln!(
            "mercury status: {} is not a data dir (run `mercury init` first)",
            data.display()
        );
        return ExitCode::from(2);
    }
    let conn = match owner_connection(&paths) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "mercury status: cannot read the owner token {} ({e}); run as the user that owns the data dir",
                paths.owner_token().display()
            );
            return ExitCode::from(2);
        }
    };
    match client::request(&conn, Method::GET, "/api/status", None).await {
        Ok((200, v)) => {
            if json {
                println!("{v}");
            } else {
                print!("{}", render_status(&v));
            }
            // Running, but not all there: a monitor's check fails on it.
            if v["degraded"] == Value::Bool(true) {
                ExitCode::from(4)
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok((code, v)) => {
            let msg = v["error"]["message"]
                .as_str()
                .or_else(|| v["message"].as_str())
                .unwrap_or("no message");
            eprintln!("mercury status: the host answered {code}: {msg}");
            ExitCode::from(1)
        }
        Err(ClientError::Connect { .. }) => {
            if json {
                println!("{}", serde_json::json!({"running": false}));
            } else {
                println!(
                    "running: no (nothing answers on {})",
                    paths.socket.display()
                );
            }
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("mercury status: {e}");
            ExitCode::from(1)
        }
    }
}

fn render_status(v: &Value) -> String {
    let s = |k: &str| v[k].to_string().trim_matches('"').to_owned();
    let mut out = String::new();
    out.push_str("running: yes\n");
    out.push_str(&format!("version: {}\n", s("version")));
    out.push_str(&format!("uptime: {} s\n", s("uptime_secs")));
    let chain: Vec<&str> = v["model_chain"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!(
        "model: {}\n",
        if chain.is_empty() {
            "(none)".to_owned()
        } else {
            chain.join(" -> ")
        }
    ));
    out.push_str(&format!(
        "spaces: {} ({} active)\n",
        s("spaces_total"),
        s("spaces_active")
    ));
    out.push_str(&format!("queue: {} pending", v["queue"]["pending"]));
    let top: Vec<String> = v["queue"]["top"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| format!("{} {}", p[0].as_str().unwrap_or("?"), p[1]))
        .collect();
    if !top.is_empty() {
        out.push_str(&format!(" (busiest: {})", top.join(", ")));
    }
    out.push('\n');
    out.push_str(&format!(
        "running turns (containers/sandboxes): {}\n",
        s("running_turns")
    ));
    let sp = &v["spend"];
    if sp.is_object() {
        out.push_str(&format!(
            "spend: {} today, {} this month\n",
            sp["today_text"].as_str().unwrap_or("?"),
            sp["month_text"].as_str().unwrap_or("?")
        ));
    }
    let sb = &v["sandbox"];
    out.push_str(&format!(
        "sandbox: {}{}\n",
        sb["backend"].as_str().unwrap_or("?"),
        match sb["unavailable"].as_str() {
            Some(why) => format!(" (tool calls refused: {why})"),
            None if sb["isolated"] == Value::Bool(false) => " (NOT isolated)".into(),
            None => String::new(),
        }
    ));
    let adapters: Vec<String> = v["adapters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let mut details = Vec::new();
            if let Some(mode) = a["mode"].as_str() {
                details.push(mode.to_owned());
            }
            if let Some(at) = a["last_update_at"]
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
            {
                details.push(format!(
                    "last update {}",
                    at.format("%Y-%m-%d %H:%M:%S UTC")
                ));
            }
            if let Some(e) = a["last_error"].as_str() {
                details.push(format!("last error: {e}"));
            }
            let details = if details.is_empty() {
                String::new()
            } else {
                format!(" ({})", details.join("; "))
            };
            format!(
                "{} {}{details}",
                a["name"].as_str().unwrap_or("?"),
                a["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    out.push_str(&format!(
        "adapters: {}\n",
        if adapters.is_empty() {
            "(none)".to_owned()
        } else {
            adapters.join(", ")
        }
    ));
    let review = &v["review"];
    out.push_str(&format!(
        "review: {}\n",
        match (review["enabled"].as_bool(), review["next_run"].as_str()) {
            (Some(true), Some(next)) => format!("on, next run {next}"),
            (Some(true), None) => "on".to_owned(),
            _ => "off".to_owned(),
        }
    ));
    if let Some(why) = review["digest_undeliverable"].as_str() {
        out.push_str(&format!("review digest: not delivered: {why}\n"));
    }
    let failures = v["recent_failures"].as_array().cloned().unwrap_or_default();
    if failures.is_empty() {
        out.push_str("failed runs (24 h): none\n");
    } else {
        out.push_str("failed runs (24 h, newest first; mrctl runs show RUN):\n");
        for f in &failures {
            let at = f["started_at"]
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                .unwrap_or_default();
            let error: String = f["error"]
                .as_str()
                .unwrap_or("-")
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .take(160)
                .collect();
            out.push_str(&format!(
                "  {} {} {} {at}: {error}\n",
                f["run_id"].as_str().unwrap_or("?"),
                f["space_id"].as_str().unwrap_or("?"),
                f["kind"].as_str().unwrap_or("?"),
            ));
        }
    }
    if v["degraded"] == Value::Bool(true) {
        out.push_str("attention: an enabled adapter is disconnected (exit 4)\n");
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Check {
    level: Level,
    what: &'static str,
    detail: String,
}

fn check(level: Level, what: &'static str, detail: impl Into<String>) -> Check {
    Check {
        level,
        what,
        detail: detail.into(),
    }
}

/// Below these, `doctor` warns and then fails: a full disk stops SQLite's
/// writes and every turn's layer.
const DISK_WARN_BYTES: u64 = 1 << 30;
const DISK_FAIL_BYTES: u64 = 100 << 20;

/// `mercury doctor`.
pub async fn doctor(data: &Path) -> ExitCode {
    let paths = DataPaths::new(data);
    if !paths.config.exists() && !paths.db.exists() {
        eprintln!(
            "mercury doctor: {} is not a data dir (run `mercury init` first)",
            data.display()
        );
        return ExitCode::from(2);
    }
    let env = config::process_env();
    let mut checks = run_checks(&paths, &env).await;
    checks.extend(host_checks(&paths).await);
    for c in &checks {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        println!("{tag} {}: {}", c.what, c.detail);
    }
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if failed > 0 {
        eprintln!("mercury doctor: {failed} check(s) failed");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The running host's own checks (`GET /api/doctor` over `api.sock`): its
/// environment, not this shell's, decides keys and endpoints. No host
/// running is a warning: the checks above are then this shell's alone.
async fn host_checks(paths: &DataPaths) -> Vec<Check> {
    let Ok(conn) = owner_connection(paths) else {
        return vec![check(
            Level::Warn,
            "host",
            "cannot read the owner token, so the running host was not asked (run as the data dir's owner)",
        )];
    };
    match client::request(&conn, Method::GET, "/api/doctor", None).await {
        Ok((200, v)) => v["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Check {
                level: match c["level"].as_str() {
                    Some("ok") => Level::Ok,
                    Some("warn") => Level::Warn,
                    _ => Level::Fail,
                },
                what: "host",
                detail: format!(
                    "{}: {}",
                    c["what"].as_str().unwrap_or("?"),
                    c["detail"].as_str().unwrap_or("?")
                ),
            })
            .collect(),
        Ok((code, v)) => vec![check(
            Level::Fail,
            "host",
            format!(
                "the running host answered {code}: {}",
                v["error"]["message"].as_str().unwrap_or("no message")
            ),
        )],
        Err(ClientError::Connect { .. }) => vec![check(
            Level::Warn,
            "host",
            format!(
                "no host answers on {}: the checks above are this shell's, not the service's",
                paths.socket.display()
            ),
        )],
        Err(e) => vec![check(Level::Fail, "host", e.to_string())],
    }
}

async fn run_checks(paths: &DataPaths, env: &BTreeMap<String, String>) -> Vec<Check> {
    let mut out = Vec::new();
    for u in config::unknown_vars(env) {
        out.push(check(Level::Warn, "environment", u.to_string()));
    }
    let settings = match config::load(&paths.config, env) {
        Ok(s) => {
            out.push(check(
                Level::Ok,
                "config",
                format!("{} is valid", paths.config.display()),
            ));
            s
        }
        Err(e) => {
            out.push(check(Level::Fail, "config", e.to_string()));
            // The defaults stand in so the other checks still say something.
            Settings::default()
        }
    };
    match config::check_scripted_files(&settings) {
        Ok(()) => {}
        Err(e) => out.push(check(Level::Fail, "models", e.to_string())),
    }
    out.extend(key_checks(&settings, env));
    out.extend(price_checks(&settings));
    out.extend(sandbox_checks(&settings).await);
    for f in crate::host::layer_probe::check(paths, &settings).await {
        let (level, detail) = match f.verdict {
            Verdict::Ok(d) => (Level::Ok, d),
            Verdict::Warn(d) => (Level::Warn, d),
            Verdict::Fail(d) => (Level::Fail, d),
        };
        out.push(check(level, f.what, detail));
    }
    let loose = data_dir::loose_modes(paths);
    if loose.is_empty() {
        out.push(check(
            Level::Ok,
            "data dir",
            format!("{} and its files are private", paths.root.display()),
        ));
    }
    for l in loose {
        out.push(check(Level::Fail, "data dir", l.to_string()));
    }
    out.push(disk_check(&paths.root));
    out
}

/// Every configured model needs a price: under a cap an unpriced model is
/// refused, without one its spend reads 0.
fn price_checks(s: &Settings) -> Vec<Check> {
    let specs: Vec<String> = s.configured_specs().into_iter().map(|(_, v)| v).collect();
    let unpriced = crate::spend::unpriced(s, &specs);
    if unpriced.is_empty() {
        return vec![check(
            Level::Ok,
            "prices",
            format!(
                "every configured model has a price (built-in: {})",
                crate::spend::price_table::SOURCE
            ),
        )];
    }
    unpriced
        .into_iter()
        .map(|spec| {
            let why = if s.budgets.any_cap() && !s.budgets.allow_unpriced {
                "a spend cap is set, so its calls will be refused"
            } else {
                "its calls count as free"
            };
            check(
                Level::Warn,
                "prices",
                format!("{spec} has no price (set prices.\"{spec}\"): {why}"),
            )
        })
        .collect()
}

fn key_checks(s: &Settings, env: &BTreeMap<String, String>) -> Vec<Check> {
    let defaults = config::ProviderConfig::default();
    let missing = config::missing_keys(s, env);
    let mut out: Vec<Check> = missing
        .iter()
        .map(|(spec, var)| {
            // A key is optional only for a server of the operator's own
            // (an OpenAI-compatible Ollama, say), never for the public APIs.
            let own_server = match config::key_var_of(spec).map(|(p, _)| p) {
                Some("openai") => s.providers.openai_base_url != defaults.openai_base_url,
                Some("anthropic") => s.providers.anthropic_base_url != defaults.anthropic_base_url,
                _ => false,
            };
            check(
                if own_server { Level::Warn } else { Level::Fail },
                "model keys",
                format!("{spec} is in the chain but {var} is not set"),
            )
        })
        .collect();
    if missing.is_empty() {
        out.push(check(
            Level::Ok,
            "model keys",
            format!("every provider of {} has a key", s.model),
        ));
    }
    out
}

async fn sandbox_checks(s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    let choice = s.sandbox.backend;
    // The engines this data dir's host starts sandboxes on: the configured
    // list (sandbox.docker.hosts), or the local one.
    let engines = crate::sandbox::lifecycle::connect(&s.sandbox.docker).await;
    let docker_ok = engines.is_ok();
    let configured = &s.sandbox.docker.hosts;
    match &engines {
        Ok(_) if configured.is_empty() => {
            out.push(check(Level::Ok, "docker", "the engine answers"));
        }
        Ok(up) => {
            let up = up.endpoints();
            for host in configured {
                out.push(if up.contains(host) {
                    check(Level::Ok, "docker", format!("{host} answers"))
                } else {
                    check(
                        Level::Fail,
                        "docker",
                        format!("{host} does not answer: the host would leave it out"),
                    )
                });
            }
        }
        Err(e) => out.push(check(
            if choice == SandboxChoice::Docker {
                Level::Fail
            } else {
                Level::Warn
            },
            "docker",
            e.to_string(),
        )),
    }
    if let Ok(engines) = &engines {
        let tag = crate::host::containers::agent_image(s).map_err(|e| format!("{e:#}"));
        match tag {
            Ok(tag) => match engines.image_present(&tag).await {
                Ok(true) => out.push(check(Level::Ok, "image", format!("{tag} is present"))),
                Ok(false) if s.sandbox.image.is_empty() => out.push(check(
                    Level::Warn,
                    "image",
                    format!(
                        "{tag} is absent; `mercury serve` builds it (or run `mercury image build`)"
                    ),
                )),
                Ok(false) => out.push(check(
                    Level::Fail,
                    "image",
                    format!("sandbox.image {tag} is not on the engine"),
                )),
                Err(e) => out.push(check(Level::Warn, "image", e.to_string())),
            },
            Err(e) => out.push(check(Level::Warn, "image", e)),
        }
    }
    let bwrap = match s.sandbox.bwrap.as_str() {
        "" => crate::sandbox::process::ProcessBackend::find_bwrap(),
        p => Some(std::path::PathBuf::from(p)).filter(|p| p.is_file()),
    };
    match &bwrap {
        Some(p) => out.push(check(Level::Ok, "bubblewrap", format!("{}", p.display()))),
        None => out.push(check(
            if choice == SandboxChoice::Process && !s.sandbox.allow_unisolated {
                Level::Fail
            } else {
                Level::Warn
            },
            "bubblewrap",
            "bwrap is not installed (Debian: apt-get install bubblewrap)",
        )),
    }
    if choice == SandboxChoice::Auto && !docker_ok && bwrap.is_none() {
        out.push(check(
            Level::Fail,
            "sandbox",
            "auto finds neither Docker nor bubblewrap: every tool call would be refused",
        ));
    }
    out
}

fn disk_check(root: &Path) -> Check {
    match crate::workspace::data_dir::free_bytes(root) {
        Some(free) => {
            let mb = free >> 20;
            let level = if free < DISK_FAIL_BYTES {
                Level::Fail
            } else if free < DISK_WARN_BYTES {
                Level::Warn
            } else {
                Level::Ok
            };
            check(
                level,
                "disk",
                format!("{mb} MB free under {}", root.display()),
            )
        }
        None => check(Level::Warn, "disk", "cannot read the free space"),
    }
}
