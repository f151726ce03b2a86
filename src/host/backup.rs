//! `mercury backup --to FILE` and `mercury restore --from FILE`: one archive
//! (tar, 0600) of a data dir while its host serves: the database as one
//! consistent copy (`VACUUM INTO`), the workspaces, the scripted model
//! files, the review reports and `mercury.yaml`. Secrets (the API tokens'
//! rows, the dashboard's sign-ins, `global/owner.token`) stay out unless
//! `--with-secrets`; a restore without them mints a new owner token.
//!
//! Must never: overwrite a file or restore into a data dir that holds
//! anything, leave a partial archive under the name asked for, follow a
//! symlink of the data dir, or unpack an archive entry that is not a plain
//! file or directory below the new data dir.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config;
use crate::shadow::snapshot::copy_dirs;
use crate::storage::{snapshot, tokens, Store};
use crate::workspace::data_dir::{private_dir, private_file};
use crate::workspace::DataPaths;

/// What the archive says about itself (`backup.json`, its first entry).
#[derive(Debug, Serialize, Deserialize)]
pub struct BackupManifest {
    pub product_version: String,
    pub created_at: String,
    pub source_data_dir: String,
    pub with_secrets: bool,
}

const MANIFEST: &str = "backup.json";

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The operator's "no": exit 2, one sentence.
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Store {
        context: String,
        #[source]
        source: crate::storage::StoreError,
    },
    #[error(transparent)]
    Shadow(#[from] crate::shadow::ShadowError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackupError {
    let context = context.into();
    move |source| BackupError::Io { context, source }
}

fn db_err(context: impl Into<String>) -> impl FnOnce(crate::storage::StoreError) -> BackupError {
    let context = context.into();
    move |source| BackupError::Store { context, source }
}

/// What a backup wrote.
#[derive(Debug)]
pub struct BackupReport {
    pub file: PathBuf,
    pub bytes: u64,
    pub with_secrets: bool,
}

/// Archives `data_dir` into the new file `to`. Blocking.
pub fn backup(data_dir: &Path, to: &Path, with_secrets: bool) -> Result<BackupReport, BackupError> {
    let live = DataPaths::new(data_dir);
    if !live.config.is_file() {
        return Err(BackupError::Refused(format!(
            "{} is not a data dir (no mercury.yaml)",
            data_dir.display()
        )));
    }
    let settings = config::load(&live.config, &Default::default())?;
    if settings.storage.backend == config::StorageBackend::Postgres {
        return Err(BackupError::Refused(
            "this deployment keeps its state in PostgreSQL: back the database up with the server's own tools (pg_dump), and the data dir's files beside it".into(),
        ));
    }
    if !live.db.is_file() {
        return Err(BackupError::Refused(format!(
            "{} has no state.db",
            data_dir.display()
        )));
    }
    if to.exists() {
        return Err(BackupError::Refused(format!(
            "{} exists: a backup never overwrites a file",
            to.display()
        )));
    }
    let parent = match to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = std::fs::canonicalize(&parent)
        .map_err(|_| BackupError::Refused(format!("{} does not exist", parent.display())))?;
    let root = std::fs::canonicalize(data_dir).map_err(io("resolving the data dir"))?;
    if parent.starts_with(&root) {
        return Err(BackupError::Refused(
            "the backup must be written outside the data dir it copies".into(),
        ));
    }
    // Staged beside the target (one file system), renamed into place whole.
    let staging = tempfile::Builder::new()
        .prefix(".mercury-backup-")
        .tempdir_in(&parent)
        .map_err(io(format!(
            "creating a staging directory in {}",
            parent.display()
        )))?;
    let stage = DataPaths::new(staging.path());
    let db = stage.db.to_str().ok_or_else(|| {
        BackupError::Refused(format!("{} is not a UTF-8 path", stage.db.display()))
    })?;
    snapshot::copy_into(&live.db, db).map_err(db_err("copying the database"))?;
    if !with_secrets {
        snapshot::replace_tokens(&stage.db, |_| Ok(()))
            .map_err(db_err("leaving the API tokens out of the copy"))?;
    }
    let limits = (&settings.workspace).into();
    for (from, to_dir) in [
        (live.spaces.clone(), stage.spaces.clone()),
        (live.reviews.clone(), stage.reviews.clone()),
        (
            crate::workspace::data_dir::models_dir(&live),
            crate::workspace::data_dir::models_dir(&stage),
        ),
    ] {
        private_dir(&to_dir).map_err(io(format!("creating {}", to_dir.display())))?;
        if from.is_dir() {
            copy_dirs(&from, &to_dir, false, "data", limits)?;
        }
    }
    std::fs::copy(&live.config, &stage.config).map_err(io("copying mercury.yaml"))?;
    if with_secrets && live.owner_token().is_file() {
        private_dir(&stage.global).map_err(io("creating global/"))?;
        std::fs::copy(live.owner_token(), stage.owner_token())
            .map_err(io("copying global/owner.token"))?;
    }
    let manifest = BackupManifest {
        product_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at: chrono::Utc::now().to_rfc3339(),
        source_data_dir: root.display().to_string(),
        with_secrets,
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io("writing backup.json")(std::io::Error::other(e)))?;
    std::fs::write(staging.path().join(MANIFEST), json).map_err(io("writing backup.json"))?;

    let partial = parent.join(format!(
        ".{}.partial",
        to.file_name().and_then(|n| n.to_str()).unwrap_or("backup")
    ));
    let file = private_file(&partial).map_err(io(format!("creating {}", partial.display())))?;
    let written = (|| -> std::io::Result<std::fs::File> {
        let mut tar = tar::Builder::new(file);
        tar.follow_symlinks(false);
        tar.append_path_with_name(staging.path().join(MANIFEST), MANIFEST)?;
        for entry in std::fs::read_dir(staging.path())? {
            let entry = entry?;
            let name = entry.file_name();
            if name == MANIFEST {
                continue;
            }
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                tar.append_dir_all(&name, &path)?;
            } else {
                tar.append_path_with_name(&path, &name)?;
            }
        }
        let mut f = tar.into_inner()?;
        f.flush()?;
        f.sync_all()?;
        Ok(f)
    })();
    match written {
        Ok(f) => {
            let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
            std::fs::rename(&partial, to).map_err(io(format!("naming {}", to.display())))?;
            Ok(BackupReport {
                file: to.to_path_buf(),
                bytes,
                with_secrets,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(io(format!("writing {}", partial.display()))(e))
        }
    }
}

/// What a restore made.
#[derive(Debug)]
pub struct RestoreReport {
    pub data_dir: PathBuf,
    pub spaces: usize,
    /// A new owner token was minted (the backup had no secrets).
    pub new_owner_token: bool,
    pub backup: BackupManifest,
}

/// Unpacks the archive `from` into the new (or empty) data dir `into`.
/// Blocking, but opens the restored store: call it off the async runtime's
/// workers (`spawn_blocking`).
pub async fn restore(from: &Path, into: &Path) -> Result<RestoreReport, BackupError> {
    match std::fs::read_dir(into) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::Refused(format!(
                    "{} is not empty: a restore makes a new data dir and never mixes with one",
                    into.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(format!("reading {}", into.display()))(e)),
    }
    let file = std::fs::File::open(from)
        .map_err(|e| BackupError::Refused(format!("cannot open {}: {e}", from.display())))?;
    private_dir(into).map_err(io(format!("creating {}", into.display())))?;
    let unpacked = unpack(file, into);
    let result = match unpacked {
        Ok(()) => finish(into).await,
        Err(e) => Err(e),
    };
    if result.is_err() {
        // Nothing half-restored is left to be served.
        if let Ok(entries) = std::fs::read_dir(into) {
            for e in entries.flatten() {
                let p = e.path();
                let _ = if p.is_dir() && !p.is_symlink() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
    result
}

fn unpack(file: std::fs::File, into: &Path) -> Result<(), BackupError> {
    let mut archive = tar::Archive::new(file);
    archive.set_preserve_permissions(false);
    archive.set_overwrite(false);
    let bad = |m: String| BackupError::Refused(format!("not a Mercury backup: {m}"));
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        if !path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(bad(format!(
                "the entry {} leaves the data dir",
                path.display()
            )));
        }
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Directory => {}
            other => {
                return Err(bad(format!(
                    "the entry {} is a {other:?}, not a file or directory",
                    path.display()
                )))
            }
        }
        entry
            .unpack_in(into)
            .map_err(io(format!("unpacking {}", path.display())))?;
    }
    Ok(())
}

async fn finish(into: &Path) -> Result<RestoreReport, BackupError> {
    let paths = DataPaths::new(into);
    let manifest: BackupManifest = std::fs::read(into.join(MANIFEST))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| BackupError::Refused("not a Mercury backup: no backup.json".into()))?;
    if !paths.db.is_file() || !paths.config.is_file() {
        return Err(BackupError::Refused(
            "not a Mercury backup: no state.db or mercury.yaml".into(),
        ));
    }
    let settings = config::load(&paths.config, &Default::default())?;
    // The data dir's modes, exactly, whatever the umask unpacked them with.
    for e in walkdir::WalkDir::new(into).follow_links(false) {
        let e = e.map_err(|e| io("setting the restored modes")(e.into()))?;
        use std::os::unix::fs::PermissionsExt;
        let mode = match e.file_type() {
            t if t.is_dir() => crate::workspace::data_dir::DIR_MODE,
            t if t.is_file() => crate::workspace::data_dir::FILE_MODE,
            _ => continue,
        };
        std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("setting the mode of {}", e.path().display())))?;
    }
    for d in [&paths.spaces, &paths.reviews, &paths.global] {
        private_dir(d).map_err(io(format!("creating {}", d.display())))?;
    }
    // Migrated to this release's schema as the host would on its start.
    let store = Store::open(&paths.db).map_err(db_err("opening the restored database"))?;
    let spaces = store
        .read(crate::storage::spaces::list_spaces)
        .await
        .map_err(db_err("reading the restored spaces"))?
        .len();
    let new_owner_token = !paths.owner_token().is_file();
    if new_owner_token {
        let owner = settings.owner.clone();
        let (_, secret) = store
            .write(move |tx| {
                tokens::mint(
                    tx,
                    &tokens::NewToken {
                        caller_id: &owner,
                        kind: tokens::TokenKind::User,
                        space_id: None,
                        run_id: None,
                        label: Some("owner (mercury restore)"),
                        created_by: Some(crate::ids::SYSTEM_CALLER),
                        expires_at: None,
                        role: None,
                        read_only: false,
                    },
                )
            })
            .await
            .map_err(db_err("minting the owner token"))?;
        private_file(&paths.owner_token())
            .and_then(|mut f| f.write_all(secret.as_bytes()))
            .map_err(io("writing global/owner.token"))?;
    }
    std::fs::remove_file(into.join(MANIFEST)).map_err(io("removing backup.json"))?;
    Ok(RestoreReport {
        data_dir: into.to_path_buf(),
        spaces,
        new_owner_token,
        backup: manifest,
    })
}
