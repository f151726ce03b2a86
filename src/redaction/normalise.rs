//! The one normalisation step the redactor and the gate both match on.
//!
//! Owns two views of a text, each with a map from every one of its characters
//! back to the bytes of the original it came from, so a match found in a view
//! is replaced in the original and everything else is left exactly as written:
//!
//! - [`View`] `plain`: NFKC; format and invisible characters dropped (`Cf`,
//!   every default-ignorable code point: zero-width space and joiners, soft
//!   hyphen, variation selectors, tag characters, bidi controls) and so are
//!   other control characters; every Unicode space and tab becomes `' '`, every
//!   dash and minus sign `'-'`, middle dots and ideographic full stops `'.'`,
//!   line and paragraph separators `'\n'`. Phones, e-mails, WhatsApp ids and
//!   sender ids are matched here.
//! - `folded`: `plain`, then for letters: lower case, the Unicode confusables
//!   skeleton (UTS #39, from `unicode-security`), diacritics (combining marks)
//!   dropped, lower case again. Names are matched here, so `ÉLODIE`, `Elodie`,
//!   `E\u{301}lodie`, `Еlodie` (Cyrillic Е) and `Ｅｌｏｄｉｅ` are one word.
//!
//! Must never: lose the mapping (every view character maps to a non-empty
//! or, at worst, zero-width range of the original, in order), or let a
//! stripped character split a match (stripped characters are simply absent
//! from the views).

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;
use unicode_normalization::char::{canonical_combining_class, is_combining_mark};
use unicode_normalization::UnicodeNormalization;
use unicode_security::confusable_detection::skeleton;

/// Scripts written without spaces between words: a name in them has no word
/// boundary to look for, so a letter of these never counts as "more word".
static NO_SPACE_SCRIPT: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(r"^[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]$")
});

/// Invisible characters: general category `Cf` and every default-ignorable
/// code point (this covers the soft hyphen, zero-width characters, variation
/// selectors, tag characters and Hangul fillers), plus the C0/C1 controls that
/// are not line breaks or tabs.
static INVISIBLE: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r"^[\p{Cf}\p{Default_Ignorable_Code_Point}\x{0}-\x{8}\x{E}-\x{1F}\x{7F}-\x{84}\x{86}-\x{9F}]$",
    )
});

static DASH: LazyLock<Regex> = LazyLock::new(|| {
    // Pd plus the minus signs and hyphen-like marks that are not Pd.
    super::constant_regex(r"^[\p{Pd}\x{2212}\x{2043}\x{02D7}\x{2796}\x{FE63}\x{FF0D}\x{2011}]$")
});

static SPACE: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"^[\p{Zs}\x{9}\x{B}\x{C}\x{2800}]$"));

/// Middle dots, bullets and ideographic full stops: read as `.`.
fn is_dot_like(c: char) -> bool {
    matches!(
        c,
        '\u{00B7}'
            | '\u{0387}'
            | '\u{2022}'
            | '\u{2027}'
            | '\u{2219}'
            | '\u{22C5}'
            | '\u{30FB}'
            | '\u{FF65}'
            | '\u{16EB}'
            | '\u{3002}'
            | '\u{FF61}'
            | '\u{FE12}'
    )
}

fn matches_char(re: &Regex, c: char) -> bool {
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

/// What a character of the original becomes in the plain view.
enum Plain {
    Drop,
    Char(char),
}

fn plain_char(c: char) -> Plain {
    if c.is_ascii() {
        return match c {
            '\t' | '\u{B}' | '\u{C}' => Plain::Char(' '),
            '\n' | '\r' => Plain::Char(c),
            c if c.is_ascii_control() => Plain::Drop,
            c => Plain::Char(c),
        };
    }
    if matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}') {
        return Plain::Char('\n');
    }
    if matches_char(&INVISIBLE, c) {
        return Plain::Drop;
    }
    if matches_char(&SPACE, c) {
        return Plain::Char(' ');
    }
    if matches_char(&DASH, c) {
        return Plain::Char('-');
    }
    if is_dot_like(c) {
        return Plain::Char('.');
    }
    Plain::Char(c)
}

/// Flags of one folded character, taken from the original it came from.
#[derive(Clone, Copy, Default)]
pub(super) struct Shape {
    /// A letter that continues a word (so not a boundary next to a name).
    pub letter: bool,
    pub upper: bool,
    pub lower: bool,
}

/// The folded form of one plain character, appended to `out`: the
/// confusables skeleton of the character as written (so upper-case look-alikes
/// such as Cyrillic `В` or Greek `Ν` meet their Latin letter), lower-cased,
/// marks dropped. The skeleton makes `I` and `l` one letter and `m` the pair
/// `rn`; lower case must agree with that, so every `l` becomes `i` and every
/// `m` `rn` after lower-casing.
fn fold_into(c: char, out: &mut String) {
    fn post(l: char, out: &mut String) {
        match l {
            'm' => out.push_str("rn"),
            'l' => out.push('i'),
            'ß' => out.push_str("ss"),
            l => out.push(l),
        }
    }
    if c.is_ascii() {
        if c.is_ascii_alphabetic() {
            // The skeleton of an ASCII letter is itself, except `I` → `l`
            // and `m` → `rn`, which `post` applies anyway.
            post(c.to_ascii_lowercase(), out);
        } else {
            out.push(c);
        }
        return;
    }
    if is_combining_mark(c) {
        return;
    }
    if !c.is_alphabetic() {
        out.push(c);
        return;
    }
    let mut buf = [0u8; 4];
    for s in skeleton(c.encode_utf8(&mut buf)) {
        if is_combining_mark(s) {
            continue;
        }
        for l in s.to_lowercase() {
            if !is_combining_mark(l) {
                post(l, out);
            }
        }
    }
}

/// One view of a text and where each of its characters came from.
#[derive(Default)]
pub(super) struct View {
    pub text: String,
    /// Byte offset in `text` of each character.
    starts: Vec<usize>,
    /// Byte range in the original of each character.
    origin: Vec<(usize, usize)>,
}

impl View {
    fn push(&mut self, c: char, origin: (usize, usize)) {
        self.starts.push(self.text.len());
        self.origin.push(origin);
        self.text.push(c);
    }

    /// The original bytes behind a (non-empty, char-aligned) range of the view.
    pub(super) fn original(&self, r: Range<usize>) -> Range<usize> {
        let first = self
            .starts
            .partition_point(|&s| s <= r.start)
            .saturating_sub(1);
        let last = self
            .starts
            .partition_point(|&s| s < r.end)
            .saturating_sub(1);
        self.origin[first].0..self.origin[last].1.max(self.origin[first].0)
    }

    /// Index of the character starting at byte `at` of the view.
    fn index(&self, at: usize) -> Option<usize> {
        self.starts.binary_search(&at).ok()
    }
}

/// The plain and folded views of one text.
pub(super) struct Views {
    pub plain: View,
    pub folded: View,
    /// One per character of `folded`.
    shapes: Vec<Shape>,
}

impl Views {
    /// Is there a word boundary for a name between the folded characters at
    /// byte `at - 1` and `at`? A boundary is the start or end of the text, a
    /// non-letter on either side, or a change from lower to upper case in the
    /// original (`OliviaBakker`).
    pub(super) fn name_boundary(&self, at: usize) -> bool {
        if at == 0 || at >= self.folded.text.len() {
            return true;
        }
        let Some(next) = self.folded.index(at) else {
            return false;
        };
        let (before, after) = (self.shapes[next - 1], self.shapes[next]);
        if !before.letter || !after.letter {
            return true;
        }
        // Two folded characters of one original character are never split.
        if self.folded.origin[next - 1] == self.folded.origin[next] {
            return false;
        }
        before.lower && after.upper
    }
}

/// Builds both views of `original`.
pub(super) fn normalise(original: &str) -> Views {
    let mut views = Views {
        plain: View::default(),
        folded: View::default(),
        shapes: Vec::new(),
    };
    let mut chars = original.char_indices().peekable();
    let mut nfkc_buf = String::new();
    let mut fold_buf = String::new();
    while let Some((start, first)) = chars.next() {
        // A cluster: one character and the combining marks after it, so NFKC
        // can compose them (`e` + U+0301 → `é`).
        let mut end = start + first.len_utf8();
        while let Some(&(i, c)) = chars.peek() {
            if canonical_combining_class(c) == 0 {
                break;
            }
            end = i + c.len_utf8();
            chars.next();
        }
        let origin = (start, end);
        let cluster = &original[start..end];
        let shape = Shape {
            letter: false,
            upper: first.is_uppercase(),
            lower: first.is_lowercase(),
        };
        nfkc_buf.clear();
        if cluster.len() == 1 {
            nfkc_buf.push(first);
        } else {
            nfkc_buf.extend(cluster.nfkc());
        }
        for c in nfkc_buf.chars() {
            let Plain::Char(p) = plain_char(c) else {
                continue;
            };
            views.plain.push(p, origin);
            fold_buf.clear();
            fold_into(p, &mut fold_buf);
            for f in fold_buf.chars() {
                let letter =
                    f.is_alphabetic() && (f.is_ascii() || !matches_char(&NO_SPACE_SCRIPT, f));
                views.folded.push(f, origin);
                views.shapes.push(Shape { letter, ..shape });
            }
        }
    }
    views
}

/// The folded form of a whole string (names from the redaction list).
pub(super) fn fold(s: &str) -> String {
    normalise(s).folded.text
}

/// The plain form of a whole string (sender ids from the redaction list).
pub(super) fn plain(s: &str) -> String {
    normalise(s).plain.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_view_strips_invisibles_and_maps_dashes_spaces_and_dots() {
        let text = "0\u{200B}6\u{2013}12\u{2009}34\u{00AD}56\u{3000}7\u{2212}8\u{00B7}9\t1\u{FE0F}\u{E0041}";
        let v = normalise(text);
        assert_eq!(v.plain.text, "06-12 3456 7-8.9 1");
        assert_eq!(plain("ｂｏｂ＠ｅｘａｍｐｌｅ。ｃｏｍ"), "bob@example.com");
        assert_eq!(plain("a\u{2028}b\u{202F}c"), "a\nb c");
    }

    #[test]
    fn folded_view_folds_case_diacritics_and_confusables() {
        // NFC, NFD, no accent, Cyrillic look-alikes, fullwidth, zero-width inside.
        for form in [
            "Élodie",
            "E\u{301}lodie",
            "ELODIE",
            "elodie",
            "\u{415}lodie",
            "Ｅｌｏｄｉｅ",
            "Elo\u{200D}die",
            "É\u{AD}lodie",
        ] {
            assert_eq!(fold(form), fold("élodie"), "{form:?}");
        }
        assert_eq!(fold("Łukasz Wróbel"), fold("lukasz wrobel"));
        assert_eq!(fold("Strauß"), fold("STRAUSS"));
        assert_eq!(fold("Ωmega"), fold("ωmega"));
        // Upper-case look-alikes: Cyrillic В, Н, М; Greek Ν, Τ, Κ, Ι.
        assert_eq!(
            fold("\u{412}ram \u{41D}ans \u{41C}ia"),
            fold("Bram Hans Mia")
        );
        assert_eq!(fold("\u{39D}\u{39F}\u{3A4}\u{39A}\u{399}"), fold("notki"));
        assert_eq!(fold("OLIVIA"), fold("olivia"));
        assert_ne!(fold("Anna"), fold("Anne"));
    }

    #[test]
    fn view_ranges_map_back_to_the_original() {
        let text = "tel: 0\u{200B}6\u{2013}12 ok";
        let v = normalise(text);
        let at = v.plain.text.find("06-12").unwrap();
        let r = v.plain.original(at..at + 5);
        assert_eq!(&text[r], "0\u{200B}6\u{2013}12");
        let text = "Hi E\u{301}LODIE!";
        let v = normalise(text);
        let needle = fold("elodie");
        let at = v.folded.text.find(&needle).unwrap();
        assert_eq!(
            &text[v.folded.original(at..at + needle.len())],
            "E\u{301}LODIE"
        );
    }

    #[test]
    fn name_boundaries_follow_letters_and_case_changes() {
        let v = normalise("OliviaBakker olivia2 OLIVIABAKKER");
        let f = &v.folded.text;
        assert!(v.name_boundary(0));
        assert!(v.name_boundary(6), "{f}");
        assert!(!v.name_boundary(3));
        let second = f.find(&fold("olivia2")).unwrap();
        assert!(v.name_boundary(second + 6));
        let third = f.rfind(&fold("oliviabakker")).unwrap();
        assert!(!v.name_boundary(third + 6));
        assert!(v.name_boundary(f.len()));
    }
}
