//! The [`Operation`] that holds any context's operation: what proposals
//! store and the gate runs.
//!
//! Each context keeps its operations in an enum of its own, in its own
//! file (`members`, `sources`, ...) implementing [`Act`]; [`Operation`]
//! only names the contexts. A new context adds a file and one variant
//! here, not arms in every match.

use serde::{Deserialize, Serialize};

use super::act::{Act, Ctx, Executed};
use crate::access::WorkspaceAccess;
use crate::error::ApiResult;
use crate::state::AppState;

/// A state-changing operation with everything it needs to run, of any
/// context. Serialised as its context's internally tagged form
/// (`{"operation": "invite_member", ...}`), which is how proposals store it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Operation {
    Members(super::members::MemberOp),
    Sessions(super::sessions::SessionOp),
    Policies(super::policies::PolicyOp),
    Credentials(super::credentials::CredentialOp),
    Sources(super::sources::SourceOp),
    Destinations(super::destinations::DestinationOp),
    Pipelines(super::pipelines::PipelineOp),
    Syncs(super::syncs::SyncOp),
    Plugins(super::plugins::PluginOp),
    ReverseEtl(super::reverse_etl::ReverseEtlOp),
    Webhooks(super::webhooks::WebhookOp),
}

impl Operation {
    /// The operation as its context describes it.
    pub(crate) fn act(&self) -> &dyn Act {
        match self {
            Operation::Members(o) => o,
            Operation::Sessions(o) => o,
            Operation::Policies(o) => o,
            Operation::Credentials(o) => o,
            Operation::Sources(o) => o,
            Operation::Destinations(o) => o,
            Operation::Pipelines(o) => o,
            Operation::Syncs(o) => o,
            Operation::Plugins(o) => o,
            Operation::ReverseEtl(o) => o,
            Operation::Webhooks(o) => o,
        }
    }

    /// Why it must go through an approval whoever asks, when it would
    /// change what a destination already holds in a way a sync cannot
    /// undo (a deduplicated stream's primary key).
    pub(super) async fn destructive(&self, state: &AppState, access: &WorkspaceAccess) -> ApiResult<Option<String>> {
        match self {
            Operation::Pipelines(super::pipelines::PipelineOp::UpdatePipeline(update)) => {
                super::pipelines::destructive_change(state, access, update).await
            }
            _ => Ok(None),
        }
    }

    /// Runs it in its context. Only the gate calls this.
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        ctx.note.action(self.act().action());
        match self {
            Operation::Members(o) => o.run(ctx).await,
            Operation::Sessions(o) => o.run(ctx).await,
            Operation::Policies(o) => o.run(ctx).await,
            Operation::Credentials(o) => o.run(ctx).await,
            Operation::Sources(o) => o.run(ctx).await,
            Operation::Destinations(o) => o.run(ctx).await,
            Operation::Pipelines(o) => o.run(ctx).await,
            Operation::Syncs(o) => o.run(ctx).await,
            Operation::Plugins(o) => o.run(ctx).await,
            Operation::ReverseEtl(o) => o.run(ctx).await,
            Operation::Webhooks(o) => o.run(ctx).await,
        }
    }
}

/// Every context's operations convert into an [`Operation`].
macro_rules! into_operation {
    ($($variant:ident($op:ty)),* $(,)?) => {$(
        impl From<$op> for Operation {
            fn from(op: $op) -> Operation {
                Operation::$variant(op)
            }
        }
    )*};
}

into_operation!(
    Members(super::members::MemberOp),
    Sessions(super::sessions::SessionOp),
    Policies(super::policies::PolicyOp),
    Credentials(super::credentials::CredentialOp),
    Sources(super::sources::SourceOp),
    Destinations(super::destinations::DestinationOp),
    Pipelines(super::pipelines::PipelineOp),
    Syncs(super::syncs::SyncOp),
    Plugins(super::plugins::PluginOp),
    ReverseEtl(super::reverse_etl::ReverseEtlOp),
    Webhooks(super::webhooks::WebhookOp),
);
