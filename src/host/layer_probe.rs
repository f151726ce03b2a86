//! `mercury doctor`'s turn-layer check: builds a real turn's layer (the
//! quota tmpfs and the overlay, [`TurnLayer`]) in the data dir's scratch over
//! a probe workspace, writes through it, and has the sandbox backend the host
//! would pick read the probe file through its bind (a container for docker,
//! a bubblewrap session otherwise). A host that passes can run a tool turn;
//! one that fails is told what to change.
//!
//! Why a real mount rather than reading capabilities alone: a service with
//! every capability can still run in a mount namespace of its own (systemd's
//! `ProtectSystem=`, `ReadWritePaths=`, `PrivateTmp=`), where an overlay it
//! mounts is invisible to dockerd and a container sees an empty workspace.
//! Only a container reading the file shows that.
//!
//! Must never: touch a space's workspace, leave a mount, a probe directory
//! or a container behind, or build or pull an image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{SandboxChoice, Settings};
use crate::sandbox::lifecycle::{self, SandboxLifecycle};
use crate::sandbox::process::ProcessBackend;
use crate::sandbox::{
    instance_id_for, ExecRequest, RunKind, SandboxBackend, SandboxLimits, SandboxSpec,
};
use crate::workspace::layer::{LayerBudget, TurnLayer};
use crate::workspace::DataPaths;

/// Capability bits (linux/capability.h) the layer needs, with their names.
const CAP_DAC_OVERRIDE: (u32, &str) = (1, "CAP_DAC_OVERRIDE");
const CAP_SYS_ADMIN: (u32, &str) = (21, "CAP_SYS_ADMIN");

/// The fix named whenever the layer cannot be mounted.
const CAPS_FIX: &str = "run `mercury serve` as root, or grant it \
    AmbientCapabilities=CAP_SYS_ADMIN CAP_DAC_OVERRIDE with the same CapabilityBoundingSet= \
    (as deploy/mercury.service does; docs/operations.md says why each is needed)";

const NAMESPACE_FIX: &str = "this process runs in a mount namespace of its own, so dockerd \
    cannot see the overlay it mounts and every container gets an empty workspace; remove \
    ProtectSystem=, ReadWritePaths=, PrivateTmp=, ProtectHome=, PrivateDevices= and any other \
    setting that makes a mount namespace from the unit (deploy/mercury.service keeps none), or \
    use the bubblewrap backend (sandbox.backend: process)";

const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok(String),
    Warn(String),
    Fail(String),
}

/// One line of doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub what: &'static str,
    pub verdict: Verdict,
}

fn finding(what: &'static str, verdict: Verdict) -> Finding {
    Finding { what, verdict }
}

/// Which backend a turn would use, as `mercury serve` picks it.
enum Probe {
    /// A container on the local engine.
    Container(Arc<dyn SandboxLifecycle>),
    Bubblewrap(PathBuf),
    /// Neither answers: the layer alone is checked (tools are refused anyway).
    LayerOnly,
}

/// Runs the check; every finding is named `turn layer` or `sandbox view`.
pub async fn check(paths: &DataPaths, settings: &Settings) -> Vec<Finding> {
    let missing = missing_capabilities();
    if !missing.is_empty() {
        let (uid, _) = effective_ids();
        return vec![finding(
            "turn layer",
            Verdict::Fail(format!(
                "this process (uid {uid}) lacks {}, which mounting a turn's layer (a tmpfs and \
                 an overlay) needs: every tool turn would fail; {CAPS_FIX}",
                missing.join(" and ")
            )),
        )];
    }
    let probe = pick(settings).await;
    let scratch = paths.scratch();
    let name = format!("doctor-{:016x}", rand::random::<u64>());
    let token = format!("mercury-doctor-probe-{:016x}", rand::random::<u64>());
    let ws = scratch.join(format!("{name}-ws"));
    let mounted = {
        let (ws, scratch, name, token) = (ws.clone(), scratch.clone(), name.clone(), token.clone());
        tokio::task::spawn_blocking(move || mount_probe(&ws, &scratch, &name, &token)).await
    };
    let layer = match mounted {
        Ok(Ok(layer)) => layer,
        Ok(Err(why)) => {
            remove_probe(&ws);
            return vec![finding("turn layer", Verdict::Fail(why))];
        }
        Err(e) => {
            remove_probe(&ws);
            return vec![finding(
                "turn layer",
                Verdict::Fail(format!("the probe task failed: {e}")),
            )];
        }
    };
    let mut out = vec![finding(
        "turn layer",
        Verdict::Ok(format!(
            "a turn's tmpfs and overlay mount in {} and take writes",
            scratch.display()
        )),
    )];
    let view = sandbox_view(&probe, paths, settings, &layer, &name, &token).await;
    out.extend(view.map(|v| finding("sandbox view", v)));
    let _ = tokio::task::spawn_blocking(move || {
        layer.discard();
        remove_probe(&ws);
    })
    .await;
    out
}

async fn pick(settings: &Settings) -> Probe {
    let engines = match settings.sandbox.backend {
        SandboxChoice::Process => None,
        SandboxChoice::Auto | SandboxChoice::Docker => lifecycle::connect_local().await.ok(),
    };
    if let Some(e) = engines {
        return Probe::Container(e);
    }
    if settings.sandbox.backend == SandboxChoice::Docker {
        return Probe::LayerOnly;
    }
    let bwrap = match settings.sandbox.bwrap.as_str() {
        "" => ProcessBackend::find_bwrap(),
        p => Some(PathBuf::from(p)).filter(|p| p.is_file()),
    };
    bwrap.map_or(Probe::LayerOnly, Probe::Bubblewrap)
}

/// Makes the probe workspace and lays a layer over it; checks that the
/// merged view shows the workspace and takes a write.
fn mount_probe(ws: &Path, scratch: &Path, name: &str, token: &str) -> Result<TurnLayer, String> {
    let make = || -> std::io::Result<()> {
        std::fs::create_dir_all(ws)?;
        std::fs::write(ws.join("AGENTS.md"), token)
    };
    make().map_err(|e| {
        format!(
            "cannot make a probe workspace in {}: {e}; the scratch directory must be writable \
             by this user",
            scratch.display()
        )
    })?;
    let layer = TurnLayer::mount(
        ws,
        scratch,
        name,
        LayerBudget::Throwaway {
            quota_mb: 1,
            limits: Default::default(),
        },
    )
    .map_err(|e| format!("{e}; {CAPS_FIX}"))?;
    let merged = layer.merged();
    let seen = std::fs::read_to_string(merged.join("AGENTS.md")).unwrap_or_default();
    if seen != token {
        return Err(format!(
            "the overlay in {} does not show the workspace under it",
            merged.display()
        ));
    }
    std::fs::write(merged.join("written.txt"), token)
        .map_err(|e| format!("cannot write through the overlay: {e}"))?;
    Ok(layer)
}

/// Has the backend read the probe file through its own bind of the merged
/// view, and write one back.
async fn sandbox_view(
    probe: &Probe,
    paths: &DataPaths,
    settings: &Settings,
    layer: &TurnLayer,
    name: &str,
    token: &str,
) -> Option<Verdict> {
    let merged = layer.merged().to_path_buf();
    let (backend, label): (Arc<dyn SandboxBackend>, &str) = match probe {
        Probe::LayerOnly => return None,
        Probe::Container(engines) => {
            let tag = match crate::host::containers::agent_image(settings) {
                Ok(t) => t,
                Err(e) => return Some(Verdict::Warn(format!("no image to check with: {e:#}"))),
            };
            match engines.image_present(&tag).await {
                Ok(true) => {}
                _ => {
                    return Some(Verdict::Warn(format!(
                        "cannot check that a container sees a turn's layer: the image {tag} is \
                         absent (run `mercury image build`, then doctor again)"
                    )))
                }
            }
            (engines.serving(tag), "a container")
        }
        Probe::Bubblewrap(bwrap) => (
            Arc::new(ProcessBackend::bubblewrap(bwrap.clone(), None)),
            "a bubblewrap session",
        ),
    };
    let instance_id = instance_id_for(&paths.root).unwrap_or_else(|_| "doctor".into());
    let spec = SandboxSpec {
        instance_id,
        space_id: "doctor".into(),
        run_id: name.to_owned(),
        kind: RunKind::Ask,
        workspace: crate::sandbox::WorkspaceMount::HostPath(merged.clone()),
        api: None,
        ro_binds: Vec::new(),
        env: Vec::new(),
        limits: SandboxLimits::default(),
    };
    // As a turn does: on a root host the session runs as nobody, who must
    // own what it writes (the chown lands in the probe layer's upper).
    if let Err(e) = backend.prepare_workspace(&merged).await {
        return Some(Verdict::Fail(format!(
            "{label} cannot be given a turn's layer: {e}"
        )));
    }
    let session = match backend.start(spec).await {
        Ok(s) => s,
        Err(e) => {
            return Some(Verdict::Fail(format!(
                "{label} cannot start over a turn's layer: {e}"
            )))
        }
    };
    let out = session
        .exec(ExecRequest {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "cat AGENTS.md && echo seen > from-sandbox.txt".into(),
            ],
            stdin: None,
            timeout: EXEC_TIMEOUT,
            output_cap: 4096,
        })
        .await;
    let _ = session.close().await;
    let wrote = std::fs::read_to_string(merged.join("from-sandbox.txt")).unwrap_or_default();
    Some(match out {
        Ok(o) if o.stdout.trim() == token && wrote.trim() == "seen" => Verdict::Ok(format!(
            "{label} reads and writes a turn's workspace through its bind"
        )),
        Ok(o) if matches!(probe, Probe::Container(_)) => Verdict::Fail(format!(
            "a container sees an empty workspace where a turn's layer is mounted (it said: \
             {:?}); {NAMESPACE_FIX}",
            first_line(&o.stdout, &o.stderr)
        )),
        Ok(o) => Verdict::Fail(format!(
            "{label} does not see a turn's layer (it said: {:?})",
            first_line(&o.stdout, &o.stderr)
        )),
        Err(e) => Verdict::Fail(format!("{label} cannot run over a turn's layer: {e}")),
    })
}

fn first_line(stdout: &str, stderr: &str) -> String {
    let text = if stdout.trim().is_empty() {
        stderr
    } else {
        stdout
    };
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

fn remove_probe(ws: &Path) {
    if let Err(e) = std::fs::remove_dir_all(ws) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %ws.display(), error = %e, "cannot remove doctor's probe workspace");
        }
    }
}

/// The capabilities the layer needs that this process does not have in
/// its effective set (`/proc/self/status`, `CapEff`).
fn missing_capabilities() -> Vec<&'static str> {
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        });
    // Unreadable: let the mount itself say what is wrong.
    let Some(effective) = effective else {
        return Vec::new();
    };
    [CAP_SYS_ADMIN, CAP_DAC_OVERRIDE]
        .iter()
        .filter(|(bit, _)| effective & (1u64 << bit) == 0)
        .map(|(_, name)| *name)
        .collect()
}

fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid take no arguments and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}
