//! The Telegram adapter (Bot API through `frankenstein`, over our reqwest):
//! an actor under the root supervisor that takes updates by long polling
//! (`getUpdates`) or by webhook (`setWebhook` with a secret token, calls
//! arriving on `/api/adapters/telegram/webhook`), stores each through
//! ingress, shows "typing…" while a turn runs, and delivers Telegram's
//! outbox items with `sendMessage` (threaded under the message they answer,
//! split at 4,096 UTF-16 units, waiting out a 429's `retry_after`).
//!
//! In webhook mode the calls are taken on every host (`intake`), since a
//! load balancer may send them to any; the lease holder only sets the
//! webhook and delivers. The secret Telegram sends back is derived from the
//! bot token, so every host of the deployment checks it without sharing a
//! value of its own (rotating the token rotates it).
//!
//! The `getUpdates` offset is stored in the same transaction as the message
//! row of the update it follows, and only the stored offset is ever sent: an
//! update is acknowledged to Telegram only once its row is committed, and a
//! restart (of the actor or the host) neither loses nor repeats one.
//!
//! Must never: put the bot token in a log, an error or a status (it is part
//! of every request path; errors are built without the URL), or act as
//! anything but its platform-bound [`AdapterIdentity`].

pub(crate) mod convert;

use std::sync::Arc;
use std::time::Duration;

use frankenstein::client_reqwest::Bot;
use frankenstein::methods::{
    DeleteWebhookParams, EditMessageTextParams, GetFileParams, GetUpdatesParams,
    SendChatActionParams, SendMessageParams, SetWebhookParams,
};
use frankenstein::response::MethodResponse;
use frankenstein::types::{AllowedUpdate, ChatAction, ReplyParameters};
use frankenstein::updates::Update;
use frankenstein::AsyncTelegramApi;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use self::convert::{BotSelf, Inbound, PLATFORM};
use super::registry::{AdapterRun, Platform};
use super::{split_reply, AdapterIdentity, AdapterKit, Backoff, ChatAdapter, EditPace, Sent};
use crate::actors::adapter::AdapterBoard;
use crate::app::App;
use crate::config::{DmPolicy, Settings, TelegramConfig, TelegramMode};
use crate::storage::outbox::{DeliveryRefs, OutboxItem};
use crate::storage::{adapters, StoreError};

/// The name on the board and in `adapter_positions`.
pub(crate) const ADAPTER: &str = "telegram";

/// Telegram on the adapters' registry.
pub(crate) struct Telegram;

impl Platform for Telegram {
    fn name(&self) -> &'static str {
        ADAPTER
    }

    fn secret_vars(&self) -> &'static [&'static str] {
        &[super::TELEGRAM_TOKEN_ENV]
    }

    fn enabled(&self, settings: &Settings) -> bool {
        settings.adapters.telegram.enabled
    }

    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy> {
        settings.adapters.telegram.dm_policy
    }

    fn identifier_patterns(&self) -> &'static [&'static str] {
        &[
            // User and chat ids in their namespaced form (`telegram:-100…`).
            r"(?i)\btelegram ?: ?-?[0-9]{1,21}\b",
            // Usernames: 5-32 of `A-Za-z0-9_`, starting with a letter, after
            // an `@` that does not end an e-mail's local part, or after `t.me/`.
            r"(?i)(?:^|[^A-Za-z0-9_.@+\-])(@[a-z][a-z0-9_]{4,31}|t\.me/[a-z][a-z0-9_]{4,31})\b",
        ]
    }
}

impl ChatAdapter for Telegram {
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun {
        Box::pin(async move {
            run(kit.app.clone(), kit.secret(0), kit.pace.clone(), cancel)
                .await
                .map_err(|e| e.to_string())
        })
    }

    /// Webhook mode: the calls, on every host.
    fn intake(&self, kit: &AdapterKit, cancel: CancellationToken) -> Option<AdapterRun> {
        if kit.app.rt.settings.adapters.telegram.mode != TelegramMode::Webhook {
            return None;
        }
        let kit = kit.clone();
        Some(Box::pin(async move {
            intake(kit.app.clone(), kit.secret(0), kit.pace.clone(), cancel)
                .await
                .map_err(|e| e.to_string())
        }))
    }

    fn turn_tools(
        &self,
        kit: &AdapterKit,
        cancel: CancellationToken,
    ) -> Result<super::TurnTools, String> {
        let cfg = &kit.app.rt.settings.adapters.telegram;
        let token = kit.secret(0);
        let (bot, http) = bot_for(cfg, &token).map_err(|e| e.to_string())?;
        let base = cfg.api_base_url.trim_end_matches('/');
        Ok(super::TurnTools {
            editor: Some(Arc::new(TelegramEditor {
                bot: bot.clone(),
                pace: kit.pace.clone(),
                cancel,
            })),
            source: Some(Arc::new(TelegramFiles {
                bot,
                http,
                file_base: format!("{base}/file/bot{token}"),
            })),
        })
    }
}

/// The Bot API client for `token`, and the HTTP client under it.
fn bot_for(cfg: &TelegramConfig, token: &str) -> Result<(Bot, reqwest::Client), TelegramError> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        // A long poll waits poll_timeout_secs for an answer.
        .timeout(Duration::from_secs(u64::from(cfg.poll_timeout_secs) + 15))
        .build()
        .map_err(|e| TelegramError::Client(e.without_url().to_string()))?;
    let base = cfg.api_base_url.trim_end_matches('/');
    let bot = Bot::builder()
        .api_url(format!("{base}/bot{token}"))
        .client(client.clone())
        .build();
    Ok((bot, client))
}
/// Telegram's longest message, in UTF-16 code units.
pub(crate) const MAX_MESSAGE: usize = 4096;
/// The longest `retry_after` waited out; a longer one is waited in steps.
const RETRY_AFTER_CAP_SECS: u64 = 3600;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TelegramError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a Bot API call failed.
#[derive(Debug)]
enum Failure {
    /// 429: wait this many seconds, then send the same call again.
    RetryAfter(u64),
    /// Telegram answered with an error (a bad chat id, a blocked bot, …).
    Api(String),
    /// No answer (connection, timeout, an unreadable body).
    Transport(String),
}

fn classify(e: frankenstein::Error) -> Failure {
    match e {
        frankenstein::Error::Api(r) => match r.parameters.and_then(|p| p.retry_after) {
            Some(secs) if r.error_code == 429 => Failure::RetryAfter(u64::from(secs)),
            _ if r.error_code == 429 => Failure::RetryAfter(1),
            _ => Failure::Api(format!("{} {}", r.error_code, r.description)),
        },
        // The body may hold people's messages: only the parser's reason is kept.
        frankenstein::Error::JsonDecode { source, .. } => {
            Failure::Transport(format!("an answer Mercury cannot read: {source}"))
        }
        // Built without the URL by frankenstein: the token is not in it.
        other => Failure::Transport(other.to_string()),
    }
}

/// What every part of a running adapter shares.
struct Ctx {
    app: Arc<App>,
    bot: Bot,
    me: BotSelf,
    identity: AdapterIdentity,
    cancel: CancellationToken,
    editor: Arc<TelegramEditor>,
    http: reqwest::Client,
    /// `{api_base_url}/bot{token}`: a secret, never in an error.
    method_base: String,
}

/// The largest file the Bot API takes as an upload, and as a photo.
const UPLOAD_MAX: usize = 50 << 20;
const PHOTO_MAX: usize = 10 << 20;

/// The least time between two edits of a message in a private chat, and in
/// a group (Telegram: about one message a second per chat, twenty a minute
/// per group; an edit counts as a message).
const EDIT_EVERY_PRIVATE: Duration = Duration::from_secs(1);
const EDIT_EVERY_GROUP: Duration = Duration::from_secs(3);

/// Fetches what a message carried: `getFile` for the file's path, then its
/// bytes from the Bot API's file route.
struct TelegramFiles {
    bot: Bot,
    http: reqwest::Client,
    /// `{api_base_url}/file/bot{token}`: a secret, never in an error.
    file_base: String,
}

#[async_trait::async_trait]
impl crate::runtime::AttachmentSource for TelegramFiles {
    async fn fetch(
        &self,
        reference: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, crate::runtime::FetchError> {
        use crate::runtime::FetchError;
        let params = GetFileParams::builder().file_id(reference).build();
        let file = match self.bot.get_file(&params).await.map_err(classify) {
            Ok(f) => f.result,
            Err(Failure::Api(e) | Failure::Transport(e)) => {
                return Err(FetchError::Failed(format!("getFile: {e}")))
            }
            Err(Failure::RetryAfter(secs)) => {
                return Err(FetchError::Failed(format!("getFile: wait {secs} s")))
            }
        };
        if file.file_size.is_some_and(|n| n > max_bytes) {
            return Err(FetchError::TooLarge(max_bytes));
        }
        // Telegram's own relative path (`photos/file_1.jpg`): anything else
        // is not followed.
        let path = file
            .file_path
            .filter(|p| {
                !p.is_empty()
                    && !p.starts_with('/')
                    && !p
                        .split('/')
                        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
            })
            .ok_or_else(|| FetchError::Failed("getFile gave no usable file_path".into()))?;
        super::download_capped(
            &self.http,
            &format!("{}/{path}", self.file_base),
            None,
            max_bytes,
        )
        .await
        .map_err(|e| match e {
            FetchError::Failed(why) => FetchError::Failed(format!("the file route: {why}")),
            other => other,
        })
    }
}

/// Shows streamed replies (`sendMessage`, then `editMessageText`), paced per
/// chat; the final reply's edit goes through it too.
struct TelegramEditor {
    bot: Bot,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
}

/// How one edit went.
enum Edited {
    Done,
    /// The message is gone or too old to edit: send the text anew.
    Gone,
    Failed(Failure),
    Stopping,
}

impl TelegramEditor {
    async fn edit_message(&self, chat: i64, message: i32, text: &str) -> Edited {
        // Group chats have negative ids.
        let every = if chat < 0 {
            EDIT_EVERY_GROUP
        } else {
            EDIT_EVERY_PRIVATE
        };
        self.pace.wait(&chat.to_string(), every).await;
        let params = EditMessageTextParams::builder()
            .chat_id(chat)
            .message_id(message)
            .text(text)
            .build();
        loop {
            let res = tokio::select! {
                _ = self.cancel.cancelled() => return Edited::Stopping,
                r = self.bot.edit_message_text(&params) => r,
            };
            match res.map_err(classify) {
                Ok(_) => return Edited::Done,
                // The same text again (a retried delivery): already shown.
                Err(Failure::Api(e)) if e.contains("message is not modified") => {
                    return Edited::Done
                }
                Err(Failure::Api(e))
                    if e.contains("message to edit not found")
                        || e.contains("message can't be edited") =>
                {
                    return Edited::Gone
                }
                Err(Failure::RetryAfter(secs)) => {
                    let wait = Duration::from_secs(secs.clamp(1, RETRY_AFTER_CAP_SECS));
                    if !super::pause(&self.cancel, wait).await {
                        return Edited::Stopping;
                    }
                }
                Err(f) => return Edited::Failed(f),
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::runtime::ReplyEditor for TelegramEditor {
    async fn send(&self, chat: &str, answered: Option<&str>, text: &str) -> Result<String, String> {
        let chat = chat
            .parse::<i64>()
            .map_err(|_| format!("{chat:?} is not a Telegram chat id"))?;
        let reply = answered.and_then(|m| m.parse::<i32>().ok()).map(|m| {
            ReplyParameters::builder()
                .message_id(m)
                .allow_sending_without_reply(true)
                .build()
        });
        let params = SendMessageParams::builder()
            .chat_id(chat)
            .text(text)
            .maybe_reply_parameters(reply)
            .build();
        match self.bot.send_message(&params).await.map_err(classify) {
            Ok(sent) => Ok(sent.result.message_id.to_string()),
            Err(Failure::RetryAfter(secs)) => Err(format!("sendMessage: wait {secs} s")),
            Err(Failure::Api(e) | Failure::Transport(e)) => Err(format!("sendMessage: {e}")),
        }
    }

    async fn edit(&self, chat: &str, message: &str, text: &str) -> Result<(), String> {
        let (Ok(chat), Ok(message)) = (chat.parse::<i64>(), message.parse::<i32>()) else {
            return Err(format!("{chat:?}/{message:?} is not a Telegram message"));
        };
        match self.edit_message(chat, message, text).await {
            Edited::Done => Ok(()),
            Edited::Gone => Err("editMessageText: the message is gone".into()),
            Edited::Stopping => Err("the adapter is stopping".into()),
            Edited::Failed(Failure::Api(e) | Failure::Transport(e)) => {
                Err(format!("editMessageText: {e}"))
            }
            Edited::Failed(Failure::RetryAfter(secs)) => {
                Err(format!("editMessageText: wait {secs} s"))
            }
        }
    }

    fn max_units(&self) -> usize {
        MAX_MESSAGE
    }
}

impl Ctx {
    fn board(&self) -> &AdapterBoard {
        &self.app.adapters
    }

    /// Sleeps `d`; false if the adapter is stopping.
    async fn pause(&self, d: Duration) -> bool {
        super::pause(&self.cancel, d).await
    }
}

/// The adapter's loop, from `getMe` to polling (or the webhook) and the outbox.
pub(crate) async fn run(
    app: Arc<App>,
    token: String,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
) -> Result<(), TelegramError> {
    let cfg = app.rt.settings.adapters.telegram.clone();
    app.adapters.set_mode(
        ADAPTER,
        match cfg.mode {
            TelegramMode::Polling => "polling",
            TelegramMode::Webhook => "webhook",
        },
    );
    let Some(ctx) = connect(app, &token, pace, cancel).await? else {
        return Ok(());
    };
    ctx.board().connected(ADAPTER);
    tracing::info!(bot = %ctx.me.username, mode = ?cfg.mode, "telegram adapter connected");
    let intake = async {
        match cfg.mode {
            TelegramMode::Polling => poll(&ctx).await,
            TelegramMode::Webhook => set_webhook(&ctx, &cfg.webhook_url, &token).await,
        }
    };
    tokio::select! {
        r = intake => r,
        r = deliver_loop(&ctx) => r,
    }
}

/// Webhook mode, on every host: the calls `crate::api` passes on (their
/// secret checked) are stored; a store that fails answers Telegram 503
/// (it sends the update again) and restarts the adapter.
async fn intake(
    app: Arc<App>,
    token: String,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
) -> Result<(), TelegramError> {
    // `getMe` first: who the bot is decides which group messages are for it.
    let Some(ctx) = connect(app, &token, pace, cancel).await? else {
        return Ok(());
    };
    // Telegram would resend a refused body forever: an unreadable one is
    // acknowledged (`take_raw` skips it).
    let secret = webhook_secret(&token);
    let take = |body| take_raw(&ctx, body);
    super::take_webhook_calls(ctx.board(), ADAPTER, secret, None, &ctx.cancel, take).await
}

/// The secret Telegram sends back on every webhook call: HMAC-SHA256 of a
/// fixed label under the bot token, hex. Every host derives the same one;
/// only a holder of the token (who could set any webhook anyway) can.
pub(crate) fn webhook_secret(token: &str) -> String {
    use hmac::{KeyInit, Mac};
    let secret = match hmac::Hmac::<sha2::Sha256>::new_from_slice(token.as_bytes()) {
        Ok(mut mac) => {
            mac.update(b"mercury telegram webhook secret v1");
            base16ct::lower::encode_string(&mac.finalize().into_bytes())
        }
        // HMAC takes a key of any length; kept total all the same.
        Err(_) => base16ct::lower::encode_string(&rand::rng().random::<[u8; 32]>()),
    };
    crate::redaction::secrets::register(&secret);
    secret
}

/// `getMe` until it answers, then what every loop of the adapter shares;
/// `None` when the adapter stops first.
async fn connect(
    app: Arc<App>,
    token: &str,
    pace: Arc<EditPace>,
    cancel: CancellationToken,
) -> Result<Option<Arc<Ctx>>, TelegramError> {
    let cfg = &app.rt.settings.adapters.telegram;
    let board = app.adapters.clone();
    let (bot, client) = bot_for(cfg, token)?;
    let base = cfg.api_base_url.trim_end_matches('/');
    let method_base = format!("{base}/bot{token}");
    let Some(r) = until_ok(&board, &cancel, "getMe", || bot.get_me()).await else {
        return Ok(None);
    };
    let me = BotSelf {
        id: r.result.id,
        username: r.result.username.unwrap_or_default(),
    };
    // The final edit of a streamed reply counts against the same pacing
    // as its preview's edits.
    let editor = Arc::new(TelegramEditor {
        bot: bot.clone(),
        pace,
        cancel: cancel.clone(),
    });
    let ctx = Arc::new(Ctx {
        app,
        bot,
        me,
        identity: AdapterIdentity::bound_to(PLATFORM),
        cancel,
        editor,
        http: client,
        method_base,
    });
    Ok(Some(ctx))
}

/// Sends the call `f` makes until it succeeds: a 429 is waited out, any
/// other failure recorded on the board and backed off. `None` if the
/// adapter is stopping.
async fn until_ok<T, F, Fut>(
    board: &AdapterBoard,
    cancel: &CancellationToken,
    call: &str,
    mut f: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, frankenstein::Error>>,
{
    let mut backoff = Backoff::default();
    loop {
        let res = tokio::select! {
            _ = cancel.cancelled() => return None,
            r = f() => r,
        };
        match res.map_err(classify) {
            Ok(v) => return Some(v),
            Err(failure) => {
                let wait = wait_for(board, &failure, &mut backoff, call);
                if !super::pause(cancel, wait).await {
                    return None;
                }
            }
        }
    }
}

/// How long to wait after a failed call, recording it on the board.
fn wait_for(board: &AdapterBoard, f: &Failure, backoff: &mut Backoff, call: &str) -> Duration {
    match f {
        Failure::RetryAfter(secs) => Duration::from_secs((*secs).clamp(1, RETRY_AFTER_CAP_SECS)),
        Failure::Api(e) | Failure::Transport(e) => {
            let msg = format!("{call}: {e}");
            tracing::warn!(error = %msg, "telegram call failed");
            board.failed(ADAPTER, &msg);
            backoff.next()
        }
    }
}

fn allowed_updates() -> Vec<AllowedUpdate> {
    vec![AllowedUpdate::Message, AllowedUpdate::EditedMessage]
}

/// Long polling: only the stored offset is sent, so an update is
/// acknowledged once (and only once) its row is committed.
async fn poll(ctx: &Arc<Ctx>) -> Result<(), TelegramError> {
    let timeout = ctx.app.rt.settings.adapters.telegram.poll_timeout_secs;
    let mut backoff = Backoff::default();
    // getUpdates is refused (409) while a webhook is set.
    let clear = DeleteWebhookParams::builder().build();
    if let Err(f) = ctx.bot.delete_webhook(&clear).await.map_err(classify) {
        let wait = wait_for(ctx.board(), &f, &mut backoff, "deleteWebhook");
        if !ctx.pause(wait).await {
            return Ok(());
        }
    }
    loop {
        let offset = ctx
            .app
            .rt
            .store
            .read(|c| adapters::position(c, ADAPTER))
            .await?
            .and_then(|p| p.parse::<i64>().ok());
        let params = GetUpdatesParams::builder()
            .maybe_offset(offset)
            .timeout(timeout)
            .limit(100)
            .allowed_updates(allowed_updates())
            .build();
        // Each update is read on its own: one Mercury cannot read (a newer
        // Bot API shape) is skipped, not allowed to stall every later one.
        let get = || {
            ctx.bot
                .request::<_, MethodResponse<Vec<serde_json::Value>>>("getUpdates", Some(&params))
        };
        let Some(r) = until_ok(ctx.board(), &ctx.cancel, "getUpdates", get).await else {
            return Ok(());
        };
        ctx.board().connected(ADAPTER);
        for raw in r.result {
            take_raw(ctx, raw).await?;
        }
    }
}

/// Webhook mode, on the lease holder: once this host's `intake` takes the
/// calls, gives Telegram the URL and the deployment's secret with
/// `setWebhook`, then waits (the calls are taken by every host's `intake`).
async fn set_webhook(ctx: &Arc<Ctx>, url: &str, token: &str) -> Result<(), TelegramError> {
    let params = SetWebhookParams::builder()
        .url(url.to_owned())
        .secret_token(webhook_secret(token))
        .allowed_updates(allowed_updates())
        .build();
    // Telegram sends as soon as it is told: this host takes the calls
    // first (its intake registers them once its own `getMe` answered), so
    // the first update is not refused with a 404.
    tokio::select! {
        () = ctx.board().webhook_registered(ADAPTER) => {}
        () = ctx.cancel.cancelled() => return Ok(()),
    }
    let set = || ctx.bot.set_webhook(&params);
    if until_ok(ctx.board(), &ctx.cancel, "setWebhook", set)
        .await
        .is_none()
    {
        return Ok(());
    }
    ctx.board().connected(ADAPTER);
    ctx.cancel.cancelled().await;
    Ok(())
}

/// Reads one raw update; one Mercury cannot read is skipped (its offset
/// still advances) with a warning that names the reason, never the text.
async fn take_raw(ctx: &Arc<Ctx>, raw: serde_json::Value) -> Result<(), TelegramError> {
    let id = raw.get("update_id").and_then(serde_json::Value::as_i64);
    match serde_json::from_value::<Update>(raw) {
        Ok(update) => take(ctx, update).await,
        Err(e) => {
            tracing::warn!(update = ?id, error = %e, "telegram update Mercury cannot read; skipped");
            if let Some(id) = id {
                ctx.app
                    .rt
                    .store
                    .write(move |tx| adapters::advance_offset(tx, ADAPTER, id + 1))
                    .await?;
            }
            Ok(())
        }
    }
}

/// Stores one update (or records it as skipped) together with the offset
/// after it. Only a failed store write is an error (the actor restarts and
/// the update comes again); a failed wake-up is not: the row is stored and
/// pending rows are picked up when the space's actor starts.
async fn take(ctx: &Arc<Ctx>, update: Update) -> Result<(), TelegramError> {
    let next = i64::from(update.update_id) + 1;
    let advance = move |tx: &crate::storage::Tx<'_>| adapters::advance_offset(tx, ADAPTER, next);
    ctx.board().updated(ADAPTER);
    let (m, carried) = match convert::inbound(&update, &ctx.me) {
        Inbound::Message(m, carried) => (m, carried),
        Inbound::Skip(why) => {
            tracing::debug!(update = update.update_id, why, "telegram update skipped");
            ctx.app.rt.store.write(advance).await?;
            return Ok(());
        }
    };
    // What the message carried is stored with it, fetched at turn time.
    let (conversation, pid) = (m.conversation.clone(), m.message_id.clone());
    let advance = move |tx: &crate::storage::Tx<'_>| {
        advance(tx)?;
        crate::storage::attachments::attach(tx, PLATFORM, &conversation, &pid, &carried)?;
        Ok(())
    };
    let chat = m.conversation.parse::<i64>().ok();
    let what = format!("telegram update {}", update.update_id);
    let queued = super::store_message(&ctx.app, ctx.identity, *m, &what, advance).await?;
    if let (Some(row), Some(chat)) = (queued, chat) {
        tokio::spawn(typing(ctx.clone(), chat, row));
    }
    Ok(())
}

/// "typing…" in `chat` while the turn answering row `message` runs:
/// Telegram shows it for five seconds, so it is renewed every four.
async fn typing(ctx: Arc<Ctx>, chat: i64, message: i64) {
    let params = SendChatActionParams::builder()
        .chat_id(chat)
        .action(ChatAction::Typing)
        .build();
    let send = || async {
        if let Err(Failure::Api(e) | Failure::Transport(e)) =
            ctx.bot.send_chat_action(&params).await.map_err(classify)
        {
            // Cosmetic: the reply still goes out.
            tracing::debug!(error = %e, "telegram sendChatAction failed");
        }
    };
    super::typing_while_pending(&ctx.app, &ctx.cancel, message, Duration::from_secs(4), send).await;
}

/// Delivers Telegram's outbox items, oldest first.
async fn deliver_loop(ctx: &Arc<Ctx>) -> Result<(), TelegramError> {
    let send = |item, refs| deliver(ctx, item, refs);
    Ok(super::deliver_outbox(&ctx.app, PLATFORM, &ctx.cancel, send).await?)
}

/// Sends one outbox item, in pieces if long, the first threaded under the
/// message it answers (or, for a streamed reply, as the edit of its
/// preview, which is sent anew if the preview is gone); a 429 is waited out
/// and the same piece sent again.
async fn deliver(ctx: &Arc<Ctx>, item: OutboxItem, refs: DeliveryRefs) -> Sent {
    let Ok(chat) = item.external_id.parse::<i64>() else {
        return Sent::Refused(format!("{:?} is not a Telegram chat id", item.external_id));
    };
    let answered = refs.answered.and_then(|m| m.parse::<i32>().ok());
    let preview = refs.edit_of.and_then(|m| m.parse::<i32>().ok());
    for (i, part) in split_reply(&item.text, MAX_MESSAGE).into_iter().enumerate() {
        if let (0, Some(preview)) = (i, preview) {
            match ctx.editor.edit_message(chat, preview, &part).await {
                Edited::Done => continue,
                Edited::Gone => {}
                Edited::Stopping => return Sent::Stopping,
                Edited::Failed(Failure::Api(e)) => return Sent::Refused(e),
                Edited::Failed(Failure::Transport(error)) => {
                    return Sent::Unreachable {
                        call: "editMessageText",
                        error,
                    }
                }
                // `edit_message` waits a 429 out itself.
                Edited::Failed(Failure::RetryAfter(secs)) => {
                    return Sent::Unreachable {
                        call: "editMessageText",
                        error: format!("asked to wait {secs} s"),
                    }
                }
            }
        }
        // The answer still goes out if that message was deleted meanwhile.
        let reply = answered.filter(|_| i == 0).map(|m| {
            ReplyParameters::builder()
                .message_id(m)
                .allow_sending_without_reply(true)
                .build()
        });
        let params = SendMessageParams::builder()
            .chat_id(chat)
            .text(part)
            .maybe_reply_parameters(reply)
            .build();
        loop {
            let res = tokio::select! {
                _ = ctx.cancel.cancelled() => return Sent::Stopping,
                r = ctx.bot.send_message(&params) => r,
            };
            match res.map_err(classify) {
                Ok(_) => break,
                Err(Failure::RetryAfter(secs)) => {
                    tracing::info!(secs, "telegram asked to wait before sending");
                    let wait = Duration::from_secs(secs.clamp(1, RETRY_AFTER_CAP_SECS));
                    if !ctx.pause(wait).await {
                        return Sent::Stopping;
                    }
                }
                Err(Failure::Api(e)) => return Sent::Refused(e),
                Err(Failure::Transport(error)) => {
                    return Sent::Unreachable {
                        call: "sendMessage",
                        error,
                    }
                }
            }
        }
    }
    for path in &refs.files {
        match send_file(ctx, chat, &item.space_id, path).await {
            Ok(()) => {}
            Err(Failure::Api(e)) => return Sent::Refused(e),
            Err(Failure::Transport(error)) => {
                return Sent::Unreachable {
                    call: "sendDocument",
                    error,
                }
            }
            Err(Failure::RetryAfter(secs)) => {
                return Sent::Unreachable {
                    call: "sendDocument",
                    error: format!("asked to wait {secs} s"),
                }
            }
        }
    }
    Sent::Delivered
}

/// Uploads one file of the space's workspace (`outbox/…`, read through the
/// safe-path function) into `chat`: a picture of at most 10 MB with
/// `sendPhoto`, anything else with `sendDocument`. A file gone meanwhile
/// is skipped with a warning (the reply itself went out).
async fn send_file(ctx: &Arc<Ctx>, chat: i64, space: &str, rel: &str) -> Result<(), Failure> {
    let file = super::reply_file(
        &ctx.app,
        space,
        rel,
        UPLOAD_MAX,
        "the Bot API's 50 MB upload",
    )
    .await
    .map_err(Failure::Api)?;
    let Some(file) = file else {
        return Ok(());
    };
    let (method, field) = if file.is_picture() && file.bytes.len() <= PHOTO_MAX {
        ("sendPhoto", "photo")
    } else {
        ("sendDocument", "document")
    };
    let (content_type, body) = crate::model::form::Form::new()
        .text("chat_id", &chat.to_string())
        .file(field, &file.name, file.mime, &file.bytes)
        .finish();
    loop {
        let sent = tokio::select! {
            _ = ctx.cancel.cancelled() => return Err(Failure::Transport("stopping".into())),
            r = ctx
                .http
                .post(format!("{}/{method}", ctx.method_base))
                .header(reqwest::header::CONTENT_TYPE, &content_type)
                .body(body.clone())
                .send() => r,
        };
        let res = sent.map_err(|e| Failure::Transport(e.without_url().to_string()))?;
        let answer: serde_json::Value = res
            .json()
            .await
            .map_err(|e| Failure::Transport(e.without_url().to_string()))?;
        if answer["ok"].as_bool() == Some(true) {
            return Ok(());
        }
        let code = answer["error_code"].as_i64().unwrap_or(0);
        if code == 429 {
            let secs = answer["parameters"]["retry_after"].as_u64().unwrap_or(1);
            if !ctx
                .pause(Duration::from_secs(secs.clamp(1, RETRY_AFTER_CAP_SECS)))
                .await
            {
                return Err(Failure::Transport("stopping".into()));
            }
            continue;
        }
        let description = answer["description"].as_str().unwrap_or("").to_owned();
        return Err(Failure::Api(format!("{method}: {code} {description}")));
    }
}
