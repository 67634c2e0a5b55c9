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
pub mod plugins;
pub mod sessions;
pub mod sources;
pub mod text;

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
    /// Loading and unloading connector plugins (installation operators).
    Plugins,
}

impl Category {
    /// Every category, in the order policies are listed.
    pub const ALL: &'static [Category] = &[Category::WorkspaceAdmin, Category::Credentials, Category::CredentialEntry, Category::Sources, Category::Destinations, Category::Pipelines, Category::Syncs, Category::Plugins];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => "workspace_admin",
            Category::Credentials => "credentials",
            Category::CredentialEntry => "credential_entry",
            Category::Sources => "sources",
            Category::Destinations => "destinations",
            Category::Pipelines => "pipelines",
            Category::Syncs => "syncs",
            Category::Plugins => "plugins",
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
            Category::Plugins => "loading and unloading connector plugins (installation operators)",
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
    /// Change a category's approval policy.
    SetApprovalPolicy(PolicyChange),
    /// Disable a connector everywhere (installation operators).
    UnloadPlugin { connector_id: String },
    /// Enable a connector again (installation operators).
    LoadPlugin { connector_id: String },
}

/// A change of one category's approval policy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    pub category: Category,
    /// Whether writes of this category from MCP clients need approval.
    pub requires_approval: Option<bool>,
    /// The least role that may approve or reject its proposals.
    pub approver_role: Option<Role>,
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
            Operation::SetApprovalPolicy(_) => "approval_policies.update",
            Operation::UnloadPlugin { .. } => "plugins.unload",
            Operation::LoadPlugin { .. } => "plugins.load",
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
            Operation::SetApprovalPolicy(_) => Category::WorkspaceAdmin,
            Operation::UnloadPlugin { .. } | Operation::LoadPlugin { .. } => Category::Plugins,
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
            Operation::SetApprovalPolicy(c) => format!(
                "Set the approval policy of {}:{}{}",
                c.category.as_str(),
                c.requires_approval.map(|r| format!(" requires_approval={r}")).unwrap_or_default(),
                c.approver_role.map(|r| format!(" approver_role={}", r.as_str())).unwrap_or_default()
            ),
            Operation::UnloadPlugin { connector_id } => format!("Unload plugin {connector_id}: its connector becomes unavailable on every server"),
            Operation::LoadPlugin { connector_id } => format!("Load plugin {connector_id}"),
        }
    }

    /// The least role that may perform the operation.
    pub fn required_role(&self) -> Role {
        match self.category() {
            Category::WorkspaceAdmin | Category::Plugins => Role::Administrator,
            Category::Credentials | Category::CredentialEntry | Category::Sources | Category::Destinations | Category::Pipelines | Category::Syncs => {
                Role::Editor
            }
        }
    }

    /// Whether only installation operators may perform it (and decide its
    /// proposals).
    pub fn needs_operator(&self) -> bool {
        self.category() == Category::Plugins
    }

    /// Whether an MCP client may not even propose it: an assistant must not
    /// be able to switch its own guard off, even with a person's approval
    /// of a proposal it worded.
    pub fn refused_to_mcp(&self) -> bool {
        matches!(self, Operation::SetApprovalPolicy(_))
    }
}

/// Checks that a caller may perform `op`: the role it needs in the
/// workspace, operator standing where it needs that, and a client kind it
/// accepts.
pub async fn authorise(state: &AppState, access: &WorkspaceAccess, op: &Operation) -> ApiResult<()> {
    access.require(op.required_role())?;
    if op.needs_operator() && !state.store.is_operator(&access.principal.user_id).await? {
        return Err(crate::error::ApiError::permission_denied("permission denied: only installation operators manage plugins"));
    }
    if op.refused_to_mcp() && access.principal.client == crate::access::ClientSource::Mcp {
        return Err(crate::error::ApiError::permission_denied(
            "permission denied: approval policies are changed by a person through the API or CLI, not by an MCP client",
        ));
    }
    Ok(())
}

/// What an executed operation answered.
#[derive(Debug)]
pub struct Executed {
    pub status: StatusCode,
    pub data: Value,
    /// JSON pointers into `data` of values shown once to whoever made the
    /// request (single-use links, OAuth states): they are answered, but
    /// never stored where someone else could read them (approval results,
    /// idempotent replays).
    pub one_time: Vec<String>,
}

/// What a one-time value becomes wherever an answer is kept.
pub const SHOWN_ONCE: &str = "(shown once to the requester; not stored)";

impl Executed {
    pub fn ok(data: impl Serialize) -> ApiResult<Self> {
        Self::with_status(StatusCode::OK, data)
    }

    pub fn created(data: impl Serialize) -> ApiResult<Self> {
        Self::with_status(StatusCode::CREATED, data)
    }

    pub fn with_status(status: StatusCode, data: impl Serialize) -> ApiResult<Self> {
        Ok(Executed { status, data: serde_json::to_value(data).map_err(crate::error::ApiError::internal)?, one_time: Vec::new() })
    }

    /// Marks values (JSON pointers into `data`) as shown once.
    pub fn shown_once(mut self, pointers: &[&str]) -> Self {
        self.one_time.extend(pointers.iter().map(|p| (*p).to_owned()));
        self
    }

    /// The answer as it may be kept: one-time values replaced.
    pub fn storable(&self) -> Value {
        let mut data = self.data.clone();
        for pointer in &self.one_time {
            if let Some(v) = data.pointer_mut(pointer)
                && !v.is_null()
            {
                *v = Value::String(SHOWN_ONCE.to_owned());
            }
        }
        data
    }
}

/// The body an idempotent replay answers instead of the response's own,
/// when that one holds values shown once.
#[derive(Clone)]
pub struct ReplayBody(pub bytes::Bytes);

impl axum::response::IntoResponse for Executed {
    fn into_response(self) -> axum::response::Response {
        let replay = (!self.one_time.is_empty()).then(|| {
            let stored = crate::http::ok(self.storable());
            bytes::Bytes::from(serde_json::to_vec(&stored).unwrap_or_default())
        });
        let mut envelope = crate::http::ok(self.data).into_response();
        *envelope.status_mut() = self.status;
        if let Some(body) = replay {
            envelope.extensions_mut().insert(ReplayBody(body));
        }
        envelope
    }
}

/// The door every write goes through: checks the caller's role, notes the
/// action for the audit record, and lets the approval gate decide between
/// executing now and storing a proposal.
pub async fn submit(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, op: Operation) -> ApiResult<Executed> {
    note.action(op.action());
    authorise(state, access, &op).await?;
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
        Operation::SetApprovalPolicy(change) => Executed::ok(crate::approvals::set_policy(state, access, note, change).await?),
        Operation::UnloadPlugin { connector_id } => plugins::unload(state, access, note, &connector_id).await,
        Operation::LoadPlugin { connector_id } => plugins::load(state, access, note, &connector_id).await,
    }
}
