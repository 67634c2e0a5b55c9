//! Write connectors for the data-integration platform.
//!
//! A *connector* teaches the platform one provider's API: how to check that
//! a configuration works, which streams of records exist (campaigns, email
//! lists, posts), how to read them page by page, and, for destinations, how
//! to write records back. It is a small Rust library compiled to a sandboxed
//! WebAssembly component (`wasm32-wasip2`). The server loads it, calls it on
//! behalf of users, and stores what it reads.
//!
//! This crate is everything a connector needs: implement [`Connector`],
//! register the type with [`export_connector!`], and use [`Http`] to talk to
//! the provider and [`Sink`] to hand over records. The WebAssembly interface
//! underneath (the WIT package `service:connector@1.3.0` in `wit/`) stays out
//! of sight.
//!
//! # What the host enforces
//!
//! A connector runs with no ambient authority: no files, no environment, no
//! sockets. What it can do, it does through the host, and the host checks:
//!
//! - **No secrets, ever.** The config holds non-secret settings and
//!   *credential handles*: strings that name a credential the user stored on
//!   the server. Name a handle on a request with
//!   [`RequestBuilder::credential`]; the host checks that the credential
//!   belongs to the caller's workspace and is bound to the target host, and
//!   injects the secret into the outgoing request. A connector that sets
//!   `Authorization`, `Proxy-Authorization`, `Cookie` or `Host` itself is
//!   refused.
//! - **Vetted hosts only.** Requests go out over HTTPS to port 443, and only
//!   to hosts the connector declares in [`ConnectorInfo::hosts`] *and* the
//!   operator allows. Private, loopback and metadata addresses are refused
//!   whatever the name resolves to. A refusal arrives as
//!   [`Error::EgressDenied`] (or [`HttpError::Denied`]) naming the rule.
//! - **Limits.** Every call has CPU, memory and wall-clock limits and size
//!   limits on responses, records and logs. A connector that traps fails only
//!   its own call. Retry waits count against the wall clock, which is why
//!   [`Retry`] is bounded.
//!
//! # Your first source in five minutes
//!
//! `service plugins new my-source` makes a crate that builds as it is: a
//! complete source with this SDK and the WIT it implements vendored in,
//! and a README that goes on to recording the source against its provider
//! and testing it offline (`service plugins record`, `service plugins
//! test`). By hand, the same takes three steps:
//!
//! 1. Create a crate next to the others in `plugins/` and add it to the
//!    `members` of `plugins/Cargo.toml`:
//!
//!    ```toml
//!    [package]
//!    name = "my-source"
//!    version = "0.1.0"
//!    edition = "2024"
//!
//!    [lib]
//!    crate-type = ["cdylib"]    # a component, not a Rust library
//!
//!    [dependencies]
//!    service-connector-sdk = { path = "../sdk" }
//!    serde = { version = "1", features = ["derive"] }
//!    serde_json = "1"
//!    ```
//!
//! 2. Describe the connector, implement the operations you offer, export it:
//!
//!    ```no_run
//!    use connector_sdk::{
//!        CheckResult, Connector, ConnectorInfo, Http, Operation, Pagination, Placement,
//!        ReadRequest, Result, Sink, Stream, export_connector, json,
//!    };
//!    use serde::Deserialize;
//!
//!    /// What the user configures; the JSON Schema in `describe` says the same.
//!    #[derive(Deserialize)]
//!    struct Config {
//!        credential_handle: String,
//!    }
//!
//!    struct Notes;
//!
//!    impl Connector for Notes {
//!        type Config = Config;
//!
//!        fn describe() -> ConnectorInfo {
//!            ConnectorInfo::source("conn_example_notes", "Notes", env!("CARGO_PKG_VERSION"))
//!                .with_hosts(["api.notes.example"])
//!                .with_operations([Operation::Check, Operation::Discover, Operation::Read])
//!                .with_config_schema(json!({
//!                    "type": "object",
//!                    "required": ["credential_handle"],
//!                    "properties": { "credential_handle": { "type": "string" } }
//!                }))
//!        }
//!
//!        fn check(config: Config) -> Result<CheckResult> {
//!            // A 401 here becomes `Error::InvalidCredentials` by itself.
//!            Http::get("https://api.notes.example/me")
//!                .credential(&config.credential_handle, Placement::Bearer)
//!                .send()?;
//!            Ok(CheckResult::success("connected"))
//!        }
//!
//!        fn discover(_config: Config) -> Result<Vec<Stream>> {
//!            Ok(vec![Stream::new("notes", json!({ "type": "object" })).with_primary_key(["id"])])
//!        }
//!
//!        fn read(request: ReadRequest<Config>) -> Result<()> {
//!            let first_page = Http::get("https://api.notes.example/notes")
//!                .credential(&request.config.credential_handle, Placement::Bearer);
//!            for page in first_page.paginate(Pagination::laravel()) {
//!                Sink::emit("notes", &page?.records)?;
//!            }
//!            Ok(())
//!        }
//!    }
//!
//!    export_connector!(Notes);
//!    ```
//!
//! 3. Build it: `cd plugins && cargo build --release` leaves
//!    `target/wasm32-wasip2/release/my_source.wasm`, a component the server
//!    loads like any bundled plugin.
//!
//! A complete, realistic example with incremental reads and checkpoints is
//! `plugins/example-http-source`.
//!
//! # Reading well
//!
//! - Emit each page as it arrives and [`Sink::checkpoint`] after it with a
//!   state that covers everything emitted so far. The host stores the
//!   checkpoint together with those records; an interrupted read resumes
//!   from it ([`ReadRequest::state`]).
//! - Stop as soon as a [`Sink`] call fails (`?` does that): the host may have
//!   cancelled the job.
//! - Return the most specific [`Error`]. [`RequestBuilder::send`] already
//!   maps statuses and retries what is worth retrying.
//! - A connector that passes the provider's records through unchanged need
//!   not build them: take the page with [`Response::into_text`], parse it
//!   once with each record as a borrowed
//!   [`RawValue`](serde_json::value::RawValue), and hand the records' text to
//!   [`Sink::emit_json`]. Each page is then parsed once in the plugin, and
//!   the host checks every record either way.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`Connector`] (`connector.rs`) | the trait a connector implements |
//! | `types.rs` | [`ConnectorInfo`], [`Stream`], [`ReadRequest`], [`Error`], ...: what passes between connector and host |
//! | [`http`] | the request builder, responses, status mapping and retries |
//! | [`pages`] | lazy pagination ([`Pagination`], [`Pages`]) |
//! | [`sink`] | [`Sink`]: records and checkpoints |
//! | [`log`] | diagnostics |
//! | [`origin`] | where a URL goes, read as the host reads it (`service-connector-rules`, which the host uses too) |
//! | [`time`] | timestamps as providers write them, parsed and written back |
//! | `convert.rs` | the only code that touches the generated bindings |

#![deny(missing_docs)]

mod connector;
mod convert;
pub mod http;
pub mod log;
pub use connector_rules::origin;
/// Where a credential stored for the URL's path goes: write
/// [`path::CREDENTIAL_MARKER`] there and name the credential as stored.
pub use connector_rules::path;
pub mod pages;
pub mod sink;
pub mod time;
mod types;

pub use connector::Connector;
pub use http::{CredentialPlace, Http, HttpError, Method, Pending, Placement, RequestBuilder, Response, Retry};
pub use pages::{Page, Pages, Pagination};
pub use serde_json::{self, Value, json};
pub use sink::{Sink, SinkError};
pub use types::{
    CheckResult, ConnectorInfo, ConnectorKind, EntityOption, Error, OAuthEndpoints, Operation, ReadRequest,
    RecordError, Result, Stream, SyncMode, WriteMode, WriteRequest, WriteResult,
};

/// The bindings `wit-bindgen` generates for the world `connector`. Only
/// `convert.rs` and [`export_connector!`] use them.
#[doc(hidden)]
pub mod bindings {
    // The WIT is the one at the repository root, shared with the host; the
    // SDK for a new package version gets its own `generate!` and conversions.
    wit_bindgen::generate!({
        path: "../../wit/connector@1.3.0",
        world: "connector",
        // 1.3.0 is 1.0.0's interfaces, 1.1.0's `http-ahead`, 1.2.0's
        // `http-placed` and its own `http-multi`: generate them all. A plugin imports only what it calls
        // (`convert.rs` reaches the newer interfaces only from the methods
        // that need them).
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_connector_world",
        default_bindings_module: "::connector_sdk::bindings",
    });
}

/// What [`export_connector!`] expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::convert::Adapter;
}

/// Makes a type implementing [`Connector`] the component's exports.
///
/// Invoke it once per plugin crate, at the top level, with the connector
/// type: `export_connector!(MySource);`. The crate documentation shows it in
/// a complete connector.
#[macro_export]
macro_rules! export_connector {
    ($connector:ty) => {
        const _: () = {
            type __ConnectorExports = $crate::__private::Adapter<$connector>;
            $crate::bindings::__export_connector_world!(
                __ConnectorExports with_types_in $crate::bindings
            );
        };
    };
}
