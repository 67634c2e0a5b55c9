//! Browser pages served by the service itself: the one-time login link
//! printed at first start, invitation acceptance, secure credential entry,
//! the OAuth landing, and web sign-in.
//!
//! Layout:
//! - this module: the routes;
//! - [`page`]: what every page shares (shell, escaping, headers);
//! - [`accounts`]: who a request comes from, the sessions pages issue,
//!   chosen passwords and the audit records of account events;
//! - [`login`]: the one-time sign-in link of the first start;
//! - [`entry`]: secure credential entry;
//! - [`oauth`]: the OAuth landing, confirmed by a person;
//! - [`signin`]: sign-in with e-mail and password, browser sessions in
//!   cookies, CSRF tokens, the account page and sign-out;
//! - [`cli_login`]: the confirmation page and code exchange of
//!   `service auth login` (loopback redirect with PKCE);
//! - [`approvals`]: pending proposals of a workspace, approved or
//!   rejected by a signed-in member;
//! - [`invitations`]: joining a workspace by an invitation link, as a new
//!   account or as the invited account signed in on the web;
//! - [`watch`]: read-only pages of pipelines, reverse-ETL activations and
//!   jobs, a job's progress redrawn live from its event stream.
//!
//! Each is two-step: `GET` shows a page and spends nothing (so link
//! previewers and prefetchers cannot burn a single-use link, and a person
//! sees what they are about to do); the form's `POST` acts.
//!
//! Every page is served with headers that forbid framing, caching and
//! content sniffing ([`page::page_headers`]); pages carry no script but
//! a job's (from this server, never inline), and their forms post only to
//! this server.

use axum::Router;
use axum::routing::get;

use crate::state::AppState;

pub(crate) mod accounts;
pub(crate) mod approvals;
pub(crate) mod cli_login;
pub(crate) mod entry;
pub(crate) mod invitations;
pub(crate) mod login;
pub(crate) mod oauth;
pub(crate) mod page;
pub(crate) mod signin;
pub(crate) mod watch;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/sign-in", get(signin::sign_in_page).post(signin::sign_in))
        .route("/sign-out", axum::routing::post(signin::sign_out))
        .route("/account", get(signin::account_page))
        .route("/cli/authorize", get(cli_login::authorize_page).post(cli_login::authorize))
        .route("/cli/token", axum::routing::post(cli_login::exchange))
        .route("/approvals", get(approvals::approvals_page))
        .route("/pipelines", get(watch::pipelines_page))
        .route("/pipelines/{pipeline_id}", get(watch::pipeline_page))
        .route("/reverse-etl/activations", get(watch::activations_page))
        .route("/reverse-etl/activations/{activation_id}", get(watch::activation_page))
        .route("/jobs/{job_id}", get(watch::job_page))
        .route("/jobs/{job_id}/events", get(watch::job_events))
        .route("/assets/job.js", get(watch::job_script))
        .route("/approvals/{approval_id}/{decision}", axum::routing::post(approvals::decide))
        .route("/login/{code}", get(login::login_page).post(login::login))
        .route("/invitations/{token}", get(invitations::invitation_page).post(invitations::accept_invitation))
        .route("/credential-entry/{token}", get(entry::entry_page).post(entry::submit_entry))
        .route("/oauth/callback", get(oauth::oauth_landing).post(oauth::oauth_complete))
        .layer(axum::middleware::from_fn(page::page_headers))
}
