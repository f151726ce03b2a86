//! Compaction: the history above a space's session boundary summarised by
//! the model, then the boundary moved so later turns see the summary instead
//! of the old messages.
//!
//! Must never: move the boundary when the model did not answer, or record
//! usage outside the transaction that stores the summary.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::model::{ChatMessage, Purpose, Role};
use crate::runtime::Runtime;
use crate::storage::{messages, runs, spaces, StoreError};

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The model chain's own sentence.
    #[error("compaction failed: {0}")]
    Model(String),
}

/// Summarises the history above the boundary through the model, then moves
/// the boundary so later turns see the summary instead of the old messages.
pub(crate) async fn compact(rt: &Arc<Runtime>, space: &str) -> Result<Value, CompactError> {
    let rt = rt.clone();
    let space = space.to_owned();
    let limit = rt.settings.turn.history_limit.max(100);
    let (history, prev_summary, chain, boundary) = {
        let (rt2, space) = (rt.clone(), space.clone());
        rt.store
            .read(move |c| {
                let (b, summary) = spaces::session_boundary(c, &space)?;
                let h = messages::history(c, &space, b, i64::MAX, limit)?;
                let chain = super::live::model_chain(c, &rt2, &space)?;
                let max = messages::max_id(c, &space)?;
                Ok((h, summary, chain, max))
            })
            .await?
    };
    if history.is_empty() {
        return Ok(
            json!({"compacted": false, "boundary": boundary, "summary": null, "reason": "nothing to compact"}),
        );
    }
    let mut transcript = String::new();
    if let Some(s) = prev_summary {
        transcript.push_str(&format!("Earlier summary: {s}\n"));
    }
    for m in &history {
        transcript.push_str(&format!("{}: {}\n", m.role, m.text));
    }
    let messages = vec![
        ChatMessage::text(
            Role::System,
            "Summarise this conversation for your own later use: facts, decisions, open questions. Plain text, short.",
        ),
        ChatMessage::text(Role::User, transcript),
    ];
    let charge = crate::spend::Charge {
        space: Some(space.clone()),
        purpose: crate::spend::SpendPurpose::Compact,
    };
    let answer = super::complete_with_chain(
        &rt,
        &chain,
        Purpose::Compact,
        &charge,
        &messages,
        &[],
        crate::spend::CallContext::default(),
    )
    .await
    .map_err(|e| CompactError::Model(e.to_string()))?;
    let (space2, spec, summary, usage, cost) = (
        space.clone(),
        answer.spec,
        answer.response.text.clone(),
        answer.response.usage,
        answer.cost,
    );
    rt.store
        .write(move |tx| {
            spaces::set_session_boundary(tx, &space2, boundary, Some(&summary))?;
            runs::record_usage(
                tx,
                &runs::UsageRow {
                    run_id: None,
                    space_id: &space2,
                    model: &spec,
                    kind: "compact",
                    tokens_in: usage.input_tokens,
                    tokens_out: usage.output_tokens,
                    cost,
                },
            )
        })
        .await?;
    Ok(json!({"compacted": true, "boundary": boundary, "summary": answer.response.text}))
}
