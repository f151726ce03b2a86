//! The sender policy: whether an inbound platform message may enter at all,
//! decided once here for every adapter (Telegram, Discord, `POST
//! /api/ingress` and any later one), before a conversation, space, member or
//! message row exists.
//!
//! A denied sender, or a conversation an operator denied, is never answered;
//! a conversation an operator allowed is. A conversation that already feeds
//! a space is answered (an operator linked it, or an earlier host or an
//! earlier approval gave it its space). Beyond that, a DM follows the
//! platform's `dm_policy` (`pairing`, `allowlist`, `open`) and a group is
//! answered only when an operator allowed or linked it.
//!
//! Must never: create a row for a stranger beyond one capped, expiring
//! pairing request (and its reply and the owner's notice), reply to a
//! stranger twice for one request, or start a turn for one.

use rand::Rng;

use crate::clock::now_ms;
use crate::config::{DmPolicy, Settings};
use crate::runtime::{Outbound, OutboundSend};
use crate::storage::conversations::{self, Conversation};
use crate::storage::pairings::{self, Decision, Pairing, RuleKind, SenderRule};
use crate::storage::StoreResult;

use super::IngressMessage;

/// Pairing codes are read aloud and typed: no 0/O, no 1/I/L.
pub const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
pub const CODE_LEN: usize = 8;

/// The outbox's space of a reply that belongs to no space (a stranger's
/// pairing code, the owner's notice when the owner's DM has none).
pub const NO_SPACE: &str = "(pairing)";

/// What an approved stranger is told, once.
pub const APPROVED_REPLY: &str = "You are approved: send your message again and I will answer.";

/// A pairing code as an operator typed it, checked and upper-cased.
pub fn parse_code(raw: &str) -> Result<String, String> {
    let code = raw.trim().to_ascii_uppercase();
    if code.len() != CODE_LEN || !code.bytes().all(|b| CODE_ALPHABET.contains(&b)) {
        return Err(format!(
            "{raw:?} is not a pairing code: 8 characters such as K7QM4XPA (see `mrctl pairing list`)"
        ));
    }
    Ok(code)
}

/// An operator's answer to pending request `code` (the API's and the
/// dashboard's one path): the request is taken, `decision` recorded for its
/// sender, and an approved stranger told once, all in `tx`. None: no such
/// pending request (expired, decided, or never made).
pub fn decide_request(
    tx: &crate::storage::Tx<'_>,
    outbound: &Outbound,
    code: &str,
    decision: Decision,
    by: &str,
) -> StoreResult<Option<(Pairing, SenderRule)>> {
    let Some(p) = pairings::take(tx, code, now_ms())? else {
        return Ok(None);
    };
    let rule = pairings::decide(tx, RuleKind::Sender, &p.platform, &p.sender, decision, by)?;
    if decision == Decision::Allowed {
        outbound.enqueue(
            tx,
            &OutboundSend {
                space: NO_SPACE,
                conversation_id: None,
                platform: &p.platform,
                external_id: &p.conversation,
                message_id: None,
                text: APPROVED_REPLY,
                source: "pairing",
            },
        )?;
    }
    Ok(Some((p, rule)))
}

/// What the policy lets a message do.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// On to the rest of ingress (space, member, message rows).
    Admit,
    /// A group nobody allowed: its conversation is recorded (so an operator
    /// can see and link it), nothing else.
    UnlistedGroup,
    /// A stranger's DM: a pairing request was opened and its code sent.
    PairingOpened(Pairing),
    /// A stranger with a pending request already: nothing sent again.
    PairingPending,
    /// Nothing stored, nothing sent (a denied sender, `allowlist`, the cap).
    Refused,
}

/// A fresh pairing code.
pub fn pairing_code() -> String {
    let mut rng = rand::rng();
    (0..CODE_LEN)
        .map(|_| char::from(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())]))
        .collect()
}

/// The reply a stranger gets with its code.
pub fn pairing_reply(code: &str, ttl_secs: u64) -> String {
    format!(
        "Hi! I only answer people my owner has approved. Your pairing code is {code}: \
         send it to my owner. It expires in {} minutes.",
        ttl_secs.div_ceil(60)
    )
}

/// The owner's notice of a new request.
pub fn owner_notice(p: &Pairing) -> String {
    let name = p.name.as_deref().unwrap_or("no name");
    format!(
        "New pairing request {code} from {sender} ({name}) on {platform}. \
         Approve: mrctl pairing approve {code}; deny: mrctl pairing deny {code}.",
        code = p.code,
        sender = p.sender,
        platform = p.platform,
    )
}

/// Decides `m` from `sender` (its caller id) in `conv` (its conversation,
/// if one exists), writing a pairing request and its two sends when one is
/// opened.
pub fn admit(
    tx: &crate::storage::Tx<'_>,
    settings: &Settings,
    outbound: &Outbound,
    m: &IngressMessage,
    sender: &str,
    conv: Option<&Conversation>,
) -> StoreResult<Admission> {
    let platform = m.platform.as_str();
    if pairings::decision(tx, RuleKind::Sender, platform, sender)? == Some(Decision::Denied) {
        return Ok(Admission::Refused);
    }
    // An operator's word about the conversation as a whole comes next, so a
    // denied group stays silent even where it feeds a space.
    match pairings::decision(tx, RuleKind::Conversation, platform, &m.conversation)? {
        Some(Decision::Denied) => return Ok(Admission::Refused),
        Some(Decision::Allowed) => return Ok(Admission::Admit),
        None => {}
    }
    if conv.is_some_and(|c| c.space_id.is_some()) {
        return Ok(Admission::Admit);
    }
    let policy = settings.dm_policy(platform);
    if m.is_group {
        return Ok(if policy == DmPolicy::Open {
            Admission::Admit
        } else {
            Admission::UnlistedGroup
        });
    }
    if policy == DmPolicy::Open
        || pairings::decision(tx, RuleKind::Sender, platform, sender)? == Some(Decision::Allowed)
    {
        return Ok(Admission::Admit);
    }
    if policy == DmPolicy::Allowlist
        || crate::ids::refuse_shared_placeholder(sender, "paired").is_err()
    {
        return Ok(Admission::Refused);
    }
    let now = now_ms();
    if pairings::pending_of(tx, platform, sender, now)?.is_some() {
        return Ok(Admission::PairingPending);
    }
    let ttl = settings.ingress.pairing_ttl_secs;
    let request = Pairing {
        code: pairing_code(),
        platform: platform.to_owned(),
        sender: sender.to_owned(),
        name: m.sender_name.clone(),
        conversation: m.conversation.clone(),
        created_at: now,
        expires_at: now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX / 1000) * 1000),
    };
    let Some(opened) = pairings::open(tx, &request, settings.ingress.pairing_max_pending)? else {
        return Ok(Admission::Refused);
    };
    let reply = pairing_reply(&opened.code, ttl);
    outbound.enqueue(
        tx,
        &OutboundSend {
            space: NO_SPACE,
            conversation_id: None,
            platform,
            external_id: &m.conversation,
            message_id: None,
            text: &reply,
            source: "pairing",
        },
    )?;
    notify_owner(tx, settings, outbound, &opened)?;
    Ok(Admission::PairingOpened(opened))
}

/// Tells the owner of a new request through the review digest's channel:
/// the DM conversation of `review.owner` (else `owner`). No such
/// conversation yet: the request waits in `mrctl pairing list` alone.
fn notify_owner(
    tx: &crate::storage::Tx<'_>,
    settings: &Settings,
    outbound: &Outbound,
    p: &Pairing,
) -> StoreResult<()> {
    let owner = if settings.review.owner.trim().is_empty() {
        settings.owner.as_str()
    } else {
        settings.review.owner.as_str()
    };
    let Some(dm) = conversations::dm_of(tx, owner)? else {
        tracing::info!(
            target: "mercury::ingress",
            code = %p.code,
            platform = %p.platform,
            "pairing request opened; the owner has no DM conversation to be told in"
        );
        return Ok(());
    };
    let text = owner_notice(p);
    outbound.enqueue(
        tx,
        &OutboundSend {
            space: dm.space_id.as_deref().unwrap_or(NO_SPACE),
            conversation_id: Some(dm.id),
            platform: &dm.platform,
            external_id: &dm.external_id,
            message_id: None,
            text: &text,
            source: "pairing",
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_codes_use_the_unambiguous_alphabet() {
        for _ in 0..200 {
            let c = pairing_code();
            assert_eq!(c.len(), CODE_LEN);
            assert!(c.bytes().all(|b| CODE_ALPHABET.contains(&b)), "{c}");
            assert!(!c.contains(['0', 'O', '1', 'I', 'L']), "{c}");
        }
        assert_ne!(pairing_code(), pairing_code());
    }

    #[test]
    fn the_pairing_reply_is_short_and_names_the_code() {
        let r = pairing_reply("ABCD2345", 3600);
        assert!(r.contains("ABCD2345") && r.contains("60 minutes"), "{r}");
        assert!(r.chars().count() < 200, "{r}");
    }
}
