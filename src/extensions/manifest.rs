//! `extension.toml`: what an extension declares, read and checked once, at
//! `mercury ext add`, so every refusal names the field that is wrong.
//!
//! Must never: accept a field it does not know (a typo would silently drop a
//! restriction), a credential written into the manifest itself, or a server
//! whose tools could be named outside `[a-zA-Z0-9_-]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The manifest's file name inside an extension's directory.
pub const MANIFEST_FILE: &str = "extension.toml";

/// Longest extension name: it prefixes tool names, which models cap at 64.
const NAME_MAX: usize = 24;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// `[a-z][a-z0-9]*`: the prefix of its tools (`<name>_<tool>`).
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// The MCP servers, by id.
    #[serde(default)]
    pub servers: BTreeMap<String, Server>,
    /// Tools of its own servers the host calls around every turn of a
    /// space that enabled it (never offered to the model).
    #[serde(default)]
    pub hooks: Hooks,
    /// Tools the host calls on a schedule in every space that enabled it;
    /// the answer goes to the extension's `extension_state` there.
    #[serde(default)]
    pub jobs: BTreeMap<String, Job>,
    /// Directories of this extension holding a `SKILL.md`, offered to the
    /// agent by name and description and readable in the sandbox.
    #[serde(default)]
    pub skills: Vec<Skill>,
    /// Per-space config keys (`<name>.<key>`), each with a schema in the
    /// JSON-schema subset [`super::space_config`] checks.
    #[serde(default)]
    pub config: BTreeMap<String, toml::Table>,
    /// The extension's own permission, `ext.<name>`: calling its tools needs it.
    #[serde(default)]
    pub permission: PermissionDecl,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    /// 1-32 of a-z, 0-9, '-', '_': its directory under /run/mercury/skills/<ext>/.
    pub name: String,
    /// The directory, relative to the extension's own (it holds `SKILL.md`).
    pub path: PathBuf,
    /// One line the agent reads in its system prompt.
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionDecl {
    /// Roles that hold `ext.<name>` by default in every space (a space's own
    /// `role.<role>.permissions` override decides for that role there).
    /// `admin` holds it always.
    #[serde(default = "default_roles")]
    pub roles: Vec<String>,
}

fn default_roles() -> Vec<String> {
    vec!["admin".into(), "member".into()]
}

impl Default for PermissionDecl {
    fn default() -> Self {
        Self {
            roles: default_roles(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// An `http` server of this manifest (a job runs outside any turn, so
    /// it has no sandbox to start a stdio server in).
    pub server: String,
    pub tool: String,
    /// Every this many seconds (at least 1)…
    #[serde(default)]
    pub interval_secs: Option<u64>,
    /// …or on this cron schedule (five fields, UTC): exactly one of the two.
    #[serde(default)]
    pub cron: Option<String>,
    /// Arguments of the call (the space's id is added as `space`).
    #[serde(default)]
    pub arguments: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    /// Before the model is called: may add a system-prompt fragment, or
    /// block the turn with a reason.
    #[serde(default)]
    pub before_turn: Option<HookTool>,
    /// After the reply: told the message and the reply; its answer is kept
    /// in the trace only.
    #[serde(default)]
    pub after_turn: Option<HookTool>,
    /// Seconds one hook may take (default 5, at most 60).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HookTool {
    pub server: String,
    pub tool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// `stdio` (runs inside the turn's sandbox) or `http` (called by the host).
    pub transport: Transport,
    /// stdio: the command and its arguments, as the sandbox sees them.
    #[serde(default)]
    pub command: Vec<String>,
    /// stdio: host directories the command needs, bound read-only into the
    /// sandbox at the same path (a pinned virtualenv `deploy/setup.sh` made).
    #[serde(default)]
    pub mounts: Vec<PathBuf>,
    /// stdio under the docker backend: a locally present image the server's
    /// container starts from (the agent image holds no language runtime;
    /// `mercury ext image` builds one from host paths, no registry). The
    /// bubblewrap backend runs the command on the host's `/usr` and ignores it.
    #[serde(default)]
    pub image: Option<String>,
    /// http: the server's URL; the only address of it the host calls.
    #[serde(default)]
    pub url: Option<String>,
    /// http: the bearer credential, from this host environment variable…
    #[serde(default)]
    pub credential_env: Option<String>,
    /// …or from this host file (its first line).
    #[serde(default)]
    pub credential_file: Option<PathBuf>,
    /// Per tool: the operator's word on whether it only reads, overriding
    /// the server's own `readOnlyHint`.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Stdio,
    Http,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    #[serde(default)]
    pub read_only: Option<bool>,
}

/// Why a manifest was refused; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read it: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: field `{field}`: {why}")]
    Field {
        path: String,
        field: String,
        why: String,
    },
}

/// Reads and checks `<dir>/extension.toml`.
pub fn load(dir: &Path) -> Result<(Manifest, String), ManifestError> {
    let path = dir.join(MANIFEST_FILE);
    let label = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
        path: label.clone(),
        source,
    })?;
    let manifest = parse(&label, &text)?;
    Ok((manifest, text))
}

/// Parses and checks a manifest's text; `label` names it in errors.
pub fn parse(label: &str, text: &str) -> Result<Manifest, ManifestError> {
    let manifest: Manifest = toml::from_str(text).map_err(|e| ManifestError::Parse {
        path: label.to_owned(),
        // toml's message names the unknown or mistyped field and its line.
        message: e.to_string().trim().replace('\n', " "),
    })?;
    manifest.check(label)?;
    Ok(manifest)
}

/// Whether `s` is a valid extension name (1-24 of a-z, 0-9, a letter first).
pub fn is_extension_name(s: &str) -> bool {
    is_ident(s, NAME_MAX) && !s.contains(['_', '-'])
}

/// Whether `s` is a plain local image reference: lowercase name components,
/// an optional tag, no digest. Anything else (a space, an option-like `-x`)
/// is refused before it reaches the engine.
pub fn is_image_reference(s: &str) -> bool {
    let (name, tag) = match s.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (s, None),
    };
    let name_ok = !name.is_empty()
        && name.split('/').all(|part| {
            part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
                })
        });
    let tag_ok = tag.is_none_or(|t| {
        !t.is_empty()
            && t.len() <= 128
            && t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    });
    s.len() <= 128 && name_ok && tag_ok
}

fn is_ident(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

impl Manifest {
    fn check(&self, label: &str) -> Result<(), ManifestError> {
        let bad = |field: String, why: &str| ManifestError::Field {
            path: label.to_owned(),
            field,
            why: why.to_owned(),
        };
        if !is_extension_name(&self.name) {
            return Err(bad(
                "name".into(),
                "must be 1-24 of a-z and 0-9, starting with a letter (it prefixes the tool names)",
            ));
        }
        if self.servers.is_empty() {
            return Err(bad("servers".into(), "declares no MCP server"));
        }
        for (id, s) in &self.servers {
            let f = |k: &str| format!("servers.{id}.{k}");
            if !is_ident(id, 32) {
                return Err(bad(
                    format!("servers.{id}"),
                    "a server id is 1-32 of a-z, 0-9, '_', '-', starting with a letter",
                ));
            }
            match s.transport {
                Transport::Stdio => {
                    if s.command.is_empty() || s.command.iter().any(String::is_empty) {
                        return Err(bad(f("command"), "a stdio server needs a command (a non-empty list of non-empty strings)"));
                    }
                    if !s.command[0].starts_with('/') {
                        return Err(bad(f("command"), "the program must be an absolute path (the sandbox's PATH is not the host's)"));
                    }
                    for m in &s.mounts {
                        let ok = m.is_absolute()
                            && m.components()
                                .all(|c| !matches!(c, std::path::Component::ParentDir));
                        if !ok {
                            return Err(bad(
                                f("mounts"),
                                "each mount is an absolute host path without '..'",
                            ));
                        }
                    }
                    if let Some(image) = &s.image {
                        if !is_image_reference(image) {
                            return Err(bad(
                                f("image"),
                                "an image reference (name[:tag], of a-z, 0-9, '.', '_', '-', '/', ':'; at most 128)",
                            ));
                        }
                    }
                    for (k, set) in [
                        ("url", s.url.is_some()),
                        ("credential_env", s.credential_env.is_some()),
                        ("credential_file", s.credential_file.is_some()),
                    ] {
                        if set {
                            return Err(bad(f(k), "only an http server has it"));
                        }
                    }
                }
                Transport::Http => {
                    let Some(url) = &s.url else {
                        return Err(bad(f("url"), "an http server needs a url"));
                    };
                    match url::Url::parse(url) {
                        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
                            if !u.username().is_empty() || u.password().is_some() {
                                return Err(bad(f("url"), "must not carry a credential (use credential_env or credential_file)"));
                            }
                        }
                        _ => {
                            return Err(bad(
                                f("url"),
                                "must be an http:// or https:// URL with a host",
                            ))
                        }
                    }
                    if !s.command.is_empty() || !s.mounts.is_empty() || s.image.is_some() {
                        return Err(bad(
                            f("command"),
                            "only a stdio server has a command, mounts or an image",
                        ));
                    }
                    if s.credential_env.is_some() && s.credential_file.is_some() {
                        return Err(bad(
                            f("credential_file"),
                            "name one of credential_env and credential_file",
                        ));
                    }
                    if let Some(v) = &s.credential_env {
                        if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        {
                            return Err(bad(f("credential_env"), "an environment variable's name"));
                        }
                    }
                    if let Some(p) = &s.credential_file {
                        if !p.is_absolute() {
                            return Err(bad(f("credential_file"), "an absolute host path"));
                        }
                    }
                }
            }
            for t in s.tools.keys() {
                if t.is_empty()
                    || !t
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(bad(
                        format!("servers.{id}.tools.{t}"),
                        "a tool name is letters, digits, '_' and '-'",
                    ));
                }
            }
        }
        for (k, h) in [
            ("before_turn", &self.hooks.before_turn),
            ("after_turn", &self.hooks.after_turn),
        ] {
            if let Some(h) = h {
                if !self.servers.contains_key(&h.server) {
                    return Err(bad(
                        format!("hooks.{k}.server"),
                        "names no server of this manifest",
                    ));
                }
                if h.tool.is_empty() {
                    return Err(bad(format!("hooks.{k}.tool"), "a tool name is required"));
                }
            }
        }
        for (id, j) in &self.jobs {
            let f = |k: &str| format!("jobs.{id}.{k}");
            match self.servers.get(&j.server).map(|s| s.transport) {
                Some(Transport::Http) => {}
                Some(Transport::Stdio) => {
                    return Err(bad(
                        f("server"),
                        "a job calls an http server (it runs outside any turn's sandbox)",
                    ))
                }
                None => return Err(bad(f("server"), "names no server of this manifest")),
            }
            if j.tool.is_empty() {
                return Err(bad(f("tool"), "a tool name is required"));
            }
            match (j.interval_secs, &j.cron) {
                (Some(0), _) => return Err(bad(f("interval_secs"), "at least 1")),
                (Some(_), Some(_)) | (None, None) => {
                    return Err(bad(
                        f("cron"),
                        "a job has exactly one of interval_secs and cron",
                    ))
                }
                (None, Some(c)) => {
                    crate::schedule::parse_cron(c).map_err(|why| bad(f("cron"), &why))?;
                }
                (Some(_), None) => {}
            }
        }
        if self.name == "manage" {
            return Err(bad(
                "name".into(),
                "\"manage\" is taken: the extension's permission ext.<name> would be ext.manage",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, sk) in self.skills.iter().enumerate() {
            let f = |k: &str| format!("skills[{i}].{k}");
            if !is_ident(&sk.name, 32) {
                return Err(bad(
                    f("name"),
                    "a skill name is 1-32 of a-z, 0-9, '_', '-', starting with a letter",
                ));
            }
            if !seen.insert(sk.name.clone()) {
                return Err(bad(f("name"), "two skills have this name"));
            }
            let ok = !sk.path.as_os_str().is_empty()
                && sk
                    .path
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !ok {
                return Err(bad(
                    f("path"),
                    "a directory inside the extension (relative, without '..')",
                ));
            }
            if sk.description.trim().is_empty() || sk.description.chars().count() > 300 {
                return Err(bad(f("description"), "one line of 1-300 characters"));
            }
        }
        for (key, schema) in &self.config {
            super::space_config::check_schema(key, schema)
                .map_err(|(field, why)| bad(format!("config.{key}{field}"), &why))?;
        }
        for r in &self.permission.roles {
            crate::perms::validate_role_name(r)
                .map_err(|why| bad("permission.roles".into(), &why))?;
        }
        if matches!(self.hooks.timeout_secs, Some(0) | Some(61..)) {
            return Err(bad("hooks.timeout_secs".into(), "between 1 and 60 seconds"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse("x/extension.toml", text).unwrap_err().to_string()
    }

    const GOOD: &str = r#"
name = "time"
[servers.time]
transport = "stdio"
command = ["/opt/v/bin/python", "-m", "mcp_server_time"]
mounts = ["/opt/v"]
[servers.time.tools.convert_time]
read_only = true
"#;

    #[test]
    fn manifest_good_one_parses() {
        let m = parse("x", GOOD).unwrap();
        assert_eq!(m.name, "time");
        assert_eq!(m.servers["time"].transport, Transport::Stdio);
        assert_eq!(
            m.servers["time"].tools["convert_time"].read_only,
            Some(true)
        );
    }

    #[test]
    fn manifest_a_stdio_server_may_name_a_plain_local_image() {
        let with =
            |image: &str| GOOD.replace("mounts = [", &format!("image = \"{image}\"\nmounts = ["));
        let m = parse("x", &with("mercury-ext-time:2026.10.19")).unwrap();
        assert_eq!(
            m.servers["time"].image.as_deref(),
            Some("mercury-ext-time:2026.10.19")
        );
        for bad in [
            "",
            "Time",
            "-x",
            "time:",
            "time:a/b",
            "a b",
            "time@sha256:00",
        ] {
            assert!(
                err(&with(bad)).contains("servers.time.image"),
                "{bad:?} was accepted"
            );
        }
        let http = "name = \"w\"\n[servers.w]\ntransport = \"http\"\nurl = \"http://h/mcp\"\nimage = \"x:1\"\n";
        assert!(err(http).contains("servers.w.command"), "{}", err(http));
    }

    #[test]
    fn manifest_refusals_name_the_field() {
        assert!(
            err(&GOOD.replace("\"time\"\n[servers", "\"Time!\"\n[servers"))
                .contains("field `name`")
        );
        assert!(err(&GOOD.replace("command = [\"/opt", "command = [\"opt"))
            .contains("servers.time.command"));
        assert!(
            err(&GOOD.replace("mounts = [\"/opt/v\"]", "mounts = [\"/opt/../etc\"]"))
                .contains("servers.time.mounts")
        );
        assert!(
            err(&format!("{GOOD}\nurl = \"http://x\"")).contains("servers.time.tools.convert_time")
                || err(&format!("{GOOD}\nurl = \"http://x\"")).contains("url")
        );
        let unknown = err(&GOOD.replace(
            "transport = \"stdio\"",
            "transport = \"stdio\"\nsecret = \"k\"",
        ));
        assert!(unknown.contains("secret"), "{unknown}");
        let http = "name = \"w\"\n[servers.w]\ntransport = \"http\"\nurl = \"http://u:p@h/mcp\"\n";
        assert!(err(http).contains("servers.w.url"));
        let http = "name = \"w\"\n[servers.w]\ntransport = \"http\"\n";
        assert!(err(http).contains("servers.w.url"));
        assert!(err("name = \"w\"\n").contains("field `servers`"));
        let job = format!("{GOOD}\n[jobs.j]\nserver = \"time\"\ntool = \"t\"\ninterval_secs = 5\n");
        assert!(err(&job).contains("jobs.j.server"), "{}", err(&job));
        let hook = GOOD.replace(
            "[servers.time]",
            "[hooks]\nbefore_turn = { server = \"nope\", tool = \"t\" }\n[servers.time]",
        );
        assert!(
            err(&hook).contains("hooks.before_turn.server"),
            "{}",
            err(&hook)
        );
        let slow = GOOD.replace(
            "[servers.time]",
            "[hooks]\ntimeout_secs = 600\n[servers.time]",
        );
        assert!(err(&slow).contains("hooks.timeout_secs"));
    }
}
