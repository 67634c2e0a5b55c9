//! The server's own PostgreSQL environment (`PG*` variables), moved into
//! the control database's URL at start so the driver never applies it to
//! a tenant's destination.

use url::Url;

use super::ConfigError;

/// libpq's environment variables, which the PostgreSQL driver reads for
/// every connection it opens, and the URL parameter each is for the
/// control database.
const POSTGRES_ENVIRONMENT: &[(&str, &str)] = &[
    ("PGHOSTADDR", "host"),
    ("PGHOST", "host"),
    ("PGPORT", "port"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGDATABASE", "dbname"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGSSLCERT", "sslcert"),
    ("PGSSLKEY", "sslkey"),
    ("PGAPPNAME", "application_name"),
    ("PGOPTIONS", "options"),
];

/// Takes the server's own PostgreSQL settings out of the environment. The
/// driver would otherwise apply them to every connection it opens, tenants'
/// destinations included (a destination without a password would be sent
/// `PGPASSWORD`, with the operator's client certificate). They are meant
/// for the control database, so they move into its URL (as defaults for
/// what the URL does not say) and nowhere else.
///
/// Must run before any other thread exists: it changes the environment.
pub fn isolate_postgres_environment(database_url: Option<&mut String>) -> Result<(), ConfigError> {
    let found: Vec<(&str, &str, String)> = POSTGRES_ENVIRONMENT
        .iter()
        .filter_map(|(var, param)| std::env::var(var).ok().map(|v| (*var, *param, v)))
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    if let Some(url) = database_url
        && (url.starts_with("postgres:") || url.starts_with("postgresql:"))
    {
        *url = fold_postgres_environment(url, &found)?;
    }
    for (var, _, _) in &found {
        // SAFETY: called from `main` before the runtime or any other thread
        // starts, so nothing reads the environment concurrently.
        unsafe { std::env::remove_var(var) };
    }
    Ok(())
}

/// The control database's URL with the environment's settings added where
/// the URL is silent (the environment never overrides the URL).
fn fold_postgres_environment(raw: &str, found: &[(&str, &str, String)]) -> Result<String, ConfigError> {
    let mut url = Url::parse(raw).map_err(|e| ConfigError::new("DATABASE_URL", format!("not a URL: {e}")))?;
    let given: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
    let mut added: Vec<(&str, String)> = Vec::new();
    for (_, param, value) in found {
        let silent = !given.iter().any(|k| k == param)
            && !added.iter().any(|(k, _)| k == param)
            && match *param {
                "host" => url.host_str().is_none_or(str::is_empty),
                "port" => url.port().is_none(),
                "user" => url.username().is_empty(),
                "password" => url.password().is_none(),
                "dbname" => url.path().trim_start_matches('/').is_empty(),
                _ => true,
            };
        if silent {
            added.push((param, value.clone()));
        }
    }
    if !added.is_empty() {
        url.query_pairs_mut().extend_pairs(added);
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_fills_in_only_what_the_control_database_url_leaves_out() {
        let found = vec![
            ("PGHOST", "host", "db.internal".to_owned()),
            ("PGPASSWORD", "password", "from-env".to_owned()),
            ("PGUSER", "user", "envuser".to_owned()),
            ("PGSSLMODE", "sslmode", "require".to_owned()),
        ];
        let url = fold_postgres_environment("postgres://alice@control.example.com/service", &found).unwrap();
        let parsed = Url::parse(&url).unwrap();
        let params: Vec<(String, String)> =
            parsed.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        assert_eq!(parsed.host_str(), Some("control.example.com"), "the URL's host stays");
        assert_eq!(parsed.username(), "alice", "the URL's user stays");
        assert!(params.contains(&("password".into(), "from-env".into())));
        assert!(params.contains(&("sslmode".into(), "require".into())));
        assert!(!params.iter().any(|(k, _)| k == "host" || k == "user"));
        let bare = fold_postgres_environment("postgres:///service?sslmode=disable", &found).unwrap();
        let params: Vec<(String, String)> =
            Url::parse(&bare).unwrap().query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        assert!(params.contains(&("host".into(), "db.internal".into())));
        assert!(params.contains(&("user".into(), "envuser".into())));
        assert_eq!(params.iter().filter(|(k, _)| k == "sslmode").count(), 1, "the URL's own sslmode wins");
    }
}
