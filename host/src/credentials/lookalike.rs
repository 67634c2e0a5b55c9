//! What looks like a secret: field names that carry one and values shaped
//! like one (a private key, a bearer header, a token of ours, the
//! published prefixes of well-known providers' keys, a JWT). Secrets enter
//! only through the credential flows; anywhere else (request bodies,
//! reverse-ETL mapping constants) a lookalike is refused, so that it is
//! neither stored in the clear nor shown to readers of the record.

use serde_json::Value;

/// Field names that carry secrets. Compared after lower-casing and dropping
/// `_` and `-`, so `client_secret`, `clientSecret` and `Client-Secret` match.
const SECRET_NAMES: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "clientsecret",
    "token",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "apitoken",
    "authtoken",
    "bearertoken",
    "apikey",
    "privatekey",
    "secretkey",
    "authorization",
    "sessiontoken",
];

/// Prefixes providers publish for their secret keys, so that scanners
/// find them: Stripe, GitHub, GitLab, Slack, Shopify, Square, Hugging Face.
const KEY_PREFIXES: &[&str] = &[
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "whsec_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "shpat_",
    "shpss_",
    "shpca_",
    "sq0atp-",
    "sq0csp-",
    "hf_",
];

/// Whether a field of this name holds a secret.
pub(crate) fn is_secret_name(key: &str) -> bool {
    let norm: String = key.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect();
    SECRET_NAMES.contains(&norm.as_str())
        || norm.ends_with("password")
        || norm.ends_with("secret")
        || norm.ends_with("apikey")
        || norm.ends_with("privatekey")
        || norm.ends_with("token")
}

/// Whether a text is shaped like a secret.
pub(crate) fn looks_like_secret_value(s: &str) -> bool {
    let t = s.trim();
    t.starts_with("-----BEGIN") && t.contains("PRIVATE KEY")
        // By bytes: a multi-byte character may straddle the seventh byte.
        || t.as_bytes().get(..7).is_some_and(|p| p.eq_ignore_ascii_case(b"bearer "))
        || t.starts_with(crate::access::tokens::TOKEN_PREFIX)
        || (KEY_PREFIXES.iter().any(|p| t.starts_with(p)) && t.len() >= 16 && !t.contains(char::is_whitespace))
        || aws_access_key(t)
        || google_api_key(t)
        || sendgrid_key(t)
        || jwt(t)
}

/// `AKIA…`/`ASIA…` and sixteen more upper-case letters and digits.
fn aws_access_key(t: &str) -> bool {
    t.len() == 20
        && (t.starts_with("AKIA") || t.starts_with("ASIA"))
        && t.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// `AIza` and 35 more URL-safe characters.
fn google_api_key(t: &str) -> bool {
    t.len() == 39 && t.starts_with("AIza") && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `SG.<22>.<43>`.
fn sendgrid_key(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 3 && parts[0] == "SG" && parts[1].len() == 22 && parts[2].len() == 43
}

/// Three base64url segments, the first a JSON header (`eyJ`).
fn jwt(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts.iter().all(|p| p.len() >= 4 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

/// Whether a value is a template that names a secret held elsewhere
/// rather than one (a declarative manifest's `api_token: "Bearer {{
/// config['api_key'] }}"`): Jinja expressions, with no more than a word
/// of text around them, none of it shaped like a secret.
fn names_a_secret(v: &Value) -> bool {
    let Value::String(s) = v else { return false };
    if !s.contains("{{") {
        return false;
    }
    let mut rest = String::new();
    let mut text = s.as_str();
    while let Some(start) = text.find("{{") {
        rest.push_str(&text[..start]);
        match text[start..].find("}}") {
            Some(end) => text = &text[start + end + 2..],
            None => return false,
        }
    }
    rest.push_str(text);
    rest.chars().filter(char::is_ascii_alphanumeric).count() <= 12 && !looks_like_secret_value(rest.trim())
}

/// Whether a value under a secret's name in a declarative manifest (a
/// published document, not a user's settings) holds none: nothing (`""`), a
/// placeholder of a character or two (a manifest's Basic `password: "x"`
/// beside a key sent as the username) or a short lower-case word, a reference to another part of the
/// document (`"#/definitions/bearer_authenticator"`), or a component of a
/// declarative manifest (an object with a `type` such as
/// `BearerAuthenticator`, whose own values are still searched).
fn holds_no_secret(v: &Value) -> bool {
    match v {
        // A word (`api_token`: Toggl's Basic password is that text).
        Value::String(s) => {
            s.chars().count() <= 2
                || s.starts_with("#/")
                || (s.len() <= 16 && s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        }
        Value::Object(map) => map
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && t.ends_with("Authenticator")),
        _ => false,
    }
}

/// Whether a value is a JSON schema describing a field (a spec's
/// `"api_key": {"type": "string", "airbyte_secret": true}`): its own
/// values are still searched.
fn describes_a_field(v: &Value) -> bool {
    let Value::Object(map) = v else { return false };
    const TYPES: &[&str] = &["string", "integer", "number", "boolean", "object", "array", "null"];
    let typed = match map.get("type") {
        Some(Value::String(t)) => TYPES.contains(&t.as_str()),
        Some(Value::Array(ts)) => ts.iter().all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))),
        _ => false,
    };
    typed || map.contains_key("airbyte_secret") || map.contains_key("oneOf") || map.contains_key("$ref")
}

/// Whether a description or title is prose about a field rather than a
/// value pasted into it: four words or more, or in a manifest's spec (a
/// published document) two words none of which is shaped like a key.
fn is_prose(text: &str, in_manifest: bool) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    let keyish = |w: &&str| looks_like_secret_value(w) || (w.len() >= 12 && w.chars().any(|c| c.is_ascii_digit()));
    words.len() >= 4 || (in_manifest && words.len() >= 2 && !words.iter().any(keyish))
}

/// Whether a JSON path is inside a `manifest` (a connector's published
/// description of an API).
fn in_manifest(path: &str) -> bool {
    path.split('.').any(|segment| segment == "manifest" || segment.starts_with("manifest["))
}

/// The JSON path of the first secret-shaped field or value, if any.
pub(crate) fn find_secret(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let here = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            // A schema's prose about a secret ("Bearer token from …") is
            // not one.
            if (k == "description" || k == "title") && v.as_str().is_some_and(|t| is_prose(t, in_manifest(&here))) {
                return None;
            }
            let placeholder = in_manifest(&here) && holds_no_secret(v);
            let secret_key = is_secret_name(k)
                && !matches!(v, Value::Null | Value::Bool(_))
                && !names_a_secret(v)
                && !describes_a_field(v)
                && !placeholder;
            if secret_key { Some(here) } else { find_secret(v, &here) }
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| find_secret(v, &format!("{path}[{i}]"))),
        Value::String(s) if looks_like_secret_value(s) && !names_a_secret(value) => Some(path.to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_naming_a_secret_is_not_one() {
        let manifest = serde_json::json!({ "authenticator": { "api_token": "{{ config['api_key'] }}",
            "password": "Bearer {{ config.password }}" } });
        assert_eq!(find_secret(&manifest, ""), None);
        for literal in ["abc123def456ghi789 {{ config.x }}", "{{ config.x }}", "sk_live_0123456789abcdef{{ x }}"] {
            let value = serde_json::json!({ "api_token": literal });
            let found = find_secret(&value, "");
            assert_eq!(found.is_some(), literal != "{{ config.x }}", "{literal}");
        }
        assert!(find_secret(&serde_json::json!({ "api_token": "{{ unclosed" }), "").is_some());
        // A spec's description of a secret field is not a secret; a value
        // inside it still is.
        let spec = serde_json::json!({ "properties": { "api_key": { "type": "string", "airbyte_secret": true } } });
        assert_eq!(find_secret(&spec, ""), None);
        let leaked = serde_json::json!({ "api_key": { "type": "string", "default": "sk_live_0123456789abcdefghij" } });
        assert_eq!(find_secret(&leaked, "").as_deref(), Some("api_key.default"));
        let prose = serde_json::json!({ "token": { "type": "string", "description": "Bearer token from your account settings" } });
        assert_eq!(find_secret(&prose, ""), None);
        let pasted = serde_json::json!({ "token": { "type": "string", "description": "Bearer abc123" } });
        assert!(find_secret(&pasted, "").is_some());
    }

    #[test]
    fn a_manifests_placeholders_references_and_components_are_not_secrets() {
        let manifest = serde_json::json!({ "configuration": { "manifest": { "refresh_token": "", "password": "x", "passwd": "api_token",
            "authenticators": { "api_key": "#/definitions/bearer", "oauth2_access_token": {
                "type": "BearerAuthenticator", "api_token": "{{ config['token'] }}" } } } } });
        assert_eq!(find_secret(&manifest, ""), None);
        // A component's own values are still searched; a real value is
        // still one.
        let inside = serde_json::json!({ "manifest": { "api_key": { "type": "BearerAuthenticator",
            "api_token": "abc123def456ghi789" } } });
        assert_eq!(find_secret(&inside, "").as_deref(), Some("manifest.api_key.api_token"));
        for value in ["abc123", "#definitely-a-password", "hunter22", "Hunter"] {
            let body = serde_json::json!({ "manifest": { "password": value } });
            assert!(find_secret(&body, "").is_some(), "{value}");
        }
        // A spec's short description is prose there; a key pasted into one
        // is not.
        let spec = serde_json::json!({ "manifest": { "spec": { "properties": { "auth_token": {
            "type": "string", "description": "Bearer token", "airbyte_secret": true } } } } });
        assert_eq!(find_secret(&spec, ""), None);
        let pasted = serde_json::json!({ "manifest": { "auth_token": { "type": "string",
            "description": "Bearer abcdef0123456789" } } });
        assert!(find_secret(&pasted, "").is_some());
        // Outside a manifest, a character is a secret all the same.
        for value in ["", "x", "#/definitions/a"] {
            assert!(find_secret(&serde_json::json!({ "config": { "password": value } }), "").is_some(), "{value:?}");
        }
    }

    #[test]
    fn provider_keys_and_tokens_look_like_secrets() {
        for secret in [
            "sk_live_51HxxxxxxxxxxxxxxxxxxxxxX",
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
            "AKIAIOSFODNN7EXAMPLE",
            "AIzaSyA-0123456789abcdefghijklmnopqrstu",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "Bearer abc",
            "-----BEGIN RSA PRIVATE KEY-----\nMII...",
        ] {
            assert!(looks_like_secret_value(secret), "{secret}");
        }
        for plain in
            ["warehouse", "sk_", "an ordinary sentence with sk_live_ in it", "AKIA", "eyJ.x.y", "c1@example.com"]
        {
            assert!(!looks_like_secret_value(plain), "{plain}");
        }
        assert!(is_secret_name("api_key") && is_secret_name("Client-Secret") && is_secret_name("refreshToken"));
        assert!(!is_secret_name("email") && !is_secret_name("origin"));
    }
}
