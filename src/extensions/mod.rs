//! Extensions (issue 29): operator-installed directories with an
//! `extension.toml` that declares MCP servers; enabled per space; their
//! tools offered to that space's turns as `<extension>_<tool>`.
//!
//! Owns the manifest ([`manifest`]), installing (`mercury ext add`), the
//! turn's view of the enabled extensions ([`TurnExtensions`]): which tools
//! exist, which only read, and the calls themselves ([`mcp`]). A `stdio`
//! server runs inside the turn's sandbox session (started on its first
//! call, gone with the session); an `http` server is called by the host, so
//! its credential, read from the host's environment or a file, never enters
//! a sandbox.
//!
//! Must never: offer a tool in a space that did not enable its extension,
//! run a tool that is not read-only in an `ask` or a shadow, call an `http`
//! server from a shadow, or give the model more of an answer than the cap.

pub mod html_text;
pub mod jobs;
pub mod manifest;
pub(crate) mod mcp;
pub mod space_config;
pub mod web;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ToolSpec;
use crate::sandbox::{SandboxSession, SpawnRequest};
use crate::storage::extensions as rows;
use crate::storage::{Conn, Store, StoreResult};
pub use manifest::{Manifest, ManifestError, Transport};

/// Tools offered per extension, at most.
const MAX_TOOLS: usize = 64;
/// Largest input schema of one tool, as JSON; a bigger one is not offered.
const MAX_SCHEMA_BYTES: usize = 16 << 10;
/// Longest tool description offered to the model.
const MAX_DESCRIPTION_CHARS: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExtensionError {
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("the server did not answer within {0:?}; the call was cut off")]
    Timeout(Duration),
    #[error("{0}")]
    Protocol(String),
    #[error("{0}")]
    BadCall(String),
    #[error("the server cannot start: {0}")]
    Start(String),
    #[error("storage: {0}")]
    Store(#[from] crate::storage::StoreError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One tool as its server listed it (the catalog kept per install).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CatalogTool {
    pub server: String,
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// The server's `readOnlyHint` (absent: not read-only).
    pub read_only_hint: bool,
}

/// A tool as a turn offers it.
#[derive(Debug, Clone)]
pub struct ExtTool {
    /// `<extension>_<tool>`: what the model calls.
    pub exposed: String,
    pub extension: String,
    pub server: String,
    pub tool: String,
    /// The manifest's override, else the server's hint.
    pub read_only: bool,
    pub spec: ToolSpec,
}

/// Where a turn runs, for what its tools may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A live or task turn: every tool runs.
    Acting,
    /// An ask: only read-only tools.
    Ask,
    /// A shadow host: only read-only tools, and no http server.
    Shadow,
}

/// Why a tool call is refused before it runs, as the model reads it.
/// `shadow_named`: the shadow's own config (`extensions.shadow_http`) names
/// the tool's http server.
pub fn refusal(
    tool: &ExtTool,
    transport: Transport,
    mode: Mode,
    shadow_named: bool,
) -> Option<String> {
    match mode {
        Mode::Acting => None,
        Mode::Shadow if transport == Transport::Http && !shadow_named => Some(format!(
            "{} is served over http by the host and a shadow calls no http server its config (extensions.shadow_http) does not name; the call was refused",
            tool.exposed
        )),
        Mode::Ask | Mode::Shadow if !tool.read_only => Some(format!(
            "{} is not marked read-only and this turn must not act; the call was refused",
            tool.exposed
        )),
        _ => None,
    }
}

/// The permission an extension's tools need: `ext.<name>`.
pub fn permission_of(extension: &str) -> String {
    format!("ext.{extension}")
}

/// Whether `name` is an extension's permission (`ext.<name>`, not `ext.manage`).
pub fn is_permission_name(name: &str) -> bool {
    name.strip_prefix("ext.")
        .is_some_and(|e| e != "manage" && manifest::is_extension_name(e))
}

/// Whether `role` holds `m`'s permission in `space`: `admin` and `system`
/// always; a role the space overrides (`role.<role>.permissions`) when its
/// list names `ext.<name>`; any other role when the manifest's
/// `[permission] roles` names it.
pub fn role_holds(
    c: &crate::storage::Conn,
    space: &str,
    role: &str,
    m: &Manifest,
) -> crate::storage::StoreResult<bool> {
    if role == crate::perms::ROLE_ADMIN || role == crate::perms::ROLE_SYSTEM {
        return Ok(true);
    }
    if role == crate::perms::ROLE_NONE {
        return Ok(false);
    }
    let own = permission_of(&m.name);
    let key = crate::perms::override_key(role);
    Ok(
        match crate::storage::spaces::kv_get(
            c,
            crate::storage::spaces::KvTable::Config,
            space,
            &key,
        )? {
            Some(list) => list.split(',').any(|p| p.trim() == own),
            None => m.permission.roles.iter().any(|r| r == role),
        },
    )
}

/// The `ext.<name>` permissions `role` holds in `space`, of the
/// extensions enabled there (by [`role_holds`]'s rule), sorted: what
/// `mrctl permissions get` lists beside the built-in ones.
pub fn held_permissions(
    c: &crate::storage::Conn,
    space: &str,
    role: &str,
) -> crate::storage::StoreResult<Vec<String>> {
    let mut out = Vec::new();
    for row in rows::enabled_in(c, space)? {
        // A manifest that no longer parses offers nothing, so it grants nothing.
        let Ok(m) = manifest::parse(&row.name, &row.manifest) else {
            continue;
        };
        if role_holds(c, space, role, &m)? {
            out.push(permission_of(&m.name));
        }
    }
    out.sort();
    Ok(out)
}

/// One skill of an enabled extension, as a turn offers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedSkill {
    pub extension: String,
    pub name: String,
    pub description: String,
    /// Its directory on the host (inside the installed copy).
    pub host_dir: std::path::PathBuf,
}

impl OfferedSkill {
    /// Where the sandbox reads it.
    pub fn inside(&self) -> String {
        format!("{SKILLS_INSIDE}/{}/{}", self.extension, self.name)
    }
}

/// The fixed root of the skills inside a sandbox.
pub const SKILLS_INSIDE: &str = "/run/mercury/skills";

/// The skills of `m` whose `SKILL.md` is in its installed copy, added to `out`.
fn offer_skills(m: &Manifest, extensions_dir: &Path, out: &mut Vec<OfferedSkill>) {
    for sk in &m.skills {
        let dir = extensions_dir.join(&m.name).join(&sk.path);
        let plain =
            |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|md| !md.file_type().is_symlink());
        if !(plain(&dir) && dir.is_dir() && plain(&dir.join("SKILL.md"))) {
            tracing::warn!(extension = %m.name, skill = %sk.name, "a skill's directory or SKILL.md is missing; it is not offered");
            continue;
        }
        out.push(OfferedSkill {
            extension: m.name.clone(),
            name: sk.name.clone(),
            description: sk.description.clone(),
            host_dir: dir,
        });
    }
}

/// The system-prompt section listing `skills` (empty: none).
pub fn skills_prompt(skills: &[OfferedSkill]) -> Option<String> {
    if skills.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# Skills\nInstructions from this space's extensions. Read a skill's SKILL.md (with `shell`: cat PATH/SKILL.md) before doing what it describes.\n",
    );
    for s in skills {
        out.push_str(&format!(
            "- {}/{}: {} ({})\n",
            s.extension,
            s.name,
            s.description.replace('\n', " "),
            s.inside()
        ));
    }
    Some(out)
}

/// The extensions enabled in one space, for one turn.
pub struct TurnExtensions {
    manifests: BTreeMap<String, (Manifest, i64)>,
    /// Extensions whose permission the turn's role does not hold: their
    /// tools are not offered, and a call is refused with a sentence.
    unpermitted: std::collections::BTreeSet<String>,
    /// Each extension's config values in this space (for hooks).
    config: BTreeMap<String, Value>,
    /// The role the turn acts with (what its permission checks name).
    role: String,
    tools: BTreeMap<String, ExtTool>,
    /// Servers whose catalog is not cached: listed on the turn's first need.
    unlisted: Vec<(String, String)>,
    connections: tokio::sync::Mutex<BTreeMap<(String, String), Arc<mcp::Connection>>>,
}

/// A space's enabled extensions as one read found them: each row, its
/// manifest parsed, and (when it parses) whether the turn's role holds its
/// permission and the space's config values for it.
#[derive(Default)]
pub struct EnabledRead(Vec<EnabledRow>);

/// One enabled extension: its row, its parsed manifest, and (when it parses)
/// whether the role holds its permission and the space's values for it.
type EnabledRow = (
    rows::Installed,
    Result<Manifest, ManifestError>,
    Option<(bool, Value)>,
);

impl std::fmt::Debug for EnabledRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(row, _, _)| &row.name))
            .finish()
    }
}

impl EnabledRead {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TurnExtensions {
    /// Reads what `space` enabled, for a turn acting with `role`. A
    /// manifest that no longer parses is logged and left out.
    pub async fn load(store: &Store, space: &str, role: &str) -> Result<Self, ExtensionError> {
        let (space, role_r) = (space.to_owned(), role.to_owned());
        let enabled = store.read(move |c| Self::read(c, &space, &role_r)).await?;
        Ok(Self::from_read(enabled, role))
    }

    /// What [`Self::load`] reads, inside a caller's own read or transaction
    /// (a turn's opening write reads it with the rest).
    pub fn read(c: &Conn, space: &str, role: &str) -> StoreResult<EnabledRead> {
        let mut out = Vec::new();
        for row in rows::enabled_in(c, space)? {
            let parsed = manifest::parse(&row.name, &row.manifest);
            let extra = match &parsed {
                Ok(m) => Some((
                    role_holds(c, space, role, m)?,
                    space_config::values(c, space, m)?,
                )),
                Err(_) => None,
            };
            out.push((row, parsed, extra));
        }
        Ok(EnabledRead(out))
    }

    /// The turn's view of what [`Self::read`] found.
    pub fn from_read(enabled: EnabledRead, role: &str) -> Self {
        let role_name = role.to_owned();
        let enabled = enabled.0;
        let mut this = Self {
            manifests: BTreeMap::new(),
            unpermitted: Default::default(),
            config: BTreeMap::new(),
            role: role_name,
            tools: BTreeMap::new(),
            unlisted: Vec::new(),
            connections: Default::default(),
        };
        for (row, parsed, extra) in enabled {
            let m = match parsed {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(extension = %row.name, error = %e, "an installed manifest no longer parses; its tools are not offered");
                    continue;
                }
            };
            if let Some((holds, config)) = extra {
                if !holds {
                    this.unpermitted.insert(m.name.clone());
                }
                this.config.insert(m.name.clone(), config);
            }
            let catalog: Option<Vec<CatalogTool>> = row
                .catalog
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok());
            match catalog {
                Some(tools) => this.add_tools(&m, &tools),
                None => this
                    .unlisted
                    .extend(m.servers.keys().map(|s| (m.name.clone(), s.clone()))),
            }
            this.manifests.insert(m.name.clone(), (m, row.installed_at));
        }
        this
    }

    pub fn is_empty(&self) -> bool {
        self.manifests.is_empty()
    }

    /// The skills of these extensions whose `SKILL.md` is in the installed
    /// copy under `extensions_dir` (a skill whose directory or file is
    /// missing, or is a link, is logged and left out).
    pub fn skills(&self, extensions_dir: &Path) -> Vec<OfferedSkill> {
        let mut out = Vec::new();
        for (m, _) in self.manifests.values() {
            offer_skills(m, extensions_dir, &mut out);
        }
        out
    }

    /// Servers still to be asked for their tools.
    pub fn unlisted(&self) -> &[(String, String)] {
        &self.unlisted
    }

    /// Whether `(extension, server)` runs inside the sandbox.
    pub fn transport(&self, extension: &str, server: &str) -> Option<Transport> {
        self.manifests
            .get(extension)
            .and_then(|(m, _)| m.servers.get(server))
            .map(|s| s.transport)
    }

    fn add_tools(&mut self, m: &Manifest, tools: &[CatalogTool]) {
        let is_hook = |t: &CatalogTool| {
            [&m.hooks.before_turn, &m.hooks.after_turn]
                .into_iter()
                .flatten()
                .any(|h| h.server == t.server && h.tool == t.name)
        };
        for t in tools.iter().filter(|t| !is_hook(t)).take(MAX_TOOLS) {
            let Some(server) = m.servers.get(&t.server) else {
                continue;
            };
            let exposed = format!("{}_{}", m.name, t.name);
            let name_ok = exposed.len() <= 64
                && exposed
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            let schema_len = t.input_schema.to_string().len();
            if !name_ok || schema_len > MAX_SCHEMA_BYTES || !t.input_schema.is_object() {
                tracing::warn!(extension = %m.name, tool = %t.name, schema_len, "a tool is not offered: its name or schema is outside the caps");
                continue;
            }
            if self.tools.contains_key(&exposed) {
                tracing::warn!(extension = %m.name, tool = %t.name, "two servers list the same tool name; the first is offered");
                continue;
            }
            let read_only = server
                .tools
                .get(&t.name)
                .and_then(|o| o.read_only)
                .unwrap_or(t.read_only_hint);
            let description: String = t.description.chars().take(MAX_DESCRIPTION_CHARS).collect();
            self.tools.insert(
                exposed.clone(),
                ExtTool {
                    exposed: exposed.clone(),
                    extension: m.name.clone(),
                    server: t.server.clone(),
                    tool: t.name.clone(),
                    read_only,
                    spec: ToolSpec {
                        name: exposed,
                        description: format!("[extension {}] {description}", m.name),
                        parameters: t.input_schema.clone(),
                    },
                },
            );
        }
    }

    /// Asks every unlisted server for its tools (a stdio one inside
    /// `session`) and keeps the catalog with the installed extension. A
    /// server that fails is logged; its tools are not offered this turn.
    pub async fn list_unlisted(
        &mut self,
        store: &Store,
        session: Option<&dyn SandboxSession>,
        shadow: Option<&[String]>,
        deadline: Duration,
    ) {
        let unlisted = std::mem::take(&mut self.unlisted);
        let mut by_ext: BTreeMap<String, Vec<CatalogTool>> = BTreeMap::new();
        let mut failed: std::collections::BTreeSet<String> = Default::default();
        for (ext, server) in unlisted {
            let named = shadow.is_some_and(|named| named.contains(&format!("{ext}.{server}")));
            if shadow.is_some() && !named && self.transport(&ext, &server) == Some(Transport::Http)
            {
                failed.insert(ext);
                continue;
            }
            let listed = async {
                let conn = self.connection(&ext, &server, session, deadline).await?;
                conn.list_tools(deadline).await
            }
            .await;
            match listed {
                Ok(tools) => by_ext
                    .entry(ext)
                    .or_default()
                    .extend(tools.into_iter().map(|t| {
                        CatalogTool {
                            server: server.clone(),
                            name: t.name.to_string(),
                            description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                            input_schema: Value::Object((*t.input_schema).clone()),
                            read_only_hint: t
                                .annotations
                                .as_ref()
                                .and_then(|a| a.read_only_hint)
                                .unwrap_or(false),
                        }
                    })),
                Err(e) => {
                    tracing::warn!(extension = %ext, server = %server, error = %e, "cannot list an extension server's tools");
                    failed.insert(ext);
                }
            }
        }
        for (ext, tools) in by_ext {
            let Some((m, installed_at)) = self.manifests.get(&ext).cloned() else {
                continue;
            };
            self.add_tools(&m, &tools);
            if failed.contains(&ext) {
                continue;
            }
            let Ok(json) = serde_json::to_string(&tools) else {
                continue;
            };
            let name = ext.clone();
            if let Err(e) = store
                .write(move |tx| rows::set_catalog(tx, &name, installed_at, &json))
                .await
            {
                tracing::warn!(extension = %ext, error = %e, "cannot keep an extension's tool catalog");
            }
        }
    }

    /// The tools offered to the model: those of extensions whose
    /// permission the turn's role holds.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools
            .values()
            .filter(|t| !self.unpermitted.contains(&t.extension))
            .map(|t| &t.spec)
    }

    /// Why the turn's role may not call `tool` (`None`: it may).
    pub fn forbidden(&self, tool: &ExtTool) -> Option<String> {
        self.unpermitted.contains(&tool.extension).then(|| {
            format!(
                "{} needs the permission {}, which the role {} does not hold in this space; the call was refused",
                tool.exposed,
                permission_of(&tool.extension),
                self.role
            )
        })
    }

    pub fn tool(&self, exposed: &str) -> Option<&ExtTool> {
        self.tools.get(exposed)
    }

    async fn connection(
        &self,
        ext: &str,
        server: &str,
        session: Option<&dyn SandboxSession>,
        deadline: Duration,
    ) -> Result<Arc<mcp::Connection>, ExtensionError> {
        let key = (ext.to_owned(), server.to_owned());
        let mut conns = self.connections.lock().await;
        if let Some(c) = conns.get(&key) {
            return Ok(c.clone());
        }
        let spec = self
            .manifests
            .get(ext)
            .and_then(|(m, _)| m.servers.get(server))
            .ok_or_else(|| ExtensionError::Start(format!("{ext}: no server {server}")))?;
        let conn = match spec.transport {
            Transport::Stdio => {
                let session = session.ok_or_else(|| {
                    ExtensionError::Start("a stdio server needs the turn's sandbox".into())
                })?;
                let process = session
                    .spawn(SpawnRequest {
                        argv: spec.command.clone(),
                        ro_mounts: spec.mounts.clone(),
                        image: spec.image.clone(),
                    })
                    .await
                    .map_err(|e| ExtensionError::Start(e.to_string()))?;
                mcp::connect_stdio(process, deadline).await?
            }
            Transport::Http => {
                let url = spec.url.clone().unwrap_or_default();
                mcp::connect_http(&url, credential(spec)?, deadline).await?
            }
        };
        let conn = Arc::new(conn);
        conns.insert(key, conn.clone());
        Ok(conn)
    }

    /// Calls `tool`: its answer (capped at `cap` bytes and stripped of
    /// control characters), or the sentence the model reads instead.
    pub async fn call(
        &self,
        tool: &ExtTool,
        arguments: Value,
        session: Option<&dyn SandboxSession>,
        deadline: Duration,
        cap: usize,
    ) -> Result<(String, bool), ExtensionError> {
        self.call_raw(
            &tool.extension,
            &tool.server,
            &tool.tool,
            arguments,
            session,
            deadline,
            cap,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_raw(
        &self,
        ext: &str,
        server: &str,
        tool: &str,
        arguments: Value,
        session: Option<&dyn SandboxSession>,
        deadline: Duration,
        cap: usize,
    ) -> Result<(String, bool), ExtensionError> {
        let conn = self.connection(ext, server, session, deadline).await?;
        let answer = conn.call(tool, arguments, deadline).await;
        if answer.is_err() {
            // A server that hung or broke is not asked again this turn.
            self.connections
                .lock()
                .await
                .remove(&(ext.to_owned(), server.to_owned()));
        }
        let (text, is_error) = answer?;
        Ok((strip_and_cap(&text, cap), is_error))
    }

    /// The hooks of `point` of every enabled extension, by extension name.
    pub fn hooks(&self, point: HookPoint) -> Vec<Hook> {
        self.manifests
            .values()
            .filter_map(|(m, _)| {
                let h = match point {
                    HookPoint::BeforeTurn => m.hooks.before_turn.as_ref(),
                    HookPoint::AfterTurn => m.hooks.after_turn.as_ref(),
                }?;
                let transport = m.servers.get(&h.server)?.transport;
                Some(Hook {
                    extension: m.name.clone(),
                    server: h.server.clone(),
                    tool: h.tool.clone(),
                    transport,
                    timeout: Duration::from_secs(m.hooks.timeout_secs.unwrap_or(5)),
                })
            })
            .collect()
    }

    /// Runs one hook within its time limit.
    pub async fn run_hook(
        &self,
        hook: &Hook,
        arguments: Value,
        session: Option<&dyn SandboxSession>,
        cap: usize,
    ) -> Result<HookAnswer, ExtensionError> {
        let mut arguments = arguments;
        if let (Some(obj), Some(cfg)) =
            (arguments.as_object_mut(), self.config.get(&hook.extension))
        {
            if cfg.as_object().is_some_and(|o| !o.is_empty()) {
                obj.insert("config".into(), cfg.clone());
            }
        }
        let (text, is_error) = self
            .call_raw(
                &hook.extension,
                &hook.server,
                &hook.tool,
                arguments,
                session,
                hook.timeout,
                cap,
            )
            .await?;
        if is_error {
            return Err(ExtensionError::Protocol(format!(
                "the hook answered an error: {text}"
            )));
        }
        Ok(HookAnswer::parse(&text))
    }

    /// Ends every connection (stdio servers die with their process).
    pub async fn close(&self) {
        let conns = std::mem::take(&mut *self.connections.lock().await);
        for (_, c) in conns {
            if let Ok(c) = Arc::try_unwrap(c) {
                c.close().await;
            }
        }
    }
}

/// Where in a turn a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    BeforeTurn,
    AfterTurn,
}

/// One hook of one extension.
#[derive(Debug, Clone)]
pub struct Hook {
    pub extension: String,
    pub server: String,
    pub tool: String,
    pub transport: Transport,
    pub timeout: Duration,
}

/// What a hook said: `{"block": "reason"}` stops the turn, `{"prompt":
/// "…"}` (or plain text) is a system-prompt fragment; empty: nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookAnswer {
    Nothing,
    Fragment(String),
    Block(String),
}

impl HookAnswer {
    fn parse(text: &str) -> Self {
        let text = text.trim();
        if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) {
            if let Some(r) = o.get("block").and_then(Value::as_str) {
                return HookAnswer::Block(r.to_owned());
            }
            return match o.get("prompt").and_then(Value::as_str) {
                Some(p) if !p.trim().is_empty() => HookAnswer::Fragment(p.trim().to_owned()),
                _ => HookAnswer::Nothing,
            };
        }
        if text.is_empty() {
            HookAnswer::Nothing
        } else {
            HookAnswer::Fragment(text.to_owned())
        }
    }
}

/// An http server's bearer credential, from the host only.
fn credential(spec: &manifest::Server) -> Result<Option<String>, ExtensionError> {
    if let Some(var) = &spec.credential_env {
        return std::env::var(var).map(Some).map_err(|_| {
            ExtensionError::Start(format!("the host has no environment variable {var}"))
        });
    }
    if let Some(path) = &spec.credential_file {
        let text = std::fs::read_to_string(path).map_err(|source| ExtensionError::Io {
            path: path.display().to_string(),
            source,
        })?;
        return Ok(text.lines().next().map(|l| l.trim().to_owned()));
    }
    Ok(None)
}

/// Control characters (but newlines and tabs) dropped, then at most `cap`
/// bytes at a character boundary.
pub(crate) fn strip_and_cap(text: &str, cap: usize) -> String {
    let mut out: String = text
        .chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect();
    if out.len() > cap {
        let mut end = cap;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("\n[output truncated]");
    }
    out
}

/// `mercury ext add DIR`: checks the manifest, copies the directory to
/// `<data dir>/extensions/<name>/` (regular files and directories only) and
/// records it. Its name.
pub async fn install(
    store: &Store,
    extensions_dir: &Path,
    dir: &Path,
) -> Result<String, ExtensionError> {
    let (m, text) = manifest::load(dir)?;
    let target = extensions_dir.join(&m.name);
    let (src, dst) = (dir.to_path_buf(), target.clone());
    tokio::task::spawn_blocking(move || copy_tree(&src, &dst))
        .await
        .map_err(|e| ExtensionError::Start(e.to_string()))??;
    let (name, at) = (m.name.clone(), crate::clock::now_ms());
    store
        .write(move |tx| rows::install(tx, &name, &text, at))
        .await?;
    Ok(m.name)
}

/// `mercury ext remove NAME`: whether it was installed.
pub async fn uninstall(
    store: &Store,
    extensions_dir: &Path,
    name: &str,
) -> Result<bool, ExtensionError> {
    let n = name.to_owned();
    let removed = store.write(move |tx| rows::remove(tx, &n)).await?;
    let dir = extensions_dir.join(name);
    if removed && !name.contains('/') && dir.is_dir() {
        std::fs::remove_dir_all(&dir).map_err(|source| ExtensionError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    Ok(removed)
}

fn copy_tree(src: &Path, dst: &Path) -> Result<(), ExtensionError> {
    let io = |p: &Path, source: std::io::Error| ExtensionError::Io {
        path: p.display().to_string(),
        source,
    };
    // Adding the installed copy again keeps it as it is.
    if let (Ok(a), Ok(b)) = (src.canonicalize(), dst.canonicalize()) {
        if a == b {
            return Ok(());
        }
    }
    if dst.exists() {
        std::fs::remove_dir_all(dst).map_err(|e| io(dst, e))?;
    }
    for entry in walkdir::WalkDir::new(src).follow_links(false) {
        let entry = entry.map_err(|e| io(src, std::io::Error::from(e)))?;
        let rel = entry.path().strip_prefix(src).unwrap_or(entry.path());
        let to = dst.join(rel);
        let ft = entry.file_type();
        if ft.is_dir() {
            std::fs::create_dir_all(&to).map_err(|e| io(&to, e))?;
        } else if ft.is_file() {
            std::fs::copy(entry.path(), &to).map_err(|e| io(&to, e))?;
        } else {
            return Err(io(
                entry.path(),
                std::io::Error::other("an extension holds only regular files and directories"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(read_only: bool) -> ExtTool {
        ExtTool {
            exposed: "web_x".into(),
            extension: "web".into(),
            server: "web".into(),
            tool: "x".into(),
            read_only,
            spec: ToolSpec {
                name: "web_x".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            },
        }
    }

    #[test]
    fn refusal_ask_and_shadow_run_only_read_only_tools_and_a_shadow_no_http() {
        let (ro, acts) = (tool(true), tool(false));
        for t in [Transport::Stdio, Transport::Http] {
            assert_eq!(refusal(&acts, t, Mode::Acting, false), None);
            assert!(refusal(&acts, t, Mode::Ask, false)
                .unwrap()
                .contains("not marked read-only"));
            assert!(refusal(&acts, t, Mode::Shadow, false).is_some());
            // Named by the shadow's config, a tool that acts is still refused.
            assert!(refusal(&acts, t, Mode::Shadow, true).is_some());
        }
        assert_eq!(refusal(&ro, Transport::Http, Mode::Ask, false), None);
        assert_eq!(refusal(&ro, Transport::Stdio, Mode::Shadow, false), None);
        assert!(refusal(&ro, Transport::Http, Mode::Shadow, false)
            .unwrap()
            .contains("a shadow calls no http server"));
        assert_eq!(refusal(&ro, Transport::Http, Mode::Shadow, true), None);
    }

    #[test]
    fn refusal_manifest_override_wins_over_the_hint_and_caps_hold() {
        let m = manifest::parse(
            "x",
            "name = \"web\"\n[servers.web]\ntransport = \"http\"\nurl = \"http://h/mcp\"\n[servers.web.tools.post]\nread_only = false\n",
        )
        .unwrap();
        let mut exts = TurnExtensions {
            manifests: BTreeMap::new(),
            unpermitted: Default::default(),
            config: BTreeMap::new(),
            role: "admin".into(),
            tools: BTreeMap::new(),
            unlisted: Vec::new(),
            connections: Default::default(),
        };
        let t = |name: &str, hint: bool, schema: Value| CatalogTool {
            server: "web".into(),
            name: name.into(),
            description: "d".into(),
            input_schema: schema,
            read_only_hint: hint,
        };
        let big =
            serde_json::json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        exts.add_tools(
            &m,
            &[
                t("post", true, serde_json::json!({"type": "object"})),
                t("get", true, serde_json::json!({"type": "object"})),
                t("big", true, big),
                t("bad name", true, serde_json::json!({"type": "object"})),
            ],
        );
        assert!(!exts.tool("web_post").unwrap().read_only);
        assert!(exts.tool("web_get").unwrap().read_only);
        assert!(exts.tool("web_big").is_none());
        assert_eq!(exts.specs().count(), 2);
        assert_eq!(strip_and_cap("a\u{1b}[31mb\nc", 100), "a[31mb\nc");
        assert!(strip_and_cap(&"é".repeat(100), 5).starts_with("éé\n[output truncated]"));
    }
}
