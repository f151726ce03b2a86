//! The agent image: `mercury-agent:<version>-<content hash>`, built `FROM scratch`
//! through the engine API from a build context assembled in memory.
//!
//! Owns: what goes into the image (the programs of [`TOOLS`], each Debian's
//! own single-purpose binary copied from the host, `mrctl`, the shared
//! libraries and loader they need, `/etc/passwd` and `/etc/group` with
//! `nobody`, empty `/work`, `/tmp` and `/run/mercury`), the content-addressed
//! tag, and "build only when absent".
//! The Dockerfile itself lives in `deploy/agent-image/` so operators can read it.
//!
//! Must never: pull from a registry (none is reachable, and the image must hold
//! exactly what this file puts in it), copy anything else from the host into
//! the image, run a build step inside the image, or hold a multi-call binary
//! (busybox): one answers to any applet name it is started under (a copy, a
//! link, its own shell's built-in lookup, `ld.so --argv0`), so the list of
//! what a container can run would not hold.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use bollard::query_parameters::BuildImageOptionsBuilder;
use bollard::Docker;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::SandboxError;

/// The Dockerfile of the agent image; part of the content hash, so editing it
/// yields a new tag.
pub const DOCKERFILE: &str = include_str!("../../deploy/agent-image/Dockerfile");

/// Repository part of every agent image reference.
pub const IMAGE_REPOSITORY: &str = "mercury-agent";

/// Where `mrctl` sits inside the image (on the engine's default `PATH`).
pub const MRCTL_PATH_IN_IMAGE: &str = "/usr/local/bin/mrctl";

/// The programs in the image's `/bin`, as (name in the image, program on the
/// host): the commands an agent's shell tools use, and nothing else (no
/// networking tool, no `su`, no `chmod`, no `ln`). Each is a single-purpose
/// Debian binary (dash, coreutils, grep, sed, findutils, hostname) found in
/// `/usr/bin` or `/bin` on the host; `sh` is dash.
pub const TOOLS: &[(&str, &str)] = &[
    ("sh", "dash"),
    ("cat", "cat"),
    ("ls", "ls"),
    ("find", "find"),
    ("mkdir", "mkdir"),
    ("rm", "rm"),
    ("cp", "cp"),
    ("mv", "mv"),
    ("echo", "echo"),
    ("printf", "printf"),
    ("base64", "base64"),
    ("hostname", "hostname"),
    ("sleep", "sleep"),
    ("head", "head"),
    ("tail", "tail"),
    ("wc", "wc"),
    ("grep", "grep"),
    ("sed", "sed"),
    ("dirname", "dirname"),
    ("basename", "basename"),
    ("env", "env"),
    ("id", "id"),
    ("touch", "touch"),
    ("test", "test"),
    ("true", "true"),
    ("false", "false"),
    ("stat", "stat"),
    ("sort", "sort"),
    ("tee", "tee"),
    ("ln", "ln"),
    ("chmod", "chmod"),
    ("dd", "dd"),
];

/// Where the host program `program` of [`TOOLS`] lives (`/usr/bin`, else `/bin`).
pub fn host_tool(program: &str) -> io::Result<PathBuf> {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("the agent image needs {program} (in /usr/bin or /bin) on this host"),
            )
        })
}

/// Label set on the image so an operator can tell where it came from.
const IMAGE_LABEL: (&str, &str) = ("mercury.image", "agent");

/// Lines of build output kept for an error message.
const LOG_TAIL_LINES: usize = 30;

/// Serialises builds inside one process: parallel sessions (and parallel
/// tests) asking for the same absent image would otherwise each send a
/// multi-megabyte context and build it again.
static BUILD_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `mercury-agent:<version>-<first 12 hex of sha256(Dockerfile + mrctl + tools)>`.
///
/// The hash makes the tag change whenever what would go into the image
/// changes, so separate processes (test binaries, a restarted host) share one
/// image per content and never run a stale one. Characters a Docker tag does
/// not allow in `version` become `_`.
pub fn agent_image_tag(version: &str, mrctl: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(DOCKERFILE.as_bytes());
    hash_file(&mut hasher, mrctl)?;
    for (name, program) in TOOLS {
        hasher.update(name.as_bytes());
        hash_file(&mut hasher, &host_tool(program)?)?;
    }
    let digest = base16ct::lower::encode_string(&hasher.finalize());
    let hash = digest.get(..12).unwrap_or(&digest);
    Ok(format!(
        "{IMAGE_REPOSITORY}:{}-{hash}",
        sanitize_tag_part(version)
    ))
}

/// Builds the image only when `tag` is absent from the engine; returns the
/// image reference to start containers from.
pub async fn ensure_agent_image(
    docker: &Docker,
    tag: &str,
    mrctl: &Path,
) -> Result<String, SandboxError> {
    let _guard = BUILD_LOCK.lock().await;
    if image_exists(docker, tag).await? {
        return Ok(tag.to_string());
    }
    tracing::info!(tag, mrctl = %mrctl.display(), "building the agent image");
    build_agent_image_locked(docker, tag, mrctl).await?;
    Ok(tag.to_string())
}

/// Builds (or rebuilds) the agent image under `tag` and drains the build
/// stream. A failed build returns [`SandboxError::Image`] with the log tail.
pub async fn build_agent_image(
    docker: &Docker,
    tag: &str,
    mrctl: &Path,
) -> Result<(), SandboxError> {
    let _guard = BUILD_LOCK.lock().await;
    build_agent_image_locked(docker, tag, mrctl).await
}

async fn build_agent_image_locked(
    docker: &Docker,
    tag: &str,
    mrctl: &Path,
) -> Result<(), SandboxError> {
    let mrctl = mrctl.to_path_buf();
    // Reading a static release mrctl (tens of MB) and running ldd block.
    let context = tokio::task::spawn_blocking(move || build_context(&mrctl))
        .await
        .map_err(|e| SandboxError::Image(format!("building the image context panicked: {e}")))??;
    build_from_context(docker, tag, context).await
}

/// Sends a ready tar context to the engine's classic builder and drains the
/// stream; split out so a failing build can be tested with a broken context.
async fn build_from_context(
    docker: &Docker,
    tag: &str,
    context: Vec<u8>,
) -> Result<(), SandboxError> {
    build_labelled(docker, tag, context, IMAGE_LABEL).await
}

/// Sends `context` to the classic builder under `tag`, labelled `label`.
pub(super) async fn build_labelled(
    docker: &Docker,
    tag: &str,
    context: Vec<u8>,
    label: (&str, &str),
) -> Result<(), SandboxError> {
    let labels = HashMap::from([label]);
    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(tag)
        .rm(true)
        .forcerm(true)
        .labels(&labels)
        .build();
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));

    let mut tail: VecDeque<String> = VecDeque::with_capacity(LOG_TAIL_LINES);
    let mut failure: Option<String> = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(text) = info.stream.as_deref() {
                    push_tail(&mut tail, text);
                }
                if let Some(detail) = info.error_detail {
                    let message = detail
                        .message
                        .unwrap_or_else(|| "unknown build error".into());
                    failure.get_or_insert(message);
                }
            }
            Err(e) => {
                failure.get_or_insert(e.to_string());
            }
        }
    }
    let tail: Vec<String> = tail.into_iter().collect();
    if let Some(message) = failure {
        return Err(SandboxError::Image(format!(
            "building {tag} failed: {message}; log tail:\n{}",
            tail.join("\n")
        )));
    }
    // A stream can end early (engine restart) without an error item.
    if !image_exists(docker, tag).await? {
        return Err(SandboxError::Image(format!(
            "build of {tag} finished but the engine does not list the image; log tail:\n{}",
            tail.join("\n")
        )));
    }
    Ok(())
}

pub async fn image_exists(docker: &Docker, tag: &str) -> Result<bool, SandboxError> {
    match docker.inspect_image(tag).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(e) => Err(SandboxError::Engine(format!("inspecting image {tag}: {e}"))),
    }
}

fn push_tail(tail: &mut VecDeque<String>, text: &str) {
    for line in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        if tail.len() == LOG_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.to_string());
    }
}

fn hash_file(hasher: &mut Sha256, path: &Path) -> io::Result<()> {
    let mut file = std::fs::File::open(path).map_err(|e| with_path(e, path))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| with_path(e, path))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn sanitize_tag_part(version: &str) -> String {
    let cleaned: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // A tag may not start with '.' or '-'; the hash suffix keeps it short.
    match cleaned.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() || c == '_' => cleaned,
        _ => format!("v{cleaned}"),
    }
}

/// One entry of the image's root filesystem, keyed by its path without the
/// leading `/`.
#[derive(Debug)]
pub(super) enum RootEntry {
    Dir {
        mode: u32,
    },
    File {
        data: Vec<u8>,
        mode: u32,
    },
    /// Only in an extension's runtime image (a virtualenv is made of links);
    /// the agent image holds none, see the header.
    Link {
        target: String,
    },
}

/// The whole root filesystem, ordered so every parent precedes its children
/// and the tar (hence the layer) is byte-for-byte reproducible.
#[derive(Debug, Default)]
pub(super) struct RootFs {
    pub(super) entries: BTreeMap<String, RootEntry>,
}

impl RootFs {
    pub(super) fn link(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.entries.insert(
            path.to_string(),
            RootEntry::Link {
                target: target.to_string(),
            },
        );
    }

    pub(super) fn dir(&mut self, path: &str, mode: u32) {
        self.parents(path);
        self.entries
            .insert(path.to_string(), RootEntry::Dir { mode });
    }

    /// The bytes of host file `host` (links followed: ldd names a library
    /// by the path the loader searches) at `path`, with its permission bits.
    pub(super) fn host_file(&mut self, path: &str, host: &Path) -> Result<(), SandboxError> {
        let mode = std::fs::metadata(host)
            .map_err(|source| SandboxError::Io {
                path: host.display().to_string(),
                source,
            })?
            .permissions()
            .mode()
            & 0o777;
        self.file(path, read_file(host)?, mode);
        Ok(())
    }

    /// What every sandbox image holds besides its programs: `nobody` in
    /// `/etc/passwd` and `/etc/group`, and the empty `/work`, `/tmp` and
    /// `/run/mercury` the sandbox mounts over.
    pub(super) fn sandbox_base(&mut self) {
        self.file("etc/passwd", PASSWD.as_bytes().to_vec(), 0o644);
        self.file("etc/group", GROUP.as_bytes().to_vec(), 0o644);
        self.dir("work", 0o755);
        self.dir("tmp", 0o1777);
        self.dir("run/mercury", 0o755);
    }

    pub(super) fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        self.parents(path);
        self.entries
            .insert(path.to_string(), RootEntry::File { data, mode });
    }

    /// Parent directories get explicit 0755 entries so their mode does not
    /// depend on the engine's defaults.
    fn parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in parts.iter().take(parts.len().saturating_sub(1)) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.entries
                .entry(prefix.clone())
                .or_insert(RootEntry::Dir { mode: 0o755 });
        }
    }
}

/// Reads every input and returns the build context as tar bytes: the
/// Dockerfile at the top, the root filesystem under `rootfs/`.
fn build_context(mrctl: &Path) -> Result<Vec<u8>, SandboxError> {
    context_of(DOCKERFILE, &assemble_rootfs(mrctl)?)
}

/// The tar build context of `dockerfile` and `rootfs` (under `rootfs/`).
pub(super) fn context_of(dockerfile: &str, rootfs: &RootFs) -> Result<Vec<u8>, SandboxError> {
    let io_err = |source: io::Error| SandboxError::Io {
        path: "image build context (in memory)".into(),
        source,
    };

    let mut builder = tar::Builder::new(Vec::new());
    let mut header = new_header(tar::EntryType::Regular, 0o644, dockerfile.len() as u64);
    builder
        .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .map_err(io_err)?;
    let mut header = new_header(tar::EntryType::Directory, 0o755, 0);
    builder
        .append_data(&mut header, "rootfs/", io::empty())
        .map_err(io_err)?;
    for (path, entry) in &rootfs.entries {
        let name = format!("rootfs/{path}");
        match entry {
            RootEntry::Dir { mode } => {
                let mut header = new_header(tar::EntryType::Directory, *mode, 0);
                builder
                    .append_data(&mut header, format!("{name}/"), io::empty())
                    .map_err(io_err)?;
            }
            RootEntry::File { data, mode } => {
                let mut header = new_header(tar::EntryType::Regular, *mode, data.len() as u64);
                builder
                    .append_data(&mut header, &name, data.as_slice())
                    .map_err(io_err)?;
            }
            RootEntry::Link { target } => {
                let mut header = new_header(tar::EntryType::Symlink, 0o777, 0);
                builder
                    .append_link(&mut header, &name, target)
                    .map_err(io_err)?;
            }
        }
    }
    builder.into_inner().map_err(io_err)
}

fn new_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    // A fixed mtime keeps the context, and so the build cache, reproducible.
    header.set_mtime(0);
    header
}

fn assemble_rootfs(mrctl: &Path) -> Result<RootFs, SandboxError> {
    let mut rootfs = RootFs::default();
    let mut binaries = Vec::new();
    for (_, program) in TOOLS {
        binaries.push(host_tool(program).map_err(|source| SandboxError::Io {
            path: format!("{program} for the agent image"),
            source,
        })?);
    }
    refuse_multi_call(&binaries)?;
    for ((name, _), host) in TOOLS.iter().zip(&binaries) {
        // Real files, never links: a link named after a tool is how a
        // multi-call binary would be reached.
        rootfs.file(&format!("bin/{name}"), read_file(host)?, 0o755);
    }

    let mrctl_in_image = MRCTL_PATH_IN_IMAGE.trim_start_matches('/');
    rootfs.file(mrctl_in_image, read_file(mrctl)?, 0o755);
    binaries.push(mrctl.to_path_buf());
    // Dynamic binaries need their libraries and the loader at the very
    // absolute paths ldd printed: the loader path is baked into each binary
    // and the libraries are found through the loader's default dirs.
    let mut libraries = Vec::new();
    for binary in &binaries {
        for library in shared_libraries(binary)? {
            if !libraries.contains(&library) {
                libraries.push(library);
            }
        }
    }
    for library in libraries {
        let in_image = image_path(&library).ok_or_else(|| {
            SandboxError::Image(format!(
                "ldd listed a library path that cannot be placed in the image: {}",
                library.display()
            ))
        })?;
        rootfs.host_file(&in_image, &library)?;
    }
    rootfs.sandbox_base();
    Ok(rootfs)
}

/// On a host whose `/bin` is busybox or toybox (Alpine, some minimal
/// images), every tool would be the same multi-call binary under another
/// name, the very thing the image must not hold: refuse to build instead.
fn refuse_multi_call(binaries: &[PathBuf]) -> Result<(), SandboxError> {
    let mut seen: HashMap<PathBuf, &Path> = HashMap::new();
    for binary in binaries {
        let real = std::fs::canonicalize(binary).map_err(|source| SandboxError::Io {
            path: binary.display().to_string(),
            source,
        })?;
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let multi = name.contains("busybox") || name.contains("toybox");
        if let Some(first) = seen.insert(real.clone(), binary) {
            return Err(SandboxError::Image(format!(
                "{} and {} are the same file ({}): the agent image needs single-purpose tools, not a multi-call binary",
                first.display(),
                binary.display(),
                real.display()
            )));
        }
        if multi {
            return Err(SandboxError::Image(format!(
                "{} is {}, a multi-call binary: the agent image needs the single-purpose tools (Debian: coreutils, dash, grep, sed, findutils, hostname)",
                binary.display(),
                real.display()
            )));
        }
    }
    Ok(())
}

/// `nobody`'s home is `/tmp` (a tmpfs at run time) so tools that write under
/// `$HOME` work without writing into the workspace.
const PASSWD: &str = "nobody:x:65534:65534:nobody:/tmp:/bin/sh\n";
const GROUP: &str = "nobody:x:65534:\n";

pub(super) fn read_file(path: &Path) -> Result<Vec<u8>, SandboxError> {
    std::fs::read(path).map_err(|source| SandboxError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// An absolute host path as a relative path inside the rootfs; `None` for
/// anything that is not plain absolute components (no `..`, no `.`).
pub(super) fn image_path(path: &Path) -> Option<String> {
    let mut parts = Vec::new();
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return None;
    }
    for component in components {
        match component {
            Component::Normal(part) => parts.push(part.to_str()?.to_string()),
            _ => return None,
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

/// The shared libraries (and dynamic loader) `binary` loads, as ldd resolves
/// them on this host; empty for a static binary.
pub(super) fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, SandboxError> {
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| {
            SandboxError::Image(format!(
                "cannot run ldd to see whether {} is dynamically linked: {e}",
                binary.display()
            ))
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if is_static(&stdout) || is_static(&stderr) {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(SandboxError::Image(format!(
            "ldd {} failed ({}): {}",
            binary.display(),
            output.status,
            stderr.trim()
        )));
    }
    parse_ldd(&stdout).map_err(|missing| {
        SandboxError::Image(format!(
            "{} needs {missing}, which ldd could not find on this host",
            binary.display()
        ))
    })
}

fn is_static(ldd_output: &str) -> bool {
    ldd_output.contains("not a dynamic executable") || ldd_output.contains("statically linked")
}

/// Parses glibc ldd output: `name => /path (addr)` lines and the bare
/// `/loader (addr)` line; the vDSO has no file and is skipped. Each path is
/// resolved to the real file so the image gets bytes, not a dangling link.
/// Returns the name of the first library ldd reports as "not found" as error.
fn parse_ldd(stdout: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let candidate = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(name.trim().to_string());
                }
                rest.split_whitespace().next().unwrap_or_default()
            }
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if candidate.starts_with('/') {
            let path = PathBuf::from(candidate);
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real dynamically linked host binary stands in for mrctl: it makes the
    /// image carry libc and the loader, which is the harder case.
    pub(crate) fn stand_in_mrctl() -> PathBuf {
        std::fs::canonicalize("/usr/bin/true").expect("coreutils true exists on the test host")
    }

    #[test]
    fn parse_ldd_lists_libraries_and_loader_but_not_vdso() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f88)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f88)\n";
        let paths = parse_ldd(out).expect("parses");
        assert_eq!(
            paths,
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn parse_ldd_reports_a_missing_library() {
        let out = "\tlibfoo.so.1 => not found\n";
        assert_eq!(parse_ldd(out), Err("libfoo.so.1".to_string()));
    }

    #[test]
    fn dynamic_true_has_libc_and_loader() {
        let libs = shared_libraries(&stand_in_mrctl()).expect("ldd true");
        assert!(libs.iter().any(|p| p.to_string_lossy().contains("libc.so")));
        assert!(libs
            .iter()
            .any(|p| p.to_string_lossy().contains("ld-linux")));
    }

    #[test]
    fn a_multi_call_binary_under_tool_names_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let multi = dir.path().join("busybox");
        std::fs::write(&multi, b"multi").expect("write");
        let cat = dir.path().join("cat");
        std::os::unix::fs::symlink(&multi, &cat).expect("link");
        let err = refuse_multi_call(&[cat]).expect_err("busybox as cat");
        assert!(err.to_string().contains("multi-call"), "{err}");

        let one = dir.path().join("one");
        std::fs::write(&one, b"x").expect("write");
        let two = dir.path().join("two");
        std::os::unix::fs::symlink(&one, &two).expect("link");
        let err = refuse_multi_call(&[one.clone(), two]).expect_err("one file, two names");
        assert!(err.to_string().contains("same file"), "{err}");

        let other = dir.path().join("other");
        std::fs::write(&other, b"y").expect("write");
        refuse_multi_call(&[one, other]).expect("two distinct files");
        let tools: Vec<PathBuf> = TOOLS
            .iter()
            .map(|(_, p)| host_tool(p).expect("tool"))
            .collect();
        refuse_multi_call(&tools).expect("this host's tools are single-purpose");
    }

    #[test]
    fn image_path_refuses_relative_and_dotted_paths() {
        assert_eq!(
            image_path(Path::new("/lib/x/libc.so.6")).as_deref(),
            Some("lib/x/libc.so.6")
        );
        assert_eq!(image_path(Path::new("lib/libc.so.6")), None);
        assert_eq!(image_path(Path::new("/lib/../etc/shadow")), None);
        assert_eq!(image_path(Path::new("/")), None);
    }

    #[test]
    fn tag_is_content_addressed_and_stable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"one").expect("write a");
        std::fs::write(&b, b"two").expect("write b");
        let first = agent_image_tag("0.1.0", &a).expect("tag");
        assert_eq!(first, agent_image_tag("0.1.0", &a).expect("tag again"));
        assert_ne!(first, agent_image_tag("0.1.0", &b).expect("tag of b"));
        let (repo, tag) = first.split_once(':').expect("has a tag");
        assert_eq!(repo, IMAGE_REPOSITORY);
        let hash = tag.strip_prefix("0.1.0-").expect("version prefix");
        assert_eq!(hash.len(), 12);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));

        std::fs::write(&a, b"one!").expect("rewrite a");
        assert_ne!(
            first,
            agent_image_tag("0.1.0", &a).expect("tag after change")
        );
        assert!(agent_image_tag("0.1.0", &dir.path().join("missing")).is_err());
        assert!(agent_image_tag("+weird/ver", &a)
            .expect("tag")
            .starts_with("mercury-agent:_weird_ver-"));
        assert!(agent_image_tag("-dash", &a)
            .expect("tag")
            .starts_with("mercury-agent:v-dash-"));
    }

    #[test]
    fn context_holds_dockerfile_tools_mrctl_libraries_and_users_and_no_link() {
        let bytes = build_context(&stand_in_mrctl()).expect("context");
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut seen: HashMap<String, (tar::EntryType, Option<String>)> = HashMap::new();
        for entry in archive.entries().expect("entries") {
            let entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let link = entry
                .link_name()
                .expect("link")
                .map(|l| l.to_string_lossy().into_owned());
            seen.insert(
                path.trim_end_matches('/').to_string(),
                (entry.header().entry_type(), link),
            );
        }
        assert!(seen.contains_key("Dockerfile"));
        for (name, _) in TOOLS {
            let (kind, link) = &seen[&format!("rootfs/bin/{name}")];
            assert_eq!(*kind, tar::EntryType::Regular, "{name}");
            assert_eq!(link, &None, "{name}");
        }
        let bin: Vec<&String> = seen
            .keys()
            .filter(|k| k.starts_with("rootfs/bin/"))
            .collect();
        assert_eq!(bin.len(), TOOLS.len(), "{bin:?}");
        assert!(
            seen.values()
                .all(|(kind, _)| *kind != tar::EntryType::Symlink),
            "the image holds no link"
        );
        assert_eq!(
            seen["rootfs/usr/local/bin/mrctl"].0,
            tar::EntryType::Regular
        );
        assert!(seen
            .keys()
            .any(|k| k.starts_with("rootfs/lib") && k.contains("libc.so")));
        for dir in ["rootfs/work", "rootfs/tmp", "rootfs/run/mercury"] {
            assert_eq!(seen[dir].0, tar::EntryType::Directory, "{dir}");
        }
        assert!(seen.contains_key("rootfs/etc/passwd"));
        assert!(seen.contains_key("rootfs/etc/group"));
    }

    #[tokio::test]
    async fn ensure_builds_once_then_reuses_the_image() {
        let docker = bollard::Docker::connect_with_local_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("a Docker engine must answer for these tests");
        let tag = agent_image_tag("test", &stand_in_mrctl()).expect("tag");
        let image = ensure_agent_image(&docker, &tag, &stand_in_mrctl())
            .await
            .expect("image");
        assert_eq!(image, tag);
        let inspect = docker.inspect_image(&image).await.expect("inspect image");
        let config = inspect.config.expect("image config");
        assert_eq!(config.user.as_deref(), Some("65534:65534"));
        assert_eq!(config.working_dir.as_deref(), Some("/work"));
        let created = inspect.created.clone();
        // Asking again must not rebuild: same image, same creation time.
        ensure_agent_image(&docker, &tag, &stand_in_mrctl())
            .await
            .expect("image again");
        let again = docker.inspect_image(&image).await.expect("inspect again");
        assert_eq!(again.created, created);
        assert_eq!(again.id, inspect.id);
    }

    #[tokio::test]
    async fn build_with_a_missing_binary_is_an_error_not_an_image() {
        let docker = bollard::Docker::connect_with_local_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("a Docker engine must answer for these tests");
        let err = build_agent_image(
            &docker,
            "mercury-agent:never-built",
            Path::new("/nonexistent/mrctl"),
        )
        .await
        .expect_err("missing mrctl must fail");
        assert!(err.to_string().contains("/nonexistent/mrctl"), "{err}");
    }

    #[tokio::test]
    async fn a_failing_build_returns_image_error_with_the_log_tail() {
        let docker = bollard::Docker::connect_with_local_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("a Docker engine must answer for these tests");
        let dockerfile = "FROM scratch\nCOPY no-such-file /\n";
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = new_header(tar::EntryType::Regular, 0o644, dockerfile.len() as u64);
        builder
            .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
            .expect("append");
        let context = builder.into_inner().expect("tar");
        let tag = "mercury-agent:test-broken-build";
        let err = build_from_context(&docker, tag, context)
            .await
            .expect_err("the build must fail");
        match &err {
            SandboxError::Image(message) => {
                assert!(message.contains(tag), "{message}");
                assert!(message.contains("no-such-file"), "{message}");
                assert!(message.contains("COPY"), "log tail missing: {message}");
            }
            other => panic!("expected SandboxError::Image, got {other:?}"),
        }
        assert!(!image_exists(&docker, tag).await.expect("inspect"));
    }
}
