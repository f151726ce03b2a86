//! Sandboxes on a Docker engine reached over TCP (issue 28, item 4): the
//! host treats a `tcp://` engine as another machine's, so nothing of its own
//! filesystem is bound into the container. The engine here is this
//! machine's, reached through a loopback TCP proxy to its socket that keeps
//! every byte the host sent, so the test sees exactly what the engine was
//! asked: no bind mount, the workspace copied in and back through the
//! archive API, the API carried over an exec stream.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio_rustls::rustls;

use crate::common::{HostOptions, TestHost};

/// A loopback TCP port that is the local engine's socket, keeping a copy of
/// everything sent to the engine; optionally behind TLS that asks for a
/// client certificate (the engine's `--tlsverify`), and switchable off (a
/// connection is then closed at once, as an engine that is down).
pub(crate) struct EngineProxy {
    pub port: u16,
    sent: Arc<Mutex<Vec<u8>>>,
    up: Arc<AtomicBool>,
    /// TLS sessions that completed their handshake.
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EngineProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways between a host's connection and the engine's socket,
/// keeping what the host sent.
async fn relay<S>(stream: S, keep: Arc<Mutex<Vec<u8>>>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(engine) = UnixStream::connect("/var/run/docker.sock").await else {
        return;
    };
    let (mut from_host, mut to_host) = tokio::io::split(stream);
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
}

impl EngineProxy {
    pub(crate) async fn start() -> Self {
        Self::start_with(None, true).await
    }

    /// A proxy that refuses every connection until [`Self::set_up`].
    pub(crate) async fn start_down() -> Self {
        Self::start_with(None, false).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>, up: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let up = Arc::new(AtomicBool::new(up));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (keep, is_up, shaken) = (Arc::clone(&sent), Arc::clone(&up), Arc::clone(&handshakes));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                if !is_up.load(Ordering::SeqCst) {
                    drop(tcp);
                    continue;
                }
                let keep = Arc::clone(&keep);
                let (tls, shaken) = (tls.clone(), Arc::clone(&shaken));
                tokio::spawn(async move {
                    match tls {
                        None => relay(tcp, keep).await,
                        Some(acceptor) => {
                            // A client without a certificate the CA signed
                            // fails here, before any byte reaches the engine.
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                shaken.fetch_add(1, Ordering::SeqCst);
                                relay(stream, keep).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            port,
            sent,
            up,
            handshakes,
            task,
        }
    }

    pub(crate) fn set_up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
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

/// Certificates made with `openssl` for one test: a CA, the engine's (for
/// 127.0.0.1) and a client's it signed; a second CA and a client it signed
/// (a stranger to the first).
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn make() -> Self {
        let dir = tempfile::tempdir().expect("a dir for certificates");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, pem, subj) = (
                format!("{ca}-key.pem"),
                format!("{ca}.pem"),
                format!("/CN=mercury-test-{ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
            run(&args);
        }
        for (name, ca, ext) in [
            (
                "server",
                "ca",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "ca", "extendedKeyUsage=clientAuth\n"),
            ("stranger", "other-ca", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, pem, extfile) = (
                format!("{name}-key.pem"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            std::fs::write(
                dir.path().join(&extfile),
                format!("basicConstraints=CA:FALSE\n{ext}"),
            )
            .unwrap();
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
            run(&args);
            let (ca_pem, ca_key, serial) = (
                format!("{ca}.pem"),
                format!("{ca}-key.pem"),
                format!("{ca}.srl"),
            );
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_pem,
                "-CAkey",
                &ca_key,
                "-CAserial",
                &serial,
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &extfile,
            ]);
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The engine's side: its certificate, and a client certificate the
    /// first CA signed required of every connection.
    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(self.path("ca.pem")).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_file(self.path("server.pem")).unwrap()],
                PrivateKeyDer::from_pem_file(self.path("server-key.pem")).unwrap(),
            )
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    fn tls(&self, ca: &str, client: &str) -> mercury::config::DockerTlsConfig {
        let p = |n: &str| self.path(n).display().to_string();
        mercury::config::DockerTlsConfig {
            ca: p(ca),
            cert: p(&format!("{client}.pem")),
            key: p(&format!("{client}-key.pem")),
        }
    }
}

fn tls_yaml(tls: &mercury::config::DockerTlsConfig) -> Yaml {
    let mut m = serde_yaml_ng::Mapping::new();
    for (k, v) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
        m.insert(Yaml::from(k), Yaml::from(v.as_str()));
    }
    Yaml::Mapping(m)
}

fn shell_rules() -> serde_json::Value {
    json!({"rules": [
        {"match": "(?s)^tool_result\\(shell\\): (.*)", "reply": "said $1"},
        {"match": "^user: run$", "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo from the engine"}}
        ]},
        {"reply": "hi"}
    ]})
}

/// A turn in space `alpha` runs the command of [`shell_rules`] and answers
/// with what it printed.
async fn runs_a_command(host: &TestHost) {
    let v = host.chat("alpha", "run").await;
    assert_eq!(v["status"], "done", "{v}");
    let reply = v["reply"].as_str().unwrap_or_default();
    assert!(reply.contains("said from the engine"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_engine_serves_a_host_whose_client_certificate_its_ca_signed_and_no_other() {
    let certs = Certs::make();
    let engine = EngineProxy::start_with(Some(certs.acceptor()), true).await;
    // A client certificate of another CA is refused by the engine; an
    // engine certificate this host's CA did not sign is refused by the host.
    for (ca, client, what) in [
        ("ca.pem", "stranger", "a stranger's client certificate"),
        ("other-ca.pem", "client", "an engine this CA did not sign"),
    ] {
        let engines = mercury::config::DockerEnginesConfig {
            hosts: vec![engine.endpoint()],
            tls: certs.tls(ca, client),
        };
        match mercury::sandbox::lifecycle::connect_every(&engines).await {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => assert!(e.to_string().contains(&engine.endpoint()), "{what}: {e}"),
        }
    }
    assert_eq!(engine.handshakes.load(Ordering::SeqCst), 0);
    assert!(engine.sent().is_empty(), "nothing reached the engine");

    let host = TestHost::start(HostOptions {
        model: shell_rules(),
        sandbox: "docker",
        config: vec![
            (
                "sandbox.docker.hosts",
                Yaml::Sequence(vec![Yaml::from(engine.endpoint())]),
            ),
            (
                "sandbox.docker.tls",
                tls_yaml(&certs.tls("ca.pem", "client")),
            ),
        ],
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    runs_a_command(&host).await;
    assert!(engine.handshakes.load(Ordering::SeqCst) > 0);
    assert!(
        engine.sent().contains("/containers/create"),
        "the turn ran there"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_down_at_start_up_joins_when_it_answers_and_takes_sandboxes() {
    let late = EngineProxy::start_down().await;
    let host = TestHost::start(HostOptions {
        model: shell_rules(),
        sandbox: "docker",
        config: vec![
            (
                "sandbox.docker.hosts",
                // Listed first: on a tie it is the one placed on.
                Yaml::Sequence(vec![
                    Yaml::from(late.endpoint()),
                    Yaml::from("unix:///var/run/docker.sock"),
                ]),
            ),
            ("sandbox.sweep_interval_secs", Yaml::Number(1.into())),
        ],
        ..Default::default()
    })
    .await;
    let engine_status = || async {
        let (st, status) = host.owner(Method::GET, "/api/status", None, None).await;
        assert_eq!(st, 200, "{status}");
        status["sandbox"]["engines"][0].clone()
    };
    let first = engine_status().await;
    assert_eq!(first["endpoint"], late.endpoint());
    assert_eq!(first["healthy"], false, "{first}");
    assert!(
        first["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("does not answer"),
        "{first}"
    );
    host.create_space("alpha").await;
    let v = host.chat("alpha", "run").await;
    assert_eq!(
        v["status"], "done",
        "the other engine serves meanwhile: {v}"
    );
    assert!(late.sent().is_empty());

    late.set_up();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let e = engine_status().await;
        if e["healthy"] == true {
            assert!(e["last_error"].is_null(), "{e}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never joined: {e}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    runs_a_command(&host).await;
    assert!(
        late.sent().contains("/containers/create"),
        "the joined engine took the turn"
    );
    host.stop().await;
}
