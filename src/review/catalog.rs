//! The reports on this box: which `<date>-daily` and `<date>-weekly`
//! directories under the reviews directory hold a `report.json`, and reading
//! one of them back. The API serves this to global admins and `review.read`
//! tokens; the intake reads another host's data dir through it.
//!
//! A report is named by a [`ReportName`] (a calendar date and a kind); one a
//! caller gives is parsed and validated before any path is built from it, and
//! the writers (daily, weekly, the scheduler's check) build theirs through
//! the same [`ReportName::dir`]: the path is always
//! `<reviews>/<YYYY-MM-DD>-<kind>/report.json`, never text a caller chose.
//!
//! Must never: build a path from unvalidated text, follow a symlink out of
//! the reviews directory, or return a file that is not a report's JSON.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// Largest `report.json` read back (a day's report is far smaller).
pub(crate) const MAX_REPORT_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReportKind {
    Daily,
    Weekly,
}

impl ReportKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReportKind::Daily => "daily",
            ReportKind::Weekly => "weekly",
        }
    }
}

/// A report's name: `2026-09-28` (the daily) or `2026-09-28-weekly`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ReportName {
    /// `YYYY-MM-DD`, a real calendar date.
    pub date: String,
    pub kind: ReportKind,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{0:?} is not a report name: give a date YYYY-MM-DD, or YYYY-MM-DD-weekly")]
    BadName(String),
    #[error("there is no {kind} report for {date}")]
    NotFound { date: String, kind: &'static str },
    #[error("reading the report in {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the report in {path} is not valid JSON ({reason})")]
    Invalid { path: String, reason: String },
}

impl ReportName {
    /// Parses `YYYY-MM-DD`, `YYYY-MM-DD-daily` or `YYYY-MM-DD-weekly`.
    pub(crate) fn parse(raw: &str) -> Result<Self, CatalogError> {
        let bad = || CatalogError::BadName(raw.chars().take(40).collect());
        let (date, kind) = match raw.len() {
            10 => (raw, ReportKind::Daily),
            _ => match raw.split_at_checked(10) {
                Some((d, "-daily")) => (d, ReportKind::Daily),
                Some((d, "-weekly")) => (d, ReportKind::Weekly),
                _ => return Err(bad()),
            },
        };
        parse_date(date).ok_or_else(bad)?;
        Ok(Self {
            date: date.to_owned(),
            kind,
        })
    }

    /// The directory name, `<date>-<kind>`.
    pub(crate) fn dir_name(&self) -> String {
        format!("{}-{}", self.date, self.kind.as_str())
    }

    /// The report's directory under `reviews`: `<reviews>/<date>-<kind>`.
    pub(crate) fn dir(&self, reviews: &Path) -> PathBuf {
        reviews.join(self.dir_name())
    }
}

/// A strict `YYYY-MM-DD` that is a real date.
pub(crate) fn parse_date(raw: &str) -> Option<chrono::NaiveDate> {
    if raw.len() != 10 || !raw.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d").ok()
}

/// One report on the box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ReportEntry {
    pub date: String,
    pub kind: ReportKind,
    /// What `GET /api/review/reports/{name}` takes.
    pub name: String,
}

/// Every report under `reviews`, oldest first (daily before weekly on a
/// date). A missing directory is an empty list.
pub(crate) fn list(reviews: &Path) -> Result<Vec<ReportEntry>, CatalogError> {
    let read = match std::fs::read_dir(reviews) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CatalogError::Io {
                path: reviews.display().to_string(),
                source,
            })
        }
    };
    let mut names = Vec::new();
    for entry in read.flatten() {
        let Some(raw) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(name) = ReportName::parse(&raw) else {
            continue;
        };
        // Only the canonical spelling (a bare date dir is not ours) and only
        // a real directory, never a symlink.
        if raw != name.dir_name() || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if is_plain_file(&reviews.join(&raw).join("report.json")) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .map(|n| ReportEntry {
            name: match n.kind {
                ReportKind::Daily => n.date.clone(),
                ReportKind::Weekly => n.dir_name(),
            },
            date: n.date,
            kind: n.kind,
        })
        .collect())
}

/// The reports that cite any of `ids` (a finding's `message_id` or
/// `reply_id`, wherever it sits in the report): what a deletion request
/// names for the operator to read or remove.
pub(crate) fn citing(
    reviews: &Path,
    ids: &std::collections::BTreeSet<i64>,
) -> Result<Vec<ReportEntry>, CatalogError> {
    fn cites(v: &Value, ids: &std::collections::BTreeSet<i64>) -> bool {
        match v {
            Value::Object(map) => map.iter().any(|(k, v)| {
                (matches!(k.as_str(), "message_id" | "reply_id")
                    && v.as_i64().is_some_and(|id| ids.contains(&id)))
                    || cites(v, ids)
            }),
            Value::Array(items) => items.iter().any(|v| cites(v, ids)),
            _ => false,
        }
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in list(reviews)? {
        let name = ReportName::parse(&entry.name)?;
        if cites(&read(reviews, &name)?, ids) {
            out.push(entry);
        }
    }
    Ok(out)
}

fn is_plain_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

/// Reads one report's JSON.
pub(crate) fn read(reviews: &Path, name: &ReportName) -> Result<Value, CatalogError> {
    let dir = name.dir(reviews);
    let path = dir.join("report.json");
    let not_found = || CatalogError::NotFound {
        date: name.date.clone(),
        kind: name.kind.as_str(),
    };
    let dir_ok = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir());
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) if dir_ok && m.file_type().is_file() => m,
        Ok(_) => return Err(not_found()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(source) => {
            return Err(CatalogError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    };
    if meta.len() > MAX_REPORT_BYTES {
        return Err(CatalogError::Invalid {
            path: path.display().to_string(),
            reason: format!("larger than {MAX_REPORT_BYTES} bytes"),
        });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| CatalogError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| CatalogError::Invalid {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_catalog_names_parse_strictly() {
        let d = ReportName::parse("2026-09-28").unwrap();
        assert_eq!((d.date.as_str(), d.kind), ("2026-09-28", ReportKind::Daily));
        assert_eq!(d.dir_name(), "2026-09-28-daily");
        let w = ReportName::parse("2026-09-28-weekly").unwrap();
        assert_eq!(w.kind, ReportKind::Weekly);
        for bad in [
            "",
            "2026-13-01",
            "2026-02-30",
            "../../etc",
            "2026-09-28-monthly",
            "2026-09-28/..",
            "2026-9-28",
            "+026-09-28",
            "２026-09-28",
        ] {
            assert!(ReportName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn review_catalog_lists_only_report_dirs_and_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        assert!(list(&r.join("missing")).unwrap().is_empty());
        for (dir, body) in [
            ("2026-09-28-daily", Some("{\"date\":\"2026-09-28\"}")),
            ("2026-09-27-daily", Some("{\"date\":\"2026-09-27\"}")),
            ("2026-09-28-weekly", Some("{\"kind\":\"weekly\"}")),
            ("2026-09-26-daily", None),
            ("notes", Some("{}")),
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            if let Some(b) = body {
                std::fs::write(r.join(dir).join("report.json"), b).unwrap();
            }
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("report.json"), "{\"secret\":1}").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("2026-09-25-daily")).unwrap();
        let names: Vec<String> = list(r).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["2026-09-27", "2026-09-28", "2026-09-28-weekly"]);
        let v = read(r, &ReportName::parse("2026-09-27").unwrap()).unwrap();
        assert_eq!(v["date"], "2026-09-27");
        for missing in ["2026-09-26", "2026-09-25", "2026-01-01-weekly"] {
            assert!(matches!(
                read(r, &ReportName::parse(missing).unwrap()),
                Err(CatalogError::NotFound { .. })
            ));
        }
    }
}
