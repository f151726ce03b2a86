//! A generated redaction corpus: identifiers of every class the redactor and
//! the gate must handle, with random values in random shapes, inside random
//! ordinary text (words in several scripts, dates, times, amounts, versions,
//! percentages, checksum-valid ISBNs, ticket/order/invoice numbers, room and
//! flight codes), and the scoring of a redactor and a gate against it.
//!
//! It depends on nothing of the crate (only `unicode-normalization`), so the
//! same corpus can score any redactor: the figures in docs/review.md for the
//! redactor before issue 12 came from this file too.

use std::collections::BTreeMap;

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// splitmix64: small, seedable, good enough to draw test values.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub(super) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    pub(super) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub(super) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }

    fn digits_in(&mut self, lo: usize, hi: usize) -> String {
        let n = self.range(lo, hi);
        self.digits(n)
    }

    fn letters(&mut self, pool: &str, lo: usize, hi: usize) -> String {
        let pool: Vec<char> = pool.chars().collect();
        (0..self.range(lo, hi)).map(|_| *self.pick(&pool)).collect()
    }
}

/// The people of the redaction list: realistic names (diacritics, particles,
/// hyphens, non-decomposing letters) and random ones.
pub(super) const PEOPLE: &[&str] = &[
    "Olivia Bakker",
    "Anna de Vries",
    "Łukasz Wróbel",
    "Jean-Pierre Dupont",
    "Søren Kierkegaard",
    "Élodie Ñúñez",
    "Bram Jansen",
    "Noah van der Berg",
    "María José García",
    "Dmitri Ivanov",
    "Zoë Hartmann",
    "Siobhán Murphy",
];

pub(super) fn people(rng: &mut Rng, random: usize) -> Vec<String> {
    let mut all: Vec<String> = PEOPLE
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    while all.len() < PEOPLE.len() + random {
        let name = format!("{} {}", syllable_name(rng), syllable_name(rng));
        if !VOCABULARY
            .iter()
            .any(|w| name.to_lowercase().contains(&w.to_lowercase()))
        {
            all.push(name);
        }
    }
    all
}

fn syllable_name(rng: &mut Rng) -> String {
    const ON: &[&str] = &[
        "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
    ];
    const NU: &[&str] = &["a", "e", "i", "o", "u", "é", "ö", "ai", "ou"];
    let mut s = String::new();
    for _ in 0..rng.range(2, 3) {
        s.push_str(rng.pick::<&str>(ON));
        s.push_str(rng.pick::<&str>(NU));
    }
    s.push_str(rng.pick::<&str>(&["n", "r", "s", "k", "l"]));
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => s,
    }
}

/// Ordinary words: none of them is, or holds, a name part of [`PEOPLE`].
pub(super) const VOCABULARY: &[&str] = &[
    "the",
    "bot",
    "answered",
    "wrongly",
    "please",
    "remind",
    "tomorrow",
    "meeting",
    "later",
    "thanks",
    "weather",
    "train",
    "ok",
    "yes",
    "no",
    "maybe",
    "kitchen",
    "garden",
    "ça",
    "déjà",
    "élan",
    "café",
    "naïve",
    "straße",
    "smörgåsbord",
    "niño",
    "日本語",
    "😀",
    "привет",
    "Ωμέγα",
    "mañana",
    "über",
    "façade",
    "—",
    "...",
    "!",
    "?",
    "(sic)",
    "«quoted»",
    "at",
    "dot",
    "net",
];

/// One ordinary token: a word, or a word followed by an ordinary number
/// (numbers never touch each other, as in prose).
fn ordinary(rng: &mut Rng) -> String {
    let word = rng.pick(VOCABULARY).to_string();
    if rng.chance(55) {
        return word;
    }
    let n = match rng.below(16) {
        0 => format!(
            "{}-{:02}-{:02}",
            rng.range(1990, 2030),
            rng.range(1, 12),
            rng.range(1, 28)
        ),
        1 => format!(
            "{:02}.{:02}.{}",
            rng.range(1, 28),
            rng.range(1, 12),
            rng.range(1990, 2030)
        ),
        2 => format!("{:02}:{:02}", rng.range(0, 23), rng.range(0, 59)),
        3 => format!("{}€{}.{:02}", "", rng.range(1, 9999), rng.range(0, 99)),
        4 => format!(
            "€ {} {:03} {:03},{:02}",
            rng.range(1, 99),
            rng.below(1000),
            rng.below(1000),
            rng.below(100)
        ),
        5 => format!("{} EUR", rng.range(1_000_000, 99_999_999)),
        6 => format!("{}.{}%", rng.range(0, 100), rng.below(10)),
        7 => format!(
            "v{}.{}.{}",
            rng.range(0, 20),
            rng.range(0, 40),
            rng.range(0, 200)
        ),
        8 => format!(
            "{}.0.{}.{}",
            rng.range(10, 130),
            rng.range(1000, 99999),
            rng.range(10, 9999)
        ),
        9 => format!("ISBN {}", isbn13(rng, true)),
        10 => isbn13(rng, false),
        11 => format!("ticket {}-{}", rng.range(2000, 2030), rng.digits_in(4, 8)),
        12 => format!("order #{}", rng.digits_in(7, 10)),
        13 => format!("invoice INV-{}-{}", rng.range(2000, 2030), rng.digits(6)),
        14 => format!("room {}", rng.pick(&["4.12", "B-1204", "12", "A3.07"])),
        _ => format!(
            "flight {}{}",
            rng.pick(&["KL", "AF", "BA", "LH", "U2"]),
            rng.range(10, 9999)
        ),
    };
    format!("{word} {n}")
}

/// A checksum-valid ISBN-13, hyphenated or not.
fn isbn13(rng: &mut Rng, hyphens: bool) -> String {
    let mut d: Vec<u32> = vec![9, 7, if rng.chance(50) { 8 } else { 9 }];
    d.extend((0..9).map(|_| rng.below(10) as u32));
    let sum: u32 = d
        .iter()
        .enumerate()
        .map(|(i, x)| if i % 2 == 0 { *x } else { 3 * x })
        .sum();
    d.push((10 - sum % 10) % 10);
    let s: String = d
        .iter()
        .map(|x| char::from_digit(*x, 10).unwrap_or('0'))
        .collect();
    if hyphens {
        format!(
            "{}-{}-{}-{}-{}",
            &s[..3],
            &s[3..4],
            &s[4..6],
            &s[6..12],
            &s[12..]
        )
    } else {
        s
    }
}

/// Separators that leaked in the incident, and the plain ones.
const SEPARATORS: &[&str] = &[
    "\u{2013}", "\u{2014}", "\u{2012}", "\u{2212}", "\u{2010}", "\u{2011}", "\u{FE63}", "\u{FF0D}",
    "\u{2009}", "\u{2002}", "\u{2007}", "\u{3000}", "\u{202F}", "\u{A0}", "\u{200B}", "\u{200D}",
    "\u{2060}", "\u{FEFF}", "\u{AD}", "\t", "_", "\u{B7}", "\u{30FB}", " ", "-", ".",
];

fn separator_run(rng: &mut Rng) -> String {
    let n = if rng.chance(70) { 1 } else { rng.range(2, 3) };
    (0..n).map(|_| *rng.pick(SEPARATORS)).collect()
}

/// Digit groups of a phone number (national, international, US).
fn phone_groups(rng: &mut Rng) -> (String, Vec<String>) {
    let mut rest: String = match rng.below(4) {
        0 => format!("0{}{}", rng.range(1, 9), rng.digits(8)),
        1 => format!("{}{}", rng.range(2, 9), rng.digits(9)),
        2 => format!("00{}{}", rng.range(1, 99), rng.digits(9)),
        _ => format!("{}{}", rng.range(1, 9), rng.digits_in(8, 10)),
    };
    let prefix = if rest.starts_with('0') || !rng.chance(60) {
        String::new()
    } else {
        "+".to_owned()
    };
    let mut groups = Vec::new();
    while !rest.is_empty() {
        let n = rng.range(1, 4).min(rest.len());
        groups.push(rest[..n].to_owned());
        rest = rest[n..].to_owned();
    }
    (prefix, groups)
}

fn join_groups(rng: &mut Rng, groups: &[String]) -> String {
    let mut s = String::new();
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            let mut sep = separator_run(rng);
            // A dot before a last group of one or two digits makes an amount
            // with cents ("it costs 1234567.50"), which the redactor keeps on
            // purpose: such a line plants no phone, so it is not generated.
            let dot_like = |c: char| matches!(c, '.' | '\u{B7}' | '\u{30FB}');
            while i + 1 == groups.len() && g.len() <= 2 && sep.contains(dot_like) {
                sep = separator_run(rng);
            }
            s.push_str(&sep);
        }
        s.push_str(g);
    }
    s
}

fn map_digits(s: &str, base: u32) -> String {
    s.chars()
        .map(|c| match c.to_digit(10) {
            Some(d) => char::from_u32(base + d).unwrap_or(c),
            None => c,
        })
        .collect()
}

fn lower_word(rng: &mut Rng, lo: usize, hi: usize) -> String {
    rng.letters("abcdefghijklnoprstuvwyz", lo, hi)
}

fn insert_soft_hyphens(rng: &mut Rng, s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        out.push(*c);
        if i + 1 < chars.len() && c.is_alphanumeric() && rng.chance(30) {
            out.push(*rng.pick(&['\u{AD}', '\u{200B}', '\u{200C}', '\u{2060}']));
        }
    }
    out
}

const CYRILLIC: &[(char, char)] = &[
    ('a', 'а'),
    ('e', 'е'),
    ('o', 'о'),
    ('p', 'р'),
    ('c', 'с'),
    ('x', 'х'),
    ('y', 'у'),
    ('A', 'А'),
    ('B', 'В'),
    ('E', 'Е'),
    ('H', 'Н'),
    ('K', 'К'),
    ('M', 'М'),
    ('O', 'О'),
    ('P', 'Р'),
    ('C', 'С'),
    ('T', 'Т'),
    ('X', 'Х'),
    ('i', 'і'),
    ('I', 'І'),
    ('j', 'ј'),
    ('s', 'ѕ'),
];
const GREEK: &[(char, char)] = &[
    ('A', 'Α'),
    ('B', 'Β'),
    ('E', 'Ε'),
    ('H', 'Η'),
    ('I', 'Ι'),
    ('K', 'Κ'),
    ('M', 'Μ'),
    ('N', 'Ν'),
    ('O', 'Ο'),
    ('P', 'Ρ'),
    ('T', 'Τ'),
    ('X', 'Χ'),
    ('Y', 'Υ'),
    ('Z', 'Ζ'),
    ('o', 'ο'),
    ('v', 'ν'),
    ('i', 'ι'),
];

/// Swaps letters for look-alikes; at least one when the name has any.
fn look_alike(rng: &mut Rng, s: &str, table: &[(char, char)]) -> String {
    let mut out = String::new();
    let mut swapped = false;
    for c in s.chars() {
        match table.iter().find(|(l, _)| *l == c) {
            Some((_, t)) if !swapped || rng.chance(50) => {
                out.push(*t);
                swapped = true;
            }
            _ => out.push(c),
        }
    }
    out
}

fn fullwidth(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '!'..='~' => char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c),
            ' ' => '\u{3000}',
            c => c,
        })
        .collect()
}

fn strip_marks(s: &str) -> String {
    s.nfd().filter(|c| !is_combining_mark(*c)).nfc().collect()
}

fn add_marks(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        out.push(c);
        if "aeiouAEIOU".contains(c) {
            out.push('\u{301}');
        }
    }
    out.nfc().collect()
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

const PARTICLES: &[&str] = &["de", "van", "der"];

/// Every class of identifier the corpus plants.
pub(super) const CLASSES: &[&str] = &[
    "phone: unicode separators",
    "phone: fullwidth or other digits",
    "phone: [msg N] disguise",
    "whatsapp: separators in local part",
    "email: plain",
    "email: no-dot domain",
    "email: fullwidth @ or ideographic full stop",
    "email: soft hyphen or zero-width inside",
    "email: (at) (dot) spelled out",
    "email: IP-literal domain",
    "name: whole",
    "name: first name",
    "name: surname part alone",
    "name: handle",
    "name: glued",
    "name: all caps",
    "name: NFD",
    "name: diacritics dropped",
    "name: diacritics added",
    "name: zero-width or soft hyphen inside",
    "name: Cyrillic look-alikes",
    "name: Greek look-alikes",
    "name: fullwidth",
    "phone: any punctuation between digits",
    "phone: bracketed groups",
    "phone: keycap digits",
    "phone: combining marks on digits",
    "phone: HTML character references",
    "phone: URL escapes",
    "email: HTML character references",
    "email: URL escapes",
    "name: spelled out letter by letter",
    "name: small capitals",
    "name: digits for letters",
    "name: regional indicators",
    "name: split by a foreign space",
    "name: hyphen and line break",
];

/// Punctuation a disguise puts between digit groups (issue 23): none of
/// them a letter, a digit, a comma, a colon, `%` or a currency sign.
const PUNCTUATION: &[&str] = &[
    "|", ";", "*", "'", "~", "+", "#", "!", "^", "\\", "»", "→", "’", "\"", "?", "<", ">", "😀",
    " ", "] [", ") (", "/",
];

/// A run of one to four punctuation characters (the most the matchers
/// join) that is not arithmetic written out (`1234 + 5678`), which the
/// redactor keeps on purpose.
fn punctuation_run(rng: &mut Rng) -> String {
    loop {
        let n = rng.range(1, 3);
        let run: String = (0..n).map(|_| *rng.pick(PUNCTUATION)).collect();
        if run.chars().count() <= 4 && ![" + ", " * "].iter().any(|a| run.contains(a)) {
            return run;
        }
    }
}

fn phone_digits(rng: &mut Rng) -> Vec<String> {
    let (_, groups) = phone_groups(rng);
    groups
}

/// Each character through `f`, groups joined by `sep`.
fn encode_groups(
    rng: &mut Rng,
    groups: &[String],
    mut digit: impl FnMut(&mut Rng, char) -> String,
    mut sep: impl FnMut(&mut Rng) -> String,
) -> String {
    let mut s = String::new();
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            s.push_str(&sep(rng));
        }
        for c in g.chars() {
            s.push_str(&digit(rng, c));
        }
    }
    s
}

fn html_reference(rng: &mut Rng, c: char) -> String {
    let r = match rng.below(3) {
        0 => format!("&#{};", c as u32),
        1 => format!("&#x{:X};", c as u32),
        _ => format!("&#x{:x};", c as u32),
    };
    if rng.chance(15) {
        r.replacen('&', "&amp;", 1)
    } else {
        r
    }
}

fn url_escape(rng: &mut Rng, c: char) -> String {
    let mut buf = [0u8; 4];
    let escaped: String = c
        .encode_utf8(&mut buf)
        .bytes()
        .map(|b| {
            if rng.chance(50) {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect();
    if rng.chance(15) {
        escaped.replacen('%', "%25", 1)
    } else {
        escaped
    }
}

fn small_capital(c: char) -> char {
    const SMALL: &[(char, char)] = &[
        ('a', '\u{1D00}'),
        ('b', '\u{0299}'),
        ('c', '\u{1D04}'),
        ('d', '\u{1D05}'),
        ('e', '\u{1D07}'),
        ('f', '\u{A730}'),
        ('g', '\u{0262}'),
        ('h', '\u{029C}'),
        ('i', '\u{026A}'),
        ('j', '\u{1D0A}'),
        ('k', '\u{1D0B}'),
        ('l', '\u{029F}'),
        ('m', '\u{1D0D}'),
        ('n', '\u{0274}'),
        ('o', '\u{1D0F}'),
        ('p', '\u{1D18}'),
        ('r', '\u{0280}'),
        ('s', '\u{A731}'),
        ('t', '\u{1D1B}'),
        ('u', '\u{1D1C}'),
        ('v', '\u{1D20}'),
        ('w', '\u{1D21}'),
        ('y', '\u{028F}'),
        ('z', '\u{1D22}'),
    ];
    let l = c.to_lowercase().next().unwrap_or(c);
    SMALL
        .iter()
        .find(|(a, _)| *a == l)
        .map(|(_, s)| *s)
        .unwrap_or(c)
}

/// A name part of four letters or more split at a random inner letter.
fn split_part(rng: &mut Rng, part: &str, with: &str) -> String {
    let chars: Vec<char> = part.chars().collect();
    let inner: Vec<usize> = (2..chars.len().saturating_sub(1))
        .filter(|&i| chars[i - 1].is_alphabetic() && chars[i].is_alphabetic())
        .collect();
    match inner.is_empty() {
        true => part.to_owned(),
        false => {
            let at = *rng.pick(&inner);
            let (a, b): (String, String) =
                (chars[..at].iter().collect(), chars[at..].iter().collect());
            format!("{a}{with}{b}")
        }
    }
}

/// The person's name with one part of four letters or more split by
/// `with` (the first such part, or the surname).
fn split_name(rng: &mut Rng, person: &str, with: &str) -> String {
    let parts: Vec<&str> = person.split(' ').collect();
    let candidates: Vec<usize> = (0..parts.len())
        .filter(|&i| parts[i].chars().filter(|c| c.is_alphabetic()).count() >= 4)
        .collect();
    let Some(&which) = candidates.get(rng.below(candidates.len().max(1))) else {
        return person.to_owned();
    };
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i == which {
                split_part(rng, p, with)
            } else {
                (*p).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One planted identifier: its class, the raw text, and what of it may stay
/// (the `@` of a handle, the `Mr.` of `Mr. X`: context, not identifier).
#[derive(Debug, Clone)]
pub(super) struct Planted {
    pub class: &'static str,
    pub raw: String,
    pub context_before: String,
    pub context_after: String,
}

fn planted(class: &'static str, raw: String) -> Planted {
    Planted {
        class,
        raw,
        context_before: String::new(),
        context_after: String::new(),
    }
}

/// A value of `class`, with a person drawn from `people` for names.
pub(super) fn identifier(rng: &mut Rng, class: &'static str, people: &[String]) -> Planted {
    let person = rng.pick(people).clone();
    let parts: Vec<&str> = person.split(' ').collect();
    let first = parts[0].to_owned();
    let surnames: Vec<&str> = parts[1..]
        .iter()
        .copied()
        .filter(|p| !PARTICLES.contains(p) && p.chars().count() >= 3)
        .collect();
    let last = surnames
        .last()
        .copied()
        .unwrap_or(parts[parts.len() - 1])
        .to_owned();
    match class {
        "phone: unicode separators" => {
            let (prefix, groups) = phone_groups(rng);
            planted(class, format!("{prefix}{}", join_groups(rng, &groups)))
        }
        "phone: fullwidth or other digits" => {
            let (prefix, groups) = phone_groups(rng);
            let base = *rng.pick(&[0xFF10, 0x660, 0x6F0, 0x966, 0x1D7CE]);
            planted(
                class,
                format!("{prefix}{}", map_digits(&join_groups(rng, &groups), base)),
            )
        }
        "phone: [msg N] disguise" => {
            let digits = format!("{}{}", rng.range(0, 9), rng.digits_in(8, 11));
            let shown = if rng.chance(40) {
                let groups: Vec<String> = digits
                    .as_bytes()
                    .chunks(3)
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect();
                join_groups(rng, &groups)
            } else {
                digits
            };
            let mut p = planted(class, shown);
            p.context_before = "[msg ".to_owned();
            p.context_after = "]".to_owned();
            p
        }
        "whatsapp: separators in local part" => {
            let (_, groups) = phone_groups(rng);
            let local = join_groups(rng, &groups).replace('+', "");
            let device = if rng.chance(30) {
                format!(":{}", rng.range(1, 40))
            } else {
                String::new()
            };
            let suffix = *rng.pick(&[
                "@s.whatsapp.net",
                "@lid",
                "@g.us",
                "@S.WHATSAPP.NET",
                "＠lid",
            ]);
            let platform = if rng.chance(30) { "whatsapp:" } else { "" };
            planted(class, format!("{platform}{local}{device}{suffix}"))
        }
        "email: plain" => planted(
            class,
            format!(
                "{}.{}@{}.{}",
                lower_word(rng, 2, 8),
                lower_word(rng, 2, 8),
                lower_word(rng, 3, 9),
                rng.pick(&["com", "org", "nl", "co.uk", "fr"])
            ),
        ),
        "email: no-dot domain" => planted(
            class,
            format!("{}@{}", lower_word(rng, 2, 9), lower_word(rng, 3, 9)),
        ),
        "email: fullwidth @ or ideographic full stop" => {
            let at = *rng.pick(&["＠", "@", "﹫"]);
            let dot = *rng.pick(&["。", "．", "｡", "."]);
            let (at, dot) = if at == "@" && dot == "." {
                ("＠", "。")
            } else {
                (at, dot)
            };
            planted(
                class,
                format!(
                    "{}{at}{}{dot}{}",
                    lower_word(rng, 2, 9),
                    lower_word(rng, 3, 9),
                    rng.pick(&["com", "nl", "de"])
                ),
            )
        }
        "email: soft hyphen or zero-width inside" => {
            let e = format!(
                "{}@{}.{}",
                lower_word(rng, 3, 9),
                lower_word(rng, 3, 9),
                rng.pick(&["com", "org", "eu"])
            );
            planted(class, insert_soft_hyphens(rng, &e))
        }
        "email: (at) (dot) spelled out" => {
            let at = *rng.pick(&[" (at) ", " [at] ", "(at)", " {at} ", " AT ", " at "]);
            let dot = if at.trim() == "at" || at.trim() == "AT" {
                *rng.pick(&[" dot ", " (dot) ", " DOT "])
            } else {
                *rng.pick(&[" (dot) ", " [dot] ", ".", " dot "])
            };
            planted(
                class,
                format!(
                    "{}{at}{}{dot}{}",
                    lower_word(rng, 3, 9),
                    lower_word(rng, 3, 9),
                    rng.pick(&["com", "org", "nl"])
                ),
            )
        }
        "email: IP-literal domain" => {
            let ip = format!(
                "{}.{}.{}.{}",
                rng.range(1, 254),
                rng.below(255),
                rng.below(255),
                rng.range(1, 254)
            );
            let domain = match rng.below(3) {
                0 => format!("[{ip}]"),
                1 => ip,
                _ => format!("[IPv6:2001:db8::{}]", rng.range(1, 9999)),
            };
            planted(class, format!("{}@{domain}", lower_word(rng, 2, 9)))
        }
        "name: whole" => planted(class, person.clone()),
        "name: first name" => planted(class, first),
        "name: surname part alone" => {
            let mut p = planted(class, last);
            if rng.chance(50) {
                p.context_before = rng.pick(&["Mr. ", "Ms. ", "Dr. ", "mevrouw "]).to_string();
            } else {
                p.context_after = rng.pick(&[" wrote", " said", " asked"]).to_string();
            }
            p
        }
        "name: handle" => {
            let sep = *rng.pick(&["_", ".", "-", ""]);
            let mut p = planted(
                class,
                format!("{}{sep}{}", first.to_lowercase(), last.to_lowercase()),
            );
            p.context_before = "@".to_owned();
            p
        }
        "name: glued" => planted(
            class,
            format!("{}{}", capitalise(&first), capitalise(&last)),
        ),
        "name: all caps" => planted(class, person.to_uppercase()),
        "name: NFD" => planted(class, person.nfd().collect()),
        "name: diacritics dropped" => planted(class, strip_marks(&person)),
        "name: diacritics added" => planted(class, add_marks(&strip_marks(&person))),
        "name: zero-width or soft hyphen inside" => {
            planted(class, insert_soft_hyphens(rng, &person))
        }
        "name: Cyrillic look-alikes" => planted(class, look_alike(rng, &person, CYRILLIC)),
        "name: Greek look-alikes" => {
            let upper = if rng.chance(50) {
                person.to_uppercase()
            } else {
                person.clone()
            };
            planted(class, look_alike(rng, &upper, GREEK))
        }
        "name: fullwidth" => planted(class, fullwidth(&person)),
        "phone: any punctuation between digits" => {
            let groups = phone_digits(rng);
            let s = encode_groups(rng, &groups, |_, c| c.to_string(), punctuation_run);
            planted(class, s)
        }
        "phone: bracketed groups" => {
            let groups = phone_digits(rng);
            let (open, close) = *rng.pick(&[("[", "]"), ("{", "}"), ("<", ">"), ("⟨", "⟩")]);
            let gap = *rng.pick(&["", " ", "  ", "-"]);
            let inner = groups.join(&format!("{close}{gap}{open}"));
            let mut p = planted(class, inner);
            p.context_before = open.to_owned();
            p.context_after = close.to_owned();
            p
        }
        "phone: keycap digits" => {
            let groups = phone_digits(rng);
            let s = encode_groups(
                rng,
                &groups,
                |rng, c| {
                    if rng.chance(80) {
                        format!("{c}\u{FE0F}\u{20E3}")
                    } else {
                        format!("{c}\u{20E3}")
                    }
                },
                |rng| rng.pick(&["", "", " ", "-"]).to_string(),
            );
            planted(class, s)
        }
        "phone: combining marks on digits" => {
            let groups = phone_digits(rng);
            let s = encode_groups(
                rng,
                &groups,
                |rng, c| {
                    let marks = [
                        '\u{305}', '\u{332}', '\u{336}', '\u{338}', '\u{20DD}', '\u{301}',
                        '\u{335}', '\u{20E0}', '\u{33F}',
                    ];
                    let mut s = c.to_string();
                    for _ in 0..rng.range(1, 2) {
                        s.push(*rng.pick(&marks));
                    }
                    s
                },
                |rng| {
                    if rng.chance(50) {
                        String::new()
                    } else {
                        rng.pick(&[" ", "-", "\u{2009}"]).to_string()
                    }
                },
            );
            planted(class, s)
        }
        "phone: HTML character references" => {
            let groups = phone_digits(rng);
            let s = encode_groups(
                rng,
                &groups,
                |rng, c| {
                    if rng.chance(30) {
                        html_reference(rng, c)
                    } else {
                        c.to_string()
                    }
                },
                |rng| {
                    let sep = *rng.pick(&[
                        "&#45;",
                        "&#x2D;",
                        "&#32;",
                        "&nbsp;",
                        "&hyphen;",
                        "&#x20;",
                        "&minus;",
                        "&ndash;",
                        "&amp;#45;",
                        "&#124;",
                        "&verbar;",
                    ]);
                    sep.to_owned()
                },
            );
            planted(class, s)
        }
        "phone: URL escapes" => {
            let groups = phone_digits(rng);
            let s = encode_groups(
                rng,
                &groups,
                |rng, c| {
                    if rng.chance(30) {
                        url_escape(rng, c)
                    } else {
                        c.to_string()
                    }
                },
                |rng| {
                    let sep = *rng.pick(&[
                        "%20",
                        "%2D",
                        "%2d",
                        "%E2%80%93",
                        "%C2%A0",
                        "%2520",
                        "%7C",
                        "%3B",
                    ]);
                    sep.to_owned()
                },
            );
            planted(class, s)
        }
        "email: HTML character references" => {
            let at = html_reference(rng, '@');
            let at = *rng.pick(&[at.as_str(), "&commat;"]);
            let dot = html_reference(rng, '.');
            let dot = *rng.pick(&[dot.as_str(), "&period;", "."]);
            planted(
                class,
                format!(
                    "{}{at}{}{dot}{}",
                    lower_word(rng, 2, 9),
                    lower_word(rng, 3, 9),
                    rng.pick(&["com", "org", "nl"])
                ),
            )
        }
        "email: URL escapes" => {
            let at = url_escape(rng, '@');
            let dot = url_escape(rng, '.');
            let dot = *rng.pick(&[dot.as_str(), "."]);
            planted(
                class,
                format!(
                    "{}{at}{}{dot}{}",
                    lower_word(rng, 2, 9),
                    lower_word(rng, 3, 9),
                    rng.pick(&["com", "org", "nl"])
                ),
            )
        }
        "name: spelled out letter by letter" => {
            let sep = *rng.pick(&[" ", ".", "-", " . ", "_", "*", "\u{B7}", ". ", "  "]);
            let which = if rng.chance(50) { &first } else { &person };
            let letters: Vec<String> = which
                .chars()
                .filter(|c| c.is_alphabetic())
                .map(|c| c.to_string())
                .collect();
            planted(class, letters.join(sep))
        }
        "name: small capitals" => {
            let which = if rng.chance(50) { &first } else { &person };
            planted(
                class,
                strip_marks(which).chars().map(small_capital).collect(),
            )
        }
        "name: digits for letters" => {
            let plain = strip_marks(&person);
            let eligible = |c: char| "oOiIlLeEaAsStT".contains(c);
            let letters = plain.chars().filter(|c| c.is_alphabetic()).count();
            let digit = |c: char| match c.to_ascii_lowercase() {
                'o' => '0',
                'i' | 'l' => '1',
                'e' => '3',
                'a' => '4',
                's' => '5',
                _ => '7',
            };
            loop {
                let mut swapped = 0;
                let out: String = plain
                    .chars()
                    .map(|c| {
                        if eligible(c) && rng.chance(50) && (swapped + 1) * 2 <= letters {
                            swapped += 1;
                            digit(c)
                        } else {
                            c
                        }
                    })
                    .collect();
                if swapped > 0 {
                    break planted(class, out);
                }
            }
        }
        "name: regional indicators" => {
            let mut which = strip_marks(&first);
            for _ in 0..50 {
                if which.chars().all(|c| c.is_ascii_alphabetic()) {
                    break;
                }
                let other = rng.pick(people).clone();
                which = strip_marks(other.split(' ').next().unwrap_or_default());
            }
            let flags: String = which
                .chars()
                .map(|c| {
                    let i = c.to_ascii_uppercase() as u32 - 'A' as u32;
                    char::from_u32(0x1F1E6 + i).unwrap_or(c)
                })
                .collect();
            planted(class, flags)
        }
        "name: split by a foreign space" => {
            let with = *rng.pick(&["\u{3000}", "\u{A0}", "\u{2009}", "\u{202F}", "\u{2002}"]);
            planted(class, split_name(rng, &person, with))
        }
        "name: hyphen and line break" => {
            let with = *rng.pick(&["-\n", "- \n", "\u{2010}\n", "-\n  "]);
            planted(class, split_name(rng, &person, with))
        }
        other => panic!("unknown class {other}"),
    }
}

const LEFT: &[&str] = &["", "", "(", "«", "\"", "¿", "<", "— "];
const RIGHT: &[&str] = &[
    "", "", ")", "»", "\"", ",", ".", "!", "?", "'s", "’s", ":", ";", "…", ">",
];

/// A marker word: consonants only, so it is no name, word or identifier.
fn marker(rng: &mut Rng) -> String {
    format!("q{}", rng.letters("bcdfghjkpqrstvwxz", 7, 7))
}

/// One line of the corpus and what was planted where.
#[derive(Debug, Clone)]
pub(super) struct Line {
    pub text: String,
    /// Each planted identifier with its decorations and the markers around it.
    pub planted: Vec<Slot>,
    /// The ordinary tokens, in order.
    pub ordinary: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub id: Planted,
    pub left: String,
    pub right: String,
    pub before: String,
    pub after: String,
}

/// A line of `words` ordinary tokens with the given identifiers planted at
/// random places, each between two marker words.
pub(super) fn line(rng: &mut Rng, ids: Vec<Planted>, words: usize) -> Line {
    let mut pieces: Vec<(bool, String)> = (0..words).map(|_| (true, ordinary(rng))).collect();
    let mut slots = Vec::new();
    for id in ids {
        let slot = Slot {
            left: rng.pick(LEFT).to_string(),
            right: rng.pick(RIGHT).to_string(),
            before: marker(rng),
            after: marker(rng),
            id,
        };
        let at = rng.below(pieces.len() + 1);
        // The `;` on each side keeps the markers out of any identifier shape
        // the ordinary words around them could form (`<marker> at 2018-10-26
        // dot flight` is a spelled-out email), so a marker always bounds
        // its slot.
        let text = format!(
            "; {} {}{}{}{}{} {};",
            slot.before,
            slot.left,
            slot.id.context_before,
            slot.id.raw,
            slot.id.context_after,
            slot.right,
            slot.after
        );
        pieces.insert(at, (false, text));
        slots.push(slot);
    }
    let ordinary = pieces
        .iter()
        .filter(|(o, _)| *o)
        .map(|(_, t)| t.clone())
        .collect();
    let text = pieces
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(" ");
    Line {
        text,
        planted: slots,
        ordinary,
    }
}

/// The corpus: `per_class` lines for each class, each planting one value.
pub(super) fn corpus(rng: &mut Rng, people: &[String], per_class: usize) -> Vec<Line> {
    let mut out = Vec::new();
    for class in CLASSES {
        for _ in 0..per_class {
            let id = identifier(rng, class, people);
            let words = rng.range(3, 12);
            out.push(line(rng, vec![id], words));
        }
    }
    out
}

fn is_placeholder_at(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('[')?;
    let close = rest.find(']')?;
    let inner = &rest[..close];
    let (kind, n) = inner.split_once('_')?;
    let known = ["PHONE", "WA", "EMAIL", "SENDER", "PERSON"].contains(&kind);
    (known && !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())).then_some(close + 2)
}

/// `text` with every placeholder replaced by `with`.
pub(super) fn without_placeholders(text: &str, with: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < text.len() {
        if let Some(n) = is_placeholder_at(&text[i..]) {
            out.push_str(with);
            i += n;
            continue;
        }
        let c = text[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn squeeze(s: &str) -> String {
    s.chars()
        .filter(|c| {
            !c.is_whitespace() && !"\u{200B}\u{200C}\u{200D}\u{2060}\u{FEFF}\u{AD}".contains(*c)
        })
        .collect()
}

/// Is every planted identifier of `line` gone from `out`? Per slot: the text
/// between its two markers, placeholders removed, must be exactly its
/// decorations and context.
pub(super) fn slot_redacted(slot: &Slot, out: &str) -> bool {
    let clean = without_placeholders(out, "");
    let Some(a) = clean.find(&slot.before) else {
        return false;
    };
    let from = a + slot.before.len();
    let Some(b) = clean[from..].find(&slot.after) else {
        return false;
    };
    let residue = &clean[from..from + b];
    squeeze(residue)
        == squeeze(&format!(
            "{}{}{}{}",
            slot.left, slot.id.context_before, slot.id.context_after, slot.right
        ))
}

/// How many ordinary tokens of `line` are in `out`, verbatim and in order.
pub(super) fn kept_tokens(line: &Line, out: &str) -> usize {
    let clean = without_placeholders(out, "\u{1}");
    let mut at = 0;
    let mut kept = 0;
    for token in &line.ordinary {
        if let Some(i) = clean[at..].find(token.as_str()) {
            kept += 1;
            at += i + token.len();
        }
    }
    kept
}

/// Figures of one run over a corpus.
#[derive(Debug, Default, Clone)]
pub(super) struct Figures {
    /// class → (planted, redacted by the redactor, flagged by the gate raw)
    pub per_class: BTreeMap<&'static str, (usize, usize, usize)>,
    pub ordinary: usize,
    pub kept: usize,
    pub lines: usize,
    /// Redacted lines the gate still blocks (kept ordinary numbers, mostly).
    pub redacted_lines_blocked: usize,
}

impl Figures {
    pub(super) fn planted(&self) -> usize {
        self.per_class.values().map(|v| v.0).sum()
    }
    pub(super) fn redacted(&self) -> usize {
        self.per_class.values().map(|v| v.1).sum()
    }
    pub(super) fn gated(&self) -> usize {
        self.per_class.values().map(|v| v.2).sum()
    }
    pub(super) fn recall(&self) -> f64 {
        self.redacted() as f64 / self.planted().max(1) as f64
    }
    pub(super) fn gate_recall(&self) -> f64 {
        self.gated() as f64 / self.planted().max(1) as f64
    }
    pub(super) fn kept_ratio(&self) -> f64 {
        self.kept as f64 / self.ordinary.max(1) as f64
    }

    pub(super) fn report(&self, title: &str) -> String {
        let mut s = format!(
            "{title}: {} lines, {} identifiers; redactor recall {:.1}% ({}/{}), gate on raw lines {:.1}% ({}/{}), ordinary tokens kept {:.1}% ({}/{}), redacted lines the gate blocks {}\n",
            self.lines,
            self.planted(),
            100.0 * self.recall(),
            self.redacted(),
            self.planted(),
            100.0 * self.gate_recall(),
            self.gated(),
            self.planted(),
            100.0 * self.kept_ratio(),
            self.kept,
            self.ordinary,
            self.redacted_lines_blocked,
        );
        for (class, (n, r, g)) in &self.per_class {
            s.push_str(&format!(
                "  {class:<45} redacted {r:>3}/{n:<3} gated {g:>3}/{n}\n"
            ));
        }
        s
    }
}

/// Scores a redactor (`redact`: line → output) and a gate (`blocks`: text →
/// flagged) on `lines`; `blocks_redacted` gates the redactor's output (only
/// for the figure of redacted lines still blocked).
pub(super) fn evaluate(
    lines: &[Line],
    mut redact: impl FnMut(&str) -> String,
    mut blocks: impl FnMut(&str) -> bool,
    mut blocks_redacted: impl FnMut(&str) -> bool,
) -> (Figures, Vec<String>) {
    let mut f = Figures {
        lines: lines.len(),
        ..Default::default()
    };
    let mut misses = Vec::new();
    for line in lines {
        let out = redact(&line.text);
        let raw_blocked = blocks(&line.text);
        for slot in &line.planted {
            let e = f.per_class.entry(slot.id.class).or_default();
            e.0 += 1;
            if slot_redacted(slot, &out) {
                e.1 += 1;
            } else {
                misses.push(format!(
                    "redactor missed {}: {:?} → {:?}",
                    slot.id.class, line.text, out
                ));
            }
            if raw_blocked {
                e.2 += 1;
            } else {
                misses.push(format!("gate passed {}: {:?}", slot.id.class, line.text));
            }
        }
        f.ordinary += line.ordinary.len();
        f.kept += kept_tokens(line, &out);
        if blocks_redacted(&out) {
            f.redacted_lines_blocked += 1;
        }
    }
    (f, misses)
}
