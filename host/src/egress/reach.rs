//! Where the host may connect for a tenant: one address policy for every
//! connection it makes on a workspace's behalf, whatever the protocol.
//!
//! A tenant names hosts (a provider's API, a receiver's URL, a warehouse's
//! database or object store), and the host connects to them from inside
//! the operator's network. Three reaches, each with the operator's list of
//! names ([`Reach::setting`]):
//!
//! - [`Reach::Providers`] and [`Reach::Receivers`]: a name on the list,
//!   resolved to global addresses only, unless the operator pinned the
//!   name to addresses (`SERVICE_EGRESS_RESOLVE`);
//! - [`Reach::Warehouses`]: a name (or address) on the list, resolved to
//!   global addresses or addresses in networks the operator listed.
//!
//! [`allowed_addresses`] is the only place a tenant's host name becomes
//! addresses, and [`PinnedClient`] the only HTTP client that connects to
//! such hosts: it goes to the addresses that were checked and nowhere
//! else (a second DNS answer cannot move it), follows no redirect, uses no
//! proxy, and trusts the system's roots plus the operator's. A refusal
//! never names the address a name resolved to: job errors reach members,
//! who must not map the inside of the network through them; the
//! operator's log has it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::address;
use crate::config::egress::{EgressPolicy, HostPattern};
use crate::config::warehouse::WarehousePolicy;

/// Which of the operator's lists a connection's host must be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Providers connectors talk to (`SERVICE_EGRESS_ALLOWED_HOSTS`).
    Providers,
    /// Receivers the host posts to for a workspace: reverse-ETL HTTP
    /// destinations and webhook subscriptions
    /// (`SERVICE_WEBHOOK_ALLOWED_HOSTS`).
    Receivers,
    /// Warehouses destinations load into: databases and object stores
    /// (`SERVICE_WAREHOUSE_ALLOWED_HOSTS`).
    Warehouses,
}

impl Reach {
    /// The setting that lists this reach's hosts.
    pub fn setting(self) -> &'static str {
        match self {
            Reach::Providers => "SERVICE_EGRESS_ALLOWED_HOSTS",
            Reach::Receivers => "SERVICE_WEBHOOK_ALLOWED_HOSTS",
            Reach::Warehouses => "SERVICE_WAREHOUSE_ALLOWED_HOSTS",
        }
    }

    /// The setting through which the operator vouches for addresses
    /// beyond the global ones.
    pub fn vouching_setting(self) -> &'static str {
        match self {
            Reach::Providers | Reach::Receivers => "SERVICE_EGRESS_RESOLVE",
            Reach::Warehouses => "SERVICE_WAREHOUSE_ALLOWED_HOSTS",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Reach::Providers => "provider",
            Reach::Receivers => "receiver",
            Reach::Warehouses => "warehouse",
        }
    }
}

/// Why a host is not connected to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unreachable {
    /// Not on the reach's list.
    #[error("{host} is not a {} host the operator allows ({})", .reach.noun(), .reach.setting())]
    HostNotAllowed { host: String, reach: Reach },
    /// The name has no address now (it may later).
    #[error("{0} did not resolve: {1}")]
    Unresolved(String, String),
    /// The address stays out of the message (see the [module](self)).
    #[error("{host} resolves to a {why}, which the operator does not allow ({})", .reach.vouching_setting())]
    AddressRefused { host: String, ip: IpAddr, why: &'static str, reach: Reach },
}

impl crate::retry::Transient for Unreachable {
    /// A name that did not resolve may resolve later; the operator's rules
    /// do not change by trying again.
    fn is_transient(&self) -> bool {
        matches!(self, Unreachable::Unresolved(..))
    }
}

/// One reach's rules, as the operator set them.
#[derive(Clone, Copy)]
pub(crate) struct Rules<'a> {
    reach: Reach,
    lists: Lists<'a>,
}

#[derive(Clone, Copy)]
enum Lists<'a> {
    /// Names, and names pinned to addresses the operator vouches for.
    Egress { names: &'a [HostPattern], pinned: &'a HashMap<String, Vec<SocketAddr>> },
    /// Names, and networks beyond the global addresses.
    Warehouses(&'a WarehousePolicy),
}

impl<'a> Rules<'a> {
    /// The rules of `reach` (providers or receivers) in the egress policy.
    /// Warehouses are not the egress's to reach: asked for them, the rules
    /// list no host at all (their own are [`Rules::warehouses`]).
    pub(crate) fn egress(policy: &'a EgressPolicy, reach: Reach) -> Rules<'a> {
        let names: &[HostPattern] = match reach {
            Reach::Providers => &policy.allowed_hosts,
            Reach::Receivers => &policy.webhook_hosts,
            Reach::Warehouses => &[],
        };
        Rules { reach, lists: Lists::Egress { names, pinned: &policy.pinned } }
    }

    /// The warehouses' rules.
    pub(crate) fn warehouses(policy: &'a WarehousePolicy) -> Rules<'a> {
        Rules { reach: Reach::Warehouses, lists: Lists::Warehouses(policy) }
    }

    /// Whether the operator lists `host` (a lower-case name; an address
    /// for warehouses).
    pub(crate) fn check_name(&self, host: &str) -> Result<(), Unreachable> {
        let allowed = match self.lists {
            Lists::Egress { names, .. } => names.iter().any(|p| p.matches(host)),
            Lists::Warehouses(policy) => policy.allows_name(host),
        };
        if allowed { Ok(()) } else { Err(Unreachable::HostNotAllowed { host: host.to_owned(), reach: self.reach }) }
    }

    /// Why `ip` may not be connected to, if it may not.
    fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        match self.lists {
            Lists::Warehouses(policy) if policy.lists_address(ip) => None,
            _ => address::refusal(ip),
        }
    }

    fn pinned(&self, host: &str) -> Option<&'a [SocketAddr]> {
        match self.lists {
            Lists::Egress { pinned, .. } => pinned.get(host).map(Vec::as_slice),
            Lists::Warehouses(_) => None,
        }
    }
}

/// The addresses `host` resolves to (port `port`), when the operator lists
/// the name and allows every address: the only ones a connection to it
/// may go to. A name the operator pinned goes to its pins.
pub(crate) async fn allowed_addresses(
    rules: &Rules<'_>,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, Unreachable> {
    rules.check_name(host)?;
    if let Some(pinned) = rules.pinned(host) {
        return Ok(pinned.to_vec());
    }
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Unreachable::Unresolved(host.to_owned(), e.to_string()))?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(Unreachable::Unresolved(host.to_owned(), "no address".into()));
    }
    for a in &addresses {
        if let Some(why) = rules.refusal(a.ip()) {
            tracing::warn!(%host, address = %a.ip(), reach = ?rules.reach, "a host resolves to a {why} the operator does not allow");
            return Err(Unreachable::AddressRefused { host: host.to_owned(), ip: a.ip(), why, reach: rules.reach });
        }
    }
    Ok(addresses)
}

/// The addresses checked by [`allowed_addresses`], read by the HTTP
/// client's resolver: the client never resolves a name by itself.
#[derive(Default)]
struct CheckedAddresses(Mutex<HashMap<String, Vec<SocketAddr>>>);

impl reqwest::dns::Resolve for CheckedAddresses {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let found = self.0.lock().unwrap_or_else(|p| p.into_inner()).get(name.as_str()).cloned();
        Box::pin(async move {
            match found {
                Some(addrs) => Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs),
                None => Err("name was not checked by the address policy".into()),
            }
        })
    }
}

/// The HTTP client for hosts a tenant names: it connects only to
/// addresses [`PinnedClient::check`] allowed.
#[derive(Clone)]
pub(crate) struct PinnedClient {
    client: reqwest::Client,
    checked: Arc<CheckedAddresses>,
}

impl PinnedClient {
    /// A client sending `user_agent`, trusting the system's roots and
    /// `extra_roots`, with `tune` applied (time-outs and the like).
    pub(crate) fn new(
        user_agent: &str,
        extra_roots: &[reqwest::Certificate],
        tune: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
    ) -> reqwest::Result<PinnedClient> {
        // The process's TLS provider (ring), as the binary installs it;
        // done here too for a library caller that did not.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let checked = Arc::new(CheckedAddresses::default());
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(checked.clone())
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(user_agent);
        if !extra_roots.is_empty() {
            builder = builder.tls_certs_merge(extra_roots.iter().cloned());
        }
        Ok(PinnedClient { client: tune(builder).build()?, checked })
    }

    /// Checks `host` against `rules` and lets the client connect to the
    /// addresses allowed (an address literal connects to itself once
    /// allowed).
    pub(crate) async fn check(&self, rules: &Rules<'_>, host: &str, port: u16) -> Result<(), Unreachable> {
        let addresses = allowed_addresses(rules, host, port).await?;
        if host.parse::<IpAddr>().is_err() {
            self.checked.0.lock().unwrap_or_else(|p| p.into_inner()).insert(host.to_owned(), addresses);
        }
        Ok(())
    }

    /// The client, for requests to hosts [`check`](Self::check)ed.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_reach_keeps_to_its_list_and_names_its_setting() {
        let mut egress =
            EgressPolicy { allowed_hosts: vec![HostPattern::parse("localhost").unwrap()], ..EgressPolicy::default() };
        let providers = Rules::egress(&egress, Reach::Providers);
        let refused = allowed_addresses(&providers, "localhost", 443).await.unwrap_err();
        assert!(matches!(refused, Unreachable::AddressRefused { why: "loopback address", .. }), "{refused}");
        let said = refused.to_string();
        assert!(said.contains("SERVICE_EGRESS_RESOLVE") && !said.contains("127.0.0.1"), "{said}");
        let receivers = Rules::egress(&egress, Reach::Receivers);
        let refused = allowed_addresses(&receivers, "localhost", 443).await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "localhost is not a receiver host the operator allows (SERVICE_WEBHOOK_ALLOWED_HOSTS)"
        );
        egress.pinned.insert("localhost".into(), vec!["127.0.0.1:8443".parse().unwrap()]);
        let pinned = allowed_addresses(&Rules::egress(&egress, Reach::Providers), "localhost", 443).await.unwrap();
        assert_eq!(pinned, vec!["127.0.0.1:8443".parse().unwrap()]);

        let warehouses = WarehousePolicy::from_settings("127.0.0.0/8,db.example").unwrap();
        let rules = Rules::warehouses(&warehouses);
        assert_eq!(
            allowed_addresses(&rules, "127.0.0.1", 5432).await.unwrap(),
            vec!["127.0.0.1:5432".parse().unwrap()]
        );
        let refused = allowed_addresses(&rules, "10.0.0.1", 5432).await.unwrap_err();
        assert!(refused.to_string().contains("not a warehouse host"), "{refused}");
    }

    #[test]
    fn warehouses_reach_global_addresses_and_listed_networks() {
        let policy = WarehousePolicy::from_settings("db.example.com, 10.0.0.0/8").unwrap();
        let rules = Rules::warehouses(&policy);
        assert!(rules.refusal("10.9.9.9".parse().unwrap()).is_none(), "a listed network");
        assert!(rules.refusal("192.168.1.1".parse().unwrap()).is_some(), "a private one that is not");
        assert!(rules.refusal("169.254.169.254".parse().unwrap()).is_some(), "metadata");
        assert!(rules.refusal("93.184.215.14".parse().unwrap()).is_none(), "global");
        // Providers have no networks: only pins vouch for an address.
        let egress = EgressPolicy::default();
        assert!(Rules::egress(&egress, Reach::Providers).refusal("10.9.9.9".parse().unwrap()).is_some());
    }

    /// The egress's rules asked for warehouses list nothing: the providers'
    /// list never stands in for the warehouses' one.
    #[test]
    fn the_egress_lists_no_warehouse() {
        let egress = EgressPolicy {
            allowed_hosts: vec![HostPattern::parse("db.example.com").unwrap()],
            ..EgressPolicy::default()
        };
        assert!(Rules::egress(&egress, Reach::Providers).check_name("db.example.com").is_ok());
        let refused = Rules::egress(&egress, Reach::Warehouses).check_name("db.example.com").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "db.example.com is not a warehouse host the operator allows (SERVICE_WAREHOUSE_ALLOWED_HOSTS)"
        );
    }
}
