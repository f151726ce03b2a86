//! Space links (`space_links`) and their audit trail (`space_link_audit`).
//!
//! Must never: delete an audit row, or let a link row be read as a grant
//! anywhere but `links::resolve_link_grant`.

use super::{params, Conn, Dialect, Optional, Query, Row};
use serde::Serialize;

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct SpaceLink {
    pub id: i64,
    pub holder_space_id: String,
    pub target_space_id: String,
    pub level: String,
    pub target_conversation_id: Option<i64>,
    pub disclosure: Option<String>,
    pub created_by: String,
    pub created_at: i64,
    pub updated_by: String,
    pub updated_at: i64,
    pub revoked_by: Option<String>,
    pub revoked_at: Option<i64>,
}

const COLS: &str = "id, holder_space_id, target_space_id, level, target_conversation_id, disclosure, created_by, created_at, updated_by, updated_at, revoked_by, revoked_at";

fn from_row(r: &Row<'_>) -> StoreResult<SpaceLink> {
    Ok(SpaceLink {
        id: r.get(0)?,
        holder_space_id: r.get(1)?,
        target_space_id: r.get(2)?,
        level: r.get(3)?,
        target_conversation_id: r.get(4)?,
        disclosure: r.get(5)?,
        created_by: r.get(6)?,
        created_at: r.get(7)?,
        updated_by: r.get(8)?,
        updated_at: r.get(9)?,
        revoked_by: r.get(10)?,
        revoked_at: r.get(11)?,
    })
}

pub struct NewLink<'a> {
    pub holder: &'a str,
    pub target: &'a str,
    pub level: &'a str,
    pub conversation: Option<i64>,
    pub disclosure: Option<&'a str>,
    pub by: &'a str,
}

pub fn insert(conn: &Conn, l: &NewLink<'_>) -> StoreResult<SpaceLink> {
    let now = now_ms();
    let id: i64 = conn.query_row(
        "INSERT INTO space_links (holder_space_id, target_space_id, level, target_conversation_id, disclosure, created_by, created_at, updated_by, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6, ?7) RETURNING id",
        params![l.holder, l.target, l.level, l.conversation, l.disclosure, l.by, now], |r| r.get(0))?;
    get(conn, id)?.ok_or_else(|| StoreError::NotFound("link just created".into()))
}

pub fn get(conn: &Conn, id: i64) -> StoreResult<Option<SpaceLink>> {
    conn.query_row(
        &format!("SELECT {COLS} FROM space_links WHERE id = ?1"),
        params![id],
        from_row,
    )
    .optional()
}

/// Active edges from `holder` to `target` or to `*` (never the holder itself).
pub fn active_edges(conn: &Conn, holder: &str, target: &str) -> StoreResult<Vec<SpaceLink>> {
    conn.query_all(
        &format!(
            "SELECT {COLS} FROM space_links
         WHERE holder_space_id = ?1 AND (target_space_id = ?2 OR target_space_id = '*')
           AND revoked_at IS NULL AND ?1 <> ?2"
        ),
        params![holder, target],
        from_row,
    )
}

/// An active edge as the act-as step reads it: id, level, conversation filter.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeRow {
    pub id: i64,
    pub level: String,
    pub conversation: Option<i64>,
}

/// Everything the act-as step needs to decide one request, read by
/// [`act_as_view`] in one statement.
#[derive(Debug, Clone, PartialEq)]
pub struct ActAsView {
    /// The holder space exists.
    pub holder_exists: bool,
    /// The caller's role in the holder: the forced role if one was given,
    /// else the stored role, else the member or the none role.
    pub holder_role: String,
    /// The holder's stored permission override of that role, if any.
    pub holder_override: Option<String>,
    /// The target space exists.
    pub target_exists: bool,
    /// The target's stored override of the key asked for (its `admin` set).
    pub target_override: Option<String>,
    /// Active edges holder → target and holder → `*` (none when the target
    /// does not exist or is the holder), oldest first.
    pub edges: Vec<EdgeRow>,
}

/// The names [`act_as_view`] resolves a role with: the layer above owns
/// them (`perms`), so they are passed in, never spelled here.
pub struct RoleNames<'a> {
    /// A role that wins over any stored one (a global admin's `admin`, an
    /// ask token's fixed role), if any.
    pub forced: Option<&'a str>,
    /// The role of a caller with no stored role who has spoken in the holder.
    pub member: &'a str,
    /// The role of anyone else.
    pub none: &'a str,
    /// The target's config key of its admin set (`role.admin.permissions`).
    pub target_key: &'a str,
}

/// The act-as step's one read (issue 32): whether holder and target exist,
/// the caller's role in the holder and that role's override, the target's
/// admin override and the active edges holder → target (and → `*`).
/// Nothing of it is kept between requests (D-003: computed on every call,
/// never cached), so a revoke or a role change is seen by the very next
/// request.
///
/// How it is read differs by backend, the answer does not (the storage
/// contract suite holds both to it): on PostgreSQL, where every statement
/// is a round trip, one prepared statement; on SQLite, in-process, six
/// small cached statements on the same connection, because the one
/// statement measured about 0.2 ms a request there (bench links) against a
/// few microseconds for the six.
pub fn act_as_view(
    conn: &Conn,
    holder: &str,
    caller: &str,
    target: &str,
    names: &RoleNames<'_>,
) -> StoreResult<ActAsView> {
    let mut view = match conn.dialect() {
        Dialect::Postgres => act_as_view_one_statement(conn, holder, caller, target, names)?,
        Dialect::Sqlite => act_as_view_statements(conn, holder, caller, target, names)?,
    };
    view.edges.sort_by_key(|e| e.id);
    Ok(view)
}

/// The holder's override key of `role`: the shape of `perms::override_key`.
fn role_key(role: &str) -> String {
    format!("role.{role}.permissions")
}

fn act_as_view_statements(
    conn: &Conn,
    holder: &str,
    caller: &str,
    target: &str,
    names: &RoleNames<'_>,
) -> StoreResult<ActAsView> {
    let exists = |id: &str| -> StoreResult<bool> {
        Ok(conn
            .query_opt(
                "SELECT 1 FROM spaces WHERE id = ?1",
                params![id],
                |_| Ok(()),
            )?
            .is_some())
    };
    let config = |space: &str, key: &str| -> StoreResult<Option<String>> {
        conn.query_opt(
            "SELECT value FROM space_config WHERE space_id = ?1 AND key = ?2",
            params![space, key],
            |r| r.get(0),
        )
    };
    let holder_exists = exists(holder)?;
    let holder_role = match names.forced {
        Some(role) => role.to_owned(),
        None => match conn.query_opt(
            "SELECT role FROM space_roles WHERE space_id = ?1 AND caller_id = ?2",
            params![holder, caller],
            |r| r.get::<_, String>(0),
        )? {
            Some(role) => role,
            None => {
                let member = conn
                    .query_opt(
                        "SELECT 1 FROM members WHERE space_id = ?1 AND caller_id = ?2",
                        params![holder, caller],
                        |_| Ok(()),
                    )?
                    .is_some();
                if member { names.member } else { names.none }.to_owned()
            }
        },
    };
    let holder_override = config(holder, &role_key(&holder_role))?;
    let target_exists = exists(target)?;
    let (target_override, edges) = if target_exists {
        let edges = conn.query_all(
            "SELECT id, level, target_conversation_id FROM space_links
              WHERE holder_space_id = ?1 AND (target_space_id = ?2 OR target_space_id = '*')
                AND revoked_at IS NULL AND holder_space_id <> ?2",
            params![holder, target],
            |r| {
                Ok(EdgeRow {
                    id: r.get(0)?,
                    level: r.get(1)?,
                    conversation: r.get(2)?,
                })
            },
        )?;
        (config(target, names.target_key)?, edges)
    } else {
        (None, Vec::new())
    };
    Ok(ActAsView {
        holder_exists,
        holder_role,
        holder_override,
        target_exists,
        target_override,
        edges,
    })
}

/// One row (kind 0) carries the spaces and roles; every other row (kind 1)
/// is an edge, in no particular order (sorted by the caller).
fn act_as_view_one_statement(
    conn: &Conn,
    holder: &str,
    caller: &str,
    target: &str,
    names: &RoleNames<'_>,
) -> StoreResult<ActAsView> {
    let mut view = ActAsView {
        holder_exists: false,
        holder_role: names.none.to_owned(),
        holder_override: None,
        target_exists: false,
        target_override: None,
        edges: Vec::new(),
    };
    conn.for_each(
        "SELECT 0 AS kind, NULL AS edge_id, NULL AS edge_level, NULL AS edge_conversation,
                (SELECT COUNT(*) FROM spaces WHERE id = ?1) AS holder_exists,
                r.role,
                (SELECT value FROM space_config
                  WHERE space_id = ?1 AND key = 'role.' || r.role || '.permissions') AS holder_override,
                (SELECT COUNT(*) FROM spaces WHERE id = ?2) AS target_exists,
                (SELECT value FROM space_config WHERE space_id = ?2 AND key = ?7) AS target_override
           FROM (SELECT COALESCE(CAST(?4 AS TEXT),
                                 (SELECT role FROM space_roles WHERE space_id = ?1 AND caller_id = ?3),
                                 CASE WHEN EXISTS (SELECT 1 FROM members WHERE space_id = ?1 AND caller_id = ?3)
                                      THEN CAST(?5 AS TEXT) ELSE CAST(?6 AS TEXT) END) AS role) AS r
         UNION ALL
         SELECT 1, l.id, l.level, l.target_conversation_id, NULL, NULL, NULL, NULL, NULL
           FROM space_links l
          WHERE l.holder_space_id = ?1 AND (l.target_space_id = ?2 OR l.target_space_id = '*')
            AND l.revoked_at IS NULL AND l.holder_space_id <> ?2
            AND EXISTS (SELECT 1 FROM spaces WHERE id = ?2)",
        params![
            holder,
            target,
            caller,
            names.forced,
            names.member,
            names.none,
            names.target_key
        ],
        |r| {
            if r.get::<_, i64>(0)? == 0 {
                view.holder_exists = r.get::<_, i64>(4)? > 0;
                view.holder_role = r.get(5)?;
                view.holder_override = r.get(6)?;
                view.target_exists = r.get::<_, i64>(7)? > 0;
                view.target_override = r.get(8)?;
            } else {
                view.edges.push(EdgeRow {
                    id: r.get(1)?,
                    level: r.get(2)?,
                    conversation: r.get(3)?,
                });
            }
            Ok(())
        },
    )?;
    Ok(view)
}

/// Every edge (active or revoked) where `space` is the holder, the target, or
/// reached through a wildcard.
pub fn touching(conn: &Conn, space: &str) -> StoreResult<Vec<SpaceLink>> {
    conn.query_all(&format!(
        "SELECT {COLS} FROM space_links
         WHERE holder_space_id = ?1 OR target_space_id = ?1 OR (target_space_id = '*' AND holder_space_id <> ?1)
         ORDER BY id"
    ), params![space], from_row)
}

pub fn update(
    conn: &Conn,
    id: i64,
    level: Option<&str>,
    disclosure: Option<&str>,
    by: &str,
) -> StoreResult<SpaceLink> {
    let n = conn.execute(
        "UPDATE space_links SET level = COALESCE(?2, level), disclosure = COALESCE(?3, disclosure), updated_by = ?4, updated_at = ?5
         WHERE id = ?1 AND revoked_at IS NULL",
        params![id, level, disclosure, by, now_ms()],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("active link {id}")));
    }
    get(conn, id)?.ok_or_else(|| StoreError::NotFound(format!("link {id}")))
}

pub fn revoke(conn: &Conn, id: i64, by: &str) -> StoreResult<SpaceLink> {
    let n = conn.execute(
        "UPDATE space_links SET revoked_by = ?2, revoked_at = ?3 WHERE id = ?1 AND revoked_at IS NULL",
        params![id, by, now_ms()],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("active link {id}")));
    }
    get(conn, id)?.ok_or_else(|| StoreError::NotFound(format!("link {id}")))
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, utoipa::ToSchema)]
pub struct AuditRow {
    pub id: i64,
    pub at: i64,
    pub caller_id: String,
    pub action: String,
    pub holder_space_id: Option<String>,
    pub target_space_id: Option<String>,
    pub link_id: Option<i64>,
    pub level: Option<String>,
    pub method: Option<String>,
    pub route: Option<String>,
    pub body_summary: Option<String>,
    pub status: Option<i64>,
    pub detail: Option<String>,
    /// The concrete request path (`/api/prefs/tone`); `route` is its pattern.
    pub path: Option<String>,
    /// The run whose token made the request (an agent turn), if any.
    pub run_id: Option<String>,
    /// What an update changed, where the route knows it (JSON text).
    pub before_value: Option<String>,
    pub after_value: Option<String>,
}

pub fn audit(conn: &Conn, a: &AuditRow) -> StoreResult<i64> {
    let id: i64 = conn.query_row(
        "INSERT INTO space_link_audit (at, caller_id, action, holder_space_id, target_space_id, link_id, level, method, route, body_summary, status, detail, path, run_id, before_value, after_value)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) RETURNING id",
        params![
            now_ms(),
            a.caller_id,
            a.action,
            a.holder_space_id,
            a.target_space_id,
            a.link_id,
            a.level,
            a.method,
            a.route,
            a.body_summary,
            a.status,
            a.detail,
            a.path,
            a.run_id,
            a.before_value,
            a.after_value
        ], |r| r.get(0))?;
    Ok(id)
}

/// Deletes the audit rows written before `before` (`links.audit_keep_days`);
/// how many it deleted.
pub fn prune_audit(conn: &Conn, before: i64) -> StoreResult<u64> {
    let n = conn.execute(
        "DELETE FROM space_link_audit WHERE at < ?1",
        params![before],
    )?;
    Ok(n as u64)
}

/// Completes an act-as row written before its handler ran (or in its
/// write's transaction): the status, and what the update changed where the
/// route said so. `false` when there is no row `id` (the transaction that
/// wrote it did not commit).
pub fn audit_finish(
    conn: &Conn,
    id: i64,
    status: i64,
    detail: Option<&str>,
    before: Option<&str>,
    after: Option<&str>,
) -> StoreResult<bool> {
    let n = conn.execute(
        "UPDATE space_link_audit SET status = ?2, detail = COALESCE(?3, detail),
           before_value = COALESCE(?4, before_value), after_value = COALESCE(?5, after_value)
         WHERE id = ?1",
        params![id, status, detail, before, after],
    )?;
    Ok(n > 0)
}

/// Revokes every active edge where `space` is the holder or the target
/// (not the wildcard edges of other holders: they reach "every other space",
/// present and future, by design). Returns the revoked edges.
pub fn revoke_touching(conn: &Conn, space: &str, by: &str) -> StoreResult<Vec<SpaceLink>> {
    let ids: Vec<i64> = {
        conn.query_all("SELECT id FROM space_links WHERE (holder_space_id = ?1 OR target_space_id = ?1) AND revoked_at IS NULL ORDER BY id", params![space], |r| r.get(0))?
    };
    ids.into_iter().map(|id| revoke(conn, id, by)).collect()
}

/// Audit rows where `space` is the holder or the target, newest first.
pub fn audit_for(conn: &Conn, space: &str, limit: u32) -> StoreResult<Vec<AuditRow>> {
    audit_query(
        conn,
        "holder_space_id = ?1 OR target_space_id = ?1",
        Some(space),
        limit,
    )
}

/// The active edge with exactly this holder, target and conversation
/// filter, if there is one (a second would be a duplicate).
pub fn active_duplicate(
    conn: &Conn,
    holder: &str,
    target: &str,
    conversation: Option<i64>,
) -> StoreResult<Option<i64>> {
    conn.query_row(
        "SELECT id FROM space_links
             WHERE holder_space_id = ?1 AND target_space_id = ?2
               AND target_conversation_id IS ?3 AND revoked_at IS NULL
             ORDER BY id LIMIT 1",
        params![holder, target, conversation],
        |r| r.get(0),
    )
    .optional()
}

/// Every edge of the instance, active or revoked (global admins).
pub fn all(conn: &Conn) -> StoreResult<Vec<SpaceLink>> {
    conn.query_all(
        &format!("SELECT {COLS} FROM space_links ORDER BY id"),
        params![],
        from_row,
    )
}

/// Every audit row of the instance, newest first (global admins).
pub fn audit_all(conn: &Conn, limit: u32) -> StoreResult<Vec<AuditRow>> {
    audit_query(conn, "1 = 1", None, limit)
}

fn audit_query(
    conn: &Conn,
    filter: &str,
    space: Option<&str>,
    limit: u32,
) -> StoreResult<Vec<AuditRow>> {
    let sql = |limit_at: &str| {
        format!(
        "SELECT id, at, caller_id, action, holder_space_id, target_space_id, link_id, level, method, route, body_summary, status, detail, path, run_id, before_value, after_value
         FROM space_link_audit WHERE {filter} ORDER BY id DESC LIMIT {limit_at}"
    )
    };
    // Every placeholder is used: PostgreSQL types each from its use, and an
    // unused one has none.
    match space {
        Some(space) => conn.query_all(&sql("?2"), params![space, limit], audit_from_row),
        None => conn.query_all(&sql("?1"), params![limit], audit_from_row),
    }
}

fn audit_from_row(r: &Row<'_>) -> StoreResult<AuditRow> {
    Ok(AuditRow {
        id: r.get(0)?,
        at: r.get(1)?,
        caller_id: r.get(2)?,
        action: r.get(3)?,
        holder_space_id: r.get(4)?,
        target_space_id: r.get(5)?,
        link_id: r.get(6)?,
        level: r.get(7)?,
        method: r.get(8)?,
        route: r.get(9)?,
        body_summary: r.get(10)?,
        status: r.get(11)?,
        detail: r.get(12)?,
        path: r.get(13)?,
        run_id: r.get(14)?,
        before_value: r.get(15)?,
        after_value: r.get(16)?,
    })
}

/// What a link change touched: a config key, a preference, a role's
/// permission set (stored as its config key) or a caller's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Config,
    Preference,
    Permissions,
    Role,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Config => "config",
            ChangeKind::Preference => "preference",
            ChangeKind::Permissions => "permissions",
            ChangeKind::Role => "role",
        }
    }

    pub fn parse(raw: &str) -> Option<ChangeKind> {
        [
            ChangeKind::Config,
            ChangeKind::Preference,
            ChangeKind::Permissions,
            ChangeKind::Role,
        ]
        .into_iter()
        .find(|k| k.as_str() == raw)
    }
}

/// One change made through a space link (`link_changes`), with the value it
/// replaced, so revoking or downgrading the link can put that value back.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct LinkChange {
    pub id: i64,
    pub link_id: i64,
    pub space_id: String,
    /// `config`, `preference`, `permissions` or `role`.
    pub kind: String,
    /// The config or preference key (a permission set's is
    /// `role.<role>.permissions`), or the caller id of a role.
    pub key: String,
    /// What was there before the change (none: the key or role was absent).
    pub before_value: Option<String>,
    /// Who had written the value before (`updated_by`, `granted_by`).
    pub before_by: Option<String>,
    /// The link that had granted the role before, if one had.
    pub before_link_id: Option<i64>,
    /// What the link wrote (none: it deleted the key or revoked the role).
    pub after_value: Option<String>,
    pub at: i64,
    /// A direct write changed the value since.
    pub superseded: bool,
    pub settled_at: Option<i64>,
    /// `restored`, `kept` or `gone` (the space was deleted), once settled.
    pub outcome: Option<String>,
}

const CHANGE_COLS: &str = "id, link_id, space_id, kind, key, before_value, before_by, before_link_id, after_value, at, superseded, settled_at, outcome";

fn change_from_row(r: &Row<'_>) -> StoreResult<LinkChange> {
    Ok(LinkChange {
        id: r.get(0)?,
        link_id: r.get(1)?,
        space_id: r.get(2)?,
        kind: r.get(3)?,
        key: r.get(4)?,
        before_value: r.get(5)?,
        before_by: r.get(6)?,
        before_link_id: r.get(7)?,
        after_value: r.get(8)?,
        at: r.get(9)?,
        superseded: r.get::<_, i64>(10)? != 0,
        settled_at: r.get(11)?,
        outcome: r.get(12)?,
    })
}

/// A change about to be recorded.
pub struct NewChange<'a> {
    pub link: i64,
    pub space: &'a str,
    pub kind: ChangeKind,
    pub key: &'a str,
    pub before: Option<&'a str>,
    pub before_by: Option<&'a str>,
    pub before_link: Option<i64>,
    pub after: Option<&'a str>,
}

pub fn record_change(conn: &Conn, c: &NewChange<'_>) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO link_changes (link_id, space_id, kind, key, before_value, before_by, before_link_id, after_value, at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            c.link,
            c.space,
            c.kind.as_str(),
            c.key,
            c.before,
            c.before_by,
            c.before_link,
            c.after,
            now_ms()
        ],
    )?;
    Ok(())
}

/// A direct write (no link) changed `key`: every open link change on it is
/// superseded, so no revoke puts the link's earlier value over it. Only the
/// rows not superseded yet are written (through their own partial index):
/// rewriting every open change on the key made each direct write of a key
/// that a link keeps writing slower than the last (`bench links`' direct
/// `PUT /api/prefs` went from 0.25 to 0.84 ms over 8,000 requests). How
/// many it marked.
pub fn supersede_changes(
    conn: &Conn,
    space: &str,
    kind: ChangeKind,
    key: &str,
) -> StoreResult<usize> {
    conn.execute(SUPERSEDE_SQL, params![space, kind.as_str(), key])
}

pub(crate) const SUPERSEDE_SQL: &str = "UPDATE link_changes SET superseded = 1
     WHERE space_id = ?1 AND kind = ?2 AND key = ?3 AND settled_at IS NULL AND superseded = 0";

/// The link's changes not yet settled by a revoke or downgrade, oldest first.
pub fn open_changes(conn: &Conn, link: i64) -> StoreResult<Vec<LinkChange>> {
    conn.query_all(&format!(
        "SELECT {CHANGE_COLS} FROM link_changes WHERE link_id = ?1 AND settled_at IS NULL ORDER BY id"
    ), params![link], change_from_row)
}

/// The first open change on `key` by another link, made after change `after_id`.
pub fn next_open_change_on(
    conn: &Conn,
    space: &str,
    kind: &str,
    key: &str,
    not_link: i64,
    after_id: i64,
) -> StoreResult<Option<LinkChange>> {
    conn.query_row(
        &format!(
            "SELECT {CHANGE_COLS} FROM link_changes
                 WHERE space_id = ?1 AND kind = ?2 AND key = ?3 AND link_id <> ?4 AND id > ?5
                   AND settled_at IS NULL
                 ORDER BY id LIMIT 1"
        ),
        params![space, kind, key, not_link, after_id],
        change_from_row,
    )
    .optional()
}

/// Hands a settled link's earlier value on to the change that followed it.
pub fn set_change_before(
    conn: &Conn,
    id: i64,
    before: Option<&str>,
    before_by: Option<&str>,
    before_link: Option<i64>,
) -> StoreResult<()> {
    conn.execute(
        "UPDATE link_changes SET before_value = ?2, before_by = ?3, before_link_id = ?4 WHERE id = ?1",
        params![id, before, before_by, before_link],
    )?;
    Ok(())
}

pub fn settle_change(conn: &Conn, id: i64, outcome: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE link_changes SET settled_at = ?2, outcome = ?3 WHERE id = ?1",
        params![id, now_ms(), outcome],
    )?;
    Ok(())
}

/// Every change made through the link, settled or not, oldest first.
pub fn changes_of_link(conn: &Conn, link: i64) -> StoreResult<Vec<LinkChange>> {
    conn.query_all(
        &format!("SELECT {CHANGE_COLS} FROM link_changes WHERE link_id = ?1 ORDER BY id"),
        params![link],
        change_from_row,
    )
}
