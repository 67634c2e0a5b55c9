//! Bindings of what `service:connector@1.3.0` adds to 1.2.0:
//! `http-multi`, requests that name several credentials.
//!
//! Everything else of 1.3.0 is 1.2.0's, so the generated types of
//! [`super::v1`], [`super::v1_1`] and [`super::v1_2`] serve it; a request
//! of this interface is converted to the egress's own request here (each
//! credential use as 1.2.0 converts one) and then performed as any other,
//! sent or started ahead against the same limit of pending requests.

use wasmtime::component::{HasSelf, Linker, Resource};

use super::sandbox::HostState;
use super::v1::service::connector::http as http_1_0;
use super::v1_1::Pending;
use crate::egress;

wasmtime::component::bindgen!({
    path: "../wit/connector@1.3.0",
    world: "connector",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "service:connector/types@1.0.0": super::v1::service::connector::types,
        "service:connector/http@1.0.0": super::v1::service::connector::http,
        "service:connector/log@1.0.0": super::v1::service::connector::log,
        "service:connector/sink@1.0.0": super::v1::service::connector::sink,
        "service:connector/http-ahead@1.1.0": super::v1_1::service::connector1_1_0::http_ahead,
        "service:connector/http-placed@1.2.0": super::v1_2::service::connector1_2_0::http_placed,
        "service:connector/http-multi@1.3.0.pending": super::v1_1::Pending,
    },
});

use self::service::connector1_3_0::http_multi as http;

/// The import that makes a component a plugin of this version.
pub(crate) const IMPORT: &str = "service:connector/http-multi@1.3.0";

/// Adds this version's own imports to `linker` (which has 1.2.0's).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    http::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

converted_http!(http, outbound);

/// A 1.3.0 request as the egress takes it.
fn outbound(req: http::Request) -> egress::OutboundRequest {
    egress::OutboundRequest {
        method: super::v1::method(req.method),
        url: req.url,
        headers: req.headers,
        body: req.body,
        credentials: req.credentials.into_iter().map(super::v1_2::credential_use).collect(),
        timeout_ms: req.timeout_ms,
    }
}
