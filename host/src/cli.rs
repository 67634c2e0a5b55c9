//! The `service` command line: `serve`, `admin ...`.

use clap::{Parser, Subcommand};
use secrecy::ExposeSecret;

use crate::access::Role;
use crate::config::{ServeArgs, ServerConfig, StorageArgs, database_url};
use crate::store::Store;

/// Control server of the data-integration platform.
#[derive(Debug, Parser)]
#[command(name = "service", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Offline administration against the server's database.
    #[command(subcommand)]
    Admin(AdminCommand),
}

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
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| "must be administrator, editor or viewer".into())
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            crate::telemetry::init_logging(args.log_format);
            let config = ServerConfig::from_args(&cli.storage, &args)?;
            crate::server::serve(config).await
        }
        Command::Admin(cmd) => {
            crate::telemetry::init_logging(crate::config::LogFormat::Human);
            let url = database_url(&cli.storage)?;
            let store = Store::connect(&url).await.map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot open the database: {e}"))?;
            match cmd {
                AdminCommand::CreateUser { email, name, workspace, role } => {
                    let (user_id, workspace_id) = crate::admin::create_user(&store, &email, &name, workspace.as_deref(), role).await?;
                    println!("created user {user_id} ({}) in workspace {workspace_id} as {}", email.trim(), role.as_str());
                }
                AdminCommand::CreateToken { email, label, expires_in_days } => {
                    let token = crate::admin::create_token(&store, &email, label.as_deref(), expires_in_days).await?;
                    // The token itself goes to stdout alone, so scripts can
                    // capture it; the note goes to stderr.
                    eprintln!("API token for {} (shown once):", email.trim());
                    println!("{}", token.expose_secret());
                }
            }
            store.close().await;
            Ok(())
        }
    }
}
