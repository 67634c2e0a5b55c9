//! Installed versions of a connector: which one runs, preparing one from
//! the control database on any replica, switching to another, and what a
//! switch widens.
//!
//! A plugin whose state names a digest runs exactly that component: this
//! replica's own file when it holds it, otherwise the installed bytes from
//! the database, verified again under today's signature policy. A job
//! names the digest it started with and keeps it; making another version
//! current changes what new jobs take. Bundled plugins have the one
//! version the server was built with.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{LoadError, LoadedPlugin, PluginSource, Registry, Signed};
use crate::plugin::InvocationError;
use crate::plugin::connector::Connector;
use crate::store::StoreError;
use crate::store::plugins::{NewPluginVersion, PluginState, PluginVersion};

/// A prepared component and who signed it.
#[derive(Clone)]
pub(crate) struct Installed {
    pub plugin: Arc<LoadedPlugin>,
    pub signer: Option<String>,
}

/// Why a version cannot be listed or made current.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("no plugin {0}")]
    UnknownPlugin(String),
    #[error("{connector} has no installed version {wanted} (`service plugins versions {connector}` lists them)")]
    NoSuchVersion { connector: String, wanted: String },
    #[error("several installed components of {connector} declare version {wanted}: name one by digest ({})", .digests.join(", "))]
    Ambiguous { connector: String, wanted: String, digests: Vec<String> },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One version, as a proposal names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRef {
    pub version: String,
    pub digest: String,
}

/// What making a version current would do, worked out before it is
/// proposed or carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedUse {
    pub connector_id: String,
    /// The version that runs now (none while the plugin is disabled).
    pub from: Option<VersionRef>,
    pub to: VersionRef,
    /// What the new version may do that the current one may not: hosts,
    /// operations, interface, OAuth.
    pub widening: Vec<String>,
}

impl Registry {
    fn is_bundled(&self, id: &str) -> bool {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.get(id).is_some_and(|k| matches!(k.source, Some(PluginSource::Bundled(_))))
    }

    /// The installed component `digest` of connector `id`, prepared here
    /// once: this replica's file when it holds it, else the database's
    /// bytes, verified again.
    pub(super) async fn installed(&self, id: &str, digest: &str) -> Result<Installed, LoadError> {
        {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = known.get(id)
                && let Some(plugin) = k.loaded.as_ref().filter(|p| p.digest == digest)
            {
                return Ok(Installed { plugin: plugin.clone(), signer: k.signer.clone() });
            }
        }
        if let Some(found) = self.installed.read().unwrap_or_else(|p| p.into_inner()).get(digest) {
            return Ok(found.clone());
        }
        let Some((bytes, signature)) = self.store.plugin_component(id, digest).await? else {
            return Err(LoadError::Invalid(format!("no installed component of {id} has digest {digest}")));
        };
        let label = format!("installed:{id}@{}", &digest[..digest.len().min(12)]);
        let (loaded, verified) = self.prepare(&bytes, &label, Signed::Kept(signature)).await?;
        if loaded.info.id != id || loaded.digest != digest {
            return Err(LoadError::Invalid(format!("{label} holds {} (sha256 {})", loaded.info.id, loaded.digest)));
        }
        let found = Installed { plugin: Arc::new(loaded), signer: verified.map(|v| v.signer) };
        self.installed.write().unwrap_or_else(|p| p.into_inner()).insert(digest.to_owned(), found.clone());
        tracing::info!(connector = %id, %digest, signer = ?found.signer, "installed plugin version prepared");
        Ok(found)
    }

    /// What runs for connector `id` in `state`: the pinned version, or
    /// (unpinned: bundled plugins) the component of its source, loaded
    /// here on demand. `None` when nothing can.
    pub(super) async fn running(&self, id: &str, state: &PluginState) -> Option<Installed> {
        if let Some(pinned) = &state.digest {
            return match self.installed(id, pinned).await {
                Ok(found) => Some(found),
                Err(e) => {
                    tracing::warn!(connector = %id, enabled = %pinned, error = %e, "the version the operator enabled cannot run here");
                    None
                }
            };
        }
        if self.loaded(id).is_none()
            && let Err(e) = self.reload(id).await
        {
            tracing::warn!(connector = %id, error = %e, "could not load the plugin here");
        }
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        let k = known.get(id)?;
        Some(Installed { plugin: k.loaded.clone()?, signer: k.signer.clone() })
    }

    /// Learns the plugins enabled on an installed version that this
    /// replica has no source of: every replica runs them from the
    /// database's bytes, with no file and no pull of its own.
    pub(super) async fn adopt_installed(&self, states: &std::collections::HashMap<String, PluginState>) {
        for (id, state) in states {
            let Some(digest) = state.digest.as_deref().filter(|_| state.enabled) else { continue };
            if self.canonical_id(id).is_some() {
                continue;
            }
            let found = match self.installed(id, digest).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(connector = %id, %digest, error = %e, "an enabled plugin's installed version cannot run here");
                    continue;
                }
            };
            if self.remember_installed(id, &found) {
                tracing::info!(connector = %id, %digest, "plugin enabled elsewhere loaded from its installed version");
            }
        }
    }

    /// Registers a plugin this replica knows only as an installed version;
    /// `false` when its legacy aliases belong to another plugin here.
    fn remember_installed(&self, id: &str, found: &Installed) -> bool {
        let info = found.plugin.info.clone();
        let mut aliases = self.aliases.write().unwrap_or_else(|p| p.into_inner());
        if info.legacy_aliases.iter().any(|a| aliases.get(a).is_some_and(|owner| owner != id)) {
            tracing::warn!(connector = %id, "an installed plugin's legacy alias belongs to another plugin here");
            return false;
        }
        for a in &info.legacy_aliases {
            aliases.insert(a.clone(), id.to_owned());
        }
        drop(aliases);
        let known = super::Known {
            version: found.plugin.version,
            digest: found.plugin.digest.clone(),
            source: Some(PluginSource::Installed),
            loaded: Some(found.plugin.clone()),
            signer: found.signer.clone(),
            info,
        };
        self.known.write().unwrap_or_else(|p| p.into_inner()).entry(id.to_owned()).or_insert(known);
        true
    }

    /// Installs a component from elsewhere than the plugins directory (a
    /// registry pull): its signature is checked under the policy, and it
    /// becomes a version of its connector, not yet current. Returns the
    /// connector id and the component's digest.
    pub async fn install(
        &self,
        bytes: &[u8],
        signature: Option<String>,
        origin: &str,
    ) -> Result<(String, String), LoadError> {
        let (loaded, verified) = self.prepare(bytes, origin, Signed::Kept(signature)).await?;
        let id = loaded.info.id.clone();
        if self.is_bundled(&id) {
            return Err(LoadError::Duplicate(id.clone(), format!("the bundled plugin {id}")));
        }
        if let Some(owner) = self.aliases.read().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Err(LoadError::Duplicate(id.clone(), format!("a legacy alias of {owner}")));
        }
        let version = self.install_version(&loaded, verified.as_ref(), origin, bytes).await?;
        let found = Installed { plugin: Arc::new(loaded), signer: version.signer.clone() };
        self.installed.write().unwrap_or_else(|p| p.into_inner()).insert(version.digest.clone(), found.clone());
        if self.canonical_id(&id).is_none() {
            self.remember_installed(&id, &found);
        }
        Ok((id, version.digest))
    }

    /// Stores a verified component as a version of its connector (once:
    /// the same bytes again change nothing).
    pub(super) async fn install_version(
        &self,
        loaded: &LoadedPlugin,
        verified: Option<&crate::plugin::signature::Verified>,
        origin: &str,
        bytes: &[u8],
    ) -> Result<PluginVersion, LoadError> {
        let version = PluginVersion {
            connector_id: loaded.info.id.clone(),
            digest: loaded.digest.clone(),
            version: loaded.info.version.clone(),
            interface: loaded.version.as_str().to_owned(),
            signer: verified.map(|v| v.signer.clone()),
            origin: origin.to_owned(),
            added_at: 0,
        };
        let new =
            NewPluginVersion { version: &version, signature: verified.map(|v| v.text.as_str()), component: bytes };
        if self.store.add_plugin_version(&new).await? {
            tracing::info!(connector = %version.connector_id, digest = %version.digest, version = %version.version, %origin, signer = ?version.signer, "plugin version installed");
        }
        Ok(version)
    }

    /// The canonical id of a connector, learning it from the database when
    /// it is enabled there on an installed version this replica has not
    /// seen yet (a job it claims may come before its next reconcile).
    pub(super) async fn resolve(&self, id_or_alias: &str) -> Result<String, InvocationError> {
        if let Some(id) = self.canonical_id(id_or_alias) {
            return Ok(id);
        }
        let state = self.store.plugin_state(id_or_alias).await.map_err(|e| InvocationError::Host(e.to_string()))?;
        if state.enabled && state.digest.is_some() {
            let states = std::collections::HashMap::from([(id_or_alias.to_owned(), state)]);
            self.adopt_installed(&states).await;
        }
        self.canonical_id(id_or_alias).ok_or_else(|| InvocationError::Unavailable(id_or_alias.to_owned()))
    }

    /// The connector a job runs: the version it recorded when it started
    /// (a job keeps it to its end, whatever became current since), or the
    /// current one for a job starting now. Bundled plugins run the build.
    pub async fn for_job(
        &self,
        id_or_alias: &str,
        workspace_id: &str,
        recorded: Option<&str>,
    ) -> Result<Connector, InvocationError> {
        let id = self.resolve(id_or_alias).await?;
        let plugin = match recorded {
            Some(digest) if !self.is_bundled(&id) => {
                let state = self.store.plugin_state(&id).await.map_err(|e| InvocationError::Host(e.to_string()))?;
                if !state.enabled {
                    return Err(InvocationError::Unavailable(id));
                }
                match self.installed(&id, digest).await {
                    Ok(found) => found.plugin,
                    Err(e) => {
                        tracing::warn!(connector = %id, %digest, error = %e, "the version a job started with cannot run here");
                        return Err(InvocationError::Unavailable(id));
                    }
                }
            }
            _ => self.available(&id).await?,
        };
        Ok(Connector::new(plugin, self.runtime.clone(), self.egress.clone(), workspace_id))
    }

    /// A connector's installed versions, oldest first, and the digest of
    /// the current one (none while nothing is pinned).
    pub async fn versions(&self, id_or_alias: &str) -> Result<(Vec<PluginVersion>, Option<String>), VersionError> {
        let id = self.canonical_id(id_or_alias).ok_or_else(|| VersionError::UnknownPlugin(id_or_alias.to_owned()))?;
        let state = self.store.plugin_state(&id).await?;
        let bundled = {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            known.get(&id).and_then(|k| match &k.source {
                Some(source @ PluginSource::Bundled(_)) => Some(PluginVersion {
                    connector_id: id.clone(),
                    digest: k.digest.clone(),
                    version: k.info.version.clone(),
                    interface: k.version.as_str().to_owned(),
                    signer: None,
                    origin: source.to_string(),
                    added_at: 0,
                }),
                _ => None,
            })
        };
        if let Some(bundled) = bundled {
            let current = state.enabled.then(|| bundled.digest.clone());
            return Ok((vec![bundled], current));
        }
        Ok((self.store.plugin_versions(&id).await?, state.digest))
    }

    /// Works out what making `wanted` (a version, or a digest or a prefix
    /// of at least 12 of its characters) current would do; checks the
    /// component still verifies and loads.
    pub async fn plan_use(&self, id_or_alias: &str, wanted: &str) -> Result<PlannedUse, VersionError> {
        let (versions, current) = self.versions(id_or_alias).await?;
        let id = self.canonical_id(id_or_alias).ok_or_else(|| VersionError::UnknownPlugin(id_or_alias.to_owned()))?;
        let by_digest = wanted.len() >= 12 && wanted.bytes().all(|b| b.is_ascii_hexdigit());
        let matching: Vec<&PluginVersion> = versions
            .iter()
            .filter(|v| if by_digest { v.digest.starts_with(wanted) } else { v.version == wanted })
            .collect();
        let chosen = match matching.as_slice() {
            [] => return Err(VersionError::NoSuchVersion { connector: id, wanted: wanted.to_owned() }),
            [one] => *one,
            several => {
                let digests = several.iter().map(|v| v.digest.clone()).collect();
                return Err(VersionError::Ambiguous { connector: id, wanted: wanted.to_owned(), digests });
            }
        };
        let to = self.installed_or_bundled(&id, &chosen.digest).await?;
        let state = self.store.plugin_state(&id).await?;
        let from = match (&current, state.enabled) {
            (Some(digest), true) => self.installed_or_bundled(&id, digest).await.ok(),
            _ => None,
        };
        Ok(PlannedUse {
            connector_id: id,
            widening: from.as_ref().map(|f| widening(f, &to)).unwrap_or_default(),
            from: from.map(|f| VersionRef { version: f.info.version.clone(), digest: f.digest.clone() }),
            to: VersionRef { version: to.info.version.clone(), digest: to.digest.clone() },
        })
    }

    /// The component `digest` of `id`: installed, or the bundled build.
    async fn installed_or_bundled(&self, id: &str, digest: &str) -> Result<Arc<LoadedPlugin>, LoadError> {
        if !self.is_bundled(id) {
            return Ok(self.installed(id, digest).await?.plugin);
        }
        if self.loaded(id).is_none() {
            self.reload(id).await?;
        }
        let built = self.loaded(id).filter(|p| p.digest == digest);
        built.ok_or_else(|| LoadError::Invalid(format!("the bundled build of {id} is not sha256 {digest}")))
    }

    /// Makes the installed component `digest` the one every replica runs
    /// for `id` (and enables the plugin); new jobs take it, running jobs
    /// keep theirs.
    pub async fn use_version(&self, id: &str, digest: &str, by: Option<&str>) -> Result<(), VersionError> {
        let id = self.canonical_id(id).ok_or_else(|| VersionError::UnknownPlugin(id.to_owned()))?;
        self.installed_or_bundled(&id, digest).await?;
        let pin = (!self.is_bundled(&id)).then_some(digest);
        self.store.use_plugin_version(&id, pin, by).await?;
        tracing::info!(connector = %id, %digest, "plugin version made current");
        Ok(())
    }
}

/// What `to` may do that `from` may not.
fn widening(from: &LoadedPlugin, to: &LoadedPlugin) -> Vec<String> {
    let mut out = Vec::new();
    for host in to.info.hosts.iter().filter(|h| !from.info.hosts.contains(h)) {
        out.push(format!("may send requests to {host}"));
    }
    for op in to.info.operations.iter().filter(|o| !from.info.operations.contains(o)) {
        out.push(format!("adds the {} operation", op.as_str()));
    }
    if to.version != from.version {
        out.push(format!("exports interface {} (now {})", to.version.as_str(), from.version.as_str()));
    }
    if to.info.kind != from.info.kind {
        out.push(format!("becomes a {:?} connector (now {:?})", to.info.kind, from.info.kind).to_lowercase());
    }
    if to.info.oauth.is_some() && to.info.oauth != from.info.oauth {
        out.push("authorizes through other OAuth endpoints".to_owned());
    }
    out
}
