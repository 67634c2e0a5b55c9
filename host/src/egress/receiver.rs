//! The URL of a receiver the host posts to on a workspace's behalf (a
//! reverse-ETL webhook destination, a webhook subscription): checked when
//! it is configured, by the same rules egress enforces when it is used.

use url::Url;

use super::EgressPolicy;

/// Why a receiver URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReceiverUrlError {
    /// Not an HTTPS URL on port 443 naming a host (never an address).
    #[error("{0}")]
    Invalid(&'static str),
    /// User-info in the URL: a secret belongs in a credential.
    #[error("the URL holds user-info")]
    SecretInUrl,
    /// The host is not on the operator's list of webhook hosts.
    #[error("{0} is not a host the operator allows webhooks to post to")]
    HostNotAllowed(String),
}

/// Checks a receiver URL: HTTPS on port 443, a host name (IP literals are
/// refused, so private and internal addresses cannot be named directly;
/// egress refuses a name resolving to one), no user-info, query or
/// fragment, and a host the operator allows webhooks to reach
/// (`SERVICE_WEBHOOK_ALLOWED_HOSTS`, not the connectors' list). Returns
/// the URL and its host, lower-cased.
pub(crate) fn check_receiver_url(policy: &EgressPolicy, raw: &str) -> Result<(Url, String), ReceiverUrlError> {
    let url = Url::parse(raw).map_err(|_| ReceiverUrlError::Invalid("url must be an absolute https URL"))?;
    if url.scheme() != "https" {
        return Err(ReceiverUrlError::Invalid("url must use https"));
    }
    if url.port().is_some_and(|p| p != 443) {
        return Err(ReceiverUrlError::Invalid("url must use port 443"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ReceiverUrlError::SecretInUrl);
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ReceiverUrlError::Invalid(
            "url must not have a query or fragment; put a secret in a credential and name its credential_handle",
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
        Some(_) => {
            return Err(ReceiverUrlError::Invalid(
                "url must name a host, not an IP address: private and internal addresses are refused",
            ));
        }
        None => return Err(ReceiverUrlError::Invalid("url has no host")),
    };
    if !policy.webhook_hosts.iter().any(|p| p.matches(&host)) {
        return Err(ReceiverUrlError::HostNotAllowed(host));
    }
    Ok((url, host))
}

/// A receiver URL as shown to those who may not hold it whole (members
/// below administrator, proposal summaries sent to webhook receivers):
/// its scheme and host, its path elided. A receiver's path often carries
/// the receiver's own secret (a chat service's incoming-hook token).
pub(crate) fn receiver_origin(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(url) => {
            let elided = if url.path().len() > 1 { "/…" } else { "/" };
            format!("{}://{}{elided}", url.scheme(), url.host_str().unwrap_or_default())
        }
        Err(_) => "(an invalid URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_keeps_the_host_and_elides_the_path() {
        assert_eq!(receiver_origin("https://hooks.example.com/T000/B000/secret"), "https://hooks.example.com/…");
        assert_eq!(receiver_origin("https://hooks.example.com"), "https://hooks.example.com/");
        assert_eq!(receiver_origin("not a url"), "(an invalid URL)");
    }
}
