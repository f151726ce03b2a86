//! The engines a host starts sandboxes on: the local one, or the list of
//! `sandbox.docker.hosts` (`unix://` sockets on this machine, `tcp://`
//! engines elsewhere, over TLS when certificates are given), where the next
//! sandbox goes (the healthy engine with the fewest running sandboxes), and
//! each engine's health (a ping; a failed start or ping marks it down until
//! a ping answers again). An engine that did not answer when the host
//! started is kept, not joined, and joins when it first answers (its API
//! version negotiated then).
//!
//! Must never: place a sandbox on an engine marked down while a healthy one
//! is there, place one on an engine that has not negotiated its API version,
//! or treat an engine reached over TCP as sharing this host's files (its
//! workspaces are synced, never bind-mounted).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bollard::Docker;

use crate::sandbox::{EngineView, SandboxError};

/// Client certificates for `tcp://` engines (the engine's `--tlsverify`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One engine and what this host knows of it now.
#[derive(Debug)]
pub(crate) struct Engine {
    /// Negotiated once `joined`; before that, the bare client to
    /// negotiate with.
    docker: RwLock<Docker>,
    /// Its API version is agreed: sandboxes may go there.
    joined: AtomicBool,
    /// As configured (`unix:///var/run/docker.sock`, `tcp://10.0.0.7:2376`).
    endpoint: String,
    /// On another machine: it cannot see this host's files or sockets.
    remote: bool,
    running: AtomicUsize,
    healthy: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Engine {
    /// An engine whose client has negotiated its API version.
    pub(super) fn new(docker: Docker, endpoint: String, remote: bool) -> Self {
        Self {
            docker: RwLock::new(docker),
            joined: AtomicBool::new(true),
            endpoint,
            remote,
            running: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            last_error: Mutex::new(None),
        }
    }

    /// An engine that did not answer: kept with its bare client, down,
    /// until [`Engine::check`] negotiates with it.
    pub(super) fn unjoined(docker: Docker, endpoint: String, remote: bool, why: String) -> Self {
        Self {
            docker: RwLock::new(docker),
            joined: AtomicBool::new(false),
            endpoint,
            remote,
            running: AtomicUsize::new(0),
            healthy: AtomicBool::new(false),
            last_error: Mutex::new(Some(why)),
        }
    }

    /// Its client (cheap: the connection pool is shared).
    pub(super) fn client(&self) -> Docker {
        match self.docker.read() {
            Ok(d) => d.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn joined(&self) -> bool {
        self.joined.load(Ordering::SeqCst)
    }

    fn usable(&self) -> bool {
        self.joined() && self.healthy.load(Ordering::SeqCst)
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn remote(&self) -> bool {
        self.remote
    }

    pub(super) fn mark(&self, outcome: Result<(), &str>) {
        self.healthy.store(outcome.is_ok(), Ordering::SeqCst);
        if let Ok(mut last) = self.last_error.lock() {
            match outcome {
                Ok(()) => *last = None,
                Err(e) => *last = Some(e.to_string()),
            }
        }
    }

    pub(crate) fn view(&self) -> EngineView {
        EngineView {
            endpoint: self.endpoint.clone(),
            remote: self.remote,
            healthy: self.healthy.load(Ordering::SeqCst),
            running: self.running.load(Ordering::SeqCst),
            last_error: self.last_error.lock().ok().and_then(|l| l.clone()),
        }
    }

    /// Pings the engine and records whether it answered. An engine not
    /// joined yet negotiates instead: `Ok(Checked::Joined)` when it just
    /// did, still marked down (the caller readies it, then marks it).
    pub(crate) async fn check(&self) -> Result<Checked, SandboxError> {
        if !self.joined() {
            return match self.client().negotiate_version().await {
                Ok(docker) => {
                    match self.docker.write() {
                        Ok(mut d) => *d = docker,
                        Err(poisoned) => *poisoned.into_inner() = docker,
                    }
                    self.joined.store(true, Ordering::SeqCst);
                    Ok(Checked::Joined)
                }
                Err(e) => {
                    let why = format!("{} does not answer: {e}", self.endpoint);
                    self.mark(Err(&why));
                    Err(SandboxError::NoEngine(why))
                }
            };
        }
        match self.client().ping().await {
            Ok(_) => {
                self.mark(Ok(()));
                Ok(Checked::Answered)
            }
            Err(e) => {
                let why = format!("{} does not answer: {e}", self.endpoint);
                self.mark(Err(&why));
                Err(SandboxError::NoEngine(why))
            }
        }
    }
}

/// What [`Engine::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// A joined engine answered its ping.
    Answered,
    /// An engine left out at start-up answered and negotiated now.
    Joined,
}

/// A sandbox counted against its engine until dropped.
#[derive(Debug)]
pub(super) struct Placed(pub(super) Arc<Engine>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Placed {
    /// Counts a sandbox against `engine` from now on: a pooled container
    /// is placed when it is claimed, not while it waits.
    pub(super) fn on(engine: &Arc<Engine>) -> Self {
        engine.running.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(engine))
    }
}

/// The engine the warm pool fills next: a healthy one on this machine (a
/// pooled container gets the turn's layer by a mount, which an engine
/// elsewhere cannot see), running the fewest now. `None` when there is none.
pub(super) fn pool_engine(engines: &[Arc<Engine>]) -> Option<Arc<Engine>> {
    engines
        .iter()
        .filter(|e| !e.remote && e.usable())
        .min_by_key(|e| e.running.load(Ordering::SeqCst))
        .cloned()
}

/// Picks the engine for the next sandbox: among the healthy ones, the one
/// running the fewest now (the first listed on a tie); when none is marked
/// healthy, the least busy of the joined ones (its start then says what is
/// wrong). Never one that has not joined.
pub(super) fn place(engines: &[Arc<Engine>]) -> Option<Placed> {
    let healthy: Vec<&Arc<Engine>> = engines.iter().filter(|e| e.usable()).collect();
    let pool: Vec<&Arc<Engine>> = if healthy.is_empty() {
        engines.iter().filter(|e| e.joined()).collect()
    } else {
        healthy
    };
    let chosen = pool
        .into_iter()
        .min_by_key(|e| e.running.load(Ordering::SeqCst))?;
    chosen.running.fetch_add(1, Ordering::SeqCst);
    Some(Placed(Arc::clone(chosen)))
}

/// A client for one configured engine, not yet negotiated.
pub(super) fn client_for(
    endpoint: &str,
    tls: Option<&EngineTls>,
) -> Result<(Docker, bool), SandboxError> {
    let bad =
        |why: String| SandboxError::NoEngine(format!("sandbox.docker.hosts {endpoint:?}: {why}"));
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(bad("a unix:// engine needs an absolute socket path".into()));
        }
        let docker = Docker::connect_with_socket(path, 120, bollard::API_DEFAULT_VERSION)
            .map_err(|e| bad(e.to_string()))?;
        return Ok((docker, false));
    }
    if let Some(addr) = endpoint.strip_prefix("tcp://") {
        if addr.is_empty() || addr.contains('/') {
            return Err(bad("a tcp:// engine is tcp://host:port".into()));
        }
        let docker = match tls {
            Some(t) => {
                for (what, path) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                    if !path.is_file() {
                        return Err(bad(format!(
                            "sandbox.docker.tls.{what} {} is not a readable file",
                            path.display()
                        )));
                    }
                }
                Docker::connect_with_ssl(
                    endpoint,
                    &t.key,
                    &t.cert,
                    &t.ca,
                    120,
                    bollard::API_DEFAULT_VERSION,
                )
            }
            None => Docker::connect_with_http(endpoint, 120, bollard::API_DEFAULT_VERSION),
        }
        .map_err(|e| bad(e.to_string()))?;
        return Ok((docker, true));
    }
    Err(bad(
        "an engine is unix:///path/to/docker.sock or tcp://host:port".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(name: &str, running: usize, healthy: bool) -> Arc<Engine> {
        let (docker, remote) = client_for(&format!("tcp://{name}:2375"), None).unwrap();
        let e = Engine::new(docker, name.into(), remote);
        e.running.store(running, Ordering::SeqCst);
        e.healthy.store(healthy, Ordering::SeqCst);
        Arc::new(e)
    }

    #[test]
    fn the_next_sandbox_goes_to_the_least_busy_healthy_engine() {
        let engines = vec![
            engine("a", 3, true),
            engine("b", 1, true),
            engine("c", 0, false),
        ];
        let placed = place(&engines).unwrap();
        assert_eq!(placed.0.endpoint(), "b");
        assert_eq!(engines[1].view().running, 2, "counted while placed");
        let second = place(&engines).unwrap();
        assert_eq!(second.0.endpoint(), "b", "b at 2 is still below a at 3");
        drop(placed);
        drop(second);
        assert_eq!(engines[1].view().running, 1, "released when dropped");
        // Nothing healthy: the least busy of all, so its start says why.
        engines[0].mark(Err("down"));
        engines[1].mark(Err("down"));
        assert_eq!(place(&engines).unwrap().0.endpoint(), "c");
        assert!(place(&[]).is_none());
    }

    #[test]
    fn an_engine_that_has_not_joined_is_never_placed_on() {
        let (docker, remote) = client_for("tcp://later:2375", None).unwrap();
        let later = Arc::new(Engine::unjoined(
            docker,
            "later".into(),
            remote,
            "does not answer".into(),
        ));
        assert!(place(std::slice::from_ref(&later)).is_none());
        // Even marked healthy by mistake, it is not joined.
        later.mark(Ok(()));
        assert!(place(std::slice::from_ref(&later)).is_none());
        let engines = vec![later, engine("a", 5, false)];
        assert_eq!(place(&engines).unwrap().0.endpoint(), "a");
        assert_eq!(engines[0].view().running, 0);
    }

    #[test]
    fn endpoints_are_unix_sockets_or_tcp_and_only_tcp_is_remote() {
        assert!(!client_for("unix:///var/run/docker.sock", None).unwrap().1);
        assert!(client_for("tcp://10.0.0.7:2375", None).unwrap().1);
        for bad in [
            "unix://relative.sock",
            "http://10.0.0.7:2375",
            "tcp://",
            "tcp://host:1/path",
            "ssh://me@host",
        ] {
            let err = client_for(bad, None).unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        let tls = EngineTls {
            ca: "/nonexistent/ca.pem".into(),
            ..Default::default()
        };
        let err = client_for("tcp://10.0.0.7:2376", Some(&tls))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sandbox.docker.tls.ca"), "{err}");
    }
}
