//! A lakehouse destination's configuration: a folder of the workspace's
//! lakehouse, or an `s3://bucket/prefix` with its endpoint, region and
//! access key; a namespace, how often to commit, and partitions per
//! stream.

use serde_json::{Map, Value};

use super::s3::S3Warehouse;
use crate::error::ApiError;
use crate::warehouse::DestinationConfig;
use crate::warehouse::config::plain_name;

/// The fields a lakehouse destination takes.
pub(crate) const FIELDS: &[&str] =
    &["warehouse", "namespace", "commit_every_seconds", "partitions", "endpoint", "region", "credential_handle"];

/// Where a lakehouse's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lakehouse {
    /// `<data-dir>/lakehouse/<workspace>/<folder>`.
    Folder(String),
    /// A bucket (and prefix) of an S3-compatible object store.
    ObjectStore(S3Warehouse),
}

impl Lakehouse {
    /// How the warehouse's catalog is named in the control database:
    /// `<workspace>/<folder>`, or `<workspace>/s3://bucket/prefix`.
    pub fn catalog_name(&self, workspace_id: &str) -> String {
        match self {
            Lakehouse::Folder(folder) => format!("{workspace_id}/{folder}"),
            Lakehouse::ObjectStore(s3) => format!("{workspace_id}/{}", s3.location()),
        }
    }
}

/// The fields only an object-store warehouse takes.
const OBJECT_STORE_FIELDS: &[&str] = &["endpoint", "region", "credential_handle"];

/// An `s3://bucket[/prefix]` warehouse with its endpoint, region and the
/// credential holding its access key.
fn object_store(obj: &Map<String, Value>, location: &str) -> Result<S3Warehouse, ApiError> {
    let invalid = |field: &str, m: &str| ApiError::invalid_field(&format!("configuration.{field}"), m);
    let rest = location
        .strip_prefix("s3://")
        .ok_or_else(|| invalid("warehouse", "warehouse must be a folder name or an s3://bucket/prefix location"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !bucket_ok {
        return Err(invalid(
            "warehouse",
            "the bucket must be 3 to 63 lower-case letters, digits, . and -, starting and ending with a letter or digit",
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    let prefix_ok = prefix.len() <= 200
        && (prefix.is_empty()
            || prefix.split('/').all(|s| {
                !s.is_empty()
                    && s != "."
                    && s != ".."
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            }));
    if !prefix_ok {
        return Err(invalid(
            "warehouse",
            "the prefix must be folder names of letters, digits, . _ and - separated by /, at most 200 characters",
        ));
    }
    let region = match obj.get("region") {
        None | Some(Value::Null) => "us-east-1".to_owned(),
        Some(Value::String(r))
            if !r.is_empty() && r.len() <= 32 && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
        {
            r.clone()
        }
        Some(_) => return Err(invalid("region", "region must be a region name such as us-east-1")),
    };
    let endpoint = match obj.get("endpoint") {
        None | Some(Value::Null) => format!("https://s3.{region}.amazonaws.com"),
        Some(Value::String(e)) => e.clone(),
        Some(_) => return Err(invalid("endpoint", "endpoint must be an https:// URL")),
    };
    let endpoint = url::Url::parse(&endpoint)
        .ok()
        .filter(|u| {
            u.scheme() == "https"
                && u.host_str().is_some_and(|h| !h.is_empty())
                && u.username().is_empty()
                && u.password().is_none()
                && matches!(u.path(), "" | "/")
                && u.query().is_none()
                && u.fragment().is_none()
        })
        .ok_or_else(|| {
            invalid("endpoint", "endpoint must be an https:// URL naming only a host and port (the store's address)")
        })?;
    let credential_handle = obj.get("credential_handle").and_then(Value::as_str).filter(|h| !h.is_empty()).ok_or_else(
        || {
            invalid(
                "credential_handle",
                "credential_handle is required: a credential holding the secret access key, bound to the endpoint's host",
            )
        },
    )?;
    Ok(S3Warehouse {
        bucket: bucket.to_owned(),
        prefix: prefix.to_owned(),
        endpoint,
        region,
        credential_handle: credential_handle.to_owned(),
    })
}

/// A partition field of a lakehouse table: a top-level column and how its
/// values are grouped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    pub field: String,
    pub transform: iceberg::spec::Transform,
}

/// Partition fields per stream, at most four each: `{"<stream>": [{"field":
/// "updated_at", "transform": "day"}, ...]}`.
fn partitions(value: Option<&Value>) -> Result<std::collections::BTreeMap<String, Vec<PartitionField>>, ApiError> {
    use iceberg::spec::Transform;
    let invalid = |m: String| ApiError::invalid_field("configuration.partitions", m);
    let streams = match value {
        None | Some(Value::Null) => return Ok(Default::default()),
        Some(Value::Object(streams)) => streams,
        Some(_) => return Err(invalid("partitions must map stream names to lists of partition fields".into())),
    };
    let mut out = std::collections::BTreeMap::new();
    for (stream, fields) in streams {
        let fields = fields
            .as_array()
            .filter(|f| f.len() <= 4)
            .ok_or_else(|| invalid(format!("partitions.{stream} must be a list of at most four partition fields")))?;
        let parsed = fields
            .iter()
            .map(|f| {
                let field = f.get("field").and_then(Value::as_str).filter(|s| !s.is_empty());
                let field = field.ok_or_else(|| invalid(format!("each partition field of {stream} needs a field")))?;
                let transform = f.get("transform").and_then(Value::as_str).unwrap_or("identity");
                let parsed = transform.parse::<Transform>().ok().filter(|t| {
                    matches!(
                        t,
                        Transform::Identity
                            | Transform::Year
                            | Transform::Month
                            | Transform::Day
                            | Transform::Hour
                            | Transform::Bucket(1..)
                            | Transform::Truncate(1..)
                    )
                });
                let transform = parsed.ok_or_else(|| {
                    invalid(format!(
                        "{transform} is not a partition transform: use identity, year, month, day, hour, bucket[N] or truncate[W]"
                    ))
                })?;
                Ok(PartitionField { field: field.to_owned(), transform })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        out.insert(stream.clone(), parsed);
    }
    Ok(out)
}

/// A lakehouse destination's configuration, checked (its fields are
/// [`FIELDS`]).
pub(crate) fn config(obj: &Map<String, Value>) -> Result<DestinationConfig, ApiError> {
    let warehouse = match obj.get("warehouse").and_then(Value::as_str) {
        Some(location) if location.contains("://") => Lakehouse::ObjectStore(object_store(obj, location)?),
        folder => {
            if let Some(field) = OBJECT_STORE_FIELDS.iter().find(|f| obj.contains_key(**f)) {
                return Err(ApiError::invalid_field(
                    &format!("configuration.{field}"),
                    format!("{field} is only for an s3:// warehouse"),
                ));
            }
            Lakehouse::Folder(plain_name("configuration.warehouse", folder)?)
        }
    };
    let namespace = match obj.get("namespace") {
        None | Some(Value::Null) => "default".to_owned(),
        Some(Value::String(n))
            if !n.is_empty() && n.len() <= 100 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            n.clone()
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "configuration.namespace",
                "namespace must be a name of letters, digits and _",
            ));
        }
    };
    let commit_every = match obj.get("commit_every_seconds") {
        None | Some(Value::Null) => 10,
        Some(v) => v.as_u64().filter(|s| (1..=3600).contains(s)).ok_or_else(|| {
            ApiError::invalid_field(
                "configuration.commit_every_seconds",
                "commit_every_seconds must be a whole number from 1 to 3600",
            )
        })?,
    };
    Ok(DestinationConfig::Iceberg {
        warehouse,
        namespace,
        commit_every: std::time::Duration::from_secs(commit_every),
        partitions: partitions(obj.get("partitions"))?,
    })
}
