//! A session's stand-in for the host's API socket: a socket of its own on a
//! small tmpfs, relaying every connection to the host's socket byte for byte.
//!
//! Why: a session gets the socket by a bind mount, and every mountinfo that
//! can see a bind (the container's, bubblewrap's) shows the bound file's
//! path inside its filesystem. Bound directly, the host's socket would name
//! the data dir to every turn. The stand-in lives at the root of a tmpfs
//! mounted for it (its path there is `/api.sock`); where the host may not
//! mount, it lives in a fresh directory under the system temp dir, which
//! names nothing of the data dir either.
//!
//! A host killed mid-session leaves its relays behind; they carry the
//! instance id in their name, and [`sweep_relays`] at the next start of
//! that instance (one host per data dir: the lock) unmounts and removes them.
//!
//! Must never: connect anywhere but the host socket it was given, outlive
//! its session (dropping it stops accepting, unmounts and removes), or
//! sweep another instance's relay.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::SandboxError;

/// The tmpfs only holds one socket inode.
const TMPFS_OPTIONS: &str = "size=16k,nr_inodes=8,mode=0755";

#[derive(Debug)]
pub(crate) struct SocketRelay {
    dir: PathBuf,
    socket: PathBuf,
    mounted: bool,
    accept: tokio::task::JoinHandle<()>,
}

impl SocketRelay {
    /// Starts relaying connections on a fresh socket to `host_socket`, for a
    /// session of instance `instance_id`.
    pub(crate) fn start(host_socket: &Path, instance_id: &str) -> Result<Self, SandboxError> {
        let io = |what: &str, source: std::io::Error| SandboxError::Io {
            path: what.to_owned(),
            source,
        };
        let dir = tempfile::Builder::new()
            .prefix(&prefix_of(instance_id))
            .tempdir()
            .map_err(|e| io("a directory for the session's API socket", e))?
            .keep();
        let mounted = mount_tmpfs(&dir).is_ok();
        let socket = dir.join("api.sock");
        let listener = match tokio::net::UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                cleanup(&dir, mounted);
                return Err(io(&socket.display().to_string(), e));
            }
        };
        // Who may connect is the session's own business (the token decides).
        if let Err(e) = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)) {
            cleanup(&dir, mounted);
            return Err(io(&socket.display().to_string(), e));
        }
        let target = host_socket.to_owned();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inside, _)) = listener.accept().await else {
                    // Out of descriptors, say: let the session's peers wait.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let target = target.clone();
                tokio::spawn(async move {
                    match tokio::net::UnixStream::connect(&target).await {
                        Ok(mut host) => {
                            let _ = tokio::io::copy_bidirectional(&mut inside, &mut host).await;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "the session's API socket cannot reach the host's");
                        }
                    }
                });
            }
        });
        Ok(Self {
            dir,
            socket,
            mounted,
            accept,
        })
    }

    /// The socket to bind into the session.
    pub(crate) fn path(&self) -> &Path {
        &self.socket
    }
}

impl Drop for SocketRelay {
    fn drop(&mut self) {
        self.accept.abort();
        cleanup(&self.dir, self.mounted);
    }
}

/// `mercury-<kind>-<instance>-`: how a host names what it keeps of one
/// instance under the system temp dir (`sock`: the relays, `warm`: the
/// warm pool's tmpfs), so a later start finds a killed host's by name.
pub(crate) fn temp_prefix(kind: &str, instance_id: &str) -> String {
    let id: String = instance_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    format!("mercury-{kind}-{id}-")
}

fn prefix_of(instance_id: &str) -> String {
    temp_prefix("sock", instance_id)
}

/// The directories under the system temp dir whose names start with
/// `prefix` (a killed host's, by [`temp_prefix`]).
pub(crate) fn temp_dirs(prefix: &str) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(std::env::temp_dir())? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(prefix) && entry.file_type()?.is_dir() {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// Unmounts and removes the relays a killed host of `instance_id` left.
/// Returns how many there were.
pub fn sweep_relays(instance_id: &str) -> std::io::Result<usize> {
    let dirs = temp_dirs(&prefix_of(instance_id))?;
    for dir in &dirs {
        cleanup(dir, true);
    }
    Ok(dirs.len())
}

fn cleanup(dir: &Path, mounted: bool) {
    if mounted {
        if let Ok(c) = CString::new(dir.as_os_str().as_bytes()) {
            // SAFETY: a valid path; MNT_DETACH so a session still holding
            // its bind does not keep the host from going on.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn mount_tmpfs(dir: &Path) -> std::io::Result<()> {
    let c = |s: &[u8]| CString::new(s).map_err(std::io::Error::other);
    let (src, tgt, fs, data) = (
        c(b"tmpfs")?,
        c(dir.as_os_str().as_bytes())?,
        c(b"tmpfs")?,
        c(TMPFS_OPTIONS.as_bytes())?,
    );
    // SAFETY: valid NUL-terminated strings; the result is checked.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_reaches_the_host_socket_and_the_relay_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host.sock");
        let listener = tokio::net::UnixListener::bind(&host).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let relay = SocketRelay::start(&host, "relaytest0000001").unwrap();
        let shown = relay.path().display().to_string();
        assert!(!shown.contains(&t.path().display().to_string()), "{shown}");
        let mut c = tokio::net::UnixStream::connect(relay.path()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        server.await.unwrap();
        let dir = relay.path().parent().unwrap().to_owned();
        drop(relay);
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn the_sweep_removes_this_instances_leftovers_and_spares_the_others() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host.sock");
        let _listener = tokio::net::UnixListener::bind(&host).unwrap();
        let mine = SocketRelay::start(&host, "relaytest0000002").unwrap();
        let other = SocketRelay::start(&host, "relaytest0000003").unwrap();
        let (mine_dir, other_dir) = (
            mine.path().parent().unwrap().to_owned(),
            other.path().parent().unwrap().to_owned(),
        );
        // As if the host had been SIGKILLed: nothing dropped.
        std::mem::forget(mine);
        assert_eq!(sweep_relays("relaytest0000002").unwrap(), 1);
        assert!(!mine_dir.exists());
        assert!(other_dir.exists());
        drop(other);
        assert!(!other_dir.exists());
    }
}
