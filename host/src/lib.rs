//! Control server of a data-integration platform whose connectors run as
//! sandboxed WebAssembly components.
//!
//! This crate implements version 1 of the Control API (served under `/v1`).
//!
//! # Layout
//!
//! - [`cli`] and [`config`]: the `service` command and its settings;
//!   `main.rs` only calls [`cli::run`].
//! - [`server`]: shared state ([`server::AppState`]), bootstrap, binding.
//! - [`http`]: the `/v1` routes, one module per resource, plus middleware
//!   (authentication, audit, idempotency, metrics) and the OpenAPI document.
//! - [`mcp`]: the MCP server (streamable HTTP at `/mcp`, stdio via
//!   `service mcp`), every API operation as a tool.
//! - [`ops`]: every write operation as a value, and the one door
//!   ([`ops::submit`]) through which all of them execute.
//! - [`approvals`]: the approval gate: execute now or store a proposal.
//! - [`plugin`]: the Wasm connector runtime and the plugin registry.
//! - [`oauth`]: OAuth authorization-code flows (PKCE) run by the host.
//! - [`destinations`]: SQLite, PostgreSQL and JSON-lines destinations.
//! - [`jobs`]: the runner (leases, heartbeats, retries) and the scheduler.
//! - [`credentials`]: the sealed credential store and its vault.
//! - [`egress`]: every outbound request of a connector, policed.
//! - [`access`]: roles, the authenticated principal, permission checks.
//! - [`store`]: the only module that speaks SQL (SQLite or PostgreSQL).
//! - [`error`]: the API error type, mapped once to the spec's error shape.
//! - [`tokens`]: opaque bearer tokens and their hashes.
//! - [`web`]: the few browser pages (one-time login, invitations).
//! - [`admin`]: first-run bootstrap and offline admin commands.
//! - [`telemetry`]: logs and metrics.

pub mod access;

pub mod audit;
pub mod cli;
pub mod config;
pub mod connectors;
pub mod credentials;
pub mod egress;
pub mod error;
pub mod http;
pub mod jobs;
pub mod mcp;
pub mod ops;
pub mod plugin;
pub mod server;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod warehouse;
pub mod web;

/// The memory allocator of every program built on this crate: the server,
/// and with it its tests and benchmarks. A sync moves each record through
/// several short-lived buffers on several threads (the response, the
/// plugin's batch, the prepared rows, the database driver's bindings). With
/// the system allocator, allocating and freeing them took about a seventh of
/// the CPU of a sync (`perf`, 1 KB records); mimalloc does the same work
/// with markedly less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
