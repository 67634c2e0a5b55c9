//! The configuration, as the shared `service-rest-manifest` crate reads
//! and checks it (the server uses the same crate when a source is saved),
//! in the SDK's terms: its refusals as [`Error::InvalidConfig`], its
//! placement and retries as the SDK's.

use connector_sdk::{Error, Placement, RequestBuilder, Result, Retry};
pub use rest_manifest::{Config, CursorFormat, Paging, StreamSpec};

/// `config` checked: a refusal names its JSON pointer.
pub fn checked(config: &Config) -> Result<()> {
    config.validate().map_err(|problem| Error::InvalidConfig(problem.to_string()))
}

/// `request` with the config's credential attached where it goes.
pub fn with_credential(request: RequestBuilder, handle: &str, config: &Config) -> Result<RequestBuilder> {
    Ok(match config.placement().map_err(|problem| Error::InvalidConfig(problem.to_string()))? {
        rest_manifest::CredentialPlacement::Bearer => request.credential(handle, Placement::Bearer),
        rest_manifest::CredentialPlacement::Header(name) => request.credential(handle, Placement::Header(name)),
        rest_manifest::CredentialPlacement::Basic { username } => {
            request.credential(handle, Placement::Basic { username })
        }
        rest_manifest::CredentialPlacement::Query(name) => request.credential_in_query(handle, name),
        rest_manifest::CredentialPlacement::AsStored => request.credential_as_stored(handle),
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
