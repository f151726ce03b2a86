//! The warm pool (`sandbox.warm: N`): up to N containers created, started
//! and paused ahead of the turns that claim them, on this machine's
//! engines, refilled in the background one at a time.
//!
//! A container cannot gain a bind mount once created, so each pooled one
//! is made with two empty per-slot directories of a pool tmpfs bound in
//! with `rslave` propagation (`<slot>/work` at `/work`, `<slot>/run`
//! read-only at `/run/mercury`); the tmpfs is a shared mount, so what the
//! host mounts on those directories at claim time appears inside: the
//! turn's layer on `work`, the session's API socket relay and the space's
//! skills (read-only) under `run`. The run's environment (its token) comes
//! with each exec. Then the container is unpaused and is the run's session
//! like any other; `close` removes it and undoes the slot.
//!
//! Owns: the pool's tmpfs, its slots and their containers until claimed,
//! the refill task and its budget, the claim, and the sweep of a killed
//! host's pool tmpfs.
//!
//! Must never: hand one container to two runs (a slot leaves the pool when
//! claimed and is destroyed with its session), mount anything of a space
//! into a slot before its claim, create a container without this
//! instance's label (the start-up sweep removes what a killed host left),
//! fill while a cold start is waiting on the engine, or remove a directory
//! tree across a mount point (a slot is cleared entry by entry on the pool
//! tmpfs only, so a failed unmount can never delete a workspace).

use std::collections::{HashSet, VecDeque};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bollard::query_parameters::{CreateContainerOptionsBuilder, StartContainerOptions};
use bollard::Docker;
use tokio::sync::Notify;

use super::engines::{pool_engine, Engine, Placed};
use super::session::{DockerSession, SiblingShape};
use super::{remove_container, shape, user};
use crate::sandbox::relay::SocketRelay;
use crate::sandbox::{SandboxError, SandboxSpec, WarmSpec, WorkspaceMount};

/// The pool tmpfs holds only directories and empty files (mount points).
const ROOT_OPTIONS: &str = "size=1m,nr_inodes=16384,mode=0755";

/// Where a space's skills appear inside a session (`extensions::Skill::inside`).
const SKILLS_INSIDE: &str = "/run/mercury/skills/";

/// How long the refill waits before looking again when the pool is full,
/// the budget is spent or no engine is there (a claim or a finished cold
/// start wakes it sooner).
const RECHECK: Duration = Duration::from_secs(5);
/// After a failed fill, waits this long, doubling up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub(super) enum WarmError {
    #[error("warm pool: {what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("warm pool: {0}")]
    Engine(String),
}

impl From<WarmError> for SandboxError {
    fn from(e: WarmError) -> Self {
        SandboxError::Engine(e.to_string())
    }
}

/// One container waiting in the pool: created, started, paused.
#[derive(Debug)]
struct WarmSlot {
    /// Its `mercury.run` label and directory name (`warm-<12 hex>`).
    name: String,
    container: String,
    engine: Arc<Engine>,
    dir: PathBuf,
}

/// The pool of one serving backend (one image, one instance).
pub(crate) struct WarmPool {
    spec: WarmSpec,
    image: String,
    /// The container user, as `user::container_user` picks it.
    user: String,
    engines: Arc<Vec<Arc<Engine>>>,
    /// The pool tmpfs (a shared mount) under the system temp dir.
    root: PathBuf,
    /// Slots ready to claim, oldest first. Claims pop; only the refill
    /// pushes.
    idle: Mutex<VecDeque<WarmSlot>>,
    /// The slots whose container may exist (being filled, idle, or claimed
    /// and not yet closed): the orphan sweep spares them.
    alive: Arc<Mutex<HashSet<String>>>,
    /// Wakes the refill task. Sent by a claim (a slot to refill), the end of
    /// a cold start (the engine is free again) and the pool's end.
    wake: Arc<Notify>,
    /// Cold starts waiting on an engine now: the refill does not add its
    /// own container work to theirs.
    cold_starts: AtomicUsize,
    closed: AtomicBool,
    /// The refill task: `shutdown` waits for it, so a container being made
    /// when the host stops is removed rather than left half-made.
    refill: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("slots", &self.spec.slots)
            .field("idle", &self.idle_count())
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl WarmPool {
    /// Mounts the pool tmpfs and starts the refill in the background.
    pub(super) fn start(
        spec: WarmSpec,
        image: String,
        engines: Arc<Vec<Arc<Engine>>>,
    ) -> Result<Arc<Self>, WarmError> {
        if spec.slots == 0 || spec.instance_id.trim().is_empty() {
            return Err(WarmError::Engine(
                "a pool needs at least one slot and an instance id".into(),
            ));
        }
        let root = tempfile::Builder::new()
            .prefix(&prefix_of(&spec.instance_id))
            .tempdir()
            .map_err(|source| WarmError::Mount {
                what: "creating the pool directory under",
                path: std::env::temp_dir().display().to_string(),
                source,
            })?
            .keep();
        if let Err(e) = mount_root(&root) {
            let _ = std::fs::remove_dir(&root);
            return Err(e);
        }
        let pool = Arc::new(Self {
            spec,
            image,
            user: user::pool_user(),
            engines,
            root,
            idle: Mutex::new(VecDeque::new()),
            alive: Arc::new(Mutex::new(HashSet::new())),
            wake: Arc::new(Notify::new()),
            cold_starts: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            refill: Mutex::new(None),
        });
        let task = tokio::spawn(refill(Arc::downgrade(&pool), Arc::clone(&pool.wake)));
        *lock(&pool.refill) = Some(task);
        Ok(pool)
    }

    pub(super) fn idle_count(&self) -> usize {
        lock(&self.idle).len()
    }

    /// The run labels of the pool's containers: never orphans.
    pub(super) fn alive(&self) -> HashSet<String> {
        lock(&self.alive).clone()
    }

    /// Whether `spec` may take a pooled container: this instance, these
    /// limits, a workspace bound from this host, skills at their usual
    /// place. Anything else starts cold.
    pub(super) fn fits(&self, spec: &SandboxSpec) -> bool {
        !self.closed.load(Ordering::SeqCst)
            && spec.instance_id == self.spec.instance_id
            && spec.limits == self.spec.limits
            && matches!(spec.workspace, WorkspaceMount::HostPath(_))
            && spec
                .ro_binds
                .iter()
                .all(|(_, inside)| skill_rel(inside).is_some())
    }

    /// Counts a cold start until the guard drops; the refill waits for it.
    pub(super) fn cold_start(self: &Arc<Self>) -> ColdStart {
        self.cold_starts.fetch_add(1, Ordering::SeqCst);
        ColdStart(Arc::clone(self))
    }

    /// A pooled container made this run's session, or `None` when the pool
    /// has none ready (or the one taken failed: it is destroyed, never put
    /// back) and the run should start cold. An error is the spec's own (a
    /// missing workspace or socket), which a cold start would meet too.
    pub(super) async fn claim(
        &self,
        spec: &SandboxSpec,
    ) -> Option<Result<DockerSession, SandboxError>> {
        if self.idle_count() == 0 {
            return None;
        }
        // Everything that can fail for the spec's sake before a slot is
        // taken: such a failure leaves the pool as it was.
        let (workspace, user, relay) = match super::bound_parts(spec).await {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        if user != self.user {
            return None;
        }
        let slot = lock(&self.idle).pop_front()?;
        self.wake.notify_one();
        let name = slot.name.clone();
        match self.attach(slot, spec, &workspace, relay, user).await {
            Ok(session) => Some(Ok(session)),
            Err(e) => {
                tracing::warn!(slot = %name, error = %e, "a pooled sandbox could not be claimed; this run starts cold");
                None
            }
        }
    }

    /// Mounts the run's layer, socket and skills into the slot, unpauses
    /// its container and wraps it as the run's session. On failure the
    /// slot is destroyed.
    async fn attach(
        &self,
        slot: WarmSlot,
        spec: &SandboxSpec,
        workspace: &Path,
        relay: Option<SocketRelay>,
        user: String,
    ) -> Result<DockerSession, SandboxError> {
        let mut claimed = ClaimedSlot {
            name: slot.name.clone(),
            dir: slot.dir.clone(),
            dev: dev_of(&self.root),
            mounts: Vec::new(),
            alive: Arc::clone(&self.alive),
        };
        let docker = slot.engine.client();
        let mounted = claimed.mount_run(spec, workspace, relay.as_ref().map(SocketRelay::path));
        let unpaused = match mounted {
            Ok(()) => docker
                .unpause_container(&slot.container)
                .await
                .map_err(|e| SandboxError::Engine(format!("unpausing {}: {e}", slot.name))),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = unpaused {
            let _ = remove_container(&docker, &slot.container).await;
            drop(claimed);
            return Err(e);
        }
        tracing::debug!(container = %slot.container, slot = %slot.name, run = %spec.run_id, "pooled sandbox claimed");
        // A spawned sibling is created for this run alone, cold: it binds
        // the layer and relay directly and carries the run's labels.
        let reach = shape::Reach::Bound {
            workspace,
            api_socket: relay.as_ref().map(SocketRelay::path),
        };
        let sibling = SiblingShape {
            name: shape::container_name(&spec.instance_id, &spec.run_id),
            body: shape::create_body(&self.image, spec, reach, user),
        };
        let env = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Ok(DockerSession::new(docker, slot.container, relay, sibling)
            .claimed(claimed, env)
            .placed(Placed::on(&slot.engine)))
    }

    /// Creates, starts and pauses one container for the pool on `engine`.
    async fn fill_one(&self, engine: &Arc<Engine>) -> Result<(), WarmError> {
        let hex = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("warm-{}", hex.get(..12).unwrap_or(&hex));
        // Before the container exists, so a sweep listing it spares it.
        lock(&self.alive).insert(name.clone());
        let dir = self.root.join(&name);
        let made = self.make_container(&engine.client(), &name, &dir).await;
        let slot = match made {
            Ok(container) => WarmSlot {
                name,
                container,
                engine: Arc::clone(engine),
                dir,
            },
            Err((container, e)) => {
                if let Some(id) = container {
                    let _ = remove_container(&engine.client(), &id).await;
                }
                remove_on_dev(&dir, dev_of(&self.root));
                lock(&self.alive).remove(&name);
                return Err(e);
            }
        };
        if self.closed.load(Ordering::SeqCst) {
            self.destroy(slot).await;
            return Ok(());
        }
        lock(&self.idle).push_back(slot);
        Ok(())
    }

    /// The container of one slot, paused; on failure, the id of what was
    /// created (to remove) and why.
    async fn make_container(
        &self,
        docker: &Docker,
        name: &str,
        dir: &Path,
    ) -> Result<String, (Option<String>, WarmError)> {
        let (work, run) = (dir.join("work"), dir.join("run"));
        for d in [dir, &work, &run] {
            std::fs::create_dir(d).map_err(|source| {
                (
                    None,
                    WarmError::Mount {
                        what: "creating the slot directory",
                        path: d.display().to_string(),
                        source,
                    },
                )
            })?;
        }
        let container_name = shape::container_name(&self.spec.instance_id, name);
        let body = shape::warm_body(
            &self.image,
            &self.spec.instance_id,
            name,
            (&work, &run),
            &self.spec.limits,
            self.user.clone(),
        );
        let options = CreateContainerOptionsBuilder::default()
            .name(&container_name)
            .build();
        let id = docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| {
                (
                    None,
                    WarmError::Engine(format!("creating {container_name}: {e}")),
                )
            })?
            .id;
        let fail = |what: &str, e: bollard::errors::Error| {
            (
                Some(id.clone()),
                WarmError::Engine(format!("{what} {container_name}: {e}")),
            )
        };
        docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| fail("starting", e))?;
        // Frozen until claimed: nothing runs in it, not even its `sleep`,
        // and no exec is accepted into it.
        docker
            .pause_container(&id)
            .await
            .map_err(|e| fail("pausing", e))?;
        Ok(id)
    }

    async fn destroy(&self, slot: WarmSlot) {
        if let Err(e) = remove_container(&slot.engine.client(), &slot.container).await {
            tracing::warn!(slot = %slot.name, error = %e, "removing a pooled sandbox failed; the sweep will");
        }
        remove_on_dev(&slot.dir, dev_of(&self.root));
        lock(&self.alive).remove(&slot.name);
    }

    /// Stops the refill and removes every idle container and the pool
    /// tmpfs. Claimed sessions keep what they have.
    pub(super) async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        // A fill under way ends first (it removes what it made once it
        // sees the pool closed).
        let task = lock(&self.refill).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let idle: Vec<WarmSlot> = lock(&self.idle).drain(..).collect();
        for slot in idle {
            self.destroy(slot).await;
        }
        unmount_root(&self.root);
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let idle: Vec<WarmSlot> = lock(&self.idle).drain(..).collect();
        // Best effort: the start-up sweep removes whatever this misses.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            for slot in idle {
                runtime.spawn(async move {
                    let _ = remove_container(&slot.engine.client(), &slot.container).await;
                });
            }
        }
        unmount_root(&self.root);
    }
}

/// A cold start in progress (see [`WarmPool::cold_start`]).
pub(super) struct ColdStart(Arc<WarmPool>);

impl Drop for ColdStart {
    fn drop(&mut self) {
        self.0.cold_starts.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

/// A slot claimed by one run: the host mounts that reach its container,
/// undone (newest first) when dropped, after which the slot's directories
/// go and the sweep no longer spares its container.
#[derive(Debug)]
pub(super) struct ClaimedSlot {
    name: String,
    dir: PathBuf,
    /// The pool tmpfs's device: only entries on it are ever removed.
    dev: Option<u64>,
    mounts: Vec<PathBuf>,
    alive: Arc<Mutex<HashSet<String>>>,
}

impl ClaimedSlot {
    /// The layer on `work`; the socket relay and each skill (read-only)
    /// under `run`. Each mount propagates into the paused container.
    fn mount_run(
        &mut self,
        spec: &SandboxSpec,
        workspace: &Path,
        socket: Option<&Path>,
    ) -> Result<(), WarmError> {
        let work = self.dir.join("work");
        bind(workspace, &work, false)?;
        self.mounts.push(work);
        let run = self.dir.join("run");
        if let Some(socket) = socket {
            let target = run.join("api.sock");
            std::fs::File::create(&target).map_err(|source| WarmError::Mount {
                what: "creating the socket's mount point",
                path: target.display().to_string(),
                source,
            })?;
            bind(socket, &target, false)?;
            self.mounts.push(target);
        }
        for (host, inside) in &spec.ro_binds {
            let rel = skill_rel(inside).ok_or_else(|| {
                WarmError::Engine(format!("{inside} is not under {SKILLS_INSIDE}"))
            })?;
            let target = run.join("skills").join(rel);
            std::fs::create_dir_all(&target).map_err(|source| WarmError::Mount {
                what: "creating a skill's mount point",
                path: target.display().to_string(),
                source,
            })?;
            bind_read_only(host, &target, &self.dir)?;
            self.mounts.push(target);
        }
        Ok(())
    }
}

impl Drop for ClaimedSlot {
    fn drop(&mut self) {
        for m in self.mounts.drain(..).rev() {
            unmount(&m);
        }
        if let Some(dev) = self.dev {
            remove_on_dev(&self.dir, Some(dev));
        }
        lock(&self.alive).remove(&self.name);
    }
}

/// Keeps the pool at its size, one container at a time, while the pool
/// lives. Waits while the pool is full, a cold start is in progress, the
/// host's available memory is below one sandbox's limit, or no engine on
/// this machine is healthy; backs off after a failure.
async fn refill(pool: Weak<WarmPool>, wake: Arc<Notify>) {
    let mut retry = RETRY_MIN;
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let pause = {
            let Some(pool) = pool.upgrade() else { return };
            if pool.closed.load(Ordering::SeqCst) {
                return;
            }
            // Full, or a run waiting on the engine comes first.
            if pool.idle_count() >= pool.spec.slots || pool.cold_starts.load(Ordering::SeqCst) > 0 {
                Some(RECHECK)
            } else if !memory_allows(pool.spec.limits.memory_bytes) {
                tracing::debug!("warm pool: waiting for memory to refill");
                Some(RECHECK)
            } else if let Some(engine) = pool_engine(&pool.engines) {
                match pool.fill_one(&engine).await {
                    Ok(()) => {
                        retry = RETRY_MIN;
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "warm pool: a refill failed");
                        let wait = retry;
                        retry = (retry * 2).min(RETRY_MAX);
                        Some(wait)
                    }
                }
            } else {
                Some(RECHECK)
            }
        };
        if let Some(wait) = pause {
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Whether the host has `bytes` of memory available (`MemAvailable`): the
/// room one more sandbox may take once claimed. Unknown counts as yes.
fn memory_allows(bytes: i64) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return true;
    };
    let available_kb = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<i64>().ok());
    available_kb.is_none_or(|kb| kb.saturating_mul(1024) >= bytes)
}

/// The path below [`SKILLS_INSIDE`], if `inside` is there and stays there.
fn skill_rel(inside: &str) -> Option<&Path> {
    let rel = Path::new(inside.strip_prefix(SKILLS_INSIDE)?);
    let normal = rel
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    (normal && rel.components().next().is_some()).then_some(rel)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned pool is still the right list of containers.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn prefix_of(instance_id: &str) -> String {
    crate::sandbox::relay::temp_prefix("warm", instance_id)
}

/// Unmounts and removes the pool tmpfs a killed host of `instance_id` left
/// (its containers go with the orphan sweep, by their label). Returns how
/// many there were.
pub fn sweep_warm_roots(instance_id: &str) -> std::io::Result<usize> {
    let roots = crate::sandbox::relay::temp_dirs(&prefix_of(instance_id))?;
    for root in &roots {
        unmount_root(root);
    }
    Ok(roots.len())
}

fn c_path(p: &Path) -> Result<CString, WarmError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| WarmError::Mount {
        what: "a path with a NUL byte",
        path: p.display().to_string(),
        source: std::io::Error::other(e),
    })
}

fn mount_err(what: &'static str, path: &Path) -> WarmError {
    WarmError::Mount {
        what,
        path: path.display().to_string(),
        source: std::io::Error::last_os_error(),
    }
}

/// The pool tmpfs, made a shared mount so later mounts on a slot's
/// directories propagate into the containers that bind them `rslave`.
fn mount_root(root: &Path) -> Result<(), WarmError> {
    let (target, data) = (
        c_path(root)?,
        CString::new(ROOT_OPTIONS).unwrap_or_default(),
    );
    let fs = c"tmpfs";
    // SAFETY: valid NUL-terminated strings; the result is checked.
    let r = unsafe {
        libc::mount(
            c"mercury-warm".as_ptr(),
            target.as_ptr(),
            fs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(mount_err(
            "mounting the pool tmpfs (needs root or CAP_SYS_ADMIN) at",
            root,
        ));
    }
    // SAFETY: as above; no data for a propagation change.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = mount_err("making the pool tmpfs shared at", root);
        unmount_root(root);
        return Err(e);
    }
    Ok(())
}

/// Detaches the pool tmpfs with everything mounted below it and removes
/// its (then empty) directory. Never recursive on the directory: what was
/// in it lived on the tmpfs.
fn unmount_root(root: &Path) {
    unmount(root);
    let _ = std::fs::remove_dir(root);
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), WarmError> {
    let (src, tgt) = (c_path(source)?, c_path(target)?);
    // SAFETY: valid NUL-terminated strings; the result is checked.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(mount_err("binding onto", target));
    }
    if read_only {
        // SAFETY: as above.
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                tgt.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if r < 0 {
            let e = mount_err("making read-only", target);
            unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Binds `source` read-only onto `target` so that the copy propagated into
/// the container is read-only too: a remount does not propagate, so the
/// read-only bind is made first on a staging directory no container sees
/// (beside the slot's two bound directories), then bound from there (a bind
/// keeps its source mount's read-only flag).
fn bind_read_only(source: &Path, target: &Path, slot_dir: &Path) -> Result<(), WarmError> {
    let stage = slot_dir.join(format!(
        "stage-{}",
        uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .get(..8)
            .unwrap_or("0")
    ));
    std::fs::create_dir(&stage).map_err(|source| WarmError::Mount {
        what: "creating a staging directory",
        path: stage.display().to_string(),
        source,
    })?;
    let staged = bind(source, &stage, true).and_then(|()| {
        let moved = bind(&stage, target, false);
        unmount(&stage);
        moved
    });
    let _ = std::fs::remove_dir(&stage);
    staged
}

fn unmount(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: a valid path; MNT_DETACH so a container still holding the
        // mount does not keep the host from going on.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

fn dev_of(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.dev())
}

/// Removes `path` and what is below it, but only entries on device `dev`
/// (the pool tmpfs): a mount point left by a failed unmount is another
/// device, and is left with everything on it (the next start's sweep
/// detaches it). Links are removed, never followed.
fn remove_on_dev(path: &Path, dev: Option<u64>) {
    let Some(dev) = dev else { return };
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.dev() != dev {
        return;
    }
    if !meta.is_dir() {
        let _ = std::fs::remove_file(path);
        return;
    }
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            remove_on_dev(&entry.path(), Some(dev));
        }
    }
    let _ = std::fs::remove_dir(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skills_claim_a_pooled_sandbox_only_below_their_usual_place() {
        assert_eq!(
            skill_rel("/run/mercury/skills/time/clock"),
            Some(Path::new("time/clock"))
        );
        for bad in [
            "/run/mercury/skills/",
            "/run/mercury/skills/../api.sock",
            "/run/mercury/other",
            "/etc/skills/x",
        ] {
            assert_eq!(skill_rel(bad), None, "{bad}");
        }
    }

    #[test]
    fn removal_stops_at_another_device() {
        // /proc is another filesystem than a temp dir: never entered.
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("slot");
        std::fs::create_dir_all(dir.join("work/a")).unwrap();
        std::fs::write(dir.join("work/a/f"), "x").unwrap();
        remove_on_dev(&dir, dev_of(t.path()));
        assert!(!dir.exists());
        remove_on_dev(Path::new("/proc/self"), dev_of(t.path()));
        assert!(Path::new("/proc/self/status").exists());
    }
}
