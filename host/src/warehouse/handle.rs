//! The tenants' warehouses as the server reaches them: one handle that
//! knows where each workspace's files live, which databases may be
//! reached, and how a destination's password is revealed, so a caller
//! names a workspace and a destination and gets a writer or a query.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use secrecy::SecretString;

use super::query::{Bounds, ModelRows, QueryError};
use super::{DestinationConfig, Place, WriteError, Writer, postgres};
use crate::egress::SecretError;
use crate::error::ApiError;
use crate::store::Store;
use crate::store::destinations::Destination;

/// Reveals a destination's password (its credential's secret), for the
/// destination's own host in its own workspace. Implemented by the vault.
pub trait PasswordSource: Send + Sync {
    fn password<'a>(
        &'a self,
        workspace_id: &'a str,
        handle: &'a str,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<SecretString, SecretError>> + Send + 'a>>;
}

/// Why a warehouse could not be opened or queried.
#[derive(Debug, thiserror::Error)]
pub enum WarehouseError {
    /// The destination's stored configuration is not valid (any more).
    #[error("{}", .0.message)]
    Config(ApiError),
    /// Its credential cannot be used.
    #[error("the destination's credential cannot be used: {0}")]
    Credential(SecretError),
    #[error(transparent)]
    Write(WriteError),
    #[error(transparent)]
    Query(QueryError),
}

impl WarehouseError {
    /// Whether another attempt may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            WarehouseError::Config(_) => false,
            WarehouseError::Credential(e) => e.is_transient(),
            WarehouseError::Write(e) => e.is_transient(),
            WarehouseError::Query(e) => e.is_transient(),
        }
    }
}

/// See the module documentation.
pub struct Warehouses {
    data_dir: PathBuf,
    policy: postgres::WarehousePolicy,
    passwords: Arc<dyn PasswordSource>,
    /// The control database, which holds the lakehouses' catalogs.
    catalogs: Store,
}

impl Warehouses {
    pub fn new(
        data_dir: PathBuf,
        policy: postgres::WarehousePolicy,
        passwords: Arc<dyn PasswordSource>,
        catalogs: Store,
    ) -> Self {
        Warehouses { data_dir, policy, passwords, catalogs }
    }

    /// Where `workspace_id`'s files live and what it may reach.
    pub fn place<'a>(&'a self, workspace_id: &'a str) -> Place<'a> {
        Place { data_dir: &self.data_dir, workspace_id, warehouses: &self.policy, catalogs: Some(&self.catalogs) }
    }

    /// The destination's configuration, checked, and its password, if it
    /// names a credential.
    async fn resolve(&self, dest: &Destination) -> Result<(DestinationConfig, Option<SecretString>), WarehouseError> {
        let config = super::validate(dest.kind, &dest.configuration).map_err(WarehouseError::Config)?;
        let password = match &config {
            DestinationConfig::Postgres { target, credential_handle: Some(h), .. } => Some(
                self.passwords
                    .password(&dest.workspace_id, h, &target.host)
                    .await
                    .map_err(WarehouseError::Credential)?,
            ),
            _ => None,
        };
        Ok((config, password))
    }

    /// A writer of one job into `dest`.
    pub async fn writer(&self, dest: &Destination) -> Result<Writer, WarehouseError> {
        let (config, password) = self.resolve(dest).await?;
        Writer::open(&config, &self.place(&dest.workspace_id), password).await.map_err(WarehouseError::Write)
    }

    /// Runs a model's query over `dest`, read-only and within `bounds`.
    pub async fn query(&self, dest: &Destination, sql: &str, bounds: Bounds) -> Result<ModelRows, WarehouseError> {
        let (config, password) = self.resolve(dest).await?;
        super::query::run(&config, &self.place(&dest.workspace_id), password, sql, bounds)
            .await
            .map_err(WarehouseError::Query)
    }
}
