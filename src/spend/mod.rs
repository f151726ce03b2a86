//! Spend: prices, caps, and the reservation every model call passes through
//! (issue 26; the rules are written out in docs/spend.md).
//!
//! Owns the one seam between the host and a model provider: [`Spend::call`]
//! prices the call's worst case (the prompt's estimated tokens and all of
//! `max_tokens` of output), reserves it in the store against every cap that
//! covers the call, in one write (the store's single writer makes the check
//! and the reservation one step, so two calls can never both take the last of
//! a cap), calls the provider only when that succeeded, and settles the row to
//! the call's cost (or releases it when the call failed).
//!
//! Must never: call a provider without a ledger row, let a call cross a cap,
//! call an unpriced model under a cap unless `budgets.allow_unpriced`, count a
//! shadow's calls on the live budget (or the live's on a shadow's), or put a
//! space id in a metric label.

pub mod price_table;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{Datelike, NaiveDate, TimeZone};
use serde::Serialize;

use crate::config::{CapPair, Price, Settings};
use crate::model::{ModelError, ModelRequest, ModelResponse, ResolvedModel};
pub use crate::storage::spend::PendingNotice;
use crate::storage::spend::{self as ledger, NewReservation, SpaceBudget};
use crate::storage::{Store, StoreError, StoreResult, Tx};
use crate::telemetry::Metrics;

/// The kinds of model call a cap can cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpendPurpose {
    /// A live turn answering a chat message.
    Turn,
    /// A scheduled task's turn.
    Task,
    /// An `ask` turn.
    Ask,
    /// History compaction.
    Compact,
    /// The review judge.
    Judge,
    /// The review intake's verify call.
    Intake,
}

impl SpendPurpose {
    pub const ALL: [SpendPurpose; 6] = [
        SpendPurpose::Turn,
        SpendPurpose::Task,
        SpendPurpose::Ask,
        SpendPurpose::Compact,
        SpendPurpose::Judge,
        SpendPurpose::Intake,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SpendPurpose::Turn => "turn",
            SpendPurpose::Task => "task",
            SpendPurpose::Ask => "ask",
            SpendPurpose::Compact => "compact",
            SpendPurpose::Judge => "judge",
            SpendPurpose::Intake => "intake",
        }
    }

    /// The conversation's own work is charged to its space; the review's is
    /// the operator's, charged to the deployment only.
    pub fn charges_space(self) -> bool {
        !matches!(self, SpendPurpose::Judge | SpendPurpose::Intake)
    }

    fn caps(self, settings: &Settings) -> CapPair {
        let p = &settings.budgets.purposes;
        match self {
            SpendPurpose::Turn => p.turn,
            SpendPurpose::Task => p.task,
            SpendPurpose::Ask => p.ask,
            SpendPurpose::Compact => p.compact,
            SpendPurpose::Judge => p.judge,
            SpendPurpose::Intake => p.intake,
        }
    }
}

/// A call's settlement: its reservation settled at the cost, or, when none
/// was made, its row written settled.
#[derive(Clone)]
struct LedgerRow {
    reserved: Option<i64>,
    at: i64,
    instance: String,
    shadow: bool,
    space: Option<String>,
    purpose: &'static str,
    nanos: i64,
    settled: Settled,
}

impl LedgerRow {
    fn settle(&self, tx: &Tx<'_>) -> StoreResult<()> {
        let id = match self.reserved {
            Some(id) => id,
            None => ledger::reserve(
                tx,
                &NewReservation {
                    at: self.at,
                    instance: &self.instance,
                    shadow: self.shadow,
                    space_id: self.space.as_deref(),
                    purpose: self.purpose,
                    model: &self.settled.spec,
                    amount: self.nanos,
                },
            )?,
        };
        ledger::settle(
            tx,
            id,
            self.nanos,
            self.settled.tokens_in,
            self.settled.tokens_out,
        )
    }
}

/// Who a call is charged to.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The space whose conversation the call serves (the judge names the
    /// space it reads, but is not charged to it).
    pub space: Option<String>,
    pub purpose: SpendPurpose,
}

/// A settled call, as the caller's own record of it sees it.
#[derive(Debug, Clone)]
pub struct Settled {
    pub spec: String,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// In the deployment's currency.
    pub cost: f64,
}

/// The caller's row about a call (a turn's usage row), written in the same
/// transaction as the settlement: one commit, not two, on the turn's path.
pub type AlsoRecord = Arc<dyn Fn(&Tx<'_>, &Settled) -> StoreResult<()> + Send + Sync>;

/// What a caller knows about a call beyond its charge (the default: nothing).
#[derive(Clone, Default)]
pub struct CallContext {
    /// The charged space's own caps as the caller's transaction just read
    /// them (`None`: not read). When they and the config leave no cap over
    /// the call, nothing is reserved: the call's ledger row is written once
    /// it answered, settled, with the settlement.
    pub space_budget: Option<Option<SpaceBudget>>,
    /// Written with the settlement.
    pub also: Option<AlsoRecord>,
    /// Shown the answer's text while it is written (a live turn's preview
    /// on a platform that edits messages); `None`: answered whole.
    pub stream: Option<crate::model::TextSink>,
}

/// A tool call's reserved cost, until [`Spend::end_tool`].
#[derive(Debug)]
pub struct ToolReservation {
    id: i64,
    label: String,
    cost: f64,
    purpose: SpendPurpose,
}

/// An answer and what it cost.
#[derive(Debug)]
pub struct Metered {
    pub response: ModelResponse,
    /// In the deployment's currency.
    pub cost: f64,
}

/// A call a cap stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct CapHit {
    /// Which cap, in words: `the space's daily cap`.
    pub cap: String,
    pub limit: f64,
    /// Spent and reserved in the period before this call.
    pub used: f64,
    pub currency: String,
    /// Start of the cap's period (ms); the next period starts at its end.
    pub period_start: i64,
    /// Which cap: `global:daily`, `purpose:judge:monthly`, `space:ID:daily`.
    pub key: String,
    /// The owner has not been told about this cap in this period yet (the
    /// caller that can reach the owner tells them).
    pub first_in_period: bool,
}

impl std::fmt::Display for CapHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} is reached ({} spent or reserved this period); the model was not called",
            self.cap,
            format_amount(self.limit, &self.currency),
            format_amount(self.used, &self.currency)
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpendError {
    #[error("{0}")]
    Capped(CapHit),
    #[error("the model {spec} has no price and a spend cap applies, so it was not called (set prices.\"{spec}\" or budgets.allow_unpriced: true)")]
    Unpriced { spec: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("spend ledger: {0}")]
    Store(#[from] StoreError),
}

/// The one currency format: four decimals under one unit (a call's cost
/// is often a fraction of a cent), cents with thousands grouped from one up
/// (`0.0012 USD`, `12,345.68 USD`; grouped so a large amount never reads as a
/// phone number to the report gate), then the currency's label.
pub fn format_amount(amount: f64, currency: &str) -> String {
    let amount = if amount.is_finite() && amount > 0.0 {
        amount.min(1e15)
    } else {
        0.0
    };
    if amount < 1.0 {
        return format!("{amount:.4} {currency}");
    }
    let cents = (amount * 100.0).round() as u64;
    let (whole, frac) = (cents / 100, cents % 100);
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{grouped}.{frac:02} {currency}")
}

/// Billionths of the currency per unit: the ledger counts in integers so
/// sums never drift.
const NANOS: f64 = 1e9;

fn to_nanos(amount: f64) -> i64 {
    (amount * NANOS).round() as i64
}

fn from_nanos(nanos: i64) -> f64 {
    nanos as f64 / NANOS
}

/// The price of `spec`: `prices` in the config, else the built-in table
/// (USD, so only while `currency` is USD).
pub fn price_of(settings: &Settings, spec: &str) -> Option<Price> {
    if let Some(p) = settings.prices.get(spec) {
        return Some(*p);
    }
    if settings.currency != "USD" {
        return None;
    }
    price_table::BUILT_IN
        .binary_search_by(|(s, _, _)| (*s).cmp(spec))
        .ok()
        .map(|i| Price {
            input: price_table::BUILT_IN[i].1,
            output: price_table::BUILT_IN[i].2,
        })
}

/// The model specs in `specs` that have no price, each once.
pub fn unpriced(settings: &Settings, specs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in specs {
        if price_of(settings, s).is_none() && !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// The cost of `tokens_in` and `tokens_out` at `price` (per million tokens).
pub fn cost_at(price: Price, tokens_in: u64, tokens_out: u64) -> f64 {
    (tokens_in as f64 * price.input + tokens_out as f64 * price.output) / 1_000_000.0
}

/// Prompt tokens of `req`, estimated high: a byte for every three
/// characters' worth is more than any tokenizer in use gives for text.
pub fn estimate_prompt_tokens(req: &ModelRequest) -> u64 {
    let mut bytes = 0usize;
    for m in &req.messages {
        bytes += m.content.len() + 16;
        for c in &m.tool_calls {
            bytes += c.name.len() + c.arguments.to_string().len();
        }
    }
    for t in &req.tools {
        bytes += t.name.len() + t.description.len() + t.parameters.to_string().len();
    }
    (bytes as u64).div_ceil(3)
}

/// Midnight of `now`'s local day in `tz`, in ms.
pub fn day_start(now_ms: i64, tz: chrono_tz::Tz) -> i64 {
    let local = tz.timestamp_millis_opt(now_ms).earliest();
    let date = local.map_or_else(NaiveDate::default, |t| t.date_naive());
    local_midnight(date, tz)
}

/// Midnight of the first day of `now`'s local month in `tz`, in ms.
pub fn month_start(now_ms: i64, tz: chrono_tz::Tz) -> i64 {
    let local = tz.timestamp_millis_opt(now_ms).earliest();
    let date = local
        .and_then(|t| t.date_naive().with_day(1))
        .unwrap_or_default();
    local_midnight(date, tz)
}

fn local_midnight(date: NaiveDate, tz: chrono_tz::Tz) -> i64 {
    let midnight = date.and_hms_opt(0, 0, 0).unwrap_or_default();
    // A zone whose clocks skip midnight starts the day at the first instant
    // that exists; an hour later always does.
    tz.from_local_datetime(&midnight)
        .earliest()
        .or_else(|| {
            tz.from_local_datetime(&(midnight + chrono::Duration::hours(1)))
                .earliest()
        })
        .map_or(0, |t| t.timestamp_millis())
}

/// What covers one call: a limit over a period and the rows it counts.
#[derive(Debug, Clone)]
struct Cap {
    cap: String,
    /// `global:daily`, `purpose:turn:monthly`, `space:ID:daily`.
    key: String,
    limit: i64,
    since: i64,
    counts: Counts,
}

#[derive(Debug, Clone)]
enum Counts {
    All,
    Purpose(&'static str),
    Space(String),
}

fn push_pair(
    out: &mut Vec<Cap>,
    words: &str,
    key: &str,
    pair: CapPair,
    counts: &Counts,
    now: i64,
    tz: chrono_tz::Tz,
) {
    for (period, limit, since) in [
        ("daily", pair.daily, day_start(now, tz)),
        ("monthly", pair.monthly, month_start(now, tz)),
    ] {
        if limit > 0.0 {
            out.push(Cap {
                cap: format!("{words} {period} cap"),
                key: format!("{key}:{period}"),
                limit: to_nanos(limit),
                since,
                counts: counts.clone(),
            });
        }
    }
}

/// Every cap covering a call of `charge` at `now`.
fn caps_for(settings: &Settings, charge: &Charge, own: Option<&SpaceBudget>, now: i64) -> Vec<Cap> {
    let tz = settings.tz();
    let mut out = Vec::new();
    push_pair(
        &mut out,
        "the deployment's",
        "global",
        settings.budgets.global,
        &Counts::All,
        now,
        tz,
    );
    let purpose = charge.purpose.as_str();
    push_pair(
        &mut out,
        &format!("the {purpose} calls'"),
        &format!("purpose:{purpose}"),
        charge.purpose.caps(settings),
        &Counts::Purpose(purpose),
        now,
        tz,
    );
    if let (Some(space), true) = (&charge.space, charge.purpose.charges_space()) {
        let default = settings.budgets.space;
        let pair = CapPair {
            daily: own.and_then(|b| b.daily).unwrap_or(default.daily),
            monthly: own.and_then(|b| b.monthly).unwrap_or(default.monthly),
        };
        let space_tz = own
            .and_then(|b| b.timezone.as_deref())
            .and_then(|t| t.parse().ok())
            .unwrap_or(tz);
        push_pair(
            &mut out,
            "the space's",
            &format!("space:{space}"),
            pair,
            &Counts::Space(space.clone()),
            now,
            space_tz,
        );
    }
    out
}

/// What the reserving write decided.
enum Decision {
    Go(i64),
    Capped(CapHit, PendingNotice),
    Unpriced,
}

/// The spend seam and its ledger, one per host (`Runtime::spend`).
pub struct Spend {
    settings: Arc<Settings>,
    store: Store,
    /// This host's `mercury.instance`: the reservations it may release at start.
    instance: String,
    metrics: Arc<Metrics>,
    /// Added to the wall clock for the periods and the ledger's times; moved
    /// only by the `test-hooks` clock route, so a test can cross midnight.
    offset_ms: AtomicI64,
    /// The owner's notices: [`Spend::call`] sends one the first time a cap
    /// stops a call in a period (so at most one per cap per period: the
    /// channel needs no bound); the host's notice task receives them and
    /// queues each through the review digest's channel. Never closed while
    /// this struct lives; a notice sent with no receiver is only logged. The
    /// channel is only the fast path: each notice is a ledger row first
    /// ([`Spend::pending_notices`] after a stop).
    notice_tx: tokio::sync::mpsc::UnboundedSender<PendingNotice>,
    /// The receiving end, until the host takes it ([`Spend::take_notices`]).
    notice_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<PendingNotice>>>,
}

impl Spend {
    pub fn new(
        settings: Arc<Settings>,
        store: Store,
        instance: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (notice_tx, notice_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            settings,
            store,
            instance,
            metrics,
            offset_ms: AtomicI64::new(0),
            notice_tx,
            notice_rx: std::sync::Mutex::new(Some(notice_rx)),
        }
    }

    /// The owner's notices, for the one task that delivers them (`None`
    /// after the first take).
    pub fn take_notices(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<PendingNotice>> {
        self.notice_rx.lock().ok().and_then(|mut rx| rx.take())
    }

    /// The notices this instance wrote and never handed on: a host stopped
    /// between the cap and the owner's DM. Sent at start, before new ones.
    pub async fn pending_notices(&self) -> Result<Vec<PendingNotice>, StoreError> {
        let instance = self.instance.clone();
        self.store
            .read(move |conn| ledger::pending_notices(conn, &instance))
            .await
    }

    /// `notice` was handed to the owner's channel (or refused there, with
    /// its reason logged): it is never sent again.
    pub async fn notice_handled(&self, notice: &PendingNotice) -> Result<(), StoreError> {
        let (key, since, now) = (notice.key.clone(), notice.period_start, self.now_ms());
        self.store
            .write(move |tx| ledger::notice_handled(tx, &key, since, now))
            .await
    }

    /// The owner's notice of a cap that stopped a call.
    fn notice(hit: &CapHit) -> String {
        let whose = hit
            .key
            .strip_prefix("space:")
            .and_then(|k| k.rsplit_once(':'))
            .map(|(space, _)| format!(" (space {space})"))
            .unwrap_or_default();
        format!(
            "Spend cap reached{whose}: {hit}. Calls under this cap resume when its period ends \
             (mrctl budget show)."
        )
    }

    pub fn currency(&self) -> &str {
        &self.settings.currency
    }

    pub fn format(&self, amount: f64) -> String {
        format_amount(amount, &self.settings.currency)
    }

    /// The spend clock: the wall clock plus the test offset (0 in production).
    pub fn now_ms(&self) -> i64 {
        crate::clock::now_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// Moves the spend clock (`test-hooks` builds only).
    #[cfg(feature = "test-hooks")]
    pub fn advance_clock(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }

    fn shadow(&self) -> bool {
        self.settings.shadow
    }

    /// Reservations this host left open when it stopped mid-call: released,
    /// at start-up, before any call is made.
    pub async fn release_left_behind(&self) -> Result<usize, StoreError> {
        let instance = self.instance.clone();
        self.store
            .write(move |tx| ledger::release_left_by(tx, &instance))
            .await
    }

    /// THE seam: reserves, calls `model`, settles. Every model call the host
    /// makes goes through here.
    pub async fn call(
        &self,
        charge: &Charge,
        spec: &str,
        model: &ResolvedModel,
        req: &ModelRequest,
    ) -> Result<Metered, SpendError> {
        self.call_in(charge, spec, model, req, CallContext::default())
            .await
    }

    /// [`Self::call`] with what the caller knows (see [`CallContext`]). If
    /// the write of `ctx.also` fails, the settlement is written alone and
    /// the error returned: a reservation never outlives its answer.
    pub async fn call_in(
        &self,
        charge: &Charge,
        spec: &str,
        model: &ResolvedModel,
        req: &ModelRequest,
        ctx: CallContext,
    ) -> Result<Metered, SpendError> {
        let price = price_of(&self.settings, spec);
        let worst = price.map_or(0, |p| {
            to_nanos(cost_at(
                p,
                estimate_prompt_tokens(req),
                u64::from(req.max_tokens),
            ))
            .saturating_add(1)
        });
        let now = self.now_ms();
        // No cap to cross: a reservation would guard nothing.
        let uncapped = ctx
            .space_budget
            .as_ref()
            .is_some_and(|own| caps_for(&self.settings, charge, own.as_ref(), now).is_empty());
        let reserved = match uncapped {
            true => None,
            false => Some(self.reserve(charge, spec, worst, price.is_some()).await?),
        };
        let answer = match &ctx.stream {
            Some(sink) => model.provider.complete_streaming(req, sink).await,
            None => model.provider.complete(req).await,
        };
        match answer {
            Ok(response) => {
                let cost = price.map_or(0.0, |p| {
                    cost_at(p, response.usage.input_tokens, response.usage.output_tokens)
                });
                let (tin, tout) = (response.usage.input_tokens, response.usage.output_tokens);
                let settled = Settled {
                    spec: spec.to_owned(),
                    tokens_in: tin,
                    tokens_out: tout,
                    cost,
                };
                let row = LedgerRow {
                    reserved,
                    at: now,
                    instance: self.instance.clone(),
                    shadow: self.shadow(),
                    space: charge.space.clone(),
                    purpose: charge.purpose.as_str(),
                    nanos: to_nanos(cost),
                    settled,
                };
                let (alone, also) = (row.clone(), ctx.also);
                let together = self
                    .store
                    .write(move |tx| {
                        row.settle(tx)?;
                        match also {
                            Some(record) => record(tx, &row.settled),
                            None => Ok(()),
                        }
                    })
                    .await;
                if let Err(e) = together {
                    self.store.write(move |tx| alone.settle(tx)).await?;
                    return Err(SpendError::Store(e));
                }
                self.metrics.cost(charge.purpose.as_str(), spec, cost);
                Ok(Metered { response, cost })
            }
            Err(e) => {
                if let Some(id) = reserved {
                    if let Err(release) = self.store.write(move |tx| ledger::release(tx, id)).await
                    {
                        tracing::error!(error = %release, "cannot release a spend reservation; it is released at the next start");
                    }
                }
                Err(SpendError::Model(e))
            }
        }
    }

    /// Checks every cap covering `charge` against `worst` more and, when
    /// none is crossed, reserves it under `spec` (a model spec, or
    /// `tool:<name>`): the ledger row's id.
    async fn reserve(
        &self,
        charge: &Charge,
        spec: &str,
        worst: i64,
        priced: bool,
    ) -> Result<i64, SpendError> {
        let now = self.now_ms();
        let (settings, charge_w, instance, shadow) = (
            self.settings.clone(),
            charge.clone(),
            self.instance.clone(),
            self.shadow(),
        );
        let spec_w = spec.to_owned();
        let decision = self
            .store
            .write(move |tx| {
                let own = match &charge_w.space {
                    Some(space) if charge_w.purpose.charges_space() => {
                        ledger::space_caps(tx, space)?
                    }
                    _ => None,
                };
                let caps = caps_for(&settings, &charge_w, own.as_ref(), now);
                if !caps.is_empty() && !priced && !settings.budgets.allow_unpriced {
                    return Ok(Decision::Unpriced);
                }
                for cap in &caps {
                    let used = match &cap.counts {
                        Counts::All => ledger::used_since(tx, shadow, cap.since)?,
                        Counts::Purpose(p) => {
                            ledger::used_since_by_purpose(tx, shadow, p, cap.since)?
                        }
                        Counts::Space(s) => ledger::used_since_by_space(tx, shadow, s, cap.since)?,
                    };
                    if used.saturating_add(worst) > cap.limit {
                        let mut hit = CapHit {
                            key: cap.key.clone(),
                            cap: cap.cap.clone(),
                            limit: from_nanos(cap.limit),
                            used: from_nanos(used),
                            currency: settings.currency.clone(),
                            period_start: cap.since,
                            first_in_period: false,
                        };
                        let notice = PendingNotice {
                            key: format!("cap:{}", cap.key),
                            period_start: cap.since,
                            text: Self::notice(&hit),
                        };
                        hit.first_in_period = ledger::note_notice_once(
                            tx,
                            &notice.key,
                            notice.period_start,
                            now,
                            &instance,
                            &notice.text,
                        )?;
                        return Ok(Decision::Capped(hit, notice));
                    }
                }
                let id = ledger::reserve(
                    tx,
                    &NewReservation {
                        at: now,
                        instance: &instance,
                        shadow,
                        space_id: charge_w.space.as_deref(),
                        purpose: charge_w.purpose.as_str(),
                        model: &spec_w,
                        amount: worst,
                    },
                )?;
                Ok(Decision::Go(id))
            })
            .await?;
        let id = match decision {
            Decision::Go(id) => id,
            Decision::Capped(hit, notice) => {
                tracing::warn!(purpose = charge.purpose.as_str(), space = charge.space.as_deref().unwrap_or("-"), cap = %hit.cap, "a spend cap stopped a model call");
                if hit.first_in_period && self.notice_tx.send(notice).is_err() {
                    tracing::warn!(cap = %hit.cap, "no one delivers the owner's spend notice");
                }
                return Err(SpendError::Capped(hit));
            }
            Decision::Unpriced => {
                return Err(SpendError::Unpriced {
                    spec: spec.to_owned(),
                })
            }
        };
        Ok(id)
    }

    /// A tool's fixed cost (`web_fetch`'s `web.fetch_cost`) reserved
    /// through the same caps as a model call, as ledger model
    /// `tool:<name>` (a cost of 0 is priced: it is known). The caller ends
    /// it with [`Spend::end_tool`]: settled when the tool did its work,
    /// released when it did not.
    pub async fn reserve_tool(
        &self,
        charge: &Charge,
        tool: &str,
        cost: f64,
    ) -> Result<ToolReservation, SpendError> {
        let label = format!("tool:{tool}");
        let nanos = to_nanos(cost);
        let id = self.reserve(charge, &label, nanos, true).await?;
        Ok(ToolReservation {
            id,
            label,
            cost,
            purpose: charge.purpose,
        })
    }

    /// Settles (`done`) or releases a tool's reservation: what it cost.
    pub async fn end_tool(&self, r: ToolReservation, done: bool) -> Result<f64, SpendError> {
        let (id, nanos) = (r.id, to_nanos(r.cost));
        if done {
            self.store
                .write(move |tx| ledger::settle(tx, id, nanos, 0, 0))
                .await?;
            self.metrics.cost(r.purpose.as_str(), &r.label, r.cost);
            Ok(r.cost)
        } else {
            self.store.write(move |tx| ledger::release(tx, id)).await?;
            Ok(0.0)
        }
    }

    /// Whether a conversation stopped by `hit` is told so this period (once
    /// per period per conversation; false after the first).
    pub async fn first_capped_reply(&self, conversation: &str, hit: &CapHit) -> bool {
        let (key, since, now) = (
            format!("reply:{conversation}"),
            hit.period_start,
            self.now_ms(),
        );
        self.store
            .write(move |tx| ledger::note_once(tx, &key, since, now))
            .await
            .unwrap_or(false)
    }

    /// The caps in force over a space (or the deployment) and what each has
    /// left now.
    pub async fn standing(&self, space: Option<String>) -> Result<Vec<CapStanding>, StoreError> {
        let (settings, shadow, now) = (self.settings.clone(), self.shadow(), self.now_ms());
        self.store
            .read(move |conn| {
                let own = match &space {
                    Some(s) => ledger::space_caps(conn, s)?,
                    None => None,
                };
                let mut caps = Vec::new();
                let tz = settings.tz();
                push_pair(
                    &mut caps,
                    "the deployment's",
                    "global",
                    settings.budgets.global,
                    &Counts::All,
                    now,
                    tz,
                );
                for p in SpendPurpose::ALL {
                    let purpose = p.as_str();
                    push_pair(
                        &mut caps,
                        &format!("the {purpose} calls'"),
                        &format!("purpose:{purpose}"),
                        p.caps(&settings),
                        &Counts::Purpose(purpose),
                        now,
                        tz,
                    );
                }
                if let Some(space) = &space {
                    let charge = Charge {
                        space: Some(space.clone()),
                        purpose: SpendPurpose::Turn,
                    };
                    caps.extend(
                        caps_for(&settings, &charge, own.as_ref(), now)
                            .into_iter()
                            .filter(|c| matches!(c.counts, Counts::Space(_))),
                    );
                }
                let mut out = Vec::new();
                for cap in caps {
                    let used = match &cap.counts {
                        Counts::All => ledger::used_since(conn, shadow, cap.since)?,
                        Counts::Purpose(p) => {
                            ledger::used_since_by_purpose(conn, shadow, p, cap.since)?
                        }
                        Counts::Space(s) => {
                            ledger::used_since_by_space(conn, shadow, s, cap.since)?
                        }
                    };
                    out.push(CapStanding {
                        cap: cap.cap,
                        key: cap.key,
                        limit: from_nanos(cap.limit),
                        used: from_nanos(used),
                        since: crate::clock::ms_to_rfc3339(cap.since),
                    });
                }
                Ok(out)
            })
            .await
    }

    /// Spent today and this month in the deployment's time zone (settled
    /// and reserved), for `mercury status` and the start-up line.
    pub async fn totals(&self) -> Result<(f64, f64), StoreError> {
        let (shadow, now, tz) = (self.shadow(), self.now_ms(), self.settings.tz());
        self.store
            .read(move |conn| {
                Ok((
                    from_nanos(ledger::used_since(conn, shadow, day_start(now, tz))?),
                    from_nanos(ledger::used_since(conn, shadow, month_start(now, tz))?),
                ))
            })
            .await
    }

    /// Settled cost since `since` (ms), by space, local day, purpose and model.
    pub async fn report(
        &self,
        since: i64,
        space: Option<String>,
    ) -> Result<CostReport, StoreError> {
        let (shadow, tz) = (self.shadow(), self.settings.tz());
        let buckets = self
            .store
            .read(move |conn| ledger::cost_buckets(conn, shadow, since))
            .await?;
        let buckets: Vec<_> = buckets
            .into_iter()
            .filter(|b| space.is_none() || b.space_id == space)
            .collect();
        Ok(CostReport::from_buckets(
            &buckets,
            since,
            tz,
            &self.settings.currency,
        ))
    }
}

/// One cap and where it stands.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CapStanding {
    pub cap: String,
    pub key: String,
    pub limit: f64,
    pub used: f64,
    /// Start of the current period (RFC 3339).
    pub since: String,
}

/// One line of a cost breakdown.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema, PartialEq)]
pub struct CostLine {
    pub key: String,
    pub cost: f64,
    pub calls: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
}

/// `GET /api/cost`: what was spent, four ways.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CostReport {
    pub currency: String,
    /// RFC 3339.
    pub since: String,
    pub total: f64,
    pub calls: u64,
    pub by_space: Vec<CostLine>,
    /// Local days in the deployment's time zone (`YYYY-MM-DD`).
    pub by_day: Vec<CostLine>,
    pub by_purpose: Vec<CostLine>,
    pub by_model: Vec<CostLine>,
}

impl CostReport {
    fn from_buckets(
        buckets: &[ledger::CostBucket],
        since: i64,
        tz: chrono_tz::Tz,
        currency: &str,
    ) -> Self {
        use std::collections::BTreeMap;
        let mut maps: [BTreeMap<String, CostLine>; 4] = Default::default();
        let mut report = CostReport {
            currency: currency.to_owned(),
            since: crate::clock::ms_to_rfc3339(since),
            ..Default::default()
        };
        let mut total = 0i64;
        for b in buckets {
            let day = tz
                .timestamp_millis_opt(b.at)
                .earliest()
                .map(|t| t.date_naive().format("%Y-%m-%d").to_string())
                .unwrap_or_default();
            let keys = [
                b.space_id.clone().unwrap_or_else(|| "(none)".into()),
                day,
                b.purpose.clone(),
                b.model.clone(),
            ];
            for (map, key) in maps.iter_mut().zip(keys) {
                let line = map.entry(key.clone()).or_insert_with(|| CostLine {
                    key,
                    ..Default::default()
                });
                line.cost += from_nanos(b.amount);
                line.calls += b.calls.max(0) as u64;
                line.tokens_in += b.tokens_in.max(0) as u64;
                line.tokens_out += b.tokens_out.max(0) as u64;
            }
            total += b.amount;
            report.calls += b.calls.max(0) as u64;
        }
        report.total = from_nanos(total);
        let [space, day, purpose, model] = maps;
        let sorted = |m: BTreeMap<String, CostLine>| {
            let mut v: Vec<CostLine> = m.into_values().collect();
            v.sort_by(|a, b| b.cost.total_cmp(&a.cost).then(a.key.cmp(&b.key)));
            v
        };
        report.by_space = sorted(space);
        // Days read best in order.
        report.by_day = day.into_values().collect();
        report.by_purpose = sorted(purpose);
        report.by_model = sorted(model);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_is_sorted_and_priced() {
        let specs: Vec<&str> = price_table::BUILT_IN.iter().map(|r| r.0).collect();
        let mut sorted = specs.clone();
        sorted.sort();
        assert_eq!(specs, sorted, "binary search needs the table sorted");
        let s = Settings::default();
        assert!(price_of(&s, "openai:gpt-4o-mini").is_some());
        assert!(price_of(&s, "anthropic:claude-sonnet-4-5").is_some());
        assert!(price_of(&s, "openai:no-such-model").is_none());
        let eur = Settings {
            currency: "EUR".into(),
            ..Settings::default()
        };
        assert!(
            price_of(&eur, "openai:gpt-4o-mini").is_none(),
            "USD prices under EUR"
        );
    }

    #[test]
    fn the_config_overrides_the_built_in_price() {
        let mut s = Settings::default();
        s.prices.insert(
            "openai:gpt-4o-mini".into(),
            Price {
                input: 1.0,
                output: 2.0,
            },
        );
        assert_eq!(
            price_of(&s, "openai:gpt-4o-mini").map(|p| p.output),
            Some(2.0)
        );
    }

    #[test]
    fn periods_start_at_local_midnight() {
        let paris: chrono_tz::Tz = "Europe/Paris".parse().unwrap();
        // 2026-12-01T23:30:00Z is 00:30 on the 2nd in Paris.
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T23:30:00Z")
            .unwrap()
            .timestamp_millis();
        let start = day_start(now, paris);
        assert_eq!(
            crate::clock::ms_to_rfc3339(start),
            "2026-12-01T23:00:00.000Z"
        );
        assert_eq!(
            crate::clock::ms_to_rfc3339(day_start(now, chrono_tz::UTC)),
            "2026-12-01T00:00:00.000Z"
        );
        assert_eq!(
            crate::clock::ms_to_rfc3339(month_start(now, paris)),
            "2026-11-30T23:00:00.000Z"
        );
    }

    #[test]
    fn one_currency_format() {
        assert_eq!(format_amount(0.0, "USD"), "0.0000 USD");
        assert_eq!(format_amount(0.00123, "USD"), "0.0012 USD");
        assert_eq!(format_amount(0.9999, "USD"), "0.9999 USD");
        assert_eq!(format_amount(12.5, "EUR"), "12.50 EUR");
        assert_eq!(format_amount(12_345.678, "USD"), "12,345.68 USD");
        assert_eq!(format_amount(1_000_000.0, "USD"), "1,000,000.00 USD");
        assert_eq!(format_amount(f64::NAN, "USD"), "0.0000 USD");
    }
}
