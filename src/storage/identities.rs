//! Identity mappings (`identities`) and their audit trail (`identity_audit`):
//! a platform sender (`telegram:123456`) acts with an operator's rights
//! (`owner`) only through a row a global admin wrote.
//!
//! Must never: map anything but a platform id, or drop an audit row.

use super::{params, Conn, Optional, Query};
use serde::Serialize;

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Identity {
    pub platform_id: String,
    pub caller_id: String,
    pub created_by: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct IdentityAudit {
    pub id: i64,
    pub at: i64,
    pub by: String,
    pub action: String,
    pub platform_id: String,
    pub caller_id: Option<String>,
}

/// The operator a platform id is mapped to, if any. Read only.
pub fn operator_for(conn: &Conn, platform_id: &str) -> StoreResult<Option<String>> {
    conn.query_row(
        "SELECT caller_id FROM identities WHERE platform_id = ?1",
        params![platform_id],
        |r| r.get(0),
    )
    .optional()
}

fn audit(
    conn: &Conn,
    by: &str,
    action: &str,
    platform_id: &str,
    caller_id: Option<&str>,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO identity_audit (at, by_caller, action, platform_id, caller_id) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![now_ms(), by, action, platform_id, caller_id],
    )?;
    Ok(())
}

/// Maps `platform_id` to `caller_id` (replacing an earlier mapping), audited.
pub fn link(conn: &Conn, platform_id: &str, caller_id: &str, by: &str) -> StoreResult<Identity> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO identities (platform_id, caller_id, created_by, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (platform_id) DO UPDATE SET caller_id = excluded.caller_id,
           created_by = excluded.created_by, created_at = excluded.created_at",
        params![platform_id, caller_id, by, now],
    )?;
    audit(conn, by, "link", platform_id, Some(caller_id))?;
    Ok(Identity {
        platform_id: platform_id.into(),
        caller_id: caller_id.into(),
        created_by: by.into(),
        created_at: now,
    })
}

/// Removes a mapping, audited; `NotFound` if there was none.
pub fn unlink(conn: &Conn, platform_id: &str, by: &str) -> StoreResult<String> {
    let was = operator_for(conn, platform_id)?
        .ok_or_else(|| StoreError::NotFound(format!("identity {platform_id}")))?;
    conn.execute(
        "DELETE FROM identities WHERE platform_id = ?1",
        params![platform_id],
    )?;
    audit(conn, by, "unlink", platform_id, Some(&was))?;
    Ok(was)
}

pub fn list(conn: &Conn) -> StoreResult<Vec<Identity>> {
    conn.query_all("SELECT platform_id, caller_id, created_by, created_at FROM identities ORDER BY platform_id", params![], |r| {
        Ok(Identity {
            platform_id: r.get(0)?,
            caller_id: r.get(1)?,
            created_by: r.get(2)?,
            created_at: r.get(3)?,
        })
    })
}

pub fn audit_log(conn: &Conn, limit: u32) -> StoreResult<Vec<IdentityAudit>> {
    conn.query_all("SELECT id, at, by_caller, action, platform_id, caller_id FROM identity_audit ORDER BY id DESC LIMIT ?1", params![limit], |r| {
        Ok(IdentityAudit {
            id: r.get(0)?,
            at: r.get(1)?,
            by: r.get(2)?,
            action: r.get(3)?,
            platform_id: r.get(4)?,
            caller_id: r.get(5)?,
        })
    })
}
