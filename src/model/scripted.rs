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
//!   {"match": "REGEX", "match_any": "REGEX", "purpose": "turn|judge|compact|ask",
//!    "reply": "TEXT", "tool_calls": [{"name": "NAME", "arguments": {}}],
//!    "latency_ms": 0}
//! ]}
//! ```
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
//!   tool name is empty when the message carries none).
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
//! milliseconds (a tokio sleep). Usage is estimated so that cost accounting
//! sees non-zero numbers: input tokens = ceil(characters of the rendered
//! request / 4), output tokens = ceil((characters of the reply + characters
//! of each call's arguments JSON) / 4).

use std::path::Path;
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

/// Replays answers from a rules file; see the module documentation for the
/// format and the matching contract.
#[derive(Debug)]
pub struct ScriptedProvider {
    path: String,
    rules: Vec<Rule>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "match")]
    matcher: Option<String>,
    match_any: Option<String>,
    purpose: Option<Purpose>,
    reply: Option<String>,
    tool_calls: Option<Vec<RawCall>>,
    latency_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

impl ScriptedProvider {
    /// Reads and compiles the rules file at `path`. Every error is a
    /// [`ModelError::Script`] naming the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Script {
            path: label.clone(),
            message: format!("cannot read the script file: {e}"),
        })?;
        Self::parse(&label, &text)
    }

    /// Compiles rules from `text`; `path` only names the source in errors.
    pub fn parse(path: &str, text: &str) -> Result<Self, ModelError> {
        let fail = |message: String| ModelError::Script {
            path: path.to_string(),
            message,
        };
        let top: Value =
            serde_json::from_str(text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
        let Value::Object(mut top) = top else {
            return Err(fail(
                "the file must be a JSON object with a `rules` list".into(),
            ));
        };
        if let Some(unknown) = top.keys().find(|k| k.as_str() != "rules") {
            return Err(fail(format!(
                "unknown top-level field `{unknown}` (only `rules` is allowed)"
            )));
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
        let rules = raw_rules
            .into_iter()
            .enumerate()
            .map(|(index, raw)| compile_rule(raw).map_err(|m| fail(format!("rule {index}: {m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            path: path.to_string(),
            rules,
            next_call_id: AtomicU64::new(0),
        })
    }

    /// The file the rules came from, as given.
    pub fn path(&self) -> &str {
        &self.path
    }
}

fn compile_rule(raw: Value) -> Result<Rule, String> {
    let raw: RawRule = serde_json::from_value(raw).map_err(|e| e.to_string())?;
    let compile = |field: &str, pattern: Option<String>| {
        pattern
            .map(|p| {
                RegexBuilder::new(&p)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|e| format!("bad `{field}` regex: {e}"))
            })
            .transpose()
    };
    let matcher = compile("match", raw.matcher)?;
    let match_any = compile("match_any", raw.match_any)?;
    let tool_calls = raw
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            if call.name.trim().is_empty() {
                return Err(format!("tool_calls[{i}] has an empty `name`"));
            }
            let arguments = match call.arguments {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(v @ Value::Object(_)) => v,
                Some(other) => {
                    return Err(format!(
                        "tool_calls[{i}] (`{}`): `arguments` must be a JSON object, not {other}",
                        call.name
                    ))
                }
            };
            Ok(ScriptedCall {
                name: call.name,
                arguments,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if raw.reply.is_none() && tool_calls.is_empty() {
        return Err("has neither `reply` nor `tool_calls`, so it could answer nothing".into());
    }
    Ok(Rule {
        matcher,
        match_any,
        purpose: raw.purpose,
        reply: raw.reply.unwrap_or_default(),
        tool_calls,
        latency: raw.latency_ms.map(Duration::from_millis),
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
        let rendered: Vec<String> = req.messages.iter().map(render_message).collect();
        let whole = rendered.join("\n");
        let last = rendered.last().map_or("", String::as_str);

        for (index, rule) in self.rules.iter().enumerate() {
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
            if let Some(latency) = rule.latency {
                tokio::time::sleep(latency).await;
            }
            return Ok(ModelResponse {
                text,
                tool_calls,
                usage,
            });
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
    use std::path::PathBuf;
    use std::sync::atomic::AtomicUsize;

    use serde_json::json;

    use super::*;

    /// Writes `text` to a fresh file under the system temp dir.
    fn script_file(text: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("mercury-scripted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("script-{}.json", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, text).unwrap();
        path
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
                assert!(message.contains("cannot read"), "{message}");
            }
            other => panic!("unexpected: {other:?}"),
        }
        let cases: &[(&str, &str)] = &[
            ("{not json", "not valid JSON"),
            ("[]", "must be a JSON object"),
            (r#"{"rules": []}"#, "`rules` is empty"),
            (r#"{"rulez": []}"#, "unknown top-level field `rulez`"),
            (r#"{}"#, "must have a `rules` list"),
            (
                r#"{"rules": [{"reply": "a"}, {"replly": "b"}]}"#,
                "rule 1: unknown field `replly`",
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
                "rule 0: unknown variant `chat`",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": "shell", "arguments": [1]}]}]}"#,
                "`arguments` must be a JSON object",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": "shell", "args": {}}]}]}"#,
                "unknown field `args`",
            ),
            (
                r#"{"rules": [{"tool_calls": [{"name": " "}]}]}"#,
                "empty `name`",
            ),
            (
                r#"{"rules": [{"reply": "x", "latency_ms": -1}]}"#,
                "rule 0:",
            ),
        ];
        for (text, expected) in cases {
            let (_, message) = load_err(text);
            assert!(message.contains(expected), "{text}: {message}");
        }
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
}
