//! Host-side wiring of the container sandbox: which image turns run in
//! (built locally, content-addressed, from `deploy/agent-image/`), connecting
//! the engines at start-up, and the periodic orphan sweep and health check
//! (through the backend, on the engines it serves with).
//!
//! Must never: sweep without this instance's id, pull an image (no registry
//! is assumed reachable; the image is built from local files), or name the
//! engine's API: it asks [`lifecycle::SandboxLifecycle`], so another kind of
//! engine needs no change here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

/// A turn's sandbox limits (and a warm pool's): tests and benches build
/// specs that fit the pool with it.
pub use crate::agent::sandbox_limits;
use crate::config::Settings;
use crate::runtime::Runtime;
use crate::sandbox::image::agent_image_tag;
use crate::sandbox::lifecycle::{self, WhenAbsent};
use crate::sandbox::{SandboxBackend, WarmSpec};
use crate::workspace::DataPaths;

/// The `mrctl` that goes into the image: `MERCURY_MRCTL`, else the one beside
/// the running binary (a static build is preferred; a dynamic one works, its
/// libraries are copied in).
pub fn mrctl_path() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MERCURY_MRCTL") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the running binary")?;
    let dir = exe
        .parent()
        .context("the running binary has no directory")?;
    // Test binaries live in target/<profile>/deps; the real ones one level up.
    for candidate in [dir.join("mrctl"), dir.join("../mrctl")] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!(
        "no mrctl binary beside {} (set MERCURY_MRCTL)",
        exe.display()
    )
}

/// Connects the engines of `sandbox.docker` and makes sure the image turns
/// run in exists on each: the backend `sandbox: docker` serves with.
pub async fn docker_backend(
    settings: &Settings,
    paths: &DataPaths,
) -> anyhow::Result<Arc<dyn SandboxBackend>> {
    let engines = lifecycle::connect(&settings.sandbox.docker).await?;
    let image = if settings.sandbox.image.is_empty() {
        let tag = agent_image(settings)?;
        // A shadow never builds an image (`shadow up` refuses a missing
        // one first): building would load the live box while it serves.
        let when_absent = if settings.shadow {
            WhenAbsent::Refuse
        } else {
            WhenAbsent::Build
        };
        engines
            .ensure_agent_image(&tag, &mrctl_path()?, when_absent)
            .await?;
        tag
    } else {
        settings.sandbox.image.clone()
    };
    if settings.sandbox.warm == 0 {
        return Ok(engines.serving(image));
    }
    let warm = WarmSpec {
        slots: settings.sandbox.warm,
        instance_id: crate::sandbox::instance_id_for(&paths.root)?,
        limits: sandbox_limits(settings),
    };
    // A host that cannot mount the pool's directory still serves, cold.
    match engines.serving_warm(image.clone(), warm) {
        Ok(backend) => Ok(backend),
        Err(e) => {
            tracing::warn!(error = %e, "sandbox.warm is set but the pool cannot start; every sandbox starts cold");
            Ok(engines.serving(image))
        }
    }
}

/// The tag of the agent image this binary's turns run in (`sandbox.image`,
/// else the content-addressed one `mercury image build` makes).
pub fn agent_image(settings: &Settings) -> anyhow::Result<String> {
    if !settings.sandbox.image.is_empty() {
        return Ok(settings.sandbox.image.clone());
    }
    let mrctl = mrctl_path()?;
    agent_image_tag(env!("CARGO_PKG_VERSION"), &mrctl)
        .with_context(|| format!("reading {} and the image's tools", mrctl.display()))
}

/// `mercury image build`: builds the image on the local engine, or on
/// every engine `data_dir`'s config names (each must answer), and prints
/// its tag.
pub async fn build_image_cli(
    mrctl: Option<PathBuf>,
    data_dir: Option<&Path>,
) -> anyhow::Result<String> {
    let mrctl = match mrctl {
        Some(p) => p,
        None => mrctl_path()?,
    };
    let engines = engines_of(data_dir).await?;
    let tag = agent_image_tag(env!("CARGO_PKG_VERSION"), &mrctl)?;
    engines.build_agent_image(&tag, &mrctl).await?;
    Ok(tag)
}

/// The engines of `data_dir`'s `sandbox.docker.hosts`, every one of them
/// answering, or the local engine without a data dir: where the image
/// commands build.
pub async fn engines_of(
    data_dir: Option<&Path>,
) -> anyhow::Result<Arc<dyn lifecycle::SandboxLifecycle>> {
    match data_dir {
        None => Ok(lifecycle::connect_local().await?),
        Some(dir) => {
            let settings = crate::host::load_settings(&DataPaths::new(dir))
                .with_context(|| format!("{} is not a data dir", dir.display()))?;
            Ok(lifecycle::connect_every(&settings.sandbox.docker).await?)
        }
    }
}

/// One of several hosts: removes what hosts that are gone left on the
/// engines (none of it runs for anyone; their spaces run elsewhere now).
async fn sweep_dead_hosts(rt: &Runtime, seat: &crate::cluster::HostSeat) {
    let dead = match seat.dead_instances(&rt.instance_id).await {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "cannot read which hosts are gone");
            return;
        }
    };
    let nothing_runs = || std::collections::HashSet::new();
    for instance in dead {
        match rt.sandbox.sweep_orphans(&instance, &nothing_runs).await {
            Ok(0) => {}
            Ok(count) => {
                tracing::warn!(count, instance = %instance, "removed the containers a host that is gone left behind");
            }
            Err(e) => {
                tracing::error!(error = %e, instance = %instance, "sweeping a gone host's containers failed");
            }
        }
    }
}

/// Removes this instance's leftover containers at start-up and then every
/// `sandbox.sweep_interval_secs` on each of the serving backend's engines,
/// sparing the runs executing now, and checks the engines' health
/// (placement skips one that stopped answering).
pub async fn sweep_loop(rt: Arc<Runtime>, shutdown: CancellationToken) {
    if rt.sandbox.engines().is_empty() {
        return;
    }
    let every = Duration::from_secs(rt.settings.sandbox.sweep_interval_secs);
    let live = || rt.live_run_ids();
    loop {
        match rt.sandbox.sweep_orphans(&rt.instance_id, &live).await {
            Ok(0) => {}
            Ok(count) => tracing::warn!(count, "removed orphan containers of this instance"),
            Err(e) => tracing::error!(error = %e, "orphan sweep failed"),
        }
        if let Some(seat) = &rt.cluster {
            sweep_dead_hosts(&rt, seat).await;
        }
        rt.sandbox.check_health().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
