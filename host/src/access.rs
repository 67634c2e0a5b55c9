//! Who may do what: workspace roles and the authenticated principal.
//!
//! Every `/v1` request is made by a [`Principal`] (a user acting through one
//! session). Inside a workspace the user holds one [`Role`]; handlers ask for
//! the least role an operation needs with [`WorkspaceAccess::require`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;

/// A member's role in one workspace, from most to least powerful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read only.
    Viewer,
    /// May change pipelines and their parts (sources, destinations, jobs).
    Editor,
    /// Everything, including members, sessions and approval policies.
    Administrator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Administrator => "administrator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "editor" => Some(Role::Editor),
            "administrator" => Some(Role::Administrator),
            _ => None,
        }
    }
}

/// Which kind of client made a request (`X-Service-Client`); recorded on
/// sessions, audit records and approvals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientSource {
    Api,
    Cli,
    Mcp,
}

impl ClientSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientSource::Api => "api",
            ClientSource::Cli => "cli",
            ClientSource::Mcp => "mcp",
        }
    }

    pub fn parse(s: &str) -> Option<ClientSource> {
        match s {
            "api" => Some(ClientSource::Api),
            "cli" => Some(ClientSource::Cli),
            "mcp" => Some(ClientSource::Mcp),
            _ => None,
        }
    }
}

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

/// Recently verified sessions, so the hot path does not ask the database
/// for every request. Used only on the embedded SQLite backend, where this
/// process is the one server and every revocation passes through it (and
/// evicts the entry at once); with PostgreSQL, where replicas share the
/// database, every request reads the session row so a revocation anywhere
/// takes effect on the next request everywhere.
pub struct SessionCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, (crate::store::sessions::ActiveSession, std::time::Instant)>>,
    ttl: std::time::Duration,
}

impl SessionCache {
    /// Entries older than this are verified again.
    pub fn new(ttl: std::time::Duration) -> Self {
        SessionCache { entries: Default::default(), ttl }
    }

    /// The live session of a token hash, if verified recently.
    pub fn get(&self, token_hash: &str, now_ms: i64) -> Option<crate::store::sessions::ActiveSession> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (s, at) = entries.get(token_hash)?;
        (at.elapsed() < self.ttl && s.expires_at.is_none_or(|e| e > now_ms)).then(|| s.clone())
    }

    pub fn put(&self, token_hash: &str, s: crate::store::sessions::ActiveSession) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() > 10_000 {
            entries.clear();
        }
        entries.insert(token_hash.to_owned(), (s, std::time::Instant::now()));
    }

    /// Evicts a revoked session.
    pub fn forget_session(&self, session_id: &str) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, (s, _)| s.session_id != session_id);
    }
}
