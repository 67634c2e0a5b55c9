//! Connecting to a PostgreSQL destination: connect options built from the
//! [`Target`](super::Target) alone, under the warehouses' address policy.

use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::PgConnectOptions;

use super::config::Target;
use crate::config::warehouse::WarehousePolicy;
use crate::egress::reach::{Rules, Unreachable, allowed_addresses};
use crate::warehouse::config::{Place, Revealed};
use crate::warehouse::tables::Db;
use crate::warehouse::{WriteError, failed};

/// Why a destination's database is not connected to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotConnected {
    /// The address policy refused its host ([`Reach::Warehouses`](crate::egress::Reach::Warehouses)).
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error("the server's environment sets PGOPTIONS; refusing to pass it to a destination")]
    EnvironmentOptions,
}

impl NotConnected {
    /// The refusal as a write's error (see [`unreachable`](crate::warehouse::unreachable)).
    pub(crate) fn write_error(self, context: &str) -> WriteError {
        match self {
            NotConnected::Unreachable(e) => crate::warehouse::unreachable(e, context),
            NotConnected::EnvironmentOptions => {
                WriteError::Refused(if context.is_empty() { self.to_string() } else { format!("{context}: {self}") })
            }
        }
    }
}

/// Resolves and checks the target's host and builds the driver's options
/// from the target's parts alone.
///
/// Without a password the connection goes to the address that was checked,
/// so a second DNS answer cannot rebind it. With one it goes to the name,
/// because `verify-full` checks the certificate against the name; a
/// rebound name then meets a server that cannot prove it, and the
/// password is never sent.
pub(crate) async fn connect_options(
    target: &Target,
    password: Option<&SecretString>,
    policy: &WarehousePolicy,
) -> Result<PgConnectOptions, NotConnected> {
    let addresses = allowed_addresses(&Rules::warehouses(policy), &target.host, target.port).await?;
    let host = if password.is_some() { target.host.clone() } else { addresses[0].ip().to_string() };
    // Every part is set here, so nothing comes from the environment; an
    // empty password keeps the driver from looking one up in a pgpass file.
    let options = PgConnectOptions::new_without_pgpass()
        .host(&host)
        .port(target.port)
        .username(&target.user)
        .database(&target.database)
        .password(password.map(|p| p.expose_secret()).unwrap_or(""))
        .ssl_mode(target.tls.driver())
        .application_name("service");
    if options.get_options().is_some() {
        return Err(NotConnected::EnvironmentOptions);
    }
    Ok(options)
}

/// Connections a job keeps to a PostgreSQL destination: batches of one
/// stream load over both at once.
pub(in crate::warehouse) const POSTGRES_CONNECTIONS: u32 = 2;

/// Connects to the PostgreSQL destination `target` for one job, as the
/// address policy allows, with its password if it has one.
pub(crate) async fn open(target: &Target, revealed: Option<Revealed>, place: &Place<'_>) -> Result<Db, WriteError> {
    let password = revealed.and_then(Revealed::into_password);
    let options = connect_options(target, password.as_ref(), place.warehouses).await.map_err(|e| e.write_error(""))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POSTGRES_CONNECTIONS)
        .connect_with(options)
        .await
        .map_err(|e| {
        failed(&format!("cannot connect to the PostgreSQL destination {}:{}", target.host, target.port), e)
    })?;
    Ok(Db::Postgres(pool))
}
