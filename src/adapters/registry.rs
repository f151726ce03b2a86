//! The one list of chat platforms this binary speaks, and the seam each
//! one plugs into: [`ChatAdapter`] (what it is: [`Platform`], and how it
//! runs: [`ChatAdapter::run`] with the shared [`AdapterKit`] and a cancel
//! token).
//!
//! Everything that concerns "every platform" iterates this list: the
//! secrets read before start-up ([`super::AdapterSecrets`]), start-up
//! ([`super::start`]), the host's `outbound_adapters`, the status board and
//! metrics (keyed by [`Platform::name`]), and, through the [`Registered`]
//! entry each line also submits, the layers below this one: the sender
//! policy's `dm_policy` per platform (`Settings::dm_policy`), each section's
//! defaults and checks (`crate::config`), and the redactor's and review
//! gate's identifier shapes (`crate::redaction`). Adding a platform is its
//! own folder, one line in [`registry!`]'s invocation below, and its docs.
//!
//! Must never: list a platform anywhere else, or let a line add an adapter
//! without its [`Registered`] entry (the macro writes both from one line).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub(crate) use crate::config::platforms::{Platform, Registered};

use crate::app::App;

/// An adapter's loop: runs until the token is cancelled (`Ok`), or fails
/// with a sentence (no secret in it) and its actor with it.
pub(crate) type AdapterRun = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What a running adapter is handed: the host's shared state (the store,
/// settings and board through [`App`]) and its own secrets, in the order of
/// [`Platform::secret_vars`].
#[derive(Clone)]
pub(crate) struct AdapterKit {
    pub app: Arc<App>,
    secrets: Arc<Vec<String>>,
    /// The per-chat edit pacing this host keeps for the platform, shared by
    /// its [`TurnTools`]' editor (a streamed preview's edits) and its
    /// delivery (the final edit), so both count against one limit.
    pub pace: Arc<super::EditPace>,
}

// Holds secrets: a derived Debug would print them.
impl std::fmt::Debug for AdapterKit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterKit")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl AdapterKit {
    pub(crate) fn new(app: Arc<App>, secrets: Vec<String>) -> Self {
        Self {
            app,
            secrets: Arc::new(secrets),
            pace: Arc::default(),
        }
    }

    /// The secret read from `secret_vars()[i]` (empty if there is none: the
    /// host refuses to start an adapter whose secrets are not all set).
    pub(crate) fn secret(&self, i: usize) -> String {
        self.secrets.get(i).cloned().unwrap_or_default()
    }
}

/// A chat platform's adapter: a supervised actor's loop that takes the
/// platform's messages into ingress and delivers its outbox items.
pub(crate) trait ChatAdapter: Platform {
    /// The loop: from connecting to the platform until `cancel` (`Ok`) or a
    /// failure (the supervisor restarts it).
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun;

    /// The part that takes the platform's calls to this host's own API
    /// (webhooks), run on every host of a deployment whatever holds the
    /// adapter's lease, beside [`Self::run`] (which then delivers, and
    /// holds any upstream connection): a platform may post to any host.
    /// `None`: the adapter takes its messages inside `run`.
    fn intake(&self, _kit: &AdapterKit, _cancel: CancellationToken) -> Option<AdapterRun> {
        None
    }

    /// What a turn on this host needs of the platform, built on every host
    /// whether or not it holds the adapter's one upstream connection (with
    /// several hosts, a space's turn runs where its lease is): the editor
    /// that shows a streamed reply, the source that fetches attachments.
    /// Plain HTTP clients with the adapter's secrets, no connection held.
    fn turn_tools(
        &self,
        _kit: &AdapterKit,
        _cancel: CancellationToken,
    ) -> Result<TurnTools, String> {
        Ok(TurnTools::default())
    }
}

/// A platform's tools for turns ([`ChatAdapter::turn_tools`]).
#[derive(Default)]
pub(crate) struct TurnTools {
    pub editor: Option<Arc<dyn crate::runtime::ReplyEditor>>,
    pub source: Option<Arc<dyn crate::runtime::AttachmentSource>>,
}

impl TurnTools {
    /// Offers them to this host's turns until the returned seats drop.
    pub(crate) fn seat(self, app: &App, platform: &str) -> Vec<crate::runtime::Seat> {
        let mut seats = Vec::new();
        if let Some(e) = self.editor {
            seats.push(app.rt.editors.seat(platform, e));
        }
        if let Some(s) = self.source {
            seats.push(app.rt.sources.seat(platform, s));
        }
        seats
    }
}

/// Writes the list and, for each line, the [`Registered`] entry the layers
/// below iterate, so the two cannot drift apart.
macro_rules! registry {
    ($($(#[$attr:meta])* $adapter:path),* $(,)?) => {
        /// Every adapter, in the order they start and are listed.
        // One push per line, so a line may carry a `#[cfg]`.
        #[allow(clippy::vec_init_then_push)]
        pub(crate) fn all() -> Vec<&'static dyn ChatAdapter> {
            let mut out: Vec<&'static dyn ChatAdapter> = Vec::new();
            $(
                $(#[$attr])*
                out.push(&$adapter);
            )*
            out
        }
        $(
            $(#[$attr])*
            inventory::submit! { Registered(&$adapter) }
        )*
    };
}

registry![
    super::telegram::Telegram,
    super::discord::Discord,
    super::whatsapp::WhatsApp,
    super::slack::Slack,
    // The seam's own test: a platform that exists only through this line.
    #[cfg(feature = "test-hooks")]
    super::echo::Echo,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_adapter_reaches_the_layers_below_and_names_are_unique() {
        let listed: Vec<&str> = all().iter().map(|a| a.name()).collect();
        let mut below: Vec<&str> = crate::config::platforms::all()
            .iter()
            .map(|p| p.name())
            .collect();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), listed.len(), "a name twice: {listed:?}");
        below.sort_unstable();
        assert_eq!(sorted, below);
        for a in all() {
            assert!(
                crate::ids::validate_platform(a.name()).is_ok(),
                "{} is not a platform name",
                a.name()
            );
            for p in a.identifier_patterns() {
                assert!(regex::Regex::new(p).is_ok(), "{}: {p}", a.name());
            }
        }
    }
}
