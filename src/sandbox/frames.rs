//! The frames that carry a sandbox's API connections over one exec stream
//! (a sandbox on an engine elsewhere has no network and no host socket):
//! `[connection u32][length u32][payload]`, big-endian; length 0 closes the
//! connection's direction it travels in; connection 0 with length 0, sent
//! once by the container side, says its socket is listening.
//!
//! Must never: accept a frame longer than [`MAX_PAYLOAD`] (a hostile sandbox
//! must not make the host buffer without bound).

/// The largest payload of one frame.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// The connection id of the "listening" frame.
pub const READY: u32 = 0;

/// One frame's bytes.
pub fn encode(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Carries one connection of either side: what arrives on the returned
/// sender is written to `stream` (an empty payload half-closes it), and what
/// `stream` says goes to `to_peer` framed as `conn` (its end as an empty
/// frame). Each read is at most [`MAX_PAYLOAD`].
pub fn carry(
    conn: u32,
    stream: tokio::net::UnixStream,
    to_peer: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> tokio::sync::mpsc::Sender<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut read, mut write) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if bytes.is_empty() {
                let _ = write.shutdown().await;
                return;
            }
            if write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_peer.send(encode(conn, b"")).await;
                    return;
                }
                Ok(n) => {
                    if to_peer.send(encode(conn, &buf[..n])).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    tx
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a bridge frame of {0} bytes is longer than {MAX_PAYLOAD}")]
pub struct FrameTooLong(pub usize);

/// Collects bytes as they arrive and hands out whole frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(u32, Vec<u8>)>, FrameTooLong> {
        let Some(head) = self.buf.get(..8) else {
            return Ok(None);
        };
        let conn = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameTooLong(len));
        }
        if self.buf.len() < 8 + len {
            return Ok(None);
        }
        let payload = self.buf[8..8 + len].to_vec();
        self.buf.drain(..8 + len);
        Ok(Some((conn, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_come_out_whole_and_in_order() {
        let mut wire = encode(READY, b"");
        wire.extend(encode(7, b"GET / HTTP/1.1\r\n\r\n"));
        wire.extend(encode(9, &[1u8; 300]));
        wire.extend(encode(7, b""));
        for step in [1, 3, 8, 64, wire.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(step) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got,
                vec![
                    (READY, vec![]),
                    (7, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
                    (9, vec![1u8; 300]),
                    (7, vec![]),
                ],
                "chunks of {step}"
            );
        }
    }

    #[test]
    fn a_frame_claiming_more_than_the_limit_is_refused() {
        let mut d = Decoder::default();
        let mut head = 1u32.to_be_bytes().to_vec();
        head.extend_from_slice(&((MAX_PAYLOAD as u32) + 1).to_be_bytes());
        d.push(&head);
        assert_eq!(d.next_frame(), Err(FrameTooLong(MAX_PAYLOAD + 1)));
    }
}
