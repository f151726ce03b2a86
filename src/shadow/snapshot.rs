//! `mercury shadow snapshot` and `prune`: a consistent copy of a live data
//! dir, taken while the live host serves, into `<shadow root>/<timestamp>/`.
//!
//! The database is copied with `VACUUM INTO` (a transactionally consistent
//! copy; the live writer is never paused); `spaces/` and `models/` through
//! the safe-path copy (no symlink is followed: a link is copied as a link);
//! `global/` without tokens or credentials. Every live API token is dropped
//! from the copy and the shadow gets its own owner token; the derived
//! `mercury.yaml` turns shadow mode on, moves the port, and sets the admins
//! to exactly `--admins` (never inherited).
//!
//! Must never: write to the live data dir, copy a live token, key or admin
//! id into the shadow, or let `prune` remove the running snapshot.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_yaml_ng::Value as Yaml;

use super::manifest::{Manifest, Marks, Running, CURRENT_LINK, MANIFEST_FILE};
use super::tap::{Baseline, BaselineTap};
use super::{db_err, io_err, ShadowError, ShadowResult};
use crate::config;
use crate::storage::{copy, snapshot, tokens, Location};
use crate::workspace::data_dir::{private_dir, private_file};
use crate::workspace::safe::{EntryKind, WorkspaceRoot};
use crate::workspace::walk::WalkLimits;
use crate::workspace::DataPaths;

/// The product's git revision, fixed at build time (`build.rs`).
pub const GIT_REVISION: &str = env!("MERCURY_GIT_REVISION");

#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    pub live_data_dir: PathBuf,
    pub root: PathBuf,
    /// The shadow's admins (caller ids); default none.
    pub admins: Vec<String>,
    pub label: Option<String>,
    /// The shadow's port; default the live port + 1.
    pub port: Option<u16>,
    /// Progress lines on stderr.
    pub progress: bool,
    /// Where the live host keeps its state when that is not its data dir's
    /// `state.db` (a PostgreSQL deployment): the caller resolves it from the
    /// live config and the environment, as the live host does.
    pub live_store: Option<Location>,
}

#[derive(Debug, Clone)]
pub struct SnapshotOutcome {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub seconds: f64,
}

/// What a snapshot copies of `global/`: only files the product itself
/// writes there and that hold no secret, named one by one (a name
/// heuristic copied `global/api_key`). Today the product writes only
/// `owner.token` there, a secret the shadow replaces with its own, so the
/// list is empty: a file the product starts writing there joins it.
pub const GLOBAL_COPIED: &[&str] = &[];

fn stamp(now_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(now_ms)
        .unwrap_or_default()
        .format("%Y%m%dT%H%M%SZ")
        .to_string()
}

/// Takes a snapshot. Blocking: run it off the async runtime.
pub fn take(opts: &SnapshotOptions) -> ShadowResult<SnapshotOutcome> {
    take_from(opts, false)
}

/// A fresh copy of a snapshot (`opts.live_data_dir` names it) for one
/// replay of a rehearsal (`mercury review rehearse`): made as [`take`]
/// makes one of a live data dir, its own tokens, config and baseline
/// included, so no replay sees another's. `opts.root` must not contain the
/// snapshot. Blocking.
pub fn replay_copy(opts: &SnapshotOptions) -> ShadowResult<SnapshotOutcome> {
    take_from(opts, true)
}

fn take_from(opts: &SnapshotOptions, of_snapshot: bool) -> ShadowResult<SnapshotOutcome> {
    let started = Instant::now();
    for a in &opts.admins {
        crate::ids::validate_operator_id(a)
            .map_err(|m| ShadowError::Refused(format!("--admins: {m}")))?;
    }
    if let Some(l) = &opts.label {
        if l.chars().count() > 200 || l.chars().any(char::is_control) {
            return Err(ShadowError::Refused(
                "--label must be one line of at most 200 characters".into(),
            ));
        }
    }
    let live_dir = std::fs::canonicalize(&opts.live_data_dir).map_err(|_| {
        ShadowError::Refused(format!(
            "{} is not a data dir",
            opts.live_data_dir.display()
        ))
    })?;
    let live = DataPaths::new(&live_dir);
    match (live_dir.join(MANIFEST_FILE).exists(), of_snapshot) {
        (true, false) => {
            return Err(ShadowError::Refused(format!(
                "{} is itself a snapshot; snapshot the live data dir",
                live_dir.display()
            )))
        }
        (false, true) => {
            return Err(ShadowError::Refused(format!(
                "{} is not a snapshot; a replay copies only a snapshot",
                live_dir.display()
            )))
        }
        _ => {}
    }
    // The live file alone: the environment of this command is not the live host's.
    let live_settings = config::load(&live.config, &Default::default())?;
    // A PostgreSQL deployment's rows are read from its server (never
    // written) into the shadow's own SQLite file (docs/storage.md, "The
    // shadow on each backend"); a SQLite one's file is copied.
    let source = match (&opts.live_store, live_settings.storage.backend) {
        (Some(at @ Location::Postgres { .. }), _) => LiveStore::Postgres(at.clone()),
        (_, config::StorageBackend::Postgres) => {
            return Err(ShadowError::Refused(
                "the live host keeps its state in PostgreSQL (storage.backend: postgres), but no server address was given for it: run the snapshot with the live host's storage settings".into(),
            ))
        }
        (_, config::StorageBackend::Sqlite) if !live.db.is_file() => {
            return Err(ShadowError::Refused(format!(
                "{} has no state.db, so it is not a live data dir",
                live_dir.display()
            )))
        }
        (_, config::StorageBackend::Sqlite) => LiveStore::Sqlite,
    };
    // Refused before anything is created: a root inside the live data dir
    // must not leave even an empty directory there.
    refuse_overlap(&resolve_ahead(&opts.root)?, &live_dir)?;
    private_dir(&opts.root).map_err(io_err(format!("creating {}", opts.root.display())))?;
    let root = std::fs::canonicalize(&opts.root)
        .map_err(io_err(format!("resolving {}", opts.root.display())))?;
    refuse_overlap(&root, &live_dir)?;
    let live_bind: std::net::SocketAddr = live_settings.bind.parse().map_err(|_| {
        ShadowError::Invalid(format!(
            "live bind {:?} is not ADDR:PORT",
            live_settings.bind
        ))
    })?;
    let port = match opts.port {
        Some(p) => p,
        None => live_bind
            .port()
            .checked_add(1)
            .ok_or_else(|| ShadowError::Refused("the live port is 65535; give --port".into()))?,
    };
    let shadow_bind = std::net::SocketAddr::new(live_bind.ip(), port).to_string();

    let now = crate::clock::now_ms();
    let mut id = stamp(now);
    let mut n = 1;
    while root.join(&id).exists() {
        n += 1;
        id = format!("{}-{n}", stamp(now));
    }
    let dir = root.join(&id);
    private_dir(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let made = make(
        opts,
        &live,
        &live_settings,
        &source,
        Place {
            root: &root,
            dir: &dir,
            id: &id,
            now,
            shadow_bind,
        },
    );
    match made {
        Ok(manifest) => Ok(SnapshotOutcome {
            dir,
            manifest,
            seconds: started.elapsed().as_secs_f64(),
        }),
        Err(e) => {
            // No half snapshot is left to be started.
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

/// Where the live rows come from.
enum LiveStore {
    /// The live data dir's `state.db`, copied whole (`VACUUM INTO`).
    Sqlite,
    /// A PostgreSQL database, read row by row into the shadow's new file.
    Postgres(Location),
}

/// Where a snapshot is being made.
struct Place<'a> {
    root: &'a Path,
    dir: &'a Path,
    id: &'a str,
    now: i64,
    shadow_bind: String,
}

/// Fills the new snapshot directory, derives its config, writes the
/// baseline and the manifest and points `current` at it.
fn make(
    opts: &SnapshotOptions,
    live: &DataPaths,
    live_settings: &config::Settings,
    source: &LiveStore,
    at: Place<'_>,
) -> ShadowResult<Manifest> {
    let shadow = DataPaths::new(at.dir);
    let (marks, db_bytes, files_bytes, baseline) = fill(
        opts,
        live,
        source,
        &shadow,
        &live_settings.owner,
        (&live_settings.workspace).into(),
    )?;
    let admins = Yaml::Sequence(opts.admins.iter().map(|a| Yaml::from(a.as_str())).collect());
    let mut keys = vec![
        ("bind", Yaml::from(at.shadow_bind.as_str())),
        ("shadow", Yaml::Bool(true)),
        ("shadow_root", Yaml::from(at.root.display().to_string())),
        ("admins", admins),
    ];
    if let LiveStore::Postgres(_) = source {
        // The shadow runs on its own file: the live server's address and
        // password file are not carried into its config.
        keys.extend([
            ("storage.backend", Yaml::from("sqlite")),
            ("storage.url", Yaml::from("")),
            ("storage.password_file", Yaml::from("")),
        ]);
    }
    // The live host's environment-set keys (recorded at its start) go
    // first, so the snapshot's own keys always win.
    let recorded = super::settings::read(&live.root)?.unwrap_or_default();
    let mut all: Vec<(&str, Yaml)> = recorded
        .settings
        .iter()
        .filter(|(k, _)| super::settings::is_carried(k))
        .filter(|(k, _)| !(matches!(source, LiveStore::Postgres(_)) && k.starts_with("storage.")))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    all.extend(keys.iter().map(|(k, v)| (*k, v.clone())));
    write_config(&shadow.config, &all)?;
    // What the diff compares against, before the shadow ever runs: the
    // files' hashes and texts were taken while they were copied.
    super::diff::write_baseline(at.dir, baseline)?;
    let manifest = Manifest {
        id: at.id.to_owned(),
        product_version: env!("CARGO_PKG_VERSION").to_owned(),
        git_revision: GIT_REVISION.to_owned(),
        live_data_dir: live.root.display().to_string(),
        created_at_ms: at.now,
        created_at: chrono::DateTime::from_timestamp_millis(at.now)
            .unwrap_or_default()
            .to_rfc3339(),
        label: opts.label.clone(),
        admin_count: Some(opts.admins.len()),
        live_bind: live_settings.bind.clone(),
        shadow_bind: at.shadow_bind,
        marks,
        db_bytes,
        files_bytes,
    };
    let json =
        serde_json::to_string_pretty(&manifest).map_err(|e| ShadowError::Invalid(e.to_string()))?;
    let mpath = at.dir.join(MANIFEST_FILE);
    private_file(&mpath)
        .and_then(|mut f| f.write_all(json.as_bytes()))
        .map_err(io_err(format!("writing {}", mpath.display())))?;
    point_current(at.root, at.id)?;
    Ok(manifest)
}

/// Sets `keys` in the shadow's copy of the live `mercury.yaml`, keeping the
/// live file's comments outside the sections it changes; a file that cannot
/// be edited line by line is re-serialised (its comments lost) instead.
fn write_config(path: &Path, keys: &[(&str, Yaml)]) -> ShadowResult<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
    };
    match super::settings::edit_keeping_comments(&text, keys) {
        Some(edited) => {
            // Validated as the host will read it before it is written.
            let doc: Yaml = serde_yaml_ng::from_str(&edited)
                .map_err(|e| ShadowError::Invalid(format!("the edited config: {e}")))?;
            config::from_value(doc, &Default::default())?;
            std::fs::write(path, edited).map_err(io_err(format!("writing {}", path.display())))
        }
        None => {
            let pairs: Vec<(&str, Yaml)> = keys.to_vec();
            config::set_keys(path, &pairs)?;
            Ok(())
        }
    }
}

/// Refuses a shadow root and a live data dir (both resolved) that contain
/// each other.
fn refuse_overlap(root: &Path, live_dir: &Path) -> ShadowResult<()> {
    if root.starts_with(live_dir) || live_dir.starts_with(root) {
        return Err(ShadowError::Refused(format!(
            "the shadow root {} and the live data dir {} must not contain each other",
            root.display(),
            live_dir.display()
        )));
    }
    Ok(())
}

/// Where `path` will be once created: its nearest existing ancestor
/// resolved (links, `..`), the part not yet there joined on as written.
fn resolve_ahead(path: &Path) -> ShadowResult<PathBuf> {
    use std::path::Component;
    let parts: Vec<Component<'_>> = path.components().collect();
    for n in (1..=parts.len()).rev() {
        let head: PathBuf = parts[..n].iter().collect();
        match std::fs::canonicalize(&head) {
            Ok(mut resolved) => {
                for c in &parts[n..] {
                    match c {
                        // A directory about to be made is no link: `..` leaves it.
                        Component::ParentDir => {
                            resolved.pop();
                        }
                        Component::Normal(p) => resolved.push(p),
                        Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                    }
                }
                return Ok(resolved);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(format!("resolving {}", head.display()))(e)),
        }
    }
    Err(ShadowError::Refused(format!(
        "the shadow root {} has no existing ancestor",
        path.display()
    )))
}

/// Database, files, config and the shadow's owner token; the marks, the
/// sizes and what the copy of `spaces/` gathered for the diff baseline.
///
/// The database and the files are copied side by side, each on its own
/// thread (issue 32): one is mostly SQLite's work, the other the disk's
/// (each copying thread's hashing is a thread of its own, [`BaselineTap`]),
/// and neither reads what the other writes. The database's thread, done
/// first, then takes workspaces of `spaces/` too ([`TopLevel`]). Both run
/// to their end before an error of either is answered, so the caller's
/// clean-up never races a copy still writing.
fn fill(
    opts: &SnapshotOptions,
    live: &DataPaths,
    source: &LiveStore,
    shadow: &DataPaths,
    owner: &str,
    limits: WalkLimits,
) -> ShadowResult<(Marks, u64, u64, Baseline)> {
    for d in [&shadow.spaces, &shadow.global, &shadow.reviews] {
        private_dir(d).map_err(io_err(format!("creating {}", d.display())))?;
    }
    let spaces = TopLevel::open(&live.spaces, &shadow.spaces, opts.progress, "spaces")?;
    let (db, files) = std::thread::scope(|s| {
        let db = s.spawn(|| {
            let copied = copy_database(opts, live, source, shadow, owner)?;
            // Its own work done, this thread takes workspaces too.
            Ok::<_, ShadowError>((copied, copy_spaces(&spaces, limits)?))
        });
        let files = copy_files(live, shadow, &spaces, limits);
        (db.join(), files)
    });
    let ((marks, db_bytes, secret), (helped_bytes, helped)) = db.map_err(|_| {
        ShadowError::Invalid("the database copy stopped unexpectedly (a panic)".into())
    })??;
    let (files_bytes, mut baseline) = files?;
    baseline.absorb(helped);
    let token_path = shadow.owner_token();
    private_file(&token_path)
        .and_then(|mut f| f.write_all(secret.as_bytes()))
        .map_err(io_err(format!("writing {}", token_path.display())))?;
    let text = std::fs::read_to_string(&live.config)
        .map_err(io_err(format!("reading {}", live.config.display())))?;
    private_file(&shadow.config)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io_err(format!("writing {}", shadow.config.display())))?;
    Ok((marks, db_bytes, files_bytes + helped_bytes, baseline))
}

/// The database into the shadow's `state.db`, every live token replaced by
/// the shadow's own owner token: the marks, the file's size and that token.
// The issue asks for progress on stderr while a large snapshot is taken.
#[allow(clippy::print_stderr)]
fn copy_database(
    opts: &SnapshotOptions,
    live: &DataPaths,
    source: &LiveStore,
    shadow: &DataPaths,
    owner: &str,
) -> ShadowResult<(Marks, u64, String)> {
    match source {
        LiveStore::Sqlite => {
            if opts.progress {
                eprintln!("mercury shadow snapshot: copying the database (VACUUM INTO)");
            }
            let target = shadow.db.to_str().ok_or_else(|| {
                ShadowError::Invalid(format!("{} is not UTF-8", shadow.db.display()))
            })?;
            snapshot::copy_into(&live.db, target).map_err(db_err(format!(
                "copying the database into {}",
                shadow.db.display()
            )))?;
        }
        LiveStore::Postgres(at) => {
            if opts.progress {
                eprintln!(
                    "mercury shadow snapshot: reading the PostgreSQL database into the shadow's own state.db"
                );
            }
            // Private before the first row is in it.
            private_file(&shadow.db)
                .map_err(io_err(format!("creating {}", shadow.db.display())))?;
            let tables = copy::copy_into_sqlite_file(at, &shadow.db).map_err(db_err(format!(
                "copying the live database into {}",
                shadow.db.display()
            )))?;
            if opts.progress {
                let rows: i64 = tables.iter().map(|t| t.rows).sum();
                eprintln!(
                    "mercury shadow snapshot: {rows} rows in {} tables copied and verified",
                    tables.len()
                );
            }
        }
    }
    set_mode(&shadow.db)?;
    // Not one live credential crosses: the shadow mints its own owner token.
    let (copy, secret) = snapshot::replace_tokens(&shadow.db, |tx| {
        tokens::mint(
            tx,
            &tokens::NewToken {
                caller_id: owner,
                kind: tokens::TokenKind::User,
                space_id: None,
                run_id: None,
                label: Some("owner (mercury shadow snapshot)"),
                created_by: Some(crate::ids::SYSTEM_CALLER),
                expires_at: None,
                role: None,
                read_only: false,
            },
        )
        .map(|(_, secret)| secret)
    })
    .map_err(db_err(format!(
        "replacing the API tokens of {}",
        shadow.db.display()
    )))?;
    let marks = Marks {
        message_id: copy.message_id,
        token_usage_id: copy.token_usage_id,
        run_started_at_ms: copy.run_started_at_ms,
    };
    let db_bytes = std::fs::metadata(&shadow.db).map(|m| m.len()).unwrap_or(0);
    Ok((marks, db_bytes, secret))
}

/// This thread's share of `spaces/` (hashed as it is copied), `models/`
/// and what `global/` may carry: the bytes copied and what this thread's
/// tap learned.
fn copy_files(
    live: &DataPaths,
    shadow: &DataPaths,
    spaces: &TopLevel,
    limits: WalkLimits,
) -> ShadowResult<(u64, Baseline)> {
    let (mut files_bytes, baseline) = copy_spaces(spaces, limits)?;
    let live_models = crate::workspace::data_dir::models_dir(live);
    let shadow_models = crate::workspace::data_dir::models_dir(shadow);
    private_dir(&shadow_models).map_err(io_err(format!("creating {}", shadow_models.display())))?;
    if live_models.is_dir() {
        files_bytes += copy_dirs(&live_models, &shadow_models, false, "models", limits)?;
    }
    files_bytes += copy_global(&live.global, &shadow.global)?;
    Ok((files_bytes, baseline))
}

/// This thread's share of the workspaces, through a tap of its own: the
/// bytes and what its tap learned.
fn copy_spaces(spaces: &TopLevel, limits: WalkLimits) -> ShadowResult<(u64, Baseline)> {
    let mut tap = BaselineTap::start()?;
    let bytes = spaces.take_all(limits, Some(&mut tap))?;
    Ok((bytes, tap.finish()?))
}

fn set_mode(path: &Path) -> ShadowResult<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("setting the mode of {}", path.display())))
}

/// Copies every entry of `from` into the empty `to` through the safe-path
/// copy, one top-level entry at a time (for progress on large trees).
pub(crate) fn copy_dirs(
    from: &Path,
    to: &Path,
    progress: bool,
    what: &str,
    limits: WalkLimits,
) -> ShadowResult<u64> {
    TopLevel::open(from, to, progress, what)?.take_all(limits, None)
}

/// The top-level entries of a tree being copied, taken one at a time by
/// whichever thread calls [`TopLevel::take_all`]: the snapshot's `spaces/`
/// is copied by the file copy's thread and, once its own work is done, by
/// the database copy's (issue 32: that thread finished in about half the
/// files' time and its CPU then idled).
struct TopLevel {
    src: WorkspaceRoot,
    dst: WorkspaceRoot,
    to: PathBuf,
    what: String,
    entries: Vec<crate::workspace::safe::Entry>,
    next: AtomicUsize,
    /// Set by a thread whose entry failed: the others take no more.
    failed: AtomicBool,
    progress: Option<Mutex<Progress>>,
}

/// What the progress lines count: entries copied to their end (an entry
/// taken by another thread still copying is not done), and their bytes.
struct Progress {
    last: Instant,
    done: usize,
    bytes: u64,
}

impl TopLevel {
    fn open(from: &Path, to: &Path, progress: bool, what: &str) -> ShadowResult<Self> {
        let src = WorkspaceRoot::open(from)
            .map_err(|e| ShadowError::Invalid(format!("{}: {e}", from.display())))?;
        let dst = WorkspaceRoot::open(to)
            .map_err(|e| ShadowError::Invalid(format!("{}: {e}", to.display())))?;
        let entries = src
            .entries()
            .map_err(io_err(format!("listing {}", from.display())))?;
        Ok(Self {
            src,
            dst,
            to: to.to_path_buf(),
            what: what.to_owned(),
            entries,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            progress: progress.then(|| {
                Mutex::new(Progress {
                    last: Instant::now(),
                    done: 0,
                    bytes: 0,
                })
            }),
        })
    }

    /// Copies entries until none is left (or another thread's failed): the
    /// bytes this thread copied. With a `tap`, each top-level directory's
    /// files are hashed (and the diffed ones' texts kept) as they are
    /// copied, so no file is read twice.
    fn take_all(&self, limits: WalkLimits, mut tap: Option<&mut BaselineTap>) -> ShadowResult<u64> {
        let mut bytes = 0;
        while !self.failed.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(e) = self.entries.get(i) else {
                break;
            };
            match self.copy_entry(e, limits, tap.as_deref_mut()) {
                Ok(n) => {
                    bytes += n;
                    self.report(n);
                }
                Err(err) => {
                    self.failed.store(true, Ordering::Relaxed);
                    return Err(err);
                }
            }
        }
        Ok(bytes)
    }

    fn copy_entry(
        &self,
        e: &crate::workspace::safe::Entry,
        limits: WalkLimits,
        tap: Option<&mut BaselineTap>,
    ) -> ShadowResult<u64> {
        let (what, name) = (&self.what, e.name.to_string_lossy());
        match e.kind {
            EntryKind::Dir => {
                self.dst
                    .mkdir(&e.name, 0o700)
                    .map_err(io_err(format!("creating {what}/{name}")))?;
                let s = self
                    .src
                    .child_dir(&e.name)
                    .map_err(io_err(format!("opening {what}/{name}")))?;
                let d = self
                    .dst
                    .child_dir(&e.name)
                    .map_err(io_err(format!("opening the copy of {what}/{name}")))?;
                let copied = match tap {
                    Some(tap) => {
                        tap.space(&name);
                        s.copy_tree_into_tapped(&d, limits, tap)
                    }
                    None => s.copy_tree_into(&d, limits),
                };
                copied.map_err(|err| io_err(format!("copying {what}/{name}"))(err.into()))
            }
            EntryKind::File => copy_file(&self.src, &e.name, &self.to),
            // A link at the top is a link to elsewhere: never followed, not needed.
            EntryKind::Symlink | EntryKind::Other => Ok(0),
        }
    }

    /// Progress on stderr for large copies (issue 14), every two seconds
    /// and at the end, whichever thread copied the entry.
    #[allow(clippy::print_stderr)]
    fn report(&self, copied: u64) {
        let Some(Ok(mut seen)) = self.progress.as_ref().map(Mutex::lock) else {
            return;
        };
        seen.done += 1;
        seen.bytes += copied;
        let total = self.entries.len();
        if seen.last.elapsed().as_secs() >= 2 || seen.done == total {
            eprintln!(
                "mercury shadow snapshot: {}: {}/{total} entries, {} MB",
                self.what,
                seen.done,
                seen.bytes >> 20
            );
            seen.last = Instant::now();
        }
    }
}

fn copy_file(src: &WorkspaceRoot, name: &OsStr, to_dir: &Path) -> ShadowResult<u64> {
    let Some(n) = name.to_str() else {
        return Ok(0);
    };
    let mut from = src
        .open_file(n)
        .map_err(|e| ShadowError::Invalid(format!("reading {n}: {e}")))?;
    let path = to_dir.join(n);
    let mut to = private_file(&path).map_err(io_err(format!("writing {}", path.display())))?;
    std::io::copy(&mut from, &mut to).map_err(io_err(format!("copying {}", path.display())))
}

/// The files of [`GLOBAL_COPIED`] that `global/` holds, each into a new
/// 0600 file; nothing else (an operator's file, a key someone put there)
/// crosses.
fn copy_global(from: &Path, to: &Path) -> ShadowResult<u64> {
    if !from.is_dir() {
        return Ok(0);
    }
    let src = WorkspaceRoot::open(from)
        .map_err(|e| ShadowError::Invalid(format!("{}: {e}", from.display())))?;
    let mut bytes = 0;
    for e in src.entries().map_err(io_err("listing global".to_owned()))? {
        let known = e.name.to_str().is_some_and(|n| GLOBAL_COPIED.contains(&n));
        if known && e.kind == EntryKind::File {
            bytes += copy_file(&src, &e.name, to)?;
        }
    }
    Ok(bytes)
}

/// Points `<root>/current` at `id` (a relative link, replaced atomically).
fn point_current(root: &Path, id: &str) -> ShadowResult<()> {
    let tmp = root.join(format!(".current.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(id, &tmp).map_err(io_err(format!("linking {}", tmp.display())))?;
    std::fs::rename(&tmp, root.join(CURRENT_LINK)).map_err(io_err(format!(
        "replacing {}/{CURRENT_LINK}",
        root.display()
    )))
}

/// The snapshots under `root`, oldest first (directories with a manifest).
pub fn list(root: &Path) -> ShadowResult<Vec<String>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(format!("listing {}", root.display()))(e)),
    };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        if ft.is_dir() && e.path().join(MANIFEST_FILE).is_file() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Resolves `current` or an id to a snapshot directory under `root`.
pub fn resolve(root: &Path, which: &str) -> ShadowResult<PathBuf> {
    let id = if which == CURRENT_LINK {
        let link = std::fs::read_link(root.join(CURRENT_LINK)).map_err(|_| {
            ShadowError::Refused(format!(
                "{} has no current snapshot; take one with `mercury shadow snapshot`",
                root.display()
            ))
        })?;
        link.to_string_lossy().into_owned()
    } else {
        which.to_owned()
    };
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return Err(ShadowError::Refused(format!("{id:?} is not a snapshot id")));
    }
    let dir = root.join(&id);
    if !dir.join(MANIFEST_FILE).is_file() {
        return Err(ShadowError::Refused(format!(
            "there is no snapshot {id} under {}",
            root.display()
        )));
    }
    Ok(dir)
}

/// Removes all but the newest `keep` snapshots, never the running one (nor
/// the one `current` names). Returns the ids removed.
pub fn prune(root: &Path, keep: usize) -> ShadowResult<Vec<String>> {
    let all = list(root)?;
    let running = Running::read(root)?.map(|r| r.snapshot);
    let current = std::fs::read_link(root.join(CURRENT_LINK))
        .ok()
        .map(|l| l.to_string_lossy().into_owned());
    let cut = all.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for id in &all[..cut] {
        if Some(id) == running.as_ref() || Some(id) == current.as_ref() {
            continue;
        }
        let dir = root.join(id);
        std::fs::remove_dir_all(&dir).map_err(io_err(format!("removing {}", dir.display())))?;
        removed.push(id.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_inside_the_live_data_dir_is_refused_before_anything_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let live = base.join("live");
        std::fs::create_dir(&live).unwrap();
        std::fs::write(live.join("state.db"), "").unwrap();
        std::os::unix::fs::symlink(&live, base.join("via-link")).unwrap();
        for root in [
            live.join("shadows"),
            live.join("a/b/shadows"),
            base.join("not-yet/../live/shadows"),
            base.join("via-link/shadows"),
        ] {
            let opts = SnapshotOptions {
                live_data_dir: live.clone(),
                root: root.clone(),
                admins: Vec::new(),
                label: None,
                port: None,
                progress: false,
                live_store: None,
            };
            let err = take(&opts).unwrap_err();
            assert!(
                matches!(&err, ShadowError::Refused(m) if m.contains("must not contain each other")),
                "{}: {err}",
                root.display()
            );
            let mut left: Vec<_> = std::fs::read_dir(&live)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            left.sort();
            assert_eq!(
                left,
                vec![std::ffi::OsString::from("state.db")],
                "{}",
                root.display()
            );
            assert!(!base.join("not-yet").exists());
        }
    }

    #[test]
    fn global_copies_only_the_listed_files_never_a_key_or_an_operators_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, to) = (tmp.path().join("from"), tmp.path().join("to"));
        std::fs::create_dir_all(from.join("sub")).unwrap();
        std::fs::create_dir(&to).unwrap();
        for p in ["owner.token", "api_key", "notes.md", "sub/a.md"] {
            std::fs::write(from.join(p), "live").unwrap();
        }
        assert_eq!(copy_global(&from, &to).unwrap(), 0);
        assert_eq!(std::fs::read_dir(&to).unwrap().count(), 0);
    }
}
