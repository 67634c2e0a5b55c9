//! An S3-compatible store on loopback: moto's server (from PyPI), started
//! by `tests/python/moto_s3.py` with request authentication on, and an
//! HTTPS front for it, so the server reaches it as it reaches a store.

use std::path::Path;

use crate::provider::{TestCa, TlsFront};

/// moto's S3 serving one bucket, with the access key it issued for it.
pub struct MotoS3 {
    _child: tokio::process::Child,
    /// moto's own (plain HTTP) port.
    pub port: u16,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl MotoS3 {
    /// Starts `moto_s3.py` with `python` (which has
    /// `tests/python/requirements.txt` installed) for `bucket`.
    pub async fn start(python: &Path, bucket: &str) -> MotoS3 {
        let script = crate::plugins::repository().join("tests/python/moto_s3.py");
        let crate::python::Script { child, started, .. } =
            crate::python::Script::start(python, &script, &[bucket]).await;
        MotoS3 {
            _child: child,
            port: started["port"].as_u64().unwrap() as u16,
            access_key_id: started["access_key_id"].as_str().unwrap().to_owned(),
            secret_access_key: started["secret_access_key"].as_str().unwrap().to_owned(),
        }
    }

    /// An HTTPS front for moto with a certificate of `ca` for 127.0.0.1:
    /// the endpoint a destination names is `https://127.0.0.1:<its port>`.
    pub async fn https_front(&self, ca: &TestCa) -> TlsFront {
        TlsFront::start(ca, &["127.0.0.1"], ([127, 0, 0, 1], self.port).into()).await
    }

    /// What pyiceberg needs to read the bucket (straight from moto).
    pub fn reader_properties(&self) -> serde_json::Value {
        serde_json::json!({
            "s3.endpoint": format!("http://127.0.0.1:{}", self.port),
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.region": "us-east-1",
        })
    }
}
