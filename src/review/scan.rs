//! One scan, end to end: read the window (read-only), redact, send batches to
//! the judge pool, validate, gate, write the report, send the digest, and
//! record all of it as a `review` run.
//!
//! Each exchange goes to the judge with its run's trace summary and its
//! friction signals; the trace's tool names and errors pass the same
//! redactor as the text, and the judge's answer and the report the same gate.
//!
//! Owns the order of those steps and the fail-closed decision: a scan whose
//! judge answered with an identifier, or whose report text fails the gate,
//! writes no report; its run says "blocked by the identifier gate" and its
//! digest says so without content.
//!
//! Must never: hand the judge a text the redactor has not seen, write a
//! report the gate has not passed, block the async runtime with SQLite or
//! regex work (both run on the scan's own low-priority thread), or run more
//! judge calls at once than the model gate admits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::ms_to_rfc3339;
use crate::config::{ReviewConfig, Settings};
use crate::model::gate::{Admission, ModelGate};
use crate::redaction::{kind_list, IdentifierGate, IdentifierKind, RedactionList, Redactor};
use crate::review::digest::{self, DigestOutcome};
use crate::review::fingerprint::Fingerprint;
use crate::review::friction::Signal;
use crate::review::judge::{self, BatchVerdict, JudgeExchange, JudgeJob, JudgeStep, JudgeTrace};
use crate::review::reader::{Exchange, ExchangeReader, Window};
use crate::review::report::{
    self, Footer, FrictionSection, Report, ReportFinding, Skip, TraceCitation,
};
use crate::review::ReviewError;
use crate::runtime::Runtime;
use crate::storage::{runs, spaces::Space};

/// The `runs.space_id` of a review run: it belongs to no one space (and no
/// space id can take this form).
pub(crate) const RUN_SPACE: &str = "(review)";
/// The `runs.kind` of a review run.
pub(crate) const RUN_KIND: &str = "review";
/// Batches in flight when the gate is open (bench only): effectively all.
const OPEN_IN_FLIGHT: usize = 1024;

/// What a scan needs from the host.
#[derive(Clone)]
pub struct ScanContext {
    pub rt: Arc<Runtime>,
    /// The spaces' writers (the digest's outbox row).
    pub spaces: Arc<dyn super::SpaceWriter>,
    /// The judge pool.
    pub pool: Arc<dyn super::BatchJudge>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScanStatus {
    Done,
    Blocked,
    Failed,
    Interrupted,
}

impl ScanStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ScanStatus::Done => "done",
            ScanStatus::Blocked => "blocked",
            ScanStatus::Failed => "failed",
            ScanStatus::Interrupted => "interrupted",
        }
    }
}

/// The outcome of a scan, as `POST /api/review/run` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ScanSummary {
    pub run_id: String,
    pub status: ScanStatus,
    /// Why the scan is blocked or failed.
    pub error: Option<String>,
    pub date: String,
    pub report_path: Option<String>,
    pub report_json_path: Option<String>,
    pub findings: usize,
    pub spaces_judged: u64,
    pub exchanges_judged: u64,
    pub skipped: Vec<Skip>,
    pub dropped_findings: u64,
    pub judge_calls: u64,
    pub wall_clock_ms: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    pub digest: DigestOutcome,
}

/// A handle on a running scan: its run id, and its summary once it ends.
#[derive(Debug, Clone)]
pub struct ScanTicket {
    pub run_id: String,
    done: watch::Receiver<Option<Arc<ScanSummary>>>,
}

impl ScanTicket {
    pub fn new(run_id: String) -> (Self, watch::Sender<Option<Arc<ScanSummary>>>) {
        let (tx, rx) = watch::channel(None);
        (Self { run_id, done: rx }, tx)
    }

    /// The summary when the scan ends; `None` if it vanished without one
    /// (its task was cancelled with the host).
    pub async fn finished(mut self) -> Option<Arc<ScanSummary>> {
        let seen = self.done.wait_for(Option::is_some).await.ok()?;
        seen.clone()
    }
}

/// Who started a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanTrigger {
    Schedule,
    RunNow { caller: String },
}

impl ScanTrigger {
    fn caller(&self) -> &str {
        match self {
            ScanTrigger::Schedule => crate::ids::SYSTEM_CALLER,
            ScanTrigger::RunNow { caller } => caller,
        }
    }
}

/// The judge's model chain: `review.model`, else the default chain.
pub(crate) fn judge_chain(settings: &Settings) -> Vec<String> {
    if settings.review.model.trim().is_empty() {
        settings.model_chain()
    } else {
        vec![settings.review.model.trim().to_owned()]
    }
}

/// How long the scan waits for the pool to judge one batch: two attempts,
/// each a whole provider retry budget, behind the limiter's spacing at its
/// slowest (the quota's floor) for the batches ahead of it.
pub(crate) fn judge_call_timeout(settings: &Settings, gate: &ModelGate) -> Duration {
    let p = &settings.providers;
    let retries = u64::from(p.max_retries);
    let per_call = p.request_timeout_secs * (retries + 1) + p.retry_after_cap_secs * retries;
    let spacing = match gate.background_slots() {
        Some(slots) => {
            let every = 60u64.div_ceil(u64::from(gate.floor_per_minute().max(1)));
            every * slots as u64
        }
        None => 0,
    };
    let per_attempt = per_call + spacing + 1;
    Duration::from_secs(u64::from(judge::ATTEMPTS) * per_attempt + 60)
}

/// Runs one scan to its end and records it. Never panics, never returns an
/// error: every outcome is a summary (and a run row).
pub(crate) async fn run(
    ctx: &ScanContext,
    run_id: &str,
    trigger: &ScanTrigger,
    cancel: CancellationToken,
) -> ScanSummary {
    let started = Instant::now();
    let rt = &ctx.rt;
    let now = Utc::now();
    let date = rt.settings.review.today(now).format("%Y-%m-%d").to_string();
    let window = Window::hours_before(now.timestamp_millis(), rt.settings.review.window_hours);
    let mut summary = ScanSummary {
        run_id: run_id.to_owned(),
        status: ScanStatus::Failed,
        error: None,
        date: date.clone(),
        report_path: None,
        report_json_path: None,
        findings: 0,
        spaces_judged: 0,
        exchanges_judged: 0,
        skipped: Vec::new(),
        dropped_findings: 0,
        judge_calls: 0,
        wall_clock_ms: 0,
        tokens_in: 0,
        tokens_out: 0,
        cost: 0.0,
        digest: DigestOutcome::default(),
    };
    let (run_s, caller) = (run_id.to_owned(), trigger.caller().to_owned());
    if let Err(e) = rt
        .store
        .write(move |tx| runs::start(tx, &run_s, RUN_SPACE, RUN_KIND, Some(&caller), None))
        .await
    {
        tracing::error!(run = %run_id, error = %e, "cannot record the review run; the scan does not start");
        summary.error = Some(format!("cannot record the run: {e}"));
        return summary;
    }
    tracing::info!(run = %run_id, trigger = ?trigger, "review scan started");
    let adaptations_before = rt.model_gate.adaptations();
    let reserve_waits_before = rt.model_gate.reserve_waits();
    let worker = match ScanThread::start(rt.model_gate.admission() == Admission::Gated) {
        Ok(w) => w,
        Err(e) => {
            summary.error = Some(e.to_string());
            finish_run(rt, &summary).await;
            return summary;
        }
    };
    let judged = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        r = judge_window(ctx, &worker, run_id, window, &date) => Some(r),
    };
    let judged = match judged {
        None => {
            summary.status = ScanStatus::Interrupted;
            summary.error = Some("the scan was stopped (host shutting down)".into());
            finish_run(rt, &summary).await;
            return summary;
        }
        Some(Err(e)) => {
            tracing::error!(run = %run_id, error = %e, "review scan failed");
            summary.error = Some(e.to_string());
            summary.wall_clock_ms = started.elapsed().as_millis() as u64;
            // The reason stays in the run row and the log; the DM only says where.
            let text = format!(
                "Conversation review {date}: the scan failed and no report was written. \
                 The reason is in run {run_id}."
            );
            summary.digest = send_digest(ctx, &date, text, false).await;
            finish_run(rt, &summary).await;
            return summary;
        }
        Some(Ok(j)) => j,
    };
    let Judged {
        mut report,
        gate,
        leak,
    } = judged;
    report.footer.wall_clock_ms = started.elapsed().as_millis() as u64;
    report.sort_findings();
    fill_counts(&mut summary, &report);
    let dir = report::report_dir(&rt.paths.reviews, &date);
    // Rendering and gating are regex work: off the async runtime. The digest
    // is made here too, for the path the report is about to be written to.
    let checked = {
        let (report, gate) = (report.clone(), gate.clone());
        worker
            .run(move || {
                let markdown = report.to_markdown();
                let json = report.to_json();
                let gated = report::gate(&markdown, &json, &gate).map_err(|g| g.kinds);
                let digest = digest::report_digest(&report, &gate);
                Ok((markdown, json, gated, digest))
            })
            .await
    };
    let (markdown, json, gated, digest_text) = match checked {
        Ok(c) => c,
        Err(e) => {
            summary.error = Some(format!("the report could not be checked: {e}"));
            finish_run(rt, &summary).await;
            return summary;
        }
    };
    // Fail closed: an identifier in the judge's answers or in the text to be
    // written stops the report before anything reaches the disk.
    let blocked = if leak.is_empty() {
        gated.err()
    } else {
        Some(leak)
    };
    if let Some(kinds) = blocked {
        let names = kind_list(&kinds);
        tracing::error!(run = %run_id, kinds = %names, "review report blocked by the identifier gate");
        summary.status = ScanStatus::Blocked;
        summary.error = Some(format!("blocked by the identifier gate ({names} found)"));
        summary.digest = send_digest(
            ctx,
            &date,
            digest::blocked_digest(&date, &kinds, run_id),
            true,
        )
        .await;
        finish_run(rt, &summary).await;
        return summary;
    }
    let write = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || report::write_atomically(&dir, &markdown, &json)).await
    };
    let written = match write {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            let e = ReviewError::Write {
                path: dir.display().to_string(),
                source: e,
            };
            tracing::error!(run = %run_id, error = %e, "cannot write the review report");
            summary.error = Some(e.to_string());
            finish_run(rt, &summary).await;
            return summary;
        }
        Err(e) => {
            summary.error = Some(format!("the report writer failed: {e}"));
            finish_run(rt, &summary).await;
            return summary;
        }
    };
    summary.status = ScanStatus::Done;
    summary.report_path = Some(written.markdown.display().to_string());
    summary.report_json_path = Some(written.json.display().to_string());
    summary.digest = match digest_text {
        Ok(text) => send_digest(ctx, &date, text, false).await,
        Err(kinds) => {
            send_digest(
                ctx,
                &date,
                digest::blocked_digest(&date, &kinds, run_id),
                true,
            )
            .await
        }
    };
    finish_run(rt, &summary).await;
    // The journal's evidence that live turns went first: how often the judge
    // quota stepped down for them (live turns themselves never wait on the
    // gate), and where it stands.
    let (downs, queued) = rt.model_gate.adaptations();
    tracing::info!(
        run = %run_id,
        findings = summary.findings,
        exchanges = summary.exchanges_judged,
        judge_calls = summary.judge_calls,
        judge_quota_downs = downs - adaptations_before.0,
        live_calls_queued = queued - adaptations_before.1,
        judge_reserve_waits = rt.model_gate.reserve_waits() - reserve_waits_before,
        judge_quota_per_minute = rt.model_gate.per_minute(),
        "review scan done"
    );
    summary
}

fn fill_counts(summary: &mut ScanSummary, report: &Report) {
    let f = &report.footer;
    summary.findings = report.findings.len();
    summary.spaces_judged = f.spaces_judged;
    summary.exchanges_judged = f.exchanges_judged;
    summary.skipped = f.skipped.clone();
    summary.dropped_findings = f.dropped_findings.values().map(|n| u64::from(*n)).sum();
    summary.judge_calls = f.judge_calls;
    summary.wall_clock_ms = f.wall_clock_ms;
    summary.tokens_in = f.tokens_in;
    summary.tokens_out = f.tokens_out;
    summary.cost = f.cost;
}

/// Sends the digest to the owner's DM and keeps it as the last digest
/// (`mrctl review digest`), delivered or not.
async fn send_digest(ctx: &ScanContext, date: &str, text: String, blocked: bool) -> DigestOutcome {
    let owner = ctx.rt.settings.review.owner.clone();
    let outcome =
        digest::deliver(&ctx.rt, ctx.spaces.as_ref(), &owner, text.clone(), blocked).await;
    let latest = digest::LatestDigest {
        date: date.to_owned(),
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        text,
        sent: outcome.sent,
        platform: outcome.platform.clone(),
        conversation_id: outcome.conversation_id,
        reason: outcome.reason.clone(),
    };
    let reviews = ctx.rt.paths.reviews.clone();
    match tokio::task::spawn_blocking(move || digest::save_latest(&reviews, &latest)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cannot keep the review digest"),
        Err(e) => tracing::error!(error = %e, "the review digest writer failed"),
    }
    outcome
}

async fn finish_run(rt: &Runtime, summary: &ScanSummary) {
    let (run, status, error) = (
        summary.run_id.clone(),
        summary.status.as_str(),
        summary
            .error
            .as_deref()
            .map(crate::redaction::secrets::scrub_error),
    );
    if let Err(e) = rt
        .store
        .write(move |tx| runs::finish(tx, &run, status, error.as_deref()))
        .await
    {
        tracing::error!(run = %summary.run_id, error = %e, "cannot close the review run");
    }
}

/// Everything judged, before the gate.
struct Judged {
    report: Report,
    /// The scan's redaction list, compiled once for every check.
    gate: Arc<IdentifierGate>,
    /// Kinds of identifier the judge's answers held (empty: none).
    leak: BTreeSet<IdentifierKind>,
}

/// The ledger's feedback for this scan: rejected fingerprints, and the
/// counter-examples through the scan's redactor and gate (one that would
/// still hold an identifier is left out). A ledger that cannot be read
/// gives no feedback and is logged: the scan itself does not depend on it.
fn feedback(
    intake_dir: &std::path::Path,
    redactor: &mut Redactor,
    gate: &IdentifierGate,
) -> crate::review::ledger::Feedback {
    let ledger = match crate::review::ledger::read(intake_dir) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "the intake ledger cannot be read; no verdict feedback this scan");
            return Default::default();
        }
    };
    let mut fb = ledger.feedback(judge::MAX_COUNTER_EXAMPLES);
    fb.counter_examples = fb
        .counter_examples
        .iter()
        .map(|c| redactor.redact_identifiers(c))
        .filter(|c| gate.check(c).is_ok())
        .collect();
    fb
}

/// Spaces with traffic in the window that the config lets the review read,
/// and the ones it does not, with the reason.
pub(crate) fn choose_spaces(
    all: &[Space],
    active: &BTreeSet<String>,
    cfg: &ReviewConfig,
) -> (Vec<String>, Vec<(String, &'static str)>) {
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for s in all.iter().filter(|s| active.contains(&s.id)) {
        if !cfg.spaces_include.is_empty() && !cfg.spaces_include.contains(&s.id) {
            skipped.push((s.id.clone(), "not in review.spaces_include"));
        } else if cfg.spaces_exclude.contains(&s.id) {
            skipped.push((s.id.clone(), "in review.spaces_exclude"));
        } else if !cfg.include_clients && s.tags.iter().any(|t| t == "client") {
            skipped.push((
                s.id.clone(),
                "tagged client (review.include_clients is false)",
            ));
        } else {
            chosen.push(s.id.clone());
        }
    }
    (chosen, skipped)
}

pub(crate) fn redaction_list(
    cfg: &ReviewConfig,
    ids: crate::review::reader::WindowIdentifiers,
) -> RedactionList {
    RedactionList::of_review(
        &cfg.owner,
        cfg.owner_names.iter().cloned().chain(ids.names),
        ids.sender_ids,
    )
}

fn speaker(r: &mut Redactor, s: &Option<String>) -> String {
    match s {
        Some(s) => r.redact_identifiers(s),
        None => "someone".to_owned(),
    }
}

/// An exchange as the judge sees it: every text and speaker through the redactor.
pub(crate) fn redact_for_judge(r: &mut Redactor, e: &Exchange) -> JudgeExchange {
    let who = speaker(r, &e.speaker);
    let context = e
        .context
        .iter()
        .map(|c| {
            let head = match c.role.as_str() {
                "assistant" => "assistant".to_owned(),
                "ambient" => format!("{} (not to the bot)", speaker(r, &c.speaker)),
                _ => speaker(r, &c.speaker),
            };
            format!("{head}: {}", r.redact_identifiers(&c.text))
        })
        .collect();
    let trace = e.trace.as_ref().map(|t| JudgeTrace {
        status: t.status.clone(),
        steps: t
            .steps
            .iter()
            .map(|s| JudgeStep {
                step: s.seq,
                tool: r.redact_identifiers(&s.tool),
                exit_code: s.exit_code,
                error: s.error.as_deref().map(|x| r.redact_identifiers(x)),
            })
            .collect(),
        more: t.more,
    });
    JudgeExchange {
        message_id: e.message_id,
        reply_id: e.reply_id,
        speaker: who,
        text: r.redact_identifiers(&e.text),
        reply: r.redact_identifiers(&e.reply),
        context,
        trace,
        friction: e.friction.clone(),
    }
}

/// What the host keeps of an exchange it sent the judge, to place a finding
/// about it: never sent to the judge itself.
#[derive(Debug, Clone, Default)]
struct SentExchange {
    reply_id: i64,
    /// The run the message started.
    run_id: Option<String>,
    /// Step → (redacted tool name, exit code), the steps sent.
    steps: BTreeMap<u32, (String, Option<i64>)>,
    friction: Vec<Signal>,
}

fn sent_exchange(raw: &Exchange, sent: &JudgeExchange) -> SentExchange {
    let steps = sent.sent_steps();
    SentExchange {
        reply_id: sent.reply_id,
        run_id: raw.trace.as_ref().map(|t| t.run_id.clone()),
        steps: sent
            .trace
            .iter()
            .flat_map(|t| &t.steps)
            .filter(|s| steps.contains(&s.step))
            .map(|s| (s.step, (s.tool.clone(), s.exit_code)))
            .collect(),
        friction: sent.friction.iter().copied().collect(),
    }
}

/// What reading a window starts from, for the daily scan and the weekly
/// recall sample alike.
pub(super) struct Staged {
    pub(super) reader: ExchangeReader,
    /// Spaces with traffic in the window the config lets the review read.
    pub(super) chosen: Vec<String>,
    /// The others, with the reason; raw: each caller redacts them where its
    /// placeholder numbering wants them.
    pub(super) skipped: Vec<(String, &'static str)>,
    /// Built from the window's identifiers and the chosen spaces' members.
    pub(super) redactor: Redactor,
    /// The redactor's gate.
    pub(super) gate: IdentifierGate,
}

/// Reads the window of the host's database through `store`, chooses its
/// spaces ([`choose_spaces`]) and builds their redactor and gate.
pub(super) fn stage(
    store: &crate::storage::Store,
    window: Window,
    cfg: &ReviewConfig,
) -> Result<Staged, ReviewError> {
    let reader = ExchangeReader::new(store, window);
    let active = reader.active_spaces()?;
    let (chosen, skipped) = choose_spaces(&reader.spaces()?, &active, cfg);
    let list = redaction_list(cfg, reader.identifiers(&chosen)?);
    let redactor = Redactor::new(list)?;
    let gate = redactor.identifier_gate();
    Ok(Staged {
        reader,
        chosen,
        skipped,
        redactor,
        gate,
    })
}

/// The exchange reader and the redactor travel together between blocking tasks.
struct Stage {
    reader: ExchangeReader,
    redactor: Redactor,
}

/// Nice value of the scan thread: a scan's CPU bursts (compiling the
/// redaction list, reading a space, redacting a batch) yield to live turns.
const SCAN_NICE: i32 = 10;

type ScanJob = Box<dyn FnOnce() + Send>;

/// One thread per scan, at a low OS priority, for the scan's SQLite and
/// regex work. It ends when the scan drops it.
struct ScanThread {
    /// Jobs in; the thread runs them in order and stops when this closes.
    jobs: std::sync::mpsc::Sender<ScanJob>,
}

impl ScanThread {
    /// `low_priority` is false only when the model gate is open (the bench's
    /// "limiter and pool off" run, which measures a scan that yields nothing).
    fn start(low_priority: bool) -> Result<Self, ReviewError> {
        let (jobs, queue) = std::sync::mpsc::channel::<ScanJob>();
        std::thread::Builder::new()
            .name("mercury-review-scan".into())
            .spawn(move || {
                if low_priority {
                    lower_this_threads_priority();
                }
                while let Ok(job) = queue.recv() {
                    job();
                }
            })
            .map_err(|e| ReviewError::Join(format!("cannot start the scan thread: {e}")))?;
        Ok(Self { jobs })
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ReviewError> + Send + 'static,
    ) -> Result<T, ReviewError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gone = || ReviewError::Join("the scan thread stopped".into());
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| gone())?;
        // A job that panicked drops its sender: the scan fails, the host lives.
        rx.await.map_err(|_| gone())?
    }
}

#[cfg(target_os = "linux")]
fn lower_this_threads_priority() {
    // SAFETY: setpriority reads its three integer arguments and nothing else.
    // On Linux the nice value is per thread, and PRIO_PROCESS with who = 0
    // names the calling thread only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, SCAN_NICE) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the scan thread keeps its priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority() {}

type InFlight = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (String, BTreeMap<i64, SentExchange>, BatchVerdict)>
            + Send,
    >,
>;

async fn judge_window(
    ctx: &ScanContext,
    worker: &ScanThread,
    run_id: &str,
    window: Window,
    date: &str,
) -> Result<Judged, ReviewError> {
    let rt = &ctx.rt;
    let cfg = rt.settings.review.clone();
    let store = rt.store.clone();
    let intake_dir = crate::review::ledger::intake_dir(&rt.paths.reviews, &cfg);
    let (stage, chosen, skipped_spaces, gate, feedback) = worker
        .run(move || {
            let Staged {
                reader,
                chosen,
                skipped,
                mut redactor,
                gate,
            } = stage(&store, window, &cfg)?;
            // The feedback first, then the skipped spaces: placeholders are
            // numbered in this order.
            let feedback = feedback(&intake_dir, &mut redactor, &gate);
            let skipped: Vec<(String, &'static str)> = skipped
                .into_iter()
                .map(|(space, reason)| (redactor.redact_identifiers(&space), reason))
                .collect();
            Ok((Stage { reader, redactor }, chosen, skipped, gate, feedback))
        })
        .await?;
    let gate = Arc::new(gate);
    let counter_examples = Arc::new(feedback.counter_examples);
    let rejected = feedback.rejected;
    let mut stage = Some(stage);
    let mut footer = Footer::default();
    let mut skips: BTreeMap<(String, String), u64> = skipped_spaces
        .into_iter()
        .map(|(label, reason)| ((label, reason.to_owned()), 0))
        .collect();
    let chain = Arc::new(judge_chain(&rt.settings));
    let model_gate = &rt.model_gate;
    let max_in_flight = model_gate
        .background_slots()
        .unwrap_or(OPEN_IN_FLIGHT)
        .max(1);
    let timeout = judge_call_timeout(&rt.settings, model_gate);
    let batch_size = rt.settings.review.batch_size.max(1) as usize;
    let mut in_flight: FuturesUnordered<InFlight> = FuturesUnordered::new();
    let mut findings = Vec::new();
    let mut judged_spaces = BTreeSet::new();
    let mut leak = BTreeSet::new();
    let mut friction = FrictionSection::default();
    let mut take = |(label, ids, v): (String, BTreeMap<i64, SentExchange>, BatchVerdict),
                    footer: &mut Footer,
                    skips: &mut BTreeMap<(String, String), u64>,
                    leak: &mut BTreeSet<IdentifierKind>| {
        footer.judge_calls += u64::from(v.calls);
        footer.tokens_in += v.tokens_in;
        footer.tokens_out += v.tokens_out;
        footer.cost += v.cost;
        if let Some(cap) = v.capped {
            footer.stopped.get_or_insert(cap);
        }
        if let Some(kinds) = v.leak {
            leak.extend(kinds);
            return;
        }
        if let Some(reason) = v.skipped {
            *skips.entry((label, reason)).or_default() += v.exchanges as u64;
            return;
        }
        footer.exchanges_judged += v.exchanges as u64;
        for (reason, n) in v.dropped {
            *footer.dropped_findings.entry(reason).or_default() += n;
        }
        footer.dropped_citations += u64::from(v.dropped_citations);
        for f in v.findings {
            // Verdict feedback: the owner rejected this finding before.
            let fp = Fingerprint::new(&label, f.kind.as_str(), f.target_layer.as_str(), &f.summary);
            if rejected.iter().any(|r| r.same_finding(&fp)) {
                footer.suppressed_rejected += 1;
                continue;
            }
            let sent = ids.get(&f.message_id).cloned().unwrap_or_default();
            // The judge validated the step against the batch; the host adds
            // the run id it kept for that exchange.
            let trace = f.trace_step.and_then(|step| {
                let (tool, exit_code) = sent.steps.get(&step)?.clone();
                Some(TraceCitation {
                    run_id: sent.run_id.clone()?,
                    step,
                    tool,
                    exit_code,
                })
            });
            findings.push(ReportFinding {
                space: label.clone(),
                message_id: f.message_id,
                reply_id: sent.reply_id,
                kind: f.kind,
                scope: f.scope,
                target_layer: f.target_layer,
                severity: f.severity,
                summary: f.summary,
                evidence: f.evidence,
                suggestion: f.suggestion,
                trace,
                friction: sent.friction,
            });
        }
        judged_spaces.insert(label);
    };
    'spaces: for space in chosen {
        let Some(mut s) = stage.take() else { break };
        let space_id = space.clone();
        let (back, window, label) = worker
            .run(move || {
                let window = s.reader.read_space(&space)?;
                let label = s.redactor.redact_identifiers(&space);
                Ok((s, window, label))
            })
            .await?;
        stage = Some(back);
        // Counted from the conversation itself, judged or not.
        for (message_id, signals) in &window.friction {
            friction.add(&label, *message_id, signals);
        }
        if window.unanswered > 0 {
            *skips
                .entry((label.clone(), "user messages with no reply".to_owned()))
                .or_default() += u64::from(window.unanswered);
        }
        let mut exchanges = window.exchanges.into_iter();
        loop {
            let chunk: Vec<Exchange> = exchanges.by_ref().take(batch_size).collect();
            if chunk.is_empty() {
                break;
            }
            while in_flight.len() >= max_in_flight {
                if let Some(done) = in_flight.next().await {
                    take(done, &mut footer, &mut skips, &mut leak);
                }
            }
            if !leak.is_empty() {
                // Blocked already: judging more would only spend tokens.
                break 'spaces;
            }
            if footer.stopped.is_some() {
                // A cap stopped a call: every later call would be stopped too.
                *skips
                    .entry((label.clone(), "stopped at a spend cap".to_owned()))
                    .or_default() += chunk.len() as u64;
                break 'spaces;
            }
            // Redacted batch by batch, as the pool takes them, so the CPU work
            // of a scan is spread at the limiter's pace instead of bunched up.
            let Some(mut s) = stage.take() else {
                break 'spaces;
            };
            let (back, batch, ids) = worker
                .run(move || {
                    let batch: Vec<JudgeExchange> = chunk
                        .iter()
                        .map(|e| redact_for_judge(&mut s.redactor, e))
                        .collect();
                    let ids: BTreeMap<i64, SentExchange> = chunk
                        .iter()
                        .zip(&batch)
                        .map(|(raw, sent)| (sent.message_id, sent_exchange(raw, sent)))
                        .collect();
                    Ok((s, batch, ids))
                })
                .await?;
            stage = Some(back);
            let job = JudgeJob {
                run_id: run_id.to_owned(),
                space_id: space_id.clone(),
                batch,
                gate: gate.clone(),
                chain: chain.clone(),
                counter_examples: counter_examples.clone(),
            };
            let (pool, label) = (ctx.pool.clone(), label.clone());
            in_flight.push(Box::pin(async move {
                let v = pool.judge(job, timeout).await;
                (label, ids, v)
            }));
        }
    }
    while let Some(done) = in_flight.next().await {
        take(done, &mut footer, &mut skips, &mut leak);
    }
    footer.spaces_judged = judged_spaces.len() as u64;
    footer.currency = rt.settings.currency.clone();
    footer.skipped = skips
        .into_iter()
        .map(|((what, reason), count)| Skip {
            what,
            reason,
            count,
        })
        .collect();
    let hours = rt.settings.review.window_hours;
    Ok(Judged {
        report: Report {
            date: date.to_owned(),
            kind: "daily",
            window_since: ms_to_rfc3339(window.since_ms),
            window_until: ms_to_rfc3339(window.until_ms),
            window_hours: hours,
            findings,
            friction,
            footer,
        },
        gate,
        leak,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(id: &str, tags: &[&str]) -> Space {
        Space {
            id: id.into(),
            name: id.into(),
            tags: tags.iter().map(std::string::ToString::to_string).collect(),
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn review_space_choice_follows_include_exclude_and_client_gate() {
        let all = vec![
            space("a", &[]),
            space("b", &[]),
            space("c", &["client"]),
            space("idle", &[]),
        ];
        let active: BTreeSet<String> = ["a", "b", "c"]
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        let mut cfg = ReviewConfig::default();
        let (chosen, skipped) = choose_spaces(&all, &active, &cfg);
        assert_eq!(chosen, vec!["a", "b"]);
        assert_eq!(
            skipped,
            vec![(
                "c".to_owned(),
                "tagged client (review.include_clients is false)"
            )]
        );
        cfg.include_clients = true;
        cfg.spaces_exclude = vec!["b".into()];
        let (chosen, skipped) = choose_spaces(&all, &active, &cfg);
        assert_eq!(chosen, vec!["a", "c"]);
        assert_eq!(skipped, vec![("b".to_owned(), "in review.spaces_exclude")]);
        cfg.spaces_include = vec!["c".into()];
        let (chosen, _) = choose_spaces(&all, &active, &cfg);
        assert_eq!(chosen, vec!["c"]);
    }

    #[test]
    fn review_judge_timeout_covers_the_whole_retry_budget() {
        let s = Settings::default();
        let t = judge_call_timeout(&s, &ModelGate::new(1, 30));
        let p = &s.providers;
        assert!(
            t >= Duration::from_secs(2 * p.request_timeout_secs * (u64::from(p.max_retries) + 1))
        );
    }

    #[test]
    fn review_list_leaves_out_ids_too_short_to_identify_anyone() {
        let ids = crate::review::reader::WindowIdentifiers {
            sender_ids: ["a", "wa:31612345678@s.whatsapp.net"]
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            names: ["Anna de Vries".to_owned()].into_iter().collect(),
        };
        let cfg = ReviewConfig {
            owner: "31600000001@s.whatsapp.net".into(),
            owner_names: vec!["Olivia Bakker".into()],
            ..Default::default()
        };
        let list = redaction_list(&cfg, ids);
        assert_eq!(list.sender_ids().len(), 2);
        assert_eq!(list.names().len(), 2);
    }
}
