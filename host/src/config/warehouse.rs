//! Where PostgreSQL destinations may connect
//! (`SERVICE_WAREHOUSE_ALLOWED_HOSTS`): the parsed policy. The connection
//! itself is checked against it in `warehouse::postgres`.

use std::net::IpAddr;

use super::ConfigError;
use super::egress::HostPattern;

/// An IP network the operator lets destinations reach, e.g. `10.0.0.0/8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// `addr` or `addr/prefix`; `None` when it is neither.
    pub fn parse(raw: &str) -> Option<Network> {
        let (addr, prefix) = match raw.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
            None => {
                let a = raw.parse::<IpAddr>().ok()?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Network { addr, prefix })
    }

    /// Whether `ip` is in this network (as written: an IPv4-mapped IPv6
    /// address is not the IPv4 address it maps).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The hosts and networks PostgreSQL destinations may reach
/// (`SERVICE_WAREHOUSE_ALLOWED_HOSTS`). Empty by default: an operator who
/// wants tenants to load into databases names where those live.
#[derive(Debug, Clone, Default)]
pub struct WarehousePolicy {
    names: Vec<HostPattern>,
    networks: Vec<Network>,
    /// The most the server reads of one object-store answer, by kind.
    pub reads: ObjectReadLimits,
}

/// The most the server reads of one answer of a tenant's object store
/// (whose bucket owner could put anything there): an announced length
/// over the limit is refused before the body, and reading stops at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectReadLimits {
    /// A table's metadata file, or any other object read whole
    /// (`SERVICE_WAREHOUSE_MAX_METADATA_MB`).
    pub metadata_bytes: usize,
    /// A manifest or manifest list (`SERVICE_WAREHOUSE_MAX_MANIFEST_MB`).
    pub manifest_bytes: usize,
    /// One page of a listing (`SERVICE_WAREHOUSE_MAX_LISTING_MB`).
    pub listing_page_bytes: usize,
}

impl Default for ObjectReadLimits {
    fn default() -> Self {
        ObjectReadLimits {
            metadata_bytes: 64 * 1024 * 1024,
            manifest_bytes: 64 * 1024 * 1024,
            listing_page_bytes: 16 * 1024 * 1024,
        }
    }
}

impl WarehousePolicy {
    /// The same policy, reading object-store answers within `reads`.
    pub fn with_reads(mut self, reads: ObjectReadLimits) -> Self {
        self.reads = reads;
        self
    }

    /// Parses a comma-separated list of host names, `*.suffix` patterns,
    /// IP addresses and networks (`10.0.0.0/8`).
    pub fn from_settings(raw: &str) -> Result<Self, ConfigError> {
        let mut policy = WarehousePolicy::default();
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Some(net) = Network::parse(entry) {
                policy.networks.push(net);
                continue;
            }
            match HostPattern::parse(entry) {
                Ok(HostPattern::Any) | Err(_) => {
                    return Err(ConfigError::new(
                        "SERVICE_WAREHOUSE_ALLOWED_HOSTS",
                        format!("'{entry}' is not a host name, *.suffix pattern, IP address or network"),
                    ));
                }
                Ok(p) => policy.names.push(p),
            }
        }
        Ok(policy)
    }

    /// Whether a destination may name `host` (a name, or an address the
    /// operator listed).
    pub(crate) fn allows_name(&self, host: &str) -> bool {
        match host.parse::<IpAddr>() {
            Ok(ip) => self.networks.iter().any(|n| n.contains(ip)),
            Err(_) => self.names.iter().any(|p| p.matches(&host.to_ascii_lowercase())),
        }
    }

    /// Whether `ip` is in a network the operator listed (which vouches
    /// for it, private or not).
    pub(crate) fn lists_address(&self, ip: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(ip))
    }
}
