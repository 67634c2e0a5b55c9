//! The rules the host and its connectors must read one way, written once.
//!
//! A rule that both sides apply, written twice, drifts: a connector that
//! takes a URL for one server while the host takes it for another, or a
//! header the SDK lets through and the host refuses. This crate has no
//! dependencies; the host uses it natively, the guest SDK re-exports it,
//! and `service plugins new` vendors it beside the SDK.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`origin`] | where a URL goes: its host and port, read one way |
//! | [`headers`] | the request headers only the host may set |
//! | [`path`] | where a credential goes in a URL's path |
//! | [`retry_after`] | how long a provider asked to wait |

pub mod headers;
pub mod origin;
pub mod path;
pub mod retry_after;
