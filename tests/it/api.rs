//! Issue 2 from the outside: every route against every kind of caller, reads
//! that must not write, bad input that must not write, paging through
//! `messages recent`, `mrctl` as a process, and the `mercury` binary's
//! `init`, config validation and SIGTERM behaviour.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{free_port, HostOptions, TestHost};
use mercury::storage::{inspect, Query};

// ---------------------------------------------------------------------------
// Route × role matrix
// ---------------------------------------------------------------------------

/// What a route asks of its caller.
#[derive(Clone, Copy, Debug)]
enum Need {
    /// Outside `/api`: no token at all.
    Public,
    /// Any user token (with a space header where the route reads one).
    Token,
    /// This permission in the space of the header.
    Perm(&'static str),
    GlobalAdmin,
    Adapter,
    AdapterOrGlobalAdmin,
}

/// The callers of the matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Owner,
    /// Granted `admin` in the space with `roles grant` (not a global admin).
    SpaceAdmin,
    /// Granted `member` (a platform sender who spoke through `/api/ingress`
    /// is `test:bob`, a different caller: no user token can claim that id).
    Member,
    Adapter,
    NoToken,
    BadToken,
    Revoked,
}

const WHO: [Who; 7] = [
    Who::Owner,
    Who::SpaceAdmin,
    Who::Member,
    Who::Adapter,
    Who::NoToken,
    Who::BadToken,
    Who::Revoked,
];

struct Route {
    method: Method,
    /// `{space}`, `{conv}`, `{task}`, `{token}` and `{n}` are filled per cell.
    path: &'static str,
    body: Option<Value>,
    need: Need,
    /// The status of an allowed call.
    ok: u16,
}

fn route(method: Method, path: &'static str, body: Option<Value>, need: Need, ok: u16) -> Route {
    Route {
        method,
        path,
        body,
        need,
        ok,
    }
}

/// Every route the router serves (with `test-hooks`), in the order of docs/api.md.
fn routes() -> Vec<Route> {
    use Need::*;
    let (get, post, put, del) = (Method::GET, Method::POST, Method::PUT, Method::DELETE);
    vec![
        route(get.clone(), "/healthz", None, Public, 200),
        route(get.clone(), "/api/whoami", None, Token, 200),
        // Lists only the caller's own spaces (all of them for a global admin).
        route(get.clone(), "/api/spaces", None, Token, 200),
        route(
            post.clone(),
            "/api/spaces",
            Some(json!({"id": "new-{n}"})),
            GlobalAdmin,
            201,
        ),
        route(get.clone(), "/api/spaces/current", None, Token, 200),
        route(
            put.clone(),
            "/api/spaces/current/name",
            Some(json!({"name": "Renamed"})),
            Perm("spaces.rename"),
            200,
        ),
        route(
            del.clone(),
            "/api/spaces/current",
            None,
            Perm("spaces.delete"),
            200,
        ),
        route(
            get.clone(),
            "/api/conversations",
            None,
            Perm("spaces.list"),
            200,
        ),
        route(
            post.clone(),
            "/api/conversations/{conv}/link",
            Some(json!({"space_id": "{space}"})),
            Perm("spaces.rename"),
            200,
        ),
        route(
            post.clone(),
            "/api/conversations/{conv}/unlink",
            None,
            Perm("spaces.rename"),
            200,
        ),
        route(
            get.clone(),
            "/api/messages?q=hello",
            None,
            Perm("messages.read"),
            200,
        ),
        route(
            get.clone(),
            "/api/messages/recent?since=1h",
            None,
            Perm("messages.read"),
            200,
        ),
        route(get.clone(), "/api/prefs", None, Perm("prefs.get"), 200),
        route(
            put.clone(),
            "/api/prefs",
            Some(json!({"key": "colour", "value": "blue"})),
            Perm("prefs.set"),
            200,
        ),
        route(
            del.clone(),
            "/api/prefs/colour",
            None,
            Perm("prefs.set"),
            200,
        ),
        route(get.clone(), "/api/config", None, Perm("config.get"), 200),
        route(
            put.clone(),
            "/api/config",
            Some(json!({"key": "trigger.match", "value": "always"})),
            Perm("config.set"),
            200,
        ),
        route(get.clone(), "/api/tasks", None, Perm("tasks.list"), 200),
        route(
            post.clone(),
            "/api/tasks",
            Some(json!({"cron": "0 9 * * *", "prompt": "standup"})),
            Perm("tasks.create"),
            201,
        ),
        route(
            post.clone(),
            "/api/tasks/{task}/pause",
            None,
            Perm("tasks.pause"),
            200,
        ),
        route(
            post.clone(),
            "/api/tasks/{task}/resume",
            None,
            Perm("tasks.resume"),
            200,
        ),
        route(
            post.clone(),
            "/api/tasks/{task}/run",
            None,
            Perm("tasks.create"),
            202,
        ),
        route(
            del.clone(),
            "/api/tasks/{task}",
            None,
            Perm("tasks.delete"),
            200,
        ),
        route(get.clone(), "/api/roles", None, Perm("roles.list"), 200),
        route(
            post.clone(),
            "/api/roles",
            Some(json!({"caller_id": "dave", "role": "member"})),
            Perm("roles.grant"),
            200,
        ),
        route(
            del.clone(),
            "/api/roles/dave",
            None,
            Perm("roles.revoke"),
            200,
        ),
        route(
            get.clone(),
            "/api/permissions",
            None,
            Perm("permissions.get"),
            200,
        ),
        route(
            put.clone(),
            "/api/permissions",
            Some(json!({"role": "member", "permissions": ["prompt"]})),
            Perm("permissions.set"),
            200,
        ),
        route(get.clone(), "/api/mutes", None, Perm("mutes.list"), 200),
        route(
            post.clone(),
            "/api/mutes",
            Some(json!({"caller_id": "carol", "for": "2h"})),
            Perm("mutes.set"),
            200,
        ),
        route(
            del.clone(),
            "/api/mutes/carol",
            None,
            Perm("mutes.set"),
            200,
        ),
        route(get.clone(), "/api/model", None, Perm("model.get"), 200),
        route(
            put.clone(),
            "/api/model",
            Some(json!({"chain": []})),
            Perm("model.set"),
            200,
        ),
        route(post.clone(), "/api/control/stop", None, Perm("stop"), 200),
        route(
            post.clone(),
            "/api/control/compact",
            None,
            Perm("compact"),
            200,
        ),
        route(
            post.clone(),
            "/api/control/clear",
            None,
            Perm("compact"),
            200,
        ),
        route(
            post.clone(),
            "/api/send",
            Some(json!({"text": "hello from the operator"})),
            Perm("send"),
            202,
        ),
        route(get.clone(), "/api/runs", None, Perm("messages.read"), 200),
        route(
            post.clone(),
            "/api/tokens",
            Some(json!({"caller_id": "zoe", "kind": "user"})),
            GlobalAdmin,
            201,
        ),
        route(get.clone(), "/api/tokens", None, GlobalAdmin, 200),
        route(del.clone(), "/api/tokens/{token}", None, GlobalAdmin, 200),
        route(
            post.clone(),
            "/api/ingress",
            Some(
                json!({"platform": "test", "conversation": "chat-{n}", "sender_id": "erin",
                        "text": "hi", "message_id": "x-{n}", "is_group": false}),
            ),
            Adapter,
            202,
        ),
        route(get.clone(), "/api/outbox", None, AdapterOrGlobalAdmin, 200),
        route(
            post.clone(),
            "/api/chat",
            Some(json!({"text": "hello"})),
            Perm("prompt"),
            200,
        ),
        route(post, "/api/test/panic", None, GlobalAdmin, 200),
    ]
}

fn expected(need: Need, who: Who, ok: u16) -> u16 {
    use Need as N;
    use Who as W;
    match (need, who) {
        (N::Public, _) => ok,
        (_, W::NoToken | W::BadToken | W::Revoked) => 401,
        (N::Adapter | N::AdapterOrGlobalAdmin, W::Adapter) => ok,
        (_, W::Adapter) => 403,
        (N::Adapter, _) => 403,
        (_, W::Owner) => ok,
        (N::Token, W::SpaceAdmin | W::Member) => ok,
        (N::Perm(_), W::SpaceAdmin) => ok,
        (N::Perm("prompt"), W::Member) => ok,
        (N::Perm(_), W::Member) => 403,
        (N::GlobalAdmin | N::AdapterOrGlobalAdmin, W::SpaceAdmin | W::Member) => 403,
    }
}

/// The objects one cell's call refers to, in a space of its own.
struct Cell {
    n: usize,
    space: String,
    conv: i64,
    task: i64,
    token: String,
}

impl Cell {
    fn fill(&self, s: &str) -> String {
        s.replace("{space}", &self.space)
            .replace("{conv}", &self.conv.to_string())
            .replace("{task}", &self.task.to_string())
            .replace("{token}", &self.token)
            .replace("{n}", &self.n.to_string())
    }
}

/// A space with a platform conversation linked to it, `bob` as a member (he
/// spoke there through ingress), `alice` granted admin, a cron task and a
/// spare token to revoke.
async fn setup_cell(h: &TestHost, adapter: &str, n: usize) -> Cell {
    let space = format!("cell-{n}");
    h.create_space(&space).await;
    let chat = format!("chat-{n}");
    // auto_space is off: the first message only makes the conversation known.
    let (st, v) = h.ingest(adapter, &chat, "bob", "hello", "m1", false).await;
    assert_eq!((st, v["status"].as_str()), (202, Some("unlinked")), "{v}");
    let (st, v) = h
        .owner(Method::GET, "/api/conversations?all=true", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let conv = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["external_id"] == chat.as_str())
        .and_then(|c| c["id"].as_i64())
        .expect("the conversation is listed");
    let (st, v) = h
        .owner(
            Method::POST,
            &format!("/api/conversations/{conv}/link"),
            Some(&space),
            Some(json!({"space_id": space})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h.ingest(adapter, &chat, "bob", "hello", "m2", false).await;
    assert_eq!((st, v["status"].as_str()), (202, Some("queued")), "{v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/roles",
            Some(&space),
            Some(json!({"caller_id": "bob", "role": "member"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/roles",
            Some(&space),
            Some(json!({"caller_id": "alice", "role": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tasks",
            Some(&space),
            Some(json!({"cron": "0 9 * * *", "prompt": "daily"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let task = v["task"]["id"].as_i64().unwrap();
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tokens",
            None,
            Some(json!({"caller_id": "spare"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let token = v["id"].as_str().unwrap().to_string();
    Cell {
        n,
        space,
        conv,
        task,
        token,
    }
}

struct Tokens {
    owner: String,
    alice: String,
    bob: String,
    adapter: String,
    revoked: String,
}

impl Tokens {
    fn of(&self, who: Who) -> Option<&str> {
        match who {
            Who::Owner => Some(&self.owner),
            Who::SpaceAdmin => Some(&self.alice),
            Who::Member => Some(&self.bob),
            Who::Adapter => Some(&self.adapter),
            Who::NoToken => None,
            Who::BadToken => Some("mrc_this-token-was-never-minted"),
            Who::Revoked => Some(&self.revoked),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_caller_with_the_expected_status() {
    let h = TestHost::start(HostOptions {
        config: vec![
            ("ingress.auto_space", Yaml::Bool(false)),
            ("ingress.per_caller_per_minute", Yaml::Number(1000.into())),
            // bob is a stranger whose conversation the owner links: an open
            // bot (the sender policy has its own tests, tests/it/pairing.rs).
            ("ingress.dm_policy", Yaml::String("open".into())),
        ],
        ..Default::default()
    })
    .await;
    let adapter = h.token("adapter-1", "adapter").await;
    let revoked = h.token("rita", "user").await;
    let (st, _) = h
        .call(Method::GET, "/api/whoami", Some(&revoked), None, None)
        .await;
    assert_eq!(st, 200, "the token works before it is revoked");
    let (_, list) = h.owner(Method::GET, "/api/tokens", None, None).await;
    let rita = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["caller_id"] == "rita")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = h
        .owner(Method::DELETE, &format!("/api/tokens/{rita}"), None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let tokens = Tokens {
        owner: h.owner_token.clone(),
        alice: h.token("alice", "user").await,
        bob: h.token("bob", "user").await,
        adapter,
        revoked,
    };

    // The roles the matrix claims are the roles the host resolves.
    let shared = setup_cell(&h, &tokens.adapter, 0).await;
    for (who, role) in [
        (Who::Owner, "admin"),
        (Who::SpaceAdmin, "admin"),
        (Who::Member, "member"),
    ] {
        let (st, v) = h
            .call(
                Method::GET,
                "/api/whoami",
                tokens.of(who),
                Some(&shared.space),
                None,
            )
            .await;
        assert_eq!((st, v["role"].as_str()), (200, Some(role)), "{who:?}: {v}");
    }
    let (_, v) = h
        .call(
            Method::GET,
            "/api/whoami",
            tokens.of(Who::SpaceAdmin),
            None,
            None,
        )
        .await;
    assert_eq!(
        v["global_admin"], false,
        "alice is an admin of the space only"
    );

    let routes = routes();
    // Cells that may change their space get a fresh one; the callers that
    // are refused before any handler runs share one.
    let mut plan = Vec::new();
    let mut n = 0;
    for ri in 0..routes.len() {
        for who in WHO {
            let fresh = matches!(who, Who::Owner | Who::SpaceAdmin | Who::Member);
            if fresh {
                n += 1;
            }
            plan.push((ri, who, fresh.then_some(n)));
        }
    }
    let cells = plan.len();
    let results: Vec<Option<String>> = futures_util::stream::iter(plan)
        .map(|(ri, who, fresh)| {
            let (h, tokens, routes, shared) = (&h, &tokens, &routes, &shared);
            async move {
                let r = &routes[ri];
                let own;
                let cell = match fresh {
                    Some(n) => {
                        own = setup_cell(h, &tokens.adapter, n).await;
                        &own
                    }
                    None => shared,
                };
                let path = cell.fill(r.path);
                let body = r
                    .body
                    .as_ref()
                    .map(|b| serde_json::from_str(&cell.fill(&b.to_string())).unwrap());
                let (st, v) = h
                    .call(
                        r.method.clone(),
                        &path,
                        tokens.of(who),
                        Some(&cell.space),
                        body,
                    )
                    .await;
                let want = expected(r.need, who, r.ok);
                // A refusal must carry the error shape, not just a status.
                let shaped = st < 400
                    || v["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty());
                (st != want || !shaped).then(|| {
                    format!(
                        "{} {} as {who:?}: got {st}, want {want}: {v}",
                        r.method, r.path
                    )
                })
            }
        })
        .buffer_unordered(6)
        .collect()
        .await;
    let failures: Vec<String> = results.into_iter().flatten().collect();
    println!(
        "route x role matrix: {} routes x {} callers = {cells} cells, {} wrong",
        routes.len(),
        WHO.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {cells} cells wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(cells, routes.len() * WHO.len());
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Reads of an unknown space
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_request_for_an_unknown_space_is_404_and_creates_no_row() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("alpha").await;
    let uma = h.token("uma", "user").await;
    let before = h.all_row_counts();
    let reads = [
        "/api/whoami",
        "/api/spaces/current",
        "/api/conversations",
        "/api/messages?q=x",
        "/api/messages/recent",
        "/api/prefs",
        "/api/config",
        "/api/tasks",
        "/api/roles",
        "/api/permissions",
        "/api/mutes",
        "/api/model",
        "/api/runs",
    ];
    for token in [h.owner_token.as_str(), uma.as_str()] {
        for path in reads {
            let (st, v) = h
                .call(Method::GET, path, Some(token), Some("ghost"), None)
                .await;
            assert_eq!(st, 404, "GET {path}: {v}");
            assert_eq!(v["error"]["code"], "not_found", "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains("ghost"),
                "{v}"
            );
        }
        // Writes aimed at it are refused at the same step.
        for (m, path, body) in [
            (Method::PUT, "/api/prefs", json!({"key": "a", "value": "b"})),
            (Method::POST, "/api/chat", json!({"text": "hello"})),
            (
                Method::POST,
                "/api/tasks",
                json!({"cron": "0 9 * * *", "prompt": "x"}),
            ),
        ] {
            let (st, v) = h
                .call(m, path, Some(token), Some("ghost"), Some(body))
                .await;
            assert_eq!(st, 404, "{path}: {v}");
        }
    }
    // A caller with no role reading an existing space is refused without
    // becoming a member.
    let (st, v) = h
        .call(
            Method::GET,
            "/api/messages/recent",
            Some(&uma),
            Some("alpha"),
            None,
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = h
        .call(Method::GET, "/api/whoami", Some(&uma), Some("alpha"), None)
        .await;
    assert_eq!((st, v["role"].as_str()), (200, Some("none")), "{v}");
    assert_eq!(h.all_row_counts(), before, "a refused request wrote a row");
    assert!(
        !h.data.join("spaces/ghost").exists(),
        "no workspace for an unknown space"
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

/// Sends a raw body with the given content type.
async fn raw(
    h: &TestHost,
    method: Method,
    path: &str,
    space: Option<&str>,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let mut req = h
        .http
        .request(method, format!("{}{}", h.url, path))
        .bearer_auth(&h.owner_token)
        .header("content-type", content_type)
        .body(body);
    if let Some(s) = space {
        req = req.header("x-mercury-space", s);
    }
    let resp = req.send().await.expect("request");
    let st = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        st,
        serde_json::from_str(&text).unwrap_or(json!({"unparsed": text})),
    )
}

/// One bad request and what its refusal must say.
struct Case {
    what: &'static str,
    method: Method,
    path: String,
    space: Option<&'static str>,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    /// Words the error message must contain.
    words: Vec<String>,
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_a_clear_message_and_writes_nothing() {
    const LIMIT: usize = 8192;
    let h = TestHost::start(HostOptions {
        config: vec![("http.body_limit_bytes", Yaml::Number(LIMIT.into()))],
        ..Default::default()
    })
    .await;
    h.create_space("alpha").await;
    let adapter = h.token("adapter-1", "adapter").await;
    let (_, perms) = h
        .owner(Method::GET, "/api/permissions", Some("alpha"), None)
        .await;
    let valid: Vec<String> = perms["available"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        valid.len(),
        31,
        "18 built-in names plus the 10 new ones plus files.read and files.write plus ext.manage"
    );
    let cron = |c: &str| json!({"cron": c, "prompt": "x"});
    let past = "2001-01-01T00:00:00Z";
    let big = "x".repeat(LIMIT + 1);
    let ingress = |is_group: Value| json!({"platform": "test", "conversation": "c", "sender_id": "s", "text": "t", "message_id": "m", "is_group": is_group});

    let j = |v: Value| serde_json::to_vec(&v).unwrap();
    let case = |what: &'static str,
                method: Method,
                path: &str,
                space: Option<&'static str>,
                body: Vec<u8>,
                status: u16,
                words: &[&str]| Case {
        what,
        method,
        path: path.to_string(),
        space,
        content_type: "application/json",
        body,
        status,
        words: words.iter().map(std::string::ToString::to_string).collect(),
    };
    let (get, post, put) = (Method::GET, Method::POST, Method::PUT);
    let a = Some("alpha");
    let mut cases = vec![
        case(
            "malformed JSON",
            post.clone(),
            "/api/tasks",
            a,
            b"{\"cron\": \"0 9 * * *\", \"prompt\": ".to_vec(),
            400,
            &["JSON"],
        ),
        case(
            "oversized body",
            put.clone(),
            "/api/prefs",
            a,
            j(json!({"key": "k", "value": big})),
            413,
            &["limit"],
        ),
        case(
            "bad space id header",
            get.clone(),
            "/api/prefs",
            Some("Not_A_Slug"),
            vec![],
            400,
            &["Not_A_Slug", "space id"],
        ),
        case(
            "bad space id to create",
            post.clone(),
            "/api/spaces",
            None,
            j(json!({"id": "-bad"})),
            400,
            &["-bad"],
        ),
        case(
            "cron with a bad field",
            post.clone(),
            "/api/tasks",
            a,
            j(cron("61 * * * *")),
            400,
            &["cron", "61"],
        ),
        case(
            "cron with three fields",
            post.clone(),
            "/api/tasks",
            a,
            j(cron("* * *")),
            400,
            &["five fields"],
        ),
        case(
            "at in the past",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"at": past, "prompt": "x"})),
            400,
            &["past"],
        ),
        case(
            "at that is no time",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"at": "tomorrow", "prompt": "x"})),
            400,
            &["RFC 3339"],
        ),
        case(
            "both cron and at",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"cron": "0 9 * * *", "at": "2999-01-01T00:00:00Z", "prompt": "x"})),
            400,
            &["exactly one"],
        ),
        case(
            "wrong type",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"cron": 5, "prompt": "x"})),
            400,
            &["invalid type"],
        ),
        case(
            "wrong type in prefs",
            put.clone(),
            "/api/prefs",
            a,
            j(json!({"key": "k", "value": true})),
            400,
            &["invalid type"],
        ),
        case(
            "unknown field",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"cron": "0 9 * * *", "prompt": "x", "colour": "red"})),
            400,
            &["colour"],
        ),
        case(
            "unknown field on create",
            post.clone(),
            "/api/spaces",
            None,
            j(json!({"id": "beta", "nmae": "typo"})),
            400,
            &["nmae"],
        ),
        case(
            "missing field",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"cron": "0 9 * * *"})),
            400,
            &["prompt"],
        ),
        case(
            "empty prompt",
            post.clone(),
            "/api/tasks",
            a,
            j(json!({"cron": "0 9 * * *", "prompt": "  "})),
            400,
            &["prompt"],
        ),
        Case {
            content_type: "application/x-www-form-urlencoded",
            ..case(
                "not JSON at all",
                put.clone(),
                "/api/prefs",
                a,
                b"key=k&value=v".to_vec(),
                415,
                &["JSON"],
            )
        },
        case(
            "unknown config key",
            put.clone(),
            "/api/config",
            a,
            j(json!({"key": "trigger.colour", "value": "x"})),
            400,
            &["trigger.colour", "rate_limit.per_minute"],
        ),
        case(
            "bad config value",
            put.clone(),
            "/api/config",
            a,
            j(json!({"key": "rate_limit.per_minute", "value": "0"})),
            400,
            &["rate_limit.per_minute"],
        ),
        case(
            "grant the system role",
            post.clone(),
            "/api/roles",
            a,
            j(json!({"caller_id": "x", "role": "system"})),
            400,
            &["system"],
        ),
        case(
            "mute until the past",
            post.clone(),
            "/api/mutes",
            a,
            j(json!({"caller_id": "x", "until": past})),
            400,
            &["past"],
        ),
        case(
            "bad model spec",
            put.clone(),
            "/api/model",
            a,
            j(json!({"chain": ["gpt-4o"]})),
            400,
            &["gpt-4o"],
        ),
        case(
            "bad token kind",
            post.clone(),
            "/api/tokens",
            None,
            j(json!({"caller_id": "x", "kind": "root"})),
            400,
            &["root"],
        ),
        case(
            "bad since",
            get.clone(),
            "/api/messages/recent?since=yesterday",
            a,
            vec![],
            400,
            &["since", "yesterday"],
        ),
        case(
            "until before since",
            get.clone(),
            "/api/messages/recent?since=1h&until=2h",
            a,
            vec![],
            400,
            &["until"],
        ),
        case(
            "bad cursor",
            get.clone(),
            "/api/messages/recent?cursor=abc",
            a,
            vec![],
            400,
            &["cursor"],
        ),
        case(
            "limit too large",
            get.clone(),
            "/api/messages/recent?limit=5000",
            a,
            vec![],
            400,
            &["limit"],
        ),
        case(
            "unknown query parameter",
            get.clone(),
            "/api/messages/recent?colour=red",
            a,
            vec![],
            400,
            &["colour"],
        ),
        case(
            "task id that is no number",
            post.clone(),
            "/api/tasks/abc/pause",
            a,
            vec![],
            400,
            &["abc"],
        ),
        case(
            "conversation id that is no number",
            post.clone(),
            "/api/conversations/abc/unlink",
            a,
            vec![],
            400,
            &["abc"],
        ),
        case(
            "unknown task",
            post.clone(),
            "/api/tasks/4242/pause",
            a,
            vec![],
            404,
            &["4242"],
        ),
        case(
            "unknown route",
            get.clone(),
            "/api/nothing-here",
            a,
            vec![],
            404,
            &["route"],
        ),
        case(
            "wrong method",
            Method::PATCH,
            "/api/prefs",
            a,
            vec![],
            405,
            &["PATCH"],
        ),
        // Refused inside the space's write (apply_with): the rule's own
        // 400, and the transaction rolled back.
        case(
            "send with no platform conversation",
            post.clone(),
            "/api/send",
            a,
            j(json!({"text": "hello"})),
            400,
            &["no platform conversation"],
        ),
    ];
    let mut unknown_perm = case(
        "unknown permission",
        put,
        "/api/permissions",
        a,
        j(json!({"role": "member", "permissions": ["prompt", "fly"]})),
        400,
        &["fly"],
    );
    unknown_perm.words.extend(valid.iter().cloned());
    cases.push(unknown_perm);

    let before = h.all_row_counts();
    let mut wrong = Vec::new();
    for c in cases {
        let (st, v) = raw(&h, c.method, &c.path, c.space, c.content_type, c.body).await;
        let message = v["error"]["message"].as_str().unwrap_or_default();
        let missing: Vec<&String> = c
            .words
            .iter()
            .filter(|w| !message.contains(w.as_str()))
            .collect();
        if st != c.status || v["error"]["code"].as_str().is_none() || !missing.is_empty() {
            wrong.push(format!(
                "{}: got {st} {v}, want {} naming {missing:?}",
                c.what, c.status
            ));
        }
        assert_eq!(h.all_row_counts(), before, "{} wrote a row", c.what);
    }
    // Ingress is validated the same way (adapter token).
    for (what, body, status) in [
        (
            "ingress: wrong type",
            serde_json::to_vec(&ingress(json!("yes"))).unwrap(),
            400,
        ),
        (
            "ingress: oversized",
            j(
                json!({"platform": "test", "conversation": "c", "sender_id": "s", "text": big, "message_id": "m", "is_group": false}),
            ),
            413,
        ),
        (
            "ingress: console is reserved",
            j(
                json!({"platform": "console", "conversation": "c", "sender_id": "s", "text": "t", "message_id": "m", "is_group": false}),
            ),
            400,
        ),
    ] {
        let resp = h
            .http
            .post(format!("{}/api/ingress", h.url))
            .bearer_auth(&adapter)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let st = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if st != status || v["error"]["message"].as_str().is_none_or(str::is_empty) {
            wrong.push(format!("{what}: got {st} {v}, want {status}"));
        }
        assert_eq!(h.all_row_counts(), before, "{what} wrote a row");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    h.stop().await;
}

// ---------------------------------------------------------------------------
// messages recent
// ---------------------------------------------------------------------------

/// Follows `next_cursor` from the first page; returns the ids in the order served.
async fn page_all(h: &TestHost, space: &str, query: &str, limit: u32) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut path = format!("/api/messages/recent?{query}&limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (st, v) = h.owner(Method::GET, &path, Some(space), None).await;
        assert_eq!(st, 200, "{path}: {v}");
        let page = v["messages"].as_array().unwrap();
        assert!(page.len() <= limit as usize);
        ids.extend(page.iter().map(|m| m["id"].as_i64().unwrap()));
        match v["next_cursor"].as_str() {
            Some(c) => {
                assert!(!page.is_empty(), "a cursor after an empty page");
                cursor = Some(c.to_string());
            }
            None => return ids,
        }
    }
    panic!("the cursor never ran out");
}

#[tokio::test]
async fn messages_recent_pages_through_1000_seeded_messages_each_once_oldest_first() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("pager").await;
    h.create_space("other").await;
    let now = chrono::Utc::now().timestamp_millis();
    // Half a minute off the hour, so "7h before now" falls between two seeded
    // minutes however late the server reads its clock.
    let base = now - 10 * 3_600_000 - 30_000;
    let minute = 60_000;
    // Four messages share each minute, and they are inserted in a scrambled
    // order, so id order is not time order: the server must order by both.
    {
        h.write(move |tx| {
            for k in 0..1000i64 {
                let i = (k * 7919) % 1000;
                tx.execute(
                    "INSERT INTO messages (space_id, sender_id, role, text, created_at) VALUES ('pager', 'seeder', 'user', ?1, ?2)",
                    &[&format!("seed {i}"), &(base + (i / 4) * minute)],
                )?;
            }
            for i in 0..50i64 {
                tx.execute(
                    "INSERT INTO messages (space_id, sender_id, role, text, created_at) VALUES ('other', 'seeder', 'user', 'elsewhere', ?1)",
                    &[&(base + i * minute)],
                )?;
            }
            Ok(())
        });
    }
    let expect = |since: i64, until: i64| -> Vec<i64> {
        h.read(|c| c.query_all("SELECT id FROM messages WHERE space_id = 'pager' AND created_at >= ?1 AND created_at < ?2 ORDER BY created_at, id", &[&since, &until], |r| r.get(0)))
    };

    let all = page_all(&h, "pager", "since=24h", 37).await;
    assert_eq!(all.len(), 1000, "every message once");
    let unique: std::collections::BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), 1000, "no message twice");
    assert_eq!(all, expect(i64::MIN, i64::MAX), "oldest first, ties by id");
    let first = h.count(&format!(
        "SELECT CAST(substr(text, 6) AS INTEGER) FROM messages WHERE id = {}",
        all[0]
    ));
    assert!(
        first < 4,
        "the first page starts with the oldest minute (seed {first})"
    );

    // An exact window: since is inclusive, until exclusive, across pages.
    let (since, until) = (base + 50 * minute, base + 120 * minute);
    let q = format!(
        "since={}&until={}",
        mercury::clock::ms_to_rfc3339(since),
        mercury::clock::ms_to_rfc3339(until)
    );
    let window = page_all(&h, "pager", &q, 50).await;
    assert_eq!(window.len(), 280, "minutes 50..120 hold 70 x 4 messages");
    assert_eq!(window, expect(since, until));

    // Durations are "that long before now".
    assert_eq!(page_all(&h, "pager", "since=11h", 1000).await.len(), 1000);
    assert!(
        page_all(&h, "pager", "since=1h", 100).await.is_empty(),
        "nothing in the last hour"
    );
    let until_7h = page_all(&h, "pager", "since=11h&until=7h", 100).await;
    assert_eq!(
        until_7h,
        expect(i64::MIN, now - 7 * 3_600_000),
        "until as a duration"
    );
    assert!(!until_7h.is_empty() && until_7h.len() < 1000);
    h.stop().await;
}

// ---------------------------------------------------------------------------
// mrctl as a process
// ---------------------------------------------------------------------------

pub(crate) async fn run(mut cmd: std::process::Command) -> (i32, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::from(cmd).output(),
    )
    .await
    .expect("the command finished within a minute")
    .expect("the command ran");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn mrctl_talks_to_the_host_and_exits_by_the_answer() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("ops").await;
    let owner = h.owner_token.clone();

    let mut c = h.mrctl(&owner, None);
    c.arg("whoami");
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("owner"), "{out}");

    let mut c = h.mrctl(&owner, None);
    c.args(["spaces", "list", "--json"]);
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert!(
        v["spaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == "ops"),
        "{v}"
    );

    let mut c = h.mrctl(&owner, Some("ops"));
    c.args([
        "tasks",
        "create",
        "--cron",
        "0 9 * * *",
        "--prompt",
        "standup",
    ]);
    let (code, _, err) = run(c).await;
    assert_eq!(code, 0, "{err}");
    let mut c = h.mrctl(&owner, Some("ops"));
    c.args(["tasks", "list", "--json"]);
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{v}");
    assert_eq!(
        (tasks[0]["prompt"].as_str(), tasks[0]["cron"].as_str()),
        (Some("standup"), Some("0 9 * * *"))
    );

    // The server says no: exit 1, its sentence on stderr, nothing written.
    let uma = h.token("uma", "user").await;
    let before = h.all_row_counts();
    let mut c = h.mrctl(&uma, Some("ops"));
    c.args([
        "tasks",
        "create",
        "--cron",
        "0 9 * * *",
        "--prompt",
        "sneaky",
    ]);
    let (code, out, err) = run(c).await;
    assert_eq!(code, 1, "stdout {out} stderr {err}");
    assert!(
        err.contains("requires the 'tasks.create' permission in this space"),
        "{err}"
    );
    assert_eq!(h.all_row_counts(), before);

    // Usage error: exit 2 before any request.
    let mut c = h.mrctl(&owner, Some("ops"));
    c.args(["tasks", "create", "--prompt", "when?"]);
    let (code, _, err) = run(c).await;
    assert_eq!(code, 2, "{err}");

    // Nobody listens there: exit 2 naming the address.
    let port = free_port();
    let mut c = h.mrctl(&owner, None);
    c.env("MERCURY_URL", format!("http://127.0.0.1:{port}"))
        .arg("whoami");
    let (code, _, err) = run(c).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&port.to_string()), "{err}");
    h.stop().await;
}

// ---------------------------------------------------------------------------
// The mercury binary
// ---------------------------------------------------------------------------

pub(crate) fn mercury() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null());
    c
}

/// Every file under `dir` with its bytes, permissions and modification time.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32, std::time::SystemTime)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    for e in walkdir::WalkDir::new(dir) {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        let bytes = if md.is_file() {
            std::fs::read(e.path()).unwrap()
        } else {
            Vec::new()
        };
        out.insert(
            e.path().display().to_string(),
            (bytes, md.permissions().mode(), md.modified().unwrap()),
        );
    }
    out
}

#[tokio::test]
async fn init_twice_refuses_with_exit_2_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut c = mercury();
    c.args(["init", "--data-dir"]).arg(&data);
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("owner.token"),
        "init says where the token is: {out}"
    );
    for f in ["mercury.yaml", "state.db", "spaces", "global/owner.token"] {
        assert!(data.join(f).exists(), "{f}");
    }
    let before = snapshot(&data);
    let mut c = mercury();
    c.args(["init", "--data-dir"]).arg(&data);
    let (code, _, err) = run(c).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("already holds a Mercury data dir") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(
        snapshot(&data),
        before,
        "the second init changed the data dir"
    );
}

#[tokio::test]
async fn an_invalid_config_value_stops_serve_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    mercury::host::init(&data, "owner").await.unwrap();
    let bind = format!("127.0.0.1:{}", free_port());

    // From the environment.
    let mut c = mercury();
    c.args(["serve", "--bind", &bind, "--data-dir"])
        .arg(&data)
        .env("MERCURY_REVIEW_ENABLED", "maybe");
    let (code, _, err) = run(c).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("review.enabled") && err.contains("maybe"),
        "{err}"
    );

    // From the file.
    let cfg = data.join("mercury.yaml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_steps: 8", "max_steps: 0");
    std::fs::write(&cfg, text).unwrap();
    let mut c = mercury();
    c.args(["serve", "--bind", &bind, "--data-dir"]).arg(&data);
    let (code, _, err) = run(c).await;
    assert_ne!(code, 0);
    assert!(err.contains("turn.max_steps"), "{err}");
    assert!(
        std::net::TcpStream::connect(&bind).is_err(),
        "nothing listens after a refused start"
    );
}

#[tokio::test]
async fn sigterm_lets_the_turn_in_flight_finish_then_exits_0() {
    let mut h = TestHost::start_process(HostOptions {
        model: json!({"rules": [{"match": "^user: slow$", "reply": "finished", "latency_ms": 1500}]}),
        ..Default::default()
    })
    .await;
    h.create_space("alpha").await;
    let chat = {
        let (http, url, token) = (h.http.clone(), h.url.clone(), h.owner_token.clone());
        tokio::spawn(async move {
            let r = http
                .post(format!("{url}/api/chat"))
                .bearer_auth(token)
                .header("x-mercury-space", "alpha")
                .json(&json!({"text": "slow"}))
                .send()
                .await
                .expect("the request in flight is answered");
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    assert_eq!(
        h.wait_count("SELECT COUNT(*) FROM runs WHERE status = 'running'", 1, 30)
            .await,
        1
    );
    h.signal("TERM");
    let (st, v) = chat.await.unwrap();
    assert_eq!((st, v["reply"].as_str()), (200, Some("finished")), "{v}");
    let status = h.wait_exit(30).await.expect("the host exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        !h.data.join("api.sock").exists(),
        "the socket is removed on the way out"
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM runs WHERE status = 'done'"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_action_whose_store_write_fails_answers_500_internal_with_no_database_text() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("alpha").await;
    // The database refuses the write `control clear` makes, with a message
    // that must stay in the host's log.
    let trigger = if crate::common::on_postgres() {
        "CREATE FUNCTION refuse_clear() RETURNS trigger AS $$ \
         BEGIN RAISE EXCEPTION 'SECRET-DB-TEXT session_state'; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER refuse_clear BEFORE INSERT ON session_state \
         FOR EACH ROW EXECUTE FUNCTION refuse_clear();"
    } else {
        "CREATE TRIGGER refuse_clear BEFORE INSERT ON session_state \
         BEGIN SELECT RAISE(ABORT, 'SECRET-DB-TEXT session_state'); END;"
    };
    h.write(move |tx| inspect::execute_script(tx, trigger));
    let (st, v) = h
        .owner(Method::POST, "/api/control/clear", Some("alpha"), None)
        .await;
    assert_eq!(st, 500, "{v}");
    assert_eq!(v["error"]["code"], "internal", "{v}");
    let body = v.to_string();
    assert!(
        !body.contains("SECRET-DB-TEXT") && !body.contains("session_state"),
        "{body}"
    );
    h.stop().await;
}

#[tokio::test]
async fn durations_past_100_years_are_a_400_not_an_overflow() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("alpha").await;
    for (path, body) in [
        (
            "/api/mutes",
            json!({"caller_id": "test:x", "for": "106751991167d"}),
        ),
        (
            "/api/tokens",
            json!({"caller_id": "bob", "kind": "user", "expires_in": "106751991167d"}),
        ),
    ] {
        let (st, v) = h.owner(Method::POST, path, Some("alpha"), Some(body)).await;
        assert_eq!(st, 400, "{path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("100 years"),
            "{path}: {v}"
        );
    }
    assert_eq!(h.count("SELECT COUNT(*) FROM mutes"), 0);
    h.stop().await;
}

// ---------------------------------------------------------------------------
// messages show (issue 25 item 5)
// ---------------------------------------------------------------------------

/// `GET /api/messages/{id}?context=N` answers the message a review finding
/// cites (`[msg N]`) with up to N messages of its conversation on each side,
/// oldest first; another space's message is 404; through a link it is served
/// under the link's rules (tagged with its source, a conversation-scoped link
/// reaches only its conversation); `mrctl messages show` marks the message and
/// `messages recent` prints each message's id.
#[tokio::test]
async fn messages_show_answers_one_message_with_its_context_here_and_through_links() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("shown").await;
    h.create_space("hq").await;
    let a = h.platform_conversation("conv-a", "shown").await;
    let b = h.platform_conversation("conv-b", "shown").await;
    let base = chrono::Utc::now().timestamp_millis() - 3_600_000;
    // Ten messages in conversation a, interleaved with ten in b, one a minute.
    let ids: Vec<(i64, i64)> = h.write(move |tx| {
        let mut out = Vec::new();
        for i in 0..20i64 {
            let conv = if i % 2 == 0 { a } else { b };
            tx.execute(
                "INSERT INTO messages (space_id, conversation_id, sender_id, sender_name, role, text, created_at) \
                 VALUES ('shown', ?1, 'test:s', 'Sam', 'user', ?2, ?3)",
                &[&conv, &format!("line {i}"), &(base + i * 60_000)],
            )?;
            out.push((
                conv,
                tx.query_row(
                    "SELECT MAX(id) FROM messages WHERE conversation_id = ?1",
                    &[&conv],
                    |r| r.get(0),
                )?,
            ));
        }
        Ok(out)
    });
    let in_a: Vec<i64> = ids
        .iter()
        .filter(|(c, _)| *c == a)
        .map(|(_, id)| *id)
        .collect();
    let target = in_a[4];
    let (st, v) = h
        .owner(
            Method::GET,
            &format!("/api/messages/{target}?context=2"),
            Some("shown"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message_id"], target);
    let got: Vec<i64> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        got,
        in_a[2..7].to_vec(),
        "two before and two after, in its conversation only"
    );
    // No context: the message alone; at the edge of the conversation: fewer.
    let (_, v) = h
        .owner(
            Method::GET,
            &format!("/api/messages/{target}"),
            Some("shown"),
            None,
        )
        .await;
    assert_eq!(v["messages"].as_array().unwrap().len(), 1, "{v}");
    let (_, v) = h
        .owner(
            Method::GET,
            &format!("/api/messages/{}?context=3", in_a[0]),
            Some("shown"),
            None,
        )
        .await;
    let got: Vec<i64> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got[0], in_a[0], "{v}");
    assert_eq!(got.len(), 4, "nothing before the first: {v}");
    // Refusals, in words, and no row written.
    let before = h.all_row_counts();
    for (path, space, status, words) in [
        (
            format!("/api/messages/{target}"),
            "hq",
            404,
            "no such message in this space",
        ),
        (
            "/api/messages/abc".to_owned(),
            "shown",
            400,
            "message id must be a number",
        ),
        (
            format!("/api/messages/{target}?context=51"),
            "shown",
            400,
            "context must be between 0 and 50",
        ),
        (
            "/api/messages/999999".to_owned(),
            "shown",
            404,
            "no such message",
        ),
    ] {
        let (st, v) = h.owner(Method::GET, &path, Some(space), None).await;
        assert_eq!(st, status, "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(words),
            "{path}: {v}"
        );
    }
    assert_eq!(h.all_row_counts(), before);

    // Through a read link from hq: served, tagged with its source.
    h.link("hq", "shown", "read").await;
    let (st, v) = h
        .act_as(
            Method::GET,
            &format!("/api/messages/{target}?context=1"),
            &h.owner_token.clone(),
            "hq",
            "shown",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["source_space"], "shown");
    assert!(
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["source_space"] == "shown"),
        "{v}"
    );
    // A link scoped to conversation b does not reach a's message.
    h.create_space("desk").await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/links",
            None,
            Some(
                json!({"holder": "desk", "target": "shown", "level": "read", "conversation_id": b}),
            ),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = h
        .act_as(
            Method::GET,
            &format!("/api/messages/{target}"),
            &h.owner_token.clone(),
            "desk",
            "shown",
            None,
        )
        .await;
    assert_eq!(st, 404, "{v}");
    let in_b = ids.iter().find(|(c, _)| *c == b).unwrap().1;
    let (st, v) = h
        .act_as(
            Method::GET,
            &format!("/api/messages/{in_b}?context=1"),
            &h.owner_token.clone(),
            "desk",
            "shown",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["conversation_id"] == b),
        "{v}"
    );

    // mrctl: the message marked, its neighbours beside it, every line an id.
    let mut cmd = h.mrctl(&h.owner_token, None);
    cmd.args([
        "--in",
        "shown",
        "messages",
        "show",
        &target.to_string(),
        "--context",
        "1",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[1].starts_with(&format!("> [msg {target}] [")),
        "{text}"
    );
    assert!(lines[1].ends_with("Sam: line 8"), "{text}");
    assert!(
        lines[0].starts_with(&format!("  [msg {}] [", in_a[3])),
        "{text}"
    );
    let mut cmd = h.mrctl(&h.owner_token, Some("shown"));
    cmd.args(["messages", "recent", "--since", "2h", "--limit", "3"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !text.is_empty() && text.lines().all(|l| l.starts_with("[msg ")),
        "{text}"
    );
    let mut cmd = h.mrctl(&h.owner_token, Some("shown"));
    cmd.args(["messages", "show", "abc"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("message id must be a number"));
    h.stop().await;
}

/// Issue 25: a grant that names no role is the least one, `member`, not
/// `admin` (an operator who forgot `--role` handed out the space).
#[tokio::test]
async fn a_grant_without_a_role_grants_member() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("least").await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/roles",
            Some("least"),
            Some(json!({"caller_id": "test:newcomer"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["role"], "member", "{v}");
    let (_, v) = h
        .owner(Method::GET, "/api/roles", Some("least"), None)
        .await;
    let granted: Vec<&Value> = v["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["caller_id"] == "test:newcomer")
        .collect();
    assert_eq!(granted.len(), 1, "{v}");
    assert_eq!(granted[0]["role"], "member", "{v}");
    h.stop().await;
}

/// Issue 25: changes the host makes but that will not work say so: a model
/// chain naming a provider the host has no key for, and an identity mapped
/// to an operator id this host never saw (a typo maps a phone to nobody).
/// `mrctl` prints the warning on stderr and still exits 0.
#[tokio::test]
async fn keyless_models_and_unseen_operators_are_warned_about() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("warned").await;
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/model",
            Some("warned"),
            Some(json!({"chain": ["anthropic:claude-x"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["warning"]
            .as_str()
            .unwrap_or_default()
            .contains("no API key for anthropic:claude-x"),
        "{v}"
    );
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/model",
            Some("warned"),
            Some(json!({"chain": []})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(v.get("warning").is_none(), "{v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/identities",
            None,
            Some(json!({"platform_id": "telegram:77", "caller_id": "ownr"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    assert!(
        v["warning"]
            .as_str()
            .unwrap_or_default()
            .contains("\"ownr\" was never seen"),
        "{v}"
    );
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/identities",
            None,
            Some(json!({"platform_id": "telegram:78", "caller_id": "owner"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    assert!(v.get("warning").is_none(), "{v}");
    let mut cmd = h.mrctl(&h.owner_token, None);
    cmd.args(["identities", "link", "telegram:79", "nobody-here"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("warning: operator \"nobody-here\" was never seen"));
    h.stop().await;
}
