//! The Slack adapter end to end: a real host (child process, real SQLite
//! file) on a fake Slack that speaks the Web API's JSON (`auth.test`,
//! `apps.connections.open`, `chat.postMessage`, `chat.update`, 429 with
//! `Retry-After`) and
//! Socket Mode's envelopes and acks over a real WebSocket on loopback.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tokio::sync::Notify;
use tokio_websockets::{Message as WsMessage, ServerBuilder};

use crate::common::{HostOptions, TestHost};

const APP_TOKEN: &str = "xapp-1-A0TEST-123-abc";
const BOT_TOKEN: &str = "xoxb-123-456-test";
const BOT_USER: &str = "U0BOT00001";

#[derive(Default)]
struct Fake {
    ws_url: Mutex<String>,
    /// Envelopes to push to the connected socket, in order.
    envelopes: Mutex<Vec<Value>>,
    pushed: Mutex<usize>,
    acks: Mutex<Vec<String>>,
    posts: Mutex<Vec<Value>>,
    /// chat.postMessage calls still to be answered 429.
    throttle: Mutex<u32>,
    throttled: Mutex<u32>,
    arrived: Notify,
    /// chat.update calls, with when they came.
    updates: Mutex<Vec<(Instant, Value)>>,
    /// The text each posted message shows now, by its `ts`.
    texts: Mutex<std::collections::BTreeMap<String, String>>,
    /// File downloads: the path and whether the bot token came with it.
    downloads: Mutex<Vec<(String, bool)>>,
    /// The fake's own origin: upload URLs point back at it.
    origin: Mutex<String>,
    /// files.getUploadURLExternal's arguments, files.completeUploadExternal's.
    upload_urls: Mutex<Vec<Value>>,
    completed: Mutex<Vec<Value>>,
    /// Bytes posted to an upload URL: its file id, whether a token came
    /// with them, the bytes.
    uploaded: Mutex<Vec<(String, bool, Vec<u8>)>>,
}

/// `POST /upload/{id}`: a file's bytes, sent to the URL Slack gave.
async fn upload(
    State(st): State<Arc<Fake>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let keyed = headers.contains_key("authorization");
    st.uploaded.lock().unwrap().push((id, keyed, body.to_vec()));
    format!("OK - {}", body.len()).into_response()
}

/// `GET /files/...`: a file's bytes, as `url_private_download` serves them
/// to a request carrying the bot token.
async fn file(
    State(st): State<Arc<Fake>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    let keyed = headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {BOT_TOKEN}"));
    st.downloads.lock().unwrap().push((path, keyed));
    if keyed {
        "the plan: ship it".into_response()
    } else {
        StatusCode::FORBIDDEN.into_response()
    }
}

async fn web(
    State(st): State<Arc<Fake>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let body: Value = if form {
        // The files.* methods take forms: read as an object of strings.
        let url = reqwest::Url::parse(&format!(
            "http://form.invalid/?{}",
            String::from_utf8_lossy(&body)
        ))
        .unwrap();
        Value::Object(
            url.query_pairs()
                .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
                .collect(),
        )
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    let want = if method == "apps.connections.open" {
        APP_TOKEN
    } else {
        BOT_TOKEN
    };
    if auth != format!("Bearer {want}") {
        return Json(json!({"ok": false, "error": "invalid_auth"})).into_response();
    }
    match method.as_str() {
        "auth.test" => {
            Json(json!({"ok": true, "user_id": BOT_USER, "bot_id": "B0BOT"})).into_response()
        }
        "apps.connections.open" => {
            Json(json!({"ok": true, "url": st.ws_url.lock().unwrap().clone()})).into_response()
        }
        "chat.postMessage" => {
            {
                let mut t = st.throttle.lock().unwrap();
                if *t > 0 {
                    *t -= 1;
                    *st.throttled.lock().unwrap() += 1;
                    let mut r = (
                        StatusCode::TOO_MANY_REQUESTS,
                        Json(json!({"ok": false, "error": "ratelimited"})),
                    )
                        .into_response();
                    r.headers_mut()
                        .insert("retry-after", HeaderValue::from_static("1"));
                    return r;
                }
            }
            let ts = {
                let mut posts = st.posts.lock().unwrap();
                posts.push(body.clone());
                format!("1700000099.{:06}", posts.len())
            };
            st.texts
                .lock()
                .unwrap()
                .insert(ts.clone(), body["text"].as_str().unwrap_or("").to_owned());
            Json(json!({"ok": true, "channel": body["channel"], "ts": ts})).into_response()
        }
        "chat.update" => {
            let ts = body["ts"].as_str().unwrap_or("").to_owned();
            let mut texts = st.texts.lock().unwrap();
            if !texts.contains_key(&ts) {
                return Json(json!({"ok": false, "error": "message_not_found"})).into_response();
            }
            texts.insert(ts.clone(), body["text"].as_str().unwrap_or("").to_owned());
            st.updates
                .lock()
                .unwrap()
                .push((Instant::now(), body.clone()));
            Json(json!({"ok": true, "channel": body["channel"], "ts": ts, "text": body["text"]}))
                .into_response()
        }
        "files.getUploadURLExternal" if form => {
            let id = format!("F0UP{:04}", st.upload_urls.lock().unwrap().len() + 1);
            st.upload_urls.lock().unwrap().push(body.clone());
            let url = format!("{}/upload/{id}", st.origin.lock().unwrap());
            Json(json!({"ok": true, "upload_url": url, "file_id": id})).into_response()
        }
        "files.completeUploadExternal" if form => {
            st.completed.lock().unwrap().push(body.clone());
            Json(json!({"ok": true, "files": [{"id": "F0UP0001"}]})).into_response()
        }
        _ => Json(json!({"ok": false, "error": "unknown_method"})).into_response(),
    }
}

async fn socket(st: Arc<Fake>, tcp: tokio::net::TcpStream) {
    let Ok((_req, mut ws)) = ServerBuilder::new().accept(tcp).await else {
        return;
    };
    let hello = json!({"type": "hello", "num_connections": 1,
        "connection_info": {"app_id": "A0TEST"}, "debug_info": {"host": "fake"}});
    if ws.send(WsMessage::text(hello.to_string())).await.is_err() {
        return;
    }
    loop {
        let due: Vec<Value> = {
            let all = st.envelopes.lock().unwrap();
            let mut p = st.pushed.lock().unwrap();
            let out = all[*p..].to_vec();
            *p = all.len();
            out
        };
        for e in due {
            if ws.send(WsMessage::text(e.to_string())).await.is_err() {
                return;
            }
        }
        let notified = st.arrived.notified();
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            frame = ws.next() => match frame {
                Some(Ok(f)) => {
                    if let Some(text) = f.as_text() {
                        let v: Value = serde_json::from_str(text).unwrap();
                        st.acks.lock().unwrap().push(v["envelope_id"].as_str().unwrap().to_owned());
                    }
                }
                _ => return,
            },
        }
    }
}

async fn fake() -> (String, Arc<Fake>) {
    let st = Arc::new(Fake::default());
    let ws_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    *st.ws_url.lock().unwrap() = format!(
        "ws://{}/link/?ticket=abc-123&app_id=A0TEST",
        ws_listener.local_addr().unwrap()
    );
    tokio::spawn({
        let st = st.clone();
        async move {
            while let Ok((tcp, _)) = ws_listener.accept().await {
                tokio::spawn(socket(st.clone(), tcp));
            }
        }
    });
    let app = Router::new()
        .route("/api/{method}", post(web))
        .route("/files/{*path}", axum::routing::get(file))
        .route("/upload/{id}", post(upload))
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    *st.origin.lock().unwrap() = format!("http://{}", listener.local_addr().unwrap());
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, st)
}

impl Fake {
    fn push(&self, envelope: Value) {
        self.envelopes.lock().unwrap().push(envelope);
        self.arrived.notify_waiters();
    }
}

fn event(envelope_id: &str, event: Value) -> Value {
    json!({"envelope_id": envelope_id, "type": "events_api", "accepts_response_payload": false,
        "retry_attempt": 0, "retry_reason": "",
        "payload": {"token": "unused", "team_id": "T0TEAM", "api_app_id": "A0TEST",
            "type": "event_callback", "event_id": format!("Ev{envelope_id}"), "event_time": 1700000000,
            "event": event}})
}

fn options(url: &str, reply: &str) -> HostOptions {
    HostOptions {
        model: json!({"rules": [{"reply": reply}]}),
        config: vec![
            ("adapters.slack.enabled", Yaml::Bool(true)),
            ("adapters.slack.api_base_url", Yaml::String(url.into())),
            ("adapters.slack.dm_policy", Yaml::String("open".into())),
        ],
        env: vec![
            ("MERCURY_SLACK_APP_TOKEN", APP_TOKEN.to_string()),
            ("MERCURY_SLACK_BOT_TOKEN", BOT_TOKEN.to_string()),
        ],
        ..HostOptions::default()
    }
}

async fn until(secs: u64, what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn slack_mention_is_answered_once_in_its_thread_without_pinging_the_channel() {
    let (url, st) = fake().await;
    let host = TestHost::start_process(options(&url, "pong <!channel> @here")).await;
    let mention_text = format!("<@{BOT_USER}> ping");
    // A mention arrives twice: as a channel message and as app_mention.
    st.push(event(
        "e1",
        json!({"type": "message", "channel": "C0CHAN0001", "channel_type": "channel",
        "user": "U0PERSON01", "text": mention_text, "ts": "1700000001.000100"}),
    ));
    st.push(event(
        "e2",
        json!({"type": "app_mention", "channel": "C0CHAN0001",
        "user": "U0PERSON01", "text": mention_text, "ts": "1700000001.000100"}),
    ));
    // Chatter without a mention is context, not answered.
    st.push(event(
        "e3",
        json!({"type": "message", "channel": "C0CHAN0001", "channel_type": "channel",
        "user": "U0PERSON02", "text": "lunch?", "ts": "1700000002.000200"}),
    ));
    // A mention inside a thread is answered in that thread.
    st.push(event("e4", json!({"type": "app_mention", "channel": "C0CHAN0001", "user": "U0PERSON02",
        "text": format!("<@{BOT_USER}> and here?"), "ts": "1700000003.000300", "thread_ts": "1700000000.000001"})));
    // The bot's own message is never taken in.
    st.push(event(
        "e5",
        json!({"type": "message", "channel": "C0CHAN0001", "channel_type": "channel",
        "user": BOT_USER, "bot_id": "B0BOT", "text": "pong", "ts": "1700000004.000400"}),
    ));
    until(60, "two replies", || st.posts.lock().unwrap().len() >= 2).await;
    until(30, "every envelope acked", || {
        st.acks.lock().unwrap().len() == 5
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let posts = st.posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 2, "one reply per mention: {posts:?}");
    let mut threads: Vec<&str> = posts
        .iter()
        .map(|p| p["thread_ts"].as_str().unwrap())
        .collect();
    threads.sort_unstable();
    assert_eq!(threads, vec!["1700000000.000001", "1700000001.000100"]);
    for p in &posts {
        assert_eq!(p["channel"], json!("C0CHAN0001"));
        assert_eq!(p["link_names"], json!(false));
        let text = p["text"].as_str().unwrap();
        assert!(text.starts_with("pong"), "{text}");
        assert!(
            !text.contains("<!channel>") && !text.contains("@here"),
            "a ping: {text}"
        );
    }
    let mut acks = st.acks.lock().unwrap().clone();
    acks.sort();
    assert_eq!(acks, vec!["e1", "e2", "e3", "e4", "e5"]);
    host.stop().await;
}

#[tokio::test]
async fn slack_429_is_waited_out_and_the_dm_answered_once() {
    let (url, st) = fake().await;
    *st.throttle.lock().unwrap() = 1;
    let host = TestHost::start_process(options(&url, "hello from mercury")).await;
    st.push(event(
        "d1",
        json!({"type": "message", "channel": "D0DIRECT01", "channel_type": "im",
        "user": "U0PERSON03", "text": "hi", "ts": "1700000010.000100"}),
    ));
    until(60, "the reply", || !st.posts.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        *st.throttled.lock().unwrap(),
        1,
        "the first send was refused with 429"
    );
    let posts = st.posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["channel"], json!("D0DIRECT01"));
    assert_eq!(posts[0]["text"], json!("hello from mercury"));
    assert!(
        posts[0].get("thread_ts").is_none(),
        "a DM is answered inline"
    );
    host.stop().await;
}

#[tokio::test]
async fn slack_a_streamed_mention_reply_grows_in_its_thread_by_chat_update() {
    let (url, st) = fake().await;
    let reply: String = (1..=20)
        .map(|i| format!("part{i}"))
        .collect::<Vec<_>>()
        .join(" ")
        + " <!channel>";
    let mut opts = options(&url, "unused");
    opts.model = json!({"rules": [{"reply": reply, "latency_ms": 3000}]});
    opts.config.extend([
        ("turn.stream", Yaml::Bool(true)),
        ("turn.stream_after_ms", Yaml::Number(200.into())),
    ]);
    let host = TestHost::start_process(opts).await;
    st.push(event(
        "s1",
        json!({"type": "app_mention", "channel": "C0CHAN0001",
        "user": "U0PERSON01", "text": format!("<@{BOT_USER}> a long one"), "ts": "1700000020.000100"}),
    ));
    let last_text = || {
        st.updates
            .lock()
            .unwrap()
            .last()
            .map(|(_, b)| b["text"].as_str().unwrap_or("").to_owned())
    };
    until(60, "the preview updated to the whole reply", || {
        last_text().is_some_and(|t| t.starts_with("part1 ") && t.contains("part20"))
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    let posts = st.posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 1, "one message, edited: {posts:?}");
    assert_eq!(posts[0]["thread_ts"], json!("1700000020.000100"));
    let updates = st.updates.lock().unwrap().clone();
    assert!(updates.len() >= 2, "{updates:?}");
    for (_, u) in &updates {
        assert_eq!(u["ts"], json!("1700000099.000001"));
        assert_eq!(u["link_names"], json!(false));
        let text = u["text"].as_str().unwrap();
        assert!(!text.contains("<!channel>"), "a ping: {text}");
    }
    for pair in updates.windows(2) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(gap >= Duration::from_millis(1000), "{gap:?}");
    }
    let shown = st.texts.lock().unwrap()["1700000099.000001"].clone();
    assert_eq!(Some(shown), last_text());
    assert!(last_text().unwrap().ends_with("&lt;!channel&gt;"));
    host.stop().await;
}

#[tokio::test]
async fn slack_a_shared_file_is_fetched_with_the_bot_token_only_from_its_origins() {
    let (url, st) = fake().await;
    let origin = url.trim_end_matches("/api").to_owned();
    let mut opts = options(&url, "unused");
    opts.model = json!({"rules": [{"match": "saved as (inbox/\\S+)\\].*\\n.*not kept: (.*)\\]", "reply": "kept $1; $2"}]});
    opts.config.push((
        "adapters.slack.file_origins",
        Yaml::Sequence(vec![Yaml::from(origin.clone())]),
    ));
    let host = TestHost::start_process(opts).await;
    st.push(event(
        "f1",
        json!({"type": "message", "subtype": "file_share", "channel": "D0DIRECT02", "channel_type": "im",
        "user": "U0PERSON04", "text": "two files", "ts": "1700000030.000100",
        "files": [
            {"id": "F1", "name": "plan.txt", "mimetype": "text/plain", "size": 17,
             "url_private_download": format!("{origin}/files/T0TEAM-F1/download/plan.txt")},
            {"id": "F2", "name": "elsewhere.txt", "mimetype": "text/plain", "size": 5,
             "url_private_download": "http://127.0.0.2:9/files/F2/elsewhere.txt"}
        ]}),
    ));
    until(60, "the reply", || !st.posts.lock().unwrap().is_empty()).await;
    let said = st.posts.lock().unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        said.starts_with("kept inbox/")
            && said.ends_with("-1.txt; it could not be fetched (its URL is not on an origin of adapters.slack.file_origins)"),
        "{said}"
    );
    assert_eq!(
        *st.downloads.lock().unwrap(),
        vec![("T0TEAM-F1/download/plan.txt".to_owned(), true)]
    );
    host.stop().await;
}

#[tokio::test]
async fn slack_a_file_the_turn_writes_under_outbox_is_shared_in_the_reply_thread() {
    let (url, st) = fake().await;
    let mut opts = options(&url, "");
    opts.model = json!({"rules": [
        {"match": "tool_result\\(write_file\\)", "reply": "attached"},
        {"match": "the summary", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "outbox/summary.md", "content": "# all good"}}
        ]}
    ]});
    let host = TestHost::start_process(opts).await;
    st.push(event(
        "f1",
        json!({"type": "app_mention", "channel": "C0CHAN0001", "user": "U0PERSON01",
        "text": format!("<@{BOT_USER}> the summary please"), "ts": "1700000005.000500"}),
    ));
    until(60, "the file shared", || {
        !st.completed.lock().unwrap().is_empty()
    })
    .await;
    let posts = st.posts.lock().unwrap().clone();
    assert_eq!(posts[0]["text"], "attached");
    // The URL is asked for the file's name and size, with the bot token (the fake checks it).
    let asked = st.upload_urls.lock().unwrap().clone();
    assert_eq!(
        asked,
        vec![json!({"filename": "summary.md", "length": "10"})]
    );
    // The bytes go to that URL without a token.
    let uploaded = st.uploaded.lock().unwrap().clone();
    assert_eq!(
        uploaded,
        vec![("F0UP0001".to_owned(), false, b"# all good".to_vec())]
    );
    // Completed into the channel, in the mention's thread, like the text.
    let done = st.completed.lock().unwrap()[0].clone();
    assert_eq!(done["channel_id"], "C0CHAN0001");
    assert_eq!(done["thread_ts"], "1700000005.000500");
    assert_eq!(posts[0]["thread_ts"], "1700000005.000500");
    let files: Value = serde_json::from_str(done["files"].as_str().unwrap()).unwrap();
    assert_eq!(files, json!([{"id": "F0UP0001", "title": "summary.md"}]));
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.stop().await;
}

const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// Slack's `X-Slack-Signature` of `body` sent at `ts`.
fn slack_sign(ts: &str, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SIGNING_SECRET.as_bytes()).unwrap();
    mac.update(format!("v0:{ts}:").as_bytes());
    mac.update(body);
    format!(
        "v0={}",
        base16ct::lower::encode_string(&mac.finalize().into_bytes())
    )
}

/// POSTs `body` to the host's Events API route, signed as at `ts` (or
/// with `signature`); the status and the answer.
async fn post_event(
    host: &TestHost,
    body: &[u8],
    ts: &str,
    signature: Option<&str>,
) -> (u16, String) {
    let sig = signature.map_or_else(|| slack_sign(ts, body), str::to_owned);
    let r = host
        .http
        .post(format!("{}/api/adapters/slack/events", host.url))
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", sig)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn slack_events_api_requests_are_checked_by_signature_and_age_before_parsing() {
    let (url, st) = fake().await;
    let mut opts = options(&url, "hi from events");
    opts.config
        .push(("adapters.slack.mode", Yaml::String("events".into())));
    // No app token: the Events API needs the signing secret instead.
    opts.env = vec![
        ("MERCURY_SLACK_BOT_TOKEN", BOT_TOKEN.to_string()),
        ("MERCURY_SLACK_SIGNING_SECRET", SIGNING_SECRET.to_string()),
    ];
    let host = TestHost::start_process(opts).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let handshake = br#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    // Until the adapter registers, the route is 404; then the handshake echoes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let (status, body) = post_event(&host, handshake, &now, None).await;
        if status == 200 {
            break body;
        }
        assert_eq!(status, 404, "{body}");
        assert!(Instant::now() < deadline, "the events route never opened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        answer["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    let dm = json!({"token": "x", "team_id": "T0TEAM", "api_app_id": "A0TEST",
        "type": "event_callback", "event_id": "Ev0DM1", "event_time": 1700000000,
        "event": {"type": "message", "channel": "D0DIRECT01", "channel_type": "im",
            "user": "U0PERSON01", "text": "hello over http", "ts": "1700000010.000100"}});
    let body = serde_json::to_vec(&dm).unwrap();
    // A wrong signature is refused, and a body that is not even JSON is
    // refused the same way: the signature is checked before parsing.
    let forged = slack_sign(&now, b"something else");
    assert_eq!(post_event(&host, &body, &now, Some(&forged)).await.0, 401);
    assert_eq!(
        post_event(&host, b"{not json", &now, Some(&forged)).await.0,
        401
    );
    // Rightly signed, but six minutes old: a replay.
    let old = (now.parse::<u64>().unwrap() - 360).to_string();
    assert_eq!(post_event(&host, &body, &old, None).await.0, 401);
    let rows = "SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'slack:%'";
    assert_eq!(host.count(rows), 0, "nothing refused was stored");
    // The signed event is stored (the 200 comes after the commit) and
    // answered; Slack's retry of it is kept once.
    assert_eq!(post_event(&host, &body, &now, None).await.0, 200);
    assert_eq!(host.count(rows), 1);
    assert_eq!(post_event(&host, &body, &now, None).await.0, 200);
    until(60, "the reply", || !st.posts.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let posts = st.posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["channel"], "D0DIRECT01");
    assert_eq!(posts[0]["text"], "hi from events");
    assert_eq!(host.count(rows), 1);
    host.stop().await;
}
