//! The settings a shadow carries over from its live host (issue 25 item 1).
//!
//! A live host configured partly by its environment (`MERCURY_<KEY>`, as
//! the README allows for any key) records, at start-up, the config keys its
//! environment set and their values in `<data dir>/environment.json`
//! ([`record`]). A snapshot applies them to the shadow's `mercury.yaml`
//! (the shadow's own environment is built from nothing, so they would
//! otherwise be lost: a live `providers.openai.base_url` pointing at a proxy
//! became the public endpoint). The shadow's file is edited per top-level
//! section ([`edit_keeping_comments`]), so the live file's comments survive
//! everywhere but inside the sections the shadow changes. `shadow up` lists
//! every effective setting that differs from the live host's ([`differences`]).
//!
//! Must never: record a secret (model keys and tokens are not config keys;
//! `storage.*`, which may hold a server address with a password, and any key
//! naming a password are left out), or carry a key the snapshot decides
//! itself (`bind`, `shadow`, `shadow_root`, `admins`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value as Yaml};

use super::{io_err, ShadowError, ShadowResult};
use crate::config::{self, Settings};
use crate::workspace::data_dir::private_file;

/// The file a live host records its environment's settings in.
pub const RECORD_FILE: &str = "environment.json";

/// Keys the snapshot sets for the shadow: never carried from the live host.
const DECIDED_BY_THE_SNAPSHOT: &[&str] = &["bind", "shadow", "shadow_root", "admins"];

/// What a live host's environment set, as recorded at its start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// RFC 3339, UTC.
    pub recorded_at: String,
    /// Dotted config key -> the value the host read from its environment.
    pub settings: BTreeMap<String, Yaml>,
}

/// Whether a key set by the live host's environment is carried into a shadow.
pub fn is_carried(key: &str) -> bool {
    !DECIDED_BY_THE_SNAPSHOT.contains(&key)
        && !key.starts_with("storage.")
        && !key.contains("password")
}

/// Writes `<data dir>/environment.json` for a live host started with `env`
/// (private, atomically). Called at every live start, so it is never older
/// than the host that serves.
pub fn record(data_dir: &Path, env: &BTreeMap<String, String>) -> ShadowResult<()> {
    let settings = config::env_keys(env)?
        .into_iter()
        .filter(|(k, _)| is_carried(k))
        .collect();
    let rec = Recorded {
        recorded_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        settings,
    };
    let json =
        serde_json::to_string_pretty(&rec).map_err(|e| ShadowError::Invalid(e.to_string()))?;
    let target = data_dir.join(RECORD_FILE);
    let tmp = data_dir.join(format!(".{RECORD_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    private_file(&tmp)
        .and_then(|mut f| f.write_all(json.as_bytes()).and_then(|()| f.sync_all()))
        .map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &target).map_err(io_err(format!("writing {}", target.display())))
}

/// The live host's recorded settings; `None` when it never recorded any (a
/// host older than issue 25, or one never started).
pub fn read(data_dir: &Path) -> ShadowResult<Option<Recorded>> {
    let path = data_dir.join(RECORD_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            ShadowError::Invalid(format!("{} is not a settings record: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
    }
}

/// The live host's effective settings: its file with its recorded
/// environment applied.
pub fn effective_live(live_dir: &Path) -> ShadowResult<Settings> {
    let paths = crate::workspace::DataPaths::new(live_dir);
    let mut root = read_yaml(&paths.config)?;
    if let Some(rec) = read(live_dir)? {
        for (k, v) in rec.settings {
            set_dotted(&mut root, &k, v);
        }
    }
    Ok(config::from_value(root, &BTreeMap::new())?)
}

fn read_yaml(path: &Path) -> ShadowResult<Yaml> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_yaml_ng::from_str(&text)
            .map_err(|e| ShadowError::Invalid(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Yaml::Null),
        Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
    }
}

fn set_dotted(root: &mut Yaml, dotted: &str, value: Yaml) {
    if !root.is_mapping() {
        *root = Yaml::Mapping(Mapping::new());
    }
    let parts: Vec<&str> = dotted.split('.').collect();
    let mut cur = root;
    for (i, part) in parts.iter().enumerate() {
        let Some(map) = cur.as_mapping_mut() else {
            return;
        };
        let key = Yaml::String((*part).to_owned());
        if i + 1 == parts.len() {
            map.insert(key, value);
            return;
        }
        let slot = map
            .entry(key)
            .or_insert_with(|| Yaml::Mapping(Mapping::new()));
        if !slot.is_mapping() {
            *slot = Yaml::Mapping(Mapping::new());
        }
        cur = slot;
    }
}

/// Whether a line opens a top-level section (`key:` at column 0).
fn top_level_key(line: &str) -> Option<&str> {
    if line.starts_with([' ', '\t', '#', '-']) || line.starts_with("...") {
        return None;
    }
    let (key, _) = line.split_once(':')?;
    let key = key.trim().trim_matches(['"', '\'']);
    (!key.is_empty()).then_some(key)
}

/// `text` (a YAML mapping) with `keys` (dotted) set, rewriting only the
/// top-level sections they fall in and keeping every other line (comments
/// included) as it was. `None` when the text cannot be edited this way (a
/// flow mapping, anchors across sections...): the caller then re-serialises.
pub fn edit_keeping_comments(text: &str, keys: &[(&str, Yaml)]) -> Option<String> {
    let mut want: Yaml = serde_yaml_ng::from_str(text).ok()?;
    if want.is_null() {
        want = Yaml::Mapping(Mapping::new());
    }
    want.as_mapping()?;
    for (k, v) in keys {
        set_dotted(&mut want, k, v.clone());
    }
    let touched: Vec<&str> = {
        let mut t: Vec<&str> = keys
            .iter()
            .map(|(k, _)| k.split('.').next().unwrap_or(k))
            .collect();
        t.dedup();
        t
    };
    let section = |name: &str| -> Option<String> {
        let mut m = Mapping::new();
        m.insert(Yaml::String(name.to_owned()), want.get(name)?.clone());
        serde_yaml_ng::to_string(&Yaml::Mapping(m)).ok()
    };
    let mut out = String::new();
    let mut written: Vec<&str> = Vec::new();
    let mut skipping = false;
    for line in text.lines() {
        if let Some(key) = top_level_key(line) {
            skipping = false;
            if let Some(name) = touched.iter().find(|t| **t == key) {
                if written.contains(name) {
                    return None;
                }
                out.push_str(&section(name)?);
                written.push(name);
                skipping = true;
                continue;
            }
        } else if skipping && (line.starts_with([' ', '\t', '-']) || line.trim().is_empty()) {
            // The old body of a rewritten section (a blank line ends nothing in YAML).
            if line.trim().is_empty() {
                out.push('\n');
            }
            continue;
        } else if line.starts_with('#') {
            skipping = false;
        }
        out.push_str(line);
        out.push('\n');
    }
    for name in &touched {
        if !written.contains(name) {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&section(name)?);
            written.push(name);
        }
    }
    // Only an edit that reads back as the intended document is used.
    let back: Yaml = serde_yaml_ng::from_str(&out).ok()?;
    (back == want).then_some(out)
}

/// Every leaf setting as `dotted key -> its value in YAML flow text`.
pub fn flatten(settings: &Settings) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(v) = serde_yaml_ng::to_value(settings) {
        walk(&v, "", &mut out);
    }
    out
}

fn walk(v: &Yaml, path: &str, out: &mut BTreeMap<String, String>) {
    match v {
        Yaml::Mapping(m) if path != "prices" => {
            for (k, x) in m {
                let Some(k) = k.as_str() else { continue };
                let full = if path.is_empty() {
                    k.to_owned()
                } else {
                    format!("{path}.{k}")
                };
                walk(x, &full, out);
            }
        }
        other => {
            let text = match other {
                Yaml::String(s) => format!("{s:?}"),
                _ => serde_json::to_string(other).unwrap_or_else(|_| "?".into()),
            };
            out.insert(path.to_owned(), text);
        }
    }
}

/// One setting that differs: `(key, live value, shadow value)`.
pub type Difference = (String, String, String);

/// Every effective setting of the shadow that differs from the live host's.
pub fn differences(live: &Settings, shadow: &Settings) -> Vec<Difference> {
    let (l, s) = (flatten(live), flatten(shadow));
    let mut keys: Vec<&String> = l.keys().chain(s.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let (a, b) = (l.get(k), s.get(k));
            (a != b).then(|| {
                let show = |x: Option<&String>| x.cloned().unwrap_or_else(|| "(unset)".into());
                (k.clone(), show(a), show(b))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_keeps_the_comments_outside_the_sections_it_changes() {
        let text = "# the family bot\nmodel: openai:gpt-4o-mini   # cheap\n\n# where it listens\nbind: 127.0.0.1:8787\nproviders:\n  openai:\n    base_url: http://old\n# review\nreview:\n  owner: owner   # me\n";
        let out = edit_keeping_comments(
            text,
            &[
                ("bind", Yaml::from("127.0.0.1:8788")),
                ("shadow", Yaml::Bool(true)),
                ("providers.openai.base_url", Yaml::from("http://proxy:4000")),
            ],
        )
        .expect("editable");
        for kept in [
            "# the family bot",
            "# cheap",
            "# where it listens",
            "# review",
            "owner: owner   # me",
        ] {
            assert!(out.contains(kept), "{kept:?} lost:\n{out}");
        }
        assert!(out.contains("bind: 127.0.0.1:8788"), "{out}");
        assert!(!out.contains("8787"), "{out}");
        assert!(
            out.contains("http://proxy:4000") && !out.contains("http://old"),
            "{out}"
        );
        assert!(out.trim_end().ends_with("shadow: true"), "{out}");
        let v: Yaml = serde_yaml_ng::from_str(&out).unwrap();
        assert_eq!(v["review"]["owner"], Yaml::from("owner"));
        // A flow mapping is not edited line by line: the caller re-serialises.
        assert_eq!(
            edit_keeping_comments("{bind: x}", &[("bind", Yaml::from("y"))]),
            None
        );
    }

    #[test]
    fn only_non_secret_keys_the_snapshot_does_not_decide_are_carried() {
        assert!(is_carried("providers.openai.base_url"));
        assert!(is_carried("model"));
        for k in [
            "bind",
            "shadow",
            "shadow_root",
            "admins",
            "storage.url",
            "storage.password_file",
        ] {
            assert!(!is_carried(k), "{k}");
        }
    }
}
