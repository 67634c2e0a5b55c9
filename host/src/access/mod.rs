//! Who may do what: workspace roles and the authenticated principal.
//!
//! Every `/v1` request is made by a [`Principal`] (a user acting through one
//! session, whose client kind is the session's). Inside a workspace the
//! user holds one [`Role`]; handlers ask for the least role an operation
//! needs with [`WorkspaceAccess::require`].
//!
//! Layout:
//! - this module: [`Principal`], [`WorkspaceAccess`], and the role and
//!   client kinds (defined with the records that store them);
//! - [`address`]: the client address of a request (behind trusted
//!   proxies too);
//! - [`tokens`]: opaque bearer tokens and single-use codes;
//! - [`throttle`]: request rate limits per address and per session, and
//!   sign-in attempts per address and per account;
//! - [`passwords`]: Argon2id password hashes for web sign-in;
//! - [`admin`]: first-run bootstrap and the offline admin commands.

use crate::error::ApiError;

pub(crate) mod address;
pub mod admin;
pub mod passwords;
pub mod throttle;
pub mod tokens;

pub use crate::store::sessions::ClientSource;
pub use crate::store::workspaces::Role;

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user_id: String,
    pub session_id: String,
    /// The client kind named by this request's `X-Service-Client` header
    /// (`api` when absent).
    pub client: ClientSource,
    /// `X-Service-Execution-Mode: proposal`: writes become proposals.
    pub proposal_requested: bool,
}

/// A principal's standing in the workspace a request addresses.
#[derive(Debug, Clone)]
pub struct WorkspaceAccess {
    pub principal: Principal,
    pub workspace_id: String,
    pub role: Role,
}

impl WorkspaceAccess {
    /// The principal's standing in `requested`, or in their first
    /// workspace when none is named; 404 for a workspace they are not in.
    pub async fn resolve(
        store: &crate::store::Store,
        principal: Principal,
        requested: Option<String>,
    ) -> Result<WorkspaceAccess, ApiError> {
        let (workspace_id, role) = match requested {
            Some(id) => {
                let role =
                    store.role_in(&principal.user_id, &id).await?.ok_or_else(|| ApiError::not_found("workspace"))?;
                (id, role)
            }
            None => {
                store.default_workspace_of(&principal.user_id).await?.ok_or_else(|| ApiError::not_found("workspace"))?
            }
        };
        Ok(WorkspaceAccess { principal, workspace_id, role })
    }

    /// Fails with the spec's permission-denied error (HTTP 403, code `"403"`)
    /// unless the caller holds at least `needed`.
    pub fn require(&self, needed: Role) -> Result<(), ApiError> {
        if self.role >= needed {
            Ok(())
        } else {
            Err(ApiError::permission_denied(format!(
                "permission denied: this operation needs the {} role in the workspace",
                needed.as_str()
            )))
        }
    }
}
