//! Identifier redaction for conversation review, with a fail-closed gate.
//!
//! Owns the rules that decide what counts as a personal identifier in review
//! text (phone numbers, WhatsApp ids, e-mail addresses, chat-platform ids
//! (Telegram ids and usernames, Discord snowflakes), the sender ids and the
//! names configured for a scan), the [`Redactor`] that swaps them for stable
//! per-scan placeholders such as `[PERSON_1]`, and [`assert_no_identifiers`] /
//! [`IdentifierGate`], the gate a report must pass before it is written or
//! sent anywhere.
//!
//! Both match on one normalisation of the text ([`normalise`]: NFKC,
//! invisible characters dropped, Unicode spaces and dashes made ASCII, and for
//! names case, diacritics and confusables folded), and the redactor replaces
//! what it found in the original text through the normalisation's span map.
//! The gate is wider than the redactor: it runs every matcher of the redactor
//! and also flags any run of seven digits or more outside the shapes the
//! report renders, any `@` or `(at)` before a host-like token, and long name
//! parts glued inside other words ([`gate`]).
//!
//! - [`normalise`]: the plain and folded views and their span maps.
//! - [`names`]: the name variants of the list and where they match.
//! - [`patterns`]: phones, WhatsApp ids, e-mails, and ordinary numbers.
//! - [`platform_ids`]: Telegram ids and usernames, Discord snowflakes.
//! - [`gate`]: the fail-closed gate.
//! - [`secrets`]: the scrubber of error text (configured secrets, key shapes,
//!   URL userinfo), for stored and served errors and the log.
//!
//! Must never: log, print, return or put in an error a matched value (errors
//! and `Debug` output name kinds and counts only), or let the gate be narrower
//! than the redactor.

mod gate;
mod names;
mod normalise;
mod patterns;
mod platform_ids;
pub mod secrets;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::{self, BufRead, Read, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use regex::{Regex, RegexBuilder};

pub(crate) use gate::kind_list;
pub use gate::{assert_no_identifiers, GateFailure, IdentifierGate};

use names::NameMatcher;
use normalise::Views;

/// What sort of identifier a placeholder stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdentifierKind {
    Phone,
    WhatsappId,
    Email,
    SenderId,
    Name,
    /// A Telegram user/chat id or username, a Discord snowflake.
    PlatformId,
}

impl IdentifierKind {
    pub const ALL: [IdentifierKind; 6] = [
        IdentifierKind::Phone,
        IdentifierKind::WhatsappId,
        IdentifierKind::Email,
        IdentifierKind::SenderId,
        IdentifierKind::Name,
        IdentifierKind::PlatformId,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IdentifierKind::Phone => "phone",
            IdentifierKind::WhatsappId => "whatsapp_id",
            IdentifierKind::Email => "email",
            IdentifierKind::SenderId => "sender_id",
            IdentifierKind::Name => "name",
            IdentifierKind::PlatformId => "platform_id",
        }
    }

    /// The upper-case word inside a placeholder, e.g. `PHONE` in `[PHONE_1]`.
    pub fn placeholder_prefix(self) -> &'static str {
        match self {
            IdentifierKind::Phone => "PHONE",
            IdentifierKind::WhatsappId => "WA",
            IdentifierKind::Email => "EMAIL",
            IdentifierKind::SenderId => "SENDER",
            IdentifierKind::Name => "PERSON",
            IdentifierKind::PlatformId => "PLATFORM",
        }
    }
}

impl fmt::Display for IdentifierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identifiers configured for one scan: names (the owner's, members'
/// display names) and the sender ids seen in the window being reviewed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedactionList {
    names: Vec<String>,
    sender_ids: Vec<String>,
}

impl RedactionList {
    pub fn new() -> Self {
        Self::default()
    }

    /// A name to redact: whole, by its first name and by each other part of
    /// three letters or more, in any case, accents, look-alike letters or
    /// glued form (see `names.rs`). A first name under two letters is ignored.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.names.push(name.into());
        self
    }

    pub fn with_names<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.names.extend(names.into_iter().map(Into::into));
        self
    }

    /// A sender id such as `whatsapp:12345@s.whatsapp.net` or `api:alice`.
    pub fn with_sender_id(mut self, id: impl Into<String>) -> Self {
        self.sender_ids.push(id.into());
        self
    }

    pub fn with_sender_ids<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sender_ids.extend(ids.into_iter().map(Into::into));
        self
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn sender_ids(&self) -> &[String] {
        &self.sender_ids
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.sender_ids.is_empty()
    }

    /// The list a review report is redacted with (and a shadow diff, with
    /// the same rule): `names`; `sender_ids` and the owner's id, once each,
    /// less those shorter than [`MIN_SENDER_ID_CHARS`].
    pub(crate) fn of_review<N, I>(owner: &str, names: N, sender_ids: I) -> Self
    where
        N: IntoIterator<Item = String>,
        I: IntoIterator<Item = String>,
    {
        let mut senders: BTreeSet<String> = sender_ids.into_iter().collect();
        if !owner.trim().is_empty() {
            senders.insert(owner.trim().to_owned());
        }
        Self::new().with_names(names).with_sender_ids(
            senders
                .into_iter()
                .filter(|s| s.chars().count() >= MIN_SENDER_ID_CHARS),
        )
    }
}

/// Sender ids shorter than this identify no one and would match inside
/// every word of a report, so [`RedactionList::of_review`] leaves them out.
pub(crate) const MIN_SENDER_ID_CHARS: usize = 3;

// The list is made of identifiers; a derived Debug would print them into logs.
impl fmt::Debug for RedactionList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedactionList")
            .field("names", &self.names.len())
            .field("sender_ids", &self.sender_ids.len())
            .finish()
    }
}

/// The configured list could not be turned into a matcher (in practice only
/// when it is so large that the compiled pattern exceeds its size limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not build the {kind} matcher from the redaction list")]
pub struct BuildError {
    pub kind: IdentifierKind,
}

/// Replaces identifiers with placeholders that stay stable for the life of
/// the `Redactor`: use one per scan so a whole report shares one numbering.
pub struct Redactor {
    list: RedactionList,
    matchers: Matchers,
    table: PlaceholderTable,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("list", &self.list)
            .field("placeholders", &self.table.counts)
            .finish()
    }
}

/// Redaction repeats until nothing changes so the output is a fixed point.
/// One round is the norm; the cap only bounds the work on adversarial input,
/// and whatever a capped run leaves behind the gate still catches.
const MAX_ROUNDS: usize = 4;

impl Redactor {
    pub fn new(list: RedactionList) -> Result<Self, BuildError> {
        let matchers = Matchers::build(&list)?;
        Ok(Self {
            list,
            matchers,
            table: PlaceholderTable::default(),
        })
    }

    pub fn list(&self) -> &RedactionList {
        &self.list
    }

    /// A redactor for the same list, sharing the compiled matchers, with no
    /// placeholder assigned yet: a numbering of its own without compiling
    /// the list again.
    pub fn fresh(&self) -> Self {
        Self {
            list: self.list.clone(),
            matchers: self.matchers.clone(),
            table: PlaceholderTable::default(),
        }
    }

    /// The gate for this redactor's list, sharing its compiled matchers (so
    /// it flags all the redactor replaces, and more).
    pub fn identifier_gate(&self) -> IdentifierGate {
        IdentifierGate::from_matchers(self.matchers.clone())
    }

    /// How many distinct values of each kind got a placeholder so far.
    pub fn counts(&self) -> &BTreeMap<IdentifierKind, usize> {
        &self.table.counts
    }

    pub fn redact_identifiers(&mut self, text: &str) -> String {
        let Redactor {
            matchers, table, ..
        } = self;
        let mut current = text.to_owned();
        for _ in 0..MAX_ROUNDS {
            let mut changed = false;
            let next = map_outside_placeholders(&current, |segment| {
                let views = normalise::normalise(segment);
                let hits = matchers.hits(&views, false);
                if hits.is_empty() {
                    return segment.to_owned();
                }
                changed = true;
                let mut out = String::with_capacity(segment.len());
                let mut last = 0;
                for hit in hits {
                    out.push_str(&segment[last..hit.range.start]);
                    out.push_str(&table.placeholder(hit.kind, hit.key));
                    last = hit.range.end;
                }
                out.push_str(&segment[last..]);
                out
            });
            if !changed {
                break;
            }
            current = next;
        }
        current
    }
}

#[derive(Default)]
struct PlaceholderTable {
    assigned: HashMap<(IdentifierKind, String), String>,
    counts: BTreeMap<IdentifierKind, usize>,
}

impl PlaceholderTable {
    fn placeholder(&mut self, kind: IdentifierKind, key: String) -> String {
        let counts = &mut self.counts;
        self.assigned
            .entry((kind, key))
            .or_insert_with(|| {
                let n = counts.entry(kind).or_insert(0);
                *n += 1;
                format!("[{}_{}]", kind.placeholder_prefix(), n)
            })
            .clone()
    }
}

/// Redacts line by line with one [`Redactor`] so placeholders stay stable
/// across the whole input. Line endings are kept as they were. No matcher
/// spans a line break but one: a word hyphenated over a line end
/// (`Oli-` / `via`), so a line ending in a letter and a hyphen is redacted
/// together with the next (up to [`MAX_JOINED_LINES`]), which equals
/// whole-text redaction.
pub fn redact_lines(
    mut input: impl BufRead,
    mut output: impl Write,
    list: &RedactionList,
) -> io::Result<()> {
    let mut redactor =
        Redactor::new(list.clone()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut line = String::new();
    let mut block = String::new();
    let mut held = 0;
    loop {
        line.clear();
        let eof = input.read_line(&mut line)? == 0;
        let body = line.trim_end_matches(['\n', '\r']);
        if !eof && held < MAX_JOINED_LINES && ends_hyphenated(body) && line.len() > body.len() {
            block.push_str(&line);
            held += 1;
            continue;
        }
        let ending = &line[body.len()..];
        block.push_str(body);
        if !block.is_empty() || !ending.is_empty() {
            output.write_all(redactor.redact_identifiers(&block).as_bytes())?;
            output.write_all(ending.as_bytes())?;
        }
        block.clear();
        held = 0;
        if eof {
            break;
        }
    }
    output.flush()
}

/// Lines [`redact_lines`] keeps together when each ends hyphenated.
const MAX_JOINED_LINES: usize = 4;

/// A letter, then a hyphen or dash, then at most spaces: a word goes on.
fn ends_hyphenated(line: &str) -> bool {
    let mut rev = line.trim_end_matches([' ', '\t']).chars().rev();
    matches!(rev.next(), Some('-' | '\u{2010}' | '\u{2011}' | '\u{2013}'))
        && rev.next().is_some_and(char::is_alphabetic)
}

/// Reads all of `input` and runs the gate on it. Text that is not UTF-8 is an
/// I/O error, never a pass. The ids of a `report.md`'s own finding lines
/// (`- message: [msg N] (reply [msg M])`, a whole line only the report
/// writes) are vouched for; every other long number counts.
pub fn gate_text(
    mut input: impl Read,
    list: &RedactionList,
) -> io::Result<Result<(), GateFailure>> {
    let mut text = String::new();
    input.read_to_string(&mut text)?;
    let gate = match IdentifierGate::new(list) {
        Ok(g) => g,
        Err(e) => {
            return Ok(Err(GateFailure {
                kinds: std::collections::BTreeSet::from([e.kind]),
            }))
        }
    };
    let ids = text
        .lines()
        .filter_map(|l| REPORT_MESSAGE_LINE.captures(l))
        .flat_map(|c| [c.get(1), c.get(2)])
        .flatten()
        .filter_map(|m| m.as_str().parse::<i64>().ok())
        .collect();
    Ok(gate.check_with_ids(&text, &ids))
}

/// The line `report.md` writes for a finding's ids (see `report.rs`).
static REPORT_MESSAGE_LINE: LazyLock<Regex> = LazyLock::new(|| {
    constant_regex(r"^- message: \[msg ([1-9][0-9]{0,17})\] \(reply \[msg ([1-9][0-9]{0,17})\]\)$")
});

/// One name per line; blank lines and lines starting with `#` are skipped.
pub fn load_names_file(path: impl AsRef<Path>) -> io::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .map(|l| l.trim_start_matches('\u{feff}').trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

// ---------------------------------------------------------------------------
// Matching
// ---------------------------------------------------------------------------

/// When matches overlap, the earlier kind names the whole: a name inside an
/// e-mail address or a sender id goes with that value, and a phone run that
/// reaches into a WhatsApp id is one identifier, not two halves.
const PRIORITY: [IdentifierKind; 6] = [
    IdentifierKind::SenderId,
    IdentifierKind::WhatsappId,
    IdentifierKind::Email,
    // Before phones: `telegram:123456789` is one id, not a prefix and a phone.
    IdentifierKind::PlatformId,
    IdentifierKind::Phone,
    IdentifierKind::Name,
];

fn priority(kind: IdentifierKind) -> usize {
    PRIORITY
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(PRIORITY.len())
}

/// Placeholders already in the text are barriers: no pass looks inside them
/// or joins text across them. The number is capped at six digits so nothing
/// dressed up as a placeholder can smuggle a phone number through.
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| {
    constant_regex(r"\[(?:PHONE|WA|EMAIL|SENDER|PERSON|PLATFORM)_[1-9][0-9]{0,5}\]")
});

/// Applies `f` to the text between placeholders and keeps the placeholders
/// verbatim, so no pass can re-match one or join text across one.
fn map_outside_placeholders(text: &str, mut f: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for m in PLACEHOLDER.find_iter(text) {
        out.push_str(&f(&text[last..m.start()]));
        out.push_str(m.as_str());
        last = m.end();
    }
    out.push_str(&f(&text[last..]));
    out
}

/// One identifier found: where in the original segment, what, and the key
/// that decides its placeholder (never logged).
struct Hit {
    range: Range<usize>,
    kind: IdentifierKind,
    key: String,
}

/// The matchers built from one [`RedactionList`] plus the fixed patterns.
/// Cloning shares the compiled regexes.
#[derive(Clone)]
struct Matchers(Arc<Compiled>);

struct Compiled {
    senders: Option<Regex>,
    names: NameMatcher,
}

impl Matchers {
    fn build(list: &RedactionList) -> Result<Self, BuildError> {
        let mut ids: Vec<String> = list
            .sender_ids
            .iter()
            .map(|s| normalise::plain(s.trim()))
            .filter(|s| !s.is_empty())
            .collect();
        ids.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        ids.dedup();
        // No word boundaries around sender ids: a configured id glued to
        // other text is still that id, and over-redacting it is harmless.
        let senders = if ids.is_empty() {
            None
        } else {
            let alts: Vec<String> = ids.iter().map(|s| regex::escape(s)).collect();
            Some(
                RegexBuilder::new(&format!("(?i)(?:{})", alts.join("|")))
                    .size_limit(1 << 26)
                    .build()
                    .map_err(|_| BuildError {
                        kind: IdentifierKind::SenderId,
                    })?,
            )
        };
        let names = NameMatcher::build(&list.names).map_err(|_| BuildError {
            kind: IdentifierKind::Name,
        })?;
        Ok(Self(Arc::new(Compiled { senders, names })))
    }

    /// Every identifier the redactor replaces in one segment (no placeholder
    /// inside), in the original's coordinates, overlaps merged, in order.
    /// `wide` (the gate) takes names spelled with look-alikes more readily.
    fn hits(&self, views: &Views, wide: bool) -> Vec<Hit> {
        let plain = &views.plain;
        let mut found: Vec<(Range<usize>, IdentifierKind, String)> = Vec::new();
        let mut from_plain = |kind: IdentifierKind, spans: Vec<Range<usize>>| {
            for r in spans.into_iter().filter(|r| !r.is_empty()) {
                let key = plain_key(kind, &plain.text[r.clone()]);
                found.push((plain.original(r), kind, key));
            }
        };
        if let Some(re) = &self.0.senders {
            from_plain(
                IdentifierKind::SenderId,
                re.find_iter(&plain.text).map(|m| m.range()).collect(),
            );
        }
        from_plain(
            IdentifierKind::WhatsappId,
            patterns::whatsapp_spans(&plain.text),
        );
        from_plain(
            IdentifierKind::PlatformId,
            platform_ids::platform_id_spans(&plain.text),
        );
        from_plain(IdentifierKind::Email, patterns::email_spans(&plain.text));
        from_plain(IdentifierKind::Phone, patterns::phone_spans(&plain.text));
        for view in [&views.folded, &views.joined] {
            for r in self.0.names.spans(view, wide) {
                let key = self.0.names.key(&view.text[r.clone()]);
                found.push((view.original(r), IdentifierKind::Name, key));
            }
        }
        merge(found)
    }

    fn names(&self) -> &NameMatcher {
        &self.0.names
    }
}

/// Overlapping hits become one, named by the kind that comes first in
/// [`PRIORITY`] (its key decides the placeholder).
fn merge(mut found: Vec<(Range<usize>, IdentifierKind, String)>) -> Vec<Hit> {
    found.sort_by(|a, b| {
        a.0.start
            .cmp(&b.0.start)
            .then_with(|| priority(a.1).cmp(&priority(b.1)))
    });
    let mut out: Vec<Hit> = Vec::new();
    for (range, kind, key) in found {
        if let Some(last) = out.last_mut() {
            if range.start < last.range.end {
                // A platform-id shape (`@handle`) that is exactly a
                // configured name's handle yields to the name, so its `@`
                // stays the text around that name. Any more of the handle
                // than the name is the union below: `@anna_smith_x` is one
                // id, never `@[PERSON_1]_smith_x`.
                let (platform, name) = (IdentifierKind::PlatformId, IdentifierKind::Name);
                let is_handle_of =
                    |n: &Range<usize>, p: &Range<usize>| n.start <= p.start + 1 && n.end >= p.end;
                if kind == platform && last.kind == name && is_handle_of(&last.range, &range) {
                    continue;
                }
                if last.kind == platform && kind == name && is_handle_of(&range, &last.range) {
                    *last = Hit { range, kind, key };
                    continue;
                }
                last.range.end = last.range.end.max(range.end);
                if priority(kind) < priority(last.kind) {
                    last.kind = kind;
                    last.key = key;
                }
                continue;
            }
        }
        out.push(Hit { range, kind, key });
    }
    out
}

/// Identity of a value for placeholder numbering: two spellings of the same
/// identifier land on the same key.
fn plain_key(kind: IdentifierKind, raw: &str) -> String {
    match kind {
        IdentifierKind::Phone => raw.chars().filter(|c| patterns::is_digit(*c)).collect(),
        IdentifierKind::WhatsappId => {
            let lower = raw.to_lowercase();
            match lower.split_once('@') {
                // The `:NN` device part names a device, not a person.
                Some((local, suffix)) => {
                    // `whatsapp:` names the platform, not the person.
                    let local = match local.split_once(':') {
                        Some((platform, rest))
                            if !platform.is_empty()
                                && platform.chars().all(char::is_alphabetic) =>
                        {
                            rest
                        }
                        _ => local,
                    };
                    let local: String = local
                        .chars()
                        .filter(|c| !matches!(c, ' ' | '-' | '.' | '/' | '(' | ')' | '_'))
                        .collect();
                    let user = match local.rsplit_once(':') {
                        Some((user, device))
                            if !device.is_empty() && device.chars().all(|c| c.is_ascii_digit()) =>
                        {
                            user.to_owned()
                        }
                        _ => local,
                    };
                    format!("{user}@{suffix}")
                }
                None => lower,
            }
        }
        // `t.me/alice` is `@alice`; `<@!123>` is the snowflake 123.
        IdentifierKind::PlatformId => {
            let lower: String = raw.to_lowercase().chars().filter(|c| *c != ' ').collect();
            if let Some(user) = lower.strip_prefix("t.me/") {
                format!("@{user}")
            } else if lower.starts_with('<') {
                lower.chars().filter(char::is_ascii_digit).collect()
            } else {
                lower
            }
        }
        IdentifierKind::Email | IdentifierKind::SenderId | IdentifierKind::Name => {
            raw.to_lowercase()
        }
    }
}

/// A regex written in this module's source. It always compiles (the unit
/// tests compile every one), so a failure is a bug that cannot reach a release.
#[allow(
    clippy::expect_used,
    reason = "a constant pattern of this module, compiled by its unit tests"
)]
pub(crate) fn constant_regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("a constant pattern of the redaction module compiles")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn redactor(list: RedactionList) -> Redactor {
        Redactor::new(list).expect("test list compiles")
    }

    fn redact(text: &str) -> String {
        redactor(RedactionList::new()).redact_identifiers(text)
    }

    fn kinds(text: &str, list: &RedactionList) -> BTreeSet<IdentifierKind> {
        match assert_no_identifiers(text, list) {
            Ok(()) => BTreeSet::new(),
            Err(e) => e.kinds,
        }
    }

    #[test]
    fn kind_strings_and_prefixes() {
        let got: Vec<_> = IdentifierKind::ALL
            .iter()
            .map(|k| (k.as_str(), k.placeholder_prefix()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("phone", "PHONE"),
                ("whatsapp_id", "WA"),
                ("email", "EMAIL"),
                ("sender_id", "SENDER"),
                ("name", "PERSON"),
                ("platform_id", "PLATFORM"),
            ]
        );
        assert_eq!(IdentifierKind::WhatsappId.to_string(), "whatsapp_id");
    }

    #[test]
    fn telegram_and_discord_ids_are_identifiers() {
        let list = RedactionList::new();
        let mut r = redactor(list.clone());
        let line = "telegram:123456789 (@alice_smith) asked <@123456789012345678> \
                    and telegram:123456789 again, see t.me/alice_smith";
        let out = r.redact_identifiers(line);
        assert_eq!(
            out,
            "[PLATFORM_1] ([PLATFORM_2]) asked [PLATFORM_3] \
             and [PLATFORM_1] again, see [PLATFORM_2]"
        );
        assert_eq!(assert_no_identifiers(&out, &list), Ok(()));
        assert_eq!(
            kinds("ping @alice_smith", &list),
            BTreeSet::from([IdentifierKind::PlatformId])
        );
    }

    #[test]
    fn a_handle_longer_than_a_configured_name_is_redacted_whole() {
        let list = RedactionList::new().with_name("Anna");
        let mut r = redactor(list.clone());
        assert_eq!(
            r.redact_identifiers("ping @anna now"),
            "ping @[PERSON_1] now"
        );
        let out = r.redact_identifiers("ping @anna_smith_x now");
        assert!(!out.contains("smith"), "{out}");
        assert_eq!(assert_no_identifiers(&out, &list), Ok(()));
    }

    #[test]
    fn redacts_international_phone_formats() {
        for phone in [
            "+33 6 12 34 56 78",
            "+33612345678",
            "+1 (555) 123-4567",
            "+44.20.7946.0958",
            "+49-30-1234567",
            "+44 (0)20 7946 0958",
            "0033 6 12 34 56 78",
        ] {
            let out = redact(&format!("call {phone} now"));
            assert_eq!(out, "call [PHONE_1] now", "format {phone:?}");
        }
    }

    #[test]
    fn redacts_local_phone_formats() {
        for phone in [
            "06 12 34 56 78",
            "06.12.34.56.78",
            "(555) 123-4567",
            "555-123-4567",
            "0612345678",
            "555-1234",
            "06\u{a0}12\u{a0}34\u{a0}56\u{a0}78",
            "٠٦١٢٣٤٥٦٧٨",
            "０６ １２ ３４ ５６ ７８",
        ] {
            let out = redact(&format!("tel: {phone}."));
            assert_eq!(out, "tel: [PHONE_1].", "format {phone:?}");
        }
    }

    #[test]
    fn parenthesised_phone_keeps_prose_parenthesis() {
        assert_eq!(redact("(0612345678)"), "([PHONE_1])");
        assert_eq!(redact("me ((555) 123-4567)"), "me ([PHONE_1])");
    }

    #[test]
    fn same_digits_get_same_placeholder() {
        let mut r = redactor(RedactionList::new());
        let out = r.redact_identifiers("+33 6 12 34 56 78 or +33.6.12.34.56.78, not 0698765432");
        assert_eq!(out, "[PHONE_1] or [PHONE_1], not [PHONE_2]");
        // Stable across calls on the same redactor.
        assert_eq!(
            r.redact_identifiers("again +33612345678"),
            "again [PHONE_1]"
        );
        assert_eq!(r.counts().get(&IdentifierKind::Phone), Some(&2));
    }

    #[test]
    fn leaves_dates_times_ids_prices_and_small_numbers() {
        for text in [
            "2026-11-29",
            "on 2026-11-29 04:00 the scan ran",
            "2026-11-29T04:00:00Z",
            "2026-11-29T04:00:00+01:00",
            "29.11.2026 at 4:05",
            "11/29/2026",
            "[msg 42] said hi",
            "it costs 12.50",
            "42 exchanges in 3 spaces, 1999 and 2026",
            "1, 2, 3, 4, 5, 6, 7",
            "from 2026-11-29 - 2026-11-30",
            "12:30:45.123",
            "1,234,567 tokens",
        ] {
            assert_eq!(redact(text), text, "text {text:?}");
            assert_eq!(assert_no_identifiers(text, &RedactionList::new()), Ok(()));
        }
    }

    #[test]
    fn ordinary_numbers_kept_by_the_redactor_are_still_flagged_by_the_gate() {
        // Defence in depth: the redactor keeps these as ordinary text, the
        // gate knows none of these shapes, so a report quoting one is blocked.
        for text in [
            "trace 3f2a9c1e-1234-5678-9abc-def012345678",
            "it costs 1234567.50",
            "ISBN 978-3-16-148410-0",
            "ticket 2026-00421234",
            "€ 1 234 567",
            "v10.0.19045.2965",
        ] {
            assert_eq!(redact(text), text, "text {text:?}");
            assert_eq!(
                kinds(text, &RedactionList::new()),
                BTreeSet::from([IdentifierKind::Phone]),
                "{text}"
            );
        }
    }

    #[test]
    fn message_ids_pass_the_gate_only_when_vouched_for() {
        let gate = IdentifierGate::new(&RedactionList::new()).unwrap();
        let text = "- message: [msg 12345678] (reply [msg 12345679])";
        assert!(gate.check(text).is_err());
        let ids = BTreeSet::from([12_345_678, 12_345_679]);
        assert_eq!(gate.check_with_ids(text, &ids), Ok(()));
        let answer = r#"{"findings": [{"message_id": 12345678, "summary": "x"}]}"#;
        assert_eq!(gate.check_with_ids(answer, &ids), Ok(()));
        // A number dressed as a message id is not one of them.
        assert!(gate.check_with_ids("[msg 612345678]", &ids).is_err());
        assert!(gate
            .check_with_ids(r#"{"message_id": 612345678}"#, &ids)
            .is_err());
        // The redactor never takes `[msg N]` for the host's: in chat text it
        // is a disguise like any other.
        assert_eq!(redact("see [msg 612345678]"), "see [msg [PHONE_1]]");
    }

    #[test]
    fn date_run_into_digits_is_redacted() {
        // Ambiguous: could be a date or a phone split by spaces. Fail closed.
        assert_eq!(redact("2026-11-29 0612345678"), "[PHONE_1]");
        // Up to three separators join digit groups, so two spaces still join.
        assert_eq!(redact("2026-11-29  0612345678"), "[PHONE_1]");
        assert_eq!(redact("2026-11-29, 0612345678"), "2026-11-29, [PHONE_1]");
    }

    #[test]
    fn leaves_placeholders_alone_and_is_idempotent() {
        let text = "[PHONE_1] met [PERSON_2] via [WA_3] and [EMAIL_4] / [SENDER_5]";
        let list = RedactionList::new()
            .with_name("Phone Person")
            .with_sender_id("SENDER_5");
        let mut r = redactor(list.clone());
        assert_eq!(r.redact_identifiers(text), text);
        assert_eq!(assert_no_identifiers(text, &list), Ok(()));
    }

    #[test]
    fn fake_placeholder_cannot_hide_a_phone() {
        let out = redact("[PHONE_0612345678] [PHONE_1234567]");
        assert!(
            !out.contains("0612345678") && !out.contains("1234567"),
            "{out}"
        );
    }

    #[test]
    fn redacts_whatsapp_ids_of_each_suffix() {
        let mut r = redactor(RedactionList::new());
        let out = r.redact_identifiers(
            "a 33612345678@s.whatsapp.net b 33612345678:12@s.whatsapp.net \
             c 33612345678-1600000000@g.us d 120363012345678901@g.us \
             e 123456789012345:3@lid f 98765@LID g 5511999@c.us",
        );
        assert_eq!(
            out,
            "a [WA_1] b [WA_1] c [WA_2] d [WA_3] e [WA_4] f [WA_5] g [WA_6]"
        );
    }

    #[test]
    fn bare_whatsapp_suffix_is_flagged() {
        let list = RedactionList::new();
        assert!(kinds("ids end in @s.whatsapp.net", &list).contains(&IdentifierKind::WhatsappId));
        assert!(
            kinds("ids end in @ s . whatsapp . net", &list).contains(&IdentifierKind::WhatsappId)
        );
        assert_eq!(redact("suffix @lid."), "suffix [WA_1].");
    }

    #[test]
    fn email_domains_that_look_like_whatsapp_stay_emails() {
        assert_eq!(redact("write to bob@lidl.de"), "write to [EMAIL_1]");
        assert_eq!(redact("123@lid.example.com"), "[EMAIL_1]");
        assert_eq!(redact("x@g.us.example.org!"), "[EMAIL_1]!");
    }

    #[test]
    fn redacts_emails_case_insensitively_stable() {
        let mut r = redactor(RedactionList::new());
        let out = r.redact_identifiers(
            "<Alice.Martin+bot@Example.co.uk>, alice.martin+bot@example.co.uk. élodie@exemple.fr",
        );
        assert_eq!(out, "<[EMAIL_1]>, [EMAIL_1]. [EMAIL_2]");
    }

    #[test]
    fn redacts_configured_sender_ids_first() {
        let list = RedactionList::new()
            .with_sender_id("whatsapp:12345@s.whatsapp.net")
            .with_sender_id("discord:9981")
            .with_sender_id("discord:99")
            .with_sender_id("api:alice");
        let mut r = redactor(list.clone());
        let out = r.redact_identifiers(
            "from whatsapp:12345@s.whatsapp.net, discord:9981, discord:99, API:Alice; 12345@s.whatsapp.net",
        );
        assert_eq!(
            out,
            "from [SENDER_1], [SENDER_2], [SENDER_3], [SENDER_4]; [WA_1]"
        );
        assert_eq!(
            kinds("by api:alice", &list),
            BTreeSet::from([IdentifierKind::SenderId])
        );
    }

    #[test]
    fn redacts_whole_and_first_names_with_one_placeholder() {
        let list = RedactionList::new()
            .with_name("Alice Martin")
            .with_name("Bob");
        let mut r = redactor(list);
        let out = r.redact_identifiers(
            "Alice Martin asked Bob; later alice said ALICE  MARTIN was right.",
        );
        assert_eq!(
            out,
            "[PERSON_1] asked [PERSON_2]; later [PERSON_1] said [PERSON_1] was right."
        );
    }

    #[test]
    fn shared_first_name_gets_its_own_placeholder() {
        let list = RedactionList::new()
            .with_name("Alice Martin")
            .with_name("Alice Dupont");
        let mut r = redactor(list);
        let out = r.redact_identifiers("Alice Dupont, Alice Martin and Alice");
        assert_eq!(out, "[PERSON_1], [PERSON_2] and [PERSON_3]");
    }

    #[test]
    fn names_are_case_insensitive_and_unicode_aware() {
        let list = RedactionList::new().with_name("Élodie Ñúñez");
        let mut r = redactor(list);
        assert_eq!(
            r.redact_identifiers("ÉLODIE, élodie et l’Élodie ñÚÑEZ"),
            "[PERSON_1], [PERSON_1] et l’[PERSON_1]"
        );
        // Word boundaries count accented letters as letters.
        assert_eq!(r.redact_identifiers("Élodiea xélodie"), "Élodiea xélodie");
        // A change of case is a boundary: glued forms are found.
        assert_eq!(r.redact_identifiers("éÉlodie"), "é[PERSON_1]");
    }

    #[test]
    fn names_respect_word_boundaries() {
        let list = RedactionList::new().with_name("Al").with_name("Bob Smith");
        let mut r = redactor(list);
        assert_eq!(
            // `_` is no letter: `Bob_x` is a handle holding the name.
            r.redact_identifiers("Also Malice, Al's car, Bob Smithers, Bob_x, al."),
            "Also Malice, [PERSON_1]'s car, [PERSON_2] Smithers, [PERSON_2]_x, [PERSON_1]."
        );
    }

    #[test]
    fn ignores_names_shorter_than_two_chars() {
        let list = RedactionList::new()
            .with_name("J")
            .with_name("K Dick")
            .with_name("  ");
        let mut r = redactor(list);
        assert_eq!(
            r.redact_identifiers("J and K met K Dick"),
            "J and K met [PERSON_1]"
        );
    }

    #[test]
    fn names_inside_emails_are_taken_with_the_email() {
        let list = RedactionList::new().with_name("Alice Martin");
        let mut r = redactor(list);
        assert_eq!(
            r.redact_identifiers("alice@martin.fr and Alice"),
            "[EMAIL_1] and [PERSON_1]"
        );
    }

    #[test]
    fn placeholders_numbered_per_kind_in_order_of_first_sight() {
        let list = RedactionList::new().with_name("Zoé").with_name("Yann");
        let mut r = redactor(list);
        let out = r.redact_identifiers("Yann 0611111111 Zoé 0622222222 yann a@b.io 0611111111");
        assert_eq!(
            out,
            "[PERSON_1] [PHONE_1] [PERSON_2] [PHONE_2] [PERSON_1] [EMAIL_1] [PHONE_1]"
        );
    }

    #[test]
    fn message_line_end_to_end() {
        let list = RedactionList::new()
            .with_name("Alice Martin")
            .with_sender_id("whatsapp:33612345678@s.whatsapp.net");
        let mut r = redactor(list.clone());
        let line = "[msg 123] 2026-11-29 04:00 Alice (whatsapp:33612345678@s.whatsapp.net): \
                    call +33 6 12 34 56 78 or mail alice.m@example.org, 12.50 €";
        let out = r.redact_identifiers(line);
        assert_eq!(
            out,
            "[msg 123] 2026-11-29 04:00 [PERSON_1] ([SENDER_1]): \
             call [PHONE_1] or mail [EMAIL_1], 12.50 €"
        );
        assert_eq!(assert_no_identifiers(&out, &list), Ok(()));
        assert_eq!(
            kinds(line, &list),
            BTreeSet::from([
                IdentifierKind::Phone,
                IdentifierKind::WhatsappId,
                IdentifierKind::Email,
                IdentifierKind::SenderId,
                IdentifierKind::Name,
            ])
        );
    }

    #[test]
    fn gate_flags_each_kind_and_message_names_no_value() {
        let list = RedactionList::new()
            .with_name("Alice Martin")
            .with_sender_id("discord:9981");
        let text = "Alice wrote from discord:9981 to 555-123-4567, \
                    bob@example.com and 123@lid, cc <@123456789012345678>";
        let err = assert_no_identifiers(text, &list).expect_err("identifiers present");
        assert_eq!(err.kinds, IdentifierKind::ALL.into_iter().collect());
        let message = err.to_string();
        assert_eq!(
            message,
            "identifier gate failed: phone, whatsapp_id, email, sender_id, name, platform_id still present"
        );
        let debug = format!("{err:?}");
        for value in [
            "Alice",
            "9981",
            "4567",
            "bob",
            "example",
            "123@lid",
            "12345678901",
        ] {
            assert!(!message.contains(value), "message leaks {value}");
            assert!(!debug.contains(value), "debug leaks {value}");
        }
    }

    #[test]
    fn a_redactors_gate_flags_what_the_list_gate_flags() {
        let list = RedactionList::new()
            .with_name("Olivia Bakker")
            .with_sender_id("api:alice");
        let gate = redactor(list.clone()).identifier_gate();
        for text in [
            "Olivia",
            "api:alice",
            "+31 6 1234 5678",
            "a@b.nl",
            "x@lid",
            "clean text",
        ] {
            assert_eq!(
                gate.check(text),
                assert_no_identifiers(text, &list),
                "{text}"
            );
        }
    }

    #[test]
    fn gate_passes_clean_text() {
        let list = RedactionList::new()
            .with_name("Alice")
            .with_sender_id("api:alice");
        assert_eq!(
            assert_no_identifiers("The bot refused [msg 7] on 2026-11-29 at 04:00.", &list),
            Ok(())
        );
    }

    #[test]
    fn debug_output_names_no_value() {
        let list = RedactionList::new()
            .with_name("Alice Martin")
            .with_sender_id("api:alice");
        let mut r = redactor(list.clone());
        r.redact_identifiers("Alice 0612345678");
        let shown = format!("{list:?} {r:?}");
        assert!(!shown.to_lowercase().contains("alice"), "{shown}");
        assert!(!shown.contains("0612345678"), "{shown}");
    }

    #[test]
    fn redact_lines_keeps_one_table_and_line_endings() {
        let list = RedactionList::new().with_name("Alice");
        let input = "Alice: 0612345678\r\nok\n\nalice again 06 12 34 56 78";
        let mut out = Vec::new();
        redact_lines(input.as_bytes(), &mut out, &list).expect("redact");
        let out = String::from_utf8(out).expect("utf8");
        assert_eq!(
            out,
            "[PERSON_1]: [PHONE_1]\r\nok\n\n[PERSON_1] again [PHONE_1]"
        );
        assert_eq!(gate_text(out.as_bytes(), &list).expect("read"), Ok(()));
    }

    #[test]
    fn redact_lines_keeps_a_hyphenated_line_with_the_next() {
        let list = RedactionList::new().with_name("Olivia Bakker");
        let input = "ask Oli-\nvia now\nWell-\n known\nend-\n";
        let mut out = Vec::new();
        redact_lines(input.as_bytes(), &mut out, &list).expect("redact");
        let out = String::from_utf8(out).expect("utf8");
        assert_eq!(out, "ask [PERSON_1] now\nWell-\n known\nend-\n");
    }

    #[test]
    fn any_punctuation_joins_digits_but_arithmetic_is_kept() {
        for phone in [
            "06|1234|5678",
            "06;12;34;56;78",
            "06*1234*5678",
            "06'1234'5678",
            "06~1234~5678",
            "06+1234+5678",
            "06#12#34#56#78",
            "06\u{1F600}1234\u{1F600}5678",
        ] {
            assert_eq!(redact(phone), "[PHONE_1]", "{phone}");
        }
        assert_eq!(redact("[06] [1234] [5678]"), "[[PHONE_1]]");
        for kept in [
            "1234 + 5678 = 6912",
            "12 * 34 = 408",
            "06,12,34,56,78",
            "€ 1 234 567,89",
        ] {
            assert_eq!(redact(kept), kept);
        }
        // The gate knows no arithmetic.
        assert!(assert_no_identifiers("1234 + 5678 = 6912", &RedactionList::new()).is_err());
    }

    #[test]
    fn names_spelled_out_or_with_look_alike_digits() {
        let list = RedactionList::new()
            .with_name("Olivia Bakker")
            .with_name("Sam Lee");
        let mut r = redactor(list.clone());
        for text in [
            "O l i v i a",
            "O.l.i.v.i.a",
            "0l1v1a",
            "B4kk3r",
            "O-l-i-v-i-a B-a-k-k-e-r",
        ] {
            assert_eq!(r.redact_identifiers(text), "[PERSON_1]", "{text}");
        }
        // Mostly digits is no name for the redactor; the gate still blocks.
        assert_eq!(r.redact_identifiers("up at 5am"), "up at 5am");
        assert!(assert_no_identifiers("up at 5am", &list).is_err());
        assert_eq!(r.redact_identifiers("80 km"), "80 km");
    }

    #[test]
    fn gate_text_reads_everything_and_rejects_non_utf8() {
        let list = RedactionList::new();
        let verdict = gate_text("fine\nbut 555-123-4567\n".as_bytes(), &list).expect("read");
        assert_eq!(
            verdict.map_err(|e| e.kinds),
            Err(BTreeSet::from([IdentifierKind::Phone]))
        );
        assert!(gate_text(&[0xff, 0xfe, b'a'][..], &list).is_err());
        // A report's own finding line vouches for its ids; the same number
        // anywhere else, or in any other shape, is still a long number.
        let report = "- message: [msg 12345678] (reply [msg 12345679])\n";
        assert_eq!(gate_text(report.as_bytes(), &list).expect("read"), Ok(()));
        for text in [
            "- summary: see [msg 12345678]\n",
            "- message: [msg 12345678] (reply [msg 12345679]) 0612345678\n",
            "x - message: [msg 12345678] (reply [msg 12345679])\n",
        ] {
            assert!(
                gate_text(text.as_bytes(), &list).expect("read").is_err(),
                "{text}"
            );
        }
        let both = "- message: [msg 12345678] (reply [msg 12345679])\n- evidence: 0612345678\n";
        assert!(gate_text(both.as_bytes(), &list).expect("read").is_err());
    }

    #[test]
    fn load_names_file_skips_comments_and_blanks() {
        let path = std::env::temp_dir().join(format!(
            "mercury-redact-names-{}-{:?}.txt",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(
            &path,
            "\u{feff}# owner\nAlice Martin\n\n   \n  Bob  \n# members\nÉlodie\n",
        )
        .expect("write names");
        let names = load_names_file(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            names.expect("read names"),
            vec!["Alice Martin", "Bob", "Élodie"]
        );
        assert!(load_names_file("/nonexistent/mercury/names.txt").is_err());
    }

    // ---- property tests ---------------------------------------------------

    #[derive(Debug, Clone)]
    struct Planted {
        kind: IdentifierKind,
        raw: String,
        configured: Option<String>,
    }

    fn phone() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\+[1-9][0-9]{0,2} [1-9]( [0-9]{2}){4}",
            "0[1-9]( [0-9]{2}){4}",
            "0[1-9](\\.[0-9]{2}){4}",
            "0[1-9][0-9]{8}",
            "\\+[1-9][0-9]{9,12}",
            "\\([2-9][0-9]{2}\\) [0-9]{3}-[0-9]{4}",
            "[2-9][0-9]{2}-[0-9]{3}-[0-9]{4}",
            "\\+1 \\([2-9][0-9]{2}\\) [0-9]{3}-[0-9]{4}",
            "\\+[1-9][0-9]{1,2}\\.[0-9]{2}\\.[0-9]{4}\\.[0-9]{4}",
            "\\+[1-9][0-9]{1,2}-[0-9]{2,3}-[0-9]{3,4}-[0-9]{3,4}",
            "00[1-9][0-9] [0-9]{3} [0-9]{3} [0-9]{3}",
            "[0-9]{3}\\.[0-9]{3}\\.[0-9]{4}",
        ]
    }

    fn whatsapp_id() -> impl Strategy<Value = String> {
        prop_oneof![
            "[1-9][0-9]{7,14}(:[0-9]{1,2})?@s\\.whatsapp\\.net",
            "[1-9][0-9]{7,14}(-[0-9]{10})?@g\\.us",
            "[1-9][0-9]{7,17}(:[0-9]{1,2})?@lid",
        ]
    }

    fn email() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9._+-]{0,10}[a-z0-9]@[a-z][a-z0-9-]{1,8}\\.[a-z]{2,6}(\\.[a-z]{2,3})?"
    }

    // Names use letters q–z and surrounding words a–p, so a name can only
    // appear in the text where it was planted.
    fn name() -> impl Strategy<Value = Planted> {
        ("[Q-Z][q-z]{2,7}", "[Q-Z][q-z]{2,7}", 0u8..4).prop_map(|(first, last, form)| {
            let whole = format!("{first} {last}");
            let raw = match form {
                0 => whole.clone(),
                1 => first,
                2 => whole.to_uppercase(),
                _ => first.to_lowercase(),
            };
            Planted {
                kind: IdentifierKind::Name,
                raw,
                configured: Some(whole),
            }
        })
    }

    fn sender_id() -> impl Strategy<Value = String> {
        prop_oneof![
            "discord:[1-9][0-9]{3,17}",
            "api:[a-p]{3,10}",
            "telegram:[1-9][0-9]{5,12}",
            "whatsapp:[1-9][0-9]{7,14}@s\\.whatsapp\\.net",
        ]
    }

    fn planted() -> impl Strategy<Value = Planted> {
        let plain = |kind: IdentifierKind| {
            move |raw: String| Planted {
                kind,
                raw,
                configured: None,
            }
        };
        prop_oneof![
            phone().prop_map(plain(IdentifierKind::Phone)),
            whatsapp_id().prop_map(plain(IdentifierKind::WhatsappId)),
            email().prop_map(plain(IdentifierKind::Email)),
            name(),
            sender_id().prop_map(|raw| Planted {
                kind: IdentifierKind::SenderId,
                configured: Some(raw.clone()),
                raw,
            }),
        ]
    }

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-pA-P]{1,8}",
            1 => prop::sample::select(vec![
                "ça", "élan", "déjà", "日本語", "😀", "Ωμέγα", "привет", "café", "niño",
                "12", "7", "2026-11-29", "04:00", "[msg 42]", "12.50", "29.11.2026",
                "—", "...", "!", "«", "»", "(", ")", "-", "+", "@", ":",
            ])
            .prop_map(str::to_owned),
        ]
    }

    const LEFT: &[&str] = &["", "(", "«", "\"", "\n", "¿", "—", "<"];
    const RIGHT: &[&str] = &[
        "", ")", "»", "\"", ",", ".", "!", "?", "'s", "’s", ":", ";", "\n", "…", ">",
    ];

    fn scenario() -> impl Strategy<Value = (String, Vec<Planted>, RedactionList)> {
        (
            prop::collection::vec(word(), 0..12),
            prop::collection::vec(
                (
                    planted(),
                    any::<prop::sample::Index>(),
                    prop::sample::select(LEFT),
                    prop::sample::select(RIGHT),
                ),
                1..4,
            ),
        )
            .prop_map(|(mut tokens, plants)| {
                let mut list = RedactionList::new();
                let mut planted = Vec::new();
                for (p, at, left, right) in plants {
                    let at = at.index(tokens.len() + 1);
                    tokens.insert(at, format!("{left}{}{right}", p.raw));
                    match (p.kind, &p.configured) {
                        (IdentifierKind::Name, Some(n)) => list = list.with_name(n.clone()),
                        (IdentifierKind::SenderId, Some(s)) => {
                            list = list.with_sender_id(s.clone());
                        }
                        _ => {}
                    }
                    planted.push(p);
                }
                (tokens.join(" "), planted, list)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn planted_identifiers_never_survive_redaction((text, planted, list) in scenario()) {
            let mut r = redactor(list.clone());
            let out = r.redact_identifiers(&text);
            prop_assert_eq!(assert_no_identifiers(&out, &list), Ok(()), "output {:?}", out);
            let visible = PLACEHOLDER.replace_all(&out, " ").to_lowercase();
            for p in &planted {
                prop_assert!(
                    !visible.contains(&p.raw.to_lowercase()),
                    "{:?} survived in {:?}", p.kind, out
                );
            }
            // Redacting again changes nothing: the output is a fixed point.
            prop_assert_eq!(r.redact_identifiers(&out), out);
        }

        #[test]
        fn raw_identifiers_always_fail_the_gate((text, planted, list) in scenario()) {
            let err = assert_no_identifiers(&text, &list);
            prop_assert!(err.is_err(), "gate passed {:?}", text);
            let found = err.err().map(|e| e.kinds).unwrap_or_default();
            for p in &planted {
                prop_assert!(found.contains(&p.kind), "{:?} not flagged in {:?}", p.kind, text);
            }
        }

        #[test]
        fn safe_text_passes_the_gate(
            pairs in prop::collection::vec(
                ("[a-pA-P]{1,8}", prop::sample::select(vec![
                    "12", "7", "2026-11-29", "2026-11-29 04:00", "04:00", "[msg 42]",
                    "12.50", "29.11.2026", "1999", "ça", "😀",
                ])),
                0..10,
            )
        ) {
            let text = pairs
                .iter()
                .map(|(w, s)| format!("{w} {s}"))
                .collect::<Vec<_>>()
                .join(" ");
            let list = RedactionList::new().with_name("Quentin Zyx").with_sender_id("api:zzz");
            prop_assert_eq!(assert_no_identifiers(&text, &list), Ok(()), "{:?}", text);
            prop_assert_eq!(redactor(list).redact_identifiers(&text), text);
        }
    }
}
