//! `BaselineTap`: what the snapshot learns of its workspaces while it copies
//! them (issue 32: each file read once): every file's hash, by the rule of
//! [`super::diff::tree_hashes`], and the texts the diff keeps.
//!
//! The hashing and the keeping run on a thread of their own, fed the copy's
//! buffers through a bounded channel: on a file system that does not wait on
//! a disk, SHA-256 of the workspaces took as long as the whole copy, and the
//! copy's thread did both one after the other. The hash is the files API's
//! own ([`ContentHash`]): `shadow promote` sends a baseline hash as
//! `If-Match` to the live host.
//!
//! The copy reads into the tap's buffers and hands them over, so no byte is
//! copied to reach the hasher, and a file goes over in one piece when it
//! fits (one wake-up of the hasher per file).
//!
//! Must never: let the copy's memory grow with the tree (at most
//! [`IN_FLIGHT`] pieces wait for the hasher; the copy waits when they do),
//! or answer a baseline the hasher did not finish.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use super::diff::{link_hash, TreeHashes};
use super::text_diff::TextKeeper;
use super::{ShadowError, ShadowResult};
use crate::workspace::files::ContentHash;

/// Pieces the copy may hand over before it waits for the hasher: enough to
/// ride out a short stall of either side.
const IN_FLIGHT: usize = 4;

/// Chunks in one piece at most: a file is handed over in one piece when it
/// fits (one wake-up of the hasher per file, not one per chunk and mark),
/// and a larger one streams in pieces of this many, so what waits is
/// bounded by [`IN_FLIGHT`] pieces of this many chunks.
const PIECE_CHUNKS: usize = 4;

/// What the tap gathered: the baseline's hashes and kept texts.
#[derive(Default)]
pub struct Baseline {
    pub hashes: TreeHashes,
    pub texts: TextKeeper,
}

impl Baseline {
    /// Takes in what another tap of the same copy gathered (other
    /// workspaces, copied by another thread).
    pub fn absorb(&mut self, other: Baseline) {
        self.hashes.extend(other.hashes);
        self.texts.absorb(other.texts);
    }
}

/// Part of one file's bytes: the first piece names the file, the last
/// closes it (one piece may be both).
#[derive(Default)]
struct Piece {
    starts: Option<String>,
    chunks: Vec<(Vec<u8>, usize)>,
    ends: bool,
}

enum Job {
    Space(String),
    Piece(Piece),
    /// A link's path and its hash (of its target text), taken on the copy's
    /// side: a few bytes.
    Link(String, String),
}

/// The copy's side: hands every file's chunks to the hasher thread. Its
/// baseline is [`BaselineTap::finish`]'s; dropping the tap without it (a
/// copy that failed) lets the thread end with nothing kept.
pub struct BaselineTap {
    jobs: SyncSender<Job>,
    /// Buffers the hasher is done with, read into again.
    spare: Receiver<Vec<u8>>,
    /// The piece being filled, of the file being copied.
    open: Option<Piece>,
    worker: JoinHandle<Baseline>,
}

impl BaselineTap {
    pub fn start() -> ShadowResult<Self> {
        let (jobs, inbox) = mpsc::sync_channel(IN_FLIGHT);
        let (give_back, spare) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("snapshot-hash".into())
            .spawn(move || hash_all(inbox, give_back))
            .map_err(super::io_err("starting the snapshot's hashing thread"))?;
        Ok(Self {
            jobs,
            spare,
            open: None,
            worker,
        })
    }

    /// The workspace the next files belong to (a directory of `spaces/`).
    pub fn space(&mut self, name: &str) {
        self.send(Job::Space(name.to_owned()));
    }

    /// Waits for the hasher to take every chunk handed to it; its baseline.
    pub fn finish(self) -> ShadowResult<Baseline> {
        let BaselineTap { jobs, worker, .. } = self;
        // Closing the channel is what ends the hasher's loop.
        drop(jobs);
        worker.join().map_err(|_| {
            ShadowError::Invalid("the snapshot's hashing stopped unexpectedly (a panic)".into())
        })
    }

    fn send(&mut self, job: Job) {
        // A hasher that is gone panicked: `finish` says so, and the
        // snapshot fails there; the copy need not stop early for it.
        let _ = self.jobs.send(job);
    }
}

impl crate::workspace::walk::CopyTap for BaselineTap {
    fn file(&mut self, rel: &str) {
        self.open = Some(Piece {
            starts: Some(rel.to_owned()),
            ..Piece::default()
        });
    }

    fn buffer(&mut self) -> Vec<u8> {
        self.spare.try_recv().unwrap_or_default()
    }

    fn bytes(&mut self, buf: Vec<u8>, len: usize) {
        let Some(piece) = &mut self.open else {
            return;
        };
        piece.chunks.push((buf, len));
        if piece.chunks.len() >= PIECE_CHUNKS {
            let full = std::mem::take(piece);
            self.send(Job::Piece(full));
        }
    }

    fn file_done(&mut self) {
        if let Some(mut piece) = self.open.take() {
            piece.ends = true;
            self.send(Job::Piece(piece));
        }
    }

    fn symlink(&mut self, rel: &str, target: &std::ffi::OsStr) {
        self.send(Job::Link(rel.to_owned(), link_hash(target)));
    }
}

/// The hasher thread: the jobs in the order the copy sent them.
fn hash_all(inbox: Receiver<Job>, give_back: mpsc::Sender<Vec<u8>>) -> Baseline {
    let mut out = Baseline::default();
    let mut space = String::new();
    // The file being hashed: its path, its hash so far, and its bytes so
    // far while it may still be a kept text.
    let mut file: Option<(String, ContentHash, Option<Vec<u8>>)> = None;
    for job in inbox {
        match job {
            Job::Space(name) => {
                out.hashes.entry(name.clone()).or_default();
                space = name;
            }
            Job::Piece(piece) => {
                if let Some(rel) = piece.starts {
                    let text = super::text_diff::is_diffed(&rel).then(Vec::new);
                    file = Some((rel, ContentHash::default(), text));
                }
                for (buf, len) in piece.chunks {
                    if let Some((_, hash, text)) = &mut file {
                        let chunk = buf.get(..len).unwrap_or(&buf);
                        hash.update(chunk);
                        if let Some(t) = text {
                            if (t.len() + chunk.len()) as u64 > super::text_diff::MAX_FILE_BYTES {
                                // Too large to diff: listed by its hash only.
                                *text = None;
                            } else {
                                t.extend_from_slice(chunk);
                            }
                        }
                    }
                    // The copy may be gone already (it failed): nothing to reuse.
                    let _ = give_back.send(buf);
                }
                if piece.ends {
                    if let Some((rel, hash, text)) = file.take() {
                        if let Some(t) = text {
                            out.texts.offer(&space, &rel, t);
                        }
                        out.hashes
                            .entry(space.clone())
                            .or_default()
                            .insert(rel, hash.finish());
                    }
                }
            }
            Job::Link(rel, hex) => {
                out.hashes
                    .entry(space.clone())
                    .or_default()
                    .insert(rel, hex);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::workspace::walk::CopyTap;

    /// What the copy does with one chunk: read into a buffer of the tap's
    /// (its own length), hand it over.
    fn feed(tap: &mut BaselineTap, part: &[u8]) {
        let mut buf = tap.buffer();
        buf.resize(part.len().max(buf.len()).max(8_192), 0xAA);
        buf[..part.len()].copy_from_slice(part);
        tap.bytes(buf, part.len());
    }

    fn sha_hex(bytes: &[u8]) -> String {
        base16ct::lower::encode_string(&Sha256::digest(bytes))
    }

    #[test]
    fn a_file_fed_in_chunks_hashes_as_its_whole_content_and_a_diffed_text_is_kept() {
        let mut tap = BaselineTap::start().expect("the hasher starts");
        tap.space("s1");
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        tap.file("data/blob.bin");
        // More pieces than the channel holds, so buffers come back for
        // reuse, each longer than what was read into it.
        for part in body.chunks(7_001) {
            feed(&mut tap, part);
        }
        tap.file_done();
        tap.file("AGENTS.md");
        feed(&mut tap, b"be ");
        feed(&mut tap, b"kind\n");
        tap.file_done();
        tap.space("s2");
        tap.symlink("link", std::ffi::OsStr::new("AGENTS.md"));
        let got = tap.finish().expect("the hasher finishes");
        let s1 = &got.hashes["s1"];
        assert_eq!(s1["data/blob.bin"], sha_hex(&body));
        assert_eq!(s1["AGENTS.md"], sha_hex(b"be kind\n"));
        assert_eq!(
            got.hashes["s2"]["link"],
            link_hash(std::ffi::OsStr::new("AGENTS.md"))
        );
        assert_ne!(got.hashes["s2"]["link"], sha_hex(b"AGENTS.md"));
        let texts = got.texts.into_texts();
        assert_eq!(
            texts.get("s1").and_then(|m| m.get("AGENTS.md")),
            Some(&"be kind\n".to_owned())
        );
    }
}
