//! Extensions on MCP (issue 29), against real servers no one here wrote: the
//! PyPI `mcp-server-time` over stdio inside the bubblewrap sandbox, and an
//! HTTP server on the PyPI `mcp` SDK (tests/fixtures/mcp_http_server.py)
//! for the host's broker. Both come from the virtualenv `deploy/setup.sh`
//! installs. Under the docker backend a stdio server runs in its own
//! container from a runtime image `mercury ext image` builds out of that
//! virtualenv and the host's Python (the agent image holds no Python).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{free_port, HostOptions, TestHost};

const VENV_PYTHON: &str = "/opt/mercury/mcp-venv/bin/python";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mercury_ext(data: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mercury"))
        .arg("ext")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("run mercury ext")
}

fn rules() -> Value {
    json!({"rules": [
        {"match": "^user: hello hook", "match_any": "HOOK-FRAGMENT-42 for h", "reply": "fragment seen"},
        {"match": "^user: what time", "tool_calls": [{"name": "time_get_current_time", "arguments": {"timezone": "Europe/Paris"}}]},
        {"match": "^user: look up (\\w+)", "tool_calls": [{"name": "web_lookup", "arguments": {"q": "$1"}}]},
        {"match": "^user: post (\\w+)", "tool_calls": [{"name": "web_post_note", "arguments": {"text": "$1"}}]},
        {"match": "^user: hang", "tool_calls": [{"name": "web_hang", "arguments": {}}]},
        {"match": "^user: huge", "tool_calls": [{"name": "web_huge", "arguments": {}}]},
        {"match": "^user: snoop (\\S+)", "tool_calls": [{"name": "shell", "arguments": {"command": "env; grep -rl -- '$1' /work /tmp /run 2>/dev/null; echo snooped"}}]},
        {"match": "(?s)^tool_result\\(([a-z_]+)\\): (.*)", "reply": "[$1] $2"},
        {"reply": "ok"}
    ]})
}

async fn host() -> TestHost {
    TestHost::start(HostOptions {
        model: rules(),
        sandbox: "process",
        config: vec![("turn.tool_timeout_secs", 5.into())],
        ..Default::default()
    })
    .await
}

async fn enable(host: &TestHost, space: &str, name: &str) {
    let (st, v) = host
        .owner(
            Method::POST,
            &format!("/api/extensions/{name}/enable"),
            Some(space),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

/// The fixture HTTP server on a free port; killed when dropped.
struct Fixture {
    child: Child,
    port: u16,
    seen: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn fixture(token: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let port = free_port();
    let child = Command::new(VENV_PYTHON)
        .arg(repo().join("tests/fixtures/mcp_http_server.py"))
        .arg(port.to_string())
        .arg(token)
        .arg(&seen)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fixture server (deploy/setup.sh installs its virtualenv)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Fixture {
        child,
        port,
        seen,
        _dir: dir,
    }
}

/// An extension `web` on the fixture, its credential in host env `var`.
fn web_extension(port: u16, var: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("extension.toml"),
        format!(
            "name = \"web\"\ndescription = \"the fixture\"\n[servers.web]\ntransport = \"http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ncredential_env = \"{var}\"\n"
        ),
    )
    .unwrap();
    dir
}

async fn steps_of(host: &TestHost, space: &str, run: &Value) -> Vec<Value> {
    let (st, v) = host
        .owner(
            Method::GET,
            &format!("/api/runs/{}", run.as_str().unwrap()),
            Some(space),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["steps"].as_array().unwrap().clone()
}

#[tokio::test]
async fn extensions_a_bad_manifest_is_refused_at_add_with_its_field_named() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("extension.toml"),
        "name = \"bad\"\n[servers.s]\ntransport = \"stdio\"\ncommand = [\"python\"]\n",
    )
    .unwrap();
    let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("servers.s.command"), "{err}");
    let listed = mercury_ext(&host.data, &["list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).trim().is_empty());
    // An unknown field is named too.
    std::fs::write(
        dir.path().join("extension.toml"),
        "name = \"bad\"\ntoken = \"k\"\n",
    )
    .unwrap();
    let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_time_over_stdio_in_the_sandbox_answers_and_is_traced() {
    let host = host().await;
    for s in ["alpha", "beta"] {
        host.create_space(s).await;
    }
    let out = mercury_ext(
        &host.data,
        &["add", repo().join("examples/time").to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&mercury_ext(&host.data, &["list"]).stdout).into_owned();
    assert!(listed.starts_with("time\t"), "{listed}");
    // A member cannot enable it: ext.manage is an admin's.
    host.grant("alpha", "bob", "member").await;
    let bob = host.token("bob", "user").await;
    let (st, _) = host
        .call(
            Method::POST,
            "/api/extensions/time/enable",
            Some(&bob),
            Some("alpha"),
            None,
        )
        .await;
    assert_eq!(st, 403);
    enable(&host, "alpha", "time").await;

    let v = host.chat("alpha", "what time is it in Paris?").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.starts_with("[time_get_current_time]"), "{v}");
    assert!(reply.contains("Europe/Paris"), "{v}");
    let steps = steps_of(&host, "alpha", &v["run_id"]).await;
    let call = steps
        .iter()
        .find(|s| s["name"] == "time_get_current_time")
        .expect("the MCP call is a step");
    assert_eq!(call["kind"], "tool");
    assert!(call["arguments"].as_str().unwrap().contains("Europe/Paris"));
    assert!(call["output"].as_str().unwrap().contains("Europe/Paris"));
    // A second turn uses the kept catalog and still answers.
    let v = host.chat("alpha", "what time is it now?").await;
    assert!(v["reply"].as_str().unwrap().contains("datetime"), "{v}");

    // Beta never enabled it: the tool does not exist there.
    let v = host.chat("beta", "what time is it in Paris?").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.contains("there is no tool named"), "{v}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_the_http_broker_holds_the_credential_and_cuts_off_bad_servers() {
    let token = format!("fixture-secret-{}", uuid::Uuid::new_v4().simple());
    let var = "MERCURY_TEST_WEB_MCP_TOKEN";
    // SAFETY: no other test reads or writes this variable.
    unsafe { std::env::set_var(var, &token) };
    let fx = fixture(&token).await;
    let host = host().await;
    for s in ["mgmt", "x"] {
        host.create_space(s).await;
    }
    let ext = web_extension(fx.port, var);
    let out = mercury_ext(&host.data, &["add", ext.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    enable(&host, "x", "web").await;

    let v = host.chat("x", "look up hello").await;
    assert_eq!(v["reply"], "[web_lookup] broker says hello", "{v}");
    assert_eq!(
        std::fs::read_to_string(&fx.seen).unwrap(),
        format!("Bearer {token}")
    );
    // The credential is nowhere a sandbox command can read.
    let v = host.chat("x", &format!("snoop {token}")).await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.contains("snooped"), "{v}");
    assert!(
        !reply.contains(&token),
        "the sandbox saw the credential: {reply}"
    );

    // A server that hangs or answers 10 MB is cut off with a sentence.
    let v = host.chat("x", "hang").await;
    assert!(v["reply"].as_str().unwrap().contains("cut off"), "{v}");
    let v = host.chat("x", "huge").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.starts_with("[web_huge] error:"), "{reply:.300}");
    assert!(reply.len() < 4096, "{}", reply.len());
    // …and the host keeps answering.
    let v = host.chat("x", "look up again").await;
    assert_eq!(v["reply"], "[web_lookup] broker says again", "{v}");

    // ask: a read-only tool runs, one that acts is refused and listed.
    host.grant("mgmt", "alice", "admin").await;
    host.link("mgmt", "x", "admin").await;
    let alice = host.token("alice", "user").await;
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "mgmt",
            "x",
            Some(json!({"message": "post secretly", "as": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["reply"]
            .as_str()
            .unwrap()
            .contains("not marked read-only"),
        "{v}"
    );
    let refusals = v["refusals"].as_array().unwrap();
    assert!(
        refusals.iter().any(|r| r["route"] == "web_post_note"),
        "{v}"
    );
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "mgmt",
            "x",
            Some(json!({"message": "look up asked", "as": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "[web_lookup] broker says asked", "{v}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_hooks_add_a_prompt_fragment_or_block_a_turn() {
    let token = "hook-fixture-token";
    let var = "MERCURY_TEST_HOOK_MCP_TOKEN";
    // SAFETY: no other test reads or writes this variable.
    unsafe { std::env::set_var(var, token) };
    let fx = fixture(token).await;
    let host = host().await;
    host.create_space("h").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("extension.toml"),
        format!(
            "name = \"hooks\"\n[servers.gate]\ntransport = \"http\"\nurl = \"http://127.0.0.1:{}/mcp\"\ncredential_env = \"{var}\"\n[jobs.tick]\nserver = \"gate\"\ntool = \"tick\"\ninterval_secs = 1\narguments = {{ label = \"hello\" }}\n[hooks]\nbefore_turn = {{ server = \"gate\", tool = \"gate\" }}\nafter_turn = {{ server = \"gate\", tool = \"audit\" }}\ntimeout_secs = 5\n",
            fx.port
        ),
    )
    .unwrap();
    let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Before enabling, no hook runs.
    let v = host.chat("h", "hello hook").await;
    assert_eq!(v["reply"], "ok", "{v}");
    enable(&host, "h", "hooks").await;
    let v = host.chat("h", "hello hook").await;
    assert_eq!(v["reply"], "fragment seen", "{v}");
    let steps = steps_of(&host, "h", &v["run_id"]).await;
    let names: Vec<&str> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"hooks.before_turn"), "{names:?}");
    assert_eq!(names.last(), Some(&"hooks.after_turn"), "{names:?}");
    assert_eq!(steps[0]["kind"], "tool");
    assert!(
        steps[0]["output"]
            .as_str()
            .unwrap()
            .contains("HOOK-FRAGMENT-42"),
        "{steps:?}"
    );
    let v = host.chat("h", "a forbidden thing").await;
    assert_eq!(
        v["reply"], "hooks blocked this turn: the word forbidden is not answered here",
        "{v}"
    );
    // The job fires on its interval and writes the space's extension_state.
    let mut state = None;
    for _ in 0..60 {
        state = host.read(|c| mercury::storage::extensions::state_get(c, "hooks", "h", "label"));
        if state.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(state.as_deref(), Some("hello h"));
    let job = host.read(|c| mercury::storage::extensions::state_get(c, "hooks", "h", "job.tick"));
    assert!(job.unwrap().contains("ticks"));
    host.stop().await;
}

/// A copy of `examples/time` whose manifest gets `extra` appended (and, when
/// `permission_roles` is set, that `[permission]` instead of the example's).
fn time_copy(permission_roles: Option<&str>, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = repo().join("examples/time");
    let mut manifest = std::fs::read_to_string(src.join("extension.toml")).unwrap();
    if let Some(roles) = permission_roles {
        let at = manifest.find("[permission]").unwrap();
        manifest.truncate(at);
        manifest.push_str(&format!("[permission]\nroles = {roles}\n"));
    }
    manifest.push_str(extra);
    std::fs::write(dir.path().join("extension.toml"), manifest).unwrap();
    std::fs::create_dir_all(dir.path().join("skills/meeting")).unwrap();
    std::fs::copy(
        src.join("skills/meeting/SKILL.md"),
        dir.path().join("skills/meeting/SKILL.md"),
    )
    .unwrap();
    dir
}

fn add(host: &TestHost, dir: &Path) {
    let out = mercury_ext(&host.data, &["add", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn skills_host() -> TestHost {
    TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: which skills", "match_any": "- time/meeting: Plan a meeting across time zones with the time tools \\(/run/mercury/skills/time/meeting\\)", "reply": "skill offered"},
            {"match": "^user: which skills", "reply": "no skill"},
            {"match": "^user: read the skill", "tool_calls": [{"name": "shell", "arguments": {"command": "cat /run/mercury/skills/time/meeting/SKILL.md; echo tamper > /run/mercury/skills/time/meeting/SKILL.md && echo WROTE || echo refused-write"}}]},
            {"match": "(?s)^tool_result\\(([a-z_]+)\\): (.*)", "reply": "[$1] $2"},
            {"reply": "ok"}
        ]}),
        sandbox: "process",
        config: vec![("turn.tool_timeout_secs", 5.into())],
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_skills_are_offered_in_the_prompt_and_readable_read_only_in_the_sandbox() {
    let host = skills_host().await;
    for s in ["on", "off"] {
        host.create_space(s).await;
    }
    add(&host, &repo().join("examples/time"));
    enable(&host, "on", "time").await;
    let v = host.chat("on", "which skills do you have?").await;
    assert_eq!(v["reply"], "skill offered", "{v}");
    let v = host.chat("off", "which skills do you have?").await;
    assert_eq!(v["reply"], "no skill", "{v}");

    let v = host.chat("on", "read the skill").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(
        reply.contains("# Planning a meeting across time zones"),
        "{v}"
    );
    assert!(
        reply.contains("refused-write") && !reply.contains("WROTE"),
        "{v}"
    );
    let installed = host.data.join("extensions/time/skills/meeting/SKILL.md");
    assert!(!std::fs::read_to_string(installed)
        .unwrap()
        .contains("tamper"));
    // A space without the extension has no such directory.
    let v = host.chat("off", "read the skill").await;
    assert!(!v["reply"].as_str().unwrap().contains("Planning"), "{v}");
    host.stop().await;
}

#[tokio::test]
async fn extensions_config_keys_are_checked_against_the_manifest_schema() {
    let host = host().await;
    for s in ["c", "d"] {
        host.create_space(s).await;
    }
    // A schema outside the subset is refused at add, the field named.
    let bad = time_copy(
        None,
        "\n[config.when]\ntype = \"string\"\nformat = \"date-time\"\n",
    );
    let out = mercury_ext(&host.data, &["add", bad.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("field `config.when.format`"), "{err}");
    assert!(err.contains("JSON-schema subset"), "{err}");

    let good = time_copy(
        None,
        "\n[config.slots]\ntype = \"integer\"\nminimum = 1\nmaximum = 8\n",
    );
    add(&host, good.path());
    enable(&host, "c", "time").await;
    let set = |key: &str, value: &str| json!({"key": key, "value": value});
    let put = |space: &'static str, body: Value| {
        let host = &host;
        async move {
            host.owner(Method::PUT, "/api/config", Some(space), Some(body))
                .await
        }
    };
    let (st, v) = put("c", set("time.home_zone", "Europe/Paris")).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = put("c", set("time.home_zone", "not a zone!")).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v.to_string()
            .contains("time.home_zone: must match the pattern"),
        "{v}"
    );
    let (st, v) = put("c", set("time.slots", "9")).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v.to_string().contains("time.slots: must be at most 8"),
        "{v}"
    );
    let (st, v) = put("c", set("time.slots", "three")).await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("must be a whole number"), "{v}");
    let (st, v) = put("c", set("time.slots", "3")).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = put("c", set("time.colour", "red")).await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("declares no such key"), "{v}");
    // A space that did not enable it cannot set its keys.
    let (st, v) = put("d", set("time.slots", "3")).await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("not enabled in this space"), "{v}");
    // A member cannot set them (config.set).
    host.grant("c", "bob", "member").await;
    let bob = host.token("bob", "user").await;
    let (st, _) = host
        .call(
            Method::PUT,
            "/api/config",
            Some(&bob),
            Some("c"),
            Some(set("time.slots", "2")),
        )
        .await;
    assert_eq!(st, 403);
    let stored = host.read(|c| {
        mercury::storage::spaces::kv_get(
            c,
            mercury::storage::spaces::KvTable::Config,
            "c",
            "time.slots",
        )
    });
    assert_eq!(stored.as_deref(), Some("3"));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_own_permission_gates_its_tools_through_the_roles() {
    let host = host().await;
    host.create_space("p").await;
    let ext = time_copy(Some("[\"admin\"]"), "");
    add(&host, ext.path());
    enable(&host, "p", "time").await;
    host.grant("p", "bob", "member").await;
    let bob = host.token("bob", "user").await;
    let chat = |text: &'static str| {
        let (host, bob) = (&host, bob.clone());
        async move {
            let (st, v) = host
                .call(
                    Method::POST,
                    "/api/chat",
                    Some(&bob),
                    Some("p"),
                    Some(json!({"text": text})),
                )
                .await;
            assert_eq!(st, 200, "{v}");
            v["reply"].as_str().unwrap().to_owned()
        }
    };
    // A member does not hold ext.time (the manifest gives it to admin only).
    let reply = chat("what time is it in Paris?").await;
    assert!(
        reply.contains("time_get_current_time needs the permission ext.time, which the role member does not hold"),
        "{reply}"
    );
    // Granted through the roles machinery: a role whose set names ext.time.
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("p"),
            Some(json!({"role": "timekeeper", "permissions": ["prompt", "ext.time"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("p"),
            Some(json!({"role": "x", "permissions": ["ext.nosuch_"]})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    // `permissions get` lists who holds ext.time: admin (by the manifest)
    // and timekeeper (by its set), not member.
    let (st, v) = host
        .owner(Method::GET, "/api/permissions", Some("p"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    let holds = |role: &str| {
        v["roles"][role]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == "ext.time"))
    };
    assert!(
        holds("admin") && holds("timekeeper") && !holds("member"),
        "{v}"
    );
    let (st, v) = host
        .owner(
            Method::GET,
            "/api/permissions?role=timekeeper",
            Some("p"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["permissions"], json!(["prompt", "ext.time"]), "{v}");
    host.grant("p", "bob", "timekeeper").await;
    let reply = chat("what time is it in Paris?").await;
    assert!(
        reply.starts_with("[time_get_current_time]") && reply.contains("Europe/Paris"),
        "{reply}"
    );
    // Revoked: back to a member, refused again.
    let (st, v) = host
        .owner(Method::DELETE, "/api/roles/bob", Some("p"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    let reply = chat("what time is it in Paris?").await;
    assert!(reply.contains("needs the permission ext.time"), "{reply}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_job_runs_are_runs_with_a_step_in_runs_show() {
    let token = "job-fixture-token";
    let var = "MERCURY_TEST_JOB_MCP_TOKEN";
    // SAFETY: no other test reads or writes this variable.
    unsafe { std::env::set_var(var, token) };
    let fx = fixture(token).await;
    let host = host().await;
    host.create_space("j").await;
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "name = \"jobs\"\n[servers.gate]\ntransport = \"http\"\nurl = \"http://127.0.0.1:{}/mcp\"\ncredential_env = \"{var}\"\n[jobs.tick]\nserver = \"gate\"\ntool = \"tick\"\ninterval_secs = 1\narguments = {{ label = \"run\" }}\n",
        fx.port
    );
    // A cron schedule is checked at add (both, or a bad expression, refused).
    for (bad, field) in [
        (
            manifest.replace(
                "interval_secs = 1",
                "interval_secs = 1\ncron = \"* * * * *\"",
            ),
            "jobs.tick.cron",
        ),
        (
            manifest.replace("interval_secs = 1", "cron = \"61 * * * *\""),
            "jobs.tick.cron",
        ),
    ] {
        std::fs::write(dir.path().join("extension.toml"), bad).unwrap();
        let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(field));
    }
    std::fs::write(dir.path().join("extension.toml"), &manifest).unwrap();
    add(&host, dir.path());
    enable(&host, "j", "jobs").await;
    let mut runs = Vec::new();
    for _ in 0..60 {
        runs = host
            .read(|c| mercury::storage::runs::list(c, "j", 20))
            .into_iter()
            .filter(|r| r.kind == "job" && r.status == "done")
            .collect();
        if !runs.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let run = runs.first().expect("a job run in the space");
    let steps = steps_of(&host, "j", &json!(run.id)).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["name"], "jobs.job.tick");
    assert_eq!(steps[0]["kind"], "tool");
    assert!(
        steps[0]["arguments"]
            .as_str()
            .unwrap()
            .contains("\"label\":\"run\""),
        "{steps:?}"
    );
    assert!(
        steps[0]["output"].as_str().unwrap().contains("ticks"),
        "{steps:?}"
    );
    host.stop().await;
}

/// A shadow host (its data dir under the temp root) with `extra` config.
async fn shadow_host(extra: Vec<(&'static str, serde_yaml_ng::Value)>) -> TestHost {
    let root = std::fs::canonicalize(std::env::temp_dir()).unwrap();
    let mut config = vec![
        ("turn.tool_timeout_secs", 5.into()),
        ("shadow", true.into()),
        ("shadow_root", root.display().to_string().into()),
    ];
    config.extend(extra);
    TestHost::start(HostOptions {
        model: rules(),
        sandbox: "process",
        config,
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_a_shadow_calls_only_the_http_servers_its_config_names() {
    let token = "shadow-fixture-token";
    let var = "MERCURY_TEST_SHADOW_MCP_TOKEN";
    // SAFETY: no other test reads or writes this variable.
    unsafe { std::env::set_var(var, token) };
    let fx = fixture(token).await;
    for (named, expect) in [
        (false, None),
        (true, Some("[web_lookup] broker says shadowed")),
    ] {
        let extra = if named {
            vec![(
                "extensions.shadow_http",
                serde_yaml_ng::from_str("['web.web']").unwrap(),
            )]
        } else {
            Vec::new()
        };
        let host = shadow_host(extra).await;
        host.create_space("s").await;
        let ext = web_extension(fx.port, var);
        add(&host, ext.path());
        enable(&host, "s", "web").await;
        let v = host.chat("s", "look up shadowed").await;
        let reply = v["reply"].as_str().unwrap();
        match expect {
            Some(want) => assert_eq!(reply, want, "{v}"),
            // Unnamed, the server is not even listed: there is no such tool.
            None => assert!(
                reply.contains("there is no tool named \"web_lookup\""),
                "{v}"
            ),
        }
        if named {
            // Named, a tool that acts is still refused in a shadow.
            let v = host.chat("s", "post quietly").await;
            assert!(
                v["reply"]
                    .as_str()
                    .unwrap()
                    .contains("not marked read-only"),
                "{v}"
            );
        }
        host.stop().await;
    }
}

/// The runtime image of the time server under the docker backend, built the
/// way docs/extensions.md tells an operator to: `mercury ext image` from the
/// pinned virtualenv, the interpreter's standard library and the zone data.
fn build_time_image(tag: &str) {
    let stdlib = std::fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3.") && p.join("os.py").exists())
        })
        .expect("the host Python's standard library under /usr/lib");
    let out = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args([
            "ext",
            "image",
            tag,
            "--path",
            "/opt/mercury/mcp-venv",
            "--path",
        ])
        .arg(&stdlib)
        .output()
        .expect("run mercury ext image");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("built {tag}")));
    // A relative path is refused before any engine work, with a sentence.
    let out = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["ext", "image", tag, "--path", "opt/venv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be absolute"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_time_over_stdio_under_docker_runs_in_its_own_image() {
    let tag = "mercury-ext-time-test:1";
    build_time_image(tag);
    let host = TestHost::start(HostOptions {
        model: rules(),
        sandbox: "docker",
        config: vec![("turn.tool_timeout_secs", 30.into())],
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    // The example's manifest, naming the image the docker backend starts.
    let dir = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(repo().join("examples/time/extension.toml")).unwrap();
    let manifest = manifest.replace("mercury-ext-time:2026.10.19", tag);
    assert!(manifest.contains(tag), "the example names its image");
    std::fs::write(dir.path().join("extension.toml"), manifest).unwrap();
    let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    enable(&host, "alpha", "time").await;

    let v = host.chat("alpha", "what time is it in Paris?").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.starts_with("[time_get_current_time]"), "{v}");
    assert!(reply.contains("Europe/Paris"), "{v}");
    let steps = steps_of(&host, "alpha", &v["run_id"]).await;
    assert!(steps.iter().any(|s| s["name"] == "time_get_current_time"));

    // The server ran in a container of that image, labelled with the run,
    // and nothing of the turn is left once it ended.
    let docker = bollard::Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let instance = mercury::sandbox::instance_id_for(&host.data).unwrap();
    let label = format!("mercury.instance={instance}");
    let filters = std::collections::HashMap::from([("label", vec![label.as_str()])]);
    let left = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");

    // A manifest naming an image the engine lacks: its server cannot start
    // (the sandbox tests hold the sentence naming the image), so its tools
    // are not offered, and the host keeps answering.
    let manifest = std::fs::read_to_string(dir.path().join("extension.toml"))
        .unwrap()
        .replace(tag, "mercury-ext-absent:0");
    std::fs::write(dir.path().join("extension.toml"), manifest).unwrap();
    let out = mercury_ext(&host.data, &["add", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = host.chat("alpha", "what time is it in Paris?").await;
    assert!(
        v["reply"]
            .as_str()
            .unwrap()
            .contains("there is no tool named"),
        "{v}"
    );
    let v = host.chat("alpha", "hello").await;
    assert_eq!(v["reply"], "ok", "{v}");
    host.stop().await;
}
