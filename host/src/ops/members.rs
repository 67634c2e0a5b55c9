//! Member operations: invitations and removal.

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use crate::access::Role;
use crate::access::tokens;
use crate::error::{ApiError, ApiResult};
use crate::store::invitations::Invitation;
use crate::store::workspaces::RemoveMemberError;
use secrecy::ExposeSecret;

/// Default and longest lifetime of an invitation.
const DEFAULT_INVITATION_HOURS: u32 = 72;
const MAX_INVITATION_HOURS: u32 = 24 * 14;

/// Body of `POST /workspaces/{workspace_id}/members/invitations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InviteMember {
    /// E-mail address of the invitee (compared without regard to case).
    #[schema(
        max_length = 254,
        pattern = r"^[^@\s\x00-\x1f\x7f-\x9f]+@[^.@\s\x00-\x1f\x7f-\x9f][^@\s\x00-\x1f\x7f-\x9f]*\.[^@\s\x00-\x1f\x7f-\x9f]*[^.@\s\x00-\x1f\x7f-\x9f]$"
    )]
    pub email: String,
    /// Role granted on acceptance.
    pub role: Role,
    /// Hours until the invitation expires (1 to 336, default 72).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 336)]
    pub expires_in_hours: Option<u32>,
}

/// A created invitation with the single-use link to accept it. The link is
/// shown once; only its hash is stored.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CreatedInvitation {
    #[serde(flatten)]
    pub invitation: Invitation,
    /// Single-use, expiring page where the invitee accepts.
    pub accept_url: String,
}

pub(crate) async fn invite(ctx: &Ctx<'_>, req: InviteMember) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    let email = crate::access::admin::normalise_email(&req.email)?;
    let hours = req.expires_in_hours.unwrap_or(DEFAULT_INVITATION_HOURS);
    if !(1..=MAX_INVITATION_HOURS).contains(&hours) {
        return Err(ApiError::invalid_field(
            "expires_in_hours",
            format!("expires_in_hours must be between 1 and {MAX_INVITATION_HOURS}"),
        ));
    }
    let token = tokens::generate(tokens::CODE_PREFIX);
    let expires_at = crate::store::now_ms() + i64::from(hours) * 3_600_000;
    let invitation = state
        .store
        .create_invitation(
            &access.workspace_id,
            &email,
            req.role,
            &tokens::hash_secret(&token),
            &access.principal.user_id,
            expires_at,
        )
        .await?;
    note.target("invitation", &invitation.invitation_id);
    let accept_url =
        state.config.public_url.join(&format!("invitations/{}", token.expose_secret())).map_err(ApiError::internal)?;
    Ok(Executed::created(CreatedInvitation { invitation, accept_url: accept_url.to_string() })?
        .shown_once(&["/accept_url"]))
}

pub(crate) async fn remove(ctx: &Ctx<'_>, member_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("member", member_id);
    match state.store.remove_member(&access.workspace_id, member_id).await {
        Ok(member) => Executed::ok(json!({ "removed": true, "member": member })),
        Err(RemoveMemberError::NotFound) => Err(ApiError::not_found("member")),
        Err(RemoveMemberError::LastAdministrator) => Err(ApiError::conflict(
            "LAST_ADMINISTRATOR",
            "the workspace must keep at least one administrator: make someone else administrator first",
        )
        .with_details(json!({ "member_id": member_id }))),
        Err(RemoveMemberError::Store(e)) => Err(e.into()),
    }
}

/// Member operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum MemberOp {
    /// Invite someone to the workspace.
    InviteMember(InviteMember),
    /// Remove a membership.
    RemoveMember { member_id: String },
}

impl Act for MemberOp {
    fn action(&self) -> &'static str {
        match self {
            MemberOp::InviteMember(_) => "members.invite",
            MemberOp::RemoveMember { .. } => "members.remove",
        }
    }

    fn category(&self) -> Category {
        Category::WorkspaceAdmin
    }

    fn summary(&self) -> String {
        match self {
            MemberOp::InviteMember(i) => format!("Invite {} to the workspace as {}", i.email.trim(), i.role.as_str()),
            MemberOp::RemoveMember { member_id } => format!("Remove member {member_id} from the workspace"),
        }
    }
}

impl MemberOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            MemberOp::InviteMember(req) => invite(ctx, req).await,
            MemberOp::RemoveMember { member_id } => remove(ctx, &member_id).await,
        }
    }
}
