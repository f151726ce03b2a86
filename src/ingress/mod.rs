//! Ingress: inbound platform messages and console chat become durable rows
//! before anything else happens, then the space's actor is told.
//!
//! Owns the decisions of the inbound path: who may come in at all (the
//! sender policy, [`policy`]), which space a conversation feeds
//! (auto-created when `ingress.auto_space`), de-duplication of replays,
//! mutes, triggers, and the per-caller rate limit ("slow down", never
//! silence).
//!
//! Must never: run a turn for a replayed platform message, drop an admitted
//! message without storing it (muted, untriggered and rate-limited messages
//! are all stored; a stranger's is not, so strangers cannot fill the
//! database), or acknowledge before the row is committed.

pub mod policy;
pub mod trigger;
pub mod webhook;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::actors::ActorError;
use crate::app::{App, CallerLimits};
use crate::clock::now_ms;
use crate::config::Settings;
use crate::ids::SpaceId;
use crate::storage::messages::{self, NewMessage};
use crate::storage::spaces::{self, KvTable};
use crate::storage::{conversations, StoreError, StoreResult};

pub const SLOW_DOWN_REPLY: &str =
    "You are sending messages faster than I can answer. Please slow down and try again in a minute.";

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IngressMessage {
    pub platform: String,
    pub conversation: String,
    pub sender_id: String,
    pub sender_name: Option<String>,
    pub text: String,
    pub message_id: String,
    pub is_group: bool,
    #[serde(default)]
    pub mentions_bot: bool,
    #[serde(default)]
    pub reply_to_bot: bool,
    pub title: Option<String>,
}

impl IngressMessage {
    pub fn validate(&self) -> Result<(), String> {
        crate::ids::validate_platform(&self.platform)?;
        if self.conversation.trim().is_empty() || self.conversation.len() > 256 {
            return Err("conversation must be 1-256 characters".into());
        }
        crate::ids::validate_caller_id(&self.sender_id).map_err(|e| format!("sender_id: {e}"))?;
        if self.message_id.trim().is_empty() || self.message_id.len() > 256 {
            return Err("message_id must be 1-256 characters".into());
        }
        if self.text.chars().count() > 32_000 {
            return Err("text is longer than 32000 characters".into());
        }
        for (what, value) in [("sender_name", &self.sender_name), ("title", &self.title)] {
            if let Some(v) = value {
                if v.chars().count() > 200 {
                    return Err(format!("{what} is longer than 200 characters"));
                }
                if v.chars().any(char::is_control) {
                    return Err(format!("{what} must not contain control characters"));
                }
            }
        }
        if self.conversation.chars().any(char::is_control) {
            return Err("conversation must not contain control characters".into());
        }
        Ok(())
    }
}

/// What happened to an inbound message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestStatus {
    /// Stored and waiting for a turn.
    Queued,
    /// Already stored earlier (a replay): nothing done.
    Duplicate,
    /// Stored as ambient context (a group message not addressed to the bot).
    Ambient,
    /// Stored, not answered: the sender is muted.
    Muted,
    /// Stored and answered with a "slow down" reply.
    RateLimited,
    /// The conversation has no space yet (auto-space is off, or a group no
    /// operator allowed): only the conversation is recorded.
    Unlinked,
    /// A stranger's DM: a pairing request is pending (its code was sent
    /// once, when it opened); nothing else stored, no turn.
    Pairing,
    /// Refused by the sender policy: nothing stored, nothing sent.
    Refused,
}

impl IngestStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            IngestStatus::Queued => "queued",
            IngestStatus::Duplicate => "duplicate",
            IngestStatus::Ambient => "ambient",
            IngestStatus::Muted => "muted",
            IngestStatus::RateLimited => "rate_limited",
            IngestStatus::Unlinked => "unlinked",
            IngestStatus::Pairing => "pairing",
            IngestStatus::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone)]
pub struct IngestResult {
    pub status: IngestStatus,
    pub message_id: Option<i64>,
    pub space_id: Option<String>,
    /// Set when the space was created by this message (its workspace must be made).
    pub created_space: bool,
}

/// Why an inbound message could not be taken in.
#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the new space {space} has no workspace: {source}")]
    Workspace {
        space: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the space {0} is not a valid space id")]
    SpaceId(String),
    #[error("the message was stored but its space did not take it: {0}")]
    Wake(#[from] ActorError),
}

/// Where a platform message came from: what decides whether its sender's
/// identity mapping (`mrctl identities link`) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The in-process adapter of the message's platform (it reads the
    /// sender from the platform itself).
    Adapter,
    /// `POST /api/ingress` with an adapter token; `trusted_identities` when
    /// it was minted with `--trusted-identities`.
    Token { trusted_identities: bool },
}

impl Origin {
    /// Whether a mapped sender of this origin acts as its operator.
    pub fn identities_hold(self) -> bool {
        matches!(
            self,
            Origin::Adapter
                | Origin::Token {
                    trusted_identities: true
                }
        )
    }
}

/// The inbound path: durable row first, then the space's actor.
pub async fn ingest(
    app: &App,
    m: IngressMessage,
    origin: Origin,
) -> Result<IngestResult, IngressError> {
    ingest_with(app, m, origin, |_| Ok(())).await
}

/// [`ingest`], with `also` run in the same transaction as the message row:
/// an in-process adapter records how far it has read its platform there, so
/// its position never runs ahead of (or behind) what is stored.
pub async fn ingest_with<F>(
    app: &App,
    m: IngressMessage,
    origin: Origin,
    also: F,
) -> Result<IngestResult, IngressError>
where
    F: FnOnce(&crate::storage::Tx<'_>) -> StoreResult<()> + Send + 'static,
{
    let settings = app.rt.settings.clone();
    let limits = app.limits.clone();
    let outbound = app.rt.outbound.clone();
    let (platform, external) = (m.platform.clone(), m.message_id.clone());
    let res = app
        .rt
        .store
        .write(move |tx| {
            let res = ingest_tx(tx, &settings, &outbound, &limits, &m, origin)?;
            also(tx)?;
            Ok(res)
        })
        .await?;
    app.rt.metrics.ingress(res.status.as_str());
    tracing::debug!(
        target: "mercury::ingress",
        platform = %platform,
        platform_message = %external,
        space = res.space_id.as_deref().unwrap_or("-"),
        message = res.message_id.unwrap_or_default(),
        decision = res.status.as_str(),
        created_space = res.created_space,
        "ingress decision"
    );
    if let Some(space) = &res.space_id {
        let id = SpaceId::parse(space).map_err(|_| IngressError::SpaceId(space.clone()))?;
        if res.created_space {
            crate::workspace::ensure_workspace(&app.rt.paths, &id).map_err(|source| {
                IngressError::Workspace {
                    space: space.clone(),
                    source,
                }
            })?;
        }
        if res.status == IngestStatus::Queued {
            app.spaces.wake(&id).await?;
        }
    }
    Ok(res)
}

/// A space id for an auto-created space: the platform and a hash of the
/// conversation, never the platform's own id (a DM's id is often a phone
/// number). Unique per conversation.
pub fn auto_space_id(
    platform: &str,
    conversation: &str,
) -> Result<SpaceId, crate::ids::InvalidSpaceId> {
    let hash = base16ct::lower::encode_string(&Sha256::digest(
        format!("{platform}\u{0}{conversation}").as_bytes(),
    ));
    let head: String = platform
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(32)
        .collect::<String>()
        .trim_matches('-')
        .to_owned();
    let id = if head.is_empty() {
        format!("s-{}", &hash[..16])
    } else {
        format!("{head}-{}", &hash[..16])
    };
    SpaceId::parse(&id)
}

/// An auto-created space's name says who the chat is, to the operator and
/// whoever may read the space (who reads its messages, names included):
/// `telegram DM: Ada` (the sender's name), `telegram group: Family` (the
/// group's title). The id stays platform + hash: ids reach logs, metrics
/// and reports, names do not. Control and invisible characters are
/// dropped and the name is cut at 60 characters; with no usable name, a
/// neutral one from the id.
fn auto_space_name(platform: &str, id: &SpaceId, m: &IngressMessage, kind: &str) -> String {
    let who = match kind {
        "dm" => m.sender_name.as_deref().or(m.title.as_deref()),
        _ => m.title.as_deref(),
    };
    let clean: String = who
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control() && !crate::links::is_invisible(*c))
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(60)
        .collect();
    let label = if kind == "dm" { "DM" } else { "group" };
    if clean.is_empty() {
        let tail = id.as_str().rsplit('-').next().unwrap_or_default();
        format!("{platform} {label} {}", &tail[..tail.len().min(8)])
    } else {
        format!("{platform} {label}: {clean}")
    }
}

/// Stores an inbound platform message and decides what it needs, in one
/// transaction. The sender policy comes first: a message it refuses leaves
/// no conversation, space, member or message row.
pub fn ingest_tx(
    tx: &crate::storage::Tx<'_>,
    settings: &Settings,
    outbound: &crate::runtime::Outbound,
    limits: &CallerLimits,
    m: &IngressMessage,
    origin: Origin,
) -> StoreResult<IngestResult> {
    // The sender lives in its platform's namespace: no body field can name
    // an operator (`owner` from telegram is `telegram:owner`).
    let sender = crate::ids::platform_caller_id(&m.platform, &m.sender_id);
    let kind = if m.is_group { "group" } else { "dm" };
    let known = conversations::find(tx, &m.platform, &m.conversation)?;
    let nothing = |status| IngestResult {
        status,
        message_id: None,
        space_id: None,
        created_space: false,
    };
    match policy::admit(tx, settings, outbound, m, &sender, known.as_ref())? {
        policy::Admission::Admit => {}
        policy::Admission::UnlistedGroup => {
            conversations::upsert(tx, &m.platform, &m.conversation, kind, m.title.as_deref())?;
            return Ok(nothing(IngestStatus::Unlinked));
        }
        policy::Admission::PairingOpened(_) | policy::Admission::PairingPending => {
            return Ok(nothing(IngestStatus::Pairing))
        }
        policy::Admission::Refused => return Ok(nothing(IngestStatus::Refused)),
    }
    let conv = conversations::upsert(tx, &m.platform, &m.conversation, kind, m.title.as_deref())?;
    let mut created_space = false;
    let space = match conv.space_id.clone() {
        Some(s) => s,
        None if settings.ingress.auto_space => {
            let id = auto_space_id(&m.platform, &m.conversation)
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            if !spaces::space_exists(tx, id.as_str())? {
                let name = auto_space_name(&m.platform, &id, m, kind);
                spaces::create_space(tx, id.as_str(), &name, &[])?;
                created_space = true;
            }
            conversations::set_space(tx, conv.id, Some(id.as_str()))?;
            id.to_string()
        }
        None => return Ok(nothing(IngestStatus::Unlinked)),
    };
    let now = now_ms();
    let base = NewMessage {
        space_id: &space,
        conversation_id: Some(conv.id),
        sender_id: Some(&sender),
        sender_name: m.sender_name.as_deref(),
        role: "user",
        text: &m.text,
        platform_message_id: Some(&m.message_id),
        created_at: now,
        trusted_identity: origin.identities_hold(),
        ..Default::default()
    };
    let done = |status, message_id| IngestResult {
        status,
        message_id,
        space_id: Some(space.clone()),
        created_space,
    };
    // De-duplicate first: a replay changes nothing, not even the member row.
    if messages::insert_probe(tx, conv.id, &m.message_id)? {
        return Ok(done(IngestStatus::Duplicate, None));
    }
    spaces::touch_member(tx, &space, &sender, m.sender_name.as_deref())?;
    if spaces::is_muted(tx, &space, &sender, now)? {
        let id = messages::insert(
            tx,
            &NewMessage {
                status: Some("muted"),
                ..base
            },
        )?;
        return Ok(done(IngestStatus::Muted, id));
    }
    let triggered = !m.is_group
        || trigger::group_triggers(
            &spaces::trigger_rule(tx, &settings.trigger, &space)?,
            &m.text,
            m.mentions_bot,
            m.reply_to_bot,
        );
    if !triggered || m.text.trim().is_empty() {
        let id = messages::insert(
            tx,
            &NewMessage {
                role: "ambient",
                ..base
            },
        )?;
        return Ok(done(IngestStatus::Ambient, id));
    }
    let per_minute = spaces::kv_get(tx, KvTable::Config, &space, "rate_limit.per_minute")?
        .and_then(|v| v.parse().ok());
    if !limits.allow_in(tx, &space, &sender, per_minute)? {
        let id = messages::insert(
            tx,
            &NewMessage {
                status: Some("rate_limited"),
                ..base
            },
        )?;
        let reply_id = messages::insert(
            tx,
            &NewMessage {
                space_id: &space,
                conversation_id: Some(conv.id),
                sender_id: Some("mercury"),
                sender_name: Some("Mercury"),
                role: "assistant",
                text: SLOW_DOWN_REPLY,
                created_at: now,
                reply_to: id,
                ..Default::default()
            },
        )?;
        outbound.enqueue(
            tx,
            &crate::runtime::OutboundSend {
                space: &space,
                conversation_id: Some(conv.id),
                platform: &m.platform,
                external_id: &m.conversation,
                message_id: reply_id,
                text: SLOW_DOWN_REPLY,
                source: "slow_down",
            },
        )?;
        return Ok(done(IngestStatus::RateLimited, id));
    }
    let id = messages::insert(
        tx,
        &NewMessage {
            status: Some("pending"),
            ..base
        },
    )?;
    match id {
        Some(id) => Ok(done(IngestStatus::Queued, Some(id))),
        None => Ok(done(IngestStatus::Duplicate, None)),
    }
}

/// Stores a console message (`POST /api/chat`, the dashboard's console) as
/// pending in `space`, its caller's turn counted against their limit in
/// the same transaction; `None` when over it (nothing stored).
pub fn chat_tx(
    tx: &crate::storage::Tx<'_>,
    limits: &CallerLimits,
    space: &str,
    caller: &str,
    conversation: &str,
    text: &str,
) -> StoreResult<Option<i64>> {
    if !limits.allow_in(tx, space, caller, None)? {
        return Ok(None);
    }
    let external = format!("{space}/{conversation}");
    let conv = conversations::upsert(tx, "console", &external, "dm", None)?;
    match conv.space_id.as_deref() {
        None => conversations::set_space(tx, conv.id, Some(space))?,
        Some(s) if s != space => {
            return Err(StoreError::Conflict(format!(
                "console conversation {external} belongs to space {s}"
            )))
        }
        Some(_) => {}
    }
    spaces::touch_member(tx, space, caller, None)?;
    messages::insert(
        tx,
        &NewMessage {
            space_id: space,
            conversation_id: Some(conv.id),
            sender_id: Some(caller),
            role: "user",
            text,
            created_at: now_ms(),
            status: Some("pending"),
            ..Default::default()
        },
    )?
    .map(Some)
    .ok_or_else(|| StoreError::Conflict("message already stored".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_space_ids_are_valid_and_distinct() {
        let a = auto_space_id("whatsapp", "31612345678@s.whatsapp.net").unwrap();
        let b = auto_space_id("whatsapp", "31612345678@S.WHATSAPP.NET").unwrap();
        assert!(a.as_str().starts_with("whatsapp-"), "{a}");
        assert!(
            !a.as_str().contains("3161234"),
            "no phone number in an id: {a}"
        );
        assert_ne!(a, b);
        let long = auto_space_id("discord", &"x".repeat(500)).unwrap();
        assert!(long.as_str().len() <= 63);
        let weird = auto_space_id("p", "@@@").unwrap();
        assert!(SpaceId::parse(weird.as_str()).is_ok());
    }

    #[test]
    fn auto_space_names_say_who_the_chat_is_and_nothing_hidden() {
        let m = |sender: Option<&str>, title: Option<&str>, is_group: bool| IngressMessage {
            platform: "telegram".into(),
            conversation: "42".into(),
            sender_id: "42".into(),
            sender_name: sender.map(str::to_owned),
            text: "hi".into(),
            message_id: "1".into(),
            is_group,
            mentions_bot: false,
            reply_to_bot: false,
            title: title.map(str::to_owned),
        };
        let id = auto_space_id("telegram", "42").unwrap();
        let name = |msg: &IngressMessage, kind: &str| auto_space_name("telegram", &id, msg, kind);
        assert_eq!(
            name(&m(Some("Ada"), Some("Ada L"), false), "dm"),
            "telegram DM: Ada"
        );
        assert_eq!(
            name(&m(Some("Ada"), Some("Family\n  chat"), true), "group"),
            "telegram group: Family chat"
        );
        // Bidi and zero-width characters are dropped, the length is bounded.
        let hostile = format!("Ev\u{202e}il\u{200b}{}", "x".repeat(200));
        let n = name(&m(Some(&hostile), None, false), "dm");
        assert!(n.starts_with("telegram DM: Evil"), "{n}");
        assert!(n.chars().count() <= "telegram DM: ".len() + 60, "{n}");
        // No name at all: a neutral one from the id.
        let tail = &id.as_str().rsplit('-').next().unwrap()[..8];
        assert_eq!(
            name(&m(None, Some(" \u{200b} "), true), "group"),
            format!("telegram group {tail}")
        );
    }

    #[test]
    fn limiter_says_slow_down_per_caller() {
        let l = CallerLimits::new(2);
        assert!(l.allow("s", "a", None));
        assert!(l.allow("s", "a", None));
        assert!(!l.allow("s", "a", None));
        assert!(l.allow("s", "b", None));
        assert!(l.allow("t", "a", None));
    }
}
