//! Who is looking: the sign-in cookie resolved to its caller, the CSRF
//! check of every state-changing form, and the caller's role in a space
//! decided by the same code as the API's auth step (`crate::perms`).
//!
//! Must never: take a caller from anything but a live sign-in (never a form
//! field, a query or a header), or compare a CSRF token in a way whose time
//! depends on how much of it matched.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};

use super::error::{UiError, UiResult};
use crate::app::App;
use crate::clock::now_ms;
use crate::ids::SpaceId;
use crate::links::LinkLevel;
use crate::perms::{self, PermSet, Permission};
use crate::storage::links::{self as link_audit, AuditRow};
use crate::storage::signins::{self, Signin};
use crate::storage::spaces;

pub(super) const COOKIE: &str = "mercury_ui";
/// How long a sign-in lasts (12 hours); signing in again makes a new one.
pub(super) const SIGNIN_TTL_MS: i64 = 12 * 3600 * 1000;
/// How long a one-time link from `mrctl ui login` may be used (5 minutes).
pub(super) const LINK_TTL_MS: i64 = 5 * 60 * 1000;

/// The signed-in caller of a dashboard request.
#[derive(Debug, Clone)]
pub(super) struct Viewer {
    pub(super) signin: Signin,
    pub(super) global_admin: bool,
}

impl Viewer {
    pub(super) fn caller(&self) -> &str {
        &self.signin.caller_id
    }

    /// Refuses a viewer who is not a global admin; `what` names the page.
    pub(super) fn require_admin(&self, what: &str) -> UiResult<()> {
        if self.global_admin {
            Ok(())
        } else {
            Err(UiError::Forbidden(format!("{what} are for global admins")))
        }
    }

    /// Refuses a form whose `csrf` field is not this sign-in's.
    pub(super) fn check_csrf(&self, sent: &str) -> UiResult<()> {
        if equal_in_constant_time(sent.as_bytes(), self.signin.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(UiError::Csrf)
        }
    }
}

fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The sign-in cookie's secret, if the request carries one.
pub(super) fn cookie_secret(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// The `Set-Cookie` value of a new sign-in; `Secure` when the request came
/// over TLS (a proxy in front of the host says so in `X-Forwarded-Proto`).
pub(super) fn set_cookie(secret: &str, tls: bool) -> String {
    format!(
        "{COOKIE}={secret}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SIGNIN_TTL_MS / 1000,
        if tls { "; Secure" } else { "" }
    )
}

pub(super) fn clear_cookie(tls: bool) -> String {
    format!(
        "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if tls { "; Secure" } else { "" }
    )
}

pub(super) fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

impl FromRequestParts<Arc<App>> for Viewer {
    type Rejection = UiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> UiResult<Self> {
        let secret = cookie_secret(&parts.headers).ok_or(UiError::SignedOut)?;
        let now = now_ms();
        let signin = app
            .rt
            .store
            .read(move |c| signins::resolve(c, &secret, now))
            .await?
            .ok_or(UiError::SignedOut)?;
        let id = signin.id.clone();
        // Only shown in the sign-ins list: a lost write costs nothing.
        app.rt
            .store
            .write_detached("ui sign-in seen", move |tx| signins::touch(tx, &id, now))
            .await;
        let global_admin = app.rt.settings.is_global_admin(&signin.caller_id);
        Ok(Viewer {
            signin,
            global_admin,
        })
    }
}

/// The viewer's role and permissions in one space.
#[derive(Debug, Clone)]
pub(super) struct SpaceAccess {
    pub(super) space: SpaceId,
    pub(super) role: String,
    pub(super) perms: PermSet,
    /// Set when the access is a space link's, not a role's in this space.
    pub(super) via: Option<LinkReach>,
}

/// Access to a space through a link from a space where the viewer holds a
/// role with `links.act` (D-011): read-only on the dashboard, audited.
#[derive(Debug, Clone)]
pub(super) struct LinkReach {
    pub(super) holder: String,
    pub(super) edge_id: i64,
    pub(super) level: &'static str,
}

/// What the dashboard shows across a link: the reads of a `read` link
/// (messages, preferences, tasks, mutes). Writes across a link stay with
/// `mrctl --space`, where each is audited with what it changed.
const LINK_READS: [Permission; 4] = [
    Permission::MessagesRead,
    Permission::PrefsGet,
    Permission::TasksList,
    Permission::MutesList,
];

impl SpaceAccess {
    pub(super) fn has(&self, perm: Permission) -> bool {
        self.perms.contains(&perm)
    }

    pub(super) fn require(&self, perm: Permission) -> UiResult<()> {
        if self.has(perm) {
            Ok(())
        } else {
            Err(UiError::Forbidden(format!(
                "you need the '{perm}' permission in space {} for this",
                self.space
            )))
        }
    }
}

/// Resolves the viewer's role in `raw` as the API's auth step does for a
/// user token (a global admin is admin everywhere; else a granted role,
/// then `member` for one who has spoken there, else none) and refuses a
/// space where the viewer may not read messages.
pub(super) async fn space_access(app: &App, viewer: &Viewer, raw: &str) -> UiResult<SpaceAccess> {
    let space = SpaceId::parse(raw).map_err(|e| UiError::BadRequest(e.to_string()))?;
    let caller = viewer.caller().to_owned();
    let admin = viewer.global_admin;
    let id = space.clone();
    let found = app
        .rt
        .store
        .read(move |c| {
            if !spaces::space_exists(c, id.as_str())? {
                return Ok(None);
            }
            let role = perms::resolve_role(c, id.as_str(), &caller, admin)?;
            let perms = perms::role_permissions(c, id.as_str(), &role)?;
            Ok(Some((role, perms)))
        })
        .await?;
    // A space the viewer has no role in is refused the same way whether or
    // not it exists: the answer must not reveal other spaces.
    let refused = || UiError::Forbidden(format!("you have no access to space {space}"));
    let (role, perms) = found.ok_or_else(refused)?;
    let access = SpaceAccess {
        space: space.clone(),
        role,
        perms,
        via: None,
    };
    if !access.has(Permission::MessagesRead) {
        return Err(refused());
    }
    Ok(access)
}

/// [`space_access`], or else, when `via` names a space, the reach a link
/// from it gives, decided as the API's act-as step decides a read (the
/// viewer needs `links.act` in `via`; an unfiltered, unrevoked edge
/// `via` → `raw` at `read` or above, a link never raising a non-admin of
/// `via` above `read`). Every read through a link writes one audit row, as
/// an act-as read does. A refusal says the same whether or not the target
/// exists.
pub(super) async fn space_access_via(
    app: &App,
    viewer: &Viewer,
    raw: &str,
    via: &str,
    route: &str,
) -> UiResult<SpaceAccess> {
    let direct = space_access(app, viewer, raw).await;
    let via = via.trim();
    if via.is_empty() || via == raw || !matches!(direct, Err(UiError::Forbidden(_))) {
        return direct;
    }
    let holder = space_access(app, viewer, via).await?;
    holder.require(Permission::LinksAct)?;
    let target = SpaceId::parse(raw).map_err(|e| UiError::BadRequest(e.to_string()))?;
    let (h, t) = (holder.space.to_string(), target.to_string());
    let grants = app
        .rt
        .store
        .read(move |c| {
            if !spaces::space_exists(c, &t)? {
                return Ok(Vec::new());
            }
            crate::links::active_grants(c, &h, &t)
        })
        .await?;
    let cap = if holder.role == perms::ROLE_ADMIN {
        LinkLevel::Admin
    } else {
        LinkLevel::Read
    };
    let grant =
        crate::links::grant_for_request(&grants, LinkLevel::Read, false, cap).map_err(|_| {
            UiError::Forbidden(format!(
                "no space link from {} grants you access to space {target}",
                holder.space
            ))
        })?;
    let row = AuditRow {
        caller_id: viewer.caller().to_owned(),
        action: "act".into(),
        holder_space_id: Some(holder.space.to_string()),
        target_space_id: Some(target.to_string()),
        link_id: Some(grant.edge_id),
        level: Some(grant.level.as_str().to_owned()),
        method: Some("GET".into()),
        route: Some(route.to_owned()),
        path: Some(route.replace("{space}", target.as_str())),
        status: Some(200),
        detail: Some("dashboard".into()),
        ..Default::default()
    };
    // Written before the page is answered, so no read leaves none behind.
    app.rt
        .store
        .write(move |tx| link_audit::audit(tx, &row).map(|_| ()))
        .await?;
    Ok(SpaceAccess {
        space: target,
        role: format!("via link #{} from {}", grant.edge_id, holder.space),
        perms: LINK_READS.into_iter().collect(),
        via: Some(LinkReach {
            holder: holder.space.to_string(),
            edge_id: grant.edge_id,
            level: grant.level.as_str(),
        }),
    })
}
