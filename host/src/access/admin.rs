//! Offline administration against the same database as the server:
//! first-run bootstrap, `service admin create-user`, `create-token`.

use secrecy::{ExposeSecret, SecretString};

use super::tokens;
use crate::access::{ClientSource, Role};
use crate::config::ServerConfig;
use crate::store::sessions::{NewSession, SessionKind};
use crate::store::{Store, StoreError};

/// How long the one-time login link printed at first start stays valid.
const LOGIN_CODE_TTL_MS: i64 = 30 * 60 * 1000;

/// What first-run bootstrap did.
#[derive(Debug)]
pub(crate) enum Bootstrap {
    /// Users already exist: nothing done.
    AlreadyInitialised,
    /// Created the first workspace and administrator; the bootstrap token
    /// from the environment is their first session token.
    WithToken { workspace_id: String, email: String },
    /// Created them; the administrator signs in through this one-time link.
    WithLoginLink { workspace_id: String, email: String, login_url: SecretString },
}

/// On a database without users, creates the first workspace and its
/// administrator (spec: fresh installation).
pub(crate) async fn bootstrap(store: &Store, config: &ServerConfig) -> anyhow::Result<Bootstrap> {
    if store.count_users().await? > 0 {
        return Ok(Bootstrap::AlreadyInitialised);
    }
    let email = normalise_email(&config.bootstrap_email)
        .map_err(|_| anyhow::anyhow!("SERVICE_BOOTSTRAP_EMAIL: not an e-mail address"))?;
    let workspace = store.create_workspace("Default workspace").await?;
    let user = match store.create_user(&email, "Administrator").await {
        Ok(u) => u,
        // Another replica bootstrapped at the same moment.
        Err(StoreError::Conflict(_)) => return Ok(Bootstrap::AlreadyInitialised),
        Err(e) => return Err(e.into()),
    };
    store.add_member(&workspace.workspace_id, &user.user_id, Role::Administrator).await?;
    // The first administrator also operates the installation (plugins).
    store.set_operator(&user.user_id, true).await?;
    if let Some(token) = &config.bootstrap_token {
        store
            .create_session(NewSession {
                user_id: &user.user_id,
                token_hash: &tokens::hash_secret(token),
                kind: SessionKind::ApiToken,
                label: Some("bootstrap token (SERVICE_BOOTSTRAP_TOKEN)"),
                client_source: ClientSource::Api,
                user_agent: None,
                address: None,
                expires_at: None,
            })
            .await?;
        return Ok(Bootstrap::WithToken { workspace_id: workspace.workspace_id, email });
    }
    let code = tokens::generate(tokens::CODE_PREFIX);
    store
        .create_login_code(&tokens::hash_secret(&code), &user.user_id, crate::store::now_ms() + LOGIN_CODE_TTL_MS)
        .await?;
    let url = config.public_url.join(&format!("login/{}", code.expose_secret()))?;
    Ok(Bootstrap::WithLoginLink {
        workspace_id: workspace.workspace_id,
        email,
        login_url: SecretString::from(url.to_string()),
    })
}

/// `service admin create-user`: creates a user and adds them to a
/// workspace (the oldest one unless named).
pub async fn create_user(
    store: &Store,
    email: &str,
    name: &str,
    workspace_id: Option<&str>,
    role: Role,
) -> anyhow::Result<(String, String)> {
    let email = normalise_email(email).map_err(|_| anyhow::anyhow!("--email: not an e-mail address"))?;
    let workspace_id = match workspace_id {
        Some(id) => {
            store.workspace(id).await?.ok_or_else(|| anyhow::anyhow!("--workspace: no workspace {id}"))?.workspace_id
        }
        None => match store.first_workspace().await? {
            Some(w) => w.workspace_id,
            None => store.create_workspace("Default workspace").await?.workspace_id,
        },
    };
    let user = match store.create_user(&email, name).await {
        Ok(u) => u,
        Err(StoreError::Conflict(_)) => anyhow::bail!("--email: a user with this address already exists"),
        Err(e) => return Err(e.into()),
    };
    store.add_member(&workspace_id, &user.user_id, role).await?;
    Ok((user.user_id, workspace_id))
}

/// `service admin create-token`: mints an API token for an existing user,
/// for one kind of client. A token for `mcp` is an assistant's: its writes
/// are proposals by default and it can never decide one, whatever header
/// its requests carry.
pub async fn create_token(
    store: &Store,
    email: &str,
    label: Option<&str>,
    expires_in_days: Option<u32>,
    client: ClientSource,
) -> anyhow::Result<SecretString> {
    let email = normalise_email(email).map_err(|_| anyhow::anyhow!("--email: not an e-mail address"))?;
    let user =
        store.user_by_email(&email).await?.ok_or_else(|| anyhow::anyhow!("--email: no user with this address"))?;
    let token = tokens::generate(tokens::TOKEN_PREFIX);
    store
        .create_session(NewSession {
            user_id: &user.user_id,
            token_hash: &tokens::hash_secret(&token),
            kind: SessionKind::ApiToken,
            label: Some(label.unwrap_or("created with service admin create-token")),
            client_source: client,
            user_agent: None,
            address: None,
            expires_at: expires_in_days.map(|d| crate::store::now_ms() + i64::from(d) * 86_400_000),
        })
        .await?;
    Ok(token)
}

/// What becomes of a user's sessions when their password is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPasswordChange {
    /// Every session and token of the user is revoked (the default: a
    /// password is reset because someone else may hold the account).
    RevokeSessions,
    /// They stay as they are (`--keep-sessions`).
    KeepSessions,
}

/// Sets the web sign-in password of an existing user (`service admin
/// set-password`); the number of sessions revoked with it. A server on
/// PostgreSQL refuses them at once (it hears the revocation); one on
/// SQLite within its cache's few seconds.
pub async fn set_password(
    store: &Store,
    email: &str,
    password: SecretString,
    sessions: OnPasswordChange,
) -> anyhow::Result<usize> {
    let email = normalise_email(email).map_err(|_| anyhow::anyhow!("--email: not an e-mail address"))?;
    let user =
        store.user_by_email(&email).await?.ok_or_else(|| anyhow::anyhow!("--email: no user with this address"))?;
    super::passwords::check(&password).map_err(|m| anyhow::anyhow!("the password is refused: {m}"))?;
    let hash = super::passwords::hash(password).await?;
    store.set_password_hash(&user.user_id, &hash).await?;
    match sessions {
        OnPasswordChange::RevokeSessions => Ok(store.revoke_user_sessions(&user.user_id).await?.len()),
        OnPasswordChange::KeepSessions => Ok(0),
    }
}

/// Normalises and checks an e-mail address (lower case, one `@`, a dotted
/// domain, no spaces).
pub(crate) fn normalise_email(raw: &str) -> Result<String, crate::error::ApiError> {
    let email = raw.trim().to_ascii_lowercase();
    let valid = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty()
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !domain.contains('@')
        })
        && !email.chars().any(|c| c.is_whitespace() || c.is_control());
    if valid {
        Ok(email)
    } else {
        Err(crate::error::ApiError::invalid_field("email", "email must be an e-mail address"))
    }
}
