//! The fixed shapes, matched on the plain view: phone numbers, WhatsApp ids,
//! e-mail addresses, and the ordinary numbers that are not phones.
//!
//! A phone candidate is a run of digits joined by up to four separators in a
//! row (anything but a letter, a digit, a line break, a currency sign, `,`,
//! `:` and `%`: spaces, dashes, dots, `|`, `;`, `*`, `'`, `~`, `+`,
//! brackets, emoji; the plain view has already decoded references and
//! escapes and dropped invisible characters and marks), with seven digits
//! or more. Isolated dates and times are hidden
//! from it first, for the redactor and the gate alike. The redactor also
//! leaves ordinary numbers alone: amounts, percentages, versions, checksum-
//! valid ISBNs, and numbers introduced by order/ticket/invoice/booking/room/
//! flight words. The gate does not: it only knows the shapes the report
//! renders (dates, times, `[msg N]` of the ids it was given).
//!
//! Must never: take a line break as a separator (no match spans lines), or
//! leave a digit of a WhatsApp id's local part behind its `@` suffix.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// Fewer digits than this is a count, a year or a short code, not a phone.
pub(super) const MIN_PHONE_DIGITS: usize = 7;
/// Separators in a row that still join two digit groups.
const MAX_SEPARATORS: usize = 4;

/// What joins two digit groups of one number: anything but a letter, a
/// digit, a control character (a line break), a currency sign, `,`, `:` or
/// `%` (how amounts, counts, times and percentages are written). So `|`,
/// `;`, `*`, `'`, `~`, `+`, brackets and emoji join digits like spaces and
/// dashes do.
const SEPARATOR_CLASS: &str = r"[^\p{L}\p{N}\p{M}\p{Cc}\p{Sc}\p{Zl}\p{Zp},:%‰]";

static SEPARATOR: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(&format!("^{SEPARATOR_CLASS}$")));

fn is_separator(c: char) -> bool {
    if c.is_ascii() {
        return !c.is_ascii_alphanumeric()
            && !c.is_ascii_control()
            && !matches!(c, ',' | ':' | '%' | '$');
    }
    let mut buf = [0u8; 4];
    SEPARATOR.is_match(c.encode_utf8(&mut buf))
}

/// Wide on purpose (any Unicode number): used to count digits and to decide
/// what not to hide, so erring wide errs towards redaction.
pub(super) fn is_digit(c: char) -> bool {
    c.is_numeric()
}

// The statics below are compiled from constant patterns. A failure is a bug
// in this file, caught by every test on first use, so it behaves like a
// start-up assertion rather than a runtime error path.

static CANDIDATE: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(&format!(r"\+?\(?\d(?:{SEPARATOR_CLASS}{{0,4}}\d)*")));

/// Arithmetic written out (`1234 + 5678`, `12 * 34 = 408`): the redactor
/// keeps it, the gate does not.
static ARITHMETIC: LazyLock<Regex> = LazyLock::new(|| super::constant_regex(r"\s[+*×÷=]\s|="));

static TIME: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(r"(?:[01]?[0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9])?(?:\.[0-9]{1,3})?")
});

// Longer alternatives first: the engine is leftmost-first, so `0?[1-9]`
// ahead of `[12][0-9]` would stop a day at its first digit.
static DATE: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?:19|20)[0-9]{2}[-/.](?:1[0-2]|0?[1-9])[-/.](?:3[01]|[12][0-9]|0?[1-9])",
        r"|(?:3[01]|[12][0-9]|0?[1-9])[-/.](?:1[0-2]|0?[1-9])[-/.](?:19|20)[0-9]{2}",
        r"|(?:1[0-2]|0?[1-9])[-/.](?:3[01]|[12][0-9]|0?[1-9])[-/.](?:19|20)[0-9]{2}",
    ))
});

static UUID: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    )
});

/// Message ids as the report and the judge write them.
static MESSAGE_ID: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(r#"\[msg ([0-9]{1,18})\]|"(?:message_id|reply_id)" ?: ?([0-9]{1,18})"#)
});

static CURRENCY_BEFORE: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)(?:\p{Sc}|\b(?:eur|usd|gbp|chf|jpy|cny|rmb|inr|aud|cad|nzd|sek|nok|dkk|pln|czk|",
        r"huf|brl|mxn|zar|rub|try|krw|sgd|hkd|idr|thb|php|ils|aed|sar|kr|rs)\.?) ?-?$",
    ))
});

static CURRENCY_AFTER: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)^(?:[,.][0-9]{1,2})? ?(?:\p{Sc}|(?:eur|usd|gbp|chf|jpy|cny|rmb|inr|aud|cad|nzd|sek|",
        r"nok|dkk|pln|czk|huf|brl|mxn|zar|rub|sgd|hkd|euros?|dollars?|pounds?|francs?|yen|yuan|",
        r"rupees?|pesos?|kronor|kroner|kronen|zlotys?|lira|rand|roubles?|rubles?)\b)",
    ))
});

static PERCENT_AFTER: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r"(?i)^(?:[,.][0-9]+)? ?(?:%|‰|percent\b|per cent\b|pct\b|procent\b|prozent\b)",
    )
});

static VERSION_BEFORE: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r"(?i)(?:\bv|\bversion|\bver\.?|\bbuild|\brelease|\brel\.?|\bfirmware|\bupdate) ?[:#]? ?$",
    )
});

/// A number introduced by a word that says what it is: kept by the redactor.
static KEYWORD_BEFORE: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)\b(?:orders?|ticket|invoice|inv|case|ref|reference|booking|reservation|",
        r"confirmation|tracking|receipt|transaction|room|flight|bestelling|bestelnummer|",
        r"factuur|kamer|vlucht|commande|facture|chambre|vol|bestellung|rechnung|zimmer|flug|",
        r"pedido|factura|vuelo|ordine|fattura|volo)",
        r"(?: ?(?:no\.?|nr\.?|number|num\.?|n°|nº|#|id))? ?[:#]? ?(?:[a-z]{1,4}[-/ ]?)?$",
    ))
});

static ISBN_BEFORE: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"(?i)\bisbn(?:-?1[03])? ?:? ?$"));

static DECIMAL: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"^[1-9][0-9]*\.[0-9]{1,2}$"));

static WHATSAPP_SUFFIX: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(r"(?i)@(?:s\.whatsapp\.net|g\.us|c\.us|lid|broadcast|newsletter)")
});

/// A quoted local part neither starts nor ends with a space, so the closing
/// quote of one phrase and the opening quote of the next (`"a" and "@b`) are
/// not taken for one.
static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(
        r#"(?:"[^"\s](?:[^"\n]{0,62}[^"\s])?"|[\w.%+\-]+)@(?:\[(?:IPv6:)?[0-9a-fA-F:.]{2,64}\]|[\w\-]+(?:\.[\w\-]+)*)"#,
    )
});

/// `name (at) example (dot) com`, `name [at] example.com`, `name(at)host`.
static BRACKET_AT: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)[\w.%+\-]+ *[(\[{<] *at *[)\]}>] *[\w\-]+",
        // A plain `.` only when a label follows at once: `x [at] y.com. Next`.
        r"(?: *(?:[(\[{<] *(?:dot|punt|punkt|point) *[)\]}>]| +dot +) *[\w\-]+|\.[\w\-]+)*",
    ))
});

/// `name at example dot com`: bare words, so a spelled-out dot is required,
/// and the last label must look like a top-level domain (two to six ASCII
/// letters).
static WORD_AT: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)[\w.%+\-]+ +at +[\w\-]+",
        r"(?: *(?:[(\[{<] *dot *[)\]}>]| +dot +) *[\w\-]+)*",
        r"(?: *(?:[(\[{<] *dot *[)\]}>]| +dot +) *[a-z]{2,6})\b",
    ))
});

/// Gate only: an `@` or `(at)` followed by something that looks like a host.
static GATE_AT_HOST: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)(?:@|[(\[{<] *at *[)\]}>]) *",
        // A host: an IP literal, four numbers (IPv4), or labels whose last
        // one holds a letter (`@ 12.50` is a price).
        r"(?:\[(?:IPv6:)?[0-9a-fA-F:.]{2,64}\]|[0-9]{1,3}(?: *\. *[0-9]{1,3}){3}",
        r"|(?:[\w\-]+ *(?:\.|[(\[{<] *dot *[)\]}>]) *)+[\w\-]*\p{L}[\w\-]*)",
        r"|\w@\w|[(\[{<] *at *[)\]}>] *\w",
    ))
});

/// Gate only: a WhatsApp suffix, however spaced.
static GATE_WHATSAPP: LazyLock<Regex> = LazyLock::new(|| {
    super::constant_regex(concat!(
        r"(?i)@ *(?:lid\b|s *\. *whatsapp|g *\. *us\b|c *\. *us\b)",
        r"|whatsapp *\. *net",
    ))
});

/// A control character: never in the plain view, never a separator, so a
/// hidden date or id is a barrier no digit run crosses.
const MASK: char = '\u{1}';

fn mask_ranges(buf: &mut String, ranges: &[Range<usize>]) {
    if ranges.is_empty() {
        return;
    }
    let mut out = String::with_capacity(buf.len());
    let mut last = 0;
    for r in ranges {
        out.push_str(&buf[last..r.start]);
        // One mask character per byte keeps every offset valid.
        out.extend(std::iter::repeat_n(MASK, r.len()));
        last = r.end;
    }
    out.push_str(&buf[last..]);
    *buf = out;
}

fn mask_where(buf: &mut String, re: &Regex, keep: impl Fn(&str, &str) -> bool) {
    let ranges: Vec<Range<usize>> = re
        .find_iter(buf)
        .filter(|m| keep(&buf[..m.start()], &buf[m.end()..]))
        .map(|m| m.range())
        .collect();
    mask_ranges(buf, &ranges);
}

/// The separators a number is written with in prose (space, `-`, `.`, `/`,
/// brackets, `_`): a date is run into another number only through these,
/// so `[msg 123] 2026-11-29` stays an id and a date.
fn is_prose_separator(c: char) -> bool {
    matches!(c, ' ' | '-' | '.' | '/' | '(' | ')' | '_')
}

/// Would a phone candidate running through this side pick up more digits?
fn reaches_digit(mut chars: impl Iterator<Item = char>) -> bool {
    for _ in 0..=MAX_SEPARATORS {
        match chars.next() {
            Some(c) if is_digit(c) || c == '+' => return true,
            Some(c) if is_prose_separator(c) => continue,
            _ => return false,
        }
    }
    false
}

/// Hides the shapes both the redactor and the gate know are not phones:
/// message ids the caller vouches for, then isolated times, then dates no
/// digit could join into a longer number (ambiguity is redacted).
fn mask_known(plain: &str, known_ids: Option<&BTreeSet<i64>>) -> String {
    let mut buf = plain.to_owned();
    if let Some(ids) = known_ids {
        let ranges: Vec<Range<usize>> = MESSAGE_ID
            .captures_iter(&buf)
            .filter_map(|c| {
                let n = c.get(1).or_else(|| c.get(2))?;
                let id: i64 = n.as_str().parse().ok()?;
                ids.contains(&id).then(|| n.range())
            })
            .collect();
        mask_ranges(&mut buf, &ranges);
    }
    mask_where(&mut buf, &TIME, |before, after| {
        !before.ends_with(|c: char| is_digit(c) || c == ':' || c == '.')
            && !after.starts_with(|c: char| is_digit(c) || c == ':')
    });
    // Judge each date with every other date already hidden, so a range such
    // as "2026-11-29 - 2026-11-30" is two dates rather than one long number.
    let mut dates_hidden = buf.clone();
    mask_where(&mut dates_hidden, &DATE, |_, _| true);
    let isolated: Vec<Range<usize>> = DATE
        .find_iter(&buf)
        .map(|m| m.range())
        .filter(|r| {
            !reaches_digit(dates_hidden[..r.start].chars().rev())
                && !reaches_digit(dates_hidden[r.end..].chars())
        })
        .collect();
    mask_ranges(&mut buf, &isolated);
    buf
}

/// Digit runs of seven digits or more in `masked`, with the prose
/// parenthesis of `(0612345678)` left out.
fn long_runs(masked: &str) -> Vec<Range<usize>> {
    CANDIDATE
        .find_iter(masked)
        .filter_map(|m| {
            let candidate = m.as_str();
            if candidate.chars().filter(|c| is_digit(*c)).count() < MIN_PHONE_DIGITS {
                return None;
            }
            let start = if candidate.starts_with('(') && !candidate.contains(')') {
                m.start() + 1
            } else {
                m.start()
            };
            Some(start..m.end())
        })
        .collect()
}

/// Phone numbers, as the redactor takes them (ordinary numbers kept).
pub(super) fn phone_spans(plain: &str) -> Vec<Range<usize>> {
    let mut masked = mask_known(plain, None);
    mask_where(&mut masked, &UUID, |before, after| {
        let joined = |c: char| c.is_ascii_alphanumeric() || c == '-';
        !before.ends_with(joined) && !after.starts_with(joined)
    });
    long_runs(&masked)
        .into_iter()
        .filter(|r| !is_ordinary_number(plain, r.clone()))
        .collect()
}

/// Gate: every run of seven digits or more outside the shapes it knows.
pub(super) fn gate_digit_runs(plain: &str, known_ids: Option<&BTreeSet<i64>>) -> bool {
    !long_runs(&mask_known(plain, known_ids)).is_empty()
}

fn ascii_digits(s: &str) -> Option<Vec<u32>> {
    s.chars()
        .filter(|c| !is_separator(*c))
        .map(|c| c.to_digit(10))
        .collect()
}

fn isbn13(d: &[u32]) -> bool {
    d.len() == 13
        && (d.starts_with(&[9, 7, 8]) || d.starts_with(&[9, 7, 9]))
        && d.iter()
            .enumerate()
            .map(|(i, x)| if i % 2 == 0 { *x } else { 3 * x })
            .sum::<u32>()
            .is_multiple_of(10)
}

fn isbn10(d: &[u32], x_check: bool) -> bool {
    let (body, check) = match (d.len(), x_check) {
        (10, false) => (&d[..9], d[9]),
        (9, true) => (d, 10),
        _ => return false,
    };
    let sum: u32 = body
        .iter()
        .enumerate()
        .map(|(i, x)| (10 - i as u32) * x)
        .sum();
    (sum + check).is_multiple_of(11)
}

/// A dotted run such as `10.0.19045.2965`: three parts or more, no leading
/// zeros, a single-digit part after the first (phones written with dots have
/// groups of two or more, a leading zero, or only a country code of one).
fn looks_like_version(candidate: &str) -> bool {
    if !candidate.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return false;
    }
    let parts: Vec<&str> = candidate.split('.').collect();
    parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && (p.len() == 1 || !p.starts_with('0')))
        && parts[1..].iter().any(|p| p.len() == 1)
}

/// Dates and times are hidden before; this is the rest of ordinary text.
fn is_ordinary_number(plain: &str, r: Range<usize>) -> bool {
    let candidate = &plain[r.clone()];
    let before = &plain[..r.start];
    let before = &before[floor_char(before, before.len().saturating_sub(48))..];
    let after = &plain[r.end..];
    let after = &after[..ceil_char(after, after.len().min(48))];
    if candidate.starts_with('+') {
        // An international prefix is a phone whatever the words around it.
        return false;
    }
    if ARITHMETIC.is_match(candidate) {
        return true;
    }
    if KEYWORD_BEFORE.is_match(before)
        || CURRENCY_BEFORE.is_match(before)
        || CURRENCY_AFTER.is_match(after)
        || PERCENT_AFTER.is_match(after)
        || DECIMAL.is_match(candidate)
    {
        return true;
    }
    if VERSION_BEFORE.is_match(before) || looks_like_version(candidate) {
        return true;
    }
    if let Some(d) = ascii_digits(candidate) {
        if candidate
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == ' ')
        {
            if isbn13(&d) {
                return true;
            }
            let x_check = after.starts_with(['X', 'x']);
            if ISBN_BEFORE.is_match(before) && (isbn10(&d, x_check) || isbn13(&d)) {
                return true;
            }
        }
    }
    false
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A WhatsApp suffix must end there: `@lidl.de` or `@g.us.example.org` is an
/// e-mail domain, left for the e-mail pass to take whole.
fn whatsapp_tail_ends(rest: &str) -> bool {
    let mut chars = rest.chars();
    match chars.next() {
        None => true,
        Some(c) if is_word_char(c) => false,
        Some('.') => !chars.next().is_some_and(is_word_char),
        Some(_) => true,
    }
}

fn is_local_char(c: char) -> bool {
    is_word_char(c) || matches!(c, '.' | ':' | '+' | '-')
}

/// Where the local part before a WhatsApp suffix starts: word characters,
/// and digit groups joined by separators (`31 6 1234 5678@lid`), so no digit
/// is left behind.
fn local_part_start(plain: &str, at: usize) -> usize {
    let mut start = at;
    loop {
        let run_start = plain[..start]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_local_char(*c))
            .last()
            .map(|(i, _)| i)
            .unwrap_or(start);
        let begins_with_digit = plain[run_start..at]
            .chars()
            .find(|c| c.is_alphanumeric())
            .is_some_and(is_digit);
        start = run_start;
        if !begins_with_digit {
            return start;
        }
        // Separators, then a digit: the same number goes on.
        let mut seps = 0;
        let mut next = start;
        for (i, c) in plain[..start].char_indices().rev() {
            if is_separator(c) && seps < MAX_SEPARATORS {
                seps += 1;
                next = i;
                continue;
            }
            if seps > 0 && (is_digit(c) || c == '+') {
                break;
            }
            return start;
        }
        if next == start || next == 0 {
            return start;
        }
        start = next;
    }
}

/// WhatsApp ids: any local part (or none) before a WhatsApp suffix.
pub(super) fn whatsapp_spans(plain: &str) -> Vec<Range<usize>> {
    WHATSAPP_SUFFIX
        .find_iter(plain)
        .filter(|m| whatsapp_tail_ends(&plain[m.end()..]))
        .map(|m| local_part_start(plain, m.start())..m.end())
        .collect()
}

pub(super) fn email_spans(plain: &str) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = EMAIL.find_iter(plain).map(|m| m.range()).collect();
    out.extend(BRACKET_AT.find_iter(plain).map(|m| m.range()));
    out.extend(WORD_AT.find_iter(plain).map(|m| m.range()));
    out
}

/// Gate only: what the e-mail and WhatsApp patterns might have missed.
pub(super) fn gate_at_host(plain: &str) -> bool {
    GATE_AT_HOST.is_match(plain)
}

pub(super) fn gate_whatsapp(plain: &str) -> bool {
    GATE_WHATSAPP.is_match(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phones(text: &str) -> Vec<&str> {
        phone_spans(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn isbn_checksums() {
        assert!(isbn13(&ascii_digits("978-0-306-40615-7").unwrap()));
        assert!(!isbn13(&ascii_digits("978-0-306-40615-8").unwrap()));
        assert!(isbn10(&ascii_digits("0-306-40615-2").unwrap(), false));
        assert!(isbn10(&ascii_digits("0-8044-2957").unwrap(), true));
    }

    #[test]
    fn ordinary_numbers_are_not_phones() {
        for text in [
            "ISBN 978-3-16-148410-0",
            "see 9780306406157 for that",
            "ISBN 0-306-40615-2",
            "ticket 2026-0042",
            "ticket #2026-00421234",
            "Invoice INV-2026-004217",
            "order no. 123456789",
            "€ 1 234 567,89",
            "EUR 1.234.567",
            "1234567 euros",
            "it went up 1234567%",
            "v10.0.19045.2965",
            "Chrome 120.0.6099.109",
            "room 12345678",
            "flight KL 1234567",
            "it costs 1234567.50",
        ] {
            assert_eq!(phones(text), Vec::<&str>::new(), "{text}");
        }
    }

    #[test]
    fn phones_are_still_phones_beside_ordinary_words() {
        assert_eq!(phones("ISBN 0-306-40615-3"), vec!["0-306-40615-3"]);
        assert_eq!(
            phones("call +31 6 1234 5678 about order 5"),
            vec!["+31 6 1234 5678"]
        );
        assert_eq!(phones("06_12_34_56_78"), vec!["06_12_34_56_78"]);
        assert_eq!(phones("06 -- 12 -- 34 -- 56"), vec!["06 -- 12 -- 34 -- 56"]);
        assert_eq!(phones("[msg 612345678]"), vec!["612345678"]);
        assert_eq!(phones("555.123.4567"), vec!["555.123.4567"]);
    }

    #[test]
    fn quoted_local_parts_do_not_join_two_quotations() {
        let text = r#"<Søren" and "@lukasz or "john doe"@example.com"#;
        let got: Vec<&str> = email_spans(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(got, vec![r#""john doe"@example.com"#]);
    }

    #[test]
    fn spelled_out_emails_end_at_the_sentence() {
        let text = "mail kw [at] host.com. Next, a (at) b (dot) nl or c at d dot org!";
        let got: Vec<&str> = email_spans(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(
            got,
            vec!["kw [at] host.com", "a (at) b (dot) nl", "c at d dot org"]
        );
        // Prose: no top-level domain after the last "dot".
        assert!(email_spans("meet at home dot afterwards").is_empty());
        assert!(email_spans("seen at tomorrow dot 日本語").is_empty());
    }

    #[test]
    fn whatsapp_local_parts_keep_every_digit() {
        let text = "call 31 6 1234 5678@lid or whatsapp:316.1234.5678@s.whatsapp.net. \
                    \"whatsapp:5  7417 86- -95 03@s.whatsapp.net";
        let got: Vec<&str> = whatsapp_spans(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(
            got,
            vec![
                "31 6 1234 5678@lid",
                "whatsapp:316.1234.5678@s.whatsapp.net",
                // A group that starts with a separator does not end the run.
                "whatsapp:5  7417 86- -95 03@s.whatsapp.net",
            ]
        );
    }
}
