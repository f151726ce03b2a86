//! Trigger matching: does a message address the bot? DMs always do; groups
//! by `mention` (a trigger word standing alone anywhere), `prefix` (the text
//! starts with one) or `always`. A reply to the bot triggers in any mode.
//! Must never: allocate a regex from user input.

// A space's rule is read where its settings live (the agent strips the same words).
pub use crate::storage::spaces::TriggerRule;

fn eq(a: &str, b: &str, cs: bool) -> bool {
    if cs {
        a == b
    } else {
        a.to_lowercase() == b.to_lowercase()
    }
}

/// Whether a group message triggers a turn.
pub fn group_triggers(
    rule: &TriggerRule,
    text: &str,
    mentions_bot: bool,
    reply_to_bot: bool,
) -> bool {
    if reply_to_bot || mentions_bot || rule.mode == "always" {
        return true;
    }
    let text = text.trim();
    match rule.mode.as_str() {
        "prefix" => rule.patterns.iter().any(|p| {
            let head: String = text.chars().take(p.chars().count()).collect();
            let rest = &text[head.len().min(text.len())..];
            eq(&head, p, rule.case_sensitive)
                && (rest.is_empty() || rest.starts_with(char::is_whitespace))
        }),
        _ => text
            .split(|c: char| c.is_whitespace())
            .map(|w| w.trim_end_matches([',', '.', '!', '?', ':', ';']))
            .any(|w| rule.patterns.iter().any(|p| eq(w, p, rule.case_sensitive))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mention_needs_a_standalone_word() {
        let r = TriggerRule::new("mention", "@mercury,mercury", false);
        assert!(group_triggers(&r, "hey Mercury, what's up", false, false));
        assert!(group_triggers(&r, "@mercury help", false, false));
        assert!(!group_triggers(&r, "mercurial mood", false, false));
        assert!(group_triggers(&r, "nothing", false, true));
    }

    #[test]
    fn prefix_needs_the_start() {
        let r = TriggerRule::new("prefix", "mercury", false);
        assert!(group_triggers(&r, "mercury do this", false, false));
        assert!(!group_triggers(&r, "hello mercury", false, false));
        assert!(!group_triggers(&r, "mercurydo", false, false));
    }
}
