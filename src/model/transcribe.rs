//! Speech to text through an OpenAI-compatible `POST /audio/transcriptions`
//! (OpenAI's Whisper, a LiteLLM proxy, a local whisper server): a voice
//! note's bytes go up as `multipart/form-data` with the model's name, the
//! text comes back.
//!
//! Must never: send the key anywhere but the configured endpoint's
//! `Authorization` header, or retry outside [`super::retry`].

use serde_json::Value;

use super::retry::{self, RetryPolicy};
use super::{ModelError, ProviderSettings};

/// The text of `audio` (its type `mime`, named `file_name` in the form) as
/// `model` hears it, from `{openai_base_url}/audio/transcriptions`.
pub async fn transcribe(
    settings: &ProviderSettings,
    model: &str,
    audio: &[u8],
    mime: &str,
    file_name: &str,
) -> Result<String, ModelError> {
    let client = reqwest::Client::builder()
        .timeout(settings.request_timeout)
        .build()
        .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))?;
    let endpoint = format!(
        "{}/audio/transcriptions",
        settings.openai_base_url.trim_end_matches('/')
    );
    // The file name is the host's own (`inbox/…`'s last part), never a sender's.
    let (content_type, body) = super::form::Form::new()
        .text("model", model)
        .text("response_format", "json")
        .file("file", file_name, mime, audio)
        .finish();
    let policy = RetryPolicy::from_settings(settings);
    let key = settings.openai_api_key.clone().filter(|k| !k.is_empty());
    let text = retry::send_with_retry(&policy, &endpoint, || {
        let req = client
            .post(&endpoint)
            .header(reqwest::header::CONTENT_TYPE, &content_type)
            .body(body.clone());
        match &key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    })
    .await?;
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        ModelError::Protocol(format!(
            "a transcription answer is not JSON ({e}): {}",
            retry::excerpt(&text, 200)
        ))
    })?;
    value
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ModelError::Protocol(format!(
                "a transcription answer has no `text`: {}",
                retry::excerpt(&text, 200)
            ))
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    use super::*;

    #[tokio::test]
    async fn a_voice_note_goes_up_as_a_form_and_its_text_comes_back() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/audio/transcriptions"))
            .and(header("authorization", "Bearer sk-voice"))
            .respond_with(|req: &Request| {
                let ct = req
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let body = String::from_utf8_lossy(&req.body).into_owned();
                let ok = ct.starts_with("multipart/form-data; boundary=")
                    && body.contains("name=\"model\"\r\n\r\nwhisper-1\r\n")
                    && body.contains(
                        "filename=\"7-1.ogg\"\r\nContent-Type: audio/ogg\r\n\r\nOggS-bytes\r\n",
                    );
                if ok {
                    ResponseTemplate::new(200)
                        .set_body_json(serde_json::json!({"text": "buy milk"}))
                } else {
                    ResponseTemplate::new(400).set_body_string(body)
                }
            })
            .mount(&server)
            .await;
        let settings = ProviderSettings {
            openai_base_url: format!("{}/v1", server.uri()),
            openai_api_key: Some("sk-voice".into()),
            retry_base: Duration::from_millis(1),
            ..ProviderSettings::default()
        };
        let text = transcribe(
            &settings,
            "whisper-1",
            b"OggS-bytes",
            "audio/ogg",
            "7-1.ogg",
        )
        .await
        .unwrap();
        assert_eq!(text, "buy milk");
    }
}
