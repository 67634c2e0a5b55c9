//! The operator's egress policy: which hosts connectors may reach, and the
//! operator overrides for tests and staging (pinned addresses, extra
//! trusted roots). Parsing lives here; enforcement in `egress`.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::ConfigError;

/// A host name pattern: an exact name, `*.suffix` (any name ending in
/// `.suffix`, not `suffix` itself), or `*` (any name; only meaningful in a
/// connector's declaration, where it defers to the operator's policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Exact(String),
    /// Holds the suffix with its leading dot, e.g. `.mailcoach.app`.
    Suffix(String),
    Any,
}

impl HostPattern {
    /// Parses a pattern; names are compared in lower case, labels must be
    /// letters, digits and hyphens.
    pub fn parse(raw: &str) -> Result<HostPattern, String> {
        let s = raw.trim().to_ascii_lowercase();
        if s == "*" {
            return Ok(HostPattern::Any);
        }
        let (suffix, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, s.clone()),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
            && name.parse::<std::net::IpAddr>().is_err();
        if !valid {
            return Err(format!("'{raw}' is not a host name or *.suffix pattern"));
        }
        Ok(if suffix { HostPattern::Suffix(format!(".{name}")) } else { HostPattern::Exact(name) })
    }

    /// Whether `host` (lower case, no trailing dot) matches. Labels are
    /// compared whole: `*.example.com` matches `a.example.com` but not
    /// `badexample.com` or `example.com`.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Suffix(s) => write!(f, "*{s}"),
        }
    }
}

/// What the operator allows, and how requests are made.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// Hosts connectors may reach at all (`SERVICE_EGRESS_ALLOWED_HOSTS`).
    /// `*` is not accepted here: the operator names what is allowed.
    pub allowed_hosts: Vec<HostPattern>,
    /// Hosts reverse-ETL webhooks may post to
    /// (`SERVICE_WEBHOOK_ALLOWED_HOSTS`): a list of their own, so that the
    /// providers connectors reach (a SaaS domain with many tenants) are
    /// not open to rows any editor chooses to send. Empty by default.
    pub webhook_hosts: Vec<HostPattern>,
    /// Names pinned to addresses (`SERVICE_EGRESS_RESOLVE`, like curl's
    /// `--resolve`): the operator vouches for them, so they skip the
    /// global-address rule. For tests and staging.
    pub pinned: HashMap<String, Vec<SocketAddr>>,
    /// Extra trusted root certificates (`SERVICE_EGRESS_EXTRA_ROOTS`).
    pub extra_roots: Vec<reqwest::Certificate>,
    /// Largest response body handed to a plugin.
    pub max_response_bytes: usize,
    /// Timeout when the plugin names none.
    pub default_timeout_ms: u32,
    /// Upper bound of any request's timeout.
    pub max_timeout_ms: u32,
}

/// Hosts allowed when the operator configures none: the cloud domain of the
/// bundled email-campaign connector and the API host of the bundled
/// social-media source.
pub(crate) const DEFAULT_ALLOWED_HOSTS: &str = "*.mailcoach.app,api.hubapi.com";

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allowed_hosts: DEFAULT_ALLOWED_HOSTS.split(',').filter_map(|p| HostPattern::parse(p).ok()).collect(),
            webhook_hosts: Vec::new(),
            pinned: HashMap::new(),
            extra_roots: Vec::new(),
            max_response_bytes: 16 * 1024 * 1024,
            default_timeout_ms: 30_000,
            max_timeout_ms: 120_000,
        }
    }
}

impl EgressPolicy {
    /// Parses the operator's settings (comma-separated lists).
    pub fn from_settings(
        allowed: &str,
        resolve: Option<&str>,
        extra_roots_pem: Option<&[u8]>,
    ) -> Result<Self, ConfigError> {
        let mut policy = EgressPolicy {
            allowed_hosts: host_list("SERVICE_EGRESS_ALLOWED_HOSTS", allowed)?,
            ..EgressPolicy::default()
        };
        for entry in resolve.unwrap_or("").split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (host, addr) = entry
                .split_once('=')
                .ok_or_else(|| ConfigError::new("SERVICE_EGRESS_RESOLVE", format!("'{entry}' is not host=ip:port")))?;
            let addr: SocketAddr = addr
                .trim()
                .parse()
                .map_err(|_| ConfigError::new("SERVICE_EGRESS_RESOLVE", format!("'{addr}' is not ip:port")))?;
            let host = match HostPattern::parse(host).map_err(|e| ConfigError::new("SERVICE_EGRESS_RESOLVE", e))? {
                HostPattern::Exact(h) => h,
                _ => return Err(ConfigError::new("SERVICE_EGRESS_RESOLVE", "pins name exact hosts, not patterns")),
            };
            policy.pinned.entry(host).or_default().push(addr);
        }
        if let Some(pem) = extra_roots_pem {
            policy.extra_roots = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                ConfigError::new("SERVICE_EGRESS_EXTRA_ROOTS", format!("not a PEM certificate bundle: {e}"))
            })?;
            if policy.extra_roots.is_empty() {
                return Err(ConfigError::new("SERVICE_EGRESS_EXTRA_ROOTS", "no certificate in the file"));
            }
        }
        Ok(policy)
    }

    /// The policy with the hosts webhooks may post to
    /// (`SERVICE_WEBHOOK_ALLOWED_HOSTS`, comma-separated).
    pub fn with_webhook_hosts(mut self, raw: &str) -> Result<Self, ConfigError> {
        self.webhook_hosts = host_list("SERVICE_WEBHOOK_ALLOWED_HOSTS", raw)?;
        Ok(self)
    }
}

/// A comma-separated list of exact hosts and `*.suffix` patterns (never
/// `*`) from the setting `setting`.
fn host_list(setting: &'static str, raw: &str) -> Result<Vec<HostPattern>, ConfigError> {
    let mut hosts = Vec::new();
    for p in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let pattern = HostPattern::parse(p).map_err(|e| ConfigError::new(setting, e))?;
        if pattern == HostPattern::Any {
            return Err(ConfigError::new(setting, "'*' is not allowed: list the hosts or *.suffix patterns to allow"));
        }
        hosts.push(pattern);
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_patterns_match_whole_labels_only() {
        let p = HostPattern::parse("*.mailcoach.app").unwrap();
        assert!(p.matches("team.mailcoach.app"));
        assert!(p.matches("a.b.mailcoach.app"));
        assert!(!p.matches("mailcoach.app"));
        assert!(!p.matches("evilmailcoach.app"));
        assert!(!p.matches("team.mailcoach.app.evil.com"));
        let e = HostPattern::parse("API.Example.com").unwrap();
        assert!(e.matches("api.example.com"));
        assert!(!e.matches("xapi.example.com"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["", "*.", "exa mple.com", "127.0.0.1", "-a.com", "a..b", "*.*.com", "http://x.com", "x.com:443"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
        assert!(EgressPolicy::from_settings("*", None, None).is_err());
        assert!(EgressPolicy::from_settings("a.com", Some("a.com=nope"), None).is_err());
        let p = EgressPolicy::from_settings("a.com, *.b.com", Some("a.com=127.0.0.1:8443"), None).unwrap();
        assert_eq!(p.allowed_hosts.len(), 2);
        assert_eq!(p.pinned["a.com"], vec!["127.0.0.1:8443".parse::<SocketAddr>().unwrap()]);
    }
}
