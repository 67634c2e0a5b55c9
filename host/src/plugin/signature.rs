//! Plugin signatures: an Ed25519 signature over a component's SHA-256
//! digest and the identity it declares (connector id, version, interface
//! version), kept in a small file beside the component (`NAME.wasm.sig`).
//!
//! Beside, not inside: a custom section would change the very bytes whose
//! digest is signed (and pinned by the registry), so signing would have to
//! hash a component minus its signature; a file beside it leaves the
//! component byte for byte as built, its digest the one operators see in
//! listings and pins, and travels as a second layer of an OCI artifact.
//!
//! The digest is checked before the component is compiled: tampered bytes
//! never reach the compiler. The identity is checked once the component
//! has described itself: a signature for one connector or version does not
//! cover another.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::signatures::{SignaturePolicy, TrustedKey};

/// The format of a signature file.
pub(crate) const FORMAT: &str = "service-plugin-signature/1";

/// A signature file is a few hundred bytes; anything past this is refused
/// unread.
const MAX_SIGNATURE_BYTES: u64 = 64 * 1024;

/// The first line of a private key file.
const KEY_HEADER: &str = "# service plugin signing key (Ed25519, PKCS#8, base64): keep it secret";

/// What a signature covers besides the digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub connector_id: String,
    pub version: String,
    pub interface: String,
}

/// A signature file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignatureFile {
    pub format: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    #[serde(flatten)]
    pub identity: Identity,
    /// The signer's public key, base64.
    pub public_key: String,
    /// The signature, base64.
    pub signature: String,
}

/// Why a component is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("it is not signed (no {0}), and the operator requires signatures (SERVICE_PLUGIN_SIGNATURES)")]
    Unsigned(String),
    #[error("its signature file cannot be read: {0}")]
    Unreadable(String),
    #[error("its signature is for another component (sha256 {0}): the bytes were changed after signing")]
    OtherComponent(String),
    #[error("it is signed by a key the operator does not trust (public key {0})")]
    UnknownKey(String),
    #[error("its signature does not verify")]
    Invalid,
    #[error("it declares {found}, but its signature covers {signed}")]
    OtherIdentity { signed: String, found: String },
}

/// Why a key could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0} is not a signing key made by `service plugins keygen`")]
    NotAKey(PathBuf),
    #[error("{0} exists; a key is never overwritten")]
    Exists(PathBuf),
    #[error("the system's random source failed")]
    Random,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.connector_id, self.version, self.interface)
    }
}

/// Where the signature of the component at `component` is kept.
pub fn sidecar(component: &Path) -> PathBuf {
    let mut name = component.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

/// SHA-256 of a component, hex (as the registry pins it).
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes signed: the format, the digest and the identity, a line each.
fn message(digest: &str, identity: &Identity) -> Vec<u8> {
    format!("{FORMAT}\n{digest}\n{}\n{}\n{}\n", identity.connector_id, identity.version, identity.interface)
        .into_bytes()
}

/// A new key pair written to `private` (mode 0600, never over an existing
/// file); answers the public key, base64.
pub(crate) fn keygen(private: &Path) -> Result<String, KeyError> {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).map_err(|_| KeyError::Random)?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| KeyError::Random)?;
    let text = format!("{KEY_HEADER}\n{}\n", STANDARD.encode(pkcs8.as_ref()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(private).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => KeyError::Exists(private.to_owned()),
        _ => KeyError::Io(private.to_owned(), e),
    })?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|e| KeyError::Io(private.to_owned(), e))?;
    Ok(STANDARD.encode(pair.public_key().as_ref()))
}

/// Signs a component's digest and identity with the key at `private`.
pub fn sign(private: &Path, digest: &str, identity: &Identity) -> Result<SignatureFile, KeyError> {
    let text = std::fs::read_to_string(private).map_err(|e| KeyError::Io(private.to_owned(), e))?;
    let pair = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| STANDARD.decode(l).ok())
        .and_then(|pkcs8| Ed25519KeyPair::from_pkcs8(&pkcs8).ok())
        .ok_or_else(|| KeyError::NotAKey(private.to_owned()))?;
    Ok(SignatureFile {
        format: FORMAT.to_owned(),
        digest: digest.to_owned(),
        identity: identity.clone(),
        public_key: STANDARD.encode(pair.public_key().as_ref()),
        signature: STANDARD.encode(pair.sign(&message(digest, identity)).as_ref()),
    })
}

/// A signature that verified: who signed what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    /// The trusted key's name.
    pub signer: String,
    pub identity: Identity,
    /// The signature file as it was found, kept with the component.
    pub text: String,
}

/// Checks the signature beside a component before it is compiled: its
/// digest is this component's, its key is trusted, and it verifies.
/// `Ok(None)`: unsigned, and the policy allows that.
pub(crate) fn check(
    policy: &SignaturePolicy,
    component: &Path,
    digest: &str,
) -> Result<Option<Verified>, SignatureError> {
    let path = sidecar(component);
    let text = match read_small(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(SignatureError::Unreadable(e.to_string())),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    check_text(policy, text, &name, digest)
}

/// Checks a signature file's text (`None`: there is none, as `missing`
/// names it) against the component with `digest`, as [`check`] does.
pub(crate) fn check_text(
    policy: &SignaturePolicy,
    text: Option<String>,
    missing: &str,
    digest: &str,
) -> Result<Option<Verified>, SignatureError> {
    let Some(text) = text else {
        return if policy.required { Err(SignatureError::Unsigned(missing.to_owned())) } else { Ok(None) };
    };
    if text.len() as u64 > MAX_SIGNATURE_BYTES {
        return Err(SignatureError::Unreadable(format!("larger than {MAX_SIGNATURE_BYTES} bytes")));
    }
    let file: SignatureFile = serde_json::from_str(&text).map_err(|e| SignatureError::Unreadable(e.to_string()))?;
    if file.format != FORMAT {
        return Err(SignatureError::Unreadable(format!("format {:.40?}, expected {FORMAT}", file.format)));
    }
    // What the file says is echoed only once it has the shape it must have.
    if file.digest.len() != 64 || !file.digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SignatureError::Unreadable("its digest is no SHA-256".into()));
    }
    if file.digest != digest {
        return Err(SignatureError::OtherComponent(file.digest));
    }
    let decoded = STANDARD.decode(&file.public_key).ok().filter(|k| k.len() == 32);
    let decoded = decoded.ok_or_else(|| SignatureError::Unreadable("its public key is no Ed25519 key".into()))?;
    let key: Option<&TrustedKey> = policy.trusted.iter().find(|t| t.public_key[..] == decoded[..]);
    let key = key.ok_or_else(|| SignatureError::UnknownKey(file.public_key.clone()))?;
    let signature = STANDARD.decode(&file.signature).map_err(|_| SignatureError::Invalid)?;
    UnparsedPublicKey::new(&ED25519, &key.public_key)
        .verify(&message(digest, &file.identity), &signature)
        .map_err(|_| SignatureError::Invalid)?;
    Ok(Some(Verified { signer: key.name.clone(), identity: file.identity, text }))
}

/// Reads a signature file: a regular file (not a link, a pipe or a
/// device, opened without waiting on one) of at most
/// [`MAX_SIGNATURE_BYTES`].
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let file = options.open(path)?;
    let meta = file.metadata()?;
    let refuse = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    if !meta.is_file() {
        return Err(refuse("it is not a regular file"));
    }
    if meta.len() > MAX_SIGNATURE_BYTES {
        return Err(refuse("it is larger than a signature file can be (64 KiB)"));
    }
    let mut text = String::new();
    file.take(MAX_SIGNATURE_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

impl Verified {
    /// Whether the component declares what was signed.
    pub(crate) fn covers(&self, found: &Identity) -> Result<(), SignatureError> {
        if self.identity == *found {
            Ok(())
        } else {
            Err(SignatureError::OtherIdentity { signed: self.identity.to_string(), found: found.to_string() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { connector_id: "conn_x".into(), version: "1.0.0".into(), interface: "service:connector@1.1.0".into() }
    }

    fn policy(name: &str, public: &str, required: bool) -> SignaturePolicy {
        SignaturePolicy { required, trusted: vec![TrustedKey::parse(&format!("{name}={public}"), "test").unwrap()] }
    }

    #[test]
    fn a_signed_component_verifies_and_any_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (key, other_key) = (dir.path().join("key"), dir.path().join("other"));
        let public = keygen(&key).unwrap();
        let other_public = keygen(&other_key).unwrap();
        assert!(matches!(keygen(&key), Err(KeyError::Exists(_))), "never over a key");
        #[cfg(unix)]
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions()) & 0o777,
            0o600
        );

        let component = dir.path().join("x.wasm");
        std::fs::write(&component, b"component bytes").unwrap();
        let d = digest(b"component bytes");
        let write =
            |file: &SignatureFile| std::fs::write(sidecar(&component), serde_json::to_vec(file).unwrap()).unwrap();
        let signed = sign(&key, &d, &identity()).unwrap();
        write(&signed);
        let trusted = policy("acme", &public, true);
        let verified = check(&trusted, &component, &d).unwrap().unwrap();
        assert_eq!(verified.signer, "acme");
        assert_eq!(verified.covers(&identity()), Ok(()));
        let mut newer = identity();
        newer.version = "1.0.1".into();
        assert!(matches!(verified.covers(&newer), Err(SignatureError::OtherIdentity { .. })));

        // Other bytes; an untrusted key; a signature over another identity.
        assert!(matches!(
            check(&trusted, &component, &digest(b"component bytez")),
            Err(SignatureError::OtherComponent(_))
        ));
        assert!(matches!(
            check(&policy("other", &other_public, true), &component, &d),
            Err(SignatureError::UnknownKey(_))
        ));
        let mut forged = signed.clone();
        forged.identity.connector_id = "conn_y".into();
        write(&forged);
        assert_eq!(check(&trusted, &component, &d), Err(SignatureError::Invalid));

        // Unsigned: refused when required, let through when allowed.
        std::fs::remove_file(sidecar(&component)).unwrap();
        assert!(matches!(check(&trusted, &component, &d), Err(SignatureError::Unsigned(_))));
        assert_eq!(check(&policy("acme", &public, false), &component, &d), Ok(None));
        assert!(matches!(sign(&component, &d, &identity()), Err(KeyError::NotAKey(_))));
    }
}
