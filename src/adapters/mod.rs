//! The in-process chat adapters: each one speaks one platform (Telegram,
//! Discord, WhatsApp, Slack), feeds its messages to [`crate::ingress`] and
//! delivers that platform's outbox items. Each is a [`ChatAdapter`] on the
//! one list in [`registry`], runs as an [`AdapterActor`] under the root
//! supervisor (restarted on failure) and keeps its position in
//! `adapter_positions`, written in the same transaction as the message row
//! it covers.
//!
//! [`start`] is the one place adapters are constructed; the host calls it
//! (and must not in shadow mode: a rehearsal copy never talks to a platform).
//!
//! Must never: act with an operator's or an admin's rights (an adapter is an
//! [`AdapterIdentity`] bound to its platform, like an adapter token), read a
//! platform secret from anywhere but the environment, or acknowledge a
//! platform update before its row is committed.

pub(crate) mod discord;
#[cfg(feature = "test-hooks")]
pub(crate) mod echo;
pub(crate) mod registry;
pub(crate) mod slack;
pub(crate) mod telegram;
pub(crate) mod whatsapp;

pub(crate) use registry::{AdapterKit, AdapterRun, ChatAdapter, TurnTools};

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{call_t, Actor, ActorCell, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;

use crate::actors::adapter::{AdapterBoard, SupervisedChild};
use crate::actors::SupervisorMsg;
use crate::app::App;
use crate::config::Settings;
use crate::ingress::{IngestResult, IngressError, IngressMessage};
use crate::storage::outbox::{self, OutboxItem};
use crate::storage::{messages, StoreError, StoreResult};

/// The environment variable the Telegram bot token is read from (only).
pub(crate) const TELEGRAM_TOKEN_ENV: &str = "MERCURY_TELEGRAM_BOT_TOKEN";
/// Delivery attempts of one outbox item before it is left undelivered.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AdapterError {
    #[error("the {adapter} adapter is enabled but {env} is not set")]
    MissingSecret {
        adapter: &'static str,
        env: &'static str,
    },
    #[error("the supervisor did not start the {adapter}: {reason}")]
    Start {
        adapter: &'static str,
        reason: String,
    },
    #[error("the supervisor did not start the {adapter}: {source}")]
    Supervised {
        adapter: &'static str,
        #[source]
        source: crate::actors::supervisor::SuperviseError,
    },
    #[error("the {adapter} may only ingest {adapter} messages, not {platform} ones")]
    WrongPlatform {
        adapter: &'static str,
        platform: String,
    },
    #[error(transparent)]
    Ingress(#[from] IngressError),
}

/// The identity an in-process adapter acts through: one platform, like an
/// adapter token bound at mint. Its messages' senders land in that
/// platform's namespace (`telegram:123`); it has no caller id of its own, so
/// it can never act as an operator or a global admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdapterIdentity {
    platform: &'static str,
}

impl AdapterIdentity {
    pub(crate) const fn bound_to(platform: &'static str) -> Self {
        Self { platform }
    }

    /// Ingests `m` (which must be of this identity's platform), running
    /// `also` in the same transaction as its row.
    pub(crate) async fn ingest<F>(
        &self,
        app: &App,
        m: IngressMessage,
        also: F,
    ) -> Result<IngestResult, AdapterError>
    where
        F: FnOnce(&crate::storage::Tx<'_>) -> StoreResult<()> + Send + 'static,
    {
        if m.platform != self.platform {
            return Err(AdapterError::WrongPlatform {
                adapter: self.platform,
                platform: m.platform,
            });
        }
        Ok(crate::ingress::ingest_with(app, m, crate::ingress::Origin::Adapter, also).await?)
    }
}

/// Stores one platform message through `identity` with `also` (the
/// adapter's position) in its transaction. `Some(row)` when a turn will
/// answer it (a typing indicator is due). A message ingress refuses (an
/// over-long text) is logged by `what` and only `also` is written. Only a
/// failed store write is an error (the adapter's actor restarts and the
/// platform gives the message again); a failed wake-up is not: the row is
/// stored, and pending rows are picked up when the space's actor starts.
pub(crate) async fn store_message<F>(
    app: &App,
    identity: AdapterIdentity,
    m: IngressMessage,
    what: &str,
    also: F,
) -> Result<Option<i64>, StoreError>
where
    F: FnOnce(&crate::storage::Tx<'_>) -> StoreResult<()> + Send + 'static,
{
    if let Err(e) = m.validate() {
        tracing::warn!(platform = identity.platform, message = what, error = %e, "message refused by ingress");
        app.rt.store.write(also).await?;
        return Ok(None);
    }
    match identity.ingest(app, m, also).await {
        Ok(r) => Ok(r
            .message_id
            .filter(|_| r.status == crate::ingress::IngestStatus::Queued)),
        Err(AdapterError::Ingress(IngressError::Store(e))) => Err(e),
        Err(e) => {
            tracing::error!(platform = identity.platform, error = %e, "message stored, but its space was not told");
            Ok(None)
        }
    }
}

/// The message's text with a marker per attachment (`[image]`, `[voice
/// note]`, `[file]`…): what history, redaction and review see of it, never
/// its bytes.
pub(crate) fn with_markers(
    text: &str,
    carried: &[crate::storage::attachments::NewAttachment],
) -> String {
    let mut out = text.to_owned();
    for a in carried {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(match a.kind.as_str() {
            "image" => "[image]",
            "voice" => "[voice note]",
            "audio" => "[audio]",
            "video" => "[video]",
            _ => "[file]",
        });
    }
    out
}

/// A display name or title ingress accepts: control characters dropped, at
/// most 200 characters; `None` if nothing is left (a platform-controlled
/// name is cleaned, never a reason to lose the message).
pub(crate) fn clean_name(raw: &str) -> Option<String> {
    let s: String = raw.chars().filter(|c| !c.is_control()).take(200).collect();
    let s = s.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// The enabled adapters' secrets, read from `env` (the process's `MERCURY_*`
/// environment) and nowhere else, by adapter name in registry order. The
/// host reads them before it starts anything, so a missing one stops
/// start-up with a sentence naming it.
#[derive(Clone, Default)]
pub(crate) struct AdapterSecrets {
    by_adapter: Vec<(&'static dyn ChatAdapter, Vec<String>)>,
}

// Holds bot tokens: a derived Debug would print them.
impl std::fmt::Debug for AdapterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.by_adapter.iter().map(|(a, _)| a.name()).collect();
        f.debug_struct("AdapterSecrets")
            .field("adapters", &names)
            .finish()
    }
}

impl AdapterSecrets {
    pub(crate) fn from_env(
        settings: &Settings,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, AdapterError> {
        let mut by_adapter = Vec::new();
        for adapter in registry::all() {
            if !adapter.enabled(settings) {
                continue;
            }
            let needed = adapter.secrets_needed(settings);
            let mut values = Vec::new();
            for &var in adapter.secret_vars() {
                let value = env.get(var).map(|t| t.trim()).filter(|t| !t.is_empty());
                let value = match value {
                    Some(v) => v,
                    None if !needed.contains(&var) => "",
                    None => {
                        return Err(AdapterError::MissingSecret {
                            adapter: adapter.name(),
                            env: var,
                        })
                    }
                };
                if !value.is_empty() {
                    // Never in a stored, served or logged error from here on.
                    crate::redaction::secrets::register(value);
                }
                values.push(value.to_owned());
            }
            by_adapter.push((adapter, values));
        }
        Ok(Self { by_adapter })
    }
}

/// Starts every adapter that has its secrets under the root supervisor. The
/// host calls this once, after the actors and before serving; shadow mode
/// must not.
pub(crate) async fn start(
    app: &Arc<App>,
    supervisor: &ActorRef<SupervisorMsg>,
    secrets: AdapterSecrets,
) -> Result<(), AdapterError> {
    for (adapter, values) in secrets.by_adapter {
        let name = adapter.name();
        // Configured but not yet connected: the gauge says so from the start.
        app.rt.metrics.set_adapter_up(name, false);
        let child = AdapterChild::running(adapter, AdapterKit::new(app.clone(), values));
        call_t!(
            supervisor,
            SupervisorMsg::Supervise,
            10_000,
            Arc::new(child)
        )
        .map_err(|e| AdapterError::Start {
            adapter: name,
            reason: e.to_string(),
        })?
        .map_err(|source| AdapterError::Supervised {
            adapter: name,
            source,
        })?;
    }
    Ok(())
}

/// An adapter's loop, started anew on every (re)start.
pub(crate) type AdapterLoop = Arc<
    dyn Fn(CancellationToken) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// One of many hosts: an adapter keeps one upstream connection per
/// deployment (a second Telegram poller would steal the first one's
/// updates), so it runs only on the host holding its lease
/// (`adapter:<name>`), and stops there as soon as a renewal finds the lease
/// gone; the other hosts wait, in standby, to take it.
async fn under_lease(
    seat: Arc<crate::cluster::HostSeat>,
    adapter: &'static dyn ChatAdapter,
    kit: AdapterKit,
    cancel: CancellationToken,
) -> Result<(), String> {
    let lease = format!("adapter:{}", adapter.name());
    let every = seat.heartbeat_every();
    loop {
        while !seat.hold_named(&lease).await {
            kit.app.adapters.set_mode(adapter.name(), "standby");
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(every) => {}
            }
        }
        let connection = cancel.child_token();
        let mut run = adapter.run(kit.clone(), connection.clone());
        let lost = async {
            loop {
                tokio::time::sleep(every).await;
                if !seat.hold_named(&lease).await {
                    return;
                }
            }
        };
        tokio::select! {
            r = &mut run => return r,
            _ = lost => {
                tracing::warn!(adapter = adapter.name(), "this host lost the adapter's lease; it stops here");
                connection.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
            }
        }
        if cancel.is_cancelled() {
            return Ok(());
        }
    }
}

/// The root supervisor's handle on one adapter: how to (re)start it.
pub(crate) struct AdapterChild {
    /// The name on the board and in `adapter_positions` (`telegram`).
    name: &'static str,
    board: AdapterBoard,
    run: AdapterLoop,
}

impl AdapterChild {
    /// The child whose every (re)start runs `adapter.run(kit, cancel)` anew.
    pub(crate) fn running(adapter: &'static dyn ChatAdapter, kit: AdapterKit) -> Self {
        let board = kit.app.adapters.clone();
        let run: AdapterLoop = Arc::new(move |cancel| {
            let kit = kit.clone();
            Box::pin(async move {
                // Turns on this host stream and fetch through these, on a
                // standby host too.
                let tools = adapter.turn_tools(&kit, cancel.clone())?;
                let _seats = tools.seat(&kit.app, adapter.name());
                let intake = adapter.intake(&kit, cancel.clone());
                let run: AdapterRun = match kit.app.rt.cluster.clone() {
                    None => adapter.run(kit, cancel),
                    Some(seat) => Box::pin(under_lease(seat, adapter, kit, cancel)),
                };
                match intake {
                    None => run.await,
                    // Either half ending (a failure, or the stop) ends both.
                    Some(intake) => tokio::select! {
                        r = run => r,
                        r = intake => r,
                    },
                }
            })
        });
        Self {
            name: adapter.name(),
            board,
            run,
        }
    }
}

#[async_trait::async_trait]
impl SupervisedChild for AdapterChild {
    fn name(&self) -> String {
        format!("{} adapter", self.name)
    }

    async fn spawn(&self, supervisor: ActorCell) -> Result<ActorCell, ActorProcessingErr> {
        let args = AdapterArgs {
            name: self.name,
            board: self.board.clone(),
            run: self.run.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, AdapterActor, args, supervisor).await?;
        Ok(actor.get_cell())
    }
}

/// One running adapter: its loop runs on a task of its own (a platform call
/// never blocks the actor); the loop's error, or its panic, fails the actor
/// and the supervisor starts it again.
pub(crate) struct AdapterActor;

pub(crate) struct AdapterArgs {
    name: &'static str,
    board: AdapterBoard,
    run: AdapterLoop,
}

pub(crate) enum AdapterMsg {
    Failed(String),
}

pub(crate) struct AdapterState {
    name: &'static str,
    cancel: CancellationToken,
    board: AdapterBoard,
}

impl Actor for AdapterActor {
    type Msg = AdapterMsg;
    type State = AdapterState;
    type Arguments = AdapterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AdapterMsg>,
        args: AdapterArgs,
    ) -> Result<AdapterState, ActorProcessingErr> {
        let cancel = CancellationToken::new();
        let task = tokio::spawn((args.run)(cancel.clone()));
        tokio::spawn(async move {
            let failure = match task.await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e,
                Err(e) => format!("the adapter's loop panicked: {e}"),
            };
            let _ = myself.cast(AdapterMsg::Failed(failure));
        });
        Ok(AdapterState {
            name: args.name,
            cancel,
            board: args.board,
        })
    }

    async fn handle(
        &self,
        _me: ActorRef<AdapterMsg>,
        msg: AdapterMsg,
        state: &mut AdapterState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AdapterMsg::Failed(e) => {
                state.board.failed(state.name, &e);
                Err(e.into())
            }
        }
    }

    async fn post_stop(
        &self,
        _me: ActorRef<AdapterMsg>,
        state: &mut AdapterState,
    ) -> Result<(), ActorProcessingErr> {
        state.cancel.cancel();
        state.board.remove_webhook(state.name);
        Ok(())
    }
}

/// A growing pause between failed platform calls: 0.5 s doubling to 30 s.
#[derive(Debug, Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    pub(crate) fn next(&mut self) -> Duration {
        self.0 = (self.0 + 1).min(7);
        Duration::from_millis((250u64 << self.0).min(30_000))
    }
}

/// Sleeps `d`; false if `cancel` fired first.
pub(crate) async fn pause(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// A platform's webhook intake, on every host: registers `adapter`'s inbox
/// (the route checks `secret`, and `verify_token` where the platform has
/// one, before it passes a call on), stores each call through `take` until
/// `cancel` fires, and removes the inbox again. A call whose store fails is
/// answered `NotStored` (the route says 503, the platform sends it again)
/// and ends the intake with that error, so the adapter restarts.
pub(crate) async fn take_webhook_calls<E, F, Fut>(
    board: &AdapterBoard,
    adapter: &str,
    secret: String,
    verify_token: Option<String>,
    cancel: &CancellationToken,
    mut take: F,
) -> Result<(), E>
where
    F: FnMut(serde_json::Value) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    use crate::actors::adapter::{WebhookCall, WebhookCallError, WebhookInbox};
    let (calls, mut inbox) = tokio::sync::mpsc::channel::<WebhookCall>(64);
    board.register_webhook(
        adapter,
        WebhookInbox {
            secret,
            verify_token,
            calls,
        },
    );
    let taken = async {
        loop {
            let call = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                c = inbox.recv() => c,
            };
            let Some(call) = call else { return Ok(()) };
            match take(call.body).await {
                Ok(()) => {
                    let _ = call.done.send(Ok(()));
                }
                Err(e) => {
                    let _ = call.done.send(Err(WebhookCallError::NotStored));
                    return Err(e);
                }
            }
        }
    }
    .await;
    board.remove_webhook(adapter);
    taken
}

/// Shows "typing…" while the turn answering row `message` runs: `send`
/// every `renew` (a platform shows it for a few seconds) until the message
/// is no longer pending, the turn's time is up, or `cancel` fires. A failed
/// `send` is the caller's to log: the reply still goes out.
pub(crate) async fn typing_while_pending<F, Fut>(
    app: &App,
    cancel: &CancellationToken,
    message: i64,
    renew: Duration,
    mut send: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let limit = Duration::from_secs(app.rt.settings.turn.timeout_secs + 30);
    let started = Instant::now();
    // The turn's end wakes this at once; the status read, once per renewal,
    // covers a message answered without a turn of its own.
    let mut answered = app.rt.waiters.register(message);
    while started.elapsed() < limit {
        send().await;
        tokio::select! {
            _ = &mut answered => return,
            go_on = pause(cancel, renew) => if !go_on { return },
        }
        let pending = app
            .rt
            .store
            .read(move |c| messages::get(c, message))
            .await
            .ok()
            .flatten()
            .is_some_and(|m| m.status.as_deref() == Some("pending"));
        if !pending {
            return;
        }
    }
}

/// Spaces the edits of each chat at least an interval apart: a platform
/// counts a chat's edits (a streamed preview's, then the final reply's)
/// against one limit.
#[derive(Debug, Default)]
pub(crate) struct EditPace(std::sync::Mutex<std::collections::HashMap<String, Instant>>);

impl EditPace {
    /// Waits for `chat`'s turn; the next edit of it may come `interval` later.
    pub(crate) async fn wait(&self, chat: &str, interval: Duration) {
        let wait = match self.0.lock() {
            Ok(mut next) => {
                let now = Instant::now();
                if next.len() > 1024 {
                    next.retain(|_, at| *at > now);
                }
                let at = next
                    .get(chat)
                    .copied()
                    .filter(|at| *at > now)
                    .unwrap_or(now);
                next.insert(chat.to_owned(), at + interval);
                at - now
            }
            Err(_) => interval,
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// `scheme://host[:port]` of `url`, lower-cased, if it has one.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    let host = u.host_str()?.to_ascii_lowercase();
    Some(match u.port() {
        Some(p) => format!("{}://{host}:{p}", u.scheme()),
        None => format!("{}://{host}", u.scheme()),
    })
}

/// [`download_capped`] of a URL a platform's payload gave, only when its
/// origin is one of `origins` (the `setting` that lists them is named in
/// the refusal): a field never decides where the host fetches from, nor
/// where a token goes.
pub(crate) async fn download_from(
    http: &reqwest::Client,
    url: &str,
    origins: &[String],
    setting: &str,
    auth: Option<&str>,
    max: u64,
) -> Result<Vec<u8>, crate::runtime::FetchError> {
    let allowed = origin_of(url)
        .is_some_and(|o| origins.iter().any(|a| origin_of(a).is_some_and(|a| a == o)));
    if !allowed {
        return Err(crate::runtime::FetchError::Failed(format!(
            "its URL is not on an origin of {setting}"
        )));
    }
    download_capped(http, url, auth, max).await
}

/// An attachment's kind from its declared type (`image/png; …` → `image`).
pub(crate) fn kind_of(mime: Option<&str>) -> &'static str {
    match mime {
        Some(t) if t.starts_with("image/") => "image",
        Some(t) if t.starts_with("audio/") => "audio",
        Some(t) if t.starts_with("video/") => "video",
        _ => "file",
    }
}

/// A declared type without its parameters, lower-cased (`audio/ogg;
/// codecs=opus` → `audio/ogg`).
pub(crate) fn bare_mime(t: &str) -> String {
    t.split(';').next().unwrap_or(t).trim().to_ascii_lowercase()
}

/// GETs `url`, reading at most `max` bytes of its body (a longer one is
/// refused as soon as it shows: by its `Content-Length`, or while it is
/// read). Errors never carry the URL (a Bot API file URL holds the token).
pub(crate) async fn download_capped(
    http: &reqwest::Client,
    url: &str,
    auth: Option<&str>,
    max: u64,
) -> Result<Vec<u8>, crate::runtime::FetchError> {
    use crate::runtime::FetchError;
    let mut req = http.get(url);
    if let Some(a) = auth {
        req = req.header(reqwest::header::AUTHORIZATION, a);
    }
    let mut res = req
        .send()
        .await
        .map_err(|e| FetchError::Failed(e.without_url().to_string()))?;
    if !res.status().is_success() {
        return Err(FetchError::Failed(format!("answered {}", res.status())));
    }
    if res.content_length().is_some_and(|n| n > max) {
        return Err(FetchError::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = res
        .chunk()
        .await
        .map_err(|e| FetchError::Failed(e.without_url().to_string()))?
    {
        if (body.len() + chunk.len()) as u64 > max {
            return Err(FetchError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A file the agent wrote under `outbox/` during a turn, read back for
/// its reply.
#[derive(Debug)]
pub(crate) struct ReplyFile {
    /// The file's own name (the path's last part).
    pub name: String,
    pub bytes: Vec<u8>,
    /// Its type from its extension: the platforms want one, and the host
    /// never sniffs content an agent wrote.
    pub mime: &'static str,
}

impl ReplyFile {
    /// A JPEG, PNG or WebP picture, which the platforms show inline.
    pub(crate) fn is_picture(&self) -> bool {
        self.mime.starts_with("image/")
    }
}

/// Reads `rel` (an `outbox/…` path the host recorded) from `space`'s
/// workspace through the safe-path function, at most `max` bytes: a file
/// gone meanwhile is `Ok(None)` (the reply itself still goes out, and a
/// warning says so); a larger one is refused with a sentence that names
/// the platform's `limit`.
pub(crate) async fn reply_file(
    app: &App,
    space: &str,
    rel: &str,
    max: usize,
    limit: &str,
) -> Result<Option<ReplyFile>, String> {
    let Ok(id) = crate::ids::SpaceId::parse(space) else {
        return Err(format!("{space:?} is not a space id"));
    };
    let live = app.rt.paths.workspace(&id);
    let at = rel.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        crate::workspace::safe::WorkspaceRoot::open(&live)
            .and_then(|root| root.read_capped(&at, max))
    })
    .await
    .map_err(|e| format!("reading {rel}: {e}"))?;
    let bytes = match read {
        Ok(Some((bytes, false))) => bytes,
        Ok(Some((_, true))) => return Err(format!("{rel} is larger than {limit}")),
        Ok(None) | Err(_) => {
            tracing::warn!(file = %rel, "a file of the reply is gone from the workspace; not sent");
            return Ok(None);
        }
    };
    let name = rel.rsplit('/').next().unwrap_or(rel).to_owned();
    let mime = mime_of(&name);
    Ok(Some(ReplyFile { name, bytes, mime }))
}

/// A file's type from its extension, for the few kinds a chat shows as
/// more than a download.
fn mime_of(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        Some("pdf") => "application/pdf",
        Some("txt" | "md" | "log") => "text/plain",
        Some("csv") => "text/csv",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

/// How sending one outbox item went.
#[derive(Debug)]
pub(crate) enum Sent {
    Delivered,
    /// The platform refused it (a bad chat, a blocked bot): an attempt.
    Refused(String),
    /// The platform could not be reached through `call`: an attempt, and
    /// the loop backs off.
    Unreachable {
        call: &'static str,
        error: String,
    },
    /// The platform will never take it (WhatsApp outside its 24-hour
    /// window): left undelivered for good with this sentence, which the
    /// operator is shown on the board and in the log.
    GivenUp(String),
    /// The adapter is stopping: nothing recorded.
    Stopping,
}

/// Delivers `platform`'s outbox items, oldest first, through `send` (given
/// each item and the platform messages it refers to: the one it answers,
/// and the preview it replaces when the reply was streamed), and records
/// what became of each: delivered, or a failed attempt (an item is given up
/// after [`MAX_ATTEMPTS`]).
pub(crate) async fn deliver_outbox<F, Fut>(
    app: &App,
    platform: &'static str,
    cancel: &CancellationToken,
    mut send: F,
) -> Result<(), StoreError>
where
    F: FnMut(OutboxItem, outbox::DeliveryRefs) -> Fut,
    Fut: Future<Output = Sent>,
{
    let store = &app.rt.store;
    let mut backoff = Backoff::default();
    loop {
        let items = store
            .read(move |c| outbox::undelivered_for(c, platform, MAX_ATTEMPTS, 20))
            .await?;
        let mut wait = Duration::from_millis(if items.is_empty() { 200 } else { 0 });
        for item in items {
            let id = item.id;
            let refs = {
                let item = item.clone();
                store.read(move |c| outbox::delivery_refs(c, &item)).await?
            };
            match send(item, refs).await {
                Sent::Delivered => {
                    store
                        .write(move |tx| outbox::mark_delivered(tx, id))
                        .await?;
                    app.adapters.connected(platform);
                    backoff = Backoff::default();
                }
                Sent::Refused(e) => {
                    tracing::warn!(platform, outbox = id, error = %e, "the platform refused a reply");
                    store
                        .write(move |tx| outbox::mark_failed(tx, id, &e))
                        .await?;
                }
                Sent::Unreachable { call, error } => {
                    app.adapters.failed(platform, &format!("{call}: {error}"));
                    store
                        .write(move |tx| outbox::mark_failed(tx, id, &error))
                        .await?;
                    wait = backoff.next();
                    break;
                }
                Sent::GivenUp(why) => {
                    tracing::warn!(platform, outbox = id, reason = %why, "a reply was not delivered");
                    app.adapters.note(platform, &why);
                    store
                        .write(move |tx| {
                            crate::storage::chat_windows::give_up(tx, id, &why, MAX_ATTEMPTS)
                        })
                        .await?;
                }
                Sent::Stopping => return Ok(()),
            }
        }
        if !pause(cancel, wait).await {
            return Ok(());
        }
    }
}

/// Splits a reply into pieces of at most `max` UTF-16 code units (how
/// Telegram counts; never more than Discord's characters): at paragraph
/// breaks where it can, else at line breaks, else between words, else
/// anywhere between characters. Nothing is lost: the pieces, joined with the
/// breaks they were cut at, are the text (trailing whitespace of a piece
/// aside).
pub(crate) fn split_reply(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let len = |s: &str| s.encode_utf16().count();
    let mut out = Vec::new();
    let mut rest = text.trim_end();
    while len(rest) > max {
        // The longest prefix that fits, in bytes.
        let mut fit = 0;
        let mut units = 0;
        for (i, c) in rest.char_indices() {
            units += c.len_utf16();
            if units > max {
                break;
            }
            fit = i + c.len_utf8();
        }
        let head = &rest[..fit];
        let cut = [
            head.rfind("\n\n").map(|i| (i, 2)),
            head.rfind('\n').map(|i| (i, 1)),
            head.rfind(' ').map(|i| (i, 1)),
        ]
        .into_iter()
        .flatten()
        .find(|(i, _)| *i > 0);
        let (piece, next) = match cut {
            Some((i, sep)) => (&rest[..i], &rest[i + sep..]),
            None => (head, &rest[fit..]),
        };
        out.push(piece.trim_end().to_owned());
        rest = next.trim_start_matches(['\n', ' ']);
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(rest.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_replies_are_one_piece() {
        assert_eq!(split_reply("hello", 4096), vec!["hello"]);
        assert_eq!(split_reply("", 10), vec![""]);
    }

    #[test]
    fn long_replies_split_on_paragraphs_first() {
        let p1 = "a".repeat(3000);
        let p2 = "b".repeat(3000);
        let p3 = "c".repeat(100);
        let text = format!("{p1}\n\n{p2}\n\n{p3}");
        let parts = split_reply(&text, 4096);
        assert_eq!(parts, vec![p1.clone(), format!("{p2}\n\n{p3}")]);
        for p in &parts {
            assert!(p.encode_utf16().count() <= 4096);
        }
    }

    #[test]
    fn words_and_then_characters_when_no_paragraph_fits() {
        let words = "word ".repeat(1000);
        for p in split_reply(&words, 2000) {
            assert!(p.chars().count() <= 2000);
            assert!(!p.starts_with(' ') && p.ends_with("word"), "{p:?}");
        }
        let solid = "x".repeat(5000);
        let parts = split_reply(&solid, 2000);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), solid);
        // Astral characters count two units each and are never cut in half.
        let emoji = "😀".repeat(3000);
        let parts = split_reply(&emoji, 4096);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= 4096));
        assert_eq!(parts.concat(), emoji);
    }
}
