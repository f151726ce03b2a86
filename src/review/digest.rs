//! The owner digest (M1.4): after a scan, one DM to `review.owner` (a caller
//! id) with the finding count, the top three findings and the command that
//! shows the whole report, queued in the outbox of the owner's DM
//! conversation ([`owner_dm`]: the owner's own id or any platform id mapped
//! to it with `identities link`, on a platform an adapter delivers, never the
//! console). A blocked report gets a digest that says so and nothing else.
//! The last digest is also kept in `<data dir>/reviews/digest.json`, so it
//! stays readable (`mrctl review digest`) when no DM could take it.
//!
//! The digest is an outbox item only, not a message row: it is not part of
//! the conversation's history, so no later turn or scan reads it back.
//!
//! Must never: carry content from a blocked report, send anything the gate
//! did not pass (the findings part is gated; the closing command line holds
//! only the report's date and is appended after), end with a server file
//! path (a phone cannot open it), or write to a space except through that
//! space's actor.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;
use serde_json::json;

use crate::redaction::{kind_list, IdentifierGate, IdentifierKind};
use crate::review::report::{count, Report};
use crate::runtime::Runtime;
use crate::storage::conversations::{self, Conversation};
use crate::storage::{identities, Conn, StoreResult};

/// The file under the reviews dir that holds the last digest.
pub(crate) const LATEST_FILE: &str = "digest.json";

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
    /// The platform of that conversation (`telegram`, ...).
    pub platform: Option<String>,
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

/// The last review digest, as `GET /api/review/digest` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub(crate) struct LatestDigest {
    /// The review date it is about (YYYY-MM-DD).
    pub date: String,
    /// When it was made (RFC 3339, UTC).
    pub at: String,
    /// The digest as sent (or as it would have been sent).
    pub text: String,
    /// Queued to the owner's DM.
    pub sent: bool,
    /// Where it went: `<platform>` of the DM conversation.
    pub platform: Option<String>,
    pub conversation_id: Option<i64>,
    /// Why it was not sent.
    pub reason: Option<String>,
}

/// Keeps `digest` as the last one (atomically: a temp file, then a rename).
pub(crate) fn save_latest(reviews: &Path, digest: &LatestDigest) -> std::io::Result<()> {
    std::fs::create_dir_all(reviews)?;
    let text = serde_json::to_string_pretty(digest).map_err(std::io::Error::other)?;
    super::report::persist(reviews, &reviews.join(LATEST_FILE), text.as_bytes())
}

/// The last digest, `None` before the first.
pub(crate) fn read_latest(reviews: &Path) -> std::io::Result<Option<LatestDigest>> {
    match std::fs::read_to_string(reviews.join(LATEST_FILE)) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The conversation the owner's digest goes to: the most recently seen DM
/// of the owner's own id or of a platform id mapped to it (`identities
/// link`), on a platform an adapter delivers. The console and the API are
/// never one: nothing delivers their outbox, so a digest queued there would
/// say "queued" and never arrive.
pub(crate) fn owner_dm(conn: &Conn, owner: &str) -> StoreResult<Option<Conversation>> {
    let mut senders = vec![owner.to_owned()];
    senders.extend(
        identities::list(conn)?
            .into_iter()
            .filter(|i| i.caller_id == owner)
            .map(|i| i.platform_id),
    );
    let mut best: Option<Conversation> = None;
    for sender in &senders {
        let Some(c) = conversations::dm_of(conn, sender)? else {
            continue;
        };
        if crate::ids::RESERVED_PLATFORMS.contains(&c.platform.as_str()) {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|b| c.last_seen_at > b.last_seen_at)
        {
            best = Some(c);
        }
    }
    Ok(best)
}

/// Why the owner's digest has nowhere to go, or `None` when it has a DM.
/// Said at start-up and by `mercury status` so the operator learns it before
/// the first scan.
pub(crate) async fn no_destination(rt: &Runtime) -> Option<String> {
    let owner = rt.settings.review.owner.trim().to_owned();
    if owner.is_empty() {
        return Some(
            "review.owner is not set: the review digest is kept for `mrctl review digest` only"
                .into(),
        );
    }
    let who = owner.clone();
    match rt.store.read(move |c| owner_dm(c, &who)).await {
        Ok(Some(_)) => None,
        Ok(None) => Some(format!(
            "review.owner {owner:?} has no DM with the bot on a chat platform (its own id or one \
             linked to it with `mrctl identities link`): the review digest is kept for \
             `mrctl review digest` until the owner writes to the bot in a DM"
        )),
        Err(e) => Some(format!("the review owner's DM could not be looked up: {e}")),
    }
}

/// The digest of a written report. `Err` when its content fails the gate.
/// It ends with the command that shows the report, never a server path.
pub(crate) fn report_digest(
    report: &Report,
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
    text.push_str(&format!(
        "\nThe whole report: mrctl review report {}",
        report.date
    ));
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
    let conversation = match rt.store.read(move |c| owner_dm(c, &who)).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            return DigestOutcome::not_sent(
                "review.owner has no DM with the bot on a chat platform (its own id or one \
                 linked to it with `mrctl identities link`); read it with `mrctl review digest`",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot look up the review owner's DM conversation");
            return DigestOutcome::not_sent("the DM conversation could not be read");
        }
    };
    let conversation_id = conversation.id;
    let platform = conversation.platform.clone();
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
            platform: Some(platform),
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
                    trace: None,
                    friction: Vec::new(),
                })
                .collect(),
            friction: Default::default(),
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
        // Issue 25: the last line is a command a phone's reader can pass on,
        // not a path on the server.
        let last = text.lines().last().unwrap();
        assert_eq!(last, "The whole report: mrctl review report 2026-09-28");
        assert!(!text.contains('/'), "{text}");
    }

    #[test]
    fn review_digest_content_is_gated() {
        let list = IdentifierGate::new(&RedactionList::new().with_name("Olivia Bakker")).unwrap();
        assert!(report_digest(&report(0), &list).is_ok());
        let mut r = report(1);
        r.findings[0].summary = "Olivia asked".into();
        assert!(report_digest(&r, &list).is_err());
    }

    #[test]
    fn the_latest_digest_is_kept_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_latest(dir.path()).unwrap(), None);
        let d = LatestDigest {
            date: "2026-09-28".into(),
            at: "2026-09-29T03:00:00Z".into(),
            text: "Conversation review 2026-09-28: 0 findings".into(),
            sent: false,
            platform: None,
            conversation_id: None,
            reason: Some("no DM".into()),
        };
        save_latest(dir.path(), &d).unwrap();
        assert_eq!(read_latest(dir.path()).unwrap(), Some(d));
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
