//! `service warehouse ...`: offline upkeep of the lakehouse warehouses
//! against the installation's database and data directory.

use clap::Subcommand;

use super::Local;
use crate::config::PluginArgs;

#[derive(Debug, Subcommand)]
pub enum WarehouseCommand {
    /// List the files of lakehouse (Iceberg) warehouses that no table
    /// refers to: writes a killed or retried sync never committed, tables a
    /// full refresh replaced or a reset dropped. Readers never see them.
    Orphans {
        /// Remove them too.
        #[arg(long)]
        delete: bool,
        /// Leave files younger than this many minutes alone: a running sync
        /// may be about to commit them.
        #[arg(long, default_value_t = 60)]
        grace_minutes: u64,
        /// The server's settings: object-store warehouses are reached as
        /// its syncs reach them (allowed hosts, trusted roots).
        #[command(flatten)]
        plugins: PluginArgs,
    },
}

/// Runs a `service warehouse` command.
pub(super) async fn run(local: Local, command: WarehouseCommand) -> anyhow::Result<()> {
    let WarehouseCommand::Orphans { delete, grace_minutes, plugins } = command;
    use crate::warehouse::iceberg::orphans;
    crate::telemetry::init_logging(crate::config::LogFormat::Human, local.log.filter_or("warn"))?;
    let storage = &local.storage;
    let settings = plugins.resolve(&storage.data_dir)?;
    let store = super::open_store(storage).await?;
    let vault = super::open_vault(storage, &store)?;
    let buckets =
        orphans::ObjectStores { keys: &vault, policy: &settings.warehouses, extra_roots: &settings.egress.extra_roots };
    let grace = std::time::Duration::from_secs(grace_minutes.saturating_mul(60));
    let findings = orphans::orphans(&store, &storage.data_dir, Some(&buckets), grace).await?;
    for warehouse in &findings.busy {
        eprintln!("{warehouse}: a sync is running into it; left alone");
    }
    for (warehouse, why) in &findings.unreachable {
        eprintln!("{warehouse}: cannot be listed, left alone: {why}");
    }
    let found = findings.orphans;
    for orphan in &found {
        println!("{}\t{}", orphan.location, orphan.bytes);
    }
    let bytes: u64 = found.iter().map(|o| o.bytes).sum();
    if delete {
        let freed = orphans::remove(&found).await?;
        println!("removed {} orphan file(s), {freed} bytes", found.len());
    } else {
        println!("{} orphan file(s), {bytes} bytes (--delete removes them)", found.len());
    }
    store.close().await;
    Ok(())
}
