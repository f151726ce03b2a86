//! Pictures, voice notes and files in, end to end on Telegram: a real host
//! (child process, real store) polling the fake Bot API of
//! `tests/it/telegram.rs` (`getFile`, then the file route), its attachments
//! fetched at turn time into the workspace's `inbox/`. A picture reaches a
//! `models.vision` model as an image part (asserted on the request a fake
//! OpenAI-compatible endpoint received); another model reads a line saying
//! where the file is; one past `adapters.max_attachment_mb` is refused with
//! a sentence and nothing of it is kept; forgetting the sender deletes
//! what their messages carried.

use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use mercury::storage::Query;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::TestHost;
use crate::telegram::{host_options, FakeBotApi};

/// A chat-completions endpoint that keeps every request body.
async fn vision_model() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = Router::new().route(
        "/v1/chat/completions",
        post({
            let seen = seen.clone();
            move |Json(body): Json<Value>| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(body);
                    Json(json!({"id": "c1", "object": "chat.completion",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a red square"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 30, "completion_tokens": 3}}))
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A DM carrying `field` (a photo's sizes, a document, a voice note).
fn carrying(update_id: i64, message_id: i64, caption: Option<&str>, field: (&str, Value)) -> Value {
    let mut m = json!({"message_id": message_id, "date": 1700000000,
        "chat": {"id": 501, "type": "private", "first_name": "U"},
        "from": {"id": 501, "is_bot": false, "first_name": "U"}});
    if let Some(c) = caption {
        m["caption"] = json!(c);
    }
    m[field.0] = field.1;
    json!({"update_id": update_id, "message": m})
}

/// Every attachment row: (kind, status, path, error).
fn rows(host: &TestHost) -> Vec<(String, String, Option<String>, Option<String>)> {
    host.read(|c| {
        c.query_all(
            "SELECT kind, status, path, error FROM attachments ORDER BY id",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
    })
}

fn inbox_files(host: &TestHost) -> Vec<String> {
    let mut out = Vec::new();
    let spaces = host.data.join("spaces");
    for space in std::fs::read_dir(spaces).unwrap().flatten() {
        if let Ok(files) = std::fs::read_dir(space.path().join("inbox")) {
            out.extend(
                files
                    .flatten()
                    .map(|f| f.file_name().to_string_lossy().into_owned()),
            );
        }
    }
    out
}

#[tokio::test]
async fn telegram_a_picture_reaches_a_vision_model_as_an_image_part() {
    let fake = FakeBotApi::start().await;
    let (model_url, seen) = vision_model().await;
    let picture: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    fake.add_file("photo-big", "photos/file_7.jpg", picture.clone());
    let mut opts = host_options(
        &fake,
        json!({"rules": [{"reply": "unused"}]}),
        vec![
            ("model", Yaml::from("openai:gpt-vision")),
            ("providers.openai_base_url", Yaml::from(model_url)),
            ("providers.max_retries", Yaml::from(0)),
            (
                "models.vision",
                Yaml::Sequence(vec![Yaml::from("openai:gpt-vision")]),
            ),
        ],
    );
    opts.env
        .push(("MERCURY_OPENAI_API_KEY", "sk-test-vision".to_string()));
    let host = TestHost::start_process(opts).await;
    fake.push(carrying(
        1,
        101,
        Some("what is this?"),
        (
            "photo",
            json!([
                {"file_id": "photo-small", "file_unique_id": "s", "width": 90, "height": 90, "file_size": 300},
                {"file_id": "photo-big", "file_unique_id": "b", "width": 800, "height": 600, "file_size": picture.len()}
            ]),
        ),
    ));
    fake.until(60, "the reply", |f| f.replies().contains_key(&101))
        .await;
    assert_eq!(fake.replies()[&101][0]["text"], "a red square");

    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    let asked = bodies[0]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(asked["role"], "user");
    let parts = asked["content"].as_array().expect("text and image parts");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(text.starts_with("what is this?"), "{text}");
    assert!(
        text.contains("[The user sent a picture; it is saved as inbox/"),
        "{text}"
    );
    let data = base64::engine::general_purpose::STANDARD.encode(&picture);
    assert_eq!(
        parts[1],
        json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{data}")}})
    );

    // Kept in the workspace, under a name the host made; the stored message
    // says "[image]" and holds none of its bytes.
    let got = rows(&host);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("image", "kept"));
    let path = got[0].2.clone().unwrap();
    assert!(
        path.starts_with("inbox/") && path.ends_with("-1.jpg"),
        "{path}"
    );
    let space: String = host.read(|c| {
        c.query_row(
            "SELECT space_id FROM messages WHERE role = 'user'",
            &[],
            |r| r.get(0),
        )
    });
    let kept = std::fs::read(host.data.join("spaces").join(&space).join(&path)).unwrap();
    assert_eq!(kept, picture);
    let stored: String = host.read(|c| {
        c.query_row("SELECT text FROM messages WHERE role = 'user'", &[], |r| {
            r.get(0)
        })
    });
    assert_eq!(stored, "what is this?\n[image]");
    // Only the largest size was fetched.
    let fetched: Vec<Value> = fake
        .calls("getFile")
        .into_iter()
        .map(|c| c.params)
        .collect();
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0]["file_id"], "photo-big");
    host.stop().await;
}

#[tokio::test]
async fn telegram_a_model_without_vision_reads_where_the_file_is_and_an_oversized_one_is_refused() {
    let fake = FakeBotApi::start().await;
    fake.add_file("doc-1", "documents/file_1.pdf", b"%PDF-1.4 small".to_vec());
    // Declared small in the update; getFile says it is past the limit.
    fake.add_file("voice-1", "voice/file_2.oga", vec![7u8; 1_200_000]);
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [
            {"match_any": "image\\(", "reply": "an image part reached a model without vision"},
            {"match": "which was not kept: (.*)\\]", "reply": "refused: $1"},
            {"match": "named \"([^\"]+)\"; it is saved as (inbox/[^\\]]+)\\]", "reply": "got $1 at $2"}
        ]}),
        vec![("adapters.max_attachment_mb", Yaml::from(1))],
    ))
    .await;

    fake.push(carrying(
        1,
        101,
        None,
        (
            "document",
            json!({"file_id": "doc-1", "file_unique_id": "d", "file_name": "../../report.pdf",
                "mime_type": "application/pdf", "file_size": 14}),
        ),
    ));
    fake.until(60, "the first reply", |f| f.replies().contains_key(&101))
        .await;
    let first = fake.replies()[&101][0]["text"].as_str().unwrap().to_owned();
    assert!(
        first.starts_with("got ../../report.pdf at inbox/") && first.ends_with("-1.pdf"),
        "{first}"
    );

    // Declared past the limit: refused before getFile is asked.
    fake.push(carrying(
        2,
        102,
        Some("and this one"),
        (
            "document",
            json!({"file_id": "doc-huge", "file_unique_id": "h", "file_name": "huge.bin",
                "mime_type": "application/octet-stream", "file_size": 5_000_000}),
        ),
    ));
    fake.push(carrying(
        3,
        103,
        None,
        (
            "voice",
            json!({"file_id": "voice-1", "file_unique_id": "v", "duration": 4, "mime_type": "audio/ogg", "file_size": 1000}),
        ),
    ));
    fake.until(60, "two more replies", |f| {
        f.replies().contains_key(&102) && f.replies().contains_key(&103)
    })
    .await;
    for id in [102, 103] {
        let said = fake.replies()[&id][0]["text"].as_str().unwrap().to_owned();
        assert_eq!(
            said, "refused: it is larger than adapters.max_attachment_mb (1 MB) allows",
            "message {id}"
        );
    }
    let asked: Vec<String> = fake
        .calls("getFile")
        .into_iter()
        .map(|c| c.params["file_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!asked.contains(&"doc-huge".to_owned()), "{asked:?}");
    let got = rows(&host);
    let statuses: Vec<(&str, &str)> = got.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(
        statuses,
        vec![("file", "kept"), ("file", "refused"), ("voice", "refused")]
    );
    // Only the small file is in the inbox; nothing of a refused one.
    let files = inbox_files(&host);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with("-1.pdf"), "{files:?}");

    // Forgetting the sender takes what their messages carried too: the
    // rows, and the file kept of them.
    let (st, v) = host
        .call(
            reqwest::Method::POST,
            "/api/senders/forget",
            Some(&host.owner_token),
            None,
            Some(json!({"sender": "telegram:501"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["spaces"][0]["attachments"], 3, "{v}");
    assert_eq!(v["spaces"][0]["inbox_files"], 1, "{v}");
    assert!(rows(&host).is_empty());
    assert!(inbox_files(&host).is_empty(), "{:?}", inbox_files(&host));
    host.stop().await;
}

/// An OpenAI-compatible `/audio/transcriptions` that checks its form and
/// keeps every body it got.
async fn transcriber() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let app = Router::new().route(
        "/v1/audio/transcriptions",
        post({
            let seen = seen.clone();
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let form = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|t| t.starts_with("multipart/form-data; boundary="));
                    let keyed = headers.get("authorization").and_then(|v| v.to_str().ok())
                        == Some("Bearer sk-test-voice");
                    seen.lock().unwrap().push(body.to_vec());
                    if form && keyed {
                        (
                            axum::http::StatusCode::OK,
                            Json(json!({"text": "buy milk tomorrow"})),
                        )
                    } else {
                        (
                            axum::http::StatusCode::BAD_REQUEST,
                            Json(json!({"error": {"message": "not a keyed form"}})),
                        )
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test]
async fn telegram_a_voice_note_is_kept_and_transcribed_for_the_turn() {
    let fake = FakeBotApi::start().await;
    let (url, seen) = transcriber().await;
    let voice = b"OggS a fake voice note".to_vec();
    fake.add_file("voice-ok", "voice/file_3.oga", voice.clone());
    let mut opts = host_options(
        &fake,
        json!({"rules": [{"match": "it says: \"([^\"]*)\"\\]", "reply": "heard: $1"}]}),
        vec![
            ("models.transcription", Yaml::from("openai:whisper-1")),
            ("providers.openai_base_url", Yaml::from(url)),
            ("providers.max_retries", Yaml::from(0)),
        ],
    );
    opts.env
        .push(("MERCURY_OPENAI_API_KEY", "sk-test-voice".to_string()));
    let host = TestHost::start_process(opts).await;
    fake.push(carrying(
        1,
        101,
        None,
        (
            "voice",
            json!({"file_id": "voice-ok", "file_unique_id": "v", "duration": 2, "mime_type": "audio/ogg", "file_size": voice.len()}),
        ),
    ));
    fake.until(60, "the reply", |f| f.replies().contains_key(&101))
        .await;
    assert_eq!(fake.replies()[&101][0]["text"], "heard: buy milk tomorrow");
    // The form carried the model's name and the note's bytes, named by the host.
    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    let body = String::from_utf8_lossy(&bodies[0]);
    assert!(
        body.contains("name=\"model\"\r\n\r\nwhisper-1\r\n"),
        "{body}"
    );
    assert!(
        body.contains("Content-Type: audio/ogg\r\n\r\nOggS a fake voice note\r\n"),
        "{body}"
    );
    assert!(body.contains("filename=\"1-1.ogg\""), "{body}");
    let transcript: Option<String> =
        host.read(|c| c.query_row("SELECT transcript FROM attachments", &[], |r| r.get(0)));
    assert_eq!(transcript.as_deref(), Some("buy milk tomorrow"));
    assert_eq!(inbox_files(&host), vec!["1-1.ogg".to_owned()]);
    host.stop().await;
}

#[tokio::test]
async fn telegram_a_file_the_turn_writes_under_outbox_goes_with_its_reply() {
    let fake = FakeBotApi::start().await;
    let host = TestHost::start_process(host_options(
        &fake,
        json!({"rules": [
            {"match": "tool_result\\(write_file\\)", "reply": "here it is"},
            {"match": "send me the report", "tool_calls": [
                {"name": "write_file", "arguments": {"path": "outbox/report.txt", "content": "quarterly numbers"}},
                {"name": "write_file", "arguments": {"path": "notes.txt", "content": "kept, not sent"}}
            ]}
        ]}),
        vec![],
    ))
    .await;
    fake.push(crate::telegram::dm(1, 101, 501, "send me the report"));
    fake.until(60, "the reply and its file", |f| {
        f.replies().contains_key(&101) && !f.calls("sendDocument").is_empty()
    })
    .await;
    assert_eq!(fake.replies()[&101][0]["text"], "here it is");
    let uploads = fake.calls("sendDocument");
    assert_eq!(uploads.len(), 1, "only the file under outbox/: {uploads:?}");
    let form = uploads[0].params["multipart"].as_str().unwrap();
    assert!(form.contains("name=\"chat_id\"\r\n\r\n501\r\n"), "{form}");
    assert!(
        form.contains("name=\"document\"; filename=\"report.txt\"")
            && form.contains("\r\n\r\nquarterly numbers\r\n"),
        "{form}"
    );
    // The reply's text went first, then its file.
    let sent = fake.calls("sendMessage");
    assert!(sent[0].at <= uploads[0].at);
    assert!(fake.calls("sendPhoto").is_empty());
    host.wait_count(
        "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
        1,
        30,
    )
    .await;
    host.stop().await;
}
