//! Security III (issue 22, items 1 and 2): a hostile workspace never harms
//! the host. Each test drives a real host whose scripted model runs what an
//! attacker would type: a tree 8,192 directories deep, a sparse file, forty
//! hard links, a flood of directories; then a message whose turn crashes the
//! host every time it runs.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};
use mercury::storage::Query;

fn hostile_rules() -> Value {
    let shell = |cmd: &str| json!([{"name": "shell", "arguments": {"command": cmd}}]);
    json!({"rules": [
        {"match": "^tool_result\\(shell\\)", "reply": "did it"},
        // The reproduction: 2^13 = 8,192 nested directories.
        {"match": "^user: deep$", "tool_calls": shell(
            "p=x; i=0; while [ $i -lt 13 ]; do p=$p/$p; i=$((i+1)); done; mkdir -p \"w/$p\"; echo made")},
        {"match": "^user: sparse$", "tool_calls": shell(
            "dd if=/dev/zero of=hole bs=1 count=0 seek=200M 2>/dev/null; echo made")},
        {"match": "^user: links$", "tool_calls": shell(
            "dd if=/dev/zero of=five bs=1M count=5 2>/dev/null; i=0; \
             while [ $i -lt 40 ]; do ln five l$i; i=$((i+1)); done; echo linked")},
        {"match": "^user: flood$", "tool_calls": shell(
            // 120,000 names made by dash's builtins (the image has no seq).
            "for k in 1 2 3 4 5 6; do i=0; while [ $i -lt 20000 ]; do echo d$k-$i; i=$((i+1)); done > /tmp/n; \
             mkdir $(cat /tmp/n) 2>/dev/null || break; done; echo flooded")},
        {"match": "^user: small$", "tool_calls": shell(
            "echo kept > kept.txt; cat AGENTS.md | head -1")},
        {"reply": "hi"}
    ]})
}

/// Bytes the workspace really takes on the host's disk (allocated blocks).
fn disk_use(root: &std::path::Path) -> u64 {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| e.path().symlink_metadata().map_or(0, |m| m.blocks() * 512))
        .sum()
}

fn run_error(host: &TestHost, run: &Value) -> String {
    host.read(|c| {
        c.query_row(
            "SELECT error FROM runs WHERE id = ?1",
            &[&run.as_str().unwrap()],
            |r| r.get::<_, Option<String>>(0),
        )
    })
    .unwrap_or_default()
}

/// Also run on a sandbox whose workspace is synced, not bound (`config`
/// names a `tcp://` engine: `remote_engine`), so the copy back goes through
/// the same bounds and the same all-or-nothing merge.
pub(crate) async fn hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was(
    sandbox: &'static str,
    mut config: Vec<(&'static str, Yaml)>,
) {
    config.push(("sandbox.workspace_mb", Yaml::from(20)));
    let host = TestHost::start(HostOptions {
        model: hostile_rules(),
        sandbox,
        config,
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let ws = host.data.join("spaces/alpha");
    let before = host.workspace_hashes("alpha");
    for (turn, says) in [
        ("deep", "workspace.max_depth = 64"),
        ("sparse", "past its quota (sandbox.workspace_mb = 20)"),
        ("links", "past its quota (sandbox.workspace_mb = 20)"),
        ("flood", "workspace.max_entries = 100000"),
    ] {
        let v = host.chat("alpha", turn).await;
        let tool_output: Vec<String> = host.read(|c| {
            c.query_all(
                "SELECT COALESCE(output, '') FROM run_steps WHERE run_id = ?1 AND kind = 'tool'",
                &[&v["run_id"].as_str().unwrap()],
                |r| r.get(0),
            )
        });
        assert_eq!(
            v["status"], "failed",
            "{turn}: {v}, the tool said {tool_output:?}"
        );
        assert!(
            v["reply"]
                .as_str()
                .is_some_and(|r| r.starts_with(mercury::config::DEFAULT_FAILURE_REPLY)),
            "{turn}: {v}"
        );
        let error = run_error(&host, &v["run_id"]);
        assert!(error.contains(says), "{turn}: {error}");
        assert!(
            error.contains("nothing it wrote was kept"),
            "{turn}: {error}"
        );
        // The host is still there, the workspace is as it was, nothing of the
        // turn reached the disk, and no layer is left mounted.
        let health = host
            .http
            .get(format!("{}/healthz", host.url))
            .send()
            .await
            .unwrap();
        assert!(health.status().is_success(), "{turn}");
        assert_eq!(host.workspace_hashes("alpha"), before, "{turn}");
        let dirs = walkdir::WalkDir::new(&ws).into_iter().count();
        assert!(dirs < 10, "{turn}: {dirs} entries in the workspace");
        assert!(
            disk_use(&ws) <= 20 << 20,
            "{turn}: {} bytes on disk",
            disk_use(&ws)
        );
        assert_eq!(host.mounts_below_data(), Vec::<String>::new(), "{turn}");
        // The message is settled: no restart runs it again.
        let status: String = host
            .read(|c| c.query_row(
                "SELECT m.status FROM messages m JOIN runs r ON r.trigger_message_id = m.id WHERE r.id = ?1",
                &[&v["run_id"].as_str().unwrap()],
                |r| r.get(0)));
        assert_eq!(status, "failed", "{turn}");
    }
    // A turn within the bounds still reads the workspace and keeps its write.
    let v = host.chat("alpha", "small").await;
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(
        std::fs::read_to_string(ws.join("kept.txt")).unwrap(),
        "kept\n"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was() {
    hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was("process", vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was() {
    hostile_trees_fail_their_turn_and_leave_the_workspace_as_it_was("docker", vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_crashes_the_host_twice_is_answered_with_the_failure_reply_not_run_again() {
    // Each attempt of the turn sleeps in its tool until the test kills the
    // host (SIGKILL: the run stays `running`, as an abort would leave it).
    let mut h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"match": "^tool_result\\(shell\\): ", "reply": "done"},
            {"match": "^user: boom$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "touch started; sleep 600"}}]}
        ]}),
        // cy is a stranger answered by an open bot (the sender policy has
        // its own tests, tests/it/pairing.rs).
        config: vec![("ingress.dm_policy", Yaml::String("open".into()))],
        ..Default::default()
    })
    .await;
    let adapter = h.token("bridge", "adapter").await;
    let (st, v) = h
        .ingest(&adapter, "dm-c", "test:cy", "boom", "c-1", false)
        .await;
    assert_eq!(st, 202, "{v}");
    for attempt in 1..=2 {
        let deadline = Instant::now() + Duration::from_secs(90);
        while h.in_turn_layer("started").is_none() {
            assert!(Instant::now() < deadline, "attempt {attempt} never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        h.kill();
        h.restart_process().await;
    }
    // Two crashes: the third start answers the message instead of running it.
    let failed = h
        .wait_count(
            "SELECT COUNT(*) FROM runs WHERE status = 'failed' AND error LIKE '%interrupted by a host crash 2 times%'",
            1,
            60,
        )
        .await;
    assert_eq!(failed, 1);
    assert_eq!(
        h.count("SELECT COUNT(*) FROM runs WHERE status = 'interrupted'"),
        2
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE role = 'user' AND status = 'failed'"),
        1
    );
    let reply: String = h.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE role = 'assistant'",
            &[],
            |r| r.get(0),
        )
    });
    assert!(
        reply.starts_with(mercury::config::DEFAULT_FAILURE_REPLY),
        "{reply}"
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM outbox WHERE text = (SELECT text FROM messages WHERE role = 'assistant')"),
        1,
        "the failure reply is queued for the sender"
    );
    // No third attempt ran, and a further restart runs nothing either.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(h.in_turn_layer("started").is_none());
    h.kill();
    h.restart_process().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.count("SELECT COUNT(*) FROM runs"), 3);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_api_writes_count_against_the_whole_workspace_quota_and_entry_limit() {
    let host = TestHost::start(HostOptions {
        config: vec![
            ("sandbox.workspace_mb", Yaml::from(2)),
            ("workspace.max_entries", Yaml::from(8)),
            ("files.max_bytes", Yaml::from(2 << 20)),
        ],
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    let put = |path: &'static str, size: usize| {
        let host = &host;
        async move {
            host.owner(
                Method::PUT,
                &format!("/api/files/{path}"),
                Some("alpha"),
                Some(json!({"content": "x".repeat(size)})),
            )
            .await
        }
    };
    // Cumulative: each write fits alone, the third does not fit with the two.
    assert_eq!(put("one.md", 800 << 10).await.0, 200);
    assert_eq!(put("two.md", 800 << 10).await.0, 200);
    let (st, v) = put("three.md", 800 << 10).await;
    assert_eq!(st, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("past its quota"),
        "{v}"
    );
    assert!(!host.data.join("spaces/alpha/three.md").exists());
    // Replacing a file is charged the difference, not the sum.
    assert_eq!(put("one.md", 900 << 10).await.0, 200);
    // Entries: the workspace holds AGENTS.md, MEMORY.md, knowledge/ and the
    // two files; a new directory and its file take it to 7, then 8 is the
    // limit.
    assert_eq!(put("a/b.md", 1).await.0, 200);
    assert_eq!(put("c.md", 1).await.0, 200);
    let (st, v) = put("d.md", 1).await;
    assert_eq!(st, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("workspace.max_entries = 8"),
        "{v}"
    );
    host.stop().await;
}
