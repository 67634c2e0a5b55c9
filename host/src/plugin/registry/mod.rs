//! Which connector plugins exist, which are loaded, and which are enabled.
//!
//! Plugins come from two places: the bundled components built with the
//! server, and `.wasm` files in the operator's plugins directory (watched:
//! adding a file registers it, disabled until an operator loads it;
//! removing it unloads it). Operators also unload and load plugins by id
//! (API and CLI); that state lives in the database, so every replica
//! agrees, and is checked on every invocation. A connector id or legacy
//! alias belongs to the plugin that declared it first, whatever its state.
//!
//! Unloading drops the prepared component but remembers the plugin, so it
//! is listed as unavailable, work on it is refused, saved sources keep
//! their configuration, and loading it again restores everything.
//!
//! Every component a plugins-directory file brings is installed as a
//! version of its connector in the control database ([`versions`]), and an
//! enabled plugin is pinned to the digest of the version the operator
//! enabled: every replica runs exactly those bytes, from the database,
//! whatever its own plugins directory holds. A file replaced under an
//! enabled plugin is a new version, installed but not run until an
//! operator makes it current; a job keeps the version it started with.
//!
//! A file is also held to the operator's signature policy
//! ([`super::signature`]): by default it must carry a signature by a
//! trusted publisher over its digest and the identity it declares, checked
//! before it is compiled, and again whenever a replica loads an installed
//! version. Bundled plugins are built with the server.
//!
//! Layout: this module (the registry: loading, listing, the operator's
//! switch, the plugins directory) and [`versions`] (installed versions,
//! which one runs, and what changes when another becomes current).

mod versions;

pub(crate) use versions::{Installed, PlannedUse, VersionError};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

pub use super::LoadedPlugin;
use super::connector::Connector;
use super::signature::{self, Identity, SignatureError};
use super::types::{ConnectorInfo, ConnectorKind, Operation};
use super::{InterfaceVersion, InvocationError, Runtime};
use crate::config::signatures::SignaturePolicy;
use crate::egress::Egress;
use crate::store::plugins::PluginState;
use crate::store::{Store, StoreError};

/// Where a plugin's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Built with the server.
    Bundled(&'static str),
    /// A file in the plugins directory.
    File(PathBuf),
    /// A version installed in the control database by another replica or
    /// a pull, with no file here.
    Installed,
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Bundled(name) => write!(f, "bundled:{name}"),
            PluginSource::File(p) => {
                write!(f, "file:{}", p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
            }
            PluginSource::Installed => write!(f, "installed"),
        }
    }
}

/// What the registry remembers about a plugin, loaded or not.
struct Known {
    info: ConnectorInfo,
    version: InterfaceVersion,
    digest: String,
    source: Option<PluginSource>,
    loaded: Option<Arc<LoadedPlugin>>,
    /// The trusted key that signed the component, if it is signed.
    signer: Option<String>,
}

/// A plugin as listed to operators and users.
#[derive(Debug, Clone)]
pub struct PluginSummary {
    pub info: ConnectorInfo,
    pub interface_version: InterfaceVersion,
    pub digest: String,
    pub source: Option<PluginSource>,
    /// The trusted publisher key that signed the component (none for
    /// bundled plugins and, where the policy allows them, unsigned files).
    pub signer: Option<String>,
    /// Loaded in this replica and enabled in the database.
    pub available: bool,
    /// The operator's switch (database).
    pub enabled: bool,
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Invalid(String),
    #[error("connector id {0} is already provided by {1}")]
    Duplicate(String, String),
    #[error("{file} (sha256 {digest}) is refused: {reason}")]
    Signature { file: String, digest: String, reason: SignatureError },
    #[error("could not install the component: {0}")]
    Store(#[from] StoreError),
}

/// Problems with a connector's description; empty when it is valid.
pub(crate) fn validate_info(info: &ConnectorInfo) -> Vec<String> {
    let mut problems = Vec::new();
    let id_ok = !info.id.is_empty()
        && info.id.len() <= 64
        && info.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && info.id.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    if !id_ok {
        problems.push(format!("id '{}' must be 1-64 characters of a-z, 0-9 and _, starting with a letter", info.id));
    }
    if info.name.trim().is_empty() {
        problems.push("name is empty".into());
    }
    if info.version.len() > 64 || info.version.chars().any(|c| c.is_whitespace() || c.is_control()) {
        problems.push(format!("version {:.64?} holds spaces or control characters", info.version));
    } else if info.version.split('.').count() < 3
        || !info.version.split('.').take(3).all(|p| p.chars().take_while(|c| c.is_ascii_digit()).count() > 0)
    {
        problems.push(format!("version '{}' is not a semantic version", info.version));
    }
    for alias in &info.legacy_aliases {
        let ok = alias
            .strip_prefix("source:")
            .is_some_and(|a| !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        if !ok {
            problems.push(format!("legacy alias '{alias}' is not of the form source:<legacy_alias>"));
        }
    }
    if info.config_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
        problems.push("config-schema must be a JSON Schema of type object".into());
    }
    if info.operations.is_empty() {
        problems.push("operations is empty".into());
    }
    if info.kind == ConnectorKind::Source
        && !info.operations.contains(&Operation::Read)
        && info.operations.contains(&Operation::Discover)
    {
        problems.push("a source that discovers streams must also read them".into());
    }
    if let Some(o) = &info.oauth {
        for (name, url) in [("authorize-url", &o.authorize_url), ("token-url", &o.token_url)] {
            if !url::Url::parse(url).is_ok_and(|u| u.scheme() == "https") {
                problems.push(format!("oauth {name} must be an https URL"));
            }
        }
    }
    problems
}

/// Where a component's signature is, if anywhere.
enum Signed<'a> {
    /// Built with the server: covered by the build.
    Built,
    /// In the signature file beside the component's file.
    Beside(&'a Path),
    /// Kept with an installed version (none: it was installed unsigned).
    Kept(Option<String>),
}

/// A plugins-directory file as last seen: (modified, length, and the
/// connector id and digest of the component it held).
type SeenFile = (SystemTime, u64, Option<(String, String)>);

/// The set of plugins of this replica.
pub struct Registry {
    runtime: Arc<Runtime>,
    /// The egress plugins' requests go through, bound into every
    /// [`Connector`] handed out.
    egress: Egress,
    store: Store,
    known: RwLock<HashMap<String, Known>>,
    aliases: RwLock<HashMap<String, String>>,
    bundled: Vec<(&'static str, &'static [u8])>,
    plugins_dir: Option<PathBuf>,
    /// What plugins-directory files must be signed with.
    signatures: SignaturePolicy,
    /// Files of the plugins directory as last seen.
    seen: std::sync::Mutex<HashMap<PathBuf, SeenFile>>,
    /// Installed versions prepared here, by digest (beyond the component
    /// each plugin's own source holds).
    installed: RwLock<HashMap<String, Installed>>,
}

impl Registry {
    pub fn new(
        runtime: Arc<Runtime>,
        egress: Egress,
        store: Store,
        bundled: Vec<(&'static str, &'static [u8])>,
        plugins_dir: Option<PathBuf>,
        signatures: SignaturePolicy,
    ) -> Self {
        Registry {
            runtime,
            egress,
            store,
            known: RwLock::new(HashMap::new()),
            aliases: RwLock::new(HashMap::new()),
            bundled,
            plugins_dir,
            signatures,
            seen: Default::default(),
            installed: Default::default(),
        }
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Loads every bundled plugin and every file of the plugins directory.
    /// A plugin that fails to load is logged and skipped: one bad file does
    /// not keep the server from starting.
    pub(crate) async fn load_all(&self) {
        for (name, bytes) in self.bundled.clone() {
            if let Err(e) = self.load_bytes(bytes, PluginSource::Bundled(name)).await {
                tracing::error!(plugin = name, error = %e, "bundled plugin failed to load");
            }
        }
        if self.signatures.required && self.signatures.trusted.is_empty() {
            let files = self.plugins_dir.as_ref().and_then(|d| std::fs::read_dir(d).ok()).into_iter().flatten();
            if files.flatten().any(|e| e.path().extension().is_some_and(|x| x == "wasm")) {
                tracing::warn!(
                    "the plugins directory holds components, but no publisher key is trusted and signatures are \
                     required: none of them will load (SERVICE_PLUGIN_TRUSTED_KEYS)"
                );
            }
        }
        self.scan_dir().await;
        if let Ok(states) = self.store.plugin_states().await {
            self.adopt_installed(&states).await;
        }
    }

    /// Verifies (as `signed` says) and prepares a component; `label` names
    /// it in refusals.
    async fn prepare(
        &self,
        bytes: &[u8],
        label: &str,
        signed: Signed<'_>,
    ) -> Result<(LoadedPlugin, Option<signature::Verified>), LoadError> {
        // The signature is checked before the bytes are compiled, and what
        // it covers once the component has described itself.
        let digest = signature::digest(bytes);
        let refused = |reason| LoadError::Signature { file: label.to_owned(), digest: digest.clone(), reason };
        let verified = match signed {
            Signed::Built => None,
            Signed::Beside(path) => signature::check(&self.signatures, path, &digest).map_err(refused)?,
            Signed::Kept(text) => {
                signature::check_text(&self.signatures, text, "signature", &digest).map_err(refused)?
            }
        };
        let loaded = self.runtime.load(bytes, label).await.map_err(|e| LoadError::Invalid(e.to_string()))?;
        if let Some(verified) = &verified {
            let found = Identity {
                connector_id: loaded.info.id.clone(),
                version: loaded.info.version.clone(),
                interface: loaded.version.as_str().to_owned(),
            };
            verified.covers(&found).map_err(refused)?;
        }
        Ok((loaded, verified))
    }

    /// Prepares, describes and validates a component, then registers it;
    /// a file's component is installed as a version of its connector. (An
    /// operator's load: the caller decides whether it runs.)
    pub async fn load_bytes(&self, bytes: &[u8], source: PluginSource) -> Result<String, LoadError> {
        self.register(bytes, source, false).await
    }

    /// [`Registry::load_bytes`]; `dropped_in` when the component is a file
    /// that appeared in the plugins directory, whose connector, if new, is
    /// registered disabled before this replica knows it.
    async fn register(&self, bytes: &[u8], source: PluginSource, dropped_in: bool) -> Result<String, LoadError> {
        let signed = match &source {
            PluginSource::File(path) => Signed::Beside(path),
            PluginSource::Bundled(_) => Signed::Built,
            PluginSource::Installed => {
                return Err(LoadError::Invalid("installed versions are prepared from the database".into()));
            }
        };
        let (loaded, verified) = self.prepare(bytes, &source.to_string(), signed).await?;
        let (info, version, digest) = (loaded.info.clone(), loaded.version, loaded.digest.clone());
        let signer = verified.as_ref().map(|v| v.signer.clone());
        let id = info.id.clone();
        {
            // An id or alias belongs to the plugin that declared it first,
            // loaded or not: a file dropped into the plugins directory can
            // take over neither a bundled connector (even one an operator
            // unloaded) nor a legacy alias saved configurations resolve.
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            let aliases = self.aliases.read().unwrap_or_else(|p| p.into_inner());
            // (Another file, or a version known only from the database,
            // is another version of the same plugin.)
            let bundled = |s: &PluginSource| matches!(s, PluginSource::Bundled(_));
            if let Some(k) = known.get(&id)
                && k.source.as_ref().is_some_and(|s| *s != source && (bundled(s) || bundled(&source)))
            {
                return Err(LoadError::Duplicate(id, k.source.as_ref().map(ToString::to_string).unwrap_or_default()));
            }
            if let Some(owner) = aliases.get(&id) {
                return Err(LoadError::Duplicate(id, format!("a legacy alias of {owner}")));
            }
            for alias in &info.legacy_aliases {
                if let Some(owner) = aliases.get(alias).filter(|owner| **owner != id) {
                    return Err(LoadError::Duplicate(alias.clone(), owner.clone()));
                }
                if known.contains_key(alias) {
                    return Err(LoadError::Duplicate(alias.clone(), "a connector id".into()));
                }
            }
        }
        if let PluginSource::File(path) = &source {
            self.install_version(&loaded, verified.as_ref(), &source.to_string(), bytes).await?;
            // A connector first met as a file is registered disabled before
            // this replica knows it: no listing or job ever finds it
            // enabled, not even for a moment.
            if dropped_in && !self.store.plugin_states().await?.contains_key(&id) {
                self.store.register_plugin_disabled(&id).await?;
                tracing::info!(connector = %id, file = %path.display(), %digest, "plugin file registered; an operator enables it with `service plugins load` or POST /v1/admin/plugins/{{id}}/load");
            }
        }
        let loaded = Arc::new(loaded);
        {
            let mut aliases = self.aliases.write().unwrap_or_else(|p| p.into_inner());
            for a in &info.legacy_aliases {
                aliases.insert(a.clone(), id.clone());
            }
        }
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        tracing::info!(connector = %id, source = %source, %digest, signer = ?signer, version = %info.version, "plugin loaded");
        known.insert(
            id.clone(),
            Known { info, version, digest, source: Some(source.clone()), loaded: Some(loaded), signer },
        );
        Ok(id)
    }

    /// The canonical id of a connector id or legacy alias (compatibility:
    /// `source:<legacy_alias>` resolves to the connector that declares it).
    pub fn canonical_id(&self, id_or_alias: &str) -> Option<String> {
        if self.known.read().unwrap_or_else(|p| p.into_inner()).contains_key(id_or_alias) {
            return Some(id_or_alias.to_owned());
        }
        self.aliases.read().unwrap_or_else(|p| p.into_inner()).get(id_or_alias).cloned()
    }

    /// A plugin ready for work: known, enabled, and prepared here in the
    /// version the operator enabled.
    pub async fn available(&self, id_or_alias: &str) -> Result<Arc<LoadedPlugin>, InvocationError> {
        let id = self.resolve(id_or_alias).await?;
        let state = self.store.plugin_state(&id).await.map_err(|e| InvocationError::Host(e.to_string()))?;
        if !state.enabled {
            return Err(InvocationError::Unavailable(id));
        }
        self.running(&id, &state).await.map(|found| found.plugin).ok_or(InvocationError::Unavailable(id))
    }

    /// An available plugin bound to `workspace_id` and the egress: what
    /// every operation on a connector starts from.
    pub async fn connector(&self, id_or_alias: &str, workspace_id: &str) -> Result<Connector, InvocationError> {
        let plugin = self.available(id_or_alias).await?;
        Ok(Connector::new(plugin, self.runtime.clone(), self.egress.clone(), workspace_id))
    }

    fn loaded(&self, id: &str) -> Option<Arc<LoadedPlugin>> {
        self.known.read().unwrap_or_else(|p| p.into_inner()).get(id).and_then(|k| k.loaded.clone())
    }

    /// Every known plugin, sorted by id, described by the version that
    /// runs (or, disabled, the one it is pinned to). Fails when the
    /// operator's switches cannot be read: a connector switched off is never
    /// listed as on because the control database did not answer.
    pub async fn list(&self) -> Result<Vec<PluginSummary>, StoreError> {
        // The ids before the states: a connector first met as a file is
        // registered disabled before it becomes known, so any id read
        // here has its state in what is read next (read the other way
        // round, a scan in between lists it with no state: enabled).
        let mut ids: Vec<String> = self.known.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        let states = self.store.plugin_states().await?;
        ids.sort();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let state = states.get(&id).cloned().unwrap_or(PluginState::UNTOUCHED);
            let running = match &state.digest {
                Some(_) => self.running(&id, &state).await,
                None if state.enabled => self.running(&id, &state).await,
                None => None,
            };
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            let Some(k) = known.get(&id) else { continue };
            let (info, interface_version, digest, signer) = match &running {
                Some(r) => (r.plugin.info.clone(), r.plugin.version, r.plugin.digest.clone(), r.signer.clone()),
                None => (k.info.clone(), k.version, k.digest.clone(), k.signer.clone()),
            };
            out.push(PluginSummary {
                info,
                interface_version,
                digest,
                source: k.source.clone(),
                signer,
                available: state.enabled && running.is_some(),
                enabled: state.enabled,
            });
        }
        Ok(out)
    }

    /// One plugin's summary.
    pub async fn summary(&self, id_or_alias: &str) -> Result<Option<PluginSummary>, StoreError> {
        let Some(id) = self.canonical_id(id_or_alias) else { return Ok(None) };
        Ok(self.list().await?.into_iter().find(|p| p.info.id == id))
    }

    /// Disables a connector everywhere and drops it from this replica.
    pub async fn unload(&self, id_or_alias: &str, by: Option<&str>) -> Result<String, InvocationError> {
        let id = self.canonical_id(id_or_alias).ok_or_else(|| InvocationError::Unavailable(id_or_alias.to_owned()))?;
        self.store.set_plugin_enabled(&id, false, by, None).await.map_err(|e| InvocationError::Host(e.to_string()))?;
        if let Some(k) = self.known.write().unwrap_or_else(|p| p.into_inner()).get_mut(&id) {
            k.loaded = None;
        }
        tracing::info!(connector = %id, "plugin unloaded");
        Ok(id)
    }

    /// Enables a connector everywhere: on the version it is pinned to,
    /// whatever its file holds now, or (never pinned) on the component
    /// its file holds, which it is pinned to from then on.
    pub async fn load(&self, id_or_alias: &str, by: Option<&str>) -> Result<String, InvocationError> {
        let id = self.canonical_id(id_or_alias).ok_or_else(|| InvocationError::Unavailable(id_or_alias.to_owned()))?;
        let host = |e: &dyn std::fmt::Display| InvocationError::Host(e.to_string());
        let pinned = self.store.plugin_state(&id).await.map_err(|e| host(&e))?.digest;
        let pin = match &pinned {
            Some(digest) => {
                self.installed(&id, digest).await.map_err(|e| host(&e))?;
                None
            }
            None => {
                self.reload(&id).await.map_err(|e| host(&e))?;
                let known = self.known.read().unwrap_or_else(|p| p.into_inner());
                known.get(&id).filter(|k| matches!(k.source, Some(PluginSource::File(_)))).map(|k| k.digest.clone())
            }
        };
        self.store.set_plugin_enabled(&id, true, by, pin.as_deref()).await.map_err(|e| host(&e))?;
        if let Some(digest) = pin.as_ref().or(pinned.as_ref()) {
            tracing::info!(connector = %id, %digest, "plugin enabled, pinned to its digest");
        }
        Ok(id)
    }

    /// Prepares a known plugin again from its source.
    async fn reload(&self, id: &str) -> Result<(), LoadError> {
        let source = self.known.read().unwrap_or_else(|p| p.into_inner()).get(id).and_then(|k| k.source.clone());
        match source {
            Some(PluginSource::Bundled(name)) => {
                let bytes = self
                    .bundled
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| LoadError::Invalid("bundle missing".into()))?;
                self.load_bytes(bytes, PluginSource::Bundled(name)).await.map(|_| ())
            }
            Some(PluginSource::File(path)) => {
                let bytes = super::read_component(&path).map_err(|e| LoadError::Invalid(e.to_string()))?;
                self.load_bytes(&bytes, PluginSource::File(path)).await.map(|_| ())
            }
            Some(PluginSource::Installed) | None => {
                Err(LoadError::Invalid(format!("{id} has no component here beside its installed versions")))
            }
        }
    }

    /// Applies the database's enabled states to this replica, learning the
    /// plugins enabled elsewhere that it has no file of.
    pub(crate) async fn reconcile(&self) {
        let Ok(states) = self.store.plugin_states().await else { return };
        self.adopt_installed(&states).await;
        let ids: Vec<(String, bool)> = {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            known.iter().map(|(id, k)| (id.clone(), k.loaded.is_some())).collect()
        };
        for (id, loaded) in ids {
            let enabled = states.get(&id).is_none_or(|s| s.enabled);
            if !enabled && loaded {
                if let Some(k) = self.known.write().unwrap_or_else(|p| p.into_inner()).get_mut(&id) {
                    k.loaded = None;
                }
                tracing::info!(connector = %id, "plugin unloaded (disabled in the database)");
            } else if enabled && !loaded {
                // Enabled elsewhere: prepared here in the version it runs.
                let state = states.get(&id).cloned().unwrap_or(PluginState::UNTOUCHED);
                if self.running(&id, &state).await.is_none() {
                    tracing::warn!(connector = %id, "could not load re-enabled plugin");
                }
            }
        }
    }

    /// Loads new or changed files of the plugins directory and unloads the
    /// plugins whose files disappeared.
    pub async fn scan_dir(&self) {
        let Some(dir) = &self.plugins_dir else { return };
        let mut present: HashMap<PathBuf, (SystemTime, u64)> = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let path = e.path();
                if path.extension().is_some_and(|x| x == "wasm")
                    && let Ok(meta) = e.metadata()
                    && meta.is_file()
                {
                    // The signature beside it counts too: one copied after
                    // its component is picked up on the next scan.
                    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    let (modified, len) = match std::fs::symlink_metadata(signature::sidecar(&path)) {
                        Ok(sig) => (
                            modified.max(sig.modified().unwrap_or(SystemTime::UNIX_EPOCH)),
                            meta.len().wrapping_mul(1_000_003).wrapping_add(sig.len() + 1),
                        ),
                        Err(_) => (modified, meta.len().wrapping_mul(1_000_003)),
                    };
                    present.insert(path, (modified, len));
                }
            }
        }
        let changed: Vec<PathBuf> = {
            let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            present
                .iter()
                .filter(|(p, (m, l))| seen.get(*p).is_none_or(|(sm, sl, _)| sm != m || sl != l))
                .map(|(p, _)| p.clone())
                .collect()
        };
        let removed: Vec<(PathBuf, Option<(String, String)>)> = {
            let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.iter()
                .filter(|(p, _)| !present.contains_key(*p))
                .map(|(p, (_, _, id))| (p.clone(), id.clone()))
                .collect()
        };
        for (path, held) in removed {
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).remove(&path);
            let Some((id, digest)) = held else { continue };
            // Only the file of the version that runs switches the plugin
            // off; another version's file going leaves it running (its
            // bytes are installed in the database).
            let pinned = match self.store.plugin_state(&id).await {
                Ok(state) => state.digest,
                Err(e) => {
                    tracing::warn!(connector = %id, error = %e, "could not read the plugin's state; its removed file changes nothing yet");
                    self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(path, (SystemTime::UNIX_EPOCH, 0, None));
                    continue;
                }
            };
            let dropped = {
                let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
                match known.get_mut(&id) {
                    Some(k) if k.source.as_ref() == Some(&PluginSource::File(path.clone())) => {
                        let running = pinned.as_deref().unwrap_or(k.digest.as_str()) == digest;
                        if running {
                            k.loaded = None;
                            k.source = None;
                        } else {
                            k.source = Some(PluginSource::Installed);
                        }
                        running
                    }
                    Some(_) => pinned.as_deref() == Some(digest.as_str()),
                    None => false,
                }
            };
            if dropped {
                // Removing the file is the operator switching the plugin
                // off: its installed versions stay, disabled everywhere.
                if let Err(e) = self.store.set_plugin_enabled(&id, false, None, None).await {
                    tracing::warn!(connector = %id, error = %e, "could not record the plugin's state");
                }
                tracing::info!(connector = %id, "plugin file removed; plugin unloaded");
            }
        }
        for path in changed {
            let (modified, len) = present[&path];
            let id = match super::read_component(&path) {
                Ok(bytes) => match self.register(&bytes, PluginSource::File(path.clone()), true).await {
                    Ok(id) => {
                        if let Err(e) = self.settle_file(&id, &path).await {
                            tracing::warn!(connector = %id, error = %e, "could not record the plugin's state");
                        }
                        Some((id, signature::digest(&bytes)))
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), error = %e, "plugin file failed to load");
                        None
                    }
                },
                Err(e) => {
                    tracing::error!(error = %e, "plugin file unreadable");
                    None
                }
            };
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(path, (modified, len, id));
        }
    }

    /// What a (new or changed) file of the plugins directory means for its
    /// connector: a new plugin is registered, not enabled (whoever can
    /// write to the directory is not thereby an operator); a file that
    /// replaced an enabled plugin's component is a new version, installed
    /// and not run until an operator makes it current.
    async fn settle_file(&self, id: &str, path: &Path) -> Result<(), crate::store::StoreError> {
        let digest =
            self.known.read().unwrap_or_else(|p| p.into_inner()).get(id).map(|k| k.digest.clone()).unwrap_or_default();
        let states = self.store.plugin_states().await?;
        match states.get(id) {
            None => {
                self.store.register_plugin_disabled(id).await?;
                tracing::info!(connector = %id, file = %path.display(), %digest, "plugin file registered; an operator enables it with `service plugins load` or POST /v1/admin/plugins/{{id}}/load");
            }
            Some(PluginState { enabled: true, digest: None }) => self.store.pin_plugin_if_unpinned(id, &digest).await?,
            Some(PluginState { enabled: true, digest: Some(pinned) }) if *pinned != digest => {
                let version =
                    self.known.read().unwrap_or_else(|p| p.into_inner()).get(id).map(|k| k.info.version.clone());
                tracing::warn!(
                    connector = %id, file = %path.display(), new = %digest, running = %pinned,
                    "an enabled plugin's file now holds another component: installed as a new version, not run until an operator makes it current (`service plugins use {id} {}`)",
                    version.unwrap_or_default()
                );
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The operator's plugins directory, if any.
    pub fn plugins_dir(&self) -> Option<&Path> {
        self.plugins_dir.as_deref()
    }
}
