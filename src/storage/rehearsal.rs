//! What `mercury shadow diff` reads of a shadow's two databases (the
//! baseline copy and the shadow's `state.db`): the compared rows of each
//! table, and what was added since the snapshot's marks. SQLite-backend
//! functions: a shadow's databases are SQLite files, and the row texts are
//! built with SQLite's `strftime`, exactly as the report has always shown
//! them.
//!
//! Must never: write to either file once the baseline is written (the
//! baseline is written once, by the snapshot, from its own copy).

use std::path::Path;

use super::{params, Conn, Query, StoreError, StoreResult};

/// The tables the diff compares, in report order.
pub const DIFF_TABLES: &[&str] = &[
    "space_config",
    "space_preferences",
    "tasks",
    "space_roles",
    "mutes",
    "extension_state",
];

/// What the diff reads of its baseline besides [`DIFF_TABLES`]: the spaces
/// and members its redaction list names. Messages, runs and usage are
/// compared through the snapshot's marks in the shadow's own database.
const REDACTION_TABLES: &[&str] = &["spaces", "members"];

/// Writes into the empty file `dest` the tables of the database at `source`
/// (a snapshot's closed copy) that the diff compares against. A copy of the
/// whole database was a quarter of everything the snapshot wrote, for a few
/// small tables (issue 32).
pub fn write_diff_baseline(source: &Path, dest: &Path) -> StoreResult<()> {
    let dest = dest
        .to_str()
        .ok_or_else(|| StoreError::Invalid(format!("{} is not a UTF-8 path", dest.display())))?;
    let conn = super::open_plain(source)?;
    conn.execute("ATTACH DATABASE ?1 AS baseline", rusqlite::params![dest])?;
    // One transaction: one sync of the new file, not one per table.
    let copies: String = DIFF_TABLES
        .iter()
        .chain(REDACTION_TABLES)
        .map(|table| format!("CREATE TABLE baseline.{table} AS SELECT * FROM main.{table};\n"))
        .collect();
    conn.execute_batch(&format!("BEGIN;\n{copies}COMMIT;"))?;
    conn.execute_batch("DETACH DATABASE baseline")?;
    Ok(())
}

/// One compared row: `((space, key), value, updated by)`.
pub type DiffRow = ((String, String), String, String);

fn diff_sql(table: &str) -> Option<&'static str> {
    Some(match table {
        "space_config" => "SELECT space_id, key, value, updated_by FROM space_config",
        "space_preferences" => "SELECT space_id, key, value, updated_by FROM space_preferences",
        "tasks" => "SELECT space_id, CAST(id AS TEXT), COALESCE(cron, 'at ' || strftime('%Y-%m-%dT%H:%M:%SZ', at / 1000, 'unixepoch')) || ' ' || CASE active WHEN 1 THEN 'active' ELSE 'paused' END || (CASE silent WHEN 1 THEN ' silent' ELSE '' END) || ': ' || prompt, created_by FROM tasks",
        "space_roles" => "SELECT space_id, caller_id, role, COALESCE(granted_by, '') FROM space_roles",
        "mutes" => "SELECT space_id, caller_id, COALESCE('until ' || strftime('%Y-%m-%dT%H:%M:%SZ', until / 1000, 'unixepoch'), 'forever') || COALESCE(' (' || reason || ')', ''), updated_by FROM mutes",
        // An extension's key/value store: `<extension>.<key>`, written by the extension.
        "extension_state" => "SELECT space_id, extension || '.' || key, value, 'extension ' || extension FROM extension_state",
        _ => return None,
    })
}

/// Every row of `table` (one of [`DIFF_TABLES`]) as the diff compares it.
pub fn diff_rows(conn: &Conn, table: &str) -> StoreResult<Vec<DiffRow>> {
    let sql = diff_sql(table).ok_or_else(|| {
        super::StoreError::Invalid(format!("{table} is not a table the diff compares"))
    })?;
    conn.query_all(sql, params![], |r| {
        Ok(((r.get(0)?, r.get(1)?), r.get(2)?, r.get(3)?))
    })
}

/// Runs started after `after_ms`, in `space` or all.
pub fn runs_started_after(conn: &Conn, after_ms: i64, space: Option<&str>) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM runs WHERE started_at > ?1 AND (?2 IS NULL OR space_id = ?2)",
        params![after_ms, space],
        |r| r.get(0),
    )
}

/// `(tokens in, tokens out, cost)` of the usage rows after `after_id`, in
/// `space` or all.
pub fn usage_after(
    conn: &Conn,
    after_id: i64,
    space: Option<&str>,
) -> StoreResult<(i64, i64, f64)> {
    conn.query_row(
        "SELECT COALESCE(SUM(tokens_in),0), COALESCE(SUM(tokens_out),0), COALESCE(SUM(cost),0.0) FROM token_usage WHERE id > ?1 AND (?2 IS NULL OR space_id = ?2)",
        params![after_id, space],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// `(space, role, text)` of every message after `after_id`, in `space` or
/// all, in id order.
pub fn messages_after(
    conn: &Conn,
    after_id: i64,
    space: Option<&str>,
) -> StoreResult<Vec<(String, String, String)>> {
    conn.query_all(
        "SELECT space_id, role, text FROM messages WHERE id > ?1 AND (?2 IS NULL OR space_id = ?2) ORDER BY id",
        params![after_id, space],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// The id of every space.
pub fn space_ids(conn: &Conn) -> StoreResult<Vec<String>> {
    conn.query_all("SELECT id FROM spaces", params![], |r| r.get(0))
}
