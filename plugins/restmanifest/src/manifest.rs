//! The configuration, as the shared `service-rest-manifest` crate reads
//! and checks it (the server uses the same crate when a source is saved),
//! in the SDK's terms: its refusals as [`Error::InvalidConfig`], its
//! placement and retries as the SDK's.

use connector_sdk::{Error, Placement, Result, Retry};
pub use rest_manifest::{Config, CursorFormat, Paging, StreamSpec};

/// `config` checked: a refusal names its JSON pointer.
pub fn checked(config: &Config) -> Result<()> {
    config.validate().map_err(|problem| Error::InvalidConfig(problem.to_string()))
}

/// Where the host puts the secret.
pub fn placement(config: &Config) -> Result<Placement> {
    Ok(match config.placement().map_err(|problem| Error::InvalidConfig(problem.to_string()))? {
        rest_manifest::CredentialPlacement::Bearer => Placement::Bearer,
        rest_manifest::CredentialPlacement::Header(name) => Placement::Header(name),
        rest_manifest::CredentialPlacement::Basic { username } => Placement::Basic { username },
    })
}

/// The stream named `name`.
pub fn stream<'a>(config: &'a Config, name: &str) -> Result<&'a StreamSpec> {
    config.stream(name).ok_or_else(|| Error::unknown_stream(name))
}

/// How `spec`'s requests are retried.
pub fn retry(spec: &StreamSpec, config: &Config) -> Retry {
    let retrying = spec.retrying(&config.manifest);
    Retry {
        max_retries: retrying.max_retries,
        first_backoff: retrying.first_backoff,
        max_backoff: retrying.max_backoff,
        max_total_wait: retrying.max_total_wait,
    }
}
