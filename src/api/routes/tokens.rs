//! API tokens: a global admin mints `user` and `adapter` tokens (the secret is
//! shown once), lists them without secrets, and revokes them.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{body, path_arg, Body, Json, PathArg};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::clock::{now_ms, parse_duration_ms};
use crate::links::ActAsRoute;
use crate::storage::tokens::{self, NewToken, TokenInfo, TokenKind};

/// Minting, listing and revoking tokens.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(revoke))
}

/// None on purpose: tokens are instance-wide and for global admins only.
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateToken {
    #[schema(min_length = 1, max_length = 200)]
    caller_id: String,
    /// `user` (default) or `adapter`.
    kind: Option<String>,
    /// The platform an adapter token is bound to (required for adapters).
    platform: Option<String>,
    /// At most 200 characters, no control character.
    label: Option<String>,
    /// A duration (`30d`); default: never expires.
    expires_in: Option<String>,
    /// Limits a user token to one scope (`review.read`); it is then read-only.
    #[schema(pattern = "^review\\.read$")]
    scope: Option<String>,
    /// Adapter tokens only: the identity mappings (`mrctl identities link`)
    /// of the senders it posts hold, so a mapped sender acts as its
    /// operator. Without it a mapped sender is only itself: an adapter token
    /// can name any sender id.
    #[serde(default)]
    trusted_identities: bool,
}

/// A minted token: `token` is the secret, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Minted {
    pub id: String,
    pub token: String,
    pub caller_id: String,
    pub kind: TokenKind,
    pub platform: Option<String>,
    /// `review.read` limits the token to the review reports.
    pub scope: Option<String>,
    pub expires_at: Option<i64>,
    /// The identity mappings of its senders hold (adapter tokens only).
    pub trusted_identities: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TokenRevoked {
    pub id: String,
    pub revoked: bool,
}

#[utoipa::path(post, path = "/api/tokens", operation_id = "createToken", summary = "Mint an API token", tag = "tokens", request_body = CreateToken,
    responses((status = 201, description = "Minted", body = Minted)))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<CreateToken>,
) -> ApiResult<(StatusCode, Json<Minted>)> {
    auth.require_global_admin()?;
    let b = body(b)?;
    crate::ids::validate_caller_id(&b.caller_id).map_err(ApiError::bad_request)?;
    let kind = match b.kind.as_deref().unwrap_or("user") {
        "user" => TokenKind::User,
        "adapter" => TokenKind::Adapter,
        other => {
            return Err(ApiError::bad_request(format!(
                "token kind {other:?} must be user or adapter"
            )))
        }
    };
    // A shadow has no platform adapter (issue 14): an adapter token would let
    // a real platform talk to the rehearsal.
    if kind == TokenKind::Adapter && app.rt.outbound.is_shadow() {
        app.rt.outbound.record_refusal(
            None,
            "adapter",
            "would have minted an adapter token for a platform adapter",
        );
        return Err(ApiError::forbidden(
            "this host is a shadow: it has no platform adapter, so it mints no adapter token",
        ));
    }
    let platform =
        match (kind, b.platform.as_deref()) {
            (TokenKind::Adapter, Some(p)) => {
                crate::ids::validate_platform(p)
                    .map_err(|m| ApiError::bad_request(format!("platform: {m}")))?;
                Some(p.to_owned())
            }
            (TokenKind::Adapter, None) => return Err(ApiError::bad_request(
                "an adapter token is bound to one platform: give platform (--platform telegram)",
            )),
            (_, Some(_)) => {
                return Err(ApiError::bad_request(
                    "platform applies to adapter tokens only",
                ))
            }
            (_, None) => {
                // A person's id can never look like a platform sender's.
                crate::ids::validate_operator_id(&b.caller_id).map_err(ApiError::bad_request)?;
                None
            }
        };
    let expires_at = b
        .expires_in
        .as_deref()
        .map(|d| parse_duration_ms(d).map(|ms| now_ms() + ms))
        .transpose()
        .map_err(|m| ApiError::bad_request(format!("expires_in: {m}")))?;
    if let Some(l) = &b.label {
        super::name_field("label", l, 200)?;
    }
    let scope = match (kind, b.scope.as_deref()) {
        (_, None) => None,
        (TokenKind::User, Some(s)) if tokens::SCOPES.contains(&s) => Some(s.to_owned()),
        (TokenKind::User, Some(_)) => {
            return Err(ApiError::bad_request(format!(
                "scope must be one of: {}",
                tokens::SCOPES.join(", ")
            )))
        }
        (_, Some(_)) => {
            return Err(ApiError::bad_request("scope applies to user tokens only"))
        }
    };
    let trusted = b.trusted_identities;
    if trusted && kind != TokenKind::Adapter {
        return Err(ApiError::bad_request(
            "trusted_identities applies to adapter tokens only",
        ));
    }
    let by = auth.caller.caller_id.clone();
    let caller = b.caller_id.clone();
    let bound = platform.clone();
    let scoped = scope.clone();
    let (id, secret) = app
        .rt
        .store
        .write(move |tx| {
            let minted = tokens::mint(
                tx,
                &NewToken {
                    caller_id: &caller,
                    kind,
                    space_id: None,
                    run_id: None,
                    label: b.label.as_deref(),
                    created_by: Some(&by),
                    expires_at,
                    role: None,
                    read_only: false,
                },
            )?;
            if let Some(p) = &bound {
                tokens::bind_platform(tx, &minted.0, p)?;
            }
            if let Some(s) = &scoped {
                tokens::bind_scope(tx, &minted.0, s)?;
            }
            if trusted {
                tokens::trust_identities(tx, &minted.0)?;
            }
            Ok(minted)
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(Minted {
            id,
            token: secret,
            caller_id: b.caller_id,
            kind,
            platform,
            scope,
            expires_at,
            trusted_identities: trusted,
        }),
    ))
}

#[utoipa::path(get, path = "/api/tokens", operation_id = "listTokens", summary = "List every API token (never the secrets)", tag = "tokens",
    responses((status = 200, description = "Every token, without secrets", body = TokenList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<TokenList>> {
    auth.require_global_admin()?;
    let list = app.rt.store.read(tokens::list).await?;
    Ok(Json(TokenList { tokens: list }))
}

#[utoipa::path(delete, path = "/api/tokens/{id}", operation_id = "revokeToken", summary = "Revoke an API token", tag = "tokens",
    params(("id" = String, Path, description = "The token's id (not its secret)")),
    responses((status = 200, description = "Revoked", body = TokenRevoked)))]
pub(crate) async fn revoke(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<String>,
) -> ApiResult<Json<TokenRevoked>> {
    let id = path_arg(id)?;
    auth.require_global_admin()?;
    let id2 = id.clone();
    app.rt
        .store
        .write(move |tx| tokens::revoke(tx, &id2))
        .await?;
    Ok(Json(TokenRevoked { id, revoked: true }))
}
