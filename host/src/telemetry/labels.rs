//! What `/metrics` labels say about tenants.
//!
//! `/metrics` may be scraped by whoever reaches it, so by default a tenant
//! appears only as a keyed digest: a workspace as `w_` and 16 hex digits,
//! a stream as `s_` and 16 (of its pipeline and name), stable for the
//! installation and unguessable without its master key. An operator who
//! wants names in the clear says so (`SERVICE_METRICS_LABELS=clear`),
//! ideally with `SERVICE_METRICS_TOKEN` set. Pipeline ids stay as they
//! are: random ids, not names.

use secrecy::{ExposeSecret, SecretBox};

pub(crate) use crate::config::MetricLabelMode;

/// Turns tenants' ids and names into `/metrics` labels.
pub struct MetricLabels {
    mode: MetricLabelMode,
    key: SecretBox<[u8; 32]>,
}

impl MetricLabels {
    /// Labels in `mode`, digests keyed with `key`.
    pub fn new(mode: MetricLabelMode, key: SecretBox<[u8; 32]>) -> Self {
        MetricLabels { mode, key }
    }

    /// The label of workspace `id`.
    pub fn workspace(&self, id: &str) -> String {
        self.label("w", &[id])
    }

    /// The label of stream `name` of `pipeline`.
    pub fn stream(&self, pipeline: &str, name: &str) -> String {
        self.label("s", &[pipeline, name])
    }

    fn label(&self, kind: &str, parts: &[&str]) -> String {
        match self.mode {
            MetricLabelMode::Clear => parts.last().copied().unwrap_or_default().to_owned(),
            MetricLabelMode::Opaque => {
                use hmac::{Hmac, Mac};
                let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(self.key.expose_secret())
                    .expect("HMAC takes any key length");
                mac.update(kind.as_bytes());
                for p in parts {
                    mac.update(&(p.len() as u64).to_be_bytes());
                    mac.update(p.as_bytes());
                }
                let digest = mac.finalize().into_bytes();
                format!("{kind}_{}", hex::encode(&digest[..8]))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_labels_are_stable_distinct_and_keyed() {
        let a = MetricLabels::new(MetricLabelMode::Opaque, SecretBox::new(Box::new([1; 32])));
        let b = MetricLabels::new(MetricLabelMode::Opaque, SecretBox::new(Box::new([2; 32])));
        let w = a.workspace("ws_123");
        assert!(w.starts_with("w_") && w.len() == 18 && !w.contains("123"), "{w}");
        assert_eq!(w, a.workspace("ws_123"));
        assert_ne!(w, b.workspace("ws_123"), "another installation's key gives another label");
        assert_ne!(a.stream("p1", "contacts"), a.stream("p2", "contacts"));
        assert!(!a.stream("p1", "contacts").contains("contacts"));
        let clear = MetricLabels::new(MetricLabelMode::Clear, SecretBox::new(Box::new([1; 32])));
        assert_eq!((clear.workspace("ws_123"), clear.stream("p1", "contacts")), ("ws_123".into(), "contacts".into()));
    }
}
