//! The Discord adapter end to end: a real host (child process, real SQLite
//! file) against a fake Discord on loopback ports that speaks Discord's wire
//! format: a gateway over a real WebSocket (opcodes Hello 10, Identify 2,
//! Heartbeat 1 / ACK 11, Resume 6, Invalid Session 9, dispatches READY,
//! RESUMED and MESSAGE_CREATE with their sequence numbers, replay after a
//! resume) and the REST calls the adapter makes (`GET /users/@me`,
//! `POST /channels/{id}/messages`, `POST /channels/{id}/typing`, with
//! `X-RateLimit-*` headers and 429 bodies).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_websockets::{Message as WsMessage, ServerBuilder};

use crate::common::{HostOptions, TestHost};

pub(crate) const TOKEN: &str = "MTAxMDEw.discord-test_token";
pub(crate) const BOT_ID: &str = "900000000000000001";
/// GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT.
const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);

/// One REST call the fake received.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub route: String,
    pub body: Value,
    pub at: Instant,
    pub status: u16,
}

#[derive(Default)]
struct Gateway {
    /// Every MESSAGE_CREATE dispatch, with its sequence.
    events: Vec<(u64, Value)>,
    last_seq: u64,
    session: Option<String>,
    sessions: u32,
    identifies: Vec<Value>,
    resumes: Vec<Value>,
    /// Bumped to drop every open connection.
    epoch: u64,
    /// While set, a connection is refused before its handshake.
    down: bool,
    /// READY payloads sent.
    readies: u32,
    /// The message ids a resume's replay delivered.
    replayed: Vec<String>,
}

#[derive(Default)]
struct FakeState {
    gw: Mutex<Gateway>,
    changed: Notify,
    calls: Mutex<Vec<Call>>,
    /// Message sends still to be answered with a global 429.
    global_429: Mutex<u32>,
    /// Each successful send says its route has no calls left for this long.
    route_reset_after: Mutex<Option<f64>>,
    sent: Mutex<u64>,
    gateway_url: Mutex<String>,
    /// The content each sent message shows now (edits change it).
    texts: Mutex<BTreeMap<String, String>>,
    /// Attachment downloads served, by path.
    downloads: Mutex<Vec<String>>,
}

#[derive(Clone)]
pub(crate) struct FakeDiscord {
    pub rest_url: String,
    pub gateway_url: String,
    state: Arc<FakeState>,
}

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bot {TOKEN}"))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"message": "401: Unauthorized", "code": 0})),
    )
        .into_response()
}

fn record(st: &FakeState, route: String, body: Value, status: StatusCode) {
    st.calls.lock().unwrap().push(Call {
        route,
        body,
        at: Instant::now(),
        status: status.as_u16(),
    });
}

async fn me(State(st): State<Arc<FakeState>>, h: HeaderMap) -> Response {
    let ok = authorized(&h);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    };
    record(&st, "GET /users/@me".into(), Value::Null, status);
    if !ok {
        return unauthorized();
    }
    Json(
        json!({"id": BOT_ID, "username": "mercury", "discriminator": "0",
        "global_name": null, "avatar": null, "bot": true, "mfa_enabled": false,
        "flags": 0, "public_flags": 0}),
    )
    .into_response()
}

async fn typing(
    State(st): State<Arc<FakeState>>,
    Path(channel): Path<String>,
    h: HeaderMap,
) -> Response {
    let status = if authorized(&h) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::UNAUTHORIZED
    };
    record(
        &st,
        format!("POST /channels/{channel}/typing"),
        Value::Null,
        status,
    );
    status.into_response()
}

async fn create_message(
    State(st): State<Arc<FakeState>>,
    Path(channel): Path<String>,
    h: HeaderMap,
    raw: axum::body::Bytes,
) -> Response {
    let route = format!("POST /channels/{channel}/messages");
    // A message with a file is a form: kept whole, as text, to assert on.
    let multipart = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let body = if multipart {
        json!({"multipart": String::from_utf8_lossy(&raw)})
    } else {
        match serde_json::from_slice::<Value>(&raw) {
            Ok(v) => v,
            Err(_) => return StatusCode::BAD_REQUEST.into_response(),
        }
    };
    if !authorized(&h) {
        record(&st, route, body, StatusCode::UNAUTHORIZED);
        return unauthorized();
    }
    {
        let mut g = st.global_429.lock().unwrap();
        if *g > 0 {
            *g -= 1;
            record(&st, route, body, StatusCode::TOO_MANY_REQUESTS);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    ("retry-after", "1"),
                    ("x-ratelimit-global", "true"),
                    ("x-ratelimit-scope", "global"),
                ],
                Json(json!({"message": "You are being rate limited.",
                    "retry_after": 0.6, "global": true})),
            )
                .into_response();
        }
    }
    let id = {
        let mut n = st.sent.lock().unwrap();
        *n += 1;
        format!("{}", 800_000_000_000_000_000u64 + *n)
    };
    record(&st, route, body.clone(), StatusCode::OK);
    st.texts.lock().unwrap().insert(
        id.clone(),
        body["content"].as_str().unwrap_or("").to_owned(),
    );
    let mut sent = message(
        &id,
        &channel,
        None,
        BOT_ID,
        body["content"].as_str().unwrap_or(""),
    );
    sent["author"]["bot"] = json!(true);
    // Discord tells the gateway about the bot's own message too.
    push_dispatch(&st, sent.clone());
    let reset = *st.route_reset_after.lock().unwrap();
    let (remaining, reset_after) = match reset {
        Some(r) => ("0".to_string(), format!("{r}")),
        None => ("4".to_string(), "1".to_string()),
    };
    let headers = [
        ("x-ratelimit-limit", "5".to_string()),
        ("x-ratelimit-remaining", remaining),
        ("x-ratelimit-reset-after", reset_after),
        ("x-ratelimit-bucket", "f4k3bucket".to_string()),
    ];
    let mut res = Json(sent).into_response();
    for (k, v) in headers {
        res.headers_mut().insert(k, v.parse().unwrap());
    }
    res
}

/// `PATCH /channels/{id}/messages/{message}`: an edit of a sent message;
/// 404 Unknown Message for one this fake never sent.
async fn edit_message(
    State(st): State<Arc<FakeState>>,
    Path((channel, id)): Path<(String, String)>,
    h: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let route = format!("PATCH /channels/{channel}/messages/{id}");
    if !authorized(&h) {
        record(&st, route, body, StatusCode::UNAUTHORIZED);
        return unauthorized();
    }
    let content = body["content"].as_str().unwrap_or("").to_owned();
    let known = st.texts.lock().unwrap().contains_key(&id);
    if !known {
        record(&st, route, body, StatusCode::NOT_FOUND);
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "Unknown Message", "code": 10008})),
        )
            .into_response();
    }
    st.texts.lock().unwrap().insert(id.clone(), content.clone());
    record(&st, route, body, StatusCode::OK);
    let mut edited = message(&id, &channel, None, BOT_ID, &content);
    edited["edited_timestamp"] = json!("2026-12-01T10:00:01.000000+00:00");
    Json(edited).into_response()
}

/// `GET /attachments/{path}`: an attachment's bytes, as Discord's CDN
/// serves them (a fixed text of 100 bytes).
async fn attachment(State(st): State<Arc<FakeState>>, Path(path): Path<String>) -> Vec<u8> {
    st.downloads.lock().unwrap().push(path);
    vec![b'x'; 100]
}

/// `GET /channels/{id}/messages?after=&limit=`: newest first, from the
/// dispatch log, without `guild_id` (REST message objects carry none).
async fn list_messages(
    State(st): State<Arc<FakeState>>,
    Path(channel): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    h: HeaderMap,
) -> Response {
    let route = format!("GET /channels/{channel}/messages");
    if !authorized(&h) {
        record(&st, route, Value::Null, StatusCode::UNAUTHORIZED);
        return unauthorized();
    }
    let after: u64 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(50);
    let mut out: Vec<Value> = st
        .gw
        .lock()
        .unwrap()
        .events
        .iter()
        .map(|(_, e)| e["d"].clone())
        .filter(|d| d["channel_id"] == channel.as_str())
        .filter(|d| {
            d["id"]
                .as_str()
                .and_then(|i| i.parse::<u64>().ok())
                .unwrap_or(0)
                > after
        })
        .collect();
    out.reverse();
    out.truncate(limit);
    for d in &mut out {
        if let Some(o) = d.as_object_mut() {
            o.remove("guild_id");
            o.remove("member");
        }
    }
    record(&st, route, json!({"after": after}), StatusCode::OK);
    Json(Value::Array(out)).into_response()
}

/// Appends a MESSAGE_CREATE to the session's log; a connected client gets
/// it at once, a resuming one in the replay.
fn push_dispatch(st: &FakeState, d: Value) -> u64 {
    let seq = {
        let mut g = st.gw.lock().unwrap();
        g.last_seq += 1;
        let seq = g.last_seq;
        g.events.push((
            seq,
            json!({"op": 0, "t": "MESSAGE_CREATE", "s": seq, "d": d}),
        ));
        seq
    };
    st.changed.notify_waiters();
    seq
}

fn dispatch(st: &FakeState, t: &str, d: Value) -> String {
    let mut g = st.gw.lock().unwrap();
    g.last_seq += 1;
    json!({"op": 0, "t": t, "s": g.last_seq, "d": d}).to_string()
}

async fn connection(st: Arc<FakeState>, tcp: tokio::net::TcpStream) {
    if st.gw.lock().unwrap().down {
        return;
    }
    let Ok((_req, mut ws)) = ServerBuilder::new().accept(tcp).await else {
        return;
    };
    let epoch = st.gw.lock().unwrap().epoch;
    let hello = json!({"op": 10, "d": {"heartbeat_interval": 5000}, "s": null, "t": null});
    if ws.send(WsMessage::text(hello.to_string())).await.is_err() {
        return;
    }
    // The last sequence this connection has delivered; None until identified.
    let mut cursor: Option<u64> = None;
    loop {
        if st.gw.lock().unwrap().epoch != epoch {
            // Dropped without a close frame, as a broken connection is.
            return;
        }
        if let Some(c) = cursor {
            let due: Vec<(u64, Value)> = st
                .gw
                .lock()
                .unwrap()
                .events
                .iter()
                .filter(|(s, _)| *s > c)
                .cloned()
                .collect();
            for (s, e) in due {
                if ws.send(WsMessage::text(e.to_string())).await.is_err() {
                    return;
                }
                cursor = Some(s);
            }
        }
        let changed = st.changed.notified();
        let incoming = tokio::select! {
            m = ws.next() => m,
            _ = changed => continue,
            _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
        };
        let Some(Ok(m)) = incoming else { return };
        let Some(text) = m.as_text() else {
            if m.is_close() {
                return;
            }
            continue;
        };
        let p: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let token_ok = |d: &Value| {
            let t = d["token"].as_str().unwrap_or("");
            t == TOKEN || t == format!("Bot {TOKEN}")
        };
        match p["op"].as_u64() {
            Some(1) => {
                let ack = json!({"op": 11, "d": null, "s": null, "t": null});
                if ws.send(WsMessage::text(ack.to_string())).await.is_err() {
                    return;
                }
            }
            Some(2) => {
                st.gw.lock().unwrap().identifies.push(p["d"].clone());
                if !token_ok(&p["d"]) {
                    let _ = ws
                        .send(WsMessage::close(
                            Some(tokio_websockets::CloseCode::try_from(4004).unwrap()),
                            "Authentication failed.",
                        ))
                        .await;
                    return;
                }
                let session = {
                    let mut g = st.gw.lock().unwrap();
                    g.sessions += 1;
                    let s = format!("fake-session-{}", g.sessions);
                    g.session = Some(s.clone());
                    s
                };
                let url = st.gateway_url.lock().unwrap().clone();
                let ready = dispatch(
                    &st,
                    "READY",
                    json!({"v": 10, "user": {"id": BOT_ID, "username": "mercury",
                        "discriminator": "0", "avatar": null, "bot": true, "mfa_enabled": false},
                        "guilds": [], "session_id": session, "resume_gateway_url": url,
                        "application": {"id": "900000000000000002", "flags": 0}}),
                );
                // A new session gets what happens from now on.
                cursor = Some(st.gw.lock().unwrap().last_seq);
                if ws.send(WsMessage::text(ready)).await.is_err() {
                    return;
                }
                st.gw.lock().unwrap().readies += 1;
            }
            Some(6) => {
                let d = p["d"].clone();
                st.gw.lock().unwrap().resumes.push(d.clone());
                let known = st.gw.lock().unwrap().session.clone();
                if token_ok(&d) && known.as_deref() == d["session_id"].as_str() {
                    let from = d["seq"].as_u64().unwrap_or(0);
                    let replay: Vec<(u64, Value)> = st
                        .gw
                        .lock()
                        .unwrap()
                        .events
                        .iter()
                        .filter(|(s, _)| *s > from)
                        .cloned()
                        .collect();
                    cursor = Some(from);
                    for (s, e) in replay {
                        if ws.send(WsMessage::text(e.to_string())).await.is_err() {
                            return;
                        }
                        if let Some(id) = e["d"]["id"].as_str() {
                            st.gw.lock().unwrap().replayed.push(id.to_owned());
                        }
                        cursor = Some(s);
                    }
                    let resumed = dispatch(&st, "RESUMED", json!({}));
                    if ws.send(WsMessage::text(resumed)).await.is_err() {
                        return;
                    }
                } else {
                    let invalid = json!({"op": 9, "d": false, "s": null, "t": null});
                    let _ = ws.send(WsMessage::text(invalid.to_string())).await;
                }
            }
            _ => {}
        }
    }
}

impl FakeDiscord {
    pub(crate) async fn start() -> FakeDiscord {
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .route("/api/v10/users/@me", get(me))
            .route(
                "/api/v10/channels/{id}/messages",
                post(create_message).get(list_messages),
            )
            .route("/api/v10/channels/{id}/typing", post(typing))
            .route(
                "/api/v10/channels/{id}/messages/{message}",
                axum::routing::patch(edit_message),
            )
            .route("/attachments/{*path}", get(attachment))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let rest_url = format!("http://{}/api/v10", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let gw = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_url = format!("ws://{}", gw.local_addr().unwrap());
        *state.gateway_url.lock().unwrap() = gateway_url.clone();
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = gw.accept().await {
                tokio::spawn(connection(st.clone(), tcp));
            }
        });
        FakeDiscord {
            rest_url,
            gateway_url,
            state,
        }
    }

    pub(crate) fn push(&self, d: Value) -> u64 {
        push_dispatch(&self.state, d)
    }

    /// Breaks every open gateway connection (no close frame) and refuses
    /// new ones until [`FakeDiscord::restore_gateway`].
    pub(crate) fn drop_gateway(&self) {
        {
            let mut g = self.state.gw.lock().unwrap();
            g.epoch += 1;
            g.down = true;
        }
        self.state.changed.notify_waiters();
    }

    /// Discord forgets the session: a resume gets Invalid Session.
    pub(crate) fn forget_session(&self) {
        self.state.gw.lock().unwrap().session = None;
    }

    pub(crate) fn restore_gateway(&self) {
        self.state.gw.lock().unwrap().down = false;
    }

    pub(crate) fn replayed(&self) -> Vec<String> {
        self.state.gw.lock().unwrap().replayed.clone()
    }

    pub(crate) fn identifies(&self) -> Vec<Value> {
        self.state.gw.lock().unwrap().identifies.clone()
    }

    pub(crate) fn resumes(&self) -> Vec<Value> {
        self.state.gw.lock().unwrap().resumes.clone()
    }

    pub(crate) fn seq_of(&self, message_id: &str) -> u64 {
        self.state
            .gw
            .lock()
            .unwrap()
            .events
            .iter()
            .find(|(_, e)| e["d"]["id"] == message_id)
            .map(|(s, _)| *s)
            .unwrap()
    }

    pub(crate) fn global_429_next_sends(&self, n: u32) {
        *self.state.global_429.lock().unwrap() = n;
    }

    pub(crate) fn exhaust_routes_for(&self, secs: f64) {
        *self.state.route_reset_after.lock().unwrap() = Some(secs);
    }

    pub(crate) fn calls(&self, suffix: &str) -> Vec<Call> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.route.ends_with(suffix))
            .cloned()
            .collect()
    }

    /// Successful message sends, by the message id they reply to ("" if none).
    pub(crate) fn replies(&self) -> BTreeMap<String, Vec<Call>> {
        let mut out: BTreeMap<String, Vec<Call>> = BTreeMap::new();
        for c in self.calls("/messages") {
            if c.status == 200 && c.route.starts_with("POST ") {
                let to = c.body["message_reference"]["message_id"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                out.entry(to).or_default().push(c);
            }
        }
        out
    }

    /// The content message `id` shows now.
    pub(crate) fn text_of(&self, id: &str) -> Option<String> {
        self.state.texts.lock().unwrap().get(id).cloned()
    }

    pub(crate) async fn until(&self, secs: u64, what: &str, f: impl Fn(&FakeDiscord) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `n` sessions got their READY: what is pushed from then on
    /// is theirs.
    pub(crate) async fn until_identified(&self, n: u32) {
        self.until(60, "a READY", |f| f.state.gw.lock().unwrap().readies >= n)
            .await;
    }
}

/// A message object as Discord's documentation shows it.
pub(crate) fn message(
    id: &str,
    channel: &str,
    guild: Option<&str>,
    author: &str,
    content: &str,
) -> Value {
    let mut m = json!({"id": id, "channel_id": channel,
        "author": {"id": author, "username": format!("user{author}"), "discriminator": "0",
            "global_name": "A User", "avatar": null},
        "content": content, "timestamp": "2026-12-01T10:00:00.000000+00:00",
        "edited_timestamp": null, "tts": false, "mention_everyone": false,
        "mentions": [], "mention_roles": [], "attachments": [], "embeds": [],
        "pinned": false, "type": 0});
    if let Some(g) = guild {
        m["guild_id"] = json!(g);
        m["member"] = json!({"roles": [], "joined_at": "2026-01-01T00:00:00.000000+00:00",
            "deaf": false, "mute": false, "nick": null});
    }
    m
}

fn dm(id: u64, from: u64, text: &str) -> Value {
    message(
        &id.to_string(),
        &format!("{}", 700_000_000_000_000_000u64 + from),
        None,
        &from.to_string(),
        text,
    )
}

pub(crate) fn host_options(
    fake: &FakeDiscord,
    model: Value,
    extra: Vec<(&'static str, serde_yaml_ng::Value)>,
) -> HostOptions {
    use serde_yaml_ng::Value as Yaml;
    let mut config = vec![
        ("adapters.discord.enabled", Yaml::Bool(true)),
        // The adapter's tests talk as strangers to an open bot; the sender
        // policy's own tests set `pairing` back in `extra`.
        ("adapters.discord.dm_policy", Yaml::String("open".into())),
        (
            "adapters.discord.api_base_url",
            Yaml::String(fake.rest_url.clone()),
        ),
        (
            "adapters.discord.gateway_url",
            Yaml::String(fake.gateway_url.clone()),
        ),
    ];
    config.extend(extra);
    HostOptions {
        model,
        config,
        env: vec![("MERCURY_DISCORD_BOT_TOKEN", TOKEN.to_string())],
        ..HostOptions::default()
    }
}

/// A fake Discord and a host whose scripted model always answers `reply`,
/// once the host's session has its READY.
async fn connected_host(reply: &str) -> (FakeDiscord, TestHost) {
    let fake = FakeDiscord::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": reply}]}),
        vec![],
    ))
    .await;
    fake.until_identified(1).await;
    (fake, host)
}

const DISCORD_ROWS: &str = "SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'discord:%'";

#[tokio::test]
async fn discord_dm_and_guild_mentions_get_threaded_replies() {
    let (fake, host) = connected_host("pong").await;
    let identify = fake.identifies().remove(0);
    assert_eq!(identify["intents"], json!(INTENTS), "{identify}");
    let (guild, channel) = ("600000000000000001", "610000000000000001");
    fake.push(dm(1001, 42, "hello there"));
    fake.push(message(
        "1002",
        channel,
        Some(guild),
        "43",
        "just chatting among ourselves",
    ));
    let mut mention = message(
        "1003",
        channel,
        Some(guild),
        "43",
        &format!("ping <@{BOT_ID}>"),
    );
    mention["mentions"] = json!([{"id": BOT_ID, "username": "mercury", "discriminator": "0",
        "avatar": null, "bot": true}]);
    fake.push(mention);
    // The legacy nickname form, in the text only.
    fake.push(message(
        "1004",
        channel,
        Some(guild),
        "44",
        &format!("<@!{BOT_ID}> status?"),
    ));
    let mut reply = message("1005", channel, Some(guild), "44", "thanks!");
    reply["type"] = json!(19);
    reply["message_reference"] = json!({"message_id": "800000000000000001", "channel_id": channel});
    reply["referenced_message"] =
        message("800000000000000001", channel, Some(guild), BOT_ID, "pong");
    fake.push(reply);
    let mut other_bot = message(
        "1006",
        channel,
        Some(guild),
        "45",
        &format!("<@{BOT_ID}> beep"),
    );
    other_bot["author"]["bot"] = json!(true);
    fake.push(other_bot);
    let mut join = message("1007", channel, Some(guild), "46", "");
    join["type"] = json!(7);
    fake.push(join);

    fake.until(60, "four replies", |f| {
        ["1001", "1003", "1004", "1005"]
            .iter()
            .all(|id| f.replies().contains_key(*id))
    })
    .await;
    let replies = fake.replies();
    assert_eq!(
        replies.keys().cloned().collect::<Vec<_>>(),
        vec!["1001", "1003", "1004", "1005"],
        "the DM, both mentions and the reply to the bot are answered; the ambient line, \
         the other bot and the join are not: {replies:?}"
    );
    assert!(replies["1001"][0]
        .route
        .contains("/channels/700000000000000042/"));
    for id in ["1003", "1004", "1005"] {
        let c = &replies[id][0];
        assert_eq!(c.route, format!("POST /channels/{channel}/messages"));
        assert_eq!(c.body["content"], "pong");
        // What the agent writes pings nobody.
        assert_eq!(c.body["allowed_mentions"]["parse"], json!([]), "{c:?}");
    }
    assert!(
        fake.calls("/typing")
            .iter()
            .any(|c| c.route.contains("700000000000000042") && c.status == 204),
        "typing while the DM's turn ran"
    );
    // Stored in the platform namespace: the DM, the ambient line, two
    // mentions and the reply; the bot's own echoed replies are not rows.
    assert_eq!(host.count(DISCORD_ROWS), 5);
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id = 'discord:42'"),
        1
    );
    assert_eq!(
        host.count(
            "SELECT COUNT(*) FROM messages WHERE role = 'ambient' AND platform_message_id = '1002'"
        ),
        1
    );
    assert_eq!(
        host.count(&format!(
            "SELECT COUNT(*) FROM messages WHERE platform_message_id = '1003' AND text LIKE '%@mercury%' AND text NOT LIKE '%{BOT_ID}%'"
        )),
        1,
        "the model reads @mercury, not the bot's snowflake"
    );
    let (st, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(st, 200);
    let dc = &health["adapters"]["discord"];
    assert_eq!(dc["mode"], "gateway", "{health}");
    assert_eq!(dc["connected"], true, "{health}");
    assert!(dc["last_update_at"].as_i64().is_some(), "{health}");
    assert!(!health.to_string().contains(TOKEN));
    let (text, code) = crate::common::mercury_status_exit(&host).await;
    assert!(
        text.contains("adapters: discord connected (gateway; last update 20"),
        "{text}"
    );
    assert_eq!(code, Some(0), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn discord_dropped_gateway_resumes_without_a_missed_or_doubled_message() {
    let (fake, host) = connected_host("ack").await;
    for i in 1..=2u64 {
        fake.push(dm(2000 + i, 500 + i, &format!("message {i}")));
    }
    fake.until(60, "two replies", |f| f.replies().len() == 2)
        .await;
    fake.drop_gateway();
    // Sent while the connection is down: only a resume's replay brings them.
    for i in 3..=5u64 {
        fake.push(dm(2000 + i, 500 + i, &format!("message {i}")));
    }
    fake.restore_gateway();
    fake.until(60, "a reply to each of the five", |f| {
        (2001..=2005).all(|id| f.replies().contains_key(&id.to_string()))
    })
    .await;
    let resumes = fake.resumes();
    assert!(!resumes.is_empty(), "the shard resumed");
    assert_eq!(resumes[0]["session_id"], "fake-session-1", "{resumes:?}");
    assert!(resumes[0]["seq"].as_u64().unwrap() >= fake.seq_of("2002"));
    assert_eq!(fake.identifies().len(), 1, "resumed, not identified anew");
    let replayed = fake.replayed();
    for id in ["2003", "2004", "2005"] {
        assert!(
            replayed.iter().any(|r| r == id),
            "{id} not replayed: {replayed:?}"
        );
    }
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
        5,
        60,
    )
    .await;
    assert_eq!(host.count(DISCORD_ROWS), 5, "every message stored once");
    assert!(
        fake.replies().values().all(|v| v.len() == 1),
        "every message answered once: {:?}",
        fake.replies()
    );
    host.stop().await;
}

#[tokio::test]
async fn discord_restart_mid_stream_loses_and_repeats_nothing() {
    let (fake, mut host) = connected_host("ack").await;
    for i in 1..=4u64 {
        fake.push(dm(3000 + i, 600 + i, &format!("message {i}")));
    }
    host.wait_count(DISCORD_ROWS, 3, 60).await;
    host.kill();
    let stored: Value = serde_json::from_str(&host.read(|c| {
        c.query_row(
            "SELECT position FROM adapter_positions WHERE adapter = 'discord'",
            &[],
            |r| r.get::<_, String>(0),
        )
    }))
    .unwrap();
    let last_row: String = host
        .read(|c| c.query_row(
            "SELECT platform_message_id FROM messages WHERE sender_id LIKE 'discord:%' ORDER BY id DESC LIMIT 1",
            &[],
            |r| r.get(0)));
    assert_eq!(
        stored["sequence"].as_u64().unwrap(),
        fake.seq_of(&last_row),
        "the stored position covers exactly the stored rows: {stored}"
    );
    assert_eq!(stored["session_id"], "fake-session-1");
    for i in 5..=8u64 {
        fake.push(dm(3000 + i, 600 + i, &format!("message {i}")));
    }
    host.restart_process().await;
    fake.until(60, "a reply to each of the eight", |f| {
        (3001..=3008).all(|id| f.replies().contains_key(&id.to_string()))
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
        8,
        60,
    )
    .await;
    assert_eq!(host.count(DISCORD_ROWS), 8, "every message stored once");
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'"),
        8,
        "every message answered once"
    );
    // The restarted host resumed the stored session from the stored sequence.
    let resumes = fake.resumes();
    assert_eq!(resumes[0]["session_id"], "fake-session-1", "{resumes:?}");
    assert_eq!(resumes[0]["seq"], stored["sequence"], "{resumes:?}");
    let replayed = fake.replayed();
    for i in 5..=8u64 {
        let id = (3000 + i).to_string();
        assert!(replayed.contains(&id), "{id} not replayed: {replayed:?}");
    }
    assert_eq!(fake.identifies().len(), 1, "resumed, not identified anew");
    host.stop().await;
}

#[tokio::test]
async fn discord_429_and_route_limits_are_waited_out_and_a_long_reply_is_split() {
    let long = format!(
        "{}\n\n{}\n\n{}",
        "a".repeat(1500),
        "b".repeat(1500),
        "c".repeat(300)
    );
    let (fake, host) = connected_host(&long).await;
    fake.global_429_next_sends(1);
    fake.exhaust_routes_for(0.8);
    fake.push(dm(4001, 42, "tell me everything"));
    fake.until(60, "the split reply", |f| {
        f.calls("/messages")
            .iter()
            .filter(|c| c.status == 200 && c.route.starts_with("POST "))
            .count()
            == 2
    })
    .await;
    let sends: Vec<Call> = fake
        .calls("/messages")
        .into_iter()
        .filter(|c| c.route.starts_with("POST "))
        .collect();
    assert_eq!(sends[0].status, 429);
    let ok: Vec<&Call> = sends.iter().filter(|c| c.status == 200).collect();
    assert_eq!(ok.len(), 2, "{sends:?}");
    assert!(
        ok[0].at.duration_since(sends[0].at) >= Duration::from_millis(600),
        "the global 429's retry_after was not waited out"
    );
    assert!(
        ok[1].at.duration_since(ok[0].at) >= Duration::from_millis(800),
        "the exhausted route's reset was not waited for"
    );
    assert_eq!(ok[0].body["content"], json!("a".repeat(1500)));
    assert_eq!(ok[0].body["message_reference"]["message_id"], "4001");
    assert_eq!(
        ok[1].body["content"],
        json!(format!("{}\n\n{}", "b".repeat(1500), "c".repeat(300)))
    );
    assert!(ok[1].body.get("message_reference").is_none());
    for c in &ok {
        assert!(c.body["content"].as_str().unwrap().chars().count() <= 2000);
    }
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE platform = 'discord' AND delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn discord_without_a_token_refuses_to_start_and_a_wrong_one_shows_on_healthz() {
    let fake = FakeDiscord::start().await;
    let mut opts = host_options(&fake, json!({"rules": [{"reply": "x"}]}), vec![]);
    opts.env.clear();
    let err = crate::common::serve_refused_without(&opts, "MERCURY_DISCORD_BOT_TOKEN").await;
    assert!(err.contains("MERCURY_DISCORD_BOT_TOKEN"), "{err}");
    assert!(fake.calls("").is_empty());

    let mut opts = host_options(&fake, json!({"rules": [{"reply": "x"}]}), vec![]);
    opts.env = vec![(
        "MERCURY_DISCORD_BOT_TOKEN",
        "wrong.discord.token".to_string(),
    )];
    let host = TestHost::start_process(opts).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let (_, health) = host.send(Method::GET, "/healthz", None, &[], None).await;
        if health["adapters"]["discord"]["last_error"].is_string() {
            break health;
        }
        assert!(Instant::now() < deadline, "no error on /healthz: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let dc = &health["adapters"]["discord"];
    assert_eq!(dc["connected"], false, "{health}");
    assert!(
        dc["last_error"]
            .as_str()
            .unwrap()
            .contains("GET /users/@me: 401"),
        "{health}"
    );
    assert!(
        !health.to_string().contains("wrong.discord.token"),
        "{health}"
    );
    assert!(
        fake.identifies().is_empty(),
        "no identify with a refused token"
    );
    let (text, code) = crate::common::mercury_status_exit(&host).await;
    assert!(
        text.contains("adapters: discord disconnected (gateway; last error: GET /users/@me: 401"),
        "{text}"
    );
    // An enabled adapter down: running, but a monitor's check fails.
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("attention: an enabled adapter is disconnected"),
        "{text}"
    );
    assert!(!text.contains("wrong.discord.token"), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn discord_a_session_lost_while_down_is_backfilled_over_rest() {
    let (fake, mut host) = connected_host("ack").await;
    let (guild, channel) = ("600000000000000009", "610000000000000009");
    fake.push(dm(5001, 77, "first"));
    fake.push(message(
        "5002",
        channel,
        Some(guild),
        "78",
        &format!("<@{BOT_ID}> hi"),
    ));
    fake.until(60, "two replies", |f| f.replies().len() == 2)
        .await;
    // Killed once both replies are marked delivered: a kill between the
    // POST and its mark resends (delivery is at least once), which is not
    // what this test is about.
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        2,
        30,
    )
    .await;
    host.kill();
    // Down longer than Discord keeps a session: what is sent meanwhile is
    // in no replay.
    fake.forget_session();
    fake.push(dm(5003, 77, "while you were away"));
    fake.push(dm(5004, 77, "and again"));
    fake.push(message(
        "5005",
        channel,
        Some(guild),
        "78",
        "chatter, not for the bot",
    ));
    fake.push(message(
        "5006",
        channel,
        Some(guild),
        "78",
        &format!("<@{BOT_ID}> back?"),
    ));
    host.restart_process().await;
    fake.until(60, "replies to the missed DM and mention", |f| {
        ["5003", "5004", "5006"]
            .iter()
            .all(|id| f.replies().contains_key(*id))
    })
    .await;
    assert!(
        !fake.resumes().is_empty(),
        "the stored session was tried first"
    );
    assert_eq!(fake.identifies().len(), 2, "then a new session");
    assert!(
        fake.replayed().is_empty(),
        "a forgotten session replays nothing"
    );
    let lists = fake.calls("/messages");
    assert!(
        lists
            .iter()
            .any(|c| c.route == "GET /channels/700000000000000077/messages"
                && c.body["after"] == json!(5001u64)),
        "the DM was read from its last stored message: {lists:?}"
    );
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
        4,
        60,
    )
    .await;
    assert_eq!(host.count(DISCORD_ROWS), 6, "every message stored once");
    // The listing carries no guild_id: the stored conversation says it is a group.
    assert_eq!(
        host.count(
            "SELECT COUNT(*) FROM messages WHERE role = 'ambient' AND platform_message_id = '5005'"
        ),
        1
    );
    assert!(!fake.replies().contains_key("5005"));
    assert!(
        fake.replies().values().all(|v| v.len() == 1),
        "{:?}",
        fake.replies()
    );
    host.stop().await;
}

#[tokio::test]
async fn discord_a_streamed_reply_is_edited_to_its_final_text_without_a_ping() {
    let fake = FakeDiscord::start().await;
    let reply: String = (1..=20)
        .map(|i| format!("bit{i}"))
        .collect::<Vec<_>>()
        .join(" ")
        + " @everyone";
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": reply, "latency_ms": 3000}]}),
        vec![
            ("turn.stream", serde_yaml_ng::Value::Bool(true)),
            (
                "turn.stream_after_ms",
                serde_yaml_ng::Value::Number(200.into()),
            ),
        ],
    ))
    .await;
    fake.until_identified(1).await;
    fake.push(dm(1_100_000_000_000_000_001, 42, "a long one please"));
    fake.until(60, "the reply edited to its whole text", |f| {
        // Every call: an edit's route ends in the message's id.
        f.calls("")
            .iter()
            .filter(|c| c.route.starts_with("PATCH ") && c.status == 200)
            .any(|c| c.body["content"] == json!(reply))
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    let sent: Vec<Call> = fake
        .calls("/messages")
        .into_iter()
        .filter(|c| c.route.starts_with("POST ") && c.status == 200)
        .collect();
    assert_eq!(sent.len(), 1, "one message, edited: {sent:?}");
    assert_eq!(
        sent[0].body["message_reference"]["message_id"],
        json!("1100000000000000001")
    );
    let edits: Vec<Call> = fake
        .calls("")
        .into_iter()
        .filter(|c| c.route.starts_with("PATCH "))
        .collect();
    assert!(edits.len() >= 2, "{edits:?}");
    let preview = "800000000000000001";
    for e in sent.iter().chain(&edits) {
        assert_eq!(e.body["allowed_mentions"]["parse"], json!([]), "{e:?}");
    }
    for e in &edits {
        assert!(e.route.ends_with(&format!("/messages/{preview}")), "{e:?}");
    }
    for pair in edits.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(900), "{gap:?}");
    }
    assert_eq!(fake.text_of(preview), Some(reply));
    host.stop().await;
}

#[tokio::test]
async fn discord_attachments_are_fetched_only_from_the_allowed_origins() {
    let fake = FakeDiscord::start().await;
    // The CDN is the fake's own origin; anything else is refused unfetched.
    let origin = fake.rest_url.trim_end_matches("/api/v10").to_owned();
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"match": "saved as (inbox/\\S+)\\].*\\n.*not kept: (.*)\\]", "reply": "kept $1; $2"}]}),
        vec![(
            "adapters.discord.attachment_origins",
            serde_yaml_ng::Value::Sequence(vec![serde_yaml_ng::Value::from(origin.clone())]),
        )],
    ))
    .await;
    fake.until_identified(1).await;
    let mut m = dm(6001, 42, "two files");
    m["attachments"] = json!([
        {"id": "1", "filename": "notes.txt", "content_type": "text/plain; charset=utf-8", "size": 100,
         "url": format!("{origin}/attachments/1/notes.txt")},
        {"id": "2", "filename": "elsewhere.txt", "content_type": "text/plain", "size": 100,
         "url": "http://127.0.0.2:9/attachments/2/elsewhere.txt"}
    ]);
    fake.push(m);
    fake.until(60, "the reply", |f| f.replies().contains_key("6001"))
        .await;
    let said = fake.replies()["6001"][0].body["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        said.starts_with("kept inbox/")
            && said.ends_with("-1.txt; it could not be fetched (its URL is not on an origin of adapters.discord.attachment_origins)"),
        "{said}"
    );
    assert_eq!(
        *fake.state.downloads.lock().unwrap(),
        vec!["1/notes.txt".to_owned()]
    );
    let stored: String = host.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE platform_message_id = '6001'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(stored, "two files\n[file]\n[file]");
    host.stop().await;
}

#[tokio::test]
async fn discord_a_file_the_turn_writes_under_outbox_follows_its_reply_as_an_upload() {
    let fake = FakeDiscord::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [
            {"match": "tool_result\\(write_file\\)", "reply": "here it is"},
            {"match": "send me the chart", "tool_calls": [
                {"name": "write_file", "arguments": {"path": "outbox/chart.png", "content": "pretend pixels"}},
                {"name": "write_file", "arguments": {"path": "notes.txt", "content": "kept, not sent"}}
            ]}
        ]}),
        vec![],
    ))
    .await;
    fake.until_identified(1).await;
    fake.push(dm(6101, 42, "send me the chart"));
    let forms = |f: &FakeDiscord| -> Vec<Call> {
        f.calls("/messages")
            .into_iter()
            .filter(|c| c.status == 200 && c.body["multipart"].is_string())
            .collect()
    };
    fake.until(60, "the reply and its file", |f| {
        f.replies().contains_key("6101") && !forms(f).is_empty()
    })
    .await;
    assert_eq!(fake.replies()["6101"][0].body["content"], "here it is");
    let uploads = forms(&fake);
    assert_eq!(uploads.len(), 1, "only the file under outbox/: {uploads:?}");
    let form = uploads[0].body["multipart"].as_str().unwrap();
    assert!(
        form.contains("name=\"files[0]\"; filename=\"chart.png\"\r\nContent-Type: image/png\r\n\r\npretend pixels\r\n"),
        "{form}"
    );
    // Its payload names the file and allows no mention.
    let payload = form
        .split("name=\"payload_json\"\r\n\r\n")
        .nth(1)
        .and_then(|rest| rest.split("\r\n").next())
        .unwrap();
    let payload: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(payload["attachments"][0]["filename"], "chart.png");
    assert_eq!(payload["allowed_mentions"]["parse"], json!([]));
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.stop().await;
}
