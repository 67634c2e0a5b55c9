//! The address a request comes from, for rate limits, sessions and the
//! audit log: the connection's peer, or, when the peer is a proxy the
//! operator trusts (`SERVICE_TRUSTED_PROXIES`), the client that proxy
//! reports in `Forwarded` (RFC 7239) or `X-Forwarded-For`.
//!
//! Those headers are read right to left, skipping trusted proxies, and the
//! first address that is not one is the client: a client can put anything
//! in front of what a proxy appends, so nothing left of that is believed.
//! From a peer that is not trusted the headers are ignored altogether.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use axum::http::request::Parts;

use crate::config::limits::Network;

/// The client's address, as [`resolve`] found it; put on every request by
/// the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientAddress(pub IpAddr);

/// The client address of a request whose connection comes from `peer`.
pub(crate) fn resolve(peer: IpAddr, headers: &HeaderMap, trusted: &[Network]) -> IpAddr {
    // A dual-stack listener sees IPv4 clients as IPv4-mapped IPv6 ones.
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip.to_canonical()));
    if !is_trusted(peer) {
        return peer;
    }
    let chain = forwarded_chain(headers);
    // Right to left: the nearest hop first.
    let mut client = peer;
    for hop in chain.iter().rev() {
        match hop {
            Some(ip) => {
                client = ip.to_canonical();
                if !is_trusted(client) {
                    return client;
                }
            }
            // An address a trusted proxy could not give (`unknown`, an
            // obfuscated name): stop at the proxy that said so.
            None => return client,
        }
    }
    client
}

/// The hops a request went through, oldest first: `Forwarded` when present,
/// else `X-Forwarded-For`. `None` marks a hop without a usable address.
fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let forwarded: Vec<&str> = headers.get_all("forwarded").iter().filter_map(|v| v.to_str().ok()).collect();
    if !forwarded.is_empty() {
        return forwarded
            .iter()
            .flat_map(|v| v.split(','))
            .map(|element| {
                element
                    .split(';')
                    .filter_map(|pair| pair.trim().split_once('='))
                    .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
                    .and_then(|(_, v)| node_address(v))
            })
            .collect();
    }
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(node_address)
        .collect()
}

/// The address of a `for=` node or an `X-Forwarded-For` entry: `1.2.3.4`,
/// `1.2.3.4:80`, `"[2001:db8::1]:80"`, `2001:db8::1`.
fn node_address(raw: &str) -> Option<IpAddr> {
    let v = raw.trim().trim_matches('"');
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    v.strip_prefix('[').and_then(|rest| rest.split_once(']')).and_then(|(ip, _)| ip.parse().ok())
}

/// The client address of a request: what the server resolved, else the
/// connection's peer, else none (a request not from a socket).
pub(crate) fn of(parts: &Parts) -> Option<IpAddr> {
    from_extensions(&parts.extensions)
}

/// [`of`], from a request's extensions.
pub(crate) fn from_extensions(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<ClientAddress>()
        .map(|c| c.0)
        .or_else(|| extensions.get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn headers_from_an_untrusted_peer_are_ignored() {
        let trusted = [Network::parse("10.0.0.1").unwrap()];
        let h = headers(&[("x-forwarded-for", "203.0.113.7"), ("forwarded", "for=198.51.100.1")]);
        assert_eq!(resolve(ip("192.0.2.9"), &h, &trusted), ip("192.0.2.9"));
        assert_eq!(resolve(ip("192.0.2.9"), &h, &[]), ip("192.0.2.9"));
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_what_a_client_prepends_is_not_believed() {
        let trusted = [Network::parse("10.0.0.0/8").unwrap()];
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.2")]);
        assert_eq!(resolve(ip("10.0.0.1"), &h, &trusted), ip("203.0.113.7"), "the first untrusted hop from the right");
        let h = headers(&[
            ("forwarded", "for=1.1.1.1, for=\"[2001:db8::7]:4711\";proto=https"),
            ("x-forwarded-for", "9.9.9.9"),
        ]);
        assert_eq!(resolve(ip("10.0.0.1"), &h, &trusted), ip("2001:db8::7"), "Forwarded wins over X-Forwarded-For");
        let h = headers(&[("x-forwarded-for", "10.0.0.3")]);
        assert_eq!(resolve(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.3"), "only proxies: the farthest");
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(resolve(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.1"), "no usable address: the proxy itself");
        assert_eq!(resolve(ip("10.0.0.1"), &HeaderMap::new(), &trusted), ip("10.0.0.1"));
    }
}
