//! The Telegram adapter end to end: a real host (child process, real SQLite
//! file) polling a fake Bot API on a loopback port that speaks the Bot API's
//! JSON (`getMe`, `getUpdates` with offset confirmation, `sendMessage`,
//! `editMessageText` with its "not modified" and "not found" refusals,
//! `sendChatAction`, `setWebhook`, `deleteWebhook`, 429 with
//! `parameters.retry_after`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tokio::sync::Notify;

use crate::common::{HostOptions, TestHost};

pub(crate) const TOKEN: &str = "123456:TEST-token_abc";
pub(crate) const BOT_ID: u64 = 999;
pub(crate) const BOT_NAME: &str = "mercury_test_bot";

/// One call the fake received.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: String,
    pub params: Value,
    /// When the call arrived.
    pub at: Instant,
    /// The HTTP status the fake answered.
    pub status: u16,
}

#[derive(Default)]
pub(crate) struct FakeState {
    /// Updates not yet confirmed (Telegram forgets one once a getUpdates
    /// asks for an offset past it).
    pending: Mutex<Vec<Value>>,
    calls: Mutex<Vec<Call>>,
    arrived: Notify,
    /// sendMessage calls still to be answered with a 429.
    throttle: Mutex<u32>,
    /// At most this many updates per getUpdates answer (0: no limit of its own).
    batch: Mutex<usize>,
    sent_ids: Mutex<i64>,
    /// The text each sent message shows now (edits change it).
    texts: Mutex<BTreeMap<i64, String>>,
    /// Files `getFile` knows, by file_id: their path and bytes.
    files: Mutex<BTreeMap<String, (String, Vec<u8>)>>,
}

#[derive(Clone)]
pub(crate) struct FakeBotApi {
    pub url: String,
    pub state: Arc<FakeState>,
}

fn ok(result: Value) -> (StatusCode, Json<Value>) {
    (StatusCode::OK, Json(json!({"ok": true, "result": result})))
}

async fn method(
    State(st): State<Arc<FakeState>>,
    Path((bot, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> (StatusCode, Json<Value>) {
    // An upload (`sendDocument`, `sendPhoto`) is a form, kept as its text.
    let params: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| json!({"multipart": String::from_utf8_lossy(&body)}));
    let at = Instant::now();
    let (status, answer) = if bot != format!("bot{TOKEN}") {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})),
        )
    } else {
        answer(&st, &name, &params).await
    };
    st.calls.lock().unwrap().push(Call {
        method: name,
        params,
        at,
        status: status.as_u16(),
    });
    (status, answer)
}

async fn answer(st: &Arc<FakeState>, name: &str, params: &Value) -> (StatusCode, Json<Value>) {
    match name {
        "getMe" => {
            ok(json!({"id": BOT_ID, "is_bot": true, "first_name": "Mercury", "username": BOT_NAME}))
        }
        "deleteWebhook" | "setWebhook" | "sendChatAction" => ok(json!(true)),
        "sendDocument" | "sendPhoto" => ok(json!({"message_id": 9000, "date": 1700000000,
            "chat": {"id": 0, "type": "private"}})),
        "getFile" => {
            let id = params["file_id"].as_str().unwrap_or("");
            match st.files.lock().unwrap().get(id) {
                Some((path, bytes)) => {
                    ok(json!({"file_id": id, "file_unique_id": format!("u-{id}"),
                    "file_size": bytes.len(), "file_path": path}))
                }
                None => (
                    StatusCode::BAD_REQUEST,
                    Json(
                        json!({"ok": false, "error_code": 400, "description": "Bad Request: invalid file_id"}),
                    ),
                ),
            }
        }
        "getUpdates" => {
            let offset = params["offset"].as_i64().unwrap_or(0);
            let timeout = params["timeout"].as_u64().unwrap_or(0).min(2);
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                let notified = st.arrived.notified();
                let ready: Vec<Value> = {
                    let mut p = st.pending.lock().unwrap();
                    p.retain(|u| u["update_id"].as_i64().unwrap() >= offset);
                    let batch = *st.batch.lock().unwrap();
                    let n = if batch == 0 {
                        p.len()
                    } else {
                        batch.min(p.len())
                    };
                    p[..n].to_vec()
                };
                if !ready.is_empty() || Instant::now() >= deadline {
                    return ok(Value::Array(ready));
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            }
        }
        "sendMessage" => {
            {
                let mut t = st.throttle.lock().unwrap();
                if *t > 0 {
                    *t -= 1;
                    return (
                        StatusCode::TOO_MANY_REQUESTS,
                        Json(json!({"ok": false, "error_code": 429,
                            "description": "Too Many Requests: retry after 1",
                            "parameters": {"retry_after": 1}})),
                    );
                }
            }
            let id = {
                let mut n = st.sent_ids.lock().unwrap();
                *n += 1;
                5000 + *n
            };
            st.texts
                .lock()
                .unwrap()
                .insert(id, params["text"].as_str().unwrap_or("").to_owned());
            ok(json!({"message_id": id, "date": 1700000000,
                "chat": {"id": params["chat_id"], "type": "private"},
                "from": {"id": BOT_ID, "is_bot": true, "first_name": "Mercury", "username": BOT_NAME},
                "text": params["text"]}))
        }
        "editMessageText" => {
            let id = params["message_id"].as_i64().unwrap_or(0);
            let text = params["text"].as_str().unwrap_or("").to_owned();
            let mut texts = st.texts.lock().unwrap();
            let refused = |d: &str| {
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"ok": false, "error_code": 400, "description": d})),
                )
            };
            match texts.get(&id) {
                None => refused("Bad Request: message to edit not found"),
                Some(now) if *now == text => refused(
                    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
                ),
                Some(_) => {
                    texts.insert(id, text.clone());
                    ok(json!({"message_id": id, "date": 1700000000, "edit_date": 1700000001,
                        "chat": {"id": params["chat_id"], "type": "private"},
                        "from": {"id": BOT_ID, "is_bot": true, "first_name": "Mercury", "username": BOT_NAME},
                        "text": text}))
                }
            }
        }
        other => (
            StatusCode::NOT_FOUND,
            Json(
                json!({"ok": false, "error_code": 404, "description": format!("Not Found: method {other}")}),
            ),
        ),
    }
}

/// `GET /file/bot<token>/<file_path>`: a file's bytes, as the Bot API
/// serves them once `getFile` gave the path.
async fn file(
    State(st): State<Arc<FakeState>>,
    Path((bot, path)): Path<(String, String)>,
) -> Result<Vec<u8>, StatusCode> {
    st.calls.lock().unwrap().push(Call {
        method: "file".into(),
        params: json!({"path": path}),
        at: Instant::now(),
        status: 200,
    });
    if bot != format!("bot{TOKEN}") {
        return Err(StatusCode::UNAUTHORIZED);
    }
    st.files
        .lock()
        .unwrap()
        .values()
        .find(|(p, _)| *p == path)
        .map(|(_, b)| b.clone())
        .ok_or(StatusCode::NOT_FOUND)
}

impl FakeBotApi {
    pub(crate) async fn start() -> FakeBotApi {
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .route("/{bot}/{method}", post(method))
            .route("/file/{bot}/{*path}", axum::routing::get(file))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeBotApi { url, state }
    }

    pub(crate) fn push(&self, update: Value) {
        self.state.pending.lock().unwrap().push(update);
        self.state.arrived.notify_waiters();
    }

    pub(crate) fn throttle_next_sends(&self, n: u32) {
        *self.state.throttle.lock().unwrap() = n;
    }

    pub(crate) fn batch(&self, n: usize) {
        *self.state.batch.lock().unwrap() = n;
    }

    pub(crate) fn calls(&self, method: &str) -> Vec<Call> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    pub(crate) fn all_calls(&self) -> usize {
        self.state.calls.lock().unwrap().len()
    }

    /// Successful sendMessage calls, by the message id they reply to.
    pub(crate) fn replies(&self) -> BTreeMap<i64, Vec<Value>> {
        let mut out: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
        for c in self.calls("sendMessage") {
            if c.status == 200 {
                let to = c.params["reply_parameters"]["message_id"]
                    .as_i64()
                    .unwrap_or(0);
                out.entry(to).or_default().push(c.params);
            }
        }
        out
    }

    /// A file `getFile` will find as `file_id`, served at `path`.
    pub(crate) fn add_file(&self, file_id: &str, path: &str, bytes: Vec<u8>) {
        self.state
            .files
            .lock()
            .unwrap()
            .insert(file_id.to_owned(), (path.to_owned(), bytes));
    }

    /// The text message `id` shows now.
    pub(crate) fn text_of(&self, id: i64) -> Option<String> {
        self.state.texts.lock().unwrap().get(&id).cloned()
    }

    /// Waits until `f` holds, up to `secs`.
    pub(crate) async fn until(&self, secs: u64, what: &str, f: impl Fn(&FakeBotApi) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn user(id: u64, name: &str) -> Value {
    json!({"id": id, "is_bot": false, "first_name": name})
}

pub(crate) fn dm(update_id: i64, message_id: i64, from: u64, text: &str) -> Value {
    json!({"update_id": update_id, "message": {
        "message_id": message_id, "date": 1700000000,
        "chat": {"id": from, "type": "private", "first_name": "U"},
        "from": user(from, "U"), "text": text}})
}

pub(crate) fn group(update_id: i64, message_id: i64, chat: i64, from: u64, text: &str) -> Value {
    json!({"update_id": update_id, "message": {
        "message_id": message_id, "date": 1700000000,
        "chat": {"id": chat, "type": "supergroup", "title": "Team"},
        "from": user(from, "G"), "text": text}})
}

pub(crate) fn host_options(
    fake: &FakeBotApi,
    model: Value,
    extra: Vec<(&'static str, Yaml)>,
) -> HostOptions {
    let mut config = vec![
        ("adapters.telegram.enabled", Yaml::Bool(true)),
        // The adapter's tests talk as strangers to an open bot; the sender
        // policy's own tests set `pairing` back in `extra`.
        ("adapters.telegram.dm_policy", Yaml::String("open".into())),
        (
            "adapters.telegram.api_base_url",
            Yaml::String(fake.url.clone()),
        ),
        (
            "adapters.telegram.poll_timeout_secs",
            Yaml::Number(1.into()),
        ),
    ];
    config.extend(extra);
    HostOptions {
        model,
        config,
        env: vec![("MERCURY_TELEGRAM_BOT_TOKEN", TOKEN.to_string())],
        ..HostOptions::default()
    }
}

#[tokio::test]
async fn telegram_dm_and_group_mentions_get_threaded_replies() {
    let fake = FakeBotApi::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "pong"}]}),
        vec![],
    ))
    .await;
    let chat = -100_777;
    fake.push(dm(1, 10, 42, "hello there"));
    fake.push(group(2, 20, chat, 43, "just chatting among ourselves"));
    fake.push(group(3, 21, chat, 43, "ping @Mercury_Test_Bot"));
    fake.push(group(4, 22, chat, 44, "/status@mercury_test_bot"));
    let mut reply = group(5, 23, chat, 44, "thanks!");
    reply["message"]["reply_to_message"] = json!({"message_id": 5001, "date": 1700000000,
        "chat": {"id": chat, "type": "supergroup"},
        "from": {"id": BOT_ID, "is_bot": true, "first_name": "Mercury"}, "text": "pong"});
    fake.push(reply);
    let mut edited = dm(6, 10, 42, "hello there (edited)");
    edited["edited_message"] = edited["message"].take();
    edited.as_object_mut().unwrap().remove("message");
    fake.push(edited);
    // A voice note alone is a message (its text the marker `[voice note]`).
    let mut voice = dm(7, 11, 42, "");
    voice["message"].as_object_mut().unwrap().remove("text");
    voice["message"]["voice"] = json!({"file_id": "x", "file_unique_id": "y", "duration": 1});
    fake.push(voice);
    // A shape Mercury cannot read (a sticker without its required fields) is skipped, not a stall.
    let mut odd = dm(8, 12, 42, "");
    odd["message"].as_object_mut().unwrap().remove("text");
    odd["message"]["sticker"] = json!({"file_id": "x"});
    fake.push(odd);

    fake.until(60, "five replies", |f| f.replies().len() == 5)
        .await;
    let replies = fake.replies();
    assert_eq!(
        replies.keys().copied().collect::<Vec<_>>(),
        vec![10, 11, 21, 22, 23],
        "the DM, the voice note, the @mention, the /cmd@bot and the reply to the bot are answered; {replies:?}"
    );
    assert_eq!(replies[&10][0]["chat_id"], json!(42));
    for id in [21, 22, 23] {
        assert_eq!(replies[&id][0]["chat_id"], json!(chat));
        assert_eq!(replies[&id][0]["text"], json!("pong"));
    }
    let typing = fake.calls("sendChatAction");
    assert!(
        typing
            .iter()
            .any(|c| c.params["chat_id"] == json!(42) && c.params["action"] == "typing"),
        "{typing:?}"
    );
    // Stored in the platform namespace; the edit and the sticker are not rows.
    host.wait_count(
        "SELECT COUNT(*) FROM adapter_positions WHERE adapter = 'telegram' AND position = '9'",
        1,
        30,
    )
    .await;
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:%'"),
        6
    );
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id = 'telegram:42'"),
        2
    );
    assert_eq!(
        host.count(
            "SELECT COUNT(*) FROM messages WHERE role = 'ambient' AND platform_message_id = '20'"
        ),
        1
    );
    let (st, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(st, 200);
    let tg = &health["adapters"]["telegram"];
    assert_eq!(tg["mode"], "polling", "{health}");
    assert_eq!(tg["connected"], true, "{health}");
    assert!(tg["last_update_at"].as_i64().is_some(), "{health}");
    assert!(!health.to_string().contains(TOKEN));
    host.stop().await;
}

#[tokio::test]
async fn telegram_restart_mid_stream_loses_and_repeats_nothing() {
    let fake = FakeBotApi::start().await;
    fake.batch(1);
    let mut host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "ack"}]}),
        vec![],
    ))
    .await;
    // Four now, one at a time; the host is killed once three are stored, so
    // the fourth may be anywhere between Telegram and the database.
    for i in 1..=4 {
        fake.push(dm(i, 100 + i, 500 + i as u64, &format!("message {i}")));
    }
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:%'",
        3,
        60,
    )
    .await;
    host.kill();
    let stored: i64 = host.read(|c| {
        c.query_row(
            "SELECT CAST(position AS INTEGER) FROM adapter_positions WHERE adapter = 'telegram'",
            &[],
            |r| r.get(0),
        )
    });
    let rows_at_kill =
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:%'");
    assert_eq!(
        stored,
        rows_at_kill + 1,
        "the stored offset covers exactly the stored rows"
    );
    for i in 5..=8 {
        fake.push(dm(i, 100 + i, 500 + i as u64, &format!("message {i}")));
    }
    let restarted = Instant::now();
    host.restart_process().await;
    fake.until(60, "a reply to each of the eight", |f| {
        (101..=108).all(|id| f.replies().contains_key(&id))
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
        8,
        60,
    )
    .await;
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:%'"),
        8,
        "every update stored once"
    );
    assert_eq!(
        host.count("SELECT COUNT(DISTINCT platform_message_id) FROM messages WHERE sender_id LIKE 'telegram:%'"),
        8
    );
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'"),
        8,
        "every message answered once"
    );
    // The restarted host asked from the stored offset: nothing confirmed was asked again.
    fake.until(30, "a poll by the restarted host", |f| {
        f.calls("getUpdates").iter().any(|c| c.at > restarted)
    })
    .await;
    let after: Vec<Call> = fake
        .calls("getUpdates")
        .into_iter()
        .filter(|c| c.at > restarted)
        .collect();
    assert_eq!(after[0].params["offset"], json!(stored), "{after:?}");
    host.stop().await;
}

#[tokio::test]
async fn telegram_429_is_waited_out_and_a_long_reply_is_split() {
    let fake = FakeBotApi::start().await;
    let long = format!(
        "{}\n\n{}\n\n{}",
        "a".repeat(3000),
        "b".repeat(3000),
        "c".repeat(50)
    );
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": long}]}),
        vec![],
    ))
    .await;
    fake.throttle_next_sends(1);
    fake.push(dm(1, 10, 42, "tell me everything"));
    fake.until(60, "the split reply", |f| {
        f.replies().values().map(Vec::len).sum::<usize>() == 2
    })
    .await;
    let sends = fake.calls("sendMessage");
    assert_eq!(sends[0].status, 429);
    let ok: Vec<&Call> = sends.iter().filter(|c| c.status == 200).collect();
    assert_eq!(ok.len(), 2);
    assert!(
        ok[0].at.duration_since(sends[0].at) >= Duration::from_secs(1),
        "retry_after was not waited out"
    );
    assert_eq!(ok[0].params["text"], json!("a".repeat(3000)));
    assert_eq!(ok[0].params["reply_parameters"]["message_id"], json!(10));
    assert_eq!(
        ok[1].params["text"],
        json!(format!("{}\n\n{}", "b".repeat(3000), "c".repeat(50)))
    );
    assert!(ok[1].params.get("reply_parameters").is_none());
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL AND attempts = 1",
        1,
        30,
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn telegram_webhook_without_the_secret_is_401() {
    let fake = FakeBotApi::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "via webhook"}]}),
        vec![
            ("adapters.telegram.mode", Yaml::String("webhook".into())),
            (
                "adapters.telegram.webhook_url",
                Yaml::String("https://bot.example/api/adapters/telegram/webhook".into()),
            ),
        ],
    ))
    .await;
    fake.until(30, "setWebhook", |f| !f.calls("setWebhook").is_empty())
        .await;
    let set = fake.calls("setWebhook").remove(0).params;
    assert_eq!(
        set["url"],
        "https://bot.example/api/adapters/telegram/webhook"
    );
    let secret = set["secret_token"].as_str().unwrap().to_string();
    assert!(secret.len() >= 32);
    let path = "/api/adapters/telegram/webhook";
    let update = dm(1, 10, 42, "hello by webhook");
    let (st, v) = host
        .send(Method::POST, path, None, &[], Some(update.clone()))
        .await;
    assert_eq!(st, 401, "{v}");
    let (st, _) = host
        .send(
            Method::POST,
            path,
            None,
            &[("X-Telegram-Bot-Api-Secret-Token", "not-the-secret")],
            Some(update.clone()),
        )
        .await;
    assert_eq!(st, 401);
    // A bearer token, even the owner's, is no substitute for the secret.
    let (st, _) = host
        .send(
            Method::POST,
            path,
            Some(&host.owner_token),
            &[],
            Some(update.clone()),
        )
        .await;
    assert_eq!(st, 401);
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:%'"),
        0,
        "a refused call stores nothing"
    );
    let header = [("X-Telegram-Bot-Api-Secret-Token", secret.as_str())];
    let (st, v) = host
        .send(Method::POST, path, None, &header, Some(update.clone()))
        .await;
    assert_eq!(st, 200, "{v}");
    // A resend (Telegram retries) is stored once.
    let (st, _) = host
        .send(Method::POST, path, None, &header, Some(update))
        .await;
    assert_eq!(st, 200);
    fake.until(60, "the webhook reply", |f| f.replies().contains_key(&10))
        .await;
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id = 'telegram:42'"),
        1
    );
    assert!(
        fake.calls("getUpdates").is_empty(),
        "webhook mode never polls"
    );
    let (_, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(health["adapters"]["telegram"]["mode"], "webhook");
    assert!(!health.to_string().contains(&secret));
    host.stop().await;
}

#[tokio::test]
async fn telegram_enabled_without_a_token_refuses_to_start() {
    let fake = FakeBotApi::start().await;
    let mut opts = host_options(&fake, json!({"rules": [{"reply": "x"}]}), vec![]);
    opts.env.clear();
    let err = crate::common::serve_refused_without(&opts, "MERCURY_TELEGRAM_BOT_TOKEN").await;
    assert!(err.contains("MERCURY_TELEGRAM_BOT_TOKEN"), "{err}");
    assert_eq!(fake.all_calls(), 0);
}

/// A supervised child that counts its starts and fails on `true`.
struct Crashy {
    starts: Arc<std::sync::atomic::AtomicUsize>,
    current: Arc<Mutex<Option<ractor::ActorRef<bool>>>>,
}

struct CrashyActor;

impl ractor::Actor for CrashyActor {
    type Msg = bool;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _me: ractor::ActorRef<bool>,
        _args: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _me: ractor::ActorRef<bool>,
        crash: bool,
        _state: &mut (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        if crash {
            return Err("asked to fail".into());
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl mercury::actors::adapter::SupervisedChild for Crashy {
    fn name(&self) -> String {
        "test adapter".into()
    }

    async fn spawn(
        &self,
        supervisor: ractor::ActorCell,
    ) -> Result<ractor::ActorCell, ractor::ActorProcessingErr> {
        let (actor, _) = ractor::Actor::spawn_linked(None, CrashyActor, (), supervisor).await?;
        self.starts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self.current.lock().unwrap() = Some(actor.clone());
        Ok(actor.get_cell())
    }
}

#[tokio::test]
async fn a_failed_adapter_actor_is_restarted_by_the_root_supervisor() {
    let (_dir, data, _) = crate::common::prepare(&HostOptions::default()).await;
    let paths = mercury::workspace::DataPaths::new(&data);
    let settings = mercury::host::load_settings(&paths).unwrap();
    let store = mercury::storage::Store::open(&paths.db).unwrap();
    let rt = mercury::host::build_runtime(
        &paths,
        settings,
        store,
        mercury::model::gate::Admission::Gated,
    )
    .await
    .unwrap();
    let (supervisor, _handle, _spaces, _review) = mercury::host::start_actors(&rt).await.unwrap();
    let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let current = Arc::new(Mutex::new(None));
    let child = Crashy {
        starts: starts.clone(),
        current: current.clone(),
    };
    let res = ractor::call_t!(
        supervisor,
        mercury::actors::SupervisorMsg::Supervise,
        5000,
        Arc::new(child)
    )
    .unwrap();
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 1);
    for round in 2..=3 {
        let actor = current.lock().unwrap().clone().unwrap();
        actor.cast(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while starts.load(std::sync::atomic::Ordering::SeqCst) < round {
            assert!(Instant::now() < deadline, "not restarted (round {round})");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The supervisor itself survived its child's failures.
    assert_eq!(supervisor.get_status(), ractor::ActorStatus::Running);
    supervisor.stop(None);
}

#[tokio::test]
async fn telegram_failures_show_on_healthz_without_the_token() {
    let fake = FakeBotApi::start().await;
    let mut opts = host_options(&fake, json!({"rules": [{"reply": "x"}]}), vec![]);
    // The fake knows another token: every call is a 401.
    opts.env = vec![("MERCURY_TELEGRAM_BOT_TOKEN", "999:wrong-token".to_string())];
    let host = TestHost::start_process(opts).await;
    fake.until(30, "a refused getMe", |f| {
        f.calls("getMe").iter().any(|c| c.status == 401)
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let (_, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
        if health["adapters"]["telegram"]["last_error"].is_string() {
            break health;
        }
        assert!(Instant::now() < deadline, "no error on /healthz: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tg = &health["adapters"]["telegram"];
    assert_eq!(tg["connected"], false, "{health}");
    assert!(
        tg["last_error"].as_str().unwrap().contains("getMe: 401"),
        "{health}"
    );
    assert!(!health.to_string().contains("wrong-token"), "{health}");
    assert!(fake.calls("getUpdates").is_empty());
    host.stop().await;
}

#[tokio::test]
async fn mercury_bench_adapters_reports_both_paths_and_the_ratio() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["bench", "adapters", "--messages", "150", "--chats", "3"])
        .env("MERCURY_LOG", "warn")
        .env_remove("MERCURY_TELEGRAM_BOT_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The figures depend on the machine; their presence does not.
    for line in [
        "150 messages over 3 group chats",
        "telegram ",
        "via getUpdates against the fake",
        "ingest_tx alone, one at a time",
        "(telegram time / ingress time)",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}
