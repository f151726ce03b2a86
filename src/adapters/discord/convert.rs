//! A Discord gateway dispatch as Mercury sees it: which `MESSAGE_CREATE`s
//! carry a message to store, and the [`IngressMessage`] each becomes (a DM,
//! a guild message that mentions the bot or replies to it, ambient guild
//! chatter).
//!
//! Read from the raw JSON into the few fields Mercury uses, so a field
//! Discord adds or changes elsewhere in a message never loses it.
//!
//! Must never: trust a field for identity (the sender is the message's
//! `author.id` snowflake, put in the `discord:` namespace by ingress), or let
//! a platform-controlled name fail validation and lose the message.

use serde::Deserialize;

use crate::adapters::clean_name;
use crate::ingress::IngressMessage;
use crate::storage::attachments::NewAttachment;

pub(crate) const PLATFORM: &str = "discord";

/// The bot itself, from `GET /users/@me`.
#[derive(Debug, Clone)]
pub(crate) struct BotSelf {
    /// The bot user's snowflake.
    pub id: String,
    pub username: String,
}

/// One gateway payload (`op`, `t`, `s`, `d`).
#[derive(Debug, Deserialize)]
pub(crate) struct Payload {
    pub op: u8,
    #[serde(default)]
    pub t: Option<String>,
    #[serde(default)]
    pub s: Option<u64>,
    #[serde(default)]
    pub d: serde_json::Value,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawUser {
    pub id: String,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub global_name: Option<String>,
    #[serde(default)]
    pub bot: bool,
}

#[derive(Debug, Deserialize)]
struct RawMember {
    #[serde(default)]
    nick: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawReferenced {
    author: Option<RawUser>,
}

/// The fields of a Discord message object Mercury reads.
#[derive(Debug, Deserialize)]
pub(crate) struct RawMessage {
    pub id: String,
    pub channel_id: String,
    #[serde(default)]
    guild_id: Option<String>,
    author: RawUser,
    #[serde(default)]
    content: String,
    #[serde(rename = "type", default)]
    kind: u8,
    #[serde(default)]
    mentions: Vec<RawUser>,
    #[serde(default)]
    referenced_message: Option<Box<RawReferenced>>,
    #[serde(default)]
    webhook_id: Option<String>,
    #[serde(default)]
    member: Option<RawMember>,
    #[serde(default)]
    attachments: Vec<RawAttachment>,
}

/// An attachment object as Discord sends it.
#[derive(Debug, Deserialize)]
struct RawAttachment {
    #[serde(default)]
    filename: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    size: Option<i64>,
    url: String,
}

/// Discord's message types a person writes: `DEFAULT` and `REPLY`.
const USER_MESSAGE_TYPES: [u8; 2] = [0, 19];

/// What a `MESSAGE_CREATE` is to Mercury.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A message to store, with what it carried (fetched at turn time).
    Message(Box<IngressMessage>, Vec<NewAttachment>),
    /// Not stored: the bot's own message, another bot's or a webhook's (two
    /// bots must not answer each other forever), a system message (a join,
    /// a pin), or one with neither text nor attachment (a guild message read
    /// without the MESSAGE_CONTENT intent).
    Skip(&'static str),
}

/// A snowflake: 1 to 20 ASCII digits.
pub(crate) fn is_snowflake(s: &str) -> bool {
    (1..=20).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
}

/// Reads one `MESSAGE_CREATE`'s message.
pub(crate) fn inbound(m: &RawMessage, bot: &BotSelf) -> Inbound {
    if ![&m.id, &m.channel_id, &m.author.id]
        .iter()
        .all(|s| is_snowflake(s))
    {
        return Inbound::Skip("a message whose ids are not snowflakes");
    }
    if m.author.id == bot.id {
        return Inbound::Skip("the bot's own message");
    }
    if m.author.bot || m.webhook_id.is_some() {
        return Inbound::Skip("a bot's or a webhook's message");
    }
    if !USER_MESSAGE_TYPES.contains(&m.kind) {
        return Inbound::Skip("a system message");
    }
    let carried: Vec<NewAttachment> = m
        .attachments
        .iter()
        .map(|a| {
            let mime = a.content_type.as_deref().map(crate::adapters::bare_mime);
            NewAttachment {
                kind: crate::adapters::kind_of(mime.as_deref()).into(),
                reference: a.url.clone(),
                name: a.filename.clone(),
                mime,
                size: a.size,
            }
        })
        .collect();
    if m.content.trim().is_empty() && carried.is_empty() {
        return Inbound::Skip("message without text or attachment");
    }
    let forms = [format!("<@{}>", bot.id), format!("<@!{}>", bot.id)];
    let mentions_bot =
        m.mentions.iter().any(|u| u.id == bot.id) || forms.iter().any(|f| m.content.contains(f));
    let reply_to_bot = m
        .referenced_message
        .as_deref()
        .and_then(|r| r.author.as_ref())
        .is_some_and(|a| a.id == bot.id);
    // The model reads `@botname`, not the bot's snowflake.
    let mut text = crate::adapters::with_markers(&m.content, &carried);
    for f in &forms {
        text = text.replace(f.as_str(), &format!("@{}", bot.username));
    }
    let name = m
        .member
        .as_ref()
        .and_then(|mem| mem.nick.clone())
        .or_else(|| m.author.global_name.clone())
        .unwrap_or_else(|| m.author.username.clone());
    Inbound::Message(
        Box::new(IngressMessage {
            platform: PLATFORM.into(),
            conversation: m.channel_id.clone(),
            sender_id: m.author.id.clone(),
            sender_name: clean_name(&name),
            text,
            message_id: m.id.clone(),
            is_group: m.guild_id.is_some(),
            mentions_bot,
            reply_to_bot,
            // MESSAGE_CREATE carries no channel name; a DM's would be a person's.
            title: None,
        }),
        carried,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bot() -> BotSelf {
        BotSelf {
            id: "900000000000000001".into(),
            username: "mercury".into(),
        }
    }

    fn msg(v: serde_json::Value) -> RawMessage {
        serde_json::from_value(v).unwrap()
    }

    fn base(content: &str) -> serde_json::Value {
        json!({"id": "1100", "channel_id": "2200", "type": 0, "content": content,
            "author": {"id": "3300", "username": "ada", "global_name": "Ada\u{7} L", "bot": false},
            "mentions": [], "tts": false, "pinned": false, "timestamp": "2026-12-01T10:00:00.000000+00:00"})
    }

    #[test]
    fn dms_mentions_replies_and_skips() {
        let Inbound::Message(dm, _) = inbound(&msg(base("hello")), &bot()) else {
            panic!("a DM is a message")
        };
        assert!(!dm.is_group && !dm.mentions_bot);
        assert_eq!(
            (dm.conversation.as_str(), dm.sender_id.as_str()),
            ("2200", "3300")
        );
        assert_eq!(dm.sender_name.as_deref(), Some("Ada L"));
        assert!(dm.validate().is_ok());

        let mut g = base("hey <@900000000000000001> what's up");
        g["guild_id"] = json!("4400");
        g["mentions"] = json!([{"id": "900000000000000001", "username": "mercury", "bot": true}]);
        g["member"] = json!({"nick": "Ada in the guild"});
        let Inbound::Message(m, _) = inbound(&msg(g), &bot()) else {
            panic!("a mention is a message")
        };
        assert!(m.is_group && m.mentions_bot && !m.reply_to_bot);
        assert_eq!(m.text, "hey @mercury what's up");
        assert_eq!(m.sender_name.as_deref(), Some("Ada in the guild"));

        let mut r = base("thanks");
        r["guild_id"] = json!("4400");
        r["type"] = json!(19);
        r["referenced_message"] =
            json!({"id": "1000", "author": {"id": "900000000000000001", "username": "mercury"}});
        let Inbound::Message(m, _) = inbound(&msg(r), &bot()) else {
            panic!("a reply is a message")
        };
        assert!(m.reply_to_bot && !m.mentions_bot);

        let mut ambient = base("just chatting");
        ambient["guild_id"] = json!("4400");
        let Inbound::Message(m, _) = inbound(&msg(ambient), &bot()) else {
            panic!("ambient chatter is stored")
        };
        assert!(m.is_group && !m.mentions_bot && !m.reply_to_bot);

        let mut own = base("my own reply");
        own["author"]["id"] = json!("900000000000000001");
        let mut other_bot = base("beep");
        other_bot["author"]["bot"] = json!(true);
        let mut hook = base("from a webhook");
        hook["webhook_id"] = json!("5500");
        let mut join = base("");
        join["type"] = json!(7);
        let empty = base("  ");
        let mut odd = base("x");
        odd["author"]["id"] = json!("../etc");
        for (v, why) in [
            (own, "the bot's own message"),
            (other_bot, "a bot's or a webhook's message"),
            (hook, "a bot's or a webhook's message"),
            (join, "a system message"),
            (empty, "message without text or attachment"),
            (odd, "a message whose ids are not snowflakes"),
        ] {
            let got = inbound(&msg(v), &bot());
            assert!(matches!(got, Inbound::Skip(w) if w == why), "{got:?}");
        }
        // Attachments alone make a message, their markers its text.
        let mut picture = base("");
        picture["attachments"] = json!([{"id": "9", "filename": "cat.png", "size": 10,
            "content_type": "image/png", "url": "https://cdn.discordapp.com/attachments/1/9/cat.png"}]);
        let Inbound::Message(m, carried) = inbound(&msg(picture), &bot()) else {
            panic!("a picture alone is a message")
        };
        assert_eq!(m.text, "[image]");
        assert_eq!(
            (
                carried[0].kind.as_str(),
                carried[0].mime.as_deref(),
                carried[0].size
            ),
            ("image", Some("image/png"), Some(10))
        );

        let mut pin = base("pinned a message");
        pin["type"] = json!(6);
        assert!(matches!(
            inbound(&msg(pin), &bot()),
            Inbound::Skip("a system message")
        ));
    }
}
