//! Raw views of the database for the integration tests (`test-hooks` only):
//! every table, every row of a table as text, and a test's own statements
//! run through the store's connections, so a test never opens the file
//! itself. SQLite-backend functions where they name the catalogue.
//!
//! Must never: be compiled into a release build (the module is behind the
//! `test-hooks` feature).

use super::{params, Conn, Query, StoreResult};

/// The name of every table, in name order.
pub fn tables(conn: &Conn) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        params![],
        |r| r.get(0),
    )
}

/// Rows in `table` (a name from [`tables`]).
pub fn row_count(conn: &Conn, table: &str) -> StoreResult<i64> {
    Ok(conn.query_row(
        &format!("SELECT COUNT(*) FROM \"{table}\""),
        params![],
        |r| r.get(0),
    )?)
}

/// Every row of `table` (a name from [`tables`]) in rowid order, each column as text
/// (`NULL` for a null, a blob as its bytes' debug form).
pub fn rows_as_text(conn: &Conn, table: &str) -> StoreResult<Vec<Vec<String>>> {
    use rusqlite::types::ValueRef;
    let mut q = conn.prepare(&format!("SELECT * FROM \"{table}\" ORDER BY rowid"))?;
    let cols = q.column_count();
    let mut rows = q.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut vals = Vec::with_capacity(cols);
        for i in 0..cols {
            vals.push(match row.get_ref(i)? {
                ValueRef::Null => "NULL".into(),
                ValueRef::Integer(x) => x.to_string(),
                ValueRef::Real(x) => x.to_string(),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                ValueRef::Blob(b) => format!("{b:?}"),
            });
        }
        out.push(vals);
    }
    Ok(out)
}

/// A test's own statement answering one integer (`SELECT COUNT(*) …`).
pub fn count(conn: &Conn, sql: &str) -> StoreResult<i64> {
    Ok(conn.query_row(sql, params![], |r| r.get(0))?)
}

/// A test's own statements run as one script (seeding rows as a release
/// wrote them, a trigger that makes a later write fail).
pub fn execute_script(conn: &Conn, sql: &str) -> StoreResult<()> {
    Ok(conn.execute_batch(sql)?)
}

/// [`execute_script`] on the database file at `path`, with no store: no
/// migration runs, so a file written at an earlier release's schema stays
/// at it. SQLite backend.
pub fn execute_script_on_file(path: &std::path::Path, sql: &str) -> StoreResult<()> {
    let conn = rusqlite::Connection::open(path).map_err(|source| super::StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    execute_script(&conn, sql)
}
