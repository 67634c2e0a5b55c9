//! Bindings of `service:connector@1.0.0` and their conversions to the
//! host's own types ([`super::types`]). This module is the only place that
//! knows the generated types of this version; a future version gets a
//! sibling module of its own.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

use wasmtime::Store;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, HasSelf, InstancePre, Lift, Linker, Lower, TypedFunc,
};

use super::sandbox::HostState;
use super::types as t;
use crate::egress::{self, HostPattern};

wasmtime::component::bindgen!({
    path: "../wit/connector@1.0.0",
    world: "connector",
    imports: { default: async },
    exports: { default: async },
});

use self::service::connector::{http, log, sink, types as g};

/// The interface name a component must export to be a plugin of this
/// version.
pub(crate) const EXPORT: &str = "service:connector/plugin@1.0.0";

/// A plugin of this version, pre-instantiated, with its exports looked up
/// once. A call instantiates the component and takes the one export it
/// calls; that export's type is checked against this version's signature
/// the first time it is called, not on every call (bindgen's loader
/// re-checks all seven exports per instantiation, about a sixth of a
/// no-op call).
pub struct Pre {
    instance: InstancePre<HostState>,
    describe: Export<(), (g::ConnectorInfo,)>,
    check: Export<(String,), Answer<g::CheckResult>>,
    discover: Export<(String,), Answer<Vec<g::Stream>>>,
    read: Export<(g::ReadRequest,), Answer<()>>,
    entity_options: Export<(String, String), Answer<Vec<g::EntityOption>>>,
    preview: Export<(String,), Answer<String>>,
    write: Export<(g::WriteRequest,), Answer<g::WriteResult>>,
}

/// What an export other than `describe` returns.
type Answer<T> = (Result<T, g::ConnectorError>,);

/// One exported function, and the signature it is called with: the type
/// parameters tie the index to the only signature it is ever used at, so
/// a check made once holds for every later call.
struct Export<P, R> {
    index: ComponentExportIndex,
    typechecked: AtomicBool,
    signature: PhantomData<fn(P) -> R>,
}

impl<P, R> Export<P, R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentNamedList + Lift + Send + Sync + 'static,
{
    fn find(component: &Component, interface: &ComponentExportIndex, name: &str) -> wasmtime::Result<Self> {
        let index = component
            .get_export_index(Some(interface), name)
            .ok_or_else(|| wasmtime::format_err!("{EXPORT} does not export `{name}`"))?;
        Ok(Export { index, typechecked: AtomicBool::new(false), signature: PhantomData })
    }

    /// Instantiates the plugin in `store` and calls this export.
    async fn call(&self, pre: &InstancePre<HostState>, store: &mut Store<HostState>, params: P) -> wasmtime::Result<R> {
        let instance = pre.instantiate_async(&mut *store).await?;
        let func = if self.typechecked.load(Ordering::Acquire) {
            let func = instance
                .get_func(&mut *store, self.index)
                .ok_or_else(|| wasmtime::format_err!("the export is missing"))?;
            // SAFETY: every instance of one `InstancePre` has the same
            // exports with the same types, and this index passed
            // `get_typed_func::<P, R>` on one of them (below); `P` and `R`
            // are fixed by this `Export`'s type.
            unsafe { TypedFunc::<P, R>::new_unchecked(func) }
        } else {
            let func = instance.get_typed_func::<P, R>(&mut *store, &self.index)?;
            self.typechecked.store(true, Ordering::Release);
            func
        };
        func.call_async(&mut *store, params).await
    }
}

impl Pre {
    pub fn new(instance: InstancePre<HostState>) -> wasmtime::Result<Pre> {
        let component = instance.component();
        let interface = component
            .get_export_index(None, EXPORT)
            .ok_or_else(|| wasmtime::format_err!("no exported instance named `{EXPORT}`"))?;
        Ok(Pre {
            describe: Export::find(component, &interface, "describe")?,
            check: Export::find(component, &interface, "check")?,
            discover: Export::find(component, &interface, "discover")?,
            read: Export::find(component, &interface, "read")?,
            entity_options: Export::find(component, &interface, "entity-options")?,
            preview: Export::find(component, &interface, "preview")?,
            write: Export::find(component, &interface, "write")?,
            instance,
        })
    }
}

/// Adds this version's host imports to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    Connector::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

// ---- exports: calling the plugin -------------------------------------------

pub(crate) async fn describe(
    pre: &Pre,
    store: &mut Store<HostState>,
) -> wasmtime::Result<Result<t::ConnectorInfo, String>> {
    let (info,) = pre.describe.call(&pre.instance, store, ()).await?;
    Ok(info_from(info))
}

pub(crate) async fn check(
    pre: &Pre,
    store: &mut Store<HostState>,
    config: &str,
) -> wasmtime::Result<Result<t::CheckResult, t::ConnectorError>> {
    let (r,) = pre.check.call(&pre.instance, store, (config.to_owned(),)).await?;
    Ok(r.map(|c| t::CheckResult { ok: c.ok, message: c.message, account: c.account }).map_err(error_from))
}

pub(crate) async fn discover(
    pre: &Pre,
    store: &mut Store<HostState>,
    config: &str,
) -> wasmtime::Result<Result<Vec<t::Stream>, t::ConnectorError>> {
    let (r,) = pre.discover.call(&pre.instance, store, (config.to_owned(),)).await?;
    Ok(match r {
        Ok(streams) => streams.into_iter().map(stream_from).collect(),
        Err(e) => Err(error_from(e)),
    })
}

pub(crate) async fn read(
    pre: &Pre,
    store: &mut Store<HostState>,
    req: &t::ReadRequest,
) -> wasmtime::Result<Result<(), t::ConnectorError>> {
    let req = g::ReadRequest {
        config: req.config.clone(),
        stream: req.stream.clone(),
        sync_mode: match req.sync_mode {
            t::SyncMode::FullRefresh => g::SyncMode::FullRefresh,
            t::SyncMode::Incremental => g::SyncMode::Incremental,
        },
        cursor_field: req.cursor_field.clone(),
        state: req.state.clone(),
    };
    let (r,) = pre.read.call(&pre.instance, store, (req,)).await?;
    Ok(r.map_err(error_from))
}

pub(crate) async fn entity_options(
    pre: &Pre,
    store: &mut Store<HostState>,
    config: &str,
    field: &str,
) -> wasmtime::Result<Result<Vec<t::EntityOption>, t::ConnectorError>> {
    let (r,) = pre.entity_options.call(&pre.instance, store, (config.to_owned(), field.to_owned())).await?;
    Ok(r.map(|opts| {
        opts.into_iter().map(|o| t::EntityOption { value: o.value, label: o.label, parent: o.parent }).collect()
    })
    .map_err(error_from))
}

pub(crate) async fn preview(
    pre: &Pre,
    store: &mut Store<HostState>,
    config: &str,
) -> wasmtime::Result<Result<String, t::ConnectorError>> {
    let (r,) = pre.preview.call(&pre.instance, store, (config.to_owned(),)).await?;
    Ok(r.map_err(error_from))
}

pub(crate) async fn write(
    pre: &Pre,
    store: &mut Store<HostState>,
    req: &t::WriteRequest,
) -> wasmtime::Result<Result<t::WriteResult, t::ConnectorError>> {
    let req = g::WriteRequest {
        config: req.config.clone(),
        stream: req.stream.clone(),
        mode: match req.mode {
            t::WriteMode::Insert => g::WriteMode::Insert,
            t::WriteMode::Update => g::WriteMode::Update,
            t::WriteMode::Upsert => g::WriteMode::Upsert,
            t::WriteMode::Delete => g::WriteMode::Delete,
        },
        key_fields: req.key_fields.clone(),
        records: req.records.clone(),
    };
    let (r,) = pre.write.call(&pre.instance, store, (req,)).await?;
    Ok(r.map(|w| t::WriteResult {
        written: w.written,
        failed: w.failed,
        errors: w.errors.into_iter().map(|e| t::RecordError { index: e.index, message: e.message }).collect(),
    })
    .map_err(error_from))
}

// ---- conversions -----------------------------------------------------------

/// Converts a description; a malformed one is refused with the reason.
fn info_from(i: g::ConnectorInfo) -> Result<t::ConnectorInfo, String> {
    let config_schema: serde_json::Value =
        serde_json::from_str(&i.config_schema).map_err(|e| format!("config-schema is not JSON: {e}"))?;
    let hosts = i
        .hosts
        .iter()
        .map(|h| HostPattern::parse(h).map_err(|e| format!("hosts: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(t::ConnectorInfo {
        id: i.id,
        name: i.name,
        version: i.version,
        kind: match i.kind {
            g::ConnectorKind::Source => t::ConnectorKind::Source,
            g::ConnectorKind::Destination => t::ConnectorKind::Destination,
        },
        legacy_aliases: i.legacy_aliases,
        config_schema,
        hosts,
        oauth: i.oauth.map(|o| t::OAuthEndpoints {
            authorize_url: o.authorize_url,
            token_url: o.token_url,
            scopes: o.scopes,
        }),
        operations: i
            .operations
            .into_iter()
            .map(|o| match o {
                g::Operation::Check => t::Operation::Check,
                g::Operation::Discover => t::Operation::Discover,
                g::Operation::Read => t::Operation::Read,
                g::Operation::EntityOptions => t::Operation::EntityOptions,
                g::Operation::Preview => t::Operation::Preview,
                g::Operation::Write => t::Operation::Write,
            })
            .collect(),
    })
}

fn stream_from(s: g::Stream) -> Result<t::Stream, t::ConnectorError> {
    let json_schema = serde_json::from_str(&s.json_schema)
        .map_err(|e| t::ConnectorError::Internal(format!("stream {} has a schema that is not JSON: {e}", s.name)))?;
    Ok(t::Stream {
        name: s.name,
        json_schema,
        sync_modes: s
            .sync_modes
            .into_iter()
            .map(|m| match m {
                g::SyncMode::FullRefresh => t::SyncMode::FullRefresh,
                g::SyncMode::Incremental => t::SyncMode::Incremental,
            })
            .collect(),
        cursor_fields: s.cursor_fields,
        primary_key: s.primary_key,
        default_cursor_field: s.default_cursor_field,
    })
}

fn error_from(e: g::ConnectorError) -> t::ConnectorError {
    match e {
        g::ConnectorError::InvalidConfig(m) => t::ConnectorError::InvalidConfig(m),
        g::ConnectorError::InvalidCredentials(m) => t::ConnectorError::InvalidCredentials(m),
        g::ConnectorError::PermissionDenied(m) => t::ConnectorError::PermissionDenied(m),
        g::ConnectorError::RateLimited(s) => t::ConnectorError::RateLimited(s),
        g::ConnectorError::ProviderUnavailable(m) => t::ConnectorError::ProviderUnavailable(m),
        g::ConnectorError::ProviderError(m) => t::ConnectorError::ProviderError(m),
        g::ConnectorError::EgressDenied(m) => t::ConnectorError::EgressDenied(m),
        g::ConnectorError::Unsupported(m) => t::ConnectorError::Unsupported(m),
        g::ConnectorError::Internal(m) => t::ConnectorError::Internal(m),
    }
}

// ---- imports: what the plugin may ask of the host --------------------------

impl g::Host for HostState {}

impl http::Host for HostState {
    async fn send(&mut self, req: http::Request) -> Result<http::Response, http::HttpError> {
        self.send_request(outbound(req)).await
    }
}

impl HostState {
    /// Performs a request of any interface version, converted.
    pub(super) async fn send_request(
        &mut self,
        req: egress::OutboundRequest,
    ) -> Result<http::Response, http::HttpError> {
        let Some(call) = self.egress_call() else {
            return Err(http::HttpError::Denied("outbound requests are not available in this call".into()));
        };
        let started = self.host_call_starts();
        let answer = call.send(req).await;
        self.host_call_ends(started);
        answer
    }

    /// What a request of this call needs of the store, owned, so that it
    /// can also be performed on a task of its own (`http-ahead`).
    pub(super) fn egress_call(&self) -> Option<EgressCall> {
        Some(EgressCall {
            egress: self.egress.clone()?,
            plugin_id: self.plugin_id.clone(),
            declared_hosts: self.declared_hosts.clone(),
            workspace_id: self.workspace_id.clone()?,
            usage: self.egress_usage.clone(),
        })
    }
}

/// One plugin's right to make requests in one workspace.
pub(super) struct EgressCall {
    egress: egress::Egress,
    plugin_id: std::sync::Arc<str>,
    declared_hosts: std::sync::Arc<[HostPattern]>,
    workspace_id: std::sync::Arc<str>,
    /// The invocation's egress usage.
    usage: std::sync::Arc<super::usage::EgressUsage>,
}

impl EgressCall {
    /// Performs `req` through the egress policy. The request is numbered
    /// on a recording now, when the plugin makes it; the returned future
    /// sends it (perhaps on a task of its own, for `http-ahead`).
    pub(super) fn send(
        self,
        req: egress::OutboundRequest,
    ) -> impl Future<Output = Result<http::Response, http::HttpError>> + Send + 'static {
        let recording = self.egress.tape(&req);
        async move { self.perform(req, recording).await }
    }

    async fn perform(
        &self,
        req: egress::OutboundRequest,
        recording: Option<crate::egress::tape::Taping>,
    ) -> Result<http::Response, http::HttpError> {
        let caller = egress::Caller {
            plugin_id: &self.plugin_id,
            declared_hosts: &self.declared_hosts,
            workspace_id: &self.workspace_id,
            reach: egress::Reach::Providers,
        };
        let (started, sent) = (std::time::Instant::now(), req.body.as_ref().map_or(0, Vec::len));
        let result = self.egress.send_taped(&caller, req, recording).await;
        let received = result.as_ref().map_or(0, |r| r.body.len());
        self.usage.record(sent, received, started.elapsed());
        match result {
            Ok(r) => Ok(http::Response { status: r.status, headers: r.headers, body: r.body }),
            Err(e) => Err(match e {
                egress::EgressError::Denied(m) => http::HttpError::Denied(m),
                egress::EgressError::InvalidRequest(m) => http::HttpError::InvalidRequest(m),
                egress::EgressError::Timeout => http::HttpError::Timeout,
                egress::EgressError::ConnectionFailed(m) => http::HttpError::ConnectionFailed(m),
                egress::EgressError::ResponseTooLarge => http::HttpError::ResponseTooLarge,
                egress::EgressError::CredentialUnavailable(m) => http::HttpError::CredentialUnavailable(m),
            }),
        }
    }
}

/// A 1.0.0 request as the egress takes it.
pub(super) fn outbound(req: http::Request) -> egress::OutboundRequest {
    egress::OutboundRequest {
        method: method(req.method),
        url: req.url,
        headers: req.headers,
        body: req.body,
        credentials: req
            .credential
            .into_iter()
            .map(|c| egress::CredentialUse {
                handle: egress::CredentialHandle::new(c.handle),
                placement: match c.placement {
                    http::CredentialPlacement::AuthorizationBearer => egress::Placement::Bearer,
                    http::CredentialPlacement::Header(h) => egress::Placement::Header(h),
                    http::CredentialPlacement::BasicPassword(u) => egress::Placement::BasicPassword(u),
                },
            })
            .collect(),
        timeout_ms: req.timeout_ms,
    }
}

/// A method of any interface version (they all use 1.0.0's).
pub(super) fn method(m: http::Method) -> egress::Method {
    match m {
        http::Method::Get => egress::Method::Get,
        http::Method::Head => egress::Method::Head,
        http::Method::Post => egress::Method::Post,
        http::Method::Put => egress::Method::Put,
        http::Method::Patch => egress::Method::Patch,
        http::Method::Delete => egress::Method::Delete,
        http::Method::Options => egress::Method::Options,
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => tracing::Level::TRACE,
            log::Level::Debug => tracing::Level::DEBUG,
            log::Level::Info => tracing::Level::INFO,
            log::Level::Warn => tracing::Level::WARN,
            log::Level::Error => tracing::Level::ERROR,
        };
        HostState::log(self, level, &message);
    }
}

fn refusal_to(r: t::SinkRefusal) -> sink::SinkError {
    match r {
        t::SinkRefusal::Cancelled => sink::SinkError::Cancelled,
        t::SinkRefusal::RecordTooLarge(i) => sink::SinkError::RecordTooLarge(i),
        t::SinkRefusal::QuotaExceeded => sink::SinkError::QuotaExceeded,
        t::SinkRefusal::Rejected(m) => sink::SinkError::Rejected(m),
    }
}

impl sink::Host for HostState {
    async fn emit(&mut self, stream: String, records: Vec<String>) -> Result<(), sink::SinkError> {
        let max = self.limits.max_record_bytes;
        if let Some(i) = records.iter().position(|r| r.len() > max) {
            Err(sink::SinkError::RecordTooLarge(i as u32))
        } else {
            let started = self.host_call_starts();
            let done = match self.sink.as_mut() {
                None => Err(sink::SinkError::Rejected("records can only be emitted during a read".into())),
                Some(s) => s.emit(&stream, records).await.map_err(refusal_to),
            };
            self.host_call_ends(started);
            done
        }
    }

    async fn checkpoint(&mut self, stream: String, state: String) -> Result<(), sink::SinkError> {
        if state.len() > self.limits.max_record_bytes {
            Err(sink::SinkError::Rejected("state too large".into()))
        } else {
            let started = self.host_call_starts();
            let done = match self.sink.as_mut() {
                None => Err(sink::SinkError::Rejected("checkpoints can only be made during a read".into())),
                Some(s) => s.checkpoint(&stream, state).await.map_err(refusal_to),
            };
            self.host_call_ends(started);
            done
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::sandbox::{Invocation, Limits};
    use super::*;

    /// A component that exports this version's interface by name, but
    /// whose every function takes and returns a number.
    const IMPOSTOR: &str = r#"
        (component
          (core module $m (func (export "f") (param i32) (result i32) local.get 0))
          (core instance $i (instantiate $m))
          (func $f (param "x" u32) (result u32) (canon lift (core func $i "f")))
          (instance $plugin
            (export "describe" (func $f)) (export "check" (func $f)) (export "discover" (func $f))
            (export "read" (func $f)) (export "entity-options" (func $f)) (export "preview" (func $f))
            (export "write" (func $f)))
          (export "service:connector/plugin@1.0.0" (instance $plugin)))
    "#;

    /// Exports are taken unchecked once checked: an export whose type is
    /// not the interface's must fail its check on every call, never be
    /// called with the wrong types.
    #[tokio::test]
    async fn an_export_of_the_wrong_type_is_refused_on_every_call() {
        let engine = wasmtime::Engine::new(&super::super::engine_config(None, None)).unwrap();
        let component = Component::new(&engine, wat::parse_str(IMPOSTOR).unwrap()).unwrap();
        let pre = Pre::new(Linker::<HostState>::new(&engine).instantiate_pre(&component).unwrap()).unwrap();
        let limits = Arc::new(Limits::default());
        let fresh_store = || {
            let invocation = Invocation {
                plugin_id: "impostor".into(),
                declared_hosts: Arc::from(Vec::new()),
                workspace_id: None,
                egress: None,
                sink: None,
                meters: None,
                time: Default::default(),
            };
            HostState::store(&engine, &Default::default(), limits.clone(), invocation)
        };
        for _ in 0..2 {
            let err = check(&pre, &mut fresh_store(), "{}").await.map(drop).expect_err("a u32 function is not `check`");
            assert!(
                err.downcast_ref::<wasmtime::Trap>().is_none(),
                "refused before the guest ran, not trapped in it: {err:#}"
            );
            assert!(!pre.check.typechecked.load(Ordering::Acquire));
        }
        assert!(describe(&pre, &mut fresh_store()).await.is_err(), "each export is checked on its own");
    }
}
