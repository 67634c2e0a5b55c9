//! The `service` command line: `serve` runs the server, `admin`,
//! `plugins` and `warehouse` administer an installation offline against its
//! database (and data directory),
//! `auth` signs the CLI in to a running service, the resource commands
//! (`sources`, `pipelines`, `approvals`, ...) call its API, and `mcp`
//! serves the API's tools to a local assistant over stdio.
//!
//! Layout:
//! - this module: the commands and their dispatch;
//! - [`admin`]: `service admin ...`, offline against the database;
//! - [`plugins`]: `service plugins ...`, offline;
//! - [`warehouse`]: `service warehouse ...`, offline;
//! - [`client`]: the CLI as an API client (addresses, stored logins,
//!   requests marked `X-Service-Client: cli`, exit codes by failure);
//! - [`auth`]: `service auth login|status|logout`;
//! - [`author`]: `service plugins new|record|test`, for connector authors;
//! - [`api`]: the API's resources as commands.

pub(crate) mod admin;
pub(crate) mod api;
pub(crate) mod auth;
pub(crate) mod author;
pub mod client;
pub(crate) mod plugins;
pub(crate) mod warehouse;

use clap::{Parser, Subcommand};

use crate::config::{ServeArgs, ServerConfig, StorageArgs};

/// Control server of the data-integration platform.
#[derive(Debug, Parser)]
#[command(
    name = "service",
    version,
    about,
    after_help = "Exit codes: 0 done; 1 failed otherwise; 2 usage error; 3 the API refused (code, message and request id printed); 4 the service could not be reached; 5 a job waited for did not succeed."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The database settings of a command that works on the server's own
    /// database (serve, admin, plugins); none for the client commands.
    pub fn storage_mut(&mut self) -> Option<&mut StorageArgs> {
        match &mut self.command {
            Command::Serve { local, .. }
            | Command::Admin { local, .. }
            | Command::Plugins { local, .. }
            | Command::Warehouse { local, .. } => Some(&mut local.storage),
            Command::Mcp { .. } | Command::Auth { .. } | Command::Api(_) => None,
        }
    }
}

/// What the commands that run the server or work on its database take
/// (and the client commands do not show).
#[derive(Debug, clap::Args)]
pub struct Local {
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// The log filter of a command that logs.
#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Which log lines to write: a level (`info`, `debug`) or directives
    /// per module (`info,service=debug,sqlx=warn`). Default: `info`;
    /// `warn` for `plugins test`, whose report is the output.
    #[arg(long = "log", env = "SERVICE_LOG", global = true)]
    pub filter: Option<String>,
}

impl LogArgs {
    /// The filter asked for, or `default`.
    pub fn filter_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.filter.as_deref().unwrap_or(default)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve {
        #[command(flatten)]
        local: Local,
        #[command(flatten)]
        serve: Box<ServeArgs>,
    },
    /// Offline administration against the server's database.
    Admin {
        #[command(flatten)]
        local: Local,
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// Serve the API's tools to a local assistant over MCP (stdio), calling
    /// a running server with your token.
    ///
    /// It uses the login `service auth login` stored for the API address,
    /// or `SERVICE_TOKEN`; its calls are the assistant's (`mcp`) whatever
    /// the session.
    Mcp {
        #[command(flatten)]
        addresses: client::Addresses,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Connector plugins: make, record, test and validate one (authors);
    /// list, load and unload them (operators).
    Plugins {
        #[command(flatten)]
        local: Local,
        #[command(subcommand)]
        command: plugins::PluginsCommand,
    },
    /// Lakehouse warehouses, offline against the database and the data
    /// directory.
    Warehouse {
        #[command(flatten)]
        local: Local,
        #[command(subcommand)]
        command: warehouse::WarehouseCommand,
    },
    /// Sign this CLI in to a running service (through the browser), show
    /// who is signed in, sign out.
    Auth {
        #[command(flatten)]
        addresses: client::Addresses,
        #[command(subcommand)]
        command: auth::AuthCommand,
    },
    #[command(flatten)]
    Api(Box<api::ApiCommand>),
}

/// The installation's control database, as an offline command opens it.
async fn open_store(storage: &StorageArgs) -> anyhow::Result<crate::store::Store> {
    let url = crate::config::database_url(storage)?;
    crate::store::Store::connect(&url).await.map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot open the database: {e}"))
}

/// The installation's vault over `store`, unsealed with its master key.
fn open_vault(storage: &StorageArgs, store: &crate::store::Store) -> anyhow::Result<crate::credentials::Vault> {
    let keyring = crate::credentials::keyring::Keyring::load(&storage.data_dir, storage.master_key.as_ref())?;
    Ok(crate::credentials::Vault::new(store.clone(), keyring))
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { local, serve } => {
            crate::telemetry::init_logging(serve.log_format, local.log.filter_or("info"))?;
            let config = ServerConfig::from_args(&local.storage, &serve)?;
            crate::server::serve(config).await
        }
        Command::Plugins { local, command } => {
            let quiet = matches!(command, plugins::PluginsCommand::Test(_) | plugins::PluginsCommand::Conform(_));
            let filter = local.log.filter_or(if quiet { "warn" } else { "info" });
            crate::telemetry::init_logging(crate::config::LogFormat::Human, filter)?;
            plugins::run(&local.storage, command).await
        }
        Command::Mcp { addresses, log } => {
            crate::telemetry::init_logging(crate::config::LogFormat::Human, log.filter_or("info"))?;
            let token = addresses.token()?;
            crate::mcp::serve_stdio(addresses.root(), token).await
        }
        Command::Warehouse { local, command } => warehouse::run(local, command).await,
        Command::Auth { addresses, command } => Ok(auth::run(&addresses, command).await?),
        Command::Api(cmd) => Ok(api::run(*cmd).await?),
        Command::Admin { local, command } => admin::run(local, command).await,
    }
}
