//! A message's attachments at turn time: each one the adapter stored as a
//! reference is fetched through its platform's [`AttachmentSource`], at
//! most `adapters.max_attachment_mb`, and kept in the workspace's `inbox/`
//! under a name the host makes (`inbox/<message>-<n>.<ext>`), through the
//! files module's safe, quota-checked write; or refused with a sentence.
//! The turn's prompt gets one line per attachment (where it is, or why it
//! is not), a voice note its transcript when `models.transcription` names
//! a model, and a picture goes to a model that takes images as an image
//! part.
//!
//! Must never: build a path from anything a sender or platform chose (the
//! file's name is shown, never used), write past the workspace quota or the
//! size limit (checked before the first byte is kept), or fetch for a
//! message whose platform has no source on this host (its adapter is not
//! running).

use std::sync::Arc;

use crate::model::ImagePart;
use crate::runtime::{AttachmentSource, FetchError, Runtime};
use crate::storage::attachments::{self, Attachment};
use crate::storage::messages::Message;
use crate::workspace::files::{self, FilesError};

/// The largest picture given to a model as an image part (the strictest
/// provider's limit); a larger one is a file with its line only.
const IMAGE_PART_MAX: usize = 5 << 20;

/// What a turn is given of its message's attachments.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// One line per attachment, for the prompt.
    pub lines: Vec<String>,
    /// The pictures, for a model that takes them.
    pub images: Vec<ImagePart>,
}

/// Fetches and keeps `message`'s pending attachments (`list`, read with
/// the run's opening transaction, with the platform of its conversation;
/// one already settled by an earlier attempt of the turn is not fetched
/// again) and says what became of each.
pub(crate) async fn take_in(
    rt: &Arc<Runtime>,
    message: &Message,
    (list, platform): (Vec<Attachment>, Option<String>),
) -> Received {
    let id = message.id;
    let source = platform.as_deref().and_then(|p| rt.sources.get(p));
    let mut out = Received::default();
    for (n, a) in list.iter().enumerate() {
        let kept = match a.status.as_str() {
            "kept" => match a.path.clone() {
                Some(path) => read_back(rt, &message.space_id, &path)
                    .await
                    .map(|bytes| (path, bytes)),
                None => Err("it was not kept".to_owned()),
            },
            "refused" => Err(a.error.clone().unwrap_or_default()),
            _ => {
                // The platform is not configured here (every host with its
                // adapter has a source, lease or not): left pending.
                let Some(source) = source.as_deref() else {
                    out.lines.push(format!(
                        "[The user sent {}, which was not fetched: its platform's adapter is not running on this host]",
                        describe(a)
                    ));
                    continue;
                };
                let kept = keep(rt, message, n + 1, a, source).await;
                let (aid, path, error) = match &kept {
                    Ok((path, _)) => (a.id, Some(path.clone()), None),
                    Err(why) => (a.id, None, Some(why.clone())),
                };
                if let Err(e) = rt
                    .store
                    .write(move |tx| {
                        attachments::settle(tx, aid, path.as_deref(), error.as_deref())
                    })
                    .await
                {
                    tracing::warn!(message = id, error = %e, "cannot record what became of an attachment");
                }
                kept
            }
        };
        let what = describe(a);
        match kept {
            Ok((path, bytes)) => {
                let heard = match &a.transcript {
                    Some(t) => Some(t.clone()),
                    None => transcribe(rt, message, a, &path, &bytes).await,
                };
                out.lines.push(match heard {
                    Some(text) => format!(
                        "[The user sent {what}; it is saved as {path}; it says: \"{}\"]",
                        one_line(&text)
                    ),
                    None => format!("[The user sent {what}; it is saved as {path}]"),
                });
                if let Some(mime) = image_mime(a).filter(|_| bytes.len() <= IMAGE_PART_MAX) {
                    use base64::Engine;
                    out.images.push(ImagePart {
                        mime: mime.to_owned(),
                        base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
                    });
                }
            }
            Err(why) => {
                tracing::info!(message = id, kind = %a.kind, reason = %why, "an attachment was not kept");
                out.lines
                    .push(format!("[The user sent {what}, which was not kept: {why}]"));
            }
        }
    }
    out
}

/// What a kept voice note or audio file says, when `models.transcription`
/// names a model: charged to the space's budget (`models.transcription_cost`,
/// through the spend seam's caps) and kept with the attachment, so a retried
/// turn does not pay again. `None` when none is configured, or it failed
/// (logged: the file is still there).
async fn transcribe(
    rt: &Arc<Runtime>,
    message: &Message,
    a: &Attachment,
    path: &str,
    bytes: &[u8],
) -> Option<String> {
    let model = rt.settings.models.transcription.strip_prefix("openai:")?;
    if !matches!(a.kind.as_str(), "voice" | "audio") {
        return None;
    }
    let charge = crate::spend::Charge {
        space: Some(message.space_id.clone()),
        purpose: crate::spend::SpendPurpose::Turn,
    };
    let reservation = match rt
        .spend
        .reserve_tool(
            &charge,
            "transcription",
            rt.settings.models.transcription_cost,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(space = %message.space_id, reason = %e, "a voice note was not transcribed");
            return None;
        }
    };
    let name = path.rsplit('/').next().unwrap_or(path);
    let mime = a.mime.as_deref().unwrap_or("application/octet-stream");
    let heard = crate::model::transcribe::transcribe(
        rt.models.provider_settings(),
        model,
        bytes,
        mime,
        name,
    )
    .await;
    if let Err(e) = rt.spend.end_tool(reservation, heard.is_ok()).await {
        tracing::warn!(error = %e, "cannot end a transcription's reservation");
    }
    match heard {
        Ok(text) => {
            let (id, kept) = (a.id, text.clone());
            if let Err(e) = rt
                .store
                .write(move |tx| attachments::set_transcript(tx, id, &kept))
                .await
            {
                tracing::warn!(error = %e, "cannot keep a voice note's transcript");
            }
            Some(text)
        }
        Err(e) => {
            let e = crate::redaction::secrets::scrub_error(&e.to_string());
            tracing::warn!(space = %message.space_id, error = %e, "a voice note could not be transcribed");
            None
        }
    }
}

/// `text` on one line, at most 4,000 characters: a transcript is the
/// sender's words, so it cannot close the line it is quoted in.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .filter(|c| *c != '"' && *c != ']')
        .take(4000)
        .collect::<String>()
        .trim()
        .to_owned()
}

/// Fetches one attachment and writes it into the live workspace's inbox;
/// the path it was kept at and its bytes, or the sentence saying why not.
async fn keep(
    rt: &Arc<Runtime>,
    message: &Message,
    n: usize,
    a: &Attachment,
    source: &dyn AttachmentSource,
) -> Result<(String, Vec<u8>), String> {
    let max_mb = rt.settings.adapters.max_attachment_mb;
    let max = max_mb << 20;
    let too_large = || format!("it is larger than adapters.max_attachment_mb ({max_mb} MB) allows");
    if a.size
        .is_some_and(|s| u64::try_from(s).unwrap_or(u64::MAX) > max)
    {
        return Err(too_large());
    }
    let bytes = match source.fetch(&a.reference, max).await {
        Ok(b) => b,
        Err(FetchError::TooLarge(_)) => return Err(too_large()),
        Err(FetchError::Failed(e)) => return Err(format!("it could not be fetched ({e})")),
    };
    let rel = format!("inbox/{}-{n}.{}", message.id, extension(a));
    let live = rt
        .paths
        .workspace(&crate::ids::SpaceId::parse(&message.space_id).map_err(|e| e.to_string())?);
    let quota = rt.settings.sandbox.workspace_mb;
    let limits = (&rt.settings.workspace).into();
    let (at, body) = (rel.clone(), bytes);
    let written = tokio::task::spawn_blocking(move || {
        files::write(&live, &at, &body, None, quota, limits).map(|_| body)
    })
    .await
    .map_err(|e| format!("it could not be saved ({e})"))?;
    match written {
        Ok(bytes) => Ok((rel, bytes)),
        Err(FilesError::OverQuota { .. } | FilesError::TooManyEntries { .. }) => Err(format!(
            "the workspace has no room left for it (sandbox.workspace_mb = {quota} MB)"
        )),
        Err(e) => Err(format!("it could not be saved ({e})")),
    }
}

/// A kept attachment's bytes, for a turn retried after a crash.
async fn read_back(rt: &Arc<Runtime>, space: &str, rel: &str) -> Result<Vec<u8>, String> {
    let space = crate::ids::SpaceId::parse(space).map_err(|e| e.to_string())?;
    let live = rt.paths.workspace(&space);
    let rel = rel.to_owned();
    tokio::task::spawn_blocking(move || {
        let root = crate::workspace::safe::WorkspaceRoot::open(&live).map_err(|e| e.to_string())?;
        match root.read_capped(&rel, IMAGE_PART_MAX + 1) {
            Ok(Some((bytes, _))) => Ok(bytes),
            Ok(None) => Err(format!("{rel} is gone from the workspace")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

/// How the prompt names an attachment: its kind, and the sender's file name
/// (shown as their text: quoted, cut, without control characters).
fn describe(a: &Attachment) -> String {
    let kind = match a.kind.as_str() {
        "image" => "a picture",
        "voice" => "a voice note",
        "audio" => "an audio file",
        "video" => "a video",
        _ => "a file",
    };
    match a.name.as_deref().map(|n| {
        n.chars()
            .filter(|c| !c.is_control())
            .take(100)
            .collect::<String>()
    }) {
        Some(name) if !name.trim().is_empty() => format!("{kind} named {name:?}"),
        _ => kind.to_owned(),
    }
}

/// The picture types every provider takes as an image part.
fn image_mime(a: &Attachment) -> Option<&'static str> {
    if a.kind != "image" {
        return None;
    }
    match a.mime.as_deref().unwrap_or("image/jpeg") {
        "image/jpeg" | "image/jpg" => Some("image/jpeg"),
        "image/png" => Some("image/png"),
        "image/gif" => Some("image/gif"),
        "image/webp" => Some("image/webp"),
        _ => None,
    }
}

/// The inbox file's extension, from the declared type only (a sender's file
/// name never chooses it).
fn extension(a: &Attachment) -> &'static str {
    match a.mime.as_deref() {
        Some("image/jpeg" | "image/jpg") => "jpg",
        Some("image/png") => "png",
        Some("image/gif") => "gif",
        Some("image/webp") => "webp",
        Some("audio/ogg") => "ogg",
        Some("audio/mpeg") => "mp3",
        Some("audio/mp4") => "m4a",
        Some("video/mp4") => "mp4",
        Some("application/pdf") => "pdf",
        Some("text/plain") => "txt",
        None if a.kind == "image" => "jpg",
        None if a.kind == "voice" => "ogg",
        _ => "bin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(kind: &str, name: Option<&str>, mime: Option<&str>) -> Attachment {
        Attachment {
            id: 1,
            message_id: 1,
            kind: kind.into(),
            reference: "r".into(),
            name: name.map(str::to_owned),
            mime: mime.map(str::to_owned),
            size: None,
            status: "pending".into(),
            path: None,
            error: None,
            transcript: None,
        }
    }

    #[test]
    fn a_senders_file_name_is_shown_never_used_for_the_path() {
        let a = attachment(
            "file",
            Some("../../etc/passwd\n.sh"),
            Some("application/x-sh"),
        );
        assert_eq!(extension(&a), "bin");
        assert_eq!(describe(&a), "a file named \"../../etc/passwd.sh\"");
        let photo = attachment("image", None, None);
        assert_eq!(
            (extension(&photo), image_mime(&photo)),
            ("jpg", Some("image/jpeg"))
        );
        let svg = attachment("image", Some("x.svg"), Some("image/svg+xml"));
        assert_eq!(image_mime(&svg), None, "not a type every provider takes");
    }
}
