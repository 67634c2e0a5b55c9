//! `service plugins ...`: connector plugins offline: authors' tools
//! (new, record, test, conform), signing and publishing, validation, and
//! the installation's plugins (list, load, use, audit) against its
//! database.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Subcommand;

use super::{author, client};
use crate::access::ClientSource;
use crate::config::{PluginArgs, StorageArgs};
use crate::plugin::Runtime;
use crate::plugin::registry::{Registry, validate_info};
use crate::store::Store;

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Make a new plugin crate: a source with a typed config and one paged,
    /// incremental stream, that builds for wasm32-wasip2 against this
    /// server's SDK and WIT (vendored into it). Needs no database.
    New {
        /// The crate's name (lower case, digits, hyphens); the connector id
        /// is `conn_` and the name with underscores.
        name: String,
        /// Where to make it (default: a folder named NAME here).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Record a plugin against its provider: check, discover, entity
    /// options, preview and reads, through the host's egress with every
    /// rule on, into a cassette that holds no secret. Needs no database.
    #[command(after_help = "The secret behind the config's credential handles is read from the environment \
        [env: SERVICE_RECORD_SECRET], else from standard input, else from a prompt that does not echo; \
        never from a flag.")]
    Record(Box<author::RecordArgs>),
    /// Replay cassettes with no network and compare what the plugin
    /// returns (records, checkpoints, catalog, answers, schemas) with what
    /// was recorded. Exit code 1 on any difference, 2 on unusable input.
    Test(author::TestArgs),
    /// The conformance suite, offline, from cassettes: every checkpoint
    /// crashed and resumed (no record twice, none missing), a canary
    /// secret echoed in every form and coding (none reaching the plugin,
    /// its output or the log), two replays compared, schemas, replay
    /// misses. Exit code 1 on any failure, 2 on unusable input.
    Conform(author::ConformArgs),
    /// Make a publisher's Ed25519 signing key (a file only you keep) and
    /// print its public key, for operators' SERVICE_PLUGIN_TRUSTED_KEYS.
    /// Needs no database.
    Keygen {
        /// Where to write the private key (never over an existing file).
        #[arg(long)]
        out: PathBuf,
        /// The name operators will know the key by.
        #[arg(long, default_value = "publisher")]
        name: String,
    },
    /// Sign a component: its SHA-256 digest and the identity it declares
    /// (connector id, version, interface), into FILE.sig beside it.
    /// Needs no database.
    Sign {
        /// The component file.
        file: PathBuf,
        /// The private key from `service plugins keygen`.
        #[arg(long)]
        key: PathBuf,
    },
    /// Publish a component, with the signature file beside it if any, to an
    /// OCI registry as a Wasm artifact; prints the reference pinned to the
    /// manifest's digest. A reference without a tag uses the version the
    /// component declares. Needs no database.
    Push {
        /// The component file.
        file: PathBuf,
        /// `oci://REGISTRY/REPOSITORY[:TAG]`.
        reference: String,
    },
    /// Check that a component implements a supported interface version and
    /// describes itself validly. Needs no database.
    Validate {
        /// The component file.
        file: PathBuf,
    },
    /// List the installation's plugins and whether they are enabled.
    List {
        #[command(flatten)]
        plugins: PluginArgs,
    },
    /// Enable a plugin by connector id; or verify a component file, install
    /// it, copy it into the plugins directory and make it current; or pull
    /// one from an OCI registry (a tag is resolved once to its digest),
    /// verify it, install it and make it current. Running servers pick the
    /// change up within seconds, with no file or pull of their own.
    Load {
        /// A connector id, the path of a `.wasm` component, or
        /// `oci://REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]`.
        target: String,
        #[command(flatten)]
        plugins: PluginArgs,
    },
    /// Disable a plugin by connector id: its connector becomes unavailable
    /// on every server sharing the database; saved sources keep their
    /// configuration.
    Unload {
        /// The connector id (or a legacy alias).
        connector_id: String,
        #[command(flatten)]
        plugins: PluginArgs,
    },
    /// List a plugin's installed versions; `*` marks the one new jobs run.
    Versions {
        /// The connector id (or a legacy alias).
        connector_id: String,
        #[command(flatten)]
        plugins: PluginArgs,
    },
    /// Make an installed version current on every server sharing the
    /// database (and enable the plugin): new jobs run it, running jobs
    /// finish on theirs. Rolling back is using the previous version.
    Use {
        /// The connector id (or a legacy alias).
        connector_id: String,
        /// A version it declares, or a digest (12 or more leading hex
        /// characters) where several components declare the same version.
        version: String,
        #[command(flatten)]
        plugins: PluginArgs,
    },
}

/// `service plugins ...`.
pub(super) async fn run(storage: &StorageArgs, cmd: PluginsCommand) -> anyhow::Result<()> {
    let plugins = match cmd {
        PluginsCommand::Validate { file } => return validate(&file).await,
        PluginsCommand::Keygen { out, name } => {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
                anyhow::bail!("--name {name:?}: a key's name is letters, digits and -_.@");
            }
            let public = crate::plugin::signature::keygen(&out)?;
            eprintln!("wrote the private key to {} (keep it secret: it signs plugins)", out.display());
            eprintln!(
                "operators trust it with SERVICE_PLUGIN_TRUSTED_KEYS (or a line of SERVICE_PLUGIN_TRUSTED_KEYS_FILE):"
            );
            println!("{name}={public}");
            return Ok(());
        }
        PluginsCommand::Sign { file, key } => return sign(&file, &key).await,
        PluginsCommand::Push { file, reference } => return push(&file, &reference).await,
        PluginsCommand::New { name, dir } => return Ok(author::new(&name, dir.as_deref())?),
        PluginsCommand::Record(args) => return Ok(author::record(*args, &crate::server::bundled_plugins()).await?),
        PluginsCommand::Test(args) => return Ok(author::test(args, &crate::server::bundled_plugins()).await?),
        PluginsCommand::Conform(args) => return Ok(author::conform(args, &crate::server::bundled_plugins()).await?),
        PluginsCommand::List { ref plugins }
        | PluginsCommand::Load { ref plugins, .. }
        | PluginsCommand::Unload { ref plugins, .. }
        | PluginsCommand::Versions { ref plugins, .. }
        | PluginsCommand::Use { ref plugins, .. } => plugins.clone(),
    };
    let plugins = &plugins;
    let settings = plugins.resolve(&storage.data_dir)?;
    let store = super::open_store(storage).await?;
    let vault = super::open_vault(storage, &store)?;
    let runtime =
        Runtime::new(settings.limits.clone(), Some(crate::server::compile_cache(&settings.compile_cache_dir, &vault)))?;
    let egress = crate::egress::Egress::new(settings.egress.clone(), Arc::new(vault.clone()))?.budgeted(store.clone());
    let registry = Registry::new(
        Arc::new(runtime),
        egress,
        store.clone(),
        crate::server::bundled_plugins(),
        Some(settings.plugins_dir.clone()),
        settings.signatures.clone(),
    );
    registry.load_all().await;
    match cmd {
        PluginsCommand::List { .. } => {
            println!(
                "{:<32} {:<10} {:<10} {:<26} {:<16} SOURCE",
                "CONNECTOR", "VERSION", "STATE", "INTERFACE", "SIGNED BY"
            );
            for p in registry.list().await? {
                let state = if p.enabled { "enabled" } else { "disabled" };
                let source = p.source.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "(missing)".into());
                let signer = match (&p.signer, &p.source) {
                    (Some(signer), _) => signer.as_str(),
                    (None, Some(crate::plugin::registry::PluginSource::Bundled(_))) => "(built in)",
                    (None, _) => "(unsigned)",
                };
                println!(
                    "{:<32} {:<10} {:<10} {:<26} {signer:<16} {source}",
                    p.info.id,
                    p.info.version,
                    state,
                    p.interface_version.as_str()
                );
            }
        }
        PluginsCommand::Load { target, .. } => {
            let id = if target.starts_with("oci://") {
                let reference = crate::plugin::oci::Reference::parse(&target)?;
                let pulled = crate::plugin::oci::pull(&reference).await?;
                let origin = pulled.reference.to_string();
                let (id, digest) = registry.install(&pulled.component, pulled.signature, &origin).await?;
                registry.use_version(&id, &digest, None).await.map_err(|e| anyhow::anyhow!("{id}: {e}"))?;
                audit_operator(&store, &registry, "plugins.load", &id, Some(&digest), &origin).await?;
                println!("loaded {id} (sha256 {digest}) from {origin}");
                id
            } else if target.ends_with(".wasm") {
                let path = PathBuf::from(&target);
                let bytes = crate::plugin::read_component(&path)?;
                // Verified and installed before it is copied, so a bad file
                // never lands in the directory servers watch; the file named
                // is the version that runs from now on.
                let id = registry.load_bytes(&bytes, crate::plugin::registry::PluginSource::File(path.clone())).await?;
                let digest = crate::plugin::signature::digest(&bytes);
                std::fs::create_dir_all(&settings.plugins_dir)?;
                let dest = settings
                    .plugins_dir
                    .join(path.file_name().ok_or_else(|| anyhow::anyhow!("{target}: no file name"))?);
                // The signature first: servers watching the directory
                // check it when the component appears, which it does whole
                // (the verified bytes, renamed into place).
                let signature = crate::plugin::signature::sidecar(&path);
                if signature.exists() {
                    std::fs::copy(&signature, crate::plugin::signature::sidecar(&dest))?;
                }
                let partial = dest.with_extension("wasm.partial");
                std::fs::write(&partial, &bytes)?;
                std::fs::rename(&partial, &dest)?;
                registry.use_version(&id, &digest, None).await.map_err(|e| anyhow::anyhow!("{id}: {e}"))?;
                audit_operator(&store, &registry, "plugins.load", &id, Some(&digest), &dest.display().to_string())
                    .await?;
                println!("loaded {id} from {} into {}", path.display(), dest.display());
                id
            } else {
                let id = registry.load(&target, None).await.map_err(|e| anyhow::anyhow!("{target}: {e}"))?;
                audit_operator(&store, &registry, "plugins.load", &id, None, "").await?;
                println!("enabled {id}");
                id
            };
            let _ = id;
        }
        PluginsCommand::Unload { connector_id, .. } => {
            let id = registry.unload(&connector_id, None).await.map_err(|e| anyhow::anyhow!("{connector_id}: {e}"))?;
            audit_operator(&store, &registry, "plugins.unload", &id, None, "").await?;
            println!("disabled {id}; it is unavailable on every server sharing this database");
        }
        PluginsCommand::Versions { connector_id, .. } => {
            let (versions, current) =
                registry.versions(&connector_id).await.map_err(|e| anyhow::anyhow!("{connector_id}: {e}"))?;
            println!("  {:<12} {:<66} {:<10} {:<16} ORIGIN", "VERSION", "DIGEST (SHA-256)", "INTERFACE", "SIGNED BY");
            for v in versions {
                let mark = if current.as_deref() == Some(v.digest.as_str()) { "*" } else { " " };
                let signer = v.signer.as_deref().unwrap_or(if v.origin.starts_with("bundled:") {
                    "(built in)"
                } else {
                    "(unsigned)"
                });
                println!("{mark} {:<12} {:<66} {:<10} {signer:<16} {}", v.version, v.digest, v.interface, v.origin);
            }
        }
        PluginsCommand::Use { connector_id, version, .. } => {
            let plan =
                registry.plan_use(&connector_id, &version).await.map_err(|e| anyhow::anyhow!("{connector_id}: {e}"))?;
            for change in &plan.widening {
                println!("widens: {change}");
            }
            registry
                .use_version(&plan.connector_id, &plan.to.digest, None)
                .await
                .map_err(|e| anyhow::anyhow!("{connector_id}: {e}"))?;
            audit_operator(&store, &registry, "plugins.use", &plan.connector_id, Some(&plan.to.digest), "").await?;
            let was = plan.from.map(|f| format!(" (was {})", f.version)).unwrap_or_default();
            println!(
                "{} now runs {} (sha256 {}){was} on every server sharing this database; running jobs finish on theirs",
                plan.connector_id, plan.to.version, plan.to.digest
            );
        }
        PluginsCommand::Validate { .. }
        | PluginsCommand::Keygen { .. }
        | PluginsCommand::Sign { .. }
        | PluginsCommand::Push { .. }
        | PluginsCommand::New { .. }
        | PluginsCommand::Record(_)
        | PluginsCommand::Test(_)
        | PluginsCommand::Conform(_) => unreachable!("handled above"),
    }
    store.close().await;
    Ok(())
}

/// Appends the installation's audit record of a plugin operation an
/// operator ran from the command line: no workspace and no user (none is
/// signed in), but the operating-system account and the host it ran on,
/// and the component's digest, version, signer and origin. A change whose
/// record cannot be written is reported as an error.
async fn audit_operator(
    store: &Store,
    registry: &Registry,
    action: &str,
    connector_id: &str,
    digest: Option<&str>,
    origin: &str,
) -> anyhow::Result<()> {
    let version = match digest {
        Some(d) => {
            registry.versions(connector_id).await.ok().and_then(|(all, _)| all.into_iter().find(|v| v.digest == d))
        }
        None => None,
    };
    let operator = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let details = serde_json::json!({
        "operator": operator,
        "host": host,
        "digest": digest,
        "version": version.as_ref().map(|v| v.version.clone()),
        "signer": version.as_ref().and_then(|v| v.signer.clone()),
        "origin": if origin.is_empty() { version.as_ref().map(|v| v.origin.clone()) } else { Some(origin.to_owned()) },
    });
    let record = crate::store::audit::NewAuditRecord {
        workspace_id: None,
        actor_user_id: None,
        actor_session_id: None,
        action: action.to_owned(),
        target_type: Some("plugin".into()),
        target_id: Some(connector_id.to_owned()),
        client_source: ClientSource::Cli,
        request_id: crate::store::new_id("cli"),
        outcome: crate::store::kinds::AuditOutcome::Succeeded,
        status_code: 200,
        approval_id: None,
        address: None,
        details: Some(details),
    };
    store
        .append_audit(&record)
        .await
        .map_err(|e| anyhow::anyhow!("{connector_id}: done, but its audit record could not be written: {e}"))?;
    Ok(())
}

/// Publishes a component after checking it loads; the tag defaults to the
/// version it declares.
async fn push(file: &std::path::Path, reference: &str) -> anyhow::Result<()> {
    use crate::plugin::oci::Reference;
    let bytes = crate::plugin::read_component(file)?;
    let runtime = Runtime::new(crate::plugin::sandbox::Limits::default(), None)?;
    let loaded = runtime.load(&bytes, "push").await.map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let reference = Reference::parse_or(reference, &loaded.info.version)?;
    let signature = match std::fs::read_to_string(crate::plugin::signature::sidecar(file)) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("{}: {e}", crate::plugin::signature::sidecar(file).display()),
    };
    let pinned = crate::plugin::oci::push(&reference, &bytes, signature.as_deref()).await?;
    let signed = if signature.is_some() { "signed" } else { "unsigned" };
    println!("{pinned}");
    eprintln!("pushed {} {} ({signed}, sha256 {}) to {reference}", loaded.info.id, loaded.info.version, loaded.digest);
    Ok(())
}

/// `service plugins validate FILE`: the author's check.
/// Signs a component after checking it loads: what is signed is what the
/// server will find when it loads it.
async fn sign(file: &std::path::Path, key: &std::path::Path) -> anyhow::Result<()> {
    let bytes = crate::plugin::read_component(file)?;
    let runtime = Runtime::new(crate::plugin::sandbox::Limits::default(), None)?;
    let loaded = runtime.load(&bytes, "sign").await.map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let identity = crate::plugin::signature::Identity {
        connector_id: loaded.info.id.clone(),
        version: loaded.info.version.clone(),
        interface: loaded.version.as_str().to_owned(),
    };
    let signed = crate::plugin::signature::sign(key, &loaded.digest, &identity)?;
    let out = crate::plugin::signature::sidecar(file);
    std::fs::write(&out, serde_json::to_vec_pretty(&signed)?)?;
    println!("signed {identity}, sha256 {}, into {}", loaded.digest, out.display());
    Ok(())
}

/// `service plugins validate FILE`: a file that is no usable component
/// (missing, not WebAssembly, no supported interface) is unusable input,
/// exit code 2 as for every author's command; a component whose
/// description has problems fails the check, exit code 1.
async fn validate(file: &std::path::Path) -> anyhow::Result<()> {
    let unusable = |e: anyhow::Error| anyhow::Error::from(client::CliFailure::Usage(format!("{e:#}")));
    let bytes = crate::plugin::read_component(file).map_err(unusable)?;
    let runtime = Runtime::new(crate::plugin::sandbox::Limits::default(), None)?;
    let (version, pre, digest) =
        runtime.prepare(&bytes).map_err(|e| unusable(anyhow::anyhow!("{}: {e:#}", file.display())))?;
    println!("interface: {} (supported)", version.as_str());
    println!("sha256:    {digest}");
    let info = runtime.describe("validate", &pre).await.map_err(|e| anyhow::anyhow!("describe failed: {e}"))?;
    println!("connector: {} \"{}\" version {} ({:?})", info.id, info.name, info.version, info.kind);
    println!("hosts:     {}", info.hosts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "));
    println!("offers:    {}", info.operations.iter().map(|o| o.as_str()).collect::<Vec<_>>().join(", "));
    let problems = validate_info(&info);
    if problems.is_empty() {
        println!("description: valid");
        Ok(())
    } else {
        for p in &problems {
            println!("problem:   {p}");
        }
        anyhow::bail!("the description has {} problem(s)", problems.len())
    }
}
