//! Issue 23 items 2 and 3 through a real host: a link never widens the
//! target's roles with reach; what a link changed comes back when it is
//! revoked or downgraded (a direct write since is kept); a role a link
//! overwrote comes back; a run trace read through a link withholds what a
//! step read from a space the reader has no link to. Each test fails on the
//! code before the fix.

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{HostOptions, TestHost};
use mercury::storage::Query;

const REACH: [&str; 7] = [
    "links.act",
    "links.list",
    "permissions.set",
    "roles.grant",
    "roles.revoke",
    "spaces.delete",
    "spaces.rename",
];

/// `mgmt` with alice as its admin, `client`, and an admin link mgmt → client.
async fn mgmt_and_client(h: &TestHost) -> (String, i64) {
    for s in ["mgmt", "client"] {
        h.create_space(s).await;
    }
    h.grant("mgmt", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let link = h.link("mgmt", "client", "admin").await;
    (alice, link)
}

fn perms_of(h: &TestHost, space: &str, role: &str) -> Option<String> {
    h.read(|c| {
        c.query_opt(
            "SELECT value FROM space_config WHERE space_id = ?1 AND key = ?2",
            &[&space, &&format!("role.{role}.permissions")],
            |r| r.get(0),
        )
    })
}

fn kv(h: &TestHost, table: &str, space: &str, key: &str) -> Option<String> {
    h.read(|c| {
        c.query_opt(
            &format!("SELECT value FROM {table} WHERE space_id = ?1 AND key = ?2"),
            &[&space, &key],
            |r| r.get(0),
        )
    })
}

fn role_of(h: &TestHost, space: &str, caller: &str) -> Option<(String, Option<i64>)> {
    h.read(|c| {
        c.query_opt(
            "SELECT role, link_id FROM space_roles WHERE space_id = ?1 AND caller_id = ?2",
            &[&space, &caller],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn through_a_link_no_role_of_the_target_gains_a_permission_that_manages_reach() {
    let h = TestHost::start(HostOptions::default()).await;
    let (alice, _) = mgmt_and_client(&h).await;
    let set = |role: &'static str, perms: Vec<&'static str>| {
        let (h, alice) = (&h, alice.clone());
        async move {
            h.act_as(
                Method::PUT,
                "/api/permissions",
                &alice,
                "mgmt",
                "client",
                Some(json!({"role": role, "permissions": perms})),
            )
            .await
        }
    };
    // The reproduction: member widened with links.act, spaces.delete and
    // permissions.set before any caller of mgmt was in client.
    let (st, v) = set(
        "member",
        vec!["prompt", "links.act", "spaces.delete", "permissions.set"],
    )
    .await;
    assert_eq!(st, 403, "{v}");
    let m = message(&v);
    assert!(
        m.contains("no role of the target may gain a permission that manages reach")
            && m.contains("links.act"),
        "{m}"
    );
    assert_eq!(
        perms_of(&h, "client", "member"),
        None,
        "nothing was written"
    );
    // Each permission of the list on its own, on a role nobody holds yet.
    for p in REACH {
        let (st, v) = set("helper", vec!["prompt", p]).await;
        assert_eq!(st, 403, "{p}: {v}");
        assert!(message(&v).contains(&format!("'{p}'")), "{p}: {v}");
    }
    // A widening without reach is the target's admin business: allowed.
    let (st, v) = set("helper", vec!["prompt", "prefs.set"]).await;
    assert_eq!(st, 200, "{v}");
    // A role with reach is not granted through a link either, to anyone.
    let (st, v) = h
        .act_as(
            Method::POST,
            "/api/roles",
            &alice,
            "mgmt",
            "client",
            Some(json!({"caller_id": "test:zed", "role": "admin"})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    assert!(message(&v).contains("manages reach"), "{v}");
    assert_eq!(role_of(&h, "client", "test:zed"), None);
    // Not even the owner's own token (or an agent acting for it) through a link.
    let (st, v) = h
        .act_as(
            Method::PUT,
            "/api/permissions",
            &h.owner_token,
            "mgmt",
            "client",
            Some(json!({"role": "member", "permissions": ["prompt", "roles.grant"]})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    // Directly, the target's admin (here the owner) still may.
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("client"),
            Some(json!({"role": "member", "permissions": ["prompt", "roles.grant"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    h.stop().await;
}

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_and_downgrade_restore_what_the_link_changed_and_keep_a_direct_write_since() {
    let h = TestHost::start(HostOptions::default()).await;
    let (alice, link) = mgmt_and_client(&h).await;
    // The client's own settings, written directly.
    for (method, path, body) in [
        (
            Method::PUT,
            "/api/permissions",
            json!({"role": "member", "permissions": ["prompt", "messages.read"]}),
        ),
        (
            Method::PUT,
            "/api/prefs",
            json!({"key": "tone", "value": "calm"}),
        ),
        (
            Method::PUT,
            "/api/config",
            json!({"key": "trigger.match", "value": "mention"}),
        ),
    ] {
        let (st, v) = h.owner(method, path, Some("client"), Some(body)).await;
        assert_eq!(st, 200, "{v}");
    }
    // Through the link.
    for (method, path, body) in [
        (
            Method::PUT,
            "/api/permissions",
            json!({"role": "member", "permissions": ["prompt"]}),
        ),
        (
            Method::PUT,
            "/api/prefs",
            json!({"key": "tone", "value": "loud"}),
        ),
        (
            Method::PUT,
            "/api/prefs",
            json!({"key": "tone", "value": "louder"}),
        ),
        (
            Method::PUT,
            "/api/prefs",
            json!({"key": "extra", "value": "1"}),
        ),
        (
            Method::PUT,
            "/api/config",
            json!({"key": "trigger.match", "value": "always"}),
        ),
        (
            Method::PUT,
            "/api/config",
            json!({"key": "rate_limit.per_minute", "value": "5"}),
        ),
    ] {
        let (st, v) = h
            .act_as(method, path, &alice, "mgmt", "client", Some(body))
            .await;
        assert_eq!(st, 200, "{path}: {v}");
    }
    // A direct write since: the client's admin chose 7 itself.
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/config",
            Some("client"),
            Some(json!({"key": "rate_limit.per_minute", "value": "7"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    // The link's record: each change with the value it replaced.
    let (st, v) = h
        .owner(
            Method::GET,
            &format!("/api/links/{link}"),
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let changes = v["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 6, "{v}");
    assert_eq!(changes[0]["kind"], "permissions");
    assert_eq!(changes[0]["before_value"], "messages.read,prompt");
    assert_eq!(changes[1]["before_value"], "calm");
    let out = h
        .mrctl(&h.owner_token, Some("mgmt"))
        .args(["links", "inspect", &link.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("changed preference tone in client: calm -> loud\n")
            && text.contains(
                "changed config rate_limit.per_minute in client: (none) -> 5 (written since)\n"
            ),
        "{text}"
    );

    // Revoked with mrctl: what was restored and what was kept, said.
    let out = h
        .mrctl(&h.owner_token, Some("mgmt"))
        .args(["links", "revoke", &link.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "restored permissions of member in client: messages.read,prompt (was prompt)",
        "restored preference tone in client: calm (was louder)",
        "restored preference extra in client: (none) (was 1)",
        "restored config trigger.match in client: mention (was always)",
        "kept config rate_limit.per_minute in client: 7 (changed since by a direct write)",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    // The target's own customised member set is back, and the rest.
    assert_eq!(
        perms_of(&h, "client", "member").as_deref(),
        Some("messages.read,prompt")
    );
    let (_, v) = h
        .owner(
            Method::GET,
            "/api/permissions?role=member",
            Some("client"),
            None,
        )
        .await;
    assert_eq!(v["permissions"], json!(["messages.read", "prompt"]), "{v}");
    assert_eq!(
        kv(&h, "space_preferences", "client", "tone").as_deref(),
        Some("calm")
    );
    assert_eq!(kv(&h, "space_preferences", "client", "extra"), None);
    assert_eq!(
        kv(&h, "space_config", "client", "trigger.match").as_deref(),
        Some("mention")
    );
    assert_eq!(
        kv(&h, "space_config", "client", "rate_limit.per_minute").as_deref(),
        Some("7")
    );
    let detail: String = h.read(|c| {
        c.query_row(
            "SELECT detail FROM space_link_audit WHERE action = 'revoke' AND link_id = ?1",
            &[&link],
            |r| r.get(0),
        )
    });
    assert!(
        detail.contains("restored preference tone in client to calm")
            && detail.contains("kept config rate_limit.per_minute in client at 7"),
        "{detail}"
    );

    // A downgrade to read restores too; the API answer lists it.
    let l2 = h.link("mgmt", "client", "admin").await;
    let (st, _) = h
        .act_as(
            Method::PUT,
            "/api/prefs",
            &alice,
            "mgmt",
            "client",
            Some(json!({"key": "tone", "value": "shouting"})),
        )
        .await;
    assert_eq!(st, 200);
    let (st, v) = h
        .owner(
            Method::PATCH,
            &format!("/api/links/{l2}"),
            None,
            Some(json!({"level": "read"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["restored"],
        json!([{"space_id": "client", "kind": "preference", "key": "tone",
                "value": "calm", "replaced": "shouting", "reason": null}]),
        "{v}"
    );
    assert_eq!(v["kept"], json!([]));
    assert_eq!(
        kv(&h, "space_preferences", "client", "tone").as_deref(),
        Some("calm")
    );
    // Settled once: the later revoke has nothing left to restore.
    let (st, v) = h
        .owner(Method::DELETE, &format!("/api/links/{l2}"), None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["restored"], json!([]), "{v}");

    // Two links on one key: the first one's revoke keeps the second's value
    // and hands it the original, which the second one's revoke restores.
    h.create_space("ops").await;
    h.grant("ops", "alice", "admin").await;
    let (first, second) = (
        h.link("mgmt", "client", "admin").await,
        h.link("ops", "client", "admin").await,
    );
    for (holder, value) in [("mgmt", "first"), ("ops", "second")] {
        let (st, v) = h
            .act_as(
                Method::PUT,
                "/api/prefs",
                &alice,
                holder,
                "client",
                Some(json!({"key": "tone", "value": value})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
    }
    let (_, v) = h
        .owner(Method::DELETE, &format!("/api/links/{first}"), None, None)
        .await;
    assert_eq!(v["kept"][0]["value"], "second", "{v}");
    assert!(
        v["kept"][0]["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("through link {second}")),
        "{v}"
    );
    let (_, v) = h
        .owner(Method::DELETE, &format!("/api/links/{second}"), None, None)
        .await;
    assert_eq!(v["restored"][0]["value"], "calm", "{v}");
    assert_eq!(
        kv(&h, "space_preferences", "client", "tone").as_deref(),
        Some("calm")
    );
    h.stop().await;
}

#[tokio::test]
async fn a_role_a_link_overwrote_or_revoked_comes_back_when_the_link_goes() {
    let h = TestHost::start(HostOptions::default()).await;
    let (alice, link) = mgmt_and_client(&h).await;
    h.grant("client", "test:cara", "viewer").await;
    h.grant("client", "test:dan", "member").await;
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("client"),
            Some(json!({"role": "viewer", "permissions": ["prompt", "messages.read"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    // Through the link: cara's viewer becomes member, dan's role goes.
    let (st, v) = h
        .act_as(
            Method::POST,
            "/api/roles",
            &alice,
            "mgmt",
            "client",
            Some(json!({"caller_id": "test:cara", "role": "member"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h
        .act_as(
            Method::DELETE,
            "/api/roles/test:dan",
            &alice,
            "mgmt",
            "client",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        role_of(&h, "client", "test:cara"),
        Some(("member".into(), Some(link)))
    );
    assert_eq!(role_of(&h, "client", "test:dan"), None);

    let (st, v) = h
        .owner(Method::DELETE, &format!("/api/links/{link}"), None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    // The earlier roles, not a deleted row.
    assert_eq!(
        role_of(&h, "client", "test:cara"),
        Some(("viewer".into(), None))
    );
    assert_eq!(
        role_of(&h, "client", "test:dan"),
        Some(("member".into(), None))
    );
    let restored: Vec<(String, String)> = v["restored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap_or("(none)").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        restored,
        [
            ("test:cara".to_owned(), "viewer".to_owned()),
            ("test:dan".to_owned(), "member".to_owned())
        ],
        "{v}"
    );
    // The role granted by the owner before, with its granter.
    let by: String = h
        .read(|c| c.query_row(
            "SELECT granted_by FROM space_roles WHERE space_id = 'client' AND caller_id = 'test:cara'",
            &[],
            |r| r.get(0)));
    assert_eq!(by, "owner");

    // A direct grant after the link's is the target's own: kept.
    let l2 = h.link("mgmt", "client", "admin").await;
    let (st, _) = h
        .act_as(
            Method::POST,
            "/api/roles",
            &alice,
            "mgmt",
            "client",
            Some(json!({"caller_id": "test:cara", "role": "member"})),
        )
        .await;
    assert_eq!(st, 200);
    h.grant("client", "test:cara", "member").await;
    let (st, v) = h
        .owner(Method::DELETE, &format!("/api/links/{l2}"), None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["restored"], json!([]), "{v}");
    assert_eq!(v["kept"][0]["key"], "test:cara", "{v}");
    assert_eq!(
        role_of(&h, "client", "test:cara"),
        Some(("member".into(), None))
    );
    h.stop().await;
}

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_read_through_a_link_withholds_what_a_step_read_from_a_third_space() {
    let h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: peek$",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": ["--space", "secret", "prefs", "list"]}}]},
            {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s).*SECRET-42",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": ["prefs", "list"]}}]},
            {"purpose": "turn", "match": "^tool_result\\(mrctl\\)", "reply": "done"},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "client", "secret"] {
        h.create_space(s).await;
    }
    h.grant("mgmt", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    for (space, key, value) in [
        ("secret", "code", "SECRET-42"),
        ("client", "mood", "client-own"),
    ] {
        let (st, v) = h
            .owner(
                Method::PUT,
                "/api/prefs",
                Some(space),
                Some(json!({"key": key, "value": value})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
    }
    h.link("client", "secret", "read").await;
    h.link("mgmt", "client", "read").await;
    let v = h.chat("client", "peek").await;
    assert_eq!(v["reply"], "done", "{v}");
    let run = v["run_id"].as_str().unwrap().to_owned();
    let stored: Vec<Option<String>> = {
        h.read(|c| c.query_all("SELECT source_spaces FROM run_steps WHERE run_id = ?1 AND kind = 'tool' ORDER BY seq", &[&&run], |r| r.get(0)))
    };
    assert_eq!(
        stored,
        [Some("secret".to_owned()), None],
        "the step records its source"
    );

    // mgmt has no link to secret: through its link to client the step that
    // read secret is withheld, the client's own step shown and tagged.
    let path = format!("/api/runs/{run}");
    let (st, v) = h
        .act_as(Method::GET, &path, &alice, "mgmt", "client", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(!v.to_string().contains("SECRET-42"), "{v}");
    let tools: Vec<&Value> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "tool")
        .collect();
    assert_eq!(tools.len(), 2, "{v}");
    assert_eq!(tools[0]["withheld"], true, "{v}");
    assert_eq!(tools[0]["source_space"], "secret");
    assert_eq!(tools[0]["output"], "[output from another space withheld]");
    assert!(tools[0]["arguments"].is_null(), "{v}");
    assert_eq!(tools[1]["source_space"], "client");
    assert!(
        tools[1]["output"].as_str().unwrap().contains("client-own"),
        "{v}"
    );
    // mrctl through the link: each step tagged with its true source.
    let out = h
        .mrctl(&alice, Some("mgmt"))
        .args(["--space", "client", "runs", "show", &run])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("SECRET-42"), "{text}");
    assert!(
        text.contains("[from secret]     [output from another space withheld]"),
        "{text}"
    );
    assert!(
        text.contains("[from client]     ") && text.contains("client-own"),
        "{text}"
    );
    assert!(text.contains("[from client] run: "), "{text}");
    assert!(
        text.contains("[from secret] #2 tool mrctl [arguments withheld] exit 0"),
        "{text}"
    );

    // With a link of its own to secret, mgmt reads the step, tagged secret.
    h.link("mgmt", "secret", "read").await;
    let (st, v) = h
        .act_as(Method::GET, &path, &alice, "mgmt", "client", None)
        .await;
    assert_eq!(st, 200, "{v}");
    let first = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "tool")
        .unwrap();
    assert!(first["withheld"].is_null(), "{v}");
    assert_eq!(first["source_space"], "secret");
    assert!(
        first["output"].as_str().unwrap().contains("SECRET-42"),
        "{v}"
    );
    h.stop().await;
}
