//! Forgetting one person on request (`mrctl senders forget PLATFORM:ID`):
//! the rows that are theirs, per space and instance-wide.
//!
//! Must never: delete another person's words in a group (only the
//! forgotten sender's rows there), drop a deny decision an operator made
//! against them, or touch an identity mapping (an operator's own row).

use serde::Serialize;

use super::{params, Conn, Query, StoreResult, Tx};

/// What one space held of the person and no longer does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SpaceForgotten {
    pub space_id: String,
    /// Their messages, and every message of their direct conversations
    /// (the bot's replies to them there are about them too).
    pub messages: usize,
    /// The ids deleted, for the reports that cite them.
    #[serde(skip)]
    pub message_ids: Vec<i64>,
    /// Their membership, role and mute rows.
    pub memberships: usize,
    /// The runs they started or that answered one of those messages, with
    /// their traces (the prompts held their words).
    pub runs: usize,
    /// Replies queued to their direct conversations.
    pub outbox: usize,
    /// Their direct conversations here, for [`forget_instance`].
    #[serde(skip)]
    pub direct_conversations: Vec<i64>,
}

/// What the instance held of the person outside any space.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct InstanceForgotten {
    /// Their direct conversations' rows (and each one's reply window).
    pub conversations: usize,
    /// Their pending pairing requests.
    pub pairings: usize,
    /// What was sent to their direct conversations outside any space (a
    /// pairing code, the approval).
    pub outbox: usize,
    /// Their allow decision, if there was one.
    pub allowed: usize,
    /// A deny decision about them stays: the operator's protection.
    pub deny_kept: bool,
    /// The operator their id is linked to (`mrctl identities unlink` removes it).
    pub linked_to: Option<String>,
}

/// The spaces holding any row of `sender`'s: messages, a membership, a role
/// or a mute.
pub fn spaces_of(conn: &Conn, sender: &str) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT space_id FROM messages WHERE sender_id = ?1
         UNION SELECT space_id FROM members WHERE caller_id = ?1
         UNION SELECT space_id FROM space_roles WHERE caller_id = ?1
         UNION SELECT space_id FROM mutes WHERE caller_id = ?1
         ORDER BY 1",
        params![sender],
        |r| r.get(0),
    )
}

/// The direct conversations `sender` wrote in (on their own platform).
fn direct_conversations(conn: &Conn, sender: &str, platform: &str) -> StoreResult<Vec<i64>> {
    conn.query_all(
        "SELECT c.id FROM conversations c
         WHERE c.kind = 'dm' AND c.platform = ?2
           AND EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.sender_id = ?1)
         ORDER BY c.id",
        params![sender, platform],
        |r| r.get(0),
    )
}

/// Deletes what `space` holds of `sender` (platform `platform`), in one
/// transaction of the space's writer.
pub fn forget_in_space(
    tx: &Tx,
    space: &str,
    sender: &str,
    platform: &str,
) -> StoreResult<SpaceForgotten> {
    let direct = direct_conversations(tx, sender, platform)?;
    let mut ids: Vec<i64> = tx.query_all(
        "SELECT id FROM messages WHERE space_id = ?1 AND sender_id = ?2",
        params![space, sender],
        |r| r.get(0),
    )?;
    let mut outbox = 0;
    for c in &direct {
        ids.extend(tx.query_all(
            "SELECT id FROM messages WHERE space_id = ?1 AND conversation_id = ?2",
            params![space, c],
            |r| r.get::<_, i64>(0),
        )?);
        outbox += tx.execute(
            "DELETE FROM outbox WHERE space_id = ?1 AND conversation_id = ?2",
            params![space, c],
        )?;
    }
    ids.sort_unstable();
    ids.dedup();
    let runs: Vec<String> = {
        let mut runs: Vec<String> = tx.query_all(
            "SELECT id FROM runs WHERE space_id = ?1 AND caller_id = ?2",
            params![space, sender],
            |r| r.get(0),
        )?;
        for id in &ids {
            runs.extend(tx.query_all(
                "SELECT id FROM runs WHERE space_id = ?1 AND trigger_message_id = ?2
                 UNION SELECT run_id FROM messages WHERE id = ?2 AND run_id IS NOT NULL",
                params![space, id],
                |r| r.get::<_, String>(0),
            )?);
        }
        runs.sort_unstable();
        runs.dedup();
        runs
    };
    for run in &runs {
        tx.execute("DELETE FROM run_steps WHERE run_id = ?1", params![run])?;
        tx.execute(
            "DELETE FROM runs WHERE id = ?1 AND space_id = ?2",
            params![run, space],
        )?;
    }
    for id in &ids {
        tx.execute(
            "DELETE FROM messages WHERE id = ?1 AND space_id = ?2",
            params![id, space],
        )?;
    }
    let mut memberships = 0;
    for table in ["members", "space_roles", "mutes"] {
        memberships += tx.execute(
            &format!("DELETE FROM {table} WHERE space_id = ?1 AND caller_id = ?2"),
            params![space, sender],
        )?;
    }
    Ok(SpaceForgotten {
        space_id: space.to_owned(),
        messages: ids.len(),
        message_ids: ids,
        memberships,
        runs: runs.len(),
        outbox,
        direct_conversations: direct,
    })
}

/// Deletes the instance-wide rows of `sender`: run after every space's
/// [`forget_in_space`], with the direct conversations they found (a
/// conversation that still has a message is someone else's too: kept).
pub fn forget_instance(
    tx: &Tx,
    sender: &str,
    platform: &str,
    direct: &[i64],
) -> StoreResult<InstanceForgotten> {
    let (mut conversations, mut outbox) = (0, 0);
    for id in direct {
        let external: Option<String> = tx.query_opt(
            "SELECT external_id FROM conversations c WHERE id = ?1 AND kind = 'dm'
               AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id)",
            params![id],
            |r| r.get(0),
        )?;
        let Some(external) = external else { continue };
        outbox += tx.execute(
            "DELETE FROM outbox WHERE platform = ?1 AND external_id = ?2 AND conversation_id IS NULL",
            params![platform, external],
        )?;
        tx.execute(
            "DELETE FROM chat_windows WHERE platform = ?1 AND conversation = ?2",
            params![platform, external],
        )?;
        conversations += tx.execute("DELETE FROM conversations WHERE id = ?1", params![id])?;
    }
    // A stranger's pairing replies are queued by conversation id, before any
    // conversation row exists.
    let pending: Vec<String> = tx.query_all(
        "SELECT conversation FROM pairings WHERE sender = ?1",
        params![sender],
        |r| r.get(0),
    )?;
    for external in &pending {
        outbox += tx.execute(
            "DELETE FROM outbox WHERE platform = ?1 AND external_id = ?2 AND conversation_id IS NULL",
            params![platform, external],
        )?;
    }
    let pairings = tx.execute("DELETE FROM pairings WHERE sender = ?1", params![sender])?;
    let allowed = tx.execute(
        "DELETE FROM allowed_senders WHERE kind = 'sender' AND subject = ?1 AND status = 'allowed'",
        params![sender],
    )?;
    let denied: i64 = tx.query_row(
        "SELECT COUNT(*) FROM allowed_senders WHERE kind = 'sender' AND subject = ?1 AND status = 'denied'",
        params![sender],
        |r| r.get(0),
    )?;
    let linked_to = tx.query_opt(
        "SELECT caller_id FROM identities WHERE platform_id = ?1",
        params![sender],
        |r| r.get(0),
    )?;
    Ok(InstanceForgotten {
        conversations,
        pairings,
        outbox,
        allowed,
        deny_kept: denied > 0,
        linked_to,
    })
}
