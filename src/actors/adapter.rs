//! What the rest of the host knows of the chat adapters (`crate::adapters`),
//! which sit above it: each adapter's health on the [`AdapterBoard`]
//! (`/healthz`), the inbox a webhook-mode adapter takes its platform's calls
//! on, and [`SupervisedChild`], how the root supervisor (re)starts an actor
//! defined in a layer above its own.
//!
//! Must never: hold an adapter's secret beyond the webhook check it exists
//! for, or show one in a status.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ractor::{ActorCell, ActorProcessingErr};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::clock::now_ms;

/// One adapter's state as `/healthz` shows it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AdapterStatus {
    /// `polling`, `webhook` or `gateway`.
    pub mode: String,
    /// The last call to the platform succeeded.
    pub connected: bool,
    /// When the last platform update was stored (ms since the epoch).
    pub last_update_at: Option<i64>,
    /// The last failure talking to the platform (no secret in it).
    pub last_error: Option<String>,
    pub last_error_at: Option<i64>,
}

/// One platform call received on the webhook route, handed to the adapter;
/// `done` is answered once the update is stored (or could not be).
pub struct WebhookCall {
    pub body: serde_json::Value,
    pub done: oneshot::Sender<Result<(), WebhookCallError>>,
}

/// Why a webhook call's update was not stored (the route answers 503, so
/// the platform sends it again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookCallError {
    #[error("the update was not stored")]
    NotStored,
}

/// A webhook-mode adapter's registration: the secret the platform sends on
/// every call and where calls go.
#[derive(Clone)]
pub struct WebhookInbox {
    pub secret: String,
    /// A second secret some platforms check on another call (WhatsApp's
    /// `hub.verify_token` of the subscription handshake).
    pub verify_token: Option<String>,
    pub calls: mpsc::Sender<WebhookCall>,
}

/// Health and webhook inboxes of every running adapter, by adapter name.
#[derive(Clone, Default)]
pub struct AdapterBoard {
    status: Arc<Mutex<BTreeMap<String, AdapterStatus>>>,
    webhooks: Arc<Mutex<BTreeMap<String, WebhookInbox>>>,
    /// Told whenever an inbox is registered ([`AdapterBoard::webhook_registered`]).
    registered: Arc<tokio::sync::Notify>,
}

impl AdapterBoard {
    pub fn statuses(&self) -> BTreeMap<String, AdapterStatus> {
        self.status.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn update(&self, adapter: &str, f: impl FnOnce(&mut AdapterStatus)) {
        if let Ok(mut m) = self.status.lock() {
            f(m.entry(adapter.to_owned()).or_default());
        }
    }

    pub fn set_mode(&self, adapter: &str, mode: &str) {
        self.update(adapter, |s| s.mode = mode.to_owned());
    }

    pub fn connected(&self, adapter: &str) {
        self.update(adapter, |s| s.connected = true);
    }

    pub fn updated(&self, adapter: &str) {
        self.update(adapter, |s| {
            s.connected = true;
            s.last_update_at = Some(now_ms());
        });
    }

    /// Records a failed platform call; the sentence is scrubbed of every
    /// secret here, once, for `/healthz`, `/api/status` and `mercury status`.
    pub fn failed(&self, adapter: &str, error: &str) {
        let error = crate::redaction::secrets::scrub_error(error);
        self.update(adapter, |s| {
            s.connected = false;
            s.last_error = Some(error);
            s.last_error_at = Some(now_ms());
        });
    }

    /// Something the operator must know that is not a failed call (a reply
    /// the platform will not take): shown as the last error, scrubbed like
    /// one, without marking the adapter disconnected.
    pub fn note(&self, adapter: &str, what: &str) {
        let what = crate::redaction::secrets::scrub_error(what);
        self.update(adapter, |s| {
            s.last_error = Some(what);
            s.last_error_at = Some(now_ms());
        });
    }

    pub fn register_webhook(&self, adapter: &str, inbox: WebhookInbox) {
        if let Ok(mut m) = self.webhooks.lock() {
            m.insert(adapter.to_owned(), inbox);
        }
        self.registered.notify_waiters();
    }

    /// Returns once this host takes `adapter`'s webhook calls (its inbox is
    /// registered): a platform told the URL sends at once, and a call
    /// before the inbox would be refused.
    pub async fn webhook_registered(&self, adapter: &str) {
        loop {
            // Listening before looking, so a registration in between is heard.
            let told = self.registered.notified();
            if self.webhook(adapter).is_some() {
                return;
            }
            told.await;
        }
    }

    pub fn remove_webhook(&self, adapter: &str) {
        if let Ok(mut m) = self.webhooks.lock() {
            m.remove(adapter);
        }
    }

    pub fn webhook(&self, adapter: &str) -> Option<WebhookInbox> {
        self.webhooks
            .lock()
            .ok()
            .and_then(|m| m.get(adapter).cloned())
    }
}

/// An actor the root supervisor starts and restarts but cannot name (it is
/// defined above the actors layer): `spawn` starts it linked to `supervisor`.
#[async_trait::async_trait]
pub trait SupervisedChild: Send + Sync + 'static {
    /// The restart-budget key and the name in logs (`telegram adapter`).
    fn name(&self) -> String;
    async fn spawn(&self, supervisor: ActorCell) -> Result<ActorCell, ActorProcessingErr>;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wait_for_a_webhook_ends_when_its_inbox_is_registered_and_not_before() {
        let board = AdapterBoard::default();
        let waiting = tokio::spawn({
            let board = board.clone();
            async move { board.webhook_registered("telegram").await }
        });
        let (calls, _rx) = mpsc::channel(1);
        let inbox = || WebhookInbox {
            secret: "s".into(),
            verify_token: None,
            calls: calls.clone(),
        };
        // Another adapter's inbox is not this one's.
        board.register_webhook("discord", inbox());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "ended before its inbox was there");
        board.register_webhook("telegram", inbox());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait hears the registration")
            .unwrap();
        // Once registered, a new wait ends at once.
        tokio::time::timeout(Duration::from_secs(1), board.webhook_registered("telegram"))
            .await
            .unwrap();
    }
}
