//! What a space link changed, and putting it back (issue 23). Every write a
//! route makes through a link (a config key, a preference, a role's
//! permission set, a caller's role) is noted here with the value it
//! replaced; a direct write on the same key supersedes those notes. Revoking
//! or downgrading the link settles them: each earlier value comes back,
//! unless the value was changed since (directly, or through another link),
//! in which case it is kept and said so.
//!
//! Must never: put a link's earlier value over a direct write made since,
//! restore anything into a space that no longer exists, or settle a change
//! twice.

use crate::storage::Conn as Connection;
use serde::Serialize;

use crate::storage::links::{self as store, ChangeKind, LinkChange, NewChange};
use crate::storage::spaces::{self, KvTable};
use crate::storage::StoreResult;

/// Notes a write of `key` (config, preference or permission set) about to
/// be made: through the link `via`, with the value it replaces; directly
/// (`via` none), as superseding every link's open change on that key.
pub fn note_kv_write(
    conn: &Connection,
    via: Option<i64>,
    space: &str,
    kind: ChangeKind,
    key: &str,
    after: Option<&str>,
) -> StoreResult<()> {
    let Some(link) = via else {
        return store::supersede_changes(conn, space, kind, key).map(|_| ());
    };
    let before = spaces::kv_entry(conn, table_of(kind), space, key)?;
    store::record_change(
        conn,
        &NewChange {
            link,
            space,
            kind,
            key,
            before: before.as_ref().map(|(v, _)| v.as_str()),
            before_by: before.as_ref().map(|(_, by)| by.as_str()),
            before_link: None,
            after,
        },
    )
}

/// Notes a grant (`after` some) or revoke (none) of `caller`'s role.
pub fn note_role_write(
    conn: &Connection,
    via: Option<i64>,
    space: &str,
    caller: &str,
    after: Option<&str>,
) -> StoreResult<()> {
    let Some(link) = via else {
        return store::supersede_changes(conn, space, ChangeKind::Role, caller).map(|_| ());
    };
    let before = spaces::role_row(conn, space, caller)?;
    store::record_change(
        conn,
        &NewChange {
            link,
            space,
            kind: ChangeKind::Role,
            key: caller,
            before: before.as_ref().map(|r| r.role.as_str()),
            before_by: before.as_ref().and_then(|r| r.granted_by.as_deref()),
            before_link: before.as_ref().and_then(|r| r.link_id),
            after,
        },
    )
}

fn table_of(kind: ChangeKind) -> KvTable {
    match kind {
        ChangeKind::Preference => KvTable::Preferences,
        _ => KvTable::Config,
    }
}

/// What settling one key gave: its earlier value back, or the value kept.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Settled {
    pub space_id: String,
    /// `config`, `preference`, `permissions` or `role`.
    pub kind: String,
    /// The key (a role's caller id; a permission set's `role.<r>.permissions`).
    pub key: String,
    /// Restored: the value put back (none: the key or role is absent again).
    /// Kept: the value left in place.
    pub value: Option<String>,
    /// Restored: the link's value that was taken out.
    pub replaced: Option<String>,
    /// Kept: why.
    pub reason: Option<String>,
}

impl Settled {
    /// One line for a person: `permissions of member in t: restored to …`.
    pub fn subject(&self) -> String {
        let what = match ChangeKind::parse(&self.kind) {
            Some(ChangeKind::Permissions) => format!(
                "permissions of {}",
                self.key
                    .strip_prefix("role.")
                    .and_then(|k| k.strip_suffix(".permissions"))
                    .unwrap_or(&self.key)
            ),
            Some(ChangeKind::Role) => format!("role of {}", self.key),
            Some(ChangeKind::Preference) => format!("preference {}", self.key),
            _ => format!("config {}", self.key),
        };
        format!("{what} in {}", self.space_id)
    }
}

/// Restored and kept, per key the link changed.
#[derive(Debug, Clone, Default, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Settlement {
    pub restored: Vec<Settled>,
    pub kept: Vec<Settled>,
}

impl Settlement {
    /// The audit row's detail (none: the link had changed nothing).
    pub fn detail(&self) -> Option<String> {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        let mut parts: Vec<String> = self
            .restored
            .iter()
            .map(|s| format!("restored {} to {}", s.subject(), show(&s.value)))
            .collect();
        parts.extend(self.kept.iter().map(|s| {
            format!(
                "kept {} at {} ({})",
                s.subject(),
                show(&s.value),
                s.reason.as_deref().unwrap_or("changed since")
            )
        }));
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The value a key holds now, and for a role the link it was granted through.
fn current(conn: &Connection, c: &LinkChange) -> StoreResult<(Option<String>, Option<i64>)> {
    match ChangeKind::parse(&c.kind) {
        Some(ChangeKind::Role) => Ok(spaces::role_row(conn, &c.space_id, &c.key)?
            .map_or((None, None), |r| (Some(r.role), r.link_id))),
        Some(kind) => Ok((
            spaces::kv_entry(conn, table_of(kind), &c.space_id, &c.key)?.map(|(v, _)| v),
            None,
        )),
        None => Ok((None, None)),
    }
}

/// Puts `first`'s earlier value back.
fn put_back(conn: &Connection, first: &LinkChange, by: &str) -> StoreResult<()> {
    let who = first.before_by.as_deref().unwrap_or(by);
    match (ChangeKind::parse(&first.kind), &first.before_value) {
        (Some(ChangeKind::Role), Some(role)) => spaces::set_role(
            conn,
            &first.space_id,
            &first.key,
            role,
            who,
            first.before_link_id,
        ),
        (Some(ChangeKind::Role), None) => {
            spaces::revoke_role(conn, &first.space_id, &first.key).map(|_| ())
        }
        (Some(kind), Some(v)) => {
            spaces::kv_set(conn, table_of(kind), &first.space_id, &first.key, v, who)
        }
        (Some(kind), None) => {
            spaces::kv_delete(conn, table_of(kind), &first.space_id, &first.key).map(|_| ())
        }
        (None, _) => Ok(()),
    }
}

/// Settles every open change of `link` (its revoke or its downgrade to
/// `read`), key by key: the value before the link's first change since the
/// last direct write comes back if the key still holds what the link wrote;
/// otherwise the value is kept. A key another link changed since hands that
/// link the earlier value, so its own revoke restores the original.
pub fn settle(conn: &Connection, link: i64, by: &str) -> StoreResult<Settlement> {
    let open = store::open_changes(conn, link)?;
    // Grouped by key, in the order the keys were first changed.
    let mut groups: Vec<Vec<LinkChange>> = Vec::new();
    for c in open {
        match groups
            .iter_mut()
            .find(|g| g[0].space_id == c.space_id && g[0].kind == c.kind && g[0].key == c.key)
        {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    let mut out = Settlement::default();
    for group in groups {
        let outcome = settle_key(conn, link, by, &group, &mut out)?;
        for c in &group {
            store::settle_change(conn, c.id, outcome)?;
        }
    }
    Ok(out)
}

fn settle_key(
    conn: &Connection,
    link: i64,
    by: &str,
    group: &[LinkChange],
    out: &mut Settlement,
) -> StoreResult<&'static str> {
    let head = &group[0];
    if !spaces::space_exists(conn, &head.space_id)? {
        return Ok("gone");
    }
    // Only the changes after the last direct write can be undone.
    let since = group
        .iter()
        .rposition(|c| c.superseded)
        .map_or(0, |i| i + 1);
    let chain = &group[since..];
    let (now, now_link) = current(conn, head)?;
    let entry = |value: Option<String>, replaced: Option<String>, reason: Option<String>| Settled {
        space_id: head.space_id.clone(),
        kind: head.kind.clone(),
        key: head.key.clone(),
        value,
        replaced,
        reason,
    };
    let (Some(first), Some(last)) = (chain.first(), chain.last()) else {
        out.kept.push(entry(
            now,
            None,
            Some("changed since by a direct write".into()),
        ));
        return Ok("kept");
    };
    let is_role = ChangeKind::parse(&head.kind) == Some(ChangeKind::Role);
    let still_ours =
        now == last.after_value && (!is_role || now.is_none() || now_link == Some(link));
    if still_ours {
        put_back(conn, first, by)?;
        out.restored
            .push(entry(first.before_value.clone(), now, None));
        return Ok("restored");
    }
    // Changed since: directly (superseded rows), or through another link,
    // whose own revoke must then restore what this link found.
    let next =
        store::next_open_change_on(conn, &head.space_id, &head.kind, &head.key, link, last.id)?;
    let reason = match next {
        Some(n) if n.before_value == last.after_value && !n.superseded => {
            store::set_change_before(
                conn,
                n.id,
                first.before_value.as_deref(),
                first.before_by.as_deref(),
                first.before_link_id,
            )?;
            format!(
                "changed since through link {}, whose revoke now restores the earlier value",
                n.link_id
            )
        }
        Some(n) => format!("changed since through link {}", n.link_id),
        None => "changed since by a direct write".to_owned(),
    };
    out.kept.push(entry(now, None, Some(reason)));
    Ok("kept")
}
