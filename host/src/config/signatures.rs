//! Which plugin publishers the operator trusts (`SERVICE_PLUGIN_TRUSTED_KEYS`
//! and `SERVICE_PLUGIN_TRUSTED_KEYS_FILE`) and whether a component from the
//! plugins directory must be signed by one of them
//! (`SERVICE_PLUGIN_SIGNATURES`). Bundled plugins are built with the server
//! and need no signature.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::ConfigError;

/// An Ed25519 public key the operator trusts, with the name it goes by in
/// logs, listings and audit records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedKey {
    pub name: String,
    pub public_key: [u8; 32],
}

impl TrustedKey {
    /// `NAME KEY` or `NAME=KEY`, the key in standard base64.
    pub fn parse(entry: &str, setting: &'static str) -> Result<TrustedKey, ConfigError> {
        // Whitespace first: base64 ends in `=` padding.
        let (name, key) = entry
            .split_once(char::is_whitespace)
            .or_else(|| entry.split_once('='))
            .map(|(n, k)| (n.trim(), k.trim()))
            .ok_or_else(|| ConfigError::new(setting, format!("{entry:?} is not NAME=KEY")))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
            return Err(ConfigError::new(setting, format!("{name:?}: a key's name is letters, digits and -_.@")));
        }
        let public_key =
            STANDARD.decode(key).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()).ok_or_else(|| {
                ConfigError::new(setting, format!("{name}: not a base64 Ed25519 public key (32 bytes)"))
            })?;
        Ok(TrustedKey { name: name.to_owned(), public_key })
    }
}

/// What the registry asks of a component from the plugins directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignaturePolicy {
    /// Refuse unsigned components (a signature that does not verify is
    /// refused either way).
    pub required: bool,
    pub trusted: Vec<TrustedKey>,
}

impl SignaturePolicy {
    /// Unsigned components load; signed ones must verify.
    pub fn allowed() -> Self {
        SignaturePolicy { required: false, trusted: Vec::new() }
    }

    /// The policy of the settings: `required` or `allowed`, keys inline
    /// (`NAME=KEY,...`) and in a file (a `NAME KEY` line each, `#`
    /// comments).
    pub fn from_settings(mode: &str, inline: &str, file: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        let required = match mode.trim() {
            "required" | "" => true,
            "allowed" => false,
            other => {
                return Err(ConfigError::new(
                    "SERVICE_PLUGIN_SIGNATURES",
                    format!("{other:?} is neither required nor allowed"),
                ));
            }
        };
        let mut trusted = Vec::new();
        for entry in inline.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            trusted.push(TrustedKey::parse(entry, "SERVICE_PLUGIN_TRUSTED_KEYS")?);
        }
        if let Some(file) = file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                ConfigError::new("SERVICE_PLUGIN_TRUSTED_KEYS_FILE", format!("{}: {e}", file.display()))
            })?;
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
                trusted.push(TrustedKey::parse(line, "SERVICE_PLUGIN_TRUSTED_KEYS_FILE")?);
            }
        }
        for (i, key) in trusted.iter().enumerate() {
            if trusted[..i].iter().any(|k| k.name == key.name) {
                return Err(ConfigError::new("SERVICE_PLUGIN_TRUSTED_KEYS", format!("{} is named twice", key.name)));
            }
        }
        Ok(SignaturePolicy { required, trusted })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    #[test]
    fn keys_come_inline_and_from_a_file_each_with_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, format!("# publishers\nacme {KEY}\n\n")).unwrap();
        let policy = SignaturePolicy::from_settings("required", &format!("ours={KEY}"), Some(&file)).unwrap();
        assert!(policy.required);
        assert_eq!(policy.trusted.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["ours", "acme"]);
        assert_eq!(policy.trusted[0].public_key[31], 31);

        assert!(!SignaturePolicy::from_settings("allowed", "", None).unwrap().required);
        let refused =
            |mode: &str, inline: &str| SignaturePolicy::from_settings(mode, inline, None).unwrap_err().to_string();
        assert!(refused("sometimes", "").contains("neither required nor allowed"));
        assert!(refused("required", "ours=AAEC").contains("not a base64 Ed25519 public key"));
        assert!(refused("required", &format!("a/b={KEY}")).contains("letters, digits"));
        assert!(refused("required", &format!("a={KEY},a={KEY}")).contains("named twice"));
    }
}
