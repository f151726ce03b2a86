//! Model providers: one trait, three implementations.
//!
//! Owns the wire types of a chat turn (messages, tool calls, usage) and the
//! providers that turn a [`ModelRequest`] into a [`ModelResponse`]:
//! an OpenAI-compatible chat-completions client, an Anthropic Messages client
//! and the `scripted` provider that replays responses from a file. [`gate`]
//! decides when background work (the review judge) may call a model.
//!
//! Must never: hold a credential anywhere but in the host process, or retry a
//! request forever (retries are bounded and `Retry-After` is capped).
//!
//! This module is self-contained: it refers to nothing outside `crate::model`.

pub mod anthropic;
pub mod form;
pub mod gate;
pub mod openai;
mod retry;
pub mod scripted;
mod sse;
pub mod transcribe;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Why the host calls the model; the scripted provider filters rules on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    Turn,
    Judge,
    Compact,
    Ask,
    /// The review intake re-judging a finding (M2.1).
    Intake,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Turn => "turn",
            Purpose::Judge => "judge",
            Purpose::Compact => "compact",
            Purpose::Ask => "ask",
            Purpose::Intake => "intake",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A tool invocation the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id, echoed back on the tool result.
    pub id: String,
    pub name: String,
    /// Always a JSON object.
    pub arguments: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// Only on assistant messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Only on tool messages: the id of the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Only on tool messages: the name of the tool that produced `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Only on user messages: pictures for a model that takes them
    /// (`models.vision`); a chain's other models are sent the text alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImagePart>,
}

/// A picture as a model takes it: its type and its bytes in base64.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImagePart {
    /// `image/jpeg`, `image/png`, `image/gif` or `image/webp`.
    pub mime: String,
    pub base64: String,
}

impl ChatMessage {
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            images: Vec::new(),
        }
    }

    pub fn tool_result(call: &ToolCall, output: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: output.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call.id.clone()),
            tool_name: Some(call.name.clone()),
            images: Vec::new(),
        }
    }
}

/// A tool the model may call; `parameters` is a JSON Schema object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelRequest {
    /// The provider's model name (the part after `openai:` / `anthropic:`).
    pub model: String,
    pub purpose: Purpose,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model endpoint answered {status}: {message}")]
    Http { status: u16, message: String },
    #[error("could not reach the model endpoint: {0}")]
    Transport(String),
    #[error("model answer could not be understood: {0}")]
    Protocol(String),
    #[error("scripted model {path}: {message}")]
    Script { path: String, message: String },
    #[error("model call failed after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: String },
    #[error("model configuration: {0}")]
    Config(String),
}

/// Where a streaming call shows its answer while it is written: told the
/// whole text of the current attempt so far, each time it grows (an attempt
/// the retry loop starts again begins again from nothing, so a holder that
/// shows the latest text never shows a failed attempt's words beside the
/// next one's).
pub type TextSink = Arc<dyn Fn(&str) + Send + Sync>;

#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// `openai`, `anthropic` or `scripted`.
    fn name(&self) -> &'static str;
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError>;
    /// [`Self::complete`], telling `sink` the answer's text as it arrives.
    /// The response is the same as `complete`'s; a provider that cannot
    /// stream answers whole and tells the sink once.
    async fn complete_streaming(
        &self,
        req: &ModelRequest,
        sink: &TextSink,
    ) -> Result<ModelResponse, ModelError> {
        let response = self.complete(req).await?;
        if !response.text.is_empty() {
            sink(&response.text);
        }
        Ok(response)
    }
}

/// Where the HTTP providers live and how hard they retry. Keys stay here, in
/// the host; nothing in this struct is ever passed to a sandbox.
#[derive(Clone, Debug)]
pub struct ProviderSettings {
    pub openai_base_url: String,
    pub openai_api_key: Option<String>,
    pub anthropic_base_url: String,
    pub anthropic_api_key: Option<String>,
    pub request_timeout: Duration,
    /// Attempts after the first one, for 429 and 5xx answers and transport errors.
    pub max_retries: u32,
    /// First backoff step; doubles each attempt, with jitter.
    pub retry_base: Duration,
    /// Upper bound on any single wait, including a server's `Retry-After`.
    pub retry_after_cap: Duration,
    /// Counts the providers' rate-limit answers for the model gate.
    pub throttles: gate::ThrottleSignal,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            openai_base_url: "https://api.openai.com/v1".into(),
            openai_api_key: None,
            anthropic_base_url: "https://api.anthropic.com".into(),
            anthropic_api_key: None,
            request_timeout: Duration::from_secs(120),
            max_retries: 3,
            retry_base: Duration::from_millis(500),
            retry_after_cap: Duration::from_secs(30),
            throttles: gate::ThrottleSignal::default(),
        }
    }
}

/// A parsed model spec: `scripted:PATH`, `openai:MODEL` or `anthropic:MODEL`.
pub struct ResolvedModel {
    pub provider: Arc<dyn ModelProvider>,
    /// The model name sent to the provider (for scripted: the file path).
    pub model: String,
    /// The spec as written, for display and for `token_usage.model`.
    pub spec: String,
}

/// Builds the provider a spec names. Bad specs are a `ModelError::Config`
/// naming the spec and the accepted forms.
pub fn resolve_model(spec: &str, settings: &ProviderSettings) -> Result<ResolvedModel, ModelError> {
    let bad_spec = || {
        ModelError::Config(format!(
            "model spec `{spec}` is not understood: write `scripted:PATH`, `openai:MODEL` or `anthropic:MODEL`"
        ))
    };
    // Split on the first colon only: a scripted path may itself contain colons.
    let (kind, rest) = spec.split_once(':').ok_or_else(bad_spec)?;
    if rest.trim().is_empty() {
        return Err(bad_spec());
    }
    let provider: Arc<dyn ModelProvider> = match kind {
        // Read on first use, off the runtime: resolving never touches the file.
        "scripted" => Arc::new(scripted::ScriptedProvider::lazy(rest)),
        "openai" => Arc::new(openai::OpenAiProvider::new(settings)?),
        "anthropic" => Arc::new(anthropic::AnthropicProvider::new(settings)?),
        _ => return Err(bad_spec()),
    };
    Ok(ResolvedModel {
        provider,
        model: rest.to_string(),
        spec: spec.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_message(result: Result<ResolvedModel, ModelError>) -> String {
        match result {
            Err(ModelError::Config(message)) => message,
            Err(other) => panic!("unexpected error: {other:?}"),
            Ok(resolved) => panic!("resolved {}", resolved.spec),
        }
    }

    #[test]
    fn resolves_http_providers() {
        let settings = ProviderSettings::default();
        let openai = resolve_model("openai:gpt-4o-mini", &settings).unwrap();
        assert_eq!(openai.provider.name(), "openai");
        assert_eq!(openai.model, "gpt-4o-mini");
        assert_eq!(openai.spec, "openai:gpt-4o-mini");
        let anthropic = resolve_model("anthropic:claude-sonnet-4-5", &settings).unwrap();
        assert_eq!(anthropic.provider.name(), "anthropic");
        assert_eq!(anthropic.model, "claude-sonnet-4-5");
        // Model names with colons (Ollama tags) survive whole.
        let tagged = resolve_model("openai:llama3.1:8b", &settings).unwrap();
        assert_eq!(tagged.model, "llama3.1:8b");
    }

    #[tokio::test]
    async fn resolves_scripted_from_a_file() {
        let path =
            std::env::temp_dir().join(format!("mercury-resolve-{}.json", std::process::id()));
        std::fs::write(&path, r#"{"rules": [{"reply": "hi"}]}"#).unwrap();
        let spec = format!("scripted:{}", path.display());
        let resolved = resolve_model(&spec, &ProviderSettings::default()).unwrap();
        assert_eq!(resolved.provider.name(), "scripted");
        assert_eq!(resolved.model, path.display().to_string());
        assert_eq!(resolved.spec, spec);
        std::fs::remove_file(&path).unwrap();

        // Resolving reads nothing; the first request finds the file missing.
        let missing = resolve_model(&spec, &ProviderSettings::default()).unwrap();
        let req = ModelRequest {
            model: missing.model.clone(),
            purpose: Purpose::Turn,
            messages: vec![ChatMessage::text(Role::User, "hi")],
            tools: Vec::new(),
            max_tokens: 10,
        };
        match missing.provider.complete(&req).await {
            Err(ModelError::Script { path: p, .. }) => assert_eq!(p, path.display().to_string()),
            Err(other) => panic!("unexpected error: {other:?}"),
            Ok(_) => panic!("a missing script answered"),
        }
    }

    #[test]
    fn bad_specs_name_the_spec_and_the_accepted_forms() {
        let settings = ProviderSettings::default();
        for spec in [
            "gpt-4o",
            "mistral:large",
            "openai:",
            "anthropic:  ",
            "scripted:",
            ":x",
            "",
        ] {
            let message = config_message(resolve_model(spec, &settings));
            assert!(message.contains(&format!("`{spec}`")), "{message}");
            for form in ["scripted:PATH", "openai:MODEL", "anthropic:MODEL"] {
                assert!(message.contains(form), "{message}");
            }
        }
    }
}

/// What `mercury doctor` learns from a provider's endpoint, asked by the
/// running host with its own settings and key: a model list request, which
/// costs nothing and proves the address, the TLS and the key together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "verdict", content = "detail", rename_all = "snake_case")]
pub enum EndpointProbe {
    /// It answered (the status said).
    Answered(String),
    /// It answered that the key is not good (401/403).
    KeyRefused(String),
    /// It did not answer (the transport's error; scrub it before showing).
    Unreachable(String),
}

/// Asks `provider`'s endpoint (`openai`: `GET {base}/models`; `anthropic`:
/// `GET {base}/v1/models`) with the host's key. Never sends more, never
/// prints the key. `None` for a provider with no endpoint (`scripted`).
pub async fn probe_endpoint(settings: &ProviderSettings, provider: &str) -> Option<EndpointProbe> {
    let client = reqwest::Client::builder()
        .timeout(settings.request_timeout.min(Duration::from_secs(10)))
        .build()
        .ok()?;
    let (url, req) = match provider {
        "openai" => {
            let url = format!("{}/models", settings.openai_base_url.trim_end_matches('/'));
            let mut req = client.get(&url);
            if let Some(k) = settings.openai_api_key.as_deref().filter(|k| !k.is_empty()) {
                req = req.bearer_auth(k);
            }
            (url, req)
        }
        "anthropic" => {
            let url = format!(
                "{}/v1/models",
                settings.anthropic_base_url.trim_end_matches('/')
            );
            let mut req = client.get(&url).header("anthropic-version", "2023-06-01");
            if let Some(k) = settings
                .anthropic_api_key
                .as_deref()
                .filter(|k| !k.is_empty())
            {
                req = req.header("x-api-key", k);
            }
            (url, req)
        }
        _ => return None,
    };
    Some(match req.send().await {
        Ok(r) if matches!(r.status().as_u16(), 401 | 403) => {
            EndpointProbe::KeyRefused(format!("{url} answered {}", r.status().as_u16()))
        }
        Ok(r) => EndpointProbe::Answered(format!("{url} answered {}", r.status().as_u16())),
        // The caller scrubs: a base URL may carry userinfo.
        Err(e) => EndpointProbe::Unreachable(format!("{url}: {e}")),
    })
}
