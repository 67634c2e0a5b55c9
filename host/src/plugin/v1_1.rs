//! Bindings of what `service:connector@1.1.0` adds to 1.0.0: the
//! `http-ahead` interface, requests started now and finished later.
//!
//! Everything else of 1.1.0 is 1.0.0's, so the generated types of [`super::v1`]
//! serve both: a 1.1.0 plugin is instantiated and called exactly like a
//! 1.0.0 one, from a linker that also holds these imports.
//!
//! A started request runs on a task of its own through the same egress
//! path as `http.send`; the task belongs to the call's store and is
//! aborted when the plugin drops the request or the call ends.

use wasmtime::component::{HasSelf, Linker, Resource};

use super::sandbox::HostState;
use super::v1::service::connector::http;

wasmtime::component::bindgen!({
    path: "../wit/connector@1.1.0",
    world: "connector",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "service:connector/types@1.0.0": super::v1::service::connector::types,
        "service:connector/http@1.0.0": super::v1::service::connector::http,
        "service:connector/log@1.0.0": super::v1::service::connector::log,
        "service:connector/sink@1.0.0": super::v1::service::connector::sink,
        "service:connector/http-ahead@1.1.0.pending": Pending,
    },
});

use self::service::connector1_1_0::http_ahead;

/// The import a component must have to be a plugin of this version (its
/// exports are 1.0.0's).
pub(crate) const IMPORT: &str = "service:connector/http-ahead@1.1.0";

/// Requests one call may have pending at once.
pub(crate) const MAX_PENDING: u32 = 4;

/// A request being performed for the plugin.
pub struct Pending {
    task: tokio::task::JoinHandle<Result<http::Response, http::HttpError>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Adds this version's own imports to `linker` (which has 1.0.0's).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    http_ahead::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

impl http_ahead::Host for HostState {
    async fn max_pending(&mut self) -> wasmtime::Result<u32> {
        Ok(MAX_PENDING)
    }

    async fn start(&mut self, req: http::Request) -> wasmtime::Result<Result<Resource<Pending>, http::HttpError>> {
        self.start_request(super::v1::outbound(req))
    }
}

impl HostState {
    /// Starts a request of any interface version, converted.
    pub(super) fn start_request(
        &mut self,
        req: crate::egress::OutboundRequest,
    ) -> wasmtime::Result<Result<Resource<Pending>, http::HttpError>> {
        let Some(call) = self.egress_call() else {
            return Ok(Err(http::HttpError::Denied("outbound requests are not available in this call".into())));
        };
        if self.pending >= MAX_PENDING {
            return Ok(Err(http::HttpError::Denied(format!(
                "at most {MAX_PENDING} started requests may be pending at once"
            ))));
        }
        // Numbered on a recording here, in the order the plugin starts them.
        let task = tokio::spawn(crate::telemetry::job_id::carried(call.send(req)));
        let handle = self.table.push(Pending { task })?;
        self.pending += 1;
        Ok(Ok(handle))
    }
}

impl http_ahead::HostPending for HostState {
    async fn finish(&mut self, this: Resource<Pending>) -> wasmtime::Result<Result<http::Response, http::HttpError>> {
        self.finish_pending(this).await
    }

    async fn drop(&mut self, this: Resource<Pending>) -> wasmtime::Result<()> {
        self.drop_pending(this)
    }
}

impl HostState {
    /// Waits for a started request of any interface version.
    pub(super) async fn finish_pending(
        &mut self,
        this: Resource<Pending>,
    ) -> wasmtime::Result<Result<http::Response, http::HttpError>> {
        let mut pending = self.table.delete(this)?;
        self.pending = self.pending.saturating_sub(1);
        let started = self.host_call_starts();
        let answer = (&mut pending.task).await;
        self.host_call_ends(started);
        match answer {
            Ok(answer) => Ok(answer),
            Err(e) => Ok(Err(http::HttpError::ConnectionFailed(format!("the request stopped: {e}")))),
        }
    }

    /// Cancels a started request of any interface version.
    pub(super) fn drop_pending(&mut self, this: Resource<Pending>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        self.pending = self.pending.saturating_sub(1);
        Ok(())
    }
}
