//! Issue 3 from the outside: a platform message goes in through
//! `/api/ingress`, the space's actor runs a turn against the scripted model,
//! tools run in the `process` sandbox, and the reply comes out through the
//! outbox, with nothing lost or doubled across crashes, panics and replays.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::api::{mercury, run};
use crate::common::{HostOptions, TestHost};
use mercury::storage::Query;

/// Options with a roomy per-caller limit, so bursts are not told to slow down.
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

/// Ingests one message and returns (space id, stored message id); it must be queued.
async fn send(
    h: &TestHost,
    adapter: &str,
    conv: &str,
    sender: &str,
    text: &str,
    mid: &str,
) -> (String, i64) {
    let (st, v) = h.ingest(adapter, conv, sender, text, mid, false).await;
    assert_eq!(
        (st, v["status"].as_str()),
        (202, Some("queued")),
        "{text}: {v}"
    );
    (
        v["space_id"].as_str().unwrap().to_string(),
        v["message_id"].as_i64().unwrap(),
    )
}

/// (user message id, reply text) of every assistant reply in the space, in reply order.
fn replies(h: &TestHost, space: &str) -> Vec<(i64, String)> {
    h.read(|c| c.query_all("SELECT reply_to, text FROM messages WHERE space_id = ?1 AND role = 'assistant' ORDER BY id", &[&space], |r| Ok((r.get(0)?, r.get(1)?))))
}

/// User messages of the space: (id, text, status), oldest first.
fn user_messages(h: &TestHost, space: &str) -> Vec<(i64, String, Option<String>)> {
    h.read(|c| c.query_all("SELECT id, text, status FROM messages WHERE space_id = ?1 AND role = 'user' ORDER BY id", &[&space], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
}

/// Replies per user message: every message must have exactly one.
fn assert_each_answered_once(h: &TestHost, space: &str, want: usize) {
    let users = user_messages(h, space);
    assert_eq!(users.len(), want, "user messages stored");
    let mut per: BTreeMap<i64, usize> = users.iter().map(|(id, _, _)| (*id, 0)).collect();
    for (to, _) in replies(h, space) {
        *per.get_mut(&to).expect("a reply to a stored user message") += 1;
    }
    let wrong: Vec<_> = per.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        wrong.is_empty(),
        "message id -> replies, not exactly one: {wrong:?}"
    );
    assert!(
        users.iter().all(|(_, _, s)| s.as_deref() == Some("done")),
        "{users:?}"
    );
}

// ---------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ingress_runs_a_turn_whose_tool_writes_the_workspace_and_the_reply_is_stored_and_queued() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^tool_result\\(write_file\\): ", "reply": "Saved your note."},
        {"purpose": "turn", "match": "^user: note (\\S+) (.*)$",
         "tool_calls": [{"name": "write_file", "arguments": {"path": "notes/$1.txt", "content": "$2"}}]}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let sender = "whatsapp:491701234567@s.whatsapp.net";
    let (space, mid) = send(
        &h,
        &adapter,
        "4917012@s.whatsapp.net",
        sender,
        "note groceries milk and eggs",
        "wamid-1",
    )
    .await;
    let q = format!("SELECT COUNT(*) FROM messages WHERE role = 'assistant' AND reply_to = {mid}");
    assert_eq!(h.wait_count(&q, 1, 60).await, 1, "the reply is stored");

    let file = h
        .data
        .join("spaces")
        .join(&space)
        .join("notes/groceries.txt");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "milk and eggs",
        "the tool wrote the workspace"
    );

    let (reply_id, text, reply_run, conv): (i64, String, String, i64) = h.read(|c| c.query_row(
            &format!("SELECT id, text, run_id, conversation_id FROM messages WHERE role = 'assistant' AND reply_to = {mid}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))));
    assert_eq!(text, "Saved your note.");
    let (status, user_run, user_conv): (String, String, i64) = h.read(|c| {
        c.query_row(
            &format!("SELECT status, run_id, conversation_id FROM messages WHERE id = {mid}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    });
    assert_eq!(
        (status.as_str(), &user_run, user_conv),
        ("done", &reply_run, conv)
    );

    let (run_status, kind, trigger, container, started, finished): (String, String, i64, Option<String>, i64, i64) = h.read(|c| c.query_row(
            "SELECT status, kind, trigger_message_id, container_id, started_at, finished_at FROM runs WHERE id = ?1",
            &[&&reply_run],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))));
    assert_eq!(
        (run_status.as_str(), kind.as_str(), trigger),
        ("done", "live", mid)
    );
    assert!(
        container.is_none(),
        "write_file runs on the host through the safe-path function: no sandbox session"
    );
    assert!(finished >= started);
    let (calls, tokens_in, tokens_out): (i64, i64, i64) = h.read(|c| c.query_row(
            "SELECT COUNT(*), SUM(tokens_in), SUM(tokens_out) FROM token_usage WHERE run_id = ?1 AND space_id = ?2",
            &[&&reply_run, &&space],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))));
    assert_eq!(
        calls, 2,
        "one usage row per model call: the tool call, then the answer"
    );
    assert!(tokens_in > 0 && tokens_out > 0);
    let live_run_tokens: i64 = h.read(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM api_tokens WHERE run_id = ?1 AND revoked_at IS NULL",
            &[&&reply_run],
            |r| r.get(0),
        )
    });
    assert_eq!(
        live_run_tokens, 0,
        "the turn's run token is revoked when it ends"
    );

    // Delivered: queued in the outbox for the platform, and pulled by the adapter.
    let (st, v) = h
        .call(
            Method::GET,
            "/api/outbox?after=0",
            Some(&adapter),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    let item = &items[0];
    assert_eq!(item["message_id"], reply_id);
    assert_eq!(item["text"], "Saved your note.");
    assert_eq!(
        (item["platform"].as_str(), item["external_id"].as_str()),
        (Some("test"), Some("4917012@s.whatsapp.net"))
    );
    assert_eq!(v["next_after"], item["id"]);
    let (_, v) = h
        .call(
            Method::GET,
            &format!("/api/outbox?after={}", item["id"]),
            Some(&adapter),
            None,
            None,
        )
        .await;
    assert!(
        v["items"].as_array().unwrap().is_empty(),
        "nothing after the last item: {v}"
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Ordering and parallelism
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_spaces_answer_twenty_messages_each_in_order_and_in_parallel() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1", "latency_ms": 100}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let senders: Vec<_> = (0..3)
        .map(|s| {
            let (h_url, http, adapter) = (h.url.clone(), h.http.clone(), adapter.clone());
            tokio::spawn(async move {
                let mut space = String::new();
                for i in 0..20 {
                    let r = http
                        .post(format!("{h_url}/api/ingress"))
                        .bearer_auth(&adapter)
                        .json(&json!({"platform": "test", "conversation": format!("room-{s}"), "sender_id": format!("user-{s}"),
                                      "text": format!("s{s} m{i}"), "message_id": format!("s{s}-{i}"), "is_group": false}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 202);
                    let v: Value = r.json().await.unwrap();
                    assert_eq!(v["status"], "queued", "{v}");
                    space = v["space_id"].as_str().unwrap().to_string();
                }
                space
            })
        })
        .collect();
    let mut spaces = Vec::new();
    for s in senders {
        spaces.push(s.await.unwrap());
    }
    let total = h
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            60,
            120,
        )
        .await;
    assert_eq!(total, 60, "every message answered");

    let mut intervals = Vec::new();
    for (s, space) in spaces.iter().enumerate() {
        assert_each_answered_once(&h, space, 20);
        let users = user_messages(&h, space);
        let want: Vec<String> = (0..20).map(|i| format!("s{s} m{i}")).collect();
        assert_eq!(
            users.iter().map(|u| u.1.clone()).collect::<Vec<_>>(),
            want,
            "stored in the order sent"
        );
        let got = replies(&h, space);
        assert_eq!(
            got.iter().map(|r| r.0).collect::<Vec<_>>(),
            users.iter().map(|u| u.0).collect::<Vec<_>>(),
            "replies in message order"
        );
        assert_eq!(
            got.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
            want.iter().map(|t| format!("re: {t}")).collect::<Vec<_>>()
        );
        // One turn at a time within a space.
        let runs: Vec<(i64, i64)> = h.read(|c| c.query_all("SELECT started_at, finished_at FROM runs WHERE space_id = ?1 ORDER BY started_at, id", &[&space], |r| Ok((r.get(0)?, r.get(1)?))));
        assert_eq!(runs.len(), 20);
        for w in runs.windows(2) {
            assert!(w[0].1 <= w[1].0, "runs of one space overlap: {w:?}");
        }
        intervals.push(runs);
    }
    // Different spaces' turns overlap in time: each pair of spaces has a pair
    // of runs whose [start, finish] intervals intersect.
    for a in 0..3 {
        for b in a + 1..3 {
            let overlap = intervals[a]
                .iter()
                .any(|x| intervals[b].iter().any(|y| x.0 < y.1 && y.0 < x.1));
            assert!(
                overlap,
                "spaces {a} and {b} were served one after the other, not in parallel"
            );
        }
    }
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Crash, panic, replay
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_turn_answers_every_message_exactly_once_after_restart() {
    // m5's turn is slow, so the kill lands inside it, not between two turns.
    let mut h = TestHost::start_process(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: m5$", "reply": "re: m5", "latency_ms": 2000},
        {"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1", "latency_ms": 100}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let mut space = String::new();
    let mut ids = Vec::new();
    for i in 0..20 {
        let (s, id) = send(
            &h,
            &adapter,
            "crashy",
            "carl",
            &format!("m{i}"),
            &format!("id-{i}"),
        )
        .await;
        space = s;
        ids.push(id);
    }
    let in_flight = format!(
        "SELECT COUNT(*) FROM runs WHERE status = 'running' AND trigger_message_id = {}",
        ids[5]
    );
    assert_eq!(
        h.wait_count(&in_flight, 1, 60).await,
        1,
        "m5's turn is running"
    );
    h.kill();
    let answered = h.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'");
    assert_eq!(answered, 5, "killed during m5's turn: m0..m4 answered");

    h.restart_process().await;
    assert_eq!(
        h.wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            20,
            120
        )
        .await,
        20
    );
    assert_each_answered_once(&h, &space, 20);
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE status = 'interrupted' AND trigger_message_id = {}",
            ids[5]
        )),
        1,
        "the turn in flight at the kill is marked interrupted at start-up"
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM runs WHERE status = 'done'"),
        20
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM outbox"),
        20,
        "each reply queued for delivery once"
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE status = 'pending'"),
        0
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_space_actor_is_restarted_and_its_queued_messages_are_answered() {
    // m0's turn is slow, so the panic lands inside it with m1..m4 queued.
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: m0$", "reply": "re: m0", "latency_ms": 3000},
        {"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1", "latency_ms": 100}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let mut space = String::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        let (s, id) = send(
            &h,
            &adapter,
            "wobbly",
            "pat",
            &format!("m{i}"),
            &format!("id-{i}"),
        )
        .await;
        space = s;
        ids.push(id);
    }
    let in_flight = format!(
        "SELECT COUNT(*) FROM runs WHERE status = 'running' AND trigger_message_id = {}",
        ids[0]
    );
    assert_eq!(h.wait_count(&in_flight, 1, 30).await, 1);
    let (st, v) = h
        .owner(Method::POST, "/api/test/panic", Some(&space), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        h.wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            5,
            60
        )
        .await,
        5
    );
    assert_each_answered_once(&h, &space, 5);
    let abandoned = h.count(&format!(
        "SELECT COUNT(*) FROM runs WHERE status = 'interrupted' AND error = 'space actor stopped during the turn' AND trigger_message_id = {}",
        ids[0]
    ));
    let runs = {
        let sql = "SELECT trigger_message_id, status, COALESCE(error, ''), started_at, COALESCE(finished_at, 0) FROM runs ORDER BY started_at".to_owned();
        h.read(move |c| mercury::storage::inspect::query_text(c, &sql))
    };
    assert_eq!(
        abandoned, 1,
        "the turn in flight died with its actor and was run again (m0 is {}; runs: {runs:?})",
        ids[0]
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM runs WHERE status = 'done'"),
        5
    );
    h.stop().await;
}

#[tokio::test]
async fn a_replayed_platform_message_runs_one_turn() {
    let h = TestHost::start(opts(
        json!({"rules": [{"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1"}]}),
    ))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, mid) = send(&h, &adapter, "echo", "eve", "hello", "plat-1").await;
    let (st, v) = h
        .ingest(&adapter, "echo", "eve", "hello", "plat-1", false)
        .await;
    assert_eq!(
        (st, v["duplicate"].as_bool(), v["status"].as_str()),
        (200, Some(true), Some("duplicate")),
        "{v}"
    );
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {mid}"),
        1,
        30,
    )
    .await;
    // Replayed again after the answer: still one.
    let (st, v) = h
        .ingest(&adapter, "echo", "eve", "hello", "plat-1", false)
        .await;
    assert_eq!((st, v["duplicate"].as_bool()), (200, Some(true)), "{v}");
    // A later message is answered after anything queued before it, so if the
    // replay had queued a turn it would have run by now.
    let (_, next) = send(&h, &adapter, "echo", "eve", "again", "plat-2").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {next}"),
        1,
        30,
    )
    .await;
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE platform_message_id = 'plat-1'"),
        1
    );
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE trigger_message_id = {mid}"
        )),
        1
    );
    assert_each_answered_once(&h, &space, 2);
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Failures and messages that get no turn
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_model_failure_gives_the_generic_failure_reply_and_a_failed_run() {
    let h = TestHost::start(opts(
        json!({"rules": [{"purpose": "turn", "match": "^user: hello$", "reply": "hi"}]}),
    ))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, mid) = send(&h, &adapter, "oops", "olga", "something unexpected", "p-1").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {mid}"),
        1,
        30,
    )
    .await;
    let got = replies(&h, &space);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].1,
        mercury::config::DEFAULT_FAILURE_REPLY,
        "the participant reads the generic sentence"
    );
    assert!(
        !got[0].1.contains("rule") && !got[0].1.contains("model.json"),
        "no internal text in the reply: {}",
        got[0].1
    );
    let (status, error): (String, String) = h.read(|c| {
        c.query_row(
            &format!("SELECT status, error FROM runs WHERE trigger_message_id = {mid}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(status, "failed");
    assert!(
        error.contains("model.json"),
        "the error names the script file: {error}"
    );
    assert_eq!(user_messages(&h, &space)[0].2.as_deref(), Some("failed"));
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM outbox WHERE text = '{}'",
            mercury::config::DEFAULT_FAILURE_REPLY
        )),
        1,
        "the failure is delivered"
    );
    // The space keeps working.
    let (_, ok) = send(&h, &adapter, "oops", "olga", "hello", "p-2").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {ok}"),
        1,
        30,
    )
    .await;
    assert_eq!(replies(&h, &space)[1].1, "hi");
    h.stop().await;
}

/// Issue 25: the canned sentence a failed turn answered with is not something
/// the model said, so the next turn's history leaves it out (the rule that
/// would see it in the request answers first if it is there).
#[tokio::test]
async fn a_failed_turns_reply_is_left_out_of_the_next_prompt() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match_any": "assistant: Sorry, something went wrong", "reply": "the failure was in my history"},
        {"purpose": "turn", "match": "^user: hello$", "reply": "hi"},
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, failed) = send(&h, &adapter, "oops", "olga", "something unexpected", "p-1").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {failed}"),
        1,
        30,
    )
    .await;
    assert_eq!(
        replies(&h, &space)[0].1,
        mercury::config::DEFAULT_FAILURE_REPLY
    );
    let (_, next) = send(&h, &adapter, "oops", "olga", "hello", "p-2").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {next}"),
        1,
        30,
    )
    .await;
    assert_eq!(replies(&h, &space)[1].1, "hi");
    h.stop().await;
}

/// Issue 25: a global admin talking to the bot directly reads why a turn
/// failed and where its trace is; a stranger in the same space does not.
#[tokio::test]
async fn a_failed_turn_tells_a_global_admin_in_a_dm_the_reason() {
    let h = TestHost::start(opts(
        json!({"rules": [{"purpose": "turn", "match": "^user: hello$", "reply": "hi"}]}),
    ))
    .await;
    h.create_space("ops").await;
    let v = h.chat("ops", "something unexpected").await;
    let reply = v["reply"].as_str().unwrap_or_default().to_string();
    assert!(
        reply.starts_with(mercury::config::DEFAULT_FAILURE_REPLY),
        "{v}"
    );
    assert!(
        reply.contains("no rule matches") && reply.contains("mrctl runs show "),
        "the owner reads the reason and the trace's command: {reply}"
    );
    // A platform stranger's failed turn says only the generic sentence.
    let adapter = h.token("bridge", "adapter").await;
    let (other, mid) = send(
        &h,
        &adapter,
        "dm-olga",
        "olga",
        "something unexpected",
        "p-1",
    )
    .await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {mid}"),
        1,
        30,
    )
    .await;
    assert_eq!(
        replies(&h, &other)[0].1,
        mercury::config::DEFAULT_FAILURE_REPLY
    );
    h.stop().await;
}

#[tokio::test]
async fn a_muted_caller_is_stored_not_answered() {
    let h = TestHost::start(opts(
        json!({"rules": [{"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1"}]}),
    ))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, first) = send(&h, &adapter, "family", "ann", "hello", "p-1").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {first}"),
        1,
        30,
    )
    .await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/mutes",
            Some(&space),
            // Platform senders live in their platform's namespace.
            Some(json!({"caller_id": "test:mo", "reason": "spam"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h
        .ingest(&adapter, "family", "mo", "buy cheap watches", "p-2", false)
        .await;
    assert_eq!((st, v["status"].as_str()), (202, Some("muted")), "{v}");
    let muted = v["message_id"]
        .as_i64()
        .expect("the muted message is stored");
    // A later message is answered; the muted one before it never is.
    let (_, later) = send(&h, &adapter, "family", "ann", "still there?", "p-3").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {later}"),
        1,
        30,
    )
    .await;
    let (text, status): (String, String) = h.read(|c| {
        c.query_row(
            &format!("SELECT text, status FROM messages WHERE id = {muted}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(
        (text.as_str(), status.as_str()),
        ("buy cheap watches", "muted")
    );
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM messages WHERE reply_to = {muted}"
        )),
        0
    );
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE trigger_message_id = {muted}"
        )),
        0
    );
    // Unmuted, the same caller is answered.
    let (st, _) = h
        .owner(Method::DELETE, "/api/mutes/test:mo", Some(&space), None)
        .await;
    assert_eq!(st, 200);
    let (_, back) = send(&h, &adapter, "family", "mo", "sorry", "p-4").await;
    assert_eq!(
        h.wait_count(
            &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {back}"),
            1,
            30
        )
        .await,
        1
    );
    h.stop().await;
}

#[tokio::test]
async fn a_group_message_without_the_trigger_is_stored_as_ambient_and_used_as_context() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: what did ann say\\?$",
         "match_any": "not addressed to you\\) we should get pizza", "reply": "Ann suggested pizza."},
        {"purpose": "turn", "reply": "I have no context."}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (st, v) = h
        .ingest(
            &adapter,
            "team@g.us",
            "ann",
            "we should get pizza",
            "g-1",
            true,
        )
        .await;
    assert_eq!((st, v["status"].as_str()), (202, Some("ambient")), "{v}");
    let ambient = v["message_id"].as_i64().unwrap();
    let space = v["space_id"].as_str().unwrap().to_string();
    let (st, v) = h
        .ingest(
            &adapter,
            "team@g.us",
            "bob",
            "mercury, what did ann say?",
            "g-2",
            true,
        )
        .await;
    assert_eq!(
        (st, v["status"].as_str()),
        (202, Some("queued")),
        "the trigger word addresses the bot: {v}"
    );
    let asked = v["message_id"].as_i64().unwrap();
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {asked}"),
        1,
        30,
    )
    .await;
    assert_eq!(
        replies(&h, &space),
        vec![(asked, "Ann suggested pizza.".to_string())],
        "the ambient line reached the prompt"
    );
    let (role, status): (String, Option<String>) = h.read(|c| {
        c.query_row(
            &format!("SELECT role, status FROM messages WHERE id = {ambient}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(
        (role.as_str(), status),
        ("ambient", None),
        "stored as ambient, not queued"
    );
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE trigger_message_id = {ambient}"
        )),
        0
    );
    h.stop().await;
}

#[tokio::test]
async fn a_caller_over_the_rate_limit_is_told_to_slow_down() {
    let h = TestHost::start(opts(
        json!({"rules": [{"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1"}]}),
    ))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, _) = send(&h, &adapter, "spammy", "sam", "hello", "r-0").await;
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/config",
            Some(&space),
            Some(json!({"key": "rate_limit.per_minute", "value": "2"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    send(&h, &adapter, "spammy", "sam", "one", "r-1").await;
    send(&h, &adapter, "spammy", "sam", "two", "r-2").await;
    let (st, v) = h
        .ingest(&adapter, "spammy", "sam", "three", "r-3", false)
        .await;
    assert_eq!(
        (st, v["status"].as_str()),
        (202, Some("rate_limited")),
        "{v}"
    );
    let limited = v["message_id"].as_i64().expect("stored");
    let (text, status): (String, String) = h
        .read(|c| c.query_row(
            &format!("SELECT r.text, u.status FROM messages r JOIN messages u ON u.id = r.reply_to WHERE r.reply_to = {limited}"),
            &[],
            |r| Ok((r.get(0)?, r.get(1)?))));
    assert!(text.contains("slow down"), "{text}");
    assert_eq!(status, "rate_limited");
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM outbox WHERE text = '{}'",
            text.replace('\'', "''")
        )),
        1,
        "delivered, not silence"
    );
    assert_eq!(
        h.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE trigger_message_id = {limited}"
        )),
        0,
        "no turn for it"
    );
    // Another caller in the same space is not limited.
    send(&h, &adapter, "spammy", "tina", "hi", "r-4").await;
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Tasks and control
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_task_fires_a_turn_through_the_space_and_records_the_firing() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: water the plants$", "reply": "Plants watered."}
    ]})))
    .await;
    h.create_space("garden").await;
    let at = mercury::clock::ms_to_rfc3339(chrono::Utc::now().timestamp_millis() + 1500);
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tasks",
            Some("garden"),
            Some(json!({"at": at, "prompt": "water the plants"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let task = v["task"]["id"].as_i64().unwrap();
    let n = h
        .wait_count(
            "SELECT COUNT(*) FROM task_runs WHERE status = 'done'",
            1,
            30,
        )
        .await;
    if n != 1 {
        for t in ["tasks", "task_runs", "messages", "runs"] {
            eprintln!(
                "DEBUG {t}: {:?}",
                h.read(|c| mercury::storage::inspect::rows_as_text(c, t))
            );
        }
    }
    assert_eq!(n, 1);
    let (task_id, run_id, finished): (i64, Option<String>, Option<i64>) = h.read(|c| {
        c.query_row(
            "SELECT task_id, run_id, finished_at FROM task_runs",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    });
    assert_eq!(task_id, task);
    assert!(finished.is_some());
    let run_id = run_id.expect("the firing names its run");
    let (kind, status, trigger): (String, String, i64) = h.read(|c| {
        c.query_row(
            "SELECT kind, status, trigger_message_id FROM runs WHERE id = ?1",
            &[&&run_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    });
    assert_eq!((kind.as_str(), status.as_str()), ("task", "done"));
    assert_eq!(
        replies(&h, "garden"),
        vec![(trigger, "Plants watered.".to_string())]
    );
    let (_, v) = h
        .owner(Method::GET, "/api/tasks", Some("garden"), None)
        .await;
    assert_eq!(
        v["tasks"][0]["active"], false,
        "a one-shot task is done after it fired: {v}"
    );
    assert_eq!(v["tasks"][0]["state"], "done", "{v}");
    // And mrctl says so, not "paused".
    let out = h
        .mrctl(&h.owner_token, Some("garden"))
        .args(["tasks", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        listed.contains("done") && !listed.contains("paused"),
        "{listed}"
    );
    assert_eq!(h.count("SELECT COUNT(*) FROM task_runs"), 1, "fired once");
    h.stop().await;
}

/// Cron times are read on the space's clock: its `timezone` config key,
/// else the deployment's; setting it moves the space's tasks at once; a
/// zone that is not one is refused with the key named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_cron_is_read_in_the_spaces_time_zone_and_moves_when_it_changes() {
    use chrono::TimeZone;
    let h = TestHost::start(HostOptions {
        config: vec![("timezone", serde_yaml_ng::Value::from("America/New_York"))],
        ..opts(json!({"rules": [{"purpose": "turn", "reply": "ok"}]}))
    })
    .await;
    h.create_space("garden").await;
    let next_nine = |tz: chrono_tz::Tz| {
        let now = chrono::Utc::now().with_timezone(&tz);
        let today = tz
            .from_local_datetime(&now.date_naive().and_hms_opt(9, 0, 0).unwrap())
            .earliest()
            .unwrap();
        let t = if today > now {
            today
        } else {
            tz.from_local_datetime(
                &(now.date_naive().succ_opt().unwrap())
                    .and_hms_opt(9, 0, 0)
                    .unwrap(),
            )
            .earliest()
            .unwrap()
        };
        t.timestamp_millis()
    };
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/tasks",
            Some("garden"),
            Some(json!({"cron": "0 9 * * *", "prompt": "water the plants"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["timezone"], "America/New_York", "the deployment's: {v}");
    assert_eq!(
        v["task"]["next_run_at"].as_i64(),
        Some(next_nine(chrono_tz::America::New_York)),
        "{v}"
    );
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/config",
            Some("garden"),
            Some(json!({"key": "timezone", "value": "Mars/Olympus"})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("timezone: is not an IANA time zone"),
        "{v}"
    );
    let out = h
        .mrctl(&h.owner_token, Some("garden"))
        .args(["config", "set", "timezone", "Asia/Tokyo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (_, v) = h
        .owner(Method::GET, "/api/tasks", Some("garden"), None)
        .await;
    assert_eq!(v["timezone"], "Asia/Tokyo", "{v}");
    assert_eq!(
        v["tasks"][0]["next_run_at"].as_i64(),
        Some(next_nine(chrono_tz::Asia::Tokyo)),
        "moved to nine in Tokyo: {v}"
    );
    let out = h
        .mrctl(&h.owner_token, Some("garden"))
        .args(["tasks", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("cron 0 9 * * * (Asia/Tokyo)"), "{listed}");
    h.stop().await;
}

#[tokio::test]
async fn control_stop_cancels_the_turn_and_drops_the_queue() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "turn", "match": "^user: m\\d$", "reply": "slow answer", "latency_ms": 5000},
        {"purpose": "turn", "reply": "quick answer"}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let mut space = String::new();
    for i in 0..5 {
        space = send(
            &h,
            &adapter,
            "busy",
            "sue",
            &format!("m{i}"),
            &format!("s-{i}"),
        )
        .await
        .0;
    }
    assert_eq!(
        h.wait_count("SELECT COUNT(*) FROM runs WHERE status = 'running'", 1, 30)
            .await,
        1
    );
    let (st, v) = h
        .owner(Method::POST, "/api/control/stop", Some(&space), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["stopped"].as_bool(), v["dropped"].as_i64()),
        (Some(true), Some(4)),
        "{v}"
    );
    let statuses: Vec<Option<String>> =
        user_messages(&h, &space).into_iter().map(|m| m.2).collect();
    assert_eq!(
        statuses[1..],
        vec![Some("dropped".to_string()); 4],
        "{statuses:?}"
    );
    // The space answers again after a stop; nothing from before is answered.
    let (_, after) = send(&h, &adapter, "busy", "sue", "are you there?", "s-5").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {after}"),
        1,
        30,
    )
    .await;
    assert_eq!(
        replies(&h, &space),
        vec![(after, "quick answer".to_string())]
    );
    let first: String = h.read(|c| {
        c.query_row(
            "SELECT status FROM runs ORDER BY started_at LIMIT 1",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(first, "stopped");
    assert_eq!(user_messages(&h, &space)[0].2.as_deref(), Some("stopped"));
    h.stop().await;
}

#[tokio::test]
async fn compact_sets_a_boundary_and_a_summary_that_later_turns_see() {
    let h = TestHost::start(opts(json!({"rules": [
        {"purpose": "compact", "match_any": "pineapple", "reply": "SUMMARY: the secret word is pineapple"},
        {"purpose": "turn", "match": "^user: what is the word\\?$", "match_any": "user: my secret word", "reply": "I read the old messages."},
        {"purpose": "turn", "match": "^user: what is the word\\?$",
         "match_any": "# Summary of the earlier conversation\\nSUMMARY: the secret word is pineapple", "reply": "From the summary: pineapple."},
        {"purpose": "turn", "reply": "noted"}
    ]})))
    .await;
    h.create_space("memo").await;
    let chat = |text: &'static str| {
        let h = &h;
        async move {
            let (st, v) = h
                .owner(
                    Method::POST,
                    "/api/chat",
                    Some("memo"),
                    Some(json!({"text": text})),
                )
                .await;
            assert_eq!(st, 200, "{v}");
            v["reply"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(chat("my secret word is pineapple").await, "noted");
    let max_before = h.count("SELECT MAX(id) FROM messages WHERE space_id = 'memo'");
    let (st, v) = h
        .owner(Method::POST, "/api/control/compact", Some("memo"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["compacted"], true, "{v}");
    assert_eq!(v["boundary"].as_i64(), Some(max_before));
    assert_eq!(v["summary"], "SUMMARY: the secret word is pineapple");
    let (boundary, summary): (i64, String) = h.read(|c| {
        c.query_row(
            "SELECT boundary_message_id, summary FROM session_state WHERE space_id = 'memo'",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(
        (boundary, summary.as_str()),
        (max_before, "SUMMARY: the secret word is pineapple")
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM token_usage WHERE kind = 'compact' AND space_id = 'memo'"),
        1
    );
    assert_eq!(
        chat("what is the word?").await,
        "From the summary: pineapple.",
        "the summary replaces the old messages"
    );
    // clear starts a fresh session: neither the summary nor the history.
    let (st, v) = h
        .owner(Method::POST, "/api/control/clear", Some("memo"), None)
        .await;
    assert_eq!((st, v["cleared"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(chat("what is the word?").await, "noted");
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------

#[tokio::test]
async fn mercury_demo_runs_a_scripted_conversation_and_exits_0() {
    let mut c = mercury();
    c.arg("demo").env("MERCURY_SANDBOX_BACKEND", "process");
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("the agent's tool call wrote"), "{out}");
    assert!(
        out.contains("read it back in the sandbox: the demo works"),
        "{out}"
    );
    assert!(out.contains("mercury: Hello!"), "{out}");
}

#[tokio::test]
async fn mercury_bench_turns_reports_both_figures_beside_their_baselines() {
    let mut c = mercury();
    c.args([
        "bench",
        "turns",
        "--messages",
        "200",
        "--turns",
        "20",
        "--concurrency",
        "4",
        "--conversations",
        "10",
        "--statements",
    ]);
    let (code, out, err) = run(c).await;
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // --statements splits each phase by statement: the message row is
    // written once per stored message, the run row opened once per turn.
    let section = |name: &str| crate::common::statements_section(&out, name);
    let ingest = section("ingest");
    assert!(ingest.contains("INSERT INTO messages"), "{ingest}");
    assert!(ingest.contains("COMMIT"), "{ingest}");
    let turns = section("turns");
    assert!(turns.contains("per turn"), "{turns}");
    assert!(turns.contains("INSERT INTO runs"), "{turns}");
    // The figures themselves depend on the machine; their presence does not.
    for line in [
        "ingest  200 messages (20 replays) over 10 conversations, 4 at a time",
        "ingress path",
        "plain inserts",
        "x the plain inserts' time",
        "turns   20 no-tool turns one at a time",
        "overhead        p50 ",
        "plain insert    p50 ",
        "ratio           p50 ",
        "targets ingest >= 5000 msg/s: ",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    let mut c = mercury();
    c.args(["bench", "turns", "--turns", "0"]);
    let (code, _, err) = run(c).await;
    assert_eq!(code, 2, "a bad flag is a usage error: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_adapter_posts_each_reply_and_retries_a_failed_delivery() {
    use std::sync::{Arc, Mutex};
    // A receiver on loopback that refuses the first POST and accepts the rest.
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let seen = seen.clone();
            move |axum::Json(v): axum::Json<Value>| {
                let seen = seen.clone();
                async move {
                    let mut s = seen.lock().unwrap();
                    s.push(v);
                    if s.len() == 1 {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut o =
        opts(json!({"rules": [{"purpose": "turn", "match": "^user: (.*)$", "reply": "re: $1"}]}));
    o.config.push((
        "webhook.url",
        Yaml::String(format!("http://127.0.0.1:{port}/hook")),
    ));
    let h = TestHost::start(o).await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, _) = send(&h, &adapter, "hooked", "hal", "ping", "w-1").await;
    assert_eq!(
        h.wait_count(
            "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
            1,
            30
        )
        .await,
        1
    );
    let (attempts, error): (i64, Option<String>) = h.read(|c| {
        c.query_row("SELECT attempts, last_error FROM outbox", &[], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    });
    assert_eq!(attempts, 2, "one refused attempt, one delivery");
    assert!(
        error.unwrap_or_default().contains("500"),
        "the failure is recorded"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], seen[1], "the retry sends the same item");
    assert_eq!(
        (seen[1]["text"].as_str(), seen[1]["conversation"].as_str()),
        (Some("re: ping"), Some("hooked"))
    );
    assert_eq!(seen[1]["space_id"].as_str(), Some(space.as_str()));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_mrctl_call_acts_with_the_role_of_the_user_who_asked() {
    // A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
    let h = TestHost::start_process(opts(json!({"rules": [
        {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "tool said: $1"},
        {"purpose": "turn", "match": "^user: schedule (.*)$",
         "tool_calls": [{"name": "mrctl", "arguments": {"args": ["tasks", "create", "--cron", "0 9 * * *", "--prompt", "$1"]}}]}
    ]})))
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (space, asked) = send(&h, &adapter, "office", "mia", "schedule standup", "t-1").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {asked}"),
        1,
        60,
    )
    .await;
    let reply = replies(&h, &space)[0].1.clone();
    assert!(
        reply.contains("requires the 'tasks.create' permission"),
        "a member's agent is refused: {reply}"
    );
    assert_eq!(h.count("SELECT COUNT(*) FROM tasks"), 0);

    let (st, v) = h
        .owner(
            Method::POST,
            "/api/roles",
            Some(&space),
            // Platform senders live in their platform's namespace.
            Some(json!({"caller_id": "test:mia", "role": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (_, again) = send(&h, &adapter, "office", "mia", "schedule standup", "t-2").await;
    h.wait_count(
        &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {again}"),
        1,
        60,
    )
    .await;
    let (prompt, by, task_space): (String, String, String) = h.read(|c| {
        c.query_row("SELECT prompt, created_by, space_id FROM tasks", &[], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
    });
    assert_eq!(
        (prompt.as_str(), by.as_str(), task_space.as_str()),
        ("standup", "test:mia", space.as_str())
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM api_tokens WHERE kind = 'run' AND revoked_at IS NULL"),
        0,
        "both turns' run tokens are revoked"
    );
    h.stop().await;
}
