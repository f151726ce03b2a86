//! Extensions' jobs: each enabled extension's `[jobs.*]` called on its
//! interval or cron schedule in every space that enabled it, the answer
//! written to that space's `extension_state` (`job.<id>` = the answer's
//! text; an answer `{"state": {"k": "v"}}` also sets each key). Every firing
//! is a run of kind `job` in that space with one step (`<ext>.job.<id>`),
//! read with `mrctl runs show ID` like a turn's.
//!
//! Must never: run on a shadow host, or let one slow server hold the others
//! past its time limit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{credential, manifest, mcp, strip_and_cap};
use crate::clock::now_ms;
use crate::runtime::Runtime;
use crate::storage::extensions as rows;
use crate::storage::runs as rows_runs;

/// How often the loop looks for due jobs.
const TICK: Duration = Duration::from_millis(500);
/// One job call's limit.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest value kept per key.
const VALUE_CAP: usize = 4000;

/// Runs until `shutdown`. A job is first due one interval after the host
/// starts (or after its space enabled it).
pub async fn run(rt: Arc<Runtime>, shutdown: CancellationToken) {
    if rt.outbound.is_shadow() {
        return;
    }
    let mut last: HashMap<(String, String, String), i64> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let enabled = match rt.store.read(rows::enabled_everywhere).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "extension jobs: cannot read the enabled extensions");
                continue;
            }
        };
        let now = now_ms();
        // A job's cron is read on the deployment's clock (`timezone`).
        let tz = crate::schedule::zone(None, &rt.settings.timezone);
        for (space, row) in enabled {
            let Ok(m) = manifest::parse(&row.name, &row.manifest) else {
                continue;
            };
            for (id, job) in &m.jobs {
                let key = (space.clone(), m.name.clone(), id.clone());
                let since = *last.entry(key.clone()).or_insert(now);
                if !due(job, since, now, tz) {
                    continue;
                }
                last.insert(key, now);
                let outcome = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = run_one(&rt, &space, &m, id, job) => r,
                };
                if let Err(e) = outcome {
                    tracing::warn!(space = %space, extension = %m.name, job = %id, error = %e, "an extension job failed");
                }
            }
        }
    }
}

/// Whether `job`, last fired (or first seen) at `since`, is due at `now`.
fn due(job: &manifest::Job, since: i64, now: i64, tz: chrono_tz::Tz) -> bool {
    match (&job.cron, job.interval_secs) {
        (Some(expr), _) => crate::schedule::parse_cron(expr)
            .and_then(|c| crate::schedule::next_fire(&c, since, tz))
            .is_ok_and(|next| next <= now),
        (None, Some(secs)) => now - since >= i64::try_from(secs).unwrap_or(i64::MAX / 1000) * 1000,
        (None, None) => false,
    }
}

/// Fires one job as a run of kind `job` of `space`: the run row, its one
/// step (arguments, answer or error, duration), closed done or failed.
async fn run_one(
    rt: &Runtime,
    space: &str,
    m: &manifest::Manifest,
    id: &str,
    job: &manifest::Job,
) -> Result<(), super::ExtensionError> {
    let run_id = crate::ids::RunId::new().to_string();
    let (r, s) = (run_id.clone(), space.to_owned());
    rt.store
        .write(move |tx| rows_runs::start(tx, &r, &s, "job", None, None))
        .await?;
    let started_at = now_ms();
    let clock = std::time::Instant::now();
    let mut step = rows_runs::RunStep {
        seq: 1,
        kind: "tool".into(),
        name: format!("{}.job.{id}", m.name),
        started_at,
        ..Default::default()
    };
    let outcome = fire(rt, space, m, id, job, &mut step).await;
    step.duration_ms = clock.elapsed().as_millis() as u64;
    let error = outcome
        .as_ref()
        .err()
        .map(|e| crate::redaction::secrets::scrub_error(&e.to_string()));
    step.error.clone_from(&error);
    let status = if error.is_some() { "failed" } else { "done" };
    let (r, steps) = (run_id, vec![step]);
    rt.store
        .write(move |tx| {
            rows_runs::record_steps(tx, &r, &steps)?;
            rows_runs::finish(tx, &r, status, error.as_deref())
        })
        .await?;
    outcome
}

async fn fire(
    rt: &Runtime,
    space: &str,
    m: &manifest::Manifest,
    id: &str,
    job: &manifest::Job,
    step: &mut rows_runs::RunStep,
) -> Result<(), super::ExtensionError> {
    let server = m
        .servers
        .get(&job.server)
        .ok_or_else(|| super::ExtensionError::Start(format!("no server {}", job.server)))?;
    let url = server.url.clone().unwrap_or_default();
    let conn = mcp::connect_http(&url, credential(server)?, JOB_TIMEOUT).await?;
    let mut args: serde_json::Map<String, Value> = job
        .arguments
        .iter()
        .filter_map(|(k, v)| serde_json::to_value(v).ok().map(|v| (k.clone(), v)))
        .collect();
    args.insert("space".into(), Value::String(space.to_owned()));
    let (sp, mm) = (space.to_owned(), m.clone());
    let config = rt
        .store
        .read(move |c| super::space_config::values(c, &sp, &mm))
        .await?;
    if config.as_object().is_some_and(|o| !o.is_empty()) {
        args.insert("config".into(), config);
    }
    let cap = rt.settings.runs.step_output_bytes;
    step.arguments = Some(strip_and_cap(
        &crate::model::scripted::canonical_json(&Value::Object(args.clone())),
        cap,
    ));
    let answer = conn.call(&job.tool, Value::Object(args), JOB_TIMEOUT).await;
    conn.close().await;
    let (text, is_error) = answer?;
    step.output_bytes = Some(text.len() as u64);
    step.output = Some(strip_and_cap(&text, cap));
    step.exit_code = Some(i64::from(is_error));
    if is_error {
        return Err(super::ExtensionError::Protocol(format!(
            "the job's tool answered an error: {}",
            strip_and_cap(&text, 200)
        )));
    }
    let mut writes = vec![(format!("job.{id}"), strip_and_cap(&text, VALUE_CAP))];
    if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text.trim()) {
        if let Some(Value::Object(state)) = o.get("state") {
            for (k, v) in state {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                writes.push((k.chars().take(128).collect(), strip_and_cap(&v, VALUE_CAP)));
            }
        }
    }
    let (ext, space, at) = (m.name.clone(), space.to_owned(), now_ms());
    rt.store
        .write(move |tx| {
            for (k, v) in &writes {
                rows::state_set(tx, &ext, &space, k, v, at)?;
            }
            Ok(())
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(interval: Option<u64>, cron: Option<&str>) -> manifest::Job {
        manifest::Job {
            server: "s".into(),
            tool: "t".into(),
            interval_secs: interval,
            cron: cron.map(str::to_owned),
            arguments: Default::default(),
        }
    }

    #[test]
    fn jobs_fire_on_their_interval_or_their_cron_schedule() {
        // 2023-11-14T22:13:20Z.
        let t0 = 1_700_000_000_000;
        let every = job(Some(60), None);
        assert!(!due(&every, t0, t0 + 59_999, chrono_tz::UTC));
        assert!(due(&every, t0, t0 + 60_000, chrono_tz::UTC));
        // At minute 15 of every hour: due from 22:15:00, not before.
        let cron = job(None, Some("15 * * * *"));
        let at_15 = 1_700_000_100_000; // 22:15:00Z
        assert!(!due(&cron, t0, at_15 - 1, chrono_tz::UTC));
        assert!(due(&cron, t0, at_15, chrono_tz::UTC));
        // Fired at 22:15, next due at 23:15.
        assert!(!due(&cron, at_15, at_15 + 59 * 60_000, chrono_tz::UTC));
        assert!(due(&cron, at_15, at_15 + 3_600_000, chrono_tz::UTC));
    }
}
