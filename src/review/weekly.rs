//! The weekly synthesis (M3.1, M3.2): `POST /api/review/weekly`
//! (`mrctl review weekly-now`) writes `<reviews>/<date>-weekly/report.md`
//! and `report.json`, gated like the daily.
//!
//! - **Clusters**: the last seven days of findings (this host's daily
//!   reports, and the other bots' reports the intake took in) grouped by
//!   kind, target layer and summary similarity (the fingerprint's MinHash,
//!   [`SAME_FINDING`](super::fingerprint::SAME_FINDING)); a cluster that
//!   spans two or more spaces is promoted from `space` to `global` scope.
//! - **Recall spot check**: up to `review.recall_sample` exchanges of the
//!   seven days that the daily judge did not flag, sampled (seeded by the
//!   date, so a rerun samples the same), redacted and re-judged with
//!   `review.weekly_model`; the share it flags estimates the daily judge's
//!   misses, with a Wilson interval ([`stats`]).
//! - **Verdicts**: precision and Cohen's κ from the intake ledger, with the
//!   confusion matrix and n, or "not enough verdicts" below
//!   [`stats::MIN_VERDICTS`].
//! - **Friction**: the friction signals of the week, per space and per
//!   signal, summed from this host's daily reports of the seven days (each
//!   daily counted them over its own window, from the conversation itself),
//!   and each space's signals per week over the last eight weeks.
//! - **Trends**: the findings of the last eight weeks (every bot's) are
//!   clustered the same way; each cluster of this week carries its count per
//!   week ([`trend`]), and a cluster seen in earlier weeks but not this one
//!   is listed as quiet (a fix that worked, or a problem gone unjudged).
//! - The cost of the weekly judge calls.
//!
//! Must never: write a report the gate has not passed, put unredacted text
//! in a prompt, or run a judge call outside the model gate's background
//! permits (live turns go first, as for the daily).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use serde_json::Value;

use crate::redaction::IdentifierGate;
use crate::review::catalog::{self, ReportKind, ReportName};
use crate::review::fingerprint::{Fingerprint, SAME_FINDING};
use crate::review::friction::{self, Signal};
use crate::review::intake::{self, Decision, IntakeFinding};
use crate::review::judge::{self, JudgeExchange, JudgeJob};
use crate::review::reader::{Exchange, Window};
use crate::review::report::{self, Skip};
use crate::review::stats::{self, Confusion, Precision, Recall};
use crate::review::trend;
use crate::review::{ledger, scan, ReviewError};
use crate::runtime::Runtime;

/// Days a weekly report covers.
pub(crate) const DAYS: i64 = 7;
/// The bot name of this host's own findings.
pub(crate) const LOCAL_BOT: &str = "local";

/// One member of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Member {
    pub bot: String,
    pub date: String,
    pub space: String,
    pub message_id: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Cluster {
    pub kind: String,
    pub target_layer: String,
    /// `global` when promoted, else the members' scope.
    pub scope: String,
    /// Spanned two or more spaces, so promoted from `space` to `global`.
    pub promoted: bool,
    pub spaces: Vec<String>,
    pub bots: Vec<String>,
    pub findings: u64,
    /// The first member's summary.
    pub summary: String,
    pub members: Vec<Member>,
    /// Findings of the cluster per week over the last eight weeks, oldest
    /// first (every member of those weeks, not only this week's).
    pub weeks: Vec<u64>,
    /// The newest member's date.
    pub last_seen: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Verdicts {
    pub n: u64,
    pub min: u64,
    pub enough: bool,
    pub precision: Precision,
    pub confusion: Confusion,
    pub kappa: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct WeeklyFooter {
    pub findings_considered: u64,
    pub judge_calls: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    pub wall_clock_ms: u64,
    pub skipped: Vec<Skip>,
    /// The deployment's currency, for the markdown's cost line.
    #[serde(skip)]
    pub currency: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct WeeklyReport {
    pub date: String,
    pub kind: &'static str,
    /// First and last day covered (`YYYY-MM-DD`).
    pub since_date: String,
    pub until_date: String,
    pub clusters: Vec<Cluster>,
    pub recall: Recall,
    pub verdicts: Verdicts,
    /// Friction signals of the seven days, per (redacted) space and signal.
    pub friction: friction::Counts,
    /// The last day of each week of the trends, oldest first.
    pub trend_weeks: Vec<String>,
    /// Clusters of the earlier weeks with no finding this week.
    pub quiet: Vec<Cluster>,
    /// Every friction signal per week, oldest first, per (redacted) space.
    pub friction_weeks: BTreeMap<String, Vec<u64>>,
    pub footer: WeeklyFooter,
}

/// What `POST /api/review/weekly` answers.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct WeeklySummary {
    pub date: String,
    pub report_path: String,
    pub report_json_path: String,
    pub clusters: usize,
    pub promoted: usize,
    pub recall: Recall,
    pub verdicts: Verdicts,
    pub cost: f64,
    /// The currency of `cost`.
    pub currency: String,
}

/// Groups findings: each joins the first group of its kind and layer whose
/// first member's summary is alike, else starts one. Spaces and bots do not
/// split a group: that is what makes the clustering cross-bot.
fn group(findings: &[IntakeFinding]) -> Vec<Vec<&IntakeFinding>> {
    let mut out: Vec<(Fingerprint, Vec<&IntakeFinding>)> = Vec::new();
    for f in findings {
        let fp = f.fingerprint();
        let found = out.iter_mut().find(|(head, members)| {
            members[0].kind == f.kind
                && members[0].target_layer == f.target_layer
                && head.summary_similarity(&fp) >= SAME_FINDING
        });
        match found {
            Some((_, members)) => members.push(f),
            None => out.push((fp, vec![f])),
        }
    }
    out.into_iter().map(|(_, members)| members).collect()
}

/// One group as a cluster (`members` is never empty); `weeks` is left for
/// the caller.
fn summarise(members: &[&IntakeFinding]) -> Cluster {
    let spaces: BTreeSet<String> = members.iter().map(|f| f.space.clone()).collect();
    let bots: BTreeSet<String> = members.iter().map(|f| f.bot.clone()).collect();
    let promoted = spaces.len() >= 2;
    let global = members.iter().any(|f| f.scope.as_str() == "global");
    let first = members[0];
    Cluster {
        kind: first.kind.as_str().to_owned(),
        target_layer: first.target_layer.as_str().to_owned(),
        scope: if promoted || global {
            "global"
        } else {
            "space"
        }
        .into(),
        promoted,
        spaces: spaces.into_iter().collect(),
        bots: bots.into_iter().collect(),
        findings: members.len() as u64,
        summary: first.summary.clone(),
        members: members
            .iter()
            .map(|f| Member {
                bot: f.bot.clone(),
                date: f.date.clone(),
                space: f.space.clone(),
                message_id: f.message_id,
            })
            .collect(),
        weeks: Vec::new(),
        last_seen: members
            .iter()
            .map(|f| f.date.as_str())
            .max()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// Widest spread first, then the most findings.
fn sort_clusters(clusters: &mut [Cluster]) {
    clusters.sort_by(|a, b| {
        b.spaces
            .len()
            .cmp(&a.spaces.len())
            .then(b.findings.cmp(&a.findings))
    });
}

/// The findings of the last eight weeks clustered across bots (see
/// [`group`]; a cluster spanning two or more spaces is promoted to `global`
/// scope): this week's
/// clusters (their members, spaces and scope from this week alone), then
/// the quiet ones (seen in an earlier week only). Each carries its count
/// per week, oldest first.
pub(crate) fn clusters_with_trends(
    findings: &[IntakeFinding],
    today: chrono::NaiveDate,
) -> (Vec<Cluster>, Vec<Cluster>) {
    let (mut current, mut quiet) = (Vec::new(), Vec::new());
    for members in group(findings) {
        let members: Vec<&IntakeFinding> = members
            .into_iter()
            .filter(|f| trend::week_of(today, &f.date).is_some())
            .collect();
        if members.is_empty() {
            continue;
        }
        let weeks = trend::per_week(today, members.iter().map(|f| f.date.as_str()));
        let this_week: Vec<&IntakeFinding> = members
            .iter()
            .copied()
            .filter(|f| trend::week_of(today, &f.date) == Some(0))
            .collect();
        let (mut c, into) = if this_week.is_empty() {
            (summarise(&members), &mut quiet)
        } else {
            (summarise(&this_week), &mut current)
        };
        c.weeks = weeks;
        into.push(c);
    }
    sort_clusters(&mut current);
    quiet.sort_by(|a, b| {
        b.last_seen
            .cmp(&a.last_seen)
            .then(b.findings.cmp(&a.findings))
    });
    (current, quiet)
}

/// Precision and κ from the ledger's rows with an owner verdict: the judge
/// said "real" unless the intake proposed `reject`; the owner said "real"
/// unless they approved `reject`.
pub(crate) fn verdicts(l: &ledger::Ledger) -> Verdicts {
    let mut c = Confusion::default();
    for r in &l.rows {
        let Some(owner) = r.approved else { continue };
        let judge_real = r.proposed != Decision::Reject;
        let owner_real = owner != Decision::Reject;
        match (judge_real, owner_real) {
            (true, true) => c.both_real += 1,
            (true, false) => c.judge_only += 1,
            (false, true) => c.owner_only += 1,
            (false, false) => c.both_fine += 1,
        }
    }
    let n = c.n();
    let real = c.both_real + c.owner_only;
    Verdicts {
        n,
        min: stats::MIN_VERDICTS,
        enough: n >= stats::MIN_VERDICTS,
        precision: stats::precision(real, n),
        kappa: c.kappa(),
        confusion: c,
    }
}

fn ratio(v: f64) -> String {
    format!("{v:.2}")
}

impl WeeklyReport {
    pub(crate) fn to_markdown(&self) -> String {
        let mut md = format!("# Conversation review, {} (weekly)\n\n", self.date);
        // Dates end their line: a number right after one would read as
        // one long digit run to the gate.
        md.push_str(&format!(
            "Seven days, from {} to {}.\n\n",
            self.since_date, self.until_date
        ));
        if let Some(first) = self.trend_weeks.first() {
            // Each week ends on the day named; the counts below are oldest first.
            md.push_str(&format!(
                "Trends count eight weeks, the first ending on {first}\n\n"
            ));
        }
        md.push_str(&format!("## Clusters ({})\n\n", self.clusters.len()));
        if self.clusters.is_empty() {
            md.push_str("No findings in these days.\n\n");
        }
        for (i, c) in self.clusters.iter().enumerate() {
            md.push_str(&format!(
                "### {}. {} / {} ({} finding{})\n\n",
                i + 1,
                c.kind,
                c.target_layer,
                report::count(c.findings),
                if c.findings == 1 { "" } else { "s" }
            ));
            md.push_str(&format!(
                "- scope: {}{}\n",
                c.scope,
                if c.promoted {
                    " (promoted from space: it spans two or more spaces)"
                } else {
                    ""
                }
            ));
            md.push_str(&format!("- spaces: {}\n", c.spaces.join(", ")));
            md.push_str(&format!("- bots: {}\n", c.bots.join(", ")));
            md.push_str(&format!("- summary: {}\n", c.summary.replace('\n', " ")));
            let seen: Vec<String> = c
                .members
                .iter()
                .map(|m| {
                    format!(
                        "[msg {}] in {} ({}, {})",
                        m.message_id, m.space, m.bot, m.date
                    )
                })
                .collect();
            md.push_str(&format!("- seen: {}\n", seen.join("; ")));
            md.push_str(&format!(
                "- per week, oldest first: {}\n\n",
                trend::line(&c.weeks)
            ));
        }
        if !self.quiet.is_empty() {
            md.push_str(&format!(
                "## Quiet this week ({})\n\nSeen in an earlier week, not in this one.\n\n",
                self.quiet.len()
            ));
            for c in &self.quiet {
                md.push_str(&format!(
                    "- {} / {}: {}; spaces: {}; bots: {}; per week, oldest first: {}; last seen {}\n",
                    c.kind,
                    c.target_layer,
                    c.summary.replace('\n', " "),
                    c.spaces.join(", "),
                    c.bots.join(", "),
                    trend::line(&c.weeks),
                    c.last_seen
                ));
            }
            md.push('\n');
        }
        md.push_str("## Friction signals (this week, per space)\n\n");
        if self.friction.is_empty() {
            md.push_str("None in these days.\n\n");
        } else {
            for (space, counts) in &self.friction {
                md.push_str(&format!(
                    "- {space}: {}\n",
                    report::friction_counts_line(counts)
                ));
            }
            md.push('\n');
        }
        if !self.friction_weeks.is_empty() {
            md.push_str("## Friction signals per week (eight weeks, oldest first)\n\n");
            for (space, weeks) in &self.friction_weeks {
                md.push_str(&format!("- {space}: {}\n", trend::line(weeks)));
            }
            md.push('\n');
        }
        let r = &self.recall;
        md.push_str("## Recall spot check\n\n");
        md.push_str(&format!(
            "- exchanges flagged by the daily judge: {}\n- not flagged: {}\n- sampled and re-judged: {}\n- flagged by the weekly judge in the sample (missed by the daily): {}\n",
            report::count(r.flagged),
            report::count(r.unflagged),
            report::count(r.sampled),
            report::count(r.missed_in_sample)
        ));
        match (r.estimate, r.interval) {
            (Some(e), Some((lo, hi))) => md.push_str(&format!(
                "- recall: {} (95 % Wilson interval {} to {})\n\n",
                ratio(e),
                ratio(lo),
                ratio(hi)
            )),
            (Some(e), None) => md.push_str(&format!("- recall: {}\n\n", ratio(e))),
            _ => md.push_str("- recall: not measurable (nothing flagged and nothing missed, or nothing to sample)\n\n"),
        }
        let v = &self.verdicts;
        md.push_str("## Verdicts (intake ledger)\n\n");
        if v.enough {
            md.push_str(&format!(
                "- precision: {} ({} of {} judged findings approved as real)\n",
                v.precision.value.map_or("-".into(), ratio),
                report::count(v.precision.real),
                report::count(v.precision.judged)
            ));
            md.push_str(&format!(
                "- Cohen's kappa (judge vs approver): {}, n = {}\n",
                v.kappa.map_or("undefined (one class only)".into(), ratio),
                report::count(v.n)
            ));
        } else {
            md.push_str(&format!(
                "- not enough verdicts: {} of the {} needed for precision and kappa\n",
                report::count(v.n),
                v.min
            ));
        }
        let c = &v.confusion;
        md.push_str("\n| | approved as real | approved as fine |\n|---|---|---|\n");
        md.push_str(&format!(
            "| judge: real | {} | {} |\n| judge: fine | {} | {} |\n\n",
            c.both_real, c.judge_only, c.owner_only, c.both_fine
        ));
        let f = &self.footer;
        md.push_str("## Footer\n\n");
        md.push_str(&format!(
            "- findings considered: {}\n",
            report::count(f.findings_considered)
        ));
        if f.skipped.is_empty() {
            md.push_str("- skipped: none\n");
        } else {
            md.push_str("- skipped:\n");
            for s in &f.skipped {
                md.push_str(&format!(
                    "  - {}: {} ({})\n",
                    s.what,
                    s.reason,
                    report::count(s.count)
                ));
            }
        }
        md.push_str(&format!(
            "- weekly judge calls: {}\n",
            report::count(f.judge_calls)
        ));
        md.push_str(&format!(
            "- tokens: {} in, {} out\n",
            report::count(f.tokens_in),
            report::count(f.tokens_out)
        ));
        md.push_str(&format!(
            "- wall clock: {}\n",
            report::seconds(f.wall_clock_ms)
        ));
        md.push_str(&format!(
            "- cost: {}\n",
            crate::spend::format_amount(f.cost, &f.currency)
        ));
        md
    }

    fn ids(&self) -> BTreeSet<i64> {
        self.clusters
            .iter()
            .chain(&self.quiet)
            .flat_map(|c| c.members.iter().map(|m| m.message_id))
            .collect()
    }
}

/// The friction counts of a daily report's JSON (`friction.counts`), added
/// to `into`; a count or signal it does not know is left out.
pub(crate) fn add_friction(into: &mut friction::Counts, json: &Value) {
    let Some(spaces) = json["friction"]["counts"].as_object() else {
        return;
    };
    for (space, counts) in spaces {
        let Some(counts) = counts.as_object() else {
            continue;
        };
        for (signal, n) in counts {
            if let (Some(signal), Some(n)) = (Signal::parse(signal), n.as_u64()) {
                *into
                    .entry(space.clone())
                    .or_default()
                    .entry(signal)
                    .or_default() += n;
            }
        }
    }
}

/// The findings of this host's daily reports in `dates`, and each
/// report's friction counts by its date.
fn local_findings(
    reviews: &std::path::Path,
    dates: &BTreeSet<String>,
) -> (Vec<IntakeFinding>, Vec<(String, friction::Counts)>) {
    let mut out = Vec::new();
    let mut by_day = Vec::new();
    for e in catalog::list(reviews).unwrap_or_default() {
        if e.kind != ReportKind::Daily || !dates.contains(&e.date) {
            continue;
        }
        let name = ReportName {
            date: e.date.clone(),
            kind: ReportKind::Daily,
        };
        if let Ok(json) = catalog::read(reviews, &name) {
            out.extend(intake::findings_of(LOCAL_BOT, &e.date, &json).0);
            let mut counts = friction::Counts::new();
            add_friction(&mut counts, &json);
            by_day.push((e.date.clone(), counts));
        }
    }
    (out, by_day)
}

/// This week's friction per space and signal, and every space's signals
/// per week over the trend's weeks.
fn friction_of(
    by_day: &[(String, friction::Counts)],
    today: chrono::NaiveDate,
) -> (friction::Counts, BTreeMap<String, Vec<u64>>) {
    let mut week = friction::Counts::new();
    let mut weeks: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (date, counts) in by_day {
        let Some(w) = trend::week_of(today, date) else {
            continue;
        };
        for (space, signals) in counts {
            let slot = &mut weeks
                .entry(space.clone())
                .or_insert_with(|| vec![0; trend::WEEKS])[trend::WEEKS - 1 - w];
            *slot += signals.values().sum::<u64>();
            if w == 0 {
                let into = week.entry(space.clone()).or_default();
                for (signal, n) in signals {
                    *into.entry(*signal).or_default() += n;
                }
            }
        }
    }
    (week, weeks)
}

/// The exchanges of the window the daily judge did not flag, and how many
/// it did, with the redaction of the sample.
struct Sample {
    flagged: u64,
    unflagged: u64,
    batch: Vec<JudgeExchange>,
    gate: IdentifierGate,
    skipped: Vec<Skip>,
}

fn sample(
    rt: &Runtime,
    window: Window,
    flagged_ids: &BTreeSet<i64>,
    size: usize,
    seed: u64,
) -> Result<Sample, ReviewError> {
    let scan::Staged {
        reader,
        chosen,
        skipped,
        mut redactor,
        gate,
    } = scan::stage(&rt.store, window, &rt.settings.review)?;
    let mut flagged = 0u64;
    let mut pool: Vec<Exchange> = Vec::new();
    for space in &chosen {
        for e in reader.read_space(space)?.exchanges {
            if flagged_ids.contains(&e.message_id) {
                flagged += 1;
            } else {
                pool.push(e);
            }
        }
    }
    let unflagged = pool.len() as u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    pool.shuffle(&mut rng);
    pool.truncate(size);
    let batch = pool
        .iter()
        .map(|e| scan::redact_for_judge(&mut redactor, e))
        .collect();
    let skipped = skipped
        .into_iter()
        .map(|(space, reason)| Skip {
            what: redactor.redact_identifiers(&space),
            reason: reason.to_owned(),
            count: 0,
        })
        .collect();
    Ok(Sample {
        flagged,
        unflagged,
        batch,
        gate,
        skipped,
    })
}

/// The weekly judge's chain: `review.weekly_model`, else the daily judge's.
pub(crate) fn weekly_chain(settings: &crate::config::Settings) -> Vec<String> {
    let m = settings.review.weekly_model.trim();
    if m.is_empty() {
        scan::judge_chain(settings)
    } else {
        vec![m.to_owned()]
    }
}

/// Runs the weekly synthesis for the week ending today (in
/// `review.timezone`) and writes its report.
pub(crate) async fn run(rt: Arc<Runtime>) -> Result<WeeklySummary, ReviewError> {
    let started = Instant::now();
    let now = chrono::Utc::now();
    let today = rt.settings.review.today(now);
    let dates: BTreeSet<String> = (0..DAYS)
        .map(|i| {
            (today - chrono::Duration::days(i))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect();
    let date = today.format("%Y-%m-%d").to_string();
    let since_date = dates.iter().next().cloned().unwrap_or_default();
    // Findings and friction of the trend's eight weeks; the week's own
    // figures are the last of them.
    let trend_dates = trend::dates(today);
    let reviews = rt.paths.reviews.clone();
    let intake_dir = ledger::intake_dir(&reviews, &rt.settings.review);

    // Findings: this host's, then the other bots' the intake took in
    // (leaving out this host's own reports if the intake took them in too).
    let (mut findings, ledger, friction_by_day) = {
        let (reviews, intake_dir, dates) =
            (reviews.clone(), intake_dir.clone(), trend_dates.clone());
        tokio::task::spawn_blocking(move || {
            let (local, friction) = local_findings(&reviews, &dates);
            let mine: BTreeSet<(String, i64, String)> = local
                .iter()
                .map(|f| (f.date.clone(), f.message_id, f.summary.clone()))
                .collect();
            let others: Vec<IntakeFinding> = intake::stored_findings(&intake_dir, &dates)
                .unwrap_or_default()
                .into_iter()
                .filter(|f| !mine.contains(&(f.date.clone(), f.message_id, f.summary.clone())))
                .collect();
            let ledger = ledger::read(&intake_dir).unwrap_or_default();
            let mut all = local;
            all.extend(others);
            (all, ledger, friction)
        })
        .await
        .map_err(|e| ReviewError::Join(e.to_string()))?
    };
    findings.sort_by(|a, b| {
        (a.date.as_str(), a.bot.as_str(), a.message_id).cmp(&(
            b.date.as_str(),
            b.bot.as_str(),
            b.message_id,
        ))
    });
    let (clusters, quiet) = clusters_with_trends(&findings, today);
    let (friction, friction_weeks) = friction_of(&friction_by_day, today);
    // The rest of the report is about this week alone.
    findings.retain(|f| dates.contains(&f.date));

    // Recall spot check over this host's exchanges of the same days.
    let flagged_ids: BTreeSet<i64> = findings
        .iter()
        .filter(|f| f.bot == LOCAL_BOT)
        .map(|f| f.message_id)
        .collect();
    let window = Window::hours_before(now.timestamp_millis(), (DAYS * 24) as u32);
    let size = rt.settings.review.recall_sample as usize;
    let seed = date
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let s = {
        let rt = rt.clone();
        tokio::task::spawn_blocking(move || sample(&rt, window, &flagged_ids, size, seed))
            .await
            .map_err(|e| ReviewError::Join(e.to_string()))??
    };
    let gate = Arc::new(s.gate);
    let chain = Arc::new(weekly_chain(&rt.settings));
    let mut footer = WeeklyFooter {
        findings_considered: findings.len() as u64,
        skipped: s.skipped,
        currency: rt.settings.currency.clone(),
        ..Default::default()
    };
    let mut missed = 0u64;
    let mut sampled = 0u64;
    let batch_size = rt.settings.review.batch_size.max(1) as usize;
    for chunk in s.batch.chunks(batch_size) {
        let job = JudgeJob {
            run_id: format!("weekly-{date}"),
            space_id: scan::RUN_SPACE.to_owned(),
            batch: chunk.to_vec(),
            gate: gate.clone(),
            chain: chain.clone(),
            counter_examples: Arc::new(Vec::new()),
        };
        let v = judge::judge_batch(&rt, &job).await;
        footer.judge_calls += u64::from(v.calls);
        footer.tokens_in += v.tokens_in;
        footer.tokens_out += v.tokens_out;
        footer.cost += v.cost;
        if v.leak.is_some() {
            // Fail closed, as the daily: the report is not written.
            return Err(ReviewError::Unavailable(
                "the weekly judge answered with an identifier; no weekly report was written".into(),
            ));
        }
        if let Some(reason) = v.skipped {
            footer.skipped.push(Skip {
                what: "recall sample".into(),
                reason,
                count: chunk.len() as u64,
            });
            continue;
        }
        sampled += chunk.len() as u64;
        let hit: BTreeSet<i64> = v.findings.iter().map(|f| f.message_id).collect();
        missed += hit.len() as u64;
    }
    let recall = stats::recall(s.flagged, s.unflagged, sampled, missed);
    let verdicts = verdicts(&ledger);
    footer.wall_clock_ms = started.elapsed().as_millis() as u64;
    let report = WeeklyReport {
        date: date.clone(),
        kind: "weekly",
        since_date,
        until_date: date.clone(),
        clusters,
        recall,
        verdicts,
        friction,
        trend_weeks: trend::week_ends(today),
        quiet,
        friction_weeks,
        footer,
    };
    let md = report.to_markdown();
    let json: Value =
        serde_json::to_value(&report).map_err(|e| ReviewError::Join(e.to_string()))?;
    intake::gate_text("weekly report", &md, &json, &report.ids(), &gate)
        .map_err(|e| ReviewError::Unavailable(e.to_string()))?;
    let dir = ReportName {
        date: date.clone(),
        kind: ReportKind::Weekly,
    }
    .dir(&reviews);
    let written = {
        let target = dir.clone();
        tokio::task::spawn_blocking(move || report::write_atomically(&target, &md, &json))
            .await
            .map_err(|e| ReviewError::Join(e.to_string()))?
            .map_err(|source| ReviewError::Write {
                path: dir.display().to_string(),
                source,
            })?
    };
    Ok(WeeklySummary {
        date,
        report_path: written.markdown.display().to_string(),
        report_json_path: written.json.display().to_string(),
        clusters: report.clusters.len(),
        promoted: report.clusters.iter().filter(|c| c.promoted).count(),
        recall: report.recall.clone(),
        verdicts: report.verdicts.clone(),
        cost: report.footer.cost,
        currency: report.footer.currency.clone(),
    })
}

/// Counts by decision in the ledger (for the API's ledger view).
pub(crate) fn ledger_counts(l: &ledger::Ledger) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in &l.rows {
        *m.entry(r.approved.map_or("unapproved", Decision::as_str).to_owned())
            .or_default() += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::judge::{FindingKind, Scope, TargetLayer};

    fn f(bot: &str, space: &str, kind: FindingKind, summary: &str, id: i64) -> IntakeFinding {
        IntakeFinding {
            bot: bot.into(),
            date: "2026-09-28".into(),
            space: space.into(),
            message_id: id,
            kind,
            scope: Scope::Space,
            target_layer: TargetLayer::Memory,
            severity: 2,
            summary: summary.into(),
            evidence: String::new(),
            suggestion: String::new(),
        }
    }

    #[test]
    fn review_weekly_clusters_across_spaces_and_promotes_them() {
        let all = vec![
            f(
                "local",
                "family",
                FindingKind::WrongAnswer,
                "The assistant named the wrong capital of France.",
                1,
            ),
            f(
                "beta",
                "work",
                FindingKind::WrongAnswer,
                "Wrong capital of France named by the assistant.",
                2,
            ),
            f(
                "local",
                "family",
                FindingKind::Tone,
                "The assistant named the wrong capital of France.",
                3,
            ),
            f(
                "local",
                "family",
                FindingKind::WrongAnswer,
                "The reminder for the dentist was refused.",
                4,
            ),
        ];
        let (c, quiet) = clusters_with_trends(&all, day("2026-09-28"));
        assert!(quiet.is_empty());
        assert_eq!(c.len(), 3, "{c:#?}");
        assert_eq!(c[0].spaces, ["family", "work"]);
        assert_eq!(
            (c[0].promoted, c[0].scope.as_str(), c[0].findings),
            (true, "global", 2)
        );
        assert_eq!(c[0].bots, ["beta", "local"]);
        assert!(c[1..].iter().all(|c| !c.promoted && c.scope == "space"));
        let r = WeeklyReport {
            date: "2026-09-28".into(),
            kind: "weekly",
            since_date: "2026-09-22".into(),
            until_date: "2026-09-28".into(),
            clusters: c,
            recall: stats::recall(9, 100, 50, 2),
            verdicts: verdicts(&ledger::Ledger::default()),
            friction: {
                let mut counts = friction::Counts::new();
                let day = serde_json::json!({"friction": {"counts": {
                    "family": {"correction": 2, "abandoned": 1, "unknown_signal": 9},
                    "work": {"rephrased": 1}
                }}});
                add_friction(&mut counts, &day);
                add_friction(&mut counts, &day);
                add_friction(&mut counts, &serde_json::json!({"findings": []}));
                counts
            },
            trend_weeks: trend::week_ends(day("2026-09-28")),
            quiet: Vec::new(),
            friction_weeks: [("family".to_owned(), vec![0, 0, 0, 0, 0, 0, 1, 6])].into(),
            footer: WeeklyFooter::default(),
        };
        let md = r.to_markdown();
        // What the host would write passes its gate (a sender id such as
        // `owner` and digit runs included).
        let gate = IdentifierGate::new(
            &crate::redaction::RedactionList::new().with_sender_ids(["owner".to_owned()]),
        )
        .unwrap();
        intake::gate_text(
            "weekly report",
            &md,
            &serde_json::to_value(&r).unwrap(),
            &r.ids(),
            &gate,
        )
        .unwrap();
        for want in [
            "- scope: global (promoted from space: it spans two or more spaces)",
            "- spaces: family, work",
            "- recall: 0.69 (95 % Wilson interval",
            "- not enough verdicts: 0 of the 10 needed",
            "| judge: real | 0 | 0 |",
            "## Friction signals (this week, per space)",
            "- family: 4 correction, 2 abandoned",
            "- work: 2 rephrased",
            "- family: 0, 0, 0, 0, 0, 0, 1, 6 (······▂█)",
        ] {
            assert!(md.contains(want), "{want} missing in\n{md}");
        }
    }

    fn day(s: &str) -> chrono::NaiveDate {
        chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn on(date: &str, mut f: IntakeFinding) -> IntakeFinding {
        f.date = date.into();
        f
    }

    #[test]
    fn review_weekly_trends_count_eight_weeks_across_bots_and_list_the_quiet() {
        let capital = "The assistant named the wrong capital of France.";
        let dentist = "The reminder for the dentist was refused.";
        let all = vec![
            // Four weeks ago on another bot, two weeks ago here, twice this week.
            on(
                "2026-11-03",
                f("beta", "work", FindingKind::WrongAnswer, capital, 1),
            ),
            on(
                "2026-11-20",
                f("local", "family", FindingKind::WrongAnswer, capital, 2),
            ),
            on(
                "2026-12-01",
                f("local", "family", FindingKind::WrongAnswer, capital, 3),
            ),
            on(
                "2026-12-05",
                f("local", "family", FindingKind::WrongAnswer, capital, 4),
            ),
            // Seen three weeks ago, not since: quiet.
            on(
                "2026-11-12",
                f("beta", "work", FindingKind::WrongAnswer, dentist, 5),
            ),
            // Older than the trend: left out.
            on(
                "2026-09-01",
                f("local", "family", FindingKind::WrongAnswer, dentist, 6),
            ),
        ];
        let (current, quiet) = clusters_with_trends(&all, day("2026-12-05"));
        assert_eq!(current.len(), 1, "{current:#?}");
        let c = &current[0];
        assert_eq!(c.weeks, [0, 0, 0, 1, 0, 1, 0, 2]);
        // This week's figures are this week's members only.
        assert_eq!(
            (
                c.findings,
                c.spaces.as_slice(),
                c.bots.as_slice(),
                c.promoted
            ),
            (
                2,
                &["family".to_owned()][..],
                &["local".to_owned()][..],
                false
            )
        );
        assert_eq!(quiet.len(), 1, "{quiet:#?}");
        assert_eq!(quiet[0].weeks, [0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(
            (quiet[0].summary.as_str(), quiet[0].last_seen.as_str()),
            (dentist, "2026-11-12")
        );
        let r = WeeklyReport {
            date: "2026-12-05".into(),
            kind: "weekly",
            since_date: "2026-11-29".into(),
            until_date: "2026-12-05".into(),
            clusters: current,
            recall: stats::recall(0, 0, 0, 0),
            verdicts: verdicts(&ledger::Ledger::default()),
            friction: friction::Counts::new(),
            trend_weeks: trend::week_ends(day("2026-12-05")),
            quiet,
            friction_weeks: BTreeMap::new(),
            footer: WeeklyFooter::default(),
        };
        let md = r.to_markdown();
        for want in [
            "Trends count eight weeks, the first ending on 2026-10-17\n",
            "- per week, oldest first: 0, 0, 0, 1, 0, 1, 0, 2 (···▄·▄·█)",
            "## Quiet this week (1)",
            "- wrong_answer / memory: The reminder for the dentist was refused.; spaces: work; bots: beta; per week, oldest first: 0, 0, 0, 0, 1, 0, 0, 0 (····█···); last seen 2026-11-12\n",
        ] {
            assert!(md.contains(want), "{want} missing in\n{md}");
        }
        let gate = IdentifierGate::new(&crate::redaction::RedactionList::new()).unwrap();
        intake::gate_text(
            "weekly report",
            &md,
            &serde_json::to_value(&r).unwrap(),
            &r.ids(),
            &gate,
        )
        .unwrap();
    }
}
