//! The tenants' warehouses as the server reaches them: one handle that
//! knows where each workspace's files live, which databases may be
//! reached, and how a destination's password is revealed, so a caller
//! names a workspace and a destination and gets a writer or a query.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use secrecy::SecretString;

use super::config::{Lakehouse, Revealed};
use super::query::{Bounds, ModelRows, QueryError};
use super::{DestinationConfig, Place, WriteError, Writer, postgres};
use crate::egress::SecretError;
use crate::error::ApiError;
use crate::retry::Transient;
use crate::store::Store;
use crate::store::destinations::Destination;

/// A credential being revealed.
pub(crate) type Revealing<'a, T> = Pin<Box<dyn Future<Output = Result<T, SecretError>> + Send + 'a>>;

/// Reveals a destination's credential, for the destination's own host in
/// its own workspace. Implemented by the vault.
pub trait PasswordSource: Send + Sync {
    /// A database's password: the credential's secret.
    fn password<'a>(&'a self, workspace_id: &'a str, handle: &'a str, host: &'a str) -> Revealing<'a, SecretString>;

    /// An object store's access key: a basic credential's username (the
    /// key's id) and its secret.
    fn access_key<'a>(
        &'a self,
        workspace_id: &'a str,
        handle: &'a str,
        host: &'a str,
    ) -> Revealing<'a, (String, SecretString)>;
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
    /// The API's answer when a request `doing` something could not reach
    /// the warehouse: a configuration that is not valid as the client's
    /// error, anything else as the destination's being unavailable.
    pub(crate) fn refusal(self, doing: &str) -> ApiError {
        match self {
            WarehouseError::Config(e) => e,
            other => ApiError::unavailable(format!("{doing}: {other}")),
        }
    }
}

impl Transient for WarehouseError {
    /// Whether another attempt may succeed.
    fn is_transient(&self) -> bool {
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
    /// Roots trusted beside the system's for object-store endpoints.
    extra_roots: Vec<reqwest::Certificate>,
    passwords: Arc<dyn PasswordSource>,
    /// The control database, which holds the lakehouses' catalogs.
    catalogs: Store,
}

impl Warehouses {
    pub fn new(
        data_dir: PathBuf,
        policy: postgres::WarehousePolicy,
        extra_roots: Vec<reqwest::Certificate>,
        passwords: Arc<dyn PasswordSource>,
        catalogs: Store,
    ) -> Self {
        Warehouses { data_dir, policy, extra_roots, passwords, catalogs }
    }

    /// Where `workspace_id`'s files live and what it may reach.
    pub fn place<'a>(&'a self, workspace_id: &'a str) -> Place<'a> {
        Place {
            data_dir: &self.data_dir,
            workspace_id,
            warehouses: &self.policy,
            extra_roots: &self.extra_roots,
            catalogs: Some(&self.catalogs),
        }
    }

    /// The destination's configuration, checked, and its credential as
    /// the vault reveals it, if it names one.
    async fn resolve(&self, dest: &Destination) -> Result<(DestinationConfig, Option<Revealed>), WarehouseError> {
        let config = super::validate(dest.kind, &dest.configuration).map_err(WarehouseError::Config)?;
        let ws = &dest.workspace_id;
        let revealed = match &config {
            DestinationConfig::Postgres { target, credential_handle: Some(h), .. } => Some(Revealed::Password(
                self.passwords.password(ws, h, &target.host).await.map_err(WarehouseError::Credential)?,
            )),
            DestinationConfig::Iceberg { warehouse: Lakehouse::ObjectStore(s3), .. } => {
                let (id, secret) = self
                    .passwords
                    .access_key(ws, &s3.credential_handle, s3.host())
                    .await
                    .map_err(WarehouseError::Credential)?;
                Some(Revealed::AccessKey { id, secret })
            }
            _ => None,
        };
        Ok((config, revealed))
    }

    /// A writer of one job into `dest`.
    pub async fn writer(&self, dest: &Destination) -> Result<Writer, WarehouseError> {
        let (config, revealed) = self.resolve(dest).await?;
        Writer::open(&config, &self.place(&dest.workspace_id), revealed).await.map_err(WarehouseError::Write)
    }

    /// Up to `limit` rows pipeline `pipeline_id` wrote to `stream`'s table
    /// in `dest` after position `after` ([`Writer::rows_after`]).
    pub(crate) async fn rows_after(
        &self,
        dest: &Destination,
        (pipeline_id, stream): (&str, &str),
        columns: &[&str],
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, serde_json::Map<String, serde_json::Value>)>, WarehouseError> {
        let writer = self.writer(dest).await?;
        let rows = writer.rows_after((pipeline_id, stream), columns, after, limit).await.map_err(WarehouseError::Write);
        writer.close().await;
        rows
    }

    /// Whether any of `streams`' tables in `dest` holds a row pipeline
    /// `pipeline_id` wrote (one connection for all of them).
    pub(crate) async fn any_rows(
        &self,
        dest: &Destination,
        pipeline_id: &str,
        streams: &[String],
    ) -> Result<bool, WarehouseError> {
        let writer = self.writer(dest).await?;
        let mut any = Ok(false);
        for stream in streams {
            any = writer
                .rows_after((pipeline_id, stream), &["_service_raw_id"], "", 1)
                .await
                .map(|rows| !rows.is_empty());
            if !matches!(any, Ok(false)) {
                break;
            }
        }
        writer.close().await;
        any.map_err(WarehouseError::Write)
    }

    /// Runs a model's query over `dest`, read-only and within `bounds`.
    pub async fn query(&self, dest: &Destination, sql: &str, bounds: Bounds) -> Result<ModelRows, WarehouseError> {
        let (config, revealed) = self.resolve(dest).await?;
        let password = revealed.and_then(Revealed::into_password);
        super::query::run(&config, &self.place(&dest.workspace_id), password, sql, bounds)
            .await
            .map_err(WarehouseError::Query)
    }
}
