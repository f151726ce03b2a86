//! `mercury shadow up|down|status|logs`: the shadow host as a separate
//! `mercury serve` process this command supervises, on its own port, socket
//! and data dir (a snapshot), with its own environment: shadow mode on, the
//! shadow root, and only the shadow's own model keys.
//!
//! Must never: start a shadow past a refusal of [`crate::shadow::guard::check_up`],
//! hand the child a live model key (its environment is built from nothing),
//! build an agent image, or signal a process that is not the recorded shadow.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;
use crate::config::{self, SandboxChoice};
use crate::sandbox::lifecycle::{self, SandboxLifecycle};
use crate::sandbox::SandboxError;
use crate::shadow::credential;
use crate::shadow::guard::{check_not_running, check_up, human_duration, UpFacts};
use crate::shadow::manifest::{Manifest, Running};
use crate::shadow::{io_err, snapshot, ShadowError, ShadowResult};
use crate::workspace::DataPaths;

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub root: PathBuf,
    pub snapshot: String,
    pub max_age_ms: i64,
    pub min_free_mem: u64,
    pub min_free_disk: u64,
    pub window_ms: i64,
    /// The shadow's port instead of its snapshot's `bind` port.
    pub port: Option<u16>,
}

/// What `up` started, and how its settings differ from the live host's.
#[derive(Debug)]
pub struct Started {
    pub running: Running,
    pub manifest: Manifest,
    /// Every effective setting that differs: `(key, live, shadow)`; `None`
    /// when the live host's settings could not be read (the reason).
    pub differences: Result<Vec<crate::shadow::settings::Difference>, String>,
}

/// The log file of a snapshot's shadow host.
pub fn log_path(snapshot_dir: &Path) -> PathBuf {
    snapshot_dir.join("shadow").join("host.log")
}

use crate::shadow::manifest::pid_alive;
pub use crate::shadow::manifest::running;

fn free_mem() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The one connection to the local engine `up` asks both questions on;
/// None when neither side runs containers.
type Engine = Option<Result<Arc<dyn SandboxLifecycle>, SandboxError>>;

/// Containers of the live instance that are running or being created (a
/// turn in progress). None when it cannot be told.
async fn live_containers(
    live: &Path,
    settings: Option<&config::Settings>,
    backend: SandboxChoice,
    engine: &Engine,
) -> Option<usize> {
    if backend == SandboxChoice::Process {
        return Some(0);
    }
    let id = match settings {
        Some(s) => crate::host::instance_id(&DataPaths::new(live), s).ok()?,
        None => crate::sandbox::instance_id_for(live).ok()?,
    };
    let engines = match engine.as_ref()? {
        Ok(e) => e,
        // `auto` without an engine runs bubblewrap: no container can exist.
        Err(_) if backend == SandboxChoice::Auto => return Some(0),
        Err(_) => return None,
    };
    let running = engines.running_sandboxes(&id).await.ok()?;
    Some(running.len())
}

/// The earliest due time of an active live task; `Some(None)` when none is
/// active, `None` when unknown. Read where the live host keeps its rows (its
/// `state.db` read-only, or its PostgreSQL server, never migrated).
async fn live_next_due(live: &Path) -> Option<Option<i64>> {
    let paths = DataPaths::new(live);
    let read = |db: &crate::storage::Conn| -> crate::storage::StoreResult<Option<Option<i64>>> {
        if crate::storage::stats::active_tasks_without_due_time(db)? > 0 {
            return Ok(None);
        }
        Ok(Some(crate::storage::tasks::next_due_at(db)?))
    };
    let settings = crate::host::load_settings(&paths).ok()?;
    match crate::host::store_location(&settings, &paths).ok()? {
        crate::storage::Location::Sqlite(db) => {
            read(&crate::storage::open_read_only_conn(&db).ok()?).ok()?
        }
        at @ crate::storage::Location::Postgres { .. } => {
            let store = crate::storage::Store::open_unmigrated(&at).ok()?;
            store.read(move |c| read(c)).await.ok()?
        }
    }
}

/// The image the shadow would run, when its backend is docker.
async fn shadow_image(settings: &config::Settings, engine: &Engine) -> Option<(String, bool)> {
    if settings.sandbox.backend == SandboxChoice::Process {
        return None;
    }
    let engines = match engine.as_ref()? {
        Ok(e) => e,
        Err(_) if settings.sandbox.backend == SandboxChoice::Auto => return None,
        Err(e) => return Some((format!("(the engine did not answer: {e})"), false)),
    };
    match crate::host::containers::agent_image(settings) {
        Ok(tag) => {
            let present = engines.image_present(&tag).await.unwrap_or(false);
            Some((tag, present))
        }
        Err(e) => Some((format!("(its tag cannot be computed: {e:#})"), false)),
    }
}

/// Every model spec the shadow may use: its default chain, the review
/// model, and the chains its spaces set.
fn shadow_chains(settings: &config::Settings, db: &Path) -> Vec<String> {
    let mut chain = settings.model_chain();
    if !settings.review.model.is_empty() {
        chain.push(settings.review.model.clone());
    }
    if let Ok(c) = crate::storage::open_read_only_conn(db) {
        if let Ok(values) = crate::storage::space_settings::config_values_of_key(&c, "model") {
            for v in values {
                chain.extend(config::split_chain(&v));
            }
        }
    }
    chain
}

/// The environment of the shadow child: built from nothing, so no live key
/// (nor any other live `MERCURY_*` setting) can reach it.
fn child_env(root: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in [
        "PATH",
        "HOME",
        "DOCKER_HOST",
        "MERCURY_LOG",
        "MERCURY_MRCTL",
        "TMPDIR",
    ] {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.to_owned(), v);
        }
    }
    env.insert("MERCURY_SHADOW".into(), "1".into());
    env.insert("MERCURY_SHADOW_ROOT".into(), root.display().to_string());
    for p in credential::PROVIDERS {
        let name = credential::env_name(p);
        if let Ok(v) = std::env::var(&name) {
            env.insert(name, v);
        }
    }
    env
}

/// Starts the shadow host on `opts.snapshot` after every refusal passed.
pub async fn up(opts: &UpOptions) -> ShadowResult<Started> {
    let dir = snapshot::resolve(&opts.root, &opts.snapshot)?;
    let manifest = Manifest::read(&dir)?;
    // The first refusal of check_up, asked before the engine or a port is.
    let already_running = running(&opts.root)?.map(|r| r.snapshot);
    check_not_running(already_running.as_deref())?;
    let paths = DataPaths::new(&dir);
    let mut child_env = child_env(&opts.root);
    // The settings the child will have: its file and its own environment.
    let of = |child_env: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        child_env
            .iter()
            .filter(|(k, _)| k.starts_with("MERCURY_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut settings = config::load(&paths.config, &of(&child_env))?;
    if let Some(port) = opts.port {
        // `--port` moves the shadow off its snapshot's port, on the same address.
        let ip = settings
            .bind
            .parse::<std::net::SocketAddr>()
            .map(|a| a.ip())
            .map_err(|_| {
                ShadowError::Invalid(format!("bind {:?} is not ADDR:PORT", settings.bind))
            })?;
        child_env.insert(
            "MERCURY_BIND".into(),
            std::net::SocketAddr::new(ip, port).to_string(),
        );
        settings = config::load(&paths.config, &of(&child_env))?;
    }
    let live = PathBuf::from(&manifest.live_data_dir);
    let live_settings = config::load(&DataPaths::new(&live).config, &Default::default()).ok();
    let live_backend = live_settings
        .as_ref()
        .map_or(SandboxChoice::Auto, |s| s.sandbox.backend);
    let bind: std::net::SocketAddr = settings
        .bind
        .parse()
        .map_err(|_| ShadowError::Invalid(format!("bind {:?} is not ADDR:PORT", settings.bind)))?;
    let port_free = std::net::TcpListener::bind(bind).is_ok();
    // Each on its own engines (sandbox.docker.hosts, or the local one):
    // the live bot's running containers, the shadow's image.
    let engine: Engine = if settings.sandbox.backend == SandboxChoice::Process {
        None
    } else {
        Some(lifecycle::connect(&settings.sandbox.docker).await)
    };
    let live_engine: Engine = match (&live_settings, live_backend) {
        (_, SandboxChoice::Process) => None,
        (Some(live), _) => Some(lifecycle::connect(&live.sandbox.docker).await),
        (None, _) => Some(lifecycle::connect_local().await),
    };
    let facts = UpFacts {
        now_ms: now_ms(),
        max_age_ms: opts.max_age_ms,
        free_mem_bytes: free_mem(),
        min_free_mem_bytes: opts.min_free_mem,
        free_disk_bytes: crate::workspace::data_dir::free_bytes(&opts.root),
        min_free_disk_bytes: opts.min_free_disk,
        live_containers_running: live_containers(
            &live,
            live_settings.as_ref(),
            live_backend,
            &live_engine,
        )
        .await,
        live_next_due_ms: live_next_due(&live).await,
        window_ms: opts.window_ms,
        image: shadow_image(&settings, &engine).await,
        port: bind.port(),
        port_free,
        providers_without_key: credential::providers_without_key(
            &shadow_chains(&settings, &paths.db),
            Some(&opts.root),
            &child_env,
        ),
        already_running,
    };
    check_up(&manifest, &facts)?;
    // Not held while the child starts.
    drop(engine);

    let exe = std::env::current_exe().map_err(io_err("locating the mercury binary"))?;
    let log = log_path(&dir);
    if let Some(d) = log.parent() {
        crate::workspace::data_dir::private_dir(d)
            .map_err(io_err(format!("creating {}", d.display())))?;
    }
    // Private like every file of a data dir: a log may quote chat text.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(crate::workspace::data_dir::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log)
        .map_err(io_err(format!("opening {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err("duplicating the log handle"))?;
    let mut child = Command::new(&exe)
        .arg("serve")
        .arg("--data-dir")
        .arg(&dir)
        .env_clear()
        .envs(&child_env)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a ^C at the operator's terminal is not the shadow's.
        .process_group(0)
        .spawn()
        .map_err(io_err(format!("starting {} serve", exe.display())))?;
    let url = format!("http://{bind}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ShadowError::Invalid(format!("building an HTTP client: {e}")))?;
    let mut ready = false;
    for _ in 0..600 {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(ShadowError::Invalid(format!(
                "the shadow host exited ({st}) before it answered; see {}",
                log.display()
            )));
        }
        if let Ok(r) = client.get(format!("{url}/healthz")).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                if v["shadow"] == true {
                    ready = true;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ready {
        let _ = child.kill();
        let _ = child.wait();
        return Err(ShadowError::Invalid(format!(
            "the shadow host did not answer on {url} as a shadow within 60 s; see {}",
            log.display()
        )));
    }
    let rec = Running {
        snapshot: manifest.id.clone(),
        data_dir: std::fs::canonicalize(&dir).unwrap_or(dir.clone()),
        pid: child.id(),
        port: bind.port(),
        url,
        started_at_ms: now_ms(),
    };
    write_running(&opts.root, &rec)?;
    let differences = crate::shadow::settings::effective_live(&live)
        .map(|l| crate::shadow::settings::differences(&l, &settings))
        .map_err(|e| e.to_string());
    Ok(Started {
        running: rec,
        manifest,
        differences,
    })
}

fn write_running(root: &Path, rec: &Running) -> ShadowResult<()> {
    let json =
        serde_json::to_string_pretty(rec).map_err(|e| ShadowError::Invalid(e.to_string()))?;
    let path = Running::path(root);
    let tmp = root.join(format!(".running.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    crate::workspace::data_dir::private_file(&tmp)
        .and_then(|mut f| f.write_all(json.as_bytes()))
        .map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io_err(format!("writing {}", path.display())))
}

/// What `down` reports: the shadow's own runs and their cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DownReport {
    pub snapshot: String,
    pub runs: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost: f64,
    /// The shadow's currency, which `cost` is in.
    pub currency: String,
}

/// Stops the running shadow (SIGTERM, then its drain) and reports its cost
/// from its `token_usage` (rows above the snapshot's mark).
pub async fn down(root: &Path) -> ShadowResult<DownReport> {
    let Some(rec) = running(root)? else {
        return Err(ShadowError::Refused("no shadow is running".into()));
    };
    // SAFETY: kill(2) on the pid just checked to be the shadow host.
    unsafe {
        libc::kill(rec.pid as libc::pid_t, libc::SIGTERM);
    }
    let mut gone = false;
    for _ in 0..600 {
        if !pid_alive(rec.pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !gone {
        return Err(ShadowError::Invalid(format!(
            "the shadow host (pid {}) did not stop within 60 s of SIGTERM",
            rec.pid
        )));
    }
    let _ = std::fs::remove_file(Running::path(root));
    let runs = crate::shadow::diff::cost_of(&rec.data_dir)?;
    Ok(DownReport {
        snapshot: rec.snapshot,
        runs: runs.runs,
        tokens_in: runs.tokens_in,
        tokens_out: runs.tokens_out,
        cost: runs.cost,
        currency: runs.currency,
    })
}

/// `status`: the running shadow, or the current snapshot when none runs;
/// and whether one runs (`mercury shadow status` exits 3 when none does,
/// like `mercury status`).
pub fn status(root: &Path) -> ShadowResult<(String, bool)> {
    let now = now_ms();
    let describe = |m: &Manifest| {
        format!(
            "snapshot {}{} (age {}, admins {}, from {})",
            m.id,
            m.label
                .as_deref()
                .map(|l| format!(" \"{l}\""))
                .unwrap_or_default(),
            human_duration(now - m.created_at_ms),
            m.admin_count
                .map_or("unrecorded".to_owned(), |n| n.to_string()),
            m.live_data_dir
        )
    };
    match running(root)? {
        Some(r) => {
            let m = Manifest::read(&r.data_dir)?;
            Ok((
                format!(
                    "shadow running: {}\n  pid {}, port {} ({}), up {}\n",
                    describe(&m),
                    r.pid,
                    r.port,
                    r.url,
                    human_duration(now - r.started_at_ms)
                ),
                true,
            ))
        }
        None => match snapshot::resolve(root, "current") {
            Ok(dir) => Ok((
                format!(
                    "no shadow is running; current {}\n",
                    describe(&Manifest::read(&dir)?)
                ),
                false,
            )),
            Err(_) => Ok((
                "no shadow is running and there is no snapshot\n".to_owned(),
                false,
            )),
        },
    }
}

/// `logs [-f]`: the host log of the running shadow (else the current snapshot's).
pub async fn logs(root: &Path, which: Option<&str>, follow: bool) -> ShadowResult<()> {
    let dir = match (which, running(root)?) {
        (Some(w), _) => snapshot::resolve(root, w)?,
        (None, Some(r)) => r.data_dir,
        (None, None) => snapshot::resolve(root, "current")?,
    };
    let path = log_path(&dir);
    // Opened once (not through a link) and read on from where the last
    // read ended: a long log is not read again every tick.
    let mut file: Option<std::fs::File> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if file.is_none() {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(f) => file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if !follow {
                        return Err(ShadowError::Refused(format!(
                            "{} has no log yet",
                            dir.display()
                        )));
                    }
                }
                Err(e) => return Err(io_err(format!("opening {}", path.display()))(e)),
            }
        }
        if let Some(f) = file.as_mut() {
            let mut out = std::io::stdout().lock();
            loop {
                let n = match std::io::Read::read(f, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
                };
                // Whoever read the log went away (a closed pipe): done.
                if out.write_all(&buf[..n]).is_err() {
                    return Ok(());
                }
            }
            if out.flush().is_err() {
                return Ok(());
            }
        }
        if !follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
