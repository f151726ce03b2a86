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
    /// The rows of what their deleted messages carried (pictures, voice
    /// notes, files).
    pub attachments: usize,
    /// Those files deleted from the workspace's `inbox/`.
    pub inbox_files: usize,
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

/// The person's direct conversations in this space (on their own
/// platform), as a subquery over `?1` (the space), `?2` (the sender) and
/// `?3` (the platform): every statement names all three, as PostgreSQL
/// types its parameters by their use.
const DIRECT: &str = "SELECT c.id FROM conversations c WHERE c.kind = 'dm' AND c.platform = ?3
    AND EXISTS (SELECT 1 FROM messages x WHERE x.conversation_id = c.id AND x.sender_id = ?2 AND x.space_id = ?1)";

/// Their messages in this space, and every message of their direct
/// conversations, as a subquery over `?1`, `?2`, `?3`.
fn mine() -> String {
    format!(
        "SELECT id FROM messages WHERE space_id = ?1 AND (sender_id = ?2 OR conversation_id IN ({DIRECT}))"
    )
}

/// The workspace files (`inbox/…`) kept of what the messages
/// [`forget_in_space`] deletes carried: removed from the workspace before
/// the rows go, so forgetting again still finds any left.
pub fn kept_files(
    conn: &Conn,
    space: &str,
    sender: &str,
    platform: &str,
) -> StoreResult<Vec<String>> {
    conn.query_all(
        &format!(
            "SELECT path FROM attachments WHERE path IS NOT NULL AND message_id IN ({}) ORDER BY id",
            mine()
        ),
        params![space, sender, platform],
        |r| r.get(0),
    )
}

/// Deletes what `space` holds of `sender` (platform `platform`), in one
/// transaction of the space's writer, a statement per table.
pub fn forget_in_space(
    tx: &Tx,
    space: &str,
    sender: &str,
    platform: &str,
) -> StoreResult<SpaceForgotten> {
    let args = params![space, sender, platform];
    let direct: Vec<i64> = tx.query_all(&format!("{DIRECT} ORDER BY c.id"), args, |r| r.get(0))?;
    let mine = mine();
    let ids: Vec<i64> = tx.query_all(&format!("{mine} ORDER BY id"), args, |r| r.get(0))?;
    // The runs they started or that answered one of those messages.
    let runs = format!(
        "SELECT id FROM runs WHERE space_id = ?1 AND (caller_id = ?2 OR trigger_message_id IN ({mine})
           OR id IN (SELECT run_id FROM messages WHERE run_id IS NOT NULL AND id IN ({mine})))"
    );
    tx.execute(
        &format!("DELETE FROM run_steps WHERE run_id IN ({runs})"),
        args,
    )?;
    let run_count = tx.execute(&format!("DELETE FROM runs WHERE id IN ({runs})"), args)?;
    let attachments = tx.execute(
        &format!("DELETE FROM attachments WHERE message_id IN ({mine})"),
        args,
    )?;
    tx.execute(
        &format!(
            "DELETE FROM outbox_files WHERE outbox_id IN
               (SELECT id FROM outbox WHERE space_id = ?1 AND conversation_id IN ({DIRECT}))"
        ),
        args,
    )?;
    let outbox = tx.execute(
        &format!("DELETE FROM outbox WHERE space_id = ?1 AND conversation_id IN ({DIRECT})"),
        args,
    )?;
    tx.execute(&format!("DELETE FROM messages WHERE id IN ({mine})"), args)?;
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
        runs: run_count,
        outbox,
        attachments,
        inbox_files: 0,
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
