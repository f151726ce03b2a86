//! Moving a deployment up: every row of a (stopped) SQLite database into an
//! empty store on another backend, in one transaction of the target, with
//! each table's row count and checksum compared before it commits. The
//! same copy runs the other way for a shadow snapshot of a PostgreSQL
//! deployment: its rows, read in one consistent transaction, into the
//! shadow's own new SQLite file.
//!
//! The checksum is order-free (a sum of per-row SHA-256 prefixes over a
//! canonical encoding of the values, integers and integral reals alike), so
//! it does not depend on either backend's row order.
//!
//! Must never: write to the source (nor migrate it), leave a partial copy (any error rolls
//! the target back), or copy into a store that already holds rows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::status::{ident, tables};
use super::{
    open_plain, open_read_only, params, Conn, Dialect, Location, Param, Query, Row, Store,
    StoreError, StoreResult, ToParam, Tx, Value,
};

/// One table as copied and verified.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableCopy {
    pub name: String,
    pub rows: i64,
    /// The order-free checksum both sides agreed on (hex).
    pub checksum: String,
}

/// Accumulates the order-free checksum of a table.
#[derive(Default)]
struct Checksum {
    rows: i64,
    sum: u64,
}

impl Checksum {
    fn add(&mut self, values: &[Value]) {
        let mut h = Sha256::new();
        for v in values {
            match v {
                Value::Null => h.update(b"n;"),
                Value::Int(i) => h.update(format!("i{i};").as_bytes()),
                Value::Real(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                    h.update(format!("i{};", *f as i64).as_bytes());
                }
                Value::Real(f) => h.update(format!("r{};", f.to_bits()).as_bytes()),
                Value::Text(t) => {
                    h.update(format!("t{}:", t.len()).as_bytes());
                    h.update(t.as_bytes());
                }
                Value::Blob(b) => {
                    h.update(format!("b{}:", b.len()).as_bytes());
                    h.update(b);
                }
            }
        }
        let digest = h.finalize();
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&digest[..8]);
        self.sum = self.sum.wrapping_add(u64::from_be_bytes(prefix));
        self.rows += 1;
    }

    fn hex(&self) -> String {
        format!("{:016x}", self.sum)
    }
}

/// Tables ordered so each comes after the tables its foreign keys name.
fn dependency_order(src: &Conn, names: &[String]) -> StoreResult<Vec<String>> {
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in names {
        let refs: Vec<String> = src.query_all(
            "SELECT \"table\" FROM pragma_foreign_key_list(?1)",
            params![t],
            |r| r.get(0),
        )?;
        deps.insert(
            t.clone(),
            refs.into_iter()
                .filter(|r| r != t && names.contains(r))
                .collect(),
        );
    }
    let mut out = Vec::new();
    while !deps.is_empty() {
        let ready: Vec<String> = deps
            .iter()
            .filter(|(_, d)| d.iter().all(|x| out.contains(x)))
            .map(|(t, _)| t.clone())
            .collect();
        if ready.is_empty() {
            return Err(StoreError::Invalid(
                "the tables' foreign keys form a cycle; the copy cannot order them".into(),
            ));
        }
        for t in ready {
            deps.remove(&t);
            out.push(t);
        }
    }
    Ok(out)
}

fn checksum_of(conn: &Conn, table: &str, columns: &[String]) -> StoreResult<Checksum> {
    let cols = columns
        .iter()
        .map(|c| ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let mut sum = Checksum::default();
    conn.for_each(
        &format!("SELECT {cols} FROM {}", ident(table)),
        params![],
        |r: &Row<'_>| {
            sum.add(&r.values()?);
            Ok(())
        },
    )?;
    Ok(sum)
}

/// Copies the SQLite database at `source` into `target` (freshly migrated,
/// empty), verifying every table; the tables as copied.
pub async fn copy_sqlite_into(source: &Path, target: &Store) -> StoreResult<Vec<TableCopy>> {
    let source = source.to_owned();
    target
        .write(move |tx| {
            let src = Conn::sqlite(open_read_only(&source)?);
            copy_all(&src, tx)
        })
        .await
}

/// Copies every row of the store at `source` (either backend, never
/// written: it is not migrated, and PostgreSQL is read in one read-only
/// repeatable-read transaction, so the copy is one consistent moment) into
/// the new SQLite file `target`, migrated to this release's schema first;
/// every table verified. What a shadow snapshot of a PostgreSQL deployment
/// is made of. On any error the target file holds no row.
pub fn copy_into_sqlite_file(source: &Location, target: &Path) -> StoreResult<Vec<TableCopy>> {
    let dst = Conn::sqlite(open_plain(target)?);
    super::migrations::apply(&dst)?;
    let src_store = Store::open_unmigrated(source)?;
    src_store.read_blocking(|src| {
        let pg = src.dialect() == Dialect::Postgres;
        if pg {
            src.execute_batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        }
        dst.execute_batch("BEGIN IMMEDIATE")?;
        let copied = copy_all(src, &Tx::new(&dst));
        let ended = match &copied {
            Ok(_) => dst.execute_batch("COMMIT"),
            Err(_) => dst.execute_batch("ROLLBACK"),
        };
        if pg {
            // Nothing was written there: the end of a read-only transaction.
            src.execute_batch("ROLLBACK")?;
        }
        let copied = copied?;
        ended?;
        Ok(copied)
    })
}

/// Every row of `src` into the empty tables of `tx`, same schema version,
/// each table's count and checksum compared on both sides.
fn copy_all(src: &Conn, tx: &Tx<'_>) -> StoreResult<Vec<TableCopy>> {
    let src_version = super::migrations::version(src)?;
    let dst_version = super::migrations::version(tx)?;
    if src_version != dst_version {
        return Err(StoreError::Invalid(format!(
            "the source database is at schema version {src_version} and the target at {dst_version}: start this release's host on the source once (it migrates), stop it, then copy"
        )));
    }
    let target_tables: BTreeSet<String> = tables(tx)?.into_iter().collect();
    for t in &target_tables {
        let n: i64 = tx.query_row(
            &format!("SELECT COUNT(*) FROM {}", ident(t)),
            params![],
            |r| r.get(0),
        )?;
        if n > 0 {
            return Err(StoreError::Conflict(format!(
                "the target is not empty (table {t} has {n} rows): copy only into a new database"
            )));
        }
    }
    let names = tables(src)?;
    if let Some(missing) = names.iter().find(|n| !target_tables.contains(*n)) {
        return Err(StoreError::Invalid(format!(
            "the target has no table {missing}"
        )));
    }
    // The schemas are one (same version), so the SQLite side names the
    // foreign keys for both.
    let order_from: &Conn = if src.dialect() == Dialect::Sqlite {
        src
    } else {
        tx
    };
    let mut copied = Vec::new();
    for table in dependency_order(order_from, &names)? {
        let select = format!("SELECT * FROM {}", ident(&table));
        let columns = src.columns(&select)?;
        let insert = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            ident(&table),
            columns
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", "),
            (1..=columns.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut sum = Checksum::default();
        src.for_each(&select, params![], |r| {
            let values = r.values()?;
            sum.add(&values);
            let bound: Vec<Param<'_>> = values.iter().map(ToParam::to_param).collect();
            let refs: Vec<&dyn ToParam> = bound.iter().map(|p| p as &dyn ToParam).collect();
            tx.execute(&insert, &refs)?;
            Ok(())
        })?;
        let there = checksum_of(tx, &table, &columns)?;
        if there.rows != sum.rows || there.sum != sum.sum {
            return Err(StoreError::Invalid(format!(
                "table {table}: {} rows (checksum {}) read, {} rows (checksum {}) in the target; nothing was copied",
                sum.rows,
                sum.hex(),
                there.rows,
                there.hex()
            )));
        }
        copied.push(TableCopy {
            name: table,
            rows: sum.rows,
            checksum: sum.hex(),
        });
    }
    if tx.dialect() == Dialect::Postgres {
        // Identity columns continue after the copied ids.
        let identities: Vec<(String, String)> = tx.query_all(
            "SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = current_schema() AND is_identity = 'YES'",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        for (table, column) in identities {
            tx.query_row(
                &format!(
                    "SELECT setval(pg_get_serial_sequence(?1, ?2), COALESCE((SELECT MAX({}) FROM {}), 0) + 1, false)",
                    ident(&column),
                    ident(&table)
                ),
                params![ident(&table), column],
                |_| Ok(()),
            )?;
        }
    }
    Ok(copied)
}
