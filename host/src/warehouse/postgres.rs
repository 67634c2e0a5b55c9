//! Where a PostgreSQL destination may connect, and how.
//!
//! A destination's URL is a tenant's input, and the connection is made by
//! the host, from inside the operator's network, possibly with a stored
//! password. So the URL is not handed to the driver: it is taken apart into
//! host, port, database, user and a TLS mode, anything else is refused
//! (`host=`, `hostaddr=`, `options=`, `sslkey=`, a socket path, a password
//! parameter ...), and the connection options are built from those parts
//! alone, without the server's own `PG*` environment or `~/.pgpass`.
//!
//! The address policy is the egress's one ([`Reach::Warehouses`](crate::egress::Reach::Warehouses)): a host
//! must be one the operator allows ([`WarehousePolicy`]), and every
//! address it resolves to must be a global one unless the operator named
//! the address or its network. A connection that sends a password verifies the
//! server's certificate and name (`verify-full`).

use std::borrow::Cow;
use std::net::IpAddr;

use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use url::Url;

use serde_json::{Map, Value};

use super::config::{Place, Revealed};
use super::shape::Row;
use super::tables::Db;
use super::{DestinationConfig, METADATA_COLUMNS, WriteError, failed};
use crate::config::egress::HostPattern;
pub use crate::config::warehouse::WarehousePolicy;
use crate::egress::reach::{Rules, Unreachable, allowed_addresses};
use crate::error::ApiError;

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

    fn driver(self) -> PgSslMode {
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
pub fn plain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.$".contains(c))
}

/// Takes a destination URL apart; the error says which part is wrong.
/// `with_password`: a credential's secret will be sent, so only
/// `verify-full` is accepted (and is the default).
pub fn parse(url: &Url, with_password: bool) -> Result<Target, String> {
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
    let credential_handle = super::config::optional_handle(obj)?;
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

/// Why a destination's database is not connected to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotConnected {
    /// The address policy refused its host ([`Reach::Warehouses`](crate::egress::Reach::Warehouses)).
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error("the server's environment sets PGOPTIONS; refusing to pass it to a destination")]
    EnvironmentOptions,
}

impl NotConnected {
    /// The refusal as a write's error (see [`super::unreachable`]).
    pub(crate) fn write_error(self, context: &str) -> WriteError {
        match self {
            NotConnected::Unreachable(e) => super::unreachable(e, context),
            NotConnected::EnvironmentOptions => {
                WriteError::Refused(if context.is_empty() { self.to_string() } else { format!("{context}: {self}") })
            }
        }
    }
}

/// Resolves and checks the target's host and builds the driver's options
/// from the target's parts alone.
///
/// Without a password the connection goes to the address that was checked,
/// so a second DNS answer cannot rebind it. With one it goes to the name,
/// because `verify-full` checks the certificate against the name; a
/// rebound name then meets a server that cannot prove it, and the
/// password is never sent.
pub(crate) async fn connect_options(
    target: &Target,
    password: Option<&SecretString>,
    policy: &WarehousePolicy,
) -> Result<PgConnectOptions, NotConnected> {
    let addresses = allowed_addresses(&Rules::warehouses(policy), &target.host, target.port).await?;
    let host = if password.is_some() { target.host.clone() } else { addresses[0].ip().to_string() };
    // Every part is set here, so nothing comes from the environment; an
    // empty password keeps the driver from looking one up in a pgpass file.
    let options = PgConnectOptions::new_without_pgpass()
        .host(&host)
        .port(target.port)
        .username(&target.user)
        .database(&target.database)
        .password(password.map(|p| p.expose_secret()).unwrap_or(""))
        .ssl_mode(target.tls.driver())
        .application_name("service");
    if options.get_options().is_some() {
        return Err(NotConnected::EnvironmentOptions);
    }
    Ok(options)
}

/// Connections a job keeps to a PostgreSQL destination: batches of one
/// stream load over both at once.
pub(super) const POSTGRES_CONNECTIONS: u32 = 2;

/// Appends one field of a `COPY ... (FORMAT binary)` row: its length and
/// its bytes, or length -1 for NULL. Binary rather than text: the server
/// takes each value as it comes instead of scanning every byte twice for
/// line ends, delimiters and escapes, which was most of its CPU time per
/// row (about 1 KB each). A NUL character is refused: PostgreSQL text
/// cannot hold one, and retrying would fail the same way.
pub(super) fn copy_field(out: &mut Vec<u8>, value: Option<&str>) -> Result<(), WriteError> {
    let Some(value) = value.map(str::as_bytes) else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return Ok(());
    };
    if memchr::memchr(0, value).is_some() {
        return Err(WriteError::BadRecord(
            "a record holds a NUL character (\\u0000), which PostgreSQL text cannot store".into(),
        ));
    }
    let len = i32::try_from(value.len())
        .map_err(|_| WriteError::BadRecord("a value is larger than PostgreSQL allows".into()))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The signature, flags and header extension length that open binary
/// `COPY` data.
pub(super) const COPY_BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Rows in `COPY ... (FORMAT binary)` form, for the columns `names`: the
/// key, the extraction time (`BIGINT`), the metadata, then the fields (all
/// `TEXT`).
pub(super) fn copy_data(names: &[String], rows: &[Row<'_>], now: i64, meta: &str) -> Result<Vec<u8>, WriteError> {
    let count = i16::try_from(names.len())
        .map_err(|_| WriteError::BadRecord("a record has more fields than a PostgreSQL table can hold".into()))?;
    let size = |v: &Option<Cow<'_, str>>| 4 + v.as_ref().map_or(0, |c| c.len());
    let mut data = Vec::with_capacity(
        COPY_BINARY_HEADER.len()
            + 2
            + rows
                .iter()
                .map(|(id, v)| 2 + 4 + id.len() + 12 + 4 + meta.len() + v.iter().map(size).sum::<usize>())
                .sum::<usize>(),
    );
    data.extend_from_slice(COPY_BINARY_HEADER);
    for (raw_id, values) in rows {
        data.extend_from_slice(&count.to_be_bytes());
        copy_field(&mut data, Some(raw_id))?;
        data.extend_from_slice(&8i32.to_be_bytes());
        data.extend_from_slice(&now.to_be_bytes());
        copy_field(&mut data, Some(meta))?;
        for j in 0..names.len() - METADATA_COLUMNS.len() {
            copy_field(&mut data, values.get(j).and_then(|v| v.as_deref()))?;
        }
    }
    // The trailer: a row of -1 fields.
    data.extend_from_slice(&(-1i16).to_be_bytes());
    Ok(data)
}

/// `COPY` data in one format or the other.
pub(super) enum CopyData {
    Binary(Vec<u8>),
    Text(Vec<u8>),
}

/// Rewrites binary `COPY` data made by [`copy_data`] in `COPY ... (FORMAT
/// text)` form: tab-separated, `\N` for NULL, with backslash, tab, newline
/// and carriage return escaped, and the extraction time (the second field)
/// as a decimal number.
pub(super) fn copy_text_from_binary(data: &[u8]) -> Result<Vec<u8>, WriteError> {
    let corrupt = || WriteError::Destination("the prepared batch is corrupt".into());
    let mut at = COPY_BINARY_HEADER.len();
    let mut take = |n: usize| -> Result<&[u8], WriteError> {
        let bytes: &[u8] = data.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(bytes)
    };
    let mut out = Vec::with_capacity(data.len());
    loop {
        let fields = i16::from_be_bytes(take(2)?.try_into().map_err(|_| corrupt())?);
        if fields < 0 {
            return Ok(out);
        }
        for i in 0..fields {
            if i > 0 {
                out.push(b'\t');
            }
            let len = i32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt())?);
            let Ok(len) = usize::try_from(len) else {
                out.extend_from_slice(b"\\N");
                continue;
            };
            let value = take(len)?;
            if i == 1 {
                let ms = i64::from_be_bytes(value.try_into().map_err(|_| corrupt())?);
                out.extend_from_slice(ms.to_string().as_bytes());
                continue;
            }
            let mut copied = 0;
            for (j, b) in value.iter().enumerate() {
                let escaped: &[u8] = match b {
                    b'\\' => b"\\\\",
                    b'\t' => b"\\t",
                    b'\n' => b"\\n",
                    b'\r' => b"\\r",
                    _ => continue,
                };
                out.extend_from_slice(&value[copied..j]);
                out.extend_from_slice(escaped);
                copied = j + 1;
            }
            out.extend_from_slice(&value[copied..]);
        }
        out.push(b'\n');
    }
}

/// One PostgreSQL transaction: `COPY` the rows in, into a staging table
/// first when they must upsert.
pub(super) async fn copy_rows(
    pool: &sqlx::PgPool,
    target: &str,
    names: &[String],
    upsert: Option<&str>,
    data: CopyData,
) -> Result<(), sqlx::Error> {
    let columns = names.join(", ");
    let mut tx = pool.begin().await?;
    let into = match upsert {
        Some(_) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE TEMP TABLE \"_service_staging\" (LIKE {target}) ON COMMIT DROP"
            )))
            .execute(&mut *tx)
            .await?;
            "\"_service_staging\"".to_owned()
        }
        None => target.to_owned(),
    };
    let (format, data) = match data {
        CopyData::Binary(data) => ("binary", data),
        CopyData::Text(data) => ("text", data),
    };
    let mut copy = tx.copy_in_raw(&format!("COPY {into} ({columns}) FROM STDIN (FORMAT {format})")).await?;
    copy.send(data).await?;
    copy.finish().await?;
    if let Some(upsert) = upsert {
        let sql = format!("INSERT INTO {target} ({columns}) SELECT {columns} FROM \"_service_staging\"{upsert}");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Connects to the PostgreSQL destination `target` for one job, as the
/// address policy allows, with its password if it has one.
pub(crate) async fn open(target: &Target, revealed: Option<Revealed>, place: &Place<'_>) -> Result<Db, WriteError> {
    let password = revealed.and_then(Revealed::into_password);
    let options = connect_options(target, password.as_ref(), place.warehouses).await.map_err(|e| e.write_error(""))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POSTGRES_CONNECTIONS)
        .connect_with(options)
        .await
        .map_err(|e| {
        failed(&format!("cannot connect to the PostgreSQL destination {}:{}", target.host, target.port), e)
    })?;
    Ok(Db::Postgres(pool))
}

/// Writes a batch with `COPY` (binary, or text into columns someone gave
/// another type: JSONB, say, takes text, which the server converts, and
/// binary it would refuse), finishing with `upsert` when keys may exist.
pub(crate) async fn apply(
    pool: &sqlx::PgPool,
    table: &str,
    names: &[String],
    upsert: Option<&str>,
    data: Vec<u8>,
    binary: bool,
) -> Result<(), WriteError> {
    let data = if binary { CopyData::Binary(data) } else { CopyData::Text(copy_text_from_binary(&data)?) };
    copy_rows(pool, &super::quote(table), names, upsert, data)
        .await
        .map_err(|e| WriteError::Destination(format!("cannot write to {table}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warehouse::quote;

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

    #[test]
    fn copy_rows_are_length_prefixed_fields_between_a_header_and_a_trailer() {
        let names: Vec<String> =
            ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b"].iter().map(|n| quote(n)).collect();
        let rows: Vec<Row> = vec![("k".into(), vec![Some("a\tb\\".into()), None])];
        let data = copy_data(&names, &rows, 258, "{}").unwrap();
        let mut expected = b"PGCOPY\n\xff\r\n\0".to_vec();
        expected.extend_from_slice(&[0; 8]); // no flags, no header extension
        expected.extend_from_slice(&[0, 5]); // five fields
        expected.extend_from_slice(&[0, 0, 0, 1, b'k']);
        expected.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 2]); // BIGINT 258
        expected.extend_from_slice(&[0, 0, 0, 2, b'{', b'}']);
        expected.extend_from_slice(&[0, 0, 0, 4, b'a', b'\t', b'b', b'\\']); // as it is, nothing escaped
        expected.extend_from_slice(&[0xff; 4]); // NULL
        expected.extend_from_slice(&[0xff; 2]); // the trailer
        assert_eq!(data, expected);
    }

    #[test]
    fn binary_copy_rows_convert_to_the_text_format_for_typed_columns() {
        let names: Vec<String> = ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b", "c"]
            .iter()
            .map(|n| quote(n))
            .collect();
        let rows: Vec<Row> = vec![
            (
                "k1".into(),
                vec![Some("tab\there, newline\n, cr\r, backslash\\".into()), None, Some(r#"{"n":1}"#.into())],
            ),
            ("k2".into(), vec![Some("plain".into())]),
        ];
        let text = copy_text_from_binary(&copy_data(&names, &rows, 1_700_000_000_123, "{}").unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "k1\t1700000000123\t{}\ttab\\there, newline\\n, cr\\r, backslash\\\\\t\\N\t{\"n\":1}\n\
             k2\t1700000000123\t{}\tplain\t\\N\t\\N\n"
        );
        assert!(
            copy_text_from_binary(&copy_data(&names, &rows, 0, "{}").unwrap()[..40]).is_err(),
            "cut short: refused, not misread"
        );
    }
}
