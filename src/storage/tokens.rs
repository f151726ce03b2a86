//! API tokens. Only a SHA-256 hash of each secret is stored; the secret is
//! shown once, when it is minted.
//!
//! Must never: return a secret or a hash to an API client, or accept a
//! revoked or expired token.

use super::{params, Conn, Optional, Query};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{StoreError, StoreResult};
use crate::clock::now_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    User,
    Run,
    Adapter,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::User => "user",
            TokenKind::Run => "run",
            TokenKind::Adapter => "adapter",
        }
    }

    pub fn parse(raw: &str) -> Option<TokenKind> {
        match raw {
            "user" => Some(TokenKind::User),
            "run" => Some(TokenKind::Run),
            "adapter" => Some(TokenKind::Adapter),
            _ => None,
        }
    }
}

/// What a presented token resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenGrant {
    pub id: String,
    pub caller_id: String,
    pub kind: TokenKind,
    /// Run tokens are bound to one space and one run.
    pub space_id: Option<String>,
    pub run_id: Option<String>,
    /// A fixed role in the bound space (ask turns), instead of the caller's own.
    pub role: Option<String>,
    /// Every write is refused and recorded (ask turns).
    pub read_only: bool,
    /// The one platform an adapter token may post and pull for.
    pub platform: Option<String>,
    /// A scope limits the token to its routes (see [`REVIEW_READ_SCOPE`]).
    pub scope: Option<String>,
    /// An adapter token minted with `--trusted-identities`: the identity
    /// mappings of the senders it posts hold.
    pub trusted_identities: bool,
}

/// The scope of a token that may only read review reports
/// (`GET /api/review/reports*`): what another host's intake pulls with.
pub const REVIEW_READ_SCOPE: &str = "review.read";

/// The scopes a token may carry.
pub const SCOPES: &[&str] = &[REVIEW_READ_SCOPE];

#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub caller_id: String,
    pub kind: String,
    pub space_id: Option<String>,
    pub platform: Option<String>,
    pub label: Option<String>,
    pub scope: Option<String>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

pub fn hash_secret(secret: &str) -> String {
    base16ct::lower::encode_string(&Sha256::digest(secret.as_bytes()))
}

/// A fresh random secret: 32 random bytes, hex, prefixed so it is recognisable in logs scrubbing.
pub fn new_secret() -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    format!("mrc_{}{}", a.simple(), b.simple())
}

pub struct NewToken<'a> {
    pub caller_id: &'a str,
    pub kind: TokenKind,
    pub space_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub label: Option<&'a str>,
    pub created_by: Option<&'a str>,
    pub expires_at: Option<i64>,
    pub role: Option<&'a str>,
    pub read_only: bool,
}

/// Stores a new token and returns `(id, secret)`; the secret is not kept.
pub fn mint(conn: &Conn, t: &NewToken<'_>) -> StoreResult<(String, String)> {
    let secret = new_secret();
    let id = uuid::Uuid::now_v7().simple().to_string();
    conn.execute(
        "INSERT INTO api_tokens (id, token_hash, caller_id, kind, space_id, run_id, label, created_by, created_at, expires_at, role, read_only)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            id,
            hash_secret(&secret),
            t.caller_id,
            t.kind.as_str(),
            t.space_id,
            t.run_id,
            t.label,
            t.created_by,
            now_ms(),
            t.expires_at,
            t.role,
            t.read_only
        ],
    )?;
    Ok((id, secret))
}

/// Resolves a presented secret; `None` for unknown, revoked or expired.
pub fn resolve(conn: &Conn, secret: &str, now: i64) -> StoreResult<Option<TokenGrant>> {
    let row = conn
        .query_row(
            "SELECT id, caller_id, kind, space_id, run_id, role, read_only, platform, scope, trusted_identities FROM api_tokens
             WHERE token_hash = ?1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)",
            params![hash_secret(secret), now],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, bool>(6)?,
                    r.get::<_, Option<String>>(7)?,
                    r.get::<_, Option<String>>(8)?,
                    r.get::<_, bool>(9)?,
                ))
            },
        )
        .optional()?;
    Ok(row.and_then(
        |(id, caller_id, kind, space_id, run_id, role, read_only, platform, scope, trusted)| {
            TokenKind::parse(&kind).map(|kind| TokenGrant {
                id,
                caller_id,
                kind,
                space_id,
                run_id,
                role,
                read_only,
                platform,
                scope,
                trusted_identities: trusted,
            })
        },
    ))
}

/// Limits a freshly minted user token to a scope (same transaction as the
/// mint). A scoped token is read-only.
pub fn bind_scope(conn: &Conn, id: &str, scope: &str) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE api_tokens SET scope = ?2, read_only = 1 WHERE id = ?1 AND kind = 'user'",
        params![id, scope],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("user token {id}")));
    }
    Ok(())
}

/// Binds a freshly minted adapter token to its platform (same transaction as
/// the mint; `NewToken` stays as the turn code builds it).
pub fn bind_platform(conn: &Conn, id: &str, platform: &str) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE api_tokens SET platform = ?2 WHERE id = ?1 AND kind = 'adapter'",
        params![id, platform],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("adapter token {id}")));
    }
    Ok(())
}

/// Marks a freshly minted adapter token as carrying its senders' identity
/// mappings (same transaction as the mint).
pub fn trust_identities(conn: &Conn, id: &str) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE api_tokens SET trusted_identities = 1 WHERE id = ?1 AND kind = 'adapter'",
        params![id],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("adapter token {id}")));
    }
    Ok(())
}

pub fn list(conn: &Conn) -> StoreResult<Vec<TokenInfo>> {
    conn.query_all("SELECT id, caller_id, kind, space_id, label, created_by, created_at, expires_at, revoked_at, platform, scope
         FROM api_tokens WHERE kind != 'run' ORDER BY created_at, id", params![], |r| {
        Ok(TokenInfo {
            id: r.get(0)?,
            caller_id: r.get(1)?,
            kind: r.get(2)?,
            space_id: r.get(3)?,
            platform: r.get(9)?,
            label: r.get(4)?,
            scope: r.get(10)?,
            created_by: r.get(5)?,
            created_at: r.get(6)?,
            expires_at: r.get(7)?,
            revoked_at: r.get(8)?,
        })
    })
}

pub fn revoke(conn: &Conn, id: &str) -> StoreResult<()> {
    let n = conn.execute(
        "UPDATE api_tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        params![id, now_ms()],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("active token {id}")));
    }
    Ok(())
}

/// Deletes the tokens of a run (ask turns leave no row that names the target).
pub fn delete_run(conn: &Conn, run_id: &str) -> StoreResult<()> {
    conn.execute("DELETE FROM api_tokens WHERE run_id = ?1", params![run_id])?;
    Ok(())
}

/// At start-up, when no run is live: every run token still standing belongs
/// to a run a hard kill interrupted. Ask tokens (read-only) are deleted, as
/// a finished ask deletes its own (no row may name the ask's target); the
/// others are revoked. Returns (revoked, deleted).
pub fn retire_run_tokens(conn: &Conn) -> StoreResult<(usize, usize)> {
    let deleted = conn.execute(
        "DELETE FROM api_tokens WHERE kind = 'run' AND read_only = 1",
        params![],
    )?;
    let revoked = conn.execute(
        "UPDATE api_tokens SET revoked_at = ?1 WHERE kind = 'run' AND revoked_at IS NULL",
        params![now_ms()],
    )?;
    Ok((revoked, deleted))
}

/// Revokes the token of a finished run so it dies with the run.
/// Shared with the query-plan test (`storage::migrations`).
pub(crate) const REVOKE_RUN_SQL: &str =
    "UPDATE api_tokens SET revoked_at = ?2 WHERE run_id = ?1 AND revoked_at IS NULL";

pub fn revoke_run(conn: &Conn, run_id: &str) -> StoreResult<()> {
    conn.execute(REVOKE_RUN_SQL, params![run_id, now_ms()])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(conn: &Conn, kind: TokenKind, run: Option<&str>, read_only: bool) -> String {
        mint(
            conn,
            &NewToken {
                caller_id: "carol",
                kind,
                space_id: run.map(|_| "target"),
                run_id: run,
                label: None,
                created_by: None,
                expires_at: None,
                role: None,
                read_only,
            },
        )
        .unwrap()
        .1
    }

    #[test]
    fn retiring_run_tokens_revokes_turns_deletes_asks_and_spares_the_rest() {
        let conn = crate::storage::test_conn();
        let user = token(&conn, TokenKind::User, None, false);
        let adapter = token(&conn, TokenKind::Adapter, None, false);
        let turn = token(&conn, TokenKind::Run, Some("run-1"), false);
        let ask = token(&conn, TokenKind::Run, Some("ask-1"), true);
        assert_eq!(retire_run_tokens(&conn).unwrap(), (1, 1));
        let now = now_ms();
        assert!(resolve(&conn, &user, now).unwrap().is_some());
        assert!(resolve(&conn, &adapter, now).unwrap().is_some());
        assert!(resolve(&conn, &turn, now).unwrap().is_none());
        assert!(resolve(&conn, &ask, now).unwrap().is_none());
        let ask_rows: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM api_tokens WHERE run_id = 'ask-1'",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(ask_rows, 0, "no row is left that names the ask's target");
        assert_eq!(retire_run_tokens(&conn).unwrap(), (0, 0));
    }
}
