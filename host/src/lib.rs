//! Control server of a data-integration platform whose connectors run as
//! sandboxed WebAssembly components.
//!
//! This crate implements version 1 of the Control API (served under `/v1`).
//!
//! # Layout
//!
//! Folders are contexts or layers; each module imports only modules of
//! the layers below it (the integration test `layout` checks this), listed
//! here from the top down.
//!
//! Composition (the root files):
//! - [`cli`]: the `service` command; `main.rs` only calls [`cli::run`].
//! - [`server`]: the composition root: puts the state together, binds,
//!   serves and shuts down.
//! - [`state`]: [`state::AppState`], the state handlers and tasks share.
//! - [`error`]: the API error type, mapped once to the spec's error shape.
//! - [`audit`]: what a request tells the audit log ([`audit::AuditNote`]).
//! - [`mcp`]: the MCP server (streamable HTTP at `/mcp`, stdio through
//!   `service mcp`), every API operation as a tool.
//!
//! Surfaces:
//! - [`http`]: the `/v1` routes, one module per resource, the middleware
//!   (authentication, audit, idempotency, metrics) and the OpenAPI
//!   description.
//! - [`web`]: the browser pages (one-time login, invitations, credential
//!   entry, OAuth landing).
//!
//! Behaviour:
//! - [`ops`]: every write as a value, one file per context, and the one
//!   door ([`ops::submit`]) with the approval gate behind it.
//! - [`connectors`]: host-side rules of particular connectors, by id.
//! - [`reverse_etl`]: models, activations and their runs: the diff against
//!   each activation's state and the sends to connectors and webhooks.
//! - [`webhooks`]: signed outbound webhooks: the deliverer that sends the
//!   outbox's events to subscriptions, once each and in order.
//! - [`jobs`]: runners (leases, heartbeats, retries), the scheduler, one
//!   sync and the write queue; reverse-ETL runs are jobs too.
//! - [`authoring`]: the connector author's kit: a new plugin crate,
//!   recordings made through the egress, offline replays and their
//!   comparison.
//! - [`credentials`]: the vault (sealed secrets behind handles), the
//!   keyring and the host's OAuth flows.
//! - [`access`]: roles, the principal, tokens, first-run bootstrap and
//!   offline administration.
//! - [`warehouse`]: the built-in destinations (SQLite, PostgreSQL,
//!   JSON-lines, Apache Iceberg tables in a folder or an object store):
//!   the only SQL spoken to a tenant's database.
//!
//! Foundations:
//! - [`plugin`]: the Wasm connector runtime and the plugin registry.
//! - [`egress`]: every outbound request of a connector, policed, and the
//!   one address policy (with its pinned client) of every host a tenant
//!   names: providers, receivers, warehouses.
//! - [`telemetry`]: logs, metrics and request ids.
//! - [`store`]: the only SQL spoken to the control database (SQLite or
//!   PostgreSQL), with the read caches.
//! - [`retry`]: whether a failure may pass if tried again
//!   ([`retry::Transient`]), answered by every error type below the API.
//! - [`config`]: the settings, parsed and checked; imports nothing.

pub mod access;
pub(crate) mod audit;
pub(crate) mod authoring;
pub mod cli;
pub mod config;
pub mod connectors;
pub mod credentials;
pub mod egress;
pub(crate) mod error;
pub(crate) mod http;
pub mod jobs;
pub(crate) mod mcp;
pub mod ops;
pub mod plugin;
pub(crate) mod retry;
pub(crate) mod reverse_etl;
pub mod server;
pub mod state;
pub mod store;
pub(crate) mod telemetry;
pub mod warehouse;
pub(crate) mod web;
pub(crate) mod webhooks;

/// The memory allocator of every program built on this crate: the server,
/// and with it its tests and benchmarks. A sync moves each record through
/// several short-lived buffers on several threads (the response, the
/// plugin's batch, the prepared rows, the database driver's bindings). With
/// the system allocator, allocating and freeing them took about a seventh of
/// the CPU of a sync (`perf`, 1 KB records); mimalloc does the same work
/// with markedly less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
