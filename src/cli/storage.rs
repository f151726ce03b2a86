//! `mercury storage status|copy`: what the store holds, and moving a
//! stopped SQLite data dir up to an empty PostgreSQL database
//! (docs/storage.md). Exit codes: 0 done, 1 failed while running, 2 usage or
//! refusal (a running host, a target that is not empty).
//!
//! Must never: copy from a data dir a host is serving, or print a password.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::storage::{copy, Location, Store, StoreError};
use crate::workspace::DataPaths;

#[derive(Subcommand, Debug)]
pub enum StorageCommand {
    /// Backend, schema version and each table's rows and size.
    Status {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a stopped data dir's SQLite database into an empty PostgreSQL
    /// database, verifying each table's rows and checksum.
    Copy {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
        /// The target: postgres://USER@HOST:5432/DB (an empty database).
        #[arg(long)]
        to: String,
        /// A file holding the target's password (kept out of the URL).
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
}

pub async fn run(command: StorageCommand) -> ExitCode {
    match command {
        StorageCommand::Status { data_dir, json } => status(&data_dir, json).await,
        StorageCommand::Copy {
            data_dir,
            to,
            password_file,
        } => copy_up(&data_dir, &to, password_file.as_deref()).await,
    }
}

async fn status(data_dir: &Path, json: bool) -> ExitCode {
    let paths = DataPaths::new(data_dir);
    let settings = match crate::host::load_settings(&paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mercury storage status: {e:#}");
            return ExitCode::from(2);
        }
    };
    let location = match crate::host::store_location(&settings, &paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mercury storage status: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Location::Sqlite(db) = &location {
        if !db.exists() {
            eprintln!(
                "mercury storage status: {} has no state.db (run mercury init first)",
                data_dir.display()
            );
            return ExitCode::from(2);
        }
    }
    let result = async {
        let store = Store::open_unmigrated(&location)?;
        store.status().await
    }
    .await;
    match result {
        Ok(s) if json => {
            println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(s) => {
            println!("backend: {}", s.backend);
            println!("at: {}", s.location);
            let note = if s.schema_version == s.latest_version {
                "(current)".to_string()
            } else {
                format!("(this release migrates to {})", s.latest_version)
            };
            println!("schema version: {} {note}", s.schema_version);
            println!("size: {} bytes", s.bytes);
            println!("{:<24} {:>12} {:>14}", "table", "rows", "bytes");
            for t in &s.tables {
                let bytes = t.bytes.map_or_else(|| "-".to_string(), |b| b.to_string());
                println!("{:<24} {:>12} {:>14}", t.name, t.rows, bytes);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mercury storage status: {e}");
            ExitCode::from(1)
        }
    }
}

async fn copy_up(data_dir: &Path, to: &str, password_file: Option<&Path>) -> ExitCode {
    let paths = DataPaths::new(data_dir);
    if !paths.db.exists() {
        eprintln!(
            "mercury storage copy: {} has no state.db to copy",
            data_dir.display()
        );
        return ExitCode::from(2);
    }
    if std::os::unix::net::UnixStream::connect(&paths.socket).is_ok() {
        eprintln!(
            "mercury storage copy: a host is serving {} (its API socket answers): stop it first, so no write is lost",
            data_dir.display()
        );
        return ExitCode::from(2);
    }
    if !(to.starts_with("postgres://") || to.starts_with("postgresql://")) {
        eprintln!(
            "mercury storage copy: --to must be a postgres:// URL (postgres://USER@HOST:5432/DB)"
        );
        return ExitCode::from(2);
    }
    let password = match password_file {
        None => None,
        Some(f) => match std::fs::read_to_string(f) {
            Ok(p) => Some(p.trim_end_matches(['\n', '\r']).to_owned()),
            Err(e) => {
                eprintln!("mercury storage copy: reading {}: {e}", f.display());
                return ExitCode::from(2);
            }
        },
    };
    let target = Location::Postgres {
        url: to.to_owned(),
        password,
    };
    let result = async {
        // Bring the source to this release's schema first (the host would).
        drop(Store::open(&paths.db)?);
        let store = Store::open_at(&target)?;
        let copied = copy::copy_sqlite_into(&paths.db, &store).await?;
        Ok::<_, StoreError>((store.describe(), copied))
    }
    .await;
    match result {
        Ok((at, copied)) => {
            for t in &copied {
                println!(
                    "{:<24} {:>10} rows  checksum {}",
                    t.name, t.rows, t.checksum
                );
            }
            let rows: i64 = copied.iter().map(|t| t.rows).sum();
            println!(
                "copied {} tables, {rows} rows, into {at}; every count and checksum matched",
                copied.len()
            );
            println!(
                "next: set storage.backend: postgres and storage.url (or MERCURY_STORAGE_URL) in {}, then start the host",
                paths.config.display()
            );
            ExitCode::SUCCESS
        }
        Err(e @ (StoreError::Conflict(_) | StoreError::Invalid(_))) => {
            eprintln!("mercury storage copy: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("mercury storage copy: {e}");
            ExitCode::from(1)
        }
    }
}
