//! Destination configurations ([`DestinationConfig`]), checked
//! ([`validate`]: the fields of a kind, then the kind's own checks, in its
//! module), and where a workspace's files live and what its databases may
//! reach ([`Place`]).

use std::path::Path;

use serde_json::{Map, Value};

pub use super::iceberg::config::Lakehouse;
pub(crate) use super::iceberg::config::PartitionField;
use super::{iceberg, jsonl, postgres, sqlite};
use crate::error::ApiError;
use crate::store::kinds::DestinationKind;

/// Where a job's destination lives and what it may reach: files of a
/// workspace stay under that workspace's own folders, so no other
/// workspace can name them (a destination's `file` is only a name, and the
/// folder is the workspace's), and databases are reached only as the
/// operator allows.
pub struct Place<'a> {
    pub data_dir: &'a Path,
    pub workspace_id: &'a str,
    pub warehouses: &'a postgres::WarehousePolicy,
    /// Roots trusted beside the system's for object-store endpoints (the
    /// operator's `SERVICE_EGRESS_EXTRA_ROOTS`).
    pub extra_roots: &'a [reqwest::Certificate],
    /// The control database, which holds the lakehouses' catalogs.
    pub catalogs: Option<&'a crate::store::Store>,
}

impl Place<'_> {
    /// `<data-dir>/warehouses/<workspace>`: the workspace's SQLite files.
    pub(crate) fn warehouse_dir(&self) -> std::path::PathBuf {
        self.data_dir.join("warehouses").join(self.workspace_id)
    }

    /// `<data-dir>/exports/<workspace>`: the workspace's JSON-lines folders.
    pub(crate) fn export_dir(&self) -> std::path::PathBuf {
        self.data_dir.join("exports").join(self.workspace_id)
    }

    /// `<data-dir>/lakehouse/<workspace>`: the workspace's Iceberg warehouses.
    pub(crate) fn lakehouse_dir(&self) -> std::path::PathBuf {
        self.data_dir.join("lakehouse").join(self.workspace_id)
    }
}

/// A validated destination configuration.
#[derive(Debug, Clone)]
pub enum DestinationConfig {
    /// `<data-dir>/warehouses/<workspace>/<file>`.
    Sqlite { file: String },
    /// A PostgreSQL database; the password, if any, by credential handle
    /// (bound to the database host); reverse-ETL models run as
    /// `model_role` when it is given.
    Postgres { target: postgres::Target, credential_handle: Option<String>, model_role: Option<String> },
    /// `<data-dir>/exports/<workspace>/<directory>/<stream>.jsonl`.
    Jsonl { directory: String },
    /// Iceberg tables in `warehouse`, in `namespace`, cataloged in the
    /// control database, committed at most every `commit_every`,
    /// partitioned per stream as `partitions` says.
    Iceberg {
        warehouse: Lakehouse,
        namespace: String,
        commit_every: std::time::Duration,
        partitions: std::collections::BTreeMap<String, Vec<PartitionField>>,
    },
}

/// A destination's credential, as the vault reveals it for the
/// destination's host.
pub enum Revealed {
    /// A database's password.
    Password(secrecy::SecretString),
    /// An object store's access key: its id (the basic credential's
    /// username) and its secret.
    AccessKey { id: String, secret: secrecy::SecretString },
}

impl Revealed {
    /// The password, if this is one.
    pub fn into_password(self) -> Option<secrecy::SecretString> {
        match self {
            Revealed::Password(p) => Some(p),
            Revealed::AccessKey { .. } => None,
        }
    }
}

pub(crate) fn plain_name(field: &str, v: Option<&str>) -> Result<String, ApiError> {
    let v = v.ok_or_else(|| ApiError::invalid_field(field, format!("{field} is required")))?;
    let ok = !v.is_empty()
        && v.len() <= 100
        && !v.starts_with('.')
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(ApiError::invalid_field(
            field,
            format!("{field} must be a plain file name (letters, digits, . _ -)"),
        ));
    }
    // SQLite keeps a database's write-ahead log, shared-memory index and
    // rollback journal beside it under these suffixes: a destination named
    // like one would write into another destination's live state.
    let lower = v.to_ascii_lowercase();
    if SIDE_FILE_SUFFIXES.iter().any(|s| lower.ends_with(s)) {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "{field} must not end in {}: SQLite uses those names for its own files",
                SIDE_FILE_SUFFIXES.join(", ")
            ),
        ));
    }
    Ok(v.to_owned())
}

/// The optional `credential_handle` of a configuration: absent, null or a
/// string.
pub(crate) fn optional_handle(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match obj.get("credential_handle") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(h)) => Ok(Some(h.clone())),
        Some(_) => {
            Err(ApiError::invalid_field("configuration.credential_handle", "credential_handle must be a string"))
        }
    }
}

/// Names SQLite gives the files it keeps beside a database.
pub(crate) const SIDE_FILE_SUFFIXES: &[&str] = &["-wal", "-shm", "-journal"];

/// Validates a destination of `kind`: its fields, then the kind's own
/// checks (each kind's `config`).
pub fn validate(kind: DestinationKind, config: &Value) -> Result<DestinationConfig, ApiError> {
    let obj = config
        .as_object()
        .ok_or_else(|| ApiError::invalid_field("configuration", "configuration must be an object"))?;
    type Check = fn(&Map<String, Value>) -> Result<DestinationConfig, ApiError>;
    let (fields, check): (&[&str], Check) = match kind {
        DestinationKind::Sqlite => (sqlite::FIELDS, sqlite::config),
        DestinationKind::Postgres => (postgres::FIELDS, postgres::config),
        DestinationKind::Jsonl => (jsonl::FIELDS, jsonl::config),
        DestinationKind::Iceberg => (iceberg::config::FIELDS, iceberg::config::config),
    };
    if let Some(k) = obj.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(&format!("configuration.{k}"), format!("unknown field {k}")));
    }
    check(obj)
}
