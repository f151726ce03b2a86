//! The `scripted` provider: answers model requests from a rules file instead
//! of a model, for tests, the demo and rehearsals. It owns the file format,
//! the rendering of a request to text that rules match against, and the
//! answer built from the first matching rule.
//!
//! Must never: call the network, guess an answer when no rule matches (that
//! is an error naming the file), or accept a file it does not fully
//! understand (unknown fields are rejected at load).
//!
//! # The file
//!
//! ```json
//! {"rules": [
//!   {"match": "REGEX", "match_any": "REGEX", "purpose": "turn|judge|compact|ask|intake",
//!    "reply": "TEXT", "tool_calls": [{"name": "NAME", "arguments": {}}],
//!    "latency_ms": 0}
//! ]}
//! ```
//!
//! The file is read once, on first use, off the async runtime; only a
//! regular file (never through a symlink, never a FIFO or device) of at most
//! [`MAX_SCRIPT_BYTES`] is read. Load errors name the file and a position or
//! one of this format's field names, never a key or value from the file
//! (which may be any host file a spec named). Which paths a space's chain may
//! name at all is decided by the caller (`ModelRegistry`, `PUT /api/model`).
//!
//! Every rule field is optional, but a rule must have a `reply` or a
//! non-empty `tool_calls` (or both). `arguments` must be a JSON object and
//! defaults to `{}`. Unknown fields, at the top level, in a rule or in a tool
//! call, are rejected. Regexes use the `regex` crate's syntax with its
//! defaults (so `.` does not match a newline and `^`/`$` anchor the whole
//! text; write `(?s)` or `(?m)` to change that) and are compiled at load.
//!
//! # Rendering (a public contract: scripts are written against it)
//!
//! Each message renders as one or more lines:
//!
//! - system, user and assistant messages render as `<role>: <content>`,
//!   e.g. `user: hello`;
//! - an assistant message with tool calls renders as `assistant: <content>`
//!   (content may be empty, leaving `assistant: `) followed, one line per
//!   call in order, by `tool_call(<name>): <arguments JSON>`, where the
//!   arguments are compact JSON with object keys sorted (as produced by
//!   [`canonical_json`]), e.g. `tool_call(read_file): {"path":"a.txt"}`;
//! - a tool message renders as `tool_result(<tool name>): <output>` (the
//!   tool name is empty when the message carries none);
//! - a user message with pictures (for a `models.vision` spec) is followed
//!   by one line per picture, `image(<mime>)`, e.g. `image(image/png)`.
//!
//! Content is inserted verbatim, so a multi-line content spans several lines.
//! The whole request renders as its messages' renderings joined with `\n`.
//!
//! # Matching
//!
//! `match` is searched (unanchored) in the rendering of the LAST message
//! (empty when there is none); `match_any` in the rendering of the whole
//! request; `purpose`, when present, must equal the request's purpose. A rule
//! matches when all of its present conditions hold (a rule with none matches
//! everything). Rules are tried in file order; the first match wins.
//!
//! # The answer
//!
//! In `reply`, and in every string value inside `arguments` (recursively;
//! object keys are left alone), `$N` and `${N}` are replaced by capture group
//! N of `match` (or of `match_any` when the rule has no `match`), `${name}`
//! by a named group, and `$$` by a literal `$`. A group that does not exist
//! or did not take part in the match is replaced by the empty string; a `$`
//! followed by anything else is kept as is. `$N` takes all the digits that
//! follow it: write `${1}0` for group 1 followed by a zero.
//!
//! Tool calls get the ids `call_1`, `call_2`, … from a counter kept per
//! provider. With `latency_ms`, the answer is delayed by that many
//! milliseconds (a tokio sleep); a streaming caller is given the reply word
//! by word, spread evenly over that time. Usage is estimated so that cost accounting
//! sees non-zero numbers: input tokens = ceil(characters of the rendered
//! request / 4), output tokens = ceil((characters of the reply + characters
//! of each call's arguments JSON) / 4).

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use regex::{Captures, Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::retry::excerpt;
use super::{
    ChatMessage, ModelError, ModelProvider, ModelRequest, ModelResponse, Purpose, Role, ToolCall,
    Usage,
};

/// Compiled-program bound per regex: generous for any hand-written rule,
/// small enough that a pathological pattern fails at load, not at run time.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Longest part of the last message quoted in a "no rule matches" error.
const NO_MATCH_QUOTE: usize = 200;

/// Largest rules file the provider reads; a bigger one is refused unread.
pub const MAX_SCRIPT_BYTES: u64 = 4 << 20;

/// Fields a rule may have, named in errors (which never quote the file).
const RULE_FIELDS: &str = "match, match_any, purpose, reply, tool_calls, latency_ms";

/// Replays answers from a rules file; see the module documentation for the
/// format and the matching contract.
///
/// The file is read once, on first use, on a blocking thread (never on an
/// async worker), through [`read_script`]: regular files only, at most
/// [`MAX_SCRIPT_BYTES`]. A failed read is retried on the next request.
#[derive(Debug)]
pub struct ScriptedProvider {
    path: String,
    rules: tokio::sync::OnceCell<Vec<Rule>>,
    next_call_id: AtomicU64,
}

#[derive(Debug)]
struct Rule {
    matcher: Option<Regex>,
    match_any: Option<Regex>,
    purpose: Option<Purpose>,
    reply: String,
    tool_calls: Vec<ScriptedCall>,
    latency: Option<Duration>,
}

#[derive(Debug)]
struct ScriptedCall {
    name: String,
    arguments: Value,
}

impl ScriptedProvider {
    /// A provider for the file at `path`, which is not touched until the
    /// first request.
    pub fn lazy(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().display().to_string(),
            rules: tokio::sync::OnceCell::new(),
            next_call_id: AtomicU64::new(0),
        }
    }

    /// Reads and compiles the rules file at `path` now (blocking: call it off
    /// the async runtime). Every error is a [`ModelError::Script`] naming the
    /// file and never quoting it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let rules = load_rules(path, &label)?;
        Ok(Self {
            path: label,
            rules: tokio::sync::OnceCell::new_with(Some(rules)),
            next_call_id: AtomicU64::new(0),
        })
    }

    /// Compiles rules from `text`; `path` only names the source in errors.
    pub fn parse(path: &str, text: &str) -> Result<Self, ModelError> {
        let rules = parse_rules(path, text)?;
        Ok(Self {
            path: path.to_string(),
            rules: tokio::sync::OnceCell::new_with(Some(rules)),
            next_call_id: AtomicU64::new(0),
        })
    }

    /// The file the rules came from, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    async fn rules(&self) -> Result<&[Rule], ModelError> {
        let rules = self
            .rules
            .get_or_try_init(|| async {
                let path = self.path.clone();
                tokio::task::spawn_blocking(move || load_rules(Path::new(&path), &path))
                    .await
                    .map_err(|e| ModelError::Script {
                        path: self.path.clone(),
                        message: format!("the reading task failed: {e}"),
                    })?
            })
            .await?;
        Ok(rules)
    }
}

/// Which rules files a model spec may name outside `mercury.yaml`: files
/// beneath one of the roots (`<data_dir>/models/` plus `models.scripted_roots`).
/// The specs the operator wrote in `mercury.yaml` itself are allowed as they
/// are. Anything else (a space's chain stored before this rule, a path a
/// space admin typed) is refused before the file is opened.
#[derive(Debug, Clone, Default)]
pub struct ScriptedPolicy {
    roots: Vec<PathBuf>,
    configured: HashSet<String>,
}

impl ScriptedPolicy {
    /// `roots` are canonicalised when they exist (a missing root holds
    /// nothing that could be opened anyway).
    pub fn new(roots: Vec<PathBuf>, configured: impl IntoIterator<Item = String>) -> Self {
        Self {
            roots: roots
                .into_iter()
                .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
                .collect(),
            configured: configured.into_iter().collect(),
        }
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// `Ok` when `path` was named in `mercury.yaml` or lies beneath a root:
    /// absolute, no `.` or `..`, and its directory, resolved, under a root
    /// (so a symlinked directory cannot lead out; the file itself is opened
    /// `O_NOFOLLOW`). The error names the rule, not the roots.
    pub fn check(&self, path: &str) -> Result<(), String> {
        if self.configured.contains(path) {
            return Ok(());
        }
        let refused = || {
            format!(
                "a space's chain may name scripted:PATH only for a file under <data dir>/models/ \
                 or a directory of models.scripted_roots, and {path:?} is not one"
            )
        };
        let p = Path::new(path);
        // Read from the string itself: `Path::components` drops a `.` and a
        // doubled `/`, so `<models>/./x.json` would pass it unseen.
        let plain = p.is_absolute()
            && path
                .split('/')
                .skip(1)
                .all(|seg| !matches!(seg, "" | "." | ".."))
            && p.components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_)));
        let (Some(dir), Some(name), true) = (p.parent(), p.file_name(), plain) else {
            return Err(refused());
        };
        let dir = std::fs::canonicalize(dir).map_err(|_| refused())?;
        let full = dir.join(name);
        if self.roots.iter().any(|r| full.starts_with(r) && full != *r) {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

fn load_rules(path: &Path, label: &str) -> Result<Vec<Rule>, ModelError> {
    let text = read_script(path).map_err(|message| ModelError::Script {
        path: label.to_string(),
        message,
    })?;
    parse_rules(label, &text)
}

/// Reads a rules file without ever blocking on it or following a link: the
/// last component is opened `O_NOFOLLOW | O_NONBLOCK` (so a FIFO returns at
/// once), and only a regular file of at most [`MAX_SCRIPT_BYTES`] (checked on
/// the open descriptor) is read. The error is a sentence about the file,
/// never its content.
pub fn read_script(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "is a symbolic link, which is never followed".to_string(),
            _ => format!("cannot open the script file: {e}"),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat the script file: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(
            "is not a regular file (FIFOs, devices, sockets and directories are refused)".into(),
        );
    }
    if meta.len() > MAX_SCRIPT_BYTES {
        return Err(format!("is larger than {MAX_SCRIPT_BYTES} bytes"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the script file: {e}"))?;
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(format!("is larger than {MAX_SCRIPT_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())
}

/// Compiles rules from `text`. Errors name positions and this format's own
/// field names, never a value or key taken from the text: the file may not
/// be a rules file at all.
fn parse_rules(path: &str, text: &str) -> Result<Vec<Rule>, ModelError> {
    let fail = |message: String| ModelError::Script {
        path: path.to_string(),
        message,
    };
    let top: Value = serde_json::from_str(text).map_err(|e| {
        fail(format!(
            "not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let Value::Object(mut top) = top else {
        return Err(fail(
            "the file must be a JSON object with a `rules` list".into(),
        ));
    };
    if top.keys().any(|k| k.as_str() != "rules") {
        return Err(fail(
            "the file has an unknown top-level field (only `rules` is allowed)".into(),
        ));
    }
    let Some(Value::Array(raw_rules)) = top.remove("rules") else {
        return Err(fail("the file must have a `rules` list".into()));
    };
    if raw_rules.is_empty() {
        return Err(fail(
            "`rules` is empty: no request could ever be answered".into(),
        ));
    }
    // Rules are decoded one by one so that an error can say which one.
    raw_rules
        .into_iter()
        .enumerate()
        .map(|(index, raw)| compile_rule(raw).map_err(|m| fail(format!("rule {index}: {m}"))))
        .collect()
}

fn string_field(rule: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match rule.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("`{field}` must be a string")),
    }
}

fn compile_rule(raw: Value) -> Result<Rule, String> {
    let Value::Object(raw) = raw else {
        return Err("is not a JSON object".into());
    };
    if raw.keys().any(|k| !RULE_FIELDS.split(", ").any(|f| f == k)) {
        return Err(format!(
            "has a field that is not a rule field (allowed: {RULE_FIELDS})"
        ));
    }
    let compile = |field: &str| -> Result<Option<Regex>, String> {
        string_field(&raw, field)?
            .map(|p| {
                RegexBuilder::new(&p)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|e| match e {
                        regex::Error::CompiledTooBig(_) => {
                            format!("bad `{field}` regex: it is too big once compiled")
                        }
                        _ => format!("bad `{field}` regex: it does not compile"),
                    })
            })
            .transpose()
    };
    let matcher = compile("match")?;
    let match_any = compile("match_any")?;
    let purpose = match raw.get("purpose") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            Purpose::deserialize(v)
                .map_err(|_| "`purpose` must be turn, judge, compact, ask or intake".to_string())?,
        ),
    };
    let latency = match raw.get("latency_ms") {
        None | Some(Value::Null) => None,
        Some(v) => Some(Duration::from_millis(v.as_u64().ok_or_else(|| {
            "`latency_ms` must be a whole number of milliseconds".to_string()
        })?)),
    };
    let calls = match raw.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls.clone(),
        Some(_) => return Err("`tool_calls` must be a list".into()),
    };
    let tool_calls = calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            let Value::Object(mut call) = call else {
                return Err(format!("tool_calls[{i}] is not a JSON object"));
            };
            if call.keys().any(|k| k != "name" && k != "arguments") {
                return Err(format!(
                    "tool_calls[{i}] has a field other than `name` and `arguments`"
                ));
            }
            let name = match call.remove("name") {
                Some(Value::String(n)) if !n.trim().is_empty() => n,
                Some(Value::String(_)) => {
                    return Err(format!("tool_calls[{i}] has an empty `name`"))
                }
                _ => return Err(format!("tool_calls[{i}] needs a string `name`")),
            };
            let arguments = match call.remove("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(v @ Value::Object(_)) => v,
                Some(_) => {
                    return Err(format!(
                        "tool_calls[{i}]: `arguments` must be a JSON object"
                    ))
                }
            };
            Ok(ScriptedCall { name, arguments })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reply = string_field(&raw, "reply")?;
    if reply.is_none() && tool_calls.is_empty() {
        return Err("has neither `reply` nor `tool_calls`, so it could answer nothing".into());
    }
    Ok(Rule {
        matcher,
        match_any,
        purpose,
        reply: reply.unwrap_or_default(),
        tool_calls,
        latency,
    })
}

/// One message as rules see it; see the module documentation.
pub fn render_message(message: &ChatMessage) -> String {
    match message.role {
        Role::Tool => format!(
            "tool_result({}): {}",
            message.tool_name.as_deref().unwrap_or(""),
            message.content
        ),
        role => {
            let mut out = format!("{}: {}", role.as_str(), message.content);
            for call in &message.tool_calls {
                out.push_str(&format!(
                    "\ntool_call({}): {}",
                    call.name,
                    canonical_json(&call.arguments)
                ));
            }
            for image in &message.images {
                out.push_str(&format!("\nimage({})", image.mime));
            }
            out
        }
    }
}

/// A whole request as `match_any` sees it: the messages' renderings joined
/// with `\n`.
pub fn render_request(req: &ModelRequest) -> String {
    req.messages
        .iter()
        .map(render_message)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compact JSON with object keys sorted, so that a rendering never depends on
/// how the map behind a `Value` orders its keys.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(key) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Expands `$N`, `${N}`, `${name}` and `$$` in `template`; see the module
/// documentation.
fn substitute(template: &str, caps: Option<&Captures<'_>>) -> String {
    let group = |key: &str| -> String {
        let found = match key.parse::<usize>() {
            Ok(n) => caps.and_then(|c| c.get(n)),
            Err(_) => caps.and_then(|c| c.name(key)),
        };
        found.map_or_else(String::new, |m| m.as_str().to_string())
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) if end > 0 => {
                    out.push_str(&group(&braced[..end]));
                    rest = &braced[end + 1..];
                }
                _ => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                out.push_str(&group(&after[..digits]));
                rest = &after[digits..];
            } else {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn substitute_value(value: &Value, caps: Option<&Captures<'_>>) -> Value {
    match value {
        Value::String(s) => Value::String(substitute(s, caps)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| substitute_value(v, caps)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute_value(v, caps)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

#[async_trait]
impl ModelProvider for ScriptedProvider {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let (response, latency) = self.answer(req).await?;
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        Ok(response)
    }

    /// The reply arrives word by word, spread evenly over the rule's
    /// `latency_ms` (all at once without one), as a model's stream would.
    async fn complete_streaming(
        &self,
        req: &ModelRequest,
        sink: &super::TextSink,
    ) -> Result<ModelResponse, ModelError> {
        let (response, latency) = self.answer(req).await?;
        let words: Vec<usize> = response
            .text
            .match_indices(' ')
            .map(|(i, _)| i + 1)
            .chain(std::iter::once(response.text.len()))
            .collect();
        let step = latency.map(|l| l / u32::try_from(words.len()).unwrap_or(u32::MAX));
        for end in words {
            if let Some(step) = step {
                tokio::time::sleep(step).await;
            }
            if end > 0 {
                sink(&response.text[..end]);
            }
        }
        Ok(response)
    }
}

impl ScriptedProvider {
    /// The first matching rule's answer and its latency.
    async fn answer(
        &self,
        req: &ModelRequest,
    ) -> Result<(ModelResponse, Option<Duration>), ModelError> {
        let rendered: Vec<String> = req.messages.iter().map(render_message).collect();
        let whole = rendered.join("\n");
        let last = rendered.last().map_or("", String::as_str);

        for (index, rule) in self.rules().await?.iter().enumerate() {
            if rule.purpose.is_some_and(|p| p != req.purpose) {
                continue;
            }
            let on_last = match &rule.matcher {
                Some(re) => match re.captures(last) {
                    Some(c) => Some(c),
                    None => continue,
                },
                None => None,
            };
            let on_whole = match &rule.match_any {
                Some(re) => match re.captures(&whole) {
                    Some(c) => Some(c),
                    None => continue,
                },
                None => None,
            };
            let caps = on_last.or(on_whole);
            tracing::debug!(script = %self.path, rule = index, purpose = req.purpose.as_str(), "scripted rule matched");

            let text = substitute(&rule.reply, caps.as_ref());
            let tool_calls: Vec<ToolCall> = rule
                .tool_calls
                .iter()
                .map(|call| ToolCall {
                    id: format!(
                        "call_{}",
                        self.next_call_id.fetch_add(1, Ordering::Relaxed) + 1
                    ),
                    name: call.name.clone(),
                    arguments: substitute_value(&call.arguments, caps.as_ref()),
                })
                .collect();
            let output_chars = text.chars().count()
                + tool_calls
                    .iter()
                    .map(|c| canonical_json(&c.arguments).chars().count())
                    .sum::<usize>();
            let usage = Usage {
                input_tokens: estimate_tokens(whole.chars().count()),
                output_tokens: estimate_tokens(output_chars),
            };
            let response = ModelResponse {
                text,
                tool_calls,
                usage,
            };
            return Ok((response, rule.latency));
        }
        Err(ModelError::Script {
            path: self.path.clone(),
            message: format!(
                "no rule matches the request (purpose {}, last message: {})",
                req.purpose.as_str(),
                excerpt(last, NO_MATCH_QUOTE)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Writes `text` to a fresh file under the system temp dir, removed
    /// when the returned path is dropped (they were left behind, a
    /// directory per test process).
    fn script_file(text: &str) -> tempfile::TempPath {
        use std::io::Write;
        let mut f = tempfile::Builder::new()
            .prefix("mercury-scripted-")
            .suffix(".json")
            .tempfile()
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.into_temp_path()
    }

    fn load(script: Value) -> ScriptedProvider {
        ScriptedProvider::load(script_file(&script.to_string())).unwrap()
    }

    fn load_err(text: &str) -> (String, String) {
        let path = script_file(text);
        match ScriptedProvider::load(&path) {
            Err(ModelError::Script { path: p, message }) => {
                assert_eq!(p, path.display().to_string());
                (p, message)
            }
            Err(other) => panic!("unexpected error: {other:?}"),
            Ok(_) => panic!("{text} loaded"),
        }
    }

    fn request(purpose: Purpose, messages: Vec<ChatMessage>) -> ModelRequest {
        ModelRequest {
            model: "script.json".into(),
            purpose,
            messages,
            tools: Vec::new(),
            max_tokens: 100,
        }
    }

    fn user(text: &str) -> ModelRequest {
        request(Purpose::Turn, vec![ChatMessage::text(Role::User, text)])
    }

    #[test]
    fn load_errors_are_clear() {
        let missing = std::env::temp_dir().join("mercury-no-such-script.json");
        match ScriptedProvider::load(&missing) {
            Err(ModelError::Script { path, message }) => {
                assert!(path.contains("mercury-no-such-script.json"));
                assert!(message.contains("cannot open"), "{message}");
            }
            other => panic!("unexpected: {other:?}"),
        }
        let cases: &[(&str, &str)] = &[
            ("{not json", "not valid JSON (line 1, column 2)"),
            ("[]", "must be a JSON object"),
            (r#"{"rules": []}"#, "`rules` is empty"),
            (r#"{"rulez": []}"#, "unknown top-level field (only `rules`"),
            (r#"{}"#, "must have a `rules` list"),
            (
                r#"{"rules": [{"reply": "a"}, {"replly": "b"}]}"#,
                "rule 1: has a field that is not a rule field",
            ),
            (
                r#"{"rules": [{"reply": "a"}, {"reply": "b"}, {"match": "(", "reply": "c"}]}"#,
                "rule 2: bad `match` regex",
            ),
            (
                r#"{"rules": [{"match_any": "a{99999999}", "reply": "c"}]}"#,
                "rule 0: bad `match_any` regex",
            ),
            (
                r#"{"rules": [{"match": "x"}]}"#,
                "rule 0: has neither `reply` nor `tool_calls`",
            ),
            (r#"{"rules": [{"tool_calls": []}]}"#, "rule 0: has neither"),
            (
                r#"{"rules": [{"purpose": "chat", "reply": "x"}]}"#,
                "rule 0: `purpose` must be turn, judge, compact, ask or intake",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": "shell", "arguments": [1]}]}]}"#,
                "`arguments` must be a JSON object",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": "shell", "args": {}}]}]}"#,
                "a field other than `name` and `arguments`",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": " "}]}]}"#,
                "empty `name`",
            ),
            (
                r#"{"rules": [{"reply": "x", "latency_ms": -1}]}"#,
                "rule 0: `latency_ms` must be a whole number",
            ),
            (
                r#"{"rules": [{"reply": 7}]}"#,
                "rule 0: `reply` must be a string",
            ),
        ];
        for (text, expected) in cases {
            let (_, message) = load_err(text);
            assert!(message.contains(expected), "{text}: {message}");
        }
    }

    /// The file named may not be a rules file at all (a space admin once
    /// pointed one at a host file): no error may quote a key or value of it.
    #[test]
    fn load_errors_never_quote_the_file() {
        let canary = "CANARY-7f3a";
        for text in [
            format!(r#"{{"{canary}": 1}}"#),
            format!(r#"{{"rules": [{{"{canary}": "x"}}]}}"#),
            format!(r#"{{"rules": [{{"purpose": "{canary}", "reply": "x"}}]}}"#),
            format!(r#"{{"rules": [{{"match": "({canary}", "reply": "x"}}]}}"#),
            format!(r#"{{"rules": [{{"reply": ["{canary}"]}}]}}"#),
            format!(r#"{{"rules": [{{"tool_calls": [{{"name": "{canary}", "arguments": 1}}]}}]}}"#),
            format!(r#"{{"rules": [{{"tool_calls": [{{"name": "x", "{canary}": 1}}]}}]}}"#),
            format!(r#"{{"rules": [{{"latency_ms": "{canary}", "reply": "x"}}]}}"#),
            format!("{canary} = 1\nsecret = {canary}"),
            format!(r#"{{"rules": "{canary}"}}"#),
        ] {
            let (_, message) = load_err(&text);
            assert!(!message.contains(canary), "{text}: {message}");
        }
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        let err = read_script(&fifo).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let err = read_script(dir.path()).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");

        let real = dir.path().join("real.json");
        std::fs::write(&real, r#"{"rules": [{"reply": "x"}]}"#).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = read_script(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(read_script(&real).is_ok());

        let big = dir.path().join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_SCRIPT_BYTES + 1).unwrap();
        let err = read_script(&big).unwrap_err();
        assert!(err.contains("larger than"), "{err}");
    }

    #[tokio::test]
    async fn a_lazy_provider_reads_its_file_on_first_use_only() {
        let path = script_file(r#"{"rules": [{"reply": "first"}]}"#);
        let provider = ScriptedProvider::lazy(&path);
        std::fs::write(&path, r#"{"rules": [{"reply": "second"}]}"#).unwrap();
        assert_eq!(provider.complete(&user("x")).await.unwrap().text, "second");
        std::fs::write(&path, r#"{"rules": [{"reply": "third"}]}"#).unwrap();
        assert_eq!(provider.complete(&user("x")).await.unwrap().text, "second");

        let missing = ScriptedProvider::lazy(std::env::temp_dir().join("mercury-no-such.json"));
        let err = missing.complete(&user("x")).await.unwrap_err();
        assert!(err.to_string().contains("cannot open"), "{err}");
    }

    #[tokio::test]
    async fn first_matching_rule_wins() {
        let provider = load(json!({"rules": [
            {"match": "hello", "reply": "first"},
            {"match": "hel+o", "reply": "second"},
            {"reply": "fallback"}
        ]}));
        assert_eq!(
            provider.complete(&user("hello there")).await.unwrap().text,
            "first"
        );
        assert_eq!(
            provider.complete(&user("hellllo")).await.unwrap().text,
            "second"
        );
        assert_eq!(
            provider.complete(&user("bye")).await.unwrap().text,
            "fallback"
        );
    }

    #[tokio::test]
    async fn purpose_filters_rules() {
        let provider = load(json!({"rules": [
            {"purpose": "judge", "reply": "{\"verdict\": \"ok\"}"},
            {"purpose": "compact", "match": "summar", "reply": "summary"},
            {"purpose": "turn", "reply": "turn answer"}
        ]}));
        let ask = |p| request(p, vec![ChatMessage::text(Role::User, "please summarise")]);
        assert_eq!(
            provider.complete(&ask(Purpose::Judge)).await.unwrap().text,
            "{\"verdict\": \"ok\"}"
        );
        assert_eq!(
            provider
                .complete(&ask(Purpose::Compact))
                .await
                .unwrap()
                .text,
            "summary"
        );
        assert_eq!(
            provider.complete(&ask(Purpose::Turn)).await.unwrap().text,
            "turn answer"
        );
        let err = provider.complete(&ask(Purpose::Ask)).await.unwrap_err();
        assert!(err.to_string().contains("purpose ask"), "{err}");
    }

    #[tokio::test]
    async fn match_only_sees_the_last_message_and_match_any_sees_all() {
        let provider = load(json!({"rules": [
            {"match": "secret", "reply": "last"},
            {"match_any": "(?m)^system: (.*)$", "reply": "any: $1"}
        ]}));
        let req = request(
            Purpose::Turn,
            vec![
                ChatMessage::text(Role::System, "be kind"),
                ChatMessage::text(Role::User, "the secret"),
                ChatMessage::text(Role::Assistant, "ok"),
            ],
        );
        assert_eq!(provider.complete(&req).await.unwrap().text, "any: be kind");
        let mut req = req;
        req.messages
            .push(ChatMessage::text(Role::User, "another secret"));
        assert_eq!(provider.complete(&req).await.unwrap().text, "last");
    }

    #[tokio::test]
    async fn both_conditions_must_hold() {
        let provider = load(json!({"rules": [
            {"match": "go", "match_any": "system: strict", "reply": "strict go"},
            {"match": "go", "reply": "plain go"}
        ]}));
        assert_eq!(
            provider.complete(&user("go")).await.unwrap().text,
            "plain go"
        );
        let req = request(
            Purpose::Turn,
            vec![
                ChatMessage::text(Role::System, "strict"),
                ChatMessage::text(Role::User, "go"),
            ],
        );
        assert_eq!(provider.complete(&req).await.unwrap().text, "strict go");
    }

    #[tokio::test]
    async fn captures_fill_reply_and_nested_argument_strings() {
        let provider = load(json!({"rules": [{
            "match": "^user: write (\\w+) to (?P<file>\\S+)(?: (urgent))?$",
            "reply": "Writing $1 to ${2}, ${file}; ${1}0 $$1 [$3] [$9] $x ${",
            "tool_calls": [{"name": "write_file", "arguments": {
                "path": "$2",
                "content": "$1",
                "meta": {"tags": ["w-$1", 7, true, {"deep": "${file}!"}], "count": 3},
                "$1": "keys stay"
            }}]
        }]}));
        let out = provider
            .complete(&user("write hello to notes.txt"))
            .await
            .unwrap();
        assert_eq!(
            out.text,
            "Writing hello to notes.txt, notes.txt; hello0 $1 [] [] $x ${"
        );
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].name, "write_file");
        assert_eq!(
            out.tool_calls[0].arguments,
            json!({
                "path": "notes.txt",
                "content": "hello",
                "meta": {"tags": ["w-hello", 7, true, {"deep": "notes.txt!"}], "count": 3},
                "$1": "keys stay"
            })
        );
    }

    #[tokio::test]
    async fn match_any_captures_are_used_without_match() {
        let provider = load(json!({"rules": [
            {"match_any": "name is (\\w+)", "purpose": "turn", "reply": "Hi $1"}
        ]}));
        let req = request(
            Purpose::Turn,
            vec![
                ChatMessage::text(Role::User, "my name is Ada"),
                ChatMessage::text(Role::Assistant, "noted"),
            ],
        );
        assert_eq!(provider.complete(&req).await.unwrap().text, "Hi Ada");
    }

    #[test]
    fn rendering_follows_the_contract() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "a.txt", "lines": {"to": 2, "from": 1}}),
        };
        let req = request(
            Purpose::Turn,
            vec![
                ChatMessage::text(Role::System, "sys"),
                ChatMessage::text(Role::User, "read a.txt"),
                ChatMessage {
                    tool_calls: vec![call.clone()],
                    ..ChatMessage::text(Role::Assistant, "")
                },
                ChatMessage::tool_result(&call, "line one\nline two"),
                ChatMessage::text(Role::Assistant, "done"),
            ],
        );
        assert_eq!(
            render_request(&req),
            "system: sys\n\
             user: read a.txt\n\
             assistant: \n\
             tool_call(read_file): {\"lines\":{\"from\":1,\"to\":2},\"path\":\"a.txt\"}\n\
             tool_result(read_file): line one\nline two\n\
             assistant: done"
        );
        let mut anonymous = ChatMessage::text(Role::Tool, "out");
        anonymous.tool_call_id = Some("x".into());
        assert_eq!(render_message(&anonymous), "tool_result(): out");
    }

    #[tokio::test]
    async fn tool_results_can_be_matched() {
        let provider = load(json!({"rules": [
            {"match": "(?s)^tool_result\\(read_file\\): (.*)$", "reply": "The file says: $1"},
            {"match": "read (\\S+)", "tool_calls": [{"name": "read_file", "arguments": {"path": "$1"}}]}
        ]}));
        let mut messages = vec![ChatMessage::text(Role::User, "read a.txt")];
        let first = provider
            .complete(&request(Purpose::Turn, messages.clone()))
            .await
            .unwrap();
        assert_eq!(first.text, "");
        let call = first.tool_calls[0].clone();
        assert_eq!(call.arguments, json!({"path": "a.txt"}));
        messages.push(ChatMessage {
            tool_calls: vec![call.clone()],
            ..ChatMessage::text(Role::Assistant, "")
        });
        messages.push(ChatMessage::tool_result(&call, "hello\nworld"));
        let second = provider
            .complete(&request(Purpose::Turn, messages))
            .await
            .unwrap();
        assert_eq!(second.text, "The file says: hello\nworld");
        assert!(second.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn call_ids_count_per_provider_and_usage_is_estimated() {
        let script = json!({"rules": [{"reply": "abcde", "tool_calls": [
            {"name": "a", "arguments": {"k": "v"}},
            {"name": "b"}
        ]}]});
        let provider = load(script.clone());
        let first = provider.complete(&user("hi")).await.unwrap();
        let second = provider.complete(&user("hi")).await.unwrap();
        let ids: Vec<&str> = first
            .tool_calls
            .iter()
            .chain(&second.tool_calls)
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["call_1", "call_2", "call_3", "call_4"]);
        let other = load(script);
        assert_eq!(
            other.complete(&user("hi")).await.unwrap().tool_calls[0].id,
            "call_1"
        );
        // "user: hi" is 8 chars -> 2; "abcde" + {"k":"v"} + {} = 5 + 9 + 2 = 16 -> 4.
        assert_eq!(
            first.usage,
            Usage {
                input_tokens: 2,
                output_tokens: 4
            }
        );
        let odd = load(json!({"rules": [{"reply": "x"}]}));
        assert_eq!(
            odd.complete(&user("h")).await.unwrap().usage,
            Usage {
                input_tokens: 2,
                output_tokens: 1
            }
        );
    }

    #[tokio::test]
    async fn latency_delays_the_answer() {
        let provider = load(json!({"rules": [{"reply": "slow", "latency_ms": 20}]}));
        let started = std::time::Instant::now();
        assert_eq!(provider.complete(&user("x")).await.unwrap().text, "slow");
        assert!(started.elapsed() >= Duration::from_millis(20));
    }

    #[tokio::test]
    async fn no_match_names_the_file_purpose_and_last_message() {
        let path = script_file(&json!({"rules": [{"match": "never", "reply": "x"}]}).to_string());
        let provider = ScriptedProvider::load(&path).unwrap();
        assert_eq!(provider.path(), path.display().to_string());
        let long = format!("start {}", "y".repeat(500));
        let err = provider
            .complete(&request(
                Purpose::Compact,
                vec![ChatMessage::text(Role::User, &long)],
            ))
            .await
            .unwrap_err();
        match &err {
            ModelError::Script { path: p, message } => {
                assert_eq!(p, &path.display().to_string());
                assert!(message.starts_with("no rule matches the request (purpose compact, last message: user: start yyy"), "{message}");
                assert!(message.chars().count() < 300, "{message}");
            }
            other => panic!("unexpected: {other:?}"),
        }
        assert!(err.to_string().contains(&path.display().to_string()));
        let empty = provider
            .complete(&request(Purpose::Turn, vec![]))
            .await
            .unwrap_err();
        assert!(empty.to_string().contains("last message: )"), "{empty}");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let v = json!({"b": [{"z": 1, "a": null}], "a": "q\"uote", "c": 1.5});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"q\"uote","b":[{"a":null,"z":1}],"c":1.5}"#
        );
    }

    #[tokio::test]
    async fn a_streaming_caller_gets_the_reply_word_by_word_over_its_latency() {
        let p = ScriptedProvider::parse(
            "inline",
            r#"{"rules": [{"reply": "one two three", "latency_ms": 30}]}"#,
        )
        .unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s2 = seen.clone();
        let sink: crate::model::TextSink =
            std::sync::Arc::new(move |t: &str| s2.lock().unwrap().push(t.to_owned()));
        let req = ModelRequest {
            model: "inline".into(),
            purpose: Purpose::Turn,
            messages: vec![ChatMessage::text(Role::User, "hi")],
            tools: Vec::new(),
            max_tokens: 10,
        };
        let started = std::time::Instant::now();
        let answer = p.complete_streaming(&req, &sink).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(answer.text, "one two three");
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["one ", "one two ", "one two three"]
        );
    }
}
