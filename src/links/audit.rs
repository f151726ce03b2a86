//! The act-as audit row of one request (D-008) on its way to the store: the
//! slot the act-as step fills, that the request's first space write takes
//! into its own transaction, and that the step completes (or writes whole)
//! when the request ends, however it ends.
//!
//! Why a slot: an `admin` request's row must be committed no later than its
//! effect (issue 11: no effect without its row). Committing it in a
//! transaction of its own before the handler ran cost every act-as write a
//! second awaited commit (issue 32). Since every API write of a space goes
//! through `SpaceDirectory::apply`, which runs in the request's task, that
//! write takes the row into its own transaction instead: the row and the
//! effect commit together or not at all.
//!
//! Must never: let a request end without its row (the completion runs
//! whether the row was taken or not, and writes it whole when it was not),
//! write the row twice, or carry a row into a task other than its request's.

use std::sync::{Arc, Mutex};

use crate::storage::links::{self as link_store, AuditRow};
use crate::storage::{StoreResult, Tx};

tokio::task_local! {
    /// The act-as row of the request this task serves, set by the act-as
    /// step around the handler of a route whose effect is a space write;
    /// read by `SpaceDirectory::apply` in the same task. Never set elsewhere.
    static REQUEST_ROW: AuditSlot;
}

/// Where one act-as request's audit row stands.
#[derive(Debug)]
enum Stage {
    /// Not in the store yet.
    Pending(AuditRow),
    /// Inserted (without its status) in a write's transaction that
    /// succeeded; kept whole in case that transaction's commit failed.
    Taken { id: i64, row: AuditRow },
    /// Completed: nothing more to write.
    Closed,
}

/// One request's audit row, shared by the act-as step and the write that
/// takes it. Every change to it happens on the store's writer, in order.
#[derive(Debug, Clone)]
pub struct AuditSlot(Arc<Mutex<Stage>>);

impl AuditSlot {
    pub fn new(row: AuditRow) -> Self {
        AuditSlot(Arc::new(Mutex::new(Stage::Pending(row))))
    }

    /// Runs `fut` (the handler) with this slot as its request's row.
    pub async fn scope<F: std::future::Future>(&self, fut: F) -> F::Output {
        REQUEST_ROW.scope(self.clone(), fut).await
    }

    /// Inside a write's transaction: inserts the row (status still open) if
    /// it is pending; `Some(id)` when it did. The write's savepoint undoes
    /// the insert with the effect if the effect fails.
    fn insert_in(&self, tx: &Tx<'_>) -> StoreResult<Option<i64>> {
        let Ok(stage) = self.0.lock() else {
            return Ok(None);
        };
        match &*stage {
            Stage::Pending(row) => link_store::audit(tx, row).map(Some),
            _ => Ok(None),
        }
    }

    /// The effect succeeded in the transaction that holds row `id`.
    fn taken(&self, id: i64) {
        if let Ok(mut stage) = self.0.lock() {
            if let Stage::Pending(row) = std::mem::replace(&mut *stage, Stage::Closed) {
                *stage = Stage::Taken { id, row };
            }
        }
    }

    /// Inserts the row now, in a transaction of its own, for an `admin`
    /// route whose effect is not a space write: committed before the
    /// handler runs, completed when it ends.
    pub fn write_ahead(&self, tx: &Tx<'_>) -> StoreResult<()> {
        if let Some(id) = self.insert_in(tx)? {
            self.taken(id);
        }
        Ok(())
    }

    /// On the writer, after everything the request queued: completes the row
    /// with the request's outcome, or writes it whole if no write took it
    /// (a read, a refusal before the effect, a client gone before it) or
    /// the write that took it did not commit.
    pub fn write_outcome(&self, tx: &Tx<'_>, outcome: Outcome) -> StoreResult<()> {
        let stage = match self.0.lock() {
            Ok(mut s) => std::mem::replace(&mut *s, Stage::Closed),
            Err(_) => return Ok(()),
        };
        let Outcome {
            status,
            detail,
            before,
            after,
        } = outcome;
        let whole = |mut row: AuditRow| {
            row.status = Some(status);
            row.detail = detail.clone().or(row.detail);
            row.before_value = before.clone();
            row.after_value = after.clone();
            link_store::audit(tx, &row).map(|_| ())
        };
        match stage {
            Stage::Pending(row) => whole(row),
            Stage::Taken { id, row } => {
                let updated = link_store::audit_finish(
                    tx,
                    id,
                    status,
                    detail.as_deref(),
                    before.as_deref(),
                    after.as_deref(),
                )?;
                if updated {
                    Ok(())
                } else {
                    // The write's transaction did not commit: its row is not there.
                    whole(row)
                }
            }
            Stage::Closed => Ok(()),
        }
    }
}

/// How an act-as request ended, for its row.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub status: i64,
    pub detail: Option<String>,
    /// What an update replaced and wrote (JSON text), where the route said.
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The write `write` with this task's pending act-as row taken into its
/// transaction (the row first, then the effect), if the task serves an
/// act-as request whose row is still pending; else `write` unchanged. Used
/// by `SpaceDirectory::apply`, the one funnel of the API's space writes.
pub fn with_request_row<T, F>(write: F) -> impl FnOnce(&Tx<'_>) -> StoreResult<T> + Send + 'static
where
    F: FnOnce(&Tx<'_>) -> StoreResult<T> + Send + 'static,
{
    let slot = REQUEST_ROW.try_with(Clone::clone).ok();
    move |tx| {
        let Some(slot) = slot else {
            return write(tx);
        };
        let id = slot.insert_in(tx)?;
        let out = write(tx)?;
        if let Some(id) = id {
            slot.taken(id);
        }
        Ok(out)
    }
}
