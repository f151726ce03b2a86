//! A live reply shown while the model writes it (`turn.stream`): once the
//! turn has run for `turn.stream_after_ms`, the text so far goes out as one
//! platform message, which is edited as the text grows (the platform's
//! editor paces the edits to its limits; edits that fall behind are folded
//! into the next one). The preview's platform id is stored as soon as it is
//! known (`storage::previews`): the committed reply is delivered as that
//! message's edit, and a turn retried after a crash goes on editing it.
//!
//! Must never: store the streamed text (the reply row is the final text
//! only), show a preview in a shadow or an ask (neither reaches a platform),
//! or hold the turn's commit past one edit in flight.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::model::TextSink;
use crate::runtime::{ReplyEditor, Runtime};
use crate::storage::messages::Message;
use crate::storage::previews::{self, Preview};
use crate::storage::{conversations, StoreResult};

/// The longest the commit waits for the preview's last edit in flight.
const FINISH_WAIT: Duration = Duration::from_secs(15);

/// A running preview of the reply to one message.
pub(crate) struct ReplyPreview {
    latest: Arc<watch::Sender<String>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Where the preview goes.
struct Target {
    message: i64,
    platform: String,
    chat: String,
    answered: Option<String>,
}

impl ReplyPreview {
    /// The preview of the reply to `message`, when streaming is on and the
    /// message came from a platform conversation whose adapter edits
    /// messages and runs on this host; `None` otherwise (the reply then goes
    /// out whole, as always).
    pub(crate) async fn start(rt: &Arc<Runtime>, message: &Message) -> Option<Self> {
        if !rt.settings.turn.stream || rt.outbound.is_shadow() || message.task_run_id.is_some() {
            return None;
        }
        let conversation = message.conversation_id?;
        let id = message.id;
        let read = rt
            .store
            .read(move |c| -> StoreResult<_> {
                Ok((
                    conversations::get(c, conversation)?,
                    previews::of_message(c, id)?,
                ))
            })
            .await;
        let (conversation, earlier) = match read {
            Ok((Some(c), earlier)) => (c, earlier),
            Ok((None, _)) => return None,
            Err(e) => {
                tracing::warn!(message = id, error = %e, "cannot read where a reply's preview goes; it is sent whole");
                return None;
            }
        };
        let editor = rt.editors.get(&conversation.platform)?;
        let target = Target {
            message: id,
            platform: conversation.platform,
            chat: conversation.external_id,
            answered: message.platform_message_id.clone(),
        };
        // A retried turn goes on editing the message its first attempt sent.
        let earlier = earlier
            .filter(|p| p.platform == target.platform && p.external_id == target.chat)
            .map(|p| p.platform_message_id);
        let (latest, rx) = watch::channel(String::new());
        let stop = CancellationToken::new();
        let after = Duration::from_millis(rt.settings.turn.stream_after_ms);
        let task = tokio::spawn(show(
            rt.clone(),
            editor,
            target,
            earlier,
            rx,
            stop.clone(),
            after,
        ));
        Some(Self {
            latest: Arc::new(latest),
            stop,
            task,
        })
    }

    /// What the model call streams into: the latest text replaces the last.
    pub(crate) fn sink(&self) -> TextSink {
        let latest = self.latest.clone();
        Arc::new(move |text: &str| {
            latest.send_replace(text.to_owned());
        })
    }

    /// Stops previewing; returns once an edit in flight has been answered
    /// (so the final reply's edit comes after it), or after [`FINISH_WAIT`].
    pub(crate) async fn finish(self) {
        self.stop.cancel();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(FINISH_WAIT, self.task).await.is_err() {
            abort.abort();
        }
    }
}

/// The preview's loop: nothing before `after` (a quick turn's reply goes
/// out whole), then the text so far, sent once and edited whenever it grew.
async fn show(
    rt: Arc<Runtime>,
    editor: Arc<dyn ReplyEditor>,
    target: Target,
    mut sent: Option<String>,
    mut latest: watch::Receiver<String>,
    stop: CancellationToken,
    after: Duration,
) {
    if sent.is_none() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(after) => {}
        }
    }
    let mut shown = String::new();
    loop {
        let text = latest.borrow_and_update().clone();
        if !text.trim().is_empty() && text != shown {
            let view = fitted(&text, editor.max_units());
            match &sent {
                None => match editor
                    .send(&target.chat, target.answered.as_deref(), &view)
                    .await
                {
                    Ok(id) => {
                        record(&rt, &target, &id).await;
                        sent = Some(id);
                    }
                    Err(e) => {
                        tracing::warn!(platform = %target.platform, message = target.message, error = %e, "a reply's preview could not be sent; the reply goes out whole");
                        return;
                    }
                },
                Some(id) => {
                    if let Err(e) = editor.edit(&target.chat, id, &view).await {
                        // The final reply still edits it (or is sent anew).
                        tracing::warn!(platform = %target.platform, message = target.message, error = %e, "a reply's preview could not be edited; it waits for the final text");
                        return;
                    }
                }
            }
            shown = text;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            changed = latest.changed() => if changed.is_err() { return },
        }
    }
}

/// Stores the preview's id before anything else is shown: from here on the
/// reply (after a restart too) edits this message.
async fn record(rt: &Runtime, target: &Target, id: &str) {
    let (message, preview) = (
        target.message,
        Preview {
            platform: target.platform.clone(),
            external_id: target.chat.clone(),
            platform_message_id: id.to_owned(),
        },
    );
    if let Err(e) = rt
        .store
        .write(move |tx| previews::record(tx, message, &preview, now_ms()))
        .await
    {
        // The final reply then comes as a second message, beside this one.
        tracing::error!(message = target.message, error = %e, "cannot store a reply preview's id");
    }
}

/// `text` cut to fit one message (`…` marks the cut): a preview shows the
/// beginning; the final reply is split across messages as usual.
fn fitted(text: &str, max_units: usize) -> String {
    if text.encode_utf16().count() <= max_units {
        return text.to_owned();
    }
    let mut units = 0;
    let mut out = String::new();
    for c in text.chars() {
        units += c.len_utf16();
        if units + 1 > max_units {
            break;
        }
        out.push(c);
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_longer_than_a_message_is_cut_with_a_mark() {
        assert_eq!(fitted("short", 10), "short");
        let cut = fitted("abcdefghij", 5);
        assert_eq!(cut, "abcd…");
        assert_eq!(cut.encode_utf16().count(), 5);
        // A character outside the BMP counts two units and is never split.
        let cut = fitted("ab\u{1f600}cd", 4);
        assert_eq!(cut, "ab…");
    }
}
