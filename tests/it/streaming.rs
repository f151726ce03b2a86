//! Streamed replies (`turn.stream`) on Telegram, end to end: a real host
//! (child process, real store) polling the fake Bot API of
//! `tests/it/telegram.rs`, with the scripted model writing its reply word
//! by word. The preview is one `sendMessage`, then `editMessageText` calls
//! paced per chat, ending in exactly the final text; a host killed
//! mid-stream ends, after its restart, in an edit of that same message.

use std::time::Duration;

use mercury::storage::Query;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::TestHost;
use crate::telegram::{dm, host_options, Call, FakeBotApi};

/// Thirty words, so the scripted model's latency spreads over thirty pieces.
fn long_reply(tag: &str) -> String {
    (1..=30)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn streaming(extra: Vec<(&'static str, Yaml)>) -> Vec<(&'static str, Yaml)> {
    let mut config = vec![
        ("turn.stream", Yaml::Bool(true)),
        ("turn.stream_after_ms", Yaml::Number(200.into())),
    ];
    config.extend(extra);
    config
}

/// The preview: the one `sendMessage` threaded under `answered`.
fn previews_of(fake: &FakeBotApi, answered: i64) -> Vec<Value> {
    fake.replies().remove(&answered).unwrap_or_default()
}

fn edits(fake: &FakeBotApi) -> Vec<Call> {
    fake.calls("editMessageText")
}

/// The platform id the fake gave the preview (its ids count from 5001).
async fn preview_id(host: &TestHost) -> i64 {
    host.wait_count("SELECT COUNT(*) FROM reply_previews", 1, 30)
        .await;
    host.read(|c| {
        c.query_row(
            "SELECT CAST(platform_message_id AS INTEGER) FROM reply_previews",
            &[],
            |r| r.get(0),
        )
    })
}

#[tokio::test]
async fn telegram_a_streamed_reply_is_edited_to_its_final_text_within_the_rate_limit() {
    let fake = FakeBotApi::start().await;
    let reply = long_reply("word");
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": reply, "latency_ms": 3000}]}),
        streaming(vec![]),
    ))
    .await;
    fake.push(dm(1, 101, 501, "tell me a long story"));
    let id = preview_id(&host).await;
    fake.until(30, "the preview edited to the final text", |f| {
        f.text_of(id).as_deref() == Some(reply.as_str())
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;

    // One message was sent: the preview, threaded, showing the beginning.
    let sent = previews_of(&fake, 101);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(fake.calls("sendMessage").len(), 1);
    let first = sent[0]["text"].as_str().unwrap().trim_end().to_owned();
    assert!(
        !first.is_empty() && first.len() < reply.len() && reply.starts_with(&first),
        "the preview showed {first:?}"
    );

    // Edits of that message only, growing, the last one the whole reply.
    let edits = edits(&fake);
    assert!(
        edits.len() >= 2,
        "the text grew while it was shown: {edits:?}"
    );
    for e in &edits {
        assert_eq!(e.params["message_id"], json!(id), "{e:?}");
        let text = e.params["text"].as_str().unwrap().trim_end();
        assert!(
            reply.starts_with(text),
            "{text:?} is not the reply's beginning"
        );
    }
    let last = edits.last().unwrap();
    assert_eq!(last.params["text"], json!(reply));
    assert_eq!(last.status, 200);

    // Within Telegram's limit for a private chat: a second between edits.
    for pair in edits.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_millis(900),
            "two edits {gap:?} apart: {edits:?}"
        );
    }

    // The stored reply is the final text only.
    let stored: Vec<String> = host.read(|c| {
        c.query_all(
            "SELECT text FROM messages WHERE role = 'assistant'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(stored, vec![reply.clone()]);
    host.stop().await;
}

#[tokio::test]
async fn telegram_a_quick_reply_is_sent_whole_without_a_preview() {
    let fake = FakeBotApi::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "short and quick"}]}),
        streaming(vec![("turn.stream_after_ms", Yaml::Number(5000.into()))]),
    ))
    .await;
    fake.push(dm(1, 101, 501, "hi"));
    fake.until(30, "the reply", |f| !previews_of(f, 101).is_empty())
        .await;
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    assert_eq!(previews_of(&fake, 101)[0]["text"], "short and quick");
    assert!(edits(&fake).is_empty());
    assert_eq!(host.count("SELECT COUNT(*) FROM reply_previews"), 0);
    host.stop().await;
}

#[tokio::test]
async fn telegram_a_restart_mid_stream_ends_in_an_edit_of_the_same_message() {
    let fake = FakeBotApi::start().await;
    // A word a second: the host is killed while the preview shows the first.
    let mut host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": long_reply("slow"), "latency_ms": 30000}]}),
        streaming(vec![]),
    ))
    .await;
    fake.push(dm(1, 101, 501, "tell me a long story"));
    let id = preview_id(&host).await;
    host.kill();
    // The restarted host's model answers at once.
    let answer = "the answer after the restart";
    std::fs::write(
        host.dir.path().join("model.json"),
        json!({"rules": [{"reply": answer}]}).to_string(),
    )
    .unwrap();
    host.restart_process().await;
    fake.until(60, "the preview edited to the answer", |f| {
        f.text_of(id).as_deref() == Some(answer)
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    assert_eq!(
        previews_of(&fake, 101).len(),
        1,
        "one message for the reply, never a second"
    );
    assert_eq!(fake.calls("sendMessage").len(), 1);
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'"),
        1
    );
    host.stop().await;
}

#[tokio::test]
async fn telegram_a_stream_the_crash_breaker_fails_is_edited_to_the_failure_reply() {
    let fake = FakeBotApi::start().await;
    let failure = "That one broke me; sorry.";
    let mut host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": long_reply("slow"), "latency_ms": 30000}]}),
        streaming(vec![
            ("turn.max_crash_retries", Yaml::Number(1.into())),
            ("turn.failure_reply", Yaml::String(failure.into())),
        ]),
    ))
    .await;
    fake.push(dm(1, 101, 501, "tell me a long story"));
    let id = preview_id(&host).await;
    host.kill();
    host.restart_process().await;
    fake.until(60, "the preview edited to the failure reply", |f| {
        f.text_of(id).as_deref() == Some(failure)
    })
    .await;
    assert_eq!(previews_of(&fake, 101).len(), 1);
    assert_eq!(fake.calls("sendMessage").len(), 1);
    let status: String = host.read(|c| {
        c.query_row(
            "SELECT status FROM messages WHERE role = 'user'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(status, "failed");
    host.stop().await;
}
