//! The fail-closed identifier gate: wider than the redactor on purpose.
//!
//! Owns [`IdentifierGate`] and [`assert_no_identifiers`]. On the same
//! normalised views as the redactor, the gate flags everything the redactor
//! would replace and also, as defence in depth against shapes the redactor
//! misses or deliberately keeps:
//!
//! - any run of seven digits or more once separators are dropped, except in
//!   isolated dates and times and in `[msg N]` / `"message_id": N` for ids
//!   the caller vouches for ([`IdentifierGate::check_with_ids`]); no ordinary
//!   number exemption (ISBN, ticket, amount, version) applies here;
//! - any `@` or `(at)` followed by a host-like token, a local part glued to an
//!   `@`, and any WhatsApp suffix however it is spaced;
//! - every listed name part of three letters or more at a name boundary, and
//!   parts of six letters or more even inside another word; a name spelled
//!   with digit look-alikes counts as soon as it holds one letter (the
//!   redactor wants it mostly letters).
//!
//! Must never: pass text it could not check (a list that does not compile is
//! a failure of that kind), or name a matched value in its result.

use std::collections::BTreeSet;
use std::fmt;

use super::normalise;
use super::patterns;
use super::{map_outside_placeholders, BuildError, IdentifierKind, Matchers, RedactionList};

/// The gate found identifiers. Carries their kinds, never their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identifier gate failed: {} still present", kind_list(.kinds))]
pub struct GateFailure {
    pub kinds: BTreeSet<IdentifierKind>,
}

/// The kinds as the gate names them: `phone, email`, in kind order.
pub(crate) fn kind_list(kinds: &BTreeSet<IdentifierKind>) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fail closed: `Err` when anything the gate flags is present, and also when
/// the list cannot be compiled (an unchecked list is treated as a found
/// identifier of that kind). Message ids are not known here, so a `[msg N]`
/// of seven digits or more is flagged like any other long number.
pub fn assert_no_identifiers(text: &str, list: &RedactionList) -> Result<(), GateFailure> {
    match IdentifierGate::new(list) {
        Ok(gate) => gate.check(text),
        Err(e) => Err(GateFailure {
            kinds: BTreeSet::from([e.kind]),
        }),
    }
}

/// [`assert_no_identifiers`] with the list compiled once, for callers that
/// gate many texts against one list (a scan gates every judge answer).
pub struct IdentifierGate {
    matchers: Matchers,
}

// Built from identifiers; keep them out of any Debug output.
impl fmt::Debug for IdentifierGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentifierGate").finish_non_exhaustive()
    }
}

impl IdentifierGate {
    pub fn new(list: &RedactionList) -> Result<Self, BuildError> {
        Ok(Self::from_matchers(Matchers::build(list)?))
    }

    pub(super) fn from_matchers(matchers: Matchers) -> Self {
        Self { matchers }
    }

    /// `Err` with the kinds found. No message id is known: every long digit
    /// run counts, `[msg N]` included.
    pub fn check(&self, text: &str) -> Result<(), GateFailure> {
        self.check_with_ids(text, &BTreeSet::new())
    }

    /// [`check`](Self::check), where `[msg N]` and `"message_id": N` (or
    /// `"reply_id"`) are the host's own rendering of a message id when `N` is
    /// one of `ids`: the report's and the batch's ids, never a number taken
    /// from the text.
    pub fn check_with_ids(&self, text: &str, ids: &BTreeSet<i64>) -> Result<(), GateFailure> {
        let mut kinds = BTreeSet::new();
        let names = self.matchers.names();
        map_outside_placeholders(text, |segment| {
            let views = normalise::normalise(segment);
            let plain = views.plain.text.as_str();
            // Phones come from the wider digit-run rule below, which holds
            // every run the redactor takes except the ids vouched for.
            kinds.extend(
                self.matchers
                    .hits(&views, true)
                    .into_iter()
                    .map(|h| h.kind)
                    .filter(|k| *k != IdentifierKind::Phone),
            );
            if patterns::gate_digit_runs(plain, Some(ids)) {
                kinds.insert(IdentifierKind::Phone);
            }
            if patterns::gate_whatsapp(plain) {
                kinds.insert(IdentifierKind::WhatsappId);
            }
            if patterns::gate_at_host(plain) {
                kinds.insert(IdentifierKind::Email);
            }
            if names.anywhere(&views) {
                kinds.insert(IdentifierKind::Name);
            }
            String::new()
        });
        if kinds.is_empty() {
            Ok(())
        } else {
            Err(GateFailure { kinds })
        }
    }
}
