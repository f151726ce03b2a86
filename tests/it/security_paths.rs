//! Security III, item 4 (issue 22): the smaller holes of workspace paths, on
//! a real host. A directory made through the files API belongs to the
//! workspace's owner (the sandbox can write into it); a file name with a
//! newline or any other control character is refused by the files API and
//! by the agent's file tools alike (one path check, `safe::components`); and
//! nothing a turn can read inside its sandbox names the host's data dir.

use std::os::unix::fs::MetadataExt;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{HostOptions, TestHost};

async fn put(h: &TestHost, space: &str, path: &str, content: &str) -> (u16, Value) {
    h.send(
        Method::PUT,
        &format!("/api/files/{path}"),
        Some(&h.owner_token),
        &[("x-mercury-space", space)],
        Some(json!({ "content": content })),
    )
    .await
}

fn reply(v: &Value) -> String {
    v["reply"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_a_directory_made_through_the_files_api_is_writable_by_the_sandbox() {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: first$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo first > first.txt && echo first-done"}}]},
            {"match": "^user: into$", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo tool > made/by/tool.txt && echo into-done"}}]},
            {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"},
            {"reply": "hi"}
        ]}),
        sandbox: "docker",
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    // A first tool turn hands the workspace to the sandbox user.
    let v = host.chat("alpha", "first").await;
    assert!(reply(&v).contains("first-done"), "{v}");
    let ws = host.data.join("spaces/alpha");
    let owner = std::fs::metadata(&ws).unwrap().uid();
    assert_ne!(owner, 0, "a root host runs the container as nobody");
    let (st, v) = put(&host, "alpha", "made/by/api.txt", "from the api").await;
    assert_eq!(st, 200, "{v}");
    for dir in ["made", "made/by"] {
        let meta = std::fs::metadata(ws.join(dir)).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (owner, std::fs::metadata(&ws).unwrap().gid()),
            "{dir} is not the workspace owner's"
        );
    }
    let v = host.chat("alpha", "into").await;
    assert!(reply(&v).contains("into-done"), "{v}");
    assert_eq!(
        std::fs::read_to_string(ws.join("made/by/tool.txt")).unwrap(),
        "tool\n"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_character_in_a_file_name_is_refused_by_the_files_api_and_the_file_tools() {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: write$", "tool_calls": [{"name": "write_file", "arguments": {
                "path": "forged\nline.md", "content": "x"}}]},
            {"match": "^user: tab$", "tool_calls": [{"name": "write_file", "arguments": {
                "path": "notes/a\tb.md", "content": "x"}}]},
            {"match": "^user: read$", "tool_calls": [{"name": "read_file", "arguments": {
                "path": "AGENTS.md\u{1b}[2J"}}]},
            {"match": "(?s)^tool_result\\((\\w+)\\): (.*)$", "reply": "$1 said: $2"},
            {"reply": "hi"}
        ]}),
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    for bad in [
        "a%0Ab.txt",
        "dir%0A/x.txt",
        "a%09b.txt",
        "a%1Bb.txt",
        "a%7Fb.txt",
        "a%C2%85b.txt",
    ] {
        let (st, v) = put(&host, "alpha", bad, "x").await;
        assert_eq!(st, 400, "{bad}: {v}");
        let msg = v.to_string();
        assert!(msg.contains("control character"), "{bad}: {msg}");
        let (st, v) = host
            .send(
                Method::GET,
                &format!("/api/files/{bad}"),
                Some(&host.owner_token),
                &[("x-mercury-space", "alpha")],
                None,
            )
            .await;
        assert_eq!(st, 400, "GET {bad}: {v}");
    }
    for (ask, tool) in [
        ("write", "write_file"),
        ("tab", "write_file"),
        ("read", "read_file"),
    ] {
        let v = host.chat("alpha", ask).await;
        let out = reply(&v);
        assert!(
            out.starts_with(&format!("{tool} said: error:")) && out.contains("control character"),
            "{ask}: {v}"
        );
    }
    let names: Vec<String> = walkdir::WalkDir::new(host.data.join("spaces/alpha"))
        .into_iter()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.chars().any(char::is_control)),
        "{names:?}"
    );
    host.stop().await;
}

/// Everything a turn's commands can read about where they run.
const LOOK_AROUND: &str = "cat /proc/self/mountinfo; env; hostname; pwd; \
    tr '\\0' ' ' < /proc/1/cmdline; echo; ls -la /run/mercury; readlink /proc/self/cwd; \
    cat /proc/self/cgroup; echo looked";

async fn the_data_dir_path_is_not_visible_inside_a_turn(sandbox: &'static str) {
    let warm = sandbox == "docker-warm";
    let mut config = vec![("turn.output_cap_bytes", serde_yaml_ng::Value::from(65536))];
    if warm {
        config.push(("sandbox.warm", serde_yaml_ng::Value::from(1)));
    }
    let sandbox = if warm { "docker" } else { sandbox };
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: look$", "tool_calls": [{"name": "shell", "arguments": {"command": LOOK_AROUND}}]},
            {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"},
            {"reply": "hi"}
        ]}),
        sandbox,
        config,
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    if warm {
        let instance = mercury::sandbox::instance_id_for(&host.data).expect("instance");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let out = std::process::Command::new("docker")
                .args(["ps", "-q", "--filter", "status=paused", "--filter"])
                .arg(format!("label=mercury.instance={instance}"))
                .output()
                .expect("docker ps");
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pool never filled"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let v = host.chat("alpha", "look").await;
    let seen = reply(&v);
    assert!(seen.contains("looked"), "{v}");
    // The mounts are there (so the check reads something real) ...
    assert!(seen.contains(" /work "), "{seen}");
    assert!(seen.contains("/run/mercury/api.sock"), "{seen}");
    // A pooled container's slot is on the pool's tmpfs.
    assert_eq!(seen.contains(" mercury-warm "), warm, "{seen}");
    // ... and none of them, nor anything else, names the host's paths.
    let tmp = host.dir.path().display().to_string();
    for secret in [host.data.display().to_string(), tmp] {
        assert!(
            !seen.contains(&secret),
            "{secret} is visible inside:\n{seen}"
        );
    }
    // The overlay's layers are named by descriptor, whatever the data dir.
    for option in ["lowerdir=", "upperdir=", "workdir="] {
        for (i, _) in seen.match_indices(option) {
            assert!(
                seen[i + option.len()..].starts_with("/proc/self/fd/"),
                "{option} names a host path:\n{seen}"
            );
        }
    }
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_the_data_dir_path_is_not_visible_inside_a_turn() {
    the_data_dir_path_is_not_visible_inside_a_turn("docker").await;
}

/// The same through a pooled container (`sandbox.warm`): its slot mounts
/// and what propagates onto them name no host path either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_warm_the_data_dir_path_is_not_visible_inside_a_pooled_turn() {
    the_data_dir_path_is_not_visible_inside_a_turn("docker-warm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_the_data_dir_path_is_not_visible_inside_a_turn() {
    the_data_dir_path_is_not_visible_inside_a_turn("process").await;
}
