//! The judge (M1.3): how a batch of redacted exchanges is put to the model,
//! and how the model's answer becomes validated findings.
//!
//! A batch is one model call with no tools and `purpose: judge`. In the
//! prompt each exchange starts with a line `[msg <message id>]` (the id of
//! the user message). The answer must be JSON, `{"findings": [...]}` or a
//! bare list; each item is checked on its own and dropped, with the reason
//! counted, when it does not hold. An answer that is not JSON at all is asked
//! for once more, then the batch is skipped with the reason.
//!
//! After the reply, an exchange may carry `trace:` (the tool steps of the run
//! its message started, by step number, redacted like the text) and
//! `friction:` (its friction signals). A finding may cite one step of its own
//! exchange's trace as `"trace_step": N`; a citation of a step that was not
//! sent with that exchange is dropped (the finding stays) and counted. The
//! judge never sees a run id: the host adds it to a citation it validated
//! (a 32-hex run id can hold a digit run the gate would take for a phone).
//!
//! The judge only ever sees placeholders, so its answer must not contain an
//! identifier: the answer goes through the identifier gate before anything
//! in it is used, and a hit marks the batch as a leak, which blocks the
//! report (fail closed; redacting the answer instead would hide exactly the
//! leak the gate exists to catch).
//!
//! Must never: offer the judge a tool, put unredacted text in a prompt (the
//! caller hands in redacted exchanges only), or let an unvalidated item reach
//! a report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{ChatMessage, ModelError, ModelRequest, Purpose, Role};
use crate::redaction::{IdentifierGate, IdentifierKind};
use crate::review::friction::{self, Signals};
use crate::runtime::Runtime;
use crate::storage::runs;

/// Characters kept of a finding's free-text field.
pub(crate) const FIELD_CAP: usize = 600;
/// Findings kept per exchange of a batch; more is noise or a runaway answer.
pub(crate) const MAX_FINDINGS_PER_EXCHANGE: usize = 3;
/// Attempts per batch when the answer cannot be parsed.
pub(crate) const ATTEMPTS: u32 = 2;
/// The `token_usage.kind` of judge calls.
pub(crate) const USAGE_KIND: &str = "review";

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(raw: &str) -> Option<Self> {
                match raw.trim() { $($text => Some($name::$variant),)+ _ => None }
            }

            pub fn list() -> String {
                Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
        }
    };
}

string_enum!(
    /// What went wrong in the reply.
    FindingKind {
        WrongAnswer => "wrong_answer",
        UnjustifiedRefusal => "unjustified_refusal",
        IgnoredInstruction => "ignored_instruction",
        Hallucination => "hallucination",
        ToolFailure => "tool_failure",
        Tone => "tone",
        Privacy => "privacy",
        Other => "other",
    }
);

string_enum!(
    /// Whether the fix belongs to the one space or to every space.
    Scope {
        Space => "space",
        Global => "global",
    }
);

string_enum!(
    /// Where a fix would go.
    TargetLayer {
        AgentsMd => "agents_md",
        Memory => "memory",
        Preferences => "preferences",
        Character => "character",
        Model => "model",
        Tool => "tool",
        Platform => "platform",
    }
);

/// One validated finding about one exchange.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The user message id of the exchange (from its `[msg N]` line).
    pub message_id: i64,
    pub kind: FindingKind,
    pub scope: Scope,
    pub target_layer: TargetLayer,
    /// 1 (minor) to 3 (serious).
    pub severity: u8,
    pub summary: String,
    pub evidence: String,
    pub suggestion: String,
    /// The step of the exchange's trace the finding cites, validated
    /// against the steps sent with that exchange.
    pub trace_step: Option<u32>,
}

/// One tool step of a trace as the judge sees it (tool and error redacted).
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeStep {
    /// The step's number in its run.
    pub step: u32,
    pub tool: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
}

/// The trace summary of the run an exchange's message started.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeTrace {
    /// The turn's status (`done`, `failed`).
    pub status: String,
    pub steps: Vec<JudgeStep>,
    /// Tool steps left out (beyond the reader's cap).
    pub more: u32,
}

/// Per message id of a batch: the trace steps sent with it, the only ones a
/// finding about it may cite.
pub(crate) type SentSteps = BTreeMap<i64, BTreeSet<u32>>;

/// One exchange as the judge sees it: every text already redacted.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeExchange {
    pub message_id: i64,
    pub reply_id: i64,
    /// Who asked (a placeholder such as `[PERSON_1]`, or `someone`).
    pub speaker: String,
    pub text: String,
    pub reply: String,
    /// `<speaker>: <text>` lines, oldest first.
    pub context: Vec<String>,
    /// The run's trace summary, when the message started a run.
    pub trace: Option<JudgeTrace>,
    /// Its friction signals (names only: no text, nothing to redact).
    pub friction: Signals,
}

impl JudgeExchange {
    /// The steps this exchange sends (what a citation may name).
    pub(crate) fn sent_steps(&self) -> BTreeSet<u32> {
        self.trace
            .as_ref()
            .filter(|t| shows(t))
            .map(|t| t.steps.iter().map(|s| s.step).collect())
            .unwrap_or_default()
    }
}

/// Whether a trace is worth its prompt lines: it has a tool step or failed.
fn shows(t: &JudgeTrace) -> bool {
    !t.steps.is_empty() || t.status == "failed"
}

/// The steps sent with each exchange of a batch.
pub(crate) fn sent_steps(batch: &[JudgeExchange]) -> SentSteps {
    batch
        .iter()
        .map(|e| (e.message_id, e.sent_steps()))
        .collect()
}

/// The instructions of every judge call.
pub(crate) fn instructions() -> String {
    format!(
        "You review the replies of a chat assistant. Below are exchanges from one chat space. \
Each exchange starts with a line [msg N], where N is its message id, then up to a few \
`context:` lines said before it, then the user's message and the assistant's reply.\n\
Report only real problems with the assistant's reply. Answer with JSON only, no prose:\n\
{{\"findings\": [{{\"message_id\": N, \"kind\": \"...\", \"scope\": \"...\", \"target_layer\": \"...\", \
\"severity\": 1, \"summary\": \"...\", \"evidence\": \"...\", \"suggestion\": \"...\"}}]}}\n\
An empty list means every reply is fine.\n\
- kind: one of {kinds}\n\
- scope: space (a fix for this space only) or global (a fix for every space)\n\
- target_layer, where the fix belongs: one of {layers}\n\
- severity: 1 (minor), 2 (clear problem) or 3 (serious)\n\
- summary: one sentence; evidence: a short quote; suggestion: the fix.\n\
After the reply an exchange may have a `trace:` line (the status of the turn's run) and \
`step N:` lines (the tool calls of that run, with exit code and the error of a failed step), \
and a `friction:` line of signals read off the conversation: correction (the user's next \
message corrected this reply), rephrased (the user asked the same again within minutes), \
not_answered (the user said the reply did not answer), failed_turn (the turn failed), \
abandoned (the turn failed or got no reply and the user wrote no more). They are evidence, \
not proof. When a finding rests on one step of its exchange's trace, add \
\"trace_step\": N with that step's number; cite only a step listed under that exchange.\n\
Personal identifiers were replaced by placeholders such as [PERSON_1] or [PHONE_2]. Keep \
placeholders exactly as they are and never guess or write a real name, number or address.",
        kinds = FindingKind::list(),
        layers = TargetLayer::list(),
    )
}

/// Counter-examples put in the judge's instructions at most (M3.2).
pub(crate) const MAX_COUNTER_EXAMPLES: usize = 5;
/// Characters kept of one counter-example.
pub(crate) const COUNTER_EXAMPLE_CAP: usize = 200;

/// The instructions with the owner's rejected findings as counter-examples
/// (each already redacted and gated by the caller; bounded here).
pub(crate) fn instructions_with(counter_examples: &[String]) -> String {
    let mut text = instructions();
    if counter_examples.is_empty() {
        return text;
    }
    text.push_str(
        "\nThe owner reviewed these earlier findings and judged them NOT to be problems; \
do not raise findings like them:\n",
    );
    for c in counter_examples.iter().take(MAX_COUNTER_EXAMPLES) {
        let one: String = c
            .chars()
            .map(|ch| if ch.is_control() { ' ' } else { ch })
            .take(COUNTER_EXAMPLE_CAP)
            .collect();
        text.push_str(&format!("- {one}\n"));
    }
    text
}

/// The batch as one user message: each exchange opens with `[msg N]`.
pub(crate) fn render_batch(batch: &[JudgeExchange]) -> String {
    let mut out = String::new();
    for (i, e) in batch.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("[msg {}]\n", e.message_id));
        for line in &e.context {
            out.push_str(&format!("context: {line}\n"));
        }
        out.push_str(&format!("user {}: {}\n", e.speaker, e.text));
        out.push_str(&format!("assistant: {}\n", e.reply));
        if let Some(t) = e.trace.as_ref().filter(|t| shows(t)) {
            out.push_str(&format!("trace: turn {}", t.status));
            if t.steps.is_empty() {
                out.push_str(", no tool calls");
            }
            if t.more > 0 {
                out.push_str(&format!(" ({} more tool steps not shown)", t.more));
            }
            out.push('\n');
            for s in &t.steps {
                out.push_str(&format!("step {}: {}", s.step, s.tool));
                if let Some(code) = s.exit_code {
                    out.push_str(&format!(", exit {code}"));
                }
                if let Some(err) = &s.error {
                    out.push_str(&format!(", error: {err}"));
                }
                out.push('\n');
            }
        }
        if !e.friction.is_empty() {
            out.push_str(&format!("friction: {}\n", friction::list(&e.friction)));
        }
    }
    out
}

/// The judge request for a batch: instructions, the batch, no tools.
pub(crate) fn build_request(model: &str, batch: &[JudgeExchange], max_tokens: u32) -> ModelRequest {
    build_request_with(model, batch, max_tokens, &[])
}

/// [`build_request`] with counter-examples in the instructions.
pub(crate) fn build_request_with(
    model: &str,
    batch: &[JudgeExchange],
    max_tokens: u32,
    counter_examples: &[String],
) -> ModelRequest {
    ModelRequest {
        model: model.to_owned(),
        purpose: Purpose::Judge,
        messages: vec![
            ChatMessage::text(Role::System, instructions_with(counter_examples)),
            ChatMessage::text(Role::User, render_batch(batch)),
        ],
        tools: Vec::new(),
        max_tokens,
    }
}

/// What survived validation, and why the rest did not.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ParsedOutput {
    pub findings: Vec<Finding>,
    /// Reason → items dropped for it.
    pub dropped: BTreeMap<String, u32>,
    /// Trace citations dropped (their findings kept): the step was not sent
    /// with that exchange, or the citation was not a step number.
    pub dropped_citations: u32,
}

/// The answer is not JSON of the agreed shape at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unparsable(pub String);

/// Parses and validates the judge's answer against the batch's message ids
/// and the trace steps sent with each.
pub(crate) fn parse_output(text: &str, sent: &SentSteps) -> Result<ParsedOutput, Unparsable> {
    let items = match first_json_value(text)? {
        Value::Array(items) => items,
        Value::Object(mut map) => match map.remove("findings") {
            Some(Value::Array(items)) => items,
            Some(_) => return Err(Unparsable("`findings` is not a list".into())),
            None => return Err(Unparsable("the JSON object has no `findings` list".into())),
        },
        _ => {
            return Err(Unparsable(
                "the answer is neither a JSON object nor a list".into(),
            ))
        }
    };
    let mut out = ParsedOutput::default();
    let limit = sent.len().max(1) * MAX_FINDINGS_PER_EXCHANGE;
    for item in items {
        if out.findings.len() >= limit {
            *out.dropped
                .entry("more findings than the batch can hold".into())
                .or_default() += 1;
            continue;
        }
        match validate(&item, sent) {
            Ok((f, citation_dropped)) => {
                out.dropped_citations += u32::from(citation_dropped);
                out.findings.push(f);
            }
            Err(reason) => *out.dropped.entry(reason.to_owned()).or_default() += 1,
        }
    }
    Ok(out)
}

/// The first JSON value in the text, after an optional code fence or
/// preamble; anything after it is ignored.
fn first_json_value(text: &str) -> Result<Value, Unparsable> {
    let start = text
        .find(['{', '['])
        .ok_or_else(|| Unparsable("no JSON in the answer".into()))?;
    let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok(v),
        // serde's message names a line and column, never the content.
        Some(Err(e)) => Err(Unparsable(format!("not valid JSON ({e})"))),
        None => Err(Unparsable("no JSON in the answer".into())),
    }
}

/// A valid finding, and whether a citation it made was dropped.
fn validate(item: &Value, sent: &SentSteps) -> Result<(Finding, bool), &'static str> {
    let obj = item.as_object().ok_or("an item is not a JSON object")?;
    let message_id = match obj.get("message_id") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or("message_id missing or not a number")?;
    let Some(steps) = sent.get(&message_id) else {
        return Err("message_id is not in the batch");
    };
    let text = |key: &str| obj.get(key).and_then(Value::as_str).unwrap_or_default();
    let kind = FindingKind::parse(text("kind")).ok_or("unknown kind")?;
    let scope = Scope::parse(text("scope")).ok_or("unknown scope")?;
    let target_layer = TargetLayer::parse(text("target_layer")).ok_or("unknown target_layer")?;
    let severity = match obj.get("severity") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|s| (1..=3).contains(s))
    .ok_or("severity is not 1, 2 or 3")? as u8;
    let field = |key: &str, missing: &'static str| {
        let v = one_line(text(key));
        if v.is_empty() {
            Err(missing)
        } else {
            Ok(v)
        }
    };
    // A citation is checked against what was sent, never trusted: one the
    // batch did not carry is dropped, and the finding stands without it.
    let (trace_step, citation_dropped) = match obj.get("trace_step") {
        None | Some(Value::Null) => (None, false),
        Some(v) => {
            let step = match v {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            }
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| steps.contains(n));
            (step, step.is_none())
        }
    };
    Ok((
        Finding {
            message_id,
            kind,
            scope,
            target_layer,
            severity,
            summary: field("summary", "summary missing")?,
            evidence: field("evidence", "evidence missing")?,
            suggestion: field("suggestion", "suggestion missing")?,
            trace_step,
        },
        citation_dropped,
    ))
}

/// One line, bounded: a report field never spans lines or grows without end.
fn one_line(raw: &str) -> String {
    crate::review::reader::cap(
        &raw.split_whitespace().collect::<Vec<_>>().join(" "),
        FIELD_CAP,
    )
}

/// One batch of one space, handed to the judge pool.
#[derive(Debug, Clone)]
pub struct JudgeJob {
    pub run_id: String,
    /// The real space id: only for `token_usage`, never put in a prompt.
    pub space_id: String,
    pub batch: Vec<JudgeExchange>,
    /// The scan's list, compiled: the gate the judge's answer must pass.
    pub gate: Arc<IdentifierGate>,
    /// Judge model specs, tried in order.
    pub chain: Arc<Vec<String>>,
    /// The owner's rejected findings, redacted, for the instructions.
    pub counter_examples: Arc<Vec<String>>,
}

/// What became of one batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchVerdict {
    pub exchanges: usize,
    pub findings: Vec<Finding>,
    pub dropped: BTreeMap<String, u32>,
    /// Trace citations dropped by validation (their findings kept).
    pub dropped_citations: u32,
    /// Set when the batch could not be judged: why.
    pub skipped: Option<String>,
    /// Model calls made (answers and retries).
    pub calls: u32,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// Set when the judge's answer held identifiers: their kinds, never values.
    pub leak: Option<BTreeSet<IdentifierKind>>,
    /// Set when a spend cap stopped the batch's call: the cap, in words.
    /// The scan judges nothing more once a batch comes back with this.
    pub capped: Option<String>,
}

impl BatchVerdict {
    pub fn skipped(exchanges: usize, reason: impl Into<String>) -> Self {
        Self {
            exchanges,
            skipped: Some(reason.into()),
            ..Default::default()
        }
    }
}

/// Judges one batch: waits for a background permit for each call, records
/// the usage of every answer, retries an unparsable answer once.
pub(crate) async fn judge_batch(rt: &Runtime, job: &JudgeJob) -> BatchVerdict {
    let mut verdict = BatchVerdict {
        exchanges: job.batch.len(),
        ..Default::default()
    };
    let sent = sent_steps(&job.batch);
    let ids: BTreeSet<i64> = sent.keys().copied().collect();
    let mut last_problem = String::new();
    for _ in 0..ATTEMPTS {
        let permit = rt.model_gate.background().await;
        let answer = call_chain(rt, job).await;
        drop(permit);
        let (spec, resp, cost) = match answer {
            Ok(a) => a,
            Err(JudgeCallError::Capped(cap)) => {
                verdict.skipped = Some("stopped at a spend cap".into());
                verdict.capped = Some(cap);
                return verdict;
            }
            Err(JudgeCallError::Failed(reason)) => {
                verdict.skipped = Some(reason);
                return verdict;
            }
        };
        verdict.calls += 1;
        record_usage(rt, job, &spec, &resp.usage, cost, &mut verdict).await;
        let (gate, text, known) = (job.gate.clone(), resp.text.clone(), ids.clone());
        // The batch's own ids are the only numbers the answer may carry as
        // `"message_id": N`; any other long number fails the gate.
        match tokio::task::spawn_blocking(move || gate.check_with_ids(&text, &known)).await {
            Ok(Ok(())) => {}
            Ok(Err(found)) => {
                tracing::error!(run = %job.run_id, kinds = %found, "the judge's answer holds identifiers; the report will be blocked");
                verdict.leak = Some(found.kinds);
                return verdict;
            }
            // Unchecked is unusable: nothing of this answer reaches the report.
            Err(e) => {
                tracing::error!(run = %job.run_id, error = %e, "the identifier check of a judge answer failed");
                verdict.skipped =
                    Some("the judge's answer could not be checked for identifiers".into());
                return verdict;
            }
        }
        match parse_output(&resp.text, &sent) {
            Ok(parsed) => {
                verdict.findings = parsed.findings;
                verdict.dropped = parsed.dropped;
                verdict.dropped_citations = parsed.dropped_citations;
                return verdict;
            }
            Err(e) => {
                tracing::warn!(run = %job.run_id, error = %e, "the judge's answer could not be parsed");
                last_problem = e.0;
            }
        }
    }
    verdict.skipped = Some(format!(
        "the judge's answer could not be parsed, twice ({last_problem})"
    ));
    verdict
}

/// Why the judge's chain gave no answer.
enum JudgeCallError {
    /// A spend cap stopped the call (the cap and what it has spent, in words).
    Capped(String),
    /// A short sentence naming what failed.
    Failed(String),
}

/// The first model of the chain that answers, through the spend seam. The
/// error is a short sentence naming what failed, never the provider's
/// message (it could quote input).
async fn call_chain(
    rt: &Runtime,
    job: &JudgeJob,
) -> Result<(String, crate::model::ModelResponse, f64), JudgeCallError> {
    let charge = crate::spend::Charge {
        space: Some(job.space_id.clone()),
        purpose: crate::spend::SpendPurpose::Judge,
    };
    let mut failures = Vec::new();
    for spec in job.chain.iter() {
        let model = match rt.models.get(spec) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(spec = %spec, error = %e, "judge model unavailable");
                failures.push(error_class(&e));
                continue;
            }
        };
        let req = build_request_with(
            &model.model,
            &job.batch,
            rt.settings.turn.max_tokens,
            &job.counter_examples,
        );
        let started = std::time::Instant::now();
        let answer = rt.spend.call(&charge, spec, &model, &req).await;
        let answer = match answer {
            Err(crate::spend::SpendError::Capped(hit)) => {
                return Err(JudgeCallError::Capped(hit.to_string()))
            }
            Err(crate::spend::SpendError::Unpriced { .. }) => {
                failures.push("model has no price under a spend cap".into());
                continue;
            }
            Err(crate::spend::SpendError::Store(e)) => {
                tracing::warn!(spec = %spec, error = %e, "judge call not reserved");
                failures.push("the spend ledger could not be written".into());
                continue;
            }
            Err(crate::spend::SpendError::Model(e)) => Err(e),
            Ok(m) => Ok(m),
        };
        let tokens = answer.as_ref().map_or((0, 0), |m| {
            (
                m.response.usage.input_tokens,
                m.response.usage.output_tokens,
            )
        });
        rt.metrics
            .model_call(spec, answer.is_ok(), started.elapsed(), tokens);
        rt.metrics
            .judge_call(if answer.is_ok() { "ok" } else { "error" });
        match answer {
            Ok(m) => return Ok((spec.clone(), m.response, m.cost)),
            Err(e) => {
                tracing::warn!(spec = %spec, error = %e, "judge call failed");
                failures.push(error_class(&e));
            }
        }
    }
    Err(JudgeCallError::Failed(format!(
        "the judge model did not answer ({})",
        if failures.is_empty() {
            "no judge model configured".to_owned()
        } else {
            failures.join("; ")
        }
    )))
}

fn error_class(e: &ModelError) -> String {
    match e {
        ModelError::Http { status, .. } => format!("HTTP {status}"),
        ModelError::Transport(_) => "endpoint unreachable".into(),
        ModelError::Protocol(_) => "answer not understood".into(),
        ModelError::Script { .. } => "scripted model had no answer".into(),
        ModelError::RetriesExhausted { attempts, .. } => {
            format!("gave up after {attempts} attempts")
        }
        ModelError::Config(_) => "model misconfigured".into(),
    }
}

async fn record_usage(
    rt: &Runtime,
    job: &JudgeJob,
    spec: &str,
    usage: &crate::model::Usage,
    cost: f64,
    verdict: &mut BatchVerdict,
) {
    verdict.tokens_in += usage.input_tokens;
    verdict.tokens_out += usage.output_tokens;
    verdict.cost += cost;
    let (run, space, spec, usage) = (
        job.run_id.clone(),
        job.space_id.clone(),
        spec.to_owned(),
        *usage,
    );
    let res = rt
        .store
        .write(move |tx| {
            runs::record_usage(
                tx,
                &runs::UsageRow {
                    run_id: Some(&run),
                    space_id: &space,
                    model: &spec,
                    kind: USAGE_KIND,
                    tokens_in: usage.input_tokens,
                    tokens_out: usage.output_tokens,
                    cost,
                },
            )
        })
        .await;
    if let Err(e) = res {
        tracing::warn!(run = %job.run_id, error = %e, "could not record the judge's token usage");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(v: &[i64]) -> SentSteps {
        v.iter().map(|id| (*id, BTreeSet::new())).collect()
    }

    fn item(id: Value) -> Value {
        json!({"message_id": id, "kind": "wrong_answer", "scope": "space", "target_layer": "memory",
               "severity": 3, "summary": "said Lyon", "evidence": "Lyon", "suggestion": "Paris"})
    }

    #[test]
    fn review_judge_prompt_opens_each_exchange_with_its_message_id() {
        let e = |id| JudgeExchange {
            message_id: id,
            reply_id: id + 1,
            speaker: "[PERSON_1]".into(),
            text: "q".into(),
            reply: "a".into(),
            context: vec!["[PERSON_2]: hi".into()],
            trace: None,
            friction: Signals::new(),
        };
        let text = render_batch(&[e(10), e(20)]);
        assert_eq!(
            text,
            "[msg 10]\ncontext: [PERSON_2]: hi\nuser [PERSON_1]: q\nassistant: a\n\n\
             [msg 20]\ncontext: [PERSON_2]: hi\nuser [PERSON_1]: q\nassistant: a\n"
        );
        let with = instructions_with(
            &(0..9)
                .map(|i| format!("tone: curt reply {i}\nx"))
                .collect::<Vec<_>>(),
        );
        assert!(with.starts_with(&instructions()));
        assert_eq!(
            with.matches("\n- tone: curt reply").count(),
            MAX_COUNTER_EXAMPLES,
            "{with}"
        );
        assert!(
            with.contains("- tone: curt reply 0 x\n"),
            "control characters flattened"
        );
        assert_eq!(instructions_with(&[]), instructions());
        let req = build_request("m", &[e(10)], 100);
        assert_eq!(req.purpose, Purpose::Judge);
        assert!(req.tools.is_empty());
        for k in FindingKind::ALL {
            assert!(req.messages[0].content.contains(k.as_str()));
        }
        for l in TargetLayer::ALL {
            assert!(req.messages[0].content.contains(l.as_str()));
        }
    }

    #[test]
    fn review_judge_output_valid_items_survive() {
        let out = parse_output(
            &format!(
                "```json\n{}\n```\nthanks",
                json!({"findings": [item(json!(7)), item(json!("8"))]})
            ),
            &ids(&[7, 8]),
        )
        .unwrap();
        assert_eq!(out.findings.len(), 2);
        assert!(out.dropped.is_empty());
        let f = &out.findings[0];
        assert_eq!(
            (f.message_id, f.kind, f.scope, f.target_layer, f.severity),
            (
                7,
                FindingKind::WrongAnswer,
                Scope::Space,
                TargetLayer::Memory,
                3
            )
        );
        let bare = parse_output(&json!([item(json!(7))]).to_string(), &ids(&[7])).unwrap();
        assert_eq!(bare.findings.len(), 1);
        let empty = parse_output(r#"{"findings": []}"#, &ids(&[7])).unwrap();
        assert_eq!(empty, ParsedOutput::default());
    }

    #[test]
    fn review_judge_output_invalid_items_are_dropped_with_reasons() {
        let mut bad_kind = item(json!(7));
        bad_kind["kind"] = json!("rude");
        let mut bad_scope = item(json!(7));
        bad_scope["scope"] = json!("planet");
        let mut bad_layer = item(json!(7));
        bad_layer["target_layer"] = json!("vibes");
        let mut bad_sev = item(json!(7));
        bad_sev["severity"] = json!(4);
        let mut no_summary = item(json!(7));
        no_summary["summary"] = json!("  ");
        let mut no_evidence = item(json!(7));
        no_evidence.as_object_mut().unwrap().remove("evidence");
        let items = json!([
            item(json!(99)),
            item(json!(null)),
            bad_kind,
            bad_scope,
            bad_layer,
            bad_sev,
            no_summary,
            no_evidence,
            "text",
            item(json!(7))
        ]);
        let out = parse_output(&items.to_string(), &ids(&[7])).unwrap();
        assert_eq!(out.findings.len(), 1);
        let want: BTreeMap<String, u32> = [
            ("message_id is not in the batch", 1),
            ("message_id missing or not a number", 1),
            ("unknown kind", 1),
            ("unknown scope", 1),
            ("unknown target_layer", 1),
            ("severity is not 1, 2 or 3", 1),
            ("summary missing", 1),
            ("evidence missing", 1),
            ("an item is not a JSON object", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(out.dropped, want);
    }

    #[test]
    fn review_judge_output_runaway_lists_are_capped() {
        let many: Vec<Value> = (0..10).map(|_| item(json!(7))).collect();
        let out = parse_output(&Value::Array(many).to_string(), &ids(&[7])).unwrap();
        assert_eq!(out.findings.len(), MAX_FINDINGS_PER_EXCHANGE);
        assert_eq!(out.dropped.values().sum::<u32>(), 7);
    }

    #[test]
    fn review_judge_output_that_is_not_json_is_unparsable() {
        for text in [
            "all good!",
            "{\"findings\": [",
            "{\"verdict\": \"ok\"}",
            "{\"findings\": 3}",
            "42",
        ] {
            assert!(parse_output(text, &ids(&[1])).is_err(), "{text}");
        }
    }

    #[test]
    fn review_judge_prompt_carries_trace_steps_and_friction() {
        let e = JudgeExchange {
            message_id: 10,
            reply_id: 11,
            speaker: "[PERSON_1]".into(),
            text: "q".into(),
            reply: "a".into(),
            context: Vec::new(),
            trace: Some(JudgeTrace {
                status: "done".into(),
                steps: vec![
                    JudgeStep {
                        step: 2,
                        tool: "shell".into(),
                        exit_code: Some(3),
                        error: Some("exit code 3 stderr: no route to [EMAIL_1]".into()),
                    },
                    JudgeStep {
                        step: 4,
                        tool: "read_file".into(),
                        exit_code: Some(0),
                        error: None,
                    },
                ],
                more: 0,
            }),
            friction: [friction::Signal::Correction, friction::Signal::Rephrased]
                .into_iter()
                .collect(),
        };
        assert_eq!(
            render_batch(std::slice::from_ref(&e)),
            "[msg 10]\nuser [PERSON_1]: q\nassistant: a\ntrace: turn done\n\
             step 2: shell, exit 3, error: exit code 3 stderr: no route to [EMAIL_1]\n\
             step 4: read_file, exit 0\nfriction: correction, rephrased\n"
        );
        assert_eq!(sent_steps(&[e])[&10], BTreeSet::from([2, 4]));
        // A done turn with no tool call adds nothing to the prompt.
        let quiet = JudgeExchange {
            message_id: 12,
            reply_id: 13,
            speaker: "x".into(),
            text: "q".into(),
            reply: "a".into(),
            context: Vec::new(),
            trace: Some(JudgeTrace {
                status: "done".into(),
                steps: Vec::new(),
                more: 0,
            }),
            friction: Signals::new(),
        };
        assert_eq!(
            render_batch(&[quiet]),
            "[msg 12]\nuser x: q\nassistant: a\n"
        );
        assert!(instructions().contains("\"trace_step\": N"));
    }

    #[test]
    fn review_judge_citation_of_a_step_not_sent_is_dropped_not_trusted() {
        let sent: SentSteps = [(7, BTreeSet::from([2, 4])), (8, BTreeSet::new())]
            .into_iter()
            .collect();
        let cite = |id: i64, step: Value| {
            let mut i = item(json!(id));
            i["trace_step"] = step;
            i
        };
        let items = json!([
            cite(7, json!(2)),
            cite(7, json!("4")),
            cite(7, json!(3)),
            cite(8, json!(2)),
            cite(7, json!("two")),
            cite(7, Value::Null),
        ]);
        let out = parse_output(&items.to_string(), &sent).unwrap();
        let steps: Vec<Option<u32>> = out.findings.iter().map(|f| f.trace_step).collect();
        assert_eq!(
            steps,
            [Some(2), Some(4), None, None, None, None],
            "every finding stays; only the citations the batch sent survive"
        );
        assert_eq!(out.dropped_citations, 3);
        assert!(out.dropped.is_empty());
    }

    #[test]
    fn review_judge_fields_are_one_bounded_line() {
        let mut long = item(json!(7));
        long["summary"] = json!(format!("a\n\nb {}", "x".repeat(2000)));
        let out = parse_output(&json!([long]).to_string(), &ids(&[7])).unwrap();
        let s = &out.findings[0].summary;
        assert!(s.starts_with("a b x") && !s.contains('\n'));
        assert_eq!(s.chars().count(), FIELD_CAP + 1);
    }
}
