//! `service admin ...`: offline administration of an installation
//! against its database: users, passwords, tokens, the master key, the
//! workspaces' shares of the job runners, the providers' rate budgets.

use clap::Subcommand;
use secrecy::ExposeSecret;

use super::Local;
use crate::access::{ClientSource, Role};
use crate::store::ClaimWeight;
use crate::store::budgets::{BudgetRate, BudgetSubject};

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a user and add them to a workspace.
    CreateUser {
        /// E-mail address (the login name).
        #[arg(long)]
        email: String,
        /// Display name.
        #[arg(long, default_value = "")]
        name: String,
        /// Workspace to join (default: the oldest workspace).
        #[arg(long)]
        workspace: Option<String>,
        /// Role in that workspace.
        #[arg(long, default_value = "viewer", value_parser = parse_role)]
        role: Role,
    },
    /// Generate a new master key and re-seal every credential with it;
    /// the old key is forgotten afterwards. Stop servers first or run it
    /// during maintenance: they keep the old key until restarted.
    RotateMasterKey {
        /// The new master key (32 bytes, base64), required when the current
        /// one is configured with `SERVICE_MASTER_KEY` rather than kept in
        /// the data directory. Set it in the environment.
        #[arg(long, env = "SERVICE_NEW_MASTER_KEY", hide_env_values = true, value_parser = crate::config::secret)]
        new_master_key: Option<secrecy::SecretString>,
    },
    /// Set the password an existing user signs in with on the web pages,
    /// read from standard input (one line; at least 12 characters). Every
    /// session and token of the user is revoked with it.
    SetPassword {
        /// E-mail address of the user.
        #[arg(long)]
        email: String,
        /// Keep the user's sessions and tokens (by default they are
        /// revoked: a password is reset when someone else may hold the
        /// account).
        #[arg(long)]
        keep_sessions: bool,
    },
    /// Mint an API token for an existing user (printed once).
    CreateToken {
        /// E-mail address of the user.
        #[arg(long)]
        email: String,
        /// What the token is for.
        #[arg(long)]
        label: Option<String>,
        /// Days until the token expires (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
        /// The kind of client the token is for: `api`, `cli`, or `mcp` for
        /// an assistant (its writes become proposals and it can never
        /// approve one, whatever headers it sends).
        #[arg(long, default_value = "cli", value_parser = parse_client)]
        client: ClientSource,
    },
    /// Set a workspace's share of the job runners of every server,
    /// relative to the other workspaces' (1 to 1,000; each starts at 1).
    /// Runners go to the waiting job of the workspace whose running jobs
    /// are the smallest share of its weight; running servers use the new
    /// weight at their next claim.
    SetClaimWeight {
        /// The workspace's id.
        #[arg(long)]
        workspace: String,
        /// Its weight: 3 gets three times the runners of a workspace of 1
        /// when both have jobs waiting.
        #[arg(long, value_parser = parse_weight)]
        weight: ClaimWeight,
    },
    /// List the workspaces with their shares of the job runners.
    ClaimWeights,
    /// Set a rate budget shared by every server: requests that name the
    /// credential (or go to the host) leave at most this fast together,
    /// each waiting for its turn; a provider's `Retry-After` seen by one
    /// server holds them on all. Running servers use it within a second.
    SetRateBudget {
        #[command(flatten)]
        target: BudgetTarget,
        /// Requests per second on average (0.001 to 100,000).
        #[arg(long)]
        per_second: f64,
        /// Requests that may go at once after a quiet spell (1 to 10,000).
        #[arg(long, default_value_t = 1)]
        burst: u32,
    },
    /// Remove a rate budget: its requests leave unpaced again.
    ClearRateBudget {
        #[command(flatten)]
        target: BudgetTarget,
    },
    /// List the rate budgets.
    RateBudgets,
}

/// The budget a command names: a credential's or a host's.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct BudgetTarget {
    /// A credential's id (`crd_…`, as `GET /v1/credentials/{id}` shows
    /// it): every request naming it, whatever pipeline or server sends it.
    #[arg(long)]
    credential: Option<String>,
    /// A provider's host name: every request to it, from every workspace.
    #[arg(long, value_parser = parse_host)]
    host: Option<String>,
}

impl BudgetTarget {
    fn subject(&self) -> BudgetSubject {
        match (&self.credential, &self.host) {
            (Some(id), _) => BudgetSubject::Credential(id.trim().to_owned()),
            (None, Some(host)) => BudgetSubject::Host(host.clone()),
            // clap requires one of them.
            (None, None) => BudgetSubject::Host(String::new()),
        }
    }
}

/// A host name as requests name it: lowercase letters, digits, `-` and
/// `.`, no scheme, port or path.
fn parse_host(s: &str) -> Result<String, String> {
    let host = s.trim().to_ascii_lowercase();
    let fits = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if fits { Ok(host) } else { Err("must be a host name such as api.example.com (no scheme, port or path)".into()) }
}

fn parse_weight(s: &str) -> Result<ClaimWeight, String> {
    s.trim()
        .parse::<u16>()
        .ok()
        .and_then(ClaimWeight::new)
        .ok_or_else(|| format!("must be a whole number from 1 to {}", ClaimWeight::MAX))
}

fn parse_client(s: &str) -> Result<ClientSource, String> {
    ClientSource::parse(s).ok_or_else(|| "must be api, cli or mcp".into())
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| "must be administrator, editor or viewer".into())
}

/// Runs a `service admin` command.
pub(super) async fn run(local: Local, cmd: AdminCommand) -> anyhow::Result<()> {
    crate::telemetry::init_logging(crate::config::LogFormat::Human, local.log.filter_or("info"))?;
    let storage = &local.storage;
    let store = super::open_store(storage).await?;
    match cmd {
        AdminCommand::CreateUser { email, name, workspace, role } => {
            let (user_id, workspace_id) =
                crate::access::admin::create_user(&store, &email, &name, workspace.as_deref(), role).await?;
            println!("created user {user_id} ({}) in workspace {workspace_id} as {}", email.trim(), role.as_str());
        }
        AdminCommand::RotateMasterKey { new_master_key } => {
            let keyring = crate::credentials::keyring::Keyring::load(&storage.data_dir, storage.master_key.as_ref())?;
            let (n, key_id) = crate::credentials::Vault::rotate(&store, keyring, new_master_key.as_ref()).await?;
            println!("re-sealed {n} credential(s) with new master key {key_id}");
            if storage.master_key.is_some() {
                println!(
                    "now set {} to the value of {} and restart the servers",
                    crate::credentials::keyring::MASTER_KEY_ENV,
                    crate::credentials::keyring::NEW_MASTER_KEY_ENV
                );
            }
        }
        AdminCommand::SetPassword { email, keep_sessions } => {
            use crate::access::admin::OnPasswordChange;
            let password = read_password()?;
            let sessions =
                if keep_sessions { OnPasswordChange::KeepSessions } else { OnPasswordChange::RevokeSessions };
            let revoked = crate::access::admin::set_password(&store, &email, password, sessions).await?;
            match sessions {
                OnPasswordChange::RevokeSessions => {
                    eprintln!("password set for {}; {revoked} session(s) and token(s) revoked", email.trim())
                }
                OnPasswordChange::KeepSessions => eprintln!("password set for {}; sessions kept", email.trim()),
            }
        }
        AdminCommand::CreateToken { email, label, expires_in_days, client } => {
            let token =
                crate::access::admin::create_token(&store, &email, label.as_deref(), expires_in_days, client).await?;
            // The token itself goes to stdout alone, so scripts can
            // capture it; the note goes to stderr.
            eprintln!("API token for {} (shown once):", email.trim());
            println!("{}", token.expose_secret());
        }
        AdminCommand::SetClaimWeight { workspace, weight } => {
            if !store.set_claim_weight(workspace.trim(), weight).await? {
                store.close().await;
                anyhow::bail!("no workspace {}", workspace.trim());
            }
            println!("workspace {} now has claim weight {weight}", workspace.trim());
        }
        AdminCommand::ClaimWeights => {
            for (workspace, weight) in store.claim_weights().await? {
                println!("{}\t{weight}\t{}", workspace.workspace_id, workspace.name);
            }
        }
        AdminCommand::SetRateBudget { target, per_second, burst } => {
            let Some(rate) = BudgetRate::new(per_second, burst) else {
                store.close().await;
                anyhow::bail!(
                    "a rate budget allows {} to {} requests per second, with a burst of 1 to {}",
                    BudgetRate::MIN_PER_SECOND,
                    BudgetRate::MAX_PER_SECOND,
                    BudgetRate::MAX_BURST
                );
            };
            let subject = target.subject();
            if !store.set_rate_budget(&subject, rate).await? {
                store.close().await;
                anyhow::bail!("no credential {}", target.credential.as_deref().unwrap_or_default().trim());
            }
            println!("{subject} now allows {} requests per second, {} at once", rate.per_second(), rate.burst());
        }
        AdminCommand::ClearRateBudget { target } => {
            let subject = target.subject();
            if !store.clear_rate_budget(&subject).await? {
                store.close().await;
                anyhow::bail!("{subject} has no rate budget");
            }
            println!("{subject} has no rate budget now");
        }
        AdminCommand::RateBudgets => {
            for budget in store.rate_budgets().await? {
                let paused =
                    budget.paused_until.map(|t| format!("\tpaused until {}", t.to_rfc3339())).unwrap_or_default();
                println!("{}\t{}/s\tburst {}{paused}", budget.subject, budget.rate.per_second(), budget.rate.burst());
            }
        }
    }
    store.close().await;
    Ok(())
}

/// A password from standard input: its first line, without the line end.
fn read_password() -> anyhow::Result<secrecy::SecretString> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprintln!("new password (input is shown; pipe it in to keep it off the screen):");
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    line.clear();
    if password.is_empty() {
        anyhow::bail!("no password on standard input");
    }
    Ok(password.into())
}
