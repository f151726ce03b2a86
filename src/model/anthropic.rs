//! The Anthropic Messages client: request encoding (system prompt apart,
//! strictly alternating user/assistant turns made of content blocks), answer
//! decoding, and the call itself through the shared retry loop.
//!
//! Must never: log or display the API key, send it anywhere but the
//! `x-api-key` header of the configured endpoint, or retry outside
//! [`super::retry`].

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use super::retry::{self, RetryPolicy, StreamedAnswer};
use super::{
    ModelError, ModelProvider, ModelRequest, ModelResponse, ProviderSettings, Role, TextSink,
    ToolCall, Usage,
};

/// The Messages API version this encoder speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Calls `POST {base_url}/v1/messages`.
pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    policy: RetryPolicy,
}

impl std::fmt::Debug for AnthropicProvider {
    // Hand-written so that the key can never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("policy", &self.policy)
            .finish()
    }
}

impl AnthropicProvider {
    /// Builds the client from `anthropic_base_url`, `anthropic_api_key`, the
    /// request timeout and the retry settings.
    pub fn new(settings: &ProviderSettings) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| {
                ModelError::Config(format!("cannot build the Anthropic HTTP client: {e}"))
            })?;
        Ok(Self {
            client,
            endpoint: format!(
                "{}/v1/messages",
                settings.anthropic_base_url.trim_end_matches('/')
            ),
            api_key: settings.anthropic_api_key.clone().filter(|k| !k.is_empty()),
            policy: RetryPolicy::from_settings(settings),
        })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = request_body(req)?;
        tracing::debug!(endpoint = %self.endpoint, model = %req.model, purpose = req.purpose.as_str(), "anthropic call");
        let text =
            retry::send_with_retry(&self.policy, &self.endpoint, || self.post(&body)).await?;
        parse_response(&text)
    }

    /// The same call with `stream: true`: `message_start` (input usage),
    /// content blocks opened, grown by `text_delta`/`input_json_delta` and
    /// closed, `message_delta` (output usage), `message_stop`.
    async fn complete_streaming(
        &self,
        req: &ModelRequest,
        sink: &TextSink,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = request_body(req)?;
        body["stream"] = json!(true);
        tracing::debug!(endpoint = %self.endpoint, model = %req.model, purpose = req.purpose.as_str(), "anthropic streaming call");
        let streamed: Streamed =
            retry::stream_with_retry(&self.policy, &self.endpoint, || self.post(&body), sink)
                .await?;
        streamed.into_response()
    }
}

impl AnthropicProvider {
    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let builder = self
            .client
            .post(&self.endpoint)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(body);
        match &self.api_key {
            Some(key) => builder.header("x-api-key", key),
            None => builder,
        }
    }
}

/// A streamed Messages answer as its events arrive.
#[derive(Debug, Default)]
struct Streamed {
    /// The content blocks by index, as `content_block_start` gave them, with
    /// what their deltas added: a text block's text, a tool_use block's
    /// input as JSON text.
    blocks: std::collections::BTreeMap<u64, (Value, String)>,
    /// The text blocks so far, in order (what the sink is shown).
    text: String,
    input_tokens: u64,
    output_tokens: u64,
}

impl StreamedAnswer for Streamed {
    /// Takes one event's data (its `type` names it, as the `event:` line
    /// does); `Ok(true)` at `message_stop`. An `overloaded_error` event is
    /// retried, another error is not.
    fn take(&mut self, data: &str, sink: &TextSink) -> Result<bool, (bool, String)> {
        let event: Value = serde_json::from_str(data).map_err(|e| {
            (
                false,
                format!(
                    "a messages stream event is not JSON ({e}): {}",
                    retry::excerpt(data, 200)
                ),
            )
        })?;
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                let usage = event.pointer("/message/usage");
                let count = |f: &str| usage.and_then(|u| u.get(f)).and_then(Value::as_u64);
                self.input_tokens = count("input_tokens").unwrap_or(0);
                self.output_tokens = count("output_tokens").unwrap_or(0);
            }
            Some("content_block_start") => {
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                if let Some(t) = block.get("text").and_then(Value::as_str) {
                    self.text.push_str(t);
                }
                self.blocks.insert(index, (block, String::new()));
            }
            Some("content_block_delta") => {
                let Some((_, grown)) = self.blocks.get_mut(&index) else {
                    return Err((
                        false,
                        format!("a messages stream grew block {index}, which it never opened"),
                    ));
                };
                let delta = event.get("delta");
                match delta.and_then(|d| d.get("type")).and_then(Value::as_str) {
                    Some("text_delta") => {
                        let piece = delta
                            .and_then(|d| d.get("text"))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        grown.push_str(piece);
                        if !piece.is_empty() {
                            self.text.push_str(piece);
                            sink(&self.text);
                        }
                    }
                    Some("input_json_delta") => grown.push_str(
                        delta
                            .and_then(|d| d.get("partial_json"))
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                    ),
                    // Thinking and signature deltas: blocks this host skips.
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(n) = event
                    .pointer("/usage/output_tokens")
                    .and_then(Value::as_u64)
                {
                    self.output_tokens = n;
                }
            }
            Some("message_stop") => return Ok(true),
            Some("error") => {
                let kind = event
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let why = format!(
                    "the stream carried an error: {}",
                    retry::error_message(data)
                );
                return Err((kind == "overloaded_error" || kind == "api_error", why));
            }
            // `ping`, `content_block_stop` and event types added later.
            _ => {}
        }
        Ok(false)
    }
}

impl Streamed {
    /// The answer as a whole Messages body would have given it, read by the
    /// same decoder.
    fn into_response(self) -> Result<ModelResponse, ModelError> {
        let mut content = Vec::with_capacity(self.blocks.len());
        for (index, (mut block, grown)) in self.blocks {
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "text" {
                let opened = block.get("text").and_then(Value::as_str).unwrap_or("");
                block["text"] = json!(format!("{opened}{grown}"));
            } else if kind == "tool_use" {
                let input = grown;
                let parsed = if input.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str(&input).map_err(|e| {
                        ModelError::Protocol(format!(
                            "the tool_use block {index} streamed an input that is not JSON ({e}): {}",
                            retry::excerpt(&input, 200)
                        ))
                    })?
                };
                block["input"] = parsed;
            }
            content.push(block);
        }
        let body = json!({
            "content": content,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        });
        parse_response(&body.to_string())
    }
}

/// The JSON body of a Messages request.
///
/// Consecutive messages that map to the same API role are merged into one
/// API message, because the API requires strict user/assistant alternation:
/// that is how several tool results become one user message of
/// `tool_result` blocks. Empty text blocks are dropped, as the API rejects
/// them.
fn request_body(req: &ModelRequest) -> Result<Value, ModelError> {
    let mut system: Vec<&str> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (index, m) in req.messages.iter().enumerate() {
        let (role, blocks) = match m.role {
            Role::System => {
                system.push(&m.content);
                continue;
            }
            Role::User => {
                // Pictures first, then the text about them (as the API's
                // guide orders them).
                let mut blocks: Vec<Value> = m
                    .images
                    .iter()
                    .map(|i| {
                        json!({"type": "image", "source": {"type": "base64", "media_type": i.mime, "data": i.base64}})
                    })
                    .collect();
                blocks.extend(text_block(&m.content));
                ("user", blocks)
            }
            Role::Assistant => {
                let mut blocks: Vec<Value> = text_block(&m.content).into_iter().collect();
                blocks.extend(m.tool_calls.iter().map(|c| {
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
                }));
                ("assistant", blocks)
            }
            Role::Tool => {
                let id = m.tool_call_id.as_deref().ok_or_else(|| {
                    ModelError::Protocol(format!(
                        "message {index} is a tool result without a tool_call_id; the endpoint could not match it to a call"
                    ))
                })?;
                (
                    "user",
                    vec![json!({"type": "tool_result", "tool_use_id": id, "content": m.content})],
                )
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();

    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    let system: Vec<&str> = system.into_iter().filter(|s| !s.is_empty()).collect();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    Ok(Value::Object(body))
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// Decodes a Messages answer body. Text blocks are concatenated in order;
/// block types this host does not use (e.g. `thinking`) are skipped.
fn parse_response(body: &str) -> Result<ModelResponse, ModelError> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        ModelError::Protocol(format!(
            "messages answer is not JSON ({e}): {}",
            retry::excerpt(body, 200)
        ))
    })?;
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ModelError::Protocol(format!(
                "messages answer has no `content` list: {}",
                retry::excerpt(body, 200)
            ))
        })?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let part = block.get("text").and_then(Value::as_str).ok_or_else(|| {
                    ModelError::Protocol(format!(
                        "content[{index}] is a text block without text: {block}"
                    ))
                })?;
                text.push_str(part);
            }
            Some("tool_use") => tool_calls.push(decode_tool_use(index, block)?),
            _ => {}
        }
    }
    let usage = value.get("usage");
    let count = |field: &str| {
        usage
            .and_then(|u| u.get(field))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ModelResponse {
        text,
        tool_calls,
        usage: Usage {
            input_tokens: count("input_tokens"),
            output_tokens: count("output_tokens"),
        },
    })
}

fn decode_tool_use(index: usize, block: &Value) -> Result<ToolCall, ModelError> {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ModelError::Protocol(format!(
                    "content[{index}] is a tool_use block without `{name}`: {block}"
                ))
            })
    };
    let (id, name) = (field("id")?, field("name")?);
    let arguments = match block.get("input") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(ModelError::Protocol(format!(
            "tool call `{name}` (content[{index}]) has an input that is not a JSON object: {other}"
        )))
        }
    };
    Ok(ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    use super::*;
    use crate::model::{ChatMessage, Purpose, ToolSpec};

    const KEY: &str = "sk-ant-test-456";
    const ROUTE: &str = "/v1/messages";

    fn api_error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
        ResponseTemplate::new(status)
            .set_body_json(json!({"type": "error", "error": {"type": kind, "message": message}}))
    }

    fn header<'r>(req: &'r Request, name: &str) -> Option<&'r str> {
        req.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The 400 the real API sends for a body it refuses, or `None` for a
    /// body it takes.
    fn refusal(body: &Value) -> Option<String> {
        if !body["max_tokens"].is_u64() {
            return Some("max_tokens: Field required".into());
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        // The real API insists on alternation starting with a user turn.
        for (i, m) in messages.iter().enumerate() {
            let expected = if i % 2 == 0 { "user" } else { "assistant" };
            if m["role"] != expected {
                return Some(format!(
                    "messages: roles must alternate; message {i} should be {expected}"
                ));
            }
        }
        None
    }

    /// Answers like the real API: the 400 for a refused body, `tool_use` for
    /// a fresh question, and text quoting every tool result once the last
    /// user turn carries them.
    fn answer(req: &Request) -> ResponseTemplate {
        let Ok(body) = req.body_json::<Value>() else {
            return api_error(400, "invalid_request_error", "body is not JSON");
        };
        if let Some(message) = refusal(&body) {
            return api_error(400, "invalid_request_error", &message);
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last_blocks = messages
            .last()
            .and_then(|m| m["content"].as_array().cloned())
            .unwrap_or_default();
        let results: Vec<String> = last_blocks
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["content"].as_str().unwrap_or("").to_string())
            .collect();
        let content = if results.is_empty() {
            json!([
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a.txt"}},
                {"type": "tool_use", "id": "toolu_02", "name": "read_file", "input": {"path": "b.txt"}}
            ])
        } else {
            json!([
                {"type": "text", "text": "Files say: "},
                {"type": "text", "text": results.join(" + ")}
            ])
        };
        ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_01", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": "end_turn",
            "usage": {"input_tokens": 33, "output_tokens": 11}
        }))
    }

    /// A local Messages endpoint. Mocks are tried by priority, then in
    /// mounting order: a wrong key (401) and a missing version header (400)
    /// come first; then the queued failures, each answering exactly once and
    /// in order; then [`answer`].
    async fn start(failures: Vec<(u16, Option<&'static str>)>) -> (MockServer, ProviderSettings) {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .and(|req: &Request| header(req, "x-api-key") != Some(KEY))
            .respond_with(api_error(401, "authentication_error", "invalid x-api-key"))
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .and(|req: &Request| header(req, "anthropic-version") != Some("2023-06-01"))
            .respond_with(api_error(
                400,
                "invalid_request_error",
                "anthropic-version: header is required",
            ))
            .with_priority(2)
            .mount(&server)
            .await;
        for (status, retry_after) in failures {
            let mut failure = api_error(status, "overloaded_error", &format!("synthetic {status}"));
            if let Some(value) = retry_after {
                failure = failure.insert_header("retry-after", value);
            }
            Mock::given(method("POST"))
                .and(path(ROUTE))
                .respond_with(failure)
                .up_to_n_times(1)
                .with_priority(3)
                .mount(&server)
                .await;
        }
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(answer)
            .with_priority(4)
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            anthropic_base_url: server.uri(),
            anthropic_api_key: Some(KEY.into()),
            request_timeout: Duration::from_secs(10),
            max_retries: 3,
            retry_base: Duration::from_millis(1),
            retry_after_cap: Duration::from_secs(5),
            ..ProviderSettings::default()
        };
        (server, settings)
    }

    /// The JSON bodies the endpoint received, in order.
    async fn requests(server: &MockServer) -> Vec<Value> {
        let received = server.received_requests().await.unwrap();
        received.iter().map(|r| r.body_json().unwrap()).collect()
    }

    async fn hits(server: &MockServer) -> usize {
        server.received_requests().await.unwrap().len()
    }

    fn request(messages: Vec<ChatMessage>) -> ModelRequest {
        ModelRequest {
            model: "claude-test".into(),
            purpose: Purpose::Turn,
            messages,
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read a file of the workspace".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }],
            max_tokens: 512,
        }
    }

    #[tokio::test]
    async fn tool_call_round_trip() {
        let (server, settings) = start(vec![]).await;
        let provider = AnthropicProvider::new(&settings).unwrap();
        let mut messages = vec![
            ChatMessage::text(Role::System, "You are helpful."),
            ChatMessage::text(Role::System, "Answer briefly."),
            ChatMessage::text(Role::User, "What is in a.txt and b.txt?"),
        ];
        let first = provider.complete(&request(messages.clone())).await.unwrap();
        assert_eq!(first.text, "Let me look.");
        assert_eq!(
            first.tool_calls,
            vec![
                ToolCall {
                    id: "toolu_01".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a.txt"})
                },
                ToolCall {
                    id: "toolu_02".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "b.txt"})
                },
            ]
        );
        assert_eq!(
            first.usage,
            Usage {
                input_tokens: 33,
                output_tokens: 11
            }
        );

        messages.push(ChatMessage {
            tool_calls: first.tool_calls.clone(),
            ..ChatMessage::text(Role::Assistant, first.text.clone())
        });
        messages.push(ChatMessage::tool_result(&first.tool_calls[0], "alpha"));
        messages.push(ChatMessage::tool_result(&first.tool_calls[1], "beta"));
        let second = provider.complete(&request(messages)).await.unwrap();
        assert_eq!(second.text, "Files say: alpha + beta");
        assert!(second.tool_calls.is_empty());

        let requests = requests(&server).await;
        assert_eq!(requests.len(), 2);
        let body = &requests[1];
        assert_eq!(body["model"], "claude-test");
        assert_eq!(body["max_tokens"], 512);
        assert_eq!(body["system"], "You are helpful.\n\nAnswer briefly.");
        assert_eq!(
            body["tools"],
            json!([{
                "name": "read_file",
                "description": "Read a file of the workspace",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}
            }])
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "What is in a.txt and b.txt?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_02", "name": "read_file", "input": {"path": "b.txt"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "alpha"},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "beta"}
                ]}
            ])
        );
    }

    #[test]
    fn no_system_and_no_tools_are_omitted() {
        let mut req = request(vec![ChatMessage::text(Role::User, "hi")]);
        req.tools.clear();
        let body = request_body(&req).unwrap();
        assert!(body.get("system").is_none(), "{body}");
        assert!(body.get("tools").is_none(), "{body}");
    }

    #[test]
    fn a_picture_is_an_image_block_before_the_text_it_came_with() {
        let asked = ChatMessage {
            images: vec![crate::model::ImagePart {
                mime: "image/png".into(),
                base64: "aGVsbG8=".into(),
            }],
            ..ChatMessage::text(Role::User, "what is this?")
        };
        let body = request_body(&request(vec![asked])).unwrap();
        assert_eq!(
            body["messages"][0]["content"],
            json!([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}},
                {"type": "text", "text": "what is this?"}
            ])
        );
    }

    #[tokio::test]
    async fn wrong_key_is_an_http_error_with_the_server_message() {
        let (server, mut settings) = start(vec![]).await;
        settings.anthropic_api_key = Some("sk-ant-wrong".into());
        let provider = AnthropicProvider::new(&settings).unwrap();
        let err = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap_err();
        match err {
            ModelError::Http { status, message } => {
                assert_eq!(status, 401);
                assert!(
                    message.contains("authentication_error: invalid x-api-key"),
                    "{message}"
                );
            }
            other => panic!("unexpected error: {other:?}"),
        }
        assert_eq!(hits(&server).await, 1);
        assert!(!format!("{provider:?}").contains("sk-ant-wrong"));
    }

    #[tokio::test]
    async fn retries_429_with_retry_after_then_succeeds() {
        let (server, settings) = start(vec![(429, Some("1"))]).await;
        let provider = AnthropicProvider::new(&settings).unwrap();
        let out = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        assert_eq!(out.tool_calls.len(), 2);
        assert_eq!(
            hits(&server).await,
            2,
            "the 429 must have been retried once"
        );
    }

    #[tokio::test]
    async fn retries_500_twice_then_succeeds() {
        let (server, settings) = start(vec![(500, None), (500, None)]).await;
        let provider = AnthropicProvider::new(&settings).unwrap();
        let out = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        assert_eq!(out.text, "Let me look.");
        assert_eq!(hits(&server).await, 3);
    }

    #[tokio::test]
    async fn overloaded_529_is_retried() {
        let (server, settings) = start(vec![(529, None)]).await;
        let provider = AnthropicProvider::new(&settings).unwrap();
        provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        assert_eq!(hits(&server).await, 2);
    }

    #[tokio::test]
    async fn bad_request_is_not_retried() {
        let (server, settings) = start(vec![(400, None)]).await;
        let provider = AnthropicProvider::new(&settings).unwrap();
        let err = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ModelError::Http { status: 400, .. }),
            "{err:?}"
        );
        assert_eq!(hits(&server).await, 1);
    }

    #[tokio::test]
    async fn exhausting_retries_reports_attempts_and_last_error() {
        let (server, mut settings) = start(vec![(529, None); 10]).await;
        settings.max_retries = 2;
        let provider = AnthropicProvider::new(&settings).unwrap();
        let err = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap_err();
        match err {
            ModelError::RetriesExhausted { attempts, last } => {
                assert_eq!(attempts, 3);
                assert!(last.contains("529"), "{last}");
            }
            other => panic!("unexpected error: {other:?}"),
        }
        assert_eq!(hits(&server).await, 3);
    }

    #[test]
    fn tool_results_then_user_text_share_one_user_turn() {
        let call = ToolCall {
            id: "t1".into(),
            name: "shell".into(),
            arguments: json!({}),
        };
        let messages = vec![
            ChatMessage::text(Role::User, "go"),
            ChatMessage {
                tool_calls: vec![call.clone()],
                ..ChatMessage::text(Role::Assistant, "")
            },
            ChatMessage::tool_result(&call, "done"),
            ChatMessage::text(Role::User, "and now?"),
        ];
        let body = request_body(&request(messages)).unwrap();
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shell", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "done"},
                    {"type": "text", "text": "and now?"}
                ]}
            ])
        );
    }

    #[test]
    fn malformed_answers_are_protocol_errors() {
        assert!(matches!(parse_response("{}"), Err(ModelError::Protocol(_))));
        assert!(matches!(
            parse_response("not json"),
            Err(ModelError::Protocol(_))
        ));
        let bad_input =
            json!({"content": [{"type": "tool_use", "id": "t", "name": "x", "input": "str"}]});
        assert!(matches!(
            parse_response(&bad_input.to_string()),
            Err(ModelError::Protocol(_))
        ));
        let thinking = json!({"content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "hi"}]});
        let out = parse_response(&thinking.to_string()).unwrap();
        assert_eq!(out.text, "hi");
        assert_eq!(out.usage, Usage::default());
    }

    /// A Messages event stream as the API sends it: named events, each
    /// with its `type` in the data too, a ping among them.
    fn streamed_answer() -> String {
        let events = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 25, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"no"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "tes.txt\"}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 17}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    #[tokio::test]
    async fn a_streamed_answer_grows_in_the_sink_and_decodes_like_a_whole_one() {
        let server = MockServer::start().await;
        let overloaded = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(ResponseTemplate::new(200).set_body_string(overloaded))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "text/event-stream")
                    .set_body_string(streamed_answer()),
            )
            .with_priority(2)
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            anthropic_base_url: server.uri(),
            anthropic_api_key: Some(KEY.into()),
            retry_base: Duration::from_millis(1),
            ..ProviderSettings::default()
        };
        let provider = AnthropicProvider::new(&settings).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s2 = seen.clone();
        let sink: TextSink =
            std::sync::Arc::new(move |t: &str| s2.lock().unwrap().push(t.to_owned()));
        let answer = provider
            .complete_streaming(&request(vec![ChatMessage::text(Role::User, "hi")]), &sink)
            .await
            .unwrap();
        assert_eq!(answer.text, "Let me look.");
        assert_eq!(
            answer.tool_calls,
            vec![ToolCall {
                id: "toolu_1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "notes.txt"}),
            }]
        );
        assert_eq!(
            answer.usage,
            Usage {
                input_tokens: 25,
                output_tokens: 17
            }
        );
        assert_eq!(*seen.lock().unwrap(), vec!["Let me ", "Let me look."]);
        // The overloaded stream was tried again; both asked for a stream.
        let bodies = requests(&server).await;
        assert_eq!(bodies.len(), 2);
        assert!(bodies.iter().all(|b| b["stream"] == true));
    }

    #[tokio::test]
    async fn a_stream_refusing_the_request_is_not_retried() {
        let server = MockServer::start().await;
        let refused = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"invalid_request_error\", \"message\": \"bad\"}}\n\n";
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(ResponseTemplate::new(200).set_body_string(refused))
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            anthropic_base_url: server.uri(),
            retry_base: Duration::from_millis(1),
            ..ProviderSettings::default()
        };
        let provider = AnthropicProvider::new(&settings).unwrap();
        let sink: TextSink = std::sync::Arc::new(|_: &str| {});
        let err = provider
            .complete_streaming(&request(vec![ChatMessage::text(Role::User, "hi")]), &sink)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ModelError::Protocol(ref m) if m.contains("invalid_request_error: bad")),
            "{err:?}"
        );
        assert_eq!(hits(&server).await, 1);
    }
}
