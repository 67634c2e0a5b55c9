//! What the server's integration tests and benchmarks share, so neither
//! borrows the other's files: fake providers that speak the real protocols
//! over real HTTPS, a fake PostgreSQL that records what it is sent, an
//! S3-compatible store, and the builder of the test plugins.
//!
//! Layout:
//! - [`provider`]: a test CA and HTTPS fake providers on loopback, with the
//!   pins and roots the egress layer is pointed at them by;
//! - [`mailcoach`]: the email-campaign provider's fake (Mailcoach's API);
//! - [`hubspot`]: the social-media provider's fake (HubSpot's broadcasts,
//!   OAuth and accounts);
//! - [`jsonplaceholder`]: the example source's provider (a
//!   JSONPlaceholder-style REST API);
//! - [`restapi`]: a REST API in every paging style a manifest describes,
//!   and routes that misbehave on purpose;
//! - [`routes`]: canned provider routes for small tests;
//! - [`codings`]: compressed answers and every way to undo them;
//! - [`fakepg`]: a fake PostgreSQL server that records what it is sent;
//! - [`objectstore`]: moto's S3 on loopback behind an HTTPS front;
//! - [`python`]: the tests' Python tools run as servers;
//! - [`plugins`]: building and finding the test plugins (`tests/plugins`)
//!   and the example source.

pub mod codings;
pub mod fakepg;
pub mod hubspot;
pub mod jsonplaceholder;
pub mod mailcoach;
pub mod objectstore;
pub mod plugins;
pub mod provider;
pub mod python;
pub mod restapi;
pub mod routes;
