//! The API's resources as commands (`service sources list`, `service
//! pipelines sync ID --wait`): human tables and records by default, the
//! answer's `data` with `--json`; writes that became proposals say so and
//! name the approval; failures print code, message and request id.
//!
//! Layout:
//! - this module: the options every API command shares ([`On`]) and the
//!   resources ([`ApiCommand`]);
//! - [`catalog`]: workspaces, members, connectors, credentials (created
//!   through the entry page), sources with entities, destinations;
//! - [`pipelines`]: pipelines and jobs, `sync --wait`;
//! - [`governance`]: approvals, approval policies, audit logs, sessions;
//! - [`reverse_etl`]: models, destinations, activations, runs;
//! - [`progress`]: waiting for a job or run with its progress live;
//! - [`context`]: the client and printer of a command, list/show/write;
//! - [`render`]: tables, records, JSON, proposals;
//! - [`body`]: request bodies from options, `--data` and `--set`.

pub(crate) mod body;
pub(crate) mod catalog;
pub(crate) mod context;
pub(crate) mod governance;
pub(crate) mod pipelines;
pub(crate) mod progress;
pub(crate) mod render;
pub(crate) mod reverse_etl;

use super::client::{Addresses, ApiClient, CliFailure};
use context::Ctx;
use render::Printer;

/// The options of every API command.
#[derive(Debug, Clone, clap::Args)]
pub struct On {
    #[command(flatten)]
    pub addresses: Addresses,
    /// The workspace to act in (default: your oldest workspace).
    #[arg(long, short = 'w', env = "SERVICE_WORKSPACE", global = true)]
    pub workspace: Option<String>,
    /// Print the answer's data as JSON, for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    /// Ask for writes to be stored as proposals for someone else to
    /// approve, instead of running.
    #[arg(long, global = true)]
    pub propose: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum ApiCommand {
    /// The workspaces you belong to.
    Workspaces {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::WorkspacesCommand,
    },
    /// A workspace's members: list, invite, remove.
    Members {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::MembersCommand,
    },
    /// The connectors this service offers.
    Connectors {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::ConnectorsCommand,
    },
    /// Credentials: stored through the browser, referenced by handle.
    Credentials {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::CredentialsCommand,
    },
    /// Sources: a connector with its configuration.
    Sources {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::SourcesCommand,
    },
    /// Destinations pipelines load into.
    Destinations {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: catalog::DestinationsCommand,
    },
    /// Pipelines from a source to a destination, and their syncs.
    Pipelines {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: pipelines::PipelinesCommand,
    },
    /// Jobs: syncs, resets and reverse-ETL runs.
    Jobs {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: pipelines::JobsCommand,
    },
    /// Proposals awaiting a decision: list, approve, reject.
    Approvals {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: governance::ApprovalsCommand,
    },
    /// Which writes from assistants need approval.
    Policies {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: governance::PoliciesCommand,
    },
    /// What was done, by whom, from which client.
    AuditLogs {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: governance::AuditLogsCommand,
    },
    /// Sessions: list, revoke.
    Sessions {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: governance::SessionsCommand,
    },
    /// Reverse ETL: warehouse models sent to destinations.
    ReverseEtl {
        #[command(flatten)]
        on: On,
        #[command(subcommand)]
        command: reverse_etl::ReverseEtlCommand,
    },
}

/// Runs an API command.
pub(crate) async fn run(cmd: ApiCommand) -> Result<(), CliFailure> {
    let on = match &cmd {
        ApiCommand::Workspaces { on, .. }
        | ApiCommand::Members { on, .. }
        | ApiCommand::Connectors { on, .. }
        | ApiCommand::Credentials { on, .. }
        | ApiCommand::Sources { on, .. }
        | ApiCommand::Destinations { on, .. }
        | ApiCommand::Pipelines { on, .. }
        | ApiCommand::Jobs { on, .. }
        | ApiCommand::Approvals { on, .. }
        | ApiCommand::Policies { on, .. }
        | ApiCommand::AuditLogs { on, .. }
        | ApiCommand::Sessions { on, .. }
        | ApiCommand::ReverseEtl { on, .. } => on.clone(),
    };
    let client = ApiClient::signed_in(&on.addresses)?.in_workspace(on.workspace.clone()).proposing(on.propose);
    let ctx = Ctx { client, out: Printer { json: on.json } };
    match cmd {
        ApiCommand::Workspaces { command, .. } => catalog::workspaces(&ctx, command).await,
        ApiCommand::Members { command, .. } => catalog::members(&ctx, on.workspace.as_deref(), command).await,
        ApiCommand::Connectors { command, .. } => catalog::connectors(&ctx, command).await,
        ApiCommand::Credentials { command, .. } => catalog::credentials(&ctx, command).await,
        ApiCommand::Sources { command, .. } => catalog::sources(&ctx, command).await,
        ApiCommand::Destinations { command, .. } => catalog::destinations(&ctx, command).await,
        ApiCommand::Pipelines { command, .. } => pipelines::pipelines(&ctx, command).await,
        ApiCommand::Jobs { command, .. } => pipelines::jobs(&ctx, command).await,
        ApiCommand::Approvals { command, .. } => governance::approvals(&ctx, command).await,
        ApiCommand::Policies { command, .. } => governance::policies(&ctx, command).await,
        ApiCommand::AuditLogs { command, .. } => governance::audit_logs(&ctx, command).await,
        ApiCommand::Sessions { command, .. } => governance::sessions(&ctx, command).await,
        ApiCommand::ReverseEtl { command, .. } => reverse_etl::run(&ctx, command).await,
    }
}
