//! Write operations, as data.
//!
//! Every state-changing request is turned into an [`Operation`] and handed to
//! [`submit`], the single door to execution. Keeping operations as
//! serialisable values is what lets the approval gate store one as a
//! proposal and run it later exactly as it would have run now.
//!
//! Layout: one module per resource holds the execution of its operations
//! (`members`, `sessions`); this module holds the enum, its metadata
//! (category, action name, least role) and the door.

pub mod credentials;
pub mod members;
pub mod sessions;
pub mod sources;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::access::{Role, WorkspaceAccess};
use crate::error::ApiResult;
use crate::http::middleware::AuditNote;
use crate::server::AppState;

/// Approval categories: every operation belongs to exactly one, and
/// workspace administrators choose per category whether MCP clients need
/// approval for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Members, invitations and sessions.
    WorkspaceAdmin,
    /// Activating stored credentials.
    Credentials,
    /// Asking for a credential-entry link (a person then types the secret).
    CredentialEntry,
    /// Creating, changing and deleting sources.
    Sources,
}

impl Category {
    /// Every category, in the order policies are listed.
    pub const ALL: &'static [Category] = &[Category::WorkspaceAdmin, Category::Credentials, Category::CredentialEntry, Category::Sources];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => "workspace_admin",
            Category::Credentials => "credentials",
            Category::CredentialEntry => "credential_entry",
            Category::Sources => "sources",
        }
    }

    /// Whether MCP writes of this category need approval until an
    /// administrator says otherwise. Entry links need none by default: the
    /// person typing the secret is the approval.
    pub fn default_requires_approval(self) -> bool {
        !matches!(self, Category::CredentialEntry)
    }

    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// What the category covers, for people choosing policies.
    pub fn description(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => "inviting and removing members, revoking sessions",
            Category::Credentials => "activating credentials stored through a credential flow",
            Category::CredentialEntry => "creating single-use links where a person enters a secret, and starting OAuth flows",
            Category::Sources => "creating, changing and deleting sources",
        }
    }
}

/// A state-changing operation with everything it needs to run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub enum Operation {
    /// Invite someone to the workspace.
    InviteMember(members::InviteMember),
    /// Remove a membership.
    RemoveMember { member_id: String },
    /// Revoke a session of a workspace member.
    RevokeSession { session_id: String },
    /// Activate a credential whose secret was sealed by a credential flow.
    ActivateCredential { credential_id: String },
    /// Create a single-use link where a person enters a secret.
    CreateEntryLink(credentials::EntryLinkRequest),
    /// Start an OAuth flow (a connector id, or `taskapp`).
    StartOAuth { target: String },
    /// Create a source.
    CreateSource(sources::CreateSource),
    /// Change a source's name or configuration.
    UpdateSource(sources::UpdateSource),
    /// Delete a source no pipeline uses.
    DeleteSource { source_id: String },
}

impl Operation {
    /// Stable action name used in audit records.
    pub fn action(&self) -> &'static str {
        match self {
            Operation::InviteMember(_) => "members.invite",
            Operation::RemoveMember { .. } => "members.remove",
            Operation::RevokeSession { .. } => "sessions.revoke",
            Operation::ActivateCredential { .. } => "credentials.create",
            Operation::CreateEntryLink(_) => "credentials.entry_link",
            Operation::StartOAuth { .. } => "credentials.oauth_start",
            Operation::CreateSource(_) => "sources.create",
            Operation::UpdateSource(_) => "sources.update",
            Operation::DeleteSource { .. } => "sources.delete",
        }
    }

    pub fn category(&self) -> Category {
        match self {
            Operation::InviteMember(_) | Operation::RemoveMember { .. } | Operation::RevokeSession { .. } => Category::WorkspaceAdmin,
            Operation::ActivateCredential { .. } => Category::Credentials,
            Operation::CreateEntryLink(_) | Operation::StartOAuth { .. } => Category::CredentialEntry,
            Operation::CreateSource(_) | Operation::UpdateSource(_) | Operation::DeleteSource { .. } => Category::Sources,
        }
    }

    /// One line a person can judge a proposal by.
    pub fn summary(&self) -> String {
        match self {
            Operation::InviteMember(i) => format!("Invite {} to the workspace as {}", i.email.trim(), i.role.as_str()),
            Operation::RemoveMember { member_id } => format!("Remove member {member_id} from the workspace"),
            Operation::RevokeSession { session_id } => format!("Revoke session {session_id}"),
            Operation::ActivateCredential { credential_id } => format!("Activate credential {credential_id}"),
            Operation::CreateEntryLink(r) => format!("Create a {} credential-entry link for {}", r.kind, r.hosts.join(", ")),
            Operation::StartOAuth { target } => format!("Start an OAuth authorisation for {target}"),
            Operation::CreateSource(s) => format!("Create source \"{}\" with connector {}", s.name.trim(), s.connector_id),
            Operation::UpdateSource(s) => format!("Update source {}", s.source_id),
            Operation::DeleteSource { source_id } => format!("Delete source {source_id}"),
        }
    }

    /// The least role that may perform the operation.
    pub fn required_role(&self) -> Role {
        match self.category() {
            Category::WorkspaceAdmin => Role::Administrator,
            Category::Credentials | Category::CredentialEntry | Category::Sources => Role::Editor,
        }
    }
}

/// What an executed operation answered.
#[derive(Debug)]
pub struct Executed {
    pub status: StatusCode,
    pub data: Value,
}

impl Executed {
    pub fn ok(data: impl Serialize) -> ApiResult<Self> {
        Ok(Executed { status: StatusCode::OK, data: serde_json::to_value(data).map_err(crate::error::ApiError::internal)? })
    }

    pub fn created(data: impl Serialize) -> ApiResult<Self> {
        Ok(Executed { status: StatusCode::CREATED, data: serde_json::to_value(data).map_err(crate::error::ApiError::internal)? })
    }
}

impl axum::response::IntoResponse for Executed {
    fn into_response(self) -> axum::response::Response {
        let mut envelope = crate::http::ok(self.data).into_response();
        *envelope.status_mut() = self.status;
        envelope
    }
}

/// The door every write goes through: checks the caller's role, notes the
/// action for the audit record, and lets the approval gate decide between
/// executing now and storing a proposal.
pub async fn submit(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, op: Operation) -> ApiResult<Executed> {
    note.action(op.action());
    access.require(op.required_role())?;
    crate::approvals::gate(state, access, note, op).await
}

/// Runs an operation that has been allowed. Only the gate calls this.
pub(crate) async fn execute(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, op: Operation) -> ApiResult<Executed> {
    note.action(op.action());
    match op {
        Operation::InviteMember(invite) => members::invite(state, access, note, invite).await,
        Operation::RemoveMember { member_id } => members::remove(state, access, note, &member_id).await,
        Operation::RevokeSession { session_id } => sessions::revoke(state, access, note, &session_id).await,
        Operation::ActivateCredential { credential_id } => credentials::activate(state, access, note, &credential_id).await,
        Operation::CreateEntryLink(req) => credentials::create_entry_link(state, access, note, req).await,
        Operation::StartOAuth { target } => credentials::start_oauth(state, access, note, &target).await,
        Operation::CreateSource(req) => sources::create(state, access, note, req).await,
        Operation::UpdateSource(req) => sources::update(state, access, note, req).await,
        Operation::DeleteSource { source_id } => sources::delete(state, access, note, &source_id).await,
    }
}
