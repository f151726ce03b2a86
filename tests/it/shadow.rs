//! The rehearsal bench (issue 14): shadow mode's every branch (sends,
//! digest, webhook, adapters, outbox, the data-dir guard), the snapshot of
//! a serving host, every refusal of `shadow up`, and the end-to-end
//! rehearsal on real processes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{prepare, write_to, HostOptions, TestHost};
use mercury::shadow::manifest::Manifest;
use mercury::storage::{inspect, Conn, Query, Store};
use mercury::workspace::transcript::{Transcript, TranscriptKind};

/// A loopback HTTP receiver that keeps every request it gets (headers and
/// body), standing in for a webhook target or a platform.
struct Receiver {
    url: String,
    hits: Arc<Mutex<Vec<String>>>,
}

async fn receiver() -> Receiver {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(Mutex::new(Vec::new()));
    let h = hits.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap, body: String| {
        let h = h.clone();
        async move {
            h.lock().unwrap().push(format!("{headers:?}\n{body}"));
            "ok"
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver {
        url: format!("http://{addr}/hook"),
        hits,
    }
}

impl Receiver {
    fn count(&self) -> usize {
        self.hits.lock().unwrap().len()
    }
}

/// The canonical temp dir: every TestHost data dir lies under it.
fn tmp_root() -> String {
    std::fs::canonicalize(std::env::temp_dir())
        .unwrap()
        .display()
        .to_string()
}

fn shadow_options(webhook: &str) -> HostOptions {
    HostOptions {
        model: json!({"rules": [{"reply": "the shadow answers"}]}),
        config: vec![
            ("shadow", Yaml::Bool(true)),
            ("shadow_root", Yaml::String(tmp_root())),
            ("webhook.url", Yaml::String(webhook.into())),
            ("review.owner", Yaml::String("owner".into())),
        ],
        ..Default::default()
    }
}

/// A platform conversation (and the owner's DM one) written straight into
/// the database, as a snapshot carries them: a shadow mints no adapter token.
fn seed_conversations(host: &TestHost, space: &str) -> (i64, i64) {
    let space = space.to_owned();
    host.write(move |tx| {
        let group: i64 = tx.query_row(
            "INSERT INTO conversations (platform, external_id, space_id, kind, first_seen_at, last_seen_at) VALUES ('test', 'group-1', ?1, 'group', 1, 2) RETURNING id",
            &[&space],
            |r| r.get(0),
        )?;
        let dm: i64 = tx.query_row(
            "INSERT INTO conversations (platform, external_id, space_id, kind, first_seen_at, last_seen_at) VALUES ('test', 'owner-dm', ?1, 'dm', 1, 1) RETURNING id",
            &[&space],
            |r| r.get(0),
        )?;
        // An old owner message: the DM is the owner's, and no review window holds it.
        tx.execute(
            "INSERT INTO messages (space_id, conversation_id, sender_id, role, text, created_at, status) VALUES (?1, ?2, 'owner', 'user', 'hi bot', 0, 'done')",
            &[&space, &dm],
        )?;
        Ok((group, dm))
    })
}

async fn wait_transcript(
    data: &Path,
    want: usize,
) -> Vec<mercury::workspace::transcript::TranscriptEntry> {
    let t = Transcript::of(data);
    for _ in 0..400 {
        let all = t.read_all().unwrap();
        if all.len() >= want {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.read_all().unwrap()
}

#[tokio::test]
async fn shadow_mode_diverts_every_send_and_refuses_outside_writes() {
    let hook = receiver().await;
    let host = TestHost::start(shadow_options(&hook.url)).await;
    // The adapter construction point refused the webhook at start.
    let first = wait_transcript(&host.data, 1).await;
    assert!(
        first.iter().any(|e| e.kind == TranscriptKind::Refusal
            && e.source == "adapter"
            && e.text.contains("Webhook")),
        "{first:?}"
    );
    let (st, v) = host.send(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(
        (st, v["shadow"].clone(), v["mode"].clone()),
        (200, json!(true), json!("shadow"))
    );
    host.create_space("alpha").await;
    let (group, dm) = seed_conversations(&host, "alpha");
    // An undelivered live reply, as a snapshot copies it: nothing may post it.
    host.write(move |tx| {
        tx.execute(
            "INSERT INTO outbox (space_id, conversation_id, platform, external_id, text, created_at) VALUES ('alpha', ?1, 'test', 'group-1', 'left over from live', 1)",
            &[&group],
        )?;
        Ok(())
    });

    // send
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/send",
            Some("alpha"),
            Some(json!({"text": "hello people"})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(
        (v["outbox_id"].clone(), v["shadow"].clone()),
        (Value::Null, json!(true))
    );
    // reply (a non-silent task's answer goes to the space's platform conversation)
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/tasks",
            Some("alpha"),
            Some(json!({"cron": "0 0 1 1 *", "prompt": "the yearly note"})),
        )
        .await;
    assert!(st == 201 || st == 200, "{v}");
    let task = v["id"].as_i64().or(v["task"]["id"].as_i64()).unwrap();
    let (st, v) = host
        .owner(
            Method::POST,
            &format!("/api/tasks/{task}/run"),
            Some("alpha"),
            None,
        )
        .await;
    assert_eq!(st, 202, "{v}");
    // digest
    let (st, v) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["digest"]["sent"], true, "{v}");
    assert_eq!(v["digest"]["outbox_id"], Value::Null, "{v}");
    assert_eq!(v["digest"]["conversation_id"], dm, "{v}");

    let all = wait_transcript(&host.data, 4).await;
    let sends: Vec<_> = all
        .iter()
        .filter(|e| e.kind == TranscriptKind::Send)
        .collect();
    let by = |src: &str| sends.iter().find(|e| e.source == src).cloned();
    let send = by("send").expect("the send is in the transcript");
    assert_eq!(
        (send.space.as_deref(), send.conversation, send.text.as_str()),
        (Some("alpha"), Some(group), "hello people")
    );
    let reply = by("reply").expect("the task reply is in the transcript");
    assert_eq!(reply.text, "the shadow answers");
    let digest = by("digest").expect("the digest is in the transcript");
    assert_eq!(digest.conversation, Some(dm));

    // The outbox pull and an adapter token: refused, and listed.
    let (st, v) = host.owner(Method::GET, "/api/outbox", None, None).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/tokens",
            None,
            Some(json!({"caller_id": "adapter:x", "kind": "adapter", "platform": "test"})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let all = Transcript::of(&host.data).read_all().unwrap();
    for src in ["outbox", "adapter"] {
        assert!(
            all.iter()
                .any(|e| e.kind == TranscriptKind::Refusal && e.source == src),
            "{src}: {all:?}"
        );
    }
    // whoami says shadow, in JSON and through mrctl.
    let (_, v) = host.owner(Method::GET, "/api/whoami", None, None).await;
    assert_eq!(v["shadow"], true, "{v}");
    // Off the test's runtime thread: the in-process host answers on it.
    let mut cmd = host.mrctl(&host.owner_token, None);
    cmd.arg("whoami");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("SHADOW"), "{text}");

    // Nothing was queued for delivery and nothing was posted.
    assert_eq!(
        host.count("SELECT COUNT(*) FROM outbox WHERE text != 'left over from live'"),
        0
    );
    assert_eq!(
        host.count("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL AND attempts = 0"),
        1
    );
    host.stop().await;
    assert_eq!(
        hook.count(),
        0,
        "the webhook receiver got {:?}",
        hook.hits.lock().unwrap()
    );
}

/// The same receiver and the same kind of send on a live host: it is posted.
/// (What makes the shadow's zero above mean something.)
#[tokio::test]
async fn shadow_control_a_live_host_posts_the_send_to_the_webhook() {
    let hook = receiver().await;
    let mut opts = shadow_options(&hook.url);
    opts.config.retain(|(k, _)| !k.starts_with("shadow"));
    let host = TestHost::start(opts).await;
    host.create_space("alpha").await;
    host.platform_conversation("group-1", "alpha").await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/send",
            Some("alpha"),
            Some(json!({"text": "hello people"})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    assert!(v["outbox_id"].is_i64(), "{v}");
    // Waits for this send itself: under the full suite a post meant for an
    // earlier test's receiver (its port since reused by this one) can land
    // here first.
    let posted = || {
        hook.hits
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("hello people"))
    };
    for _ in 0..200 {
        if posted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(hook
        .hits
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.contains("hello people")));
    assert!(!Transcript::of(&host.data).path().exists());
    host.stop().await;
}

#[tokio::test]
async fn shadow_adapter_construction_point_builds_none_in_shadow_mode() {
    let t = tempfile::tempdir().unwrap();
    let mut settings = mercury::config::Settings {
        webhook: mercury::config::WebhookConfig {
            url: "http://127.0.0.1:9/hook".into(),
            max_attempts: 1,
        },
        ..Default::default()
    };
    settings.adapters.telegram.enabled = true;
    settings.adapters.discord.enabled = true;
    let live = mercury::runtime::Outbound::Live;
    use mercury::host::OutboundAdapter::{Chat, Webhook};
    assert_eq!(
        mercury::host::outbound_adapters(&settings, &live),
        vec![Webhook, Chat("telegram"), Chat("discord")]
    );
    let shadow = mercury::runtime::Outbound::Shadow(Transcript::of(t.path()));
    assert!(mercury::host::outbound_adapters(&settings, &shadow).is_empty());
    let lines = Transcript::of(t.path()).read_all().unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(
            (line.kind.clone(), line.source.as_str()),
            (TranscriptKind::Refusal, "adapter")
        );
    }
}

fn mercury_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null());
    c
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(Result::unwrap)
        .map(|e| e.path().display().to_string())
        // The WAL files come and go with the fixture's own closing connection.
        .filter(|p| !p.ends_with("-wal") && !p.ends_with("-shm"))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn shadow_data_dir_guard_refuses_before_touching_the_dir() {
    let (_dir, data, _) = prepare(&HostOptions::default()).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let before = listing(&data);
    let run = |env: &[(&str, &str)]| {
        let out = mercury_cmd()
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let root = elsewhere.path().to_str().unwrap();
    // Shadow mode on a data dir outside the shadow root.
    let (code, err) = run(&[("MERCURY_SHADOW", "1"), ("MERCURY_SHADOW_ROOT", root)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not under the shadow root"), "{err}");
    // Shadow mode with no shadow root at all.
    let (code, err) = run(&[("MERCURY_SHADOW", "true")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("shadow_root"), "{err}");
    // A flag value that is neither 1 nor true: an error naming the key.
    let (code, err) = run(&[("MERCURY_SHADOW", "yes"), ("MERCURY_SHADOW_ROOT", root)]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("MERCURY_SHADOW") && err.contains("config key shadow"),
        "{err}"
    );
    assert_eq!(
        listing(&data),
        before,
        "a refused start wrote into the data dir"
    );
    // A snapshot (it holds SNAPSHOT.json) without shadow mode.
    std::fs::write(data.join("SNAPSHOT.json"), "{}").unwrap();
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("shadow snapshot"), "{err}");
}

/// A live host with three spaces, traffic, a symlink in a workspace that
/// points outside it, and secrets in global/.
async fn live_with_traffic(host: &TestHost) {
    for s in ["alpha", "beta", "gamma"] {
        host.create_space(s).await;
        host.chat(s, &format!("hello {s}")).await;
    }
    host.grant("beta", "api:bob", "member").await;
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/prefs",
            Some("alpha"),
            Some(json!({"key": "tone", "value": "formal"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    std::fs::write(host.dir.path().join("canary.txt"), "outside the workspace").unwrap();
    std::os::unix::fs::symlink(
        host.dir.path().join("canary.txt"),
        host.data.join("spaces/alpha/knowledge/link"),
    )
    .unwrap();
    std::fs::write(
        host.data.join("global/auth.json"),
        "{\"refresh\": \"live-refresh\"}",
    )
    .unwrap();
    std::fs::write(host.data.join("global/notes.md"), "operator notes").unwrap();
    std::fs::write(host.data.join("global/api_key"), "sk-live-key").unwrap();
}

pub(crate) fn snapshot_cli(
    live: &Path,
    root: &Path,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let out = mercury_cmd()
        .arg("shadow")
        .arg("snapshot")
        .arg("--data-dir")
        .arg(live)
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A read-only connection, through storage, to a database no host serves
/// (the snapshot's copy).
fn ro(path: &Path) -> Conn {
    mercury::storage::open_read_only_conn(path).unwrap()
}

#[tokio::test]
async fn shadow_snapshot_copies_a_serving_host_without_tokens_secrets_or_admins() {
    let host = TestHost::start(HostOptions {
        config: vec![("admins", Yaml::Sequence(vec![Yaml::from("api:liveadmin")]))],
        ..Default::default()
    })
    .await;
    live_with_traffic(&host).await;
    // Enough live tokens that their rows fill pages the swap frees.
    for i in 0..40 {
        host.token(&format!("api:user{i}"), "user").await;
    }
    // And a dashboard sign-in, whose cookie hash must not cross either.
    let signed_in = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={}", host.owner_token))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 303);
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    let live_rows = host.all_row_counts();
    // Taken while the host serves (and answers a chat in between).
    let (code, out, err) = {
        let (d, r) = (host.data.clone(), root_path.clone());
        tokio::task::spawn_blocking(move || {
            snapshot_cli(
                &d,
                &r,
                &[
                    "--admins",
                    "api:rehearser",
                    "--label",
                    "try a new AGENTS.md",
                ],
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(code, Some(0), "{out}{err}");
    host.chat("alpha", "still serving").await;
    let current = std::fs::read_link(root_path.join("current")).unwrap();
    let dir = root_path.join(&current);
    let manifest_text = std::fs::read_to_string(dir.join("SNAPSHOT.json")).unwrap();
    let m: Manifest = serde_json::from_str(&manifest_text).unwrap();
    assert_eq!(m.admin_count, Some(1));
    assert_eq!(m.label.as_deref(), Some("try a new AGENTS.md"));
    assert_eq!(m.product_version, env!("CARGO_PKG_VERSION"));
    assert!(!m.git_revision.is_empty());
    assert_eq!(
        Path::new(&m.live_data_dir),
        std::fs::canonicalize(&host.data).unwrap()
    );
    for id in ["api:rehearser", "api:liveadmin"] {
        assert!(!manifest_text.contains(id), "the manifest names {id}");
        assert!(
            !out.contains(id) && !err.contains(id),
            "the output names {id}"
        );
    }
    // The copy: every row but the tokens, which are the shadow's own, and
    // the dashboard's sign-ins, which were made with live tokens.
    let copy = ro(&dir.join("state.db"));
    for (table, n) in &live_rows {
        let c = inspect::row_count(&copy, table).unwrap();
        if table == "api_tokens" {
            assert_eq!(c, 1, "only the shadow's owner token");
        } else if table == "ui_signins" || table == "ui_login_links" {
            assert_eq!(c, 0, "{table} crossed into the copy");
        } else {
            assert_eq!(c, *n, "{table}");
        }
    }
    let shadow_token = std::fs::read_to_string(dir.join("global/owner.token")).unwrap();
    assert_ne!(shadow_token.trim(), host.owner_token);
    // global/: only what the product writes there itself, never a name
    // that merely looks harmless (issue 23 item 10).
    for p in ["global/auth.json", "global/api_key", "global/notes.md"] {
        assert!(!dir.join(p).exists(), "{p} was copied");
    }
    // No live token hash survives in the copy's free pages either.
    let raw = std::fs::read(dir.join("state.db")).unwrap();
    let live_hashes: Vec<String> = host.read(|c| {
        c.query_all(
            "SELECT token_hash FROM api_tokens UNION ALL SELECT secret_hash FROM ui_signins",
            &[],
            |r| r.get(0),
        )
    });
    assert!(live_hashes.len() > 40, "{}", live_hashes.len());
    for h in &live_hashes {
        assert!(
            !raw.windows(h.len()).any(|w| w == h.as_bytes()),
            "a live token hash is in the copy's file"
        );
    }
    // The symlink is a symlink in the copy, never its target's bytes.
    let link = dir.join("spaces/alpha/knowledge/link");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        host.workspace_hashes("beta"),
        walk_hashes(&dir.join("spaces/beta")),
        "the workspace copy is byte-identical"
    );
    // Its containers carry their own instance label: no sweep crosses.
    assert_ne!(
        mercury::sandbox::instance_id_for(&std::fs::canonicalize(&host.data).unwrap()).unwrap(),
        mercury::sandbox::instance_id_for(&dir).unwrap()
    );
    // The derived config: shadow on, its own port, admins exactly --admins.
    let s = mercury::config::load(&dir.join("mercury.yaml"), &Default::default()).unwrap();
    assert!(s.shadow);
    assert_eq!(s.admins, vec!["api:rehearser".to_string()]);
    assert_eq!(Path::new(&s.shadow_root), root_path);
    let live_s =
        mercury::config::load(&host.data.join("mercury.yaml"), &Default::default()).unwrap();
    let port = |b: &str| b.rsplit_once(':').unwrap().1.parse::<u16>().unwrap();
    assert_eq!(port(&s.bind), port(&live_s.bind) + 1);
    // Modes: the copy is as private as the live dir.
    use std::os::unix::fs::PermissionsExt;
    for p in [
        dir.clone(),
        dir.join("state.db"),
        dir.join("global/owner.token"),
    ] {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o077;
        assert_eq!(mode, 0, "{} is open to others", p.display());
    }
    // Default admins: none, never inherited.
    let (code, _, err) = snapshot_cli(&host.data, &root_path, &[]);
    assert_eq!(code, Some(0), "{err}");
    let dir2 = root_path.join(std::fs::read_link(root_path.join("current")).unwrap());
    let s2 = mercury::config::load(&dir2.join("mercury.yaml"), &Default::default()).unwrap();
    assert!(s2.admins.is_empty());
    assert_eq!(Manifest::read(&dir2).unwrap().admin_count, Some(0));
    // Bad input: a refusal with a sentence, nothing written.
    let (code, _, err) = snapshot_cli(&host.data, &root_path, &["--admins", "not an id"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = snapshot_cli(&dir2, &root_path, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        mercury::shadow::snapshot::list(&root_path).unwrap().len(),
        2
    );
    host.stop().await;
}

fn walk_hashes(root: &Path) -> Vec<(String, String)> {
    use sha2::{Digest, Sha256};
    let mut out: Vec<(String, String)> = walkdir::WalkDir::new(root)
        .into_iter()
        .map(Result::unwrap)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            (
                rel,
                base16ct::lower::encode_string(&Sha256::digest(std::fs::read(e.path()).unwrap())),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn shadow_prune_keeps_the_newest_and_never_the_running_one() {
    let (_dir, data, _) = prepare(&HostOptions::default()).await;
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let (code, _, err) = snapshot_cli(&data, &root_path, &[]);
        assert_eq!(code, Some(0), "{err}");
        ids.push(
            std::fs::read_link(root_path.join("current"))
                .unwrap()
                .display()
                .to_string(),
        );
    }
    // The oldest is recorded as running.
    let running = json!({
        "snapshot": ids[0], "data_dir": root_path.join(&ids[0]), "pid": std::process::id(),
        "port": 1, "url": "http://127.0.0.1:1", "started_at_ms": 0
    });
    std::fs::write(root_path.join("running.json"), running.to_string()).unwrap();
    let removed = mercury::shadow::snapshot::prune(&root_path, 1).unwrap();
    assert_eq!(removed, vec![ids[1].clone(), ids[2].clone()]);
    let left = mercury::shadow::snapshot::list(&root_path).unwrap();
    assert_eq!(left, vec![ids[0].clone(), ids[3].clone()]);
}

/// A live data dir (not serving) and a snapshot of it under a fresh root.
struct UpFixture {
    _live_dir: crate::common::TestDir,
    live: std::path::PathBuf,
    _root_dir: tempfile::TempDir,
    root: std::path::PathBuf,
    snap: std::path::PathBuf,
}

async fn up_fixture(live_keys: Vec<(&'static str, Yaml)>) -> UpFixture {
    let (live_dir, live, _) = prepare(&HostOptions {
        config: live_keys,
        ..Default::default()
    })
    .await;
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let opts = mercury::shadow::snapshot::SnapshotOptions {
        live_data_dir: live.clone(),
        root: root.clone(),
        admins: vec!["api:rehearser".into()],
        label: None,
        port: Some(crate::common::free_port()),
        progress: false,
        live_store: None,
    };
    let out = mercury::shadow::snapshot::take(&opts).unwrap();
    UpFixture {
        _live_dir: live_dir,
        live,
        _root_dir: root_dir,
        root,
        snap: out.dir,
    }
}

impl UpFixture {
    /// `mercury shadow up` with `args`: its exit code and stderr.
    fn up(&self, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
        let out = mercury_cmd()
            .envs(env.iter().copied())
            .args(["shadow", "up", "--root"])
            .arg(&self.root)
            .args(args)
            .output()
            .unwrap();
        assert!(
            !self.root.join("running.json").exists(),
            "a refused up recorded a running shadow"
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn refused(&self, args: &[&str], env: &[(&str, &str)], sentence: &str) {
        let (code, err) = self.up(args, env);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(sentence), "expected {sentence:?} in {err:?}");
        assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    }

    fn edit_manifest(&self, f: impl FnOnce(&mut Value)) {
        let p = self.snap.join("SNAPSHOT.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
    }

    fn shadow_keys(&self, keys: &[(&str, Yaml)]) {
        mercury::config::set_keys(&self.snap.join("mercury.yaml"), keys).unwrap();
    }
}

#[tokio::test]
async fn shadow_up_refuses_a_snapshot_older_than_max_age() {
    let f = up_fixture(vec![]).await;
    f.edit_manifest(|v| v["created_at_ms"] = json!(0));
    f.refused(&[], &[], "older than --max-age 1d 0h");
}

#[tokio::test]
async fn shadow_up_refuses_a_manifest_without_an_admin_count() {
    let f = up_fixture(vec![]).await;
    f.edit_manifest(|v| {
        v.as_object_mut().unwrap().remove("admin_count");
    });
    f.refused(&[], &[], "records no admin count");
}

#[tokio::test]
async fn shadow_up_refuses_under_min_free_mem() {
    let f = up_fixture(vec![]).await;
    f.refused(
        &["--min-free-mem", "100000G"],
        &[],
        "of memory is free, under --min-free-mem",
    );
}

#[tokio::test]
async fn shadow_up_refuses_under_min_free_disk() {
    let f = up_fixture(vec![]).await;
    f.refused(
        &["--min-free-disk", "100000G"],
        &[],
        "of disk is free under the shadow root",
    );
}

/// Needs the Docker engine: a container carrying the live instance's label.
#[tokio::test]
async fn shadow_up_refuses_while_a_live_container_runs_a_turn() {
    let f = up_fixture(vec![("sandbox.backend", Yaml::from("docker"))]).await;
    let instance =
        mercury::sandbox::instance_id_for(&std::fs::canonicalize(&f.live).unwrap()).unwrap();
    let tar = f.root.join("empty.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .args(["--files-from", "/dev/null"])
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("docker")
        .arg("import")
        .arg(&tar)
        .arg("mercury-shadow-test:empty")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "docker import");
    let out = Command::new("docker")
        .args(["create", "--label"])
        .arg(format!("mercury.instance={instance}"))
        .args(["mercury-shadow-test:empty", "/turn"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let result = f.up(&[], &[]);
    let _ = Command::new("docker")
        .args(["rm", "-f", &id])
        .stdout(Stdio::null())
        .status();
    let (code, err) = result;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the live instance is running a turn (1 container"),
        "{err}"
    );
    // And with the container gone, that refusal is gone too (another may follow).
    let (_, err) = f.up(&["--min-free-mem", "100000G"], &[]);
    assert!(!err.contains("running a turn"), "{err}");
}

#[tokio::test]
async fn shadow_up_refuses_a_live_task_due_within_the_window_or_unknown() {
    let f = up_fixture(vec![]).await;
    let store = Store::open(&f.live.join("state.db")).unwrap();
    let soon = mercury::clock::now_ms() + 60_000;
    write_to(&store, move |tx| {
        tx.execute(
            "INSERT INTO spaces (id, name, created_at, updated_at) VALUES ('alpha', 'alpha', 0, 0)",
            &[],
        )?;
        tx.execute(
            "INSERT INTO tasks (space_id, cron, prompt, next_run_at, created_by, created_at, updated_at) VALUES ('alpha', '* * * * *', 'p', ?1, 'owner', 0, 0)",
            &[&soon],
        )?;
        Ok(())
    });
    f.refused(&[], &[], "a live scheduled task is due in");
    write_to(&store, |tx| {
        tx.execute("UPDATE tasks SET next_run_at = NULL", &[])?;
        Ok(())
    });
    f.refused(&[], &[], "when the live scheduled tasks are due is unknown");
    // Outside the window: that refusal is gone.
    write_to(&store, move |tx| {
        tx.execute("UPDATE tasks SET next_run_at = ?1", &[&(soon + 7_200_000)])?;
        Ok(())
    });
    let (_, err) = f.up(&["--min-free-mem", "100000G"], &[]);
    assert!(!err.contains("scheduled task"), "{err}");
}

#[tokio::test]
async fn shadow_up_refuses_a_missing_agent_image_and_names_the_tag() {
    let f = up_fixture(vec![]).await;
    f.shadow_keys(&[
        ("sandbox.backend", Yaml::from("docker")),
        ("sandbox.image", Yaml::from("mercury-shadow-test:absent")),
    ]);
    f.refused(
        &[],
        &[],
        "the agent image mercury-shadow-test:absent is missing",
    );
}

#[tokio::test]
async fn shadow_up_refuses_a_taken_port() {
    let f = up_fixture(vec![]).await;
    let s = mercury::config::load(&f.snap.join("mercury.yaml"), &Default::default()).unwrap();
    let _held = std::net::TcpListener::bind(&s.bind).unwrap();
    let port = s.bind.rsplit_once(':').unwrap().1.to_string();
    f.refused(&[], &[], &format!("port {port} is taken"));
}

#[tokio::test]
async fn shadow_up_refuses_a_provider_without_a_shadow_key_even_with_the_live_key() {
    let f = up_fixture(vec![]).await;
    f.shadow_keys(&[("model", Yaml::from("openai:gpt-4o-mini"))]);
    f.refused(
        &[],
        &[("MERCURY_OPENAI_API_KEY", "sk-live-secret")],
        "uses openai but the shadow has no openai key",
    );
}

/// Every row of every table, as text (a byte-level fingerprint of a database).
fn dump(host: &TestHost) -> Vec<String> {
    host.read(|c| {
        let mut out = Vec::new();
        for n in inspect::tables(c)? {
            for vals in inspect::rows_as_text(c, &n)? {
                out.push(format!("{n}: {}", vals.join(" | ")));
            }
        }
        Ok(out)
    })
}

fn grep_tree(root: &Path, needle: &str) -> Vec<String> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .map(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.path().display().to_string())
        .collect()
}

pub(crate) async fn call(
    url: &str,
    method: Method,
    path: &str,
    token: &str,
    space: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .bearer_auth(token);
    if let Some(s) = space {
        req = req.header("x-mercury-space", s);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let st = r.status().as_u16();
    (
        st,
        serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null),
    )
}

pub(crate) fn shadow_cli(
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let out = mercury_cmd()
        .env("MERCURY_LOG", "info")
        .envs(env.iter().copied())
        .arg("shadow")
        .args(args)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const LIVE_KEY: &str = "sk-live-canary-7f3a9c";

#[tokio::test]
async fn shadow_rehearsal_end_to_end_on_real_processes() {
    let hook = receiver().await;
    let mut live = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"match": "remember", "tool_calls": [{"name": "write_file", "arguments": {"path": "MEMORY.md", "content": "# Memory\n\nThe sky is green here.\n"}}]},
            {"match": "tool_result\\(write_file\\)", "reply": "noted"},
            {"reply": "ok"}
        ]}),
        config: vec![("webhook.url", Yaml::String(hook.url.clone()))],
        env: vec![("MERCURY_OPENAI_API_KEY", LIVE_KEY.to_string())],
        ..Default::default()
    })
    .await;
    // Three spaces with traffic: console turns and a platform conversation.
    for s in ["alpha", "beta", "gamma"] {
        live.create_space(s).await;
        live.chat(s, &format!("hello {s}")).await;
    }
    live.platform_conversation("grp-alpha", "alpha").await;
    live.platform_conversation("grp-beta", "beta").await;
    let (st, v) = live
        .owner(
            Method::PUT,
            "/api/prefs",
            Some("alpha"),
            Some(json!({"key": "tone", "value": "formal"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = live
        .owner(
            Method::POST,
            "/api/send",
            Some("beta"),
            Some(json!({"text": "live news"})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    // Let the live webhook deliver everything the live host queued.
    for _ in 0..400 {
        if live.count("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL") == 0
            && live.count("SELECT COUNT(*) FROM messages WHERE status = 'pending'") == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live_posts = hook.count();
    assert!(live_posts >= 1, "the live host posts to the receiver");

    // Snapshot while the live host serves.
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let (code, out, err) = snapshot_cli(
        &live.data,
        &root,
        &["--admins", "api:rehearser", "--label", "e2e"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let before_rows = dump(&live);
    let before_files: Vec<_> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|s| live.workspace_hashes(s))
        .collect();

    // up: with the live key in the operator's environment, on purpose. On a
    // port of its own: the snapshot's (the live port + 1) may be any other
    // test's at that moment.
    let port = crate::common::free_port().to_string();
    let (code, out, err) = shadow_cli(
        &root,
        &["up", "--port", &port],
        &[("MERCURY_OPENAI_API_KEY", LIVE_KEY)],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let running: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("running.json")).unwrap()).unwrap();
    let url = running["url"].as_str().unwrap().to_string();
    let snap = std::path::PathBuf::from(running["data_dir"].as_str().unwrap());
    let pid = running["pid"].as_u64().unwrap();
    let token = std::fs::read_to_string(snap.join("global/owner.token"))
        .unwrap()
        .trim()
        .to_string();
    // A second up is refused while this one runs.
    let (code, _, err) = shadow_cli(&root, &["up"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("a shadow is running already"), "{err}");

    // Tokens do not cross, either way.
    let (st, _) = call(
        &url,
        Method::GET,
        "/api/whoami",
        &live.owner_token,
        None,
        None,
    )
    .await;
    assert_eq!(st, 401);
    let (st, _) = live
        .call(Method::GET, "/api/whoami", Some(&token), None, None)
        .await;
    assert_eq!(st, 401);
    let (st, v) = call(&url, Method::GET, "/api/whoami", &token, None, None).await;
    assert_eq!((st, v["shadow"].clone()), (200, json!(true)), "{v}");

    // The rehearsal: a console turn writes MEMORY.md, a preference changes, a send.
    let (st, v) = call(
        &url,
        Method::POST,
        "/api/chat",
        &token,
        Some("alpha"),
        Some(json!({"text": "remember the sky is green"})),
    )
    .await;
    assert_eq!((st, v["reply"].clone()), (200, json!("noted")), "{v}");
    let (st, v) = call(
        &url,
        Method::PUT,
        "/api/prefs",
        &token,
        Some("alpha"),
        Some(json!({"key": "tone", "value": "casual"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(
        &url,
        Method::POST,
        "/api/send",
        &token,
        Some("beta"),
        Some(json!({"text": "rehearsal send"})),
    )
    .await;
    assert_eq!((st, v["outbox_id"].clone()), (202, Value::Null), "{v}");

    // status names the snapshot, its admin count and the pid.
    let (code, out, _) = shadow_cli(&root, &["status"], &[]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("admins 1") && out.contains(&pid.to_string()),
        "{out}"
    );
    // The shadow's environment holds no live key.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains(LIVE_KEY));
    assert!(String::from_utf8_lossy(&environ).contains("MERCURY_SHADOW=1"));

    // The diff shows exactly those changes.
    let (code, out, err) = shadow_cli(&root, &["diff", "--json"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let d: Value = serde_json::from_str(&out).unwrap();
    let rows = d["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            rows[0]["table"].as_str(),
            rows[0]["space"].as_str(),
            rows[0]["key"].as_str()
        ),
        (Some("space_preferences"), Some("alpha"), Some("tone"))
    );
    assert_eq!(rows[0]["before"]["value"], "formal");
    assert_eq!(rows[0]["after"]["value"], "casual");
    assert_eq!(rows[0]["after"]["updated_by"], "owner");
    let files = d["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(
        (
            files[0]["space"].as_str(),
            files[0]["path"].as_str(),
            files[0]["change"].as_str(),
            files[0]["class"].as_str()
        ),
        (
            Some("alpha"),
            Some("MEMORY.md"),
            Some("changed"),
            Some("memory")
        )
    );
    let sends = d["sends"].as_array().unwrap();
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(
        (sends[0]["text"].as_str(), sends[0]["space"].as_str()),
        (Some("rehearsal send"), Some("beta"))
    );
    let added: Vec<(String, u64)> = d["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["space"].as_str().unwrap().to_string(),
                m["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        added,
        vec![("alpha".to_string(), 2), ("beta".to_string(), 1)]
    );
    assert!(d["runs"]["runs"].as_u64().unwrap() >= 1, "{}", d["runs"]);
    // --space narrows every part of the report to one space.
    let (code, out, err) = shadow_cli(&root, &["diff", "--json", "--space", "beta"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            b["rows"].as_array().unwrap().len(),
            b["files"].as_array().unwrap().len(),
            b["sends"].as_array().unwrap().len()
        ),
        (0, 0, 1),
        "{b}"
    );
    let (code, human, _) = shadow_cli(&root, &["diff"], &[]);
    assert_eq!(code, Some(0));
    assert!(
        human.contains("space_preferences tone") && human.contains("MEMORY.md"),
        "{human}"
    );

    // down stops it and prints the cost.
    let (code, out, err) = shadow_cli(&root, &["down"], &[]);
    assert_eq!(code, Some(0), "{err}");
    // In the one currency format, the shadow's own currency (docs/spend.md).
    let cost = out.split("cost ").nth(1).unwrap_or_default().trim();
    assert!(
        cost.ends_with(" USD")
            && cost
                .split(' ')
                .next()
                .is_some_and(|n| n.parse::<f64>().is_ok()),
        "{out}"
    );
    assert!(!out.contains('$'), "{out}");
    assert!(!root.join("running.json").exists());

    // logs prints the shadow host's log.
    let (code, logs_out, _) = shadow_cli(&root, &["logs"], &[]);
    assert_eq!(code, Some(0));
    assert!(logs_out.contains("shadow=1 SHADOW MODE"), "{logs_out}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(snap.join("shadow/host.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the shadow's log is private");
    }
    // Every line the shadow host logged says shadow=1.
    let log = std::fs::read_to_string(snap.join("shadow/host.log")).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l.contains("shadow=1"), "a log line without shadow=1: {l:?}");
    }
    // The live key is in no file of the shadow root (snapshot, log, transcript).
    assert!(grep_tree(&root, LIVE_KEY).is_empty());
    // The receiver got nothing from the shadow.
    assert_eq!(hook.count(), live_posts);
    assert!(!hook
        .hits
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.contains("rehearsal send") || h.contains(LIVE_KEY)));
    // The live host: rows and workspaces byte-identical.
    assert_eq!(dump(&live), before_rows);
    let after_files: Vec<_> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|s| live.workspace_hashes(s))
        .collect();
    assert_eq!(after_files, before_files);
    live.kill();
}

#[tokio::test]
async fn shadow_auth_set_key_writes_the_shadows_own_key_and_never_prints_it() {
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let mut child = mercury_cmd()
        .args(["shadow", "auth", "set-key", "openai", "--root"])
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"sk-shadow-own\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sk-shadow-own"));
    let file = root.join("auth/openai.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let chain = vec!["openai:gpt-4o-mini".to_string()];
    assert!(mercury::shadow::credential::providers_without_key(
        &chain,
        Some(&root),
        &Default::default()
    )
    .is_empty());
    // An unknown provider is refused with a sentence.
    let out = mercury_cmd()
        .args(["shadow", "auth", "set-key", "gemini", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 25 item 1: a live host configured by its environment
/// (`MERCURY_PROVIDERS_OPENAI_BASE_URL`, as the README allows for any key)
/// records those settings; the snapshot carries them into the shadow's
/// `mercury.yaml` (whose comments it keeps), `shadow up --port` serves on the
/// port given, and `up` lists every setting that differs from the live host's
/// (ids of people said to differ, never printed).
#[tokio::test]
async fn shadow_keeps_the_live_environment_settings_and_comments_and_up_lists_what_differs() {
    let proxy = "http://127.0.0.1:4000/v1";
    let live = TestHost::start_process(HostOptions {
        env: vec![
            ("MERCURY_PROVIDERS_OPENAI_BASE_URL", proxy.to_string()),
            ("MERCURY_PROVIDERS_MAX_RETRIES", "5".to_string()),
        ],
        ..Default::default()
    })
    .await;
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(live.data.join("environment.json")).unwrap())
            .unwrap();
    assert_eq!(
        recorded["settings"]["providers.openai_base_url"], proxy,
        "{recorded}"
    );
    assert_eq!(
        recorded["settings"]["providers.max_retries"], 5,
        "{recorded}"
    );
    // The operator's comments in the live file.
    let cfg = live.data.join("mercury.yaml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        format!("# the family bot, set up on day one\n{text}# keep the port\n"),
    )
    .unwrap();

    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let (code, out, err) = snapshot_cli(&live.data, &root, &["--admins", "api:rehearser"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let snap_cfg = std::fs::read_to_string(root.join("current/mercury.yaml")).unwrap();
    assert!(
        snap_cfg.starts_with("# the family bot, set up on day one\n"),
        "{snap_cfg}"
    );
    assert!(snap_cfg.contains("# keep the port"), "{snap_cfg}");
    let shadow =
        mercury::config::load(&root.join("current/mercury.yaml"), &Default::default()).unwrap();
    assert_eq!(shadow.providers.openai_base_url, proxy);
    assert_eq!(shadow.providers.max_retries, 5);
    assert!(shadow.shadow);

    let port = crate::common::free_port();
    let (code, out, err) = shadow_cli(&root, &["up", "--port", &port.to_string()], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let running: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("running.json")).unwrap()).unwrap();
    assert_eq!(running["port"], port, "{running}");
    assert!(
        out.contains("settings that differ from the live host's"),
        "{out}"
    );
    assert!(
        out.contains(&format!("    bind: \"127.0.0.1:{port}\" (live: ")),
        "{out}"
    );
    assert!(out.contains("    shadow: true (live: false)"), "{out}");
    assert!(out.contains("    admins: differs (not shown)"), "{out}");
    assert!(!out.contains("rehearser"), "an admin id was printed: {out}");
    assert!(
        !out.contains("providers.openai_base_url"),
        "carried, so the same: {out}"
    );
    let (code, out, err) = shadow_cli(&root, &["down"], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    live.stop().await;
}
