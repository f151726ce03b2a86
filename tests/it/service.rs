//! Security III, item 3 (issue 22): the shipped service runs tools. A real
//! `mercury serve` runs as a fresh non-root uid with exactly what
//! `deploy/mercury.service` gives it, read from the unit itself: its
//! supplementary groups, ambient and bounding capabilities, no new
//! privileges, and a mount namespace of its own (`unshare`) if the unit has
//! a setting that makes one. systemd is absent; `setpriv` (util-linux) does
//! what the unit's keys do. Its tool turn reads `AGENTS.md` and writes a
//! file that is then checked on the host (an `echo` alone would pass with an
//! empty workspace). `mercury doctor` run as that uid fails with the fix when
//! a capability or the host's mount namespace is missing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{prepare, HostOptions};

/// Keys of a unit's `[Service]` section that give it a mount namespace of
/// its own (systemd.exec(5)).
const MOUNT_NAMESPACE_KEYS: &[&str] = &[
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "BindPaths",
    "BindReadOnlyPaths",
    "TemporaryFileSystem",
    "MountFlags",
    "RootDirectory",
    "RootImage",
    "MountAPIVFS",
];

/// The `[Service]` keys of the shipped unit (a key given twice keeps both).
struct Unit {
    keys: Vec<(String, String)>,
}

impl Unit {
    fn shipped() -> Unit {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/mercury.service"),
        )
        .expect("deploy/mercury.service");
        let mut in_service = false;
        let mut keys = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            if !in_service || line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                keys.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
        Unit { keys }
    }

    fn all(&self, key: &str) -> Vec<String> {
        self.keys
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, v)| v.split_whitespace().map(str::to_owned))
            .collect()
    }

    fn flag(&self, key: &str) -> bool {
        self.all(key).iter().any(|v| v == "true" || v == "yes")
    }

    /// The unit's capabilities in setpriv's spelling (`sys_admin`).
    fn caps(&self, key: &str) -> Vec<String> {
        self.all(key)
            .iter()
            .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
            .collect()
    }

    fn makes_a_mount_namespace(&self) -> bool {
        self.keys
            .iter()
            .any(|(k, v)| MOUNT_NAMESPACE_KEYS.contains(&k.as_str()) && v != "no" && v != "false")
    }
}

/// A fresh system user standing in for the unit's `User=`, in the unit's
/// supplementary groups; removed on drop.
struct UnitUser {
    name: String,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl UnitUser {
    fn create(unit: &Unit) -> UnitUser {
        assert_eq!(
            unit.all("User"),
            vec!["mercury"],
            "the unit runs as mercury"
        );
        let name = format!("mercury-it-{:08x}", rand::random::<u32>());
        let groups = unit.all("SupplementaryGroups");
        let mut add = Command::new("useradd");
        add.args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/usr/sbin/nologin"]);
        if !groups.is_empty() {
            add.arg("--groups").arg(groups.join(","));
        }
        let st = add.arg(&name).status().expect("useradd");
        assert!(st.success(), "useradd {name} failed");
        let id = |flag: &str| -> String {
            let out = Command::new("id")
                .arg(flag)
                .arg(&name)
                .output()
                .expect("id");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let uid = id("-u").parse().expect("uid");
        let gid = id("-g").parse().expect("gid");
        let groups = id("-G")
            .split_whitespace()
            .map(|g| g.parse().expect("gid"))
            .collect();
        UnitUser {
            name,
            uid,
            gid,
            groups,
        }
    }
}

impl Drop for UnitUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// A data dir owned by the unit's user, with binaries it can reach.
struct ServiceDir {
    _dir: crate::common::TestDir,
    data: PathBuf,
    bin: PathBuf,
    port: u16,
}

async fn service_dir(user: &UnitUser, sandbox: &'static str, model: Value) -> ServiceDir {
    let (dir, data, port) = prepare(&HostOptions {
        model,
        sandbox,
        config: vec![("sandbox.workspace_mb", Yaml::from(64))],
        ..Default::default()
    })
    .await;
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    // The binaries beside each other (mrctl names the image), reachable by
    // the user whatever the checkout's modes, and still root's.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for (name, from) in [
        ("mercury", env!("CARGO_BIN_EXE_mercury")),
        ("mrctl", env!("CARGO_BIN_EXE_mrctl")),
    ] {
        if std::fs::hard_link(from, bin.join(name)).is_err() {
            std::fs::copy(from, bin.join(name)).unwrap();
        }
    }
    ServiceDir {
        _dir: dir,
        data,
        bin,
        port,
    }
}

/// `mercury ARGS` as the unit runs it: its user and groups, its
/// capabilities (none when `caps` is false), no new privileges, and
/// `unshare` for a mount namespace the unit would make.
fn as_unit(unit: &Unit, user: &UnitUser, dir: &ServiceDir, caps: bool, args: &[&str]) -> Command {
    let set = |key: &str| -> String {
        let mut s = String::from("-all");
        if caps {
            for c in unit.caps(key) {
                s.push_str(",+");
                s.push_str(&c);
            }
        }
        s
    };
    let groups: Vec<String> = user.groups.iter().map(u32::to_string).collect();
    let mut c = if unit.makes_a_mount_namespace() {
        // systemd makes its namespaces slaves of the host's.
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "slave", "--", "setpriv"]);
        c
    } else {
        Command::new("setpriv")
    };
    c.arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg(format!("--groups={}", groups.join(",")))
        .arg(format!("--inh-caps={}", set("AmbientCapabilities")))
        .arg(format!("--ambient-caps={}", set("AmbientCapabilities")))
        .arg(format!("--bounding-set={}", set("CapabilityBoundingSet")));
    if unit.flag("NoNewPrivileges") {
        c.arg("--no-new-privs");
    }
    c.arg(dir.bin.join("mercury"))
        .args(args)
        .arg("--data-dir")
        .arg(&dir.data)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null());
    c
}

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

fn turn_rules() -> Value {
    json!({"rules": [
        {"match": "^user: go$", "tool_calls": [{"name": "shell", "arguments": {"command":
            "head -n 1 AGENTS.md && echo made-by-the-tool > from-tool.txt && echo tool-wrote"}}]},
        {"match": "(?s)^tool_result\\(shell\\): (.*)$", "reply": "$1"},
        {"reply": "hi"}
    ]})
}

async fn the_shipped_unit_runs_a_tool_turn(sandbox: &'static str) {
    let unit = Unit::shipped();
    let user = UnitUser::create(&unit);
    let dir = service_dir(&user, sandbox, turn_rules()).await;
    let _serving = Serving(
        as_unit(&unit, &user, &dir, true, &["serve"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn mercury serve"),
    );
    let url = format!("http://127.0.0.1:{}", dir.port);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let mut ready = false;
    for _ in 0..2400 {
        if let Ok(r) = http.get(format!("{url}/healthz")).send().await {
            ready = r.status().is_success();
            if ready {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "the service did not start");
    let token = std::fs::read_to_string(dir.data.join("global/owner.token")).unwrap();
    let token = token.trim();
    let r = http
        .post(format!("{url}/api/spaces"))
        .bearer_auth(token)
        .json(&json!({"id": "alpha"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = http
        .post(format!("{url}/api/chat"))
        .bearer_auth(token)
        .header("x-mercury-space", "alpha")
        .json(&json!({"text": "go"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ws = dir.data.join("spaces/alpha");
    let agents = std::fs::read_to_string(ws.join("AGENTS.md")).unwrap();
    let first = agents.lines().next().unwrap();
    let reply = v["reply"].as_str().unwrap_or_default();
    assert!(
        reply.contains(first) && reply.contains("tool-wrote"),
        "the tool turn did not read the workspace: {v}"
    );
    let written = ws.join("from-tool.txt");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap_or_default(),
        "made-by-the-tool\n",
        "the tool's file did not reach the host's workspace: {v}"
    );
    assert_eq!(std::fs::metadata(&written).unwrap().uid(), user.uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_the_shipped_unit_runs_a_tool_turn_that_reads_agents_md_and_writes_the_workspace() {
    the_shipped_unit_runs_a_tool_turn("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_the_shipped_unit_runs_a_tool_turn_that_reads_agents_md_and_writes_the_workspace(
) {
    the_shipped_unit_runs_a_tool_turn("process").await;
}

fn doctor(cmd: &mut Command) -> (i32, String) {
    let out = cmd.output().expect("run mercury doctor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The image the docker probe needs, built as root if absent.
async fn ensure_image(data: &Path) {
    let settings = mercury::host::settings_of(data).unwrap();
    mercury::host::containers::docker_backend(&settings, &mercury::workspace::DataPaths::new(data))
        .await
        .expect("the agent image");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_as_the_unit_user_without_its_capabilities_fails_and_names_the_fix() {
    let unit = Unit::shipped();
    let user = UnitUser::create(&unit);
    let dir = service_dir(&user, "docker", turn_rules()).await;
    ensure_image(&dir.data).await;
    let (code, text) = doctor(&mut as_unit(&unit, &user, &dir, false, &["doctor"]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL turn layer") && text.contains("lacks CAP_SYS_ADMIN"),
        "{text}"
    );
    assert!(
        text.contains("AmbientCapabilities=CAP_SYS_ADMIN CAP_DAC_OVERRIDE"),
        "{text}"
    );
    // With the unit's rights the same host passes, a container included.
    let (code, text) = doctor(&mut as_unit(&unit, &user, &dir, true, &["doctor"]));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok   turn layer"), "{text}");
    assert!(
        text.contains("ok   sandbox view: a container reads and writes"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(dir.data.join("tmp")).unwrap().count(),
        0,
        "doctor left its probe behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_in_a_mount_namespace_of_its_own_fails_for_docker_and_names_the_fix() {
    let unit = Unit::shipped();
    let user = UnitUser::create(&unit);
    let dir = service_dir(&user, "docker", turn_rules()).await;
    ensure_image(&dir.data).await;
    // What ProtectSystem= / PrivateTmp= do: a namespace whose mounts the
    // host's (and dockerd's) never see.
    let inner = as_unit(&unit, &user, &dir, true, &["doctor"]);
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    let (code, text) = doctor(&mut cmd);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL sandbox view: a container sees an empty workspace")
            && text.contains("mount namespace of its own")
            && text.contains("ProtectSystem="),
        "{text}"
    );
}
