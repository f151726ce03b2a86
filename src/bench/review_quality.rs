//! `mercury bench review-quality`: the review pipeline's recall and
//! precision on a planted-finding conversation set
//! (`tests/review-quality/set.json`: known bad answers among fine ones)
//! with the scripted judge of `tests/review-quality/judge.json`.
//!
//! Seeds the set into a real host on a temp data dir, runs a real scan
//! (`POST /api/review/run`: reader, redaction, judge pool, validation, gate,
//! report), and scores the report's flagged message ids against the planted
//! ones. The figures measure the pipeline around a fixed judge (nothing is
//! lost or invented between the judge and the report), not a model.
//!
//! Issue 31 adds two figures: **trace citations** (planted exchanges whose
//! run has a failing `shell` step: the share of them whose finding reaches
//! the report citing exactly that step) and **friction recall** (signals
//! planted by a sender's next message: the share the report lists on the
//! right exchange, and any signal it lists that was not planted). The
//! friction signals are computed without a model, so that figure measures
//! the detector itself.
//!
//! Must never: touch a data dir it did not create, or reach anything but
//! 127.0.0.1.

use std::collections::BTreeSet;
use std::fmt;

use anyhow::Context;
use hyper::Method;
use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

use crate::clock::now_ms;
use crate::host::temp_host::TempHost;
use crate::storage::messages::{self, NewMessage};
use crate::storage::{runs, spaces, Store};

const SET: &str = include_str!("../../tests/review-quality/set.json");
const JUDGE: &str = include_str!("../../tests/review-quality/judge.json");

#[derive(Deserialize)]
struct PlantedSet {
    exchanges: Vec<PlantedExchange>,
}

#[derive(Deserialize)]
struct PlantedExchange {
    space: String,
    text: String,
    reply: String,
    /// Why the answer is bad; `None` for a fine one.
    planted: Option<String>,
    /// Who wrote it (friction signals follow one sender).
    #[serde(default)]
    sender: Option<String>,
    /// A run with tool steps, started by the message.
    #[serde(default)]
    trace: Option<PlantedTrace>,
    /// The friction signals planted on this exchange.
    #[serde(default)]
    friction: Vec<String>,
    /// The space's `AGENTS.md`, written before the host starts.
    #[serde(default)]
    agents_md: Option<String>,
    /// What a rehearsal of this finding's drafted fix must find:
    /// `fixes` (current fails, candidate passes) or `no_repro`.
    #[serde(default)]
    rehearsal: Option<String>,
}

#[derive(Deserialize, Clone)]
struct PlantedTrace {
    /// The step a finding should cite.
    #[serde(default)]
    failing_step: Option<u32>,
    steps: Vec<PlantedStep>,
}

#[derive(Deserialize, Clone)]
struct PlantedStep {
    name: String,
    exit_code: i64,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QualityReport {
    pub exchanges: usize,
    pub planted: usize,
    pub flagged: usize,
    pub true_positives: usize,
    pub recall: f64,
    pub precision: f64,
    /// Why each planted answer that was not flagged is bad.
    pub missed: Vec<String>,
    pub false_positives: usize,
    /// Planted failing steps, and the findings citing exactly one of them.
    pub trace_planted: usize,
    pub trace_cited: usize,
    /// Planted friction signals, those listed on their exchange, and
    /// signals listed that were not planted.
    pub friction_planted: usize,
    pub friction_found: usize,
    pub friction_unplanted: usize,
    /// Planted rehearsal truths, and the rehearsals whose verdict agreed.
    pub rehearsal_planted: usize,
    pub rehearsal_agreed: usize,
    /// Each disagreement: the truth and the verdict.
    pub rehearsal_disagreed: Vec<String>,
}

impl fmt::Display for QualityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "review quality on the planted set (scripted judge)")?;
        writeln!(
            f,
            "exchanges {}, planted bad answers {}, flagged {}",
            self.exchanges, self.planted, self.flagged
        )?;
        writeln!(
            f,
            "recall    {:.3} ({} of {} planted flagged)",
            self.recall, self.true_positives, self.planted
        )?;
        writeln!(
            f,
            "precision {:.3} ({} of {} flagged planted; {} false positive(s))",
            self.precision, self.true_positives, self.flagged, self.false_positives
        )?;
        for m in &self.missed {
            writeln!(f, "missed: {m}")?;
        }
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        writeln!(
            f,
            "trace citations {:.3} ({} of {} planted failing steps cited by their finding)",
            ratio(self.trace_cited, self.trace_planted),
            self.trace_cited,
            self.trace_planted
        )?;
        writeln!(
            f,
            "friction recall {:.3} ({} of {} planted signals on their exchange; {} not planted)",
            ratio(self.friction_found, self.friction_planted),
            self.friction_found,
            self.friction_planted,
            self.friction_unplanted
        )?;
        writeln!(
            f,
            "rehearsal agreement {:.3} ({} of {} planted verdicts: 3 replays an arm in shadows)",
            ratio(self.rehearsal_agreed, self.rehearsal_planted),
            self.rehearsal_agreed,
            self.rehearsal_planted
        )?;
        for d in &self.rehearsal_disagreed {
            writeln!(f, "rehearsal disagreed: {d}")?;
        }
        Ok(())
    }
}

pub(crate) async fn run() -> anyhow::Result<QualityReport> {
    let set: PlantedSet = serde_json::from_str(SET).context("tests/review-quality/set.json")?;
    let (dir, data) = TempHost::builder()
        .model(JUDGE)
        // Turns are not measured here: no container is needed.
        .sandbox("process")
        .set("review.batch_size", Yaml::Number(1.into()))
        .set("review.calls_per_minute", Yaml::Number(6000.into()))
        .prepare()
        .await?;
    // Seed before the host opens the database: user message ids of the
    // planted answers are what the report must flag.
    let store = Store::open(&data.join("state.db"))?;
    type Row = (
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<PlantedTrace>,
    );
    let rows: Vec<Row> = set
        .exchanges
        .iter()
        .map(|e| {
            (
                e.space.clone(),
                e.text.clone(),
                e.reply.clone(),
                e.planted.clone(),
                e.sender.clone(),
                e.trace.clone(),
            )
        })
        .collect();
    // (user message id, why) of planted answers; (id, step) of planted
    // failing steps; the user message id of every exchange, in set order.
    type Seeded = (Vec<(i64, String)>, Vec<(i64, u32)>, Vec<Option<i64>>);
    let (planted_ids, planted_steps, ids): Seeded = store
        .write(move |tx| {
            let now = now_ms();
            let mut made = BTreeSet::new();
            let mut planted = Vec::new();
            let mut steps_planted = Vec::new();
            let mut ids = Vec::new();
            for (i, (space, text, reply, why, sender, trace)) in rows.iter().enumerate() {
                if made.insert(space.clone()) {
                    spaces::create_space(tx, space, space, &[])?;
                }
                let at = now - 3_600_000 + (i as i64) * 1000;
                let run_id = trace
                    .as_ref()
                    .map(|_| uuid::Uuid::now_v7().simple().to_string());
                let user = messages::insert(
                    tx,
                    &NewMessage {
                        space_id: space,
                        sender_id: sender.as_deref(),
                        role: "user",
                        text,
                        created_at: at,
                        status: Some("done"),
                        run_id: run_id.as_deref(),
                        ..Default::default()
                    },
                )?;
                ids.push(user);
                if let (Some(trace), Some(run), Some(id)) = (trace, &run_id, user) {
                    runs::start(tx, run, space, "turn", sender.as_deref(), Some(id))?;
                    let steps: Vec<runs::RunStep> = trace
                        .steps
                        .iter()
                        .enumerate()
                        .map(|(n, s)| runs::RunStep {
                            seq: n as u32 + 1,
                            kind: "tool".into(),
                            name: s.name.clone(),
                            exit_code: Some(s.exit_code),
                            error: s.error.clone(),
                            started_at: at,
                            ..Default::default()
                        })
                        .collect();
                    runs::record_steps(tx, run, &steps)?;
                    runs::finish(tx, run, "done", None)?;
                    if let Some(step) = trace.failing_step {
                        steps_planted.push((id, step));
                    }
                }
                messages::insert(
                    tx,
                    &NewMessage {
                        space_id: space,
                        sender_id: Some("mercury"),
                        sender_name: Some("Mercury"),
                        role: "assistant",
                        text: reply,
                        created_at: at + 1,
                        reply_to: user,
                        ..Default::default()
                    },
                )?;
                if let (Some(why), Some(id)) = (why, user) {
                    planted.push((id, why.clone()));
                }
            }
            Ok((planted, steps_planted, ids))
        })
        .await?;
    drop(store);
    // The planted spaces' instructions, where the workspace would have them.
    let paths = crate::workspace::DataPaths::new(&data);
    for e in &set.exchanges {
        if let Some(text) = &e.agents_md {
            let id = crate::ids::SpaceId::parse(&e.space)
                .map_err(|_| anyhow::anyhow!("{} is not a space id", e.space))?;
            let ws = crate::workspace::ensure_workspace(&paths, &id)?;
            std::fs::write(ws.join("AGENTS.md"), text)?;
        }
    }
    let host = TempHost::serve_in(dir, data).await?;
    let conn = host.connection(None);
    let summary = host
        .ok(&conn, Method::POST, "/api/review/run", None)
        .await?;
    let date = summary["date"]
        .as_str()
        .context("the scan's date")?
        .to_owned();
    let report = host
        .ok(
            &conn,
            Method::GET,
            &format!("/api/review/reports/{date}"),
            None,
        )
        .await?;
    let data = host.stop_and_keep().await?;
    let rehearsed = rehearse_planted(&data, &set, &ids).await;
    if let Some(temp) = data.parent() {
        let _ = std::fs::remove_dir_all(temp);
    }
    let (rehearsal_planted, rehearsal_agreed, rehearsal_disagreed) = rehearsed?;
    let findings = report["report"]["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let flagged: BTreeSet<i64> = findings
        .iter()
        .filter_map(|f| f["message_id"].as_i64())
        .collect();
    let trace_cited = planted_steps
        .iter()
        .filter(|(id, step)| {
            findings.iter().any(|f| {
                f["message_id"].as_i64() == Some(*id)
                    && f["trace"]["step"].as_u64() == Some(u64::from(*step))
            })
        })
        .count();
    // Friction: (message id, signal) planted vs listed.
    let planted_friction: BTreeSet<(i64, String)> = set
        .exchanges
        .iter()
        .zip(&ids)
        .filter_map(|(e, id)| id.map(|id| (e, id)))
        .flat_map(|(e, id)| e.friction.iter().map(move |s| (id, s.clone())))
        .collect();
    let listed: BTreeSet<(i64, String)> = report["report"]["friction"]["exchanges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| Some((x["message_id"].as_i64()?, x["signals"].as_array()?.clone())))
        .flat_map(|(id, s)| {
            s.into_iter()
                .filter_map(move |v| v.as_str().map(|v| (id, v.to_owned())))
        })
        .collect();
    let planted: BTreeSet<i64> = planted_ids.iter().map(|(id, _)| *id).collect();
    let tp = flagged.intersection(&planted).count();
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok(QualityReport {
        exchanges: set.exchanges.len(),
        planted: planted.len(),
        flagged: flagged.len(),
        true_positives: tp,
        recall: ratio(tp, planted.len()),
        precision: ratio(tp, flagged.len()),
        missed: planted_ids
            .iter()
            .filter(|(id, _)| !flagged.contains(id))
            .map(|(_, why)| why.clone())
            .collect(),
        false_positives: flagged.difference(&planted).count(),
        trace_planted: planted_steps.len(),
        trace_cited,
        friction_planted: planted_friction.len(),
        friction_found: planted_friction.intersection(&listed).count(),
        friction_unplanted: listed.difference(&planted_friction).count(),
        rehearsal_planted,
        rehearsal_agreed,
        rehearsal_disagreed,
    })
}

/// `mercury review intake` on the scanned data dir, then `mercury review
/// rehearse` of each row whose finding has a planted rehearsal truth (the
/// product's own commands, as an operator runs them); how many were
/// planted, how many verdicts agreed, and each disagreement.
async fn rehearse_planted(
    data: &std::path::Path,
    set: &PlantedSet,
    ids: &[Option<i64>],
) -> anyhow::Result<(usize, usize, Vec<String>)> {
    let truth: Vec<(i64, String)> = set
        .exchanges
        .iter()
        .zip(ids)
        .filter_map(|(e, id)| Some(((*id)?, e.rehearsal.clone()?)))
        .collect();
    let exe = std::env::current_exe().context("the mercury binary")?;
    let root = data.with_file_name("shadow-root");
    let data_s = data.display().to_string();
    let run = |args: Vec<String>| {
        let exe = exe.clone();
        let root = root.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(exe)
                .args(args)
                .env("MERCURY_SHADOW_ROOT", root)
                .env("MERCURY_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .output()
        })
    };
    let out = run(vec![
        "review".into(),
        "intake".into(),
        "--data-dir".into(),
        data_s.clone(),
    ])
    .await??;
    anyhow::ensure!(
        out.status.success(),
        "mercury review intake: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let triage_path = data.join("reviews/intake/triage.json");
    let triage: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&triage_path)?)?;
    let mut agreed = 0;
    let mut disagreed = Vec::new();
    for (id, want) in &truth {
        let row = triage["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["finding"]["message_id"].as_i64() == Some(*id));
        let Some(n) = row.and_then(|r| r["row"].as_u64()) else {
            disagreed.push(format!("{want}: the finding was not in the triage"));
            continue;
        };
        let out = run(vec![
            "review".into(),
            "rehearse".into(),
            n.to_string(),
            "--data-dir".into(),
            data_s.clone(),
        ])
        .await??;
        if !out.status.success() {
            disagreed.push(format!(
                "{want}: rehearse failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let after: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&triage_path)?)?;
        let verdict = after["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["row"].as_u64() == Some(n))
            .and_then(|r| r["rehearsal"]["verdict"].as_str())
            .unwrap_or("")
            .to_owned();
        let ok = match want.as_str() {
            "fixes" => verdict.starts_with("the candidate fixes it"),
            "no_repro" => verdict.starts_with("did not reproduce"),
            _ => false,
        };
        if ok {
            agreed += 1;
        } else {
            disagreed.push(format!("{want}: {verdict}"));
        }
    }
    Ok((truth.len(), agreed, disagreed))
}
