//! The storage face: the connection, transaction, parameter and row types
//! every storage module runs its statements on, whichever backend is behind
//! them (SQLite through rusqlite, PostgreSQL through tokio-postgres).
//!
//! Statements are written once, in the SQL both backends speak, with `?N`
//! placeholders; the PostgreSQL side rewrites them to `$N` (see
//! [`super::pg::translate`]). A [`Tx`] is a [`Conn`] inside the writer's
//! transaction: it reads like one, so a write can check and change rows in
//! one transaction.
//!
//! Must never: be constructed outside `storage` (callers receive `&Tx` and
//! `&Conn` from `Store::write`/`read`), or hand a driver type to a caller.

use std::ops::Deref;

use super::pg::PgConn;
use super::{StoreError, StoreResult};

/// Which SQL a connection speaks, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// One bound value of a statement: the same five kinds a row's cell holds.
pub type Param<'a> = Cell<'a>;

/// A value that can be bound to a statement.
pub trait ToParam {
    fn to_param(&self) -> Param<'_>;
}

macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl ToParam for $t {
            fn to_param(&self) -> Param<'_> {
                Param::Int(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_param!(i64, i32, i16, u8, u16, u32, u64, usize);

impl ToParam for bool {
    fn to_param(&self) -> Param<'_> {
        Param::Int(i64::from(*self))
    }
}

impl ToParam for f64 {
    fn to_param(&self) -> Param<'_> {
        Param::Real(*self)
    }
}

impl ToParam for str {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for String {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for [u8] {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}

impl ToParam for Vec<u8> {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}

impl<T: ToParam> ToParam for Option<T> {
    fn to_param(&self) -> Param<'_> {
        match self {
            Some(v) => v.to_param(),
            None => Param::Null,
        }
    }
}

impl<T: ToParam + ?Sized> ToParam for &T {
    fn to_param(&self) -> Param<'_> {
        (**self).to_param()
    }
}

impl ToParam for Param<'_> {
    fn to_param(&self) -> Param<'_> {
        *self
    }
}

/// `params![a, b]`: a statement's parameter list.
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::storage::ToParam]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::storage::ToParam),+] as &[&dyn $crate::storage::ToParam]
    };
}
pub(crate) use params;

/// One value read from a row, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub enum Cell<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl Cell<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "NULL",
            Cell::Int(_) => "an integer",
            Cell::Real(_) => "a real",
            Cell::Text(_) => "text",
            Cell::Blob(_) => "a blob",
        }
    }
}

/// A Rust value read from one cell.
pub trait FromCell: Sized {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String>;
}

fn mismatch<T>(cell: Cell<'_>, want: &str) -> Result<T, String> {
    Err(format!("expected {want}, found {}", cell.kind()))
}

macro_rules! int_cell {
    ($($t:ty),*) => {$(
        impl FromCell for $t {
            fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
                match cell {
                    Cell::Int(v) => <$t>::try_from(v)
                        .map_err(|_| format!("{v} does not fit in {}", stringify!($t))),
                    other => mismatch(other, "an integer"),
                }
            }
        }
    )*};
}
int_cell!(i64, i32, u32, u64, usize, u16, u8);

impl FromCell for bool {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Int(v) => Ok(v != 0),
            other => mismatch(other, "an integer"),
        }
    }
}

impl FromCell for f64 {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Real(v) => Ok(v),
            Cell::Int(v) => Ok(v as f64),
            other => mismatch(other, "a number"),
        }
    }
}

impl FromCell for String {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Text(v) => Ok(v.to_owned()),
            other => mismatch(other, "text"),
        }
    }
}

impl FromCell for Vec<u8> {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Blob(v) => Ok(v.to_vec()),
            Cell::Text(v) => Ok(v.as_bytes().to_vec()),
            other => mismatch(other, "a blob"),
        }
    }
}

impl<T: FromCell> FromCell for Option<T> {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Null => Ok(None),
            other => T::from_cell(other).map(Some),
        }
    }
}

/// A column position in a row (by index only: names differ in case between
/// the backends).
pub trait ColumnIndex {
    fn index(&self) -> usize;
}

impl ColumnIndex for usize {
    fn index(&self) -> usize {
        *self
    }
}

/// One row of a result, as the closure of a query sees it.
pub struct Row<'r> {
    inner: RowRef<'r>,
}

enum RowRef<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r tokio_postgres::Row),
}

impl<'r> Row<'r> {
    pub(super) fn sqlite(row: &'r rusqlite::Row<'r>) -> Self {
        Row {
            inner: RowRef::Sqlite(row),
        }
    }

    pub(super) fn postgres(row: &'r tokio_postgres::Row) -> Self {
        Row {
            inner: RowRef::Postgres(row),
        }
    }

    /// The value of column `idx`.
    pub fn get<I: ColumnIndex, T: FromCell>(&self, idx: I) -> StoreResult<T> {
        let idx = idx.index();
        let convert = |cell: Cell<'_>| {
            T::from_cell(cell).map_err(|e| StoreError::Column(format!("column {idx}: {e}")))
        };
        match &self.inner {
            RowRef::Sqlite(r) => {
                use rusqlite::types::ValueRef;
                let cell = match r.get_ref(idx)? {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(v) => Cell::Int(v),
                    ValueRef::Real(v) => Cell::Real(v),
                    ValueRef::Text(t) => Cell::Text(std::str::from_utf8(t).map_err(|e| {
                        StoreError::Column(format!("column {idx}: not UTF-8: {e}"))
                    })?),
                    ValueRef::Blob(b) => Cell::Blob(b),
                };
                convert(cell)
            }
            RowRef::Postgres(r) => super::pg::cell(r, idx, convert),
        }
    }

    /// How many columns the row has.
    pub fn width(&self) -> usize {
        match &self.inner {
            RowRef::Sqlite(r) => r.as_ref().column_count(),
            RowRef::Postgres(r) => r.len(),
        }
    }

    /// Every column as an owned value (the copy and the inspection dumps).
    pub fn values(&self) -> StoreResult<Vec<Value>> {
        (0..self.width())
            .map(|i| self.get::<usize, Value>(i))
            .collect()
    }
}

/// An owned cell: what the table copy and checksum move between backends.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl FromCell for Value {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        Ok(match cell {
            Cell::Null => Value::Null,
            Cell::Int(v) => Value::Int(v),
            Cell::Real(v) => Value::Real(v),
            Cell::Text(v) => Value::Text(v.to_owned()),
            Cell::Blob(v) => Value::Blob(v.to_vec()),
        })
    }
}

impl ToParam for Value {
    fn to_param(&self) -> Param<'_> {
        match self {
            Value::Null => Param::Null,
            Value::Int(v) => Param::Int(*v),
            Value::Real(v) => Param::Real(*v),
            Value::Text(v) => Param::Text(v),
            Value::Blob(v) => Param::Blob(v),
        }
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Null => ValueRef::Null,
            Param::Int(v) => ValueRef::Integer(v),
            Param::Real(v) => ValueRef::Real(v),
            Param::Text(v) => ValueRef::Text(v.as_bytes()),
            Param::Blob(v) => ValueRef::Blob(v),
        }))
    }
}

/// A connection to the store: a pooled reader, or (inside a [`Tx`]) the
/// writer's.
pub struct Conn {
    backend: Backend,
}

enum Backend {
    Sqlite(rusqlite::Connection),
    Postgres(PgConn),
}

fn bind<'a>(params: &'a [&'a dyn ToParam]) -> Vec<Param<'a>> {
    params.iter().map(|p| p.to_param()).collect()
}

impl Conn {
    pub(super) fn sqlite(conn: rusqlite::Connection) -> Conn {
        Conn {
            backend: Backend::Sqlite(conn),
        }
    }

    pub(super) fn postgres(conn: PgConn) -> Conn {
        Conn {
            backend: Backend::Postgres(conn),
        }
    }

    pub fn dialect(&self) -> Dialect {
        match self.backend {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection, for the operations only that backend has
    /// (`VACUUM INTO`, the query planner test); `None` on PostgreSQL.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.backend {
            Backend::Sqlite(c) => Some(c),
            Backend::Postgres(_) => None,
        }
    }

    pub(super) fn into_postgres(self) -> Option<PgConn> {
        match self.backend {
            Backend::Postgres(c) => Some(c),
            Backend::Sqlite(_) => None,
        }
    }

    /// Runs one statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> StoreResult<usize> {
        let bound = bind(params);
        super::tally::timed(sql, || match &self.backend {
            Backend::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(bound.iter()))?),
            Backend::Postgres(c) => c.execute(sql, &bound),
        })
    }

    /// One transaction-control statement (`BEGIN`, `SAVEPOINT`, …), run by
    /// every write: SQLite keeps it prepared, so each write does not parse
    /// it again; PostgreSQL sends it as a simple query.
    pub(super) fn control(&self, sql: &str) -> StoreResult<()> {
        super::tally::timed(sql, || match &self.backend {
            Backend::Sqlite(c) => {
                c.prepare_cached(sql)?.execute([])?;
                Ok(())
            }
            Backend::Postgres(c) => c.batch(sql),
        })
    }

    /// Runs statements without parameters, one after the other (schema
    /// changes and transaction control).
    pub(super) fn execute_batch(&self, sql: &str) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Backend::Postgres(c) => c.batch(sql),
        }
    }

    /// The first row of a query; [`StoreError::NoRow`] when there is none.
    pub fn query_row<T, F>(&self, sql: &str, params: &[&dyn ToParam], f: F) -> StoreResult<T>
    where
        F: FnOnce(&Row<'_>) -> StoreResult<T>,
    {
        self.query_opt(sql, params, f)?.ok_or(StoreError::NoRow)
    }

    /// Runs `f` on every row of a query, in order.
    pub fn for_each<F>(&self, sql: &str, params: &[&dyn ToParam], mut f: F) -> StoreResult<()>
    where
        F: FnMut(&Row<'_>) -> StoreResult<()>,
    {
        let bound = bind(params);
        super::tally::timed(sql, || match &self.backend {
            Backend::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(bound.iter()))?;
                while let Some(r) = rows.next()? {
                    f(&Row::sqlite(r))?;
                }
                Ok(())
            }
            Backend::Postgres(c) => {
                for r in c.query(sql, &bound)? {
                    f(&Row::postgres(&r))?;
                }
                Ok(())
            }
        })
    }

    /// The column names of a query's result, in order.
    pub(super) fn columns(&self, sql: &str) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Sqlite(c) => Ok(c.prepare(sql)?.column_names().map(str::to_owned).collect()),
            Backend::Postgres(c) => c.columns(sql),
        }
    }
}

/// The reads every backend answers alike: one optional row, or all rows.
pub trait Query {
    fn query_opt<T, F>(&self, sql: &str, params: &[&dyn ToParam], f: F) -> StoreResult<Option<T>>
    where
        F: FnOnce(&Row<'_>) -> StoreResult<T>;
    fn query_all<T, F>(&self, sql: &str, params: &[&dyn ToParam], f: F) -> StoreResult<Vec<T>>
    where
        F: FnMut(&Row<'_>) -> StoreResult<T>;
}

impl Query for Conn {
    fn query_opt<T, F>(&self, sql: &str, params: &[&dyn ToParam], f: F) -> StoreResult<Option<T>>
    where
        F: FnOnce(&Row<'_>) -> StoreResult<T>,
    {
        let bound = bind(params);
        super::tally::timed(sql, || match &self.backend {
            Backend::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(bound.iter()))?;
                match rows.next()? {
                    Some(r) => f(&Row::sqlite(r)).map(Some),
                    None => Ok(None),
                }
            }
            Backend::Postgres(c) => match c.query_opt(sql, &bound)? {
                Some(r) => f(&Row::postgres(&r)).map(Some),
                None => Ok(None),
            },
        })
    }

    fn query_all<T, F>(&self, sql: &str, params: &[&dyn ToParam], mut f: F) -> StoreResult<Vec<T>>
    where
        F: FnMut(&Row<'_>) -> StoreResult<T>,
    {
        let mut out = Vec::new();
        self.for_each(sql, params, |r| {
            out.push(f(r)?);
            Ok(())
        })?;
        Ok(out)
    }
}

/// `.optional()` on a single-row read: no row is `None`, not an error.
pub trait Optional<T> {
    fn optional(self) -> StoreResult<Option<T>>;
}

impl<T> Optional<T> for StoreResult<T> {
    fn optional(self) -> StoreResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(StoreError::NoRow) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The writer's connection inside the batch's transaction. A write closure
/// receives `&Tx`; everything it does commits or rolls back together.
pub struct Tx<'a> {
    conn: &'a Conn,
}

impl<'a> Tx<'a> {
    pub(super) fn new(conn: &'a Conn) -> Tx<'a> {
        Tx { conn }
    }
}

impl Deref for Tx<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn
    }
}
