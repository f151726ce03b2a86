//! Conversation review (milestone 1): a daily scan judges every exchange of
//! the last window with an LLM judge and writes a redacted report on the box;
//! the owner gets a DM digest.
//!
//! - [`reader`]: the window of exchanges per space, over a read-only connection.
//! - [`redact`]: identifier redaction and the fail-closed gate.
//! - [`judge`]: the batched, tool-less judge prompt and the validation of its answer.
//! - [`report`]: `report.md` + `report.json`, gated, written atomically.
//! - [`digest`]: the owner's DM.
//! - [`scan`]: one scan end to end, recorded as a `review` run.
//!
//! The actors that run it (`ReviewScheduler`, `JudgePool`) live in
//! `crate::actors`; the admission of judge calls in `crate::model::gate`.
//!
//! Must never: let an identifier reach a report, a digest or a judge prompt,
//! or write to the database except the run row, token usage and the digest's
//! outbox item.

pub mod digest;
pub mod judge;
pub mod reader;
pub mod redact;
pub mod report;
pub mod scan;

use crate::storage::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("reading the conversations: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Redaction(#[from] redact::BuildError),
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
