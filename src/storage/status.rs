//! What a store holds, as `mercury storage status` prints it: the backend,
//! the schema version against this release's, and each table's rows and
//! size; and the list of tables the copy and the checksums walk.
//!
//! Must never: write, or name a table it did not read from the catalogue.

use serde::Serialize;

use super::{migrations, params, Conn, Dialect, Query, Store, StoreResult};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableSize {
    pub name: String,
    pub rows: i64,
    /// Bytes on disk (PostgreSQL's relation size with indexes; SQLite's
    /// pages of the table where the build can tell, else none).
    pub bytes: Option<i64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StoreStatus {
    pub backend: &'static str,
    /// The database file, or the PostgreSQL URL without its password.
    pub location: String,
    pub schema_version: i64,
    /// The version this release migrates to.
    pub latest_version: i64,
    /// The whole database's size in bytes.
    pub bytes: i64,
    pub tables: Vec<TableSize>,
}

/// The store's own tables, by name (not the schema bookkeeping).
pub fn tables(conn: &Conn) -> StoreResult<Vec<String>> {
    let sql = match conn.dialect() {
        Dialect::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        }
        Dialect::Postgres => {
            "SELECT table_name FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
               AND table_name <> 'mercury_schema' ORDER BY table_name"
        }
    };
    conn.query_all(sql, params![], |r| r.get(0))
}

/// The first of the store's tables that holds a row, and its count; `None`
/// when every table is empty (a new deployment's database).
pub fn first_table_with_rows(conn: &Conn) -> StoreResult<Option<(String, i64)>> {
    for name in tables(conn)? {
        let rows: i64 = conn.query_row(
            &format!("SELECT COUNT(*) FROM {}", ident(&name)),
            params![],
            |r| r.get(0),
        )?;
        if rows > 0 {
            return Ok(Some((name, rows)));
        }
    }
    Ok(None)
}

/// Quotes a catalogue name for use as an identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn status_of(conn: &Conn, location: String) -> StoreResult<StoreStatus> {
    let mut tables_out = Vec::new();
    for name in tables(conn)? {
        let rows: i64 = conn.query_row(
            &format!("SELECT COUNT(*) FROM {}", ident(&name)),
            params![],
            |r| r.get(0),
        )?;
        let bytes = match conn.dialect() {
            Dialect::Postgres => conn.query_row(
                "SELECT CAST(pg_total_relation_size(CAST(CAST(?1 AS TEXT) AS regclass)) AS BIGINT)",
                params![ident(&name)],
                |r| r.get(0),
            )?,
            Dialect::Sqlite => None,
        };
        tables_out.push(TableSize { name, rows, bytes });
    }
    let bytes = match conn.dialect() {
        Dialect::Sqlite => conn.query_row(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            params![],
            |r| r.get(0),
        )?,
        Dialect::Postgres => conn.query_row(
            "SELECT CAST(pg_database_size(current_database()) AS BIGINT)",
            params![],
            |r| r.get(0),
        )?,
    };
    Ok(StoreStatus {
        backend: match conn.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        },
        location,
        schema_version: migrations::version(conn)?,
        latest_version: migrations::latest(),
        bytes,
        tables: tables_out,
    })
}

impl Store {
    /// Backend, schema version and sizes.
    pub async fn status(&self) -> StoreResult<StoreStatus> {
        let location = self.describe();
        self.read(move |c| status_of(c, location)).await
    }
}
