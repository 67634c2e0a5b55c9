//! Integration suite: the real server over HTTP, on SQLite and PostgreSQL.
//! See `support` for the harness and how the PostgreSQL runs are enabled.

mod support;

mod access;
mod airbyte;
mod approvals;
mod audit;
mod authoring;
mod browser;
mod budgets;
mod canaries;
mod claims;
mod cli;
mod cli_api;
mod cli_login;
mod client_limits;
mod contracts;
mod conventions;
mod credentials;
mod drift;
mod emailcampaign;
mod faults;
mod idempotency;
mod lakehouse;
mod layout;
mod mcp;
mod members;
mod oauth;
mod oci;
mod pipelines;
mod progress;
mod references;
mod replicas;
mod restmanifest;
mod reverse_etl;
mod reverse_etl_bounds;
mod runtime;
mod secrets;
mod sessions;
mod signatures;
mod signin;
mod socialmedia;
mod trust;
mod versions;
mod web_sessions;
mod webhooks;
