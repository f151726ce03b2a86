//! The webhook adapter: POSTs each undelivered outbox item to `webhook.url`,
//! retrying failed items with jittered pauses up to `webhook.max_attempts`.
//!
//! Replies of a platform an in-process adapter serves (`adapters.telegram`)
//! are left to that adapter.
//!
//! Must never: mark an item delivered without a 2xx answer, retry forever,
//! or post anything from a shadow host (it refuses to run there).

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::runtime::Runtime;
use crate::storage::outbox;

/// Runs until `shutdown` is cancelled.
pub async fn run(rt: Arc<Runtime>, shutdown: CancellationToken) {
    // The host never constructs this adapter in shadow mode; should a caller
    // still start it, it refuses before a client exists.
    if rt.outbound.is_shadow() {
        rt.outbound.record_refusal(
            None,
            "webhook",
            "would have started the webhook adapter posting outbox items",
        );
        return;
    }
    let url = rt.settings.webhook.url.clone();
    let max = rt.settings.webhook.max_attempts;
    // The in-process Telegram adapter delivers Telegram's replies itself.
    let skip = rt.settings.adapters.telegram.enabled.then_some("telegram");
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "webhook adapter cannot start");
            return;
        }
    };
    loop {
        let items = rt
            .store
            .read(move |c| outbox::undelivered_except(c, skip, max, 100))
            .await
            .unwrap_or_default();
        for item in items {
            let body = json!({
                "id": item.id,
                "space_id": item.space_id,
                "platform": item.platform,
                "conversation": item.external_id,
                "text": item.text,
                "message_id": item.message_id,
            });
            let res = client.post(&url).json(&body).send().await;
            let id = item.id;
            let outcome = match res {
                Ok(r) if r.status().is_success() => None,
                Ok(r) => Some(format!("webhook answered {}", r.status())),
                Err(e) => Some(format!("webhook unreachable: {e}")),
            };
            let write = match outcome {
                None => {
                    rt.store
                        .write(move |tx| outbox::mark_delivered(tx, id))
                        .await
                }
                Some(err) => {
                    tracing::warn!(outbox = id, error = %err, "webhook delivery failed");
                    rt.store
                        .write(move |tx| outbox::mark_failed(tx, id, &err))
                        .await
                }
            };
            if let Err(e) = write {
                tracing::error!(error = %e, "cannot record a webhook delivery");
            }
        }
        // Jitter keeps several hosts (or retries) from hammering the receiver in step.
        let pause = Duration::from_millis(500 + rand::rng().random_range(0..500));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
