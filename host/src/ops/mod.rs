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
pub mod pipelines;
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
    /// Creating and changing destinations.
    Destinations,
    /// Creating, changing, pausing, resuming and deleting pipelines.
    Pipelines,
    /// Starting syncs and resets, cancelling jobs.
    Syncs,
}

impl Category {
    /// Every category, in the order policies are listed.
    pub const ALL: &'static [Category] = &[Category::WorkspaceAdmin, Category::Credentials, Category::CredentialEntry, Category::Sources, Category::Destinations, Category::Pipelines, Category::Syncs];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => "workspace_admin",
            Category::Credentials => "credentials",
            Category::CredentialEntry => "credential_entry",
            Category::Sources => "sources",
            Category::Destinations => "destinations",
            Category::Pipelines => "pipelines",
            Category::Syncs => "syncs",
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
            Category::Destinations => "creating and changing destinations",
            Category::Pipelines => "creating, changing, pausing, resuming and deleting pipelines (connections)",
            Category::Syncs => "starting syncs and resets, cancelling jobs",
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
    CreateDestination(pipelines::CreateDestination),
    UpdateDestination(pipelines::UpdateDestination),
    CreatePipeline(pipelines::CreatePipeline),
    UpdatePipeline(pipelines::UpdatePipeline),
    PausePipeline { pipeline_id: String },
    ResumePipeline { pipeline_id: String },
    DeleteConnection { connection_id: String },
    /// Start a sync job.
    SyncPipeline(pipelines::RunPipeline),
    /// Start a reset job (clear destination data and state, sync again).
    ResetPipeline(pipelines::RunPipeline),
    CancelJob { job_id: String },
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
            Operation::CreateDestination(_) => "destinations.create",
            Operation::UpdateDestination(_) => "destinations.update",
            Operation::CreatePipeline(_) => "pipelines.create",
            Operation::UpdatePipeline(_) => "pipelines.update",
            Operation::PausePipeline { .. } => "pipelines.pause",
            Operation::ResumePipeline { .. } => "pipelines.resume",
            Operation::DeleteConnection { .. } => "connections.delete",
            Operation::SyncPipeline(_) => "pipelines.sync",
            Operation::ResetPipeline(_) => "pipelines.reset",
            Operation::CancelJob { .. } => "jobs.cancel",
        }
    }

    pub fn category(&self) -> Category {
        match self {
            Operation::InviteMember(_) | Operation::RemoveMember { .. } | Operation::RevokeSession { .. } => Category::WorkspaceAdmin,
            Operation::ActivateCredential { .. } => Category::Credentials,
            Operation::CreateEntryLink(_) | Operation::StartOAuth { .. } => Category::CredentialEntry,
            Operation::CreateSource(_) | Operation::UpdateSource(_) | Operation::DeleteSource { .. } => Category::Sources,
            Operation::CreateDestination(_) | Operation::UpdateDestination(_) => Category::Destinations,
            Operation::CreatePipeline(_)
            | Operation::UpdatePipeline(_)
            | Operation::PausePipeline { .. }
            | Operation::ResumePipeline { .. }
            | Operation::DeleteConnection { .. } => Category::Pipelines,
            Operation::SyncPipeline(_) | Operation::ResetPipeline(_) | Operation::CancelJob { .. } => Category::Syncs,
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
            Operation::CreateDestination(d) => format!("Create {} destination \"{}\"", d.kind, d.name.trim()),
            Operation::UpdateDestination(d) => format!("Update destination {}", d.destination_id),
            Operation::CreatePipeline(p) => format!("Create pipeline \"{}\" from {} to {}", p.name.trim(), p.source_id, p.destination_id),
            Operation::UpdatePipeline(p) => format!("Update pipeline {}", p.pipeline_id),
            Operation::PausePipeline { pipeline_id } => format!("Pause pipeline {pipeline_id}"),
            Operation::ResumePipeline { pipeline_id } => format!("Resume pipeline {pipeline_id}"),
            Operation::DeleteConnection { connection_id } => format!("Delete connection {connection_id}"),
            Operation::SyncPipeline(r) => format!("Sync pipeline {} (schedule version {:?})", r.pipeline_id, r.schedule_version),
            Operation::ResetPipeline(r) => format!("Reset pipeline {}: clear its destination data and state, then sync from scratch", r.pipeline_id),
            Operation::CancelJob { job_id } => format!("Cancel job {job_id}"),
        }
    }

    /// The least role that may perform the operation.
    pub fn required_role(&self) -> Role {
        match self.category() {
            Category::WorkspaceAdmin => Role::Administrator,
            Category::Credentials | Category::CredentialEntry | Category::Sources | Category::Destinations | Category::Pipelines | Category::Syncs => {
                Role::Editor
            }
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
        Operation::CreateDestination(r) => pipelines::create_destination(state, access, note, r).await,
        Operation::UpdateDestination(r) => pipelines::update_destination(state, access, note, r).await,
        Operation::CreatePipeline(r) => pipelines::create_pipeline(state, access, note, r).await,
        Operation::UpdatePipeline(r) => pipelines::update_pipeline(state, access, note, r).await,
        Operation::PausePipeline { pipeline_id } => pipelines::set_status(state, access, note, &pipeline_id, "paused").await,
        Operation::ResumePipeline { pipeline_id } => pipelines::set_status(state, access, note, &pipeline_id, "active").await,
        Operation::DeleteConnection { connection_id } => pipelines::delete_connection(state, access, note, &connection_id).await,
        Operation::SyncPipeline(r) => {
            let trigger = if access.principal.session_id.is_empty() { "approval" } else { "manual" };
            pipelines::run(state, access, note, r, "sync", trigger).await
        }
        Operation::ResetPipeline(r) => pipelines::run(state, access, note, r, "reset", "manual").await,
        Operation::CancelJob { job_id } => pipelines::cancel_job(state, access, note, &job_id).await,
    }
}
