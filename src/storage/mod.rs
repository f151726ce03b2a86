//! Storage: the SQLite database (`state.db`, WAL) behind one writer thread
//! and a small pool of read connections.
//!
//! Owns the connection set-up, the numbered migrations and one module per
//! table group. Async code never blocks on SQLite: writes are closures sent to
//! the writer thread, reads run on `spawn_blocking` with a pooled read-only
//! connection.
//!
//! Must never: open a second writer, hold a transaction across an await, or
//! create a row as a side effect of a read.

pub mod conversations;
pub mod links;
pub mod messages;
mod migrations;
pub mod outbox;
pub mod runs;
pub mod spaces;
pub mod tasks;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the database writer has stopped")]
    WriterGone,
    #[error("database task failed: {0}")]
    Join(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

type WriteJob = Box<dyn FnOnce(&mut Connection) + Send>;

/// Handle to the database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    path: PathBuf,
    /// Sender side of the writer thread's queue. Every clone of `Store` shares
    /// it; the writer thread ends when the last `Store` is dropped and the
    /// channel closes.
    writer: mpsc::Sender<WriteJob>,
    /// Idle read-only connections, reused so their pragmas are set once.
    readers: Mutex<Vec<Connection>>,
}

const READER_POOL: usize = 8;

/// Prepared statements kept per connection: more than the ingress and turn
/// paths use together, so neither evicts the other's.
const STATEMENT_CACHE: usize = 128;

/// `execute` and `query_row` through the connection's statement cache. The
/// hot paths run the same few statements for every message; compiling the
/// SQL each time was most of their cost. Same semantics as rusqlite's own.
pub trait Cached {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the database, applies migrations and starts the writer thread.
    pub fn open(path: &Path) -> StoreResult<Store> {
        let mut conn = open_plain(path)?;
        migrations::apply(&mut conn)?;
        let (tx, mut rx) = mpsc::channel::<WriteJob>(1024);
        std::thread::Builder::new()
            .name("mercury-db-writer".into())
            .spawn(move || {
                while let Some(job) = rx.blocking_recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| StoreError::Join(format!("cannot start the writer thread: {e}")))?;
        Ok(Store {
            inner: Arc::new(StoreInner {
                path: path.to_owned(),
                writer: tx,
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` inside one IMMEDIATE transaction on the writer thread; commits
    /// if it returns `Ok`, rolls back otherwise (no partial write).
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: WriteJob = Box::new(move |conn: &mut Connection| {
            let result = (|| {
                let txn =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let out = f(&txn)?;
                txn.commit()?;
                Ok(out)
            })();
            let _ = tx.send(result);
        });
        self.inner
            .writer
            .send(job)
            .await
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Queues a write without waiting for its commit. The writer runs jobs in
    /// order, so a later `write` or read after it sees this one; a failure is
    /// logged with `what`. Used where the caller must not wait on the disk
    /// (the link audit row after an act-as response).
    pub async fn write_detached<F>(&self, what: &'static str, f: F)
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<()> + Send + 'static,
    {
        let job: WriteJob = Box::new(move |conn: &mut Connection| {
            let result = (|| {
                let txn =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                f(&txn)?;
                txn.commit()?;
                Ok::<(), StoreError>(())
            })();
            if let Err(e) = result {
                tracing::error!(error = %e, what, "queued write failed");
            }
        });
        if self.inner.writer.send(job).await.is_err() {
            tracing::error!(what, "queued write lost: the database writer has stopped");
        }
    }

    /// Runs `f` on a read-only connection off the async runtime.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let conn = inner.take_reader()?;
            let out = f(&conn);
            inner.return_reader(conn);
            out
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
    }

    /// Synchronous read for code already off the runtime (CLI, benches).
    pub fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let conn = self.inner.take_reader()?;
        let out = f(&conn);
        self.inner.return_reader(conn);
        out
    }
}

impl StoreInner {
    fn take_reader(&self) -> StoreResult<Connection> {
        if let Some(c) = self.readers.lock().ok().and_then(|mut v| v.pop()) {
            return Ok(c);
        }
        open_read_only(&self.path)
    }

    fn return_reader(&self, conn: Connection) {
        if let Ok(mut v) = self.readers.lock() {
            if v.len() < READER_POOL {
                v.push(conn);
            }
        }
    }
}

/// A read-write connection with the store's file settings (WAL, busy
/// timeout, foreign keys, `synchronous = NORMAL`) and no schema: what the
/// writer thread runs on, and the plain-SQLite baseline of `mercury bench`.
pub fn open_plain(path: &Path) -> StoreResult<Connection> {
    let open_err = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let conn = Connection::open(path).map_err(open_err)?;
    let _mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(open_err)?;
    configure(&conn).map_err(open_err)?;
    Ok(conn)
}

/// A read-only connection: the review reader opens its own with this.
pub fn open_read_only(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}
