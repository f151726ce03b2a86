//! `mercury bench sandbox`: how long a docker-backed turn waits for its
//! sandbox, from "create the container" to "the first exec has answered"
//! (the docker backend's `start` + exec `true`, through bollard, with the run's
//! full shape: labels, mounts, limits, lockdown), beside
//! `docker run --rm <image> true` through the CLI (the baseline the issue
//! names; target ≤ 0.6×) and `docker run --rm --network none <image> true`
//! (the same network setup as ours, so the ratio is not won by skipping the
//! bridge alone).
//!
//! Beside them, **claiming a pooled container** (`sandbox.warm`, started and
//! paused ahead) until its first exec has answered: the claim mounts the
//! run's workspace into the slot, unpauses, and execs `true` (target ≤ 0.25×
//! of `docker run`). The pool refills before anything else is timed, so its
//! background work never overlaps a measurement.
//!
//! Runs are interleaved (pooled, ours, then each baseline) so background
//! load hits all of them alike. Every container is closed after its run and
//! the bench's own instance is swept at the end, also after a failure.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::Settings;
use crate::sandbox::{
    instance_id_for, ExecRequest, RunKind, SandboxBackend, SandboxLimits, SandboxSpec,
};
use crate::workspace::DataPaths;

/// Timings of one bench, one entry per run.
#[derive(Debug, Default)]
pub(crate) struct SandboxFigures {
    pub image: String,
    /// The bench's instance id (its containers carry it as `mercury.instance`).
    pub instance: String,
    pub bollard: Vec<Duration>,
    /// Claiming a pooled container + exec `true`.
    pub warm: Vec<Duration>,
    pub cli: Vec<Duration>,
    pub cli_no_network: Vec<Duration>,
}

/// Runs the bench: one unmeasured warm-up of each path, then `runs` of each.
pub(crate) async fn run(runs: usize) -> anyhow::Result<SandboxFigures> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let tmp = tempfile::Builder::new()
        .prefix("mercury-bench-sandbox-")
        .tempdir()
        .context("creating the bench's temp dir")?;
    let workspace = tmp.path().join("work");
    std::fs::create_dir(&workspace).with_context(|| format!("creating {}", workspace.display()))?;
    let instance = instance_id_for(tmp.path())?;
    let settings = Settings::default();
    let paths = DataPaths::new(tmp.path());
    let backend = crate::host::containers::docker_backend(&settings, &paths)
        .await
        .context("mercury bench sandbox needs a Docker engine")?;
    // The same engine and instance with one container kept ready.
    let mut warm_settings = settings.clone();
    warm_settings.sandbox.warm = 1;
    let warm = crate::host::containers::docker_backend(&warm_settings, &paths).await?;
    let mut figures = SandboxFigures {
        image: crate::host::containers::agent_image(&settings)?,
        instance: instance.clone(),
        ..Default::default()
    };
    let limits = crate::host::containers::sandbox_limits(&settings);
    let backends = Backends {
        cold: backend.as_ref(),
        warm: warm.as_ref(),
    };
    let measured = measure(backends, &instance, &limits, &workspace, runs, &mut figures).await;
    // Whatever happened above, leave none of this bench's containers behind.
    warm.shutdown().await;
    let swept = backend.sweep_orphans(&instance, &HashSet::new).await;
    measured?;
    swept.context("removing the bench's containers")?;
    Ok(figures)
}

/// The backend that starts cold, and one with a warm pool of one.
#[derive(Clone, Copy)]
struct Backends<'a> {
    cold: &'a dyn SandboxBackend,
    warm: &'a dyn SandboxBackend,
}

/// Waits (untimed) until the pool holds a container again.
async fn refilled(warm: &dyn SandboxBackend) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while warm.warm_idle() == 0 {
        if Instant::now() > deadline {
            bail!("the warm pool did not refill within 120 s (see the log)");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn measure(
    backends: Backends<'_>,
    instance: &str,
    limits: &SandboxLimits,
    workspace: &std::path::Path,
    runs: usize,
    figures: &mut SandboxFigures,
) -> anyhow::Result<()> {
    let image = figures.image.clone();
    for i in 0..=runs {
        refilled(backends.warm).await?;
        let warm = start_and_exec(
            backends.warm,
            instance,
            limits,
            workspace,
            &format!("warm-{i}"),
        )
        .await?;
        refilled(backends.warm).await?;
        let ours =
            start_and_exec(backends.cold, instance, limits, workspace, &i.to_string()).await?;
        let cli = docker_run(&image, false).await?;
        let cli_none = docker_run(&image, true).await?;
        // Run 0 warms the page cache and the engine; it is not counted.
        if i > 0 {
            figures.warm.push(warm);
            figures.bollard.push(ours);
            figures.cli.push(cli);
            figures.cli_no_network.push(cli_none);
        }
    }
    Ok(())
}

/// One run's sandbox, as a turn starts it: create + start, then exec `true`.
/// Only that is timed; removing the container is not.
async fn start_and_exec(
    backend: &dyn SandboxBackend,
    instance: &str,
    limits: &SandboxLimits,
    workspace: &std::path::Path,
    i: &str,
) -> anyhow::Result<Duration> {
    let spec = SandboxSpec {
        instance_id: instance.to_string(),
        space_id: "bench".into(),
        run_id: format!("bench-{i}"),
        kind: RunKind::Live,
        workspace: crate::sandbox::WorkspaceMount::HostPath(workspace.to_path_buf()),
        api: None,
        ro_binds: Vec::new(),
        env: vec![("MERCURY_SPACE".into(), "bench".into())],
        limits: limits.clone(),
    };
    let t = Instant::now();
    let session = backend
        .start(spec)
        .await
        .with_context(|| format!("starting bench container {i}"))?;
    let out = session
        .exec(ExecRequest {
            argv: vec!["true".into()],
            stdin: None,
            timeout: Duration::from_secs(60),
            output_cap: 1024,
        })
        .await;
    let elapsed = t.elapsed();
    let closed = session.close().await;
    let out = out.with_context(|| format!("exec `true` in bench container {i}"))?;
    closed.with_context(|| format!("removing bench container {i}"))?;
    if out.exit_code != 0 {
        bail!("`true` exited {} in bench container {i}", out.exit_code);
    }
    Ok(elapsed)
}

/// `docker run --rm [--network none] <image> true`, timed as a whole.
async fn docker_run(image: &str, no_network: bool) -> anyhow::Result<Duration> {
    let mut cmd = tokio::process::Command::new("docker");
    cmd.args(["run", "--rm"]);
    if no_network {
        cmd.args(["--network", "none"]);
    }
    cmd.args([image, "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let t = Instant::now();
    let out = cmd
        .output()
        .await
        .context("running the docker CLI (is `docker` on PATH?)")?;
    let elapsed = t.elapsed();
    if !out.status.success() {
        bail!(
            "docker run --rm {image} true failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(elapsed)
}

/// The middle value (the upper middle one for an even count).
pub(crate) fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The report `mercury bench sandbox` prints (data, so stdout).
pub(crate) fn report(f: &SandboxFigures) -> String {
    let line = |name: &str, v: &[Duration]| {
        let min = v.iter().min().copied().unwrap_or_default();
        let max = v.iter().max().copied().unwrap_or_default();
        format!(
            "  {name:<52} median {:>7.1} ms  (min {:.1}, max {:.1})\n",
            ms(median(v)),
            ms(min),
            ms(max)
        )
    };
    let ours = median(&f.bollard).as_secs_f64();
    let ratio = |base: &[Duration]| ours / median(base).as_secs_f64().max(f64::MIN_POSITIVE);
    let warm_ratio =
        median(&f.warm).as_secs_f64() / median(&f.cli).as_secs_f64().max(f64::MIN_POSITIVE);
    let mut out = format!(
        "bench sandbox: create to first exec answered, {} runs each, image {}, instance {}\n",
        f.bollard.len(),
        f.image,
        f.instance
    );
    out.push_str(&line(
        "bollard: start (create+start) + exec `true`",
        &f.bollard,
    ));
    out.push_str(&line(
        "bollard: claim a pooled container + exec `true`",
        &f.warm,
    ));
    out.push_str(&line("cli: docker run --rm IMAGE true", &f.cli));
    out.push_str(&line(
        "cli: docker run --rm --network none IMAGE true",
        &f.cli_no_network,
    ));
    out.push_str(&format!(
        "ratio bollard / docker run: {:.2}x (target <= 0.60x)\n",
        ratio(&f.cli)
    ));
    out.push_str(&format!(
        "ratio bollard / docker run --network none: {:.2}x\n",
        ratio(&f.cli_no_network)
    ));
    out.push_str(&format!(
        "ratio pooled claim / docker run: {warm_ratio:.2}x (target <= 0.25x)\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn median_is_the_middle_value_of_the_sorted_runs() {
        assert_eq!(median(&ms_list(&[30, 10, 20])), Duration::from_millis(20));
        assert_eq!(
            median(&ms_list(&[40, 10, 30, 20])),
            Duration::from_millis(30)
        );
        assert_eq!(median(&[]), Duration::ZERO);
    }

    #[test]
    fn the_report_gives_each_median_and_both_ratios() {
        let f = SandboxFigures {
            image: "mercury-agent:x".into(),
            instance: "0123456789abcdef".into(),
            bollard: ms_list(&[100, 120, 110]),
            warm: ms_list(&[40, 42, 41]),
            cli: ms_list(&[400, 440, 420]),
            cli_no_network: ms_list(&[200, 220, 210]),
        };
        let r = report(&f);
        assert!(r.contains("3 runs each"), "{r}");
        assert!(r.contains("median   110.0 ms"), "{r}");
        assert!(r.contains("median   420.0 ms"), "{r}");
        assert!(
            r.contains("ratio bollard / docker run: 0.26x (target <= 0.60x)"),
            "{r}"
        );
        assert!(
            r.contains("ratio bollard / docker run --network none: 0.52x"),
            "{r}"
        );
        assert!(r.contains("median    41.0 ms"), "{r}");
        assert!(
            r.contains("ratio pooled claim / docker run: 0.10x (target <= 0.25x)"),
            "{r}"
        );
    }
}
