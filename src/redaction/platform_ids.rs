//! Chat-platform identifiers the adapters bring in (issues 16 and 30): the
//! shapes each registered platform declares
//! ([`crate::config::platforms::Platform::identifier_patterns`]: Telegram ids
//! and usernames, Discord snowflakes and mentions, WhatsApp and Slack ids,
//! and any later platform's), matched on the plain view. The list is the
//! adapters' registry, so a new platform's ids are redacted and gated
//! without an edit here.
//!
//! Must never: leave a digit of a matched id behind, or need the id to be
//! on the scan's sender list (these are found by shape alone).

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// Every registered platform's patterns, compiled once (the registry's own
/// test compiles each of them, so `constant_regex` holds).
static SHAPES: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    crate::config::platforms::all()
        .into_iter()
        .flat_map(|p| p.identifier_patterns().iter())
        .map(|p| super::constant_regex(p))
        .collect()
});

pub(super) fn platform_id_spans(plain: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for re in SHAPES.iter() {
        // Captures cost more than a plain find: only where a group says where the id is.
        if re.captures_len() > 1 {
            for c in re.captures_iter(plain) {
                if let Some(m) = c.get(1).or_else(|| c.get(0)) {
                    out.push(m.range());
                }
            }
        } else {
            out.extend(re.find_iter(plain).map(|m| m.range()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<&str> {
        let mut spans = platform_id_spans(text);
        spans.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
        // Overlaps are merged by the redactor; the outermost is what counts here.
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for r in spans {
            if out.last().is_none_or(|l| r.start >= l.end) {
                out.push(r);
            }
        }
        out.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn telegram_ids_and_usernames() {
        assert_eq!(
            found("from telegram:123456789 in telegram:-1001234567890"),
            vec!["telegram:123456789", "telegram:-1001234567890"]
        );
        assert_eq!(
            found("ask @alice_smith or see t.me/Bob_Jones1, not a@b.example"),
            vec!["@alice_smith", "t.me/Bob_Jones1"]
        );
        assert!(found("@bob is too short, so is @x").is_empty());
        assert!(found("mail me at someone@example.com").is_empty());
    }

    #[test]
    fn discord_snowflakes() {
        assert_eq!(
            found(
                "<@123456789012345678> said hi in <#876543210987654321> to <@&112233445566778899>"
            ),
            vec![
                "<@123456789012345678>",
                "<#876543210987654321>",
                "<@&112233445566778899>"
            ]
        );
        assert_eq!(
            found("discord:80351110224678912 and 175928847299117063"),
            vec!["discord:80351110224678912", "175928847299117063"]
        );
        assert!(found("in 2026 we had 42 of them").is_empty());
    }
}
