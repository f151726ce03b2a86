//! PostgreSQL as a deployment uses it: TLS as `sslmode` says, a password
//! from a file, `mercury storage copy` moving a data dir up, and a real host
//! on the copied database serving a turn with a tool call, a link act-as
//! and a server restart under it.

use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use mercury::storage::{spaces, Location, Store};

use crate::common::{HostOptions, TestHost};
use crate::pg::{cluster_dir, port, psql, PgDatabase, PrivateCluster};

fn tls_connections(db: &str) -> i64 {
    psql(
        "postgres",
        &format!(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.datname = '{db}'"
        ),
    )
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_and_verify_full_checks_the_certificate() {
    let db = PgDatabase::create();
    let url = |q: &str| format!("postgres://postgres@localhost:{}/{}?{q}", port(), db.name);
    let store = Store::open_at(&Location::Postgres {
        url: url("sslmode=require"),
        password: None,
    })
    .unwrap();
    store
        .write(|tx| spaces::create_space(tx, "tls", "tls", &[]))
        .await
        .unwrap();
    assert!(
        tls_connections(&db.name) >= 1,
        "the store's connections are TLS"
    );
    drop(store);

    let root = format!("{}/root.crt", cluster_dir());
    let verified = Store::open_at(&Location::Postgres {
        url: url(&format!("sslmode=verify-full&sslrootcert={root}")),
        password: None,
    })
    .unwrap();
    assert!(verified
        .read(|c| spaces::space_exists(c, "tls"))
        .await
        .unwrap());
    drop(verified);

    // A root that did not sign the server's certificate is refused.
    let other = tempfile::tempdir().unwrap();
    let (key, crt) = (other.path().join("k.pem"), other.path().join("c.pem"));
    let st = Command::new("openssl")
        .args([
            "req",
            "-new",
            "-x509",
            "-days",
            "1",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .unwrap();
    assert!(st.status.success());
    let refused = Store::open_at(&Location::Postgres {
        url: url(&format!(
            "sslmode=verify-full&sslrootcert={}",
            crt.display()
        )),
        password: None,
    });
    let err = refused
        .err()
        .expect("an unknown authority is refused")
        .to_string();
    assert!(err.contains("cannot be reached"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_comes_from_the_location_and_is_never_printed() {
    let db = PgDatabase::create();
    psql(&db.name, "GRANT ALL ON SCHEMA public TO mercury_pw");
    let url = format!(
        "postgres://mercury_pw@127.0.0.1:{}/{}?sslmode=disable",
        port(),
        db.name
    );
    let store = Store::open_at(&Location::Postgres {
        url: url.clone(),
        password: Some("test-only-password".into()),
    })
    .unwrap();
    assert!(!store.describe().contains("test-only-password"));
    drop(store);
    let wrong = Store::open_at(&Location::Postgres {
        url: format!(
            "postgres://mercury_pw:not-it@127.0.0.1:{}/{}?sslmode=disable",
            port(),
            db.name
        ),
        password: None,
    });
    let err = wrong
        .err()
        .expect("a wrong password is refused")
        .to_string();
    assert!(
        !err.contains("not-it"),
        "the password is not in the error: {err}"
    );
    assert!(err.contains("***") || err.contains("password"), "{err}");
}

fn mercury(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mercury"))
        .env("MERCURY_LOG", "warn")
        .args(args)
        .output()
        .unwrap()
}

/// Rewrites the data dir's `mercury.yaml` to use the PostgreSQL database.
fn point_at(data: &std::path::Path, url: &str) {
    let path = data.join("mercury.yaml");
    let mut y: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    y["storage"]["backend"] = "postgres".into();
    y["storage"]["url"] = url.into();
    std::fs::write(&path, serde_yaml_ng::to_string(&y).unwrap()).unwrap();
}

// mrctl and the CLI run as blocking child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_moved_up_serves_turns_links_and_survives_a_server_restart() {
    let opts = HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: use a tool",
             "tool_calls": [{"name": "shell", "arguments": {"command": "echo from-the-sandbox"}}]},
            {"purpose": "turn", "match": "^tool_result\\(shell\\)", "reply": "the tool ran"},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    };
    // Rows to carry over: a space and a conversation made on SQLite.
    let host = TestHost::start(opts).await;
    host.create_space("ops").await;
    host.create_space("client").await;
    assert_eq!(host.chat("client", "hello").await["reply"], "ok");
    let (dir, data) = host.stop_keeping().await;

    // Its own cluster: the test restarts the server under the host.
    let cluster = PrivateCluster::start("restart");
    let db = PgDatabase::create_on(cluster.port);
    let data_s = data.display().to_string();
    let out = mercury(&["storage", "copy", "--data-dir", &data_s, "--to", &db.url()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("every count and checksum matched"),
        "{stdout}"
    );
    // A second copy into the now full database is refused, and changes nothing.
    let again = mercury(&["storage", "copy", "--data-dir", &data_s, "--to", &db.url()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));

    point_at(&data, &db.url());
    let status = mercury(&["storage", "status", "--data-dir", &data_s, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["backend"], "postgres");
    assert_eq!(v["schema_version"], v["latest_version"]);
    let spaces_rows = v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spaces")
        .unwrap()["rows"]
        .as_i64();
    assert_eq!(spaces_rows, Some(2));

    let host = TestHost::start_on(dir, data).await;
    // The owner's token came across; a turn with a tool call runs.
    let v = host.chat("client", "use a tool").await;
    assert_eq!(v["reply"], "the tool ran", "{v}");
    let run = v["run_id"].as_str().unwrap().to_owned();
    let out = host
        .mrctl(&host.owner_token, Some("client"))
        .args(["--json", "runs", "show", &run])
        .output()
        .unwrap();
    let trace: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        trace["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "tool"),
        "{trace}"
    );
    // A link act-as reads the target's history through the holder.
    host.link("ops", "client", "read").await;
    let (st, body) = host
        .act_as(
            Method::GET,
            "/api/messages/recent?since=7d",
            &host.owner_token,
            "ops",
            "client",
            None,
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert!(body.to_string().contains("the tool ran"), "{body}");

    // The server restarts under the host: a turn fails with a sentence while
    // it is down, and the host works again after.
    let pg_bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .filter_map(std::result::Result::ok)
        .map(|e| e.path().join("bin"))
        .max()
        .unwrap();
    let ctl = |action: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(pg_bin.join("pg_ctl"))
            .arg("-D")
            .arg(format!("{}/data", cluster.dir))
            .args(["-w", "-m", "fast", action]);
        if action == "start" {
            c.arg("-o").arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c ssl=on -c fsync=off -c max_connections=400",
                cluster.port, cluster.dir
            ));
            c.arg("-l").arg(format!("{}/server.log", cluster.dir));
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {action}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ctl("stop");
    let (st, body) = host
        .owner(
            Method::POST,
            "/api/chat",
            Some("client"),
            Some(json!({"text": "while down"})),
        )
        .await;
    assert!(st >= 500, "{st} {body}");
    assert!(!body.to_string().contains("panicked"), "{body}");
    ctl("start");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut answered = None;
    for _ in 0..40 {
        let (st, v) = host
            .owner(
                Method::POST,
                "/api/chat",
                Some("client"),
                Some(json!({"text": "after"})),
            )
            .await;
        if st == 200 {
            answered = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        answered.expect("the host answers after the restart")["reply"],
        "ok"
    );
    host.stop().await;
}

/// Each table's rows, as `mercury storage status --json` reads them.
fn table_rows(data: &std::path::Path) -> Vec<(String, i64)> {
    let out = mercury(&[
        "storage",
        "status",
        "--data-dir",
        &data.display().to_string(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["rows"].as_i64().unwrap(),
            )
        })
        .collect()
}

// The CLI runs as blocking child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_deployment_asks_reviews_and_rehearses_on_a_sqlite_shadow_without_writing_the_live_database(
) {
    let opts = HostOptions {
        model: json!({"rules": [
            {"purpose": "ask", "reply": "asked and answered"},
            {"purpose": "judge", "reply": "{\"findings\": []}"},
            {"purpose": "turn", "match": "rehearse", "reply": "rehearsed"},
            {"reply": "ok"}
        ]}),
        config: vec![
            (
                "ingress.dm_policy",
                serde_yaml_ng::Value::String("open".into()),
            ),
            ("review.owner", serde_yaml_ng::Value::String("owner".into())),
        ],
        ..Default::default()
    };
    let host = TestHost::start(opts).await;
    let (dir, data) = host.stop_keeping().await;
    let db = PgDatabase::create();
    let out = mercury(&[
        "storage",
        "copy",
        "--data-dir",
        &data.display().to_string(),
        "--to",
        &db.url(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    point_at(&data, &db.url());
    // Nothing of the deployment is in the data dir's file from here on.
    std::fs::remove_file(data.join("state.db")).unwrap();
    let _ = std::fs::remove_file(data.join("state.db-wal"));
    let _ = std::fs::remove_file(data.join("state.db-shm"));
    let host = TestHost::start_on(dir, data).await;

    // A platform DM: an exchange the review will judge.
    let adapter = host.adapter_token("adapter:test", "test").await;
    let (st, v) = host
        .ingest(&adapter, "dm-1", "u1", "hello there", "m1", false)
        .await;
    assert_eq!(st, 202, "{v}");
    let replies = host
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            1,
            20,
        )
        .await;
    assert_eq!(replies, 1, "the turn answered on PostgreSQL");
    let space = v["space_id"].as_str().unwrap().to_owned();

    // ask: one turn of the space's agent on a throwaway copy, through a link.
    host.create_space("mgmt").await;
    host.grant("mgmt", "alice", "admin").await;
    let alice = host.token("alice", "user").await;
    host.link("mgmt", &space, "admin").await;
    let messages_before = host.count(&format!(
        "SELECT COUNT(*) FROM messages WHERE space_id = '{space}'"
    ));
    let (st, v) = host
        .act_as(
            Method::POST,
            "/api/ask",
            &alice,
            "mgmt",
            &space,
            Some(json!({"message": "what is going on", "as": "admin"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "asked and answered", "{v}");
    assert_eq!(
        host.count(&format!(
            "SELECT COUNT(*) FROM messages WHERE space_id = '{space}'"
        )),
        messages_before,
        "an ask writes no message into its target"
    );

    // The review's scan reads the exchanges through storage.
    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    assert_eq!(summary["status"], "done", "{summary:#}");
    assert!(
        summary["exchanges_judged"].as_i64().unwrap() >= 1,
        "{summary:#}"
    );
    let (dir, data) = host.stop_keeping().await;

    // The shadow: the live rows read into its own file; the server untouched.
    let live_rows = table_rows(&data);
    let live_tokens = psql(
        &db.name,
        "SELECT token_hash FROM api_tokens ORDER BY token_hash",
    );
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let (code, out, err) = crate::shadow::snapshot_cli(&data, &root, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.contains("copied and verified"), "{err}");
    assert_eq!(
        table_rows(&data),
        live_rows,
        "the snapshot wrote to the live database"
    );
    let snap = std::fs::canonicalize(root.join("current")).unwrap();
    let config = std::fs::read_to_string(snap.join("mercury.yaml")).unwrap();
    let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config).unwrap();
    assert_eq!(y["storage"]["backend"], "sqlite", "{config}");
    assert!(
        !config.contains(&db.name),
        "the live server's address stays out: {config}"
    );
    let shadow_rows = table_rows(&snap);
    for (table, rows) in &live_rows {
        let there = shadow_rows
            .iter()
            .find(|(t, _)| t == table)
            .map(|(_, n)| *n);
        let want = if table == "api_tokens" { 1 } else { *rows };
        assert_eq!(there, Some(want), "table {table}");
    }
    let file = std::fs::read(snap.join("state.db")).unwrap();
    for hash in live_tokens.lines() {
        assert!(
            !file.windows(hash.len()).any(|w| w == hash.as_bytes()),
            "a live token hash is in the shadow's file"
        );
    }

    // The shadow runs on its copy, and its diff shows the rehearsal.
    // On a port of its own: the snapshot's (the live port + 1) may be any
    // other test's at that moment (it was, once, in a full run).
    let port = crate::common::free_port().to_string();
    let (code, out, err) = crate::shadow::shadow_cli(&root, &["up", "--port", &port], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let running: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("running.json")).unwrap()).unwrap();
    let url = running["url"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(snap.join("global/owner.token")).unwrap();
    let (st, v) = crate::shadow::call(
        &url,
        Method::POST,
        "/api/chat",
        token.trim(),
        Some(&space),
        Some(json!({"text": "rehearse this"})),
    )
    .await;
    assert_eq!((st, v["reply"].clone()), (200, json!("rehearsed")), "{v}");
    let (code, out, err) = crate::shadow::shadow_cli(&root, &["diff", "--json"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let d: serde_json::Value = serde_json::from_str(&out).unwrap();
    // One space gained the rehearsal's two lines (its id is redacted as the
    // diff redacts every line: the auto-space id's digits read as a number).
    let added = d["messages"].as_array().unwrap();
    assert_eq!(added.len(), 1, "{out}");
    assert_eq!(added[0]["count"], 2, "{out}");
    assert_eq!(added[0]["first_lines"][1], "assistant: rehearsed", "{out}");
    let (code, _, err) = crate::shadow::shadow_cli(&root, &["down"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        table_rows(&data),
        live_rows,
        "the shadow wrote to the live database"
    );
    drop((dir, db));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_victims_write_is_refused_whole_and_answered_send_it_again() {
    use mercury::storage::inspect::execute_script;
    let db = PgDatabase::create();
    // Two hosts' stores on one database.
    let a = Store::open_at(&db.location()).unwrap();
    let b = Store::open_at(&db.location()).unwrap();
    a.write(|tx| {
        execute_script(
            tx,
            "CREATE TABLE duel (id BIGINT PRIMARY KEY, v BIGINT NOT NULL); INSERT INTO duel VALUES (1, 0), (2, 0)",
        )
    })
    .await
    .unwrap();
    // Each takes one row, waits, then wants the other's: one must give way.
    let crossing = |store: Store, first: i64, second: i64| async move {
        store
            .write(move |tx| {
                execute_script(tx, &format!("UPDATE duel SET v = v + 1 WHERE id = {first}"))?;
                std::thread::sleep(Duration::from_millis(400));
                execute_script(
                    tx,
                    &format!("UPDATE duel SET v = v + 10 WHERE id = {second}"),
                )
            })
            .await
    };
    let (ra, rb) = tokio::join!(crossing(a.clone(), 1, 2), crossing(b.clone(), 2, 1));
    let mut lost: Vec<_> = [ra, rb].into_iter().filter_map(Result::err).collect();
    assert_eq!(lost.len(), 1, "exactly one write gave way: {lost:?}");
    let victim = lost.remove(0);
    assert!(victim.is_contended(), "{victim}");
    // Nothing of the victim's write is left: the winner's 1 and 10 only.
    let total: Vec<Vec<String>> = a
        .read(|c| mercury::storage::inspect::query_text(c, "SELECT SUM(v) FROM duel"))
        .await
        .unwrap();
    assert_eq!(total, vec![vec!["11".to_string()]]);
    // An API caller is told to send it again (503), not a server fault.
    let answer: mercury::api::ApiError = victim.into();
    assert_eq!(answer.status().as_u16(), 503);
    assert!(
        matches!(&answer, mercury::api::ApiError::Unavailable(m) if m.contains("send it again")),
        "{answer:?}"
    );
}
