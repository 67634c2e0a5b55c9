//! Files in a lakehouse no table refers to: data files and metadata a
//! sync wrote but never committed (it was killed, or lost a race and
//! retried), staged tables a full refresh dropped, tables a reset forgot.
//! Readers never see them; they only take space until removed.
//!
//! A file is referenced when a table of the warehouse's catalog reaches it
//! from its current metadata: the metadata files in its log, every
//! snapshot's manifest list, every manifest and every data file those
//! list. A file younger than the grace period is never an orphan, and a
//! warehouse a sync is running into is left alone: the sync may be about
//! to commit what it wrote.
//!
//! Folder warehouses are found under the data directory. A warehouse in an
//! object store is found through the destinations that name it, and
//! listed with the access key of the first of them that works (the same
//! key a sync uses, under the same warehouse policy); one that cannot be
//! reached is left alone, with the reason. Workspaces may name the same
//! bucket and prefix (each with its own catalog): an object is an orphan
//! only when no catalog whose warehouse overlaps it refers to it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use iceberg::io::{FileIO, FileIOBuilder, LocalFsStorageFactory};
use iceberg::spec::{ManifestList, TableMetadata};

use super::s3::ObjectStore;
use crate::store::Store;
use crate::store::kinds::DestinationKind;
use crate::warehouse::config::Lakehouse;
use crate::warehouse::postgres::WarehousePolicy;
use crate::warehouse::{DestinationConfig, PasswordSource};

/// A file no table refers to.
#[derive(Debug, Clone)]
pub(crate) struct Orphan {
    /// Its path, or for an object its `s3://bucket/key`.
    pub location: String,
    pub bytes: u64,
    /// The bucket an object is in.
    bucket: Option<ObjectStore>,
}

/// What a look for orphans found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub orphans: Vec<Orphan>,
    /// Warehouses left alone because a sync is running into them.
    pub busy: Vec<String>,
    /// Object-store warehouses that could not be listed, and why.
    pub unreachable: Vec<(String, String)>,
}

/// How object-store warehouses are reached: the vault's access keys, and
/// the operator's warehouse policy and trusted roots.
pub(crate) struct ObjectStores<'a> {
    pub keys: &'a dyn PasswordSource,
    pub policy: &'a WarehousePolicy,
    pub extra_roots: &'a [reqwest::Certificate],
}

/// Why the orphans of a warehouse could not be listed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrphansError {
    #[error("cannot read the catalog: {0}")]
    Catalog(#[from] crate::store::StoreError),
    #[error("cannot read table {table}: {source}")]
    Table { table: String, source: Box<iceberg::Error> },
    #[error("cannot list {}: {source}", path.display())]
    Folder { path: PathBuf, source: std::io::Error },
    /// Files the catalog refers to are not where the data directory says
    /// they are (another data directory, another spelling of it): nothing
    /// is listed rather than everything.
    #[error(
        "{folder} holds none of {missing} files its catalog refers to (such as {example}): is this the server's data directory?"
    )]
    Elsewhere { folder: String, missing: usize, example: String },
}

/// The orphans of every lakehouse: those under `data_dir`, and with
/// `object_stores`, those in buckets. Files not referenced by their
/// warehouse's catalog and last written at least `grace` ago.
pub(crate) async fn orphans(
    store: &Store,
    data_dir: &Path,
    object_stores: Option<&ObjectStores<'_>>,
    grace: Duration,
) -> Result<Findings, OrphansError> {
    let busy = store.lakehouses_being_loaded().await?;
    let mut found = Findings::default();
    in_folders(store, data_dir, &busy, grace, &mut found).await?;
    if let Some(stores) = object_stores {
        in_buckets(store, stores, &busy, grace, &mut found).await?;
    }
    Ok(found)
}

async fn in_folders(
    store: &Store,
    data_dir: &Path,
    busy: &[(String, String)],
    grace: Duration,
    found: &mut Findings,
) -> Result<(), OrphansError> {
    let root = data_dir.join("lakehouse");
    let root = match std::fs::canonicalize(&root) {
        Ok(root) => root,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(OrphansError::Folder { path: root, source }),
    };
    for workspace in folders(&root)? {
        for warehouse in folders(&workspace)? {
            let (Some(ws), Some(name)) = (file_name(&workspace), file_name(&warehouse)) else { continue };
            if busy.iter().any(|(w, folder)| *w == ws && *folder == name) {
                found.busy.push(warehouse.display().to_string());
                continue;
            }
            // The files first, then what refers to them: a commit in
            // between only makes a listed file referenced.
            let cutoff = SystemTime::now() - grace;
            let mut files = Vec::new();
            walk(&warehouse, &mut files)?;
            let file_io = FileIOBuilder::new(std::sync::Arc::new(LocalFsStorageFactory)).build();
            let referenced: HashSet<PathBuf> =
                referenced(store, &format!("{ws}/{name}"), &file_io).await?.iter().map(|l| local(l)).collect();
            let listed: HashSet<&PathBuf> = files.iter().map(|(path, ..)| path).collect();
            let missing: Vec<&PathBuf> = referenced.iter().filter(|p| !listed.contains(p) && p.exists()).collect();
            if let Some(example) = missing.first() {
                return Err(OrphansError::Elsewhere {
                    folder: warehouse.display().to_string(),
                    missing: missing.len(),
                    example: example.display().to_string(),
                });
            }
            for (path, bytes, modified) in files {
                if modified <= cutoff && !referenced.contains(&path) {
                    found.orphans.push(Orphan { location: path.display().to_string(), bytes, bucket: None });
                }
            }
        }
    }
    Ok(())
}

/// The orphans of every object-store warehouse a destination names.
async fn in_buckets(
    store: &Store,
    stores: &ObjectStores<'_>,
    busy: &[(String, String)],
    grace: Duration,
    found: &mut Findings,
) -> Result<(), OrphansError> {
    // Catalogs looked at, and those no destination's key could list yet
    // (another destination naming the warehouse may hold a working key).
    let mut done = HashSet::new();
    let mut failed: Vec<(String, String, String)> = Vec::new();
    for (ws, configuration) in store.lakehouse_destinations().await? {
        let Ok(DestinationConfig::Iceberg { warehouse: Lakehouse::ObjectStore(s3), .. }) =
            crate::warehouse::validate(DestinationKind::Iceberg, &configuration)
        else {
            continue;
        };
        let catalog = Lakehouse::ObjectStore(s3.clone()).catalog_name(&ws);
        if done.contains(&catalog) {
            continue;
        }
        if busy.iter().any(|(w, location)| *w == ws && location.trim_end_matches('/') == s3.location()) {
            found.busy.push(s3.location());
            done.insert(catalog);
            continue;
        }
        // The objects first, then what refers to them (as for folders).
        let cutoff = chrono::Utc::now() - grace;
        let listing = match stores.keys.access_key(&ws, &s3.credential_handle, s3.host()).await {
            Ok(key) => match ObjectStore::connect(&s3, key, stores.policy, stores.extra_roots).await {
                Ok(bucket) => bucket.list(None).await.map(|listed| (bucket, listed)).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(format!("its credential cannot be used: {e}")),
        };
        let (bucket, listed) = match listing {
            Ok(listing) => listing,
            Err(why) => {
                failed.push((catalog, s3.location(), why));
                continue;
            }
        };
        done.insert(catalog.clone());
        let file_io = bucket.file_io();
        // Every catalog whose warehouse overlaps this one (another
        // workspace's on the same prefix, one on a folder inside it) keeps
        // its files: an object is an orphan only when none refers to it.
        let mut referenced = HashSet::new();
        let mut unreadable = None;
        for other in overlapping(&store.iceberg_catalog_names().await?, &s3.location()) {
            match self::referenced(store, &other, &file_io).await {
                Ok(found) => referenced.extend(found),
                Err(e) => unreadable = Some(format!("the catalog {other} shares its objects and cannot be read: {e}")),
            }
        }
        if let Some(why) = unreadable {
            found.unreachable.push((s3.location(), why));
            continue;
        }
        let names: HashSet<&str> = listed.iter().map(|l| l.location.as_str()).collect();
        let mut missing = Vec::new();
        for location in referenced.iter().filter(|l| !names.contains(l.as_str())) {
            if file_io.exists(location).await.unwrap_or(false) {
                missing.push(location.clone());
            }
        }
        if let Some(example) = missing.first() {
            return Err(OrphansError::Elsewhere {
                folder: s3.location(),
                missing: missing.len(),
                example: example.clone(),
            });
        }
        for object in listed {
            let old = chrono::DateTime::parse_from_rfc3339(&object.last_modified).is_ok_and(|t| t <= cutoff);
            if old && !referenced.contains(&object.location) {
                found.orphans.push(Orphan {
                    location: object.location,
                    bytes: object.bytes,
                    bucket: Some(bucket.clone()),
                });
            }
        }
    }
    for (catalog, location, why) in failed {
        if done.insert(catalog) {
            found.unreachable.push((location, why));
        }
    }
    Ok(())
}

fn file_name(path: &Path) -> Option<String> {
    path.file_name().and_then(|n| n.to_str()).map(str::to_owned)
}

fn folders(dir: &Path) -> Result<Vec<PathBuf>, OrphansError> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(OrphansError::Folder { path: dir.to_owned(), source }),
    };
    let mut out = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|source| OrphansError::Folder { path: dir.to_owned(), source })?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Every file under `dir` (symbolic links are not followed), with its
/// size and when it was last written.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64, SystemTime)>) -> Result<(), OrphansError> {
    let failed = |source| OrphansError::Folder { path: dir.to_owned(), source };
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(failed)?.collect::<Result<_, _>>().map_err(failed)?;
    entries.sort_by_key(std::fs::DirEntry::path);
    for entry in entries {
        let meta = std::fs::symlink_metadata(entry.path()).map_err(failed)?;
        if meta.is_dir() {
            walk(&entry.path(), out)?;
        } else if meta.is_file() {
            out.push((entry.path(), meta.len(), meta.modified().map_err(failed)?));
        }
    }
    Ok(())
}

/// The catalogs of `names` (`<workspace>/<location>`) whose object-store
/// location is `location`, lies inside it or contains it.
fn overlapping(names: &[String], location: &str) -> Vec<String> {
    let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
    names
        .iter()
        .filter(|name| {
            name.split_once('/').is_some_and(|(_, other)| {
                other.starts_with("s3://") && (inside(other, location) || inside(location, other))
            })
        })
        .cloned()
        .collect()
}

/// The locations every table of `catalog` refers to, as written.
async fn referenced(store: &Store, catalog: &str, file_io: &FileIO) -> Result<HashSet<String>, OrphansError> {
    let mut locations = HashSet::new();
    for (namespace, table, location) in store.iceberg_catalog_tables(catalog).await? {
        let failed = |source| OrphansError::Table { table: format!("{namespace}.{table}"), source: Box::new(source) };
        reach(file_io, &location, &mut locations).await.map_err(failed)?;
    }
    Ok(locations)
}

async fn reach(file_io: &FileIO, location: &str, found: &mut HashSet<String>) -> iceberg::Result<()> {
    let metadata = TableMetadata::read_from(file_io, location).await?;
    found.insert(location.to_owned());
    found.extend(metadata.metadata_log().iter().map(|m| m.metadata_file.clone()));
    let mut manifests = HashSet::new();
    for snapshot in metadata.snapshots() {
        found.insert(snapshot.manifest_list().to_owned());
        let bytes = file_io.new_input(snapshot.manifest_list())?.read().await?;
        for manifest in ManifestList::parse_with_version(&bytes, metadata.format_version())?.entries() {
            if manifests.insert(manifest.manifest_path.clone()) {
                found.insert(manifest.manifest_path.clone());
                for entry in manifest.load_manifest(file_io).await?.entries() {
                    found.insert(entry.file_path().to_owned());
                }
            }
        }
    }
    Ok(())
}

/// A `file://` location as a path, resolved as the walk sees it.
fn local(location: &str) -> PathBuf {
    let path = url::Url::parse(location)
        .ok()
        .and_then(|u| u.to_file_path().ok())
        .unwrap_or_else(|| PathBuf::from(location.strip_prefix("file://").unwrap_or(location)));
    std::fs::canonicalize(&path).unwrap_or(path)
}

/// Removes `orphans`; how many bytes were freed.
pub(crate) async fn remove(orphans: &[Orphan]) -> std::io::Result<u64> {
    let mut freed = 0;
    for orphan in orphans {
        match &orphan.bucket {
            Some(bucket) => {
                bucket.delete(&orphan.location).await.map_err(std::io::Error::other)?;
                freed += orphan.bytes;
            }
            None => match std::fs::remove_file(&orphan.location) {
                Ok(()) => freed += orphan.bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
        }
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogs_sharing_objects_are_those_whose_locations_overlap() {
        let names: Vec<String> = [
            "ws_a/s3://b/p",
            "ws_b/s3://b/p",
            "ws_c/s3://b/p/q",
            "ws_d/s3://b",
            "ws_e/s3://b/pq",
            "ws_f/s3://c/p",
            "ws_g/lake",
        ]
        .map(str::to_owned)
        .into();
        assert_eq!(
            overlapping(&names, "s3://b/p"),
            ["ws_a/s3://b/p", "ws_b/s3://b/p", "ws_c/s3://b/p/q", "ws_d/s3://b"]
        );
    }
}
