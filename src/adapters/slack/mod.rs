//! The Slack adapter, through Socket Mode: an actor under the root
//! supervisor that asks `apps.connections.open` (with the app-level token)
//! for a WebSocket URL, holds that socket (no public URL is needed), stores
//! each DM and each message that mentions the bot through ingress (other
//! channel messages as ambient context), acknowledges every envelope by its
//! `envelope_id` once its row is committed, and delivers Slack's outbox items
//! with `chat.postMessage` (the bot token) in the thread of the message they
//! answer, split at [`MAX_MESSAGE`] characters, waiting out a 429's
//! `Retry-After`, a reply's files after it ([`web`]); a streamed reply
//! (`turn.stream`) is a message grown with `chat.update`. With
//! `mode: events` the same events arrive over HTTP instead ([`events`]).
//!
//! Slack redelivers an envelope it has not seen acknowledged (also after a
//! reconnect or a restart), and a mention arrives twice (`message` and
//! `app_mention`); both carry the same channel and `ts`, which ingress keeps
//! once, so nothing is answered twice.
//!
//! Must never: ping a channel (`<!channel>`, `<!here>`, `<!everyone>`,
//! `@channel`…: an adversary could get the agent to write one; every reply
//! is escaped ([`neutralise`]) and sent with `link_names: false`), put a
//! token in a log, an error or a status, acknowledge an envelope before its
//! row is committed, or act as anything but its platform-bound
//! [`AdapterIdentity`].

pub(crate) mod events;
mod web;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tokio_util::sync::CancellationToken;
use tokio_websockets::Message as WsMessage;

use self::web::{said, Args, Failure, SlackEditor, Web};
use super::registry::{AdapterRun, Platform};
use super::{split_reply, AdapterIdentity, AdapterKit, Backoff, ChatAdapter, Sent};
use crate::app::App;
use crate::config::{DmPolicy, Settings};
use crate::ingress::IngressMessage;
use crate::storage::attachments::NewAttachment;
use crate::storage::outbox::{DeliveryRefs, OutboxItem};
use crate::storage::StoreError;

/// The name on the board, of the platform and of the config section.
pub(crate) const ADAPTER: &str = "slack";
/// The longest reply piece, in characters (Slack advises at most 4,000).
pub(crate) const MAX_MESSAGE: usize = 4000;
/// The longest `Retry-After` waited out at once.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(600);
/// 429s of one piece before it counts as an attempt.
const MAX_429: u32 = 5;
/// The largest file Mercury uploads (Slack takes far more; a reply's file
/// is read into memory whole).
const UPLOAD_MAX: usize = 50 << 20;

/// Slack on the adapters' registry.
pub(crate) struct Slack;

/// `adapters.slack`, the section this platform declares.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SlackConfig {
    pub enabled: bool,
    /// How events arrive: `socket` (Socket Mode, no public URL) or
    /// `events` (the Events API posting to this host's
    /// `/api/adapters/slack/events`, checked with the signing secret).
    pub mode: SlackMode,
    /// The Web API's base URL (a test's fake).
    pub api_base_url: String,
    pub dm_policy: Option<DmPolicy>,
    /// The origins a message's files may be downloaded from (with the bot
    /// token); a file elsewhere is refused, never fetched.
    pub file_origins: Vec<String>,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            mode: SlackMode::Socket,
            api_base_url: "https://slack.com/api".into(),
            dm_policy: None,
            file_origins: vec!["https://files.slack.com".into()],
        }
    }
}

/// `adapters.slack.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SlackMode {
    Socket,
    Events,
}

fn config(settings: &Settings) -> SlackConfig {
    settings
        .adapters
        .section(ADAPTER)
        .and_then(|v| serde_yaml_ng::from_value(v.clone()).ok())
        .unwrap_or_default()
}

impl Platform for Slack {
    fn name(&self) -> &'static str {
        ADAPTER
    }

    /// The app-level token (`xapp-…`, `connections:write`; Socket Mode),
    /// the bot token (`xoxb-…`) and the signing secret (the Events API),
    /// in that order.
    fn secret_vars(&self) -> &'static [&'static str] {
        &[
            "MERCURY_SLACK_APP_TOKEN",
            "MERCURY_SLACK_BOT_TOKEN",
            "MERCURY_SLACK_SIGNING_SECRET",
        ]
    }

    fn secrets_needed(&self, settings: &Settings) -> Vec<&'static str> {
        match config(settings).mode {
            SlackMode::Socket => vec!["MERCURY_SLACK_APP_TOKEN", "MERCURY_SLACK_BOT_TOKEN"],
            SlackMode::Events => vec!["MERCURY_SLACK_BOT_TOKEN", "MERCURY_SLACK_SIGNING_SECRET"],
        }
    }

    fn enabled(&self, settings: &Settings) -> bool {
        config(settings).enabled
    }

    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy> {
        config(settings).dm_policy
    }

    fn identifier_patterns(&self) -> &'static [&'static str] {
        &[
            r"(?i)\bslack ?: ?[A-Z0-9]{6,15}\b",
            // Mentions of people, channels and groups: `<@U024BE7LH>`, `<#C0…|general>`, `<!subteam^S0…>`.
            r"<(?:[@#][UWCGD]|!subteam\^S)[A-Z0-9]{6,15}(?:\|[^>]{0,80})?>",
            // Bare user ids (U0…, W0…).
            r"\b[UW]0[A-Z0-9]{6,12}\b",
        ]
    }

    fn section_defaults(&self) -> Option<Yaml> {
        serde_yaml_ng::to_value(SlackConfig::default()).ok()
    }

    fn check(&self, settings: &Settings) -> Result<(), (String, String)> {
        let section = settings.adapters.section(ADAPTER).cloned();
        let c: SlackConfig = serde_yaml_ng::from_value(section.unwrap_or(Yaml::Null))
            .map_err(|e| ("adapters.slack".to_owned(), e.to_string()))?;
        let url = &c.api_base_url;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(['?', '#'])
        {
            return Err((
                "adapters.slack.api_base_url".into(),
                "must start with http:// or https:// and hold no query".into(),
            ));
        }
        Ok(())
    }
}

impl ChatAdapter for Slack {
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun {
        Box::pin(async move { run(kit, cancel).await.map_err(|e| e.to_string()) })
    }

    fn intake(&self, kit: &AdapterKit, cancel: CancellationToken) -> Option<AdapterRun> {
        if config(&kit.app.rt.settings).mode != SlackMode::Events {
            return None;
        }
        let kit = kit.clone();
        Some(Box::pin(async move {
            intake(kit, cancel).await.map_err(|e| e.to_string())
        }))
    }

    fn turn_tools(
        &self,
        kit: &AdapterKit,
        cancel: CancellationToken,
    ) -> Result<super::TurnTools, String> {
        let cfg = config(&kit.app.rt.settings);
        let editor = SlackEditor {
            web: Arc::new(web_for(&cfg).map_err(|e| e.to_string())?),
            bot_token: kit.secret(1),
            pace: kit.pace.clone(),
            cancel,
        };
        let files = SlackFiles {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(120))
                // The token goes with the request: never to a redirect's host.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| e.without_url().to_string())?,
            auth: format!("Bearer {}", kit.secret(1)),
            origins: cfg.file_origins,
        };
        Ok(super::TurnTools {
            editor: Some(Arc::new(editor)),
            source: Some(Arc::new(files)),
        })
    }
}

/// The Web API client of `cfg`.
fn web_for(cfg: &SlackConfig) -> Result<Web, SlackError> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| SlackError::Client(e.without_url().to_string()))?;
    Ok(Web {
        http,
        base: cfg.api_base_url.trim_end_matches('/').to_owned(),
    })
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SlackError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Reply text as Slack will show it and never act on: `&`, `<` and `>`
/// escaped (so `<!channel>`, `<!here>`, `<@U…>` and links are plain text)
/// and a word joiner after the `@` of `@channel`, `@here` and `@everyone`.
pub(crate) fn neutralise(text: &str) -> String {
    let escaped = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped.as_str();
    while let Some(i) = rest.find('@') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let word: String = rest
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect::<String>()
            .to_ascii_lowercase();
        if matches!(word.as_str(), "channel" | "here" | "everyone") {
            out.push('\u{2060}');
        }
    }
    out.push_str(rest);
    out
}

struct Ctx {
    app: Arc<App>,
    web: Arc<Web>,
    app_token: String,
    /// The bot's own user id (`auth.test`): mentions of it, and its own messages.
    bot_user: String,
    identity: AdapterIdentity,
    cancel: CancellationToken,
    editor: Arc<SlackEditor>,
}

/// The Web API client and the bot's own user (`auth.test`, asked until it
/// answers); `None` if the adapter stopped first.
async fn connect(
    kit: &AdapterKit,
    cancel: CancellationToken,
) -> Result<Option<Arc<Ctx>>, SlackError> {
    let app = kit.app.clone();
    let cfg = config(&app.rt.settings);
    let web = Arc::new(web_for(&cfg)?);
    let (app_token, bot_token) = (kit.secret(0), kit.secret(1));
    let mut backoff = Backoff::default();
    let me = loop {
        match web
            .call("auth.test", &bot_token, Args::Json(&json!({})))
            .await
        {
            Ok(v) => break v["user_id"].as_str().unwrap_or_default().to_owned(),
            Err(f) => {
                let wait = wait_for(&app, &f, &mut backoff);
                if !super::pause(&cancel, wait).await {
                    return Ok(None);
                }
            }
        }
    };
    // The final edit of a streamed reply counts against the same pacing
    // as its preview's edits.
    let editor = Arc::new(SlackEditor {
        web: web.clone(),
        bot_token,
        pace: kit.pace.clone(),
        cancel: cancel.clone(),
    });
    Ok(Some(Arc::new(Ctx {
        app,
        web,
        app_token,
        bot_user: me,
        identity: AdapterIdentity::bound_to(ADAPTER),
        cancel,
        editor,
    })))
}

/// Delivery, and in Socket Mode the socket: one host of a deployment at a
/// time.
async fn run(kit: AdapterKit, cancel: CancellationToken) -> Result<(), SlackError> {
    let mode = config(&kit.app.rt.settings).mode;
    kit.app.adapters.set_mode(
        ADAPTER,
        match mode {
            SlackMode::Socket => "socket",
            SlackMode::Events => "events",
        },
    );
    let Some(ctx) = connect(&kit, cancel).await? else {
        return Ok(());
    };
    let send = |item, refs| deliver(&ctx, item, refs);
    let delivery = super::deliver_outbox(&ctx.app, ADAPTER, &ctx.cancel, send);
    match mode {
        SlackMode::Socket => tokio::select! {
            r = socket_loop(&ctx) => r,
            r = delivery => Ok(r?),
        },
        SlackMode::Events => {
            ctx.app.adapters.connected(ADAPTER);
            Ok(delivery.await?)
        }
    }
}

/// The Events API's intake, on every host (`mode: events`).
async fn intake(kit: AdapterKit, cancel: CancellationToken) -> Result<(), SlackError> {
    let Some(ctx) = connect(&kit, cancel).await? else {
        return Ok(());
    };
    events::intake(&ctx, kit.secret(2)).await
}

fn wait_for(app: &App, f: &Failure, backoff: &mut Backoff) -> Duration {
    match f {
        Failure::RetryAfter(d) => *d,
        Failure::Api(e) | Failure::Transport(e) => {
            tracing::warn!(error = %e, "slack call failed");
            app.adapters.failed(ADAPTER, e);
            backoff.next()
        }
    }
}

/// Opens a Socket Mode connection and reads it until Slack asks for a new
/// one (`disconnect`), the socket drops, or the adapter stops.
async fn socket_loop(ctx: &Arc<Ctx>) -> Result<(), SlackError> {
    let mut backoff = Backoff::default();
    loop {
        let url = match ctx
            .web
            .call(
                "apps.connections.open",
                &ctx.app_token,
                Args::Json(&json!({})),
            )
            .await
        {
            Ok(v) => v["url"].as_str().unwrap_or_default().to_owned(),
            Err(f) => {
                let wait = wait_for(&ctx.app, &f, &mut backoff);
                if !super::pause(&ctx.cancel, wait).await {
                    return Ok(());
                }
                continue;
            }
        };
        let uri = match url.parse::<http::Uri>() {
            Ok(u) => u,
            Err(_) => {
                ctx.app.adapters.failed(
                    ADAPTER,
                    "apps.connections.open gave a URL Mercury cannot use",
                );
                if !super::pause(&ctx.cancel, backoff.next()).await {
                    return Ok(());
                }
                continue;
            }
        };
        let client = tokio_websockets::ClientBuilder::from_uri(uri);
        let connected = tokio::select! {
            _ = ctx.cancel.cancelled() => return Ok(()),
            c = client.connect() => c,
        };
        let mut ws = match connected {
            Ok((ws, _)) => ws,
            // The URL holds a one-time ticket: the sentence names neither it nor the error.
            Err(_) => {
                ctx.app
                    .adapters
                    .failed(ADAPTER, "the Socket Mode connection failed");
                if !super::pause(&ctx.cancel, backoff.next()).await {
                    return Ok(());
                }
                continue;
            }
        };
        ctx.app.adapters.connected(ADAPTER);
        backoff = Backoff::default();
        loop {
            let frame = tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    let _ = ws.close().await;
                    return Ok(());
                }
                f = ws.next() => f,
            };
            let Some(Ok(frame)) = frame else {
                tracing::info!("the slack socket closed; reconnecting");
                break;
            };
            let Some(text) = frame.as_text() else {
                continue;
            };
            let Ok(envelope) = serde_json::from_str::<Value>(text) else {
                tracing::warn!("a slack frame Mercury cannot read; skipped");
                continue;
            };
            match envelope["type"].as_str() {
                Some("hello") => {}
                Some("disconnect") => {
                    tracing::info!(reason = ?envelope["reason"].as_str(), "slack asked for a new connection");
                    break;
                }
                _ => {
                    // Stored first, acknowledged after: Slack redelivers what it has not seen acked.
                    if envelope["type"].as_str() == Some("events_api") {
                        take(ctx, &envelope["payload"]).await?;
                    }
                    if let Some(id) = envelope["envelope_id"].as_str() {
                        let ack = json!({"envelope_id": id}).to_string();
                        if ws.send(WsMessage::text(ack)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        if !super::pause(&ctx.cancel, Duration::from_millis(200)).await {
            return Ok(());
        }
    }
}

/// An Events API event inside an envelope, the parts Mercury reads.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type", default)]
    kind: String,
    subtype: Option<String>,
    user: Option<String>,
    bot_id: Option<String>,
    #[serde(default)]
    text: String,
    #[serde(default)]
    ts: String,
    thread_ts: Option<String>,
    #[serde(default)]
    channel: String,
    channel_type: Option<String>,
    /// A `file_share` message's files.
    #[serde(default)]
    files: Vec<SlackFile>,
}

/// A file object of a `file_share` message, the parts Mercury reads.
#[derive(Debug, Deserialize)]
struct SlackFile {
    name: Option<String>,
    mimetype: Option<String>,
    size: Option<i64>,
    url_private_download: Option<String>,
    url_private: Option<String>,
}

/// Downloads a message's files with the bot token, only from
/// `adapters.slack.file_origins` (the token must never go anywhere else).
struct SlackFiles {
    http: reqwest::Client,
    auth: String,
    origins: Vec<String>,
}

#[async_trait::async_trait]
impl crate::runtime::AttachmentSource for SlackFiles {
    async fn fetch(
        &self,
        reference: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, crate::runtime::FetchError> {
        crate::adapters::download_from(
            &self.http,
            reference,
            &self.origins,
            "adapters.slack.file_origins",
            Some(&self.auth),
            max_bytes,
        )
        .await
    }
}

/// Stores the message of one `event_callback` (a Socket Mode envelope's
/// payload, or an Events API request's body), or skips it.
async fn take(ctx: &Arc<Ctx>, payload: &Value) -> Result<(), SlackError> {
    if payload["type"].as_str() != Some("event_callback") {
        return Ok(());
    }
    let Ok(ev) = serde_json::from_value::<Event>(payload["event"].clone()) else {
        tracing::warn!("a slack event Mercury cannot read; skipped");
        return Ok(());
    };
    if !matches!(ev.kind.as_str(), "message" | "app_mention") {
        return Ok(());
    }
    // Edits, joins, bots (this one too) are not people's messages.
    let Some(user) = ev.user.clone().filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    // A message with files (`file_share`) is a person's message too.
    let shared = ev.subtype.as_deref() == Some("file_share");
    if (ev.subtype.is_some() && !shared) || ev.bot_id.is_some() || user == ctx.bot_user {
        return Ok(());
    }
    let carried: Vec<NewAttachment> = ev
        .files
        .iter()
        .filter_map(|f| {
            let url = f.url_private_download.clone().or(f.url_private.clone())?;
            let mime = f.mimetype.as_deref().map(super::bare_mime);
            Some(NewAttachment {
                kind: super::kind_of(mime.as_deref()).into(),
                reference: url,
                name: f.name.clone(),
                mime,
                size: f.size,
            })
        })
        .collect();
    if (ev.text.trim().is_empty() && carried.is_empty())
        || ev.ts.is_empty()
        || ev.channel.is_empty()
    {
        return Ok(());
    }
    ctx.app.adapters.updated(ADAPTER);
    let is_group = ev.channel_type.as_deref() != Some("im") && !ev.channel.starts_with('D');
    let mentions_bot =
        ev.kind == "app_mention" || ev.text.contains(&format!("<@{}>", ctx.bot_user));
    // `thread/ts`: the reply goes to the thread the message is in (or starts one under it).
    let thread = ev.thread_ts.clone().unwrap_or_else(|| ev.ts.clone());
    let m = IngressMessage {
        platform: ADAPTER.into(),
        conversation: ev.channel.clone(),
        sender_id: user,
        sender_name: None,
        text: super::with_markers(&ev.text, &carried),
        message_id: format!("{thread}/{}", ev.ts),
        is_group,
        mentions_bot,
        reply_to_bot: false,
        title: None,
    };
    let what = format!("slack message {}", ev.ts);
    // What the message carried is stored with it, fetched at turn time.
    let (conversation, pid) = (m.conversation.clone(), m.message_id.clone());
    let attach = move |tx: &crate::storage::Tx<'_>| {
        crate::storage::attachments::attach(tx, ADAPTER, &conversation, &pid, &carried).map(|_| ())
    };
    super::store_message(&ctx.app, ctx.identity, m, &what, attach).await?;
    Ok(())
}

/// Sends one outbox item in pieces, all in the thread of the message it
/// answers (a channel's; a DM's inline), the first as the edit of its
/// preview when the reply was streamed (posted anew if that message can no
/// longer be edited); a 429 is waited out and the same piece sent again.
async fn deliver(ctx: &Arc<Ctx>, item: OutboxItem, refs: DeliveryRefs) -> Sent {
    let channel = item.external_id.as_str();
    for (i, part) in split_reply(&item.text, MAX_MESSAGE).into_iter().enumerate() {
        if let (0, Some(preview)) = (i, refs.edit_of.as_deref()) {
            match ctx.editor.update(channel, preview, &part).await {
                None => return Sent::Stopping,
                Some(Ok(true)) => continue,
                Some(Ok(false)) => {}
                Some(Err(Failure::Api(e))) => return Sent::Refused(e),
                Some(Err(f)) => {
                    return Sent::Unreachable {
                        call: "chat.update",
                        error: said(f),
                    }
                }
            }
        }
        match ctx
            .editor
            .post(channel, refs.answered.as_deref(), &part)
            .await
        {
            None => return Sent::Stopping,
            Some(Ok(_)) => {}
            Some(Err(Failure::Api(e))) => return Sent::Refused(e),
            Some(Err(f)) => {
                return Sent::Unreachable {
                    call: "chat.postMessage",
                    error: said(f),
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
            "Mercury's 50 MB upload to Slack",
        )
        .await
        {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Sent::Refused(e),
        };
        match ctx
            .editor
            .upload(channel, refs.answered.as_deref(), &file)
            .await
        {
            None => return Sent::Stopping,
            Some(Ok(())) => {}
            Some(Err(Failure::Api(e))) => return Sent::Refused(e),
            Some(Err(f)) => {
                return Sent::Unreachable {
                    call: "files.completeUploadExternal",
                    error: said(f),
                }
            }
        }
    }
    Sent::Delivered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_never_ping_a_channel() {
        let n =
            neutralise("hey <!channel> and <!here|here> @here @Channel @everyone <@U024BE7LH> a&b");
        assert!(!n.contains("<!"), "{n}");
        assert!(!n.contains('<') && !n.contains('>'), "{n}");
        for word in ["@here", "@Channel", "@everyone"] {
            assert!(!n.contains(word), "{word} in {n}");
        }
        assert!(n.contains("a&amp;b"));
        assert_eq!(neutralise("mail me@example.com"), "mail me@example.com");
    }
}
