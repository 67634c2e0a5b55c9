//! A plugin bound to what every call of it needs: the workspace it runs
//! for and the egress that polices its requests. Handed out by
//! [`super::registry::Registry::connector`] only for a plugin that is
//! available (loaded, enabled, the component the operator enabled), so
//! the operations' callers pass their own input and nothing else; the
//! authoring kit binds a plugin it loaded itself to a recording egress.

use std::sync::Arc;

use super::sandbox::RecordSink;
use super::types::{CheckResult, EntityOption, ReadRequest, Stream, WriteRequest, WriteResult};
use super::{InvocationError, LoadedPlugin, Runtime};
use crate::egress::Egress;
use crate::store::Store;

/// A connector ready to be called for one workspace.
pub struct Connector {
    plugin: Arc<LoadedPlugin>,
    runtime: Arc<Runtime>,
    egress: Egress,
    workspace_id: String,
}

impl Connector {
    pub(crate) fn new(plugin: Arc<LoadedPlugin>, runtime: Arc<Runtime>, egress: Egress, workspace_id: &str) -> Self {
        Connector { plugin, runtime, egress, workspace_id: workspace_id.to_owned() }
    }

    /// The plugin behind it (its description, digest, interface version).
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.plugin
    }

    pub async fn check(&self, config: &str) -> Result<CheckResult, InvocationError> {
        self.runtime.check(&self.plugin, &self.workspace_id, &self.egress, config).await
    }

    pub(crate) async fn discover(&self, config: &str) -> Result<Vec<Stream>, InvocationError> {
        self.runtime.discover(&self.plugin, &self.workspace_id, &self.egress, config).await
    }

    /// The streams of source `source_id` (configured with `config`): as
    /// kept from its last discover by this plugin's component with this
    /// configuration, else discovered now and kept. Creating a pipeline
    /// and syncing it use this, so they do not ask the provider again for
    /// what a discover already said (a schema inferred from a first page,
    /// say). A control database that cannot keep it costs a discover.
    pub(crate) async fn catalog(
        &self,
        store: &Store,
        source_id: &str,
        config: &str,
    ) -> Result<Vec<Stream>, InvocationError> {
        match store.source_catalog(source_id, &self.plugin.digest, config).await {
            Ok(Some(kept)) => match serde_json::from_value::<Vec<Stream>>(kept) {
                Ok(streams) => return Ok(streams),
                Err(e) => tracing::warn!(source_id, error = %e, "a kept catalog no longer reads; discovering again"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(source_id, error = %e, "the kept catalog could not be read; discovering"),
        }
        let streams = self.discover(config).await?;
        self.keep(store, source_id, config, &streams).await;
        Ok(streams)
    }

    /// A discover that is kept as the source's catalog: what a pipeline's
    /// prepare runs, the moment a user looks at the streams.
    pub(crate) async fn discover_and_keep(
        &self,
        store: &Store,
        source_id: &str,
        config: &str,
    ) -> Result<Vec<Stream>, InvocationError> {
        let streams = self.discover(config).await?;
        self.keep(store, source_id, config, &streams).await;
        Ok(streams)
    }

    async fn keep(&self, store: &Store, source_id: &str, config: &str, streams: &[Stream]) {
        let Ok(catalog) = serde_json::to_value(streams) else { return };
        if let Err(e) = store.save_source_catalog(source_id, &self.plugin.digest, config, &catalog).await {
            tracing::warn!(source_id, error = %e, "the discovered catalog could not be kept");
        }
    }

    pub(crate) async fn entity_options(&self, config: &str, field: &str) -> Result<Vec<EntityOption>, InvocationError> {
        self.runtime.entity_options(&self.plugin, &self.workspace_id, &self.egress, config, field).await
    }

    pub async fn preview(&self, config: &str) -> Result<serde_json::Value, InvocationError> {
        self.runtime.preview(&self.plugin, &self.workspace_id, &self.egress, config).await
    }

    /// Reads one stream into `sink`.
    pub async fn read(&self, req: &ReadRequest, sink: Box<dyn RecordSink>) -> Result<(), InvocationError> {
        self.runtime.read(&self.plugin, &self.workspace_id, &self.egress, req, sink).await
    }

    pub async fn write(&self, req: &WriteRequest) -> Result<WriteResult, InvocationError> {
        self.runtime.write(&self.plugin, &self.workspace_id, &self.egress, req).await
    }
}
