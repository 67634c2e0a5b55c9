//! Opaque bearer tokens and single-use codes.
//!
//! Tokens are 256 random bits, base64url-encoded behind a readable prefix
//! (`svc_` for session and API tokens) so leaked tokens are easy to spot and
//! scan for. Only a SHA-256 hash is stored: tokens carry enough entropy that a
//! slow password hash would add cost without adding safety.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// Prefix of session and API tokens.
pub(crate) const TOKEN_PREFIX: &str = "svc_";
/// Prefix of one-time login codes and invitation tokens.
pub(crate) const CODE_PREFIX: &str = "svc1_";

/// A fresh random secret with `prefix`.
pub(crate) fn generate(prefix: &str) -> SecretString {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    SecretString::from(format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// The stored form of a token: lowercase hex SHA-256.
pub fn hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Hash of a secret token without exposing it anywhere else.
pub(crate) fn hash_secret(token: &SecretString) -> String {
    hash(token.expose_secret())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_unique_and_hash_stably() {
        let a = generate(TOKEN_PREFIX);
        let b = generate(TOKEN_PREFIX);
        assert!(a.expose_secret().starts_with(TOKEN_PREFIX));
        assert_ne!(a.expose_secret(), b.expose_secret());
        assert_eq!(hash_secret(&a), hash(a.expose_secret()));
        assert_eq!(hash_secret(&a).len(), 64);
        // The Debug form of a secret never shows it.
        assert!(!format!("{a:?}").contains(&a.expose_secret()[4..]));
    }
}
