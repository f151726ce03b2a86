//! The orphan sweep: removing this instance's containers whose run is no
//! longer live (after a crash or a restart), found by the instance label.
//!
//! Must never: sweep when the instance id is empty (that would be "no
//! filter"), touch a container without this instance's `mercury.instance`
//! label, or read the live runs before the listing.

use std::collections::{HashMap, HashSet};

use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::Docker;

use super::remove_container;
use crate::sandbox::{SandboxError, LABEL_INSTANCE, LABEL_RUN};

/// Removes this instance's containers whose run is not among `live_runs()`;
/// returns the removed container ids.
///
/// The engine filters on `mercury.instance=<instance_id>` and every result is
/// checked again here, so a container without our label is never touched.
/// An empty instance id is refused: it would mean "no filter".
///
/// `live_runs` is asked only after the listing: a run is live before it
/// creates its container, so every listed container of a run that is still
/// going is in that later set. A set taken before the listing would miss a
/// run that started in between and sweep its brand-new container (the
/// start-up sweep runs while resumed turns start).
pub async fn sweep_orphans(
    docker: &Docker,
    instance_id: &str,
    live_runs: impl Fn() -> HashSet<String>,
) -> Result<Vec<String>, SandboxError> {
    if instance_id.trim().is_empty() {
        return Err(SandboxError::Engine(
            "refusing to sweep containers without an instance id".into(),
        ));
    }
    let filter = format!("{LABEL_INSTANCE}={instance_id}");
    let filters = HashMap::from([("label", vec![filter.as_str()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let containers = docker.list_containers(Some(options)).await.map_err(|e| {
        SandboxError::Engine(format!("listing containers of instance {instance_id}: {e}"))
    })?;

    let live_runs = live_runs();
    let mut removed = Vec::new();
    for container in containers {
        let Some(id) = container.id else { continue };
        let labels = container.labels.unwrap_or_default();
        if labels.get(LABEL_INSTANCE).map(String::as_str) != Some(instance_id) {
            continue;
        }
        if labels
            .get(LABEL_RUN)
            .is_some_and(|run| live_runs.contains(run))
        {
            continue;
        }
        tracing::info!(container = %id, run = ?labels.get(LABEL_RUN), "removing orphaned sandbox container");
        if remove_container(docker, &id).await? {
            removed.push(id);
        }
    }
    Ok(removed)
}
