//! Membership as a yes/no: whether a caller has spoken in a space (the
//! `member` role's ground). The member rows themselves are `spaces`'.
//!
//! Must never: create a member row as a side effect of asking.

use super::{params, Conn, Query, StoreResult};

/// Whether `caller` has a member row in `space`.
pub fn is_member(conn: &Conn, space: &str, caller: &str) -> StoreResult<bool> {
    Ok(conn
        .query_opt(
            "SELECT 1 FROM members WHERE space_id = ?1 AND caller_id = ?2",
            params![space, caller],
            |_| Ok(()),
        )?
        .is_some())
}
