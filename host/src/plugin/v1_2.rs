//! Bindings of what `service:connector@1.2.0` adds to 1.1.0:
//! `http-placed`, requests whose credential placements also name a query
//! parameter or a body field.
//!
//! Everything else of 1.2.0 is 1.1.0's (and so 1.0.0's), so the generated
//! types of [`super::v1`] serve all three; a request of this interface is
//! converted to the egress's own request here and then performed exactly
//! as one of `http@1.0.0` (sent) or `http-ahead@1.1.0` (started, counted
//! against the same limit of pending requests).

use wasmtime::component::{HasSelf, Linker, Resource};

use super::sandbox::HostState;
use super::v1::service::connector::http as http_1_0;
use super::v1_1::Pending;
use crate::egress;

wasmtime::component::bindgen!({
    path: "../wit/connector@1.2.0",
    world: "connector",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "service:connector/types@1.0.0": super::v1::service::connector::types,
        "service:connector/http@1.0.0": super::v1::service::connector::http,
        "service:connector/log@1.0.0": super::v1::service::connector::log,
        "service:connector/sink@1.0.0": super::v1::service::connector::sink,
        "service:connector/http-ahead@1.1.0": super::v1_1::service::connector1_1_0::http_ahead,
        "service:connector/http-placed@1.2.0.pending": super::v1_1::Pending,
    },
});

use self::service::connector1_2_0::http_placed as http;

/// The import that makes a component a plugin of this version.
pub(crate) const IMPORT: &str = "service:connector/http-placed@1.2.0";

/// Adds this version's own imports to `linker` (which has 1.1.0's).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    http::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

converted_http!(http, outbound);

/// A 1.2.0 request as the egress takes it.
fn outbound(req: http::Request) -> egress::OutboundRequest {
    egress::OutboundRequest {
        method: super::v1::method(req.method),
        url: req.url,
        headers: req.headers,
        body: req.body,
        credentials: req.credential.into_iter().map(credential_use).collect(),
        timeout_ms: req.timeout_ms,
    }
}

/// A 1.2.0 credential use (1.3.0's too) as the egress takes it.
pub(super) fn credential_use(c: http::CredentialUse) -> egress::CredentialUse {
    egress::CredentialUse {
        handle: egress::CredentialHandle::new(c.handle),
        placement: match c.placement {
            http::CredentialPlacement::AuthorizationBearer => egress::Placement::Bearer,
            http::CredentialPlacement::Header(h) => egress::Placement::Header(h),
            http::CredentialPlacement::BasicPassword(u) => egress::Placement::BasicPassword(u),
            http::CredentialPlacement::QueryParameter(name) => egress::Placement::Query(name),
            http::CredentialPlacement::BodyField(field) => egress::Placement::BodyField(field),
            http::CredentialPlacement::AsStored => egress::Placement::AsStored,
        },
    }
}
