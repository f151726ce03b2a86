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
