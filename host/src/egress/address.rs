//! Which IP addresses a connector may reach: only globally routable
//! unicast addresses. Everything private, local, reserved or special is
//! refused, and IPv6 forms that embed an IPv4 address are judged by that
//! address, so `::ffff:127.0.0.1` or `64:ff9b::a9fe:a9fe` cannot sneak past.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not reachable, for the operator's log and the plugin.
pub(crate) fn refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4),
        IpAddr::V6(v6) => refusal_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn refusal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RULES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "unspecified or this-network address"),
        ([10, 0, 0, 0], 8, "private address"),
        ([100, 64, 0, 0], 10, "carrier-grade NAT address"),
        ([127, 0, 0, 0], 8, "loopback address"),
        ([169, 254, 0, 0], 16, "link-local or cloud metadata address"),
        ([172, 16, 0, 0], 12, "private address"),
        ([192, 0, 0, 0], 24, "IETF protocol assignment"),
        ([192, 0, 2, 0], 24, "documentation address"),
        ([192, 31, 196, 0], 24, "AS112 service address"),
        ([192, 52, 193, 0], 24, "AMT relay address"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast address"),
        ([192, 168, 0, 0], 16, "private address"),
        ([192, 175, 48, 0], 24, "AS112 service address"),
        ([198, 18, 0, 0], 15, "benchmarking address"),
        ([198, 51, 100, 0], 24, "documentation address"),
        ([203, 0, 113, 0], 24, "documentation address"),
        ([224, 0, 0, 0], 4, "multicast address"),
        ([240, 0, 0, 0], 4, "reserved or broadcast address"),
    ];
    RULES.iter().find(|(net, prefix, _)| in_v4(ip, *net, *prefix)).map(|(_, _, why)| *why)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
    (u128::from(ip) & mask) == (u128::from(Ipv6Addr::from(net)) & mask)
}

/// The IPv4 address in the low 32 bits.
fn low_v4(ip: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(ip) & 0xffff_ffff) as u32)
}

fn refusal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified address");
    }
    if ip.is_loopback() {
        return Some("loopback address");
    }
    // Forms that carry an IPv4 address: judge the IPv4 address.
    if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96)      // IPv4-mapped
        || in_v6(ip, [0, 0, 0, 0, 0, 0, 0, 0], 96)        // IPv4-compatible (deprecated)
        || in_v6(ip, [0, 0, 0, 0, 0xffff, 0, 0, 0], 96)   // IPv4-translated
        || in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96)
    // NAT64 well-known prefix
    {
        // Even the form of a global IPv4 address is refused: the connection
        // would leave through translation paths the policy never vetted.
        return Some(refusal_v4(low_v4(ip)).unwrap_or("IPv6 form of an IPv4 address"));
    }
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return Some("6to4 address (embeds an IPv4 address)");
    }
    const RULES: &[([u16; 8], u32, &str)] = &[
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64 address"),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only address"),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo address (embeds an IPv4 address)"),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "IETF protocol assignment"),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation address"),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation address"),
        ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, "segment routing address"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local (private) address"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local address"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local address"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast address"),
    ];
    RULES.iter().find(|(net, prefix, _)| in_v6(ip, *net, *prefix)).map(|(_, _, why)| *why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> bool {
        refusal(s.parse().unwrap()).is_some()
    }

    #[test]
    fn non_global_addresses_are_refused() {
        for a in [
            "127.0.0.1",
            "127.255.255.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "192.0.2.10",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.0.170",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2002:7f00:1::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "100::1",
            "3fff::1",
            "::ffff:0:7f00:1",
        ] {
            assert!(refused(a), "{a} must be refused");
        }
    }

    #[test]
    fn global_addresses_pass() {
        for a in [
            "93.184.215.14",
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
        ] {
            assert!(!refused(a), "{a} must pass");
        }
    }

    #[test]
    fn mapped_forms_of_global_addresses_are_refused_too() {
        assert!(refused("::ffff:8.8.8.8"));
        assert!(refused("64:ff9b::808:808"));
    }
}
