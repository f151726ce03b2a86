//! Docker-sandboxed turns through a real host (`sandbox.backend: docker`),
//! checked from the outside: the engine's own view of the containers (list,
//! inspect, events, exec), the workspace on disk, the `runs` table and the
//! HTTP API. Every test needs a Docker engine and fails without one.
//!
//! Each test removes whatever it leaves behind, also when it fails: see
//! [`Leftovers`].

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerSummary, ContainerSummaryStateEnum, HostConfig,
};
use bollard::query_parameters::{
    CreateContainerOptions, EventsOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{prepare, HostOptions, TestHost};
use mercury::sandbox::instance_id_for;

const LABEL_INSTANCE: &str = "mercury.instance";

/// The engine the host uses. No engine is a failure, never a skip.
async fn engine() -> Docker {
    let docker = Docker::connect_with_local_defaults().expect("a Docker client");
    docker
        .negotiate_version()
        .await
        .expect("no Docker engine answers: these tests need one (deploy/setup.sh starts dockerd)")
}

fn docker_host(model: Value, config: Vec<(&'static str, Yaml)>) -> HostOptions {
    HostOptions {
        model,
        sandbox: "docker",
        config,
        ..Default::default()
    }
}

fn instance_of(host: &TestHost) -> String {
    instance_id_for(&host.data).expect("instance id of the host's data dir")
}

/// Every container (running or not) labelled with `instance`.
async fn containers(docker: &Docker, instance: &str) -> Vec<ContainerSummary> {
    let label = format!("{LABEL_INSTANCE}={instance}");
    let filters = HashMap::from([("label", vec![label.as_str()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .expect("list containers")
}

/// Polls `probe` every 100 ms until it yields a value, failing after `secs`.
async fn until<T>(what: &str, secs: u64, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The one running container of `instance` (the turn's sandbox).
async fn running_container(docker: &Docker, instance: &str) -> ContainerSummary {
    until("the turn's running container", 120, async || {
        containers(docker, instance)
            .await
            .into_iter()
            .find(|c| c.state == Some(ContainerSummaryStateEnum::RUNNING))
    })
    .await
}

async fn exists(docker: &Docker, id: &str) -> bool {
    match docker.inspect_container(id, None).await {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(e) => panic!("inspecting {id}: {e}"),
    }
}

/// Runs `argv` in a running container through the engine; returns stdout.
async fn exec_stdout(docker: &Docker, id: &str, argv: &[&str]) -> String {
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(argv.iter().map(std::string::ToString::to_string).collect()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create exec")
        .id;
    let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec, None).await.expect("start exec")
    else {
        panic!("exec started detached");
    };
    let mut out = String::new();
    while let Some(item) = output.next().await {
        if let bollard::container::LogOutput::StdOut { message } = item.expect("exec output") {
            out.push_str(&String::from_utf8_lossy(&message));
        }
    }
    out
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Ids of containers of `instance` the engine reports as created in
/// `[since, until]`: proof of what happened even to a container that is
/// already gone.
async fn created_between(docker: &Docker, instance: &str, since: f64, until: f64) -> Vec<String> {
    let label = format!("{LABEL_INSTANCE}={instance}");
    let filters = HashMap::from([
        ("type", vec!["container"]),
        ("event", vec!["create"]),
        ("label", vec![label.as_str()]),
    ]);
    let options = EventsOptionsBuilder::default()
        .since(&format!("{since:.6}"))
        .until(&format!("{until:.6}"))
        .filters(&filters)
        .build();
    docker
        .events(Some(options))
        .map(|e| {
            e.expect("engine event")
                .actor
                .and_then(|a| a.id)
                .expect("event names its container")
        })
        .collect()
        .await
}

/// Force-removes, on drop (so also when an assertion fails), every container
/// of `instance` and the `extra` ones. Through the CLI: `Drop` cannot await.
/// Declare it before the host so it runs after the host has stopped.
#[derive(Default)]
struct Leftovers {
    instance: Option<String>,
    extra: Vec<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let mut ids = self.extra.clone();
        if let Some(instance) = &self.instance {
            let listed = Command::new("docker")
                .args(["ps", "-aq", "--no-trunc", "--filter"])
                .arg(format!("label={LABEL_INSTANCE}={instance}"))
                .output();
            if let Ok(out) = listed {
                ids.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .split_whitespace()
                        .map(String::from),
                );
            }
        }
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&ids)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `POST /api/chat` as the owner in a task of its own, so the test can look
/// at the engine while the turn runs.
fn chat_in_background(
    host: &TestHost,
    space: &str,
    text: &str,
) -> tokio::task::JoinHandle<reqwest::Result<(u16, Value)>> {
    let request = host
        .http
        .post(format!("{}/api/chat", host.url))
        .bearer_auth(&host.owner_token)
        .header("x-mercury-space", space)
        .json(&json!({"text": text}));
    tokio::spawn(async move {
        let resp = request.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    })
}

async fn chat(host: &TestHost, space: &str, text: &str) -> Value {
    host.chat(space, text).await
}

#[derive(Debug)]
struct RunRow {
    status: String,
    error: Option<String>,
    container_id: Option<String>,
    proof: Option<String>,
}

fn run_row(host: &TestHost, run_id: &str) -> RunRow {
    host.read(|c| {
        c.query_row(
            "SELECT status, error, container_id, sandbox_proof FROM runs WHERE id = ?1",
            &[&run_id],
            |r| {
                Ok(RunRow {
                    status: r.get(0)?,
                    error: r.get(1)?,
                    container_id: r.get(2)?,
                    proof: r.get(3)?,
                })
            },
        )
    })
}

/// The scripted tool call every "long tool" test uses: it marks the moment
/// the exec is running (a file in the workspace), then outlasts the test.
fn long_tool_model() -> Value {
    json!({"rules": [
        {"match": "(?s)^tool_result\\(shell\\): (.*)", "reply": "the tool finished: $1"},
        {"match": "^user: long$", "tool_calls": [
            {"name": "shell", "arguments": {"command": "touch started && sleep 600"}}
        ]}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turn_writes_the_workspace_and_a_plain_turn_starts_no_container() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let host = TestHost::start(docker_host(
        json!({"rules": [
            {"match": "^tool_result\\(shell\\): ", "reply": "noted"},
            {"match": "^user: note (.*)$", "tool_calls": [
                {"name": "shell", "arguments": {"command": "echo '$1' > note.txt"}}
            ]},
            {"match": "^user: hello$", "reply": "hello there"}
        ]}),
        vec![],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;
    assert!(containers(&docker, &instance).await.is_empty());

    let t0 = unix_now();
    let plain = chat(&host, "alpha", "hello").await;
    let t1 = unix_now();
    assert_eq!(plain["reply"], "hello there", "{plain}");
    assert!(containers(&docker, &instance).await.is_empty());

    let tool = chat(&host, "alpha", "note the sandbox works").await;
    let t2 = unix_now();
    assert_eq!(tool["reply"], "noted", "{tool}");
    assert_eq!(tool["status"], "done", "{tool}");
    let note = std::fs::read_to_string(host.data.join("spaces/alpha/note.txt")).expect("note.txt");
    assert_eq!(note, "the sandbox works\n");
    assert!(
        containers(&docker, &instance).await.is_empty(),
        "the tool turn's container was not removed"
    );

    // The engine's event log: nothing created during the plain turn, exactly
    // one container during the tool turn (the same method sees both).
    assert_eq!(
        created_between(&docker, &instance, t0, t1).await,
        Vec::<String>::new()
    );
    let created = created_between(&docker, &instance, t1, t2).await;
    assert_eq!(created.len(), 1, "{created:?}");

    // Each run records its sandbox: none for the plain turn; for the tool
    // turn the container id and the hostname read inside it, which is the
    // id's 12-character prefix.
    let plain_run = run_row(&host, plain["run_id"].as_str().expect("run id"));
    assert_eq!((plain_run.container_id, plain_run.proof), (None, None));
    let tool_run = run_row(&host, tool["run_id"].as_str().expect("run id"));
    assert_eq!(tool_run.status, "done");
    assert_eq!(tool_run.container_id.as_deref(), Some(created[0].as_str()));
    let proof = tool_run.proof.expect("sandbox proof");
    assert_eq!(proof.len(), 12, "{proof}");
    assert!(
        created[0].starts_with(&proof),
        "{proof} is not a prefix of {}",
        created[0]
    );
    // The same record through the API.
    let (st, runs) = host
        .owner(Method::GET, "/api/runs", Some("alpha"), None)
        .await;
    assert_eq!(st, 200, "{runs}");
    let listed = runs["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["id"] == tool["run_id"])
        .expect("the tool run is listed");
    assert_eq!(listed["container_id"], created[0].as_str());
    assert_eq!(listed["sandbox_proof"], proof.as_str());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_turns_container_is_labelled_limited_locked_down_and_holds_no_credential() {
    let docker = engine().await;
    let fake_model_key = "sk-fake-model-key-6a1f0c9e";
    let mut leftovers = Leftovers::default();
    let host = TestHost::start_process(HostOptions {
        env: vec![("MERCURY_OPENAI_API_KEY", fake_model_key.to_string())],
        ..docker_host(
            json!({"rules": [
                {"match": "^tool_result\\(shell\\): ", "reply": "slept"},
                {"match": "^user: slow$", "tool_calls": [
                    {"name": "shell", "arguments": {"command": "sleep 8"}}
                ]}
            ]}),
            vec![
                ("sandbox.memory_mb", Yaml::from(192)),
                ("sandbox.cpus", Yaml::from(0.75)),
                ("sandbox.pids", Yaml::from(99)),
                // tg:42 is a stranger answered by an open bot (the sender
                // policy has its own tests, tests/it/pairing.rs).
                ("ingress.dm_policy", Yaml::String("open".into())),
            ],
        )
    })
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    let adapter_secret = host.token("test-adapter", "adapter").await;

    // A platform message through the adapter: the turn starts in the background.
    let (st, v) = host
        .ingest(&adapter_secret, "dm-1", "tg:42", "slow", "m-1", false)
        .await;
    assert_eq!(st, 202, "{v}");
    let space = v["space_id"].as_str().expect("space id").to_string();

    let summary = running_container(&docker, &instance).await;
    let id = summary.id.expect("container id");
    let info = docker.inspect_container(&id, None).await.expect("inspect");
    let run_id: String = host.read(|c| {
        c.query_row(
            "SELECT id FROM runs WHERE space_id = ?1 AND status = 'running'",
            &[&&space],
            |r| r.get(0),
        )
    });

    let config = info.config.expect("config");
    let labels = config.labels.clone().expect("labels");
    assert_eq!(labels.get("mercury.instance"), Some(&instance));
    assert_eq!(labels.get("mercury.space"), Some(&space));
    assert_eq!(labels.get("mercury.run"), Some(&run_id));
    assert_eq!(labels.get("mercury.kind").map(String::as_str), Some("live"));

    let hc = info.host_config.expect("host config");
    assert_eq!(hc.memory, Some(192 << 20));
    assert_eq!(hc.nano_cpus, Some(750_000_000));
    assert_eq!(hc.pids_limit, Some(99));
    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    assert_eq!(hc.readonly_rootfs, Some(true));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
    let user = config.user.clone().unwrap_or_default();
    assert!(
        !user.is_empty() && user != "root" && user != "0" && !user.starts_with("0:"),
        "the container runs as {user:?}"
    );
    assert_ne!(exec_stdout(&docker, &id, &["id", "-u"]).await.trim(), "0");

    // Exactly two mounts: the space's workspace and the API socket.
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
    // The workspace reaches the container only as this run's layer (an
    // overlay over `spaces/<id>`), never as the workspace itself.
    let layer = host.data.join("tmp").join(format!("turn-{run_id}"));
    let canonical = |p: &Path| {
        std::fs::canonicalize(p)
            .expect("canonical")
            .display()
            .to_string()
    };
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    // The socket is the session's relay to `<data dir>/api.sock` (a bind
    // shows its path in the container's mountinfo), outside the data dir.
    assert_eq!(mounts[0].0, "/run/mercury/api.sock");
    let relay = Path::new(&mounts[0].1);
    assert!(
        relay.ends_with("api.sock") && !relay.starts_with(&host.data),
        "{mounts:?}"
    );
    assert_eq!(
        mounts[1],
        ("/work".to_string(), format!("{}/merged", canonical(&layer)))
    );

    // The environment: the run token, the space and the socket, nothing
    // else from the host (whose environment holds the fake model key and
    // every CARGO_* variable of this test run).
    let env = config.env.expect("env");
    let mut keys: Vec<&str> = env
        .iter()
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["MERCURY_SOCKET", "MERCURY_SPACE", "MERCURY_TOKEN", "PATH"],
        "{env:?}"
    );
    assert!(env.contains(&format!("MERCURY_SPACE={space}")));
    assert!(env.contains(&"MERCURY_SOCKET=/run/mercury/api.sock".to_string()));
    let inside = exec_stdout(&docker, &id, &["env"]).await;
    let mut inside_keys: Vec<&str> = inside
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    inside_keys.sort();
    // HOSTNAME and PATH come from the engine, HOME from the runtime (the
    // user's home in the image's /etc/passwd).
    assert!(
        inside_keys.iter().all(|k| [
            "HOME",
            "HOSTNAME",
            "MERCURY_SOCKET",
            "MERCURY_SPACE",
            "MERCURY_TOKEN",
            "PATH"
        ]
        .contains(k)),
        "{inside}"
    );
    for (what, secret) in [
        ("the model key", fake_model_key),
        ("the adapter secret", adapter_secret.as_str()),
        ("the owner token", host.owner_token.as_str()),
    ] {
        assert!(
            !env.iter().any(|kv| kv.contains(secret)),
            "{what} is in the container's config env"
        );
        assert!(
            !inside.contains(secret),
            "{what} is in the environment inside the container"
        );
    }

    let done = host
        .wait_count(
            &format!("SELECT COUNT(*) FROM runs WHERE id = '{run_id}' AND status = 'done'"),
            1,
            120,
        )
        .await;
    assert_eq!(done, 1, "{:?}", run_row(&host, &run_id));
    assert!(containers(&docker, &instance).await.is_empty());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrctl_inside_reaches_the_api_through_the_socket_and_the_run_token_dies_with_the_run() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let host = TestHost::start(docker_host(
        json!({"rules": [
            {"match_any": "(?s)tool_result\\(shell\\): (\\S+).*tool_result\\(mrctl\\): (.*)",
             "reply": "token=$1\n$2"},
            {"match": "^user: check$", "tool_calls": [
                {"name": "shell", "arguments": {"command": "echo \"$$MERCURY_TOKEN\""}},
                {"name": "mrctl", "arguments": {"args": ["prefs", "set", "colour", "teal"]}},
                {"name": "mrctl", "arguments": {"args": ["whoami"]}}
            ]}
        ]}),
        vec![],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;
    // The run token carries the asking user's role in the space: ann is an
    // admin of alpha, so her turn may write preferences.
    let ann = host.token("ann", "user").await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/roles",
            Some("alpha"),
            Some(json!({"caller_id": "ann", "role": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");

    let (st, v) = host
        .call(
            Method::POST,
            "/api/chat",
            Some(&ann),
            Some("alpha"),
            Some(json!({"text": "check"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "done", "{v}");
    let reply = v["reply"].as_str().expect("reply");
    // whoami answered through /run/mercury/api.sock (the container has no
    // network): the caller is the one who asked, with a run token.
    for line in ["caller: ann", "token: run", "space: alpha", "role: admin"] {
        assert!(reply.contains(line), "{line:?} missing from {reply:?}");
    }
    // The write went through the same way.
    let (st, prefs) = host
        .owner(Method::GET, "/api/prefs", Some("alpha"), None)
        .await;
    assert_eq!(st, 200, "{prefs}");
    let colour = prefs["preferences"]
        .as_array()
        .expect("preferences")
        .iter()
        .find(|p| p["key"] == "colour")
        .unwrap_or_else(|| panic!("no colour pref: {prefs}; reply {reply:?}"));
    assert_eq!(colour["value"], "teal");

    // The run token read inside the container is dead now that the run ended.
    let token = reply
        .strip_prefix("token=")
        .and_then(|r| r.lines().next())
        .expect("the token line");
    assert!(token.len() >= 16, "{token:?}");
    let (st, body) = host
        .call(Method::GET, "/api/whoami", Some(token), None, None)
        .await;
    assert_eq!(st, 401, "the run token still works after the run: {body}");
    assert!(containers(&docker, &instance).await.is_empty());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_past_the_tool_timeout_fails_the_run_and_leaves_no_container() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let host = TestHost::start(docker_host(
        long_tool_model(),
        vec![("turn.tool_timeout_secs", Yaml::from(2))],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;

    let started = Instant::now();
    let v = chat(&host, "alpha", "long").await;
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the timeout did not stop the tool"
    );
    let run = run_row(&host, v["run_id"].as_str().expect("run id"));
    assert_eq!(run.status, "failed");
    let error = run.error.expect("run error");
    assert!(error.contains("timed out after 2s"), "{error}");
    let cid = run.container_id.expect("the run had a container");
    assert!(
        !exists(&docker, &cid).await,
        "the timed-out run's container is still there"
    );
    assert!(containers(&docker, &instance).await.is_empty());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_from_outside_fails_the_run_and_leaves_no_container() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let host = TestHost::start(docker_host(
        long_tool_model(),
        vec![("turn.tool_timeout_secs", Yaml::from(900))],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;

    let turn = chat_in_background(&host, "alpha", "long");
    until("the tool to start", 120, async || {
        host.in_turn_layer("started")
    })
    .await;
    let id = running_container(&docker, &instance).await.id.expect("id");
    docker
        .kill_container(
            &id,
            Some(
                KillContainerOptionsBuilder::default()
                    .signal("KILL")
                    .build(),
            ),
        )
        .await
        .expect("kill the container from outside");

    let (st, v) = tokio::time::timeout(Duration::from_secs(120), turn)
        .await
        .expect("the turn ends after its container died")
        .expect("chat task")
        .expect("chat request");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "failed", "{v}");
    let run = run_row(&host, v["run_id"].as_str().expect("run id"));
    assert_eq!(run.status, "failed");
    assert_eq!(run.container_id.as_deref(), Some(id.as_str()));
    let error = run.error.expect("run error");
    assert!(error.contains("sandbox is gone"), "{error}");
    assert!(
        !exists(&docker, &id).await,
        "the killed container was not removed"
    );
    assert!(containers(&docker, &instance).await.is_empty());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stopped_with_mrctl_control_stop_records_it_and_leaves_no_container() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let host = TestHost::start(docker_host(
        long_tool_model(),
        vec![("turn.tool_timeout_secs", Yaml::from(900))],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;

    let turn = chat_in_background(&host, "alpha", "long");
    until("the tool to start", 120, async || {
        host.in_turn_layer("started")
    })
    .await;
    let id = running_container(&docker, &instance).await.id.expect("id");

    let mut stop = host.mrctl(&host.owner_token, Some("alpha"));
    stop.args(["control", "stop"]);
    let out = tokio::process::Command::from(stop)
        .output()
        .await
        .expect("run mrctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mrctl control stop: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (st, v) = tokio::time::timeout(Duration::from_secs(60), turn)
        .await
        .expect("the turn ends after the stop")
        .expect("chat task")
        .expect("chat request");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "stopped", "{v}; mrctl said {stdout}");
    // The running turn is stopped, not counted among the dropped queue.
    assert!(stdout.contains("dropped 0"), "{stdout}");
    let run = run_row(&host, v["run_id"].as_str().expect("run id"));
    assert_eq!(run.status, "stopped", "{run:?}");
    assert_eq!(run.error.as_deref(), Some("stopped"));
    assert_eq!(run.container_id.as_deref(), Some(id.as_str()));
    assert!(
        !exists(&docker, &id).await,
        "the stopped turn's container is still there"
    );
    assert!(containers(&docker, &instance).await.is_empty());
    host.stop().await;
}

/// A bare `sleep infinity` container from the agent image with `labels`.
async fn bare_container(docker: &Docker, image: &str, labels: HashMap<String, String>) -> String {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(vec!["/bin/sleep".into(), "infinity".into()]),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
        .expect("create a bare container")
        .id;
    docker
        .start_container(&id, None::<StartContainerOptions>)
        .await
        .expect("start the bare container");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_host_sweeps_its_own_leftovers_and_spares_other_containers() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    // The first attempt sleeps; the resumed one after the restart finds the
    // marker the test puts in the workspace and ends at once.
    let mut host = TestHost::start_process(docker_host(
        json!({"rules": [
            {"match": "^tool_result\\(shell\\): ", "reply": "done"},
            {"match": "^user: long$", "tool_calls": [
                {"name": "shell", "arguments": {"command": "test -f resume-ok || { touch started && sleep 600; }"}}
            ]}
        ]}),
        vec![],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;

    // A real leftover: the host dies (SIGKILL) while its turn's container runs.
    let turn = chat_in_background(&host, "alpha", "long");
    until("the tool to start", 120, async || {
        host.in_turn_layer("started")
    })
    .await;
    let crashed = running_container(&docker, &instance).await;
    let crashed_id = crashed.id.expect("id");
    let crashed_run = crashed.labels.expect("labels")["mercury.run"].clone();
    host.kill();
    turn.abort();
    assert!(
        exists(&docker, &crashed_id).await,
        "the crash should have left the container"
    );
    // The killed turn's layer is still mounted; the restart must clear it.
    assert!(!host.mounts_below_data().is_empty());
    std::fs::write(host.data.join("spaces/alpha/resume-ok"), "").expect("marker");

    // And three made by hand: ours with a dead run id, another instance's,
    // and one without labels.
    let image = docker
        .inspect_container(&crashed_id, None)
        .await
        .expect("inspect")
        .config
        .and_then(|c| c.image)
        .expect("image");
    let label = |instance: &str| {
        HashMap::from([
            ("mercury.instance".to_string(), instance.to_string()),
            ("mercury.space".to_string(), "alpha".to_string()),
            ("mercury.run".to_string(), "r-dead".to_string()),
            ("mercury.kind".to_string(), "live".to_string()),
        ])
    };
    let ours = bare_container(&docker, &image, label(&instance)).await;
    let foreign = bare_container(&docker, &image, label("0123456789abcdef")).await;
    leftovers.extra.push(foreign.clone());
    let unlabelled = bare_container(&docker, &image, HashMap::new()).await;
    leftovers.extra.push(unlabelled.clone());

    host.restart_process().await;
    until("the start-up sweep", 120, async || {
        (!exists(&docker, &crashed_id).await && !exists(&docker, &ours).await).then_some(())
    })
    .await;
    for id in [&foreign, &unlabelled] {
        let info = docker
            .inspect_container(id, None)
            .await
            .expect("spared container");
        assert_eq!(
            info.state.and_then(|s| s.running),
            Some(true),
            "{id} was touched"
        );
    }
    // The crashed run is on record as interrupted; its message is answered
    // by a new run after the restart, whose container is removed as usual.
    assert_eq!(run_row(&host, &crashed_run).status, "interrupted");
    let answered = host
        .wait_count("SELECT COUNT(*) FROM runs WHERE status = 'done'", 1, 120)
        .await;
    assert_eq!(answered, 1);
    // No layer of the killed turn or of the resumed one is left.
    assert_eq!(host.mounts_below_data(), Vec::<String>::new());
    assert_eq!(
        std::fs::read_dir(host.data.join("tmp"))
            .map(std::iter::Iterator::count)
            .unwrap_or(0),
        0
    );
    until("the resumed run's container to go", 60, async || {
        containers(&docker, &instance)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    host.stop().await;
}

/// `mercury serve` as a child process whose Docker engine is a socket that
/// does not exist; stderr is collected as it comes.
/// `/healthz` of a host on `port`, once it answers.
async fn health_of(http: &reqwest::Client, port: u16) -> Value {
    until("the host to answer", 60, async || {
        let resp = http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .ok()?;
        resp.json::<Value>().await.ok()
    })
    .await
}

fn serve_without_engine(data: &Path, dir: &Path) -> (std::process::Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["serve", "--data-dir"])
        .arg(data)
        .env(
            "DOCKER_HOST",
            format!("unix://{}", dir.join("no-engine.sock").display()),
        )
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mercury serve");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("stderr pipe");
    let sink = stderr.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("stderr buffer")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, stderr)
}

#[tokio::test]
async fn sandbox_docker_without_an_engine_stops_start_up_with_a_clear_message() {
    let opts = docker_host(json!({"rules": [{"reply": "ok"}]}), vec![]);
    let (dir, data, port) = prepare(&opts).await;
    let (mut child, stderr) = serve_without_engine(&data, dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the host kept running without an engine: {}",
                stderr.lock().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The reader thread finishes at end of file; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = stderr.lock().unwrap().clone();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("sandbox: docker was asked for"), "{err}");
    assert!(
        err.contains("no-engine.sock"),
        "the message should name the engine it tried: {err}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the host listened although it refused to start"
    );
}

#[tokio::test]
async fn sandbox_auto_without_an_engine_uses_bubblewrap_never_an_unisolated_process() {
    let opts = HostOptions {
        sandbox: "auto",
        ..Default::default()
    };
    let (dir, data, port) = prepare(&opts).await;
    let (mut child, stderr) = serve_without_engine(&data, dir.path());
    let http = reqwest::Client::new();
    let health = health_of(&http, port).await;
    let _ = child.kill();
    let _ = child.wait();
    let err = stderr.lock().unwrap().clone();
    assert_eq!(health["sandbox"], "bwrap", "{health}");
    assert!(
        err.contains("no usable Docker engine") && err.contains("bubblewrap"),
        "no warning: {err}"
    );
    assert!(
        err.contains("sandbox backend: bwrap (bubblewrap namespaces)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_auto_without_engine_or_bubblewrap_refuses_tools_and_says_so() {
    let opts = HostOptions {
        sandbox: "auto",
        model: json!({"rules": [
            {"match": "^tool_result\\(shell\\): (.*)$", "reply": "tool said: $1"},
            {"match": "^user: run$", "tool_calls": [{"name": "shell", "arguments": {"command": "echo ran > ran.txt"}}]}
        ]}),
        config: vec![("sandbox.bwrap", Yaml::from("/nonexistent/bwrap"))],
        ..Default::default()
    };
    let (dir, data, port) = prepare(&opts).await;
    let (mut child, stderr) = serve_without_engine(&data, dir.path());
    let http = reqwest::Client::new();
    let health = health_of(&http, port).await;
    assert_eq!(health["sandbox"], "none", "{health}");
    let token = std::fs::read_to_string(data.join("global/owner.token")).expect("token");
    let auth = format!("Bearer {}", token.trim());
    let created = http
        .post(format!("http://127.0.0.1:{port}/api/spaces"))
        .header("authorization", &auth)
        .json(&json!({"id": "alpha"}))
        .send()
        .await
        .expect("create space");
    assert!(created.status().is_success(), "{created:?}");
    let reply: Value = http
        .post(format!("http://127.0.0.1:{port}/api/chat"))
        .header("authorization", &auth)
        .header("x-mercury-space", "alpha")
        .json(&json!({"text": "run"}))
        .send()
        .await
        .expect("chat")
        .json()
        .await
        .expect("json");
    let _ = child.kill();
    let _ = child.wait();
    let err = stderr.lock().unwrap().clone();
    assert!(
        reply["reply"]
            .as_str()
            .unwrap_or("")
            .contains("no sandbox is available"),
        "{reply}"
    );
    assert!(!data.join("spaces/alpha/ran.txt").exists());
    assert!(
        err.contains("no sandbox is available, tool calls are refused"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surviving_host_removes_what_a_host_that_is_gone_left_on_a_shared_engine() {
    let docker = engine().await;
    let hosts = TestHost::start_cluster(
        1,
        docker_host(
            json!({"rules": [{"reply": "ok"}]}),
            vec![
                ("ingress.dm_policy", Yaml::String("open".into())),
                ("sandbox.sweep_interval_secs", Yaml::from(1)),
            ],
        ),
    )
    .await;
    // The host built the agent image at start; a gone host's container of it.
    let images = docker
        .list_images(None::<bollard::query_parameters::ListImagesOptions>)
        .await
        .expect("images");
    let image = images
        .iter()
        .flat_map(|i| i.repo_tags.iter())
        .find(|t| t.starts_with("mercury-agent:"))
        .expect("the agent image")
        .clone();
    let label = |instance: &str| {
        HashMap::from([
            ("mercury.instance".to_string(), instance.to_string()),
            ("mercury.space".to_string(), "alpha".to_string()),
            ("mercury.run".to_string(), "r-of-a-gone-host".to_string()),
            ("mercury.kind".to_string(), "live".to_string()),
        ])
    };
    let (gone, living) = ("9e0e9e0e9e0e9e0e", "a11fea11fea11fea");
    let mut leftovers = Leftovers {
        instance: None,
        extra: Vec::new(),
    };
    let of_gone = bare_container(&docker, &image, label(gone)).await;
    let of_living = bare_container(&docker, &image, label(living)).await;
    leftovers.extra.extend([of_gone.clone(), of_living.clone()]);
    // Two other hosts on record: one stopped, one beating now.
    let now = mercury::clock::now_ms();
    hosts[0].write(move |tx| {
        mercury::storage::leases::join_host(
            tx,
            "h-gone-1",
            "h-gone",
            "http://10.0.0.9:1",
            gone,
            now - 3_600_000,
        )?;
        mercury::storage::leases::leave(tx, "h-gone-1", now - 3_500_000)?;
        mercury::storage::leases::join_host(
            tx,
            "h-live-1",
            "h-live",
            "http://10.0.0.8:1",
            living,
            now + 600_000,
        )
    });
    until("the gone host's container removed", 60, async || {
        (!exists(&docker, &of_gone).await).then_some(())
    })
    .await;
    let info = docker
        .inspect_container(&of_living, None)
        .await
        .expect("the living host's container is spared");
    assert_eq!(info.state.and_then(|s| s.running), Some(true));
}

/// The pooled (warm) containers of `instance`, by id.
async fn pooled(docker: &Docker, instance: &str) -> Vec<String> {
    let mut ids: Vec<String> = containers(docker, instance)
        .await
        .into_iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .and_then(|l| l.get("mercury.kind"))
                .is_some_and(|k| k == "warm")
        })
        .filter_map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

/// The pool directories of `instance` under the system temp dir.
fn pool_dirs(instance: &str) -> usize {
    std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("mercury-warm-{instance}-"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_host_runs_a_turn_in_a_pooled_container_and_a_killed_hosts_pool_is_swept() {
    let docker = engine().await;
    let mut leftovers = Leftovers::default();
    let mut host = TestHost::start_process(docker_host(
        json!({"rules": [
            {"match_any": "(?s)tool_result\\(shell\\): (\\S+).*tool_result\\(mrctl\\): (.*)",
             "reply": "space=$1\n$2"},
            {"match": "^user: check$", "tool_calls": [
                {"name": "shell", "arguments": {"command": "echo \"$$MERCURY_SPACE\""}},
                {"name": "mrctl", "arguments": {"args": ["whoami"]}}
            ]}
        ]}),
        vec![
            ("sandbox.warm", Yaml::from(2)),
            // Sweeps every second: the pool's containers must be spared.
            ("sandbox.sweep_interval_secs", Yaml::from(1)),
        ],
    ))
    .await;
    let instance = instance_of(&host);
    leftovers.instance = Some(instance.clone());
    host.create_space("alpha").await;
    let first = until("the pool to fill", 180, async || {
        let ids = pooled(&docker, &instance).await;
        (ids.len() == 2).then_some(ids)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pooled(&docker, &instance).await,
        first,
        "the periodic sweep touched the pool"
    );
    // /api/status shows the pool: its size and what waits now.
    let (st, status) = host.owner(Method::GET, "/api/status", None, None).await;
    assert_eq!(st, 200, "{status}");
    assert_eq!(status["sandbox"]["warm"], json!({"slots": 2, "idle": 2}));

    // A turn claims one: its token and space come with each exec, its API
    // socket through the slot.
    let v = chat(&host, "alpha", "check").await;
    assert_eq!(v["status"], "done", "{v}");
    let reply = v["reply"].as_str().expect("reply");
    for line in ["space=alpha", "token: run", "space: alpha"] {
        assert!(reply.contains(line), "{line:?} missing from {reply:?}");
    }
    let used: String = host.read(|c| {
        c.query_row(
            "SELECT container_id FROM runs WHERE status = 'done'",
            &[],
            |r| r.get(0),
        )
    });
    assert!(
        first.contains(&used),
        "the turn ran cold in {used}, not in {first:?}"
    );
    assert!(
        !exists(&docker, &used).await,
        "the claimed container outlived its turn"
    );
    let refilled = until("the pool to refill", 180, async || {
        let ids = pooled(&docker, &instance).await;
        (ids.len() == 2).then_some(ids)
    })
    .await;
    assert!(
        !refilled.contains(&used),
        "a used container went back to the pool"
    );

    // Killed: its pool stays behind, labelled with this instance; the next
    // start sweeps it (and its directory) and fills a new one.
    host.kill();
    for id in &refilled {
        assert!(exists(&docker, id).await, "{id} went with the kill");
    }
    assert_eq!(pool_dirs(&instance), 1);
    host.restart_process().await;
    let second = until(
        "the old pool to be swept and a new one filled",
        180,
        async || {
            let mut gone = true;
            for id in &refilled {
                gone &= !exists(&docker, id).await;
            }
            let ids = pooled(&docker, &instance).await;
            (gone && ids.len() == 2).then_some(ids)
        },
    )
    .await;
    assert!(second.iter().all(|id| !refilled.contains(id)));
    assert_eq!(
        pool_dirs(&instance),
        1,
        "the killed host's pool directory is left"
    );

    // A graceful stop removes the idle pool.
    host.stop().await;
    until("the pool to go with the host", 60, async || {
        (containers(&docker, &instance).await.is_empty() && pool_dirs(&instance) == 0).then_some(())
    })
    .await;
}
