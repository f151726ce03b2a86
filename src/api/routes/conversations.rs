//! Conversations: list the space's chats, link a chat to a space, unlink it.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, body, params, path_arg, Body, Json, Params, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::storage::conversations::{self, Conversation};
use crate::storage::spaces;

/// The space's conversations, and linking a chat to a space.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(link))
        .routes(routes!(unlink))
}

/// Across a link: the list (also for a conversation-filtered edge; `?all=true`
/// is 403 through a link, D-005). Relinking a conversation is absent on purpose.
pub(crate) const ACT_AS: &[ActAsRoute] = &[ActAsRoute::conversation_read("GET", "/api/conversations")];

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Every space's conversations (global admin; 403 through a link).
    #[serde(default)]
    all: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConversationList {
    pub conversations: Vec<Conversation>,
}

#[utoipa::path(get, path = "/api/conversations", operation_id = "listConversations", summary = "List the space's conversations", tag = "conversations", params(ListQuery),
    responses((status = 200, description = "The space's conversations", body = ConversationList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<ListQuery>,
) -> ApiResult<Json<ConversationList>> {
    let q = params(q)?;
    if q.all && auth.via.is_some() {
        // D-005: the instance-wide views are out of a link's reach.
        return Err(ApiError::forbidden(
            "?all=true lists every space's conversations and cannot be used across a space link",
        ));
    }
    let scope = if q.all {
        auth.require_global_admin()?;
        None
    } else {
        Some(auth.require(Permission::SpacesList)?.space.to_string())
    };
    let only = auth.via.as_ref().and_then(|v| v.conversation);
    let list: Vec<_> = app
        .rt
        .store
        .read(move |c| conversations::list(c, scope.as_deref()))
        .await?
        .into_iter()
        .filter(|c| only.is_none_or(|id| c.id == id))
        .collect();
    Ok(Json(ConversationList {
        conversations: list,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LinkBody {
    #[schema(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    space_id: String,
}

/// A conversation and the space it belongs to now (`null`: none).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConversationSpace {
    pub conversation_id: i64,
    pub space_id: Option<String>,
}

#[utoipa::path(post, path = "/api/conversations/{id}/link", operation_id = "linkConversation", summary = "Route a conversation's messages to a space", tag = "conversations",
    params(("id" = i64, Path, description = "The conversation")), request_body = LinkBody,
    responses((status = 200, description = "Linked", body = ConversationSpace)))]
pub(crate) async fn link(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
    b: Body<LinkBody>,
) -> ApiResult<Json<ConversationSpace>> {
    let id = path_arg(id)?;
    let ctx = auth.require(Permission::SpacesRename)?;
    let target =
        SpaceId::parse(&body(b)?.space_id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if target != ctx.space && !auth.caller.global_admin {
        return Err(ApiError::forbidden(
            "only a global admin may link a conversation to another space",
        ));
    }
    let t = target.to_string();
    let out = apply(&app, &target, move |tx| {
            if !spaces::space_exists(tx, &t)? {
                return Err(crate::storage::StoreError::NotFound(format!("space {t}")));
            }
            conversations::get(tx, id)?.ok_or_else(|| {
                crate::storage::StoreError::NotFound(format!("conversation {id}"))
            })?;
            conversations::set_space(tx, id, Some(&t))?;
            Ok(ConversationSpace {
                conversation_id: id,
                space_id: Some(t),
            })
        })
        .await?;
    Ok(Json(out))
}

#[utoipa::path(post, path = "/api/conversations/{id}/unlink", operation_id = "unlinkConversation", summary = "Detach a conversation from its space", tag = "conversations",
    params(("id" = i64, Path, description = "The conversation")),
    responses((status = 200, description = "Unlinked", body = ConversationSpace)))]
pub(crate) async fn unlink(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    id: PathArg<i64>,
) -> ApiResult<Json<ConversationSpace>> {
    let id = path_arg(id)?;
    let ctx = auth.require(Permission::SpacesRename)?;
    let sid = ctx.space.clone();
    let space = sid.to_string();
    let global = auth.caller.global_admin;
    let out = apply(&app, &sid, move |tx| {
            let conv = conversations::get(tx, id)?.ok_or_else(|| {
                crate::storage::StoreError::NotFound(format!("conversation {id}"))
            })?;
            if conv.space_id.as_deref() != Some(space.as_str()) && !global {
                return Err(crate::storage::StoreError::NotFound(format!(
                    "conversation {id} in this space"
                )));
            }
            conversations::set_space(tx, id, None)?;
            Ok(ConversationSpace {
                conversation_id: id,
                space_id: None,
            })
        })
        .await?;
    Ok(Json(out))
}
