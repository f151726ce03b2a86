//! `mercury ext add|list|remove|image`: the operator installs extensions on
//! a data dir (docs/extensions.md) and builds a `stdio` server's runtime
//! image for the docker backend; a space only enables what is installed
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
    /// Build TAG, a stdio server's runtime image for the docker backend, from
    /// host paths (a virtualenv, the interpreter's library): what their links
    /// lead to and their ELF files' libraries come along. Nothing is pulled.
    Image {
        /// The image reference a manifest's `image` names, e.g. mercury-ext-time:1.
        tag: String,
        /// A host directory or file to copy at the same path (repeatable).
        #[arg(long = "path", required = true)]
        paths: Vec<PathBuf>,
        /// Build on every engine this data dir's config names (each must
        /// answer); without it, the local engine.
        #[arg(long, env = "MERCURY_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

/// The commands on an installed data dir, once it is open.
enum OnDataDir {
    Add(PathBuf),
    List,
    Remove(String),
}

/// `mercury ext image`: needs an engine; a data dir only to name its engines.
async fn build_image(tag: &str, paths: &[PathBuf], data_dir: Option<&Path>) -> ExitCode {
    if !crate::extensions::manifest::is_image_reference(tag) {
        eprintln!("mercury ext image: refused: {tag:?} is not a plain image reference (name[:tag], lowercase)");
        return ExitCode::from(2);
    }
    if let Err(e) = crate::sandbox::runtime_image::check_paths(paths) {
        eprintln!("mercury ext image: refused: {e}");
        return ExitCode::from(2);
    }
    let engines = match crate::host::containers::engines_of(data_dir).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("mercury ext image: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match engines.build_runtime_image(tag, paths).await {
        Ok(n) => {
            println!("built {tag} ({n} entries)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mercury ext image: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn open(data_dir: &Path) -> Result<Store, String> {
    let paths = DataPaths::new(data_dir);
    let settings = crate::host::load_settings(&paths).map_err(|e| format!("{e:#}"))?;
    let location = crate::host::store_location(&settings, &paths).map_err(|e| format!("{e:#}"))?;
    Store::open_at(&location).map_err(|e| e.to_string())
}

pub async fn run(command: ExtCommand) -> ExitCode {
    let (data_dir, action) = match command {
        // The one command that needs an engine, not a data dir.
        ExtCommand::Image {
            tag,
            paths,
            data_dir,
        } => return build_image(&tag, &paths, data_dir.as_deref()).await,
        ExtCommand::Add { path, data_dir } => (data_dir, OnDataDir::Add(path)),
        ExtCommand::List { data_dir } => (data_dir, OnDataDir::List),
        ExtCommand::Remove { name, data_dir } => (data_dir, OnDataDir::Remove(name)),
    };
    let store = match open(&data_dir).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mercury ext: {e}");
            return ExitCode::from(2);
        }
    };
    let extensions_dir = data_dir.join("extensions");
    match action {
        OnDataDir::Add(path) => {
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
        OnDataDir::List => match store.read(rows::list).await {
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
        OnDataDir::Remove(name) => {
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
