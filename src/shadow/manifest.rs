//! `SNAPSHOT.json`: what a snapshot is (product version, git revision, the
//! live data dir, time, label, the admin count — never the ids) and the
//! marks the diff and `down` measure from (the last ids of the live rows
//! copied), plus `running.json`, the record of the shadow `up` started.
//!
//! Must never: hold an admin id, a token or a key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{io_err, ShadowError, ShadowResult};

pub const MANIFEST_FILE: &str = "SNAPSHOT.json";
pub const RUNNING_FILE: &str = "running.json";
pub const CURRENT_LINK: &str = "current";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// The snapshot's directory name under the shadow root (its timestamp).
    pub id: String,
    pub product_version: String,
    pub git_revision: String,
    pub live_data_dir: String,
    pub created_at_ms: i64,
    pub created_at: String,
    pub label: Option<String>,
    /// How many admins the shadow has (`--admins`); absent in a manifest
    /// written before the count existed, which `up` refuses.
    pub admin_count: Option<usize>,
    pub live_bind: String,
    pub shadow_bind: String,
    /// The highest row ids copied: everything above is the shadow's own.
    pub marks: Marks,
    pub db_bytes: u64,
    pub files_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Marks {
    pub message_id: i64,
    pub token_usage_id: i64,
    pub run_started_at_ms: i64,
}

impl Manifest {
    pub fn read(snapshot_dir: &Path) -> ShadowResult<Manifest> {
        let path = snapshot_dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(io_err(format!("reading {}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            ShadowError::Invalid(format!(
                "{} is not a snapshot manifest: {e}",
                path.display()
            ))
        })
    }
}

/// The shadow `up` started: which snapshot, which process, where.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Running {
    pub snapshot: String,
    pub data_dir: PathBuf,
    pub pid: u32,
    pub port: u16,
    pub url: String,
    pub started_at_ms: i64,
}

impl Running {
    pub fn path(root: &Path) -> PathBuf {
        root.join(RUNNING_FILE)
    }

    /// None when no shadow is recorded as running.
    pub fn read(root: &Path) -> ShadowResult<Option<Running>> {
        let path = Self::path(root);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                ShadowError::Invalid(format!("{} is not a running record: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
        }
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) is gone for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Is `pid` the shadow host serving `data_dir`? (Never signal a reused pid.)
fn is_shadow_process(pid: u32, data_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let want = data_dir.as_os_str().as_encoded_bytes();
    pid_alive(pid)
        && cmdline.split(|b| *b == 0).any(|arg| arg == want)
        && cmdline.split(|b| *b == 0).any(|arg| arg == b"serve")
}

/// The recorded shadow when it still runs; a stale record is removed.
pub fn running(root: &Path) -> ShadowResult<Option<Running>> {
    match Running::read(root)? {
        Some(r) if is_shadow_process(r.pid, &r.data_dir) => Ok(Some(r)),
        Some(_) => {
            let _ = std::fs::remove_file(Running::path(root));
            Ok(None)
        }
        None => Ok(None),
    }
}
