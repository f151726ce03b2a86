//! Tests of the backend against a real Docker engine: start, exec, the
//! container as the engine reports it, proof, close, timeouts, deaths and the
//! sweep. Each test owns its instance id and workspace and removes its
//! containers even when it fails.
//!
//! Must never: touch a container outside its own instance (bar the ones it
//! made itself and tracks), or pass without an engine answering.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{ListContainersOptionsBuilder, StartContainerOptions};
use bollard::Docker;
use futures_util::FutureExt;

use super::shape::KEEPALIVE_CMD;
use super::{remove_container, sweep_orphans, DockerBackend, NOBODY};
use crate::sandbox::effective_ids;
use crate::sandbox::image::{agent_image_tag, ensure_agent_image};
use crate::sandbox::{
    ApiEndpoint, ExecRequest, RunKind, SandboxBackend, SandboxError, SandboxLimits, SandboxSession,
    SandboxSpec, WorkspaceMount, LABEL_INSTANCE, LABEL_KIND, LABEL_RUN, LABEL_SPACE,
};

const MIB: i64 = 1 << 20;

/// A real dynamically linked host binary in the mrctl slot: proves the
/// image carries a working loader and libc (the debug-build case).
fn stand_in_mrctl() -> PathBuf {
    std::fs::canonicalize("/usr/bin/true").expect("coreutils true exists on the test host")
}

fn random_hex() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos(),
    );
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

async fn engine() -> Docker {
    Docker::connect_with_local_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("a Docker engine must answer for these tests")
}

/// One test's world: its own instance id (so tests run in parallel and
/// never see each other's containers) and its own workspace.
#[derive(Clone)]
struct Fixture {
    docker: Docker,
    backend: DockerBackend,
    instance: String,
    workspace: Arc<tempfile::TempDir>,
    /// Containers made outside this instance's label (sweep tests); they
    /// are removed with the rest at the end.
    extra: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Fixture {
    async fn new() -> Self {
        let docker = engine().await;
        let tag = agent_image_tag("test", &stand_in_mrctl()).expect("tag");
        let image = ensure_agent_image(&docker, &tag, &stand_in_mrctl())
            .await
            .expect("agent image");
        Self {
            backend: DockerBackend::with_client(docker.clone(), image),
            docker,
            instance: random_hex(),
            workspace: Arc::new(tempfile::tempdir().expect("workspace")),
            extra: Arc::default(),
        }
    }

    fn spec(&self, run: &str) -> SandboxSpec {
        SandboxSpec {
            instance_id: self.instance.clone(),
            space_id: "space-1".into(),
            run_id: run.into(),
            kind: RunKind::Task,
            workspace: WorkspaceMount::HostPath(self.workspace.path().to_path_buf()),
            api: None,
            ro_binds: Vec::new(),
            env: vec![
                ("MERCURY_RUN_TOKEN".into(), "tok-123".into()),
                ("MERCURY_SPACE".into(), "space-1".into()),
            ],
            limits: SandboxLimits {
                memory_bytes: 128 * MIB,
                nano_cpus: 500_000_000,
                pids: 64,
                tmp_bytes: 8 * MIB,
                ..SandboxLimits::default()
            },
        }
    }

    async fn ours(&self) -> Vec<String> {
        let filter = format!("{LABEL_INSTANCE}={}", self.instance);
        let filters = HashMap::from([("label", vec![filter.as_str()])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        self.docker
            .list_containers(Some(options))
            .await
            .expect("list")
            .into_iter()
            .filter_map(|c| c.id)
            .collect()
    }

    fn track(&self, id: &str) {
        self.extra.lock().expect("extra ids").push(id.to_string());
    }

    async fn remove_all(&self) {
        let extra = self.extra.lock().expect("extra ids").clone();
        for id in self.ours().await.into_iter().chain(extra) {
            let _ = remove_container(&self.docker, &id).await;
        }
    }

    /// Runs `body`, then removes every container of this instance even
    /// when `body` panicked, then re-raises the panic.
    async fn run<F, Fut>(self, body: F)
    where
        F: FnOnce(Fixture) -> Fut,
        Fut: Future<Output = ()>,
    {
        let outcome = AssertUnwindSafe(body(self.clone())).catch_unwind().await;
        self.remove_all().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

fn req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(std::string::ToString::to_string).collect(),
        stdin: None,
        timeout: Duration::from_secs(30),
        output_cap: 64 * 1024,
    }
}

#[tokio::test]
async fn connect_with_local_defaults_answers_ping() {
    let backend = DockerBackend::connect("unused".into())
        .await
        .expect("engine");
    backend.ping().await.expect("ping");
    assert_eq!(backend.name(), "docker");
}

#[tokio::test]
async fn start_refuses_an_empty_instance_id() {
    let fx = Fixture::new().await;
    fx.clone()
        .run(|fx| async move {
            let mut spec = fx.spec("r-empty");
            spec.instance_id = String::new();
            let err = fx.backend.start(spec).await.err().expect("must refuse");
            assert!(err.to_string().contains("instance id"), "{err}");
        })
        .await;
}

#[tokio::test]
async fn echo_stderr_and_exit_code_come_back() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-echo")).await.expect("start");
            assert_eq!(session.workdir(), "/work");
            let out = session
                .exec(req(&["echo", "hello", "world"]))
                .await
                .expect("exec");
            assert_eq!(out.exit_code, 0);
            assert_eq!(out.stdout, "hello world\n");
            assert_eq!(out.stderr, "");
            assert!(!out.truncated);

            let out = session
                .exec(req(&["sh", "-c", "echo oops >&2; pwd; exit 3"]))
                .await
                .expect("exec");
            assert_eq!(out.exit_code, 3);
            assert_eq!(out.stdout, "/work\n");
            assert_eq!(out.stderr, "oops\n");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_missing_command_is_an_exit_code_not_an_error() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-missing")).await.expect("start");
            let out = session
                .exec(req(&["no-such-command-anywhere"]))
                .await
                .expect("an outcome, not an error");
            assert!(matches!(out.exit_code, 126 | 127), "{out:?}");
            // The session is still usable.
            assert_eq!(
                session.exec(req(&["true"])).await.expect("true").exit_code,
                0
            );
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn stdin_is_written_then_closed() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-stdin")).await.expect("start");
            let mut request = req(&["cat"]);
            request.stdin = Some(b"line one\nline two\n".to_vec());
            let out = session.exec(request).await.expect("cat");
            assert_eq!(out.stdout, "line one\nline two\n");
            assert_eq!(out.exit_code, 0);

            // More than any pipe buffer: needs writing and reading at once.
            let mut request = req(&["wc", "-c"]);
            request.stdin = Some(vec![b'x'; 3 << 20]);
            let out = session.exec(request).await.expect("wc");
            assert_eq!(out.stdout.trim(), (3u64 << 20).to_string());
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_file_written_inside_appears_in_the_host_workspace() {
    Fixture::new()
        .await
        .run(|fx| async move {
            std::fs::write(fx.workspace.path().join("from-host.txt"), "host says hi")
                .expect("seed");
            let session = fx.backend.start(fx.spec("r-files")).await.expect("start");
            let out = session
                .exec(req(&[
                    "sh",
                    "-c",
                    "cat from-host.txt && mkdir -p sub && echo written > sub/out.txt",
                ]))
                .await
                .expect("exec");
            assert_eq!(out.exit_code, 0, "{}", out.stderr);
            assert_eq!(out.stdout, "host says hi");
            let host = std::fs::read_to_string(fx.workspace.path().join("sub/out.txt"))
                .expect("file on host");
            assert_eq!(host, "written\n");

            // The root filesystem is read-only; /tmp is a writable tmpfs.
            let out = session
                .exec(req(&[
                    "sh",
                    "-c",
                    "touch /etc/x; echo $?; touch /tmp/x && echo tmp-ok",
                ]))
                .await
                .expect("exec");
            assert!(out.stdout.starts_with('1'), "{out:?}");
            assert!(out.stdout.contains("tmp-ok"), "{out:?}");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn output_beyond_the_cap_is_dropped_and_flagged() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-cap")).await.expect("start");
            let mut request = req(&["sh", "-c", "head -c 200000 /bin/sh | base64; echo done >&2"]);
            request.output_cap = 1000;
            let out = session.exec(request).await.expect("exec");
            assert_eq!(out.exit_code, 0);
            assert_eq!(out.stdout.len(), 1000);
            assert!(out.truncated);
            assert_eq!(out.stderr, "done\n");

            let mut request = req(&["echo", "short"]);
            request.output_cap = 1000;
            assert!(!session.exec(request).await.expect("exec").truncated);
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_timeout_kills_the_container_and_close_leaves_none() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-timeout")).await.expect("start");
            let mut request = req(&["sleep", "30"]);
            request.timeout = Duration::from_millis(1500);
            let started = std::time::Instant::now();
            let err = session.exec(request).await.expect_err("must time out");
            assert!(matches!(err, SandboxError::Timeout(_)), "{err:?}");
            assert!(started.elapsed() < Duration::from_secs(20));

            let info = fx
                .docker
                .inspect_container(session.id(), None)
                .await
                .expect("inspect");
            assert_ne!(info.state.and_then(|s| s.running), Some(true));
            let err = session
                .exec(req(&["true"]))
                .await
                .expect_err("container is dead");
            assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");

            session.close().await.expect("close");
            assert!(fx.ours().await.is_empty(), "container left behind");
            session.close().await.expect("close twice");
        })
        .await;
}

#[tokio::test]
async fn a_container_killed_from_outside_makes_exec_gone() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-killed")).await.expect("start");
            session.exec(req(&["true"])).await.expect("alive");
            fx.docker
                .kill_container(
                    session.id(),
                    None::<bollard::query_parameters::KillContainerOptions>,
                )
                .await
                .expect("kill");
            let err = session.exec(req(&["echo", "hi"])).await.expect_err("gone");
            assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");

            // Removed from outside: still Gone, and close is still Ok.
            remove_container(&fx.docker, session.id())
                .await
                .expect("remove");
            let err = session.exec(req(&["echo", "hi"])).await.expect_err("gone");
            assert!(matches!(err, SandboxError::Gone(_)), "{err:?}");
            session.close().await.expect("close after removal");
        })
        .await;
}

/// Two removers of one container (a spawned server's handle dropped as the
/// turn closes its servers, then the session's `close`): the second is told
/// "removal already in progress", and must still return only once the
/// container is gone, or a turn ends with its container still listed.
#[tokio::test]
async fn a_second_remover_returns_only_once_the_container_is_gone() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx
                .backend
                .start(fx.spec("r-two-removers"))
                .await
                .expect("start");
            session.exec(req(&["true"])).await.expect("alive");
            let id = session.id().to_owned();
            let first = {
                let (docker, id) = (fx.docker.clone(), id.clone());
                tokio::spawn(async move { remove_container(&docker, &id).await })
            };
            // Let the first request reach the engine before the second.
            tokio::time::sleep(Duration::from_millis(5)).await;
            remove_container(&fx.docker, &id)
                .await
                .expect("second remove");
            let still = fx.docker.inspect_container(&id, None).await;
            assert!(
                still.is_err(),
                "the container was still there when the second remover returned: {:?}",
                still.map(|c| c.state)
            );
            first.await.expect("first remover").expect("first remove");
        })
        .await;
}

#[tokio::test]
async fn a_command_killed_by_a_signal_in_a_live_container_is_an_exit_code() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx
                .backend
                .start(fx.spec("r-self-kill"))
                .await
                .expect("start");
            let out = session
                .exec(req(&["sh", "-c", "kill -9 $$"]))
                .await
                .expect("an outcome: the container is alive");
            assert_eq!(out.exit_code, 137, "{out:?}");
            assert_eq!(
                session
                    .exec(req(&["true"]))
                    .await
                    .expect("still usable")
                    .exit_code,
                0
            );
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_container_killed_while_its_exec_runs_makes_that_exec_gone() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx
                .backend
                .start(fx.spec("r-killed-mid"))
                .await
                .expect("start");
            let session: Arc<dyn SandboxSession> = Arc::from(session);
            let running = tokio::spawn({
                let session = session.clone();
                async move {
                    session
                        .exec(req(&["sh", "-c", "touch started; sleep 600"]))
                        .await
                }
            });
            let marker = fx.workspace.path().join("started");
            for _ in 0..600 {
                if marker.exists() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(marker.exists(), "the exec never started");
            fx.docker
                .kill_container(
                    session.id(),
                    None::<bollard::query_parameters::KillContainerOptions>,
                )
                .await
                .expect("kill");
            let result = tokio::time::timeout(Duration::from_secs(60), running)
                .await
                .expect("the exec ends with its container")
                .expect("exec task");
            // Not "exit code 137" from a live sandbox: the sandbox died.
            assert!(matches!(result, Err(SandboxError::Gone(_))), "{result:?}");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn inspect_shows_labels_limits_lockdown_user_and_exact_mounts() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let sock_dir = tempfile::tempdir().expect("socket dir");
            let sock = sock_dir.path().join("api.sock");
            let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind socket");
            let mut spec = fx.spec("r-inspect");
            spec.api = Some(ApiEndpoint::UnixSocket(sock.clone()));
            spec.kind = RunKind::Ask;
            let session = fx.backend.start(spec).await.expect("start");
            let info = fx
                .docker
                .inspect_container(session.id(), None)
                .await
                .expect("inspect");

            assert_eq!(
                info.name.as_deref(),
                Some(format!("/mercury-{}-r-inspect", &fx.instance[..8]).as_str())
            );
            let config = info.config.expect("config");
            let labels = config.labels.expect("labels");
            assert_eq!(labels[LABEL_INSTANCE], fx.instance);
            assert_eq!(labels[LABEL_SPACE], "space-1");
            assert_eq!(labels[LABEL_RUN], "r-inspect");
            assert_eq!(labels[LABEL_KIND], "ask");
            assert_eq!(
                config.cmd,
                Some(vec!["/bin/sleep".to_string(), "infinity".to_string()])
            );
            let user = config.user.expect("user");
            assert!(!user.is_empty() && user != "0" && !user.starts_with("0:") && user != "root");
            if effective_ids().0 == 0 {
                assert_eq!(user, "65534:65534");
            }
            assert_eq!(config.working_dir.as_deref(), Some("/work"));

            let host = info.host_config.expect("host config");
            assert_eq!(host.network_mode.as_deref(), Some("none"));
            assert_eq!(host.readonly_rootfs, Some(true));
            assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
            assert_eq!(
                host.security_opt,
                Some(vec!["no-new-privileges".to_string()])
            );
            assert_eq!(host.memory, Some(128 * MIB));
            assert_eq!(host.memory_swap, Some(128 * MIB));
            assert_eq!(host.nano_cpus, Some(500_000_000));
            assert_eq!(host.pids_limit, Some(64));
            assert_eq!(host.auto_remove, Some(false));
            let tmpfs = host.tmpfs.expect("tmpfs");
            assert!(
                tmpfs["/tmp"].contains(&format!("size={}", 8 * MIB)),
                "{tmpfs:?}"
            );

            let mut mounts: Vec<(String, String)> = info
                .mounts
                .expect("mounts")
                .into_iter()
                .map(|m| {
                    (
                        m.destination.unwrap_or_default(),
                        m.source.unwrap_or_default(),
                    )
                })
                .collect();
            mounts.sort();
            let workspace = std::fs::canonicalize(fx.workspace.path()).expect("canonical");
            // The socket is the session's relay, never the host's own path.
            assert_eq!(mounts.len(), 2, "{mounts:?}");
            assert_eq!(mounts[0].0, "/run/mercury/api.sock");
            let relay = std::path::Path::new(&mounts[0].1);
            assert!(
                relay.ends_with("api.sock")
                    && relay
                        .parent()
                        .and_then(|p| p.file_name())
                        .is_some_and(|n| n.to_string_lossy().starts_with("mercury-sock-"))
                    && !relay.starts_with(sock_dir.path()),
                "{mounts:?}"
            );
            assert_eq!(
                mounts[1],
                ("/work".to_string(), workspace.display().to_string())
            );
            let out = session
                .exec(req(&["sh", "-c", "test -S /run/mercury/api.sock && id -u"]))
                .await
                .expect("exec");
            assert_eq!(out.exit_code, 0, "{out:?}");
            assert_ne!(out.stdout.trim(), "0");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn environment_is_only_the_spec_env_plus_engine_defaults() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-env")).await.expect("start");
            let info = fx
                .docker
                .inspect_container(session.id(), None)
                .await
                .expect("inspect");
            let mut config_env = info.config.and_then(|c| c.env).unwrap_or_default();
            // The engine adds a default PATH to images that set none.
            config_env.retain(|kv| !kv.starts_with("PATH="));
            config_env.sort();
            assert_eq!(
                config_env,
                vec![
                    "MERCURY_RUN_TOKEN=tok-123".to_string(),
                    "MERCURY_SPACE=space-1".to_string()
                ]
            );

            let out = session.exec(req(&["env"])).await.expect("env");
            let mut keys: Vec<&str> = out
                .stdout
                .lines()
                .filter_map(|l| l.split_once('=').map(|(k, _)| k))
                .collect();
            keys.sort();
            // PATH and HOSTNAME come from the engine, HOME from the
            // runtime (nobody's home); nothing from this host.
            let allowed = [
                "HOME",
                "HOSTNAME",
                "MERCURY_RUN_TOKEN",
                "MERCURY_SPACE",
                "PATH",
            ];
            assert!(
                keys.iter().all(|k| allowed.contains(k)),
                "unexpected env: {keys:?}"
            );
            assert!(out.stdout.contains("MERCURY_RUN_TOKEN=tok-123\n"));
            assert!(
                !out.stdout.contains("CARGO"),
                "host env leaked: {}",
                out.stdout
            );
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn proof_is_the_hostname_and_a_prefix_of_the_container_id() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-proof")).await.expect("start");
            let proof = session.proof().await.expect("proof");
            assert_eq!(proof.len(), 12, "{proof}");
            assert!(
                session.id().starts_with(&proof),
                "{proof} vs {}",
                session.id()
            );
            let info = fx
                .docker
                .inspect_container(session.id(), None)
                .await
                .expect("inspect");
            assert_eq!(info.config.and_then(|c| c.hostname), Some(proof));
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_dynamic_mrctl_runs_inside_the_image() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-mrctl")).await.expect("start");
            let out = session
                .exec(req(&["mrctl", "--version"]))
                .await
                .expect("exec");
            assert_eq!(out.exit_code, 0, "{out:?}");
            assert!(out.stdout.contains("coreutils"), "{out:?}");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn a_root_host_hands_the_workspace_to_nobody() {
    if effective_ids().0 != 0 {
        return; // Non-root hosts run the container as themselves; nothing to chown.
    }
    Fixture::new()
        .await
        .run(|fx| async move {
            let nested = fx.workspace.path().join("a/b");
            std::fs::create_dir_all(&nested).expect("mkdir");
            std::fs::write(nested.join("f"), "x").expect("write");
            std::os::unix::fs::symlink("/etc/hostname", fx.workspace.path().join("link"))
                .expect("symlink");
            let session = fx.backend.start(fx.spec("r-chown")).await.expect("start");
            for path in [
                fx.workspace.path().to_path_buf(),
                nested.clone(),
                nested.join("f"),
            ] {
                let meta = std::fs::symlink_metadata(&path).expect("meta");
                assert_eq!(
                    (meta.uid(), meta.gid()),
                    (NOBODY, NOBODY),
                    "{}",
                    path.display()
                );
            }
            let link = std::fs::symlink_metadata(fx.workspace.path().join("link")).expect("link");
            assert_eq!(link.uid(), NOBODY);
            // The link's target on the host was not handed over.
            assert_eq!(std::fs::metadata("/etc/hostname").expect("target").uid(), 0);
            let out = session
                .exec(req(&["sh", "-c", "echo ok > a/b/f && cat a/b/f"]))
                .await
                .expect("exec");
            assert_eq!(out.stdout, "ok\n", "{out:?}");
            session.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn starting_the_same_run_again_replaces_its_leftover() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let first = fx.backend.start(fx.spec("r-again")).await.expect("first");
            let first_id = first.id().to_string();
            std::mem::forget(first); // a crash: no close, no drop
            let second = fx.backend.start(fx.spec("r-again")).await.expect("second");
            assert_ne!(second.id(), first_id);
            assert_eq!(fx.ours().await, vec![second.id().to_string()]);
            second.close().await.expect("close");
        })
        .await;
}

/// A bare container from the agent image, outside any session.
async fn bare_container(docker: &Docker, image: &str, labels: HashMap<String, String>) -> String {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(
            KEEPALIVE_CMD
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
        ),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            body,
        )
        .await
        .expect("create")
        .id;
    docker
        .start_container(&id, None::<StartContainerOptions>)
        .await
        .expect("start");
    id
}

#[tokio::test]
async fn sweep_removes_only_this_instances_dead_runs() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let foreign = bare_container(
                &fx.docker,
                fx.backend.image(),
                HashMap::from([
                    (LABEL_INSTANCE.to_string(), random_hex()),
                    (LABEL_RUN.to_string(), "r-dead".to_string()),
                ]),
            )
            .await;
            fx.track(&foreign);
            let unlabelled = bare_container(&fx.docker, fx.backend.image(), HashMap::new()).await;
            fx.track(&unlabelled);

            let dead = fx.backend.start(fx.spec("r-dead")).await.expect("dead run");
            let live = fx.backend.start(fx.spec("r-live")).await.expect("live run");
            let dead_id = dead.id().to_string();
            std::mem::forget(dead); // as after a crash: no close, no drop

            let live_runs = HashSet::from(["r-live".to_string()]);
            let removed = sweep_orphans(&fx.docker, &fx.instance, || live_runs.clone())
                .await
                .expect("sweep");
            assert_eq!(removed, vec![dead_id]);
            assert_eq!(fx.ours().await, vec![live.id().to_string()]);
            for id in [&foreign, &unlabelled] {
                let info = fx
                    .docker
                    .inspect_container(id, None)
                    .await
                    .expect("untouched");
                assert_eq!(info.state.and_then(|s| s.running), Some(true));
            }
            // Nothing left to sweep the second time.
            assert!(
                sweep_orphans(&fx.docker, &fx.instance, || live_runs.clone())
                    .await
                    .expect("sweep again")
                    .is_empty()
            );
            live.close().await.expect("close");
        })
        .await;
}

#[tokio::test]
async fn sweep_without_an_instance_id_is_refused() {
    let docker = engine().await;
    for empty in ["", "   "] {
        let err = sweep_orphans(&docker, empty, HashSet::new)
            .await
            .expect_err("must refuse");
        assert!(err.to_string().contains("instance id"), "{err}");
    }
}

/// An extension's stdio server: its own container beside the run's, same
/// workspace, labels and no network, speaking over attached pipes, removed
/// with its handle and at close.
#[tokio::test]
async fn a_spawned_process_runs_in_its_own_container_and_speaks_over_its_pipes() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    Fixture::new()
        .await
        .run(|fx| async move {
            std::fs::write(fx.workspace.path().join("seen.txt"), "shared workspace\n").unwrap();
            let session = fx.backend.start(fx.spec("r-spawn")).await.expect("start");
            let process = session
                .spawn(crate::sandbox::SpawnRequest {
                    argv: vec!["sh".into(), "-c".into(), "cat /work/seen.txt; cat".into()],
                    ro_mounts: Vec::new(),
                    image: None,
                })
                .await
                .expect("spawn");
            let crate::sandbox::SpawnedProcess {
                mut stdin,
                stdout,
                handle,
            } = process;
            let mut lines = BufReader::new(stdout).lines();
            assert_eq!(
                lines.next_line().await.unwrap().as_deref(),
                Some("shared workspace")
            );
            stdin.write_all(b"ping 1\n").await.unwrap();
            stdin.flush().await.unwrap();
            assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ping 1"));
            // Two containers of this run now: the run's and the process's.
            let ours = fx.ours().await;
            assert_eq!(ours.len(), 2, "{ours:?}");
            let mut spawned = None;
            for id in &ours {
                let info = fx.docker.inspect_container(id, None).await.unwrap();
                let labels = info.config.unwrap().labels.unwrap();
                assert_eq!(labels[LABEL_RUN], "r-spawn");
                assert_eq!(
                    info.host_config.unwrap().network_mode.as_deref(),
                    Some("none")
                );
                if labels.contains_key(super::spawn::LABEL_SPAWNED) {
                    spawned = Some(id.clone());
                }
            }
            let spawned = spawned.expect("one container is the spawned process's");
            // Dropping the handle removes the process's container.
            drop(handle);
            for _ in 0..100 {
                if !fx.ours().await.contains(&spawned) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(!fx.ours().await.contains(&spawned));

            // A second one is left running: close removes it with the run's.
            let _kept = session
                .spawn(crate::sandbox::SpawnRequest {
                    argv: vec!["cat".into()],
                    ro_mounts: Vec::new(),
                    image: None,
                })
                .await
                .expect("spawn");
            assert_eq!(fx.ours().await.len(), 2);
            session.close().await.expect("close");
            assert!(
                fx.ours().await.is_empty(),
                "close left {:?}",
                fx.ours().await
            );
        })
        .await;
}

#[tokio::test]
async fn a_spawn_from_an_absent_image_is_refused_with_a_sentence_and_nothing_pulled() {
    Fixture::new()
        .await
        .run(|fx| async move {
            let session = fx.backend.start(fx.spec("r-noimage")).await.expect("start");
            let err = session
                .spawn(crate::sandbox::SpawnRequest {
                    argv: vec!["/bin/true".into()],
                    ro_mounts: Vec::new(),
                    image: Some("mercury-ext-absent:never-built".into()),
                })
                .await
                .expect_err("refused");
            let text = err.to_string();
            assert!(text.contains("mercury-ext-absent:never-built"), "{text}");
            assert!(text.contains("mercury ext image"), "{text}");
            assert_eq!(fx.ours().await.len(), 1, "only the run's container");
            session.close().await.expect("close");
        })
        .await;
}
