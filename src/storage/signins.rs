//! The dashboard's sign-ins and one-time sign-in links (issue 27). Only a
//! SHA-256 hash of a cookie's or a link's secret is stored; a sign-in lasts
//! only while the user token it was made from is neither revoked nor expired.
//!
//! Must never: return a secret or a hash, accept a revoked or expired
//! sign-in, or let a link sign in twice.

use super::tokens::{hash_secret, new_secret};
use super::{params, Conn, Optional, Query, StoreResult, Tx};

/// A sign-in as a request resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Signin {
    pub id: String,
    pub caller_id: String,
    /// The form token every state-changing form of this sign-in carries.
    pub csrf: String,
    pub expires_at: i64,
}

/// A sign-in as its owner's list shows it (no secret, no CSRF token).
#[derive(Debug, Clone, PartialEq)]
pub struct SigninInfo {
    pub id: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub last_seen_at: i64,
    pub revoked_at: Option<i64>,
    pub agent: String,
}

pub struct NewSignin<'a> {
    pub caller_id: &'a str,
    pub token_id: &'a str,
    pub now: i64,
    pub expires_at: i64,
    /// The browser's `User-Agent`, cut short (shown in the list only).
    pub agent: &'a str,
}

/// Stores a sign-in; returns `(id, cookie secret)`.
pub fn create(tx: &Tx, s: &NewSignin<'_>) -> StoreResult<(String, String)> {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let secret = new_secret();
    let csrf = uuid::Uuid::new_v4().simple().to_string();
    let agent: String = s.agent.chars().take(200).collect();
    tx.execute(
        "INSERT INTO ui_signins (id, secret_hash, caller_id, token_id, csrf, created_at, expires_at, last_seen_at, revoked_at, agent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6, NULL, ?8)",
        params![id, hash_secret(&secret), s.caller_id, s.token_id, csrf, s.now, s.expires_at, agent],
    )?;
    Ok((id, secret))
}

/// The live sign-in of a cookie secret: not revoked, not expired, and its
/// user token still good.
pub fn resolve(conn: &Conn, secret: &str, now: i64) -> StoreResult<Option<Signin>> {
    conn.query_row(
        "SELECT s.id, s.caller_id, s.csrf, s.expires_at FROM ui_signins s
         JOIN api_tokens t ON t.id = s.token_id
         WHERE s.secret_hash = ?1 AND s.revoked_at IS NULL AND s.expires_at > ?2
           AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > ?2)",
        params![hash_secret(secret), now],
        |r| {
            Ok(Signin {
                id: r.get(0)?,
                caller_id: r.get(1)?,
                csrf: r.get(2)?,
                expires_at: r.get(3)?,
            })
        },
    )
    .optional()
}

/// Marks a sign-in seen (shown in the list; never extends it).
pub fn touch(tx: &Tx, id: &str, now: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE ui_signins SET last_seen_at = ?2 WHERE id = ?1",
        params![id, now],
    )?;
    Ok(())
}

/// A caller's sign-ins, newest first (at most `limit`).
pub fn list_for(conn: &Conn, caller: &str, limit: u32) -> StoreResult<Vec<SigninInfo>> {
    conn.query_all(
        "SELECT id, created_at, expires_at, last_seen_at, revoked_at, agent FROM ui_signins
         WHERE caller_id = ?1 ORDER BY created_at DESC, id DESC LIMIT ?2",
        params![caller, limit],
        |r| {
            Ok(SigninInfo {
                id: r.get(0)?,
                created_at: r.get(1)?,
                expires_at: r.get(2)?,
                last_seen_at: r.get(3)?,
                revoked_at: r.get(4)?,
                agent: r.get(5)?,
            })
        },
    )
}

/// Revokes one of `caller`'s own sign-ins; whether a live one was revoked.
pub fn revoke(tx: &Tx, caller: &str, id: &str, now: i64) -> StoreResult<bool> {
    Ok(tx.execute(
        "UPDATE ui_signins SET revoked_at = ?3 WHERE id = ?1 AND caller_id = ?2 AND revoked_at IS NULL",
        params![id, caller, now],
    )? > 0)
}

/// Stores a one-time sign-in link's secret; returns the secret.
pub fn create_link(
    tx: &Tx,
    caller: &str,
    token_id: &str,
    now: i64,
    expires_at: i64,
) -> StoreResult<String> {
    let secret = new_secret();
    tx.execute(
        "INSERT INTO ui_login_links (secret_hash, caller_id, token_id, created_at, expires_at, used_at)
         VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
        params![hash_secret(&secret), caller, token_id, now, expires_at],
    )?;
    Ok(secret)
}

/// Uses a link: `(caller, token id)` the first time within its life, then
/// never again.
pub fn redeem_link(tx: &Tx, secret: &str, now: i64) -> StoreResult<Option<(String, String)>> {
    tx.query_row(
        "UPDATE ui_login_links SET used_at = ?2
         WHERE secret_hash = ?1 AND used_at IS NULL AND expires_at > ?2
         RETURNING caller_id, token_id",
        params![hash_secret(secret), now],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
}
