//! `mrctl bridge`: the inside half of the API of a sandbox on an engine
//! elsewhere (the host half is the docker backend's `bridge`). It listens
//! on the API socket path inside the container and carries each connection
//! made there as frames (`crate::sandbox::frames`) over its stdout, and the
//! host's answers back from its stdin.
//!
//! Must never: write anything but frames to stdout (it is the protocol),
//! or keep running once the host side is gone (stdin at its end).

use std::collections::HashMap;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::sandbox::frames::{self, Decoder};

/// Runs until the host closes stdin; the exit code is 2 when it cannot
/// start, 0 otherwise.
pub(super) async fn serve(listen: &Path) -> u8 {
    let _ = std::fs::remove_file(listen);
    let listener = match UnixListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mrctl bridge: cannot listen at {}: {e}", listen.display());
            return 2;
        }
    };
    let (to_host, mut outgoing) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(frame) = outgoing.recv().await {
            if stdout.write_all(&frame).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    if to_host
        .send(frames::encode(frames::READY, b""))
        .await
        .is_err()
    {
        return 2;
    }
    let mut stdin = tokio::io::stdin();
    let mut decoder = Decoder::default();
    let mut conns: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut next = 1u32;
    let mut buf = vec![0u8; frames::MAX_PAYLOAD];
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let conn = next;
                next = next.checked_add(1).unwrap_or(1);
                conns.insert(conn, frames::carry(conn, stream, to_host.clone()));
            }
            read = stdin.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                decoder.push(&buf[..n]);
                loop {
                    match decoder.next_frame() {
                        Ok(Some((conn, payload))) => {
                            let close = payload.is_empty();
                            if let Some(tx) = conns.get(&conn) {
                                if tx.send(payload).await.is_err() || close {
                                    conns.remove(&conn);
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("mrctl bridge: {e}");
                            writer.abort();
                            return 2;
                        }
                    }
                }
            }
        }
    }
    writer.abort();
    0
}
