//! The fixture itself works: a host starts, a space is created, a console
//! chat gets the scripted reply.

use reqwest::Method;
use serde_json::json;

use crate::common::{HostOptions, TestHost};

#[tokio::test]
async fn console_chat_gets_the_scripted_reply() {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [{"match": "^user: ping$", "reply": "pong"}]}),
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/chat",
            Some("alpha"),
            Some(json!({"text": "ping"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "pong");
    assert_eq!(v["status"], "done");
    host.stop().await;
}
