//! The WhatsApp adapter, through Meta's official Cloud API: an actor under
//! the root supervisor that takes webhook notifications (the subscription
//! handshake's `hub.challenge` and every signed POST arrive on
//! `/api/adapters/whatsapp/webhook`; `crate::api` checks the verify token
//! and `X-Hub-Signature-256` with [`signature_ok`] before a byte of the body
//! is parsed), stores each text message through ingress, records delivery
//! statuses, and delivers WhatsApp's outbox items with the Graph API's
//! `POST /{phone_number_id}/messages` ([`graph`]).
//!
//! Meta redelivers a notification until it is answered 2xx, so the 2xx is
//! sent only once its rows are committed, and a redelivery (even after a
//! restart) is the same `wamid` again, which ingress keeps once: nothing is
//! lost and nothing is answered twice. A reply may be sent freely only
//! within 24 hours of the person's last message (the customer-service
//! window, `chat_windows`, written with the message's row); outside it the
//! configured template is sent instead, or nothing, and the operator is told
//! (the board's last error, the log, the outbox item's error).
//!
//! Must never: parse, store or answer a POST whose signature is not the
//! app secret's; put the access token or app secret in a log, an error or a
//! status; or act as anything but its platform-bound [`AdapterIdentity`].

pub(crate) mod graph;

use std::sync::Arc;

use hmac::{KeyInit, Mac};
use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;
use tokio_util::sync::CancellationToken;

use self::graph::{Graph, GraphFailure};
use super::registry::{AdapterRun, Platform};
use super::{split_reply, AdapterIdentity, AdapterKit, ChatAdapter, Sent};
use crate::app::App;
use crate::clock::now_ms;
use crate::config::{DmPolicy, Settings};
use crate::ingress::IngressMessage;
use crate::storage::attachments::NewAttachment;
use crate::storage::chat_windows;
use crate::storage::outbox::{DeliveryRefs, OutboxItem};
use crate::storage::StoreError;

/// The name on the board, of the platform and of the config section.
pub(crate) const ADAPTER: &str = "whatsapp";
/// The longest text body the Cloud API takes, in characters.
pub(crate) const MAX_MESSAGE: usize = 4096;
/// The largest reply file Mercury uploads (the Cloud API takes documents
/// up to 100 MB; a reply's file is read into memory whole).
const UPLOAD_MAX: usize = 50 << 20;
/// The customer-service window: replies are free within it.
pub(crate) const WINDOW_MS: i64 = 24 * 3600 * 1000;
/// The header Meta signs every POST with.
pub(crate) const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// WhatsApp on the adapters' registry.
pub(crate) struct WhatsApp;

/// `adapters.whatsapp`, the section this platform declares.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct WhatsAppConfig {
    pub enabled: bool,
    /// The Graph API's base URL, version included (a test's fake).
    pub graph_base_url: String,
    /// The business phone number's id (Meta's App Dashboard, WhatsApp > API Setup).
    pub phone_number_id: String,
    /// An approved template sent instead of a reply outside the 24-hour
    /// window; empty: nothing is sent.
    pub window_template: String,
    pub window_template_language: String,
    pub dm_policy: Option<DmPolicy>,
    /// The origins a media object's download URL may point at (fetched with
    /// the access token); a URL elsewhere is refused, never fetched.
    pub media_origins: Vec<String>,
}

impl Default for WhatsAppConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            graph_base_url: "https://graph.facebook.com/v21.0".into(),
            phone_number_id: String::new(),
            window_template: String::new(),
            window_template_language: "en_US".into(),
            dm_policy: None,
            media_origins: vec!["https://lookaside.fbsbx.com".into()],
        }
    }
}

pub(crate) fn config(settings: &Settings) -> WhatsAppConfig {
    settings
        .adapters
        .section(ADAPTER)
        .and_then(|v| serde_yaml_ng::from_value(v.clone()).ok())
        .unwrap_or_default()
}

impl Platform for WhatsApp {
    fn name(&self) -> &'static str {
        ADAPTER
    }

    /// The access token (a system user's), the app secret (signatures) and
    /// the verify token (the subscription handshake), in that order.
    fn secret_vars(&self) -> &'static [&'static str] {
        &[
            "MERCURY_WHATSAPP_ACCESS_TOKEN",
            "MERCURY_WHATSAPP_APP_SECRET",
            "MERCURY_WHATSAPP_VERIFY_TOKEN",
        ]
    }

    fn enabled(&self, settings: &Settings) -> bool {
        config(settings).enabled
    }

    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy> {
        config(settings).dm_policy
    }

    fn identifier_patterns(&self) -> &'static [&'static str] {
        &[
            r"(?i)\bwhatsapp ?: ?\+?[0-9]{5,15}\b",
            // Message ids carry the sender's number, base64-encoded.
            r"\bwamid\.[A-Za-z0-9_=+/\-]{8,}",
        ]
    }

    fn section_defaults(&self) -> Option<Yaml> {
        serde_yaml_ng::to_value(WhatsAppConfig::default()).ok()
    }

    fn check(&self, settings: &Settings) -> Result<(), (String, String)> {
        let key = |k: &str| format!("adapters.whatsapp.{k}");
        let section = settings.adapters.section(ADAPTER).cloned();
        let c: WhatsAppConfig = serde_yaml_ng::from_value(section.unwrap_or(Yaml::Null))
            .map_err(|e| ("adapters.whatsapp".to_owned(), e.to_string()))?;
        let url = &c.graph_base_url;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(['?', '#'])
        {
            return Err((
                key("graph_base_url"),
                "must start with http:// or https:// and hold no query".into(),
            ));
        }
        if c.enabled
            && (c.phone_number_id.is_empty()
                || !c.phone_number_id.chars().all(|ch| ch.is_ascii_digit()))
        {
            return Err((
                key("phone_number_id"),
                "WhatsApp needs the business phone number's id (digits, from the App Dashboard)"
                    .into(),
            ));
        }
        if c.window_template.len() > 512 || c.window_template_language.len() > 16 {
            return Err((key("window_template"), "is too long".into()));
        }
        Ok(())
    }
}

impl ChatAdapter for WhatsApp {
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun {
        Box::pin(async move { run(kit, cancel).await.map_err(|e| e.to_string()) })
    }

    fn intake(&self, kit: &AdapterKit, cancel: CancellationToken) -> Option<AdapterRun> {
        let kit = kit.clone();
        Some(Box::pin(async move {
            intake(kit, cancel).await.map_err(|e| e.to_string())
        }))
    }

    /// Media only: WhatsApp cannot edit a sent message, so a reply is
    /// never streamed.
    fn turn_tools(
        &self,
        kit: &AdapterKit,
        _cancel: CancellationToken,
    ) -> Result<super::TurnTools, String> {
        let media = graph::GraphMedia::new(&config(&kit.app.rt.settings), kit.secret(0))?;
        Ok(super::TurnTools {
            editor: None,
            source: Some(Arc::new(media)),
        })
    }
}

/// Whether `header` (`sha256=<hex>`) is the HMAC-SHA256 of `body` under
/// the app secret, compared in constant time. The one check a POST passes
/// before its body is parsed.
pub(crate) fn signature_ok(app_secret: &str, header: Option<&[u8]>, body: &[u8]) -> bool {
    let Some(hex) = header.and_then(|h| h.strip_prefix(b"sha256=")) else {
        return false;
    };
    let Ok(given) = base16ct::mixed::decode_vec(hex) else {
        return false;
    };
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(app_secret.as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum WhatsAppError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A webhook notification (`object: whatsapp_business_account`), the parts
/// Mercury reads.
#[derive(Debug, Deserialize)]
struct Notification {
    #[serde(default)]
    object: String,
    #[serde(default)]
    entry: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(default)]
    changes: Vec<Change>,
}

#[derive(Debug, Deserialize)]
struct Change {
    #[serde(default)]
    field: String,
    value: Option<ChangeValue>,
}

#[derive(Debug, Deserialize)]
struct ChangeValue {
    metadata: Option<Metadata>,
    #[serde(default)]
    contacts: Vec<Contact>,
    #[serde(default)]
    messages: Vec<WaMessage>,
    #[serde(default)]
    statuses: Vec<WaStatus>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    #[serde(default)]
    phone_number_id: String,
}

#[derive(Debug, Deserialize)]
struct Contact {
    #[serde(default)]
    wa_id: String,
    profile: Option<Profile>,
}

#[derive(Debug, Deserialize)]
struct Profile {
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WaMessage {
    from: String,
    id: String,
    #[serde(default)]
    timestamp: String,
    #[serde(rename = "type", default)]
    kind: String,
    text: Option<Body>,
    image: Option<Captioned>,
    video: Option<Captioned>,
    document: Option<Captioned>,
    audio: Option<Captioned>,
    button: Option<ButtonReply>,
    context: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Body {
    body: String,
}

/// A media object of a message: its id (fetched through the Graph API at
/// turn time), type, caption and a document's file name.
#[derive(Debug, Deserialize)]
struct Captioned {
    caption: Option<String>,
    id: Option<String>,
    mime_type: Option<String>,
    filename: Option<String>,
    /// An audio message recorded in the chat (a voice note).
    #[serde(default)]
    voice: bool,
}

#[derive(Debug, Deserialize)]
struct ButtonReply {
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WaStatus {
    #[serde(default)]
    status: String,
    #[serde(default)]
    errors: Vec<StatusError>,
}

#[derive(Debug, Deserialize)]
struct StatusError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    title: String,
}

impl WaMessage {
    /// The text Mercury stores: a text's body, a media caption, a quick
    /// reply button's label; `None` for what carries none (voice, stickers,
    /// reactions, locations).
    fn text(&self) -> Option<&str> {
        match self.kind.as_str() {
            "text" => self.text.as_ref().map(|t| t.body.as_str()),
            "image" => self.image.as_ref().and_then(|m| m.caption.as_deref()),
            "video" => self.video.as_ref().and_then(|m| m.caption.as_deref()),
            "document" => self.document.as_ref().and_then(|m| m.caption.as_deref()),
            "button" => self.button.as_ref().and_then(|b| b.text.as_deref()),
            _ => None,
        }
        .filter(|t| !t.trim().is_empty())
    }

    /// The media the message carried, by the ids the Graph API resolves.
    fn attachments(&self) -> Vec<NewAttachment> {
        let media = match self.kind.as_str() {
            "image" => self.image.as_ref().map(|m| ("image", m)),
            "video" => self.video.as_ref().map(|m| ("video", m)),
            "document" => self.document.as_ref().map(|m| ("file", m)),
            "audio" => self
                .audio
                .as_ref()
                .map(|m| (if m.voice { "voice" } else { "audio" }, m)),
            _ => None,
        };
        media
            .and_then(|(kind, m)| {
                Some(NewAttachment {
                    kind: kind.into(),
                    reference: m.id.clone()?,
                    name: m.filename.clone(),
                    mime: m.mime_type.as_deref().map(super::bare_mime),
                    size: None,
                })
            })
            .into_iter()
            .collect()
    }

    /// When it was sent (ms), never later than now: the window's start.
    fn sent_at(&self, now: i64) -> i64 {
        self.timestamp
            .parse::<i64>()
            .ok()
            .map_or(now, |s| s.saturating_mul(1000).min(now))
    }
}

struct Ctx {
    app: Arc<App>,
    graph: Graph,
    cfg: WhatsAppConfig,
    identity: AdapterIdentity,
    cancel: CancellationToken,
}

/// The context both halves share, built from the kit.
fn context(kit: &AdapterKit, cancel: CancellationToken) -> Result<Arc<Ctx>, WhatsAppError> {
    let cfg = config(&kit.app.rt.settings);
    let graph = Graph::new(&cfg, kit.secret(0)).map_err(WhatsAppError::Client)?;
    Ok(Arc::new(Ctx {
        app: kit.app.clone(),
        graph,
        cfg,
        identity: AdapterIdentity::bound_to(ADAPTER),
        cancel,
    }))
}

/// Delivery: the outbox, one host of a deployment at a time.
async fn run(kit: AdapterKit, cancel: CancellationToken) -> Result<(), WhatsAppError> {
    let ctx = context(&kit, cancel)?;
    let board = ctx.app.adapters.clone();
    board.set_mode(ADAPTER, "webhook");
    board.connected(ADAPTER);
    let send = |item, refs| deliver(&ctx, item, refs);
    Ok(super::deliver_outbox(&ctx.app, ADAPTER, &ctx.cancel, send).await?)
}

/// Intake: the notifications `crate::api` passes on (signed, parsed),
/// on every host, until the adapter stops; a store that fails answers
/// Meta 503 (it redelivers) and restarts the adapter.
async fn intake(kit: AdapterKit, cancel: CancellationToken) -> Result<(), WhatsAppError> {
    let ctx = context(&kit, cancel)?;
    let (secret, verify) = (kit.secret(1), Some(kit.secret(2)));
    let take = |body| take(&ctx, body);
    super::take_webhook_calls(
        &ctx.app.adapters,
        ADAPTER,
        secret,
        verify,
        &ctx.cancel,
        take,
    )
    .await
}

/// Stores every message of one (signed) notification and records its
/// statuses. A shape Mercury cannot read is acknowledged and skipped: Meta
/// would otherwise redeliver it for days.
async fn take(ctx: &Arc<Ctx>, body: serde_json::Value) -> Result<(), WhatsAppError> {
    let n: Notification = match serde_json::from_value(body) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "whatsapp notification Mercury cannot read; skipped");
            return Ok(());
        }
    };
    if n.object != "whatsapp_business_account" {
        tracing::debug!(object = %n.object, "not a WhatsApp notification; skipped");
        return Ok(());
    }
    for value in n
        .entry
        .into_iter()
        .flat_map(|e| e.changes)
        .filter(|c| c.field == "messages")
        .filter_map(|c| c.value)
    {
        let ours = value
            .metadata
            .as_ref()
            .is_none_or(|m| m.phone_number_id == ctx.cfg.phone_number_id);
        if !ours {
            tracing::debug!("a notification for another phone number; skipped");
            continue;
        }
        for s in &value.statuses {
            status(ctx, s);
        }
        for m in &value.messages {
            message(ctx, m, &value.contacts).await?;
        }
    }
    Ok(())
}

fn status(ctx: &Ctx, s: &WaStatus) {
    match s.status.as_str() {
        "failed" => {
            let why: Vec<String> = s
                .errors
                .iter()
                .map(|e| format!("{} {}", e.code, e.title))
                .collect();
            let why = format!("WhatsApp could not deliver a reply: {}", why.join("; "));
            tracing::warn!(reason = %why, "whatsapp delivery failed");
            ctx.app.adapters.note(ADAPTER, &why);
        }
        other => tracing::debug!(status = other, "whatsapp delivery status"),
    }
}

async fn message(ctx: &Arc<Ctx>, m: &WaMessage, contacts: &[Contact]) -> Result<(), WhatsAppError> {
    let now = now_ms();
    let (from, at) = (m.from.clone(), m.sent_at(now));
    // The person wrote: the window opens whether or not the message has text.
    let window = move |tx: &crate::storage::Tx<'_>| chat_windows::touch(tx, ADAPTER, &from, at);
    ctx.app.adapters.updated(ADAPTER);
    let carried = m.attachments();
    if m.text().is_none() && carried.is_empty() {
        tracing::debug!(kind = %m.kind, "whatsapp message without text; not stored");
        ctx.app.rt.store.write(window).await?;
        return Ok(());
    }
    let text = super::with_markers(m.text().unwrap_or(""), &carried);
    // What the message carried is stored with it, fetched at turn time.
    let (conversation, pid) = (m.from.clone(), m.id.clone());
    let window = move |tx: &crate::storage::Tx<'_>| {
        window(tx)?;
        crate::storage::attachments::attach(tx, ADAPTER, &conversation, &pid, &carried).map(|_| ())
    };
    let name = contacts
        .iter()
        .find(|c| c.wa_id == m.from)
        .and_then(|c| c.profile.as_ref())
        .and_then(|p| p.name.as_deref())
        .and_then(super::clean_name);
    let im = IngressMessage {
        platform: ADAPTER.into(),
        conversation: m.from.clone(),
        sender_id: m.from.clone(),
        sender_name: name,
        text,
        message_id: m.id.clone(),
        is_group: false,
        mentions_bot: false,
        reply_to_bot: m.context.is_some(),
        title: None,
    };
    super::store_message(&ctx.app, ctx.identity, im, "whatsapp message", window).await?;
    Ok(())
}

/// Sends one outbox item: in pieces if long (the first one quoting the
/// message it answers), within the window; outside it, the template or
/// nothing.
async fn deliver(ctx: &Arc<Ctx>, item: OutboxItem, refs: DeliveryRefs) -> Sent {
    let answered = refs.answered;
    let to = item.external_id.clone();
    if to.is_empty() || !to.chars().all(|c| c.is_ascii_digit()) {
        return Sent::Refused(format!("{to:?} is not a WhatsApp id"));
    }
    let last = {
        let to = to.clone();
        ctx.app
            .rt
            .store
            .read(move |c| chat_windows::last_inbound(c, ADAPTER, &to))
            .await
    };
    let last = match last {
        Ok(l) => l,
        Err(e) => {
            return Sent::Unreachable {
                call: "the window's row",
                error: e.to_string(),
            }
        }
    };
    if last.is_none_or(|t| now_ms().saturating_sub(t) >= WINDOW_MS) {
        return outside_window(ctx, &to).await;
    }
    for (i, part) in split_reply(&item.text, MAX_MESSAGE).into_iter().enumerate() {
        let context = answered.as_deref().filter(|_| i == 0);
        match ctx.graph.send_text(&to, &part, context, &ctx.cancel).await {
            Ok(()) => {}
            Err(GraphFailure::Stopping) => return Sent::Stopping,
            // Meta closed the window before Mercury's clock did.
            Err(GraphFailure::WindowClosed) => return outside_window(ctx, &to).await,
            Err(GraphFailure::Refused(e)) => return Sent::Refused(e),
            Err(GraphFailure::Unreachable(error)) => {
                return Sent::Unreachable {
                    call: "messages",
                    error,
                }
            }
        }
    }
    for rel in &refs.files {
        let file = match super::reply_file(
            &ctx.app,
            &item.space_id,
            rel,
            UPLOAD_MAX,
            "Mercury's 50 MB upload to WhatsApp",
        )
        .await
        {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Sent::Refused(e),
        };
        match ctx.graph.send_file(&to, &file, &ctx.cancel).await {
            Ok(()) => {}
            Err(GraphFailure::Stopping) => return Sent::Stopping,
            // The text went within the window; the file alone is given up.
            Err(GraphFailure::WindowClosed) => {
                return Sent::GivenUp(format!(
                    "WhatsApp's 24-hour window closed before {rel} could be sent"
                ))
            }
            Err(GraphFailure::Refused(e)) => return Sent::Refused(e),
            Err(GraphFailure::Unreachable(error)) => {
                return Sent::Unreachable {
                    call: "media",
                    error,
                }
            }
        }
    }
    Sent::Delivered
}

/// Outside the window: the configured template once, or nothing; either way
/// the reply itself is given up and the operator told.
async fn outside_window(ctx: &Arc<Ctx>, to: &str) -> Sent {
    let template = ctx.cfg.window_template.trim();
    let closed = "a reply outside WhatsApp's 24-hour customer-service window was not sent";
    if template.is_empty() {
        return Sent::GivenUp(format!(
            "{closed} (set adapters.whatsapp.window_template to send an approved template instead)"
        ));
    }
    let lang = ctx.cfg.window_template_language.trim();
    match ctx
        .graph
        .send_template(to, template, lang, &ctx.cancel)
        .await
    {
        Ok(()) => Sent::GivenUp(format!(
            "{closed}; the template {template:?} was sent instead"
        )),
        Err(GraphFailure::Stopping) => Sent::Stopping,
        Err(GraphFailure::WindowClosed) => Sent::GivenUp(format!(
            "{closed}, and WhatsApp refused the template {template:?}"
        )),
        Err(GraphFailure::Refused(e)) => Sent::GivenUp(format!(
            "{closed}, and WhatsApp refused the template {template:?}: {e}"
        )),
        Err(GraphFailure::Unreachable(error)) => Sent::Unreachable {
            call: "messages (template)",
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        format!(
            "sha256={}",
            base16ct::lower::encode_string(&mac.finalize().into_bytes())
        )
    }

    #[test]
    fn only_the_app_secrets_signature_of_these_bytes_passes() {
        let body = br#"{"object":"whatsapp_business_account"}"#;
        let good = sign("s3cret", body);
        assert!(signature_ok("s3cret", Some(good.as_bytes()), body));
        assert!(signature_ok(
            "s3cret",
            Some(good.to_uppercase().replace("SHA256=", "sha256=").as_bytes()),
            body
        ));
        assert!(!signature_ok("other", Some(good.as_bytes()), body));
        assert!(!signature_ok("s3cret", Some(good.as_bytes()), b"{}"));
        assert!(!signature_ok("s3cret", None, body));
        assert!(!signature_ok("s3cret", Some(b"sha256="), body));
        assert!(!signature_ok("s3cret", Some(b"sha1=abcd"), body));
        assert!(!signature_ok("s3cret", Some(&good.as_bytes()[..20]), body));
    }

    #[test]
    fn its_section_is_checked_and_unknown_keys_refused() {
        let set = |yaml: &str| {
            crate::config::from_value(
                serde_yaml_ng::from_str(yaml).unwrap(),
                &std::collections::BTreeMap::new(),
            )
        };
        let s =
            set("adapters:\n  whatsapp:\n    phone_number_id: \"123\"\n    window_template: hi")
                .unwrap();
        assert_eq!(config(&s).phone_number_id, "123");
        assert_eq!(config(&s).window_template, "hi");
        assert!(set("adapters:\n  whatsapp:\n    bogus: 1").is_err());
        assert!(set("adapters:\n  whatsap:\n    enabled: true").is_err());
        let no_number = set("adapters:\n  whatsapp:\n    enabled: true").unwrap_err();
        assert!(
            no_number
                .to_string()
                .contains("adapters.whatsapp.phone_number_id"),
            "{no_number}"
        );
        assert!(set("adapters:\n  whatsapp:\n    graph_base_url: ftp://x").is_err());
        let env: std::collections::BTreeMap<String, String> = [(
            "MERCURY_ADAPTERS_WHATSAPP_WINDOW_TEMPLATE".to_owned(),
            "from_env".to_owned(),
        )]
        .into();
        let s = crate::config::from_value(serde_yaml_ng::Value::Null, &env).unwrap();
        assert_eq!(config(&s).window_template, "from_env");
        assert!(crate::config::unknown_vars(
            &[("MERCURY_WHATSAPP_APP_SECRET".to_owned(), String::new())].into()
        )
        .is_empty());
    }
}
