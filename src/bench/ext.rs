//! `mercury bench ext`: an extension's MCP tool call beside a `shell` call,
//! both in one sandbox session as a turn makes them (bubblewrap, or with
//! `--backend docker` the turn's container, the server in its own container
//! from the runtime image `--image` names): `shell` runs
//! `hostname` (one sandboxed process per call, as every `shell` call is; the agent image has no `date`);
//! the MCP call is `get_current_time` of the PyPI `mcp-server-time` server
//! (`examples/time`, from the virtualenv `deploy/setup.sh` installs), once
//! cold (start the server inside the session, MCP initialize, the call) and
//! then warm (the turn's later calls reuse the running server).
//!
//! Must never: touch a data dir (the workspace is a temp dir), or pass or
//! fail on a number (the ratio is printed, not asserted).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::sandbox::process::ProcessBackend;
use crate::sandbox::{
    ExecRequest, RunKind, SandboxBackend, SandboxLimits, SandboxSpec, SpawnRequest,
};

/// The server's interpreter and virtualenv (as `examples/time` names them).
const VENV: &str = "/opt/mercury/mcp-venv";

#[derive(Debug, Default)]
pub(crate) struct ExtFigures {
    /// `bubblewrap` or `docker`.
    pub backend: &'static str,
    pub shell: Vec<Duration>,
    pub mcp_cold: Vec<Duration>,
    pub mcp_warm: Vec<Duration>,
}

/// The backend `mercury bench ext --backend` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ExtBackend {
    Bubblewrap,
    Docker,
}

/// `runs` shell calls, `runs` cold MCP starts+calls and `runs` warm calls,
/// after one unmeasured warm-up of each.
pub(crate) async fn run(
    runs: usize,
    backend: ExtBackend,
    image: &str,
) -> anyhow::Result<ExtFigures> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    if backend == ExtBackend::Docker {
        return run_docker(runs, image).await;
    }
    let Some(bwrap) = ProcessBackend::find_bwrap() else {
        bail!("bubblewrap is not installed (deploy/setup.sh installs it); stdio servers run only under it");
    };
    let python = format!("{VENV}/bin/python");
    if !std::path::Path::new(&python).is_file() {
        bail!("{python} is missing: deploy/setup.sh installs the MCP virtualenv");
    }
    let backend = ProcessBackend::bubblewrap(bwrap, None);
    let tmp = tempfile::Builder::new()
        .prefix("mercury-bench-ext-")
        .tempdir()?;
    let session = backend
        .start(SandboxSpec {
            instance_id: "bench-ext".into(),
            space_id: "bench".into(),
            run_id: "bench-ext".into(),
            kind: RunKind::Live,
            workspace: crate::sandbox::WorkspaceMount::HostPath(tmp.path().to_path_buf()),
            api: None,
            ro_binds: Vec::new(),
            env: Vec::new(),
            limits: SandboxLimits::default(),
        })
        .await
        .context("starting the bubblewrap session")?;
    let result = measure(session.as_ref(), &python, None, runs).await;
    session.close().await?;
    result
}

/// The same calls under the docker backend: `shell` is an exec in the
/// turn's container, the server its own container from `image`.
async fn run_docker(runs: usize, image: &str) -> anyhow::Result<ExtFigures> {
    let tmp = tempfile::Builder::new()
        .prefix("mercury-bench-ext-")
        .tempdir()?;
    let workspace = tmp.path().join("work");
    std::fs::create_dir(&workspace)?;
    let instance = crate::sandbox::instance_id_for(tmp.path())?;
    let backend = crate::host::containers::docker_backend(
        &crate::config::Settings::default(),
        &crate::workspace::DataPaths::new(tmp.path()),
    )
    .await
    .context("mercury bench ext --backend docker needs a Docker engine")?;
    let session = backend
        .start(SandboxSpec {
            instance_id: instance.clone(),
            space_id: "bench".into(),
            run_id: "bench-ext".into(),
            kind: RunKind::Live,
            workspace: crate::sandbox::WorkspaceMount::HostPath(workspace),
            api: None,
            ro_binds: Vec::new(),
            env: Vec::new(),
            limits: SandboxLimits::default(),
        })
        .await
        .context("starting the turn's container")?;
    let python = format!("{VENV}/bin/python");
    let result = measure(session.as_ref(), &python, Some(image), runs).await;
    let closed = session.close().await;
    // Whatever happened above, leave none of this bench's containers behind.
    let swept = backend
        .sweep_orphans(&instance, &std::collections::HashSet::new)
        .await;
    let mut figures = result?;
    closed?;
    swept.context("removing the bench's containers")?;
    figures.backend = "docker";
    Ok(figures)
}

async fn measure(
    session: &dyn crate::sandbox::SandboxSession,
    python: &str,
    image: Option<&str>,
    runs: usize,
) -> anyhow::Result<ExtFigures> {
    let deadline = Duration::from_secs(30);
    let args = serde_json::json!({"timezone": "Europe/Paris"});
    let start = || async {
        let process = session
            .spawn(SpawnRequest {
                argv: vec![
                    python.to_owned(),
                    "-m".into(),
                    "mcp_server_time".into(),
                    "--local-timezone".into(),
                    "UTC".into(),
                ],
                ro_mounts: vec![VENV.into()],
                image: image.map(str::to_owned),
            })
            .await?;
        anyhow::Ok(crate::extensions::mcp::connect_stdio(process, deadline).await?)
    };
    let mut figs = ExtFigures {
        backend: "bubblewrap",
        ..ExtFigures::default()
    };
    for i in 0..=runs {
        let t = Instant::now();
        let out = session
            .exec(ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "hostname".into()],
                stdin: None,
                timeout: deadline,
                output_cap: 1024,
            })
            .await?;
        let took = t.elapsed();
        anyhow::ensure!(out.exit_code == 0, "shell: hostname failed");
        if i > 0 {
            figs.shell.push(took);
        }
        let t = Instant::now();
        let conn = start().await?;
        let (text, is_error) = conn
            .call("get_current_time", args.clone(), deadline)
            .await?;
        let took = t.elapsed();
        anyhow::ensure!(
            !is_error && text.contains("Europe/Paris"),
            "the MCP call answered {text}"
        );
        conn.close().await;
        if i > 0 {
            figs.mcp_cold.push(took);
        }
    }
    let conn = start().await?;
    for i in 0..=runs {
        let t = Instant::now();
        let (_, is_error) = conn
            .call("get_current_time", args.clone(), deadline)
            .await?;
        let took = t.elapsed();
        anyhow::ensure!(!is_error, "the warm MCP call failed");
        if i > 0 {
            figs.mcp_warm.push(took);
        }
    }
    conn.close().await;
    Ok(figs)
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    super::percentile(&s, 50.0)
}

/// The figures as `mercury bench ext` prints them.
pub(crate) fn report(f: &ExtFigures) -> String {
    let (shell, cold, warm) = (median(&f.shell), median(&f.mcp_cold), median(&f.mcp_warm));
    let ratio = |d: Duration| d.as_secs_f64() / shell.as_secs_f64().max(1e-9);
    format!(
        "bench ext: {} runs each, one {} session\n\
         shell (hostname), median:                      {}\n\
         MCP get_current_time, cold (start+init+call):   {}  ({:.2}x shell)\n\
         MCP get_current_time, warm (server running):    {}  ({:.2}x shell)\n",
        f.shell.len(),
        f.backend,
        super::ms(shell),
        super::ms(cold),
        ratio(cold),
        super::ms(warm),
        ratio(warm),
    )
}
