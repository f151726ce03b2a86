//! `mercury cluster status`: the hosts of a deployment on one PostgreSQL
//! database, what each holds and when it last beat (docs/scale-out.md).
//! Exit codes: 0 shown, 1 the store could not be read, 2 usage (no data
//! dir, or a deployment that is not a cluster).
//!
//! Must never: write to the store (it is read by an operator beside
//! running hosts).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;

use crate::clock::{ms_to_rfc3339, now_ms};
use crate::storage::{leases, Store};
use crate::workspace::DataPaths;

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Hosts, their heartbeats, the spaces and named leases each holds.
    Status {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(command: ClusterCommand) -> ExitCode {
    match command {
        ClusterCommand::Status { data_dir, json } => status(&data_dir, json).await,
    }
}

async fn status(data_dir: &Path, json: bool) -> ExitCode {
    let paths = DataPaths::new(data_dir);
    let settings = match crate::host::load_settings(&paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mercury cluster status: {e:#}");
            return ExitCode::from(2);
        }
    };
    if !settings.cluster.enabled {
        eprintln!(
            "mercury cluster status: {} is one host (cluster.enabled is false); see docs/scale-out.md",
            data_dir.display()
        );
        return ExitCode::from(2);
    }
    let read = async {
        let at = crate::host::store_location(&settings, &paths)?;
        let store = Store::open_at(&at)?;
        let now = now_ms();
        let rows = store
            .read(move |c| Ok((leases::hosts(c, now)?, leases::named_leases(c)?)))
            .await?;
        anyhow::Ok((rows, now))
    }
    .await;
    let ((hosts, named), now) = match read {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mercury cluster status: cannot read the deployment: {e:#}");
            return ExitCode::from(1);
        }
    };
    let lease_ms = i64::try_from(settings.cluster.lease_secs * 1000).unwrap_or(i64::MAX);
    let state = |h: &leases::HostRow| match h.stopped_at {
        Some(_) => "stopped",
        None if now - h.heartbeat_at > lease_ms => "silent",
        None => "up",
    };
    if json {
        let body = json!({
            "hosts": hosts.iter().map(|h| json!({
                "host_id": h.host_id, "name": h.name, "api_url": h.api_url,
                "state": state(h), "started_at": ms_to_rfc3339(h.started_at),
                "heartbeat_at": ms_to_rfc3339(h.heartbeat_at),
                "spaces": h.spaces, "leases": h.named,
            })).collect::<Vec<_>>(),
            "leases": named.iter().map(|l| json!({
                "name": l.name, "host_id": l.host_id, "epoch": l.epoch,
                "held": l.expires_at > now,
            })).collect::<Vec<_>>(),
        });
        println!("{body:#}");
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<24} {:<8} {:<7} {:>6}  {:<22} LEASES",
        "HOST", "STATE", "BEAT", "SPACES", "API"
    );
    for h in &hosts {
        println!(
            "{:<24} {:<8} {:<7} {:>6}  {:<22} {}",
            h.host_id,
            state(h),
            format!("{}s", (now - h.heartbeat_at).max(0) / 1000),
            h.spaces,
            h.api_url,
            if h.named.is_empty() {
                "-".to_owned()
            } else {
                h.named.join(",")
            }
        );
    }
    ExitCode::SUCCESS
}
