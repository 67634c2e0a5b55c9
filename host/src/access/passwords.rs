//! Account passwords for web sign-in: Argon2id with OWASP's parameters
//! (19 MiB, two passes), stored as PHC text, hashed and checked off the
//! async threads.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use secrecy::{ExposeSecret, SecretString};

/// The shortest password accepted, in characters.
pub(crate) const MIN_CHARS: usize = 12;
/// The longest, in bytes (hashing cost stays bounded).
pub(crate) const MAX_BYTES: usize = 1024;

fn argon2() -> Argon2<'static> {
    // 19 MiB, 2 passes, 1 lane: OWASP's minimum for Argon2id.
    Argon2::new(
        Algorithm::Argon2id,
        Version::V0x13,
        Params::new(19 * 1024, 2, 1, None).expect("valid Argon2 parameters"),
    )
}

/// Why a password is refused.
pub(crate) fn check(password: &SecretString) -> Result<(), String> {
    let p = password.expose_secret();
    if p.chars().count() < MIN_CHARS {
        return Err(format!("a password has at least {MIN_CHARS} characters"));
    }
    if p.len() > MAX_BYTES {
        return Err(format!("a password has at most {MAX_BYTES} bytes"));
    }
    if p.trim().is_empty() {
        return Err("a password is not only spaces".into());
    }
    Ok(())
}

/// The PHC text of a new hash of `password`.
pub(crate) async fn hash(password: SecretString) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        argon2()
            .hash_password(password.expose_secret().as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing the password failed: {e}"))
    })
    .await?
}

/// Whether `password` matches `stored` (PHC text). Without a stored hash
/// the same work is done against a dummy one, so timing does not say
/// which accounts exist or have a password.
pub async fn verify(password: SecretString, stored: Option<String>) -> bool {
    tokio::task::spawn_blocking(move || {
        let dummy = DUMMY.get_or_init(|| {
            argon2()
                .hash_password(b"no account has this password", &SaltString::generate(&mut OsRng))
                .map(|h| h.to_string())
                .unwrap_or_default()
        });
        let (text, real) = match &stored {
            Some(s) => (s.as_str(), true),
            None => (dummy.as_str(), false),
        };
        let Ok(parsed) = PasswordHash::new(text) else { return false };
        argon2().verify_password(password.expose_secret().as_bytes(), &parsed).is_ok() && real
    })
    .await
    .unwrap_or(false)
}

static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_verifies_its_password_only() {
        let h = hash(SecretString::from("correct horse battery")).await.unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify(SecretString::from("correct horse battery"), Some(h.clone())).await);
        assert!(!verify(SecretString::from("correct horse battery!"), Some(h)).await);
        assert!(!verify(SecretString::from("anything"), None).await, "no hash: never a match");
        assert!(check(&SecretString::from("short")).is_err());
        assert!(check(&SecretString::from("            ")).is_err());
        assert!(check(&SecretString::from("x".repeat(MAX_BYTES + 1))).is_err());
        assert!(check(&SecretString::from("twelve chars")).is_ok());
    }
}
