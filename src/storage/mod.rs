//! Storage: the SQLite database (`state.db`, WAL) behind one writer thread
//! and a small pool of read connections.
//!
//! Owns the connection set-up, the numbered migrations and one module per
//! table group. Async code never blocks on SQLite: writes are closures sent to
//! the writer thread, reads run on `spawn_blocking` with a pooled read-only
//! connection.
//!
//! Group commit: the writer takes every write already queued (up to
//! [`MAX_BATCH`]) and runs them in one transaction, each inside its own
//! savepoint, so one write's error undoes only that write. Nobody is answered
//! before the shared commit; if it fails, every write of the batch fails.
//! Concurrent writers (many messages arriving at once) then share the cost
//! of a commit instead of paying it each.
//!
//! Must never: open a second writer, hold a transaction across an await, or
//! create a row as a side effect of a read.

pub mod adapters;
pub mod chat_windows;
pub mod conversations;
pub mod identities;
pub mod links;
pub mod messages;
mod migrations;
pub mod outbox;
pub mod pairings;
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
    /// A file written inside a write's transaction (the shadow transcript)
    /// could not be written; the transaction is rolled back. A 500, logged.
    #[error("writing {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The write ran but the transaction it shared could not commit.
    #[error("the write was not committed: {0}")]
    NotCommitted(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The store's connection and write transaction as the modules above name
/// them, so new code outside `storage` does not name the driver (the first
/// step of the storage face; issue 24 puts a trait behind these names).
pub type Conn = rusqlite::Connection;
pub type Tx<'a> = rusqlite::Transaction<'a>;

/// The parameter list of a statement; storage modules name it through here.
pub use rusqlite::params;

/// The reads every backend answers alike: one optional row, or all rows.
pub trait Query {
    fn query_opt<T, P, F>(&self, sql: &str, params: P, f: F) -> StoreResult<Option<T>>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
    fn query_all<T, P, F>(&self, sql: &str, params: P, f: F) -> StoreResult<Vec<T>>
    where
        P: rusqlite::Params,
        F: FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Query for Connection {
    fn query_opt<T, P, F>(&self, sql: &str, params: P, f: F) -> StoreResult<Option<T>>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        use rusqlite::OptionalExtension;
        Ok(self.prepare_cached(sql)?.query_row(params, f).optional()?)
    }

    fn query_all<T, P, F>(&self, sql: &str, params: P, f: F) -> StoreResult<Vec<T>>
    where
        P: rusqlite::Params,
        F: FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        let mut stmt = self.prepare_cached(sql)?;
        let rows = stmt.query_map(params, f)?;
        Ok(rows.collect::<rusqlite::Result<Vec<T>>>()?)
    }
}

type WriteJob = Box<dyn PendingWrite>;

/// Writes run together in one transaction, at most this many.
pub const MAX_BATCH: usize = 64;

/// One queued write: run inside the batch's transaction, then answered once
/// the batch has committed (or failed).
trait PendingWrite: Send {
    /// Runs the write; true if it succeeded (its savepoint is kept).
    fn run(&mut self, tx: &rusqlite::Transaction<'_>) -> bool;
    /// Answers the caller; `failure` is set when the batch did not commit.
    fn finish(self: Box<Self>, failure: Option<&str>);
}

struct Write<T, F> {
    f: Option<F>,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> PendingWrite for Write<T, F>
where
    T: Send,
    F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send,
{
    fn run(&mut self, tx: &rusqlite::Transaction<'_>) -> bool {
        let result = self.f.take().map(|f| f(tx));
        let ok = matches!(result, Some(Ok(_)));
        self.result = result;
        ok
    }

    fn finish(self: Box<Self>, failure: Option<&str>) {
        let out = match (failure, self.result) {
            (None, Some(r)) => r,
            // Its own error says more than the batch's.
            (Some(_), Some(Err(e))) => Err(e),
            (Some(f), _) => Err(StoreError::NotCommitted(f.to_owned())),
            (None, None) => Err(StoreError::NotCommitted("the write never ran".into())),
        };
        let _ = self.reply.send(out);
    }
}

/// A queued write nobody waits for: its failure is logged.
struct Detached<F> {
    f: Option<F>,
    what: &'static str,
    error: Option<String>,
}

impl<F> PendingWrite for Detached<F>
where
    F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<()> + Send,
{
    fn run(&mut self, tx: &rusqlite::Transaction<'_>) -> bool {
        match self.f.take().map(|f| f(tx)) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                self.error = Some(e.to_string());
                false
            }
            None => false,
        }
    }

    fn finish(self: Box<Self>, failure: Option<&str>) {
        if let Some(e) = self.error.as_deref().or(failure) {
            tracing::error!(error = %e, what = self.what, "queued write failed");
        }
    }
}

/// Runs `jobs` in one IMMEDIATE transaction, each in a savepoint, then
/// answers them all. If SQLite abandons the transaction under a failing
/// write, the savepoint commands fail and so does the whole batch.
fn run_batch(conn: &mut Connection, mut jobs: Vec<WriteJob>) {
    let failure = (|| -> rusqlite::Result<()> {
        let txn = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for job in &mut jobs {
            txn.execute_cached("SAVEPOINT write", [])?;
            if !job.run(&txn) {
                txn.execute_cached("ROLLBACK TO write", [])?;
            }
            txn.execute_cached("RELEASE write", [])?;
        }
        txn.commit()
    })()
    .err()
    .map(|e| e.to_string());
    if let Some(f) = &failure {
        tracing::error!(writes = jobs.len(), error = %f, "a write batch did not commit");
    }
    for job in jobs {
        job.finish(failure.as_deref());
    }
}

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
                while let Some(first) = rx.blocking_recv() {
                    let mut jobs = vec![first];
                    while jobs.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    run_batch(&mut conn, jobs);
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

    /// Creates the database at `path` with the schema of release `version`
    /// (its first `version` migrations) and no host behind it: the upgrade
    /// tests write rows there as that release did, then start today's host.
    #[cfg(feature = "test-hooks")]
    pub fn create_at_version(path: &Path, version: usize) -> StoreResult<()> {
        let mut conn = open_plain(path)?;
        migrations::apply_up_to(&mut conn, version)
    }

    /// Runs `f` on the writer thread inside an IMMEDIATE transaction (shared
    /// with the other writes queued at that moment, see the module doc) and
    /// answers once it is committed. If `f` returns `Err`, everything it wrote
    /// is rolled back (no partial write) and the other writes are unaffected.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: WriteJob = Box::new(Write {
            f: Some(f),
            result: None,
            reply: tx,
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
        let job: WriteJob = Box::new(Detached {
            f: Some(f),
            what,
            error: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    type Reply<T> = oneshot::Receiver<StoreResult<T>>;

    fn job<F>(f: F) -> (WriteJob, Reply<()>)
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<()> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: WriteJob = Box::new(Write {
            f: Some(f),
            result: None,
            reply,
        });
        (job, rx)
    }

    fn insert(name: &'static str) -> impl FnOnce(&rusqlite::Transaction<'_>) -> StoreResult<()> {
        move |tx| {
            tx.execute("INSERT INTO t (name) VALUES (?1)", [name])?;
            Ok(())
        }
    }

    fn setup() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_plain(&dir.path().join("t.db")).unwrap();
        conn.execute_batch("CREATE TABLE t (name TEXT NOT NULL)")
            .unwrap();
        (dir, conn)
    }

    fn names(conn: &Connection) -> Vec<String> {
        let mut stmt = conn.prepare("SELECT name FROM t ORDER BY rowid").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_failing_write_in_a_batch_undoes_only_itself() {
        let (_dir, mut conn) = setup();
        let (a, mut ra) = job(insert("a"));
        let (b, mut rb) = job(|tx| {
            tx.execute("INSERT INTO t (name) VALUES ('b')", [])?;
            Err(StoreError::Invalid("b changed its mind".into()))
        });
        let (c, mut rc) = job(insert("c"));
        run_batch(&mut conn, vec![a, b, c]);
        assert_eq!(names(&conn), ["a", "c"]);
        assert!(ra.try_recv().unwrap().is_ok());
        assert!(matches!(
            rb.try_recv().unwrap(),
            Err(StoreError::Invalid(_))
        ));
        assert!(rc.try_recv().unwrap().is_ok());
    }

    #[test]
    fn when_the_shared_transaction_is_lost_every_write_of_the_batch_fails() {
        let (_dir, mut conn) = setup();
        let (a, mut ra) = job(insert("a"));
        // Ends the shared transaction under everyone (as SQLite does itself
        // after some errors): nothing of the batch may be reported written.
        let (b, mut rb) = job(|tx| {
            tx.execute_batch("ROLLBACK")?;
            Ok(())
        });
        let (c, mut rc) = job(insert("c"));
        run_batch(&mut conn, vec![a, b, c]);
        assert!(names(&conn).is_empty());
        for r in [&mut ra, &mut rb, &mut rc] {
            assert!(matches!(
                r.try_recv().unwrap(),
                Err(StoreError::NotCommitted(_))
            ));
        }
        // The connection is usable for the next batch.
        let (d, mut rd) = job(insert("d"));
        run_batch(&mut conn, vec![d]);
        assert!(rd.try_recv().unwrap().is_ok());
        assert_eq!(names(&conn), ["d"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_all_land_with_their_own_results() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let writes = (0..200).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(move |tx| {
                        tx.execute(
                            "INSERT INTO spaces (id, name, created_at, updated_at) VALUES (?1, ?1, 0, 0)",
                            [format!("s{i}")],
                        )?;
                        if i % 7 == 0 {
                            return Err(StoreError::Invalid(format!("no {i}")));
                        }
                        Ok(i)
                    })
                    .await
            })
        });
        let results = futures_util::future::join_all(writes).await;
        for (i, r) in results.into_iter().enumerate() {
            match r.unwrap() {
                Ok(v) => assert_eq!(v, i),
                Err(StoreError::Invalid(m)) => assert_eq!((i % 7, m), (0, format!("no {i}"))),
                Err(e) => panic!("write {i}: {e}"),
            }
        }
        let n: i64 = store
            .read(|c| Ok(c.query_row("SELECT COUNT(*) FROM spaces", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(
            n,
            200 - 29,
            "every write but the 29 failing ones (multiples of 7)"
        );
    }
}
