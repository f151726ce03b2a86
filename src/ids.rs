//! Identifier newtypes and their validation.
//!
//! Owns the rules for what a space id, run id and caller id look like, so a
//! bad id is refused at the edge and never reaches storage. Must never create
//! anything: validating an id says nothing about whether it exists.

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

// Compiled from a constant pattern; failure would be a programming error
// caught by the first test that touches a space id.
#[allow(clippy::expect_used)]
static SPACE_ID_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9][a-z0-9-]{0,62}$").expect("constant regex"));

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid space id {0:?}: use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit")]
pub struct InvalidSpaceId(pub String);

/// A space's slug. Constructed only through [`SpaceId::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SpaceId(String);

impl SpaceId {
    pub fn parse(raw: &str) -> Result<Self, InvalidSpaceId> {
        if SPACE_ID_RE.is_match(raw) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidSpaceId(raw.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for SpaceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        SpaceId::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for SpaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A run (one agent turn, task firing, ask or review) id: a UUIDv7, so ids sort by time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct RunId(String);

impl RunId {
    pub(crate) fn new() -> Self {
        Self(uuid::Uuid::now_v7().simple().to_string())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The reserved caller id of the host's own calls. No token can name it.
pub(crate) const SYSTEM_CALLER: &str = "system";

/// Caller ids are free-form platform ids (`whatsapp:123@s.whatsapp.net`,
/// `api:alice`, `owner`) but bounded, printable and never `system`.
pub(crate) fn validate_caller_id(raw: &str) -> Result<(), String> {
    if raw.is_empty() || raw.len() > 200 {
        return Err("caller id must be 1-200 characters".into());
    }
    if raw == SYSTEM_CALLER {
        return Err("caller id 'system' is reserved for the host".into());
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("caller id must not contain spaces or control characters".into());
    }
    Ok(())
}

/// Platforms an adapter may not claim: `console` is the API chat and `api`
/// is the one prefix operator ids may use (`api:alice`).
pub(crate) const RESERVED_PLATFORMS: &[&str] = &["console", "api"];

/// A platform name: 1-32 of a-z, 0-9, '-', not reserved.
pub(crate) fn validate_platform(p: &str) -> Result<(), String> {
    if p.is_empty()
        || p.len() > 32
        || !p
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err("platform must be 1-32 characters of a-z, 0-9 or '-'".into());
    }
    if RESERVED_PLATFORMS.contains(&p) {
        return Err(format!("platform {p:?} is reserved"));
    }
    Ok(())
}

/// The platform of a caller id in a platform's namespace (`telegram:123` →
/// `telegram`), or `None` for an operator id.
pub(crate) fn platform_of(caller: &str) -> Option<&str> {
    let (head, rest) = caller.split_once(':')?;
    (!rest.is_empty() && validate_platform(head).is_ok()).then_some(head)
}

/// The caller id of a platform sender: always in its platform's namespace,
/// so no adapter can name an operator (`owner` from telegram is
/// `telegram:owner`). A sender id that already carries the prefix keeps it.
pub(crate) fn platform_caller_id(platform: &str, sender: &str) -> String {
    match sender
        .strip_prefix(platform)
        .and_then(|r| r.strip_prefix(':'))
    {
        Some(rest) if !rest.is_empty() => sender.to_owned(),
        _ => format!("{platform}:{sender}"),
    }
}

/// Platform ids many people post as: Telegram shows an anonymous group
/// admin as `GroupAnonymousBot` (1087968824), a channel's posts as
/// `Channel_Bot` (136817688) and its own notices as 777000. Mapping one to
/// an operator, granting it a role or allowing it as a sender would hand
/// that to everyone behind it.
const SHARED_PLACEHOLDERS: &[(&str, &str)] = &[
    (
        "telegram:1087968824",
        "Telegram's anonymous group admin (GroupAnonymousBot)",
    ),
    (
        "telegram:136817688",
        "Telegram's channel poster (Channel_Bot)",
    ),
    (
        "telegram:777000",
        "Telegram's service notifications (777000)",
    ),
];

/// `Err` with a sentence when `caller` is a platform id shared by many
/// people ([`SHARED_PLACEHOLDERS`]); `what` says what was refused.
pub(crate) fn refuse_shared_placeholder(caller: &str, what: &str) -> Result<(), String> {
    match SHARED_PLACEHOLDERS.iter().find(|(id, _)| *id == caller) {
        Some((id, who)) => Err(format!(
            "{id} is {who}, an id every such post shares: it cannot be {what}"
        )),
        None => Ok(()),
    }
}

/// An operator's caller id (user tokens, `owner`, `admins`): a caller id that
/// can never equal a platform sender's, i.e. not `<platform>:…`.
pub(crate) fn validate_operator_id(raw: &str) -> Result<(), String> {
    validate_caller_id(raw)?;
    if let Some(p) = platform_of(raw) {
        return Err(format!(
            "{raw:?} is in platform {p:?}'s namespace; an operator id may not look like a platform sender (map one with `mrctl identities link`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_ids_never_equal_operator_ids() {
        assert_eq!(platform_caller_id("telegram", "owner"), "telegram:owner");
        assert_eq!(platform_caller_id("telegram", "telegram:12"), "telegram:12");
        assert_eq!(platform_caller_id("test", "discord:9"), "test:discord:9");
        assert_eq!(
            platform_caller_id("telegram", "telegram:"),
            "telegram:telegram:"
        );
        for op in ["owner", "alice", "api:alice"] {
            assert!(validate_operator_id(op).is_ok(), "{op}");
        }
        for bad in ["telegram:1", "test:zed", "whatsapp:1@s.whatsapp.net"] {
            assert!(validate_operator_id(bad).is_err(), "{bad}");
        }
        assert!(validate_platform("api").is_err());
        assert!(validate_platform("console").is_err());
    }

    #[test]
    fn space_id_accepts_slugs_and_rejects_everything_else() {
        for ok in ["a", "main", "client-42", "0abc", &"a".repeat(63)] {
            assert!(SpaceId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "A",
            "a_b",
            "a b",
            "a/b",
            "é",
            &"a".repeat(64),
            "slack:C123",
        ] {
            assert!(SpaceId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn caller_id_system_is_reserved() {
        assert!(validate_caller_id("system").is_err());
        assert!(validate_caller_id("whatsapp:1@s.whatsapp.net").is_ok());
        assert!(validate_caller_id("a b").is_err());
    }
}
