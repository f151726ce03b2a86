//! The shadow transcript: `<data_dir>/shadow/transcript.jsonl`, one JSON
//! line per outbound send a shadow host diverted (space, conversation, text,
//! time) and per outside-acting write it refused. The shadow's stand-in for
//! every real recipient, and what `mercury shadow diff` reports as sends.
//!
//! Must never: follow a symlink where it opens the file, rewrite a line
//! already written (it only appends), or be readable by another local user.

use std::io::{self, BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::data_dir::{private_dir, FILE_MODE};

/// What one transcript line records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum TranscriptKind {
    /// A send that would have gone to a platform (reply, `send`, digest).
    Send,
    /// A write that would have acted on the outside, refused.
    Refusal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TranscriptEntry {
    pub kind: TranscriptKind,
    /// Milliseconds since the epoch.
    pub time: i64,
    pub space: Option<String>,
    /// The conversation id in the shadow's database, when there is one.
    pub conversation: Option<i64>,
    /// The platform and its conversation a send was addressed to.
    pub platform: Option<String>,
    pub external_id: Option<String>,
    /// A send's text, or what a refusal would have done.
    pub text: String,
    /// Which path produced the line (`reply`, `send`, `digest`, `webhook`, …).
    pub source: String,
}

/// The transcript file of one data dir.
#[derive(Debug, Clone)]
pub struct Transcript {
    path: PathBuf,
}

impl Transcript {
    /// `<data_dir>/shadow/transcript.jsonl`.
    pub fn of(data_dir: &Path) -> Self {
        Self {
            path: data_dir.join("shadow").join("transcript.jsonl"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (the directory and file are created private).
    pub fn append(&self, entry: &TranscriptEntry) -> io::Result<()> {
        if let Some(dir) = self.path.parent() {
            private_dir(dir)?;
        }
        let mut line = serde_json::to_string(entry).map_err(io::Error::other)?;
        line.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)?;
        // One write of the whole line: concurrent appends never interleave.
        f.write_all(line.as_bytes())?;
        f.sync_data()
    }

    /// Every line so far (none when the file does not exist). A line that
    /// does not parse is an error: the transcript is the rehearsal's record.
    pub fn read_all(&self) -> io::Result<Vec<TranscriptEntry>> {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for (i, line) in io::BufReader::new(f).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            out.push(serde_json::from_str(&line).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} line {}: {e}", self.path.display(), i + 1),
                )
            })?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_reads_back_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let tr = Transcript::of(t.path());
        assert!(tr.read_all().unwrap().is_empty());
        let e = TranscriptEntry {
            kind: TranscriptKind::Send,
            time: 1,
            space: Some("a".into()),
            conversation: Some(3),
            platform: Some("test".into()),
            external_id: Some("c".into()),
            text: "hi\nthere".into(),
            source: "reply".into(),
        };
        tr.append(&e).unwrap();
        tr.append(&e).unwrap();
        assert_eq!(tr.read_all().unwrap(), vec![e.clone(), e]);
        let mode = std::fs::metadata(tr.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn never_follows_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("shadow")).unwrap();
        let target = t.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("shadow/transcript.jsonl")).unwrap();
        let tr = Transcript::of(t.path());
        let e = TranscriptEntry {
            kind: TranscriptKind::Refusal,
            time: 1,
            space: None,
            conversation: None,
            platform: None,
            external_id: None,
            text: "x".into(),
            source: "webhook".into(),
        };
        assert!(tr.append(&e).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
    }
}
