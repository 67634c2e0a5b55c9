//! Signatures per the Standard Webhooks specification: a secret of random
//! bytes, shown to the client once as `whsec_` and its base64; each
//! message signed with HMAC-SHA256 over `id.timestamp.body`, sent as
//! `v1,<base64>` in `webhook-signature` (several, space-separated, while a
//! rotated-out secret still signs).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox, SecretString};
use sha2::Sha256;

/// The prefix of a secret as clients see it.
const PREFIX: &str = "whsec_";

/// Random bytes in a new secret (the specification asks for 24 to 64).
const SECRET_BYTES: usize = 32;

/// A signing secret's bytes; never printed.
pub(crate) struct SigningSecret(SecretBox<Vec<u8>>);

impl SigningSecret {
    /// A new random secret.
    pub(crate) fn generate() -> SigningSecret {
        let mut bytes = vec![0u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        SigningSecret(SecretBox::new(Box::new(bytes)))
    }

    /// The secret from its bytes (as unsealed).
    pub(crate) fn from_bytes(bytes: &[u8]) -> SigningSecret {
        SigningSecret(SecretBox::new(Box::new(bytes.to_vec())))
    }

    /// Its bytes, to be sealed.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.expose_secret()
    }

    /// The form shown to the client, once: `whsec_<base64>`.
    pub(crate) fn shown(&self) -> SecretString {
        SecretString::from(format!("{PREFIX}{}", STANDARD.encode(self.0.expose_secret())))
    }

    /// The signature of one message: `v1,<base64 of HMAC-SHA256>`.
    pub(crate) fn sign(&self, message_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret()).expect("HMAC takes any key length");
        mac.update(message_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret([redacted])")
    }
}

/// The `webhook-signature` value of a message: one signature per secret
/// that signs, the current one first.
pub(crate) fn signature_header(secrets: &[SigningSecret], message_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets.iter().map(|s| s.sign(message_id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries: this secret, id, timestamp and body sign to this value.
    #[test]
    fn signs_as_the_specification_does() {
        let key = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let secret = SigningSecret::from_bytes(&key);
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(secret.shown().expose_secret(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert!(!format!("{secret:?}").contains("MfKQ"));
    }

    #[test]
    fn a_rotation_signs_with_both_secrets() {
        let (a, b) = (SigningSecret::generate(), SigningSecret::generate());
        let header = signature_header(&[a, b], "msg_1", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")) && parts[0] != parts[1]);
    }
}
