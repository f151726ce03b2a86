//! Sandboxes on a Docker engine reached over TCP (issue 28, item 4): the
//! host treats a `tcp://` engine as another machine's, so nothing of its own
//! filesystem is bound into the container. The engine here is this
//! machine's, reached through a loopback TCP proxy to its socket that keeps
//! every byte the host sent, so the test sees exactly what the engine was
//! asked: no bind mount, the workspace copied in and back through the
//! archive API, the API carried over an exec stream.

use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

use crate::common::{HostOptions, TestHost};

/// A loopback TCP port that is the local engine's socket, keeping a copy of
/// everything sent to the engine.
pub(crate) struct EngineProxy {
    pub port: u16,
    sent: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EngineProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EngineProxy {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let keep = Arc::clone(&keep);
                tokio::spawn(async move {
                    let Ok(engine) = UnixStream::connect("/var/run/docker.sock").await else {
                        return;
                    };
                    let (mut from_host, mut to_host) = tcp.into_split();
                    let (mut from_engine, mut to_engine) = engine.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            match from_host.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    keep.lock().unwrap().extend_from_slice(&buf[..n]);
                                    if to_engine.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to_engine.shutdown().await;
                    };
                    let down = async {
                        let _ = tokio::io::copy(&mut from_engine, &mut to_host).await;
                        let _ = to_host.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Self { port, sent, task }
    }

    pub(crate) fn config(&self) -> Vec<(&'static str, Yaml)> {
        vec![(
            "sandbox.docker.hosts",
            Yaml::Sequence(vec![Yaml::from(format!("tcp://127.0.0.1:{}", self.port))]),
        )]
    }

    /// What the host sent the engine, as text (bodies included).
    fn sent(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_on_a_tcp_engine_binds_nothing_and_its_workspace_comes_back_through_the_archive() {
    let engine = EngineProxy::start().await;
    let shell = |cmd: &str| json!({"name": "shell", "arguments": {"command": cmd}});
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match_any": "(?s)tool_result\\(shell\\): (.*)tool_result\\(mrctl\\): (.*)",
             "reply": "shell=$1\nmrctl=$2"},
            {"match": "(?s)^tool_result\\(shell\\): (.*)", "reply": "said $1"},
            {"match": "^user: write$", "tool_calls": [
                shell("mkdir -p notes && echo remote > notes/a.txt && cat AGENTS.md | head -c 5"),
                {"name": "mrctl", "arguments": {"args": ["whoami"]}}
            ]},
            // A file tool on the host, then a command that reads it inside.
            {"match": "^user: both$", "tool_calls": [
                {"name": "write_file", "arguments": {"path": "host.txt", "content": "from the host"}},
                shell("cat host.txt; echo; rm notes/a.txt; ln -s /etc/passwd pw")
            ]},
            {"reply": "hi"}
        ]}),
        sandbox: "docker",
        config: engine.config(),
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let ws = host.data.join("spaces/alpha");

    let v = host.chat("alpha", "write").await;
    assert_eq!(v["status"], "done", "{v}");
    let reply = v["reply"].as_str().unwrap();
    // The workspace went in (AGENTS.md was read inside), the API answered
    // through the bridge (the container has no network and no host socket).
    for line in ["token: run", "space: alpha"] {
        assert!(reply.contains(line), "{line:?} missing from {reply:?}");
    }
    assert!(reply.starts_with("shell="), "{reply}");
    // What the command wrote came back and was merged.
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(),
        "remote\n"
    );

    let v = host.chat("alpha", "both").await;
    assert_eq!(v["status"], "done", "{v}");
    assert!(
        v["reply"].as_str().unwrap().contains("said from the host"),
        "the host's write reached the sandbox before its next command: {v}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("host.txt")).unwrap(),
        "from the host"
    );
    assert!(!ws.join("notes/a.txt").exists(), "a removal came back too");
    // A link the sandbox made is a link in the workspace, never followed.
    assert_eq!(
        std::fs::read_link(ws.join("pw")).unwrap(),
        std::path::Path::new("/etc/passwd")
    );

    // What the engine was asked: containers with the workspace as their own
    // tmpfs volume, nothing of this host bound, the tree copied in and back.
    let sent = engine.sent();
    assert!(sent.contains("/containers/create"), "no create seen");
    assert!(sent.contains("\"Type\":\"volume\""), "no volume mount");
    assert!(
        !sent.contains("\"Type\":\"bind\""),
        "a bind mount was asked for"
    );
    assert!(
        !sent.contains(&host.data.display().to_string()),
        "a host path reached the engine"
    );
    let asked = |method: &str| {
        sent.lines()
            .any(|l| l.starts_with(method) && l.contains("/archive?") && l.contains("work"))
    };
    assert!(asked("PUT "), "nothing was copied in");
    assert!(asked("GET "), "nothing was copied back");
    assert!(
        sent.contains("\"mrctl\",\"bridge\""),
        "no API bridge started"
    );

    // /api/status shows the engine, remote, and nothing running on it now.
    let (st, status) = host.owner(Method::GET, "/api/status", None, None).await;
    assert_eq!(st, 200, "{status}");
    let engines = status["sandbox"]["engines"].as_array().expect("engines");
    assert_eq!(engines.len(), 1, "{status}");
    assert_eq!(
        engines[0]["endpoint"],
        format!("tcp://127.0.0.1:{}", engine.port)
    );
    assert_eq!(engines[0]["remote"], true);
    assert_eq!(engines[0]["healthy"], true);
    assert_eq!(engines[0]["running"], 0);
    host.stop().await;
}

/// Security III on the synced path: the hostile trees of
/// `security_workspace` made on an engine elsewhere come back bounded and
/// are refused whole, the workspace as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_engine_hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was() {
    let engine = EngineProxy::start().await;
    crate::security_workspace::hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was(
        "docker",
        engine.config(),
    )
    .await;
}
