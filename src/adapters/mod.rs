//! The in-process chat adapters: each one speaks one platform (Telegram
//! today), feeds its messages to [`crate::ingress`] and delivers that
//! platform's outbox items. Each runs as an actor under the root supervisor
//! (restarted on failure) and keeps its position in `adapter_positions`,
//! written in the same transaction as the message row it covers.
//!
//! [`start`] is the one place adapters are constructed; the host calls it
//! (and must not in shadow mode: a rehearsal copy never talks to a platform).
//!
//! Must never: act with an operator's or an admin's rights (an adapter is an
//! [`AdapterIdentity`] bound to its platform, like an adapter token), read a
//! platform secret from anywhere but the environment, or acknowledge a
//! platform update before its row is committed.

pub(crate) mod telegram;

use std::collections::BTreeMap;
use std::sync::Arc;

use ractor::{call_t, ActorRef};

use crate::actors::SupervisorMsg;
use crate::app::App;
use crate::config::Settings;
use crate::ingress::{IngestResult, IngressError, IngressMessage};
use crate::storage::StoreResult;

/// The environment variable the Telegram bot token is read from (only).
pub(crate) const TELEGRAM_TOKEN_ENV: &str = "MERCURY_TELEGRAM_BOT_TOKEN";

#[derive(Debug, thiserror::Error)]
pub(crate) enum AdapterError {
    #[error("{adapter} is enabled but {env} is not set")]
    MissingSecret {
        adapter: &'static str,
        env: &'static str,
    },
    #[error("the supervisor did not start the {adapter}: {reason}")]
    Start {
        adapter: &'static str,
        reason: String,
    },
    #[error("the {adapter} may only ingest {adapter} messages, not {platform} ones")]
    WrongPlatform {
        adapter: &'static str,
        platform: String,
    },
    #[error(transparent)]
    Ingress(#[from] IngressError),
}

/// The identity an in-process adapter acts through: one platform, like an
/// adapter token bound at mint. Its messages' senders land in that
/// platform's namespace (`telegram:123`); it has no caller id of its own, so
/// it can never act as an operator or a global admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdapterIdentity {
    platform: &'static str,
}

impl AdapterIdentity {
    pub(crate) const fn bound_to(platform: &'static str) -> Self {
        Self { platform }
    }

    /// Ingests `m` (which must be of this identity's platform), running
    /// `also` in the same transaction as its row.
    pub(crate) async fn ingest<F>(
        &self,
        app: &App,
        m: IngressMessage,
        also: F,
    ) -> Result<IngestResult, AdapterError>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<()> + Send + 'static,
    {
        if m.platform != self.platform {
            return Err(AdapterError::WrongPlatform {
                adapter: self.platform,
                platform: m.platform,
            });
        }
        Ok(crate::ingress::ingest_with(app, m, also).await?)
    }
}

/// The enabled adapters' secrets, read from `env` (the process's `MERCURY_*`
/// environment) and nowhere else. The host reads them before it starts
/// anything, so a missing one stops start-up with a sentence naming it.
#[derive(Clone, Default)]
pub(crate) struct AdapterSecrets {
    telegram: Option<String>,
}

// Holds bot tokens: a derived Debug would print them.
impl std::fmt::Debug for AdapterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterSecrets")
            .field("telegram", &self.telegram.is_some())
            .finish()
    }
}

impl AdapterSecrets {
    pub(crate) fn from_env(
        settings: &Settings,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, AdapterError> {
        let mut secrets = Self::default();
        if settings.adapters.telegram.enabled {
            let token = env
                .get(TELEGRAM_TOKEN_ENV)
                .map(|t| t.trim())
                .filter(|t| !t.is_empty())
                .ok_or(AdapterError::MissingSecret {
                    adapter: "the telegram adapter",
                    env: TELEGRAM_TOKEN_ENV,
                })?;
            secrets.telegram = Some(token.to_owned());
        }
        Ok(secrets)
    }
}

/// Starts every adapter that has its secret under the root supervisor. The
/// host calls this once, after the actors and before serving; shadow mode
/// must not.
pub(crate) async fn start(
    app: &Arc<App>,
    supervisor: &ActorRef<SupervisorMsg>,
    secrets: AdapterSecrets,
) -> Result<(), AdapterError> {
    if let Some(token) = secrets.telegram {
        let child = telegram::TelegramChild::new(app.clone(), token);
        call_t!(
            supervisor,
            SupervisorMsg::Supervise,
            10_000,
            Arc::new(child)
        )
        .map_err(|e| AdapterError::Start {
            adapter: "telegram adapter",
            reason: e.to_string(),
        })?
        .map_err(|reason| AdapterError::Start {
            adapter: "telegram adapter",
            reason,
        })?;
    }
    Ok(())
}

/// Splits a reply into pieces of at most `max` UTF-16 code units (how
/// Telegram counts; never more than Discord's characters): at paragraph
/// breaks where it can, else at line breaks, else between words, else
/// anywhere between characters. Nothing is lost: the pieces, joined with the
/// breaks they were cut at, are the text (trailing whitespace of a piece
/// aside).
pub(crate) fn split_reply(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let len = |s: &str| s.encode_utf16().count();
    let mut out = Vec::new();
    let mut rest = text.trim_end();
    while len(rest) > max {
        // The longest prefix that fits, in bytes.
        let mut fit = 0;
        let mut units = 0;
        for (i, c) in rest.char_indices() {
            units += c.len_utf16();
            if units > max {
                break;
            }
            fit = i + c.len_utf8();
        }
        let head = &rest[..fit];
        let cut = [
            head.rfind("\n\n").map(|i| (i, 2)),
            head.rfind('\n').map(|i| (i, 1)),
            head.rfind(' ').map(|i| (i, 1)),
        ]
        .into_iter()
        .flatten()
        .find(|(i, _)| *i > 0);
        let (piece, next) = match cut {
            Some((i, sep)) => (&rest[..i], &rest[i + sep..]),
            None => (head, &rest[fit..]),
        };
        out.push(piece.trim_end().to_owned());
        rest = next.trim_start_matches(['\n', ' ']);
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(rest.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_replies_are_one_piece() {
        assert_eq!(split_reply("hello", 4096), vec!["hello"]);
        assert_eq!(split_reply("", 10), vec![""]);
    }

    #[test]
    fn long_replies_split_on_paragraphs_first() {
        let p1 = "a".repeat(3000);
        let p2 = "b".repeat(3000);
        let p3 = "c".repeat(100);
        let text = format!("{p1}\n\n{p2}\n\n{p3}");
        let parts = split_reply(&text, 4096);
        assert_eq!(parts, vec![p1.clone(), format!("{p2}\n\n{p3}")]);
        for p in &parts {
            assert!(p.encode_utf16().count() <= 4096);
        }
    }

    #[test]
    fn words_and_then_characters_when_no_paragraph_fits() {
        let words = "word ".repeat(1000);
        for p in split_reply(&words, 2000) {
            assert!(p.chars().count() <= 2000);
            assert!(!p.starts_with(' ') && p.ends_with("word"), "{p:?}");
        }
        let solid = "x".repeat(5000);
        let parts = split_reply(&solid, 2000);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), solid);
        // Astral characters count two units each and are never cut in half.
        let emoji = "😀".repeat(3000);
        let parts = split_reply(&emoji, 4096);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= 4096));
        assert_eq!(parts.concat(), emoji);
    }
}
