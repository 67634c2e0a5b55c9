//! Who may do what, and what was done: proposals to approve or reject,
//! the approval policy of each category, audit logs, and sessions.

use reqwest::Method;
use serde_json::Value;

use super::body::Body;
use super::context::{Ctx, Page, seg};
use super::render::{Column, text_at};
use crate::cli::client::CliFailure;

const APPROVALS: &[Column] = &[
    Column("APPROVAL", "approval_id"),
    Column("STATUS", "status"),
    Column("CATEGORY", "category"),
    Column("CLIENT", "client_source"),
    Column("PROPOSED BY", "proposed_by"),
    Column("CREATED", "created_at"),
    Column("SUMMARY", "summary"),
];
const POLICIES: &[Column] = &[
    Column("CATEGORY", "category"),
    Column("REQUIRES APPROVAL", "requires_approval"),
    Column("APPROVER ROLE", "approver_role"),
];
const AUDIT: &[Column] = &[
    Column("TIME", "created_at"),
    Column("ACTION", "action"),
    Column("OUTCOME", "outcome"),
    Column("STATUS", "status_code"),
    Column("ACTOR", "actor_user_id"),
    Column("CLIENT", "client_source"),
    Column("TARGET", "target_id"),
    Column("REQUEST", "request_id"),
];
const SESSIONS: &[Column] = &[
    Column("SESSION", "session_id"),
    Column("USER", "user_id"),
    Column("KIND", "kind"),
    Column("CLIENT", "client_source"),
    Column("LABEL", "label"),
    Column("LAST USED", "last_used_at"),
    Column("EXPIRES", "expires_at"),
    Column("REVOKED", "revoked_at"),
];

#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// Proposals, newest first.
    List {
        /// Only in this status: pending, executing, executed, failed, rejected,
        /// expired, voided.
        #[arg(long)]
        status: Option<String>,
        /// Only of this category.
        #[arg(long)]
        category: Option<String>,
        /// Only from this kind of client: api, cli, mcp.
        #[arg(long)]
        client: Option<String>,
        #[command(flatten)]
        page: Page,
    },
    /// Approve a proposal: it runs now, as proposed, and its answer is shown.
    Approve { approval_id: String },
    /// Reject a proposal: it never runs.
    Reject { approval_id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum PoliciesCommand {
    /// Whether each category's writes from assistants need approval, and
    /// who may approve them (workspace administrators).
    List,
    /// Change a category's policy (workspace administrators, never from an
    /// assistant).
    Set {
        category: String,
        /// Whether MCP writes of the category become proposals.
        #[arg(long)]
        requires_approval: Option<bool>,
        /// The least role that decides them: administrator or editor.
        #[arg(long)]
        approver_role: Option<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum AuditLogsCommand {
    /// Audit records, newest first.
    List {
        /// Only records at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Only records before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// Only this user's actions.
        #[arg(long)]
        actor: Option<String>,
        /// Only this action (e.g. `sources.create`).
        #[arg(long)]
        action: Option<String>,
        /// Only from this kind of client: api, cli, mcp.
        #[arg(long)]
        client: Option<String>,
        /// Only this outcome: succeeded, failed, denied, proposed.
        #[arg(long)]
        outcome: Option<String>,
        #[command(flatten)]
        page: Page,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum SessionsCommand {
    /// Sessions of the workspace's members (administrators; others see
    /// their own).
    List {
        /// Only this user's sessions.
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        page: Page,
    },
    /// Revoke a session: its token stops working at once, on every server.
    Revoke { session_id: String },
}

/// What a decided proposal's execution answered.
fn decided(d: &Value, verb: &str) -> String {
    let a = &d["approval"];
    let mut out = format!("{verb} {} ({}): {}", text_at(a, "approval_id"), text_at(a, "status"), text_at(a, "summary"));
    // The live answer holds values shown once (an invitation's link), which
    // the stored copy on the approval leaves out.
    if let Some(status) = a["result"]["status"].as_i64() {
        let body = if d["result"].is_null() { &a["result"]["body"] } else { &d["result"] };
        out.push_str(&format!(
            "\nIt ran and answered {status}:\n{}",
            serde_json::to_string_pretty(body).unwrap_or_default()
        ));
    }
    out
}

pub(crate) async fn approvals(ctx: &Ctx, cmd: ApprovalsCommand) -> Result<(), CliFailure> {
    match cmd {
        ApprovalsCommand::List { status, category, client, page } => {
            let q = page.with(vec![("status", status), ("category", category), ("client_source", client)]);
            ctx.list("approvals", &q, APPROVALS).await
        }
        ApprovalsCommand::Approve { approval_id } => ctx
            .write(Method::POST, &format!("approvals/{}/approve", seg(&approval_id)), None, |d| decided(d, "Approved"))
            .await
            .map(drop),
        ApprovalsCommand::Reject { approval_id } => ctx
            .write(Method::POST, &format!("approvals/{}/reject", seg(&approval_id)), None, |d| decided(d, "Rejected"))
            .await
            .map(drop),
    }
}

pub(crate) async fn policies(ctx: &Ctx, cmd: PoliciesCommand) -> Result<(), CliFailure> {
    match cmd {
        PoliciesCommand::List => ctx.list("approval-policies", &[], POLICIES).await,
        PoliciesCommand::Set { category, requires_approval, approver_role } => {
            let mut body = Body::default();
            body.opt("requires_approval", requires_approval).opt("approver_role", approver_role);
            ctx.write(Method::PATCH, &format!("approval-policies/{}", seg(&category)), Some(body.into_value()), |d| {
                format!(
                    "{}: requires approval {}, approver role {}",
                    text_at(d, "category"),
                    text_at(d, "requires_approval"),
                    text_at(d, "approver_role")
                )
            })
            .await
            .map(drop)
        }
    }
}

pub(crate) async fn audit_logs(ctx: &Ctx, cmd: AuditLogsCommand) -> Result<(), CliFailure> {
    match cmd {
        AuditLogsCommand::List { since, until, actor, action, client, outcome, page } => {
            let q = page.with(vec![
                ("since", since),
                ("until", until),
                ("actor", actor),
                ("action", action),
                ("client_source", client),
                ("outcome", outcome),
            ]);
            ctx.list("audit-logs", &q, AUDIT).await
        }
    }
}

pub(crate) async fn sessions(ctx: &Ctx, cmd: SessionsCommand) -> Result<(), CliFailure> {
    match cmd {
        SessionsCommand::List { user, page } => {
            let q = page.with(vec![("user_id", user)]);
            ctx.list("sessions", &q, SESSIONS).await
        }
        SessionsCommand::Revoke { session_id } => ctx
            .write(Method::POST, &format!("sessions/{}/revoke", seg(&session_id)), None, |_| {
                format!("Revoked session {session_id}")
            })
            .await
            .map(drop),
    }
}
