//! The API of a sandbox on an engine elsewhere: `mrctl bridge` listens at
//! [`CONTAINER_API_SOCKET`] inside the container and sends every connection
//! made there as frames (`crate::sandbox::frames`) over its exec's stdout;
//! this side opens one connection to the host's API socket per connection
//! inside and carries the bytes both ways. The run token still travels in
//! each request, so the host checks every call as it does a local one.
//!
//! Must never: connect anywhere but the host API socket it was given,
//! buffer more than one frame's worth per read, or outlive its session
//! (dropping the bridge ends its tasks; removing the container ends the exec).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::session::DockerSession;
use crate::sandbox::frames::{self, Decoder};
use crate::sandbox::{SandboxError, CONTAINER_API_SOCKET};

/// How long `mrctl bridge` may take to say its socket listens.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// The running bridge of one session.
#[derive(Debug)]
pub(crate) struct ApiBridge {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiBridge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DockerSession {
    /// Starts `mrctl bridge` in the container and carries its connections
    /// to `host_socket`; returns once the socket inside listens.
    pub(super) async fn bridge_api(mut self, host_socket: &Path) -> Result<Self, SandboxError> {
        let id = self.container().to_string();
        let config = CreateExecOptions {
            cmd: Some(vec![
                "mrctl".to_string(),
                "bridge".to_string(),
                "--listen".to_string(),
                CONTAINER_API_SOCKET.to_string(),
            ]),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let engine = |doing: &str, e: bollard::errors::Error| {
            SandboxError::Engine(format!("{doing} the API bridge in container {id}: {e}"))
        };
        let exec = self
            .docker
            .create_exec(&id, config)
            .await
            .map_err(|e| engine("creating", e))?;
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| engine("starting", e))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(SandboxError::Engine(format!(
                "the API bridge in container {id} started detached"
            )));
        };
        // Until the bridge says it listens, nothing else is read.
        let mut decoder = Decoder::default();
        let ready = async {
            loop {
                match output.next().await {
                    Some(Ok(LogOutput::StdOut { message })) => {
                        decoder.push(&message);
                        match decoder.next_frame() {
                            Ok(Some((frames::READY, _))) => return Ok(()),
                            Ok(Some((conn, _))) => {
                                return Err(format!(
                                    "a frame of connection {conn} before it listened"
                                ))
                            }
                            Ok(None) => {}
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => {
                        return Err(String::from_utf8_lossy(&message).trim().to_string())
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err("it ended before it listened".into()),
                }
            }
        };
        match tokio::time::timeout(READY_WITHIN, ready).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                return Err(SandboxError::Engine(format!(
                    "the API bridge in container {id} did not start: {why}"
                )))
            }
            Err(_) => {
                return Err(SandboxError::Engine(format!(
                    "the API bridge in container {id} did not listen within {READY_WITHIN:?}"
                )))
            }
        }
        let carry = Carry {
            host_socket: host_socket.to_path_buf(),
            container: id,
        };
        self.bridge = Some(ApiBridge {
            task: tokio::spawn(carry.run(decoder, output, input)),
        });
        Ok(self)
    }
}

struct Carry {
    host_socket: PathBuf,
    container: String,
}

impl Carry {
    async fn run<S, W>(self, mut decoder: Decoder, mut output: S, mut input: W)
    where
        S: futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // Every writer of frames into the container goes through one task.
        let (to_container, mut frames_in) = mpsc::channel::<Vec<u8>>(64);
        let writer = tokio::spawn(async move {
            while let Some(frame) = frames_in.recv().await {
                if input.write_all(&frame).await.is_err() {
                    return;
                }
            }
        });
        let mut conns: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
        'stream: while let Some(item) = output.next().await {
            let message = match item {
                Ok(LogOutput::StdOut { message }) => message,
                Ok(LogOutput::StdErr { message }) => {
                    tracing::warn!(container = %self.container, said = %String::from_utf8_lossy(&message).trim(), "the API bridge");
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(container = %self.container, error = %e, "the API bridge's stream ended");
                    break;
                }
            };
            decoder.push(&message);
            loop {
                let (conn, payload) = match decoder.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(container = %self.container, error = %e, "the API bridge sent a bad frame; it is stopped");
                        break 'stream;
                    }
                };
                if conn == frames::READY {
                    continue;
                }
                let close = payload.is_empty();
                let tx = match conns.entry(conn) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(_) if close => continue,
                    Entry::Vacant(v) => match UnixStream::connect(&self.host_socket).await {
                        Ok(stream) => v.insert(frames::carry(conn, stream, to_container.clone())),
                        Err(e) => {
                            tracing::warn!(container = %self.container, error = %e, "the API bridge cannot reach the host API");
                            let _ = to_container.send(frames::encode(conn, b"")).await;
                            continue;
                        }
                    },
                };
                if tx.send(payload).await.is_err() || close {
                    conns.remove(&conn);
                }
            }
        }
        writer.abort();
    }
}
