//! Raw views of the database for the integration tests (`test-hooks` only):
//! every table, every row of a table as text, and a test's own statements
//! run through the store's connections, so a test never opens the file
//! itself. Either backend, but for the functions marked SQLite backend.
//!
//! Must never: be compiled into a release build (the module is behind the
//! `test-hooks` feature).

use super::{params, Conn, Dialect, StoreResult, Value};

/// The name of every table, in name order.
pub fn tables(conn: &Conn) -> StoreResult<Vec<String>> {
    super::status::tables(conn)
}

/// Rows in `table` (a name from [`tables`]).
pub fn row_count(conn: &Conn, table: &str) -> StoreResult<i64> {
    conn.query_row(
        &format!("SELECT COUNT(*) FROM \"{table}\""),
        params![],
        |r| r.get(0),
    )
}

/// Every row of `table` (a name from [`tables`]) in rowid order (on
/// PostgreSQL, which has none, sorted by their text), each column as text
/// (`NULL` for a null, a blob as its bytes' debug form).
pub fn rows_as_text(conn: &Conn, table: &str) -> StoreResult<Vec<Vec<String>>> {
    let mut out = Vec::new();
    let order = match conn.dialect() {
        Dialect::Sqlite => " ORDER BY rowid",
        Dialect::Postgres => "",
    };
    conn.for_each(
        &format!("SELECT * FROM \"{table}\"{order}"),
        params![],
        |r| {
            let vals = r.values()?.into_iter().map(|v| match v {
                Value::Null => "NULL".into(),
                Value::Int(x) => x.to_string(),
                Value::Real(x) => x.to_string(),
                Value::Text(t) => t,
                Value::Blob(b) => format!("{b:?}"),
            });
            out.push(vals.collect());
            Ok(())
        },
    )?;
    if conn.dialect() == Dialect::Postgres {
        out.sort();
    }
    Ok(out)
}

/// A test's own query, every row's columns as text (`NULL` for a null).
pub fn query_text(conn: &Conn, sql: &str) -> StoreResult<Vec<Vec<String>>> {
    let mut out = Vec::new();
    conn.for_each(sql, params![], |r| {
        let vals = r.values()?.into_iter().map(|v| match v {
            Value::Null => "NULL".into(),
            Value::Int(x) => x.to_string(),
            Value::Real(x) => x.to_string(),
            Value::Text(t) => t,
            Value::Blob(b) => format!("{b:?}"),
        });
        out.push(vals.collect());
        Ok(())
    })?;
    Ok(out)
}

/// Messages of the conversation `id` still waiting for their turn.
pub fn pending_in_conversation(conn: &Conn, id: i64) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE conversation_id = ?1 AND status = 'pending'",
        params![id],
        |r| r.get(0),
    )
}

/// A test's own statement answering one integer (`SELECT COUNT(*) …`).
pub fn count(conn: &Conn, sql: &str) -> StoreResult<i64> {
    conn.query_row(sql, params![], |r| r.get(0))
}

/// A test's own statements run as one script (seeding rows as a release
/// wrote them, a trigger that makes a later write fail).
pub fn execute_script(conn: &Conn, sql: &str) -> StoreResult<()> {
    conn.execute_batch(sql)
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
    execute_script(&Conn::sqlite(conn), sql)
}
