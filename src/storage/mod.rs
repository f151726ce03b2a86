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
pub mod attachments;
pub mod baseline;
pub mod caller_windows;
pub mod chat_windows;
mod conn;
pub mod conversations;
pub mod copy;
pub mod exchanges;
pub mod extensions;
pub mod forget;
pub mod identities;
#[cfg(feature = "test-hooks")]
pub mod inspect;
pub mod leases;
pub mod links;
pub mod messages;
mod migrations;
pub mod outbox;
pub mod pairings;
mod pg;
pub mod previews;
pub mod rehearsal;
pub mod runs;
pub mod seed;
pub mod signins;
pub mod snapshot;
pub mod space_settings;
pub mod spaces;
pub mod spend;
pub mod stats;
pub mod status;
pub mod tally;
pub mod task_runs;
pub mod tasks;
pub mod tokens;
pub mod ui_lists;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

pub(crate) use conn::params;
pub use conn::{Cell, Conn, Dialect, FromCell, Optional, Param, Query, Row, ToParam, Tx, Value};
use pg::PgBackend;

/// The server's own words for a PostgreSQL error (the driver's Display
/// says only "db error"), for logs; `ApiError` never sends it to a client.
fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database: {}", pg_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    /// The database server cannot be reached (down, restarting, refused).
    #[error("{0}")]
    Unavailable(String),
    #[error("the database writer has stopped")]
    WriterGone,
    #[error("database task failed: {0}")]
    Join(String),
    /// A single-row read found no row (`.optional()` turns it into `None`).
    #[error("the query returned no row")]
    NoRow,
    /// A column held a value of another type than the reader expected.
    #[error("database value: {0}")]
    Column(String),
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
    /// This host lost the space's lease (paused past it, cut off): another
    /// host runs the space now, so nothing of this write may commit.
    #[error("{0}")]
    Fenced(String),
    /// The write ran but the transaction it shared could not commit.
    #[error("the write was not committed: {0}")]
    NotCommitted(String),
}

impl StoreError {
    /// The database gave this write up for another one: PostgreSQL chose
    /// it as a deadlock's victim (`40P01`) or could not serialize it
    /// (`40001`), which hosts writing one database at once can cause.
    /// Nothing of it was written, and the same write sent again can pass.
    pub fn is_contended(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            StoreError::Postgres(e) => e.code().is_some_and(|c| {
                *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
            }),
            _ => false,
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A write a space's one writer (its actor) runs in its mailbox order, with
/// the JSON its caller answers: the actors' and the review's, named once.
pub type SpaceWrite = Box<dyn FnOnce(&Tx<'_>) -> StoreResult<serde_json::Value> + Send + 'static>;

type WriteJob = Box<dyn PendingWrite>;

/// Writes run together in one transaction, at most this many.
pub const MAX_BATCH: usize = 64;

/// One queued write: run inside the batch's transaction, then answered once
/// the batch has committed (or failed).
trait PendingWrite: Send {
    /// Runs the write; true if it succeeded (its savepoint is kept).
    fn run(&mut self, tx: &Tx<'_>) -> bool;
    /// Answers the caller; `failure` is set when the batch did not commit.
    fn finish(self: Box<Self>, failure: Option<&str>);
}

/// How long a lingering write waits for company before it is handed to the
/// writer's queue: an act-as read's audit row reaches the disk within this,
/// sharing a commit with the writes (and rows) of the same moment.
pub const LINGER: Duration = Duration::from_millis(100);

/// Writes queued with [`Store::write_lingering`], not yet handed to the writer.
type Lingering = Arc<Mutex<Vec<WriteJob>>>;

/// Hands every lingering write to the writer's queue (in the order they
/// came; the writer runs its queue in order).
async fn hand_over(lingering: &Lingering, writer: &mpsc::Sender<WriteJob>) -> StoreResult<()> {
    let jobs = match lingering.lock() {
        Ok(mut waiting) => std::mem::take(&mut *waiting),
        Err(_) => Vec::new(),
    };
    for job in jobs {
        writer.send(job).await.map_err(|_| StoreError::WriterGone)?;
    }
    Ok(())
}

struct Write<T, F> {
    f: Option<F>,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> PendingWrite for Write<T, F>
where
    T: Send,
    F: FnOnce(&Tx<'_>) -> StoreResult<T> + Send,
{
    fn run(&mut self, tx: &Tx<'_>) -> bool {
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

impl<F> Detached<F>
where
    F: FnOnce(&Tx<'_>) -> StoreResult<()> + Send + 'static,
{
    fn job(what: &'static str, f: F) -> WriteJob {
        Box::new(Detached {
            f: Some(f),
            what,
            error: None,
        })
    }
}

impl<F> PendingWrite for Detached<F>
where
    F: FnOnce(&Tx<'_>) -> StoreResult<()> + Send,
{
    fn run(&mut self, tx: &Tx<'_>) -> bool {
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

/// Runs `jobs` in one transaction (IMMEDIATE on SQLite), each in a
/// savepoint, then answers them all. If the backend abandons the transaction
/// under a failing write, the savepoint commands fail and so does the whole
/// batch. Returns false when the connection's state is unknown afterwards
/// (it could not even roll back), so a pooled one is not reused.
fn run_batch(conn: &Conn, mut jobs: Vec<WriteJob>) -> bool {
    let begin = match conn.dialect() {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::Postgres => "BEGIN",
    };
    let failure = (|| -> StoreResult<()> {
        conn.control(begin)?;
        let tx = Tx::new(conn);
        for job in &mut jobs {
            conn.control("SAVEPOINT sp_write")?;
            if !job.run(&tx) {
                conn.control("ROLLBACK TO SAVEPOINT sp_write")?;
            }
            conn.control("RELEASE SAVEPOINT sp_write")?;
        }
        conn.control("COMMIT")
    })()
    .err()
    .map(|e| e.to_string());
    let mut reusable = true;
    if let Some(f) = &failure {
        tracing::error!(writes = jobs.len(), error = %f, "a write batch did not commit");
        // SQLite may have rolled back already ("no transaction is active").
        if conn.execute_batch("ROLLBACK").is_err() && conn.dialect() == Dialect::Postgres {
            reusable = false;
        }
    }
    for job in jobs {
        job.finish(failure.as_deref());
    }
    reusable
}

/// How long the writer keeps looking for the next write before it sleeps.
/// A turn's writes come one after the other with a little work between
/// them (the prompt, the model call, the reply); a writer that slept after
/// each had to be woken for the next, a thread wake-up each on top of the
/// hand-off. Looking on for up to 150 µs catches most of them (`bench
/// turns`' p50: 0.64, 0.58, 0.47 and 0.46 ms with no look, 50, 150 and 400
/// µs). The price is CPU: up to 150 µs after each batch, and a thread that
/// yields between looks, so anything else runnable on that CPU goes first.
const WRITER_SPIN: Duration = Duration::from_micros(150);

/// The writer's next job: looked for until [`WRITER_SPIN`] has passed,
/// then waited for; `None` once every sender is gone.
fn next_job(rx: &mut mpsc::Receiver<WriteJob>) -> Option<WriteJob> {
    let until = std::time::Instant::now() + WRITER_SPIN;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {}
        }
        if std::time::Instant::now() >= until {
            return rx.blocking_recv();
        }
        std::thread::yield_now();
    }
}

/// Answers every job of a batch that could not start.
fn fail_batch(jobs: Vec<WriteJob>, why: &str) {
    tracing::error!(writes = jobs.len(), error = %why, "a write batch could not start");
    for job in jobs {
        job.finish(Some(why));
    }
}

/// Handle to the database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    backend: Arc<Backend>,
    /// Sender side of the writer thread's queue. Every clone of `Store` shares
    /// it; the writer thread ends when the last `Store` is dropped and the
    /// channel closes.
    writer: mpsc::Sender<WriteJob>,
    /// Writes the writer takes into one transaction, at most ([`MAX_BATCH`]
    /// unless [`Store::one_write_per_transaction`]).
    batch: Arc<std::sync::atomic::AtomicUsize>,
    /// SQLite: one slot per pooled read connection. An async read waits for
    /// a slot instead of opening a connection past the pool, which costs a
    /// schema parse and a cold page cache, then is closed again (3,738 opens
    /// in 10,000 turns at 32 in flight), and holds a blocking thread and its
    /// allocator arena for each read in flight. PostgreSQL's pool bounds
    /// its own.
    read_slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Writes that wait (at most [`LINGER`]) to share a commit.
    lingering: Lingering,
}

enum Backend {
    Sqlite {
        path: PathBuf,
        /// Idle read-only connections, reused so their settings are made once.
        readers: Mutex<Vec<Conn>>,
    },
    Postgres(PgBackend),
}

/// Which database a deployment keeps its state in (`storage.backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The data dir's `state.db`.
    Sqlite(PathBuf),
    /// A PostgreSQL database: the URL (`storage.url`) and, when it comes
    /// from a file, the password.
    Postgres {
        url: String,
        password: Option<String>,
    },
}

impl Location {
    /// Where a deployment whose config says `storage` keeps its rows: the
    /// `sqlite_file` (its data dir's `state.db`), or the PostgreSQL
    /// database `storage.url` names, its password read from
    /// `storage.password_file` when set (so it is in no URL or process list).
    pub fn of(storage: &crate::config::StorageConfig, sqlite_file: &Path) -> StoreResult<Location> {
        use crate::config::StorageBackend;
        Ok(match storage.backend {
            StorageBackend::Sqlite => Location::Sqlite(sqlite_file.to_owned()),
            StorageBackend::Postgres => {
                let password = match storage.password_file.trim() {
                    "" => None,
                    file => Some(
                        std::fs::read_to_string(file)
                            .map_err(|e| {
                                StoreError::Invalid(format!(
                                    "reading storage.password_file {file}: {e}"
                                ))
                            })?
                            .trim_end_matches(['\n', '\r'])
                            .to_owned(),
                    ),
                };
                Location::Postgres {
                    url: storage.url.trim().to_owned(),
                    password,
                }
            }
        })
    }
}

const READER_POOL: usize = 8;

/// Prepared statements kept per connection: more than the ingress and turn
/// paths use together, so neither evicts the other's.
const STATEMENT_CACHE: usize = 128;

/// `execute` and `query_row` through a plain SQLite connection's statement
/// cache, for the modules that still open their own file.
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
    cache_plans(conn)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
    Ok(())
}

/// What every store connection, read-only ones included, sets up so that a
/// cached statement is prepared once and a savepoint costs no file.
///
/// The query planner stability guarantee: without it the bundled SQLite
/// (3.54) marks a statement with a `col = ?` term (under an `ORDER BY` or a
/// join) to be prepared again when that parameter is rebound to or from 0
/// or 1, and rusqlite's statement cache clears every binding when a
/// statement goes back to the cache, which SQLite takes as such a rebind: so
/// every cached statement with such a term was prepared again on each use
/// (about seven per no-tool turn, found with `sqlite3_stmt_status`). With
/// the guarantee a plan never depends on a bound value, so a partial index
/// is chosen only where the statement names its condition as a literal
/// (`state = 0`, `status = 'pending'`); the store's statements do.
///
/// `temp_store = MEMORY`: each write runs in a savepoint, whose statement
/// journal otherwise went to a new temporary file (created, written and
/// deleted once per turn); it holds at most the pages one write changes.
fn cache_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

/// WAL pages the writer lets gather before it copies them into the main
/// file (SQLite's default is 1,000). A checkpoint runs inside the commit that
/// crosses the mark, so with the default one commit in a few hundred paid
/// several milliseconds (a turn's p99 was 5–6 ms against a p50 under 1 ms),
/// and the same hot index pages were copied again at every checkpoint; ten
/// times the interval copies each of them once where it copied it ten times
/// (`bench turns`: ingest about 20% faster, turn p99 1.3–2.9 ms). The price
/// is a WAL file of up to about 40 MB that SQLite keeps at its largest size.
const WAL_CHECKPOINT_PAGES: i64 = 10_000;

impl Store {
    /// Opens (creating if needed) the SQLite database at `path`, applies
    /// migrations and starts the writer thread.
    pub fn open(path: &Path) -> StoreResult<Store> {
        Store::open_at(&Location::Sqlite(path.to_owned()))
    }

    /// Opens the store where `location` says, applies the migrations and
    /// starts the writer thread.
    pub fn open_at(location: &Location) -> StoreResult<Store> {
        let backend = Arc::new(match location {
            Location::Sqlite(path) => {
                let conn = Conn::sqlite(open_plain(path)?);
                migrations::apply(&conn)?;
                let backend = Backend::Sqlite {
                    path: path.clone(),
                    readers: Mutex::new(Vec::new()),
                };
                return Store::start(backend, Some(conn));
            }
            Location::Postgres { url, password } => {
                let pg = PgBackend::connect(url, password.clone(), |pg| {
                    migrations::apply(&Conn::postgres(pg.get()?))
                })?;
                Backend::Postgres(pg)
            }
        });
        Store::start_shared(backend, None)
    }

    /// Opens the store where `location` says without migrating it (what
    /// `mercury storage status` reads: the version as it is).
    pub fn open_unmigrated(location: &Location) -> StoreResult<Store> {
        match location {
            Location::Sqlite(path) => {
                let conn = Conn::sqlite(open_plain(path)?);
                let backend = Backend::Sqlite {
                    path: path.clone(),
                    readers: Mutex::new(Vec::new()),
                };
                Store::start(backend, Some(conn))
            }
            Location::Postgres { url, password } => {
                let pg = PgBackend::connect(url, password.clone(), |_| Ok(()))?;
                Store::start_shared(Arc::new(Backend::Postgres(pg)), None)
            }
        }
    }

    fn start(backend: Backend, writer_conn: Option<Conn>) -> StoreResult<Store> {
        Store::start_shared(Arc::new(backend), writer_conn)
    }

    /// Starts the writer thread: SQLite's keeps its one connection,
    /// PostgreSQL's takes one from the pool for each batch (so a server
    /// restart costs the batches in flight, and the next one reconnects).
    fn start_shared(backend: Arc<Backend>, writer_conn: Option<Conn>) -> StoreResult<Store> {
        let (tx, mut rx) = mpsc::channel::<WriteJob>(1024);
        let for_writer = backend.clone();
        let lingering: Lingering = Arc::default();
        let for_lingering = lingering.clone();
        let batch = Arc::new(std::sync::atomic::AtomicUsize::new(MAX_BATCH));
        let batch_limit = batch.clone();
        std::thread::Builder::new()
            .name("mercury-db-writer".into())
            .spawn(move || {
                while let Some(first) = next_job(&mut rx) {
                    let mut jobs = vec![first];
                    let most = batch_limit.load(std::sync::atomic::Ordering::Relaxed);
                    while jobs.len() < most {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    // Lingering writes ride along where the batch has room
                    // (their timer hands the rest over).
                    if jobs.len() < most {
                        if let Ok(mut waiting) = for_lingering.lock() {
                            let take = waiting.len().min(most - jobs.len());
                            jobs.extend(waiting.drain(..take));
                        }
                    }
                    match (&writer_conn, for_writer.as_ref()) {
                        (Some(conn), _) => {
                            run_batch(conn, jobs);
                        }
                        (None, Backend::Postgres(pg)) => match pg.get() {
                            Ok(c) => {
                                let conn = Conn::postgres(c);
                                if !run_batch(&conn, jobs) {
                                    if let Some(c) = conn.into_postgres() {
                                        c.discard();
                                    }
                                }
                            }
                            Err(e) => fail_batch(jobs, &e.to_string()),
                        },
                        (None, Backend::Sqlite { .. }) => {
                            fail_batch(jobs, "the SQLite writer has no connection");
                        }
                    }
                }
            })
            .map_err(|e| StoreError::Join(format!("cannot start the writer thread: {e}")))?;
        let read_slots = matches!(backend.as_ref(), Backend::Sqlite { .. })
            .then(|| Arc::new(tokio::sync::Semaphore::new(READER_POOL)));
        Ok(Store {
            inner: Arc::new(StoreInner {
                backend,
                writer: tx,
                batch,
                read_slots,
                lingering,
            }),
        })
    }

    /// The payloads of PostgreSQL's `NOTIFY channel` from now on (a host of
    /// many hears another host's wake-ups); `None` on SQLite, which has one
    /// host and nothing to hear.
    pub fn listen(&self, channel: &str) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        match self.inner.backend.as_ref() {
            Backend::Sqlite { .. } => None,
            Backend::Postgres(pg) => Some(pg.listen(channel)),
        }
    }

    /// One write per transaction from now on. Many hosts writing one
    /// PostgreSQL database take row locks in each other's way: a batch of
    /// many writes holds many rows in an order no other host shares, and two
    /// such batches deadlock (two hosts storing messages of the same
    /// conversations did); one write holds few rows, in its own order.
    pub fn one_write_per_transaction(&self) {
        self.inner
            .batch
            .store(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn dialect(&self) -> Dialect {
        match self.inner.backend.as_ref() {
            Backend::Sqlite { .. } => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Where the store is, for messages (a PostgreSQL URL without its password).
    pub fn describe(&self) -> String {
        match self.inner.backend.as_ref() {
            Backend::Sqlite { path, .. } => path.display().to_string(),
            Backend::Postgres(pg) => pg.display.clone(),
        }
    }

    /// Creates the database at `path` with the schema of release `version`
    /// (its first `version` migrations) and no host behind it: the upgrade
    /// tests write rows there as that release did, then start today's host.
    #[cfg(feature = "test-hooks")]
    pub fn create_at_version(path: &Path, version: usize) -> StoreResult<()> {
        let conn = Conn::sqlite(open_plain(path)?);
        migrations::apply_up_to(&conn, version)
    }

    /// Runs `f` on the writer thread inside one transaction (shared with
    /// the other writes queued at that moment, see the module doc) and
    /// answers once it is committed. If `f` returns `Err`, everything it wrote
    /// is rolled back (no partial write) and the other writes are unaffected.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        let started = tally::on().then(std::time::Instant::now);
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
        let out = rx.await.map_err(|_| StoreError::WriterGone)?;
        if let Some(t) = started {
            tally::record(tally::WRITE_HANDOFF, t.elapsed());
        }
        out
    }

    /// Queues a write without waiting for its commit. The writer runs jobs in
    /// order, so a later `write` sees this one (and so does a read made after
    /// that write returned; a read alone may not yet); a failure is
    /// logged with `what`. Used where the caller must not wait on the disk
    /// but order matters (a UI sign-in's last-seen time, a wake-up for
    /// another host).
    pub async fn write_detached<F>(&self, what: &'static str, f: F)
    where
        F: FnOnce(&Tx<'_>) -> StoreResult<()> + Send + 'static,
    {
        let job = Detached::job(what, f);
        if self.inner.writer.send(job).await.is_err() {
            tracing::error!(what, "queued write lost: the database writer has stopped");
        }
    }

    /// Queues a write that may wait up to [`LINGER`] to share a commit with
    /// other writes: it rides along with the writer's next batch if that has
    /// room, and is handed to the writer's queue when [`LINGER`] has passed
    /// (or as soon as a batch's worth waits). It has no order against other
    /// writes (use it only for a write that reads nothing another queued
    /// write makes: an act-as audit row), and nobody waits for it; a failure
    /// is logged with `what`. [`Store::flush_lingering`] writes them now.
    ///
    /// Why: an act-as read's audit row in a commit of its own cost each
    /// request a WAL append and every reader's page cache (issue 32); a
    /// row per request is kept (D-008), a commit per request is not.
    pub fn write_lingering<F>(&self, what: &'static str, f: F)
    where
        F: FnOnce(&Tx<'_>) -> StoreResult<()> + Send + 'static,
    {
        let job = Detached::job(what, f);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No timer can run: queued as an ordinary write.
            if self.inner.writer.try_send(job).is_err() {
                tracing::error!(
                    what,
                    "queued write lost: the database writer is full or gone"
                );
            }
            return;
        };
        let waiting = match self.inner.lingering.lock() {
            Ok(mut waiting) => {
                waiting.push(job);
                waiting.len()
            }
            Err(_) => {
                tracing::error!(what, "queued write lost: the lingering queue is poisoned");
                return;
            }
        };
        // The first of a group starts its timer; a full batch goes at once.
        // The timer holds a sender, so the writer outlives what it carries.
        if waiting == 1 || waiting == MAX_BATCH {
            let (lingering, writer) = (self.inner.lingering.clone(), self.inner.writer.clone());
            let delay = if waiting == 1 { LINGER } else { Duration::ZERO };
            runtime.spawn(async move {
                tokio::time::sleep(delay).await;
                if hand_over(&lingering, &writer).await.is_err() {
                    tracing::error!("lingering writes lost: the database writer has stopped");
                }
            });
        }
    }

    /// Hands every lingering write to the writer and waits until they are
    /// committed (or failed, which is logged): a reader of what they write
    /// (the audit listing, the host's shutdown) sees them all.
    pub async fn flush_lingering(&self) -> StoreResult<()> {
        hand_over(&self.inner.lingering, &self.inner.writer).await?;
        // The writer runs its queue in order: this answers after them.
        self.write(|_| Ok(())).await
    }

    /// Runs `f` on a read connection off the async runtime.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Conn) -> StoreResult<T> + Send + 'static,
    {
        let started = tally::on().then(std::time::Instant::now);
        let inner = self.inner.clone();
        // The semaphore is the store's own and never closed; were it ever,
        // reading without a slot is what the store did before slots.
        let slot = match &self.inner.read_slots {
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        };
        let out = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            pg::blocking_here(|| inner.with_reader(f))
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?;
        if let Some(t) = started {
            tally::record(tally::READ_HANDOFF, t.elapsed());
        }
        out
    }

    /// Synchronous read for code already off the runtime (CLI, benches).
    pub fn read_blocking<T>(&self, f: impl FnOnce(&Conn) -> StoreResult<T>) -> StoreResult<T> {
        self.inner.with_reader(f)
    }
}

impl StoreInner {
    fn with_reader<T>(&self, f: impl FnOnce(&Conn) -> StoreResult<T>) -> StoreResult<T> {
        match self.backend.as_ref() {
            Backend::Sqlite { path, readers } => {
                let conn = match readers.lock().ok().and_then(|mut v| v.pop()) {
                    Some(c) => c,
                    None => Conn::sqlite(open_read_only(path)?),
                };
                let out = f(&conn);
                if let Ok(mut v) = readers.lock() {
                    if v.len() < READER_POOL {
                        v.push(conn);
                    }
                }
                out
            }
            Backend::Postgres(pg) => f(&Conn::postgres(pg.get()?)),
        }
    }
}

/// A read-write connection with the store's file settings (WAL, busy
/// timeout, foreign keys, `synchronous = NORMAL`) and no schema: what the
/// writer thread runs on.
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

/// A read-only store connection to the SQLite database at `path` (another
/// data dir's: a snapshot, a shadow), with no writer behind it.
pub fn open_read_only_conn(path: &Path) -> StoreResult<Conn> {
    Ok(Conn::sqlite(open_read_only(path)?))
}

/// A read-only connection.
pub fn open_read_only(path: &Path) -> StoreResult<Connection> {
    let open_err = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(open_err)?;
    cache_plans(&conn).map_err(open_err)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// An in-memory SQLite store connection with today's schema, for the unit
/// tests of the storage modules.
#[cfg(test)]
pub(crate) fn test_conn() -> Conn {
    let conn = Conn::sqlite(Connection::open_in_memory().unwrap());
    migrations::apply(&conn).unwrap();
    conn
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    type Reply<T> = oneshot::Receiver<StoreResult<T>>;

    fn job<F>(f: F) -> (WriteJob, Reply<()>)
    where
        F: FnOnce(&Tx<'_>) -> StoreResult<()> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: WriteJob = Box::new(Write {
            f: Some(f),
            result: None,
            reply,
        });
        (job, rx)
    }

    fn insert(name: &'static str) -> impl FnOnce(&Tx<'_>) -> StoreResult<()> {
        move |tx| {
            tx.execute("INSERT INTO t (name) VALUES (?1)", params![name])?;
            Ok(())
        }
    }

    fn setup() -> (tempfile::TempDir, Conn) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Conn::sqlite(open_plain(&dir.path().join("t.db")).unwrap());
        conn.execute_batch("CREATE TABLE t (name TEXT NOT NULL)")
            .unwrap();
        (dir, conn)
    }

    fn names(conn: &Conn) -> Vec<String> {
        conn.query_all("SELECT name FROM t ORDER BY rowid", params![], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn the_writer_takes_a_job_sent_while_it_looks_or_after_it_sleeps_and_ends_when_closed() {
        let (tx, mut rx) = mpsc::channel::<WriteJob>(4);
        let (first, _answer) = job(|_| Ok(()));
        tx.try_send(first).unwrap();
        assert!(next_job(&mut rx).is_some(), "a queued job is taken at once");
        let late = std::thread::spawn({
            let tx = tx.clone();
            move || {
                // Past the look: the writer is asleep in `blocking_recv`.
                std::thread::sleep(WRITER_SPIN * 20);
                let (late, answer) = job(|_| Ok(()));
                tx.blocking_send(late).unwrap();
                answer
            }
        });
        assert!(
            next_job(&mut rx).is_some(),
            "a job sent after the look wakes it"
        );
        drop(late.join().unwrap());
        drop(tx);
        assert!(
            next_job(&mut rx).is_none(),
            "no sender left: the writer ends"
        );
    }

    /// How often SQLite prepared `sql` again since its cached statement was made.
    fn reprepared(conn: &Conn, sql: &str) -> i32 {
        let c = conn.as_sqlite().unwrap();
        c.prepare_cached(sql)
            .unwrap()
            .get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn a_cached_statement_with_a_bound_equality_is_prepared_once_on_every_connection() {
        let (dir, conn) = setup();
        conn.execute_batch("CREATE INDEX t_name ON t (name)")
            .unwrap();
        for name in ["a", "b", "c"] {
            conn.execute("INSERT INTO t (name) VALUES (?1)", params![name])
                .unwrap();
        }
        let reader = Conn::sqlite(open_read_only(&dir.path().join("t.db")).unwrap());
        // An equality with a bound value in a statement with an ORDER BY is
        // what SQLite marks for a new plan when the value is rebound to or
        // from 0 or 1; the statement cache's cleared bindings count as that.
        let sql = "SELECT rowid FROM t WHERE name = ?1 ORDER BY rowid";
        for c in [&conn, &reader] {
            for (name, id) in [("a", 1_i64), ("b", 2), ("c", 3), ("a", 1)] {
                let found: i64 = c.query_row(sql, params![name], |r| r.get(0)).unwrap();
                assert_eq!(found, id);
            }
            assert_eq!(
                reprepared(c, sql),
                0,
                "a cached statement was prepared again"
            );
            let temp: i64 = c
                .query_row("PRAGMA temp_store", params![], |r| r.get(0))
                .unwrap();
            assert_eq!(temp, 2, "savepoint journals go to memory, not a file");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_reads_wait_for_a_pooled_connection_instead_of_opening_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let reads = (0..READER_POOL * 4).map(|_| {
            let (store, now, most) = (store.clone(), now.clone(), most.clone());
            tokio::spawn(async move {
                store
                    .read(move |c| {
                        let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(at_once, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        let one: i64 = c.query_row("SELECT 1", params![], |r| r.get(0))?;
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok(one)
                    })
                    .await
            })
        });
        for read in futures_util::future::join_all(reads).await {
            assert_eq!(read.unwrap().unwrap(), 1);
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most <= READER_POOL, "{most} reads ran at once");
        assert!(most > 1, "reads still run side by side");
    }

    /// Inserts space `id` on the writer and notes when it ran.
    fn noted_space(
        id: String,
        ran: Arc<Mutex<Vec<std::time::Instant>>>,
    ) -> impl FnOnce(&Tx<'_>) -> StoreResult<()> + Send + 'static {
        move |tx| {
            tx.execute(
                "INSERT INTO spaces (id, name, created_at, updated_at) VALUES (?1, ?1, 0, 0)",
                params![id],
            )?;
            ran.lock().unwrap().push(std::time::Instant::now());
            Ok(())
        }
    }

    async fn spaces_in(store: &Store) -> i64 {
        store
            .read(|c| c.query_row("SELECT COUNT(*) FROM spaces", params![], |r| r.get(0)))
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lingering_writes_wait_for_company_and_a_flush_writes_them_now() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let ran = Arc::new(Mutex::new(Vec::new()));
        // Five writes a millisecond apart: none runs before the last is
        // queued (a write of its own would have run at once).
        let mut last_queued = std::time::Instant::now();
        for i in 0..5 {
            store.write_lingering("test row", noted_space(format!("l{i}"), ran.clone()));
            last_queued = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while spaces_in(&store).await < 5 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(spaces_in(&store).await, 5, "the timer writes them alone");
        let times = ran.lock().unwrap().clone();
        assert!(
            times.iter().all(|t| *t >= last_queued),
            "a lingering write ran before the others were queued"
        );
        // A write that comes takes the lingering ones into its batch.
        store.write_lingering("test row", noted_space("l5".into(), ran.clone()));
        store
            .write(noted_space("w".into(), ran.clone()))
            .await
            .unwrap();
        assert_eq!(spaces_in(&store).await, 7, "they rode with the write");
        // A flush hands them over and waits for their commit.
        for i in 6..9 {
            store.write_lingering("test row", noted_space(format!("l{i}"), ran.clone()));
        }
        store.flush_lingering().await.unwrap();
        assert_eq!(spaces_in(&store).await, 10);
    }

    /// With one write per transaction no batch has room for a lingering
    /// write to ride along: the timer's one hand-over must bring them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lingering_writes_left_behind_by_a_full_batch_are_still_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        store.one_write_per_transaction();
        let ran = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3 {
            store.write_lingering("test row", noted_space(format!("l{i}"), ran.clone()));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while spaces_in(&store).await < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(spaces_in(&store).await, 3, "a lingering write was stranded");
    }

    #[test]
    fn a_failing_write_in_a_batch_undoes_only_itself() {
        let (_dir, conn) = setup();
        let (a, mut ra) = job(insert("a"));
        let (b, mut rb) = job(|tx| {
            tx.execute("INSERT INTO t (name) VALUES ('b')", params![])?;
            Err(StoreError::Invalid("b changed its mind".into()))
        });
        let (c, mut rc) = job(insert("c"));
        run_batch(&conn, vec![a, b, c]);
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
        let (_dir, conn) = setup();
        let (a, mut ra) = job(insert("a"));
        // Ends the shared transaction under everyone (as SQLite does itself
        // after some errors): nothing of the batch may be reported written.
        let (b, mut rb) = job(|tx| {
            tx.execute_batch("ROLLBACK")?;
            Ok(())
        });
        let (c, mut rc) = job(insert("c"));
        run_batch(&conn, vec![a, b, c]);
        assert!(names(&conn).is_empty());
        for r in [&mut ra, &mut rb, &mut rc] {
            assert!(matches!(
                r.try_recv().unwrap(),
                Err(StoreError::NotCommitted(_))
            ));
        }
        // The connection is usable for the next batch.
        let (d, mut rd) = job(insert("d"));
        run_batch(&conn, vec![d]);
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
                            params![format!("s{i}")],
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
            .read(|c| c.query_row("SELECT COUNT(*) FROM spaces", params![], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(
            n,
            200 - 29,
            "every write but the 29 failing ones (multiples of 7)"
        );
    }
}
