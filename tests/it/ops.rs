//! Issue 17, the operator's view, from the outside: what a participant reads
//! when a turn fails, the trigger word kept out of the prompt, `/metrics`
//! after a real turn, the host's log lines, `mercury status` and `doctor`,
//! start-up validation and mrctl's exit codes and help.

use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{free_port, prepare, HostOptions, TestHost};

fn mercury_cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_remove("MERCURY_DATA_DIR").stdin(Stdio::null());
    c
}

/// GET `path` on `base` with an optional token: (status, content type, body).
async fn get_text(
    h: &TestHost,
    base: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    let mut req = h.http.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, ct, r.text().await.unwrap_or_default())
}

/// The value of the sample `series` (name and labels exactly) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// Waits for the reply to stored message `mid`; returns its text.
async fn reply_to(h: &TestHost, mid: i64) -> String {
    let sql = format!("SELECT COUNT(*) FROM messages WHERE reply_to = {mid}");
    assert_eq!(h.wait_count(&sql, 1, 60).await, 1, "a reply to {mid}");
    h.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE reply_to = ?1",
            &[&mid],
            |r| r.get(0),
        )
    })
}

async fn ingest_dm(h: &TestHost, adapter: &str, text: &str, id: &str) -> i64 {
    // pat is the bot's approved user (the sender policy's own tests are in
    // tests/it/pairing.rs); allowing again changes nothing.
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/senders/allow",
            None,
            Some(json!({"sender": "test:pat"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h.ingest(adapter, "ops-dm", "pat", text, id, false).await;
    assert_eq!((st, v["status"].as_str()), (202, Some("queued")), "{v}");
    v["message_id"].as_i64().unwrap()
}

#[tokio::test]
async fn ops_a_failed_turn_answers_the_configured_sentence_and_keeps_the_reason() {
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [{"match": "^user: hello$", "reply": "hi"}]}),
        config: vec![(
            "turn.failure_reply",
            Yaml::String("That did not work, sorry.".into()),
        )],
        ..Default::default()
    })
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let mid = ingest_dm(&h, &adapter, "/etc/passwd please", "f-1").await;
    assert_eq!(reply_to(&h, mid).await, "That did not work, sorry.");
    let error: String = h.read(|c| {
        c.query_row(
            "SELECT error FROM runs WHERE trigger_message_id = ?1",
            &[&mid],
            |r| r.get(0),
        )
    });
    assert!(
        error.contains("no rule matches"),
        "the reason stays: {error}"
    );
    let outbox: String = h.read(|c| {
        c.query_row(
            "SELECT text FROM outbox ORDER BY id DESC LIMIT 1",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(
        outbox, "That did not work, sorry.",
        "delivered as configured"
    );
    // The owner on the console is a global admin in a direct conversation:
    // the same sentence, then the reason (issue 25; a stranger's reply above
    // carries none).
    h.create_space("ops-console").await;
    let v = h.chat("ops-console", "anything at all").await;
    let reply = v["reply"].as_str().unwrap_or_default();
    assert!(reply.starts_with("That did not work, sorry.\n\n"), "{v}");
    assert!(reply.contains("no rule matches"), "{v}");
    h.stop().await;
}

#[tokio::test]
async fn ops_the_trigger_word_does_not_reach_the_model() {
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: what is the time\\?$", "reply": "stripped"},
            {"reply": "not stripped"}
        ]}),
        ..Default::default()
    })
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let mid = ingest_dm(&h, &adapter, "@mercury what is the time?", "t-1").await;
    assert_eq!(reply_to(&h, mid).await, "stripped");
    let mid = ingest_dm(&h, &adapter, "Mercury, what is the time?", "t-2").await;
    assert_eq!(reply_to(&h, mid).await, "stripped");
    // A mention inside the text is the participant's words: kept.
    let mid = ingest_dm(&h, &adapter, "is mercury what is the time?", "t-3").await;
    assert_eq!(reply_to(&h, mid).await, "not stripped");
    // The stored message keeps what was said.
    let stored: String = h.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE platform_message_id = 't-1'",
            &[],
            |r| r.get(0),
        )
    });
    assert_eq!(stored, "@mercury what is the time?");
    h.stop().await;
}

#[tokio::test]
async fn ops_metrics_count_a_real_turn_behind_an_admin_token() {
    let metrics_port = free_port();
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^tool_result\\(shell\\): ", "reply": "ran it"},
            {"purpose": "turn", "match": "^user: run it$",
             "tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
            {"purpose": "turn", "reply": "ok"}
        ]}),
        config: vec![(
            "metrics.bind",
            Yaml::String(format!("127.0.0.1:{metrics_port}")),
        )],
        ..Default::default()
    })
    .await;
    h.create_space("ops-metrics").await;
    assert_eq!(h.chat("ops-metrics", "run it").await["reply"], "ran it");
    let adapter = h.token("bridge", "adapter").await;
    let mid = ingest_dm(&h, &adapter, "hello", "m-1").await;
    reply_to(&h, mid).await;
    let (st, v) = h
        .ingest(&adapter, "ops-dm", "pat", "hello", "m-1", false)
        .await;
    assert_eq!((st, v["status"].as_str()), (200, Some("duplicate")), "{v}");

    let (st, ct, text) = get_text(&h, &h.url, "/metrics", Some(&h.owner_token)).await;
    assert_eq!(st, 200, "{text}");
    assert!(ct.starts_with("text/plain"), "{ct}");
    let want = [
        ("mercury_turns_total{kind=\"live\",status=\"done\"}", 2.0),
        ("mercury_turn_duration_seconds_count{kind=\"live\"}", 2.0),
        (
            "mercury_model_calls_total{provider=\"scripted\",outcome=\"ok\"}",
            3.0,
        ),
        (
            "mercury_model_call_duration_seconds_count{provider=\"scripted\",outcome=\"ok\"}",
            3.0,
        ),
        ("mercury_ingress_messages_total{decision=\"queued\"}", 1.0),
        (
            "mercury_ingress_messages_total{decision=\"duplicate\"}",
            1.0,
        ),
        ("mercury_queue_depth", 0.0),
        ("mercury_running_turns", 0.0),
        ("mercury_build_info{version=\"0.1.0\"}", 1.0),
    ];
    for (series, value) in want {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    }
    for series in [
        "mercury_model_tokens_total{provider=\"scripted\",direction=\"input\"}",
        "mercury_judge_quota_per_minute",
        "mercury_judge_quota_downs_total",
        "mercury_active_spaces",
        "mercury_uptime_seconds",
    ] {
        assert!(sample(&text, series).is_some(), "{series} in:\n{text}");
    }
    assert!(
        text.lines().any(|l| l
            .starts_with("mercury_sandbox_start_duration_seconds_count{backend=")
            && l.ends_with(" 1")),
        "one sandbox start:\n{text}"
    );
    assert!(
        !text.contains("ops-dm") && !text.contains("pat"),
        "no caller or conversation in a label"
    );

    // Only the owner and global admins read it on the API listener.
    let member = h.token("mallory", "user").await;
    let (st, _, _) = get_text(&h, &h.url, "/metrics", Some(&member)).await;
    assert_eq!(st, 403);
    let (st, _, _) = get_text(&h, &h.url, "/metrics", None).await;
    assert_eq!(st, 401);
    // metrics.bind serves it alone, without a token.
    let open = format!("http://127.0.0.1:{metrics_port}");
    let (st, _, text) = get_text(&h, &open, "/metrics", None).await;
    assert_eq!(st, 200);
    assert_eq!(
        sample(&text, "mercury_turns_total{kind=\"live\",status=\"done\"}"),
        Some(2.0)
    );
    let (st, _, _) = get_text(&h, &open, "/api/spaces", Some(&h.owner_token)).await;
    assert_eq!(st, 404, "the metrics listener serves nothing else");
    h.stop().await;
}

/// Waits until the captured stderr holds `needle` (the host logs asynchronously).
async fn wait_log(h: &TestHost, needle: &str) -> String {
    for _ in 0..200 {
        let text = h.stderr();
        if text.contains(needle) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{needle:?} never appeared in:\n{}", h.stderr());
}

#[tokio::test]
async fn ops_log_lines_for_turns_act_as_ingress_and_start_up_without_ansi() {
    let h = TestHost::start_process_captured(HostOptions {
        env: vec![
            (
                "MERCURY_LOG",
                "info,mercury::ingress=debug,mercury::act_as=debug".into(),
            ),
            ("MERCURY_SANDBOX", "docker".into()),
            ("MERCURY_REVIEW_MODEL", "anthropic:claude-x".into()),
            ("MERCURY_ANTHROPIC_API_KEY", String::new()),
        ],
        ..Default::default()
    })
    .await;
    h.create_space("ops-logs").await;
    h.create_space("ops-other").await;
    h.chat("ops-logs", "hello").await;
    h.link("ops-logs", "ops-other", "read").await;
    let (st, v) = h
        .act_as(
            Method::GET,
            "/api/runs",
            &h.owner_token,
            "ops-logs",
            "ops-other",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let adapter = h.token("bridge", "adapter").await;
    let mid = ingest_dm(&h, &adapter, "hello", "l-1").await;
    reply_to(&h, mid).await;
    wait_log(&h, "act-as request").await;
    let log = wait_log(&h, "ingress decision").await;

    assert!(
        !log.contains('\u{1b}'),
        "no ANSI escapes on a non-terminal:\n{log}"
    );
    let line = |needle: &str| -> String {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{log}"))
            .to_owned()
    };
    let start = line("mercury started");
    for part in [
        "model_chain=scripted:",
        "sandbox=",
        "sandbox_why=",
        "owner=owner",
        "review=\"off\"",
        "adapters=",
    ] {
        assert!(start.contains(part), "{part} in {start}");
    }
    let unknown = line("MERCURY_SANDBOX is not a Mercury variable");
    assert!(
        unknown.contains("did you mean MERCURY_SANDBOX_BACKEND?"),
        "{unknown}"
    );
    assert!(unknown.contains("WARN"), "{unknown}");
    let key = line("MERCURY_ANTHROPIC_API_KEY is not set");
    assert!(key.contains("anthropic:claude-x"), "{key}");
    let turn = log
        .lines()
        .find(|l| l.contains(" turn ") && l.contains("space=ops-logs"))
        .unwrap_or_else(|| panic!("no turn line in:\n{log}"));
    for part in [
        "INFO",
        "run=",
        "kind=\"live\"",
        "status=\"done\"",
        "ms=",
        "tokens_in=",
        "tokens_out=",
        "sandbox=\"none\"",
    ] {
        assert!(turn.contains(part), "{part} in {turn}");
    }
    let act = line("act-as request");
    for part in [
        "holder=\"ops-logs\"",
        "target_space=ops-other",
        "caller=owner",
        "route=/api/runs",
        "level=\"read\"",
        "status=200",
    ] {
        assert!(act.contains(part), "{part} in {act}");
    }
    let ingress = line("ingress decision");
    assert!(
        ingress.contains("DEBUG") && ingress.contains("decision=\"queued\""),
        "{ingress}"
    );
    h.stop().await;
}

#[tokio::test]
async fn ops_log_format_json_writes_one_object_per_line() {
    let h = TestHost::start_process_captured(HostOptions {
        env: vec![
            ("MERCURY_LOG", "info".into()),
            ("MERCURY_LOG_FORMAT", "json".into()),
        ],
        ..Default::default()
    })
    .await;
    h.create_space("ops-json").await;
    h.chat("ops-json", "hello").await;
    let log = wait_log(&h, "\"turn\"").await;
    let mut turn = None;
    // Issue 25: every line, the start-up lines ("serving on ...") included.
    assert!(log.contains("serving on http://"), "{log}");
    for l in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        if v["fields"]["message"] == "turn" {
            turn = Some(v);
        }
    }
    let turn = turn.expect("a turn line");
    assert_eq!(turn["level"], "INFO");
    assert_eq!(turn["fields"]["space"], "ops-json");
    assert_eq!(turn["fields"]["status"], "done");
    assert!(turn["fields"]["ms"].is_u64(), "{turn}");
    h.stop().await;
}

#[tokio::test]
async fn ops_a_missing_scripted_file_is_refused_at_start_up() {
    let (_dir, data, _) = prepare(&HostOptions::default()).await;
    let out = mercury_cli()
        .args(["serve", "--data-dir"])
        .arg(&data)
        .env("MERCURY_MODEL", "scripted:/nonexistent/ops-model.json")
        .env("MERCURY_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/nonexistent/ops-model.json") && err.contains("does not exist"),
        "{err}"
    );
}

// A child process talks to the in-process host: the test's own thread
// blocks on it, so the host needs worker threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_status_says_running_or_not_with_its_exit_codes() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("ops-status").await;
    let out = mercury_cli()
        .args(["status", "--data-dir"])
        .arg(&h.data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for part in [
        "running: yes",
        "version: 0.1.0",
        "uptime: ",
        "model: scripted:",
        "spaces: 1 (",
        "queue: 0 pending",
        "sandbox: ",
        "adapters: (none)",
        "review: off",
        "spend: ",
        "failed runs (24 h): none",
    ] {
        assert!(text.contains(part), "{part} in:\n{text}");
    }
    assert!(!text.contains("attention:"), "{text}");
    // A turn whose model has no answer fails; status names it.
    let rules = h.data.join("models/none.json");
    std::fs::write(&rules, r#"{"rules": []}"#).unwrap();
    let (st, v) = h
        .owner(
            Method::PUT,
            "/api/model",
            Some("ops-status"),
            Some(json!({"chain": [format!("scripted:{}", rules.display())]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let failed = h.chat("ops-status", "hello?").await;
    let run = failed["run_id"].as_str().unwrap().to_owned();
    let out = mercury_cli()
        .args(["status", "--data-dir"])
        .arg(&h.data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("failed runs (24 h, newest first; mrctl runs show RUN):")
            && text.contains(&format!("  {run} ops-status live ")),
        "{text}"
    );
    let out = mercury_cli()
        .args(["status", "--json", "--data-dir"])
        .arg(&h.data)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], "0.1.0");
    assert_eq!(v["review"]["enabled"], false);
    assert_eq!(v["spaces_total"], 1);
    assert_eq!(v["degraded"], false);
    assert_eq!(v["recent_failures"][0]["run_id"], run.as_str(), "{v}");
    h.stop().await;
}

#[tokio::test]
async fn ops_status_exit_codes_when_no_host_runs() {
    let (_dir, data, _) = prepare(&HostOptions::default()).await;
    let out = mercury_cli()
        .args(["status", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("running: no"));
    let out = mercury_cli()
        .args(["status", "--data-dir", "/nonexistent/ops-data"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn ops_doctor_passes_a_good_data_dir_and_fails_a_bad_one() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, data, _) = prepare(&HostOptions::default()).await;
    let doctor = || {
        mercury_cli()
            .args(["doctor", "--data-dir"])
            .arg(&data)
            .env_remove("MERCURY_SANDBOX_BACKEND")
            .output()
            .unwrap()
    };
    let out = doctor();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    for part in [
        "ok   config:",
        "ok   model keys:",
        "bubblewrap:",
        "docker:",
        "ok   data dir:",
        "disk:",
        "warn host: no host answers on",
    ] {
        assert!(text.contains(part), "{part} in:\n{text}");
    }
    // A data dir others can read fails.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = doctor();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL data dir:"), "{text}");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    // So does a config with an unknown key.
    let cfg = data.join("mercury.yaml");
    let mut yaml = std::fs::read_to_string(&cfg).unwrap();
    yaml.push_str("\nfrobnicate: 1\n");
    std::fs::write(&cfg, yaml).unwrap();
    let out = doctor();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL config:") && text.contains("frobnicate"),
        "{text}"
    );
    // No data dir at all is a usage error.
    let out = mercury_cli()
        .args(["doctor", "--data-dir", "/nonexistent/ops-data"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

// A child process talks to the in-process host: the test's own thread
// blocks on it, so the host needs worker threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_mrctl_exit_codes_json_errors_and_header_hints() {
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [{"match": "^user: hello$", "reply": "hi"}]}),
        ..Default::default()
    })
    .await;
    h.create_space("ops-cli").await;
    let run = |args: &[&str], token: &str, space: Option<&str>| {
        let out = h.mrctl(token, space).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let owner = h.owner_token.clone();
    let (code, out, _) = run(&["chat", "hello"], &owner, Some("ops-cli"));
    assert_eq!((code, out.as_str()), (Some(0), "hi\n"));
    // The turn ran and failed: 3, with the generic reply shown.
    let (code, out, err) = run(&["chat", "no rule for this"], &owner, Some("ops-cli"));
    assert_eq!(code, Some(3), "{out} {err}");
    assert!(err.contains("the turn ended failed"), "{err}");
    // Refused by the server: 1; as JSON under --json.
    let (code, _, err) = run(&["--json", "spaces", "create", "ops-cli"], &owner, None);
    assert_eq!(code, Some(1), "{err}");
    let v: Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["error"]["exit_code"], 1);
    assert_eq!(v["error"]["status"], 409, "{v}");
    // A bad token: 2.
    let (code, _, err) = run(&["whoami"], "not-a-token", None);
    assert_eq!(code, Some(2), "{err}");
    // A space header the server asked for, said as what to set; a usage
    // error, 2 (issue 25).
    let (code, _, err) = run(&["prefs", "list"], &owner, None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("set MERCURY_SPACE="), "{err}");
    assert!(!err.contains("x-mercury-space"), "{err}");
    // Lists have headers, and an empty one says so.
    let (code, out, _) = run(&["tasks", "list"], &owner, Some("ops-cli"));
    assert_eq!((code, out.as_str()), (Some(0), "(none)\n"));
    let (code, out, _) = run(&["spaces", "list"], &owner, None);
    assert_eq!(code, Some(0));
    assert!(out.starts_with("ID\tNAME\tTAGS\n"), "{out}");
    h.stop().await;
}

#[test]
fn ops_mrctl_completions_and_man_pages_are_generated() {
    let mrctl = env!("CARGO_BIN_EXE_mrctl");
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(mrctl)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("mrctl") && text.contains("links"),
            "{shell}: {text}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(mrctl)
        .arg("man")
        .arg(dir.path().join("man"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in ["mrctl.1", "mrctl-links-create.1", "mrctl-review-run-now.1"] {
        let text = std::fs::read_to_string(dir.path().join("man").join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}");
    }
}

/// Every command and argument of mrctl has a description, and each
/// command's --help is a reviewed snapshot (tests/it/snapshots/).
#[test]
fn ops_mrctl_help_of_every_command() {
    use clap::CommandFactory;
    fn walk(
        cmd: &clap::Command,
        path: Vec<String>,
        out: &mut Vec<(String, String)>,
        missing: &mut Vec<String>,
    ) {
        let name = path.join(" ");
        if cmd.get_about().is_none() && path.len() > 1 {
            missing.push(format!("command `{name}`"));
        }
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id != "help"
                && id != "version"
                && a.get_help().is_none()
                && a.get_long_help().is_none()
            {
                missing.push(format!("argument {id} of `{name}`"));
            }
        }
        let mut c = cmd.clone();
        out.push((path.join("_"), c.render_long_help().to_string()));
        // A hidden command (`mrctl bridge`, started by the host) has no help page.
        for sub in cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            let mut p = path.clone();
            p.push(sub.get_name().to_owned());
            walk(sub, p, out, missing);
        }
    }
    let mut root = mercury::cli::mrctl::Cli::command();
    root.build();
    let (mut helps, mut missing) = (Vec::new(), Vec::new());
    walk(&root, vec!["mrctl".into()], &mut helps, &mut missing);
    assert!(missing.is_empty(), "no description: {missing:#?}");
    assert!(helps.len() > 60, "{} commands", helps.len());
    for (name, help) in helps {
        insta::assert_snapshot!(name, help);
    }
}

/// Issue 25: `mercury init` prints the next steps for its data dir, and a
/// command whose stdout is a closed pipe (`mercury shadow diff --json |
/// head`) exits quietly (141, as a tool killed by SIGPIPE) instead of
/// panicking; `mercury shadow status` with no shadow exits 3 like
/// `mercury status` with no host.
#[test]
fn ops_init_prints_next_steps_and_a_closed_stdout_is_a_quiet_exit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = mercury_cli()
        .args(["init", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("next steps:"), "{text}");
    assert!(
        text.contains(&format!("mercury serve --data-dir {}", data.display())),
        "{text}"
    );
    assert!(text.contains("mrctl --in family chat hello"), "{text}");

    // stdout: a pipe whose reading end is already closed.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = mercury_cli()
        .args(["init", "--data-dir"])
        .arg(dir.path().join("data2"))
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.trim().is_empty(), "quiet: {err}");
    assert_eq!(out.status.code(), Some(141), "{err}");

    let root = tempfile::tempdir().unwrap();
    let out = mercury_cli()
        .args(["shadow", "status", "--root"])
        .arg(root.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no shadow is running"));
}

/// `mercury backup` of a serving host and `mercury restore` into a new data
/// dir (issue 25): the rows and files come back, secrets only when asked
/// for, nothing is overwritten or mixed, and an archive entry that is not a
/// plain file or directory is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_backup_of_a_serving_host_restores_its_rows_and_files_and_keeps_secrets_out() {
    use std::os::unix::fs::PermissionsExt;
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("fam").await;
    h.chat("fam", "hello").await;
    std::fs::write(h.data.join("spaces/fam/notes.md"), "remember the milk\n").unwrap();
    let messages = h.count("SELECT COUNT(*) FROM messages");
    let tokens = h.count("SELECT COUNT(*) FROM api_tokens");
    let out_dir = tempfile::tempdir().unwrap();
    let archive = out_dir.path().join("fam.tar");
    let run = |args: &[&str]| {
        let out = mercury_cli().args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let data = h.data.to_str().unwrap().to_owned();
    let a = archive.to_str().unwrap().to_owned();
    let (code, out, err) = run(&["backup", "--data-dir", &data, "--to", &a]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("without secrets"), "{out}");
    assert_eq!(
        std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let bytes = std::fs::read(&archive).unwrap();
    let secret = h.owner_token.as_bytes();
    assert!(
        !bytes.windows(secret.len()).any(|w| w == secret),
        "the owner token is in the archive"
    );
    let (code, _, err) = run(&["backup", "--data-dir", &data, "--to", &a]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("never overwrites"), "{err}");

    let restored = out_dir.path().join("restored");
    let r = restored.to_str().unwrap().to_owned();
    let (code, out, err) = run(&["restore", "--from", &a, "--data-dir", &r]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with("restored 1 spaces into") && out.contains("a new owner token"),
        "{out}"
    );
    let store = mercury::storage::Store::open(&restored.join("state.db")).unwrap();
    let count = |sql: &'static str| {
        let store = store.clone();
        async move {
            store
                .read(move |c| mercury::storage::inspect::count(c, sql))
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT COUNT(*) FROM messages").await, messages);
    assert_eq!(
        count("SELECT COUNT(*) FROM api_tokens").await,
        1,
        "only the new owner token"
    );
    assert_eq!(
        std::fs::read_to_string(restored.join("spaces/fam/notes.md")).unwrap(),
        "remember the milk\n"
    );
    let new_token = std::fs::read_to_string(restored.join("global/owner.token")).unwrap();
    assert_ne!(new_token.trim(), h.owner_token);
    assert_eq!(
        std::fs::metadata(restored.join("state.db"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(!restored.join("backup.json").exists());
    // Never into a data dir that holds anything.
    let (code, _, err) = run(&["restore", "--from", &a, "--data-dir", &r]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not empty"), "{err}");

    // With its secrets, the owner token and the token rows come back as they were.
    let with = out_dir.path().join("with.tar");
    let w = with.to_str().unwrap().to_owned();
    let (code, out, err) = run(&["backup", "--data-dir", &data, "--to", &w, "--with-secrets"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let again = out_dir.path().join("again");
    let g = again.to_str().unwrap().to_owned();
    let (code, out, err) = run(&["restore", "--from", &w, "--data-dir", &g]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(again.join("global/owner.token"))
            .unwrap()
            .trim(),
        h.owner_token
    );
    let store2 = mercury::storage::Store::open(&again.join("state.db")).unwrap();
    let n = store2
        .read(|c| mercury::storage::inspect::count(c, "SELECT COUNT(*) FROM api_tokens"))
        .await
        .unwrap();
    assert_eq!(n, tokens);

    // A planted symlink entry is refused, and nothing is left behind.
    let evil = out_dir.path().join("evil.tar");
    {
        let mut b = tar::Builder::new(std::fs::File::create(&evil).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        b.append_link(&mut header, "spaces", "/etc").unwrap();
        b.finish().unwrap();
    }
    let target = out_dir.path().join("evil-dir");
    let (code, _, err) = run(&[
        "restore",
        "--from",
        evil.to_str().unwrap(),
        "--data-dir",
        target.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a file or directory"), "{err}");
    assert_eq!(
        std::fs::read_dir(&target)
            .map(std::iter::Iterator::count)
            .unwrap_or(0),
        0
    );
    h.stop().await;
}

/// `mercury doctor` asks the running host what it uses (issue 25): its own
/// environment's keys, not the shell's, and its model endpoint with its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_doctor_asks_the_running_host_for_its_keys_and_endpoint() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&server)
        .await;
    let h = TestHost::start(HostOptions {
        config: vec![
            ("model", Yaml::from("openai:gpt-fake")),
            (
                "providers.openai_base_url",
                Yaml::from(format!("{}/v1", server.uri())),
            ),
        ],
        ..Default::default()
    })
    .await;
    let out = mercury_cli()
        .args(["doctor", "--data-dir"])
        .arg(&h.data)
        .env("MERCURY_OPENAI_API_KEY", "sk-this-shell-only")
        .env_remove("MERCURY_SANDBOX_BACKEND")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    // This shell has a key; the service does not, and its endpoint says so.
    assert!(text.contains("ok   model keys:"), "{text}");
    assert!(
        text.contains("FAIL host: host model keys: openai:gpt-fake (model) has no key in the running host's environment"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "FAIL host: host model endpoint: {}/v1/models answered 401: the key is refused",
            server.uri()
        )),
        "{text}"
    );
    assert!(text.contains("host: host sandbox:"), "{text}");
    // The serving process built a turn's layer itself (its rights, its mounts).
    assert!(text.contains("ok   host: host turn layer:"), "{text}");
    assert!(!text.contains("sk-this-shell-only"), "{text}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    h.stop().await;
}

/// `mercury onboard` on a real pseudo-terminal (issue 25): each question,
/// the key and the bot token typed without echo, one test call with them,
/// then the config, the env file (0600) and the unit; scripted with flags,
/// a refused key writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_onboard_asks_on_a_terminal_hides_secrets_tests_the_key_and_writes_the_setup() {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::PermissionsExt;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .and(header("authorization", "Bearer sk-typed-key"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&server)
        .await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let unit = tmp.path().join("mercury.service");
    let (mut master, slave) = unsafe {
        let (mut m, mut s) = (0, 0);
        assert_eq!(
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null()
            ),
            0
        );
        (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s))
    };
    let mut child = mercury_cli()
        .args(["onboard", "--data-dir"])
        .arg(&data)
        .arg("--unit")
        .arg(&unit)
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave)
        .spawn()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let (seen, mut m) = (seen.clone(), master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = m.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let base = format!("{}/v1", server.uri());
    for (prompt, answer) in [
        ("Model provider, openai or anthropic [openai]: ", ""),
        ("Base URL [https://api.openai.com/v1]: ", base.as_str()),
        ("Model [gpt-4o-mini]: ", "gpt-test"),
        ("API key (not shown): ", "sk-typed-key"),
        ("(empty: no Telegram) (not shown): ", "123:tg-secret"),
        ("Your Telegram user id (digits; empty: none): ", "4242"),
    ] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !seen.lock().unwrap().contains(prompt) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {prompt:?} in {:?}",
                seen.lock().unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        master.write_all(format!("{answer}\n").as_bytes()).unwrap();
    }
    let status = child.wait().unwrap();
    drop(master);
    let _ = reader.join();
    let text = seen.lock().unwrap().clone();
    assert!(status.success(), "{text}");
    assert!(
        !text.contains("sk-typed-key") && !text.contains("tg-secret"),
        "a secret was echoed: {text}"
    );
    assert!(
        text.contains(&format!("test call: {base}/models answered 200")),
        "{text}"
    );
    let cfg = std::fs::read_to_string(data.join("mercury.yaml")).unwrap();
    let doc: Yaml = serde_yaml_ng::from_str(&cfg).unwrap();
    assert_eq!(doc["model"], Yaml::from("openai:gpt-test"), "{cfg}");
    assert_eq!(
        doc["providers"]["openai_base_url"],
        Yaml::from(base.as_str()),
        "{cfg}"
    );
    assert_eq!(doc["review"]["owner"], Yaml::from("owner"), "{cfg}");
    assert!(
        text.contains("telegram:4242 is now owner (a global admin)"),
        "{text}"
    );
    let store = mercury::storage::Store::open(&data.join("state.db")).unwrap();
    let linked = store
        .read(|c| mercury::storage::identities::operator_for(c, "telegram:4242"))
        .await
        .unwrap();
    assert_eq!(linked.as_deref(), Some("owner"));
    drop(store);
    assert_eq!(
        doc["adapters"]["telegram"]["enabled"],
        Yaml::Bool(true),
        "{cfg}"
    );
    assert!(
        !cfg.contains("sk-typed-key") && !cfg.contains("tg-secret"),
        "{cfg}"
    );
    let env_file = data.join("mercury.env");
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap(),
        "MERCURY_OPENAI_API_KEY=sk-typed-key\nMERCURY_TELEGRAM_BOT_TOKEN=123:tg-secret\n"
    );
    assert_eq!(
        std::fs::metadata(&env_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let unit_text = std::fs::read_to_string(&unit).unwrap();
    let data_abs = std::fs::canonicalize(&data).unwrap();
    assert!(
        unit_text.contains(&format!(
            "EnvironmentFile={}",
            data_abs.join("mercury.env").display()
        )),
        "{unit_text}"
    );
    assert!(
        unit_text.contains(&format!("serve --data-dir {}", data_abs.display())),
        "{unit_text}"
    );
    assert!(unit_text.contains("AmbientCapabilities=CAP_SYS_ADMIN CAP_DAC_OVERRIDE"));
    assert!(data.join("global/owner.token").is_file());

    // Scripted: a refused key is an exit 1 and writes nothing.
    let key = tmp.path().join("bad.key");
    std::fs::write(&key, "sk-wrong\n").unwrap();
    let other = tmp.path().join("other");
    let out = mercury_cli()
        .args(["onboard", "--yes", "--provider", "openai", "--model", "m"])
        .args(["--base-url", &base, "--telegram-token-file", "-"])
        .arg("--key-file")
        .arg(&key)
        .arg("--data-dir")
        .arg(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("answered 401: the key is refused; nothing was written"),
        "{err}"
    );
    assert!(!other.exists());
    // Bad input is a usage error: an unknown provider, a shared Telegram id.
    for extra in [
        &["--provider", "gemini"][..],
        &[
            "--provider",
            "openai",
            "--owner-telegram-id",
            "1087968824",
            "--no-test-call",
        ][..],
    ] {
        let out = mercury_cli()
            .args(["onboard", "--yes"])
            .args(extra)
            .arg("--data-dir")
            .arg(&other)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {out:?}");
        assert!(!other.exists());
    }
}

#[tokio::test]
async fn ops_doctor_and_the_image_commands_ask_every_configured_engine_and_name_one_that_does_not_answer(
) {
    use serde_yaml_ng::Value as Yaml;
    let (_dir, data, _) = prepare(&HostOptions {
        config: vec![(
            "sandbox.docker.hosts",
            Yaml::Sequence(vec![
                Yaml::from("unix:///var/run/docker.sock"),
                // Nothing listens on the discard port.
                Yaml::from("tcp://127.0.0.1:9"),
            ]),
        )],
        ..HostOptions::default()
    })
    .await;
    let out = mercury_cli()
        .args(["doctor", "--data-dir"])
        .arg(&data)
        .env_remove("MERCURY_SANDBOX_BACKEND")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ok   docker: unix:///var/run/docker.sock answers"),
        "{text}"
    );
    assert!(
        text.contains("FAIL docker: tcp://127.0.0.1:9 does not answer"),
        "{text}"
    );
    // The image commands build on every engine the data dir names, so one
    // that does not answer stops them (it would be left without the image).
    for args in [
        vec!["image", "build"],
        vec!["ext", "image", "mercury-ext-probe:1", "--path", "/bin/sh"],
    ] {
        let out = mercury_cli()
            .args(&args)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("every engine of sandbox.docker.hosts must answer")
                && err.contains("tcp://127.0.0.1:9"),
            "{args:?}: {err}"
        );
    }
}

/// A space actor idle for `spaces.idle_stop_secs` stops (the supervisor's
/// one sweep asks every live actor), and the space's next message starts
/// it again: `mercury_active_spaces` follows.
#[tokio::test]
async fn ops_an_idle_space_actor_stops_and_its_next_message_starts_it_again() {
    let h = TestHost::start(HostOptions {
        config: vec![("spaces.idle_stop_secs", Yaml::Number(1.into()))],
        ..Default::default()
    })
    .await;
    let active = || async {
        let (st, _, text) = get_text(&h, &h.url, "/metrics", Some(&h.owner_token)).await;
        assert_eq!(st, 200, "{text}");
        sample(&text, "mercury_active_spaces").unwrap_or(-1.0)
    };
    h.create_space("idler").await;
    for round in 0..2 {
        assert_eq!(h.chat("idler", "hello").await["reply"], "ok");
        assert_eq!(active().await, 1.0, "round {round}: the actor runs");
        let mut stopped = false;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if active().await == 0.0 {
                stopped = true;
                break;
            }
        }
        assert!(
            stopped,
            "round {round}: the actor stopped after about a second idle"
        );
    }
}
