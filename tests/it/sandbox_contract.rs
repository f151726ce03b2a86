//! One sandbox contract, run against every isolating backend (docker on the
//! real engine, bubblewrap): what the agent's `shell` and `mrctl` may rely on
//! and what they can never do, whatever the backend.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::exec::CreateExecOptions;
use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::Docker;
use mercury::config::Settings;
use mercury::sandbox::{
    instance_id_for, ApiEndpoint, ExecRequest, Isolation, RunKind, SandboxBackend, SandboxError,
    SandboxLimits, SandboxSpec, WorkspaceMount,
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
    let instance_id = format!("contract-{}", uuid::Uuid::new_v4().simple());
    let limits = SandboxLimits {
        tmp_bytes: 1 << 20,
        ..SandboxLimits::default()
    };
    contract_with(backend, synced, instance_id, limits).await;
}

/// The contract with the spec's instance id and limits given (a warm
/// pool's, so its sessions come from the pool).
async fn contract_with(
    backend: Arc<dyn SandboxBackend>,
    synced: bool,
    instance_id: String,
    limits: SandboxLimits,
) -> String {
    let name = backend.name();
    assert!(backend.isolation().isolates(), "{name} must isolate");
    let dir = tempfile::tempdir().expect("dir");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    std::fs::write(ws.join("in.txt"), "from the host\n").expect("in.txt");
    std::fs::write(dir.path().join("outside.txt"), "OUTSIDE").expect("outside");
    backend.prepare_workspace(&ws).await.expect("prepare");
    let spec = SandboxSpec {
        instance_id,
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
        limits,
    };
    let session = backend.start(spec).await.expect("start");
    let id = session.id().to_owned();
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
    id
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

/// A docker backend keeping `warm` containers ready for the instance of
/// `dir` (a data dir that must outlive it), and the limits its pool's
/// containers have: a spec of that instance with those limits claims one.
async fn warm_backend(warm: usize, dir: &Path) -> (Arc<dyn SandboxBackend>, String, SandboxLimits) {
    let mut settings = Settings::default();
    settings.sandbox.warm = warm;
    settings.sandbox.tmp_mb = 1;
    let backend = mercury::host::containers::docker_backend(&settings, &DataPaths::new(dir))
        .await
        .expect("a Docker engine must answer (deploy/setup.sh starts one)");
    let instance = instance_id_for(dir).expect("instance id");
    let limits = mercury::host::containers::sandbox_limits(&settings);
    (backend, instance, limits)
}

/// Waits (not timed: filling runs in the background) for `n` idle pooled
/// containers.
async fn until_warm(backend: &dyn SandboxBackend, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while backend.warm_idle() < n {
        assert!(
            Instant::now() < deadline,
            "the pool never held {n} containers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn engine() -> Docker {
    Docker::connect_with_local_defaults()
        .expect("a Docker client")
        .negotiate_version()
        .await
        .expect("a Docker engine must answer")
}

/// The containers of `instance` as the engine lists them: id and labels.
async fn listed(docker: &Docker, instance: &str) -> Vec<(String, HashMap<String, String>)> {
    let label = format!("mercury.instance={instance}");
    let filters = HashMap::from([("label", vec![label.as_str()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .expect("list containers")
        .into_iter()
        .map(|c| (c.id.unwrap_or_default(), c.labels.unwrap_or_default()))
        .collect()
}

async fn gone(docker: &Docker, id: &str) -> bool {
    matches!(
        docker.inspect_container(id, None).await,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        })
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_backend_keeps_the_sandbox_contract_with_the_warm_pool_on() {
    let docker = engine().await;
    let dir = tempfile::tempdir().expect("dir");
    let (backend, instance, limits) = warm_backend(2, dir.path()).await;
    until_warm(backend.as_ref(), 2).await;
    let pooled: Vec<String> = listed(&docker, &instance)
        .await
        .into_iter()
        .filter(|(_, labels)| labels.get("mercury.kind").map(String::as_str) == Some("warm"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    let used = contract_with(backend.clone(), false, instance.clone(), limits).await;
    assert!(
        pooled.contains(&used),
        "the session did not come from the pool: {used}"
    );
    assert!(
        gone(&docker, &used).await,
        "a pooled container outlived its run"
    );
    backend.shutdown().await;
    assert_eq!(listed(&docker, &instance).await, Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_container_has_seen_nothing_before_its_claim_and_serves_one_run_only() {
    let docker = engine().await;
    let dir = tempfile::tempdir().expect("dir");
    let (backend, instance, limits) = warm_backend(1, dir.path()).await;
    until_warm(backend.as_ref(), 1).await;
    let idle = listed(&docker, &instance).await;
    assert_eq!(idle.len(), 1, "{idle:?}");
    let (first, labels) = idle[0].clone();
    // The pool's container carries this instance's label (the start-up
    // sweep finds it by that) and no space or run of any turn.
    assert_eq!(labels.get("mercury.instance"), Some(&instance));
    assert_eq!(labels.get("mercury.kind").map(String::as_str), Some("warm"));
    assert!(!labels.contains_key("mercury.space"), "{labels:?}");

    // Before its claim: paused, no run's variable, and its only two mounts
    // are empty slot directories.
    let info = docker
        .inspect_container(&first, None)
        .await
        .expect("inspect");
    assert_eq!(info.state.and_then(|s| s.paused), Some(true));
    let env = info.config.and_then(|c| c.env).unwrap_or_default();
    assert!(!env.iter().any(|v| v.starts_with("MERCURY_")), "{env:?}");
    let mounts = info.mounts.unwrap_or_default();
    let mut targets: Vec<_> = mounts
        .iter()
        .filter_map(|m| m.destination.clone())
        .collect();
    targets.sort();
    assert_eq!(targets, vec!["/run/mercury", "/work"], "{mounts:?}");
    for m in &mounts {
        let source = m.source.clone().expect("a bind's source");
        assert_eq!(m.propagation.as_deref(), Some("rslave"), "{m:?}");
        let entries = std::fs::read_dir(&source).expect("slot dir").count();
        assert_eq!(entries, 0, "{source} holds something before the claim");
    }
    // Nothing can run in it before the claim.
    let exec = docker
        .create_exec(
            &first,
            CreateExecOptions::<String> {
                cmd: Some(vec!["true".into()]),
                ..Default::default()
            },
        )
        .await;
    assert!(
        exec.is_err(),
        "an exec into an unclaimed container: {exec:?}"
    );

    // Run A claims it, with an API socket and a skill.
    let ws_a = dir.path().join("ws-a");
    std::fs::create_dir(&ws_a).expect("ws a");
    std::fs::write(ws_a.join("a.txt"), "of run a\n").expect("a.txt");
    let skill = dir.path().join("skill");
    std::fs::create_dir(&skill).expect("skill");
    std::fs::write(skill.join("SKILL.md"), "skill a\n").expect("SKILL.md");
    let socket = dir.path().join("api.sock");
    let _listener = tokio::net::UnixListener::bind(&socket).expect("socket");
    backend.prepare_workspace(&ws_a).await.expect("prepare a");
    let spec = |ws: &Path, token: &str| SandboxSpec {
        instance_id: instance.clone(),
        space_id: "contract".into(),
        run_id: format!("run-{}", uuid::Uuid::new_v4().simple()),
        kind: RunKind::Live,
        workspace: WorkspaceMount::HostPath(ws.to_owned()),
        api: None,
        ro_binds: Vec::new(),
        env: vec![("MERCURY_TOKEN".into(), token.into())],
        limits: limits.clone(),
    };
    let mut spec_a = spec(&ws_a, "token-of-a");
    spec_a.api = Some(ApiEndpoint::UnixSocket(socket.clone()));
    spec_a.ro_binds = vec![(skill.clone(), "/run/mercury/skills/tool-a".into())];
    let a = backend.start(spec_a).await.expect("start a");
    assert_eq!(a.id(), first, "run a did not get the pooled container");
    let out = a
        .exec(req(
            "cat /work/a.txt /run/mercury/skills/tool-a/SKILL.md; \
             test -S /run/mercury/api.sock && echo socket; echo \"$MERCURY_TOKEN\"; \
             grep ' /run/mercury/skills/tool-a ' /proc/mounts | sed 's/^[^ ]* [^ ]* [^ ]* \\([^,]*\\).*/\\1/'; \
             echo kept > /tmp/left-by-a; echo made > /work/made-by-a",
        ))
        .await
        .expect("exec a");
    assert_eq!(
        out.stdout, "of run a\nskill a\nsocket\ntoken-of-a\nro\n",
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws_a.join("made-by-a")).expect("written through"),
        "made\n"
    );
    a.close().await.expect("close a");
    assert!(gone(&docker, &first).await, "run a's container outlived it");
    for m in &mounts {
        let source = m.source.clone().expect("source");
        assert!(
            !std::path::Path::new(&source).exists(),
            "run a's slot {source} is still there"
        );
    }

    // Run B gets another container, which has seen nothing of run A.
    let ws_b = dir.path().join("ws-b");
    std::fs::create_dir(&ws_b).expect("ws b");
    std::fs::write(ws_b.join("b.txt"), "of run b\n").expect("b.txt");
    backend.prepare_workspace(&ws_b).await.expect("prepare b");
    until_warm(backend.as_ref(), 1).await;
    let b = backend
        .start(spec(&ws_b, "token-of-b"))
        .await
        .expect("start b");
    assert_ne!(b.id(), first, "a pooled container served a second run");
    let out = b
        .exec(req(
            "ls -A /work; echo --; ls -A /tmp; echo --; ls -A /run/mercury; echo --; env | grep MERCURY_",
        ))
        .await
        .expect("exec b");
    assert_eq!(
        out.stdout, "b.txt\n--\n--\n--\nMERCURY_TOKEN=token-of-b\n",
        "{out:?}"
    );
    b.close().await.expect("close b");
    backend.shutdown().await;
    assert_eq!(listed(&docker, &instance).await, Vec::new());
}
