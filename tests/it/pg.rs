//! The PostgreSQL the tests run against: one throwaway cluster per test run
//! (`deploy/test-postgres.sh start`, shared by the test processes under a
//! lock; `.ci/run` stops it), and a fresh database per test, dropped when
//! the test's handle goes.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use mercury::storage::Location;

fn script() -> String {
    format!("{}/deploy/test-postgres.sh", env!("CARGO_MANIFEST_DIR"))
}

/// Starts (or finds) the cluster in `dir` (the shared one when `None`); its port.
fn start_cluster(dir: Option<&str>) -> u16 {
    let mut c = Command::new("bash");
    c.arg(script()).arg("start");
    if let Some(d) = dir {
        c.env("MERCURY_TEST_PG_DIR", d);
    }
    let out = c.output().expect("run deploy/test-postgres.sh");
    assert!(
        out.status.success(),
        "deploy/test-postgres.sh start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the script prints the port")
}

/// The cluster's port, starting it if this run has none yet.
pub(crate) fn port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| start_cluster(None))
}

/// The directory of the cluster (its `root.crt` signs the server's).
pub(crate) fn cluster_dir() -> String {
    std::env::var("MERCURY_TEST_PG_DIR").unwrap_or_else(|_| "/tmp/mercury-test-pg".into())
}

pub(crate) fn psql(db: &str, sql: &str) -> String {
    psql_on(port(), db, sql)
}

pub(crate) fn psql_on(port: u16, db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-q",
            "-At",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
        ])
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(db)
        .arg("-c")
        .arg(sql)
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A cluster of one test's own (the test stops and starts its server),
/// removed on drop.
pub(crate) struct PrivateCluster {
    pub(crate) dir: String,
    pub(crate) port: u16,
}

impl PrivateCluster {
    pub(crate) fn start(name: &str) -> PrivateCluster {
        let dir = format!("/tmp/mercury-test-pg-{name}-{}", std::process::id());
        let port = start_cluster(Some(&dir));
        PrivateCluster { dir, port }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .env("MERCURY_TEST_PG_DIR", &self.dir)
            .output();
    }
}

/// One empty database of the shared cluster, dropped on drop.
pub(crate) struct PgDatabase {
    pub(crate) name: String,
    port: u16,
}

impl PgDatabase {
    pub(crate) fn create() -> PgDatabase {
        Self::create_on(port())
    }

    pub(crate) fn create_on(port: u16) -> PgDatabase {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "mt_{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        psql_on(port, "postgres", &format!("CREATE DATABASE {name}"));
        PgDatabase { name, port }
    }

    /// The URL the store opens (trust authentication, no TLS).
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}?sslmode=disable",
            self.port, self.name
        )
    }

    pub(crate) fn location(&self) -> Location {
        Location::Postgres {
            url: self.url(),
            password: None,
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
    }
}
