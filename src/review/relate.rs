//! Relate (M2.1): which known items of the operator's review directory a
//! finding is about. Known items are markdown files under
//! `<intake_dir>/ideas/`, `bugs/` and `landed/`: a title line (`# Title`,
//! or the first line), free text, and for a landed item a line
//! `deployed: true|false`. An item the intake wrote for a `new` finding also
//! carries `fingerprint: <space> <kind> <layer> <minhash>`.
//!
//! Ranking: an item whose fingerprint line is the same finding
//! ([`Fingerprint::same_finding`]) ranks first; the rest are ranked with
//! BM25 (the `bm25` crate, without its default tokenizer: the text goes
//! through [`fingerprint::words`], the same normalising as the fingerprint)
//! over title and text, queried with the finding's kind, layer, summary and
//! suggestion. A BM25 hit counts as a match only when it shares at least
//! [`MIN_SHARED_WORDS`] distinct normalised words with the query, so one
//! common word never relates a finding to an item.
//!
//! Must never: follow a symlink out of the intake directory, or read
//! anything there but `*.md` files of those three folders.

use std::collections::BTreeSet;
use std::path::Path;

use bm25::{Document, SearchEngineBuilder, Tokenizer};
use serde::Serialize;

use crate::review::fingerprint::{self, Fingerprint, MinHash};

/// Distinct normalised words a BM25 hit must share with the query.
pub(crate) const MIN_SHARED_WORDS: usize = 3;
/// Largest known-item file read.
pub(crate) const MAX_ITEM_BYTES: u64 = 256 * 1024;

/// Where a known item sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ItemKind {
    Idea,
    Bug,
    Landed,
}

impl ItemKind {
    pub(crate) const ALL: [ItemKind; 3] = [ItemKind::Idea, ItemKind::Bug, ItemKind::Landed];

    pub(crate) fn dir(self) -> &'static str {
        match self {
            ItemKind::Idea => "ideas",
            ItemKind::Bug => "bugs",
            ItemKind::Landed => "landed",
        }
    }
}

/// One known item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KnownItem {
    pub kind: ItemKind,
    /// Relative to the intake dir, e.g. `bugs/wrong-capital.md`.
    pub path: String,
    pub title: String,
    pub text: String,
    /// A landed item's `deployed:` line (None elsewhere or when absent).
    pub deployed: Option<bool>,
    pub fingerprint: Option<Fingerprint>,
}

impl KnownItem {
    pub(crate) fn parse(kind: ItemKind, path: String, body: &str) -> Self {
        let mut title = None;
        let mut deployed = None;
        let mut fp = None;
        for line in body.lines() {
            let t = line.trim();
            if title.is_none() && !t.is_empty() {
                title = Some(t.trim_start_matches('#').trim().to_owned());
            }
            if let Some(v) = t.strip_prefix("deployed:") {
                deployed = match v.trim() {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => deployed,
                };
            }
            if let Some(v) = t.strip_prefix("fingerprint:") {
                let parts: Vec<&str> = v.split_whitespace().collect();
                if let [space, k, layer, hash] = parts[..] {
                    if MinHash::from_hex(hash).is_some() {
                        fp = Some(Fingerprint {
                            space: space.to_owned(),
                            kind: k.to_owned(),
                            target_layer: layer.to_owned(),
                            summary_minhash: hash.to_owned(),
                        });
                    }
                }
            }
        }
        Self {
            kind,
            path,
            title: title.unwrap_or_default(),
            text: body.to_owned(),
            deployed: if kind == ItemKind::Landed {
                deployed
            } else {
                None
            },
            fingerprint: fp,
        }
    }
}

/// The `fingerprint:` line an item written for a finding carries.
pub(crate) fn fingerprint_line(fp: &Fingerprint) -> String {
    format!(
        "fingerprint: {} {} {} {}",
        fp.space, fp.kind, fp.target_layer, fp.summary_minhash
    )
}

/// Every known item under `intake_dir`, in path order. Missing folders are
/// empty; symlinks and files that are not UTF-8 or too large are skipped.
pub(crate) fn load_items(intake_dir: &Path) -> std::io::Result<Vec<KnownItem>> {
    let mut items = Vec::new();
    for kind in ItemKind::ALL {
        let dir = intake_dir.join(kind.dir());
        let read = match std::fs::read_dir(&dir) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut names: Vec<String> = read
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| n.ends_with(".md") && !n.starts_with('.'))
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_file() || meta.len() > MAX_ITEM_BYTES {
                continue;
            }
            let Ok(body) = std::fs::read_to_string(&path) else {
                continue;
            };
            items.push(KnownItem::parse(
                kind,
                format!("{}/{name}", kind.dir()),
                &body,
            ));
        }
    }
    Ok(items)
}

/// The fingerprint's normalising, as BM25's tokenizer.
#[derive(Debug, Default, Clone, Copy)]
struct Words;

impl Tokenizer for Words {
    fn tokenize(&self, input_text: &str) -> Vec<String> {
        fingerprint::words(input_text)
    }
}

/// Why an item matched.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MatchedBy {
    Fingerprint,
    Bm25,
}

/// One matched item, best first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Match {
    /// Index into the items given to [`relate`].
    #[serde(skip)]
    pub item: usize,
    pub path: String,
    pub by: MatchedBy,
    /// Fingerprint similarity (0 to 1) or BM25 score.
    pub score: f64,
}

/// The ranked known items over one intake's item set.
pub(crate) struct Ranker {
    engine: bm25::SearchEngine<usize, u32, Words>,
    items: Vec<KnownItem>,
    /// Per item, the distinct normalised words of the text it is indexed by.
    words: Vec<BTreeSet<String>>,
    /// Per item, its fingerprint's signature, decoded.
    signatures: Vec<Option<MinHash>>,
}

impl Ranker {
    pub(crate) fn new(items: Vec<KnownItem>) -> Self {
        let texts: Vec<String> = items
            .iter()
            .map(|it| format!("{}\n{}", it.title, it.text))
            .collect();
        let words = texts
            .iter()
            .map(|t| fingerprint::words(t).into_iter().collect())
            .collect();
        let signatures = items
            .iter()
            .map(|it| {
                it.fingerprint
                    .as_ref()
                    .and_then(|f| MinHash::from_hex(&f.summary_minhash))
            })
            .collect();
        let docs: Vec<Document<usize>> = texts
            .into_iter()
            .enumerate()
            .map(|(i, t)| Document::new(i, t))
            .collect();
        let engine =
            SearchEngineBuilder::<usize, u32, Words>::with_tokenizer_and_documents(Words, docs)
                .build();
        Self {
            engine,
            items,
            words,
            signatures,
        }
    }

    pub(crate) fn items(&self) -> &[KnownItem] {
        &self.items
    }

    /// The items a finding matches, best first: fingerprint matches, then
    /// BM25 hits sharing enough words.
    pub(crate) fn relate(&self, fp: &Fingerprint, query: &str) -> Vec<Match> {
        let mut out: Vec<Match> = Vec::new();
        let signature = MinHash::from_hex(&fp.summary_minhash);
        for (i, (it, sig)) in self.items.iter().zip(&self.signatures).enumerate() {
            let sim = match (&it.fingerprint, sig, &signature) {
                (Some(f), Some(a), Some(b)) if f.same_parts(fp) => Some(a.similarity(b)),
                _ => None,
            };
            if let Some(sim) = sim {
                if sim >= fingerprint::SAME_FINDING {
                    out.push(Match {
                        item: i,
                        path: it.path.clone(),
                        by: MatchedBy::Fingerprint,
                        score: sim,
                    });
                }
            }
        }
        out.sort_by(|a, b| b.score.total_cmp(&a.score));
        let query_words: BTreeSet<String> = fingerprint::words(query).into_iter().collect();
        for hit in self.engine.search(query, 10) {
            let i = hit.document.id;
            if out.iter().any(|m| m.item == i) {
                continue;
            }
            let (Some(it), Some(item_words)) = (self.items.get(i), self.words.get(i)) else {
                continue;
            };
            if query_words.intersection(item_words).count() >= MIN_SHARED_WORDS {
                out.push(Match {
                    item: i,
                    path: it.path.clone(),
                    by: MatchedBy::Bm25,
                    score: f64::from(hit.score),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, body: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }

    #[test]
    fn review_relate_ranks_known_items_with_bm25_and_fingerprints() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "bugs/reminders.md", "# Reminders are refused\n\nThe assistant refuses to set a reminder for appointments.\n");
        write(
            d,
            "ideas/recipes.md",
            "# Recipe cards\n\nShow recipes as cards with ingredients.\n",
        );
        write(d, "landed/units.md", "# Convert units\n\ndeployed: false\n\nThe assistant converts miles to kilometres in answers.\n");
        write(d, "landed/notes.txt", "not an item");
        let outside = tempfile::tempdir().unwrap();
        write(
            outside.path(),
            "secret.md",
            "# reminder reminder appointment refuses assistant",
        );
        std::os::unix::fs::symlink(outside.path().join("secret.md"), d.join("bugs/link.md"))
            .unwrap();
        let items = load_items(d).unwrap();
        let paths: Vec<&str> = items.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            ["ideas/recipes.md", "bugs/reminders.md", "landed/units.md"]
        );
        assert_eq!(items[2].deployed, Some(false));
        assert_eq!(items[1].title, "Reminders are refused");

        let ranker = Ranker::new(items);
        let fp = Fingerprint::new(
            "main",
            "unjustified_refusal",
            "agents_md",
            "Refused to set a reminder",
        );
        let m = ranker.relate(
            &fp,
            "unjustified refusal: the assistant refused to set a reminder for the appointment",
        );
        assert_eq!(
            m.first().map(|m| m.path.as_str()),
            Some("bugs/reminders.md"),
            "{m:?}"
        );
        assert_eq!(m[0].by, MatchedBy::Bm25);
        assert!(m.iter().all(|m| m.path != "ideas/recipes.md"));
        // One shared word is not a match.
        assert!(ranker.relate(&fp, "a recipe").is_empty());

        // An item written for a finding is found by its fingerprint even
        // when the wording shares little.
        write(
            d,
            "bugs/capital.md",
            &format!(
                "# Wrong capital\n\n{}\n",
                fingerprint_line(&Fingerprint::new(
                    "main",
                    "wrong_answer",
                    "memory",
                    "The assistant named the wrong capital of France"
                ))
            ),
        );
        let ranker = Ranker::new(load_items(d).unwrap());
        let again = Fingerprint::new(
            "main",
            "wrong_answer",
            "memory",
            "wrong capital of France named by the assistant",
        );
        let m = ranker.relate(&again, "zzz");
        assert_eq!(
            (m[0].path.as_str(), m[0].by),
            ("bugs/capital.md", MatchedBy::Fingerprint)
        );
    }
}
