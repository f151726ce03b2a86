//! The host's shared services, handed to every actor and handler: settings,
//! storage, the model registry, the sandbox backend and the turn waiters.
//!
//! Must never: hold an actor reference (actors hold this, not the other way
//! round), or expose a model credential to anything that reaches a sandbox.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::clock::now_ms;
use crate::config::Settings;
use crate::model::gate::ModelGate;
use crate::model::scripted::ScriptedPolicy;
use crate::model::{resolve_model, ModelError, ProviderSettings, ResolvedModel};
use crate::sandbox::SandboxBackend;
use crate::storage::{outbox, Store, StoreError, StoreResult};
use crate::workspace::transcript::{Transcript, TranscriptEntry, TranscriptKind};
use crate::workspace::DataPaths;

pub struct Runtime {
    pub settings: Arc<Settings>,
    pub paths: DataPaths,
    pub store: Store,
    /// `mercury.instance` label value, derived from the canonical data dir.
    pub instance_id: String,
    pub models: ModelRegistry,
    /// Live turns before background work: every model call takes a permit here.
    pub model_gate: Arc<ModelGate>,
    pub sandbox: Arc<dyn SandboxBackend>,
    /// Parties waiting for a user message's turn to end (`POST /api/chat`).
    pub waiters: TurnWaiters,
    /// Runs that are executing now; the orphan sweep spares their containers.
    pub live_runs: Mutex<HashSet<String>>,
    /// Writes refused inside `ask` turns, by run id; drained when the ask ends.
    pub ask_refusals: Mutex<HashMap<String, Vec<AskRefusal>>>,
    /// The spaces each run has reached across a space link since its current
    /// tool step began (issue 23), by run id: the act-as step adds, the turn
    /// takes them into the step's trace row when the tool call ends.
    pub cross_reads: CrossReads,
    /// Prometheus metrics (`/metrics`).
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// Prices, caps and the reservation: every model call goes through
    /// [`crate::spend::Spend::call`].
    pub spend: Arc<crate::spend::Spend>,
    /// Where outbound sends go: the outbox (live) or the shadow transcript.
    pub outbound: Outbound,
    /// When a turn's commit last deleted expired run traces (ms; 0: never).
    pub steps_pruned_at: std::sync::atomic::AtomicI64,
    /// This host's leases when it is one of many (`cluster.enabled`).
    pub cluster: Option<Arc<crate::cluster::HostSeat>>,
    /// The connected adapters that can show a reply while it is written.
    pub editors: Arc<ReplyEditors>,
    /// The connected adapters that fetch what their messages carried.
    pub sources: Arc<AttachmentSources>,
}

impl Runtime {
    /// The fence of `space`'s runner writes: `None` on a single host, else
    /// this host's lease (a space it does not hold has a fence nobody holds,
    /// so the write is refused rather than made unfenced).
    pub fn fence(&self, space: &str) -> Option<crate::storage::leases::Fence> {
        let seat = self.cluster.as_ref()?;
        Some(seat.fence(space).unwrap_or(crate::storage::leases::Fence {
            space: space.to_owned(),
            host: seat.host_id.clone(),
            epoch: -1,
        }))
    }
}

/// Which other spaces a run read across links, step by step. Counted when the
/// act-as step grants the request, before any of the target's data is
/// answered, so a tool call's reads are all in before the tool returns.
#[derive(Debug, Default)]
pub struct CrossReads(Mutex<HashMap<String, std::collections::BTreeSet<String>>>);

impl CrossReads {
    /// `run` reached `space` across a link.
    pub fn note(&self, run: &str, space: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.entry(run.to_owned())
                .or_default()
                .insert(space.to_owned());
        }
    }

    /// The spaces `run` reached since the last take, sorted; forgets them.
    pub fn take(&self, run: &str) -> Vec<String> {
        self.0
            .lock()
            .ok()
            .and_then(|mut m| m.remove(run))
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }
}

/// A platform's way of showing a live reply while it is written
/// (`turn.stream`): an in-process adapter whose platform edits sent messages
/// registers one while it is connected. It paces its own edits of a chat to
/// the platform's limits, the final reply's edit included (the adapter
/// delivers that one through the same editor).
#[async_trait::async_trait]
pub trait ReplyEditor: Send + Sync {
    /// Sends `text` into `chat`, threaded under `answered`; the new
    /// message's platform id. The error is a sentence with no secret in it.
    async fn send(&self, chat: &str, answered: Option<&str>, text: &str) -> Result<String, String>;
    /// Replaces the text of `message` in `chat`.
    async fn edit(&self, chat: &str, message: &str, text: &str) -> Result<(), String>;
    /// The longest text one message holds, in UTF-16 code units (what the
    /// strictest platform counts).
    fn max_units(&self) -> usize;
}

/// How fetching an attachment failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// It holds more than the bytes allowed (read no further).
    #[error("it is larger than {0} bytes")]
    TooLarge(u64),
    /// The platform did not give it (a sentence with no secret in it).
    #[error("{0}")]
    Failed(String),
}

/// A platform's way of fetching what a message carried (`storage::attachments`):
/// an in-process adapter registers one while it is connected, so a turn
/// fetches through the platform's own client and credentials.
#[async_trait::async_trait]
pub trait AttachmentSource: Send + Sync {
    /// The bytes `reference` names, reading no more than `max_bytes`.
    async fn fetch(&self, reference: &str, max_bytes: u64) -> Result<Vec<u8>, FetchError>;
}

/// What the adapters connected on this host offer the turns, by platform
/// (a reply editor, an attachment source).
pub struct PlatformSeats<T: ?Sized>(Mutex<HashMap<String, Arc<T>>>);

impl<T: ?Sized> Default for PlatformSeats<T> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<T: ?Sized + Send + Sync + 'static> PlatformSeats<T> {
    /// Registers `it` for `platform` until the returned seat is dropped
    /// (the adapter's loop holds it: an adapter that stopped serves nothing).
    pub fn seat(self: &Arc<Self>, platform: &str, it: Arc<T>) -> Seat {
        if let Ok(mut m) = self.0.lock() {
            m.insert(platform.to_owned(), it);
        }
        let (seats, platform) = (self.clone(), platform.to_owned());
        Seat(Some(Box::new(move || {
            if let Ok(mut m) = seats.0.lock() {
                m.remove(&platform);
            }
        })))
    }

    pub fn get(&self, platform: &str) -> Option<Arc<T>> {
        self.0.lock().ok().and_then(|m| m.get(platform).cloned())
    }
}

/// The reply editors of the adapters connected on this host.
pub type ReplyEditors = PlatformSeats<dyn ReplyEditor>;
/// The attachment sources of the adapters connected on this host.
pub type AttachmentSources = PlatformSeats<dyn AttachmentSource>;

/// A registration; dropping it unregisters.
pub struct Seat(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(leave) = self.0.take() {
            leave();
        }
    }
}

/// One send addressed to a platform conversation.
#[derive(Debug, Clone, Copy)]
pub struct OutboundSend<'a> {
    pub space: &'a str,
    pub conversation_id: Option<i64>,
    pub platform: &'a str,
    pub external_id: &'a str,
    pub message_id: Option<i64>,
    pub text: &'a str,
    /// `reply`, `send`, `digest`, `slow_down`: which path sent it.
    pub source: &'a str,
}

/// The one place an outbound send is routed (issue 14). Every reply, operator
/// send and digest calls [`Outbound::enqueue`]; in shadow mode nothing reaches
/// the outbox (so no adapter or webhook could ever deliver it) and the send
/// is a transcript line instead.
#[derive(Debug, Clone)]
pub enum Outbound {
    Live,
    Shadow(Transcript),
}

impl Outbound {
    pub fn for_settings(settings: &Settings, paths: &DataPaths) -> Self {
        if settings.shadow {
            Outbound::Shadow(Transcript::of(&paths.root))
        } else {
            Outbound::Live
        }
    }

    pub fn is_shadow(&self) -> bool {
        matches!(self, Outbound::Shadow(_))
    }

    /// Queues `send` in the outbox (its id) or, in shadow mode, appends it to
    /// the transcript (None). Called inside the write's transaction: a
    /// transcript that cannot be written fails the write, so no send is lost.
    pub fn enqueue(
        &self,
        tx: &crate::storage::Conn,
        send: &OutboundSend<'_>,
    ) -> StoreResult<Option<i64>> {
        match self {
            Outbound::Live => Ok(Some(outbox::enqueue(
                tx,
                send.space,
                send.conversation_id,
                send.platform,
                send.external_id,
                send.message_id,
                send.text,
            )?)),
            Outbound::Shadow(t) => {
                t.append(&TranscriptEntry {
                    kind: TranscriptKind::Send,
                    time: now_ms(),
                    space: Some(send.space.to_owned()),
                    conversation: send.conversation_id,
                    platform: Some(send.platform.to_owned()),
                    external_id: Some(send.external_id.to_owned()),
                    text: send.text.to_owned(),
                    source: send.source.to_owned(),
                })
                .map_err(|source| StoreError::File {
                    path: t.path().display().to_string(),
                    source,
                })?;
                Ok(None)
            }
        }
    }

    /// Lists a refused outside-acting write in the transcript (shadow mode
    /// only; a live host has nothing to list). Logged when the line cannot be
    /// written: the refusal itself already happened.
    pub fn record_refusal(&self, space: Option<&str>, source: &str, what: &str) {
        if let Outbound::Shadow(t) = self {
            let entry = TranscriptEntry {
                kind: TranscriptKind::Refusal,
                time: now_ms(),
                space: space.map(str::to_owned),
                conversation: None,
                platform: None,
                external_id: None,
                text: what.to_owned(),
                source: source.to_owned(),
            };
            if let Err(e) = t.append(&entry) {
                tracing::error!(error = %e, source, "cannot list a shadow refusal in the transcript");
            }
        }
    }
}

/// One write an `ask` turn tried and was refused (D-016).
#[derive(Debug, Clone, serde::Serialize, PartialEq, utoipa::ToSchema)]
pub struct AskRefusal {
    pub method: String,
    pub route: String,
    /// "would have …", for the holder to read.
    pub summary: String,
}

impl Runtime {
    pub fn record_refusal(&self, run_id: &str, refusal: AskRefusal) {
        if let Ok(mut m) = self.ask_refusals.lock() {
            m.entry(run_id.to_owned()).or_default().push(refusal);
        }
    }

    pub fn take_refusals(&self, run_id: &str) -> Vec<AskRefusal> {
        self.ask_refusals
            .lock()
            .ok()
            .and_then(|mut m| m.remove(run_id))
            .unwrap_or_default()
    }

    pub fn live_run_ids(&self) -> HashSet<String> {
        self.live_runs.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Resolves model specs to providers once and keeps them (a scripted file is
/// read on first use; an HTTP provider keeps its connection pool).
///
/// A `scripted:PATH` spec resolves only when [`ScriptedPolicy`] allows its
/// path, so a chain stored in a space can never make the host read an
/// arbitrary host file.
pub struct ModelRegistry {
    settings: ProviderSettings,
    scripted: ScriptedPolicy,
    cache: Mutex<HashMap<String, Arc<ResolvedModel>>>,
}

impl ModelRegistry {
    pub fn new(settings: ProviderSettings, scripted: ScriptedPolicy) -> Self {
        Self {
            settings,
            scripted,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The rule `PUT /api/model` applies to a scripted spec, the same one
    /// [`Self::get`] applies at use.
    /// Where the HTTP providers live, with their keys (for a call that is
    /// no chat completion: a transcription).
    pub fn provider_settings(&self) -> &ProviderSettings {
        &self.settings
    }

    pub fn scripted_policy(&self) -> &ScriptedPolicy {
        &self.scripted
    }

    /// Whether this host holds an API key for `provider` (`openai`,
    /// `anthropic`); any other provider needs none.
    pub fn has_key_for(&self, provider: &str) -> bool {
        let held = |k: &Option<String>| k.as_deref().is_some_and(|k| !k.trim().is_empty());
        match provider {
            "openai" => held(&self.settings.openai_api_key),
            "anthropic" => held(&self.settings.anthropic_api_key),
            _ => true,
        }
    }

    /// Asks `provider`'s endpoint with this host's settings and key
    /// (`mercury doctor` through `GET /api/doctor`).
    pub async fn probe(&self, provider: &str) -> Option<crate::model::EndpointProbe> {
        crate::model::probe_endpoint(&self.settings, provider).await
    }

    pub fn get(&self, spec: &str) -> Result<Arc<ResolvedModel>, ModelError> {
        if let Some(m) = self.cache.lock().ok().and_then(|c| c.get(spec).cloned()) {
            return Ok(m);
        }
        if let Some(path) = spec.strip_prefix("scripted:") {
            self.scripted
                .check(path)
                .map_err(|message| ModelError::Script {
                    path: path.to_owned(),
                    message,
                })?;
        }
        let resolved = Arc::new(resolve_model(spec, &self.settings)?);
        if let Ok(mut c) = self.cache.lock() {
            c.insert(spec.to_owned(), resolved.clone());
        }
        Ok(resolved)
    }
}

/// One-shot notifications for "the turn of message N has ended".
#[derive(Default)]
pub struct TurnWaiters {
    waiting: Mutex<HashMap<i64, Vec<oneshot::Sender<()>>>>,
}

impl TurnWaiters {
    /// Register before checking the message's status, so a turn that ends in
    /// between is not missed.
    pub fn register(&self, message_id: i64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.waiting.lock() {
            w.entry(message_id).or_default().push(tx);
        }
        rx
    }

    pub fn notify(&self, message_id: i64) {
        let senders = self
            .waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&message_id));
        for tx in senders.into_iter().flatten() {
            let _ = tx.send(());
        }
    }

    /// The messages someone waits for (one of many hosts looks them up:
    /// another host may run their turn).
    pub fn waited(&self) -> Vec<i64> {
        self.waiting
            .lock()
            .map(|w| w.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Wakes every waiter (host shutdown).
    pub fn notify_all(&self) {
        let all: Vec<_> = self
            .waiting
            .lock()
            .map(|mut w| w.drain().flat_map(|(_, v)| v).collect())
            .unwrap_or_default();
        for tx in all {
            let _ = tx.send(());
        }
    }
}
