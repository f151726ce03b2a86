//! "echo": a platform that exists only for the adapter seam's test (built
//! with `test-hooks` only). It is added through one registry line and this
//! folder, nothing else: its config section, secret, `dm_policy`, board
//! entry, metrics gauge and identifier shapes all reach the rest of the host
//! through [`ChatAdapter`], which is what the test proves.
//!
//! Its wire format (spoken by the test's fake on loopback): `GET
//! {base_url}/updates?after=N` answers `[{"id", "chat", "from", "text"}]`
//! with ids above `N`; `POST {base_url}/send` takes `{"chat", "text",
//! "reply_to"}`. Every call carries `Authorization: Bearer <MERCURY_ECHO_TOKEN>`.
//!
//! Must never: be compiled into a release (`test-hooks` only), or send the
//! token anywhere but its own base URL.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use serde_yaml_ng::Value;
use tokio_util::sync::CancellationToken;

use super::registry::{AdapterRun, Platform};
use super::{AdapterIdentity, AdapterKit, Backoff, ChatAdapter, Sent};
use crate::config::{DmPolicy, Settings};
use crate::ingress::IngressMessage;
use crate::storage::adapters;

const NAME: &str = "echo";

/// The echo platform on the registry.
pub(crate) struct Echo;

/// `adapters.echo`, read from the section this platform declares.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct EchoConfig {
    enabled: bool,
    base_url: String,
    dm_policy: Option<DmPolicy>,
}

fn config(settings: &Settings) -> EchoConfig {
    settings
        .adapters
        .section(NAME)
        .and_then(|v| serde_yaml_ng::from_value(v.clone()).ok())
        .unwrap_or_default()
}

impl Platform for Echo {
    fn name(&self) -> &'static str {
        NAME
    }

    fn secret_vars(&self) -> &'static [&'static str] {
        &["MERCURY_ECHO_TOKEN"]
    }

    fn enabled(&self, settings: &Settings) -> bool {
        config(settings).enabled
    }

    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy> {
        config(settings).dm_policy
    }

    fn identifier_patterns(&self) -> &'static [&'static str] {
        &[r"(?i)\becho ?: ?[0-9]{3,12}\b"]
    }

    fn section_defaults(&self) -> Option<Value> {
        serde_yaml_ng::from_str("enabled: false\nbase_url: \"\"\ndm_policy: null").ok()
    }

    fn check(&self, settings: &Settings) -> Result<(), (String, String)> {
        let section = settings.adapters.section(NAME).cloned();
        let c: EchoConfig = serde_yaml_ng::from_value(section.unwrap_or(Value::Null))
            .map_err(|e| ("adapters.echo".to_owned(), e.to_string()))?;
        if c.enabled && !c.base_url.starts_with("http://") {
            return Err((
                "adapters.echo.base_url".into(),
                "must start with http://".into(),
            ));
        }
        Ok(())
    }
}

impl ChatAdapter for Echo {
    fn run(&self, kit: AdapterKit, cancel: CancellationToken) -> AdapterRun {
        Box::pin(async move { run(kit, cancel).await })
    }
}

#[derive(Debug, Deserialize)]
struct Update {
    id: i64,
    chat: String,
    from: String,
    text: String,
}

async fn run(kit: AdapterKit, cancel: CancellationToken) -> Result<(), String> {
    let base = config(&kit.app.rt.settings)
        .base_url
        .trim_end_matches('/')
        .to_owned();
    let token = kit.secret(0);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.without_url().to_string())?;
    kit.app.adapters.set_mode(NAME, "polling");
    let intake = poll(&kit, &http, &base, &token, &cancel);
    let send = |item: crate::storage::outbox::OutboxItem,
                refs: crate::storage::outbox::DeliveryRefs| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let body =
                json!({"chat": item.external_id, "text": item.text, "reply_to": refs.answered});
            match http
                .post(format!("{base}/send"))
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => Sent::Delivered,
                Ok(r) => Sent::Refused(format!("send answered {}", r.status())),
                Err(e) => Sent::Unreachable {
                    call: "send",
                    error: e.without_url().to_string(),
                },
            }
        }
    };
    let deliver = super::deliver_outbox(&kit.app, NAME, &cancel, send);
    tokio::select! {
        r = intake => r,
        r = deliver => r.map_err(|e| e.to_string()),
    }
}

async fn poll(
    kit: &AdapterKit,
    http: &reqwest::Client,
    base: &str,
    token: &str,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let app = &kit.app;
    let identity = AdapterIdentity::bound_to(NAME);
    let mut backoff = Backoff::default();
    loop {
        let after = app
            .rt
            .store
            .read(|c| adapters::position(c, NAME))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|p| p.parse::<i64>().ok())
            .unwrap_or(0);
        let got = http
            .get(format!("{base}/updates?after={after}"))
            .bearer_auth(token)
            .send()
            .await;
        let updates: Vec<Update> = match got {
            Ok(r) if r.status().is_success() => r.json().await.unwrap_or_default(),
            Ok(r) => {
                app.adapters
                    .failed(NAME, &format!("updates answered {}", r.status()));
                Vec::new()
            }
            Err(e) => {
                app.adapters
                    .failed(NAME, &format!("updates: {}", e.without_url()));
                if !super::pause(cancel, backoff.next()).await {
                    return Ok(());
                }
                continue;
            }
        };
        app.adapters.connected(NAME);
        for u in updates.into_iter().filter(|u| u.id > after) {
            let next = u.id;
            let m = IngressMessage {
                platform: NAME.into(),
                conversation: u.chat,
                sender_id: u.from,
                sender_name: None,
                text: u.text,
                message_id: u.id.to_string(),
                is_group: false,
                mentions_bot: false,
                reply_to_bot: false,
                title: None,
            };
            let advance =
                move |tx: &crate::storage::Tx<'_>| adapters::advance_offset(tx, NAME, next);
            super::store_message(app, identity, m, "echo update", advance)
                .await
                .map_err(|e| e.to_string())?;
            app.adapters.updated(NAME);
        }
        if !super::pause(cancel, Duration::from_millis(100)).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::redaction::{RedactionList, Redactor};

    #[test]
    fn the_redactor_and_the_gate_know_echo_ids_through_the_registry() {
        let mut r = Redactor::new(RedactionList::new()).unwrap();
        let out = r.redact_identifiers("write to echo:48151623 later");
        assert!(!out.contains("48151623"), "{out}");
        let gate = crate::redaction::IdentifierGate::new(&RedactionList::new()).unwrap();
        assert!(gate.check("write to echo:48151623 later").is_err());
        assert_eq!(
            crate::config::Settings::default().dm_policy("echo"),
            crate::config::DmPolicy::Pairing
        );
    }
}
