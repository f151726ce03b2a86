//! The Anthropic Messages client: request encoding (system prompt apart,
//! strictly alternating user/assistant turns made of content blocks), answer
//! decoding, and the call itself through the shared retry loop.
//!
//! Must never: log or display the API key, send it anywhere but the
//! `x-api-key` header of the configured endpoint, or retry outside
//! [`super::retry`].

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use super::retry::{self, RetryPolicy};
use super::{
    ModelError, ModelProvider, ModelRequest, ModelResponse, ProviderSettings, Role, ToolCall, Usage,
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
        let text = retry::send_with_retry(&self.policy, &self.endpoint, || {
            let builder = self
                .client
                .post(&self.endpoint)
                .header("anthropic-version", ANTHROPIC_VERSION)
                .json(&body);
            match &self.api_key {
                Some(key) => builder.header("x-api-key", key),
                None => builder,
            }
        })
        .await?;
        parse_response(&text)
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
            Role::User => ("user", text_block(&m.content).into_iter().collect()),
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
}
