//! Issue 11 (Security II) through a real host: platform identities, what a
//! link gives and takes back, `ask --as`, the act-as audit under a client
//! that goes away, space deletion, the spaces list, filtered edges, text
//! hygiene, `?all` through a link, and the error shapes. One regression test
//! (or more) per item of the issue; each fails on the code before its fix.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};
use mercury::storage::Query;

fn opts(model: Value) -> HostOptions {
    HostOptions {
        model,
        // These tests are about an open bot's live path: strangers are
        // answered (the sender policy has its own tests, tests/it/pairing.rs).
        config: vec![
            ("ingress.per_caller_per_minute", Yaml::Number(1000.into())),
            ("ingress.dm_policy", Yaml::String("open".into())),
        ],
        ..Default::default()
    }
}

/// The reply text to the platform message `mid` (waits for the turn).
async fn reply_to(h: &TestHost, message_id: i64) -> String {
    let sql = format!("SELECT COUNT(*) FROM messages WHERE reply_to = {message_id}");
    assert_eq!(
        h.wait_count(&sql, 1, 60).await,
        1,
        "no reply to {message_id}"
    );
    h.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE reply_to = ?1",
            &[&message_id],
            |r| r.get(0),
        )
    })
}

async fn ingest_as(
    h: &TestHost,
    adapter: &str,
    platform: &str,
    sender: &str,
    text: &str,
    mid: &str,
) -> (u16, Value) {
    h.call(
        Method::POST,
        "/api/ingress",
        Some(adapter),
        None,
        Some(
            json!({"platform": platform, "conversation": "phone", "sender_id": sender,
                    "text": text, "message_id": mid, "is_group": false}),
        ),
    )
    .await
}

fn pref(h: &TestHost, space: &str, key: &str) -> Option<(String, String)> {
    h.read(|c| {
        c.query_opt(
            "SELECT value, updated_by FROM space_preferences WHERE space_id = ?1 AND key = ?2",
            &[&space, &key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
}

// ---------------------------------------------------------------------------
// 1. identities
// ---------------------------------------------------------------------------

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_cannot_claim_an_operator_and_a_mapped_identity_acts_as_one() {
    let h = TestHost::start_process(opts(json!({"rules": [
        {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "tool said: $1"},
        {"purpose": "turn", "match": "^user: set (.*)$",
         "tool_calls": [{"name": "mrctl", "arguments": {"args": ["prefs", "set", "tone", "$1"]}}]},
        {"reply": "ok"}
    ]})))
    .await;
    h.create_space("mgmt").await;
    h.platform_conversation("phone", "mgmt").await;
    // A bridge trusted with identities (issue 23): without the flag no
    // mapping holds (tests/it/pairing.rs).
    let adapter = h.trusted_adapter_token("bridge", "test").await;

    // The body says "owner": the turn still runs as test:owner, with no rights.
    let (st, v) = ingest_as(&h, &adapter, "test", "owner", "set evil", "a-1").await;
    assert_eq!(st, 202, "{v}");
    let reply = reply_to(&h, v["message_id"].as_i64().unwrap()).await;
    assert!(reply.contains("prefs.set"), "refused: {reply}");
    assert_eq!(pref(&h, "mgmt", "tone"), None, "no preference was set");
    let sender: String = h.read(|c| {
        c.query_row(
            "SELECT sender_id FROM messages WHERE platform_message_id = 'a-1'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(sender, "test:owner");

    // An adapter is bound to its platform; tokens say which at mint.
    let (st, v) = ingest_as(&h, &adapter, "telegram", "42", "hi", "a-2").await;
    assert_eq!(st, 403, "another platform's ingress: {v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tokens",
            None,
            Some(json!({"caller_id": "x", "kind": "adapter"})),
        )
        .await;
    assert_eq!(st, 400, "an adapter needs a platform: {v}");
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tokens",
            None,
            Some(json!({"caller_id": "test:owner", "kind": "user"})),
        )
        .await;
    assert_eq!(st, 400, "a user id never looks like a platform sender: {v}");

    // Only a global admin maps an identity; then the sender acts as the operator.
    let alice = h.token("alice", "user").await;
    let (st, _) = h
        .call(
            Method::POST,
            "/api/identities",
            Some(&alice),
            None,
            Some(json!({"platform_id": "test:555", "caller_id": "owner"})),
        )
        .await;
    assert_eq!(st, 403);
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["identities", "link", "test:555", "owner"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (st, v) = h.owner(Method::GET, "/api/identities", None, None).await;
    assert_eq!(st, 200);
    assert_eq!(v["identities"][0]["platform_id"], "test:555", "{v}");
    let (st, v) = ingest_as(&h, &adapter, "test", "555", "set warm", "a-3").await;
    assert_eq!(st, 202, "{v}");
    let reply = reply_to(&h, v["message_id"].as_i64().unwrap()).await;
    assert!(!reply.contains("requires"), "{reply}");
    assert_eq!(
        pref(&h, "mgmt", "tone"),
        Some(("warm".into(), "owner".into())),
        "the mapped sender acts as the owner"
    );
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["identities", "unlink", "test:555"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (st, v) = ingest_as(&h, &adapter, "test", "555", "set cold", "a-4").await;
    assert_eq!(st, 202, "{v}");
    let reply = reply_to(&h, v["message_id"].as_i64().unwrap()).await;
    assert!(reply.contains("prefs.set"), "unmapped again: {reply}");
    assert_eq!(pref(&h, "mgmt", "tone").map(|p| p.0), Some("warm".into()));
    let (_, v) = h
        .owner(Method::GET, "/api/identities/audit", None, None)
        .await;
    let actions: Vec<&str> = v["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["unlink", "link"], "{v}");

    // The outbox shows an adapter its own platform's replies only.
    let other = h.adapter_token("bridge-2", "other").await;
    let (st, mine) = h
        .call(Method::GET, "/api/outbox", Some(&adapter), None, None)
        .await;
    assert_eq!(st, 200);
    assert!(!mine["items"].as_array().unwrap().is_empty(), "{mine}");
    let (st, theirs) = h
        .call(Method::GET, "/api/outbox", Some(&other), None, None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(theirs["items"], json!([]), "{theirs}");
    h.stop().await;
}

// ---------------------------------------------------------------------------
// 2. what a link gives, and takes back
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_link_never_grants_its_own_side_a_role_and_revoke_takes_back_what_it_gave() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t"] {
        h.create_space(s).await;
    }
    h.grant("h", "alice", "admin").await;
    h.grant("h", "bob", "member").await;
    h.grant("t", "bob", "member").await;
    let alice = h.token("alice", "user").await;
    let link = h.link("h", "t", "admin").await;
    let grant = |caller: &'static str, role: &'static str| {
        let alice = alice.clone();
        let h = &h;
        async move {
            h.act_as(
                Method::POST,
                "/api/roles",
                &alice,
                "h",
                "t",
                Some(json!({"caller_id": caller, "role": role})),
            )
            .await
        }
    };
    for who in ["alice", "bob"] {
        let (st, v) = grant(who, "admin").await;
        assert_eq!(st, 403, "{who}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("never gives the acting caller or a caller of the holder"),
            "{v}"
        );
    }
    // bob (of the holder) is a member of t: the member role is out of reach too.
    let (st, v) = h
        .act_as(
            Method::PUT,
            "/api/permissions",
            &alice,
            "h",
            "t",
            Some(json!({"role": "member", "permissions": ["prompt", "roles.grant"]})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    // No two-step deletion: alice has no role in t, and delete is not on the allowlist.
    let (st, _) = h
        .call(
            Method::DELETE,
            "/api/spaces/current",
            Some(&alice),
            Some("t"),
            None,
        )
        .await;
    assert_eq!(st, 403);
    let (st, _) = h
        .act_as(
            Method::DELETE,
            "/api/spaces/current",
            &alice,
            "h",
            "t",
            None,
        )
        .await;
    assert_eq!(st, 400);

    // A third party's role granted through the link is recorded with it
    // (not admin: no role with reach comes through a link, issue 23)…
    let (st, v) = grant("test:dora", "admin").await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = grant("test:dora", "member").await;
    assert_eq!(st, 200, "{v}");
    let (_, roles) = h.owner(Method::GET, "/api/roles", Some("t"), None).await;
    let dora = roles["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["caller_id"] == "test:dora")
        .cloned()
        .unwrap();
    assert_eq!(dora["link_id"], link);
    let (st, v) = h
        .owner(Method::GET, &format!("/api/links/{link}"), Some("h"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["granted_roles"][0]["caller_id"], "test:dora", "{v}");
    // …and removed with it; the answer lists what went.
    let (st, v) = h
        .owner(Method::DELETE, &format!("/api/links/{link}"), None, None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        v["removed_roles"],
        json!([{"space_id": "t", "caller_id": "test:dora", "role": "member"}])
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_roles WHERE caller_id = 'test:dora'"),
        0
    );
    let detail: String = h.read(|c| {
        c.query_row(
            "SELECT detail FROM space_link_audit WHERE action = 'revoke' AND link_id = ?1",
            &[&link],
            |r| r.get(0),
        )
    });
    assert!(detail.contains("test:dora in t"), "{detail}");

    // A downgrade to read takes them back as well.
    let l2 = h.link("h", "t", "admin").await;
    let (st, _) = grant("test:erin", "member").await;
    assert_eq!(st, 200);
    let (st, v) = h
        .owner(
            Method::PATCH,
            &format!("/api/links/{l2}"),
            None,
            Some(json!({"level": "read"})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["removed_roles"][0]["caller_id"], "test:erin", "{v}");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_roles WHERE caller_id = 'test:erin'"),
        0
    );
    // A direct grant is the target's own: a link's revoke never touches it.
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_roles WHERE space_id = 't' AND caller_id = 'bob'"),
        1
    );
}

// ---------------------------------------------------------------------------
// 3. + 8. ask --as, ask stripping and tags
// ---------------------------------------------------------------------------

fn whoami_in(reply: &str) -> Value {
    serde_json::from_str(reply).unwrap_or_else(|e| panic!("{e}: {reply}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_as_member_or_admin_carries_exactly_that_set_and_never_links_act() {
    let h = TestHost::start_process(opts(json!({"rules": [
        {"purpose": "ask", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "$1"},
        {"purpose": "ask", "match": "^user: whoami",
         "tool_calls": [{"name": "mrctl", "arguments": {"args": ["--json", "whoami"]}}]},
        {"purpose": "ask", "match": "^user: reach",
         "tool_calls": [{"name": "mrctl", "arguments": {"args": ["--space", "y", "prefs", "list"]}}]},
        {"purpose": "ask", "match": "^user: hidden", "reply": "hel\u{200B}lo\u{202E} there\u{E0041}"},
        {"reply": "ok"}
    ]})))
    .await;
    for s in ["mgmt", "x", "y"] {
        h.create_space(s).await;
    }
    h.link("mgmt", "x", "admin").await;
    // x's own link: an ask in x must never reach through it.
    h.link("x", "y", "admin").await;
    let ask = |message: &'static str, role: Option<&'static str>| {
        let mut body = json!({"message": message});
        if let Some(r) = role {
            body["as"] = json!(r);
        }
        let h = &h;
        async move {
            let (st, v) = h
                .act_as(
                    Method::POST,
                    "/api/ask",
                    &h.owner_token,
                    "mgmt",
                    "x",
                    Some(body),
                )
                .await;
            assert_eq!(st, 200, "{v}");
            v
        }
    };
    let (_, perms) = h
        .owner(Method::GET, "/api/permissions", Some("x"), None)
        .await;
    let set = |role: &str| -> Vec<Value> {
        perms["roles"][role]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| *p != "links.act")
            .cloned()
            .collect()
    };
    for (role, want) in [
        (None, "member"),
        (Some("member"), "member"),
        (Some("admin"), "admin"),
    ] {
        let v = ask("whoami", role).await;
        let me = whoami_in(v["reply"].as_str().unwrap());
        assert_eq!(me["space_id"], "x", "{me}");
        assert_eq!(me["role"], want, "{role:?}: {me}");
        assert_eq!(me["permissions"], json!(set(want)), "{role:?}: {me}");
        assert!(!me["permissions"]
            .as_array()
            .unwrap()
            .contains(&json!("links.act")));
    }
    // No reach through the target's own links, even as admin.
    let v = ask("reach", Some("admin")).await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.contains("links.act"), "{reply}");
    assert_eq!(
        h.count(
            "SELECT COUNT(*) FROM space_link_audit WHERE holder_space_id = 'x' AND action = 'act'"
        ),
        0,
        "the ask never even reached the grant check in y"
    );

    // 8: an ask's reply is stripped and tagged, and mrctl shows the tag.
    let v = ask("hidden", None).await;
    assert_eq!(v["reply"], "hello there", "{v}");
    assert_eq!(v["source_space"], "x");
    let out = h
        .mrctl(&h.owner_token, Some("mgmt"))
        .args(["--space", "x", "ask", "hidden"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("[x] hello there\n"), "{text}");
    h.stop().await;
}

// ---------------------------------------------------------------------------
// 4. the audit row survives a client that goes away
// ---------------------------------------------------------------------------

async fn walk_away(h: &TestHost, path: &str, body: Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let r = client
        .post(format!("{}{path}", h.url))
        .bearer_auth(&h.owner_token)
        .header("x-mercury-space", "h")
        .header("x-mercury-act-as", "t")
        .json(&body)
        .send()
        .await;
    assert!(r.is_err(), "the client should give up first: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_write_or_mid_ask_still_leaves_its_audit_row() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "compact", "latency_ms": 2500, "reply": "the summary"},
        {"purpose": "ask", "latency_ms": 2500, "reply": "late answer"},
        {"reply": "ok"}
    ]})))
    .await;
    for s in ["h", "t"] {
        h.create_space(s).await;
    }
    h.link("h", "t", "admin").await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/chat",
            Some("t"),
            Some(json!({"text": "hello"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    const ROW: &str = "SELECT COUNT(*) FROM space_link_audit WHERE action = 'act' AND path = ";

    walk_away(&h, "/api/control/compact", json!({})).await;
    assert_eq!(
        h.wait_count(&format!("{ROW} '/api/control/compact'"), 1, 10)
            .await,
        1,
        "the row was committed before the effect"
    );
    // The effect still happens, and the row says the client was gone.
    assert_eq!(
        h.wait_count(
            "SELECT COUNT(*) FROM session_state WHERE space_id = 't' AND summary = 'the summary'",
            1,
            20
        )
        .await,
        1
    );
    assert_eq!(
        h.wait_count(
            &format!("{ROW} '/api/control/compact' AND status = 499"),
            1,
            10
        )
        .await,
        1
    );

    // An ask whose client is gone is not stopped: it runs to its end (and is
    // paid for), and its row is there from the start.
    walk_away(&h, "/api/ask", json!({"message": "anyone?"})).await;
    assert_eq!(h.wait_count(&format!("{ROW} '/api/ask'"), 1, 10).await, 1);
    assert_eq!(
        h.wait_count(&format!("{ROW} '/api/ask' AND status = 499"), 1, 10)
            .await,
        1
    );
    assert!(
        h.wait_count(
            "SELECT COUNT(*) FROM token_usage WHERE space_id = 't' AND kind = 'ask'",
            1,
            20
        )
        .await
            >= 1
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_row_records_the_concrete_path_the_run_and_before_after() {
    let h = TestHost::start_process(opts(json!({"rules": [
        {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "tool said: $1"},
        {"purpose": "turn", "match": "^user: drop",
         "tool_calls": [{"name": "mrctl", "arguments": {"args": ["--space", "t", "prefs", "delete", "tone"]}}]},
        {"reply": "ok"}
    ]})))
    .await;
    for s in ["h", "t"] {
        h.create_space(s).await;
    }
    h.link("h", "t", "admin").await;
    let (st, _) = h
        .act_as(
            Method::PUT,
            "/api/prefs",
            &h.owner_token,
            "h",
            "t",
            Some(json!({"key": "tone", "value": "warm"})),
        )
        .await;
    assert_eq!(st, 200);
    let (st, _) = h
        .act_as(
            Method::PUT,
            "/api/prefs",
            &h.owner_token,
            "h",
            "t",
            Some(json!({"key": "tone", "value": "cold"})),
        )
        .await;
    assert_eq!(st, 200);
    h.wait_count(
        "SELECT COUNT(*) FROM space_link_audit WHERE route = '/api/prefs' AND status = 200",
        2,
        10,
    )
    .await;
    let (before, after): (String, String) = h
        .read(|c| c.query_row(
            "SELECT before_value, after_value FROM space_link_audit WHERE route = '/api/prefs' ORDER BY id DESC LIMIT 1",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?))));
    assert_eq!(
        serde_json::from_str::<Value>(&before).unwrap(),
        json!({"value": "warm"})
    );
    assert_eq!(
        serde_json::from_str::<Value>(&after).unwrap(),
        json!({"key": "tone", "value": "cold"})
    );
    // A turn's act-as: the concrete path and its run.
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/chat",
            Some("h"),
            Some(json!({"text": "drop"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let run = v["run_id"].as_str().unwrap().to_string();
    let sql = "SELECT COUNT(*) FROM space_link_audit WHERE method = 'DELETE' AND status = 200";
    assert_eq!(h.wait_count(sql, 1, 10).await, 1);
    let (route, path, run_id, before): (String, String, Option<String>, String) = h
        .read(|c| c.query_row(
            "SELECT route, path, run_id, before_value FROM space_link_audit WHERE method = 'DELETE'",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))));
    assert_eq!(
        (route.as_str(), path.as_str(), run_id.as_deref()),
        ("/api/prefs/{key}", "/api/prefs/tone", Some(run.as_str()))
    );
    assert_eq!(
        serde_json::from_str::<Value>(&before).unwrap(),
        json!({"value": "cold"})
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// 5. deleting a space
// ---------------------------------------------------------------------------

#[tokio::test]
async fn deleting_a_space_revokes_its_links_and_removes_its_workspace() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t", "u"] {
        h.create_space(s).await;
    }
    h.grant("h", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let into = h.link("h", "t", "admin").await;
    let out_of = h.link("t", "u", "admin").await;
    // A role t's link gave in u goes with the link.
    h.grant("t", "owner-helper", "admin").await;
    let (st, v) = h
        .act_as(
            Method::POST,
            "/api/roles",
            &h.owner_token,
            "t",
            "u",
            Some(json!({"caller_id": "test:via-t", "role": "member"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let ws = h.data.join("spaces/t");
    let templates = h.workspace_hashes("u");
    std::fs::write(ws.join("MEMORY.md"), "the old client's secrets\n").unwrap();
    // A symlink planted in the workspace: deletion must not follow it.
    let outside = h.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), "not the space's").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();

    let (st, v) = h
        .owner(Method::DELETE, "/api/spaces/current", Some("t"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["links_revoked"], json!([into, out_of]), "{v}");
    assert_eq!(v["roles_removed"][0]["caller_id"], "test:via-t", "{v}");
    assert!(!ws.exists(), "the workspace is gone");
    assert!(
        outside.join("keep.txt").exists(),
        "the symlink was not followed"
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_link_audit WHERE action = 'revoke' AND detail LIKE 'space t was deleted%'"),
        2
    );
    // What t's link had changed in u is put back, and the audit says so.
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_link_audit WHERE action = 'revoke' AND detail = 'space t was deleted; restored role of test:via-t in u to (none)'"),
        1
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_roles WHERE caller_id = 'test:via-t'"),
        0
    );
    // Re-created: the templates, no link, no old file.
    h.create_space("t").await;
    assert_eq!(h.workspace_hashes("t"), templates);
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_links WHERE (holder_space_id = 't' OR target_space_id = 't') AND revoked_at IS NULL"),
        0
    );
    let (st, _) = h
        .act_as(Method::GET, "/api/prefs", &alice, "h", "t", None)
        .await;
    assert_eq!(st, 403, "the old admin reach is gone");
    let spaces_dir: Vec<String> = std::fs::read_dir(h.data.join("spaces"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !spaces_dir.iter().any(|n| n.starts_with("t-")),
        "no tombstone under spaces/: {spaces_dir:?}"
    );
}

// ---------------------------------------------------------------------------
// 6. the spaces list and auto-space ids
// ---------------------------------------------------------------------------

#[tokio::test]
async fn spaces_list_per_caller_kind_and_auto_space_ids_carry_no_platform_id() {
    // An auto-created space for a stranger's DM: an open bot (the sender
    // policy has its own tests, tests/it/pairing.rs).
    let h = TestHost::start(HostOptions {
        config: vec![("ingress.dm_policy", Yaml::String("open".into()))],
        ..Default::default()
    })
    .await;
    for s in ["a", "b", "c"] {
        h.create_space(s).await;
    }
    h.grant("a", "alice", "admin").await;
    h.grant("b", "alice", "member").await;
    let alice = h.token("alice", "user").await;
    let nobody = h.token("nobody", "user").await;
    let ids = |v: &Value| -> Vec<String> {
        v["spaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (st, v) = h
        .call(Method::GET, "/api/spaces", Some(&alice), Some("a"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(ids(&v), ["a", "b"], "a space admin sees only their spaces");
    let (st, v) = h
        .call(Method::GET, "/api/spaces", Some(&nobody), None, None)
        .await;
    assert_eq!(st, 200);
    assert!(ids(&v).is_empty());
    let (_, v) = h.owner(Method::GET, "/api/spaces", None, None).await;
    assert_eq!(ids(&v), ["a", "b", "c"], "a global admin sees all");

    let adapter = h.adapter_token("wa", "whatsapp").await;
    let (st, v) = h
        .call(
            Method::POST,
            "/api/ingress",
            Some(&adapter),
            None,
            Some(
                json!({"platform": "whatsapp", "conversation": "31612345678@s.whatsapp.net",
                        "sender_id": "31612345678@s.whatsapp.net", "sender_name": "Jane Doe",
                        "title": "Jane Doe", "text": "hi", "message_id": "w1", "is_group": false}),
            ),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    let id = v["space_id"].as_str().unwrap();
    assert!(
        id.starts_with("whatsapp-") && !id.contains("3161234"),
        "{id}"
    );
    let name: String = h.read(|c| {
        c.query_row("SELECT name FROM spaces WHERE id = ?1", &[&id], |r| {
            r.get(0)
        })
    });
    // The name says who the chat is (to those who may read the space);
    // neither it nor the id carries the phone number.
    assert_eq!(name, "whatsapp DM: Jane Doe");
    assert!(!name.contains("3161234"), "{name}");
}

// ---------------------------------------------------------------------------
// 7. filtered edges
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_filtered_edge_counts_only_inside_its_conversation() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t"] {
        h.create_space(s).await;
    }
    h.grant("h", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let c1 = h.platform_conversation("c1", "t").await;
    let c2 = h.platform_conversation("c2", "t").await;
    h.link("h", "*", "read").await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/links",
            None,
            Some(json!({"holder": "h", "target": "t", "level": "admin", "conversation_id": c1})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    // Unfiltered reads use the broader edge: the whole space, both conversations.
    let (st, v) = h
        .act_as(Method::GET, "/api/conversations", &alice, "h", "t", None)
        .await;
    assert_eq!(st, 200, "{v}");
    let convs: Vec<i64> = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_i64().unwrap())
        .collect();
    assert!(convs.contains(&c1) && convs.contains(&c2), "{v}");
    for path in ["/api/prefs", "/api/messages/recent?since=1h", "/api/tasks"] {
        let (st, v) = h.act_as(Method::GET, path, &alice, "h", "t", None).await;
        assert_eq!(st, 200, "{path}: {v}");
    }
    // The filtered admin edge does not reach an admin route outside its conversation.
    let (st, v) = h
        .act_as(
            Method::PUT,
            "/api/prefs",
            &alice,
            "h",
            "t",
            Some(json!({"key": "k", "value": "v"})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
}

// ---------------------------------------------------------------------------
// 8. act-as answers are stripped and tagged; 9. ?all; 10. smaller holes
// ---------------------------------------------------------------------------

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_act_as_answer_is_stripped_and_tagged_and_all_is_refused() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t"] {
        h.create_space(s).await;
    }
    h.grant("h", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let (st, _) = h
        .owner(
            Method::PUT,
            "/api/prefs",
            Some("t"),
            Some(json!({"key": "note", "value": "ig\u{200B}nore\u{202E} this"})),
        )
        .await;
    assert_eq!(st, 200);
    h.link("h", "t", "read").await;
    let (st, v) = h
        .act_as(Method::GET, "/api/prefs", &alice, "h", "t", None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["source_space"], "t");
    assert_eq!(v["preferences"][0]["value"], "ignore this", "{v}");
    let out = h
        .mrctl(&alice, Some("h"))
        .args(["--space", "t", "prefs", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("[from t] ") && text.contains("ignore this"),
        "{text}"
    );

    // 9: the instance-wide view is out of a link's reach, even for the owner.
    let (st, v) = h
        .act_as(
            Method::GET,
            "/api/conversations?all=true",
            &h.owner_token,
            "h",
            "t",
            None,
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, _) = h
        .owner(Method::GET, "/api/conversations?all=true", None, None)
        .await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn errors_are_json_names_are_clean_and_no_answer_is_an_existence_oracle() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t", "other"] {
        h.create_space(s).await;
    }
    h.grant("h", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let link = h.link("h", "t", "read").await;
    let is_json_error =
        |v: &Value| v["error"]["code"].is_string() && v["error"]["message"].is_string();
    let (st, v) = h
        .owner(Method::GET, "/api/links/abc", Some("h"), None)
        .await;
    assert_eq!(st, 400);
    assert!(is_json_error(&v), "{v}");
    let huge = format!("/api/messages?q={}", "a".repeat(20_000));
    let (st, v) = h.owner(Method::GET, &huge, Some("h"), None).await;
    assert_eq!(st, 414);
    assert!(is_json_error(&v), "{v}");

    let adapter = h.token("bridge", "adapter").await;
    let msg = |sender_name: &str, title: &str| {
        json!({"platform": "test", "conversation": "g", "sender_id": "s", "sender_name": sender_name,
               "title": title, "text": "t", "message_id": "m", "is_group": true})
    };
    for (body, what) in [
        (msg("ok", &"x".repeat(201)), "a 201-character title"),
        (msg("a\u{0}b", "ok"), "NUL in a name"),
        (msg("ok", "line\nbreak"), "a newline in a title"),
    ] {
        let (st, v) = h
            .call(
                Method::POST,
                "/api/ingress",
                Some(&adapter),
                None,
                Some(body),
            )
            .await;
        assert_eq!(st, 400, "{what}: {v}");
    }
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/spaces",
            None,
            Some(json!({"id": "n", "name": "a\u{0}b"})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM conversations WHERE external_id = 'g'"),
        0
    );

    // Off the allowlist: the same answer whatever the target.
    let off = |target: &'static str| {
        let (h, alice) = (&h, alice.clone());
        async move {
            h.act_as(Method::GET, "/api/spaces", &alice, "h", target, None)
                .await
        }
    };
    let answers = [off("t").await, off("other").await, off("nosuch").await];
    for a in &answers {
        assert_eq!(a, &answers[0], "{answers:?}");
    }
    assert_eq!(answers[0].0, 400);

    // whoami through a link: the link's level and where it comes from.
    let (st, v) = h
        .act_as(Method::GET, "/api/whoami", &alice, "h", "t", None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        v["via"],
        json!({"holder": "h", "level": "read", "link_id": link, "conversation_id": null})
    );
    assert_eq!(v["permissions"], json!([]), "{v}");
    assert!(v["role"].is_null(), "{v}");
}
