//! The adapter seam (issue 30): "echo", a platform that exists only as one
//! registry line and its own folder (`src/adapters/echo`, `test-hooks`
//! builds only), is configured, started, answered, shown on `/healthz` and
//! `/metrics`, and held to its own `dm_policy`, like Telegram and Discord,
//! by a real host (child process) talking to a fake of its wire format on a
//! loopback port.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

const TOKEN: &str = "echo-secret-token";

#[derive(Default)]
struct Fake {
    updates: Mutex<Vec<Value>>,
    sent: Mutex<Vec<Value>>,
    unauthorised: Mutex<u32>,
}

fn authorised(st: &Fake, headers: &HeaderMap) -> bool {
    let ok = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"));
    if !ok {
        *st.unauthorised.lock().unwrap() += 1;
    }
    ok
}

async fn updates(
    State(st): State<Arc<Fake>>,
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    if !authorised(&st, &headers) {
        return (StatusCode::UNAUTHORIZED, Json(json!([])));
    }
    let after: i64 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let out: Vec<Value> = st
        .updates
        .lock()
        .unwrap()
        .iter()
        .filter(|u| u["id"].as_i64().unwrap() > after)
        .cloned()
        .collect();
    (StatusCode::OK, Json(Value::Array(out)))
}

async fn send(
    State(st): State<Arc<Fake>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    if !authorised(&st, &headers) {
        return StatusCode::UNAUTHORIZED;
    }
    st.sent.lock().unwrap().push(body);
    StatusCode::OK
}

async fn fake() -> (String, Arc<Fake>) {
    let st = Arc::new(Fake::default());
    let app = Router::new()
        .route("/updates", get(updates))
        .route("/send", post(send))
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, st)
}

async fn until(secs: u64, what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn options(url: &str, dm_policy: &str) -> HostOptions {
    HostOptions {
        model: json!({"rules": [{"reply": "echoed"}]}),
        config: vec![
            ("adapters.echo.enabled", Yaml::Bool(true)),
            ("adapters.echo.base_url", Yaml::String(url.to_owned())),
            ("adapters.echo.dm_policy", Yaml::String(dm_policy.into())),
        ],
        env: vec![("MERCURY_ECHO_TOKEN", TOKEN.to_string())],
        ..HostOptions::default()
    }
}

#[tokio::test]
async fn a_platform_added_only_through_the_registry_is_started_answered_and_shown() {
    let (url, st) = fake().await;
    // Its secret is required like any platform's: no start without it.
    let refused =
        crate::common::serve_refused_without(&options(&url, "open"), "MERCURY_ECHO_TOKEN").await;
    assert!(
        refused.contains("the echo adapter is enabled but MERCURY_ECHO_TOKEN is not set"),
        "{refused}"
    );
    let host = TestHost::start_process(options(&url, "open")).await;
    st.updates
        .lock()
        .unwrap()
        .push(json!({"id": 1, "chat": "room-7", "from": "u-42", "text": "hello echo"}));
    until(60, "the reply", || !st.sent.lock().unwrap().is_empty()).await;
    let sent = st.sent.lock().unwrap().clone();
    assert_eq!(sent[0]["chat"], json!("room-7"));
    assert_eq!(sent[0]["text"], json!("echoed"));
    assert_eq!(sent[0]["reply_to"], json!("1"));
    assert_eq!(*st.unauthorised.lock().unwrap(), 0);

    let (status, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(
        health["adapters"]["echo"]["mode"],
        json!("polling"),
        "{health}"
    );
    assert_eq!(
        health["adapters"]["echo"]["connected"],
        json!(true),
        "{health}"
    );
    let metrics = host
        .http
        .get(format!("{}/metrics", host.url))
        .bearer_auth(&host.owner_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("adapter=\"echo\""),
        "the gauge follows the registry: {metrics}"
    );
    // Answered once: a second look at the same update does not repeat it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(st.sent.lock().unwrap().len(), 1);
    host.stop().await;
}

#[tokio::test]
async fn the_sender_policy_reads_the_registered_platforms_own_dm_policy() {
    let (url, st) = fake().await;
    let host = TestHost::start_process(options(&url, "allowlist")).await;
    st.updates
        .lock()
        .unwrap()
        .push(json!({"id": 1, "chat": "room-8", "from": "stranger", "text": "let me in"}));
    // Once the board shows the update stored, the policy has decided it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, h) = host.send(Method::GET, "/healthz", None, &[], None).await;
        if h["adapters"]["echo"]["last_update_at"].is_number() {
            break;
        }
        assert!(Instant::now() < deadline, "the update was never read: {h}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Under `ingress.dm_policy` (pairing, the default) a request would be
    // open now, in the same transaction; echo's own `allowlist` opens none.
    let (status, pairings) = host
        .send(
            Method::GET,
            "/api/pairings",
            Some(&host.owner_token),
            &[],
            None,
        )
        .await;
    assert_eq!(status, 200, "{pairings}");
    assert!(
        !pairings.to_string().contains("echo"),
        "allowlist opens no pairing request: {pairings}"
    );
    assert!(st.sent.lock().unwrap().is_empty());
    host.stop().await;
}
