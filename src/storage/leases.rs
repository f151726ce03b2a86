//! Many hosts on one database (issue 28): the hosts' rows, the space leases
//! that make one host a space's only runner, and the deployment's named
//! leases (one review scan, one connection per single-connection adapter).
//!
//! A lease's `epoch` rises at every claim and never goes back (a released
//! lease keeps its row, expired at once), so a host that lost a lease while
//! paused finds, at its next commit, another epoch or another host: that
//! check ([`hold`]) runs inside the commit's own transaction and locks the
//! row against a concurrent claim until the commit ends.
//!
//! Times are the hosts' clocks in milliseconds; safety does not depend on
//! them (the epoch does), only how soon a dead host's spaces move.
//!
//! Must never: take a lease that is held and unexpired by another host, or
//! let an epoch go down.

use super::{params, Conn, Dialect, Query, StoreError, StoreResult};

/// What a host holds of a space: the fencing token of its commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub space: String,
    pub host: String,
    pub epoch: i64,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This host holds the lease now, with this epoch.
    Held(i64),
    /// Another host holds it until `expires_at`.
    Elsewhere { host: String, expires_at: i64 },
}

/// One host of the deployment as `mercury cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    pub host_id: String,
    pub name: String,
    pub api_url: String,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub stopped_at: Option<i64>,
    /// Space leases it holds unexpired.
    pub spaces: i64,
    /// Named leases it holds unexpired.
    pub named: Vec<String>,
}

/// One named lease row (the review scan, an adapter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    pub host_id: String,
    pub epoch: i64,
    pub expires_at: i64,
}

/// `FOR UPDATE` where the backend has row locks; SQLite's one writer
/// already excludes every other writer.
fn locked(conn: &Conn, sql: &str, lock: &str) -> String {
    match conn.dialect() {
        Dialect::Sqlite => sql.to_owned(),
        Dialect::Postgres => format!("{sql} {lock}"),
    }
}

/// Records this host joining (or rejoining under the same id), with the
/// instance id its sandboxes are labelled with.
pub fn join_host(
    conn: &Conn,
    host: &str,
    name: &str,
    api_url: &str,
    instance_id: &str,
    now: i64,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO cluster_hosts (host_id, name, api_url, started_at, heartbeat_at, instance_id)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5)
         ON CONFLICT (host_id) DO UPDATE SET name = excluded.name, api_url = excluded.api_url,
           heartbeat_at = excluded.heartbeat_at, stopped_at = NULL, instance_id = excluded.instance_id",
        params![host, name, api_url, now, instance_id],
    )?;
    Ok(())
}

/// The sandbox instance ids of hosts that are gone (stopped, or silent for
/// `stale_ms`) and that no living host carries (a restarted host keeps its
/// instance id): what is left of them on an engine is nobody's.
pub fn dead_instances(conn: &Conn, now: i64, stale_ms: i64) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT DISTINCT d.instance_id FROM cluster_hosts d
         WHERE d.instance_id IS NOT NULL
           AND (d.stopped_at IS NOT NULL OR d.heartbeat_at < ?1)
           AND NOT EXISTS (SELECT 1 FROM cluster_hosts l
             WHERE l.instance_id = d.instance_id AND l.stopped_at IS NULL AND l.heartbeat_at >= ?1)
         ORDER BY 1",
        params![now - stale_ms],
        |r| r.get(0),
    )
}

/// Renews every lease `host` still holds (space and named) and its
/// heartbeat; the spaces it holds, with their epochs. A space missing from
/// the answer was taken by another host while this one could not renew.
pub fn renew(conn: &Conn, host: &str, now: i64, lease_ms: i64) -> StoreResult<Vec<(String, i64)>> {
    conn.execute(
        "UPDATE cluster_hosts SET heartbeat_at = ?2 WHERE host_id = ?1",
        params![host, now],
    )?;
    conn.execute(
        "UPDATE deployment_leases SET expires_at = ?2 WHERE host_id = ?1 AND expires_at > ?3",
        params![host, now + lease_ms, now],
    )?;
    // An expired lease nobody took is still this host's: no other host ran
    // the space meanwhile, so renewing it is safe.
    conn.query_all(
        "UPDATE space_leases SET expires_at = ?2 WHERE host_id = ?1 AND expires_at > 0
         RETURNING space_id, epoch",
        params![host, now + lease_ms],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Claims `space` for `host` if nobody else holds it unexpired. A takeover
/// (the row was another host's, or a dead predecessor's) also closes what
/// the previous holder left running: its runs are marked interrupted (each
/// counts toward its message's crash attempts, whichever host ran it) and
/// their run tokens revoked.
pub fn claim_space(
    conn: &Conn,
    space: &str,
    host: &str,
    now: i64,
    lease_ms: i64,
) -> StoreResult<Claim> {
    let current = |conn: &Conn| {
        conn.query_opt(
            &locked(
                conn,
                "SELECT host_id, epoch, expires_at FROM space_leases WHERE space_id = ?1",
                "FOR UPDATE",
            ),
            params![space],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )
    };
    let row = match current(conn)? {
        Some(r) => r,
        None => {
            let n = conn.execute(
                "INSERT INTO space_leases (space_id, host_id, epoch, expires_at)
                 VALUES (?1, ?2, 1, ?3) ON CONFLICT (space_id) DO NOTHING",
                params![space, host, now + lease_ms],
            )?;
            if n == 1 {
                close_left_running(conn, space, now)?;
                return Ok(Claim::Held(1));
            }
            // Another host inserted it first: decide on its row.
            current(conn)?.ok_or(StoreError::NoRow)?
        }
    };
    let (holder, epoch, expires_at) = row;
    if holder != host && expires_at > now {
        return Ok(Claim::Elsewhere {
            host: holder,
            expires_at,
        });
    }
    let epoch = epoch + 1;
    conn.execute(
        "UPDATE space_leases SET host_id = ?2, epoch = ?3, expires_at = ?4 WHERE space_id = ?1",
        params![space, host, epoch, now + lease_ms],
    )?;
    close_left_running(conn, space, now)?;
    Ok(Claim::Held(epoch))
}

/// The runs of `space` still `running` when its lease is claimed: their host
/// is gone or fenced (nobody else may run the space), so they are marked the
/// way a restart marks a crash's runs, and their tokens die with them.
fn close_left_running(conn: &Conn, space: &str, now: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE api_tokens SET revoked_at = ?2 WHERE revoked_at IS NULL AND run_id IN
           (SELECT id FROM runs WHERE space_id = ?1 AND status = 'running')",
        params![space, now],
    )?;
    conn.execute(
        "UPDATE runs SET status = 'interrupted', error = ?3, finished_at = ?2
         WHERE space_id = ?1 AND status = 'running'",
        params![space, now, super::runs::CRASHED],
    )?;
    Ok(())
}

/// Gives `space` up (its actor stopped): the row stays, expired at once,
/// so the next claim's epoch is higher still.
pub fn release_space(conn: &Conn, fence: &Fence) -> StoreResult<()> {
    conn.execute(
        "UPDATE space_leases SET expires_at = 0 WHERE space_id = ?1 AND host_id = ?2 AND epoch = ?3",
        params![fence.space, fence.host, fence.epoch],
    )?;
    Ok(())
}

/// Fails unless `fence` still holds its space: run inside the transaction
/// of a write only the space's runner may make (a turn's commit, a write in
/// the space's order). On PostgreSQL it also locks the lease row, so a
/// claim waits for this transaction and then sees what it committed.
pub fn hold(conn: &Conn, fence: &Fence) -> StoreResult<()> {
    let held = conn
        .query_opt(
            &locked(
                conn,
                "SELECT 1 FROM space_leases WHERE space_id = ?1 AND host_id = ?2 AND epoch = ?3",
                "FOR SHARE",
            ),
            params![fence.space, fence.host, fence.epoch],
            |r| r.get::<_, i64>(0),
        )?
        .is_some();
    if held {
        Ok(())
    } else {
        Err(StoreError::Fenced(format!(
            "this host no longer holds the lease of space {} (epoch {}): another host runs it",
            fence.space, fence.epoch
        )))
    }
}

/// Takes or keeps the named lease `name` (the review scan, an adapter's
/// connection); true while `host` holds it. Claimed again every tick, so
/// it moves only when its holder stops renewing.
pub fn hold_named(
    conn: &Conn,
    name: &str,
    host: &str,
    now: i64,
    lease_ms: i64,
) -> StoreResult<bool> {
    let row = conn.query_opt(
        &locked(
            conn,
            "SELECT host_id, expires_at FROM deployment_leases WHERE name = ?1",
            "FOR UPDATE",
        ),
        params![name],
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
    )?;
    match row {
        None => {
            let n = conn.execute(
                "INSERT INTO deployment_leases (name, host_id, epoch, expires_at)
                 VALUES (?1, ?2, 1, ?3) ON CONFLICT (name) DO NOTHING",
                params![name, host, now + lease_ms],
            )?;
            Ok(n == 1)
        }
        Some((holder, expires_at)) if holder == host || expires_at <= now => {
            // Same holder: renewed, same epoch; a takeover: the next epoch.
            conn.execute(
                "UPDATE deployment_leases SET epoch = epoch + CASE WHEN host_id = ?2 THEN 0 ELSE 1 END,
                   host_id = ?2, expires_at = ?3 WHERE name = ?1",
                params![name, host, now + lease_ms],
            )?;
            Ok(true)
        }
        Some(_) => Ok(false),
    }
}

/// Gives up everything `host` holds (a clean stop): other hosts may claim
/// its spaces at once instead of after the lease time.
pub fn leave(conn: &Conn, host: &str, now: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE space_leases SET expires_at = 0 WHERE host_id = ?1",
        params![host],
    )?;
    conn.execute(
        "UPDATE deployment_leases SET expires_at = 0 WHERE host_id = ?1",
        params![host],
    )?;
    conn.execute(
        "UPDATE cluster_hosts SET stopped_at = ?2 WHERE host_id = ?1",
        params![host, now],
    )?;
    Ok(())
}

/// Spaces with pending messages that `host` may run now: unleased, expired,
/// or its own. Polled by every host, so a message stored by any host (or
/// left by a dead one) reaches a runner.
pub fn runnable_pending(conn: &Conn, host: &str, now: i64) -> StoreResult<Vec<String>> {
    conn.query_all(
        "SELECT DISTINCT m.space_id FROM messages m
         LEFT JOIN space_leases l ON l.space_id = m.space_id
         WHERE m.status = 'pending'
           AND (l.space_id IS NULL OR l.expires_at <= ?2 OR l.host_id = ?1)
         ORDER BY m.space_id",
        params![host, now],
        |r| r.get(0),
    )
}

/// The channel a host's wake-up of a space another host runs goes on.
pub const WAKE_CHANNEL: &str = "mercury_wake";

/// Tells every host (on commit) that `space` has work: its holder wakes it
/// at once instead of at its next look. PostgreSQL only (SQLite has one host).
pub fn notify_wake(conn: &Conn, space: &str) -> StoreResult<()> {
    if conn.dialect() == Dialect::Postgres {
        conn.query_opt(
            "SELECT pg_notify(?1, ?2)",
            params![WAKE_CHANNEL, space],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// Where the running host `host` serves its API (none once it stopped).
pub fn host_url(conn: &Conn, host: &str) -> StoreResult<Option<String>> {
    conn.query_opt(
        "SELECT api_url FROM cluster_hosts WHERE host_id = ?1 AND stopped_at IS NULL",
        params![host],
        |r| r.get(0),
    )
}

/// Every host that ever joined, newest first, with what it holds now.
pub fn hosts(conn: &Conn, now: i64) -> StoreResult<Vec<HostRow>> {
    let mut rows = conn.query_all(
        "SELECT h.host_id, h.name, h.api_url, h.started_at, h.heartbeat_at, h.stopped_at,
           (SELECT COUNT(*) FROM space_leases l WHERE l.host_id = h.host_id AND l.expires_at > ?1)
         FROM cluster_hosts h ORDER BY h.started_at DESC, h.host_id",
        params![now],
        |r| {
            Ok(HostRow {
                host_id: r.get(0)?,
                name: r.get(1)?,
                api_url: r.get(2)?,
                started_at: r.get(3)?,
                heartbeat_at: r.get(4)?,
                stopped_at: r.get(5)?,
                spaces: r.get(6)?,
                named: Vec::new(),
            })
        },
    )?;
    for lease in named_leases(conn)? {
        if lease.expires_at > now {
            if let Some(h) = rows.iter_mut().find(|h| h.host_id == lease.host_id) {
                h.named.push(lease.name);
            }
        }
    }
    Ok(rows)
}

/// The named leases, by name.
pub fn named_leases(conn: &Conn) -> StoreResult<Vec<LeaseRow>> {
    conn.query_all(
        "SELECT name, host_id, epoch, expires_at FROM deployment_leases ORDER BY name",
        params![],
        |r| {
            Ok(LeaseRow {
                name: r.get(0)?,
                host_id: r.get(1)?,
                epoch: r.get(2)?,
                expires_at: r.get(3)?,
            })
        },
    )
}

/// Records the host a run runs on (a cluster's runs say where they ran).
pub fn set_run_host(conn: &Conn, run: &str, host: &str) -> StoreResult<()> {
    conn.execute(
        "UPDATE runs SET host_id = ?2 WHERE id = ?1",
        params![run, host],
    )?;
    Ok(())
}
