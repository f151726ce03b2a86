//! Drafted fixes (review roadmap, "drafted fixes"): for a finding of this
//! host's own bot whose layer is `agents_md` or `memory`, the intake asks
//! its model for a small edit of the space's `AGENTS.md` or `MEMORY.md`.
//! The edit is kept as the lines to remove and the lines to add (what
//! approval applies) and as a unified diff (what the owner reads), against
//! the sha256 of the file it was drafted from.
//!
//! The model sees the file's lines redacted with the space's identifiers
//! and numbered; it answers with line numbers and new lines, so nothing it
//! says is matched against text. The diff shows the real file's lines, so
//! it goes through the intake's gate like everything else the intake
//! writes: a draft that would hold an identifier is not kept.
//!
//! Applying is the caller's (the files API's audited write, `If-Match` on
//! [`Draft::base_hash`]): a file changed since the draft is refused whole.
//!
//! Must never: draft for a layer other than the two files, keep a draft the
//! gate has not passed, accept an edit outside the file's lines, or build
//! a text that is not the base with exactly the edit applied.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::review::judge::TargetLayer;

/// Lines of a file the drafter will look at; a longer file is not drafted.
pub(crate) const MAX_LINES: usize = 400;
/// Lines one draft may remove or add.
pub(crate) const MAX_CHANGED: usize = 20;
/// Characters of one added line.
pub(crate) const MAX_LINE_CHARS: usize = 400;
/// Lines of context around a hunk of the diff.
const CONTEXT: usize = 3;

/// What the draft changes: base lines to remove and lines to add after
/// base line `after` (0: before the first line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Edit {
    /// 1-based line numbers of the base, ascending, each once.
    pub remove: Vec<usize>,
    pub add: Vec<String>,
    pub after: usize,
}

/// A drafted change of one workspace file, as the triage and the ledger
/// keep it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Draft {
    /// `AGENTS.md` or `MEMORY.md`, at the workspace's top.
    pub file: String,
    /// The sha256 of the file the draft was made from, each hex digit
    /// written as a letter (`0`–`9` as `a`–`j`, `a`–`f` as `k`–`p`): a hex
    /// hash holds digit runs the identifier gate would take for a phone
    /// number. Empty when the file did not exist. See [`Draft::base_hex`].
    pub base_hash: String,
    pub edit: Edit,
    /// The unified diff, for the owner to read.
    pub diff: String,
    /// The model's one-line reason.
    pub reason: String,
    /// What approval did with it: `applied`, `stale` (the file changed
    /// since), or a sentence saying why it was not applied. `None` until
    /// an approval tried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// The file a finding of `layer` is drafted against.
pub(crate) fn file_of(layer: TargetLayer) -> Option<&'static str> {
    match layer {
        TargetLayer::AgentsMd => Some("AGENTS.md"),
        TargetLayer::Memory => Some("MEMORY.md"),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DraftError {
    #[error("the answer was not a JSON object with `remove`, `add` and `after`")]
    NotJson,
    #[error("the answer changes nothing")]
    Empty,
    #[error("line {0} is not a line of the file")]
    NoSuchLine(usize),
    #[error("the answer changes more than {MAX_CHANGED} lines")]
    TooMany,
    #[error(
        "an added line is longer than {MAX_LINE_CHARS} characters or holds a control character"
    )]
    BadLine,
}

/// The system prompt of a draft call.
pub(crate) fn instructions() -> &'static str {
    "You draft the smallest change to a chat bot's instruction file that fixes one \
     reviewed finding. The file is given with numbered lines; personal identifiers in it \
     are replaced by placeholders such as [PHONE_1]. Never write a placeholder or any \
     personal identifier in a line you add. Answer with one JSON object only: \
     {\"remove\": [line numbers to delete], \"add\": [\"new line\", ...], \
     \"after\": line number the new lines follow (0 for the top), \
     \"reason\": \"one sentence\"}."
}

/// The user prompt: the finding, then the file's redacted lines numbered.
pub(crate) fn prompt(file: &str, redacted_lines: &[String], finding: &str) -> String {
    let mut out = format!("Draft a change to {file} that fixes this finding.\n\n{finding}\n\n");
    out.push_str(&format!("{file}, {} lines:\n", redacted_lines.len()));
    for (i, l) in redacted_lines.iter().enumerate() {
        out.push_str(&format!("{:>4}| {l}\n", i + 1));
    }
    out
}

/// The edit and reason of a draft answer, checked against a base of
/// `lines` lines.
pub(crate) fn parse_answer(answer: &str, lines: usize) -> Result<(Edit, String), DraftError> {
    let start = answer.find('{').ok_or(DraftError::NotJson)?;
    let v: Value = serde_json::Deserializer::from_str(&answer[start..])
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .ok_or(DraftError::NotJson)?;
    let numbers = |key: &str| -> Result<Vec<usize>, DraftError> {
        match &v[key] {
            Value::Null => Ok(Vec::new()),
            Value::Array(a) => a
                .iter()
                .map(|n| {
                    n.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or(DraftError::NotJson)
                })
                .collect(),
            _ => Err(DraftError::NotJson),
        }
    };
    let mut remove = numbers("remove")?;
    remove.sort_unstable();
    remove.dedup();
    let add: Vec<String> = match &v["add"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|l| l.as_str().map(str::to_owned).ok_or(DraftError::NotJson))
            .collect::<Result<_, _>>()?,
        _ => return Err(DraftError::NotJson),
    };
    let after = match &v["after"] {
        Value::Null => lines,
        n => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(DraftError::NotJson)?,
    };
    let edit = Edit { remove, add, after };
    check(&edit, lines)?;
    let reason = v["reason"]
        .as_str()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_LINE_CHARS)
        .collect();
    Ok((edit, reason))
}

/// Whether `edit` fits a base of `lines` lines.
fn check(edit: &Edit, lines: usize) -> Result<(), DraftError> {
    if edit.remove.is_empty() && edit.add.is_empty() {
        return Err(DraftError::Empty);
    }
    if edit.remove.len() > MAX_CHANGED || edit.add.len() > MAX_CHANGED {
        return Err(DraftError::TooMany);
    }
    if let Some(bad) = edit.remove.iter().find(|n| **n == 0 || **n > lines) {
        return Err(DraftError::NoSuchLine(*bad));
    }
    if !edit.remove.windows(2).all(|w| w[0] < w[1]) {
        return Err(DraftError::NotJson);
    }
    if edit.after > lines {
        return Err(DraftError::NoSuchLine(edit.after));
    }
    if edit
        .add
        .iter()
        .any(|l| l.chars().count() > MAX_LINE_CHARS || l.chars().any(char::is_control))
    {
        return Err(DraftError::BadLine);
    }
    Ok(())
}

/// One line of the diff's walk over the base.
enum Op<'a> {
    Keep(&'a str),
    Remove(&'a str),
    Add(&'a str),
}

fn ops<'a>(base: &'a str, edit: &'a Edit) -> Vec<Op<'a>> {
    let mut out = Vec::new();
    let adds = || edit.add.iter().map(|l| Op::Add(l.as_str()));
    if edit.after == 0 {
        out.extend(adds());
    }
    for (i, line) in base.lines().enumerate() {
        let n = i + 1;
        out.push(if edit.remove.binary_search(&n).is_ok() {
            Op::Remove(line)
        } else {
            Op::Keep(line)
        });
        if n == edit.after {
            out.extend(adds());
        }
    }
    out
}

/// `base` with `edit` applied; a base that ended in a newline (or was
/// empty) keeps ending in one.
pub(crate) fn apply(base: &str, edit: &Edit) -> Result<String, DraftError> {
    check(edit, base.lines().count())?;
    let mut out = String::with_capacity(base.len() + 64);
    for op in ops(base, edit) {
        if let Op::Keep(l) | Op::Add(l) = op {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !base.is_empty() && !base.ends_with('\n') && out.ends_with('\n') {
        out.pop();
    }
    Ok(out)
}

/// The unified diff of `edit` on `base`, as `diff -u` would print it
/// (`--- a/FILE`, `+++ b/FILE`, hunks with three lines of context).
pub(crate) fn unified_diff(file: &str, base: &str, edit: &Edit) -> String {
    let ops = ops(base, edit);
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Op::Keep(_)))
        .map(|(i, _)| i)
        .collect();
    let mut out = format!("--- a/{file}\n+++ b/{file}\n");
    // Hunks: runs of changed ops whose gaps are at most twice the context.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        match hunks.last_mut() {
            Some((_, end)) if i <= *end + 2 * CONTEXT + 1 => *end = i,
            _ => hunks.push((i, i)),
        }
    }
    // Line numbers in the old and new files before each op.
    let mut old_at = Vec::with_capacity(ops.len());
    let mut new_at = Vec::with_capacity(ops.len());
    let (mut o, mut n) = (0usize, 0usize);
    for op in &ops {
        old_at.push(o);
        new_at.push(n);
        match op {
            Op::Keep(_) => {
                o += 1;
                n += 1;
            }
            Op::Remove(_) => o += 1,
            Op::Add(_) => n += 1,
        }
    }
    for (first, last) in hunks {
        let start = first.saturating_sub(CONTEXT);
        let end = (last + CONTEXT + 1).min(ops.len());
        let span = &ops[start..end];
        let old_len = span.iter().filter(|o| !matches!(o, Op::Add(_))).count();
        let new_len = span.iter().filter(|o| !matches!(o, Op::Remove(_))).count();
        // `diff -u` names the line before an empty side.
        let head = |at: usize, len: usize| if len == 0 { at } else { at + 1 };
        out.push_str(&format!(
            "@@ -{},{old_len} +{},{new_len} @@\n",
            head(old_at[start], old_len),
            head(new_at[start], new_len)
        ));
        for op in span {
            let (mark, l) = match op {
                Op::Keep(l) => (' ', l),
                Op::Remove(l) => ('-', l),
                Op::Add(l) => ('+', l),
            };
            out.push(mark);
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// What applying an approved draft came to, as the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DraftOutcome {
    Applied,
    /// The file is not the one the draft was made from: nothing written.
    Stale,
    /// Not applied, and why (a sentence of the host's own).
    Refused(&'static str),
}

impl DraftOutcome {
    /// The ledger's `outcome`.
    pub(crate) fn outcome(&self, file: &str) -> String {
        match self {
            DraftOutcome::Applied => "applied".into(),
            DraftOutcome::Stale => format!(
                "stale: {file} changed since the draft was made from it; nothing was written"
            ),
            DraftOutcome::Refused(why) => format!("not applied: {why}"),
        }
    }
}

/// A hex hash in the letters [`Draft::base_hash`] keeps it in.
pub(crate) fn hash_letters(hex: &str) -> String {
    hex.chars()
        .map(|c| match c.to_digit(16) {
            Some(d) => char::from(b'a' + d as u8),
            None => '?',
        })
        .collect()
}

impl Draft {
    /// The base's sha256 in hex, as the files API gives it; `None` when
    /// [`Draft::base_hash`] is not in its letters.
    pub(crate) fn base_hex(&self) -> Option<String> {
        self.base_hash
            .chars()
            .map(|c| {
                let d = u32::from(c).checked_sub(u32::from('a'))?;
                char::from_digit(d, 16).filter(|_| d < 16)
            })
            .collect()
    }

    /// The `If-Match` value the write goes under: the base's hash, or the
    /// files API's "must not exist" when the draft was made from no file.
    pub(crate) fn expect(&self) -> String {
        if self.base_hash.is_empty() {
            crate::workspace::files::ABSENT.to_owned()
        } else {
            self.base_hex().unwrap_or_default()
        }
    }

    /// The file's new text, from its text now (`None`: it does not exist)
    /// and that text's hash; [`DraftOutcome::Stale`] when they are not what the
    /// draft was made from.
    pub(crate) fn new_text(&self, now: Option<(&str, &str)>) -> Result<String, DraftOutcome> {
        let base = match now {
            None if self.base_hash.is_empty() => "",
            Some((text, hash)) if Some(hash) == self.base_hex().as_deref() => text,
            _ => return Err(DraftOutcome::Stale),
        };
        apply(base, &self.edit).map_err(|_| DraftOutcome::Stale)
    }
}

/// The draft's new text for the workspace `ws` as its file is now: the
/// file read through the safe-path function (at most `max` bytes) and
/// checked against the draft's base.
pub(crate) fn text_in(
    ws: &std::path::Path,
    draft: &Draft,
    max: usize,
) -> Result<String, DraftOutcome> {
    use crate::workspace::files::{self, FilesError};
    use crate::workspace::safe::SafePathError;
    let now = match files::read(ws, &draft.file, max) {
        Ok(c) => Some(c),
        Err(FilesError::Path(SafePathError::NotFound(_))) => None,
        Err(_) => return Err(DraftOutcome::Refused("the file could not be read")),
    };
    draft.new_text(now.as_ref().map(|c| (c.content.as_str(), c.hash.as_str())))
}

/// Applies `draft` to the workspace `ws`: [`text_in`], then the files
/// API's write under `If-Match` on the draft's base, within the quota.
/// The caller is the space's one writer (its actor, or a copy no host
/// serves).
pub(crate) fn apply_in(
    ws: &std::path::Path,
    draft: &Draft,
    max: usize,
    quota_mb: u64,
    limits: crate::workspace::walk::WalkLimits,
) -> DraftOutcome {
    use crate::workspace::files::{self, FilesError};
    let text = match text_in(ws, draft, max) {
        Ok(t) => t,
        Err(o) => return o,
    };
    match files::write(
        ws,
        &draft.file,
        text.as_bytes(),
        Some(&draft.expect()),
        quota_mb,
        limits,
    ) {
        Ok(_) => DraftOutcome::Applied,
        Err(FilesError::Stale { .. } | FilesError::StaleMissing(_) | FilesError::Exists { .. }) => {
            DraftOutcome::Stale
        }
        Err(_) => DraftOutcome::Refused("the write was refused (the workspace's quota or limits)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "# Family bot\nBe brief.\nAnswer in English.\nParis is not the capital of France.\nUse metric units.\nSign off politely.\nNo emojis.\nKeep lists short.\nBe kind.\n";

    #[test]
    fn review_draft_applies_exactly_the_edit() {
        let edit = Edit {
            remove: vec![4],
            add: vec!["Paris is the capital of France.".into()],
            after: 4,
        };
        let out = apply(BASE, &edit).unwrap();
        assert_eq!(
            out,
            BASE.replace(
                "Paris is not the capital of France.",
                "Paris is the capital of France."
            )
        );
        // At the top, at the end, and a base without its last newline.
        let top = Edit {
            remove: vec![],
            add: vec!["First.".into()],
            after: 0,
        };
        assert_eq!(apply("a\nb", &top).unwrap(), "First.\na\nb");
        let end = Edit {
            remove: vec![1],
            add: vec!["c".into()],
            after: 2,
        };
        assert_eq!(apply("a\nb\n", &end).unwrap(), "b\nc\n");
        assert_eq!(apply("", &top).unwrap(), "First.\n");
    }

    #[test]
    fn review_draft_refuses_an_edit_outside_the_file() {
        for (answer, err) in [
            (r#"{"remove": [10], "add": []}"#, DraftError::NoSuchLine(10)),
            (r#"{"remove": [0]}"#, DraftError::NoSuchLine(0)),
            (r#"{"add": ["x"], "after": 12}"#, DraftError::NoSuchLine(12)),
            (r#"{"remove": [], "add": []}"#, DraftError::Empty),
            (r#"{"add": ["a\nb"]}"#, DraftError::BadLine),
            (r#"{"remove": "all"}"#, DraftError::NotJson),
            ("no JSON here", DraftError::NotJson),
        ] {
            assert_eq!(parse_answer(answer, 9), Err(err), "{answer}");
        }
        let many: Vec<String> = (0..=MAX_CHANGED).map(|i| format!("\"l{i}\"")).collect();
        assert_eq!(
            parse_answer(&format!("{{\"add\": [{}]}}", many.join(",")), 9),
            Err(DraftError::TooMany)
        );
        // Duplicates are one removal; a missing `after` appends.
        let (e, reason) = parse_answer(
            r#"Here: {"remove": [4, 4], "add": ["ok"], "reason": "The line was wrong."}"#,
            9,
        )
        .unwrap();
        assert_eq!(
            (e.remove, e.after, reason.as_str()),
            (vec![4], 9, "The line was wrong.")
        );
    }

    #[test]
    fn review_draft_keeps_its_base_hash_in_letters_and_refuses_a_changed_base() {
        let hex = crate::workspace::files::hash_bytes(BASE.as_bytes());
        let d = Draft {
            file: "AGENTS.md".into(),
            base_hash: hash_letters(&hex),
            edit: Edit {
                remove: vec![2],
                add: vec![],
                after: 9,
            },
            diff: String::new(),
            reason: String::new(),
            outcome: None,
        };
        assert!(d.base_hash.chars().all(|c| ('a'..='p').contains(&c)));
        assert_eq!(d.base_hex().as_deref(), Some(hex.as_str()));
        assert_eq!(d.expect(), hex);
        assert_eq!(
            d.new_text(Some((BASE, &hex))).unwrap(),
            BASE.replace("Be brief.\n", "")
        );
        let other = crate::workspace::files::hash_bytes(b"changed");
        assert_eq!(
            d.new_text(Some(("changed", &other))),
            Err(DraftOutcome::Stale)
        );
        assert_eq!(d.new_text(None), Err(DraftOutcome::Stale));
        let fresh = Draft {
            base_hash: String::new(),
            ..d.clone()
        };
        assert_eq!(fresh.expect(), crate::workspace::files::ABSENT);
        assert_eq!(fresh.new_text(Some((BASE, &hex))), Err(DraftOutcome::Stale));
    }

    #[test]
    fn review_draft_diff_is_a_unified_diff() {
        let edit = Edit {
            remove: vec![4],
            add: vec!["Paris is the capital of France.".into()],
            after: 4,
        };
        assert_eq!(
            unified_diff("AGENTS.md", BASE, &edit),
            "--- a/AGENTS.md\n+++ b/AGENTS.md\n@@ -1,7 +1,7 @@\n # Family bot\n Be brief.\n \
             Answer in English.\n-Paris is not the capital of France.\n+Paris is the capital of France.\n \
             Use metric units.\n Sign off politely.\n No emojis.\n"
        );
        // Two changes far apart are two hunks; an empty file is `-0,0`.
        let two = Edit {
            remove: vec![1, 9],
            add: vec![],
            after: 9,
        };
        let d = unified_diff("AGENTS.md", BASE, &two);
        assert_eq!(
            d.matches("\n@@ ").count() + usize::from(d.starts_with("@@")),
            2,
            "{d}"
        );
        assert!(d.contains("@@ -1,4 +1,3 @@\n-# Family bot\n"), "{d}");
        assert!(d.contains("@@ -6,4 +5,3 @@\n Sign off politely.\n No emojis.\n Keep lists short.\n-Be kind.\n"), "{d}");
        let new = Edit {
            remove: vec![],
            add: vec!["Be brief.".into()],
            after: 0,
        };
        assert_eq!(
            unified_diff("MEMORY.md", "", &new),
            "--- a/MEMORY.md\n+++ b/MEMORY.md\n@@ -0,0 +1,1 @@\n+Be brief.\n"
        );
    }
}
