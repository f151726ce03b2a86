//! Security I (issue 10, items 1, 3, 4, 5): whatever a chat participant makes
//! the agent do stays inside that space's workspace and its limits, on the
//! docker and the bubblewrap backends alike. Each test drives a real host.
//!
//! The scripted model's first rule answers `LEAKED` whenever the canary's
//! secret appears anywhere in a request: so "the canary reached no model
//! request" is asserted on what the provider really received.

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

async fn chat(host: &TestHost, space: &str, text: &str) -> Value {
    host.chat(space, text).await
}

fn reply(v: &Value) -> String {
    v["reply"].as_str().unwrap_or_default().to_owned()
}

struct Canary {
    secret: String,
    file: std::path::PathBuf,
}

fn canary(host: &TestHost) -> Canary {
    let secret = format!("CANARY-{}", uuid::Uuid::new_v4().simple());
    let file = host.dir.path().join("outside").join("canary.txt");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, &secret).unwrap();
    Canary { secret, file }
}

fn symlink_rules(canary_path: &str, canary_dir: &str) -> Value {
    let plant = format!(
        "ln -sf {canary_path} MEMORY.md && ln -sf {canary_path} AGENTS.md && \
         ln -sf {canary_path} knowledge/k.md && ln -sfn {canary_dir} outdir && echo planted"
    );
    json!({"rules": [
        {"match_any": "CANARY-[0-9a-f]{32}", "reply": "LEAKED"},
        {"match": "^user: plant$", "tool_calls": [{"name": "shell", "arguments": {"command": plant}}]},
        {"match": "^user: cat$", "tool_calls": [{"name": "shell", "arguments": {
            "command": "cat MEMORY.md AGENTS.md knowledge/k.md outdir/canary.txt 2>&1; echo catted"}}]},
        {"match": "^user: read (.*)$", "tool_calls": [{"name": "read_file", "arguments": {"path": "$1"}}]},
        {"match": "^user: list (.*)$", "tool_calls": [{"name": "list_files", "arguments": {"path": "$1"}}]},
        {"match": "^user: write (\\S+)$", "tool_calls": [{"name": "write_file", "arguments": {"path": "$1", "content": "overwritten"}}]},
        {"match": "(?s)^tool_result\\((\\w+)\\): (.*)$", "reply": "$1 said: $2"},
        {"reply": "hi"}
    ]})
}

async fn planted_symlinks_never_reach_the_model_a_reply_or_an_ask(sandbox: &'static str) {
    // The canary's path is known before the host starts only through the
    // host's temp dir, so the rules name it through a fixed link the test
    // makes there: `<tmp>/outside/canary.txt`.
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [{"reply": "placeholder"}]}),
        sandbox,
        ..Default::default()
    })
    .await;
    let c = canary(&host);
    let rules = symlink_rules(
        &c.file.display().to_string(),
        &c.file.parent().unwrap().display().to_string(),
    );
    let models = host.data.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let script = models.join("symlinks.json");
    std::fs::write(&script, rules.to_string()).unwrap();
    for s in ["mgmt", "alpha"] {
        host.create_space(s).await;
        let (st, v) = host
            .owner(
                Method::PUT,
                "/api/model",
                Some(s),
                Some(json!({"chain": [format!("scripted:{}", script.display())]})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
    }
    host.link("mgmt", "alpha", "admin").await;

    let planted = chat(&host, "alpha", "plant").await;
    assert!(reply(&planted).contains("planted"), "{planted}");
    let ws = host.data.join("spaces/alpha");
    for name in ["MEMORY.md", "AGENTS.md", "knowledge/k.md", "outdir"] {
        let meta = std::fs::symlink_metadata(ws.join(name)).expect(name);
        assert!(
            meta.file_type().is_symlink(),
            "{name} was planted as a link"
        );
    }

    // The next turn's prompt is built from AGENTS.md and MEMORY.md.
    let next = chat(&host, "alpha", "hello").await;
    assert_eq!(reply(&next), "hi", "{next}");
    // Host-side file tools refuse links, `..` and absolute paths.
    for path in [
        "MEMORY.md",
        "knowledge/k.md",
        "outdir/canary.txt",
        "../../global/owner.token",
        "/etc/hostname",
    ] {
        let v = chat(&host, "alpha", &format!("read {path}")).await;
        let r = reply(&v);
        assert!(r.starts_with("read_file said: error:"), "{path}: {v}");
    }
    let v = chat(&host, "alpha", "list outdir").await;
    assert!(reply(&v).starts_with("list_files said: error:"), "{v}");
    let v = chat(&host, "alpha", "list ..").await;
    assert!(reply(&v).starts_with("list_files said: error:"), "{v}");
    // Writing at a link's name replaces the link; the target is untouched.
    let v = chat(&host, "alpha", "write knowledge/k.md").await;
    assert!(reply(&v).starts_with("write_file said: wrote"), "{v}");
    assert_eq!(std::fs::read_to_string(&c.file).unwrap(), c.secret);
    // Inside the sandbox the links resolve in the sandbox's own view.
    let v = chat(&host, "alpha", "cat").await;
    assert!(reply(&v).contains("catted"), "{v}");
    assert!(!reply(&v).contains("LEAKED"), "{v}");

    // An ask on alpha builds its prompt from the same (planted) files.
    let owner = host.owner_token.clone();
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &owner,
            "mgmt",
            "alpha",
            Some(json!({"message": "hello"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["reply"].as_str().unwrap_or_default().contains("hi"),
        "{v}"
    );

    // Nowhere the canary could have surfaced holds it.
    let leaked: i64 = host.read(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM messages WHERE text LIKE '%CANARY-%' OR text LIKE '%LEAKED%'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(leaked, 0);
    assert_eq!(std::fs::read_to_string(&c.file).unwrap(), c.secret);
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_planted_symlinks_never_reach_the_model_a_reply_or_an_ask() {
    planted_symlinks_never_reach_the_model_a_reply_or_an_ask("process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_planted_symlinks_never_reach_the_model_a_reply_or_an_ask() {
    planted_symlinks_never_reach_the_model_a_reply_or_an_ask("docker").await;
}

async fn a_turn_past_the_quota_fails_and_leaves_the_workspace_as_it_was(sandbox: &'static str) {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: fill$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo changed > AGENTS.md; rm -f MEMORY.md; mkdir -p d; echo x > d/new; \
                 dd if=/dev/zero of=big bs=1M count=8 2>&1 | tail -1"}}]},
            {"match": "^user: small$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "dd if=/dev/zero of=ok.bin bs=1K count=100 2>/dev/null; echo fine"}}]},
            {"match": "^tool_result\\(shell\\)", "reply": "wrote it"},
            {"reply": "hi"}
        ]}),
        sandbox,
        config: vec![("sandbox.workspace_mb", Yaml::from(2))],
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let before = host.workspace_hashes("alpha");
    let v = chat(&host, "alpha", "fill").await;
    assert_eq!(v["status"], "failed", "{v}");
    let error: String = host.read(|c| {
        c.query_row(
            "SELECT error FROM runs WHERE id = ?1",
            &[&v["run_id"].as_str().unwrap()],
            |r| r.get(0),
        )
    });
    assert!(
        error.contains("workspace quota (sandbox.workspace_mb = 2)"),
        "{error}"
    );
    assert!(reply(&v).starts_with(mercury::config::DEFAULT_FAILURE_REPLY));
    assert_eq!(host.workspace_hashes("alpha"), before);
    assert!(!host.data.join("spaces/alpha/big").exists());
    // Within the quota, a turn's writes are kept.
    let v = chat(&host, "alpha", "small").await;
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(
        std::fs::metadata(host.data.join("spaces/alpha/ok.bin"))
            .unwrap()
            .len(),
        100 * 1024
    );
    assert_eq!(host.mounts_below_data(), Vec::<String>::new());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_a_turn_past_the_quota_fails_and_leaves_the_workspace_as_it_was() {
    a_turn_past_the_quota_fails_and_leaves_the_workspace_as_it_was("process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_a_turn_past_the_quota_fails_and_leaves_the_workspace_as_it_was() {
    a_turn_past_the_quota_fails_and_leaves_the_workspace_as_it_was("docker").await;
}

fn ask_writer_rules() -> Value {
    json!({"rules": [
        {"purpose": "ask", "match": "^user: wreck$", "tool_calls": [{"name": "shell", "arguments": {"command":
            "echo hacked >> MEMORY.md; rm -f AGENTS.md; rm -rf knowledge; mkdir evil; echo x > evil/f; \
             ln -s /etc/passwd passwd; echo wrecked"}}]},
        {"purpose": "ask", "match": "^tool_result\\(shell\\)", "tool_calls": [{"name": "write_file",
            "arguments": {"path": "MEMORY.md", "content": "replaced"}}]},
        {"purpose": "ask", "match": "^tool_result\\(write_file\\)", "reply": "all done"},
        {"reply": "ok"}
    ]})
}

/// Spaces `mgmt` and `x`, an admin link between them, and one ask of `x`
/// as the owner; returns x's workspace before, and the answer.
async fn ask_x(host: &TestHost, body: Value) -> (Vec<(String, String)>, u16, Value) {
    for s in ["mgmt", "x"] {
        host.create_space(s).await;
    }
    host.link("mgmt", "x", "admin").await;
    let before = host.workspace_hashes("x");
    let owner = host.owner_token.clone();
    let (st, v) = host
        .act_as(Method::POST, "/api/ask", &owner, "mgmt", "x", Some(body))
        .await;
    (before, st, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_an_ask_leaves_the_target_byte_identical() {
    let host = TestHost::start(HostOptions {
        model: ask_writer_rules(),
        sandbox: "process",
        ..Default::default()
    })
    .await;
    let (before, st, v) = ask_x(&host, json!({"message": "wreck", "as": "admin"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "all done", "{v}");
    assert_eq!(host.workspace_hashes("x"), before);
    assert!(!host.data.join("spaces/x/evil").exists());
    assert_eq!(
        std::fs::read_dir(host.data.join("tmp"))
            .map(std::iter::Iterator::count)
            .unwrap_or(0),
        0,
        "the ask's layer is gone"
    );
    assert_eq!(host.mounts_below_data(), Vec::<String>::new());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_on_an_unisolated_backend_is_refused_with_503() {
    let host = TestHost::start(HostOptions {
        model: ask_writer_rules(),
        sandbox: "process",
        config: vec![
            ("sandbox.allow_unisolated", Yaml::from(true)),
            ("sandbox.bwrap", Yaml::from("/nonexistent/bwrap")),
        ],
        ..Default::default()
    })
    .await;
    let (before, st, v) = ask_x(&host, json!({"message": "wreck"})).await;
    assert_eq!(st, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("isolating sandbox"),
        "{v}"
    );
    assert_eq!(host.workspace_hashes("x"), before);
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_backend_without_bubblewrap_or_opt_in_does_not_start() {
    let opts = HostOptions {
        sandbox: "process",
        config: vec![("sandbox.bwrap", Yaml::from("/nonexistent/bwrap"))],
        ..Default::default()
    };
    let (_dir, data, _port) = crate::common::prepare(&opts).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["serve", "--data-dir"])
        .arg(&data)
        .output()
        .expect("run serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sandbox.allow_unisolated") && err.contains("bubblewrap"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_ask_leaves_no_scratch_and_no_live_token_after_restart() {
    let mut host = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "ask", "match": "^user: hang$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo \"$MERCURY_TOKEN\" > token && echo copy > marker && sleep 600"}}]},
            {"reply": "ok"}
        ]}),
        sandbox: "process",
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "x"] {
        host.create_space(s).await;
    }
    host.link("mgmt", "x", "admin").await;
    let request = host
        .http
        .post(format!("{}/api/ask", host.url))
        .bearer_auth(&host.owner_token)
        .header("x-mercury-space", "mgmt")
        .header("x-mercury-act-as", "x")
        .json(&json!({"message": "hang"}));
    let ask = tokio::spawn(async move { request.send().await });
    let token_file = {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let found = std::fs::read_dir(host.data.join("tmp"))
                .ok()
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .map(|e| e.path().join("merged/token"))
                .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.trim().len() > 10));
            if let Some(p) = found {
                break p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the ask never started its tool"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    let (st, _) = host
        .call(Method::GET, "/api/whoami", Some(&token), Some("x"), None)
        .await;
    assert_eq!(st, 200, "the ask's run token works while the ask runs");
    host.kill();
    ask.abort();
    assert!(
        !host.mounts_below_data().is_empty(),
        "the kill left the ask's layer mounted"
    );

    host.restart_process().await;
    assert_eq!(host.mounts_below_data(), Vec::<String>::new());
    assert_eq!(
        std::fs::read_dir(host.data.join("tmp"))
            .map(std::iter::Iterator::count)
            .unwrap_or(0),
        0,
        "no scratch directory is left"
    );
    assert!(!host.data.join("spaces/x/marker").exists());
    let (st, v) = host
        .call(Method::GET, "/api/whoami", Some(&token), Some("x"), None)
        .await;
    assert_eq!(
        st, 401,
        "the interrupted ask's run token still answers: {v}"
    );
    host.kill();
}

async fn a_file_a_turn_writes_cannot_be_run_as_a_program(sandbox: &'static str) {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: run$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "cp /bin/true ./t && chmod +x ./t && { ./t; echo work=$?; }; \
                 cp ./t /tmp/t && chmod +x /tmp/t && { /tmp/t; echo tmp=$?; }"}}]},
            {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"}
        ]}),
        sandbox,
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let v = chat(&host, "alpha", "run").await;
    let out = reply(&v);
    // 126: found but not executable (the mount is noexec).
    assert!(out.contains("work=126"), "{v}");
    if sandbox == "docker" {
        assert!(out.contains("tmp=126"), "{v}");
    }
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_a_file_a_turn_writes_cannot_be_run_as_a_program() {
    a_file_a_turn_writes_cannot_be_run_as_a_program("process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_a_file_a_turn_writes_cannot_be_run_as_a_program() {
    a_file_a_turn_writes_cannot_be_run_as_a_program("docker").await;
}

/// Issue 23, item 10: bubblewrap maps the sandbox's uid to the uid that
/// starts it, so on a root host a turn ran as host root. It must run as
/// nobody on the host: its files come back nobody's, without setuid, and the
/// data dir stays closed to nobody all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_a_root_hosts_turn_runs_and_writes_as_nobody_on_the_host() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the host under test must run as root");
        return;
    }
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: run$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo made > made.txt && chmod 4755 made.txt && mkdir -p d && echo x > d/y; \
                 cat AGENTS.md >/dev/null && echo agents=read"}}]},
            {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"}
        ]}),
        sandbox: "process",
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let v = chat(&host, "alpha", "run").await;
    let out = reply(&v);
    assert!(out.contains("agents=read"), "{v}");
    let ws = host.data.join("spaces").join("alpha");
    for file in [ws.join("made.txt"), ws.join("d").join("y")] {
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (65534, 65534),
            "{}",
            file.display()
        );
        assert_eq!(meta.mode() & 0o6000, 0, "{}", file.display());
    }
    let data_mode = std::fs::metadata(&host.data).unwrap().permissions().mode();
    assert_eq!(
        data_mode & 0o077,
        0,
        "the data dir was opened: {data_mode:o}"
    );
    host.stop().await;
}
