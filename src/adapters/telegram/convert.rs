//! A Telegram update as Mercury sees it: which updates carry a message to
//! store, and the [`IngressMessage`] each becomes (a mention of the bot, a
//! reply to it, `/cmd@botname`).
//!
//! Must never: trust a field for identity (the sender is the update's
//! numeric `from.id`, or `sender_chat.id` when the message speaks for a chat,
//! put in the `telegram:` namespace by ingress), or let a
//! platform-controlled name fail validation and lose the message (names are
//! cleaned, not refused).

use frankenstein::types::{ChatType, Message};
use frankenstein::updates::{Update, UpdateContent};

use crate::adapters::clean_name;
use crate::ingress::IngressMessage;
use crate::storage::attachments::NewAttachment;

pub(crate) const PLATFORM: &str = "telegram";

/// The bot itself, from `getMe`.
#[derive(Debug, Clone)]
pub(crate) struct BotSelf {
    pub id: u64,
    /// Without the `@`.
    pub username: String,
}

/// What an update is to Mercury.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A message to store (and maybe answer), with what it carried.
    Message(Box<IngressMessage>, Vec<NewAttachment>),
    /// Acknowledged and not stored: an edit (the first version stays as it
    /// was received and answered), a message with neither text, caption nor
    /// attachment (stickers, service messages), a channel post, anything else.
    Skip(&'static str),
}

/// Reads one update.
pub(crate) fn inbound(update: &Update, bot: &BotSelf) -> Inbound {
    match &update.content {
        UpdateContent::Message(m) => message(m, bot),
        UpdateContent::EditedMessage(_) => Inbound::Skip("edited message"),
        UpdateContent::ChannelPost(_) | UpdateContent::EditedChannelPost(_) => {
            Inbound::Skip("channel post")
        }
        _ => Inbound::Skip("not a message"),
    }
}

fn message(m: &Message, bot: &BotSelf) -> Inbound {
    let Some(from) = m.from.as_deref() else {
        return Inbound::Skip("message without a sender");
    };
    if from.id == bot.id {
        return Inbound::Skip("the bot's own message");
    }
    let carried = attachments(m);
    let said = m.text.as_deref().or(m.caption.as_deref());
    if said.is_none() && carried.is_empty() {
        return Inbound::Skip("message without text, caption or attachment");
    }
    let text = crate::adapters::with_markers(said.unwrap_or(""), &carried);
    let text = text.as_str();
    let is_group = !matches!(m.chat.type_field, ChatType::Private);
    let (sender_id, name) = sender(m, from);
    let reply_to_bot = m
        .reply_to_message
        .as_deref()
        .and_then(|r| r.from.as_deref())
        .is_some_and(|u| u.id == bot.id);
    Inbound::Message(
        Box::new(IngressMessage {
            platform: PLATFORM.into(),
            conversation: m.chat.id.to_string(),
            sender_id,
            sender_name: clean_name(&name),
            text: text.to_owned(),
            message_id: m.message_id.to_string(),
            is_group,
            mentions_bot: mentions(text, &bot.username),
            reply_to_bot,
            title: if is_group {
                m.chat.title.as_deref().and_then(clean_name)
            } else {
                // A DM's "title" is the other person's name: not kept on the conversation.
                None
            },
        }),
        carried,
    )
}

/// What a message carried, as references `getFile` fetches: the largest
/// size of a photo, a voice note, an audio file, a video, a document.
fn attachments(m: &Message) -> Vec<NewAttachment> {
    let size = |s: Option<u64>| s.and_then(|s| i64::try_from(s).ok());
    let mut out = Vec::new();
    if let Some(photo) = m
        .photo
        .as_ref()
        .and_then(|sizes| sizes.iter().max_by_key(|p| p.width * p.height))
    {
        out.push(NewAttachment {
            kind: "image".into(),
            reference: photo.file_id.clone(),
            name: None,
            mime: Some("image/jpeg".into()),
            size: size(photo.file_size),
        });
    }
    if let Some(v) = m.voice.as_deref() {
        out.push(NewAttachment {
            kind: "voice".into(),
            reference: v.file_id.clone(),
            name: None,
            mime: v.mime_type.clone().or(Some("audio/ogg".into())),
            size: size(v.file_size),
        });
    }
    if let Some(a) = m.audio.as_deref() {
        out.push(NewAttachment {
            kind: "audio".into(),
            reference: a.file_id.clone(),
            name: a.file_name.clone(),
            mime: a.mime_type.clone(),
            size: size(a.file_size),
        });
    }
    if let Some(v) = m.video.as_deref() {
        out.push(NewAttachment {
            kind: "video".into(),
            reference: v.file_id.clone(),
            name: v.file_name.clone(),
            mime: v.mime_type.clone(),
            size: size(v.file_size),
        });
    }
    if let Some(d) = m.document.as_deref() {
        // A picture sent uncompressed is still a picture; anything else a file.
        let kind = match crate::adapters::kind_of(d.mime_type.as_deref()) {
            "image" => "image",
            _ => "file",
        };
        out.push(NewAttachment {
            kind: kind.into(),
            reference: d.file_id.clone(),
            name: d.file_name.clone(),
            mime: d.mime_type.clone(),
            size: size(d.file_size),
        });
    }
    out
}

/// The caller a message counts as, and its display name. A message that
/// speaks for a chat (a channel's post in its discussion group, a member
/// posting as a channel, an anonymous group admin) carries one of Telegram's
/// shared placeholder users in `from` (`777000`, `136817688`,
/// `1087968824`): every such post would be one caller, so a muted person
/// could post as a channel and be answered, and the per-caller limit would
/// be one bucket for everyone. Such a message's caller is `sender_chat`'s
/// id instead (negative, so never a person's); the author signature, a label
/// the poster may change at will, only names it.
fn sender(m: &Message, from: &frankenstein::types::User) -> (String, String) {
    if let Some(chat) = m.sender_chat.as_deref() {
        let title = chat
            .title
            .clone()
            .or_else(|| chat.username.clone())
            .unwrap_or_else(|| "chat".to_owned());
        let name = match m.author_signature.as_deref() {
            Some(sig) if !sig.trim().is_empty() => format!("{title} ({sig})"),
            _ => title,
        };
        return (chat.id.to_string(), name);
    }
    let name = match &from.last_name {
        Some(last) => format!("{} {last}", from.first_name),
        None => from.first_name.clone(),
    };
    (from.id.to_string(), name)
}

/// `@botname` standing alone, or a command addressed to the bot
/// (`/cmd@botname`), anywhere in the text; case-insensitive as Telegram's
/// usernames are. A bare `/cmd` in a group may be meant for another bot and
/// does not count.
pub(crate) fn mentions(text: &str, username: &str) -> bool {
    if username.is_empty() {
        return false;
    }
    let at = format!("@{}", username.to_lowercase());
    text.split(char::is_whitespace).any(|word| {
        let w = word
            .trim_end_matches([',', '.', '!', '?', ':', ';', ')'])
            .to_lowercase();
        w == at || (w.starts_with('/') && w.ends_with(&at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bot() -> BotSelf {
        BotSelf {
            id: 999,
            username: "mercury_test_bot".into(),
        }
    }

    fn update(v: serde_json::Value) -> Update {
        serde_json::from_value(v).unwrap()
    }

    fn msg(chat: serde_json::Value, text: &str) -> serde_json::Value {
        json!({"update_id": 1, "message": {
            "message_id": 7, "date": 1, "chat": chat, "text": text,
            "from": {"id": 42, "is_bot": false, "first_name": "Ada\u{7}", "last_name": "L"}
        }})
    }

    #[test]
    fn mention_forms() {
        let u = "mercury_test_bot";
        assert!(mentions("hey @Mercury_Test_Bot, hi", u));
        assert!(mentions("/help@mercury_test_bot now", u));
        assert!(!mentions("/help", u));
        assert!(!mentions("@mercury_test_bot_not", u));
        assert!(!mentions("mail@mercury_test_bot.example", u));
    }

    #[test]
    fn dms_groups_and_skips() {
        let dm = update(msg(
            json!({"id": 42, "type": "private", "first_name": "Ada"}),
            "hello",
        ));
        let Inbound::Message(m, _) = inbound(&dm, &bot()) else {
            panic!("a DM is a message")
        };
        assert!(!m.is_group);
        assert_eq!(
            (m.conversation.as_str(), m.sender_id.as_str()),
            ("42", "42")
        );
        assert_eq!(m.sender_name.as_deref(), Some("Ada L"));
        assert_eq!(m.title, None);
        assert!(m.validate().is_ok());

        let group = update(msg(
            json!({"id": -100123, "type": "supergroup", "title": "Team"}),
            "ping @mercury_test_bot",
        ));
        let Inbound::Message(m, _) = inbound(&group, &bot()) else {
            panic!("a group message is a message")
        };
        assert!(m.is_group && m.mentions_bot && !m.reply_to_bot);
        assert_eq!(m.title.as_deref(), Some("Team"));

        let mut reply = msg(json!({"id": -5, "type": "group", "title": "G"}), "thanks");
        reply["message"]["reply_to_message"] = json!({"message_id": 6, "date": 1,
            "chat": {"id": -5, "type": "group"},
            "from": {"id": 999, "is_bot": true, "first_name": "Mercury"}, "text": "hi"});
        let Inbound::Message(m, _) = inbound(&update(reply), &bot()) else {
            panic!("a reply is a message")
        };
        assert!(m.reply_to_bot && !m.mentions_bot);

        let mut edited = msg(json!({"id": 42, "type": "private"}), "edit");
        edited["edited_message"] = edited["message"].take();
        edited.as_object_mut().unwrap().remove("message");
        assert!(matches!(
            inbound(&update(edited), &bot()),
            Inbound::Skip("edited message")
        ));

        let mut sticker = msg(json!({"id": 42, "type": "private"}), "x");
        sticker["message"].as_object_mut().unwrap().remove("text");
        assert!(matches!(
            inbound(&update(sticker), &bot()),
            Inbound::Skip(_)
        ));

        let mut photo = msg(json!({"id": 42, "type": "private"}), "x");
        photo["message"].as_object_mut().unwrap().remove("text");
        photo["message"]["caption"] = json!("look at this");
        photo["message"]["photo"] = json!([
            {"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90, "file_size": 900},
            {"file_id": "large", "file_unique_id": "l", "width": 800, "height": 600, "file_size": 80000}
        ]);
        let Inbound::Message(m, carried) = inbound(&update(photo), &bot()) else {
            panic!("a captioned photo is a message")
        };
        assert_eq!(m.text, "look at this\n[image]");
        assert_eq!(carried.len(), 1);
        assert_eq!(
            (
                carried[0].kind.as_str(),
                carried[0].reference.as_str(),
                carried[0].size
            ),
            ("image", "large", Some(80000))
        );

        // A voice note alone is a message too: its marker is its text.
        let mut voice = msg(json!({"id": 42, "type": "private"}), "x");
        voice["message"].as_object_mut().unwrap().remove("text");
        voice["message"]["voice"] = json!({"file_id": "v1", "file_unique_id": "v", "duration": 3, "mime_type": "audio/ogg", "file_size": 5000});
        let Inbound::Message(m, carried) = inbound(&update(voice), &bot()) else {
            panic!("a voice note is a message")
        };
        assert_eq!(m.text, "[voice note]");
        assert_eq!(carried[0].kind, "voice");
        assert!(m.validate().is_ok());
    }

    #[test]
    fn a_post_for_a_chat_is_that_chats_caller_not_the_placeholder() {
        let chat = json!({"id": -100555, "type": "supergroup", "title": "Team"});
        // Anonymous group admin: from is GroupAnonymousBot, sender_chat the group.
        let mut anon = msg(chat.clone(), "ping @mercury_test_bot");
        anon["message"]["from"] =
            json!({"id": 1087968824u64, "is_bot": true, "first_name": "Group"});
        anon["message"]["sender_chat"] = chat.clone();
        anon["message"]["author_signature"] = json!("Boss");
        let Inbound::Message(m, _) = inbound(&update(anon), &bot()) else {
            panic!("an anonymous admin's post is a message")
        };
        assert_eq!(m.sender_id, "-100555");
        assert_eq!(m.sender_name.as_deref(), Some("Team (Boss)"));
        assert!(m.validate().is_ok());
        // A member posting as their channel: Channel_Bot in from, the channel in sender_chat.
        let mut as_channel = msg(chat, "hello");
        as_channel["message"]["from"] =
            json!({"id": 136817688u64, "is_bot": true, "first_name": "Channel"});
        as_channel["message"]["sender_chat"] =
            json!({"id": -100777, "type": "channel", "title": "My channel"});
        let Inbound::Message(m, _) = inbound(&update(as_channel), &bot()) else {
            panic!("a post as a channel is a message")
        };
        assert_eq!(
            (m.sender_id.as_str(), m.sender_name.as_deref()),
            ("-100777", Some("My channel"))
        );
    }
}
