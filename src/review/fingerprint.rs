//! The fingerprint of a finding (M2.1): what makes two findings "the same
//! problem", stable across days and across the judge's wording.
//!
//! A fingerprint is the finding's **space**, **kind** and **target layer**
//! (exact) plus a **MinHash** signature of its normalised summary. Two
//! findings are the same when the exact parts are equal and the signatures
//! estimate a Jaccard similarity of at least [`SAME_FINDING`] between their
//! summaries' word sets.
//!
//! Normalising ([`words`]): Unicode NFKC, lower case; a placeholder such as
//! `[PERSON_2]` becomes the word `person` (its number changes from day to
//! day); digits, punctuation and a short list of English stop words are
//! dropped; a crude suffix stemmer folds plurals and `-ing`/`-ed`. The word
//! *set* is hashed, so order and repetition do not matter.
//!
//! MinHash ([`MinHash`]): each distinct word is hashed once with SHA-256 (a
//! hash whose output is fixed by its standard, so a signature written to the
//! ledger today compares equal next year); [`SLOTS`] permutations are then
//! derived from that 64-bit value by xoring a per-slot constant and applying
//! the SplitMix64 finaliser, and each slot keeps the minimum. The share of
//! equal slots between two signatures estimates the Jaccard similarity of
//! the sets (standard error about `sqrt(J(1-J)/SLOTS)`, 0.06 at J = 0.85).
//! This is a documented few-line implementation over the `sha2` crate the
//! host already uses; no lean maintained MinHash crate fitted without
//! pulling in a tokenizer stack.
//!
//! Must never: depend on a hasher whose output may change between Rust
//! releases (`std`'s `DefaultHasher`), or put text in the fingerprint that
//! did not come out of the redacted report.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// Slots of a MinHash signature.
pub(crate) const SLOTS: usize = 32;
/// Estimated Jaccard similarity at or above which two summaries (with the
/// same space, kind and layer) are the same finding.
pub(crate) const SAME_FINDING: f64 = 0.5;

/// Words that carry no meaning of their own in a finding's summary.
const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "an", "and", "any", "are", "as", "at", "be", "been",
    "before", "but", "by", "did", "do", "does", "for", "from", "had", "has", "have", "he", "her",
    "his", "how", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "she", "so",
    "than", "that", "the", "their", "them", "then", "there", "they", "this", "to", "was", "were",
    "what", "when", "which", "while", "who", "with", "would", "you", "your",
];

/// A finding's summary as its normalised words, in order.
pub(crate) fn words(text: &str) -> Vec<String> {
    let folded: String = text.nfkc().flat_map(char::to_lowercase).collect();
    let folded = placeholders().replace_all(&folded, " $kind ");
    folded
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter_map(|w| normalise_word(w.trim_matches('\'')))
        .collect()
}

/// `[person_2]` (already lower-cased): the redactor's placeholders.
fn placeholders() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        // A fixed pattern that is tested below; it compiles.
        #[allow(clippy::expect_used)]
        regex::Regex::new(r"\[(?P<kind>[a-z]+)_[a-z0-9_]*\]").expect("placeholder pattern")
    })
}

fn normalise_word(raw: &str) -> Option<String> {
    let w = raw.strip_suffix("'s").unwrap_or(raw).replace('\'', "");
    if w.chars().count() < 2 || w.chars().all(char::is_numeric) {
        return None;
    }
    if STOP_WORDS.binary_search(&w.as_str()).is_ok() {
        return None;
    }
    Some(stem(&w))
}

/// Folds the commonest English suffixes; crude on purpose (it only has to
/// map a word's forms onto one key, not produce a real stem).
fn stem(w: &str) -> String {
    let n = w.chars().count();
    let cut = |s: &str| w[..w.len() - s.len()].to_owned();
    if n > 4 && w.ends_with("ies") {
        return format!("{}y", cut("ies"));
    }
    if n > 5 && w.ends_with("ing") {
        return cut("ing");
    }
    if n > 4 && w.ends_with("ed") {
        return cut("ed");
    }
    if n > 3 && w.ends_with('s') && !w.ends_with("ss") && !w.ends_with("us") {
        return cut("s");
    }
    w.to_owned()
}

/// A MinHash signature of a word set.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct MinHash(pub [u32; SLOTS]);

impl MinHash {
    pub(crate) fn of_words<'a>(words: impl IntoIterator<Item = &'a str>) -> Self {
        let mut slots = [u32::MAX; SLOTS];
        let set: BTreeSet<&str> = words.into_iter().collect();
        for w in set {
            let digest = Sha256::digest(w.as_bytes());
            let mut base = [0u8; 8];
            base.copy_from_slice(&digest[..8]);
            let base = u64::from_le_bytes(base);
            for (i, slot) in slots.iter_mut().enumerate() {
                let h = (splitmix64(base ^ SLOT_KEYS[i]) >> 32) as u32;
                *slot = (*slot).min(h);
            }
        }
        Self(slots)
    }

    pub(crate) fn of_text(text: &str) -> Self {
        let w = words(text);
        Self::of_words(w.iter().map(String::as_str))
    }

    /// Estimated Jaccard similarity of the two word sets (0 to 1).
    pub(crate) fn similarity(&self, other: &MinHash) -> f64 {
        let same = self
            .0
            .iter()
            .zip(other.0.iter())
            .filter(|(a, b)| a == b)
            .count();
        same as f64 / SLOTS as f64
    }

    /// Eight letters `a`–`p` per slot (hex with letters for digits, so a
    /// signature never holds a digit run the identifier gate would take for
    /// a phone number).
    pub(crate) fn to_hex(&self) -> String {
        self.0.iter().map(|s| letters(u64::from(*s), 8)).collect()
    }

    pub(crate) fn from_hex(raw: &str) -> Option<Self> {
        if raw.len() != SLOTS * 8 || !raw.bytes().all(|b| (b'a'..=b'p').contains(&b)) {
            return None;
        }
        let mut slots = [0u32; SLOTS];
        for (i, slot) in slots.iter_mut().enumerate() {
            *slot = raw.as_bytes()[i * 8..i * 8 + 8]
                .iter()
                .fold(0u32, |acc, b| (acc << 4) | u32::from(b - b'a'));
        }
        Some(Self(slots))
    }
}

impl fmt::Debug for MinHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MinHash({}…)", &self.to_hex()[..16])
    }
}

/// Per-slot constants (the first 32 odd multiples of the golden ratio's
/// 64-bit fraction): fixed forever, since signatures are stored.
const SLOT_KEYS: [u64; SLOTS] = {
    let mut k = [0u64; SLOTS];
    let mut i = 0;
    while i < SLOTS {
        k[i] = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(2 * i as u64 + 1);
        i += 1;
    }
    k
};

/// The low `n` nibbles of `v`, most significant first, as letters `a`–`p`.
fn letters(v: u64, n: usize) -> String {
    (0..n)
        .rev()
        .map(|i| char::from(b'a' + ((v >> (4 * i)) & 0xf) as u8))
        .collect()
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What identifies a finding across days and wording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Fingerprint {
    pub space: String,
    pub kind: String,
    pub target_layer: String,
    /// The summary's MinHash signature, hex ([`MinHash::to_hex`]).
    pub summary_minhash: String,
}

impl Fingerprint {
    pub(crate) fn new(space: &str, kind: &str, target_layer: &str, summary: &str) -> Self {
        Self {
            space: space.to_owned(),
            kind: kind.to_owned(),
            target_layer: target_layer.to_owned(),
            summary_minhash: MinHash::of_text(summary).to_hex(),
        }
    }

    /// How alike the two summaries are (0 to 1), when space, kind and layer
    /// are equal; `None` when they differ or a signature is unreadable.
    pub(crate) fn similarity(&self, other: &Fingerprint) -> Option<f64> {
        if !self.same_parts(other) {
            return None;
        }
        let a = MinHash::from_hex(&self.summary_minhash)?;
        let b = MinHash::from_hex(&other.summary_minhash)?;
        Some(a.similarity(&b))
    }

    /// Equal space, kind and layer: the exact parts of [`similarity`](Self::similarity).
    pub(crate) fn same_parts(&self, other: &Fingerprint) -> bool {
        self.space == other.space
            && self.kind == other.kind
            && self.target_layer == other.target_layer
    }

    /// The same finding: equal exact parts and alike summaries.
    pub(crate) fn same_finding(&self, other: &Fingerprint) -> bool {
        self.similarity(other).is_some_and(|s| s >= SAME_FINDING)
    }

    /// Summaries alike regardless of space (the weekly clusters across spaces).
    pub(crate) fn summary_similarity(&self, other: &Fingerprint) -> f64 {
        match (
            MinHash::from_hex(&self.summary_minhash),
            MinHash::from_hex(&other.summary_minhash),
        ) {
            (Some(a), Some(b)) => a.similarity(&b),
            _ => 0.0,
        }
    }

    /// A short stable id: 12 letters (`a`–`p`) of SHA-256 over the exact
    /// parts and the signature (two wordings of one finding may have
    /// different ids; compare with [`Fingerprint::same_finding`]).
    pub(crate) fn short_id(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            &self.space,
            &self.kind,
            &self.target_layer,
            &self.summary_minhash,
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let d = h.finalize();
        let mut v = [0u8; 8];
        v.copy_from_slice(&d[..8]);
        letters(u64::from_be_bytes(v), 12)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn review_fingerprint_stop_words_are_sorted_for_the_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn review_fingerprint_normalises_wording() {
        assert_eq!(
            words("The assistant named the WRONG capitals, [PERSON_2] asked twice!"),
            [
                "assistant",
                "nam",
                "wrong",
                "capital",
                "person",
                "ask",
                "twice"
            ]
        );
        assert_eq!(words("[PERSON_1]'s cat"), ["person", "cat"]);
        assert_eq!(words("call 12345 [broken"), ["call", "broken"]);
        assert!(words("").is_empty());
    }

    #[test]
    fn review_fingerprint_is_stable_and_separates_kinds() {
        let a = Fingerprint::new(
            "main",
            "wrong_answer",
            "memory",
            "The assistant named the wrong capital of France.",
        );
        // The word set is hashed: order does not matter.
        assert_eq!(
            &a.summary_minhash[..8],
            &MinHash::of_text("capital france named wrong assistant").to_hex()[..8]
        );
        let b = Fingerprint::new(
            "main",
            "wrong_answer",
            "memory",
            "Wrong capital of France named by the assistant",
        );
        assert!(a.same_finding(&b), "{:?}", a.similarity(&b));
        let other_kind = Fingerprint {
            kind: "tone".into(),
            ..b.clone()
        };
        assert!(!a.same_finding(&other_kind));
        let other_space = Fingerprint {
            space: "family".into(),
            ..b.clone()
        };
        assert!(!a.same_finding(&other_space));
        assert!(a.summary_similarity(&other_space) > 0.9);
        let unrelated = Fingerprint::new(
            "main",
            "wrong_answer",
            "memory",
            "The reply refused to set a reminder for the dentist.",
        );
        assert!(
            !a.same_finding(&unrelated),
            "{:?}",
            a.similarity(&unrelated)
        );
        assert_eq!(
            MinHash::from_hex(&a.summary_minhash).unwrap().to_hex(),
            a.summary_minhash
        );
        assert!(MinHash::from_hex("zz").is_none());
        assert!(a.summary_minhash.bytes().all(|b| b.is_ascii_lowercase()));
        assert_eq!(a.short_id().len(), 12);
    }

    const VOCAB: &[&str] = &[
        "assistant",
        "reply",
        "capital",
        "france",
        "reminder",
        "dentist",
        "calendar",
        "weather",
        "forecast",
        "recipe",
        "pasta",
        "translation",
        "german",
        "invoice",
        "total",
        "currency",
        "meeting",
        "tuesday",
        "refused",
        "ignored",
        "instruction",
        "summary",
        "birthday",
        "gift",
        "train",
        "ticket",
        "price",
        "answer",
        "wrong",
        "missing",
        "language",
        "format",
    ];

    fn sentence() -> impl Strategy<Value = Vec<&'static str>> {
        proptest::sample::subsequence(VOCAB, 8..14).prop_shuffle()
    }

    proptest! {
        /// Rewording a summary (case, punctuation, stop words, placeholder
        /// numbers, order, one word swapped) keeps it the same finding.
        #[test]
        fn review_fingerprint_survives_rewording(
            base in sentence(),
            swap_at in 0usize..8,
            swap_to in proptest::sample::select(&["lunch", "holiday", "parcel", "museum"][..]),
            upper in any::<bool>(),
            n in 1u32..9,
        ) {
            let original = format!("The {} of [PERSON_1].", base.join(" "));
            let mut changed: Vec<String> = base.iter().rev().map(|w| (*w).to_owned()).collect();
            changed[swap_at] = swap_to.to_owned();
            let mut reworded = format!("[PERSON_{n}] : the {} , it was a {}!", changed.join(", "), changed[0]);
            if upper {
                reworded = reworded.to_uppercase();
            }
            let a = Fingerprint::new("s", "wrong_answer", "memory", &original);
            let b = Fingerprint::new("s", "wrong_answer", "memory", &reworded);
            prop_assert!(a.same_finding(&b), "{original:?} vs {reworded:?}: {:?}", a.similarity(&b));
        }

        /// Summaries that share no word are not the same finding.
        #[test]
        fn review_fingerprint_keeps_disjoint_summaries_apart(split in 4usize..28) {
            let (left, right) = VOCAB.split_at(split);
            let a = Fingerprint::new("s", "tone", "character", &left.join(" "));
            let b = Fingerprint::new("s", "tone", "character", &right.join(" "));
            prop_assert!(!a.same_finding(&b));
        }
    }
}
