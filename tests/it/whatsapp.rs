//! The WhatsApp adapter end to end: a real host (child process, real SQLite
//! file) receiving Cloud API webhook notifications signed like Meta signs
//! them (`X-Hub-Signature-256`, HMAC-SHA256 of the raw body under the app
//! secret) and replying through a fake Graph API on a loopback port that
//! speaks its JSON (`POST /{phone_number_id}/messages`, error objects with
//! Meta's codes).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use hmac::{KeyInit, Mac};
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

const ACCESS_TOKEN: &str = "EAAG-test-access-token";
const APP_SECRET: &str = "whatsapp-app-secret-123";
const VERIFY_TOKEN: &str = "verify-me-please";
const PHONE_ID: &str = "106540352242922";

#[derive(Default)]
pub(crate) struct Graph {
    /// The fake's own origin: media URLs point back at it.
    origin: Mutex<String>,
    /// Media downloads served: the path, and whether the token came with it.
    downloads: Mutex<Vec<(String, bool)>>,
    pub(crate) sent: Mutex<Vec<Value>>,
    /// Sends still to be answered with Meta's throughput error (130429).
    throttle: Mutex<u32>,
    throttled: Mutex<u32>,
    /// Media uploads (`POST /{phone}/media`): the form, as text.
    uploads: Mutex<Vec<String>>,
}

/// `POST /{phone}/media`: a reply's file, as a form; its media id.
async fn upload(
    State(g): State<Arc<Graph>>,
    Path(phone): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, Json<Value>) {
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !keyed(&headers) || phone != PHONE_ID || !form {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "bad upload", "code": 100}})),
        );
    }
    let n = {
        let mut u = g.uploads.lock().unwrap();
        u.push(String::from_utf8_lossy(&body).into_owned());
        u.len()
    };
    (StatusCode::OK, Json(json!({"id": format!("55500{n}")})))
}

async fn messages(
    State(g): State<Arc<Graph>>,
    Path(phone): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {ACCESS_TOKEN}") || phone != PHONE_ID {
        return (
            StatusCode::UNAUTHORIZED,
            Json(
                json!({"error": {"message": "Invalid OAuth access token.", "type": "OAuthException", "code": 190}}),
            ),
        );
    }
    {
        let mut t = g.throttle.lock().unwrap();
        if *t > 0 {
            *t -= 1;
            *g.throttled.lock().unwrap() += 1;
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    json!({"error": {"message": "(#130429) Rate limit hit", "type": "OAuthException", "code": 130429}}),
                ),
            );
        }
    }
    let n = {
        let mut s = g.sent.lock().unwrap();
        s.push(body.clone());
        s.len()
    };
    (
        StatusCode::OK,
        Json(json!({"messaging_product": "whatsapp",
            "contacts": [{"input": body["to"], "wa_id": body["to"]}],
            "messages": [{"id": format!("wamid.OUT{n:08}")}]})),
    )
}

fn keyed(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {ACCESS_TOKEN}"))
}

/// `GET /{media-id}`: the media's short-lived URL, as the Graph API gives it.
async fn media_lookup(
    State(g): State<Arc<Graph>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if !keyed(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"code": 190}})),
        );
    }
    let origin = g.origin.lock().unwrap().clone();
    (
        StatusCode::OK,
        Json(
            json!({"messaging_product": "whatsapp", "id": id, "mime_type": "image/jpeg",
            "sha256": "00", "file_size": 21, "url": format!("{origin}/media/{id}?ext=1")}),
        ),
    )
}

/// The media URL: the bytes, to a request with the token.
async fn media(
    State(g): State<Arc<Graph>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> (StatusCode, Vec<u8>) {
    let ok = keyed(&headers);
    g.downloads.lock().unwrap().push((id, ok));
    if ok {
        (StatusCode::OK, b"a jpeg from whatsapp!".to_vec())
    } else {
        (StatusCode::UNAUTHORIZED, Vec::new())
    }
}

pub(crate) async fn graph() -> (String, Arc<Graph>) {
    let g = Arc::new(Graph::default());
    let app = Router::new()
        .route("/v21.0/{phone}/messages", post(messages))
        .route("/v21.0/{phone}/media", post(upload))
        .route("/v21.0/{id}", axum::routing::get(media_lookup))
        .route("/media/{id}", axum::routing::get(media))
        .with_state(g.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    *g.origin.lock().unwrap() = format!("http://{}", listener.local_addr().unwrap());
    let url = format!("http://{}/v21.0", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, g)
}

pub(crate) fn options(graph_url: &str, template: &str) -> HostOptions {
    HostOptions {
        model: json!({"rules": [{"reply": "hello from mercury"}]}),
        config: vec![
            ("adapters.whatsapp.enabled", Yaml::Bool(true)),
            (
                "adapters.whatsapp.graph_base_url",
                Yaml::String(graph_url.into()),
            ),
            (
                "adapters.whatsapp.phone_number_id",
                Yaml::String(PHONE_ID.into()),
            ),
            (
                "adapters.whatsapp.window_template",
                Yaml::String(template.into()),
            ),
            ("adapters.whatsapp.dm_policy", Yaml::String("open".into())),
        ],
        env: vec![
            ("MERCURY_WHATSAPP_ACCESS_TOKEN", ACCESS_TOKEN.to_string()),
            ("MERCURY_WHATSAPP_APP_SECRET", APP_SECRET.to_string()),
            ("MERCURY_WHATSAPP_VERIFY_TOKEN", VERIFY_TOKEN.to_string()),
        ],
        ..HostOptions::default()
    }
}

/// A notification of one text message, as the Cloud API sends it.
pub(crate) fn text_message(wamid: &str, from: &str, text: &str, sent_at_secs: u64) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
    "field": "messages",
    "value": {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
        "contacts": [{"profile": {"name": "Sheena Nelson"}, "wa_id": from}],
        "messages": [{"from": from, "id": wamid, "timestamp": sent_at_secs.to_string(),
            "type": "text", "text": {"body": text}}]
    }}]}]})
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub(crate) fn sign(body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(APP_SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!(
        "sha256={}",
        base16ct::lower::encode_string(&mac.finalize().into_bytes())
    )
}

/// POSTs `body` (raw bytes) to the webhook with `signature`: the status.
pub(crate) async fn post_raw(host: &TestHost, body: &[u8], signature: Option<&str>) -> u16 {
    let mut req = host
        .http
        .post(format!("{}/api/adapters/whatsapp/webhook", host.url))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(s) = signature {
        req = req.header("x-hub-signature-256", s);
    }
    req.send().await.unwrap().status().as_u16()
}

pub(crate) async fn post_signed(host: &TestHost, v: &Value) -> u16 {
    let body = serde_json::to_vec(v).unwrap();
    post_raw(host, &body, Some(&sign(&body))).await
}

async fn until(secs: u64, what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the adapter registered its webhook (the route answers 403, not 404, to a wrong token).
async fn until_subscribed(host: &TestHost) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = host
            .send(Method::GET, "/api/adapters/whatsapp/webhook?hub.mode=subscribe&hub.verify_token=x&hub.challenge=1", None, &[], None)
            .await;
        if status == 403 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the whatsapp adapter never registered ({status})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn whatsapp_dm_is_answered_once_and_the_handshake_echoes_the_challenge() {
    let (url, g) = graph().await;
    let host = TestHost::start_process(options(&url, "")).await;
    until_subscribed(&host).await;
    let challenge = host
        .http
        .get(format!(
            "{}/api/adapters/whatsapp/webhook?hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=1158201444",
            host.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(challenge.status().as_u16(), 200);
    assert_eq!(challenge.text().await.unwrap(), "1158201444");

    let note = text_message(
        "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTdCOEQ5",
        "15551234567",
        "hi there",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &note).await, 200);
    until(60, "the reply", || !g.sent.lock().unwrap().is_empty()).await;
    // Meta redelivers a notification it is unsure of: the same wamid is not answered again.
    assert_eq!(post_signed(&host, &note).await, 200);
    let second = text_message(
        "wamid.SECONDMESSAGE00001",
        "15551234567",
        "and again",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &second).await, 200);
    until(60, "the second reply", || g.sent.lock().unwrap().len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = g.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "one reply per message: {sent:?}");
    assert_eq!(sent[0]["to"], json!("15551234567"));
    assert_eq!(sent[0]["type"], json!("text"));
    assert_eq!(sent[0]["text"]["body"], json!("hello from mercury"));
    assert_eq!(
        sent[0]["context"]["message_id"],
        json!("wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTdCOEQ5")
    );
    assert_eq!(
        sent[1]["context"]["message_id"],
        json!("wamid.SECONDMESSAGE00001")
    );
    host.stop().await;
}

#[tokio::test]
async fn whatsapp_bad_signature_is_refused_before_the_body_is_parsed() {
    let (url, g) = graph().await;
    let host = TestHost::start_process(options(&url, "")).await;
    until_subscribed(&host).await;
    let note = serde_json::to_vec(&text_message(
        "wamid.FORGED0000000001",
        "15550001111",
        "forged",
        now_secs(),
    ))
    .unwrap();
    // No header, a signature of other bytes, another key's signature, garbage.
    assert_eq!(post_raw(&host, &note, None).await, 401);
    assert_eq!(
        post_raw(&host, &note, Some(&sign(b"something else"))).await,
        401
    );
    let mut other = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"not the app secret").unwrap();
    other.update(&note);
    let other = format!(
        "sha256={}",
        base16ct::lower::encode_string(&other.finalize().into_bytes())
    );
    assert_eq!(post_raw(&host, &note, Some(&other)).await, 401);
    assert_eq!(post_raw(&host, &note, Some("sha256=zz")).await, 401);
    // A body that is not even JSON gets the same 401 (not a 400): it was never parsed.
    assert_eq!(post_raw(&host, b"{not json", Some("sha256=00")).await, 401);
    // Signed, the same bytes that are not JSON are parsed, and refused as such.
    assert_eq!(
        post_raw(&host, b"{not json", Some(&sign(b"{not json"))).await,
        400
    );
    // The forged message was never stored: the host answers nothing.
    let good = text_message(
        "wamid.GENUINE000000001",
        "15550001111",
        "genuine",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &good).await, 200);
    until(60, "the genuine reply", || {
        !g.sent.lock().unwrap().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = g.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0]["context"]["message_id"],
        json!("wamid.GENUINE000000001")
    );
    host.stop().await;
}

#[tokio::test]
async fn whatsapp_restart_does_not_repeat_a_reply() {
    let (url, g) = graph().await;
    let mut host = TestHost::start_process(options(&url, "")).await;
    until_subscribed(&host).await;
    let note = text_message(
        "wamid.RESTART0000000001",
        "15559876543",
        "before the crash",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &note).await, 200);
    until(60, "the reply", || !g.sent.lock().unwrap().is_empty()).await;
    // Killed once the reply is marked delivered: a kill between the POST
    // and its mark resends (delivery is at least once, docs/adapters.md),
    // which is not what this test is about. PostgreSQL's slower mark made
    // that window reachable here.
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.kill();
    host.restart_process().await;
    until_subscribed(&host).await;
    // Meta redelivers what it never saw answered; then a new message comes.
    assert_eq!(post_signed(&host, &note).await, 200);
    let next = text_message(
        "wamid.RESTART0000000002",
        "15559876543",
        "after the crash",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &next).await, 200);
    until(60, "the reply after the restart", || {
        g.sent.lock().unwrap().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = g.sent.lock().unwrap().clone();
    let answered: Vec<&Value> = sent.iter().map(|s| &s["context"]["message_id"]).collect();
    assert_eq!(
        answered,
        vec![
            &json!("wamid.RESTART0000000001"),
            &json!("wamid.RESTART0000000002")
        ],
        "each message answered once across the restart"
    );
    host.stop().await;
}

#[tokio::test]
async fn whatsapp_reply_outside_the_24_hour_window_sends_only_the_template() {
    let (url, g) = graph().await;
    // Meta's throughput limit on the first send is waited out, not a failure.
    *g.throttle.lock().unwrap() = 1;
    let host = TestHost::start_process(options(&url, "reopen_conversation")).await;
    until_subscribed(&host).await;
    // A message written 25 hours ago (delivered late): the window has closed.
    let old = text_message(
        "wamid.LATE00000000000001",
        "15557654321",
        "are you there?",
        now_secs() - 25 * 3600,
    );
    assert_eq!(post_signed(&host, &old).await, 200);
    until(60, "the template", || !g.sent.lock().unwrap().is_empty()).await;
    // The operator is told, on the board.
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let (_, h) = host.send(Method::GET, "/healthz", None, &[], None).await;
        if h["adapters"]["whatsapp"]["last_error"].is_string() {
            break h;
        }
        assert!(Instant::now() < deadline, "the operator was not told: {h}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let told = health["adapters"]["whatsapp"]["last_error"]
        .as_str()
        .unwrap();
    assert!(
        told.contains("24-hour") && told.contains("reopen_conversation"),
        "{told}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = g.sent.lock().unwrap().clone();
    assert_eq!(
        sent.len(),
        1,
        "the template once, the reply never: {sent:?}"
    );
    assert_eq!(sent[0]["type"], json!("template"));
    assert_eq!(sent[0]["template"]["name"], json!("reopen_conversation"));
    assert!(sent[0].get("text").is_none());
    assert_eq!(*g.throttled.lock().unwrap(), 1);
    // A message inside the window is answered with text again.
    let fresh = text_message(
        "wamid.FRESH0000000000001",
        "15557654321",
        "hello?",
        now_secs(),
    );
    assert_eq!(post_signed(&host, &fresh).await, 200);
    until(60, "the text reply", || g.sent.lock().unwrap().len() >= 2).await;
    assert_eq!(g.sent.lock().unwrap()[1]["type"], json!("text"));
    host.stop().await;
}

#[tokio::test]
async fn whatsapp_a_picture_is_fetched_through_its_media_id_with_the_token() {
    let (url, g) = graph().await;
    let origin = g.origin.lock().unwrap().clone();
    let mut opts = options(&url, "");
    opts.model = json!({"rules": [{"match": "saved as (inbox/\\S+)\\]", "reply": "kept $1"}]});
    opts.config.push((
        "adapters.whatsapp.media_origins",
        Yaml::Sequence(vec![Yaml::from(origin)]),
    ));
    let host = TestHost::start_process(opts).await;
    until_subscribed(&host).await;
    let note = json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
    "field": "messages",
    "value": {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
        "contacts": [{"profile": {"name": "Sheena Nelson"}, "wa_id": "16315551181"}],
        "messages": [{"from": "16315551181", "id": "wamid.IMG1", "timestamp": now_secs().to_string(),
            "type": "image", "image": {"caption": "look", "mime_type": "image/jpeg", "sha256": "00", "id": "987654321"}}]
    }}]}]});
    assert_eq!(post_signed(&host, &note).await, 200);
    until(60, "the reply", || !g.sent.lock().unwrap().is_empty()).await;
    let sent = g.sent.lock().unwrap()[0].clone();
    let said = sent["text"]["body"].as_str().unwrap();
    assert!(
        said.starts_with("kept inbox/") && said.ends_with("-1.jpg"),
        "{sent}"
    );
    assert_eq!(
        *g.downloads.lock().unwrap(),
        vec![("987654321".to_owned(), true)]
    );
    host.stop().await;
}

#[tokio::test]
async fn whatsapp_a_file_the_turn_writes_under_outbox_is_uploaded_then_sent_by_its_id() {
    let (url, g) = graph().await;
    let mut opts = options(&url, "");
    opts.model = json!({"rules": [
        {"match": "tool_result\\(write_file\\)", "reply": "here they are"},
        {"match": "send the files", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "outbox/plan.txt", "content": "step one"}},
            {"name": "write_file", "arguments": {"path": "outbox/photo.png", "content": "pretend pixels"}}
        ]}
    ]});
    let host = TestHost::start_process(opts).await;
    until_subscribed(&host).await;
    let m = text_message("wamid.FILES1", "16315551181", "send the files", now_secs());
    assert_eq!(post_signed(&host, &m).await, 200);
    until(60, "the reply and both files", || {
        g.sent.lock().unwrap().len() >= 3
    })
    .await;
    let sent = g.sent.lock().unwrap().clone();
    assert_eq!(sent[0]["text"]["body"], "here they are", "{sent:?}");
    let uploads = g.uploads.lock().unwrap().clone();
    assert_eq!(uploads.len(), 2, "{uploads:?}");
    // In path order: outbox/photo.png, then outbox/plan.txt.
    assert!(
        uploads[1].contains("name=\"messaging_product\"\r\n\r\nwhatsapp\r\n")
            && uploads[1]
                .contains("filename=\"plan.txt\"\r\nContent-Type: text/plain\r\n\r\nstep one\r\n"),
        "{}",
        uploads[1]
    );
    assert!(
        uploads[0].contains("name=\"type\"\r\n\r\nimage/png\r\n"),
        "{}",
        uploads[0]
    );
    // Each is sent by the id its upload answered: a picture as one, a document by name.
    assert_eq!(sent[1]["type"], "image", "{sent:?}");
    assert_eq!(sent[1]["image"], json!({"id": "555001"}));
    assert_eq!(sent[2]["type"], "document", "{sent:?}");
    assert_eq!(
        sent[2]["document"],
        json!({"id": "555002", "filename": "plan.txt"})
    );
    assert!(sent[1..].iter().all(|v| v["to"] == "16315551181"));
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.stop().await;
}
