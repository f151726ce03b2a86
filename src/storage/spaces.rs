//! Spaces and everything keyed by one space alone: members, roles, config,
//! preferences, mutes and the session boundary.
//!
//! Must never: create a space or a member row from a lookup (`get_space` and
//! `member_role` only read).

use super::{params, Conn, Optional, Query, Row};
use serde::Serialize;

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Space {
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

fn space_from_row(r: &Row<'_>) -> StoreResult<Space> {
    let tags: String = r.get(2)?;
    Ok(Space {
        id: r.get(0)?,
        name: r.get(1)?,
        tags: tags
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
        created_at: r.get(3)?,
        updated_at: r.get(4)?,
    })
}

pub fn get_space(conn: &Conn, id: &str) -> StoreResult<Option<Space>> {
    conn.query_row(
        "SELECT id, name, tags, created_at, updated_at FROM spaces WHERE id = ?1",
        params![id],
        space_from_row,
    )
    .optional()
}

pub fn space_exists(conn: &Conn, id: &str) -> StoreResult<bool> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM spaces WHERE id = ?1",
            params![id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

pub fn list_spaces(conn: &Conn) -> StoreResult<Vec<Space>> {
    conn.query_all(
        "SELECT id, name, tags, created_at, updated_at FROM spaces ORDER BY created_at, id",
        params![],
        space_from_row,
    )
}

/// Inserts the row; `Conflict` if the id is taken. Workspace files are the caller's job.
pub fn create_space(conn: &Conn, id: &str, name: &str, tags: &[String]) -> StoreResult<Space> {
    let now = now_ms();
    if space_exists(conn, id)? {
        return Err(StoreError::Conflict(format!("space {id} already exists")));
    }
    conn.execute(
        "INSERT INTO spaces (id, name, tags, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?4)",
        params![id, name, tags.join(","), now],
    )?;
    Ok(Space {
        id: id.into(),
        name: name.into(),
        tags: tags.to_vec(),
        created_at: now,
        updated_at: now,
    })
}

pub fn rename_space(conn: &Conn, id: &str, name: &str) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE spaces SET name = ?2, updated_at = ?3 WHERE id = ?1",
        params![id, name, now_ms()],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("space {id}")));
    }
    Ok(())
}

#[derive(Debug, Clone, Serialize, Default, PartialEq, utoipa::ToSchema)]
pub struct DeletedCounts {
    pub messages: usize,
    pub tasks: usize,
    pub roles: usize,
    pub members: usize,
    pub config: usize,
    pub preferences: usize,
    pub conversations_unlinked: usize,
}

/// Deletes the space and its rows in one transaction (the caller's), returning what went.
pub fn delete_space(conn: &Conn, id: &str) -> StoreResult<DeletedCounts> {
    if !space_exists(conn, id)? {
        return Err(StoreError::NotFound(format!("space {id}")));
    }
    let count = |sql: &str| -> StoreResult<usize> {
        Ok(conn.query_row(sql, params![id], |r| r.get::<_, i64>(0))? as usize)
    };
    let counts = DeletedCounts {
        messages: count("SELECT COUNT(*) FROM messages WHERE space_id = ?1")?,
        tasks: count("SELECT COUNT(*) FROM tasks WHERE space_id = ?1")?,
        roles: count("SELECT COUNT(*) FROM space_roles WHERE space_id = ?1")?,
        members: count("SELECT COUNT(*) FROM members WHERE space_id = ?1")?,
        config: count("SELECT COUNT(*) FROM space_config WHERE space_id = ?1")?,
        preferences: count("SELECT COUNT(*) FROM space_preferences WHERE space_id = ?1")?,
        conversations_unlinked: count("SELECT COUNT(*) FROM conversations WHERE space_id = ?1")?,
    };
    conn.execute("DELETE FROM spaces WHERE id = ?1", params![id])?;
    Ok(counts)
}

/// Records that a caller spoke in a space (ingress only; never from an API read).
pub fn touch_member(
    conn: &Conn,
    space: &str,
    caller: &str,
    display_name: Option<&str>,
) -> StoreResult<()> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO members (space_id, caller_id, display_name, first_seen_at, last_seen_at)
         VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT (space_id, caller_id) DO UPDATE SET
           last_seen_at = excluded.last_seen_at,
           display_name = COALESCE(excluded.display_name, members.display_name)",
        params![space, caller, display_name, now],
    )?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Member {
    pub caller_id: String,
    pub display_name: Option<String>,
    pub first_seen_at: i64,
    pub last_seen_at: i64,
}

/// Whether `caller` has written in `space` (a member row exists).
pub fn is_member(conn: &Conn, space: &str, caller: &str) -> StoreResult<bool> {
    Ok(conn
        .query_opt(
            "SELECT 1 FROM members WHERE space_id = ?1 AND caller_id = ?2",
            params![space, caller],
            |_| Ok(()),
        )?
        .is_some())
}

pub fn list_members(conn: &Conn, space: &str) -> StoreResult<Vec<Member>> {
    conn.query_all("SELECT caller_id, display_name, first_seen_at, last_seen_at FROM members WHERE space_id = ?1 ORDER BY caller_id", params![space], |r| {
        Ok(Member {
            caller_id: r.get(0)?,
            display_name: r.get(1)?,
            first_seen_at: r.get(2)?,
            last_seen_at: r.get(3)?,
        })
    })
}

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct RoleGrant {
    pub caller_id: String,
    pub role: String,
    pub granted_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Set when the role was granted through a space link: revoking or
    /// downgrading that link removes the role.
    pub link_id: Option<i64>,
}

/// The stored role of a caller in a space, if one was granted. Read only.
pub fn stored_role(conn: &Conn, space: &str, caller: &str) -> StoreResult<Option<String>> {
    conn.query_row(
        "SELECT role FROM space_roles WHERE space_id = ?1 AND caller_id = ?2",
        params![space, caller],
        |r| r.get(0),
    )
    .optional()
}

/// A caller's stored role row, as a link change remembers it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleRow {
    pub role: String,
    pub granted_by: Option<String>,
    /// The link it was granted through (none: a direct grant).
    pub link_id: Option<i64>,
}

/// A caller's stored role row, if one was granted. Read only.
pub fn role_row(conn: &Conn, space: &str, caller: &str) -> StoreResult<Option<RoleRow>> {
    conn.query_row(
        "SELECT role, granted_by, link_id FROM space_roles WHERE space_id = ?1 AND caller_id = ?2",
        params![space, caller],
        |r| {
            Ok(RoleRow {
                role: r.get(0)?,
                granted_by: r.get(1)?,
                link_id: r.get(2)?,
            })
        },
    )
    .optional()
}

pub fn list_roles(conn: &Conn, space: &str) -> StoreResult<Vec<RoleGrant>> {
    conn.query_all("SELECT caller_id, role, granted_by, created_at, updated_at, link_id FROM space_roles WHERE space_id = ?1 ORDER BY caller_id", params![space], |r| {
        Ok(RoleGrant {
            caller_id: r.get(0)?,
            role: r.get(1)?,
            granted_by: r.get(2)?,
            created_at: r.get(3)?,
            updated_at: r.get(4)?,
            link_id: r.get(5)?,
        })
    })
}

/// Grants a role; `link` is the space link it was granted through (a direct
/// grant clears an earlier link's claim on the row).
pub fn set_role(
    conn: &Conn,
    space: &str,
    caller: &str,
    role: &str,
    by: &str,
    link: Option<i64>,
) -> StoreResult<()> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO space_roles (space_id, caller_id, role, granted_by, created_at, updated_at, link_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)
         ON CONFLICT (space_id, caller_id) DO UPDATE SET role = excluded.role,
           granted_by = excluded.granted_by, updated_at = excluded.updated_at, link_id = excluded.link_id",
        params![space, caller, role, by, now, link],
    )?;
    Ok(())
}

/// A role granted through a space link.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct LinkRole {
    pub space_id: String,
    pub caller_id: String,
    pub role: String,
}

/// The roles granted through `link` (in any space it reached).
pub fn roles_of_link(conn: &Conn, link: i64) -> StoreResult<Vec<LinkRole>> {
    conn.query_all("SELECT space_id, caller_id, role FROM space_roles WHERE link_id = ?1 ORDER BY space_id, caller_id", params![link], |r| {
        Ok(LinkRole {
            space_id: r.get(0)?,
            caller_id: r.get(1)?,
            role: r.get(2)?,
        })
    })
}

/// Removes every role granted through `link`; returns what went.
pub fn remove_link_roles(conn: &Conn, link: i64) -> StoreResult<Vec<LinkRole>> {
    let gone = roles_of_link(conn, link)?;
    conn.execute("DELETE FROM space_roles WHERE link_id = ?1", params![link])?;
    Ok(gone)
}

/// Everyone who is a caller of `space`: a granted role or a member row.
pub fn callers_of(conn: &Conn, space: &str) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT caller_id FROM space_roles WHERE space_id = ?1
         UNION SELECT caller_id FROM members WHERE space_id = ?1",
        params![space],
        |r| r.get(0),
    )
}

/// The spaces where `caller` holds a role (granted, or member by having spoken).
pub fn spaces_of_caller(conn: &Conn, caller: &str) -> StoreResult<Vec<Space>> {
    conn.query_all(
        "SELECT id, name, tags, created_at, updated_at FROM spaces WHERE id IN (
           SELECT space_id FROM space_roles WHERE caller_id = ?1
           UNION SELECT space_id FROM members WHERE caller_id = ?1)
         ORDER BY created_at, id",
        params![caller],
        space_from_row,
    )
}

/// Removes a grant; the caller falls back to `member`. Returns whether a row went.
pub fn revoke_role(conn: &Conn, space: &str, caller: &str) -> StoreResult<bool> {
    Ok(conn.execute(
        "DELETE FROM space_roles WHERE space_id = ?1 AND caller_id = ?2",
        params![space, caller],
    )? > 0)
}

/// Key/value tables that share one shape: `space_config` and `space_preferences`.
#[derive(Debug, Clone, Copy)]
pub enum KvTable {
    Config,
    Preferences,
}

impl KvTable {
    fn name(self) -> &'static str {
        match self {
            KvTable::Config => "space_config",
            KvTable::Preferences => "space_preferences",
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct KvEntry {
    pub key: String,
    pub value: String,
    pub updated_by: String,
    pub updated_at: i64,
}

pub fn kv_list(conn: &Conn, table: KvTable, space: &str) -> StoreResult<Vec<KvEntry>> {
    let sql = format!(
        "SELECT key, value, updated_by, updated_at FROM {} WHERE space_id = ?1 ORDER BY key",
        table.name()
    );
    conn.query_all(&sql, params![space], |r| {
        Ok(KvEntry {
            key: r.get(0)?,
            value: r.get(1)?,
            updated_by: r.get(2)?,
            updated_at: r.get(3)?,
        })
    })
}

pub fn kv_get(conn: &Conn, table: KvTable, space: &str, key: &str) -> StoreResult<Option<String>> {
    let sql = format!(
        "SELECT value FROM {} WHERE space_id = ?1 AND key = ?2",
        table.name()
    );
    conn.query_row(&sql, params![space, key], |r| r.get(0))
        .optional()
}

/// A key's value and who wrote it last.
pub fn kv_entry(
    conn: &Conn,
    table: KvTable,
    space: &str,
    key: &str,
) -> StoreResult<Option<(String, String)>> {
    let sql = format!(
        "SELECT value, updated_by FROM {} WHERE space_id = ?1 AND key = ?2",
        table.name()
    );
    conn.query_row(&sql, params![space, key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

pub fn kv_set(
    conn: &Conn,
    table: KvTable,
    space: &str,
    key: &str,
    value: &str,
    by: &str,
) -> StoreResult<()> {
    let sql = format!(
        "INSERT INTO {} (space_id, key, value, updated_by, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (space_id, key) DO UPDATE SET value = excluded.value,
           updated_by = excluded.updated_by, updated_at = excluded.updated_at",
        table.name()
    );
    conn.execute(&sql, params![space, key, value, by, now_ms()])?;
    Ok(())
}

pub fn kv_delete(conn: &Conn, table: KvTable, space: &str, key: &str) -> StoreResult<bool> {
    let sql = format!(
        "DELETE FROM {} WHERE space_id = ?1 AND key = ?2",
        table.name()
    );
    Ok(conn.execute(&sql, params![space, key])? > 0)
}

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Mute {
    pub caller_id: String,
    pub until: Option<i64>,
    pub reason: Option<String>,
    pub updated_by: String,
    pub updated_at: i64,
}

pub fn list_mutes(conn: &Conn, space: &str) -> StoreResult<Vec<Mute>> {
    conn.query_all("SELECT caller_id, until, reason, updated_by, updated_at FROM mutes WHERE space_id = ?1 ORDER BY caller_id", params![space], |r| {
        Ok(Mute {
            caller_id: r.get(0)?,
            until: r.get(1)?,
            reason: r.get(2)?,
            updated_by: r.get(3)?,
            updated_at: r.get(4)?,
        })
    })
}

pub fn set_mute(
    conn: &Conn,
    space: &str,
    caller: &str,
    until: Option<i64>,
    reason: Option<&str>,
    by: &str,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO mutes (space_id, caller_id, until, reason, updated_by, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (space_id, caller_id) DO UPDATE SET until = excluded.until, reason = excluded.reason,
           updated_by = excluded.updated_by, updated_at = excluded.updated_at",
        params![space, caller, until, reason, by, now_ms()],
    )?;
    Ok(())
}

pub fn delete_mute(conn: &Conn, space: &str, caller: &str) -> StoreResult<bool> {
    Ok(conn.execute(
        "DELETE FROM mutes WHERE space_id = ?1 AND caller_id = ?2",
        params![space, caller],
    )? > 0)
}

pub fn is_muted(conn: &Conn, space: &str, caller: &str, now: i64) -> StoreResult<bool> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM mutes WHERE space_id = ?1 AND caller_id = ?2 AND (until IS NULL OR until > ?3)",
            params![space, caller, now],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// The message id below which history is no longer sent to the model.
pub fn session_boundary(conn: &Conn, space: &str) -> StoreResult<(i64, Option<String>)> {
    Ok(conn
        .query_row(
            "SELECT boundary_message_id, summary FROM session_state WHERE space_id = ?1",
            params![space],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .unwrap_or((0, None)))
}

pub fn set_session_boundary(
    conn: &Conn,
    space: &str,
    boundary: i64,
    summary: Option<&str>,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO session_state (space_id, boundary_message_id, summary, updated_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (space_id) DO UPDATE SET boundary_message_id = excluded.boundary_message_id,
           summary = excluded.summary, updated_at = excluded.updated_at",
        params![space, boundary, summary, now_ms()],
    )?;
    Ok(())
}
/// A space's group trigger: its own `trigger.*` settings, else the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRule {
    pub mode: String,
    pub patterns: Vec<String>,
    pub case_sensitive: bool,
}

impl TriggerRule {
    pub fn new(mode: &str, patterns: &str, case_sensitive: bool) -> Self {
        Self {
            mode: mode.to_owned(),
            patterns: crate::config::trigger_patterns(patterns),
            case_sensitive,
        }
    }
}

/// The trigger rule of `space` (ingress decides by it; a turn strips its words).
pub fn trigger_rule(
    conn: &Conn,
    defaults: &crate::config::TriggerConfig,
    space: &str,
) -> StoreResult<TriggerRule> {
    let get = |k: &str| kv_get(conn, KvTable::Config, space, k);
    let mode = get("trigger.match")?.unwrap_or_else(|| defaults.mode.clone());
    let patterns = get("trigger.patterns")?
        .filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| defaults.patterns.clone());
    let cs = get("trigger.case_sensitive")?.as_deref() == Some("true");
    Ok(TriggerRule::new(&mode, &patterns, cs))
}
