//! Where a URL goes, read one way by the host and by every connector.
//!
//! The SDK uses it (connectors compare next links and redirects with it)
//! and so does the host (its egress refuses a URL this reading and the
//! host's own URL parser disagree on), so a connector and the host can
//! never take one URL for two different servers.
//!
//! The reading: the scheme `https` in any case; the authority ends at the
//! first `/`, `\`, `?` or `#`; no user-info; the host in ASCII (an
//! internationalised name is written in its `xn--` form) and lower case;
//! the default port 443 is the same origin as no port.

/// Why a URL has no origin a request may go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginError {
    /// Not `https://`.
    NotHttps,
    /// No host after the scheme.
    NoHost,
    /// `user@` or `user:password@` before the host.
    UserInfo,
    /// A host with characters beyond ASCII, or percent-encoded ones.
    NotAscii,
    /// A port that is not a number from 1 to 65535.
    BadPort,
}

impl core::fmt::Display for OriginError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            OriginError::NotHttps => "not an https:// URL",
            OriginError::NoHost => "the URL names no host",
            OriginError::UserInfo => "the URL carries user-info before its host",
            OriginError::NotAscii => {
                "the host is not written in ASCII; write an internationalised name in its xn-- (punycode) form"
            }
            OriginError::BadPort => "the port is not a number from 1 to 65535",
        })
    }
}

/// The server a URL goes to: its host (lower case, IPv6 literals in
/// brackets) and its port, `None` for the default 443.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Lower case; an IPv6 literal in its brackets.
    pub host: String,
    /// `None` for the default, 443.
    pub port: Option<u16>,
}

impl Origin {
    /// `https://host` or `https://host:port`.
    pub fn serialize(&self) -> String {
        match self.port {
            Some(port) => format!("https://{}:{port}", self.host),
            None => format!("https://{}", self.host),
        }
    }
}

/// The origin of `url`, read the one way.
pub fn parse(url: &str) -> Result<Origin, OriginError> {
    let rest = url
        .get(..8)
        .filter(|scheme| scheme.eq_ignore_ascii_case("https://"))
        .map(|_| &url[8..])
        .ok_or(OriginError::NotHttps)?;
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(OriginError::UserInfo);
    }
    if !authority.is_ascii() || authority.contains('%') {
        return Err(OriginError::NotAscii);
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(literal) => {
            let close = literal.find(']').ok_or(OriginError::NoHost)?;
            let after = &literal[close + 1..];
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or(OriginError::BadPort)?),
            };
            (&authority[..close + 2], port)
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() || host == "[]" {
        return Err(OriginError::NoHost);
    }
    let port = match port {
        None | Some("") => None,
        Some(digits) if !digits.bytes().all(|b| b.is_ascii_digit()) => return Err(OriginError::BadPort),
        Some(digits) => match digits.parse::<u16>() {
            Ok(443) => None,
            Ok(0) | Err(_) => return Err(OriginError::BadPort),
            Ok(other) => Some(other),
        },
    };
    Ok(Origin { host: host.to_ascii_lowercase(), port })
}

/// `https://host[:port]` of `url`, or `None` when it has no origin a
/// request may go to.
pub fn origin(url: &str) -> Option<String> {
    parse(url).ok().map(|o| o.serialize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases both the host and the SDK run.
    #[test]
    fn one_reading_of_hosts_ports_and_names() {
        let same = [
            ("https://API.Example.com/v1?x=1", "https://api.example.com"),
            ("HTTPS://api.example.com:443/x", "https://api.example.com"),
            ("https://api.example.com:8443", "https://api.example.com:8443"),
            ("https://api.example.com\\@evil.example/", "https://api.example.com"),
            ("https://api.example.com#@evil.example", "https://api.example.com"),
            ("https://[::1]:443/x", "https://[::1]"),
            ("https://[2001:DB8::1]:8443/x", "https://[2001:db8::1]:8443"),
            ("https://xn--bcher-kva.example/", "https://xn--bcher-kva.example"),
        ];
        for (url, want) in same {
            assert_eq!(origin(url).as_deref(), Some(want), "{url}");
        }
        let refused = [
            ("http://api.example.com/", OriginError::NotHttps),
            ("https:///x", OriginError::NoHost),
            ("https://user@api.example.com/", OriginError::UserInfo),
            ("https://evil.example%2F@api.example.com/", OriginError::UserInfo),
            ("https://bücher.example/", OriginError::NotAscii),
            ("https://api%2eexample.com/", OriginError::NotAscii),
            ("https://api.example.com:0/", OriginError::BadPort),
            ("https://api.example.com:99999/", OriginError::BadPort),
            ("https://api.example.com:+443/", OriginError::BadPort),
        ];
        for (url, why) in refused {
            assert_eq!(parse(url), Err(why), "{url}");
        }
    }
}
