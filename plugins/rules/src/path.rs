//! A credential in a URL's path. Some APIs take an identifier their users
//! keep secret inside the path (`/v3/company/<realm>/query`); a plugin
//! writes [`CREDENTIAL_MARKER`] where it goes, names the credential, and
//! the host writes the secret there in the request it sends. The plugin's
//! URL, its logs and its cassettes hold the marker only.

/// Where a credential stored for the URL's path goes: the text `{credential}`
/// as a URL holds it (its braces percent-encoded), once, in the path.
pub const CREDENTIAL_MARKER: &str = "%7Bcredential%7D";

/// The path with `secret` written where the marker is, each byte a path
/// segment may not hold percent-encoded; `None` unless the path holds the
/// marker exactly once.
pub fn with_secret(path: &str, secret: &str) -> Option<String> {
    let at = path.find(CREDENTIAL_MARKER)?;
    let rest = &path[at + CREDENTIAL_MARKER.len()..];
    if rest.contains(CREDENTIAL_MARKER) {
        return None;
    }
    let mut out = String::with_capacity(path.len() + secret.len() * 3);
    out.push_str(&path[..at]);
    for b in secret.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_goes_where_the_marker_is_once_and_encoded() {
        assert_eq!(
            with_secret("/v3/company/%7Bcredential%7D/query", "12345").as_deref(),
            Some("/v3/company/12345/query")
        );
        assert_eq!(
            with_secret("/o/urn:li:organization:%7Bcredential%7D", "a/b?c").as_deref(),
            Some("/o/urn:li:organization:a%2Fb%3Fc")
        );
        assert_eq!(with_secret("/v3/company/query", "1"), None);
        assert_eq!(with_secret("/%7Bcredential%7D/%7Bcredential%7D", "1"), None);
    }
}
