//! Extensions in a space (issue 29): which installed extensions exist and
//! which this space enabled; a space admin (`ext.manage`) enables or
//! disables one. Installing is the operator's (`mercury ext add`), never a
//! space's.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, audited, path_arg, Json, PathArg};
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::clock::now_ms;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::perms::Permission;
use crate::storage::extensions as rows;

pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(extensions_list))
        .routes(routes!(extension_enable))
        .routes(routes!(extension_disable))
}

/// Across a link: the list only. Enabling is `ext.manage`, which no link
/// hands out (it widens what the space's agent can reach).
pub(crate) const ACT_AS: &[ActAsRoute] = &[ActAsRoute::new("GET", "/api/extensions", Read)];

/// An installed extension and whether this space enabled it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExtensionRow {
    pub name: String,
    pub description: Option<String>,
    pub enabled: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExtensionList {
    pub extensions: Vec<ExtensionRow>,
}

/// What enabling or disabling did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExtensionSet {
    pub name: String,
    pub enabled: bool,
    /// The row changed (false: it already was so).
    pub changed: bool,
}

#[utoipa::path(get, path = "/api/extensions", operation_id = "listExtensions", summary = "List installed extensions and which this space enabled", tag = "extensions",
    responses((status = 200, description = "Installed extensions, and which this space enabled", body = ExtensionList)))]
pub(crate) async fn extensions_list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<ExtensionList>> {
    let space = auth.require(Permission::ConfigGet)?.space.to_string();
    let (all, enabled) = app
        .rt
        .store
        .read(move |c| Ok((rows::list(c)?, rows::enabled_in(c, &space)?)))
        .await?;
    let extensions = all
        .into_iter()
        .map(|r| ExtensionRow {
            enabled: enabled.iter().any(|e| e.name == r.name),
            description: crate::extensions::manifest::parse(&r.name, &r.manifest)
                .ok()
                .and_then(|m| m.description),
            name: r.name,
        })
        .collect();
    Ok(Json(ExtensionList { extensions }))
}

#[utoipa::path(post, path = "/api/extensions/{name}/enable", operation_id = "enableExtension", summary = "Offer an installed extension's tools in this space", tag = "extensions",
    params(("name" = String, Path, description = "The installed extension")),
    responses((status = 200, description = "Enabled (a 404: not installed)", body = ExtensionSet)))]
pub(crate) async fn extension_enable(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    name: PathArg<String>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<ExtensionSet>)> {
    let sid = auth.require(Permission::ExtManage)?.space.clone();
    let name = path_arg(name)?;
    let (space, by, n) = (sid.to_string(), auth.caller.caller_id.clone(), name.clone());
    let (before, installed) = apply(&app, &sid, move |tx| {
        let before = rows::enabled_in(tx, &space)?.iter().any(|e| e.name == n);
        Ok((before, rows::enable(tx, &space, &n, &by, now_ms())?))
    })
    .await?;
    if !installed {
        return Err(ApiError::not_found(format!(
            "no extension named {name:?} is installed (the operator installs with `mercury ext add`)"
        )));
    }
    Ok(audited(
        json!({ "enabled": before }),
        ExtensionSet {
            name,
            enabled: true,
            changed: !before,
        },
    ))
}

#[utoipa::path(post, path = "/api/extensions/{name}/disable", operation_id = "disableExtension", summary = "Stop offering an extension's tools in this space", tag = "extensions",
    params(("name" = String, Path, description = "The extension")),
    responses((status = 200, description = "Disabled (or was not enabled)", body = ExtensionSet)))]
pub(crate) async fn extension_disable(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    name: PathArg<String>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<ExtensionSet>)> {
    let sid = auth.require(Permission::ExtManage)?.space.clone();
    let name = path_arg(name)?;
    let (space, n) = (sid.to_string(), name.clone());
    let changed = apply(&app, &sid, move |tx| rows::disable(tx, &space, &n)).await?;
    Ok(audited(
        json!({ "enabled": changed }),
        ExtensionSet {
            name,
            enabled: false,
            changed,
        },
    ))
}
