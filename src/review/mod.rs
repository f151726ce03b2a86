//! Conversation review (milestone 1): a daily scan judges every exchange of
//! the last window with an LLM judge and writes a redacted report on the box;
//! the owner gets a DM digest.
//!
//! - [`reader`]: the window of exchanges per space, over a read-only connection.
//! - redaction and its fail-closed gate are [`crate::redaction`] (the API uses them too).
//! - [`judge`]: the batched, tool-less judge prompt and the validation of its answer.
//! - [`report`]: `report.md` + `report.json`, gated, written atomically.
//! - [`digest`]: the owner's DM.
//! - [`scan`]: one scan end to end, recorded as a `review` run.
//! - [`fingerprint`]: what makes two findings the same across days and wording.
//! - [`friction`]: friction signals (corrections, rephrasings, complaints,
//!   failed and abandoned turns), computed without a model.
//! - [`relate`]: known items of the intake directory ranked for a finding (BM25).
//! - [`intake`]: pull, re-gate and triage other hosts' reports (M2.1).
//! - [`ledger`]: owner approval, applying rows, `ledger.json`.
//! - [`draft`]: a drafted `AGENTS.md`/`MEMORY.md` edit for a finding of this host's bot.
//! - [`rehearse`]: what a rehearsal of a drafted fix records, and the judge's comparison.
//! - [`weekly`]: the weekly synthesis (clusters, recall, verdicts); [`stats`] its figures.
//! - [`trend`]: the last eight weeks, counted per week (the weekly's trend lines).
//! - [`catalog`]: the reports on the box, listed and read back (the API's
//!   `GET /api/review/reports`).
//!
//! The actors that run it (`ReviewScheduler`, `JudgePool`) live in
//! `crate::actors`, above this module: review reaches them only through the
//! two traits it owns here, [`SpaceWriter`] (the digest's outbox row goes
//! through its space's one writer) and [`BatchJudge`] (a batch to the judge
//! pool). The admission of judge calls is in `crate::model::gate`.
//!
//! Must never: let an identifier reach a report, a digest or a judge prompt,
//! or write to the database except the run row, token usage and the digest's
//! outbox item.

pub(crate) mod catalog;
pub(crate) mod digest;
pub(crate) mod draft;
pub(crate) mod fingerprint;
pub(crate) mod friction;
pub(crate) mod intake;
pub(crate) mod judge;
pub(crate) mod ledger;
pub(crate) mod reader;
pub(crate) mod rehearse;
pub(crate) mod relate;
pub(crate) mod report;
pub(crate) mod scan;
pub(crate) mod stats;
pub(crate) mod trend;
pub(crate) mod weekly;

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::storage::StoreError;

pub(crate) use crate::storage::SpaceWrite;

/// Why a write through a space's writer did not happen.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SpaceWriteError(pub String);

/// The one writer of each space (implemented by the space actors'
/// directory): review writes in a space only through it.
#[async_trait]
pub trait SpaceWriter: Send + Sync {
    async fn write_in_space(
        &self,
        space: &crate::ids::SpaceId,
        write: SpaceWrite,
    ) -> Result<Value, SpaceWriteError>;
}

/// Judges one batch of redacted exchanges (implemented by the judge pool).
/// Every failure to get a verdict is a skipped batch with a reason.
#[async_trait]
pub trait BatchJudge: Send + Sync {
    async fn judge(&self, job: judge::JudgeJob, timeout: Duration) -> judge::BatchVerdict;
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("reading the conversations: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Redaction(#[from] crate::redaction::BuildError),
    #[error("writing the report in {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the review scheduler is not available: {0}")]
    Unavailable(String),
    #[error("a review task failed: {0}")]
    Join(String),
}
