//! The dashboard's paged lists (issue 27): every list it shows is one page
//! cut in SQL, so a page costs the same with 10 spaces or 10,000.
//!
//! Must never: return a space or a run the caller was not allowed by the
//! filter the caller of this module passes (`member_of`), or read a whole
//! table to cut a page in memory.

use super::runs::Run;
use super::spaces::Space;
use super::{params, Conn, Query, StoreResult};

/// One page of spaces by id after `after` (exclusive), `limit` rows and
/// whether more follow. `member_of`: only the spaces where that caller holds
/// a role or has spoken (`None`: every space, for a global admin). `search`
/// matches the id or the name, anywhere, case-insensitively for ASCII.
pub fn spaces_page(
    conn: &Conn,
    member_of: Option<&str>,
    search: &str,
    after: &str,
    limit: u32,
) -> StoreResult<(Vec<Space>, bool)> {
    let pattern = format!("%{}%", escape_like(&search.to_lowercase()));
    let mut rows = conn.query_all(
        "SELECT id, name, tags, created_at, updated_at FROM spaces
         WHERE id > ?1
           AND (CAST(?2 AS TEXT) = '%%' OR LOWER(id) LIKE ?2 ESCAPE '\\' OR LOWER(name) LIKE ?2 ESCAPE '\\')
           AND (CAST(?3 AS TEXT) IS NULL OR id IN (
                SELECT space_id FROM space_roles WHERE caller_id = CAST(?3 AS TEXT)
                UNION SELECT space_id FROM members WHERE caller_id = CAST(?3 AS TEXT)))
         ORDER BY id LIMIT ?4",
        params![after, pattern, member_of, i64::from(limit) + 1],
        |r| {
            let tags: String = r.get(2)?;
            Ok(Space {
                id: r.get(0)?,
                name: r.get(1)?,
                tags: tags
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect(),
                created_at: r.get(3)?,
                updated_at: r.get(4)?,
            })
        },
    )?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    Ok((rows, more))
}

fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The filters of the runs list; empty strings filter nothing.
pub struct RunFilter<'a> {
    pub space: &'a str,
    pub status: &'a str,
    pub kind: &'a str,
    /// Only runs started before this (ms; the next page's cursor).
    pub before: i64,
}

/// One page of a space's runs, newest first, and whether more follow.
pub fn runs_page(conn: &Conn, f: &RunFilter<'_>, limit: u32) -> StoreResult<(Vec<Run>, bool)> {
    let mut rows = conn.query_all(
        "SELECT id, space_id, kind, status, caller_id, trigger_message_id, started_at, finished_at, container_id, sandbox_proof, error
         FROM runs WHERE space_id = ?1 AND started_at < ?2
           AND (CAST(?3 AS TEXT) = '' OR status = CAST(?3 AS TEXT)) AND (CAST(?4 AS TEXT) = '' OR kind = CAST(?4 AS TEXT))
         ORDER BY started_at DESC, id DESC LIMIT ?5",
        params![f.space, f.before, f.status, f.kind, i64::from(limit) + 1],
        |r| {
            Ok(Run {
                id: r.get(0)?,
                space_id: r.get(1)?,
                kind: r.get(2)?,
                status: r.get(3)?,
                caller_id: r.get(4)?,
                trigger_message_id: r.get(5)?,
                started_at: r.get(6)?,
                finished_at: r.get(7)?,
                container_id: r.get(8)?,
                sandbox_proof: r.get(9)?,
                error: r.get(10)?,
            })
        },
    )?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    Ok((rows, more))
}

/// Counts for the overview: spaces, messages waiting for a turn, runs
/// started and failed since `since` (ms).
pub fn overview_counts(conn: &Conn, since: i64) -> StoreResult<(i64, i64, i64, i64)> {
    conn.query_row(
        "SELECT (SELECT COUNT(*) FROM spaces),
                (SELECT COUNT(*) FROM messages WHERE status = 'pending'),
                (SELECT COUNT(*) FROM runs WHERE started_at >= ?1),
                (SELECT COUNT(*) FROM runs WHERE started_at >= ?1 AND status = 'failed')",
        params![since],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}
