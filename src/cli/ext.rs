//! `mercury ext add|list|remove`: the operator installs extensions on a
//! data dir (docs/extensions.md); a space only enables what is installed
//! (`mrctl ext enable`). Exit codes: 0 done, 1 failed while running, 2 usage
//! or refusal (a bad manifest, named by its field).
//!
//! Must never: install a manifest that does not pass its checks.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::storage::{extensions as rows, Store};
use crate::workspace::DataPaths;

#[derive(Subcommand, Debug)]
pub enum ExtCommand {
    /// Check PATH/extension.toml and install the extension (or replace it).
    Add {
        /// The extension's directory.
        path: PathBuf,
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// The installed extensions, with their servers.
    List {
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Remove an extension, every space's enablement of it and its state.
    Remove {
        name: String,
        #[arg(long, default_value = "./mercury-data", env = "MERCURY_DATA_DIR")]
        data_dir: PathBuf,
    },
}

async fn open(data_dir: &Path) -> Result<Store, String> {
    let paths = DataPaths::new(data_dir);
    let settings = crate::host::load_settings(&paths).map_err(|e| format!("{e:#}"))?;
    let location = crate::host::store_location(&settings, &paths).map_err(|e| format!("{e:#}"))?;
    Store::open_at(&location).map_err(|e| e.to_string())
}

pub async fn run(command: ExtCommand) -> ExitCode {
    let data_dir = match &command {
        ExtCommand::Add { data_dir, .. }
        | ExtCommand::List { data_dir }
        | ExtCommand::Remove { data_dir, .. } => data_dir.clone(),
    };
    let store = match open(&data_dir).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mercury ext: {e}");
            return ExitCode::from(2);
        }
    };
    let extensions_dir = data_dir.join("extensions");
    match command {
        ExtCommand::Add { path, .. } => {
            match crate::extensions::install(&store, &extensions_dir, &path).await {
                Ok(name) => {
                    println!("installed {name}");
                    ExitCode::SUCCESS
                }
                Err(e @ crate::extensions::ExtensionError::Manifest(_)) => {
                    eprintln!("mercury ext add: refused: {e}");
                    ExitCode::from(2)
                }
                Err(e) => {
                    eprintln!("mercury ext add: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        ExtCommand::List { .. } => match store.read(rows::list).await {
            Ok(list) => {
                for row in list {
                    let servers = crate::extensions::manifest::parse(&row.name, &row.manifest)
                        .map(|m| {
                            m.servers
                                .iter()
                                .map(|(id, s)| format!("{id}({:?})", s.transport).to_lowercase())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_else(|e| format!("bad manifest: {e}"));
                    println!("{}\t{servers}", row.name);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mercury ext list: {e}");
                ExitCode::FAILURE
            }
        },
        ExtCommand::Remove { name, .. } => {
            match crate::extensions::uninstall(&store, &extensions_dir, &name).await {
                Ok(true) => {
                    println!("removed {name}");
                    ExitCode::SUCCESS
                }
                Ok(false) => {
                    eprintln!("mercury ext remove: {name} is not installed");
                    ExitCode::from(2)
                }
                Err(e) => {
                    eprintln!("mercury ext remove: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
