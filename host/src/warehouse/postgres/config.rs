//! A PostgreSQL destination's configuration: the URL taken apart into host,
//! port, database, user and a TLS mode ([`Target`]), anything else refused.

use std::net::IpAddr;

use sqlx::postgres::PgSslMode;
use url::Url;

use serde_json::{Map, Value};

use crate::config::egress::HostPattern;
pub use crate::config::warehouse::WarehousePolicy;
use crate::error::ApiError;
use crate::warehouse::DestinationConfig;

/// How a connection uses TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl TlsMode {
    fn parse(raw: &str) -> Option<TlsMode> {
        Some(match raw {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            _ => return None,
        })
    }

    pub(super) fn driver(self) -> PgSslMode {
        match self {
            TlsMode::Disable => PgSslMode::Disable,
            TlsMode::Prefer => PgSslMode::Prefer,
            TlsMode::Require => PgSslMode::Require,
            TlsMode::VerifyCa => PgSslMode::VerifyCa,
            TlsMode::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

/// A destination database, taken apart from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// A host name or an IP address (without brackets).
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub tls: TlsMode,
}

/// Characters of the names a URL may carry (role, database).
pub(crate) fn plain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.$".contains(c))
}

/// Takes a destination URL apart; the error says which part is wrong.
/// `with_password`: a credential's secret will be sent, so only
/// `verify-full` is accepted (and is the default).
pub(crate) fn parse(url: &Url, with_password: bool) -> Result<Target, String> {
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err("url must be a postgres:// URL".into());
    }
    if url.fragment().is_some() {
        return Err("url must not have a fragment".into());
    }
    let host = url.host_str().filter(|h| !h.is_empty()).ok_or("url must name a host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    if host.parse::<IpAddr>().is_err() && !matches!(HostPattern::parse(&host), Ok(HostPattern::Exact(_))) {
        return Err("the host must be a host name or an IP address (no socket paths or encodings)".into());
    }
    let user = url.username();
    if !plain(user) {
        return Err("url must name a user (letters, digits, _ - . $)".into());
    }
    let database = url.path().strip_prefix('/').unwrap_or_default();
    if !plain(database) {
        return Err("url must name one database as its path (letters, digits, _ - . $)".into());
    }
    let mut tls = None;
    for (key, value) in url.query_pairs() {
        match &*key {
            "sslmode" if tls.is_none() => {
                tls = Some(
                    TlsMode::parse(&value)
                        .ok_or("sslmode must be disable, prefer, require, verify-ca or verify-full")?,
                );
            }
            other => return Err(format!("the URL parameter '{other}' is not accepted; only sslmode is")),
        }
    }
    let tls = match (tls, with_password) {
        (None, true) | (Some(TlsMode::VerifyFull), true) => TlsMode::VerifyFull,
        (Some(_), true) => return Err("a password is sent only over TLS that verifies the server: use sslmode=verify-full (the default with a credential)".into()),
        (None, false) => TlsMode::Prefer,
        (Some(mode), false) => mode,
    };
    Ok(Target { host, port: url.port().unwrap_or(5432), database: database.to_owned(), user: user.to_owned(), tls })
}

/// The fields a PostgreSQL destination takes.
pub(crate) const FIELDS: &[&str] = &["url", "credential_handle", "model_role"];

/// A PostgreSQL destination's configuration, checked: a `postgres://`
/// URL without a password (that is a credential's), the credential by
/// handle, and the role models run as.
pub(crate) fn config(obj: &Map<String, Value>) -> Result<DestinationConfig, ApiError> {
    let raw = obj
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_field("configuration.url", "url is required"))?;
    let url = url::Url::parse(raw)
        .map_err(|_| ApiError::invalid_field("configuration.url", "url must be a postgres:// URL"))?;
    if url.password().is_some() {
        return Err(ApiError::secret_refused("configuration.url"));
    }
    let credential_handle = crate::warehouse::config::optional_handle(obj)?;
    let target =
        parse(&url, credential_handle.is_some()).map_err(|m| ApiError::invalid_field("configuration.url", m))?;
    let model_role = match obj.get("model_role") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if plain(r) => Some(r.clone()),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "configuration.model_role",
                "model_role must be a role name (letters, digits, _ - . $)",
            ));
        }
    };
    Ok(DestinationConfig::Postgres { target, credential_handle, model_role })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn only_host_port_database_user_and_a_tls_mode_are_taken() {
        let t = parse(&url("postgres://loader@db.example.com:6543/warehouse?sslmode=require"), false).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.database.as_str(), t.user.as_str(), t.tls),
            ("db.example.com", 6543, "warehouse", "loader", TlsMode::Require)
        );
        for bad in [
            "postgres://loader@db.example.com/w?host=/var/run/postgresql",
            "postgres://loader@db.example.com/w?hostaddr=10.0.0.1",
            "postgres://loader@db.example.com/w?password=x",
            "postgres://loader@db.example.com/w?options=-c%20search_path%3Devil",
            "postgres://loader@db.example.com/w?sslkey=/etc/ssl/private/server.key",
            "postgres://loader@db.example.com/w?port=5433",
            "postgres://loader@%2Fvar%2Frun%2Fpostgresql/w",
            "postgres://db.example.com/w",
            "postgres://loader@db.example.com/",
            "postgres://loader@db.example.com/a/b",
            "postgres://loader@db.example.com/w#x",
            "mysql://loader@db.example.com/w",
        ] {
            assert!(parse(&url(bad), false).is_err(), "{bad}");
        }
        assert_eq!(parse(&url("postgres://u@[::1]/w"), false).unwrap().host, "::1");
    }

    #[test]
    fn a_password_travels_only_over_verified_tls() {
        assert_eq!(parse(&url("postgres://u@db.example.com/w"), true).unwrap().tls, TlsMode::VerifyFull);
        for mode in ["disable", "prefer", "require", "verify-ca"] {
            assert!(parse(&url(&format!("postgres://u@db.example.com/w?sslmode={mode}")), true).is_err(), "{mode}");
        }
        assert_eq!(parse(&url("postgres://u@db.example.com/w"), false).unwrap().tls, TlsMode::Prefer);
    }

    #[test]
    fn the_policy_allows_listed_names_and_networks_only() {
        let p = WarehousePolicy::from_settings("db.example.com, *.rds.example.net, 10.0.0.0/8, 127.0.0.1").unwrap();
        assert!(p.allows_name("db.example.com"));
        assert!(p.allows_name("a.rds.example.net"));
        assert!(!p.allows_name("rds.example.net"));
        assert!(!p.allows_name("evil.example.com"));
        assert!(p.allows_name("127.0.0.1"));
        assert!(p.allows_name("10.1.2.3"));
        assert!(!p.allows_name("127.0.0.2"));
        assert!(!p.allows_name("169.254.169.254"));
        assert!(WarehousePolicy::from_settings("*").is_err());
        assert!(WarehousePolicy::from_settings("10.0.0.0/33").is_err());
        assert!(!WarehousePolicy::default().allows_name("db.example.com"), "nothing by default");
    }
}
