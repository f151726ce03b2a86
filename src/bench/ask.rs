//! `mercury bench ask`: how long an `ask` takes to start (its throwaway
//! layer over the workspace + container ready to exec) on a generated
//! 100 MB / 10,000-file workspace, beside `cp -a` of the same tree (target:
//! the layer ≤ 0.2× of `cp -a`; the whole start ≤ 1.0×).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Settings;
use crate::sandbox::{ExecRequest, RunKind, SandboxBackend, SandboxLimits, SandboxSpec};
use crate::workspace::layer::{LayerBudget, TurnLayer};
use crate::workspace::DataPaths;

pub(crate) struct AskOptions {
    pub files: usize,
    pub file_bytes: usize,
    pub runs: usize,
}

impl Default for AskOptions {
    fn default() -> Self {
        Self {
            files: 10_000,
            file_bytes: 10 * 1024,
            runs: 3,
        }
    }
}

pub(crate) struct AskFigures {
    pub cp_a: Vec<Duration>,
    pub copy: Vec<Duration>,
    pub container: Vec<Duration>,
    pub total: Vec<Duration>,
    pub bytes: u64,
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

pub(crate) async fn run(opts: &AskOptions) -> anyhow::Result<AskFigures> {
    let tmp = tempfile::Builder::new()
        .prefix("mercury-bench-ask-")
        .tempdir()?;
    let src = tmp.path().join("workspace");
    let bytes = generate(&src, opts.files, opts.file_bytes)?;
    let backend: Arc<dyn SandboxBackend> =
        crate::host::containers::docker_backend(&Settings::default(), &DataPaths::new(tmp.path()))
            .await?;
    // What the space actor does before laying a view: a no-op once the
    // workspace belongs to the sandbox user, as it does after its first run.
    backend.prepare_workspace(&src).await?;
    let mut figs = AskFigures {
        cp_a: Vec::new(),
        copy: Vec::new(),
        container: Vec::new(),
        total: Vec::new(),
        bytes,
    };
    for i in 0..opts.runs {
        let dst = tmp.path().join(format!("cp-{i}"));
        let t = Instant::now();
        let st = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(&dst)
            .status()
            .await?;
        anyhow::ensure!(st.success(), "cp -a failed");
        figs.cp_a.push(t.elapsed());
        let t = Instant::now();
        let (s2, scratch) = (src.clone(), tmp.path().join("scratch"));
        let layer = tokio::task::spawn_blocking(move || {
            TurnLayer::mount(
                &s2,
                &scratch,
                &format!("ask-{i}"),
                LayerBudget::Throwaway {
                    quota_mb: 1024,
                    limits: Default::default(),
                },
            )
        })
        .await??;
        let copied = t.elapsed();
        let dst = layer.merged().to_path_buf();
        let spec = SandboxSpec {
            instance_id: format!("bench-{}", uuid::Uuid::new_v4().simple()),
            space_id: "bench".into(),
            run_id: format!("bench-{i}"),
            kind: RunKind::Ask,
            workspace: crate::sandbox::WorkspaceMount::HostPath(dst.clone()),
            api: None,
            ro_binds: Vec::new(),
            env: Vec::new(),
            limits: SandboxLimits::default(),
        };
        let t2 = Instant::now();
        let session = backend
            .start(spec)
            .await
            .context("starting the ask container")?;
        let out = session
            .exec(ExecRequest {
                argv: vec!["true".into()],
                stdin: None,
                timeout: Duration::from_secs(30),
                output_cap: 1024,
            })
            .await;
        let ready = t2.elapsed();
        session.close().await?;
        layer.discard();
        out?;
        figs.copy.push(copied);
        figs.container.push(ready);
        figs.total.push(copied + ready);
    }
    Ok(figs)
}

fn generate(root: &Path, files: usize, size: usize) -> anyhow::Result<u64> {
    let mut total = 0;
    let chunk: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    for i in 0..files {
        let dir = root.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("f{i:05}.bin")), &chunk)?;
        total += size as u64;
    }
    Ok(total)
}

pub(crate) fn print(f: &mut AskFigures) {
    let cp = median(&mut f.cp_a);
    let copy = median(&mut f.copy);
    let container = median(&mut f.container);
    let total = median(&mut f.total);
    println!(
        "bench ask: {} MB workspace, medians of {} runs",
        f.bytes / 1_000_000,
        f.total.len()
    );
    println!(
        "  cp -a (baseline)            {:>9.1} ms",
        cp.as_secs_f64() * 1e3
    );
    println!(
        "  ask layer (overlay mount)   {:>9.1} ms   ratio {:.3}x of cp -a (target <= 0.20x)",
        copy.as_secs_f64() * 1e3,
        copy.as_secs_f64() / cp.as_secs_f64()
    );
    println!(
        "  ask container ready (exec)  {:>9.1} ms",
        container.as_secs_f64() * 1e3
    );
    println!(
        "  ask start total             {:>9.1} ms   ratio {:.2}x of cp -a (target <= 1.00x)",
        total.as_secs_f64() * 1e3,
        total.as_secs_f64() / cp.as_secs_f64()
    );
}
