//! Names from the redaction list, matched on the folded view.
//!
//! Owns the variants a configured name is looked for as: the whole name, the
//! first name, every other part of three letters or more (particles such as
//! `van` or `der` excepted: alone they name no one), first and last name
//! without the middle, and each of these written with `_`, `.`, `-`, spaces or
//! nothing between the parts (`@olivia_bakker`, `OliviaBakker`), each also
//! spelled out letter by letter (`O l i v i a`), every letter also matching
//! its digit look-alikes (`0l1v1a`). Matching is on the folded and joined
//! views, so case, diacritics, confusables, fullwidth forms, small capitals,
//! regional indicators, invisible characters and a break inside a word make
//! no difference. A variant is taken only at name
//! boundaries (a non-letter, the ends, or a lower-to-upper change of case in
//! the original), except by the gate, which also flags a part of six letters
//! or more inside any word.
//!
//! Must never: let a match hold a different number of people than it
//! names (a first name shared by two listed people gets its own key).

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use regex::{Regex, RegexBuilder};

use super::normalise::{self, View, Views};

/// Between two parts of a name: nothing (glued), or up to three of these.
const JOINER: &str = r"[ _.\-']{0,3}";

/// Between two letters of a name spelled out letter by letter (`O l i v i
/// a`, `O.l.i.v.i.a`, `O-l-i-v-i-a`): one to three spaces or ASCII
/// punctuation marks. The views have already made every Unicode space,
/// dash and middle dot ASCII; a class of every non-letter would make the
/// compiled list many times larger.
const SPREAD: &str = r"[\x20-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E]{1,3}";

/// A name spelled out needs this many letters; shorter ones (`Al` as `A l`)
/// are ordinary text too often.
const MIN_SPREAD: usize = 3;

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

/// Digits and signs written for a folded letter (`0l1v1a`, `4nn4`, `$am`).
fn look_alikes(letter: char) -> &'static str {
    match letter {
        'o' => "0",
        'i' => "1!|",
        'e' => "3",
        'a' => "4@",
        's' => "5$",
        't' => "7+",
        'b' => "8",
        'g' => "9",
        'z' => "2",
        _ => "",
    }
}

/// The digit a look-alike stands for, back to its letter (for the key).
fn letter_of(c: char) -> char {
    match c {
        '0' => 'o',
        '1' | '!' | '|' => 'i',
        '3' => 'e',
        '4' | '@' => 'a',
        '5' | '$' => 's',
        '7' | '+' => 't',
        '8' => 'b',
        '9' => 'g',
        '2' => 'z',
        c => c,
    }
}

/// The pattern of a folded chunk: each letter, or a look-alike of it.
fn chunk_pattern(chunk: &str) -> String {
    chunk
        .chars()
        .map(|c| {
            let alikes = look_alikes(c);
            if alikes.is_empty() {
                regex::escape(c.encode_utf8(&mut [0u8; 4]))
            } else {
                let mut class = String::from("[");
                class.push_str(&regex::escape(c.encode_utf8(&mut [0u8; 4])));
                for a in alikes.chars() {
                    class.push_str(&regex::escape(a.encode_utf8(&mut [0u8; 4])));
                }
                class.push(']');
                class
            }
        })
        .collect()
}

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

/// One part of a configured name: folded, its length in characters as
/// written, and the folded form of each of its characters.
struct Part {
    folded: String,
    len: usize,
    chunks: Vec<String>,
}

/// A configured name, split into words (on spaces) and each word into parts
/// (on anything not a letter or digit).
fn words(name: &str) -> Vec<Vec<Part>> {
    normalise::plain(name)
        .split_whitespace()
        .map(|w| {
            // Digits stay in their part: a display name `Bob42` is not `Bob`.
            w.split(|c: char| !c.is_alphanumeric())
                // A part of digits only names no one (a display name that is
                // a phone number is the phone matcher's).
                .filter(|p| p.chars().any(char::is_alphabetic))
                .map(|p| Part {
                    folded: normalise::fold(p),
                    len: p.chars().count(),
                    chunks: normalise::fold_chunks(p),
                })
                .filter(|p| !p.folded.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn word_parts(w: &[Part]) -> Vec<&Part> {
    w.iter().collect()
}

fn letters(w: &[Part]) -> usize {
    w.iter().map(|p| p.len).sum()
}

fn alternation(mut alts: Vec<String>) -> Result<Option<Regex>, ()> {
    if alts.is_empty() {
        return Ok(None);
    }
    // Longest first: at one start the engine takes the earliest alternative.
    alts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    alts.dedup();
    RegexBuilder::new(&format!("(?:{})", alts.join("|")))
        .size_limit(1 << 27)
        .build()
        .map(Some)
        .map_err(|_| ())
}

/// Is a match with look-alike digits in it a name? The redactor takes one
/// that is mostly letters, two of them at least, and either five characters
/// long or with two look-alikes (`0l1v1a`, `4nn4`, not `5am` or `80`); the
/// gate any match with a letter in it.
fn plausible(matched: &str, wide: bool) -> bool {
    let digits = matched.chars().filter(char::is_ascii_digit).count();
    if digits == 0 {
        return true;
    }
    let letters = matched.chars().filter(|c| c.is_alphabetic()).count();
    if wide {
        return letters >= 1;
    }
    letters >= 2 && letters >= digits && (letters + digits >= 5 || digits >= 2)
}

impl NameMatcher {
    pub(super) fn build(names: &[String]) -> Result<Self, ()> {
        let mut bounded = Vec::new();
        let mut anywhere = Vec::new();
        let mut owners: HashMap<String, BTreeSet<String>> = HashMap::new();
        for name in names {
            let words = words(name);
            let parts: Vec<&Part> = words.iter().flatten().collect();
            let (Some(first_word), Some(last_word)) = (words.first(), words.last()) else {
                continue;
            };
            let person: String = parts.iter().map(|p| p.folded.as_str()).collect();
            let mut variants: Vec<Vec<&Part>> = Vec::new();
            if parts.iter().map(|p| p.len).sum::<usize>() >= MIN_FIRST {
                variants.push(parts.clone());
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
                for p in w {
                    // Every part of three letters or more: the surname parts
                    // and the parts of a compound first name.
                    let alone = words.len() > 1 || w.len() > 1;
                    if alone && p.len >= MIN_PART && !PARTICLES.contains(&p.folded.as_str()) {
                        variants.push(vec![p]);
                    }
                    if p.len >= MIN_ANYWHERE {
                        anywhere.push(chunk_pattern(&p.folded));
                    }
                }
            }
            for v in variants {
                let key: String = v.iter().map(|p| p.folded.as_str()).collect();
                owners.entry(key).or_default().insert(person.clone());
                bounded.push(
                    v.iter()
                        .map(|p| chunk_pattern(&p.folded))
                        .collect::<Vec<_>>()
                        .join(JOINER),
                );
                // The same, spelled out letter by letter.
                let chunks: Vec<String> = v
                    .iter()
                    .flat_map(|p| p.chunks.iter().map(|c| chunk_pattern(c)))
                    .collect();
                if chunks.len() >= MIN_SPREAD {
                    bounded.push(chunks.join(SPREAD));
                }
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
    pub(super) fn spans(&self, view: &View, wide: bool) -> Vec<Range<usize>> {
        let Some(re) = &self.bounded else {
            return Vec::new();
        };
        let text = view.text.as_str();
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(m) = re.find_at(text, at) {
            let start = m.start();
            let mut end = m.end();
            let mut found = None;
            if view.name_boundary(start) {
                loop {
                    if view.name_boundary(end) && plausible(&text[start..end], wide) {
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
        self.anywhere.as_ref().is_some_and(|re| {
            [&views.folded, &views.joined]
                .iter()
                .any(|v| re.find_iter(&v.text).any(|m| plausible(m.as_str(), true)))
        })
    }

    /// The placeholder key of a matched name (folded text): the person it
    /// names when only one, whatever look-alikes spelled it.
    pub(super) fn key(&self, folded: &str) -> String {
        let c = compact(folded);
        if let Some(person) = self.keys.get(&c) {
            return person.clone();
        }
        let letters: String = folded
            .chars()
            .map(letter_of)
            .filter(|c| c.is_alphanumeric())
            .collect();
        self.keys.get(&letters).cloned().unwrap_or(letters)
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
        m.spans(&v.folded, false)
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
