//! Names from the redaction list, matched on the folded view.
//!
//! Owns the variants a configured name is looked for as: the whole name, the
//! first name, every other part of three letters or more (particles such as
//! `van` or `der` excepted: alone they name no one), first and last name
//! without the middle, and each of these written with `_`, `.`, `-`, spaces or
//! nothing between the parts (`@olivia_bakker`, `OliviaBakker`). Matching is
//! on the folded view, so case, diacritics, confusables, fullwidth forms and
//! invisible characters make no difference. A variant is taken only at name
//! boundaries (a non-letter, the ends, or a lower-to-upper change of case in
//! the original), except by the gate, which also flags a part of six letters
//! or more inside any word.
//!
//! Must never: let a match hold a different number of people than it
//! names (a first name shared by two listed people gets its own key).

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use regex::{Regex, RegexBuilder};

use super::normalise::{self, Views};

/// Between two parts of a name: nothing (glued), or up to three of these.
const JOINER: &str = r"[ _.\-']{0,3}";

/// Parts of a surname that name no one on their own.
const PARTICLES: &[&str] = &[
    "van", "von", "der", "den", "del", "della", "delle", "dei", "des", "dos", "das", "ter", "ten",
    "het", "bin", "ibn", "bint", "abu", "san", "santa", "saint", "sainte",
];

/// First names this short are still names; other parts need three letters.
const MIN_FIRST: usize = 2;
const MIN_PART: usize = 3;
/// The gate flags parts this long even glued inside another word.
const MIN_ANYWHERE: usize = 6;

pub(super) struct NameMatcher {
    /// Every variant, taken at name boundaries.
    bounded: Option<Regex>,
    /// Long parts, taken anywhere (gate only).
    anywhere: Option<Regex>,
    /// Compact variant (letters only) → the person it means, when only one.
    keys: HashMap<String, String>,
}

/// Letters and digits only: the identity of a matched name whatever joined
/// its parts.
fn compact(s: &str) -> String {
    s.chars().filter(|c| c.is_alphanumeric()).collect()
}

/// A configured name, split into words (on spaces) and each word into folded
/// parts (on anything not a letter or digit), with each part's length in
/// characters as written.
fn words(name: &str) -> Vec<Vec<(String, usize)>> {
    normalise::plain(name)
        .split_whitespace()
        .map(|w| {
            // Digits stay in their part: a display name `Bob42` is not `Bob`.
            w.split(|c: char| !c.is_alphanumeric())
                // A part of digits only names no one (a display name that is
                // a phone number is the phone matcher's).
                .filter(|p| p.chars().any(char::is_alphabetic))
                .map(|p| (normalise::fold(p), p.chars().count()))
                .filter(|(f, _)| !f.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn word_parts(w: &[(String, usize)]) -> Vec<&str> {
    w.iter().map(|(p, _)| p.as_str()).collect()
}

fn letters(w: &[(String, usize)]) -> usize {
    w.iter().map(|(_, n)| n).sum()
}

fn alternation(mut alts: Vec<String>) -> Result<Option<Regex>, ()> {
    if alts.is_empty() {
        return Ok(None);
    }
    // Longest first: at one start the engine takes the earliest alternative.
    alts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    alts.dedup();
    RegexBuilder::new(&format!("(?:{})", alts.join("|")))
        .size_limit(1 << 26)
        .build()
        .map(Some)
        .map_err(|_| ())
}

impl NameMatcher {
    pub(super) fn build(names: &[String]) -> Result<Self, ()> {
        let mut bounded = Vec::new();
        let mut anywhere = Vec::new();
        let mut owners: HashMap<String, BTreeSet<String>> = HashMap::new();
        for name in names {
            let words = words(name);
            let parts: Vec<&(String, usize)> = words.iter().flatten().collect();
            let (Some(first_word), Some(last_word)) = (words.first(), words.last()) else {
                continue;
            };
            let person: String = parts.iter().map(|(p, _)| p.as_str()).collect();
            let mut variants: Vec<Vec<&str>> = Vec::new();
            if parts.iter().map(|(_, n)| n).sum::<usize>() >= MIN_FIRST {
                variants.push(parts.iter().map(|(p, _)| p.as_str()).collect());
            }
            if words.len() > 1 {
                // The first name as written (`Jean-Pierre`), and first + last.
                if letters(first_word) >= MIN_FIRST {
                    variants.push(word_parts(first_word));
                }
                if words.len() > 2 {
                    let mut v = word_parts(first_word);
                    v.extend(word_parts(last_word));
                    variants.push(v);
                }
            }
            for (i, w) in words.iter().enumerate() {
                if w.len() > 1 && (i > 0 || words.len() == 1) {
                    // A hyphenated word (`Smith-Jones`) as written.
                    variants.push(word_parts(w));
                }
                for (p, n) in w {
                    // Every part of three letters or more: the surname parts
                    // and the parts of a compound first name.
                    let alone = words.len() > 1 || w.len() > 1;
                    if alone && *n >= MIN_PART && !PARTICLES.contains(&p.as_str()) {
                        variants.push(vec![p.as_str()]);
                    }
                    if *n >= MIN_ANYWHERE {
                        anywhere.push(regex::escape(p));
                    }
                }
            }
            for v in variants {
                owners.entry(v.concat()).or_default().insert(person.clone());
                bounded.push(
                    v.iter()
                        .map(|p| regex::escape(p))
                        .collect::<Vec<_>>()
                        .join(JOINER),
                );
            }
        }
        let keys = owners
            .into_iter()
            .filter_map(|(variant, people)| match people.len() {
                1 => people.into_iter().next().map(|p| (variant, p)),
                _ => None,
            })
            .collect();
        Ok(Self {
            bounded: alternation(bounded)?,
            anywhere: alternation(anywhere)?,
            keys,
        })
    }

    /// Ranges of the folded view holding a listed name, at name boundaries.
    pub(super) fn spans(&self, views: &Views) -> Vec<Range<usize>> {
        let Some(re) = &self.bounded else {
            return Vec::new();
        };
        let text = views.folded.text.as_str();
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(m) = re.find_at(text, at) {
            let start = m.start();
            let mut end = m.end();
            let mut found = None;
            if views.name_boundary(start) {
                loop {
                    if views.name_boundary(end) {
                        found = Some(end);
                        break;
                    }
                    // "olivia bakkerij": the whole name fails, "olivia" holds.
                    let shorter = &text[..prev_boundary(text, end)];
                    match re.find_at(shorter, start) {
                        Some(s) if s.start() == start && s.end() > start => end = s.end(),
                        _ => break,
                    }
                }
            }
            match found {
                Some(end) => {
                    out.push(start..end);
                    at = end;
                }
                None => at = next_boundary(text, start),
            }
            if at >= text.len() {
                break;
            }
        }
        out
    }

    /// Does any long listed part appear anywhere, even inside a word?
    pub(super) fn anywhere(&self, views: &Views) -> bool {
        self.anywhere
            .as_ref()
            .is_some_and(|re| re.is_match(&views.folded.text))
    }

    /// The placeholder key of a matched name (folded text).
    pub(super) fn key(&self, folded: &str) -> String {
        let c = compact(folded);
        self.keys.get(&c).cloned().unwrap_or(c)
    }
}

fn prev_boundary(text: &str, end: usize) -> usize {
    text[..end]
        .char_indices()
        .next_back()
        .map(|(i, _)| i)
        .unwrap_or(0)
}

fn next_boundary(text: &str, start: usize) -> usize {
    text[start..]
        .chars()
        .next()
        .map(|c| start + c.len_utf8())
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(names: &[&str], text: &str) -> Vec<String> {
        let m = NameMatcher::build(
            &names
                .iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>(),
        )
        .expect("names compile");
        let v = normalise::normalise(text);
        m.spans(&v)
            .into_iter()
            .map(|r| text[v.folded.original(r)].to_owned())
            .collect()
    }

    #[test]
    fn name_variants_cover_parts_handles_and_glued_forms() {
        let names = ["Anna de Vries"];
        assert_eq!(found(&names, "Mr. Vries wrote"), vec!["Vries"]);
        assert_eq!(found(&["Bob42"], "Bob and bob42"), vec!["bob42"]);
        // A display name that is a number adds no name variant.
        assert!(found(&["+31 6 1234 5678"], "31 December, room 1234").is_empty());
        assert_eq!(
            found(&names, "@anna_devries and AnnaDeVries"),
            vec!["anna_devries", "AnnaDeVries"]
        );
        assert_eq!(found(&names, "ANNA VRIES"), vec!["ANNA VRIES"]);
        // "de" alone is too short to name anyone.
        assert!(found(&names, "de tuin").is_empty());
        assert_eq!(found(&["Jan van der Berg"], "van der Berg"), vec!["Berg"]);
        assert_eq!(
            found(
                &["Jean-Pierre Dupont"],
                "Jean-Pierre, Pierre and JEAN PIERRE"
            ),
            vec!["Jean-Pierre", "Pierre", "JEAN PIERRE"]
        );
    }

    #[test]
    fn a_failed_long_variant_falls_back_to_a_shorter_one() {
        assert_eq!(found(&["Olivia Bakker"], "olivia bakkerij"), vec!["olivia"]);
        assert!(found(&["Olivia Bakker"], "Olivias bakkerij").is_empty());
    }

    #[test]
    fn shared_first_names_have_no_single_owner() {
        let m = NameMatcher::build(&["Alice Martin".into(), "Alice Dupont".into()]).unwrap();
        let key = |s: &str| m.key(&normalise::fold(s));
        assert_eq!(key("Alice"), normalise::fold("alice"));
        assert_eq!(key("Alice Martin"), key("martin"));
        assert_ne!(key("Alice Dupont"), key("martin"));
    }
}
