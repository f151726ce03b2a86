//! The owner digest (M1.4): after a scan, one DM to `review.owner` (a caller
//! id) with the finding count, the top three findings and the report path,
//! queued in the outbox of that caller's DM conversation
//! ([`conversations::dm_of`]). A blocked report gets a digest that says so
//! and nothing else.
//!
//! The digest is an outbox item only, not a message row: it is not part of
//! the conversation's history, so no later turn or scan reads it back.
//!
//! Must never: carry content from a blocked report, send anything the gate
//! did not pass (the findings part is gated; the report path is the
//! operator's own file path and is appended after), or write to a space
//! except through that space's actor.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;
use serde_json::json;

use crate::redaction::{kind_list, IdentifierGate, IdentifierKind};
use crate::review::report::{count, Report};
use crate::runtime::Runtime;
use crate::storage::conversations;

/// The outbox `space_id` of a digest whose DM conversation feeds no space.
pub(crate) const NO_SPACE: &str = "(review)";

/// Findings listed in the digest.
pub(crate) const TOP: usize = 3;

/// What became of the digest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DigestOutcome {
    pub sent: bool,
    /// The digest says the report was blocked.
    pub blocked: bool,
    pub conversation_id: Option<i64>,
    pub outbox_id: Option<i64>,
    /// Why it was not sent.
    pub reason: Option<String>,
}

impl DigestOutcome {
    pub fn not_sent(reason: impl Into<String>) -> Self {
        Self {
            reason: Some(reason.into()),
            ..Default::default()
        }
    }
}

/// The digest of a written report. `Err` when its content fails the gate.
pub(crate) fn report_digest(
    report: &Report,
    report_path: &Path,
    gate: &IdentifierGate,
) -> Result<String, BTreeSet<IdentifierKind>> {
    let n = report.findings.len();
    let mut text = format!(
        "Conversation review {}: {} finding{} in {} exchange{} ({} space{} judged).",
        report.date,
        count(n as u64),
        plural(n as u64),
        count(report.footer.exchanges_judged),
        plural(report.footer.exchanges_judged),
        count(report.footer.spaces_judged),
        plural(report.footer.spaces_judged),
    );
    if n > 0 {
        text.push_str(&format!("\nTop {}:", n.min(TOP)));
        for (i, f) in report.findings.iter().take(TOP).enumerate() {
            text.push_str(&format!(
                "\n{}. {} (severity {}, {}, {}) in {} at [msg {}]: {}",
                i + 1,
                f.kind.as_str(),
                f.severity,
                f.scope.as_str(),
                f.target_layer.as_str(),
                f.space,
                f.message_id,
                f.summary
            ));
        }
    }
    let ids = report
        .findings
        .iter()
        .flat_map(|f| [f.message_id, f.reply_id])
        .collect();
    gate.check_with_ids(&text, &ids).map_err(|g| g.kinds)?;
    text.push_str(&format!("\nReport: {}", report_path.display()));
    Ok(text)
}

/// The digest of a blocked report: the fact and the kinds, no content.
pub(crate) fn blocked_digest(date: &str, kinds: &BTreeSet<IdentifierKind>, run_id: &str) -> String {
    format!(
        "Conversation review {date}: blocked by the identifier gate ({} found in the text to be \
         written). No report was written. Run {run_id}.",
        kind_list(kinds)
    )
}

/// Queues `text` for the DM conversation of `owner`.
pub(crate) async fn deliver(
    rt: &Runtime,
    spaces: &dyn super::SpaceWriter,
    owner: &str,
    text: String,
    blocked: bool,
) -> DigestOutcome {
    if owner.trim().is_empty() {
        return DigestOutcome::not_sent("review.owner is not set");
    }
    let who = owner.to_owned();
    let conversation = match rt.store.read(move |c| conversations::dm_of(c, &who)).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            return DigestOutcome::not_sent("review.owner has no DM conversation with the bot yet")
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot look up the review owner's DM conversation");
            return DigestOutcome::not_sent("the DM conversation could not be read");
        }
    };
    let conversation_id = conversation.id;
    let space = conversation.space_id.clone();
    let outbound = rt.outbound.clone();
    let enqueue = move |tx: &crate::storage::Tx<'_>| {
        // In shadow mode the digest is a transcript line, never an outbox row.
        let id = outbound.enqueue(
            tx,
            &crate::runtime::OutboundSend {
                space: conversation.space_id.as_deref().unwrap_or(NO_SPACE),
                conversation_id: Some(conversation.id),
                platform: &conversation.platform,
                external_id: &conversation.external_id,
                message_id: None,
                text: &text,
                source: "digest",
            },
        )?;
        Ok(json!(id))
    };
    let queued = match space {
        // One writer per space: the outbox item of a space goes through its actor.
        Some(space) => match crate::ids::SpaceId::parse(&space) {
            Ok(id) => spaces
                .write_in_space(&id, Box::new(enqueue))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        None => rt.store.write(enqueue).await.map_err(|e| e.to_string()),
    };
    match queued {
        Ok(v) => DigestOutcome {
            sent: true,
            blocked,
            conversation_id: Some(conversation_id),
            outbox_id: v.as_i64(),
            reason: None,
        },
        Err(e) => {
            tracing::error!(error = %e, "cannot queue the review digest");
            DigestOutcome::not_sent("the digest could not be queued")
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redaction::RedactionList;
    use crate::review::judge::{FindingKind, Scope, TargetLayer};
    use crate::review::report::{Footer, ReportFinding};

    fn report(n: usize) -> Report {
        Report {
            date: "2026-09-28".into(),
            kind: "daily",
            window_since: String::new(),
            window_until: String::new(),
            window_hours: 24,
            findings: (0..n)
                .map(|i| ReportFinding {
                    space: "s".into(),
                    message_id: i as i64 + 1,
                    reply_id: i as i64 + 2,
                    kind: FindingKind::WrongAnswer,
                    scope: Scope::Space,
                    target_layer: TargetLayer::Memory,
                    severity: 3,
                    summary: format!("finding {i}"),
                    evidence: "e".into(),
                    suggestion: "s".into(),
                })
                .collect(),
            footer: Footer {
                spaces_judged: 1,
                exchanges_judged: 9,
                ..Default::default()
            },
        }
    }

    #[test]
    fn review_digest_lists_the_count_top_three_and_path() {
        let text = report_digest(
            &report(5),
            Path::new("/data/reviews/x/report.md"),
            &IdentifierGate::new(&RedactionList::new()).unwrap(),
        )
        .unwrap();
        assert!(
            text.starts_with(
                "Conversation review 2026-09-28: 5 findings in 9 exchanges (1 space judged)."
            ),
            "{text}"
        );
        assert!(
            text.contains("1. wrong_answer (severity 3, space, memory) in s at [msg 1]: finding 0")
        );
        assert!(text.contains("3. wrong_answer"));
        assert!(!text.contains("4. "), "{text}");
        assert!(text.ends_with("Report: /data/reviews/x/report.md"));
    }

    #[test]
    fn review_digest_content_is_gated_but_not_the_path() {
        let list = IdentifierGate::new(&RedactionList::new().with_name("Olivia Bakker")).unwrap();
        assert!(report_digest(&report(0), Path::new("/home/olivia/report.md"), &list).is_ok());
        let mut r = report(1);
        r.findings[0].summary = "Olivia asked".into();
        assert!(report_digest(&r, Path::new("/x"), &list).is_err());
    }

    #[test]
    fn review_blocked_digest_names_kinds_only() {
        let kinds = [IdentifierKind::Phone].into_iter().collect();
        let text = blocked_digest("2026-09-28", &kinds, "run1");
        assert!(
            text.contains("blocked by the identifier gate (phone found"),
            "{text}"
        );
    }
}
