//! The sender policy's rows: pending pairing requests of strangers
//! (`pairings`) and the operator's allow and deny decisions
//! (`allowed_senders`, per platform sender or per conversation).
//!
//! Must never: keep an expired request as pending, hold two requests for
//! one sender, or store a pairing beyond the cap it is given.

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::StoreResult;
use crate::clock::now_ms;

/// A stranger's request to talk to the bot, waiting for an operator.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Pairing {
    /// 8 characters of an unambiguous alphabet (no 0/O, 1/I/L).
    pub code: String,
    pub platform: String,
    /// The sender's caller id (`telegram:42`).
    pub sender: String,
    /// The display name the platform gave.
    pub name: Option<String>,
    #[serde(skip)]
    pub conversation: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// What a sender rule targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// One platform sender, everywhere (its DMs).
    Sender,
    /// One conversation (a group) as a whole.
    Conversation,
}

impl RuleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Sender => "sender",
            RuleKind::Conversation => "conversation",
        }
    }
}

/// An operator's decision about a sender or a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    Denied,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
        }
    }

    fn parse(raw: &str) -> Option<Decision> {
        match raw {
            "allowed" => Some(Decision::Allowed),
            "denied" => Some(Decision::Denied),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct SenderRule {
    pub kind: RuleKind,
    pub platform: String,
    /// A sender's caller id (`telegram:42`), or a conversation's platform id.
    pub subject: String,
    pub status: Decision,
    /// Who decided (`upgrade`: seeded from the members an older host had).
    pub decided_by: String,
    pub created_at: i64,
}

const PAIRING_COLS: &str = "code, platform, sender, name, conversation, created_at, expires_at";

fn pairing_from_row(r: &Row<'_>) -> StoreResult<Pairing> {
    Ok(Pairing {
        code: r.get(0)?,
        platform: r.get(1)?,
        sender: r.get(2)?,
        name: r.get(3)?,
        conversation: r.get(4)?,
        created_at: r.get(5)?,
        expires_at: r.get(6)?,
    })
}

/// The operator's decision about `subject`, if any.
pub fn decision(
    conn: &Conn,
    kind: RuleKind,
    platform: &str,
    subject: &str,
) -> StoreResult<Option<Decision>> {
    let raw: Option<String> = conn
        .query_row(
            "SELECT status FROM allowed_senders WHERE kind = ?1 AND platform = ?2 AND subject = ?3",
            params![kind.as_str(), platform, subject],
            |r| r.get(0),
        )
        .optional()?;
    Ok(raw.as_deref().and_then(Decision::parse))
}

/// Records a decision (replacing an earlier one); an allowed or denied
/// sender has no pending request left.
pub fn decide(
    conn: &Conn,
    kind: RuleKind,
    platform: &str,
    subject: &str,
    status: Decision,
    by: &str,
) -> StoreResult<SenderRule> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO allowed_senders (kind, platform, subject, status, decided_by, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (kind, platform, subject) DO UPDATE SET status = excluded.status,
           decided_by = excluded.decided_by, created_at = excluded.created_at",
        params![kind.as_str(), platform, subject, status.as_str(), by, now],
    )?;
    if kind == RuleKind::Sender {
        conn.execute(
            "DELETE FROM pairings WHERE platform = ?1 AND sender = ?2",
            params![platform, subject],
        )?;
    }
    Ok(SenderRule {
        kind,
        platform: platform.to_owned(),
        subject: subject.to_owned(),
        status,
        decided_by: by.to_owned(),
        created_at: now,
    })
}

/// Every decision, senders first, then by platform and subject.
pub fn rules(conn: &Conn) -> StoreResult<Vec<SenderRule>> {
    let rows = conn.query_all(
        "SELECT kind, platform, subject, status, decided_by, created_at FROM allowed_senders
         ORDER BY kind DESC, platform, subject",
        params![],
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, i64>(5)?,
            ))
        },
    )?;
    let mut out = Vec::new();
    for (kind, platform, subject, status, decided_by, created_at) in rows {
        let kind = if kind == "conversation" {
            RuleKind::Conversation
        } else {
            RuleKind::Sender
        };
        // A row the CHECK constraint let in always parses.
        let status = Decision::parse(&status).unwrap_or(Decision::Denied);
        out.push(SenderRule {
            kind,
            platform,
            subject,
            status,
            decided_by,
            created_at,
        });
    }
    Ok(out)
}

/// Deletes the requests that expired by `now`.
pub fn expire(conn: &Conn, now: i64) -> StoreResult<usize> {
    conn.execute("DELETE FROM pairings WHERE expires_at <= ?1", params![now])
}

/// The pending (unexpired) request of `sender`, if any.
pub fn pending_of(
    conn: &Conn,
    platform: &str,
    sender: &str,
    now: i64,
) -> StoreResult<Option<Pairing>> {
    conn
        .query_row(
            &format!(
                "SELECT {PAIRING_COLS} FROM pairings WHERE platform = ?1 AND sender = ?2 AND expires_at > ?3"
            ),
            params![platform, sender, now],
            pairing_from_row,
        )
        .optional()
}

/// How many requests are pending at `now`.
pub fn pending_count(conn: &Conn, now: i64) -> StoreResult<u64> {
    let n: i64 = conn.query_row(
        "SELECT COUNT(*) FROM pairings WHERE expires_at > ?1",
        params![now],
        |r| r.get(0),
    )?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Stores the request `p`, unless `max_pending` requests are pending
/// already, the sender has one, or its code is taken (`None` each time: the
/// stranger gets nothing this time). Expired rows go first, so the cap
/// counts only live requests.
pub fn open(conn: &Conn, p: &Pairing, max_pending: u64) -> StoreResult<Option<Pairing>> {
    expire(conn, p.created_at)?;
    if pending_count(conn, p.created_at)? >= max_pending {
        return Ok(None);
    }
    let n = conn.execute(
        &format!(
            "INSERT INTO pairings ({PAIRING_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING"
        ),
        params![
            p.code,
            p.platform,
            p.sender,
            p.name,
            p.conversation,
            p.created_at,
            p.expires_at
        ],
    )?;
    Ok((n == 1).then(|| p.clone()))
}

/// Every pending request, oldest first.
pub fn list(conn: &Conn, now: i64) -> StoreResult<Vec<Pairing>> {
    conn.query_all(
        &format!(
            "SELECT {PAIRING_COLS} FROM pairings WHERE expires_at > ?1 ORDER BY created_at, code"
        ),
        params![now],
        pairing_from_row,
    )
}

/// Removes and returns the pending request `code` (`None`: no such
/// request, or it expired).
pub fn take(conn: &Conn, code: &str, now: i64) -> StoreResult<Option<Pairing>> {
    let found = conn
        .query_row(
            &format!("SELECT {PAIRING_COLS} FROM pairings WHERE code = ?1 AND expires_at > ?2"),
            params![code, now],
            pairing_from_row,
        )
        .optional()?;
    if found.is_some() {
        conn.execute("DELETE FROM pairings WHERE code = ?1", params![code])?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Conn {
        crate::storage::test_conn()
    }

    fn request(code: &str, sender: &str, at: i64) -> Pairing {
        Pairing {
            code: code.into(),
            platform: "telegram".into(),
            sender: sender.into(),
            name: Some("Stranger".into()),
            conversation: sender.trim_start_matches("telegram:").into(),
            created_at: at,
            expires_at: at + 1000,
        }
    }

    #[test]
    fn pairings_are_capped_expire_and_are_one_per_sender() {
        let conn = db();
        assert!(open(&conn, &request("AAAAAAAA", "telegram:1", 0), 2)
            .unwrap()
            .is_some());
        // The same sender again: no second row.
        assert!(open(&conn, &request("BBBBBBBB", "telegram:1", 1), 2)
            .unwrap()
            .is_none());
        assert!(open(&conn, &request("CCCCCCCC", "telegram:2", 2), 2)
            .unwrap()
            .is_some());
        // The cap: a third stranger gets nothing.
        assert!(open(&conn, &request("DDDDDDDD", "telegram:3", 3), 2)
            .unwrap()
            .is_none());
        assert_eq!(list(&conn, 3).unwrap().len(), 2);
        // Once the first expired, there is room again.
        assert!(open(&conn, &request("EEEEEEEE", "telegram:3", 1000), 2)
            .unwrap()
            .is_some());
        assert_eq!(
            list(&conn, 1000)
                .unwrap()
                .iter()
                .map(|p| p.code.as_str())
                .collect::<Vec<_>>(),
            vec!["CCCCCCCC", "EEEEEEEE"]
        );
        assert!(take(&conn, "AAAAAAAA", 1000).unwrap().is_none());
        assert_eq!(
            take(&conn, "EEEEEEEE", 1000).unwrap().unwrap().sender,
            "telegram:3"
        );
        assert!(take(&conn, "EEEEEEEE", 1000).unwrap().is_none());
    }

    #[test]
    fn a_decision_replaces_the_last_and_clears_the_request() {
        let conn = db();
        open(&conn, &request("AAAAAAAA", "telegram:1", now_ms()), 10).unwrap();
        decide(
            &conn,
            RuleKind::Sender,
            "telegram",
            "telegram:1",
            Decision::Allowed,
            "owner",
        )
        .unwrap();
        assert!(list(&conn, now_ms()).unwrap().is_empty());
        assert_eq!(
            decision(&conn, RuleKind::Sender, "telegram", "telegram:1").unwrap(),
            Some(Decision::Allowed)
        );
        decide(
            &conn,
            RuleKind::Sender,
            "telegram",
            "telegram:1",
            Decision::Denied,
            "owner",
        )
        .unwrap();
        assert_eq!(
            decision(&conn, RuleKind::Sender, "telegram", "telegram:1").unwrap(),
            Some(Decision::Denied)
        );
        assert_eq!(rules(&conn).unwrap().len(), 1);
    }
}
