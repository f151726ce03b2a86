//! The benches' seed rows, written into a data dir's database file from
//! outside its host, as a second process would (WAL, a busy timeout): many
//! rows in one transaction, faster than the API would take them.
//! SQLite-backend functions: they open the file by path.
//!
//! Must never: run against a data dir that is not a bench's own.

use std::path::Path;
use std::time::Duration;

use super::{Cached, StoreError, StoreResult};

fn open(path: &Path) -> StoreResult<rusqlite::Connection> {
    rusqlite::Connection::open(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })
}

/// `n` user messages of `test:c` in the space `client`, one per
/// millisecond up to `now_ms`.
pub fn client_messages(path: &Path, n: usize, now_ms: i64) -> StoreResult<()> {
    let mut db = open(path)?;
    db.busy_timeout(Duration::from_secs(10))?;
    let tx = db.transaction()?;
    for i in 0..n {
        tx.execute_cached(
            "INSERT INTO messages (space_id, role, text, sender_id, created_at) VALUES ('client', 'user', ?1, 'test:c', ?2)",
            rusqlite::params![format!("message {i} with a little text in it"), now_ms - (n - i) as i64],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// The spaces `bench-0000`… and `messages` done messages spread over them,
/// alternating user and assistant, each `text #i`.
pub fn spaces_with_messages(
    path: &Path,
    spaces: usize,
    messages: usize,
    text: &str,
) -> StoreResult<()> {
    let mut db = open(path)?;
    let tx = db.transaction()?;
    for s in 0..spaces {
        tx.execute_cached(
            "INSERT INTO spaces (id, name, created_at, updated_at) VALUES (?1, ?1, 0, 0)",
            rusqlite::params![format!("bench-{s:04}")],
        )?;
    }
    for i in 0..messages {
        let s = i % spaces.max(1);
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        tx.execute_cached(
            "INSERT INTO messages (space_id, sender_id, role, text, created_at, status) VALUES (?1, ?2, ?3, ?4, ?5, 'done')",
            rusqlite::params![
                format!("bench-{s:04}"),
                format!("api:user{s}"),
                role,
                format!("{text} #{i}"),
                i as i64
            ],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// The spaces `scale-00000`… and `messages` done messages spread over them
/// round-robin, alternating user and assistant, one a millisecond up to
/// `now_ms` (so a `since=1h` read finds them), written in transactions of
/// 50,000 rows. Returns nothing but the rows: `mercury bench scale`'s store.
pub fn scale_store(path: &Path, spaces: usize, messages: usize, now_ms: i64) -> StoreResult<()> {
    let mut db = open(path)?;
    db.busy_timeout(Duration::from_secs(10))?;
    let tx = db.transaction()?;
    for s in 0..spaces {
        tx.execute_cached(
            "INSERT INTO spaces (id, name, created_at, updated_at) VALUES (?1, ?1, 0, 0)",
            rusqlite::params![format!("scale-{s:05}")],
        )?;
    }
    tx.commit()?;
    let spaces = spaces.max(1);
    let mut start = 0;
    while start < messages {
        let end = (start + 50_000).min(messages);
        let tx = db.transaction()?;
        for i in start..end {
            let s = i % spaces;
            let role = if (i / spaces).is_multiple_of(2) {
                "user"
            } else {
                "assistant"
            };
            tx.execute_cached(
                "INSERT INTO messages (space_id, sender_id, role, text, created_at, status) VALUES (?1, ?2, ?3, ?4, ?5, 'done')",
                rusqlite::params![
                    format!("scale-{s:05}"),
                    format!("api:user{s}"),
                    role,
                    format!("message {i} with a little text in it"),
                    now_ms - (messages - i) as i64
                ],
            )?;
        }
        tx.commit()?;
        start = end;
    }
    Ok(())
}
