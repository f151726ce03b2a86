//! The host's own boundaries (issue 10, items 2, 5-8), on a real host: who
//! may point a space's model chain at a host file and how that file is read;
//! run tokens of a hard-killed host; the modes of the data dir; one host per
//! data dir; what the agent image can run (real Docker engine).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{free_port, prepare, HostOptions, TestHost};
use mercury::storage::Query;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path owned for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Chats in `space` as the owner; (status, reply text, run error).
async fn owner_chat(h: &TestHost, space: &str, text: &str) -> (String, String, String) {
    let v = h.chat(space, text).await;
    let run = v["run_id"].as_str().unwrap_or_default().to_owned();
    let error: Option<String> = h
        .read(|c| {
            c.query_opt("SELECT error FROM runs WHERE id = ?1", &[&&run], |r| {
                r.get(0)
            })
        })
        .flatten();
    (
        v["status"].as_str().unwrap_or_default().to_owned(),
        v["reply"].as_str().unwrap_or_default().to_owned(),
        error.unwrap_or_default(),
    )
}

async fn set_chain(h: &TestHost, token: &str, space: &str, spec: &str) -> (u16, Value) {
    h.call(
        Method::PUT,
        "/api/model",
        Some(token),
        Some(space),
        Some(json!({"chain": [spec]})),
    )
    .await
}

// ---------------------------------------------------------------------------
// Item 2: scripted: in a space's chain
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_global_admin_may_set_a_scripted_model_and_only_under_models() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    h.grant("team", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let inside = h.data.join("models/rules.json");
    std::fs::write(&inside, r#"{"rules": [{"reply": "from models"}]}"#).unwrap();
    let outside = h.dir.path().join("elsewhere.json");
    std::fs::write(&outside, r#"{"rules": [{"reply": "from elsewhere"}]}"#).unwrap();

    // A space admin: refused whatever the path, with the rule named.
    for path in [
        PathBuf::from("/etc/shadow"),
        outside.clone(),
        inside.clone(),
    ] {
        let (st, v) = set_chain(&h, &alice, "team", &format!("scripted:{}", path.display())).await;
        assert_eq!(st, 403, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("only a global admin"), "{message}");
        assert!(message.contains("models/"), "{message}");
    }
    // The space admin keeps the other forms.
    let (st, v) = set_chain(&h, &alice, "team", "openai:gpt-4o-mini").await;
    assert_eq!(st, 200, "{v}");

    // The owner: outside models/ (also through `..` or a symlinked dir) refused.
    std::os::unix::fs::symlink(h.dir.path(), h.data.join("models/out")).unwrap();
    for path in [
        outside.display().to_string(),
        format!("{}/models/../../elsewhere.json", h.data.display()),
        format!("{}/models/out/elsewhere.json", h.data.display()),
        // Inside models/, but not in the one plain form (issue 23 item 10).
        format!("{}/models/./rules.json", h.data.display()),
        format!("{}/models//rules.json", h.data.display()),
        "models/rules.json".to_owned(),
    ] {
        let (st, v) = set_chain(&h, &h.owner_token, "team", &format!("scripted:{path}")).await;
        assert_eq!(st, 403, "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("models/"),
            "{v}"
        );
    }
    // No refused chain was written.
    assert_eq!(
        h.count(
            "SELECT COUNT(*) FROM space_config WHERE key = 'model' AND value LIKE 'scripted:%'"
        ),
        0
    );

    let spec = format!("scripted:{}", inside.display());
    let (st, v) = set_chain(&h, &h.owner_token, "team", &spec).await;
    assert_eq!(st, 200, "{v}");
    let (status, reply, _) = owner_chat(&h, "team", "hello").await;
    assert_eq!((status.as_str(), reply.as_str()), ("done", "from models"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_scripted_roots_adds_a_directory_a_global_admin_may_name() {
    let extra = tempfile::tempdir().unwrap();
    let rules = extra.path().join("r.json");
    std::fs::write(&rules, r#"{"rules": [{"reply": "from the extra root"}]}"#).unwrap();
    let h = TestHost::start(HostOptions {
        config: vec![(
            "models.scripted_roots",
            Yaml::Sequence(vec![Yaml::String(extra.path().display().to_string())]),
        )],
        ..Default::default()
    })
    .await;
    h.create_space("team").await;
    let (st, v) = set_chain(
        &h,
        &h.owner_token,
        "team",
        &format!("scripted:{}", rules.display()),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (status, reply, _) = owner_chat(&h, "team", "hello").await;
    assert_eq!(
        (status.as_str(), reply.as_str()),
        ("done", "from the extra root")
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_under_models_fails_its_turn_and_the_host_keeps_answering() {
    // A child-process host: a FIFO read with blocking std::fs would stall one
    // of its runtime's workers for good, and this test's chat would hang.
    let h = TestHost::start_process(HostOptions::default()).await;
    h.create_space("team").await;
    let fifo = h.data.join("models/fifo.json");
    mkfifo(&fifo);
    let (st, v) = set_chain(
        &h,
        &h.owner_token,
        "team",
        &format!("scripted:{}", fifo.display()),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    let chat = {
        let (url, token) = (h.url.clone(), h.owner_token.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{url}/api/chat"))
                .bearer_auth(token)
                .header("x-mercury-space", "team")
                .json(&json!({"text": "hello"}))
                .timeout(Duration::from_secs(60))
                .send()
                .await
        })
    };
    let (st, _) = h.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(st, 200);
    let resp = chat
        .await
        .unwrap()
        .expect("the chat answers, it does not hang");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["status"], "failed", "{v}");
    // The participant reads the generic sentence; the reason is the run's.
    // (The owner in the console is a global admin in a direct conversation,
    // so the reason follows the sentence; a participant reads the sentence only.)
    assert!(
        v["reply"]
            .as_str()
            .is_some_and(|r| r.starts_with(mercury::config::DEFAULT_FAILURE_REPLY)),
        "{v}"
    );
    let run = v["run_id"].as_str().unwrap();
    let error: String = h.read(|c| {
        c.query_row("SELECT error FROM runs WHERE id = ?1", &[&run], |r| {
            r.get(0)
        })
    });
    assert!(error.contains("not a regular file"), "{error}");
    // Twice: the first failure did not wedge anything either.
    let (status, _, error) = owner_chat(&h, "team", "again").await;
    assert_eq!(status, "failed");
    assert!(error.contains("not a regular file"), "{error}");
    let (st, _) = h.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(st, 200);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_file_that_is_not_a_rules_file_is_never_quoted() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    let canary = "CANARY-c0ffee-secret";
    let cases = [
        format!(r#"{{"api_key": "{canary}", "{canary}": 1}}"#),
        format!(r#"{{"rules": [{{"purpose": "{canary}", "reply": "x"}}]}}"#),
        format!(r#"{{"rules": [{{"match": "({canary}", "reply": "x"}}]}}"#),
        format!("token={canary}\n"),
    ];
    for (i, text) in cases.iter().enumerate() {
        let path = h.data.join(format!("models/case{i}.json"));
        std::fs::write(&path, text).unwrap();
        let (st, v) = set_chain(
            &h,
            &h.owner_token,
            "team",
            &format!("scripted:{}", path.display()),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let (status, reply, error) = owner_chat(&h, "team", "hello").await;
        assert_eq!(status, "failed", "{text}: {reply}");
        assert!(
            reply.starts_with(mercury::config::DEFAULT_FAILURE_REPLY),
            "{reply}"
        );
        assert!(!reply.contains(canary), "{reply}");
        assert!(
            error.contains(&format!("case{i}.json")),
            "the run's error names the file: {error}"
        );
        assert!(!reply.contains(canary), "{text}: {reply}");
        assert!(!error.contains(canary), "{text}: {error}");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_chain_naming_a_file_outside_the_roots_is_refused_at_use() {
    // A chain written before the rule existed (or by any other way into the
    // table): the host still never opens the file.
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    let outside = h.dir.path().join("planted.json");
    std::fs::write(&outside, r#"{"rules": [{"reply": "PLANTED-CANARY"}]}"#).unwrap();
    let chain = format!("scripted:{}", outside.display());
    h.write(move |tx| {
        tx.execute(
            "INSERT INTO space_config (space_id, key, value, updated_by, updated_at) VALUES ('team', 'model', ?1, 'x', 0)",
            &[&chain],
        )?;
        Ok(())
    });
    let (status, reply, error) = owner_chat(&h, "team", "hello").await;
    assert_eq!(status, "failed", "{reply}");
    assert!(!reply.contains("PLANTED-CANARY"), "{reply}");
    assert!(!error.contains("PLANTED-CANARY"), "{error}");
    assert!(
        error.contains("models/"),
        "the run's error names the rule: {error}"
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Item 5: run tokens after a hard kill
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_token_of_a_turn_interrupted_by_sigkill_is_dead_after_restart() {
    // The first attempt keeps its token and sleeps in its layer; the retried
    // one after the restart finds the `resume-ok` the test puts in the
    // workspace and finishes at once.
    let mut h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"match": "^tool_result\\(shell\\): ", "reply": "done"},
            {"match": "^user: go$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "test -f resume-ok || { printf %s \"$MERCURY_TOKEN\" > run.token; touch started; sleep 600; }"}}]}
        ]}),
        // kim is a stranger answered by an open bot (the sender policy has
        // its own tests, tests/it/pairing.rs).
        config: vec![("ingress.dm_policy", Yaml::String("open".into()))],
        ..Default::default()
    })
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (st, v) = h
        .ingest(&adapter, "dm-k", "test:kim", "go", "k-1", false)
        .await;
    assert_eq!(st, 202, "{v}");
    let space = v["space_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = loop {
        if let Some(p) = h.in_turn_layer("started") {
            break p;
        }
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let token = std::fs::read_to_string(started.with_file_name("run.token")).unwrap();
    let (st, v) = h
        .call(Method::GET, "/api/whoami", Some(&token), None, None)
        .await;
    assert_eq!(st, 200, "the run token works while its run is live: {v}");

    // The sandboxed tool dies with the host (bubblewrap's --die-with-parent).
    h.kill();
    std::fs::write(h.data.join("spaces").join(&space).join("resume-ok"), "").unwrap();
    h.restart_process().await;

    let (st, v) = h
        .call(Method::GET, "/api/whoami", Some(&token), None, None)
        .await;
    assert_eq!(st, 401, "{v}");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM api_tokens WHERE kind = 'run' AND revoked_at IS NULL AND run_id IN (SELECT id FROM runs WHERE status = 'interrupted')"),
        0
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_interrupted_by_sigkill_leaves_no_token_row_after_restart() {
    // Docker: an ask runs only on an isolating backend. The ask's tool call
    // mints its read-only run token, then sleeps.
    let mut h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "ask", "match": "^user: linger$", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 600"}}]},
            {"reply": "ok"}
        ]}),
        sandbox: "docker",
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "x"] {
        h.create_space(s).await;
    }
    h.grant("mgmt", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    h.link("mgmt", "x", "admin").await;
    let ask = {
        let url = h.url.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{url}/api/ask"))
                .bearer_auth(alice)
                .header("x-mercury-space", "mgmt")
                .header("x-mercury-act-as", "x")
                .json(&json!({"message": "linger", "as": "admin"}))
                .timeout(Duration::from_secs(120))
                .send()
                .await
        })
    };
    let live_ask_tokens =
        "SELECT COUNT(*) FROM api_tokens WHERE kind = 'run' AND read_only = 1 AND revoked_at IS NULL";
    assert_eq!(
        h.wait_count(live_ask_tokens, 1, 120).await,
        1,
        "the ask's tool is running"
    );
    h.kill();
    ask.abort();
    h.restart_process().await;
    assert_eq!(
        h.count("SELECT COUNT(*) FROM api_tokens WHERE kind = 'run' AND (read_only = 1 OR space_id = 'x')"),
        0,
        "no token row of the interrupted ask is left"
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Item 6: modes
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_state_db_wal_and_workspaces_are_private_whatever_the_umask() {
    // nextest runs each test in its own process: this umask is ours alone.
    // SAFETY: umask(2) has no memory effects.
    unsafe { libc::umask(0) };
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    let (status, _, _) = owner_chat(&h, "team", "hi").await;
    assert_eq!(status, "done");
    let d = &h.data;
    let ws = d.join("spaces/team");
    for (path, want) in [
        (d.clone(), 0o700),
        (d.join("state.db"), 0o600),
        (d.join("state.db-wal"), 0o600),
        (d.join("state.db-shm"), 0o600),
        (d.join("mercury.yaml"), 0o600),
        (d.join("global"), 0o700),
        (d.join("global/owner.token"), 0o600),
        (d.join("spaces"), 0o700),
        (d.join("models"), 0o700),
        (d.join("reviews"), 0o700),
        (d.join("lock"), 0o600),
        (ws.clone(), 0o700),
        (ws.join("knowledge"), 0o700),
        (ws.join("AGENTS.md"), 0o600),
        (ws.join("MEMORY.md"), 0o600),
    ] {
        assert_eq!(mode(&path), want, "{}", path.display());
    }
    h.stop().await;
}

#[tokio::test]
async fn init_makes_an_empty_existing_dir_private_and_leaves_a_used_one_as_it_was() {
    let base = tempfile::tempdir().unwrap();
    let empty = base.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    mercury::host::init(&empty, "owner").await.unwrap();
    assert_eq!(mode(&empty), 0o700);

    // Someone's directory with other files: init adds its own, private,
    // and does not change the mode of what it did not create.
    let used = base.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("notes.txt"), "mine").unwrap();
    std::fs::set_permissions(&used, std::fs::Permissions::from_mode(0o750)).unwrap();
    mercury::host::init(&used, "owner").await.unwrap();
    assert_eq!(mode(&used), 0o750);
    assert_eq!(mode(&used.join("state.db")), 0o600);
    assert_eq!(mode(&used.join("global")), 0o700);
}

/// Starts `mercury serve` on `data` with stderr piped; the child and its
/// stderr lines (read on a thread).
fn spawn_serve_piped(
    data: &Path,
    bind: &str,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .arg("--bind")
        .arg(bind)
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mercury serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_about_every_loose_mode_it_finds() {
    let (dir, data, port) = prepare(&HostOptions::default()).await;
    std::fs::create_dir(data.join("spaces/old")).unwrap();
    for (path, m) in [
        (data.clone(), 0o755),
        (data.join("state.db"), 0o644),
        (data.join("global/owner.token"), 0o640),
        (data.join("spaces/old"), 0o755),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
    }
    let (mut child, lines) = spawn_serve_piped(&data, &format!("127.0.0.1:{port}"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|l: &String| l.contains("serving on")) {
        assert!(Instant::now() < deadline, "serve did not start: {seen:#?}");
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let warned = |path: &Path, m: &str| {
        seen.iter().any(|l| {
            l.contains("warning") && l.contains(&format!("{} has mode {m}", path.display()))
        })
    };
    let canonical = std::fs::canonicalize(&data).unwrap();
    for (path, m) in [
        (canonical.clone(), "755"),
        (canonical.join("state.db"), "644"),
        (canonical.join("global/owner.token"), "640"),
        (canonical.join("spaces/old"), "755"),
    ] {
        assert!(
            warned(&path, m),
            "no warning for {}: {seen:#?}",
            path.display()
        );
    }
    // Warned, not changed: the operator decides.
    assert_eq!(mode(&data.join("state.db")), 0o644);
    assert!(
        !seen.iter().any(|l| l.contains("mercury.yaml has mode")),
        "a private file is not warned about: {seen:#?}"
    );
    drop(dir);
}

// ---------------------------------------------------------------------------
// Item 7: one host per data dir
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_locked_data_dir_exits_2_naming_the_holder_and_the_first_keeps_serving()
{
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("team").await;
    let socket = h.data.join("api.sock");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let socket_before = inode(&socket);

    let (mut second, lines) = spawn_serve_piped(&h.data, &format!("127.0.0.1:{}", free_port()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = second.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second host kept running on a data dir another host serves");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(2), "a second host must exit 2");
    let stderr: Vec<String> = lines.iter().collect();
    let pid = format!("pid {}", std::process::id());
    assert!(
        stderr
            .iter()
            .any(|l| l.contains(&pid) && l.contains("lock")),
        "names the holder: {stderr:#?}"
    );

    // The first host is untouched: same socket, still answering, still working.
    assert_eq!(
        inode(&socket),
        socket_before,
        "the socket was not taken over"
    );
    let (st, _) = h.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(st, 200);
    let (status, reply, _) = owner_chat(&h, "team", "still there?").await;
    assert_eq!((status.as_str(), reply.as_str()), ("done", "ok"));
    assert_eq!(
        std::fs::read_to_string(h.data.join("lock")).unwrap().trim(),
        std::process::id().to_string()
    );
    h.stop().await;
}

// ---------------------------------------------------------------------------
// Item 8: what the agent image can run (real Docker engine)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_image_runs_its_listed_tools_and_nothing_else() {
    let tools: Vec<&str> = mercury::sandbox::image::TOOLS
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let probe = format!(
        "for t in {list}; do command -v $t >/dev/null 2>&1 || echo missing:$t; done; \
         for t in nc wget busybox telnet ping ip ifconfig udhcpc httpd ftpget tftp ssl_client \
                  awk vi su; do command -v $t >/dev/null 2>&1 && echo present:$t; done; \
         nc 2>/dev/null; echo nc-rc:$?; wget 2>/dev/null; echo wget-rc:$?; \
         echo bin:$(ls /bin); \
         echo usrlocal:$(ls /usr/local/bin); \
         for d in /usr/bin /sbin /usr/sbin; do test -e $d && echo extra-dir:$d; done; \
         grep -rlsa BusyBox /bin /usr /lib /lib64 /etc /sbin; \
         echo works:$(echo hi | base64)-$(printf '%s' b | wc -c)-$(echo a1 | grep -o 1)-$(echo ab | sed s/b/c/)\
-$(printf 'b\\na\\n' | sort | head -n 1)-$(mkdir -p d/e && touch d/e/f && find d -name f)\
-$(basename /x/y)-$(dirname /x/y)-$(id -u >/dev/null && echo id)-$(env | grep -c MERCURY_SPACE)-$(stat -c %s d/e/f)\
-$(echo t | tee d/t | tail -n 1)-$(cat d/t)-$(cp d/t d/u && mv d/u d/v && ls d | wc -l)\
-$(rm -r d && test ! -e d && true && ! false && echo ok)-$(sleep 0 && hostname | wc -l)",
        list = tools.join(" ")
    );
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"},
            {"match": "^user: probe$", "tool_calls": [{"name": "shell", "arguments": {"command": probe}}]}
        ]}),
        sandbox: "docker",
        ..Default::default()
    })
    .await;
    h.create_space("team").await;
    let (status, out, error) = owner_chat(&h, "team", "probe").await;
    assert_eq!(status, "done", "{out} {error}");
    assert!(!out.contains("missing:"), "a listed tool is absent: {out}");
    assert!(
        !out.contains("present:"),
        "an unlisted program is runnable: {out}"
    );
    assert!(out.contains("nc-rc:127"), "{out}");
    assert!(out.contains("wget-rc:127"), "{out}");
    let line = |prefix: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line: {out}"))
            .to_owned()
    };
    let mut listed: Vec<&str> = tools.clone();
    listed.sort();
    let bin = line("bin:");
    let in_bin: Vec<&str> = bin.split_whitespace().collect();
    let mut sorted = in_bin.clone();
    sorted.sort();
    assert_eq!(sorted, listed, "/bin holds exactly the listed tools");
    assert_eq!(line("usrlocal:"), "mrctl");
    assert!(!out.contains("extra-dir:"), "{out}");
    assert!(
        !out.lines().any(|l| l.starts_with('/')),
        "no file in the image is busybox: {out}"
    );
    assert_eq!(line("works:"), "aGkK-1-1-ac-a-d/e/f-y-/x-id-1-0-t-t-3-ok-1");
    h.stop().await;
}
