//! Slack's Web API as the adapter calls it: one call (JSON or form
//! arguments, a 429's `Retry-After` read), and the calls that deliver
//! ([`SlackEditor`]): posts, `chat.update` edits paced per channel, and
//! file uploads (`files.getUploadURLExternal`, the bytes to the URL Slack
//! gives, `files.completeUploadExternal` into the channel or thread).
//!
//! Must never: put a token in an error (errors are built without the URL,
//! and the token travels in the `Authorization` header only), send the bot
//! token to an upload URL, or post text that could ping a channel (every
//! text passes [`super::neutralise`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{neutralise, MAX_429, MAX_MESSAGE, RETRY_AFTER_CAP};
use crate::adapters::{EditPace, ReplyFile};

/// A call's arguments: a JSON body, or a form (`files.*` take forms only).
#[derive(Clone, Copy)]
pub(super) enum Args<'a> {
    Json(&'a Value),
    Form(&'a [(&'a str, &'a str)]),
}

/// How a Web API call failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// 429: wait this long, then make the same call again.
    RetryAfter(Duration),
    /// `ok: false` with Slack's error (`channel_not_found`, `not_in_channel`…).
    Api(String),
    /// No answer, a 5xx, an unreadable body.
    Transport(String),
}

pub(super) struct Web {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
}

impl Web {
    pub(super) async fn call(
        &self,
        method: &str,
        token: &str,
        args: Args<'_>,
    ) -> Result<Value, Failure> {
        let req = self
            .http
            .post(format!("{}/{method}", self.base))
            .bearer_auth(token);
        let req = match args {
            Args::Json(body) => req.json(body),
            Args::Form(fields) => req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(urlencoded(fields)),
        };
        let r = req
            .send()
            .await
            .map_err(|e| Failure::Transport(e.without_url().to_string()))?;
        if r.status().as_u16() == 429 {
            let secs = r
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1);
            return Err(Failure::RetryAfter(
                Duration::from_secs(secs.max(1)).min(RETRY_AFTER_CAP),
            ));
        }
        if !r.status().is_success() {
            return Err(Failure::Transport(format!("{method}: HTTP {}", r.status())));
        }
        let v: Value = r.json().await.map_err(|e| {
            Failure::Transport(format!(
                "{method}: an answer Mercury cannot read: {}",
                e.without_url()
            ))
        })?;
        if v["ok"].as_bool() == Some(true) {
            Ok(v)
        } else {
            let error: String = v["error"]
                .as_str()
                .unwrap_or("unknown")
                .chars()
                .take(100)
                .collect();
            Err(Failure::Api(format!("{method}: {error}")))
        }
    }
}

/// The least time between two `chat.update`s in one channel (a Tier 3
/// method: about fifty a minute).
const EDIT_EVERY: Duration = Duration::from_millis(1200);

/// Errors of `chat.update` that mean the message can no longer be edited:
/// the text is posted anew instead.
const GONE: [&str; 3] = [
    "message_not_found",
    "cant_update_message",
    "edit_window_closed",
];

/// Makes the Web API calls that deliver: posts (a 429 waited out, at most
/// [`MAX_429`] times) and, for a streamed reply, edits paced per channel.
pub(super) struct SlackEditor {
    pub(super) web: Arc<Web>,
    pub(super) bot_token: String,
    pub(super) pace: Arc<EditPace>,
    pub(super) cancel: CancellationToken,
}

impl SlackEditor {
    /// `method` with `body`, a 429 waited out; `None` if the adapter is
    /// stopping.
    async fn call(&self, method: &str, args: Args<'_>) -> Option<Result<Value, Failure>> {
        let mut waits = 0;
        loop {
            let res = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                r = self.web.call(method, &self.bot_token, args) => r,
            };
            match res {
                Err(Failure::RetryAfter(d)) if waits < MAX_429 => {
                    waits += 1;
                    tracing::info!(secs = d.as_secs(), method, "slack asked to wait");
                    if !crate::adapters::pause(&self.cancel, d).await {
                        return None;
                    }
                }
                Err(Failure::RetryAfter(_)) => {
                    return Some(Err(Failure::Transport("still rate limited".into())))
                }
                other => return Some(other),
            }
        }
    }

    /// Posts `text` into `channel`, in the thread of `answered` unless the
    /// channel is a DM; the new message's `ts`.
    pub(super) async fn post(
        &self,
        channel: &str,
        answered: Option<&str>,
        text: &str,
    ) -> Option<Result<String, Failure>> {
        let mut body = json!({
            "channel": channel,
            "text": neutralise(text),
            "link_names": false,
            "unfurl_links": false,
            "unfurl_media": false,
        });
        // A DM (`D…`) is answered inline, a channel in the message's thread.
        if let Some(t) = thread_of(channel, answered) {
            body["thread_ts"] = json!(t);
        }
        Some(
            self.call("chat.postMessage", Args::Json(&body))
                .await?
                .map(|v| v["ts"].as_str().unwrap_or_default().to_owned()),
        )
    }

    /// Replaces the text of message `ts`; `Ok(false)` when it can no longer
    /// be edited.
    pub(super) async fn update(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
    ) -> Option<Result<bool, Failure>> {
        self.pace.wait(channel, EDIT_EVERY).await;
        let body = json!({
            "channel": channel,
            "ts": ts,
            "text": neutralise(text),
            "link_names": false,
        });
        Some(match self.call("chat.update", Args::Json(&body)).await? {
            Ok(_) => Ok(true),
            Err(Failure::Api(e)) if GONE.contains(&e.as_str()) => Ok(false),
            Err(f) => Err(f),
        })
    }
    /// Shares `file` into `channel` (in the thread of `answered` unless
    /// the channel is a DM), through Slack's external upload: a URL asked
    /// for its size, the bytes sent there (without the token: the URL
    /// carries its own grant), then the upload completed into the channel.
    pub(super) async fn upload(
        &self,
        channel: &str,
        answered: Option<&str>,
        file: &ReplyFile,
    ) -> Option<Result<(), Failure>> {
        let length = file.bytes.len().to_string();
        let fields = [
            ("filename", file.name.as_str()),
            ("length", length.as_str()),
        ];
        let got = match self
            .call("files.getUploadURLExternal", Args::Form(&fields))
            .await?
        {
            Ok(v) => v,
            Err(f) => return Some(Err(f)),
        };
        let (Some(url), Some(id)) = (got["upload_url"].as_str(), got["file_id"].as_str()) else {
            return Some(Err(Failure::Transport(
                "files.getUploadURLExternal answered no upload_url or file_id".into(),
            )));
        };
        let sent = tokio::select! {
            _ = self.cancel.cancelled() => return None,
            r = self
                .web
                .http
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, file.mime)
                .body(file.bytes.clone())
                .send() => r,
        };
        match sent {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                return Some(Err(Failure::Transport(format!(
                    "the file upload answered {}",
                    r.status()
                ))))
            }
            Err(e) => {
                return Some(Err(Failure::Transport(format!(
                    "the file upload: {}",
                    e.without_url()
                ))))
            }
        }
        let files = json!([{"id": id, "title": file.name}]).to_string();
        let mut fields = vec![("files", files.as_str()), ("channel_id", channel)];
        if let Some(t) = thread_of(channel, answered) {
            fields.push(("thread_ts", t));
        }
        Some(
            self.call("files.completeUploadExternal", Args::Form(&fields))
                .await?
                .map(|_| ()),
        )
    }
}

pub(super) fn said(f: Failure) -> String {
    match f {
        Failure::RetryAfter(d) => format!("asked to wait {} s", d.as_secs()),
        Failure::Api(e) | Failure::Transport(e) => e,
    }
}

#[async_trait::async_trait]
impl crate::runtime::ReplyEditor for SlackEditor {
    async fn send(&self, chat: &str, answered: Option<&str>, text: &str) -> Result<String, String> {
        match self.post(chat, answered, text).await {
            Some(Ok(ts)) if !ts.is_empty() => Ok(ts),
            Some(Ok(_)) => Err("chat.postMessage answered no ts".into()),
            Some(Err(f)) => Err(format!("chat.postMessage: {}", said(f))),
            None => Err("the adapter is stopping".into()),
        }
    }

    async fn edit(&self, chat: &str, message: &str, text: &str) -> Result<(), String> {
        match self.update(chat, message, text).await {
            Some(Ok(true)) => Ok(()),
            Some(Ok(false)) => Err("chat.update: the message can no longer be edited".into()),
            Some(Err(f)) => Err(format!("chat.update: {}", said(f))),
            None => Err("the adapter is stopping".into()),
        }
    }

    fn max_units(&self) -> usize {
        MAX_MESSAGE
    }
}

/// The thread a reply goes to: the `thread` part of the answered message's
/// `thread/ts` id, unless the channel is a DM (`D…`, answered inline).
fn thread_of<'a>(channel: &str, answered: Option<&'a str>) -> Option<&'a str> {
    answered
        .and_then(|a| a.split_once('/').map(|(t, _)| t))
        .filter(|_| !channel.starts_with('D'))
}

/// `application/x-www-form-urlencoded` of `fields`.
fn urlencoded(fields: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        escape_into(&mut out, k);
        out.push('=');
        escape_into(&mut out, v);
    }
    out
}

fn escape_into(out: &mut String, s: &str) {
    use std::fmt::Write;
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_are_escaped_and_a_dm_is_answered_inline() {
        assert_eq!(
            urlencoded(&[("files", r#"[{"id":"F1"}]"#), ("a b", "é&=")]),
            "files=%5B%7B%22id%22%3A%22F1%22%7D%5D&a%20b=%C3%A9%26%3D"
        );
        assert_eq!(thread_of("C0CHAN", Some("1.0/2.0")), Some("1.0"));
        assert_eq!(thread_of("D0DM", Some("1.0/2.0")), None);
        assert_eq!(thread_of("C0CHAN", None), None);
    }
}
