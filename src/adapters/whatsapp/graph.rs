//! The Graph API calls the WhatsApp adapter makes: `POST
//! /{phone_number_id}/messages` (a text quoting the message it answers, a
//! template, or a picture or document by its media id), `POST
//! /{phone_number_id}/media` (a reply's file, uploaded first), and the
//! media lookup of an attachment; Meta's rate limits waited out and its
//! error codes sorted into what the outbox does next.
//!
//! Must never: put the access token in an error (it travels in the
//! `Authorization` header only, and errors are built without the URL), or
//! send to a base URL other than the configured one.

use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::WhatsAppConfig;
use crate::adapters::Backoff;

/// Rate-limit tries of one send before it counts as unreachable.
const MAX_WAITS: u32 = 6;
/// The longest `Retry-After` waited out at once.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

/// Meta's codes for "too many, later": the app's or the account's call
/// rate (4, 80007), the number's throughput (130429), spam limits (131048)
/// and the pair rate of one recipient (131056).
const RATE_LIMITED: &[i64] = &[4, 80007, 130429, 131048, 131056];
/// Outside the customer-service window ("re-engagement message").
const WINDOW_CLOSED: i64 = 131047;
/// The access token is invalid or expired.
const TOKEN_REFUSED: i64 = 190;
/// The largest picture WhatsApp shows as one; a larger one goes as a document.
const IMAGE_MAX: usize = 5 << 20;

/// How a send failed.
#[derive(Debug)]
pub(crate) enum GraphFailure {
    /// Meta refused it for good (a bad number, a template it does not know).
    Refused(String),
    /// Outside the 24-hour window, as Meta sees it.
    WindowClosed,
    /// No answer, a 5xx, a refused token, or rate limited past [`MAX_WAITS`].
    Unreachable(String),
    /// The adapter is stopping.
    Stopping,
}

pub(crate) struct Graph {
    http: reqwest::Client,
    url: String,
    media_url: String,
    token: String,
}

/// A call's body.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Json(&'a Value),
    Form {
        content_type: &'a str,
        body: &'a [u8],
    },
}

impl Graph {
    pub(crate) fn new(cfg: &WhatsAppConfig, token: String) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        let base = cfg.graph_base_url.trim_end_matches('/');
        Ok(Self {
            http,
            url: format!("{base}/{}/messages", cfg.phone_number_id),
            media_url: format!("{base}/{}/media", cfg.phone_number_id),
            token,
        })
    }

    /// A text to `to`, quoting `context` (the `wamid` it answers) if given.
    pub(crate) async fn send_text(
        &self,
        to: &str,
        text: &str,
        context: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<(), GraphFailure> {
        let mut body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "text",
            // A link in the reply is not fetched for a preview.
            "text": {"body": text, "preview_url": false},
        });
        if let Some(id) = context {
            body["context"] = json!({"message_id": id});
        }
        self.send(&body, cancel).await
    }

    /// The approved template `name` (no parameters) in `language`.
    pub(crate) async fn send_template(
        &self,
        to: &str,
        name: &str,
        language: &str,
        cancel: &CancellationToken,
    ) -> Result<(), GraphFailure> {
        let body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "template",
            "template": {"name": name, "language": {"code": language}},
        });
        self.send(&body, cancel).await
    }

    /// `file` (a reply's) uploaded, then sent to `to` by its media id: a
    /// JPEG or PNG of at most 5 MB as a picture, anything else as a
    /// document with its name.
    pub(crate) async fn send_file(
        &self,
        to: &str,
        file: &crate::adapters::ReplyFile,
        cancel: &CancellationToken,
    ) -> Result<(), GraphFailure> {
        let (content_type, body) = crate::model::form::Form::new()
            .text("messaging_product", "whatsapp")
            .text("type", file.mime)
            .file("file", &file.name, file.mime, &file.bytes)
            .finish();
        let form = Payload::Form {
            content_type: &content_type,
            body: &body,
        };
        let uploaded = self.post(&self.media_url, form, cancel).await?;
        let Some(id) = uploaded["id"].as_str() else {
            return Err(GraphFailure::Unreachable(
                "the media upload answered no id".into(),
            ));
        };
        let picture =
            matches!(file.mime, "image/jpeg" | "image/png") && file.bytes.len() <= IMAGE_MAX;
        let mut message = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
        });
        if picture {
            message["type"] = json!("image");
            message["image"] = json!({ "id": id });
        } else {
            message["type"] = json!("document");
            message["document"] = json!({ "id": id, "filename": file.name });
        }
        self.send(&message, cancel).await
    }

    async fn send(&self, body: &Value, cancel: &CancellationToken) -> Result<(), GraphFailure> {
        self.post(&self.url, Payload::Json(body), cancel)
            .await
            .map(|_| ())
    }

    /// POSTs to `url` until it is taken (its answer), refused, or rate
    /// limited [`MAX_WAITS`] times.
    async fn post(
        &self,
        url: &str,
        payload: Payload<'_>,
        cancel: &CancellationToken,
    ) -> Result<Value, GraphFailure> {
        let mut backoff = Backoff::default();
        for _ in 0..MAX_WAITS {
            let req = self.http.post(url).bearer_auth(&self.token);
            let req = match payload {
                Payload::Json(body) => req.json(body),
                Payload::Form { content_type, body } => req
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .body(body.to_vec()),
            };
            let res = tokio::select! {
                _ = cancel.cancelled() => return Err(GraphFailure::Stopping),
                r = req.send() => r,
            };
            let wait = match res {
                Err(e) => return Err(GraphFailure::Unreachable(e.without_url().to_string())),
                Ok(r) if r.status().is_success() => {
                    return Ok(r.json().await.unwrap_or(Value::Null));
                }
                Ok(r) => {
                    let status = r.status().as_u16();
                    let retry_after = r
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let err: Value = r.json().await.unwrap_or(Value::Null);
                    let code = err["error"]["code"].as_i64().unwrap_or(0);
                    // Meta's message names the rule broken, never the text sent.
                    let message: String = err["error"]["message"]
                        .as_str()
                        .unwrap_or("")
                        .chars()
                        .take(200)
                        .collect();
                    let what = format!("{status} (code {code}) {message}");
                    if status == 429 || RATE_LIMITED.contains(&code) {
                        tracing::info!(code, "whatsapp asked to slow down");
                        retry_after.map_or_else(|| backoff.next(), |d| d.min(RETRY_AFTER_CAP))
                    } else if code == WINDOW_CLOSED {
                        return Err(GraphFailure::WindowClosed);
                    } else if code == TOKEN_REFUSED || status == 401 || status >= 500 {
                        return Err(GraphFailure::Unreachable(what));
                    } else {
                        return Err(GraphFailure::Refused(what));
                    }
                }
            };
            if !crate::adapters::pause(cancel, wait).await {
                return Err(GraphFailure::Stopping);
            }
        }
        Err(GraphFailure::Unreachable(
            "still rate limited after several waits".into(),
        ))
    }
}

/// Fetches a message's media: `GET /{media-id}` gives a short-lived URL,
/// which is fetched with the same token, only on
/// `adapters.whatsapp.media_origins` and never through a redirect (the
/// token must go nowhere else).
pub(crate) struct GraphMedia {
    http: reqwest::Client,
    base: String,
    auth: String,
    origins: Vec<String>,
}

impl GraphMedia {
    pub(crate) fn new(cfg: &WhatsAppConfig, token: String) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Self {
            http,
            base: cfg.graph_base_url.trim_end_matches('/').to_owned(),
            auth: format!("Bearer {token}"),
            origins: cfg.media_origins.clone(),
        })
    }
}

#[async_trait::async_trait]
impl crate::runtime::AttachmentSource for GraphMedia {
    async fn fetch(
        &self,
        reference: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, crate::runtime::FetchError> {
        use crate::runtime::FetchError;
        // Media ids are digits: nothing else reaches the Graph API's path.
        if reference.is_empty() || !reference.bytes().all(|b| b.is_ascii_digit()) {
            return Err(FetchError::Failed("not a media id".into()));
        }
        let res = self
            .http
            .get(format!("{}/{reference}", self.base))
            .header(reqwest::header::AUTHORIZATION, &self.auth)
            .send()
            .await
            .map_err(|e| FetchError::Failed(format!("the media lookup: {}", e.without_url())))?;
        if !res.status().is_success() {
            return Err(FetchError::Failed(format!(
                "the media lookup answered {}",
                res.status()
            )));
        }
        let found: Value = res
            .json()
            .await
            .map_err(|e| FetchError::Failed(format!("the media lookup: {}", e.without_url())))?;
        if found["file_size"].as_u64().is_some_and(|n| n > max_bytes) {
            return Err(FetchError::TooLarge(max_bytes));
        }
        let url = found["url"]
            .as_str()
            .ok_or_else(|| FetchError::Failed("the media lookup gave no url".into()))?;
        crate::adapters::download_from(
            &self.http,
            url,
            &self.origins,
            "adapters.whatsapp.media_origins",
            Some(&self.auth),
            max_bytes,
        )
        .await
    }
}
