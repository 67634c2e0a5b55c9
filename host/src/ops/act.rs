//! What every context's operations share: their approval [`Category`],
//! the [`Act`] they implement (action name, category, summary, who may
//! perform it), the [`Ctx`] they run with and what an executed one answers
//! ([`Executed`]). Contexts import this; nothing here imports a context.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::access::{Role, WorkspaceAccess};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Approval categories: every operation belongs to exactly one, and
/// workspace administrators choose per category whether MCP clients need
/// approval for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Category {
    /// Members, invitations, others' sessions and approval policies.
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
    /// Starting syncs, resets and replays, cancelling jobs.
    Syncs,
    /// Loading and unloading connector plugins (installation operators).
    Plugins,
    /// Reverse-ETL models, destinations and activations, and starting runs.
    ReverseEtl,
    /// Webhook subscriptions: where a workspace's events are sent.
    Webhooks,
}

impl Category {
    /// Every category, in the order policies are listed.
    pub(crate) const ALL: &'static [Category] = &[
        Category::WorkspaceAdmin,
        Category::Credentials,
        Category::CredentialEntry,
        Category::Sources,
        Category::Destinations,
        Category::Pipelines,
        Category::Syncs,
        Category::Plugins,
        Category::ReverseEtl,
        Category::Webhooks,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => "workspace_admin",
            Category::Credentials => "credentials",
            Category::CredentialEntry => "credential_entry",
            Category::Sources => "sources",
            Category::Destinations => "destinations",
            Category::Pipelines => "pipelines",
            Category::Syncs => "syncs",
            Category::Plugins => "plugins",
            Category::ReverseEtl => "reverse_etl",
            Category::Webhooks => "webhooks",
        }
    }

    /// Whether MCP writes of this category need approval until an
    /// administrator says otherwise. Entry links need none by default: the
    /// person typing the secret is the approval.
    pub(crate) fn default_requires_approval(self) -> bool {
        !matches!(self, Category::CredentialEntry)
    }

    pub(crate) fn parse(s: &str) -> Option<Category> {
        Category::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// Whether its operations answer a secret shown once (a webhook's
    /// signing secret). Such a secret must reach a person who may hold
    /// it: MCP writes of the category always need approval, whatever the
    /// workspace's policy says, and its proposals are decided only by the
    /// role that may perform them (an approver is answered the result).
    pub(crate) fn answers_secrets(self) -> bool {
        matches!(self, Category::Webhooks)
    }

    /// What the category covers, for people choosing policies.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Category::WorkspaceAdmin => {
                "inviting and removing members, revoking others' sessions, changing approval policies"
            }
            Category::Credentials => "activating credentials stored through a credential flow",
            Category::CredentialEntry => {
                "creating single-use links where a person enters a secret, and starting OAuth flows"
            }
            Category::Sources => "creating, changing and deleting sources",
            Category::Destinations => "creating and changing destinations",
            Category::Pipelines => "creating, changing, pausing, resuming and deleting pipelines (connections)",
            Category::Syncs => "starting syncs, resets and replays of rejected rows, cancelling jobs",
            Category::Plugins => "loading and unloading connector plugins (installation operators)",
            Category::ReverseEtl => {
                "creating, changing and deleting reverse-ETL models, destinations and activations, and starting their runs"
            }
            Category::Webhooks => {
                "creating, changing and deleting webhook subscriptions (where the workspace's events are sent) and replaying deliveries"
            }
        }
    }

    /// The least role that may perform operations of this category.
    pub(crate) fn required_role(self) -> Role {
        match self {
            Category::WorkspaceAdmin | Category::Plugins | Category::Webhooks => Role::Administrator,
            Category::Credentials
            | Category::CredentialEntry
            | Category::Sources
            | Category::Destinations
            | Category::Pipelines
            | Category::Syncs
            | Category::ReverseEtl => Role::Editor,
        }
    }
}

/// What every operation tells about itself, whatever its context.
pub(crate) trait Act: Send + Sync {
    /// Stable action name used in audit records (`members.invite`).
    fn action(&self) -> &'static str;

    /// The approval category it belongs to.
    fn category(&self) -> Category;

    /// One line a person can judge a proposal by.
    fn summary(&self) -> String;

    /// The least role that may perform it.
    fn required_role(&self) -> Role {
        self.category().required_role()
    }

    /// Whether only installation operators may perform it (and decide its
    /// proposals).
    fn needs_operator(&self) -> bool {
        self.category() == Category::Plugins
    }

    /// Whether an MCP client may not even propose it: an assistant must not
    /// be able to switch its own guard off, even with a person's approval
    /// of a proposal it worded.
    fn refused_to_mcp(&self) -> bool {
        false
    }
}

/// How an execution came about: a request, or the approval of a proposal
/// (jobs record it as their trigger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Request,
    Approval,
}

/// Everything an operation runs with.
pub(crate) struct Ctx<'a> {
    pub state: &'a AppState,
    /// The caller (for an approved proposal: its proposer, with the role
    /// they hold now).
    pub access: &'a WorkspaceAccess,
    pub note: &'a AuditNote,
    pub via: Via,
}

impl<'a> Ctx<'a> {
    /// A request's context: the caller acting now, not an approval.
    pub(crate) fn request(state: &'a AppState, access: &'a WorkspaceAccess, note: &'a AuditNote) -> Self {
        Ctx { state, access, note, via: Via::Request }
    }
}

/// What an executed operation answered.
#[derive(Debug)]
pub(crate) struct Executed {
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
    pub(crate) fn ok(data: impl Serialize) -> ApiResult<Self> {
        Self::with_status(StatusCode::OK, data)
    }

    pub(crate) fn created(data: impl Serialize) -> ApiResult<Self> {
        Self::with_status(StatusCode::CREATED, data)
    }

    pub(crate) fn with_status(status: StatusCode, data: impl Serialize) -> ApiResult<Self> {
        Ok(Executed { status, data: serde_json::to_value(data).map_err(ApiError::internal)?, one_time: Vec::new() })
    }

    /// Marks values (JSON pointers into `data`) as shown once.
    pub(crate) fn shown_once(mut self, pointers: &[&str]) -> Self {
        self.one_time.extend(pointers.iter().map(|p| (*p).to_owned()));
        self
    }

    /// The answer as it may be kept: one-time values replaced.
    pub(crate) fn storable(&self) -> Value {
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
