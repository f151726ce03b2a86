//! `mercury bench shadow`: `mercury shadow snapshot` (VACUUM INTO, the
//! safe-path copy of `spaces/`, the diff baseline) on a generated data dir,
//! timed beside `cp -a` of the same dir, with both sizes and the ratio.
//! The case is 1M messages over 1,000 spaces (~1 GB, `--full`); the
//! default is a tenth of it so the bench runs in a minute on a small box.
//!
//! Must never: touch a real data dir (everything is under a temp dir).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::shadow::snapshot::{take, SnapshotOptions};

#[derive(Debug, Clone)]
pub(crate) struct ShadowBenchOptions {
    pub messages: usize,
    pub spaces: usize,
    /// Bytes of workspace files per space (AGENTS.md, MEMORY.md, knowledge/).
    pub files_bytes_per_space: usize,
}

impl ShadowBenchOptions {
    /// The case: 1M messages, 1,000 spaces, about 1 GB.
    pub(crate) fn full() -> Self {
        Self {
            messages: 1_000_000,
            spaces: 1_000,
            files_bytes_per_space: 700 * 1024,
        }
    }
}

impl Default for ShadowBenchOptions {
    fn default() -> Self {
        Self {
            messages: 100_000,
            spaces: 100,
            files_bytes_per_space: 700 * 1024,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ShadowFigures {
    pub source_bytes: u64,
    pub snapshot: Duration,
    pub snapshot_bytes: u64,
    pub cp_a: Duration,
    pub cp_a_bytes: u64,
}

fn du(path: &Path) -> u64 {
    walkdir::WalkDir::new(path)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn generate(data: &Path, opts: &ShadowBenchOptions) -> anyhow::Result<()> {
    let text = "a message of about the length people write in a chat, with a few words more to it, and then some";
    crate::storage::seed::spaces_with_messages(
        &data.join("state.db"),
        opts.spaces,
        opts.messages,
        text,
    )?;
    let chunk = vec![b'x'; 64 * 1024];
    for s in 0..opts.spaces {
        let ws = data.join("spaces").join(format!("bench-{s:04}"));
        std::fs::create_dir_all(ws.join("knowledge"))?;
        std::fs::write(ws.join("AGENTS.md"), crate::workspace::AGENTS_TEMPLATE)?;
        std::fs::write(ws.join("MEMORY.md"), crate::workspace::MEMORY_TEMPLATE)?;
        let mut left = opts.files_bytes_per_space;
        let mut n = 0;
        while left > 0 {
            let len = left.min(chunk.len());
            std::fs::write(
                ws.join("knowledge").join(format!("note-{n}.md")),
                &chunk[..len],
            )?;
            left -= len;
            n += 1;
        }
    }
    Ok(())
}

pub(crate) async fn run(opts: &ShadowBenchOptions) -> anyhow::Result<ShadowFigures> {
    let tmp = tempfile::Builder::new()
        .prefix("mercury-bench-shadow-")
        .tempdir()?;
    let data = tmp.path().join("live");
    crate::host::init(&data, "owner").await?;
    eprintln!(
        "mercury bench shadow: generating {} messages over {} spaces",
        opts.messages, opts.spaces
    );
    let (d, o) = (data.clone(), opts.clone());
    tokio::task::spawn_blocking(move || generate(&d, &o)).await??;
    let source_bytes = du(&data);

    let cp_target = tmp.path().join("cp-a");
    let t = Instant::now();
    let st = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&cp_target)
        .status()
        .context("running cp -a")?;
    let cp_a = t.elapsed();
    if !st.success() {
        bail!("cp -a failed: {st}");
    }
    let cp_a_bytes = du(&cp_target);
    std::fs::remove_dir_all(&cp_target)?;

    let root = tmp.path().join("shadow-root");
    let snap_opts = SnapshotOptions {
        live_data_dir: data.clone(),
        root: root.clone(),
        admins: Vec::new(),
        label: Some("bench".into()),
        port: None,
        progress: false,
        live_store: None,
    };
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || take(&snap_opts)).await??;
    let snapshot = t.elapsed();
    let snapshot_bytes = du(&out.dir);
    Ok(ShadowFigures {
        source_bytes,
        snapshot,
        snapshot_bytes,
        cp_a,
        cp_a_bytes,
    })
}

pub(crate) fn report(opts: &ShadowBenchOptions, f: &ShadowFigures) -> String {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    let ratio = f.snapshot.as_secs_f64() / f.cp_a.as_secs_f64().max(1e-9);
    let build = if cfg!(debug_assertions) {
        "DEBUG build: hashing and copying run unoptimised; run a release build for figures\n"
    } else {
        ""
    };
    format!(
        "{build}shadow snapshot of a {:.0} MB data dir ({} messages, {} spaces)\n\
         \x20 mercury shadow snapshot: {:>8.3} s, {:>8.1} MB written (database, files, diff baseline)\n\
         \x20 cp -a:                   {:>8.3} s, {:>8.1} MB written\n\
         \x20 ratio snapshot / cp -a:  {ratio:.2}x (time), {:.2}x (size)\n",
        mb(f.source_bytes),
        opts.messages,
        opts.spaces,
        f.snapshot.as_secs_f64(),
        mb(f.snapshot_bytes),
        f.cp_a.as_secs_f64(),
        mb(f.cp_a_bytes),
        f.snapshot_bytes as f64 / (f.cp_a_bytes.max(1)) as f64,
    )
}
