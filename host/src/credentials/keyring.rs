//! The master key(s) that seal credential secrets.
//!
//! The current key comes from `SERVICE_MASTER_KEY` (32 bytes, base64) or,
//! when that is unset, from `<data-dir>/master.key`, created on first run
//! with mode 0600. The file may hold several keys (one `<key-id> <base64>`
//! per line, the first is current) so a rotation can re-encrypt while old
//! ciphertexts still open. A key id is derived from the key itself, so a
//! ciphertext always says which key sealed it.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox, SecretString};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::config::ConfigError;
pub(crate) use crate::store::credentials::Sealed;

/// Environment variable holding the master key.
pub(crate) const MASTER_KEY_ENV: &str = "SERVICE_MASTER_KEY";
/// Environment variable holding the new key when the current one comes from
/// the environment (`service admin rotate-master-key`).
pub(crate) const NEW_MASTER_KEY_ENV: &str = "SERVICE_NEW_MASTER_KEY";
/// Name of the key file in the data directory.
pub const KEY_FILE: &str = "master.key";

/// One 256-bit key.
pub struct MasterKey {
    pub id: String,
    key: SecretBox<[u8; 32]>,
}

impl MasterKey {
    fn from_bytes(bytes: [u8; 32]) -> Self {
        let digest = Sha256::digest(Sha256::digest(bytes));
        let id = format!("k{}", digest[..6].iter().map(|b| format!("{b:02x}")).collect::<String>());
        MasterKey { id, key: SecretBox::new(Box::new(bytes)) }
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self::from_bytes(bytes)
    }

    /// Parses a base64 key.
    pub fn parse(b64: &str) -> Result<Self, String> {
        let raw = Zeroizing::new(STANDARD.decode(b64.trim()).map_err(|_| "not base64".to_owned())?);
        let bytes: [u8; 32] =
            raw.as_slice().try_into().map_err(|_| format!("must decode to 32 bytes, not {}", raw.len()))?;
        Ok(Self::from_bytes(bytes))
    }

    fn encoded(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(self.key.expose_secret()))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.key.expose_secret().into())
    }
}

/// A key derived for one purpose ([`Keyring::derive`]).
pub struct DerivedKey(SecretBox<[u8; 32]>);

impl DerivedKey {
    /// HMAC-SHA256 of `parts`, each length-prefixed so no two sequences of
    /// parts give the same input.
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret()).expect("HMAC takes any key length");
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac.finalize().into_bytes().into()
    }

    /// The key itself, for a layer that authenticates with it on its own
    /// (the compiled-plugin cache).
    pub(crate) fn into_secret(self) -> SecretBox<[u8; 32]> {
        self.0
    }

    /// Whether `tag` is the MAC of `parts` (compared in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret()).expect("HMAC takes any key length");
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac.verify_slice(tag).is_ok()
    }
}

/// The current key and older ones still able to open.
pub struct Keyring {
    keys: Vec<MasterKey>,
    /// Where the keys came from (for rotation), `None` for the environment.
    file: Option<PathBuf>,
}

impl Keyring {
    /// Loads the keyring: the configured key (`SERVICE_MASTER_KEY`) when
    /// there is one, else the key file, created (0600) when missing.
    pub fn load(data_dir: &Path, configured: Option<&SecretString>) -> Result<Self, ConfigError> {
        if let Some(v) = configured {
            let key = MasterKey::parse(v.expose_secret()).map_err(|e| ConfigError::new(MASTER_KEY_ENV, e))?;
            return Ok(Keyring { keys: vec![key], file: None });
        }
        let path = data_dir.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let mut keys = Vec::new();
                for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
                    let b64 = line.split_whitespace().last().unwrap_or("");
                    keys.push(
                        MasterKey::parse(b64)
                            .map_err(|e| ConfigError::new("SERVICE_DATA_DIR", format!("{}: {e}", path.display())))?,
                    );
                }
                if keys.is_empty() {
                    return Err(ConfigError::new("SERVICE_DATA_DIR", format!("{} holds no key", path.display())));
                }
                Ok(Keyring { keys, file: Some(path) })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::config::ensure_data_dir(data_dir)?;
                let ring = Keyring { keys: vec![MasterKey::generate()], file: Some(path) };
                ring.write_file()
                    .map_err(|e| ConfigError::new("SERVICE_DATA_DIR", format!("cannot write the key file: {e}")))?;
                tracing::info!(key_id = %ring.current().id, "created a new master key file");
                Ok(ring)
            }
            Err(e) => Err(ConfigError::new("SERVICE_DATA_DIR", format!("cannot read {}: {e}", path.display()))),
        }
    }

    /// The key new secrets are sealed with.
    pub fn current(&self) -> &MasterKey {
        &self.keys[0]
    }

    /// A key for one purpose other than sealing (keyed fingerprints, the
    /// compiled-plugin cache's authentication), derived from the current
    /// master key so every replica derives the same one and none is
    /// stored. Rotating the master key changes it.
    pub fn derive(&self, purpose: &str) -> DerivedKey {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.current().key.expose_secret())
            .expect("HMAC takes any key length");
        mac.update(b"service/derived-key/");
        mac.update(purpose.as_bytes());
        DerivedKey(SecretBox::new(Box::new(mac.finalize().into_bytes().into())))
    }

    /// Seals `plaintext`, binding it to `aad` (credential and workspace).
    pub(crate) fn seal(&self, aad: &str, plaintext: &[u8]) -> Sealed {
        let key = self.current();
        let mut nonce = [0u8; 24];
        rand::rng().fill_bytes(&mut nonce);
        let ciphertext = key
            .cipher()
            .encrypt(&XNonce::from(nonce), Payload { msg: plaintext, aad: aad.as_bytes() })
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory buffers");
        Sealed { key_id: key.id.clone(), nonce: STANDARD.encode(nonce), ciphertext: STANDARD.encode(ciphertext) }
    }

    /// Opens a sealed secret; fails if the key is unknown, the data was
    /// altered, or it was sealed for another credential or workspace.
    pub fn open(&self, aad: &str, sealed: &Sealed) -> Result<Zeroizing<Vec<u8>>, &'static str> {
        let key = self.keys.iter().find(|k| k.id == sealed.key_id).ok_or("sealed with an unknown master key")?;
        let nonce: [u8; 24] =
            STANDARD.decode(&sealed.nonce).ok().and_then(|n| n.try_into().ok()).ok_or("corrupt nonce")?;
        let ct = STANDARD.decode(&sealed.ciphertext).map_err(|_| "corrupt ciphertext")?;
        key.cipher()
            .decrypt(&XNonce::from(nonce), Payload { msg: &ct, aad: aad.as_bytes() })
            .map(Zeroizing::new)
            .map_err(|_| "ciphertext does not open with its binding")
    }

    /// Puts a new key first (old ones stay until [`Keyring::retire_old`]).
    pub(crate) fn add_current(&mut self, key: MasterKey) {
        self.keys.insert(0, key);
    }

    /// Keeps only the current key.
    pub(crate) fn retire_old(&mut self) {
        self.keys.truncate(1);
    }

    /// Whether keys live in a file this process may rewrite.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Writes the key file atomically with mode 0600.
    pub(crate) fn write_file(&self) -> std::io::Result<()> {
        let Some(path) = &self.file else { return Ok(()) };
        let tmp = path.with_extension("key.tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&tmp)?;
        writeln!(f, "# Master keys of this installation; the first is current. Keep this file secret and backed up.")?;
        for k in &self.keys {
            writeln!(f, "{} {}", k.id, k.encoded().as_str())?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_only_with_their_binding() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Keyring { keys: vec![MasterKey::generate()], file: Some(dir.path().join(KEY_FILE)) };
        let sealed = ring.seal("crd_1|ws_1", b"canary");
        assert!(!sealed.ciphertext.contains("canary"));
        assert_eq!(ring.open("crd_1|ws_1", &sealed).unwrap().as_slice(), b"canary");
        assert!(ring.open("crd_1|ws_2", &sealed).is_err(), "bound to its workspace");
        assert!(ring.open("crd_2|ws_1", &sealed).is_err(), "bound to its credential");
        ring.write_file().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let reloaded = Keyring::load(dir.path(), None).unwrap();
        assert_eq!(reloaded.open("crd_1|ws_1", &sealed).unwrap().as_slice(), b"canary");
    }
}
