//! `mercury bench adapters`: messages per second taken in through the
//! Telegram adapter (a temp host long-polling a local fake Bot API that
//! speaks `getMe`/`deleteWebhook`/`getUpdates`), beside the ingress path
//! alone (`ingress::ingest_tx` through the store's writer, one message per
//! transaction and one at a time, as the adapter stores them), as a ratio.
//!
//! The messages are group messages that do not address the bot, so each is
//! stored as ambient context and no turn runs: the figure is intake only
//! (poll, JSON, conversion, the row and its offset in one transaction).
//!
//! Must never: reach the real Bot API (the fake is on loopback), or pass or
//! fail on a number.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::{Path as UrlPath, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::app::CallerLimits;
use crate::config::Settings;
use crate::host::temp_host::TempHost;
use crate::ingress::{self, IngressMessage};
use crate::storage::Store;

const TOKEN: &str = "1:bench";

#[derive(Debug, Clone)]
pub(crate) struct AdaptersOptions {
    pub messages: usize,
    /// Group chats the messages are spread over (each gets a space).
    pub chats: usize,
}

impl Default for AdaptersOptions {
    fn default() -> Self {
        Self {
            messages: 2000,
            chats: 20,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct AdaptersFigures {
    pub messages: usize,
    pub chats: usize,
    pub telegram: Duration,
    pub ingress: Duration,
}

impl AdaptersFigures {
    pub(crate) fn per_second(d: Duration, n: usize) -> f64 {
        n as f64 / d.as_secs_f64().max(1e-9)
    }

    /// Telegram-path time over ingress-alone time (1.0: the adapter adds nothing).
    pub(crate) fn ratio(&self) -> f64 {
        self.telegram.as_secs_f64() / self.ingress.as_secs_f64().max(1e-9)
    }
}

/// The fake's queue: updates until a `getUpdates` offset confirms them.
#[derive(Default)]
struct Queue {
    pending: Mutex<Vec<Value>>,
    arrived: Notify,
}

async fn bot_api(
    State(q): State<Arc<Queue>>,
    UrlPath((_bot, method)): UrlPath<(String, String)>,
    body: axum::body::Bytes,
) -> Json<Value> {
    let params: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let ok = |result: Value| Json(json!({"ok": true, "result": result}));
    match method.as_str() {
        "getMe" => {
            ok(json!({"id": 1, "is_bot": true, "first_name": "Bench", "username": "bench_bot"}))
        }
        "getUpdates" => {
            let offset = params["offset"].as_i64().unwrap_or(0);
            let limit = params["limit"].as_u64().unwrap_or(100) as usize;
            let deadline = Instant::now() + Duration::from_secs(1);
            loop {
                let notified = q.arrived.notified();
                let ready: Vec<Value> = match q.pending.lock() {
                    Ok(mut p) => {
                        p.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
                        p.iter().take(limit).cloned().collect()
                    }
                    Err(_) => Vec::new(),
                };
                if !ready.is_empty() || Instant::now() >= deadline {
                    return ok(Value::Array(ready));
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            }
        }
        _ => ok(json!(true)),
    }
}

fn update(i: usize, chats: usize) -> Value {
    let chat = -1_000_000 - (i % chats) as i64;
    json!({"update_id": i + 1, "message": {
        "message_id": i + 1, "date": 1_700_000_000,
        "chat": {"id": chat, "type": "group", "title": "bench"},
        "from": {"id": 10_000 + (i % 50), "is_bot": false, "first_name": "B"},
        "text": format!("just talking, message {i}")}})
}

/// When the database first holds `n` Telegram messages: one read-only
/// connection on a blocking thread, polled every 2 ms (a connection per poll
/// would cost the host's writer more than the adapter does).
async fn stored_at(db: &Path, n: usize, deadline: Instant) -> anyhow::Result<Instant> {
    let db = db.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Instant> {
        let c = crate::storage::open_read_only_conn(&db)?;
        loop {
            let count = crate::storage::stats::messages_from_platform(&c, "telegram")?;
            if usize::try_from(count).unwrap_or(0) >= n {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                anyhow::bail!("the adapter did not store every message within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .await?
}

async fn telegram_path(opts: &AdaptersOptions) -> anyhow::Result<Duration> {
    let queue = Arc::new(Queue::default());
    let app = Router::new()
        .route("/{bot}/{method}", post(bot_api))
        .with_state(queue.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let host = TempHost::builder()
        .sandbox("process")
        .set("adapters.telegram.enabled", true.into())
        .set("adapters.telegram.api_base_url", url.into())
        .set("adapters.telegram.poll_timeout_secs", 1.into())
        // The bench's groups are unknown to the fresh host: `open` lets them
        // in, as on the in-process path measured beside it.
        .set("adapters.telegram.dm_policy", "open".into())
        .env(crate::adapters::TELEGRAM_TOKEN_ENV, TOKEN)
        .start()
        .await
        .context("starting the temp host")?;
    let db = host.data.join("state.db");
    let start = Instant::now();
    if let Ok(mut p) = queue.pending.lock() {
        p.extend((0..opts.messages).map(|i| update(i, opts.chats)));
    }
    queue.arrived.notify_waiters();
    let done = stored_at(&db, opts.messages, start + Duration::from_secs(600)).await?;
    let elapsed = done.duration_since(start);
    host.stop().await.context("stopping the temp host")?;
    server.abort();
    Ok(elapsed)
}

async fn ingress_path(opts: &AdaptersOptions) -> anyhow::Result<Duration> {
    let dir = tempfile::Builder::new()
        .prefix("mercury-bench-")
        .tempdir()?;
    let store = Store::open(&dir.path().join("state.db"))?;
    // The bench's groups are unknown to a fresh database: `open` lets them in,
    // so the path measured is the one an allowed group takes.
    let mut settings = Settings::default();
    settings.ingress.dm_policy = crate::config::DmPolicy::Open;
    let settings = Arc::new(settings);
    let limits = Arc::new(CallerLimits::new(settings.ingress.per_caller_per_minute));
    let start = Instant::now();
    for i in 0..opts.messages {
        let m = IngressMessage {
            platform: "telegram".into(),
            conversation: (-1_000_000 - (i % opts.chats) as i64).to_string(),
            sender_id: (10_000 + (i % 50)).to_string(),
            sender_name: Some("B".into()),
            text: format!("just talking, message {i}"),
            message_id: (i + 1).to_string(),
            is_group: true,
            mentions_bot: false,
            reply_to_bot: false,
            title: Some("bench".into()),
        };
        let (s, l) = (settings.clone(), limits.clone());
        store
            .write(move |tx| {
                ingress::ingest_tx(
                    tx,
                    &s,
                    &crate::runtime::Outbound::Live,
                    &l,
                    &m,
                    ingress::Origin::Adapter,
                )
            })
            .await?;
    }
    Ok(start.elapsed())
}

pub(crate) async fn run(opts: &AdaptersOptions) -> anyhow::Result<AdaptersFigures> {
    let opts = AdaptersOptions {
        messages: opts.messages.max(1),
        chats: opts.chats.max(1),
    };
    let ingress = ingress_path(&opts).await?;
    let telegram = telegram_path(&opts).await?;
    Ok(AdaptersFigures {
        messages: opts.messages,
        chats: opts.chats,
        telegram,
        ingress,
    })
}

pub(crate) fn print(f: &AdaptersFigures) {
    let build = if cfg!(debug_assertions) {
        "debug build (unoptimised: build with --release for real figures)"
    } else {
        "release build"
    };
    println!(
        "mercury bench adapters: {build}, {} messages over {} group chats",
        f.messages, f.chats
    );
    println!(
        "telegram  {:>10.0} msg/s   ({} via getUpdates against the fake)",
        AdaptersFigures::per_second(f.telegram, f.messages),
        super::ms(f.telegram)
    );
    println!(
        "ingress   {:>10.0} msg/s   ({} ingest_tx alone, one at a time)",
        AdaptersFigures::per_second(f.ingress, f.messages),
        super::ms(f.ingress)
    );
    println!(
        "ratio     {:>10.2}x   (telegram time / ingress time)",
        f.ratio()
    );
}
