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

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use iceberg::io::{FileIO, FileIOBuilder, LocalFsStorageFactory};
use iceberg::spec::{ManifestList, TableMetadata};

use crate::store::Store;

/// A file no table refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub path: PathBuf,
    pub bytes: u64,
}

/// What a look for orphans found.
#[derive(Debug, Default)]
pub struct Findings {
    pub orphans: Vec<Orphan>,
    /// Warehouse folders left alone because a sync is running into them.
    pub busy: Vec<PathBuf>,
}

/// Why the orphans of a warehouse could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum OrphansError {
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
        "{} holds none of {} files its catalog refers to (such as {}): is this the server's data directory?",
        folder.display(), missing, example.display()
    )]
    Elsewhere { folder: PathBuf, missing: usize, example: PathBuf },
}

/// The orphans of every lakehouse under `data_dir`, by path: files not
/// referenced by their warehouse's catalog and last written at least
/// `grace` ago.
pub async fn orphans(store: &Store, data_dir: &Path, grace: Duration) -> Result<Findings, OrphansError> {
    let root = data_dir.join("lakehouse");
    let root = match std::fs::canonicalize(&root) {
        Ok(root) => root,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Findings::default()),
        Err(source) => return Err(OrphansError::Folder { path: root, source }),
    };
    let busy = store.lakehouses_being_loaded().await?;
    let mut found = Findings::default();
    for workspace in folders(&root)? {
        for warehouse in folders(&workspace)? {
            let (Some(ws), Some(name)) = (file_name(&workspace), file_name(&warehouse)) else { continue };
            if busy.iter().any(|(w, folder)| *w == ws && *folder == name) {
                found.busy.push(warehouse);
                continue;
            }
            // The files first, then what refers to them: a commit in
            // between only makes a listed file referenced.
            let cutoff = SystemTime::now() - grace;
            let mut files = Vec::new();
            walk(&warehouse, &mut files)?;
            let referenced = referenced(store, &format!("{ws}/{name}")).await?;
            let listed: HashSet<&PathBuf> = files.iter().map(|(path, ..)| path).collect();
            let missing: Vec<&PathBuf> = referenced.iter().filter(|p| !listed.contains(p) && p.exists()).collect();
            if let Some(example) = missing.first() {
                return Err(OrphansError::Elsewhere {
                    folder: warehouse.clone(),
                    missing: missing.len(),
                    example: example.to_path_buf(),
                });
            }
            for (path, bytes, modified) in files {
                if modified <= cutoff && !referenced.contains(&path) {
                    found.orphans.push(Orphan { path, bytes });
                }
            }
        }
    }
    Ok(found)
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

/// The local paths every table of `catalog` refers to.
async fn referenced(store: &Store, catalog: &str) -> Result<HashSet<PathBuf>, OrphansError> {
    let file_io = FileIOBuilder::new(std::sync::Arc::new(LocalFsStorageFactory)).build();
    let mut paths = HashSet::new();
    for (namespace, table, location) in store.iceberg_catalog_tables(catalog).await? {
        let failed = |source| OrphansError::Table { table: format!("{namespace}.{table}"), source: Box::new(source) };
        reach(&file_io, &location, &mut paths).await.map_err(failed)?;
    }
    Ok(paths)
}

async fn reach(file_io: &FileIO, location: &str, paths: &mut HashSet<PathBuf>) -> iceberg::Result<()> {
    let metadata = TableMetadata::read_from(file_io, location).await?;
    paths.insert(local(location));
    paths.extend(metadata.metadata_log().iter().map(|m| local(&m.metadata_file)));
    let mut manifests = HashSet::new();
    for snapshot in metadata.snapshots() {
        paths.insert(local(snapshot.manifest_list()));
        let bytes = file_io.new_input(snapshot.manifest_list())?.read().await?;
        for manifest in ManifestList::parse_with_version(&bytes, metadata.format_version())?.entries() {
            if manifests.insert(manifest.manifest_path.clone()) {
                paths.insert(local(&manifest.manifest_path));
                for entry in manifest.load_manifest(file_io).await?.entries() {
                    paths.insert(local(entry.file_path()));
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
pub fn remove(orphans: &[Orphan]) -> std::io::Result<u64> {
    let mut freed = 0;
    for orphan in orphans {
        match std::fs::remove_file(&orphan.path) {
            Ok(()) => freed += orphan.bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(freed)
}
