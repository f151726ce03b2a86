//! The Discord adapter: an actor under the root supervisor that holds one
//! gateway session (twilight's shard: identify with intents, heartbeat,
//! resume after a dropped connection), stores each `MESSAGE_CREATE` through
//! ingress, shows "typing…" while a turn runs, and delivers Discord's outbox
//! items through [`rest`] (threaded under the message they answer, split at
//! 2,000 characters, within the per-route and global rate limits; a
//! streamed reply is a message edited as it grows, `turn.stream`).
//!
//! The gateway position (session id, sequence, resume URL) is stored in the
//! same transaction as the message row of the dispatch it follows, and a
//! start resumes from the stored one: Discord then replays exactly the
//! dispatches after it, so a restart (of the actor or the host) neither
//! loses nor repeats a message while Discord still holds the session. When
//! it no longer does (a new session's READY), each known channel is read
//! over REST from its last stored message on ([`backfill`]).
//!
//! Must never: put the bot token in a log, an error or a status; let a reply
//! ping anyone (every send carries `allowed_mentions` that parse nothing: an
//! adversary could get the agent to write `@everyone`); or act as anything
//! but its platform-bound [`AdapterIdentity`].

pub(crate) mod convert;
pub(crate) mod rest;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use twilight_gateway::error::ReceiveMessageErrorType;
use twilight_gateway::{ConfigBuilder, Intents, Message, Session, Shard, ShardId};

use self::convert::{BotSelf, Inbound, Payload, RawMessage, PLATFORM};
use self::rest::{DiscordRest, RestError};
use super::registry::{AdapterRun, Platform};
use super::{split_reply, AdapterIdentity, AdapterKit, Backoff, ChatAdapter, EditPace, Sent};
use crate::app::App;
use crate::config::{DiscordConfig, DmPolicy, Settings};
use crate::storage::outbox::{DeliveryRefs, OutboxItem};
use crate::storage::{adapters, StoreError};

/// The name on the board and in `adapter_positions`.
pub(crate) const ADAPTER: &str = "discord";
/// The environment variable the bot token is read from (only).
pub(crate) const TOKEN_ENV: &str = "MERCURY_DISCORD_BOT_TOKEN";

/// Discord on the adapters' registry.
pub(crate) struct Discord;

impl Platform for Discord {
    fn name(&self) -> &'static str {
        ADAPTER
    }

    fn secret_vars(&self) -> &'static [&'static str] {
        &[TOKEN_ENV]
    }

    fn enabled(&self, settings: &Settings) -> bool {
        settings.adapters.discord.enabled
    }

    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy> {
        settings.adapters.discord.dm_policy
    }

    fn identifier_patterns(&self) -> &'static [&'static str] {
        &[
            r"(?i)\bdiscord ?: ?-?[0-9]{1,21}\b",
            // Snowflakes: mentions `<@…>`, `<@!…>`, `<#…>`, `<@&…>`, and a bare 17-20 digit number.
            r"<(?:@[!&]?|#)[0-9]{15,21}>|\b[0-9]{17,20}\b",
        ]
    }
}

impl ChatAdapter for Discord {
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun {
        Box::pin(async move {
            run(kit.app.clone(), kit.secret(0), kit.pace.clone(), cancel)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn turn_tools(
        &self,
        kit: &AdapterKit,
        cancel: CancellationToken,
    ) -> Result<super::TurnTools, String> {
        let cfg = &kit.app.rt.settings.adapters.discord;
        let rest =
            DiscordRest::new(&cfg.api_base_url, &kit.secret(0)).map_err(|e| e.to_string())?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(super::TurnTools {
            editor: Some(Arc::new(DiscordEditor {
                rest: Arc::new(rest),
                pace: kit.pace.clone(),
                cancel,
            })),
            source: Some(Arc::new(DiscordFiles {
                http,
                origins: cfg.attachment_origins.clone(),
            })),
        })
    }
}
/// Discord's longest message, in characters.
pub(crate) const MAX_MESSAGE: usize = 2000;
/// The largest file a bot uploads to a server without boosts.
const UPLOAD_MAX: usize = 10 << 20;
/// Discord shows "typing…" for 10 s: renewed every 8.
const TYPING_RENEW: Duration = Duration::from_secs(8);
/// The pause after Discord closed the session for good (a bad token,
/// intents not allowed): a new identify, not a hammering loop (identifies
/// are limited to 1,000 a day).
const FATAL_PAUSE: Duration = Duration::from_secs(60);
/// Pages of 100 messages a backfill reads per channel, at most.
const BACKFILL_PAGES: usize = 10;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DiscordError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the gateway session stands, as stored in `adapter_positions`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct GatewayPosition {
    pub session_id: String,
    /// The sequence of the last dispatch whose message is stored.
    pub sequence: u64,
    pub resume_url: String,
}

/// What every part of a running adapter shares.
struct Ctx {
    app: Arc<App>,
    rest: Arc<DiscordRest>,
    me: BotSelf,
    identity: AdapterIdentity,
    cancel: CancellationToken,
    editor: Arc<DiscordEditor>,
}

/// The least time between two edits of a message in one channel (Discord
/// allows five edits in five seconds per channel; the route limits of
/// [`rest`] hold the rest).
const EDIT_EVERY: Duration = Duration::from_secs(1);

/// Fetches a message's attachments from their URLs, only on the origins
/// `adapters.discord.attachment_origins` names (an attachment URL is the
/// platform's, but a host never fetches from wherever a field points).
struct DiscordFiles {
    http: reqwest::Client,
    origins: Vec<String>,
}

#[async_trait::async_trait]
impl crate::runtime::AttachmentSource for DiscordFiles {
    async fn fetch(
        &self,
        reference: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, crate::runtime::FetchError> {
        crate::adapters::download_from(
            &self.http,
            reference,
            &self.origins,
            "adapters.discord.attachment_origins",
            None,
            max_bytes,
        )
        .await
    }
}

/// Shows streamed replies (`POST` a message, then `PATCH` it), paced per
/// channel; the final reply's edit goes through it too.
struct DiscordEditor {
    rest: Arc<DiscordRest>,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
}

/// Nobody is pinged by what the agent writes, not even the person answered.
fn quiet(content: &str) -> serde_json::Value {
    json!({"content": content, "allowed_mentions": {"parse": [], "replied_user": false}})
}

impl DiscordEditor {
    /// Edits `message` in `channel`; `Ok(false)` when it is gone (deleted).
    async fn edit_message(
        &self,
        channel: &str,
        message: &str,
        text: &str,
    ) -> Result<bool, RestError> {
        if !convert::is_snowflake(channel) || !convert::is_snowflake(message) {
            return Err(RestError::Api {
                status: 400,
                message: format!("{channel:?}/{message:?} is not a Discord message"),
            });
        }
        self.pace.wait(channel, EDIT_EVERY).await;
        let path = format!("/channels/{channel}/messages/{message}");
        match self
            .rest
            .call(Method::PATCH, &path, Some(&quiet(text)), &self.cancel)
            .await
        {
            Ok(_) => Ok(true),
            Err(RestError::Api { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl crate::runtime::ReplyEditor for DiscordEditor {
    async fn send(&self, chat: &str, answered: Option<&str>, text: &str) -> Result<String, String> {
        if !convert::is_snowflake(chat) {
            return Err(format!("{chat:?} is not a Discord channel id"));
        }
        let mut body = quiet(text);
        if let Some(m) = answered.filter(|m| convert::is_snowflake(m)) {
            body["message_reference"] = json!({"message_id": m, "fail_if_not_exists": false});
        }
        let path = format!("/channels/{chat}/messages");
        let sent = self
            .rest
            .call(Method::POST, &path, Some(&body), &self.cancel)
            .await
            .map_err(|e| format!("POST /channels/…/messages: {e}"))?;
        sent["id"]
            .as_str()
            .filter(|id| convert::is_snowflake(id))
            .map(str::to_owned)
            .ok_or_else(|| "POST /channels/…/messages answered no message id".to_owned())
    }

    async fn edit(&self, chat: &str, message: &str, text: &str) -> Result<(), String> {
        match self.edit_message(chat, message, text).await {
            Ok(true) => Ok(()),
            Ok(false) => Err("PATCH /channels/…/messages/…: the message is gone".into()),
            Err(e) => Err(format!("PATCH /channels/…/messages/…: {e}")),
        }
    }

    fn max_units(&self) -> usize {
        MAX_MESSAGE
    }
}

impl Ctx {
    fn board(&self) -> &crate::actors::adapter::AdapterBoard {
        &self.app.adapters
    }
}

/// The adapter's loop, from `GET /users/@me` to the gateway and the outbox.
pub(crate) async fn run(
    app: Arc<App>,
    token: String,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
) -> Result<(), DiscordError> {
    let cfg = app.rt.settings.adapters.discord.clone();
    let board = app.adapters.clone();
    board.set_mode(ADAPTER, "gateway");
    let rest = Arc::new(
        DiscordRest::new(&cfg.api_base_url, &token)
            .map_err(|e| DiscordError::Client(e.to_string()))?,
    );
    let mut backoff = Backoff::default();
    let me = loop {
        match rest.current_user(&cancel).await {
            Ok(me) => break me,
            Err(RestError::Cancelled) => return Ok(()),
            Err(e) => {
                let msg = format!("GET /users/@me: {e}");
                tracing::warn!(error = %msg, "discord call failed");
                board.failed(ADAPTER, &msg);
                if !super::pause(&cancel, backoff.next()).await {
                    return Ok(());
                }
            }
        }
    };
    tracing::info!(bot = %me.username, "discord adapter has its bot user");
    // The final edit of a streamed reply counts against the same pacing
    // as its preview's edits.
    let editor = Arc::new(DiscordEditor {
        rest: rest.clone(),
        pace,
        cancel: cancel.clone(),
    });
    let ctx = Arc::new(Ctx {
        app,
        rest,
        me,
        identity: AdapterIdentity::bound_to(PLATFORM),
        cancel,
        editor,
    });
    tokio::select! {
        r = gateway(&ctx, &token, &cfg) => r,
        r = deliver_loop(&ctx) => r,
    }
}

fn intents(cfg: &DiscordConfig) -> Intents {
    let base = Intents::GUILD_MESSAGES | Intents::DIRECT_MESSAGES;
    if cfg.message_content {
        base | Intents::MESSAGE_CONTENT
    } else {
        base
    }
}

/// A shard that resumes the stored session if there is one (Discord
/// answers a stale one with "invalid session", and the shard identifies
/// anew).
async fn shard(ctx: &Ctx, token: &str, cfg: &DiscordConfig) -> Result<Shard, DiscordError> {
    let stored = ctx
        .app
        .rt
        .store
        .read(|c| adapters::position(c, ADAPTER))
        .await?
        .and_then(|p| serde_json::from_str::<GatewayPosition>(&p).ok())
        // The shard cannot be handed a URL it cannot parse.
        .filter(|p| crate::config::is_gateway_url(&p.resume_url));
    let mut builder = ConfigBuilder::new(token.to_owned(), intents(cfg))
        .proxy_url(cfg.gateway_url.trim_end_matches('/').to_owned());
    if let Some(p) = stored {
        tracing::info!(
            sequence = p.sequence,
            "discord: resuming the stored gateway session"
        );
        builder = builder
            .session(Session::new(p.sequence, p.session_id))
            .resume_url(p.resume_url.trim_end_matches('/').to_owned());
    }
    Ok(Shard::with_config(ShardId::ONE, builder.build()))
}

/// The gateway: one shard at a time; the shard reconnects (and resumes) by
/// itself after a dropped connection, and a session Discord closed for good
/// is identified again after [`FATAL_PAUSE`].
async fn gateway(ctx: &Arc<Ctx>, token: &str, cfg: &DiscordConfig) -> Result<(), DiscordError> {
    loop {
        let mut shard = shard(ctx, token, cfg).await?;
        loop {
            let next = tokio::select! {
                _ = ctx.cancel.cancelled() => return Ok(()),
                m = shard.next() => m,
            };
            match next {
                None => break,
                Some(Ok(Message::Text(json))) => {
                    // Read before any await: the shard is not shared across one.
                    let Ok(p) = serde_json::from_str::<Payload>(&json) else {
                        tracing::warn!("a discord gateway payload Mercury cannot read; skipped");
                        continue;
                    };
                    let pos = p.s.and_then(|s| position_at(&shard, s));
                    take_payload(ctx, p, pos).await?;
                }
                Some(Ok(Message::Close(frame))) => {
                    let why = frame.map_or_else(
                        || "the gateway connection closed".to_owned(),
                        |f| format!("the gateway closed the connection: {} {}", f.code, f.reason),
                    );
                    tracing::warn!(error = %why, "discord gateway");
                    ctx.board().failed(ADAPTER, &why);
                }
                Some(Err(e)) => {
                    // A Deserializing error's text is the raw event (people's messages).
                    let why = match e.kind() {
                        ReceiveMessageErrorType::Deserializing { .. } => {
                            "a gateway event Mercury cannot read".to_owned()
                        }
                        _ => e.to_string(),
                    };
                    tracing::warn!(error = %why, "discord gateway");
                    ctx.board().failed(ADAPTER, &why);
                }
            }
        }
        tracing::error!("discord closed the gateway session for good; identifying again later");
        if !super::pause(&ctx.cancel, FATAL_PAUSE).await {
            return Ok(());
        }
    }
}

/// The position after a dispatch with sequence `s`, if the shard has a
/// session (it has one for every dispatch after READY).
fn position_at(shard: &Shard, s: u64) -> Option<GatewayPosition> {
    let session = shard.session()?;
    Some(GatewayPosition {
        session_id: session.id().to_owned(),
        sequence: s,
        resume_url: shard.resume_url()?.to_owned(),
    })
}

/// One gateway payload, with the position after it. The shard has already
/// acted on the ones about the connection (hello, heartbeats, reconnect,
/// invalid session); what is left here is dispatches.
async fn take_payload(
    ctx: &Arc<Ctx>,
    p: Payload,
    pos: Option<GatewayPosition>,
) -> Result<(), DiscordError> {
    if p.op != 0 {
        return Ok(());
    }
    match p.t.as_deref() {
        Some("READY") => {
            ctx.board().connected(ADAPTER);
            tracing::info!("discord gateway session identified");
            if let Some(pos) = pos {
                let text = serde_json::to_string(&pos).unwrap_or_default();
                ctx.app
                    .rt
                    .store
                    .write(move |tx| adapters::set_position(tx, ADAPTER, &text))
                    .await?;
            }
            // Off the gateway loop: the shard must go on being polled (heartbeats).
            tokio::spawn(backfill(ctx.clone()));
        }
        Some("RESUMED") => {
            ctx.board().connected(ADAPTER);
            tracing::info!("discord gateway session resumed");
        }
        Some("MESSAGE_CREATE") => match serde_json::from_value::<RawMessage>(p.d) {
            Ok(m) => take_message(ctx, m, pos, None).await?,
            Err(e) => {
                tracing::warn!(error = %e, "a discord message Mercury cannot read; skipped");
            }
        },
        _ => {}
    }
    Ok(())
}

/// Stores one message together with the gateway position after it.
/// `is_group` overrides the message's own say (REST listings carry no
/// `guild_id`; the stored conversation knows).
async fn take_message(
    ctx: &Arc<Ctx>,
    m: RawMessage,
    pos: Option<GatewayPosition>,
    is_group: Option<bool>,
) -> Result<(), DiscordError> {
    ctx.board().updated(ADAPTER);
    let (msg, carried) = match convert::inbound(&m, &ctx.me) {
        Inbound::Message(mut msg, carried) => {
            if let Some(g) = is_group {
                msg.is_group = g;
            }
            (msg, carried)
        }
        Inbound::Skip(why) => {
            // Not stored, so the position need not move: a resume replays it
            // and it is skipped again.
            tracing::debug!(why, "discord message skipped");
            return Ok(());
        }
    };
    let text = pos.and_then(|p| serde_json::to_string(&p).ok());
    // What the message carried is stored with it, fetched at turn time.
    let (conversation, pid) = (msg.conversation.clone(), msg.message_id.clone());
    let advance = move |tx: &crate::storage::Tx<'_>| {
        if let Some(t) = &text {
            adapters::set_position(tx, ADAPTER, t)?;
        }
        crate::storage::attachments::attach(tx, PLATFORM, &conversation, &pid, &carried)?;
        Ok(())
    };
    let what = format!("discord message {}", m.id);
    let channel = m.channel_id.clone();
    if let Some(row) = super::store_message(&ctx.app, ctx.identity, *msg, &what, advance).await? {
        tokio::spawn(typing(ctx.clone(), channel, row));
    }
    Ok(())
}

/// After a new session (not a resume): Discord replays nothing from before
/// it, so each known channel's messages after the last one stored are read
/// over REST (`GET /channels/{id}/messages?after=…`, 100 a page, at most
/// [`BACKFILL_PAGES`] pages) and stored like live ones, oldest first. One
/// already stored is a duplicate and changes nothing; the gateway position
/// does not move (these messages have no sequence).
async fn backfill(ctx: Arc<Ctx>) {
    let known = match ctx
        .app
        .rt
        .store
        .read(|c| adapters::last_seen(c, PLATFORM))
        .await
    {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "discord backfill: cannot read the known channels");
            return;
        }
    };
    let mut read = 0usize;
    for seen in known {
        if !convert::is_snowflake(&seen.conversation) {
            continue;
        }
        let mut after = seen.last_message_id;
        for _ in 0..BACKFILL_PAGES {
            let path = format!(
                "/channels/{}/messages?after={after}&limit=100",
                seen.conversation
            );
            let page = match ctx.rest.call(Method::GET, &path, None, &ctx.cancel).await {
                Ok(v) => v,
                Err(RestError::Cancelled) => return,
                Err(e) => {
                    // A channel the bot can no longer read is no reason to stop.
                    tracing::warn!(error = %e, "discord backfill: a channel could not be read");
                    break;
                }
            };
            let mut page: Vec<RawMessage> = page
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| serde_json::from_value(m.clone()).ok())
                .collect();
            let full = page.len() >= 100;
            page.retain(|m| m.id.parse::<i64>().is_ok_and(|id| id > after));
            page.sort_by_key(|m| m.id.parse::<i64>().unwrap_or(0));
            let Some(last) = page.last().and_then(|m| m.id.parse::<i64>().ok()) else {
                break;
            };
            for m in page {
                if let Err(e) = take_message(&ctx, m, None, Some(seen.is_group)).await {
                    tracing::error!(error = %e, "discord backfill: a message could not be stored");
                    return;
                }
                read += 1;
            }
            after = last;
            if !full {
                break;
            }
        }
    }
    if read > 0 {
        tracing::info!(
            messages = read,
            "discord backfill read what the lost session missed"
        );
    }
}

/// "typing…" in `channel` while the turn answering row `message` runs.
async fn typing(ctx: Arc<Ctx>, channel: String, message: i64) {
    let path = format!("/channels/{channel}/typing");
    let send = || async {
        if let Err(e) = ctx.rest.call(Method::POST, &path, None, &ctx.cancel).await {
            // Cosmetic: the reply still goes out.
            tracing::debug!(error = %e, "discord typing failed");
        }
    };
    super::typing_while_pending(&ctx.app, &ctx.cancel, message, TYPING_RENEW, send).await;
}

/// Delivers Discord's outbox items, oldest first.
async fn deliver_loop(ctx: &Arc<Ctx>) -> Result<(), DiscordError> {
    let send = |item, refs| deliver(ctx, item, refs);
    Ok(super::deliver_outbox(&ctx.app, PLATFORM, &ctx.cancel, send).await?)
}

/// Sends one outbox item, in pieces if long, the first threaded under the
/// message it answers (or, for a streamed reply, as the edit of its
/// preview, sent anew if the preview was deleted); the rate limits are
/// [`rest`]'s.
async fn deliver(ctx: &Arc<Ctx>, item: OutboxItem, refs: DeliveryRefs) -> Sent {
    if !convert::is_snowflake(&item.external_id) {
        return Sent::Refused(format!(
            "{:?} is not a Discord channel id",
            item.external_id
        ));
    }
    let answered = refs.answered.filter(|m| convert::is_snowflake(m));
    let path = format!("/channels/{}/messages", item.external_id);
    for (i, part) in split_reply(&item.text, MAX_MESSAGE).into_iter().enumerate() {
        if let (0, Some(preview)) = (i, refs.edit_of.as_deref()) {
            match ctx
                .editor
                .edit_message(&item.external_id, preview, &part)
                .await
            {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => return failed("PATCH /channels/…/messages/…", e),
            }
        }
        let mut body = quiet(&part);
        // The answer still goes out if that message was deleted meanwhile.
        if let Some(m) = answered.as_ref().filter(|_| i == 0) {
            body["message_reference"] = json!({"message_id": m, "fail_if_not_exists": false});
        }
        if let Err(e) = ctx
            .rest
            .call(Method::POST, &path, Some(&body), &ctx.cancel)
            .await
        {
            return failed("POST /channels/…/messages", e);
        }
    }
    for rel in &refs.files {
        let file = match super::reply_file(
            &ctx.app,
            &item.space_id,
            rel,
            UPLOAD_MAX,
            "Discord's 10 MB upload",
        )
        .await
        {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Sent::Refused(e),
        };
        // The file alone, in a message of its own after the text; it pings no one.
        let payload = json!({
            "allowed_mentions": {"parse": []},
            "attachments": [{"id": 0, "filename": file.name}],
        });
        let (content_type, body) = crate::model::form::Form::new()
            .text("payload_json", &payload.to_string())
            .file("files[0]", &file.name, file.mime, &file.bytes)
            .finish();
        if let Err(e) = ctx
            .rest
            .call_form(Method::POST, &path, &content_type, &body, &ctx.cancel)
            .await
        {
            return failed("POST /channels/…/messages (a file)", e);
        }
    }
    Sent::Delivered
}

/// What the outbox records of a REST `call` that failed.
fn failed(call: &'static str, e: RestError) -> Sent {
    match e {
        RestError::Cancelled => Sent::Stopping,
        RestError::Api { status, message } => Sent::Refused(format!("{status} {message}")),
        RestError::Transport(error) => Sent::Unreachable { call, error },
    }
}

#[cfg(test)]
mod tests {
    use crate::adapters::origin_of;

    #[test]
    fn an_origin_is_scheme_host_and_port_whatever_the_path_or_case() {
        assert_eq!(
            origin_of("https://CDN.discordapp.com/attachments/1/2/a.png?ex=1").as_deref(),
            Some("https://cdn.discordapp.com")
        );
        assert_eq!(
            origin_of("http://127.0.0.1:8080/x").as_deref(),
            Some("http://127.0.0.1:8080")
        );
        // A look-alike is another origin; userinfo does not change the host.
        assert_ne!(
            origin_of("https://cdn.discordapp.com.evil.example/a"),
            origin_of("https://cdn.discordapp.com/a")
        );
        assert_eq!(
            origin_of("https://cdn.discordapp.com@evil.example/a").as_deref(),
            Some("https://evil.example")
        );
        assert_eq!(origin_of("not a url"), None);
    }
}
