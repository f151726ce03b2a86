//! `mercury shadow …`: snapshot, prune, up, down, status, logs, diff and
//! `auth set-key` (docs/shadow.md). Refusals exit 2 with one sentence,
//! failures while running exit 1.
//!
//! Must never: print a key, a token or an admin id.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::shadow::guard::{parse_duration, parse_size};
use crate::shadow::{root_from, ShadowError};

#[derive(Subcommand, Debug)]
pub enum ShadowCommand {
    /// Copy a live data dir into <root>/<timestamp>/ while it serves.
    Snapshot {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// The shadow's admins (caller ids, comma-separated); default none, never inherited.
        #[arg(long, value_delimiter = ',')]
        admins: Vec<String>,
        #[arg(long)]
        label: Option<String>,
        /// The shadow's port (default: the live port + 1).
        #[arg(long)]
        port: Option<u16>,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// Remove all but the newest N snapshots (never the running one).
    Prune {
        #[arg(long, default_value_t = 3)]
        keep: usize,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// Start the shadow host on a snapshot (refuses, exit 2, when unsafe).
    Up {
        #[arg(long, default_value = "current")]
        snapshot: String,
        #[arg(long, default_value = "24h")]
        max_age: String,
        #[arg(long, default_value = "512M")]
        min_free_mem: String,
        #[arg(long, default_value = "1G")]
        min_free_disk: String,
        /// No live scheduled task may be due within this window.
        #[arg(long, default_value = "30m")]
        window: String,
        /// Serve the shadow on this port instead of its snapshot's.
        #[arg(long)]
        port: Option<u16>,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// Stop the shadow host and print its cost.
    Down {
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// The running shadow: snapshot, age, admin count, pid, port, uptime.
    Status {
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// The shadow host's log.
    Logs {
        #[arg(short = 'f', long)]
        follow: bool,
        #[arg(long)]
        snapshot: Option<String>,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// The snapshot vs the shadow now: rows, messages, runs, files, sends,
    /// every line through the review's redactor and identifier gate.
    Diff {
        #[arg(long)]
        space: Option<String>,
        #[arg(long)]
        json: bool,
        /// Print every line as stored, unredacted: only for a global admin
        /// of the shadow, by its token in MERCURY_TOKEN.
        #[arg(long)]
        raw: bool,
        /// Also list every added message, 50 a page: page N (from 1).
        #[arg(long, value_name = "N")]
        messages_page: Option<usize>,
        #[arg(long, default_value = "current")]
        snapshot: String,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// Copy one rehearsed file into the live workspace, through the live
    /// host's audited file write, only if the live file is still what the
    /// snapshot saw (If-Match its hash; for a file the rehearsal added,
    /// only if the live has none). A file the rehearsal deleted is deleted.
    Promote {
        /// SPACE/PATH, as `mercury shadow diff` lists it (family/AGENTS.md).
        #[arg(long, value_name = "SPACE/PATH")]
        file: String,
        #[arg(long, default_value = "current")]
        snapshot: String,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
    /// The shadow's own model credential.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Read a key for PROVIDER (openai, anthropic) from stdin into <root>/auth/.
    SetKey {
        provider: String,
        #[arg(long, env = "MERCURY_SHADOW_ROOT")]
        root: Option<PathBuf>,
    },
}

fn exit_for(cmd: &str, e: &ShadowError) -> ExitCode {
    eprintln!("mercury shadow {cmd}: {e}");
    ExitCode::from(if matches!(e, ShadowError::Refused(_)) {
        2
    } else {
        1
    })
}

fn root(explicit: Option<PathBuf>) -> Result<PathBuf, ShadowError> {
    root_from(explicit.as_deref(), std::env::var("HOME").ok().as_deref())
}

/// The live host's database when it is a PostgreSQL server: resolved from
/// its config file and this environment as the live host resolves it
/// (`MERCURY_STORAGE_*`, the password file). `None` for SQLite, whose file
/// the snapshot finds in the data dir itself.
fn live_store_of(data_dir: &std::path::Path) -> anyhow::Result<Option<crate::storage::Location>> {
    let paths = crate::workspace::DataPaths::new(data_dir);
    if !paths.config.is_file() {
        return Ok(None);
    }
    let settings = crate::host::load_settings(&paths)?;
    Ok(match crate::host::store_location(&settings, &paths)? {
        at @ crate::storage::Location::Postgres { .. } => Some(at),
        crate::storage::Location::Sqlite(_) => None,
    })
}

/// Keys whose values are ids of people: said to differ, never printed.
const UNSHOWN: &[&str] = &["admins", "owner", "review.owner", "review.owner_names"];

/// `shadow up`'s list of every setting that differs from the live host's.
fn render_differences(diffs: &Result<Vec<crate::shadow::settings::Difference>, String>) -> String {
    match diffs {
        Err(why) => format!("  settings: the live host's could not be read ({why})\n"),
        Ok(d) if d.is_empty() => "  settings: the same as the live host's\n".to_owned(),
        Ok(d) => {
            let mut out = format!(
                "  settings that differ from the live host's ({}):\n",
                d.len()
            );
            for (key, live, shadow) in d {
                if UNSHOWN.contains(&key.as_str()) {
                    out.push_str(&format!("    {key}: differs (not shown)\n"));
                } else {
                    out.push_str(&format!("    {key}: {shadow} (live: {live})\n"));
                }
            }
            out
        }
    }
}

fn usage(cmd: &str, m: String) -> ExitCode {
    eprintln!("mercury shadow {cmd}: {m}");
    ExitCode::from(2)
}

pub async fn run(cmd: ShadowCommand) -> ExitCode {
    match cmd {
        ShadowCommand::Snapshot {
            data_dir,
            admins,
            label,
            port,
            root: r,
        } => {
            let root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("snapshot", &e),
            };
            let live_store = match live_store_of(&data_dir) {
                Ok(at) => at,
                Err(e) => {
                    eprintln!("mercury shadow snapshot: {e:#}");
                    return ExitCode::from(1);
                }
            };
            let opts = crate::shadow::snapshot::SnapshotOptions {
                live_data_dir: data_dir,
                root,
                admins: admins
                    .into_iter()
                    .filter(|a| !a.trim().is_empty())
                    .collect(),
                label,
                port,
                progress: true,
                live_store,
            };
            let res =
                tokio::task::spawn_blocking(move || crate::shadow::snapshot::take(&opts)).await;
            match res {
                Ok(Ok(out)) => {
                    let m = &out.manifest;
                    println!("snapshot {} at {}", m.id, out.dir.display());
                    println!(
                        "  {} MB database, {} MB files, {:.2} s; admins: {}; shadow bind {}",
                        m.db_bytes >> 20,
                        m.files_bytes >> 20,
                        out.seconds,
                        m.admin_count.unwrap_or(0),
                        m.shadow_bind
                    );
                    println!(
                        "  shadow owner token: {}/global/owner.token",
                        out.dir.display()
                    );
                    ExitCode::SUCCESS
                }
                Ok(Err(e)) => exit_for("snapshot", &e),
                Err(e) => {
                    eprintln!("mercury shadow snapshot: {e}");
                    ExitCode::from(1)
                }
            }
        }
        ShadowCommand::Prune { keep, root: r } => {
            match root(r).and_then(|root| crate::shadow::snapshot::prune(&root, keep)) {
                Ok(removed) => {
                    for id in &removed {
                        println!("removed {id}");
                    }
                    println!("{} snapshot(s) removed", removed.len());
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("prune", &e),
            }
        }
        ShadowCommand::Up {
            snapshot,
            max_age,
            min_free_mem,
            min_free_disk,
            window,
            port,
            root: r,
        } => {
            let parsed = (|| {
                Ok::<_, String>(crate::host::shadow::UpOptions {
                    root: PathBuf::new(),
                    snapshot,
                    max_age_ms: parse_duration(&max_age).map_err(|m| format!("--max-age: {m}"))?,
                    min_free_mem: parse_size(&min_free_mem)
                        .map_err(|m| format!("--min-free-mem: {m}"))?,
                    min_free_disk: parse_size(&min_free_disk)
                        .map_err(|m| format!("--min-free-disk: {m}"))?,
                    window_ms: parse_duration(&window).map_err(|m| format!("--window: {m}"))?,
                    port,
                })
            })();
            let mut opts = match parsed {
                Ok(o) => o,
                Err(m) => return usage("up", m),
            };
            opts.root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("up", &e),
            };
            match crate::host::shadow::up(&opts).await {
                Ok(started) => {
                    let (rec, m) = (&started.running, &started.manifest);
                    println!(
                        "shadow up: snapshot {} (admins: {}) on {}, pid {}",
                        rec.snapshot,
                        m.admin_count.unwrap_or(0),
                        rec.url,
                        rec.pid
                    );
                    println!(
                        "  owner token: {}/global/owner.token",
                        rec.data_dir.display()
                    );
                    println!(
                        "  log: {}",
                        crate::host::shadow::log_path(&rec.data_dir).display()
                    );
                    print!("{}", render_differences(&started.differences));
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("up", &e),
            }
        }
        ShadowCommand::Down { root: r } => {
            let root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("down", &e),
            };
            match crate::host::shadow::down(&root).await {
                Ok(d) => {
                    println!(
                        "shadow down: snapshot {}: {} run(s), {} tokens in / {} out, cost {}",
                        d.snapshot,
                        d.runs,
                        d.tokens_in,
                        d.tokens_out,
                        crate::spend::format_amount(d.cost, &d.currency)
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("down", &e),
            }
        }
        ShadowCommand::Status { root: r } => {
            match root(r).and_then(|root| crate::host::shadow::status(&root)) {
                Ok((s, running)) => {
                    print!("{s}");
                    // 3 like `mercury status` with no host: scripts can ask "is one up?".
                    if running {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(3)
                    }
                }
                Err(e) => exit_for("status", &e),
            }
        }
        ShadowCommand::Logs {
            follow,
            snapshot,
            root: r,
        } => {
            let root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("logs", &e),
            };
            match crate::host::shadow::logs(&root, snapshot.as_deref(), follow).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => exit_for("logs", &e),
            }
        }
        ShadowCommand::Promote {
            file,
            snapshot,
            root: r,
        } => {
            let root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("promote", &e),
            };
            let token = std::env::var("MERCURY_TOKEN")
                .ok()
                .filter(|t| !t.trim().is_empty());
            match crate::host::promote::promote_file(&root, &snapshot, &file, token).await {
                Ok(p) => {
                    println!(
                        "promoted {}/{}: {} in the live workspace through its audited file write ({} -> {})",
                        p.space,
                        p.path,
                        p.action,
                        p.before.as_deref().unwrap_or("new"),
                        p.after.as_deref().unwrap_or("gone"),
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("promote", &e),
            }
        }
        ShadowCommand::Diff {
            space,
            json,
            raw,
            messages_page,
            snapshot,
            root: r,
        } => {
            let res = root(r).and_then(|root| {
                let dir = crate::shadow::snapshot::resolve(&root, &snapshot)?;
                if raw {
                    let token = std::env::var("MERCURY_TOKEN").ok();
                    crate::shadow::diff::raw_allowed(&dir, token.as_deref())?;
                    crate::shadow::diff::diff_paged(&dir, space.as_deref(), messages_page)
                } else {
                    crate::shadow::diff::diff_redacted(&dir, space.as_deref(), messages_page)
                }
            });
            match res {
                Ok(report) => {
                    if report.raw {
                        eprintln!(
                            "mercury shadow diff: --raw: printing every line as stored, not redacted"
                        );
                    }
                    if json {
                        match serde_json::to_string_pretty(&report) {
                            Ok(s) => println!("{s}"),
                            Err(e) => {
                                eprintln!("mercury shadow diff: {e}");
                                return ExitCode::from(1);
                            }
                        }
                    } else {
                        print!("{}", crate::shadow::diff::render(&report));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("diff", &e),
            }
        }
        ShadowCommand::Auth {
            command: AuthCommand::SetKey { provider, root: r },
        } => {
            let root = match root(r) {
                Ok(r) => r,
                Err(e) => return exit_for("auth set-key", &e),
            };
            let mut secret = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut secret) {
                eprintln!("mercury shadow auth set-key: reading stdin: {e}");
                return ExitCode::from(1);
            }
            match crate::shadow::credential::set_key(&root, &provider, &secret) {
                Ok(path) => {
                    println!(
                        "the shadow's {provider} key is in {} (mode 0600)",
                        path.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => exit_for("auth set-key", &e),
            }
        }
    }
}
