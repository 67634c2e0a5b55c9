//! `GET /v1/me`: the current user, session and workspaces (spec section 4,
//! "Current user").

use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Caller;
use super::{Envelope, ok};
use crate::access::ClientSource;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::users::User;
use crate::store::workspaces::WorkspaceWithRole;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_me))
}

/// The caller's identity.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Me {
    pub user: User,
    /// Session the request was authenticated with.
    pub session_id: String,
    /// Client kind named by this request.
    pub client_source: ClientSource,
    /// Workspace used when a request names none.
    pub default_workspace_id: Option<String>,
    /// The first page of the caller's workspaces (see `GET /v1/workspaces`).
    pub workspaces: Vec<WorkspaceWithRole>,
}

/// The current user.
#[utoipa::path(get, path = "/me", tag = "current user",
    responses((status = 200, body = Envelope<Me>), (status = 401, body = crate::error::ErrorBody)))]
async fn get_me(
    axum::extract::State(state): axum::extract::State<AppState>,
    Caller(principal): Caller,
) -> ApiResult<Envelope<Me>> {
    let profile = match state.me_cache.get(&principal.user_id, state.store.membership_generation()) {
        Some(p) => p,
        None => {
            let generation = state.store.membership_generation();
            let p = std::sync::Arc::new(
                state
                    .store
                    .user_with_workspaces(&principal.user_id, super::extract::MAX_LIMIT)
                    .await?
                    .ok_or_else(|| ApiError::unauthenticated("the session's user no longer exists"))?,
            );
            state.me_cache.put(&principal.user_id, generation, p.clone());
            p
        }
    };
    let (user, workspaces) = (profile.0.clone(), profile.1.clone());
    let default_workspace_id = workspaces.first().map(|w| w.workspace_id.clone());
    Ok(ok(Me {
        user,
        session_id: principal.session_id,
        client_source: principal.client,
        default_workspace_id,
        workspaces,
    }))
}
