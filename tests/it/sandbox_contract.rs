//! One sandbox contract, run against every isolating backend (docker on the
//! real engine, bubblewrap): what the agent's `shell` and `mrctl` may rely on
//! and what they can never do, whatever the backend.

use std::sync::Arc;
use std::time::Duration;

use mercury::config::Settings;
use mercury::sandbox::{
    ExecRequest, Isolation, RunKind, SandboxBackend, SandboxError, SandboxLimits, SandboxSpec,
    WorkspaceMount,
};
use mercury::workspace::DataPaths;

fn req(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        stdin: None,
        timeout: Duration::from_secs(30),
        output_cap: 64 * 1024,
    }
}

async fn contract(backend: Arc<dyn SandboxBackend>) {
    contract_on(backend, false).await;
}

/// `synced`: the workspace is copied in and back rather than bound (as on
/// an engine elsewhere); the contract is the same.
async fn contract_on(backend: Arc<dyn SandboxBackend>, synced: bool) {
    let name = backend.name();
    assert!(backend.isolation().isolates(), "{name} must isolate");
    let dir = tempfile::tempdir().expect("dir");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    std::fs::write(ws.join("in.txt"), "from the host\n").expect("in.txt");
    std::fs::write(dir.path().join("outside.txt"), "OUTSIDE").expect("outside");
    backend.prepare_workspace(&ws).await.expect("prepare");
    let spec = SandboxSpec {
        instance_id: format!("contract-{}", uuid::Uuid::new_v4().simple()),
        space_id: "contract".into(),
        run_id: format!("run-{}", uuid::Uuid::new_v4().simple()),
        kind: RunKind::Live,
        workspace: if synced {
            WorkspaceMount::Synced(ws.clone())
        } else {
            WorkspaceMount::HostPath(ws.clone())
        },
        api: None,
        ro_binds: Vec::new(),
        env: vec![("MERCURY_SPACE".into(), "contract".into())],
        limits: SandboxLimits {
            tmp_bytes: 1 << 20,
            ..SandboxLimits::default()
        },
    };
    let session = backend.start(spec).await.expect("start");
    assert!(!session.proof().await.expect("proof").is_empty(), "{name}");
    assert_eq!(session.workdir(), "/work", "{name}");

    // Exit codes and both streams.
    let out = session
        .exec(req("echo out; echo err >&2; exit 3"))
        .await
        .expect("exec");
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
        (3, "out\n", "err\n"),
        "{name}"
    );
    // The workspace is the working directory, both ways.
    let out = session
        .exec(req("pwd; cat in.txt; echo made > made.txt"))
        .await
        .expect("exec");
    assert_eq!(out.stdout, "/work\nfrom the host\n", "{name}");
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).expect("made"),
        "made\n",
        "{name}"
    );
    // Nothing outside the workspace, by any path.
    let outside = dir.path().join("outside.txt");
    let out = session
        .exec(req(&format!(
            "cat {} ../outside.txt /work/../outside.txt 2>&1; echo done",
            outside.display()
        )))
        .await
        .expect("exec");
    assert!(!out.stdout.contains("OUTSIDE"), "{name}: {out:?}");
    // The environment is the spec's, with PATH and HOME; no host variable.
    let out = session.exec(req("env")).await.expect("env");
    assert!(
        out.stdout.contains("MERCURY_SPACE=contract\n"),
        "{name}: {out:?}"
    );
    for host_var in ["CARGO", "RUST", "USER=", "SSH_", "MERCURY_OPENAI"] {
        assert!(
            !out.stdout.contains(host_var),
            "{name} leaks {host_var}: {out:?}"
        );
    }
    // stdin is written, then closed.
    let mut r = req("cat | wc -c");
    r.stdin = Some(vec![b'x'; 100_000]);
    let out = session.exec(r).await.expect("stdin");
    assert_eq!(out.stdout.trim(), "100000", "{name}");
    // Output is capped and says so.
    let mut r = req("head -c 100000 /dev/zero");
    r.output_cap = 10;
    let out = session.exec(r).await.expect("cap");
    assert!(out.truncated && out.stdout.len() == 10, "{name}: {out:?}");
    // /tmp is sized.
    let out = session
        .exec(req("dd if=/dev/zero of=/tmp/big bs=1M count=4 2>&1"))
        .await
        .expect("dd");
    assert!(
        out.stdout.contains("No space left") || out.exit_code != 0,
        "{name}: {out:?}"
    );
    // No network: only a loopback device exists.
    let out = session
        .exec(req("sed -n '3,$p' /proc/net/dev | sed 's/:.*//; s/ //g'"))
        .await
        .expect("net");
    assert_eq!(out.stdout.trim(), "lo", "{name}: {out:?}");
    // A command past its timeout is killed, and nothing of it lives on.
    let mut r = req("(sleep 3; touch late.txt) & sleep 60");
    r.timeout = Duration::from_millis(500);
    assert!(
        matches!(session.exec(r).await, Err(SandboxError::Timeout(_))),
        "{name}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !ws.join("late.txt").exists(),
        "{name}: a process outlived its timeout"
    );
    // Close is final and idempotent.
    session.close().await.expect("close");
    session.close().await.expect("close twice");
    assert!(session.exec(req("true")).await.is_err(), "{name}");
}

async fn docker_backend() -> Arc<dyn SandboxBackend> {
    let dir = tempfile::tempdir().expect("dir");
    let backend = mercury::host::containers::docker_backend(
        &Settings::default(),
        &DataPaths::new(dir.path()),
    )
    .await
    .expect("a Docker engine must answer (deploy/setup.sh starts one)");
    assert_eq!(backend.isolation(), Isolation::Container);
    backend
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_backend_keeps_the_sandbox_contract() {
    contract(docker_backend().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_backend_keeps_the_sandbox_contract_with_a_synced_workspace() {
    contract_on(docker_backend().await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bubblewrap_backend_keeps_the_sandbox_contract() {
    let bwrap = mercury::sandbox::process::ProcessBackend::find_bwrap()
        .expect("bubblewrap must be installed (deploy/setup.sh installs it)");
    let backend = mercury::sandbox::process::ProcessBackend::bubblewrap(bwrap, None);
    assert_eq!(backend.isolation(), Isolation::Namespaces);
    contract(Arc::new(backend)).await;
}
