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
use crate::storage::{spaces, Store};

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
    let rows: Vec<(String, String, String, Option<String>)> = set
        .exchanges
        .iter()
        .map(|e| {
            (
                e.space.clone(),
                e.text.clone(),
                e.reply.clone(),
                e.planted.clone(),
            )
        })
        .collect();
    let planted_ids: Vec<(i64, String)> = store
        .write(move |tx| {
            let now = now_ms();
            let mut made = BTreeSet::new();
            let mut planted = Vec::new();
            for (i, (space, text, reply, why)) in rows.iter().enumerate() {
                if made.insert(space.clone()) {
                    spaces::create_space(tx, space, space, &[])?;
                }
                let at = now - 3_600_000 + (i as i64) * 1000;
                let user = messages::insert(
                    tx,
                    &NewMessage {
                        space_id: space,
                        role: "user",
                        text,
                        created_at: at,
                        status: Some("done"),
                        ..Default::default()
                    },
                )?;
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
            Ok(planted)
        })
        .await?;
    drop(store);
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
    host.stop().await?;
    let flagged: BTreeSet<i64> = report["report"]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["message_id"].as_i64())
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
    })
}
