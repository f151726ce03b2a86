//! Chat-platform identifiers the adapters bring in (issue 16): Telegram user
//! and chat ids in their namespaced form (`telegram:123456789`, `telegram:-100…`),
//! Telegram usernames (`@alice_smith`, `t.me/alice_smith`), and Discord
//! snowflakes (`discord:…`, mentions `<@…>`, `<@!…>`, `<#…>`, `<@&…>`, and a
//! bare 17-20 digit number). Matched on the plain view.
//!
//! Must never: leave a digit of a matched id behind, or need the id to be
//! on the scan's sender list (these are found by shape alone).

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

// Constant patterns, compiled by this file's tests (see `constant_regex`).
static NAMESPACED: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"(?i)\b(?:telegram|discord) ?: ?-?[0-9]{1,21}\b"));

/// Telegram usernames: 5-32 of `A-Za-z0-9_`, starting with a letter, after
/// an `@` that does not end an e-mail's local part, or after `t.me/`.
static USERNAME: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r"(?i)(?:^|[^A-Za-z0-9_.@+\-])(@[a-z][a-z0-9_]{4,31}|t\.me/[a-z][a-z0-9_]{4,31})\b",
    )
});

static SNOWFLAKE: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"<(?:@[!&]?|#)[0-9]{15,21}>|\b[0-9]{17,20}\b"));

pub(super) fn platform_id_spans(plain: &str) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = NAMESPACED.find_iter(plain).map(|m| m.range()).collect();
    out.extend(
        USERNAME
            .captures_iter(plain)
            .filter_map(|c| c.get(1))
            .map(|m| m.range()),
    );
    out.extend(SNOWFLAKE.find_iter(plain).map(|m| m.range()));
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
