//! `ask` (issue 6, spec D-016): one turn of another space's agent on a
//! throwaway copy, every write refused and listed, the target unchanged.

use std::collections::HashMap;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{HostOptions, TestHost};

fn ask_rules() -> Value {
    json!({"rules": [
        {"purpose": "ask", "match": "^user: adversarial", "tool_calls": [{"name": "shell", "arguments": {"command": "echo hacked >> MEMORY.md && cat MEMORY.md | tail -1"}}]},
        {"purpose": "ask", "match": "^tool_result\\(shell\\)", "tool_calls": [{"name": "mrctl", "arguments": {"args": ["prefs", "set", "tone", "evil"]}}]},
        {"purpose": "ask", "match": "would have set preference", "tool_calls": [{"name": "mrctl", "arguments": {"args": ["tasks", "create", "--cron", "0 9 * * *", "--prompt", "spam"]}}]},
        {"purpose": "ask", "match": "would have created a task", "tool_calls": [{"name": "mrctl", "arguments": {"args": ["send", "hello from the sandbox"]}}]},
        {"purpose": "ask", "match": "would have sent", "tool_calls": [{"name": "write_file", "arguments": {"path": "new.txt", "content": "left behind?"}}]},
        {"purpose": "ask", "match": "^tool_result\\(write_file\\)", "reply": "all done"},
        {"purpose": "ask", "match_any": "(?s)secret phrase is ([A-Z0-9-]+).*user: what is the phrase", "reply": "X says $1"},
        {"purpose": "ask", "match": "^user: what happened", "match_any": "slow done", "reply": "I saw the live reply"},
        {"purpose": "turn", "match": "^user: slow", "latency_ms": 1500, "reply": "slow done"},
        {"reply": "ok"}
    ]})
}

async fn setup(sandbox: &'static str) -> (TestHost, String) {
    let host = TestHost::start(HostOptions {
        model: ask_rules(),
        sandbox,
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "x"] {
        host.create_space(s).await;
    }
    host.grant("mgmt", "alice", "admin").await;
    let alice = host.token("alice", "user").await;
    // X has a platform conversation, so a `send` would have somewhere to go.
    host.platform_conversation("xc", "x").await;
    host.link("mgmt", "x", "admin").await;
    (host, alice)
}

async fn containers_of(host: &TestHost) -> usize {
    let docker = bollard::Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let id = mercury::sandbox::instance_id_for(&host.data).unwrap();
    let filters = HashMap::from([("label", vec![format!("mercury.instance={id}")])]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker.list_containers(Some(opts)).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adversarial_ask_changes_nothing_in_the_target_and_lists_its_refusals() {
    let (host, alice) = setup("docker").await;
    let rows_before =
        host.rows_mentioning("x", &["token_usage", "spend_ledger", "space_link_audit"]);
    let files_before = host.workspace_hashes("x");
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "mgmt",
            "x",
            Some(json!({"message": "adversarial", "as": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "all done", "{v}");
    assert_eq!(v["space_id"], "x");
    let refusals: Vec<String> = v["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["summary"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        refusals,
        vec![
            "would have set preference tone to \"evil\"".to_string(),
            "would have created a task (cron 0 9 * * *): \"spam\"".to_string(),
            "would have sent \"hello from the sandbox\"".to_string(),
        ],
        "{v}"
    );
    // What the agent wrote in its copy is listed, and went with the copy.
    assert_eq!(
        v["discarded"],
        json!({"changes": [
            {"path": "MEMORY.md", "kind": "written"},
            {"path": "new.txt", "kind": "written"}
        ], "more": false}),
        "{v}"
    );
    assert!(v["tokens_in"].as_u64().unwrap() > 0);
    // X is byte-identical: rows (but usage accounting, token_usage and the
    // spend ledger, and the link audit) and files.
    assert_eq!(
        host.rows_mentioning("x", &["token_usage", "spend_ledger", "space_link_audit"]),
        rows_before
    );
    assert_eq!(host.workspace_hashes("x"), files_before);
    assert!(
        host.count("SELECT COUNT(*) FROM token_usage WHERE space_id = 'x' AND kind = 'ask'") > 0
    );
    // No copy and no container remain.
    let tmp = host.data.join("tmp");
    assert_eq!(
        std::fs::read_dir(&tmp)
            .map(std::iter::Iterator::count)
            .unwrap_or(0),
        0,
        "ask copies left in {}",
        tmp.display()
    );
    assert_eq!(containers_of(&host).await, 0);
    host.stop().await;
}

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_uses_the_targets_own_instructions() {
    let (host, alice) = setup("process").await;
    std::fs::write(
        host.data.join("spaces/x/AGENTS.md"),
        "Only X knows: the secret phrase is PINEAPPLE-42.\n",
    )
    .unwrap();
    let out = host
        .mrctl(&alice, Some("mgmt"))
        .args(["--space", "x", "ask", "what is the phrase?"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("[x] X says PINEAPPLE-42"), "{text}");
    assert!(text.contains("refused writes: none"), "{text}");
    assert!(
        text.contains("written in the throwaway copy (discarded): nothing"),
        "{text}"
    );
    assert!(text.contains("tokens:"), "{text}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_during_a_live_turn_waits_for_a_consistent_copy() {
    let (host, alice) = setup("process").await;
    let live = {
        let url = host.url.clone();
        let token = host.owner_token.clone();
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/api/chat"))
                .bearer_auth(token)
                .header("x-mercury-space", "x")
                .json(&json!({"text": "slow"}))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    // Ask only once X's live turn is in flight.
    let n = host
        .wait_count(
            "SELECT COUNT(*) FROM runs WHERE space_id = 'x' AND status = 'running'",
            1,
            10,
        )
        .await;
    assert_eq!(n, 1, "the live turn should be running");
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "mgmt",
            "x",
            Some(json!({"message": "what happened today?"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    // The copy was taken after the live turn ended: the ask saw its reply.
    assert_eq!(v["reply"], "I saw the live reply", "{v}");
    let live = live.await.unwrap();
    assert_eq!(
        live["reply"], "slow done",
        "the live reply is unaffected: {live}"
    );
    host.stop().await;
}

#[tokio::test]
async fn ask_needs_an_admin_link_and_an_admin_caller() {
    let (host, alice) = setup("process").await;
    host.create_space("peer").await;
    host.link("peer", "x", "read").await;
    host.grant("peer", "alice", "admin").await;
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "peer",
            "x",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(st, 403, "a read link cannot ask: {v}");
    host.grant("mgmt", "bob", "member").await;
    let (st, _) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("mgmt"),
            Some(json!({"role": "member", "permissions": ["prompt", "links.act"]})),
        )
        .await;
    assert_eq!(st, 200);
    let bob = host.token("bob", "user").await;
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &bob,
            "mgmt",
            "x",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(st, 403, "a member caller is capped at read: {v}");
    let (st, v) = host
        .call(
            Method::POST,
            "/api/ask",
            Some(&alice),
            Some("mgmt"),
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(st, 400, "ask without a link target is refused: {v}");
    host.stop().await;
}
