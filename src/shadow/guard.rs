//! The guards of a shadow: the data-dir guard every host start passes
//! (a shadow serves only under the shadow root; a snapshot serves only as a
//! shadow), and the refusals of `mercury shadow up`, each a pure function of
//! facts the host gathered, so each is tested on its own.
//!
//! Must never: allow on an unknown state (a question it cannot answer is a
//! refusal), or name an admin id in a sentence.

use std::path::Path;

use super::manifest::{Manifest, MANIFEST_FILE};
use super::{ShadowError, ShadowResult};
use crate::config::Settings;

/// Refuses a start whose data dir does not fit its mode. `data_dir` is
/// canonical. In shadow mode it must lie strictly under `shadow_root` (the
/// flag alone protects people, not the live database); a data dir holding a
/// snapshot manifest serves only in shadow mode.
pub fn check_data_dir(settings: &Settings, data_dir: &Path) -> ShadowResult<()> {
    if settings.shadow {
        if settings.shadow_root.is_empty() {
            return Err(ShadowError::Refused(format!(
                "shadow mode is on but shadow_root (MERCURY_SHADOW_ROOT) is not set, so {} cannot be shown to be a shadow's data dir",
                data_dir.display()
            )));
        }
        let root = std::fs::canonicalize(&settings.shadow_root).map_err(|_| {
            ShadowError::Refused(format!(
                "the shadow root {} does not exist, so {} cannot be under it",
                settings.shadow_root,
                data_dir.display()
            ))
        })?;
        if data_dir == root || !data_dir.starts_with(&root) {
            return Err(ShadowError::Refused(format!(
                "shadow mode refuses to serve {}: it is not under the shadow root {}",
                data_dir.display(),
                root.display()
            )));
        }
    } else if data_dir.join(MANIFEST_FILE).exists() {
        return Err(ShadowError::Refused(format!(
            "{} is a shadow snapshot (it holds {MANIFEST_FILE}) and serves only with shadow: true",
            data_dir.display()
        )));
    }
    Ok(())
}

/// What `up` found out before starting a shadow.
#[derive(Debug, Clone)]
pub struct UpFacts {
    pub now_ms: i64,
    pub max_age_ms: i64,
    pub free_mem_bytes: Option<u64>,
    pub min_free_mem_bytes: u64,
    pub free_disk_bytes: Option<u64>,
    pub min_free_disk_bytes: u64,
    /// Containers of the live instance that are running now (None: unknown).
    pub live_containers_running: Option<usize>,
    /// The earliest due time of an active live task (Some(None): none due,
    /// None: unknown — the live database could not be read, or a task has no
    /// next run time).
    pub live_next_due_ms: Option<Option<i64>>,
    pub window_ms: i64,
    /// The agent image the shadow would run, when it runs docker: (tag, present).
    pub image: Option<(String, bool)>,
    /// The shadow's port and whether it can be bound.
    pub port: u16,
    pub port_free: bool,
    /// Providers of the shadow's chain that have no shadow key.
    pub providers_without_key: Vec<String>,
    /// A shadow is running already (its snapshot id).
    pub already_running: Option<String>,
}

/// The first refusal of [`check_up`], on its own: `up` asks it before it
/// gathers the other facts.
pub fn check_not_running(already_running: Option<&str>) -> ShadowResult<()> {
    match already_running {
        Some(id) => Err(ShadowError::Refused(format!(
            "a shadow is running already (snapshot {id}); run `mercury shadow down` first"
        ))),
        None => Ok(()),
    }
}

/// The first refusal of `up` (one sentence), in a fixed order, or Ok.
pub fn check_up(manifest: &Manifest, facts: &UpFacts) -> ShadowResult<()> {
    let refuse = |s: String| Err(ShadowError::Refused(s));
    check_not_running(facts.already_running.as_deref())?;
    let Some(_) = manifest.admin_count else {
        return refuse(format!(
            "snapshot {} records no admin count; take a new snapshot (`mercury shadow snapshot --admins …`)",
            manifest.id
        ));
    };
    let age = facts.now_ms - manifest.created_at_ms;
    if age > facts.max_age_ms {
        return refuse(format!(
            "snapshot {} is {} old, older than --max-age {}; take a new one",
            manifest.id,
            human_duration(age),
            human_duration(facts.max_age_ms)
        ));
    }
    match facts.free_mem_bytes {
        Some(m) if m >= facts.min_free_mem_bytes => {}
        Some(m) => {
            return refuse(format!(
                "only {} MB of memory is free, under --min-free-mem {} MB",
                m >> 20,
                facts.min_free_mem_bytes >> 20
            ))
        }
        None => return refuse("free memory cannot be read from /proc/meminfo".into()),
    }
    match facts.free_disk_bytes {
        Some(d) if d >= facts.min_free_disk_bytes => {}
        Some(d) => {
            return refuse(format!(
                "only {} MB of disk is free under the shadow root, under --min-free-disk {} MB",
                d >> 20,
                facts.min_free_disk_bytes >> 20
            ))
        }
        None => return refuse("free disk space under the shadow root cannot be read".into()),
    }
    match facts.live_containers_running {
        Some(0) => {}
        Some(n) => {
            return refuse(format!(
                "the live instance is running a turn ({n} container{} carry its instance label); try again when it is idle",
                if n == 1 { "" } else { "s" }
            ))
        }
        None => {
            return refuse(
                "whether the live instance is running a turn cannot be told (the Docker engine did not answer)".into(),
            )
        }
    }
    match facts.live_next_due_ms {
        Some(None) => {}
        Some(Some(due)) if due > facts.now_ms + facts.window_ms => {}
        Some(Some(due)) => {
            return refuse(format!(
                "a live scheduled task is due in {}, within --window {}",
                human_duration((due - facts.now_ms).max(0)),
                human_duration(facts.window_ms)
            ))
        }
        None => {
            return refuse(
                "when the live scheduled tasks are due is unknown (a task has no next run time, or the live database cannot be read)".into(),
            )
        }
    }
    if let Some((tag, false)) = &facts.image {
        return refuse(format!(
            "the agent image {tag} is missing; build it with `mercury image build` (up never builds one)"
        ));
    }
    if !facts.port_free {
        return refuse(format!(
            "port {} is taken; free it or give --port",
            facts.port
        ));
    }
    if let Some(p) = facts.providers_without_key.first() {
        return refuse(format!(
            "the shadow's model chain uses {p} but the shadow has no {p} key (set MERCURY_SHADOW_{}_API_KEY or run `mercury shadow auth set-key {p}`)",
            p.to_uppercase()
        ));
    }
    Ok(())
}

/// `3h 4m`, `12m`, `45s`.
pub fn human_duration(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m")
    } else {
        format!("{s}s")
    }
}

/// `24h`, `30m`, `90s`, `2d` → milliseconds.
pub fn parse_duration(raw: &str) -> Result<i64, String> {
    // One duration grammar for every flag (`30m`, `24h`, `2d`, `1h30m`).
    crate::clock::parse_duration_ms(raw)
}

/// `512M`, `2G`, `100K`, plain bytes → bytes.
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let raw = raw.trim();
    let bad = || format!("{raw:?} is not a size (use e.g. 512M, 2G)");
    let (n, mult) = match raw.char_indices().last() {
        Some((i, 'K' | 'k')) => (&raw[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&raw[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&raw[..i], 1 << 30),
        Some(_) => (raw, 1),
        None => return Err(bad()),
    };
    n.parse::<u64>()
        .map_err(|_| bad())?
        .checked_mul(mult)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(shadow: bool, root: &str) -> Settings {
        Settings {
            shadow,
            shadow_root: root.into(),
            ..Settings::default()
        }
    }

    #[test]
    fn data_dir_guard_every_branch() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let inside = root.join("20260101T000000Z");
        let outside = t.path().join("live");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let inside = std::fs::canonicalize(&inside).unwrap();
        let outside = std::fs::canonicalize(&outside).unwrap();
        let r = root.to_str().unwrap();
        check_data_dir(&settings(true, r), &inside).unwrap();
        let e = check_data_dir(&settings(true, r), &outside).unwrap_err();
        assert!(
            matches!(e, ShadowError::Refused(_)) && e.to_string().contains("not under"),
            "{e}"
        );
        let e = check_data_dir(&settings(true, r), &root).unwrap_err();
        assert!(e.to_string().contains("not under"), "{e}");
        let e = check_data_dir(&settings(true, ""), &inside).unwrap_err();
        assert!(e.to_string().contains("shadow_root"), "{e}");
        let missing = t.path().join("nope");
        let e = check_data_dir(&settings(true, missing.to_str().unwrap()), &inside).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        // Live mode: any dir but a snapshot.
        check_data_dir(&settings(false, ""), &outside).unwrap();
        std::fs::write(inside.join(MANIFEST_FILE), "{}").unwrap();
        let e = check_data_dir(&settings(false, r), &inside).unwrap_err();
        assert!(e.to_string().contains("shadow snapshot"), "{e}");
        // A `..` trick does not pass: paths are canonical before the check.
        let sneaky = std::fs::canonicalize(inside.join("..").join("..").join("live")).unwrap();
        assert!(check_data_dir(&settings(true, r), &sneaky).is_err());
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("30m").unwrap(), 1_800_000);
        assert_eq!(parse_duration("24h").unwrap(), 86_400_000);
        assert!(parse_duration("h").is_err() && parse_duration("5y").is_err());
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("10").unwrap(), 10);
        assert!(parse_size("x").is_err());
        assert_eq!(human_duration(3_660_000), "1h 1m");
    }
}
