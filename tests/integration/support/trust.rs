//! A server that trusts the tests' fake providers: [`Trust`] builds the
//! egress policy that reaches each fake provider, under the names it
//! serves, through the tests' CA, and nothing else.

use service::egress::EgressPolicy;

use super::provider::{FakeProvider, TestCa};

/// The egress policy of a server trusting fake providers of one CA.
pub struct Trust {
    pem: String,
    allowed: Vec<String>,
    pins: Vec<String>,
    receivers: Vec<String>,
}

impl Trust {
    /// Trusts `ca`; reaches nothing yet.
    pub fn new(ca: &TestCa) -> Trust {
        Trust { pem: ca.pem.clone(), allowed: Vec::new(), pins: Vec::new(), receivers: Vec::new() }
    }

    /// Reaches `provider` under `names` (allowed, and pinned to it).
    pub fn serving(mut self, provider: &FakeProvider, names: &[&str]) -> Trust {
        self.allowed.extend(names.iter().map(|n| (*n).to_owned()));
        self.pins.push(provider.pins(names));
        self
    }

    /// Also allows `patterns` (a comma-separated list, as the setting
    /// takes it), for hosts a test expects refused or pins itself.
    pub fn allowing(mut self, patterns: &str) -> Trust {
        self.allowed.extend(patterns.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned));
        self
    }

    /// Also pins `pins` (`name=address,...`) without allowing them.
    pub fn pinning(mut self, pins: &str) -> Trust {
        if !pins.is_empty() {
            self.pins.push(pins.to_owned());
        }
        self
    }

    /// Lets receivers (reverse-ETL and webhook) reach `hosts`.
    pub fn receiving(mut self, hosts: &[&str]) -> Trust {
        self.receivers.extend(hosts.iter().map(|h| (*h).to_owned()));
        self
    }

    /// The policy.
    pub fn policy(&self) -> EgressPolicy {
        let policy =
            EgressPolicy::from_settings(&self.allowed.join(","), Some(&self.pins.join(",")), Some(self.pem.as_bytes()))
                .unwrap();
        if self.receivers.is_empty() { policy } else { policy.with_webhook_hosts(&self.receivers.join(",")).unwrap() }
    }
}
