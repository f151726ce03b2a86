//! The content half of `mercury shadow diff`: the text of the files a
//! rehearsal is usually about (`AGENTS.md`, `MEMORY.md`, `knowledge/`),
//! kept aside by the snapshot (`shadow/baseline-text.json`), and a line diff
//! of each against the shadow's file now.
//!
//! Must never: open a workspace path but through [`WorkspaceRoot`] (no
//! symlink followed), keep a file larger than [`MAX_FILE_BYTES`] or more
//! than [`MAX_TOTAL_BYTES`] in all, or print more than [`MAX_DIFF_LINES`]
//! lines for one file.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::{io_err, ShadowError, ShadowResult};
use crate::workspace::safe::WorkspaceRoot;

pub const BASELINE_TEXT: &str = "shadow/baseline-text.json";
/// A file above this is listed by the diff, not diffed.
pub const MAX_FILE_BYTES: u64 = 256 << 10;
/// What the snapshot keeps aside in all.
pub const MAX_TOTAL_BYTES: u64 = 8 << 20;
/// Lines of one file's diff.
pub const MAX_DIFF_LINES: usize = 200;
/// Above this many lines on a side, no line diff is computed.
const MAX_LINES: usize = 2_000;

/// (space, path) → text.
pub type Texts = BTreeMap<String, BTreeMap<String, String>>;

/// Whether a workspace path's text is kept and diffed.
pub fn is_diffed(path: &str) -> bool {
    matches!(path, "AGENTS.md" | "MEMORY.md") || path.starts_with("knowledge/")
}

/// The text of `space/path` under `spaces_dir`: `None` when it is missing,
/// not a regular file, larger than [`MAX_FILE_BYTES`] or not UTF-8.
pub fn read_text(spaces_dir: &Path, space: &str, path: &str) -> Option<String> {
    let root = WorkspaceRoot::open(spaces_dir).ok()?;
    let ws = root.open_dir(space).ok()?;
    let file = ws.open_file(path).ok()?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut buf).ok()?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return None;
    }
    String::from_utf8(buf).ok()
}

/// The texts a snapshot keeps, offered in any order as the copy meets the
/// files (issue 32: each file is read once, by the copy) and kept as if
/// they had been read in (space, path) order: the longest run of that order
/// within [`MAX_TOTAL_BYTES`], the first text past the cap and everything
/// after it left out. At most the cap plus one file is held at a time.
#[derive(Debug, Default)]
pub struct TextKeeper {
    kept: BTreeMap<(String, String), String>,
    total: u64,
    /// The first (space, path) left out for the cap: nothing from there on
    /// is kept.
    cutoff: Option<(String, String)>,
}

impl TextKeeper {
    /// `text` of a diffed regular file (the caller checks [`is_diffed`]):
    /// kept unless it is over [`MAX_FILE_BYTES`], not UTF-8, or past the cap.
    pub fn offer(&mut self, space: &str, path: &str, bytes: Vec<u8>) {
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return;
        }
        let Ok(text) = String::from_utf8(bytes) else {
            return;
        };
        self.keep((space.to_owned(), path.to_owned()), text);
    }

    /// A text already checked, under its (space, path), within the cap.
    fn keep(&mut self, key: (String, String), text: String) {
        if self.cutoff.as_ref().is_some_and(|c| key >= *c) {
            return;
        }
        self.total += text.len() as u64;
        self.kept.insert(key, text);
        // Over the cap: the last ones in order go, and with them everything after.
        while self.total > MAX_TOTAL_BYTES {
            let Some((k, t)) = self.kept.pop_last() else {
                break;
            };
            self.total -= t.len() as u64;
            self.cutoff = Some(k);
        }
    }

    /// Takes in `other`'s texts (of other workspaces of the same snapshot,
    /// kept by another thread's copy) as if they had all been offered to
    /// this keeper: what `other` left out for the cap is left out here too,
    /// since everything before it in order already held more than the cap.
    pub fn absorb(&mut self, other: TextKeeper) {
        if let Some(cut) = other.cutoff {
            if self.cutoff.as_ref().is_none_or(|c| cut < *c) {
                let dropped = self.kept.split_off(&cut);
                self.total -= dropped.values().map(|t| t.len() as u64).sum::<u64>();
                self.cutoff = Some(cut);
            }
        }
        for (key, text) in other.kept {
            self.keep(key, text);
        }
    }

    pub(super) fn into_texts(self) -> Texts {
        let mut out = Texts::new();
        for ((space, path), text) in self.kept {
            out.entry(space).or_default().insert(path, text);
        }
        out
    }
}

/// Writes the texts kept while the snapshot copied its workspaces to
/// `<dir>/shadow/baseline-text.json`.
pub fn write_baseline_text(dir: &Path, texts: TextKeeper) -> ShadowResult<()> {
    let out = texts.into_texts();
    let json = serde_json::to_string(&out).map_err(|e| ShadowError::Invalid(e.to_string()))?;
    let p = dir.join(BASELINE_TEXT);
    crate::workspace::data_dir::private_file(&p)
        .and_then(|mut f| std::io::Write::write_all(&mut f, json.as_bytes()))
        .map_err(io_err(format!("writing {}", p.display())))
}

/// The texts the snapshot kept; `None` for a snapshot taken before they were.
pub fn read_baseline_text(dir: &Path) -> ShadowResult<Option<Texts>> {
    let p = dir.join(BASELINE_TEXT);
    match std::fs::read_to_string(&p) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ShadowError::Invalid(format!("{}: {e}", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("reading {}", p.display()))(e)),
    }
}

/// The changed lines from `before` to `after`, `- ` removed and `+ ` added,
/// in file order, each after a `@@ line N` naming where it starts in
/// `after`; at most [`MAX_DIFF_LINES`], then one line saying how many more.
pub fn line_diff(before: &str, after: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    if a.len() > MAX_LINES || b.len() > MAX_LINES {
        return vec![format!(
            "(too long to diff line by line: {} lines before, {} after)",
            a.len(),
            b.len()
        )];
    }
    // Longest common subsequence, from the ends, so the walk goes forwards.
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[at(i, j)] = if a[i] == b[j] {
                lcs[at(i + 1, j + 1)] + 1
            } else {
                lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
            };
        }
    }
    let mut out = Vec::new();
    let mut changed = 0usize;
    let (mut i, mut j) = (0, 0);
    let mut in_hunk = false;
    let push = |out: &mut Vec<String>, line: String, changed: &mut usize| {
        *changed += 1;
        if out.len() < MAX_DIFF_LINES {
            out.push(line);
        }
    };
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
            in_hunk = false;
            continue;
        }
        if !in_hunk {
            if out.len() < MAX_DIFF_LINES {
                out.push(format!("@@ line {}", j + 1));
            }
            in_hunk = true;
        }
        if j == m || (i < n && lcs[at(i + 1, j)] >= lcs[at(i, j + 1)]) {
            push(&mut out, format!("- {}", a[i]), &mut changed);
            i += 1;
        } else {
            push(&mut out, format!("+ {}", b[j]), &mut changed);
            j += 1;
        }
    }
    let shown = out.iter().filter(|l| !l.starts_with("@@")).count();
    if changed > shown {
        out.push(format!("… {} more changed lines", changed - shown));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forty-one 200 KiB texts, one per space (the forty-first over the
    /// 8 MiB cap), then a short one after them.
    fn texts() -> Vec<(String, Vec<u8>)> {
        (0..42)
            .map(|i| {
                let len = if i < 41 { 200 << 10 } else { 10 };
                (format!("s{i:02}"), vec![b'a' + (i % 26) as u8; len])
            })
            .collect()
    }

    fn kept_keys(k: TextKeeper) -> Vec<String> {
        k.into_texts().into_keys().collect()
    }

    #[test]
    fn two_keepers_absorbed_keep_what_one_keeper_offered_everything_keeps() {
        let mut one = TextKeeper::default();
        // Offered out of order, as the copy meets the files.
        for (space, t) in texts().into_iter().rev() {
            one.offer(&space, "AGENTS.md", t);
        }
        let whole = kept_keys(one);
        let expected: Vec<String> = (0..40).map(|i| format!("s{i:02}")).collect();
        assert_eq!(
            whole, expected,
            "the first 40 fit; the short one after the cut is left out"
        );
        // Split two ways: interleaved (neither half over the cap), and the
        // large ones apart from the short one, whose keeper alone would keep
        // it: the other keeper's cut must reach it.
        let splits: [fn(usize) -> bool; 2] = [|i| i % 2 == 0, |i| i < 41];
        for first in splits {
            for swap in [false, true] {
                let (mut a, mut b) = (TextKeeper::default(), TextKeeper::default());
                for (i, (space, t)) in texts().into_iter().enumerate() {
                    let k = if first(i) != swap { &mut a } else { &mut b };
                    k.offer(&space, "AGENTS.md", t);
                }
                a.absorb(b);
                assert_eq!(kept_keys(a), whole, "swapped: {swap}");
            }
        }
    }

    #[test]
    fn a_line_diff_names_where_each_change_starts() {
        let before = "# Agent\nBe brief.\nAnswer in English.\n";
        let after = "# Agent\nBe brief and kind.\nAnswer in English.\nSign with -- M\n";
        assert_eq!(
            line_diff(before, after),
            vec![
                "@@ line 2",
                "- Be brief.",
                "+ Be brief and kind.",
                "@@ line 4",
                "+ Sign with -- M",
            ]
        );
        assert!(line_diff("same\n", "same\n").is_empty());
        assert_eq!(line_diff("", "new\n"), vec!["@@ line 1", "+ new"]);
    }

    #[test]
    fn a_long_diff_is_cut_and_says_how_much_is_left() {
        let after: String = (0..300).map(|i| format!("line {i}\n")).collect();
        let d = line_diff("", &after);
        assert_eq!(d.len(), MAX_DIFF_LINES + 1);
        assert_eq!(d.last().unwrap(), "… 101 more changed lines");
        let huge: String = (0..MAX_LINES + 1).map(|i| format!("{i}\n")).collect();
        assert!(line_diff(&huge, "x")[0].starts_with("(too long to diff"));
    }

    #[test]
    fn only_the_files_a_rehearsal_is_about_are_kept() {
        assert!(is_diffed("AGENTS.md") && is_diffed("MEMORY.md") && is_diffed("knowledge/faq.md"));
        assert!(!is_diffed("notes/AGENTS.md") && !is_diffed("big.bin"));
    }
}
