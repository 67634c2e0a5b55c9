//! What the benchmarks of several servers share: `service serve`
//! processes, the installation they make up, and a PostgreSQL database of
//! their own to share.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::Connection;

/// A `service serve` process on a port of its own, killed (as with
/// `kill -9`) when dropped.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    /// Starts one with `env` (and nothing else from this environment but
    /// `PATH`), once it answers `/healthz`.
    pub async fn start(env: &[(&str, String)]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_service"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("SERVICE_BIND", format!("127.0.0.1:{port}"))
            .env("SERVICE_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the service binary");
        let base = format!("http://127.0.0.1:{port}");
        for _ in 0..600 {
            if reqwest::get(format!("{base}/healthz")).await.is_ok_and(|r| r.status().is_success()) {
                return Server { child, base };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the server did not answer within 30 s");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The settings every server of one installation starts with: a private
/// data directory, the shared database, the bootstrap token, and egress
/// to the fake provider's one host (its CA trusted, its address pinned),
/// with [`Installation::with`] adding the bench's own. The directory
/// lives as long as the installation.
pub struct Installation {
    _dir: tempfile::TempDir,
    pub env: Vec<(&'static str, String)>,
}

impl Installation {
    pub fn new(database_url: &str, token: &str, host: &str, pins: String, ca_pem: &str) -> Installation {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, ca_pem).unwrap();
        let env = vec![
            ("SERVICE_DATA_DIR", dir.path().join("data").display().to_string()),
            ("DATABASE_URL", database_url.to_owned()),
            ("SERVICE_BOOTSTRAP_TOKEN", token.to_owned()),
            ("SERVICE_EGRESS_ALLOWED_HOSTS", host.to_owned()),
            ("SERVICE_EGRESS_RESOLVE", pins),
            ("SERVICE_EGRESS_EXTRA_ROOTS", roots.display().to_string()),
        ];
        Installation { _dir: dir, env }
    }

    /// One more setting.
    pub fn with(mut self, name: &'static str, value: impl ToString) -> Installation {
        self.env.push((name, value.to_string()));
        self
    }
}

/// A database of its own on the PostgreSQL server `BENCH_POSTGRES_URL`
/// names (default `postgres://postgres@127.0.0.1:5432/postgres`), named
/// after the benchmark; [`Scratch::drop_now`] drops it.
pub struct Scratch {
    admin: sqlx::PgConnection,
    name: String,
    pub url: String,
}

impl Scratch {
    pub async fn create(bench: &str) -> Scratch {
        let admin_url = std::env::var("BENCH_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let name = format!("bench_{bench}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.expect("PostgreSQL (BENCH_POSTGRES_URL)");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut admin).await.unwrap();
        let url = match admin_url.rfind('/') {
            Some(i) => format!("{}/{name}", &admin_url[..i]),
            None => panic!("BENCH_POSTGRES_URL names no database"),
        };
        Scratch { admin, name, url }
    }

    /// Drops the database, whoever is still connected.
    pub async fn drop_now(mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut self.admin).await;
    }
}
