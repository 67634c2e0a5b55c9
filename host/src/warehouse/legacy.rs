//! A move of files from before each workspace had folders of its own.

use std::path::Path;

use crate::store::kinds::DestinationKind;

/// Moves files that destinations kept directly under `warehouses/` and
/// `exports/` (before each workspace had folders of its own) into their
/// workspace's folder, when exactly one workspace names them. A file that
/// several workspaces named is left where it is, with a warning: it cannot
/// be told whose it is, and each workspace starts a file of its own.
pub(crate) async fn relocate_shared_files(store: &crate::store::Store, data_dir: &Path) {
    let Ok(destinations) = store.file_destinations().await else { return };
    let legacy = |d: &crate::store::destinations::Destination| -> Option<(&'static str, String)> {
        match d.kind {
            DestinationKind::Sqlite => d.configuration["file"].as_str().map(|f| ("warehouses", f.to_owned())),
            DestinationKind::Jsonl => d.configuration["directory"].as_str().map(|f| ("exports", f.to_owned())),
            DestinationKind::Postgres | DestinationKind::Iceberg => None,
        }
    };
    for d in &destinations {
        let Some((folder, name)) = legacy(d) else { continue };
        let old = data_dir.join(folder).join(&name);
        let new_dir = data_dir.join(folder).join(&d.workspace_id);
        if !old.exists() || new_dir.join(&name).exists() || name.contains('/') {
            continue;
        }
        let claimants: std::collections::BTreeSet<&str> = destinations
            .iter()
            .filter(|o| legacy(o).is_some_and(|(f, n)| f == folder && n == name))
            .map(|o| o.workspace_id.as_str())
            .collect();
        if claimants.len() > 1 {
            tracing::warn!(file = %old.display(), workspaces = ?claimants, "a file several workspaces named is left in place; each workspace now writes a file of its own");
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(&new_dir) {
            tracing::warn!(error = %e, "cannot create {}", new_dir.display());
            continue;
        }
        // SQLite's side files move with the database.
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let from = data_dir.join(folder).join(format!("{name}{suffix}"));
            if from.exists()
                && let Err(e) = std::fs::rename(&from, new_dir.join(format!("{name}{suffix}")))
            {
                tracing::warn!(error = %e, file = %from.display(), "could not move a destination file");
            }
        }
        tracing::info!(file = %old.display(), workspace = %d.workspace_id, "moved a destination's file into its workspace's folder");
    }
}
