//! The OpenAI-compatible chat-completions client (OpenAI, Ollama, vLLM,
//! llama.cpp server, OpenRouter): request encoding, answer decoding, and the
//! call itself through the shared retry loop.
//!
//! Must never: log or display the API key, send it anywhere but the
//! `Authorization` header of the configured endpoint, or retry outside
//! [`super::retry`].

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use super::retry::{self, RetryPolicy, StreamedAnswer};
use super::{
    ChatMessage, ModelError, ModelProvider, ModelRequest, ModelResponse, ProviderSettings, Role,
    TextSink, ToolCall, Usage,
};

/// Calls `POST {base_url}/chat/completions`.
pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    policy: RetryPolicy,
}

impl std::fmt::Debug for OpenAiProvider {
    // Hand-written so that the key can never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("policy", &self.policy)
            .finish()
    }
}

impl OpenAiProvider {
    /// Builds the client from `openai_base_url`, `openai_api_key`, the
    /// request timeout and the retry settings.
    pub fn new(settings: &ProviderSettings) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| ModelError::Config(format!("cannot build the OpenAI HTTP client: {e}")))?;
        Ok(Self {
            client,
            endpoint: format!(
                "{}/chat/completions",
                settings.openai_base_url.trim_end_matches('/')
            ),
            api_key: settings.openai_api_key.clone().filter(|k| !k.is_empty()),
            policy: RetryPolicy::from_settings(settings),
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = request_body(req)?;
        tracing::debug!(endpoint = %self.endpoint, model = %req.model, purpose = req.purpose.as_str(), "openai call");
        let text =
            retry::send_with_retry(&self.policy, &self.endpoint, || self.post(&body)).await?;
        parse_response(&text)
    }

    /// The same call with `stream: true`: the answer comes as server-sent
    /// chunks (`choices[0].delta`), the usage in a last chunk
    /// (`stream_options.include_usage`), then `data: [DONE]`.
    async fn complete_streaming(
        &self,
        req: &ModelRequest,
        sink: &TextSink,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = request_body(req)?;
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        tracing::debug!(endpoint = %self.endpoint, model = %req.model, purpose = req.purpose.as_str(), "openai streaming call");
        let streamed: Streamed =
            retry::stream_with_retry(&self.policy, &self.endpoint, || self.post(&body), sink)
                .await?;
        streamed.into_response()
    }
}

impl OpenAiProvider {
    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let builder = self.client.post(&self.endpoint).json(body);
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }
}

/// A streamed answer as its chunks arrive: the text, each tool call's
/// pieces by its `index`, and the usage of the last chunk.
#[derive(Debug, Default)]
struct Streamed {
    text: String,
    /// id, name, arguments text (the arguments arrive in pieces).
    calls: std::collections::BTreeMap<u64, (String, String, String)>,
    usage: Value,
}

impl StreamedAnswer for Streamed {
    /// Takes one event's data; `Ok(true)` at `[DONE]`. An error object in
    /// the stream (a server that ran out of capacity mid-answer) is retried.
    fn take(&mut self, data: &str, sink: &TextSink) -> Result<bool, (bool, String)> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            (
                false,
                format!(
                    "a chat-completions stream chunk is not JSON ({e}): {}",
                    retry::excerpt(data, 200)
                ),
            )
        })?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err((
                true,
                format!(
                    "the stream carried an error: {}",
                    retry::error_message(&json!({ "error": error }).to_string())
                ),
            ));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = usage.clone();
        }
        let Some(delta) = chunk.pointer("/choices/0/delta") else {
            return Ok(false);
        };
        if let Some(piece) = delta.get("content").and_then(Value::as_str) {
            if !piece.is_empty() {
                self.text.push_str(piece);
                sink(&self.text);
            }
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let (id, name, arguments) = self.calls.entry(index).or_default();
            if let Some(given) = call.get("id").and_then(Value::as_str) {
                if id.is_empty() {
                    given.clone_into(id);
                }
            }
            if let Some(piece) = call.pointer("/function/name").and_then(Value::as_str) {
                name.push_str(piece);
            }
            match call.pointer("/function/arguments") {
                Some(Value::String(piece)) => arguments.push_str(piece),
                // Ollama sends the object whole.
                Some(v @ Value::Object(_)) => *arguments = v.to_string(),
                _ => {}
            }
        }
        Ok(false)
    }
}

impl Streamed {
    /// The answer as a whole chat-completions body would have given it, read
    /// by the same decoder (so a streamed answer is checked as strictly).
    fn into_response(self) -> Result<ModelResponse, ModelError> {
        let calls: Vec<Value> = self
            .calls
            .into_values()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let message = if calls.is_empty() {
            json!({"role": "assistant", "content": self.text})
        } else {
            json!({"role": "assistant", "content": self.text, "tool_calls": calls})
        };
        parse_response(&json!({"choices": [{"message": message}], "usage": self.usage}).to_string())
    }
}

/// The JSON body of a chat-completions request.
fn request_body(req: &ModelRequest) -> Result<Value, ModelError> {
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| encode_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("max_tokens".into(), json!(req.max_tokens));
    Ok(Value::Object(body))
}

fn encode_message(index: usize, m: &ChatMessage) -> Result<Value, ModelError> {
    Ok(match m.role {
        Role::User if !m.images.is_empty() => {
            // The text, then each picture as a data URL.
            let mut parts = vec![json!({"type": "text", "text": m.content})];
            parts.extend(m.images.iter().map(|i| {
                json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}", i.mime, i.base64)}})
            }));
            json!({ "role": "user", "content": parts })
        }
        Role::System | Role::User => json!({ "role": m.role.as_str(), "content": m.content }),
        Role::Assistant if m.tool_calls.is_empty() => {
            json!({ "role": "assistant", "content": m.content })
        }
        Role::Assistant => {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        // The API wants the arguments as a JSON *string*.
                        "function": { "name": c.name, "arguments": c.arguments.to_string() },
                    })
                })
                .collect();
            // A tool-calling turn with no prose is `null`, as the API itself sends it.
            let content = if m.content.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            };
            json!({ "role": "assistant", "content": content, "tool_calls": calls })
        }
        Role::Tool => {
            let id = m.tool_call_id.as_deref().ok_or_else(|| {
                ModelError::Protocol(format!(
                    "message {index} is a tool result without a tool_call_id; the endpoint could not match it to a call"
                ))
            })?;
            json!({ "role": "tool", "tool_call_id": id, "content": m.content })
        }
    })
}

/// Decodes a chat-completions answer body.
fn parse_response(body: &str) -> Result<ModelResponse, ModelError> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        ModelError::Protocol(format!(
            "chat-completions answer is not JSON ({e}): {}",
            retry::excerpt(body, 200)
        ))
    })?;
    let message = value
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .ok_or_else(|| {
            ModelError::Protocol(format!(
                "chat-completions answer has no choices[0].message: {}",
                retry::excerpt(body, 200)
            ))
        })?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ModelError::Protocol(format!(
                "choices[0].message.content is neither text nor null: {other}"
            )))
        }
    };
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| decode_tool_call(i, c))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ModelError::Protocol(format!(
                "choices[0].message.tool_calls is not a list: {other}"
            )))
        }
    };
    // Some compatible servers omit usage; cost accounting then sees zero.
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
            input_tokens: count("prompt_tokens"),
            output_tokens: count("completion_tokens"),
        },
    })
}

fn decode_tool_call(index: usize, call: &Value) -> Result<ToolCall, ModelError> {
    let function = call.get("function").ok_or_else(|| {
        ModelError::Protocol(format!("tool_calls[{index}] has no `function`: {call}"))
    })?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ModelError::Protocol(format!("tool_calls[{index}] has no function name: {call}"))
        })?;
    let arguments = match function.get("arguments") {
        // Argument-less calls arrive as "" or not at all from some servers.
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            ModelError::Protocol(format!(
                "tool call `{name}` (tool_calls[{index}]) has arguments that are not JSON ({e}): {}",
                retry::excerpt(s, 200)
            ))
        })?,
        // Ollama sends the object itself rather than a string.
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(ModelError::Protocol(format!(
                "tool call `{name}` (tool_calls[{index}]) has arguments of the wrong type: {other}"
            )))
        }
    };
    if !arguments.is_object() {
        return Err(ModelError::Protocol(format!(
            "tool call `{name}` (tool_calls[{index}]) has arguments that are not a JSON object: {arguments}"
        )));
    }
    // An id is needed to answer the call; synthesise one for servers that omit it.
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call_{index}"), str::to_string);
    Ok(ToolCall {
        id,
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
    use crate::model::{Purpose, ToolSpec};

    const KEY: &str = "sk-test-123";
    const ROUTE: &str = "/v1/chat/completions";

    fn api_error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
        ResponseTemplate::new(status)
            .set_body_json(json!({"error": {"message": message, "type": kind}}))
    }

    /// True when the request does not carry the test key the way the real
    /// API wants it (`Authorization: Bearer <key>`).
    fn unauthorised(req: &Request) -> bool {
        let auth = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        auth != Some(format!("Bearer {KEY}").as_str())
    }

    /// True when the body lacks what the real API requires.
    fn malformed(req: &Request) -> bool {
        let Ok(body) = req.body_json::<Value>() else {
            return true;
        };
        body["model"].as_str().is_none()
            || !body["messages"].is_array()
            || !body["max_tokens"].is_u64()
    }

    /// Answers like the real API: a tool call for a fresh question, and a
    /// text answer quoting the tool output once a tool result is present.
    fn answer(req: &Request) -> ResponseTemplate {
        let body: Value = req.body_json().unwrap();
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let message = if last["role"] == "tool" {
            json!({"role": "assistant", "content": format!("the file says: {}", last["content"].as_str().unwrap())})
        } else {
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"notes.txt\"}"}
                }]
            })
        };
        ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28}
        }))
    }

    /// A local chat-completions endpoint. Mocks are tried by priority, then
    /// in mounting order: a wrong key is a 401 before anything else; then the
    /// queued failures, each answering exactly once and in order; then the
    /// body check (400) and the answer.
    async fn start(failures: Vec<(u16, Option<&'static str>)>) -> (MockServer, ProviderSettings) {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .and(unauthorised)
            .respond_with(api_error(
                401,
                "invalid_request_error",
                "Incorrect API key provided",
            ))
            .with_priority(1)
            .mount(&server)
            .await;
        for (status, retry_after) in failures {
            let mut failure = api_error(status, "server_error", &format!("synthetic {status}"));
            if let Some(value) = retry_after {
                failure = failure.insert_header("retry-after", value);
            }
            Mock::given(method("POST"))
                .and(path(ROUTE))
                .respond_with(failure)
                .up_to_n_times(1)
                .with_priority(2)
                .mount(&server)
                .await;
        }
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .and(malformed)
            .respond_with(api_error(
                400,
                "invalid_request_error",
                "missing model, messages or max_tokens",
            ))
            .with_priority(3)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(answer)
            .with_priority(4)
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            openai_base_url: format!("{}/v1/", server.uri()),
            openai_api_key: Some(KEY.into()),
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
            model: "gpt-test".into(),
            purpose: Purpose::Turn,
            messages,
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read a file of the workspace".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }],
            max_tokens: 256,
        }
    }

    #[tokio::test]
    async fn tool_call_round_trip() {
        let (server, settings) = start(vec![]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
        let mut messages = vec![
            ChatMessage::text(Role::System, "You are helpful."),
            ChatMessage::text(Role::User, "What is in notes.txt?"),
        ];
        let first = provider.complete(&request(messages.clone())).await.unwrap();
        assert_eq!(first.text, "");
        assert_eq!(
            first.tool_calls,
            vec![ToolCall {
                id: "call_abc".into(),
                name: "read_file".into(),
                arguments: json!({"path": "notes.txt"}),
            }]
        );
        assert_eq!(
            first.usage,
            Usage {
                input_tokens: 21,
                output_tokens: 7
            }
        );

        let call = first.tool_calls[0].clone();
        messages.push(ChatMessage {
            tool_calls: first.tool_calls.clone(),
            ..ChatMessage::text(Role::Assistant, "")
        });
        messages.push(ChatMessage::tool_result(&call, "buy milk"));
        let second = provider.complete(&request(messages)).await.unwrap();
        assert_eq!(second.text, "the file says: buy milk");
        assert!(second.tool_calls.is_empty());

        let requests = requests(&server).await;
        assert_eq!(requests.len(), 2);
        let body = &requests[1];
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(body["max_tokens"], 256);
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {
                "name": "read_file",
                "description": "Read a file of the workspace",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
            }}])
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "What is in notes.txt?"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_abc", "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"notes.txt\"}"}
                }]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "buy milk"}
            ])
        );
    }

    #[tokio::test]
    async fn tools_are_omitted_when_empty() {
        let (server, settings) = start(vec![]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
        let mut req = request(vec![ChatMessage::text(Role::User, "hi")]);
        req.tools.clear();
        provider.complete(&req).await.unwrap();
        let requests = requests(&server).await;
        assert!(requests[0].get("tools").is_none(), "{}", requests[0]);
    }

    #[tokio::test]
    async fn wrong_key_is_an_http_error_with_the_server_message() {
        let (server, mut settings) = start(vec![]).await;
        settings.openai_api_key = Some("sk-wrong".into());
        let provider = OpenAiProvider::new(&settings).unwrap();
        let err = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap_err();
        match err {
            ModelError::Http { status, message } => {
                assert_eq!(status, 401);
                assert!(message.contains("Incorrect API key provided"), "{message}");
                assert!(!message.contains("sk-wrong"), "{message}");
            }
            other => panic!("unexpected error: {other:?}"),
        }
        assert_eq!(hits(&server).await, 1);
        assert!(!format!("{provider:?}").contains("sk-wrong"));
    }

    #[tokio::test]
    async fn retries_429_with_retry_after_then_succeeds() {
        let (server, settings) = start(vec![(429, Some("1"))]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
        let out = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(
            hits(&server).await,
            2,
            "the 429 must have been retried once"
        );
        // The model gate is told of it (it slows background calls).
        assert_eq!(settings.throttles.count(), 1);
    }

    #[tokio::test]
    async fn a_stated_rate_limit_budget_reaches_the_model_gate() {
        let server = MockServer::start().await;
        // 600 a minute (10 a second, a live reserve of 2.5), none left.
        let answer = ResponseTemplate::new(200)
            .set_body_json(json!({
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            }))
            .insert_header("x-ratelimit-limit-requests", "600")
            .insert_header("x-ratelimit-remaining-requests", "0");
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(answer)
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            openai_base_url: format!("{}/v1/", server.uri()),
            openai_api_key: Some(KEY.into()),
            ..ProviderSettings::default()
        };
        let gate =
            crate::model::gate::ModelGate::new(1, 1).with_throttles(settings.throttles.clone());
        let provider = OpenAiProvider::new(&settings).unwrap();
        provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        // The judge's call waits for 3.5 requests of refill: about 350 ms.
        let started = std::time::Instant::now();
        drop(gate.background().await);
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert!(gate.reserve_waits() > 0);
    }

    #[tokio::test]
    async fn retries_500_twice_then_succeeds() {
        let (server, settings) = start(vec![(500, None), (500, None)]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
        let out = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap();
        assert_eq!(out.tool_calls[0].name, "read_file");
        assert_eq!(hits(&server).await, 3);
    }

    #[tokio::test]
    async fn bad_request_is_not_retried() {
        let (server, settings) = start(vec![(400, None)]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
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
        let (server, settings) = start(vec![(503, None); 10]).await;
        let provider = OpenAiProvider::new(&settings).unwrap();
        let err = provider
            .complete(&request(vec![ChatMessage::text(Role::User, "hi")]))
            .await
            .unwrap_err();
        match err {
            ModelError::RetriesExhausted { attempts, last } => {
                assert_eq!(attempts, 4);
                assert!(last.contains("503"), "{last}");
                assert!(last.contains("synthetic"), "{last}");
            }
            other => panic!("unexpected error: {other:?}"),
        }
        assert_eq!(hits(&server).await, 4);
    }

    #[test]
    fn unparsable_arguments_are_a_protocol_error() {
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{not json"}}
        ]}}]})
        .to_string();
        let err = parse_response(&body).unwrap_err();
        assert!(
            matches!(&err, ModelError::Protocol(m) if m.contains("shell")),
            "{err:?}"
        );
    }

    #[test]
    fn lenient_argument_forms_and_missing_usage() {
        let body = json!({"choices": [{"message": {"content": "ok", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": ""}},
            {"type": "function", "function": {"name": "b", "arguments": {"x": 1}}}
        ]}}]})
        .to_string();
        let out = parse_response(&body).unwrap();
        assert_eq!(out.text, "ok");
        assert_eq!(out.tool_calls[0].arguments, json!({}));
        assert_eq!(out.tool_calls[1].arguments, json!({"x": 1}));
        assert_eq!(out.tool_calls[1].id, "call_1");
        assert_eq!(out.usage, Usage::default());
        let array_args = json!({"choices": [{"message": {"tool_calls": [
            {"id": "c1", "function": {"name": "a", "arguments": "[1,2]"}}
        ]}}]})
        .to_string();
        assert!(matches!(
            parse_response(&array_args),
            Err(ModelError::Protocol(_))
        ));
        assert!(matches!(
            parse_response("{\"choices\": []}"),
            Err(ModelError::Protocol(_))
        ));
        assert!(matches!(
            parse_response("<html>"),
            Err(ModelError::Protocol(_))
        ));
    }

    #[test]
    fn tool_message_without_id_is_rejected_before_sending() {
        let mut m = ChatMessage::text(Role::Tool, "out");
        m.tool_name = Some("shell".into());
        let err = request_body(&request(vec![m])).unwrap_err();
        assert!(
            matches!(&err, ModelError::Protocol(msg) if msg.contains("message 0")),
            "{err:?}"
        );
    }

    /// An event-stream body of chat-completions chunks, as the API sends it.
    fn sse(chunks: &[Value]) -> String {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        body.push_str("data: [DONE]\n\n");
        body
    }

    fn streamed_answer() -> String {
        let delta = |d: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": null}]});
        sse(&[
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Hel"})),
            delta(json!({"content": "lo, "})),
            delta(json!({"content": "world"})),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": ""}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":"}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"a.txt\"}"}}]})),
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}),
        ])
    }

    fn recorder() -> (TextSink, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let sink: TextSink =
            std::sync::Arc::new(move |t: &str| s2.lock().unwrap().push(t.to_owned()));
        (sink, seen)
    }

    #[tokio::test]
    async fn a_streamed_answer_grows_in_the_sink_and_decodes_like_a_whole_one() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "text/event-stream")
                    .set_body_string(streamed_answer()),
            )
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            openai_base_url: format!("{}/v1", server.uri()),
            openai_api_key: Some(KEY.into()),
            ..ProviderSettings::default()
        };
        let provider = OpenAiProvider::new(&settings).unwrap();
        let (sink, seen) = recorder();
        let answer = provider
            .complete_streaming(&request(vec![ChatMessage::text(Role::User, "hi")]), &sink)
            .await
            .unwrap();
        assert_eq!(answer.text, "Hello, world");
        assert_eq!(
            answer.tool_calls,
            vec![ToolCall {
                id: "call_9".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.txt"}),
            }]
        );
        assert_eq!(
            answer.usage,
            Usage {
                input_tokens: 11,
                output_tokens: 5
            }
        );
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["Hel", "Hello, ", "Hello, world"]
        );
        let body = &requests(&server).await[0];
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
    }

    #[tokio::test]
    async fn a_stream_that_breaks_off_or_carries_an_error_is_retried_from_the_start() {
        let server = MockServer::start().await;
        let cut = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lost words\"}}]}\n\n";
        let error = "data: {\"error\":{\"type\":\"server_error\",\"message\":\"overloaded\"}}\n\n";
        for body in [cut.to_string(), error.to_string()] {
            Mock::given(method("POST"))
                .and(path(ROUTE))
                .respond_with(ResponseTemplate::new(200).set_body_string(body))
                .up_to_n_times(1)
                .with_priority(1)
                .mount(&server)
                .await;
        }
        Mock::given(method("POST"))
            .and(path(ROUTE))
            .respond_with(ResponseTemplate::new(200).set_body_string(streamed_answer()))
            .with_priority(2)
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            openai_base_url: format!("{}/v1", server.uri()),
            max_retries: 3,
            retry_base: Duration::from_millis(1),
            ..ProviderSettings::default()
        };
        let provider = OpenAiProvider::new(&settings).unwrap();
        let (sink, seen) = recorder();
        let answer = provider
            .complete_streaming(&request(vec![ChatMessage::text(Role::User, "hi")]), &sink)
            .await
            .unwrap();
        assert_eq!(answer.text, "Hello, world");
        assert_eq!(hits(&server).await, 3);
        // The broken attempt's words were shown, then the next attempt's
        // text started again from nothing.
        let seen = seen.lock().unwrap();
        assert_eq!(seen.first().map(String::as_str), Some("lost words"));
        assert_eq!(seen.last().map(String::as_str), Some("Hello, world"));
        assert!(seen.contains(&"Hel".to_string()));
    }
}
