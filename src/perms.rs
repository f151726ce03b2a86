//! Roles and permissions: the `Permission` enum, each role's default set,
//! per-space overrides (`space_config` key `role.<role>.permissions`) and the
//! one `check_perm` every route uses.
//!
//! Must never: hand out the `system` role to a request, or let a grant give a
//! role more permissions than the granter holds.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::storage::spaces::{self, KvTable};
use crate::storage::{Conn, StoreResult};

/// A permission a role can hold. The wire name (`tasks.create`) is what
/// config overrides, grants and responses carry; the variant is what code
/// checks, so a typo is a compile error rather than a permission nobody holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// `prompt`
    Prompt,
    /// `stop`
    Stop,
    /// `compact`
    Compact,
    /// `tasks.list`
    TasksList,
    /// `tasks.create`
    TasksCreate,
    /// `tasks.pause`
    TasksPause,
    /// `tasks.resume`
    TasksResume,
    /// `tasks.delete`
    TasksDelete,
    /// `config.get`
    ConfigGet,
    /// `config.set`
    ConfigSet,
    /// `roles.list`
    RolesList,
    /// `roles.grant`
    RolesGrant,
    /// `roles.revoke`
    RolesRevoke,
    /// `permissions.get`
    PermissionsGet,
    /// `permissions.set`
    PermissionsSet,
    /// `spaces.list`
    SpacesList,
    /// `spaces.rename`
    SpacesRename,
    /// `spaces.delete`
    SpacesDelete,
    /// `messages.read`
    MessagesRead,
    /// `prefs.get`
    PrefsGet,
    /// `prefs.set`
    PrefsSet,
    /// `mutes.list`
    MutesList,
    /// `mutes.set`
    MutesSet,
    /// `model.get`
    ModelGet,
    /// `model.set`
    ModelSet,
    /// `send`
    Send,
    /// `links.list`
    LinksList,
    /// `links.act`
    LinksAct,
    /// `files.read`
    FilesRead,
    /// `files.write`
    FilesWrite,
    /// `ext.manage`: enable or disable an installed extension in the space.
    ExtManage,
}

impl Permission {
    /// Every permission. The first 18 are the earlier version's built-ins.
    pub const ALL: &'static [Permission] = &[
        Permission::Prompt,
        Permission::Stop,
        Permission::Compact,
        Permission::TasksList,
        Permission::TasksCreate,
        Permission::TasksPause,
        Permission::TasksResume,
        Permission::TasksDelete,
        Permission::ConfigGet,
        Permission::ConfigSet,
        Permission::RolesList,
        Permission::RolesGrant,
        Permission::RolesRevoke,
        Permission::PermissionsGet,
        Permission::PermissionsSet,
        Permission::SpacesList,
        Permission::SpacesRename,
        Permission::SpacesDelete,
        Permission::MessagesRead,
        Permission::PrefsGet,
        Permission::PrefsSet,
        Permission::MutesList,
        Permission::MutesSet,
        Permission::ModelGet,
        Permission::ModelSet,
        Permission::Send,
        Permission::LinksList,
        Permission::LinksAct,
        Permission::FilesRead,
        Permission::FilesWrite,
        Permission::ExtManage,
    ];

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Permission::Prompt => "prompt",
            Permission::Stop => "stop",
            Permission::Compact => "compact",
            Permission::TasksList => "tasks.list",
            Permission::TasksCreate => "tasks.create",
            Permission::TasksPause => "tasks.pause",
            Permission::TasksResume => "tasks.resume",
            Permission::TasksDelete => "tasks.delete",
            Permission::ConfigGet => "config.get",
            Permission::ConfigSet => "config.set",
            Permission::RolesList => "roles.list",
            Permission::RolesGrant => "roles.grant",
            Permission::RolesRevoke => "roles.revoke",
            Permission::PermissionsGet => "permissions.get",
            Permission::PermissionsSet => "permissions.set",
            Permission::SpacesList => "spaces.list",
            Permission::SpacesRename => "spaces.rename",
            Permission::SpacesDelete => "spaces.delete",
            Permission::MessagesRead => "messages.read",
            Permission::PrefsGet => "prefs.get",
            Permission::PrefsSet => "prefs.set",
            Permission::MutesList => "mutes.list",
            Permission::MutesSet => "mutes.set",
            Permission::ModelGet => "model.get",
            Permission::ModelSet => "model.set",
            Permission::Send => "send",
            Permission::LinksList => "links.list",
            Permission::LinksAct => "links.act",
            Permission::FilesRead => "files.read",
            Permission::FilesWrite => "files.write",
            Permission::ExtManage => "ext.manage",
        }
    }

    /// The permissions that manage reach: who may act across links, who
    /// holds which role, what a role holds, and whether the space exists
    /// under its name. A change made through a space link never gives a
    /// role of the target one of these (issue 23): a holder could otherwise
    /// widen the target's roles and keep, after the link is revoked, reach
    /// it was never given as a row. A later permission of this kind (an
    /// extension's `ext.manage`) joins this list, and the rule follows.
    pub const fn manages_reach() -> &'static [Permission] {
        &[
            Permission::ExtManage,
            Permission::LinksAct,
            Permission::LinksList,
            Permission::PermissionsSet,
            Permission::RolesGrant,
            Permission::RolesRevoke,
            Permission::SpacesDelete,
            Permission::SpacesRename,
        ]
    }

    /// Whether this permission is one of [`Permission::manages_reach`].
    pub fn is_reach(self) -> bool {
        Self::manages_reach().contains(&self)
    }

    /// The permission a wire name names, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|p| p.as_str() == name)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// Sets and lists order by wire name, as they did when they held strings, so
// every response keeps its order.
impl Ord for Permission {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for Permission {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for Permission {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

pub(crate) const ROLE_ADMIN: &str = "admin";
pub(crate) const ROLE_MEMBER: &str = "member";
pub(crate) const ROLE_SYSTEM: &str = "system";
/// A caller with a valid token but no role or membership in the space.
pub(crate) const ROLE_NONE: &str = "none";

pub(crate) type PermSet = BTreeSet<Permission>;

/// Checks a role name given to `roles grant` or `permissions set`.
pub(crate) fn validate_role_name(role: &str) -> Result<(), String> {
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
        ROLE_ADMIN | ROLE_SYSTEM => Permission::ALL.iter().copied().collect(),
        ROLE_MEMBER => [Permission::Prompt].into_iter().collect(),
        _ => PermSet::new(),
    }
}

pub(crate) fn override_key(role: &str) -> String {
    format!("role.{role}.permissions")
}

/// The effective permission set of `role` in `space`.
pub(crate) fn role_permissions(conn: &Conn, space: &str, role: &str) -> StoreResult<PermSet> {
    if role == ROLE_SYSTEM || role == ROLE_NONE {
        return Ok(permissions_from(role, None));
    }
    let stored = spaces::kv_get(conn, KvTable::Config, space, &override_key(role))?;
    Ok(permissions_from(role, stored.as_deref()))
}

/// The effective permission set of `role` given its stored override (the
/// value of [`override_key`] in the space's config, already read): the one
/// rule [`role_permissions`] and the act-as step's single read share.
pub(crate) fn permissions_from(role: &str, stored: Option<&str>) -> PermSet {
    if role == ROLE_SYSTEM {
        return defaults(ROLE_SYSTEM);
    }
    if role == ROLE_NONE {
        return PermSet::new();
    }
    match stored {
        Some(list) => list
            .split(',')
            .filter_map(|p| Permission::parse(p.trim()))
            .collect(),
        None => defaults(role),
    }
}

/// The role a caller holds in a space, without writing anything: global
/// admins are `admin` everywhere; then a granted role; then `member` for a
/// caller who has spoken there; else `none`.
pub(crate) fn resolve_role(
    conn: &Conn,
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
    let is_member = spaces::is_member(conn, space, caller)?;
    Ok(if is_member { ROLE_MEMBER } else { ROLE_NONE }.into())
}

/// Every role that has a grant or an override in the space, plus admin and member.
pub(crate) fn roles_in_space(conn: &Conn, space: &str) -> StoreResult<BTreeSet<String>> {
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
        assert_eq!(Permission::ALL.len(), 31);
        assert_eq!(defaults(ROLE_ADMIN).len(), 31);
        assert_eq!(
            defaults(ROLE_MEMBER),
            [Permission::Prompt].into_iter().collect()
        );
        assert!(defaults("custom").is_empty());
    }

    #[test]
    fn every_wire_name_parses_back_to_its_permission() {
        for p in Permission::ALL {
            assert_eq!(Permission::parse(p.as_str()), Some(*p));
        }
        assert_eq!(Permission::parse("tasks.write"), None);
    }

    #[test]
    fn the_reach_list_names_exactly_the_permissions_issue_23_lists() {
        let names: Vec<&str> = Permission::manages_reach()
            .iter()
            .map(|p| p.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "ext.manage",
                "links.act",
                "links.list",
                "permissions.set",
                "roles.grant",
                "roles.revoke",
                "spaces.delete",
                "spaces.rename"
            ]
        );
        assert!(!Permission::PrefsSet.is_reach());
    }

    #[test]
    fn system_and_none_cannot_be_granted() {
        assert!(validate_role_name("system").is_err());
        assert!(validate_role_name("none").is_err());
        assert!(validate_role_name("Editor").is_err());
        assert!(validate_role_name("editor").is_ok());
    }
}
