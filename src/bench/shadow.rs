//! `mercury bench shadow`: `mercury shadow snapshot` (VACUUM INTO, the
//! safe-path copy of `spaces/`, the diff baseline) on a generated data dir,
//! timed beside `cp -a` of the same dir, with both sizes and the ratio.
//! The case is 1M messages over 1,000 spaces (~1 GB, `--full`); the
//! default is a tenth of it so the bench runs in a minute on a small box.
//!
//! Both sides are timed to a durable copy (the system's dirty pages flushed
//! before each side starts and counted when it ends), in interleaved pairs
//! whose order alternates, and the figure is the median pair's ratio: one
//! side left writing back behind the other, or a run taken while a shared
//! disk was throttled, made single ratios swing from 0.7x to 1.7x.
//!
//! Must never: touch a real data dir (everything is under a temp dir).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::shadow::snapshot::{take, SnapshotOptions};

#[derive(Debug, Clone)]
pub(crate) struct ShadowBenchOptions {
    pub messages: usize,
    pub spaces: usize,
    /// Bytes of workspace files per space (AGENTS.md, MEMORY.md, knowledge/).
    pub files_bytes_per_space: usize,
    /// Snapshot / `cp -a` pairs to time, interleaved.
    pub pairs: usize,
}

impl ShadowBenchOptions {
    /// The case: 1M messages, 1,000 spaces, about 1 GB.
    pub(crate) fn full() -> Self {
        Self {
            messages: 1_000_000,
            spaces: 1_000,
            files_bytes_per_space: 700 * 1024,
            pairs: DEFAULT_PAIRS,
        }
    }
}

impl Default for ShadowBenchOptions {
    fn default() -> Self {
        Self {
            messages: 100_000,
            spaces: 100,
            files_bytes_per_space: 700 * 1024,
            pairs: DEFAULT_PAIRS,
        }
    }
}

/// Interleaved pairs timed when none is asked for.
pub(crate) const DEFAULT_PAIRS: usize = 5;

/// One pair: the snapshot and `cp -a` of the same data dir, back to back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair {
    pub snapshot: Duration,
    pub cp_a: Duration,
}

impl Pair {
    fn ratio(&self) -> f64 {
        self.snapshot.as_secs_f64() / self.cp_a.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ShadowFigures {
    pub source_bytes: u64,
    pub snapshot_bytes: u64,
    pub cp_a_bytes: u64,
    /// In the order they ran (the second, fourth, ... ran the snapshot first).
    pub pairs: Vec<Pair>,
}

impl ShadowFigures {
    /// The pair whose ratio is the median (the lower middle of an even count).
    fn median(&self) -> Option<Pair> {
        let mut sorted = self.pairs.clone();
        sorted.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        sorted.get(sorted.len().saturating_sub(1) / 2).copied()
    }
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

    let (snapshot_root, cp_target) = (tmp.path().join("shadow-root"), tmp.path().join("cp-a"));
    let count = opts.pairs.max(1);
    let mut pairs = Vec::with_capacity(count);
    let (mut snapshot_bytes, mut cp_a_bytes) = (0, 0);
    for i in 0..count {
        let ((snapshot, s_bytes), (cp_a, c_bytes)) = if snapshot_first(i) {
            let s = time_snapshot(&data, &snapshot_root).await?;
            (s, time_cp_a(&data, &cp_target).await?)
        } else {
            let c = time_cp_a(&data, &cp_target).await?;
            (time_snapshot(&data, &snapshot_root).await?, c)
        };
        (snapshot_bytes, cp_a_bytes) = (s_bytes, c_bytes);
        pairs.push(Pair { snapshot, cp_a });
    }
    Ok(ShadowFigures {
        source_bytes,
        snapshot_bytes,
        cp_a_bytes,
        pairs,
    })
}

/// Whether pair `i` (from 0) runs the snapshot before `cp -a`: every other
/// pair, so neither side always runs on what the other left behind.
fn snapshot_first(i: usize) -> bool {
    i % 2 == 1
}

/// Flushes every dirty page of the system and waits for it (see
/// [`durably`]: a side must not pay for the writes of the one before, and
/// must pay for its own).
async fn flush_all() -> anyhow::Result<()> {
    // SAFETY: sync(2) takes no argument and cannot fail.
    tokio::task::spawn_blocking(|| unsafe { libc::sync() })
        .await
        .context("sync")
}

/// The time `work` takes to a durable end: every dirty page flushed before
/// the clock starts, and `work`'s own flushed before it stops.
async fn durably<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(Duration, T)> {
    flush_all().await?;
    let t = Instant::now();
    let out = work.await?;
    flush_all().await?;
    Ok((t.elapsed(), out))
}

/// `cp -a` of the data dir to `target`, durable; the time and the bytes
/// written. The copy is removed afterwards (untimed).
async fn time_cp_a(data: &Path, target: &Path) -> anyhow::Result<(Duration, u64)> {
    let (took, ()) = durably(async {
        let st = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(data)
            .arg(target)
            .status()
            .await
            .context("running cp -a")?;
        if !st.success() {
            bail!("cp -a failed: {st}");
        }
        Ok(())
    })
    .await?;
    let bytes = du(target);
    std::fs::remove_dir_all(target)?;
    Ok((took, bytes))
}

/// `mercury shadow snapshot` of the data dir under `root`, durable; the
/// time and the bytes written. The snapshot is removed afterwards (untimed).
async fn time_snapshot(data: &Path, root: &Path) -> anyhow::Result<(Duration, u64)> {
    let snap_opts = SnapshotOptions {
        live_data_dir: data.to_path_buf(),
        root: root.to_path_buf(),
        admins: Vec::new(),
        label: Some("bench".into()),
        port: None,
        progress: false,
        live_store: None,
    };
    let (took, out) =
        durably(async { Ok(tokio::task::spawn_blocking(move || take(&snap_opts)).await??) })
            .await?;
    let bytes = du(&out.dir);
    std::fs::remove_dir_all(root)?;
    Ok((took, bytes))
}

pub(crate) fn report(opts: &ShadowBenchOptions, f: &ShadowFigures) -> String {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    let build = if cfg!(debug_assertions) {
        "DEBUG build: hashing and copying run unoptimised; run a release build for figures\n"
    } else {
        ""
    };
    let mut out = format!(
        "{build}shadow snapshot of a {:.0} MB data dir ({} messages, {} spaces), {} interleaved pairs, each side synced before and timed to its end and a sync\n",
        mb(f.source_bytes),
        opts.messages,
        opts.spaces,
        f.pairs.len(),
    );
    for (i, p) in f.pairs.iter().enumerate() {
        let first = if snapshot_first(i) {
            "snapshot first"
        } else {
            "cp -a first"
        };
        out.push_str(&format!(
            "  pair {}: snapshot {:>7.3} s, cp -a {:>7.3} s, ratio {:.2}x ({first})\n",
            i + 1,
            p.snapshot.as_secs_f64(),
            p.cp_a.as_secs_f64(),
            p.ratio(),
        ));
    }
    if let Some(m) = f.median() {
        out.push_str(&format!(
            "  mercury shadow snapshot: {:>8.3} s, {:>8.1} MB written (database, files, diff baseline)\n\
             \x20 cp -a:                   {:>8.3} s, {:>8.1} MB written\n\
             \x20 ratio snapshot / cp -a:  {:.2}x (time, the median pair; target <= 1.20x), {:.2}x (size)\n",
            m.snapshot.as_secs_f64(),
            mb(f.snapshot_bytes),
            m.cp_a.as_secs_f64(),
            mb(f.cp_a_bytes),
            m.ratio(),
            f.snapshot_bytes as f64 / (f.cp_a_bytes.max(1)) as f64,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(snapshot_ms: u64, cp_a_ms: u64) -> Pair {
        Pair {
            snapshot: Duration::from_millis(snapshot_ms),
            cp_a: Duration::from_millis(cp_a_ms),
        }
    }

    fn figures(pairs: Vec<Pair>) -> ShadowFigures {
        ShadowFigures {
            source_bytes: 1,
            snapshot_bytes: 1,
            cp_a_bytes: 1,
            pairs,
        }
    }

    #[test]
    fn the_figure_is_the_median_pair_by_ratio_not_by_time() {
        // Ratios 2.0, 0.5, 1.1, 1.5, 0.9: the median is 1.1, though
        // neither its snapshot nor its cp -a is the median time.
        let f = figures(vec![
            pair(200, 100),
            pair(100, 200),
            pair(1100, 1000),
            pair(30, 20),
            pair(90, 100),
        ]);
        let m = f.median().map(|p| p.ratio());
        assert!(m.is_some_and(|r| (r - 1.1).abs() < 1e-9), "{m:?}");
        let out = report(&ShadowBenchOptions::default(), &f);
        assert!(out.contains("ratio 2.00x (cp -a first)"), "{out}");
        assert!(out.contains("ratio 0.50x (snapshot first)"), "{out}");
        assert!(out.contains("1.10x (time, the median pair"), "{out}");
    }

    #[test]
    fn an_even_count_takes_the_lower_middle() {
        let f = figures(vec![
            pair(300, 100),
            pair(100, 100),
            pair(120, 100),
            pair(200, 100),
        ]);
        let m = f.median().map(|p| p.ratio());
        assert!(m.is_some_and(|r| (r - 1.2).abs() < 1e-9), "{m:?}");
    }
}
