//! Extensions' jobs: each enabled extension's `[jobs.*]` called on its
//! interval in every space that enabled it, the answer written to that
//! space's `extension_state` (`job.<id>` = the answer's text; an answer
//! `{"state": {"k": "v"}}` also sets each key).
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
        for (space, row) in enabled {
            let Ok(m) = manifest::parse(&row.name, &row.manifest) else {
                continue;
            };
            for (id, job) in &m.jobs {
                let key = (space.clone(), m.name.clone(), id.clone());
                let since = *last.entry(key.clone()).or_insert(now);
                if now - since < (job.interval_secs as i64) * 1000 {
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

async fn run_one(
    rt: &Runtime,
    space: &str,
    m: &manifest::Manifest,
    id: &str,
    job: &manifest::Job,
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
    let answer = conn.call(&job.tool, Value::Object(args), JOB_TIMEOUT).await;
    conn.close().await;
    let (text, is_error) = answer?;
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
