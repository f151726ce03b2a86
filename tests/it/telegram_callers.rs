//! Telegram posts that speak for a chat (a member posting as a channel, an
//! anonymous group admin) against the fake Bot API of `telegram.rs`: each is
//! its `sender_chat`'s own caller, so a mute and the per-caller limit hold
//! for it (issue 23, item 8).

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::TestHost;
use crate::telegram::{group, host_options, FakeBotApi};

/// Telegram's shared placeholder senders (`from` of such posts).
const CHANNEL_BOT: u64 = 136_817_688;
const GROUP_ANONYMOUS_BOT: u64 = 1_087_968_824;

/// A post in `chat` made for `sender_chat` through the placeholder `from`.
fn for_chat(update_id: i64, message_id: i64, chat: i64, from: u64, sender_chat: Value) -> Value {
    let mut u = group(update_id, message_id, chat, from, "ping @mercury_test_bot");
    u["message"]["from"]["is_bot"] = json!(true);
    u["message"]["sender_chat"] = sender_chat;
    u
}

#[tokio::test]
async fn telegram_a_muted_channel_stays_muted_and_anonymous_admins_have_their_own_limit() {
    let fake = FakeBotApi::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [{"reply": "pong"}]}),
        vec![("ingress.per_caller_per_minute", Yaml::Number(2.into()))],
    ))
    .await;
    let chat = -100_555;
    // A person's post creates the group's space.
    fake.push(group(1, 21, chat, 43, "ping @mercury_test_bot"));
    fake.until(60, "the first reply", |f| f.replies().contains_key(&21))
        .await;
    let space: String = host.read(|c| {
        c.query_row(
            "SELECT space_id FROM conversations WHERE external_id = ?1",
            &[&chat.to_string()],
            |r| r.get(0),
        )
    });
    // The operator mutes the channel someone posts as.
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/mutes",
            Some(&space),
            Some(json!({"caller_id": "telegram:-100777"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let channel = json!({"id": -100_777, "type": "channel", "title": "Loud channel"});
    fake.push(for_chat(2, 22, chat, CHANNEL_BOT, channel));
    // Someone else posting as another channel is another caller, answered.
    let other = json!({"id": -100_888, "type": "channel", "title": "Quiet channel"});
    fake.push(for_chat(3, 23, chat, CHANNEL_BOT, other));
    fake.until(60, "the other channel's reply", |f| {
        f.replies().contains_key(&23)
    })
    .await;
    host.wait_count(
        "SELECT COUNT(*) FROM messages WHERE sender_id = 'telegram:-100777' AND status = 'muted'",
        1,
        30,
    )
    .await;
    assert!(
        !fake.replies().contains_key(&22),
        "the muted channel was answered: {:?}",
        fake.replies()
    );
    assert_eq!(
        host.count("SELECT COUNT(*) FROM messages WHERE sender_id LIKE 'telegram:1%'"),
        0,
        "no row carries a placeholder id"
    );
    // Anonymous admins are the group's own caller: two a minute, then "slow down";
    // a person of the group keeps their own budget.
    let anon = || json!({"id": chat, "type": "supergroup", "title": "Team"});
    for (i, id) in [(4, 24), (5, 25), (6, 26)] {
        let mut u = for_chat(i, id, chat, GROUP_ANONYMOUS_BOT, anon());
        u["message"]["author_signature"] = json!("Boss");
        fake.push(u);
    }
    fake.push(group(7, 27, chat, 44, "ping @mercury_test_bot"));
    fake.until(60, "answers to the three and the person", |f| {
        [24, 25, 26, 27]
            .iter()
            .all(|id| f.replies().contains_key(id))
    })
    .await;
    let replies = fake.replies();
    assert_eq!(replies[&24][0]["text"], "pong");
    assert_eq!(replies[&25][0]["text"], "pong");
    assert!(
        replies[&26][0]["text"]
            .as_str()
            .unwrap()
            .contains("slow down"),
        "{replies:?}"
    );
    assert_eq!(replies[&27][0]["text"], "pong");
    let (caller, name): (String, String) = host.read(|c| {
        c.query_row(
            "SELECT sender_id, sender_name FROM messages WHERE platform_message_id = '24'",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(
        (caller.as_str(), name.as_str()),
        ("telegram:-100555", "Team (Boss)")
    );
    host.stop().await;
}
