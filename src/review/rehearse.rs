//! Proposal → rehearsal (issue 31, item 5): what a rehearsal of a drafted
//! fix records, how the judge is asked to compare one replayed answer with
//! the finding, and the verdict over both arms. The orchestration (the
//! snapshot, the six shadows, the replays) is `mercury review rehearse`'s,
//! in `crate::cli::review_rehearse`, above the host that starts shadows.
//!
//! Must never: put an unredacted answer in a prompt or a record, or call a
//! finding reproduced when the current profile passed every replay.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::review::intake::IntakeFinding;

/// Replays per arm.
pub(crate) const RUNS_PER_ARM: usize = 3;
/// Characters of a replayed answer kept in the record.
const ANSWER_CAP: usize = 1_000;

/// Which profile a replay ran with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Arm {
    /// The space as it is.
    Current,
    /// The space with the drafted change applied.
    Candidate,
}

impl Arm {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Arm::Current => "current",
            Arm::Candidate => "candidate",
        }
    }
}

/// One replay in its own shadow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct RehearsalRun {
    pub arm: Arm,
    /// The shadow's answer, redacted with the space's identifiers.
    pub answer: String,
    /// The judge: the finding's problem is still in the answer. `None`
    /// when the replay or the judge call gave no verdict.
    pub still: Option<bool>,
    pub reason: String,
    /// What else the replay changed (the shadow diff of rows, files, held
    /// sends and refusals), redacted; empty when nothing.
    pub side_effects: Vec<String>,
    /// The shadow's own spend on this replay.
    pub cost: f64,
}

/// What `mercury review rehearse` attaches to a triage row (and approval
/// carries into the ledger).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Rehearsal {
    /// When the snapshot of the live bot every replay was copied from was
    /// taken (RFC 3339; its directory under the shadow root is named after
    /// it). Not its id: `20261205T190734Z` is a digit run the gate would
    /// take for a phone number.
    pub snapshot_at: String,
    /// RFC 3339, UTC.
    pub at: String,
    pub runs: Vec<RehearsalRun>,
    /// Current replays the judge still found the problem in.
    pub current_failed: usize,
    /// Candidate replays the judge found it fixed in.
    pub candidate_passed: usize,
    /// The result in one sentence.
    pub verdict: String,
    /// The replays' cost plus the judge's, all on the shadow's budget.
    pub cost: f64,
    pub currency: String,
}

/// The judge's system prompt for one comparison.
pub(crate) fn compare_instructions() -> &'static str {
    "You check whether a chat bot's reply still shows a problem a reviewer found earlier. \
     Personal identifiers are replaced by placeholders such as [PHONE_1]. Answer with one JSON \
     object only: {\"still\": true or false, \"reason\": \"one sentence\"}."
}

/// The user prompt: the finding, then the replayed exchange (both redacted).
pub(crate) fn compare_prompt(f: &IntakeFinding, user: &str, answer: &str) -> String {
    format!(
        "Compare a replayed reply with an earlier finding.\n\nfinding: {} / {}: {}\n\
         evidence: {}\n\nreplayed exchange:\nuser: {user}\nassistant: {answer}\n",
        f.kind.as_str(),
        f.target_layer.as_str(),
        f.summary,
        f.evidence
    )
}

/// `(still, reason)` of a comparison answer.
pub(crate) fn parse_compare(answer: &str) -> Option<(bool, String)> {
    let start = answer.find('{')?;
    let v: Value = serde_json::Deserializer::from_str(&answer[start..])
        .into_iter::<Value>()
        .next()?
        .ok()?;
    let still = v["still"].as_bool()?;
    let reason = v["reason"]
        .as_str()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(300)
        .collect();
    Some((still, reason))
}

/// A replayed answer as the record keeps it (already redacted).
pub(crate) fn capped(answer: &str) -> String {
    answer.chars().take(ANSWER_CAP).collect()
}

/// The counts and the sentence over every replay.
pub(crate) fn verdict(runs: &[RehearsalRun]) -> (usize, usize, String) {
    let of = |arm: Arm| runs.iter().filter(move |r| r.arm == arm);
    let current_failed = of(Arm::Current).filter(|r| r.still == Some(true)).count();
    let candidate_passed = of(Arm::Candidate)
        .filter(|r| r.still == Some(false))
        .count();
    let (n_current, n_candidate) = (of(Arm::Current).count(), of(Arm::Candidate).count());
    let unjudged = runs.iter().filter(|r| r.still.is_none()).count();
    let mut sentence = if current_failed == 0 {
        format!(
            "did not reproduce: the current profile passed all {n_current} replays, so the \
             candidate's {candidate_passed} of {n_candidate} passes prove nothing"
        )
    } else if candidate_passed == n_candidate {
        format!(
            "the candidate fixes it: current failed {current_failed} of {n_current}, candidate \
             passed {candidate_passed} of {n_candidate}"
        )
    } else {
        format!(
            "the candidate does not fix it every time: current failed {current_failed} of \
             {n_current}, candidate passed {candidate_passed} of {n_candidate}"
        )
    };
    if unjudged > 0 {
        sentence.push_str(&format!("; {unjudged} replay(s) had no verdict"));
    }
    (current_failed, candidate_passed, sentence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(arm: Arm, still: Option<bool>) -> RehearsalRun {
        RehearsalRun {
            arm,
            answer: "a".into(),
            still,
            reason: String::new(),
            side_effects: Vec::new(),
            cost: 0.0,
        }
    }

    #[test]
    fn review_rehearse_verdict_needs_the_current_profile_to_fail() {
        use Arm::*;
        let fixed = [
            run(Current, Some(true)),
            run(Current, Some(true)),
            run(Current, Some(true)),
            run(Candidate, Some(false)),
            run(Candidate, Some(false)),
            run(Candidate, Some(false)),
        ];
        let (f, p, s) = verdict(&fixed);
        assert_eq!((f, p), (3, 3));
        assert!(s.starts_with("the candidate fixes it"), "{s}");
        // The noise floor: the current profile passing is no reproduction.
        let noise = [
            run(Current, Some(false)),
            run(Current, Some(false)),
            run(Current, Some(false)),
            run(Candidate, Some(false)),
            run(Candidate, Some(false)),
            run(Candidate, Some(false)),
        ];
        let (f, _, s) = verdict(&noise);
        assert_eq!(f, 0);
        assert!(s.starts_with("did not reproduce"), "{s}");
        let partial = [
            run(Current, Some(true)),
            run(Candidate, Some(true)),
            run(Candidate, None),
        ];
        let (_, p, s) = verdict(&partial);
        assert_eq!(p, 0);
        assert!(
            s.contains("does not fix it every time") && s.ends_with("1 replay(s) had no verdict"),
            "{s}"
        );
    }

    #[test]
    fn review_rehearse_compare_answers_parse_or_give_no_verdict() {
        assert_eq!(
            parse_compare("ok {\"still\": false, \"reason\": \"It says Paris.\"}"),
            Some((false, "It says Paris.".into()))
        );
        assert_eq!(parse_compare("{\"still\": \"no\"}"), None);
        assert_eq!(parse_compare("yes"), None);
    }
}
