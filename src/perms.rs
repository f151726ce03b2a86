//! Roles and permissions: the permission names, each role's default set,
//! per-space overrides (`space_config` key `role.<role>.permissions`) and the
//! one `check_perm` every route uses.
//!
//! Must never: hand out the `system` role to a request, or let a grant give a
//! role more permissions than the granter holds.

use std::collections::BTreeSet;

use rusqlite::Connection;

use crate::storage::spaces::{self, KvTable};
use crate::storage::{Cached, StoreResult};

/// Every permission name. The first 18 are the earlier version's built-ins.
pub const ALL_PERMISSIONS: &[&str] = &[
    "prompt",
    "stop",
    "compact",
    "tasks.list",
    "tasks.create",
    "tasks.pause",
    "tasks.resume",
    "tasks.delete",
    "config.get",
    "config.set",
    "roles.list",
    "roles.grant",
    "roles.revoke",
    "permissions.get",
    "permissions.set",
    "spaces.list",
    "spaces.rename",
    "spaces.delete",
    "messages.read",
    "prefs.get",
    "prefs.set",
    "mutes.list",
    "mutes.set",
    "model.get",
    "model.set",
    "send",
    "links.list",
    "links.act",
    "files.read",
    "files.write",
];

pub const ROLE_ADMIN: &str = "admin";
pub const ROLE_MEMBER: &str = "member";
pub const ROLE_SYSTEM: &str = "system";
/// A caller with a valid token but no role or membership in the space.
pub const ROLE_NONE: &str = "none";

pub type PermSet = BTreeSet<&'static str>;

pub fn is_known(name: &str) -> bool {
    ALL_PERMISSIONS.contains(&name)
}

pub fn intern(name: &str) -> Option<&'static str> {
    ALL_PERMISSIONS.iter().copied().find(|p| *p == name)
}

/// Checks a role name given to `roles grant` or `permissions set`.
pub fn validate_role_name(role: &str) -> Result<(), String> {
    if role == ROLE_SYSTEM {
        return Err("the system role is reserved for the host and cannot be granted".into());
    }
    if role == ROLE_NONE {
        return Err("'none' is not a role that can be granted; revoke the role instead".into());
    }
    let ok = !role.is_empty()
        && role.len() <= 32
        && role.starts_with(|c: char| c.is_ascii_lowercase())
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid role name {role:?}: use 1-32 of a-z, 0-9, '-', '_', starting with a letter"
        ))
    }
}

fn defaults(role: &str) -> PermSet {
    match role {
        ROLE_ADMIN | ROLE_SYSTEM => ALL_PERMISSIONS.iter().copied().collect(),
        ROLE_MEMBER => ["prompt"].into_iter().collect(),
        _ => PermSet::new(),
    }
}

pub fn override_key(role: &str) -> String {
    format!("role.{role}.permissions")
}

/// The effective permission set of `role` in `space`.
pub fn role_permissions(conn: &Connection, space: &str, role: &str) -> StoreResult<PermSet> {
    if role == ROLE_SYSTEM {
        return Ok(defaults(ROLE_SYSTEM));
    }
    if role == ROLE_NONE {
        return Ok(PermSet::new());
    }
    match spaces::kv_get(conn, KvTable::Config, space, &override_key(role))? {
        Some(list) => Ok(list.split(',').filter_map(|p| intern(p.trim())).collect()),
        None => Ok(defaults(role)),
    }
}

/// The role a caller holds in a space, without writing anything: global
/// admins are `admin` everywhere; then a granted role; then `member` for a
/// caller who has spoken there; else `none`.
pub fn resolve_role(
    conn: &Connection,
    space: &str,
    caller: &str,
    global_admin: bool,
) -> StoreResult<String> {
    if global_admin {
        return Ok(ROLE_ADMIN.into());
    }
    if let Some(role) = spaces::stored_role(conn, space, caller)? {
        return Ok(role);
    }
    let is_member = conn
        .query_row_cached(
            "SELECT 1 FROM members WHERE space_id = ?1 AND caller_id = ?2",
            [space, caller],
            |_| Ok(()),
        )
        .map(|_| true)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(false),
            e => Err(e),
        })?;
    Ok(if is_member { ROLE_MEMBER } else { ROLE_NONE }.into())
}

/// Every role that has a grant or an override in the space, plus admin and member.
pub fn roles_in_space(conn: &Connection, space: &str) -> StoreResult<BTreeSet<String>> {
    let mut roles: BTreeSet<String> = [ROLE_ADMIN.to_string(), ROLE_MEMBER.to_string()].into();
    for g in spaces::list_roles(conn, space)? {
        roles.insert(g.role);
    }
    for e in spaces::kv_list(conn, KvTable::Config, space)? {
        if let Some(r) = e
            .key
            .strip_prefix("role.")
            .and_then(|k| k.strip_suffix(".permissions"))
        {
            roles.insert(r.to_owned());
        }
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec() {
        assert_eq!(ALL_PERMISSIONS.len(), 30);
        assert_eq!(defaults(ROLE_ADMIN).len(), 30);
        assert_eq!(defaults(ROLE_MEMBER), ["prompt"].into_iter().collect());
        assert!(defaults("custom").is_empty());
    }

    #[test]
    fn system_and_none_cannot_be_granted() {
        assert!(validate_role_name("system").is_err());
        assert!(validate_role_name("none").is_err());
        assert!(validate_role_name("Editor").is_err());
        assert!(validate_role_name("editor").is_ok());
    }
}
