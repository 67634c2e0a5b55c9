//! Integration suite: the real server over HTTP, on SQLite and PostgreSQL.
//! See `support` for the harness and how the PostgreSQL runs are enabled.

mod support;

mod access;
mod approvals;
mod browser;
mod audit;
mod cli;
mod cli_api;
mod cli_login;
mod client_limits;
mod emailcampaign;
mod socialmedia;
mod conventions;
mod credentials;
mod idempotency;
mod layout;
mod mcp;
mod members;
mod oauth;
mod pipelines;
mod reverse_etl;
mod reverse_etl_bounds;
mod runtime;
mod secrets;
mod sessions;
mod signin;
mod trust;
mod web_sessions;
