//! `mercury onboard`: a first run, asked question by question on a terminal
//! (or answered by flags, for a script): the data dir (`mercury init` when
//! there is none), the model provider, its base URL, model and key, one
//! test call with them, optionally a Telegram bot token and the owner's
//! Telegram id, and the systemd unit with its working rights.
//!
//! Must never: echo a key or token typed on a terminal, write a key or token
//! into `mercury.yaml` (they go in the env file, 0600, which the unit reads),
//! or write anything when the test call fails.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_yaml_ng::Value as Yaml;

use crate::workspace::DataPaths;

/// The unit `deploy/mercury.service`, adapted to the data dir and env file.
const UNIT: &str = include_str!("../../deploy/mercury.service");

#[derive(Debug, Args)]
pub struct OnboardArgs {
    #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
    pub data_dir: PathBuf,
    /// openai (any OpenAI-compatible server) or anthropic.
    #[arg(long)]
    pub provider: Option<String>,
    /// The provider's base URL (an OpenAI-compatible server's, a LiteLLM proxy's).
    #[arg(long)]
    pub base_url: Option<String>,
    /// The model name at that provider.
    #[arg(long)]
    pub model: Option<String>,
    /// A file holding the API key (else it is asked, not shown).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// A file holding a Telegram bot token ("-": no Telegram).
    #[arg(long, value_name = "FILE")]
    pub telegram_token_file: Option<PathBuf>,
    /// The owner's Telegram user id (digits), made a global admin and the review's owner.
    #[arg(long, value_name = "ID")]
    pub owner_telegram_id: Option<String>,
    /// Where the keys go (KEY=value lines, 0600; the unit's EnvironmentFile).
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Also write the systemd unit here, adapted to this data dir and env file.
    #[arg(long, value_name = "FILE")]
    pub unit: Option<PathBuf>,
    /// Skip the test call.
    #[arg(long)]
    pub no_test_call: bool,
    /// Ask nothing: every value not given is its default, or an error.
    #[arg(long)]
    pub yes: bool,
}

struct Asker {
    interactive: bool,
    lines: std::io::StdinLock<'static>,
}

impl Asker {
    fn ask(&mut self, question: &str, default: &str) -> Result<String, String> {
        if !self.interactive {
            return Ok(default.to_owned());
        }
        if default.is_empty() {
            print!("{question}: ");
        } else {
            print!("{question} [{default}]: ");
        }
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        self.lines
            .read_line(&mut line)
            .map_err(|e| format!("reading the answer: {e}"))?;
        let line = line.trim();
        Ok(if line.is_empty() { default } else { line }.to_owned())
    }

    /// A secret: the terminal's echo is off while it is typed.
    fn secret(&mut self, question: &str) -> Result<String, String> {
        if !self.interactive {
            return Ok(String::new());
        }
        print!("{question} (not shown): ");
        let _ = std::io::stdout().flush();
        let echo = EchoOff::new();
        let mut line = String::new();
        let read = self.lines.read_line(&mut line);
        drop(echo);
        println!();
        read.map_err(|e| format!("reading the answer: {e}"))?;
        Ok(line.trim().to_owned())
    }
}

/// Turns the terminal's echo off until dropped.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> Self {
        // SAFETY: tcgetattr/tcsetattr on stdin with a termios this owns;
        // results checked, the old state restored on drop.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut t) != 0 {
                return Self(None);
            }
            let old = t;
            t.c_lflag &= !libc::ECHO;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) != 0 {
                return Self(None);
            }
            Self(Some(old))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: restores the state read in `new`.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &old);
            }
        }
    }
}

fn read_secret_file(p: &Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{what}: cannot read {}: {e}", p.display()))
}

pub async fn run(a: OnboardArgs) -> ExitCode {
    match onboard(a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("mercury onboard: {msg}");
            ExitCode::from(code)
        }
    }
}

async fn onboard(a: OnboardArgs) -> Result<(), (u8, String)> {
    let usage = |m: String| (2u8, m);
    let paths = DataPaths::new(&a.data_dir);
    let interactive = !a.yes && std::io::stdin().is_terminal();
    let mut asker = Asker {
        interactive,
        lines: std::io::stdin().lock(),
    };
    if interactive {
        println!("Mercury first run: a few questions (Enter keeps the [default]).");
    }
    let provider = match &a.provider {
        Some(p) => p.clone(),
        None => asker
            .ask("Model provider, openai or anthropic", "openai")
            .map_err(usage)?,
    };
    let (default_url, default_model, key_var) = match provider.as_str() {
        "openai" => ("https://api.openai.com/v1", "gpt-4o-mini", "MERCURY_OPENAI_API_KEY"),
        "anthropic" => (
            "https://api.anthropic.com",
            "claude-sonnet-4-5",
            "MERCURY_ANTHROPIC_API_KEY",
        ),
        other => {
            return Err(usage(format!(
                "the provider {other:?} is not one Mercury speaks: openai (any OpenAI-compatible server) or anthropic"
            )))
        }
    };
    let base_url = match &a.base_url {
        Some(u) => u.clone(),
        None => asker.ask("Base URL", default_url).map_err(usage)?,
    };
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(usage(format!(
            "the base URL {base_url:?} must start with http:// or https://"
        )));
    }
    let model = match &a.model {
        Some(m) => m.clone(),
        None => asker.ask("Model", default_model).map_err(usage)?,
    };
    if model.trim().is_empty() || model.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(usage(format!("the model name {model:?} must be one word")));
    }
    let key = match &a.key_file {
        Some(f) => read_secret_file(f, "--key-file").map_err(usage)?,
        None => asker.secret("API key").map_err(usage)?,
    };
    let telegram = match &a.telegram_token_file {
        Some(f) if f.as_os_str() == "-" => String::new(),
        Some(f) => read_secret_file(f, "--telegram-token-file").map_err(usage)?,
        None => asker
            .secret("Telegram bot token, from @BotFather (empty: no Telegram)")
            .map_err(usage)?,
    };
    let owner_id = match &a.owner_telegram_id {
        Some(id) => id.clone(),
        None if telegram.is_empty() => String::new(),
        None => asker
            .ask("Your Telegram user id (digits; empty: none)", "")
            .map_err(usage)?,
    };
    if !owner_id.is_empty() && !owner_id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage(format!(
            "the Telegram user id {owner_id:?} must be digits (ask @userinfobot)"
        )));
    }
    if !owner_id.is_empty() {
        // Telegram's anonymous-admin, channel and service ids are many people.
        crate::ids::refuse_shared_placeholder(
            &format!("telegram:{owner_id}"),
            "linked to the owner",
        )
        .map_err(usage)?;
    }

    if !a.no_test_call {
        let settings = crate::model::ProviderSettings {
            openai_base_url: base_url.clone(),
            openai_api_key: Some(key.clone()).filter(|k| !k.is_empty()),
            anthropic_base_url: base_url.clone(),
            anthropic_api_key: Some(key.clone()).filter(|k| !k.is_empty()),
            ..Default::default()
        };
        match crate::model::probe_endpoint(&settings, &provider).await {
            Some(crate::model::EndpointProbe::Answered(d)) => println!("test call: {d}"),
            Some(crate::model::EndpointProbe::KeyRefused(d)) => {
                return Err((
                    1,
                    format!("test call: {d}: the key is refused; nothing was written"),
                ))
            }
            Some(crate::model::EndpointProbe::Unreachable(d)) => {
                let d = crate::redaction::secrets::scrub_error(&d);
                return Err((1, format!("test call: {d}; nothing was written")));
            }
            None => {}
        }
    }

    if !paths.config.is_file() {
        crate::host::init_with(&a.data_dir, "owner", None)
            .await
            .map_err(|e| (2, format!("{e:#}")))?;
        println!("initialised {}", a.data_dir.display());
    }
    let mut keys: Vec<(&str, Yaml)> = vec![("model", Yaml::from(format!("{provider}:{model}")))];
    let url_key = if provider == "openai" {
        "providers.openai_base_url"
    } else {
        "providers.anthropic_base_url"
    };
    keys.push((url_key, Yaml::from(base_url.as_str())));
    if !telegram.is_empty() {
        keys.push(("adapters.telegram.enabled", Yaml::Bool(true)));
    }
    let settings = crate::config::set_keys(&paths.config, &keys).map_err(|e| (1, e.to_string()))?;
    println!("wrote {}", paths.config.display());
    if !owner_id.is_empty() {
        // The owner's Telegram account is the owner (an identity mapping),
        // allowed to talk to the bot, and the review digest's reader.
        let id = format!("telegram:{owner_id}");
        let owner = settings.owner.clone();
        let at =
            crate::host::store_location(&settings, &paths).map_err(|e| (1, format!("{e:#}")))?;
        let store = crate::storage::Store::open_at(&at).map_err(|e| (1, e.to_string()))?;
        let (i, o) = (id.clone(), owner.clone());
        store
            .write(move |tx| {
                crate::storage::identities::link(tx, &i, &o, "onboard")?;
                crate::storage::pairings::decide(
                    tx,
                    crate::storage::pairings::RuleKind::Sender,
                    "telegram",
                    &i,
                    crate::storage::pairings::Decision::Allowed,
                    "onboard",
                )
            })
            .await
            .map_err(|e| (1, format!("linking {id} to {owner}: {e}")))?;
        crate::config::set_keys(
            &paths.config,
            &[("review.owner", Yaml::from(owner.as_str()))],
        )
        .map_err(|e| (1, e.to_string()))?;
        println!("{id} is now {owner} (a global admin), allowed to talk to the bot, and gets the review digest");
    }

    let env_file = a
        .env_file
        .clone()
        .unwrap_or_else(|| paths.root.join("mercury.env"));
    let mut env = String::new();
    if !key.is_empty() {
        env.push_str(&format!("{key_var}={key}\n"));
    }
    if !telegram.is_empty() {
        env.push_str(&format!("MERCURY_TELEGRAM_BOT_TOKEN={telegram}\n"));
    }
    let _ = std::fs::remove_file(&env_file);
    crate::workspace::data_dir::private_file(&env_file)
        .and_then(|mut f| f.write_all(env.as_bytes()))
        .map_err(|e| (1, format!("writing {}: {e}", env_file.display())))?;
    println!("wrote the keys to {} (mode 0600)", env_file.display());

    let data = std::fs::canonicalize(&a.data_dir).unwrap_or_else(|_| a.data_dir.clone());
    let env_abs = std::fs::canonicalize(&env_file).unwrap_or(env_file.clone());
    if let Some(unit) = &a.unit {
        let text = UNIT
            .replace(
                "EnvironmentFile=-/etc/mercury/env",
                &format!("EnvironmentFile={}", env_abs.display()),
            )
            .replace(
                "--data-dir /var/lib/mercury",
                &format!("--data-dir {}", data.display()),
            );
        std::fs::write(unit, text).map_err(|e| (1, format!("writing {}: {e}", unit.display())))?;
        println!(
            "wrote the systemd unit to {} (its rights: CAP_SYS_ADMIN and CAP_DAC_OVERRIDE, docs/operations.md)",
            unit.display()
        );
    }
    println!(
        "\nnext steps:\n  1. start it: set -a; . {env}; set +a; mercury serve --data-dir {d}\n     (or install the unit: sudo install -m 0644 UNIT /etc/systemd/system/mercury.service; sudo systemctl enable --now mercury)\n  2. check it: mercury doctor --data-dir {d}\n  3. talk to it: MERCURY_DATA_DIR={d} mrctl spaces create family --name Family; mrctl --in family chat hello",
        env = env_abs.display(),
        d = data.display(),
    );
    if !telegram.is_empty() {
        println!(
            "  4. message your bot on Telegram{}",
            if owner_id.is_empty() {
                " (strangers get a pairing code: mrctl pairing list)"
            } else {
                ": you are its admin"
            }
        );
    }
    Ok(())
}
