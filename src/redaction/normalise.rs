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
//! Before either view is built, HTML character references (`&#64;`,
//! `&#x2D;`, `&commat;`, `&nbsp;`) and URL escapes (`%40`, `%20`, UTF-8
//! sequences such as `%C3%A9`) are decoded, up to three times over (so
//! `&amp;#64;` and `%2540` are `@` too); each decoded character maps back
//! to the whole reference. Combining marks are kept with the character they
//! follow and dropped from both views (keycaps `0️⃣`, overlines `0̅`), small
//! capitals (`ᴏʟɪᴠɪᴀ`) and regional indicators (`🇴🇱`) become ASCII letters,
//! dingbat digits (`❶`, `🔟`) digits. A third view, `joined`, is `folded`
//! with the breaks a disguise puts inside a word removed: a space other than
//! U+0020 between two letters (`Oli\u{3000}via`) and a hyphen and line break
//! (`Oli-\nvia`). Names are matched on `folded` and `joined`.
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
    /// Came from a regional indicator (`🇴`): a run of them is a word of
    /// its own, so a flag glued to a name is still a boundary.
    pub regional: bool,
    /// Came from a space other than U+0020 (ideographic, no-break, thin…).
    pub foreign_space: bool,
    /// A hyphen or dash.
    pub hyphen: bool,
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
    /// One per character (folded and joined views only).
    shapes: Vec<Shape>,
}

impl View {
    fn push(&mut self, c: char, origin: (usize, usize)) {
        self.starts.push(self.text.len());
        self.origin.push(origin);
        self.text.push(c);
    }

    fn push_shaped(&mut self, c: char, origin: (usize, usize), shape: Shape) {
        self.push(c, origin);
        self.shapes.push(shape);
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

    /// Is there a word boundary for a name between the characters at byte
    /// `at - 1` and `at`? A boundary is the start or end of the text, a
    /// non-letter on either side, a change between regional indicators and
    /// other letters, or a change from lower to upper case in the original
    /// (`OliviaBakker`).
    pub(super) fn name_boundary(&self, at: usize) -> bool {
        if at == 0 || at >= self.text.len() {
            return true;
        }
        let Some(next) = self.index(at) else {
            return false;
        };
        let (before, after) = (self.shapes[next - 1], self.shapes[next]);
        if !before.letter || !after.letter || before.regional != after.regional {
            return true;
        }
        // Two folded characters of one original character are never split.
        if self.origin[next - 1] == self.origin[next] {
            return false;
        }
        before.lower && after.upper
    }
}

/// The views of one text.
pub(super) struct Views {
    pub plain: View,
    pub folded: View,
    /// `folded` without the breaks a disguise puts inside a word.
    pub joined: View,
}

/// What a small capital, a regional indicator or a dingbat digit stands for.
fn look_alike_of(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{1D00}' => "a",
        '\u{0299}' => "b",
        '\u{1D04}' => "c",
        '\u{1D05}' => "d",
        '\u{1D07}' => "e",
        '\u{A730}' => "f",
        '\u{0262}' => "g",
        '\u{029C}' => "h",
        '\u{026A}' => "i",
        '\u{1D0A}' => "j",
        '\u{1D0B}' => "k",
        '\u{029F}' => "l",
        '\u{1D0D}' => "m",
        '\u{0274}' => "n",
        '\u{1D0F}' => "o",
        '\u{1D18}' => "p",
        '\u{A7AF}' => "q",
        '\u{0280}' => "r",
        '\u{A731}' => "s",
        '\u{1D1B}' => "t",
        '\u{1D1C}' => "u",
        '\u{1D20}' => "v",
        '\u{1D21}' => "w",
        '\u{028F}' => "y",
        '\u{1D22}' => "z",
        '\u{1F51F}' | '\u{277F}' | '\u{2789}' | '\u{2793}' => "10",
        '\u{24FF}' | '\u{1F10B}' | '\u{1F10C}' => "0",
        '\u{1F1E6}'..='\u{1F1FF}' => {
            const RI: [&str; 26] = [
                "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P",
                "Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z",
            ];
            RI[(c as u32 - 0x1F1E6) as usize]
        }
        '\u{2776}'..='\u{277E}' | '\u{2780}'..='\u{2788}' | '\u{278A}'..='\u{2792}' => {
            const D: [&str; 9] = ["1", "2", "3", "4", "5", "6", "7", "8", "9"];
            let base = match c {
                '\u{2776}'..='\u{277E}' => 0x2776,
                '\u{2780}'..='\u{2788}' => 0x2780,
                _ => 0x278A,
            };
            D[(c as u32 - base) as usize]
        }
        _ => return None,
    })
}

fn is_regional(c: char) -> bool {
    matches!(c, '\u{1F1E6}'..='\u{1F1FF}')
}

/// A character after decoding and the byte range of the original it came from.
type Decoded = (char, (usize, usize));

/// Named character references a disguise may use: the punctuation of
/// addresses and numbers, spaces and invisible characters.
fn named_reference(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" | "NonBreakingSpace" => '\u{A0}',
        "ensp" => '\u{2002}',
        "emsp" => '\u{2003}',
        "thinsp" => '\u{2009}',
        "commat" => '@',
        "period" => '.',
        "hyphen" | "dash" => '\u{2010}',
        "minus" => '\u{2212}',
        "ndash" => '\u{2013}',
        "mdash" => '\u{2014}',
        "plus" => '+',
        "num" => '#',
        "lpar" => '(',
        "rpar" => ')',
        "lsqb" | "lbrack" => '[',
        "rsqb" | "rbrack" => ']',
        "lowbar" | "UnderBar" => '_',
        "sol" => '/',
        "bsol" => '\\',
        "colon" => ':',
        "semi" => ';',
        "comma" => ',',
        "excl" => '!',
        "quest" => '?',
        "ast" | "midast" => '*',
        "verbar" | "vert" | "VerticalLine" => '|',
        "tilde" => '~',
        "equals" => '=',
        "percnt" => '%',
        "dollar" => '$',
        "middot" | "centerdot" => '\u{B7}',
        "bull" | "bullet" => '\u{2022}',
        "shy" => '\u{AD}',
        "zwj" => '\u{200D}',
        "zwnj" => '\u{200C}',
        "lrm" => '\u{200E}',
        "rlm" => '\u{200F}',
        "ZeroWidthSpace" | "NegativeThinSpace" | "NegativeMediumSpace" => '\u{200B}',
        "NoBreak" => '\u{2060}',
        "Tab" => '\t',
        _ => return None,
    })
}

/// A character reference at the start of `s` (`&#64;`, `&#x40`, `&commat;`):
/// the character and the bytes it took. A numeric one needs no `;`, as in
/// browsers; a named one does.
fn html_reference(s: &[Decoded]) -> Option<(char, usize)> {
    let chars = s.iter().map(|(c, _)| *c);
    let text: String = chars.take(40).collect();
    let rest = text.strip_prefix('&')?;
    if let Some(num) = rest.strip_prefix('#') {
        let (digits, radix) = match num.strip_prefix(['x', 'X']) {
            Some(hex) => (hex, 16),
            None => (num, 10),
        };
        let n = digits
            .chars()
            .take_while(|c| c.is_digit(radix))
            .take(8)
            .count();
        if n == 0 {
            return None;
        }
        let value = u32::from_str_radix(&digits[..n], radix).ok()?;
        let c = char::from_u32(value)?;
        let mut used = 1 + 1 + (num.len() - digits.len()) + n;
        if digits[n..].starts_with(';') {
            used += 1;
        }
        return Some((c, used));
    }
    let name: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .take(32)
        .collect();
    if !rest[name.len()..].starts_with(';') {
        return None;
    }
    named_reference(&name).map(|c| (c, name.len() + 2))
}

fn hex_byte(s: &[Decoded]) -> Option<u8> {
    match s {
        [('%', _), (h, _), (l, _), ..] => {
            let (h, l) = (h.to_digit(16)?, l.to_digit(16)?);
            u8::try_from(h * 16 + l).ok()
        }
        _ => None,
    }
}

/// URL escapes at the start of `s`: the longest run of `%HH` that is UTF-8
/// (`%C3%A9` is one `é`), as characters and the escapes each took.
fn url_escape(s: &[Decoded]) -> Option<(Vec<char>, usize)> {
    let mut bytes = Vec::new();
    while let Some(b) = hex_byte(&s[bytes.len() * 3..]) {
        bytes.push(b);
        if bytes.len() >= 64 {
            break;
        }
    }
    // The longest prefix that decodes; a stray byte ends the run there.
    while !bytes.is_empty() {
        if let Ok(text) = std::str::from_utf8(&bytes) {
            return Some((text.chars().collect(), bytes.len() * 3));
        }
        bytes.pop();
    }
    None
}

/// One round of decoding: each reference or escape becomes what it stands
/// for, mapped to the union of the bytes it was written with.
fn decode_round(input: &[Decoded]) -> (Vec<Decoded>, bool) {
    let mut out = Vec::with_capacity(input.len());
    let mut changed = false;
    let mut i = 0;
    let span = |from: usize, to: usize| (input[from].1 .0, input[to - 1].1 .1);
    while i < input.len() {
        let c = input[i].0;
        if c == '&' {
            if let Some((d, used)) = html_reference(&input[i..]) {
                out.push((d, span(i, i + used)));
                i += used;
                changed = true;
                continue;
            }
        }
        if c == '%' {
            if let Some((chars, used)) = url_escape(&input[i..]) {
                // Each decoded character maps to its whole escape run, so
                // a match over part of it still replaces all of it.
                let whole = span(i, i + used);
                out.extend(chars.into_iter().map(|d| (d, whole)));
                i += used;
                changed = true;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    (out, changed)
}

/// The original's characters with references and escapes decoded.
fn decoded(original: &str) -> Vec<Decoded> {
    let mut chars: Vec<Decoded> = original
        .char_indices()
        .map(|(i, c)| (c, (i, i + c.len_utf8())))
        .collect();
    if !original.contains(['&', '%']) {
        return chars;
    }
    for _ in 0..3 {
        let (next, changed) = decode_round(&chars);
        chars = next;
        if !changed {
            break;
        }
    }
    chars
}

/// A mark kept with the character before it: combining marks of any class
/// (enclosing keycaps, overlines, accents) and variation selectors.
fn continues_cluster(c: char) -> bool {
    is_combining_mark(c) || canonical_combining_class(c) != 0
}

/// Builds the views of `original`.
pub(super) fn normalise(original: &str) -> Views {
    let mut views = Views {
        plain: View::default(),
        folded: View::default(),
        joined: View::default(),
    };
    let chars = decoded(original);
    let mut nfkc_buf = String::new();
    let mut fold_buf = String::new();
    let mut i = 0;
    while i < chars.len() {
        // A cluster: one character and the marks after it, so NFKC can
        // compose them (`e` + U+0301 → `é`) and a mark NFKC leaves is
        // dropped with its base mapped over it.
        let (first, (start, mut end)) = chars[i];
        let mut j = i + 1;
        while j < chars.len() && continues_cluster(chars[j].0) {
            end = end.max(chars[j].1 .1);
            j += 1;
        }
        let origin = (start, end);
        let shape = Shape {
            upper: first.is_uppercase(),
            lower: first.is_lowercase(),
            regional: is_regional(first),
            foreign_space: first != ' ' && matches_char(&SPACE, first),
            ..Shape::default()
        };
        nfkc_buf.clear();
        if j == i + 1 && first.is_ascii() {
            nfkc_buf.push(first);
        } else {
            let cluster: String = chars[i..j].iter().map(|(c, _)| *c).collect();
            for c in cluster.nfkc() {
                match look_alike_of(c) {
                    Some(s) => nfkc_buf.push_str(s),
                    None => nfkc_buf.push(c),
                }
            }
        }
        i = j;
        for c in nfkc_buf.chars() {
            if is_combining_mark(c) {
                continue;
            }
            let Plain::Char(p) = plain_char(c) else {
                continue;
            };
            views.plain.push(p, origin);
            fold_buf.clear();
            fold_into(p, &mut fold_buf);
            for f in fold_buf.chars() {
                let letter =
                    f.is_alphabetic() && (f.is_ascii() || !matches_char(&NO_SPACE_SCRIPT, f));
                views.folded.push_shaped(
                    f,
                    origin,
                    Shape {
                        letter,
                        hyphen: f == '-',
                        ..shape
                    },
                );
            }
        }
    }
    views.joined = joined(&views.folded);
    views
}

/// `folded` without a space other than U+0020 between two letters, nor a
/// hyphen and line break (spaces around either allowed) between two letters.
fn joined(folded: &View) -> View {
    let n = folded.shapes.len();
    let chars: Vec<char> = folded.text.chars().collect();
    let mut skip = vec![false; n];
    let mut i = 0;
    while i < n {
        if i == 0 || !folded.shapes[i - 1].letter {
            i += 1;
            continue;
        }
        // A run of foreign spaces, or `-`, spaces, a line break, spaces.
        let mut j = i;
        while j < n && folded.shapes[j].foreign_space {
            j += 1;
        }
        if j == i && folded.shapes[i].hyphen {
            let mut k = i + 1;
            while k < n && chars[k] == ' ' {
                k += 1;
            }
            if k < n && chars[k] == '\r' {
                k += 1;
            }
            if k < n && chars[k] == '\n' {
                k += 1;
                while k < n && chars[k] == ' ' {
                    k += 1;
                }
                j = k;
            }
        }
        if j > i && j < n && folded.shapes[j].letter {
            skip[i..j].iter_mut().for_each(|s| *s = true);
            i = j;
        } else {
            i += 1;
        }
    }
    let mut out = View::default();
    for (k, c) in chars.into_iter().enumerate() {
        if !skip[k] {
            out.push_shaped(c, folded.origin[k], folded.shapes[k]);
        }
    }
    out
}

/// The folded form of a whole string (names from the redaction list).
pub(super) fn fold(s: &str) -> String {
    normalise(s).folded.text
}

/// The folded form of each character of `s` as written, in order (a name
/// part spelled out letter by letter is matched chunk by chunk).
pub(super) fn fold_chunks(s: &str) -> Vec<String> {
    let folded = normalise(s).folded;
    let mut out: Vec<String> = Vec::new();
    let mut last = None;
    for (k, c) in folded.text.chars().enumerate() {
        if last == Some(folded.origin[k]) {
            if let Some(chunk) = out.last_mut() {
                chunk.push(c);
                continue;
            }
        }
        last = Some(folded.origin[k]);
        out.push(c.to_string());
    }
    out
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
    fn references_escapes_marks_and_look_alikes_are_decoded_before_the_views() {
        assert_eq!(
            plain("bob&#64;x&#x2E;nl &commat; &amp;#64; 06&#45;12"),
            "bob@x.nl @ @ 06-12"
        );
        assert_eq!(
            plain("bob%40x%2Enl %2540 caf%C3%A9 100% %zz"),
            "bob@x.nl @ café 100% %zz"
        );
        assert_eq!(
            plain("0\u{FE0F}\u{20E3}6\u{20E3} 1\u{305}2\u{332}"),
            "06 12"
        );
        assert_eq!(
            fold("\u{1D0F}\u{29F}\u{26A}\u{1D20}\u{26A}\u{1D00}"),
            fold("olivia")
        );
        assert_eq!(fold("\u{1F1F4}\u{1F1F1}"), fold("ol"));
        assert_eq!(plain("\u{2776}\u{1F51F}"), "110");
        // A reference maps back to all of itself.
        let text = "a&#64;b";
        let v = normalise(text);
        let at = v.plain.text.find('@').unwrap();
        assert_eq!(&text[v.plain.original(at..at + 1)], "&#64;");
    }

    #[test]
    fn joined_view_drops_breaks_inside_a_word_only() {
        assert_eq!(normalise("Oli\u{3000}via").joined.text, fold("olivia"));
        assert_eq!(normalise("Oli-\nvia").joined.text, fold("olivia"));
        assert_eq!(normalise("Oli- \r\n  via").joined.text, fold("olivia"));
        // An ordinary space, a hyphen without a line break, a break between
        // non-letters: kept.
        assert_eq!(normalise("Oli via").joined.text, fold("oli via"));
        assert_eq!(normalise("Oli-via").joined.text, fold("oli-via"));
        assert_eq!(normalise("12\u{3000}34").joined.text, "12 34");
        // Regional indicators glued to a word are a word of their own.
        let v = normalise("\u{1F1F3}\u{1F1F1}Anna");
        assert!(v.folded.name_boundary(v.folded.text.find('a').unwrap()));
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
        let v = &v.folded;
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
