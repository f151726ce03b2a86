//! Friction signals: evidence that an exchange went badly, read off the
//! conversation itself without a model (issue 31, item 2).
//!
//! Each signal is put on the exchange it is evidence *against*: a user's
//! "no, that's wrong" is a signal on the exchange whose reply it corrects
//! (the same sender's previous message in the space), not on the message
//! that says it. The signals:
//!
//! - `correction`: the sender's next message, within [`FOLLOW_UP_MS`],
//!   corrects the bot ("no,", "that's wrong", "not what I asked");
//! - `rephrased`: the sender's next message, within [`REPHRASE_MS`], asks
//!   the same again (word overlap at least [`REPHRASE_OVERLAP`]);
//! - `not_answered`: the sender's next message, within [`FOLLOW_UP_MS`],
//!   complains that the bot did not answer;
//! - `failed_turn`: the turn the message started failed;
//! - `abandoned`: the turn failed or got no reply, and the sender wrote
//!   nothing more in the space (in the window read).
//!
//! Owns the phrase lists and the thresholds. Must never: call a model, read
//! or write storage (the reader hands the messages in), or keep the text it
//! looked at (only the signal names leave this module, so they need no
//! redaction).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How soon a correction or a complaint must follow to count.
pub(crate) const FOLLOW_UP_MS: i64 = 30 * 60_000;
/// How soon a rephrased request must follow to count.
pub(crate) const REPHRASE_MS: i64 = 5 * 60_000;
/// Jaccard overlap of the two messages' words that makes a rephrasing.
pub(crate) const REPHRASE_OVERLAP: f64 = 0.5;
/// Fewer distinct words than this in both messages together is too little
/// to call two messages the same request ("ok" and "ok").
const REPHRASE_MIN_WORDS: usize = 3;

/// One friction signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    Correction,
    Rephrased,
    NotAnswered,
    FailedTurn,
    Abandoned,
}

impl Signal {
    pub(crate) const ALL: [Signal; 5] = [
        Signal::Correction,
        Signal::Rephrased,
        Signal::NotAnswered,
        Signal::FailedTurn,
        Signal::Abandoned,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Signal::Correction => "correction",
            Signal::Rephrased => "rephrased",
            Signal::NotAnswered => "not_answered",
            Signal::FailedTurn => "failed_turn",
            Signal::Abandoned => "abandoned",
        }
    }

    pub(crate) fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw.trim())
    }
}

/// The signals of one message, in a fixed order.
pub(crate) type Signals = BTreeSet<Signal>;

/// `a, b` for a line of the prompt or the report.
pub(crate) fn list(signals: &Signals) -> String {
    signals
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Per space, per signal: how many exchanges (or unanswered messages) had it.
pub(crate) type Counts = BTreeMap<String, BTreeMap<Signal, u64>>;

/// One user message of a space, in order, as the signals need it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UserTurn<'a> {
    /// Who wrote it (sender id, else name); `None`: unknown, matched to no one.
    pub sender: Option<&'a str>,
    pub text: &'a str,
    pub at_ms: i64,
    /// The turn it started failed (`messages.status = 'failed'`).
    pub failed: bool,
    /// A reply answered it.
    pub answered: bool,
    /// Its turn has not ended yet: it cannot be abandoned.
    pub pending: bool,
}

/// The signals of each message of `turns` (oldest first), index for index.
pub(crate) fn signals(turns: &[UserTurn<'_>]) -> Vec<Signals> {
    let mut out = vec![Signals::new(); turns.len()];
    for (i, t) in turns.iter().enumerate() {
        if t.failed {
            out[i].insert(Signal::FailedTurn);
        }
        let next = t
            .sender
            .and_then(|who| turns[i + 1..].iter().find(|n| n.sender == Some(who)));
        match next {
            Some(n) => {
                let gap = n.at_ms - t.at_ms;
                if gap <= FOLLOW_UP_MS && is_correction(n.text) {
                    out[i].insert(Signal::Correction);
                }
                if gap <= FOLLOW_UP_MS && is_complaint(n.text) {
                    out[i].insert(Signal::NotAnswered);
                }
                if gap <= REPHRASE_MS && is_rephrasing(t.text, n.text) {
                    out[i].insert(Signal::Rephrased);
                }
            }
            None => {
                if !t.pending && (t.failed || !t.answered) {
                    out[i].insert(Signal::Abandoned);
                }
            }
        }
    }
    out
}

/// Lower case, typographic apostrophes made plain, whitespace collapsed,
/// leading mentions (`@mercury no, ...` in a group) left out.
fn normal(text: &str) -> String {
    text.to_lowercase()
        .replace(['\u{2019}', '\u{2018}', '`'], "'")
        .split_whitespace()
        .skip_while(|w| w.starts_with('@'))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Openings that reject the last reply ("no, ...").
const CORRECTION_OPENINGS: &[&str] = &["no,", "no.", "no!", "no ", "nope", "wrong", "incorrect"];
/// "No" openings that are not corrections.
const NOT_CORRECTIONS: &[&str] = &[
    "no problem",
    "no worries",
    "no thanks",
    "no thank you",
    "no need",
    "no rush",
];
const CORRECTION_PHRASES: &[&str] = &[
    "that's wrong",
    "that is wrong",
    "thats wrong",
    "that's not right",
    "that is not right",
    "that's not correct",
    "that is not correct",
    "that's incorrect",
    "that is incorrect",
    "you're wrong",
    "you are wrong",
    "not what i asked",
    "not what i meant",
    "not what i said",
    "i didn't ask",
    "i did not ask",
];
const COMPLAINT_PHRASES: &[&str] = &[
    "you didn't answer",
    "you did not answer",
    "didn't answer my",
    "did not answer my",
    "you didn't reply",
    "you did not reply",
    "you ignored",
    "answer my question",
    "answer the question",
    "still waiting",
    "that doesn't answer",
    "that does not answer",
    "not an answer",
];

/// The user corrects the bot.
pub(crate) fn is_correction(text: &str) -> bool {
    let t = normal(text);
    let bare = t.replace([',', '.', '!'], "");
    if NOT_CORRECTIONS.iter().any(|p| bare.starts_with(p)) {
        return false;
    }
    t == "no"
        || CORRECTION_OPENINGS.iter().any(|p| t.starts_with(p))
        || CORRECTION_PHRASES.iter().any(|p| t.contains(p))
}

/// The user says the bot did not answer.
pub(crate) fn is_complaint(text: &str) -> bool {
    let t = normal(text);
    COMPLAINT_PHRASES.iter().any(|p| t.contains(p))
}

/// Words too common to say two messages ask the same.
const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "you", "can", "please", "what", "with", "this", "that", "are", "was",
    "not", "but", "have", "has", "does", "did", "how", "why", "when", "who", "mercury",
];

fn words(text: &str) -> BTreeSet<String> {
    normal(text)
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3 && !STOP_WORDS.contains(w))
        .map(str::to_owned)
        .collect()
}

/// The second message asks what the first asked: their words overlap by at
/// least [`REPHRASE_OVERLAP`] (Jaccard).
pub(crate) fn is_rephrasing(first: &str, second: &str) -> bool {
    let (a, b) = (words(first), words(second));
    let union = a.union(&b).count();
    if union < REPHRASE_MIN_WORDS {
        return false;
    }
    let shared = a.intersection(&b).count();
    shared as f64 / union as f64 >= REPHRASE_OVERLAP
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn turn<'a>(sender: &'a str, text: &'a str, at_min: i64) -> UserTurn<'a> {
        UserTurn {
            sender: Some(sender),
            text,
            at_ms: at_min * MIN,
            failed: false,
            answered: true,
            pending: false,
        }
    }

    fn names(s: &Signals) -> Vec<&'static str> {
        s.iter().map(|x| x.as_str()).collect()
    }

    #[test]
    fn review_friction_correction_lands_on_the_corrected_exchange() {
        let turns = [
            turn("a", "what is the capital of France?", 0),
            turn("a", "No, that's wrong, it is Paris", 1),
        ];
        let s = signals(&turns);
        assert_eq!(names(&s[0]), ["correction"]);
        assert!(s[1].is_empty());
        for yes in [
            "no.",
            "Nope",
            "That’s not what I asked",
            "wrong again",
            "you are wrong",
            "@mercury no, Paris",
        ] {
            assert!(is_correction(yes), "{yes}");
        }
        for no in [
            "no problem, thanks",
            "No, thanks",
            "No worries",
            "nothing else",
            "now book it",
            "great",
        ] {
            assert!(!is_correction(no), "{no}");
        }
        // Too late, or from someone else: not a correction of this reply.
        let late = [turn("a", "q", 0), turn("a", "no, wrong", 31)];
        assert!(signals(&late)[0].is_empty());
        let other = [turn("a", "q", 0), turn("b", "no, wrong", 1)];
        assert!(signals(&other)[0].is_empty());
    }

    #[test]
    fn review_friction_rephrased_request_within_minutes() {
        let turns = [
            turn("a", "remind me to call the dentist tomorrow", 0),
            turn("a", "please remind me tomorrow to call my dentist", 3),
        ];
        assert_eq!(names(&signals(&turns)[0]), ["rephrased"]);
        let later = [
            turns[0].clone(),
            UserTurn {
                at_ms: 6 * MIN,
                ..turns[1].clone()
            },
        ];
        assert!(signals(&later)[0].is_empty(), "after five minutes");
        assert!(!is_rephrasing(
            "remind me to call the dentist tomorrow",
            "what is the weather in Paris"
        ));
        assert!(!is_rephrasing("ok", "ok"), "too few words to tell");
    }

    #[test]
    fn review_friction_you_did_not_answer() {
        let turns = [
            turn("a", "which train goes to Utrecht?", 0),
            turn("a", "You didn't answer my question", 2),
        ];
        assert_eq!(names(&signals(&turns)[0]), ["not_answered"]);
        assert!(is_complaint("that does not answer anything"));
        assert!(!is_complaint("thanks, that answers it"));
    }

    #[test]
    fn review_friction_failed_turn() {
        let mut t = turn("a", "book it", 0);
        t.failed = true;
        let next = turn("a", "thanks", 1);
        let s = signals(&[t, next]);
        assert_eq!(names(&s[0]), ["failed_turn"]);
        assert!(s[1].is_empty());
    }

    #[test]
    fn review_friction_abandoned_after_a_failure_or_no_reply() {
        let mut failed = turn("a", "book it", 0);
        failed.failed = true;
        assert_eq!(
            names(&signals(std::slice::from_ref(&failed))[0]),
            ["failed_turn", "abandoned"]
        );
        let mut unanswered = turn("a", "hello?", 0);
        unanswered.answered = false;
        assert_eq!(
            names(&signals(std::slice::from_ref(&unanswered))[0]),
            ["abandoned"]
        );
        // Still running: not abandoned yet. Answered and done: not abandoned.
        let mut pending = unanswered.clone();
        pending.pending = true;
        assert!(signals(&[pending])[0].is_empty());
        assert!(signals(&[turn("a", "thanks", 0)])[0].is_empty());
        // The sender came back: not abandoned (someone else's message does not count).
        let back = [unanswered.clone(), turn("a", "never mind", 40)];
        assert!(signals(&back)[0].is_empty());
        let other = [unanswered, turn("b", "hi", 1)];
        assert_eq!(names(&signals(&other)[0]), ["abandoned"]);
    }

    #[test]
    fn review_friction_signal_names_round_trip() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::String(s.as_str().into())
            );
        }
        assert_eq!(
            list(
                &[Signal::Abandoned, Signal::Correction]
                    .into_iter()
                    .collect()
            ),
            "correction, abandoned"
        );
    }
}
