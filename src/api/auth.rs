//! The auth step of every `/api/*` request: the bearer token decides the
//! caller, `x-mercury-space` (or a run token's own space) decides the space,
//! and the caller's role and permissions there are resolved once, read-only.
//!
//! Must never: trust a header for identity, create a space or member row, or
//! give any request the `system` role.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;

use super::error::{ApiError, ApiResult};
use crate::app::App;
use crate::clock::now_ms;
use crate::ids::SpaceId;
use crate::links::LinkLevel;
use crate::perms::{self, PermSet, Permission};
use crate::storage::tokens::{self, TokenKind};
use crate::storage::{identities, runs, spaces};

pub const SPACE_HEADER: &str = "x-mercury-space";
pub const ACT_AS_HEADER: &str = "x-mercury-act-as";

/// The verified caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub caller_id: String,
    pub kind: TokenKind,
    pub global_admin: bool,
    pub run_id: Option<String>,
    /// An adapter token's platform (the only one it may post and pull for).
    pub platform: Option<String>,
    /// The platform id this caller was mapped from (`identities`), when a
    /// turn of a mapped platform sender acts with its operator's rights.
    pub identity: Option<String>,
    /// A scoped token's scope (`review.read`): it reaches only its routes.
    pub scope: Option<String>,
    /// An adapter token minted with `--trusted-identities`.
    pub trusted_identities: bool,
}

/// The space a request acts in, with the caller's role there.
#[derive(Debug, Clone)]
pub struct SpaceCtx {
    pub space: SpaceId,
    pub role: String,
    pub perms: PermSet,
}

/// Set when the request acts in another space through a link (D-011).
#[derive(Debug, Clone)]
pub struct Via {
    pub holder: SpaceId,
    pub level: LinkLevel,
    pub edge_id: i64,
    /// The edge reaches only this conversation of the target.
    pub conversation: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Auth {
    pub caller: Caller,
    pub space: Option<SpaceCtx>,
    pub via: Option<Via>,
}

impl Auth {
    pub fn space(&self) -> ApiResult<&SpaceCtx> {
        self.space.as_ref().ok_or_else(|| {
            ApiError::bad_request(format!(
                "this route needs the {SPACE_HEADER} header naming a space"
            ))
        })
    }

    /// The space, if the caller holds `perm` there; the one `check_perm`.
    pub fn require(&self, perm: Permission) -> ApiResult<&SpaceCtx> {
        let ctx = self.space()?;
        if ctx.perms.contains(&perm) {
            Ok(ctx)
        } else {
            Err(ApiError::missing_perm(perm))
        }
    }

    /// Reading review reports: a global admin or a `review.read` token.
    pub fn require_review_read(&self) -> ApiResult<()> {
        if self.caller.global_admin
            || self.caller.scope.as_deref() == Some(tokens::REVIEW_READ_SCOPE)
        {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                "only a global admin or a review.read token may read review reports",
            ))
        }
    }

    pub fn require_global_admin(&self) -> ApiResult<()> {
        if self.caller.global_admin {
            Ok(())
        } else {
            Err(ApiError::forbidden("only a global admin may do this"))
        }
    }
}

/// The routes a scope reaches (read-only is enforced with the method).
fn scope_allows(scope: &str, path: &str) -> bool {
    match scope {
        tokens::REVIEW_READ_SCOPE => {
            path == "/api/review/reports" || path.starts_with("/api/review/reports/")
        }
        _ => false,
    }
}

fn bearer(headers: &HeaderMap) -> ApiResult<&str> {
    let raw = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <token>"))?;
    raw.to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be 'Bearer <token>'"))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> ApiResult<Option<&'a str>> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| ApiError::bad_request(format!("{name} must be plain text"))),
    }
}

pub async fn authenticate(
    State(app): State<Arc<App>>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = bearer(req.headers())?.to_owned();
    let requested = header_str(req.headers(), SPACE_HEADER)?.map(str::to_owned);
    let act_as = header_str(req.headers(), ACT_AS_HEADER)?.map(str::to_owned);
    let path = req.uri().path().to_owned();
    let settings = app.rt.settings.clone();
    let act_as_target = act_as.clone();
    let auth = app
        .rt
        .store
        .read(move |c| {
            let Some(grant) = tokens::resolve(c, &token, now_ms())? else {
                return Ok(Err(ApiError::unauthorized(
                    "unknown, revoked or expired token",
                )));
            };
            // A scoped token never carries its caller's admin rights: it is
            // exactly its scope.
            let global_admin = grant.kind == TokenKind::User
                && grant.scope.is_none()
                && settings.is_global_admin(&grant.caller_id);
            // A turn of a platform sender acts as that sender, unless a global
            // admin mapped the sender to an operator (`mrctl identities link`)
            // and the message came through an origin mappings hold for (the
            // platform's in-process adapter, or an adapter token minted with
            // `--trusted-identities`): any other adapter token could name
            // any sender id.
            let mappable = grant.kind == TokenKind::Run
                && crate::ids::platform_of(&grant.caller_id).is_some()
                && match grant.run_id.as_deref() {
                    Some(run) => runs::trigger_identity_trusted(c, run)?,
                    None => false,
                };
            let mapped = if mappable {
                identities::operator_for(c, &grant.caller_id)?
            } else {
                None
            };
            let (caller_id, identity) = match mapped {
                Some(op) => (op, Some(grant.caller_id.clone())),
                None => (grant.caller_id.clone(), None),
            };
            let caller = Caller {
                caller_id,
                kind: grant.kind,
                global_admin,
                run_id: grant.run_id.clone(),
                platform: grant.platform.clone(),
                identity,
                scope: grant.scope.clone(),
                trusted_identities: grant.trusted_identities,
            };
            if let Some(scope) = &grant.scope {
                if !scope_allows(scope, &path) || requested.is_some() || act_as_target.is_some() {
                    return Ok(Err(ApiError::forbidden(format!(
                        "a {scope} token may only read /api/review/reports"
                    ))));
                }
            }
            if grant.kind == TokenKind::Adapter
                && !matches!(
                    path.as_str(),
                    "/api/ingress" | "/api/outbox" | "/api/outbox/ack"
                )
            {
                return Ok(Err(ApiError::forbidden(
                    "an adapter token may only call /api/ingress, /api/outbox and /api/outbox/ack",
                )));
            }
            let space_id = match (&grant.space_id, requested) {
                (Some(bound), Some(asked)) if grant.kind == TokenKind::Run && *bound != asked => {
                    return Ok(Err(ApiError::forbidden(
                        "a run token is bound to its own space",
                    )));
                }
                (Some(bound), _) if grant.kind == TokenKind::Run => Some(bound.clone()),
                (_, asked) => asked,
            };
            // An act-as request reads its holder context and everything about
            // its target in one statement (`act_as::read`); a target that is
            // not an id is refused by the act-as step without a read.
            let act_target = act_as_target
                .as_deref()
                .and_then(|t| SpaceId::parse(t).ok());
            let space = match space_id {
                None => None,
                Some(raw) => {
                    let id = match SpaceId::parse(&raw) {
                        Ok(id) => id,
                        Err(e) => return Ok(Err(ApiError::bad_request(e.to_string()))),
                    };
                    if let Some(target) = &act_target {
                        // The same roles as below: an ask token's fixed role
                        // (never with `links.act`), a global admin's `admin`,
                        // else the stored role, member or none.
                        let fixed = match (&grant.kind, &grant.role) {
                            (TokenKind::Run, Some(fixed)) => Some(fixed.clone()),
                            _ => None,
                        };
                        let admin_here = global_admin
                            || (grant.kind == TokenKind::Run
                                && settings.is_global_admin(&caller.caller_id));
                        let forced = fixed
                            .clone()
                            .or_else(|| admin_here.then(|| perms::ROLE_ADMIN.to_owned()));
                        let Some((mut ctx, found)) = crate::api::act_as::read(
                            c,
                            &id,
                            &caller.caller_id,
                            target,
                            forced.as_deref(),
                        )?
                        else {
                            return Ok(Err(ApiError::not_found(format!(
                                "space {id} does not exist"
                            ))));
                        };
                        if fixed.is_some() {
                            ctx.perms.remove(&Permission::LinksAct);
                        }
                        return Ok(Ok((
                            Auth {
                                caller,
                                space: Some(ctx),
                                via: None,
                            },
                            grant.read_only,
                            Some(found),
                        )));
                    }
                    if !spaces::space_exists(c, id.as_str())? {
                        return Ok(Err(ApiError::not_found(format!(
                            "space {id} does not exist"
                        ))));
                    }
                    let (role, perms) = match (&grant.kind, &grant.role) {
                        // An ask turn carries exactly the role it was started
                        // with (`--as member|admin`) in its target, and never
                        // `links.act`: an ask does not reach the target's links.
                        (TokenKind::Run, Some(fixed)) => {
                            let mut p = perms::role_permissions(c, id.as_str(), fixed)?;
                            p.remove(&Permission::LinksAct);
                            (fixed.clone(), p)
                        }
                        _ => {
                            // A turn acts with its user's role: a global admin's
                            // turn is admin in its space (but not a global admin).
                            let admin_here = global_admin
                                || (grant.kind == TokenKind::Run
                                    && settings.is_global_admin(&caller.caller_id));
                            let role =
                                perms::resolve_role(c, id.as_str(), &caller.caller_id, admin_here)?;
                            let p = perms::role_permissions(c, id.as_str(), &role)?;
                            (role, p)
                        }
                    };
                    Some(SpaceCtx {
                        space: id,
                        role,
                        perms,
                    })
                }
            };
            Ok(Ok((
                Auth {
                    caller,
                    space,
                    via: None,
                },
                grant.read_only,
                None,
            )))
        })
        .await??;
    let (auth, read_only, lookup) = auth;
    if read_only && req.method() != axum::http::Method::GET {
        return Ok(crate::api::ask_guard::refuse(&app, &auth, req).await);
    }
    match act_as {
        None => {
            req.extensions_mut().insert(auth);
            Ok(next.run(req).await)
        }
        Some(target) => crate::api::act_as::act_as(app, auth, target, lookup, req, next).await,
    }
}
