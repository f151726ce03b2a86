//! One config key across every space (what the shadow's pre-flight checks
//! read: every model chain a space set). Per-space reads are `spaces::kv_*`.
//!
//! Must never: write.

use super::{params, Conn, Query, StoreResult};

/// Every space's value of the config key `key`.
pub fn config_values_of_key(conn: &Conn, key: &str) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT value FROM space_config WHERE key = ?1",
        params![key],
        |r| r.get(0),
    )
}
