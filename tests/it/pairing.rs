//! Issue 23, item 1 and the identity hole of item 10, on a real host: the
//! sender policy (`ingress.dm_policy`), the pairing flow, groups, the upgrade
//! rule, Telegram's shared placeholder ids, and identity mappings that hold
//! only for trusted origins.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{prepare, HostOptions, TestHost};
use crate::discord::{self, FakeDiscord};
use crate::telegram::{dm, host_options, FakeBotApi};
use mercury::storage::Query;

const CODE_CHARS: &str = "ABCDEFGHJKMNPQRSTUVWXYZ23456789";

fn is_code(s: &str) -> bool {
    s.len() == 8 && s.chars().all(|c| CODE_CHARS.contains(c))
}

/// The pairing code in a reply text.
fn code_in(text: &str) -> String {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| is_code(w))
        .unwrap_or_else(|| panic!("no pairing code in {text:?}"))
        .to_owned()
}

fn outbox_texts(h: &TestHost, external: &str) -> Vec<String> {
    h.read(|c| {
        c.query_all(
            "SELECT text FROM outbox WHERE external_id = ?1 ORDER BY id",
            &[&external],
            |r| r.get(0),
        )
    })
}

fn mrctl_ok(h: &TestHost, args: &[&str]) -> String {
    let out = h.mrctl(&h.owner_token, None).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "mrctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for the assistant reply to stored message `id`.
async fn answered(h: &TestHost, id: i64) {
    let sql = format!("SELECT COUNT(*) FROM messages WHERE reply_to = {id} AND role = 'assistant'");
    assert_eq!(h.wait_count(&sql, 1, 60).await, 1, "no reply to {id}");
}

async fn dm_in(h: &TestHost, adapter: &str, conv: &str, sender: &str, mid: &str) -> Value {
    let (st, v) = h.ingest(adapter, conv, sender, "hello", mid, false).await;
    assert_eq!(st, 202, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_a_stranger_gets_one_code_no_model_call_and_the_owner_is_told_once() {
    let h = TestHost::start(HostOptions::default()).await;
    let adapter = h.adapter_token("bridge", "test").await;
    // The owner talks to the bot from test:owner (the digest's channel).
    mrctl_ok(&h, &["senders", "allow", "test:owner"]);
    let v = dm_in(&h, &adapter, "owner-dm", "owner", "o-1").await;
    assert_eq!(v["status"], "queued", "{v}");
    answered(&h, v["message_id"].as_i64().unwrap()).await;
    let runs = h.count("SELECT COUNT(*) FROM runs");

    let v = dm_in(&h, &adapter, "dm-s1", "s1", "s-1").await;
    assert_eq!(v["status"], "pairing", "{v}");
    assert_eq!(v["space_id"], Value::Null, "{v}");
    let replies = outbox_texts(&h, "dm-s1");
    assert_eq!(replies.len(), 1, "{replies:?}");
    let code = code_in(&replies[0]);
    let told = |h: &TestHost| {
        outbox_texts(h, "owner-dm")
            .iter()
            .filter(|t| t.contains(&code))
            .count()
    };
    assert_eq!(told(&h), 1, "the owner is told of the request");
    // Again: no second code, no second notice, still nothing stored.
    let v = dm_in(&h, &adapter, "dm-s1", "s1", "s-2").await;
    assert_eq!(v["status"], "pairing", "{v}");
    assert_eq!(outbox_texts(&h, "dm-s1").len(), 1);
    assert_eq!(told(&h), 1);
    assert_eq!(h.count("SELECT COUNT(*) FROM runs"), runs, "no model call");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE sender_id = 'test:s1'"),
        0
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM conversations WHERE external_id = 'dm-s1'"),
        0
    );

    let listed: Value =
        serde_json::from_str(&mrctl_ok(&h, &["--json", "pairing", "list"])).unwrap();
    let rows = listed["pairings"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed}");
    let row = &rows[0];
    assert_eq!(row["code"], json!(code));
    assert_eq!(row["platform"], "test");
    assert_eq!(row["sender"], "test:s1");
    assert_eq!(row["name"], "Tester");
    let ttl = row["expires_at"].as_i64().unwrap() - row["created_at"].as_i64().unwrap();
    assert_eq!(ttl, 3_600_000, "ingress.pairing_ttl_secs' default");
    let human = mrctl_ok(&h, &["pairing", "list"]);
    assert!(
        human.starts_with("CODE") && human.contains(&code),
        "{human}"
    );

    // Typed in lower case, the code still approves.
    let out = mrctl_ok(&h, &["pairing", "approve", &code.to_lowercase()]);
    assert!(out.contains("approved") && out.contains("test:s1"), "{out}");
    assert_eq!(
        outbox_texts(&h, "dm-s1").len(),
        2,
        "the stranger is told once"
    );
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["pairing", "approve", &code])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a decided request is gone");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no pending pairing request"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = dm_in(&h, &adapter, "dm-s1", "s1", "s-3").await;
    assert_eq!(v["status"], "queued", "{v}");
    answered(&h, v["message_id"].as_i64().unwrap()).await;
    assert_eq!(h.count("SELECT COUNT(*) FROM pairings"), 0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_ten_thousand_strangers_in_a_minute_make_no_model_call_and_stay_capped() {
    let h = TestHost::start(HostOptions::default()).await;
    let adapter = h.adapter_token("bridge", "test").await;
    let started = Instant::now();
    let statuses: Vec<(u16, String)> = futures_util::stream::iter(0..10_000)
        .map(|i| {
            let (h, adapter) = (&h, &adapter);
            async move {
                let conv = format!("dm-{i}");
                let sender = format!("stranger-{i}");
                let (st, v) = h.ingest(adapter, &conv, &sender, "hi", "m-1", false).await;
                (st, v["status"].as_str().unwrap_or_default().to_owned())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert!(
        statuses.iter().all(|(st, _)| *st == 202),
        "every one answered"
    );
    let pairing = statuses.iter().filter(|(_, s)| s == "pairing").count();
    let refused = statuses.iter().filter(|(_, s)| s == "refused").count();
    assert_eq!(pairing, 20, "ingress.pairing_max_pending's default");
    assert_eq!(refused, 10_000 - 20);
    assert_eq!(h.count("SELECT COUNT(*) FROM pairings"), 20);
    assert_eq!(
        h.count("SELECT COUNT(*) FROM outbox"),
        20,
        "one reply per request"
    );
    for table in [
        "runs",
        "token_usage",
        "messages",
        "conversations",
        "spaces",
        "members",
    ] {
        assert_eq!(
            h.count(&format!("SELECT COUNT(*) FROM {table}")),
            0,
            "{table}: strangers leave no row"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_groups_are_answered_only_where_allowed_and_a_member_there_is_no_dm_sender() {
    let h = TestHost::start(HostOptions::default()).await;
    let adapter = h.adapter_token("bridge", "test").await;
    let (st, v) = h
        .ingest(&adapter, "grp", "g1", "mercury hi", "g-1", true)
        .await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["status"], "unlinked", "{v}");
    // The group is known (so an operator can find it), nothing else.
    assert_eq!(
        h.count(
            "SELECT COUNT(*) FROM conversations WHERE external_id = 'grp' AND space_id IS NULL"
        ),
        1
    );
    assert_eq!(h.count("SELECT COUNT(*) FROM messages"), 0);
    assert_eq!(
        h.count("SELECT COUNT(*) FROM outbox"),
        0,
        "no code in a group"
    );

    let out = mrctl_ok(&h, &["senders", "allow", "--conversation", "test:grp"]);
    assert!(out.contains("allowed"), "{out}");
    let (_, v) = h
        .ingest(&adapter, "grp", "g1", "mercury hi", "g-2", true)
        .await;
    assert_eq!(v["status"], "queued", "{v}");
    answered(&h, v["message_id"].as_i64().unwrap()).await;
    // A member of the group, a stranger in a DM.
    let v = dm_in(&h, &adapter, "dm-g1", "g1", "d-1").await;
    assert_eq!(v["status"], "pairing", "{v}");
    // Denied, the group is silent though it now feeds a space.
    mrctl_ok(&h, &["senders", "deny", "--conversation", "test:grp"]);
    let (_, v) = h
        .ingest(&adapter, "grp", "g1", "mercury again", "g-3", true)
        .await;
    assert_eq!(v["status"], "refused", "{v}");
    mrctl_ok(&h, &["senders", "allow", "--conversation", "test:grp"]);
    let listed: Value =
        serde_json::from_str(&mrctl_ok(&h, &["--json", "senders", "list"])).unwrap();
    assert_eq!(
        listed["senders"],
        json!([{"kind": "conversation", "platform": "test", "subject": "grp",
                "status": "allowed", "decided_by": "owner",
                "created_at": listed["senders"][0]["created_at"]}]),
        "{listed}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_a_denied_sender_and_the_allowlist_policy_get_nothing() {
    let h = TestHost::start(HostOptions::default()).await;
    let adapter = h.adapter_token("bridge", "test").await;
    dm_in(&h, &adapter, "dm-s2", "s2", "a-1").await;
    let code = code_in(&outbox_texts(&h, "dm-s2")[0]);
    let out = mrctl_ok(&h, &["pairing", "deny", &code]);
    assert!(out.contains("denied"), "{out}");
    let v = dm_in(&h, &adapter, "dm-s2", "s2", "a-2").await;
    assert_eq!(v["status"], "refused", "{v}");
    assert_eq!(outbox_texts(&h, "dm-s2").len(), 1, "nothing more sent");
    assert_eq!(h.count("SELECT COUNT(*) FROM pairings"), 0);
    h.stop().await;

    let h = TestHost::start(HostOptions {
        config: vec![("ingress.dm_policy", Yaml::String("allowlist".into()))],
        ..Default::default()
    })
    .await;
    let adapter = h.adapter_token("bridge", "test").await;
    let v = dm_in(&h, &adapter, "dm-s3", "s3", "b-1").await;
    assert_eq!(v["status"], "refused", "{v}");
    assert_eq!(h.count("SELECT COUNT(*) FROM outbox"), 0);
    assert_eq!(h.count("SELECT COUNT(*) FROM pairings"), 0);
    mrctl_ok(&h, &["senders", "allow", "test:s3"]);
    let v = dm_in(&h, &adapter, "dm-s3", "s3", "b-2").await;
    assert_eq!(v["status"], "queued", "{v}");
    h.stop().await;
}

/// The upgrade rule, on a data dir as the last release wrote it (schema 9:
/// no sender policy): a linked DM conversation and the members of its
/// spaces are answered without pairing; a stranger is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_a_data_dir_of_the_last_release_keeps_answering_its_people() {
    let (dir, data, _) = prepare(&HostOptions::default()).await;
    let db = data.join("state.db");
    let old = data.join("old.db");
    mercury::storage::Store::create_at_version(&old, 9).unwrap();
    {
        // The owner's token, so the new host can be driven.
        let attach = format!("ATTACH DATABASE '{}' AS cur;", db.to_str().unwrap());
        mercury::storage::inspect::execute_script_on_file(
            &old,
            &(attach + "
             INSERT INTO api_tokens (id, token_hash, caller_id, kind, space_id, run_id, label, created_by, created_at, expires_at, revoked_at, role, read_only, platform, scope)
               SELECT id, token_hash, caller_id, kind, space_id, run_id, label, created_by, created_at, expires_at, revoked_at, role, read_only, platform, scope FROM cur.api_tokens;
             DETACH DATABASE cur;
             INSERT INTO spaces (id, name, tags, created_at, updated_at) VALUES
               ('test-0000000000000001', 'test dm 00000000', '', 1, 1),
               ('test-0000000000000002', 'test group 00000000', '', 1, 1);
             INSERT INTO conversations (platform, external_id, space_id, kind, title, first_seen_at, last_seen_at) VALUES
               ('test', 'dm-old', 'test-0000000000000001', 'dm', 'Old Friend', 1, 1),
               ('test', 'grp-old', 'test-0000000000000002', 'group', 'Team', 1, 1);
             INSERT INTO members (space_id, caller_id, display_name, first_seen_at, last_seen_at) VALUES
               ('test-0000000000000001', 'test:oldfriend', 'Old Friend', 1, 1),
               ('test-0000000000000002', 'test:groupie', 'Groupie', 1, 1);
             INSERT INTO messages (space_id, conversation_id, sender_id, sender_name, role, text, platform_message_id, created_at, status) VALUES
               ('test-0000000000000001', 1, 'test:oldfriend', 'Old Friend', 'user', 'hi', 'old-1', 1, 'done');"),
        )
        .unwrap();
    }
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(data.join(f));
    }
    std::fs::rename(&old, &db).unwrap();
    let h = TestHost::start_on(dir, data).await;
    let adapter = h.adapter_token("bridge", "test").await;

    let v = dm_in(&h, &adapter, "dm-old", "oldfriend", "new-1").await;
    assert_eq!(v["status"], "queued", "the linked DM: {v}");
    assert_eq!(v["space_id"], "test-0000000000000001");
    answered(&h, v["message_id"].as_i64().unwrap()).await;
    // A member of the old group, in a DM it never had: answered.
    let v = dm_in(&h, &adapter, "dm-groupie", "groupie", "new-2").await;
    assert_eq!(v["status"], "queued", "a member of a space: {v}");
    // A stranger in the linked group is answered there (a member now).
    let (_, v) = h
        .ingest(
            &adapter,
            "grp-old",
            "newbie",
            "mercury hello",
            "new-3",
            true,
        )
        .await;
    assert_eq!(v["status"], "queued", "{v}");
    // A stranger's DM pairs.
    let v = dm_in(&h, &adapter, "dm-newbie", "newbie", "new-4").await;
    assert_eq!(v["status"], "pairing", "{v}");
    let (_, v) = h.owner(Method::GET, "/api/senders", None, None).await;
    let seeded: Vec<&str> = v["senders"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["decided_by"] == "upgrade")
        .map(|r| r["subject"].as_str().unwrap())
        .collect();
    assert_eq!(seeded, ["test:groupie", "test:oldfriend"], "{v}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_telegram_shared_placeholder_ids_cannot_be_mapped_granted_or_allowed() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    let before = h.all_row_counts();
    for id in [
        "telegram:1087968824",
        "telegram:136817688",
        "telegram:777000",
    ] {
        let (st, v) = h
            .owner(
                Method::POST,
                "/api/identities",
                None,
                Some(json!({"platform_id": id, "caller_id": "owner"})),
            )
            .await;
        assert_eq!(st, 400, "{id}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("shares"),
            "{v}"
        );
        let (st, v) = h
            .owner(
                Method::POST,
                "/api/roles",
                Some("team"),
                Some(json!({"caller_id": id, "role": "member"})),
            )
            .await;
        assert_eq!(st, 400, "{id}: {v}");
        let (st, v) = h
            .owner(
                Method::POST,
                "/api/senders/allow",
                None,
                Some(json!({"sender": id})),
            )
            .await;
        assert_eq!(st, 400, "{id}: {v}");
    }
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["identities", "link", "telegram:1087968824", "owner"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("GroupAnonymousBot"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.all_row_counts(), before, "nothing written");
    h.stop().await;
}

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_a_mapped_identity_through_an_untrusted_adapter_token_gets_no_operator_rights() {
    let h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "tool said: $1"},
            {"purpose": "turn", "match": "^user: set (.*)$",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": ["prefs", "set", "tone", "$1"]}}]},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    h.create_space("mgmt").await;
    h.platform_conversation("phone", "mgmt").await;
    mrctl_ok(&h, &["identities", "link", "test:555", "owner"]);
    let tone = |h: &TestHost| -> Option<String> {
        h.read(|c| {
            c.query_opt(
                "SELECT value FROM space_preferences WHERE space_id = 'mgmt' AND key = 'tone'",
                &[],
                |r| r.get(0),
            )
        })
    };
    let post = |adapter: String, text: &'static str, mid: &'static str| {
        let h = &h;
        async move {
            let (st, v) = h
                .call(
                    Method::POST,
                    "/api/ingress",
                    Some(&adapter),
                    None,
                    Some(
                        json!({"platform": "test", "conversation": "phone", "sender_id": "555",
                                "text": text, "message_id": mid, "is_group": false}),
                    ),
                )
                .await;
            assert_eq!(st, 202, "{v}");
            let id = v["message_id"].as_i64().unwrap();
            answered(h, id).await;
            h.read(|c| {
                c.query_row(
                    "SELECT text FROM messages WHERE reply_to = ?1",
                    &[&id],
                    |r| r.get::<_, String>(0),
                )
            })
        }
    };
    // Any adapter token can name sender 555: without the flag it is only test:555.
    let plain = h.adapter_token("bridge", "test").await;
    let reply = post(plain, "set evil", "u-1").await;
    assert!(reply.contains("prefs.set"), "refused: {reply}");
    assert_eq!(tone(&h), None, "no operator right");
    let trusted = h.trusted_adapter_token("bridge-2", "test").await;
    let reply = post(trusted, "set warm", "u-2").await;
    assert!(!reply.contains("requires"), "{reply}");
    assert_eq!(tone(&h).as_deref(), Some("warm"), "the mapping holds");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_open_warns_at_every_start() {
    let h = TestHost::start_process_captured(HostOptions {
        config: vec![("adapters.discord.dm_policy", Yaml::String("open".into()))],
        ..Default::default()
    })
    .await;
    let log = h.stderr();
    assert!(log.contains("adapters.discord.dm_policy is open"), "{log}");
    assert!(!log.contains("ingress.dm_policy is open"), "{log}");
    h.stop().await;
}

/// The in-process Telegram adapter goes through the same policy: a
/// stranger's DM gets its code through sendMessage and no model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_telegram_strangers_get_a_code_through_the_adapter() {
    let fake = FakeBotApi::start().await;
    let h = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "pong"}]}),
        vec![(
            "adapters.telegram.dm_policy",
            Yaml::String("pairing".into()),
        )],
    ))
    .await;
    fake.push(dm(1, 10, 4242, "hello"));
    fake.push(dm(2, 11, 4242, "hello?"));
    fake.until(60, "the pairing code", |f| {
        !f.calls("sendMessage").is_empty()
    })
    .await;
    let sends = fake.calls("sendMessage");
    let code = code_in(sends[0].params["text"].as_str().unwrap());
    assert_eq!(sends[0].params["chat_id"], json!(4242));
    // Both updates are read (the position passes them) with one code only.
    let read = h
        .wait_count(
            "SELECT COUNT(*) FROM adapter_positions WHERE adapter = 'telegram' AND CAST(position AS INTEGER) >= 3",
            1,
            30,
        )
        .await;
    assert_eq!(read, 1);
    assert_eq!(fake.calls("sendMessage").len(), 1);
    assert_eq!(h.count("SELECT COUNT(*) FROM runs"), 0, "no model call");
    mrctl_ok(&h, &["pairing", "approve", &code]);
    fake.push(dm(3, 12, 4242, "now?"));
    fake.until(60, "the answer", |f| f.replies().contains_key(&12))
        .await;
    assert_eq!(fake.replies()[&12][0]["text"], json!("pong"));
    h.stop().await;
}

/// The in-process Discord adapter goes through the same policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_discord_strangers_get_a_code_through_the_adapter() {
    let fake = FakeDiscord::start().await;
    let h = TestHost::start_process(discord::host_options(
        &fake,
        json!({"rules": [{"reply": "pong"}]}),
        vec![("adapters.discord.dm_policy", Yaml::String("pairing".into()))],
    ))
    .await;
    fake.until_identified(1).await;
    let channel = "700000000000000077";
    fake.push(discord::message("2001", channel, None, "77", "hello"));
    fake.until(60, "the pairing code", |f| {
        f.replies().get("").is_some_and(|r| !r.is_empty())
    })
    .await;
    let sent = &fake.replies()[""][0];
    assert_eq!(sent.route, format!("POST /channels/{channel}/messages"));
    let code = code_in(sent.body["content"].as_str().unwrap());
    assert_eq!(h.count("SELECT COUNT(*) FROM runs"), 0, "no model call");
    assert_eq!(h.count("SELECT COUNT(*) FROM messages"), 0);
    mrctl_ok(&h, &["pairing", "approve", &code]);
    fake.push(discord::message("2002", channel, None, "77", "now?"));
    fake.until(60, "the answer", |f| f.replies().contains_key("2002"))
        .await;
    assert_eq!(fake.replies()["2002"][0].body["content"], "pong");
    h.stop().await;
}

/// A deletion request (`mrctl senders forget`, issue 25): one person's
/// messages, direct conversation, memberships, runs and pairing rows go in
/// every space; the group's other people keep theirs; a deny stays; the
/// review reports citing a deleted message are named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_senders_forget_deletes_one_person_everywhere_and_names_the_reports_citing_them() {
    let h = TestHost::start(HostOptions::default()).await;
    let adapter = h.adapter_token("bridge", "test").await;
    // Ada asks for a code first (a pending pairing and its reply), then is allowed.
    let v = dm_in(&h, &adapter, "dm-ada", "ada", "a-0").await;
    assert_eq!(v["status"], "pairing", "{v}");
    mrctl_ok(&h, &["senders", "allow", "test:ada"]);
    let v = dm_in(&h, &adapter, "dm-ada", "ada", "a-1").await;
    assert_eq!(v["status"], "queued", "{v}");
    answered(&h, v["message_id"].as_i64().unwrap()).await;
    // In a group, Ada and Bob.
    mrctl_ok(&h, &["senders", "allow", "--conversation", "test:grp"]);
    let mut group = Vec::new();
    for (who, mid) in [("ada", "g-1"), ("bob", "g-2")] {
        let (_, v) = h
            .ingest(&adapter, "grp", who, "mercury hi", mid, true)
            .await;
        assert_eq!(v["status"], "queued", "{v}");
        let id = v["message_id"].as_i64().unwrap();
        answered(&h, id).await;
        group.push(id);
    }
    let (ada_group, bob_group) = (group[0], group[1]);
    let spaces_before =
        h.count("SELECT COUNT(DISTINCT space_id) FROM messages WHERE sender_id = 'test:ada'");
    assert_eq!(spaces_before, 2, "a DM space and the group's");
    // Two daily reports: one cites Ada's message, one Bob's.
    for (date, id) in [("2026-01-05", ada_group), ("2026-01-06", bob_group)] {
        let dir = h.data.join(format!("reviews/{date}-daily"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("report.json"),
            json!({"date": date, "findings": [{"message_id": id, "reply_id": id + 1}]}).to_string(),
        )
        .unwrap();
    }

    // Not for a space admin, not for a malformed id.
    let member = h.token("someone", "user").await;
    let (st, v) = h
        .call(
            Method::POST,
            "/api/senders/forget",
            Some(&member),
            None,
            Some(json!({"sender": "test:ada"})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["senders", "forget", "ada"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("<platform>:<id>"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = mrctl_ok(&h, &["senders", "forget", "test:ada"]);
    assert!(out.starts_with("forgot test:ada\n"), "{out}");
    assert!(
        out.contains("review reports citing their messages"),
        "{out}"
    );
    assert!(
        out.contains("  2026-01-05\n") && !out.contains("2026-01-06"),
        "{out}"
    );
    for (what, sql, want) in [
        ("her messages", "SELECT COUNT(*) FROM messages WHERE sender_id = 'test:ada'", 0),
        ("the bot's replies in her DM", "SELECT COUNT(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.external_id = 'dm-ada'", 0),
        ("her DM conversation", "SELECT COUNT(*) FROM conversations WHERE external_id = 'dm-ada'", 0),
        ("what was sent to her DM", "SELECT COUNT(*) FROM outbox WHERE external_id = 'dm-ada'", 0),
        ("her memberships", "SELECT COUNT(*) FROM members WHERE caller_id = 'test:ada'", 0),
        ("her runs", "SELECT COUNT(*) FROM runs WHERE caller_id = 'test:ada'", 0),
        ("her allow decision", "SELECT COUNT(*) FROM allowed_senders WHERE subject = 'test:ada'", 0),
        ("her pairing requests", "SELECT COUNT(*) FROM pairings WHERE sender = 'test:ada'", 0),
        ("Bob's message", "SELECT COUNT(*) FROM messages WHERE sender_id = 'test:bob'", 1),
        ("the reply to Bob", &format!("SELECT COUNT(*) FROM messages WHERE reply_to = {bob_group}"), 1),
        ("Bob's membership", "SELECT COUNT(*) FROM members WHERE caller_id = 'test:bob'", 1),
        ("the group's decision", "SELECT COUNT(*) FROM allowed_senders WHERE subject = 'grp'", 1),
    ] {
        assert_eq!(h.count(sql), want, "{what}");
    }
    // Forgotten twice: nothing left to find.
    let out = mrctl_ok(&h, &["senders", "forget", "test:ada"]);
    assert!(out.contains("no space held a row of theirs"), "{out}");
    assert!(
        out.contains("no review report cites their messages"),
        "{out}"
    );
    // A deny is the operator's protection: it stays, and says so.
    mrctl_ok(&h, &["senders", "deny", "test:mallory"]);
    let v: Value = serde_json::from_str(&mrctl_ok(
        &h,
        &["--json", "senders", "forget", "test:mallory"],
    ))
    .unwrap();
    assert_eq!(v["instance"]["deny_kept"], true, "{v}");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM allowed_senders WHERE subject = 'test:mallory' AND status = 'denied'"),
        1
    );
    h.stop().await;
}
