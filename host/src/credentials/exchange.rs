//! Credentials the host trades for a token before it sends anything: an
//! OAuth client's secret (the client-credentials grant; with a refresh
//! token the credential also holds, the refresh-token grant, whose
//! rotated refresh tokens the vault keeps), a private key
//! that signs a JWT assertion (RFC 7523's JWT bearer grant), or a password
//! that logs in for a session token. The stored secret goes only to the
//! token endpoint, in the request the host makes there; requests to the
//! API carry the token it got, which the host keeps in memory until it
//! expires or the API refuses it, and then obtains again.
//!
//! The recipe is stored with the credential (its metadata's `exchange`)
//! and checked when it is made: the token endpoint is `https` and on one
//! of the credential's bound hosts, so the secret goes nowhere else.

use ring::rand::SecureRandom;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What the host trades a credential's secret for, and where it sends
/// what it gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenExchange {
    #[serde(flatten)]
    pub grant: Grant,
    /// The header the token goes in; `Authorization: Bearer` without one.
    #[serde(default)]
    pub header: Option<String>,
    /// `scopes` fields of an OAuth token request, one per scope (the form
    /// Airbyte's CDK sends; RFC 6749's space-separated `scope` is the
    /// client-credentials grant's `scope`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The field of the endpoint's answer, beside the token, that says
    /// when it expires: seconds from now (`expires_in` when unset), or
    /// with `expiry_is_time` the instant itself (RFC 3339 or Unix time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_field: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expiry_is_time: bool,
}

/// How the token is obtained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "grant", rename_all = "snake_case")]
pub enum Grant {
    /// OAuth 2.0 client credentials: `client_id` and the secret in the
    /// token request's body.
    ClientCredentials {
        token_url: String,
        client_id: String,
        #[serde(default)]
        scope: Option<String>,
    },
    /// OAuth 2.0 refresh-token grant (RFC 6749 section 6) for a client of
    /// the user's own: `client_id`, the secret and the refresh token the
    /// credential holds beside it in the token request's body. A refresh
    /// token the endpoint answers with replaces the stored one.
    RefreshToken {
        token_url: String,
        client_id: String,
        /// The request's refresh token is empty and the credential holds
        /// none: some providers take the client's id and secret this way
        /// (Airbyte manifests that write `refresh_token: ""`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        empty_refresh_token: bool,
    },
    /// OAuth 2.0 JWT bearer assertion (RFC 7523): the secret is a PKCS#8
    /// private key (PEM) that signs the assertion.
    JwtBearer {
        token_url: String,
        issuer: String,
        /// `sub`; the issuer when unset.
        #[serde(default)]
        subject: Option<String>,
        /// `aud`; the token URL when unset.
        #[serde(default)]
        audience: Option<String>,
        #[serde(default)]
        scope: Option<String>,
        algorithm: JwtAlgorithm,
        #[serde(default)]
        key_id: Option<String>,
    },
    /// A login: a JSON body with the username and the secret as the
    /// password, the session token read at `token_pointer` of the answer.
    Login {
        token_url: String,
        username: String,
        #[serde(default = "username_field")]
        username_field: String,
        #[serde(default = "password_field")]
        password_field: String,
        token_pointer: String,
        /// How long a session lasts when the answer does not say
        /// (`expires_in` beside the token).
        #[serde(default)]
        lifetime_secs: Option<u64>,
    },
}

fn username_field() -> String {
    "username".into()
}

fn password_field() -> String {
    "password".into()
}

/// The signature of a JWT assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JwtAlgorithm {
    RS256,
    ES256,
}

/// A token the host obtained (its `Debug` shows no token).
#[derive(Debug)]
pub(crate) struct Obtained {
    pub token: SecretString,
    /// Seconds it lasts, as the endpoint said (or the recipe's lifetime).
    pub expires_in: Option<i64>,
    /// The refresh token to use next time, when the endpoint rotated it.
    pub refresh_token: Option<SecretString>,
}

/// Why no token was obtained: safe to show (never the secret, never the
/// endpoint's answer beyond an OAuth error code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ExchangeError(pub String);

/// Sessions last this long when nothing says otherwise.
const DEFAULT_LIFETIME_SECS: i64 = 3600;
/// How long an assertion is valid.
const ASSERTION_SECS: u64 = 300;

impl TokenExchange {
    pub(crate) fn token_url(&self) -> &str {
        match &self.grant {
            Grant::ClientCredentials { token_url, .. }
            | Grant::RefreshToken { token_url, .. }
            | Grant::JwtBearer { token_url, .. }
            | Grant::Login { token_url, .. } => token_url,
        }
    }

    /// Checks a recipe for a credential bound to `hosts`; the reason names
    /// the field.
    pub fn check(&self, hosts: &[String]) -> Result<(), String> {
        let url = url::Url::parse(self.token_url()).map_err(|e| format!("exchange.token_url: {e}"))?;
        if url.scheme() != "https" || url.username() != "" || url.password().is_some() {
            return Err("exchange.token_url: an https URL without user-info".into());
        }
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        if !hosts.iter().any(|h| h.eq_ignore_ascii_case(&host)) {
            return Err(format!(
                "exchange.token_url: {host} is not among the credential's hosts; the secret goes only to them"
            ));
        }
        if let Some(h) = &self.header
            && (h.is_empty()
                || !h.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
                || connector_rules::headers::is_reserved(h))
        {
            return Err(format!("exchange.header: '{h}' cannot carry a token"));
        }
        if let Grant::Login { token_pointer, .. } = &self.grant
            && !token_pointer.starts_with('/')
        {
            return Err("exchange.token_pointer: a JSON pointer such as /data/token".into());
        }
        if !self.scopes.is_empty() {
            if !matches!(self.grant, Grant::ClientCredentials { .. } | Grant::RefreshToken { .. }) {
                return Err("exchange.scopes: only an OAuth client's grants ask for scopes".into());
            }
            if self.scopes.iter().any(|s| s.is_empty() || s.len() > 512 || s.chars().any(char::is_control)) {
                return Err("exchange.scopes: each scope is a non-empty line of at most 512 bytes".into());
            }
        }
        match &self.expiry_field {
            Some(f) if f.is_empty() || f.len() > 128 || f.contains('/') => {
                return Err("exchange.expiry_field: the name of a field beside the token".into());
            }
            None if self.expiry_is_time => {
                return Err("exchange.expiry_is_time: needs exchange.expiry_field".into());
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the credential holds a refresh token beside its secret.
    pub fn refreshes(&self) -> bool {
        matches!(self.grant, Grant::RefreshToken { empty_refresh_token: false, .. })
    }

    /// The token request: its body and content type. `now` is Unix
    /// seconds; `refresh_token` the one the credential holds.
    pub(crate) fn request(
        &self,
        secret: &SecretString,
        refresh_token: Option<&SecretString>,
        now: u64,
    ) -> Result<(Vec<u8>, &'static str), ExchangeError> {
        let form = |pairs: Vec<(&str, String)>| {
            let body = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())))
                .finish();
            (body.into_bytes(), "application/x-www-form-urlencoded")
        };
        Ok(match &self.grant {
            Grant::ClientCredentials { client_id, scope, .. } => {
                let mut pairs = vec![
                    ("grant_type", "client_credentials".to_owned()),
                    ("client_id", client_id.clone()),
                    ("client_secret", secret.expose_secret().to_owned()),
                ];
                if let Some(scope) = scope {
                    pairs.push(("scope", scope.clone()));
                }
                pairs.extend(self.scopes.iter().map(|s| ("scopes", s.clone())));
                form(pairs)
            }
            Grant::RefreshToken { client_id, empty_refresh_token, .. } => {
                let empty = SecretString::from(String::new());
                let refresh_token = match (refresh_token, empty_refresh_token) {
                    (_, true) => &empty,
                    (Some(token), false) => token,
                    (None, false) => {
                        return Err(ExchangeError("the credential holds no refresh token; store it again".into()));
                    }
                };
                let mut pairs = vec![
                    ("grant_type", "refresh_token".to_owned()),
                    ("client_id", client_id.clone()),
                    ("client_secret", secret.expose_secret().to_owned()),
                    ("refresh_token", refresh_token.expose_secret().to_owned()),
                ];
                pairs.extend(self.scopes.iter().map(|s| ("scopes", s.clone())));
                form(pairs)
            }
            Grant::JwtBearer { token_url, issuer, subject, audience, scope, algorithm, key_id } => {
                let mut claims = json!({
                    "iss": issuer,
                    "sub": subject.as_ref().unwrap_or(issuer),
                    "aud": audience.as_ref().unwrap_or(token_url),
                    "iat": now,
                    "exp": now + ASSERTION_SECS,
                    "jti": jti()?,
                });
                if let Some(scope) = scope {
                    claims["scope"] = json!(scope);
                }
                let assertion = sign_jwt(*algorithm, key_id.as_deref(), &claims, secret)?;
                let mut pairs = vec![
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer".to_owned()),
                    ("assertion", assertion),
                ];
                if let Some(scope) = scope {
                    pairs.push(("scope", scope.clone()));
                }
                form(pairs)
            }
            Grant::Login { username, username_field, password_field, .. } => {
                let mut body = serde_json::Map::new();
                body.insert(username_field.clone(), json!(username));
                body.insert(password_field.clone(), json!(secret.expose_secret()));
                let bytes = serde_json::to_vec(&body).unwrap_or_default();
                if let Some(Value::String(s)) = body.get_mut(password_field) {
                    zeroize::Zeroize::zeroize(s);
                }
                (bytes, "application/json")
            }
        })
    }

    /// The token in the endpoint's answer, `now` Unix seconds.
    pub(crate) fn token(&self, status: u16, body: &[u8], now: u64) -> Result<Obtained, ExchangeError> {
        let mut answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        if !(200..300).contains(&status) {
            let code = answer["error"]
                .as_str()
                .filter(|e| e.len() <= 64 && e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
                .map_or_else(|| format!("HTTP {status}"), str::to_owned);
            crate::egress::inject::zero_strings(&mut answer);
            return Err(ExchangeError(format!("the token endpoint refused the credential ({code})")));
        }
        let pointer = match &self.grant {
            Grant::Login { token_pointer, .. } => token_pointer.as_str(),
            _ => "/access_token",
        };
        let token = match answer.pointer(pointer) {
            Some(Value::String(t)) if !t.is_empty() => Some(t.clone()),
            // A login's session may be a number (as Airbyte's CDK reads it).
            Some(Value::Number(n)) if matches!(self.grant, Grant::Login { .. }) => Some(n.to_string()),
            _ => None,
        };
        let field = self.expiry_field.as_deref().unwrap_or("expires_in");
        let expiry = answer.pointer(&format!("{}/{}", parent(pointer), field.replace('~', "~0")));
        let expires_in = expiry.and_then(|v| lifetime(v, self.expiry_is_time, now)).or(match &self.grant {
            Grant::Login { lifetime_secs, .. } => lifetime_secs.and_then(|s| i64::try_from(s).ok()),
            _ => None,
        });
        let refresh_token = match self.grant {
            Grant::RefreshToken { empty_refresh_token: false, .. } => answer
                .pointer("/refresh_token")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(|t| SecretString::from(t.to_owned())),
            _ => None,
        };
        crate::egress::inject::zero_strings(&mut answer);
        let token =
            token.ok_or_else(|| ExchangeError(format!("the token endpoint's answer has no token at {pointer}")))?;
        Ok(Obtained {
            token: SecretString::from(token),
            expires_in: Some(expires_in.unwrap_or(DEFAULT_LIFETIME_SECS)),
            refresh_token,
        })
    }
}

/// The seconds a token lasts from `now` by the answer's `value`: a
/// number of seconds, or with `is_time` the instant it expires.
fn lifetime(value: &Value, is_time: bool, now: u64) -> Option<i64> {
    let number = value.as_f64().or_else(|| value.as_str().and_then(|s| s.trim().parse::<f64>().ok()));
    if !is_time {
        return number.map(|n| n as i64);
    }
    let at = match (number, value.as_str()) {
        (Some(n), _) => n as i64,
        (None, Some(text)) => {
            let text = text.trim();
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.timestamp())
                .or_else(|_| {
                    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").map(|t| t.and_utc().timestamp())
                })
                .ok()?
        }
        _ => return None,
    };
    Some(at - i64::try_from(now).unwrap_or(i64::MAX))
}

/// The pointer of the object holding `pointer`'s value.
fn parent(pointer: &str) -> &str {
    pointer.rsplit_once('/').map_or("", |(p, _)| p)
}

fn jti() -> Result<String, ExchangeError> {
    let mut raw = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut raw)
        .map_err(|_| ExchangeError("no randomness for the assertion".into()))?;
    Ok(hex::encode(raw))
}

/// A compact JWS of `claims`, signed with the PKCS#8 key in `pem`.
fn sign_jwt(
    algorithm: JwtAlgorithm,
    key_id: Option<&str>,
    claims: &Value,
    pem: &SecretString,
) -> Result<String, ExchangeError> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut header = json!({ "alg": format!("{algorithm:?}"), "typ": "JWT" });
    if let Some(kid) = key_id {
        header["kid"] = json!(kid);
    }
    let input = format!("{}.{}", b64.encode(header.to_string()), b64.encode(claims.to_string()));
    let der = private_key_der(pem)?;
    let rng = ring::rand::SystemRandom::new();
    let unusable = || ExchangeError(format!("the credential's secret is not a PKCS#8 {algorithm:?} private key"));
    let signature = match algorithm {
        JwtAlgorithm::RS256 => {
            let key = ring::rsa::KeyPair::from_pkcs8(&der).map_err(|_| unusable())?;
            let mut out = vec![0; key.public().modulus_len()];
            key.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, input.as_bytes(), &mut out).map_err(|_| unusable())?;
            out
        }
        JwtAlgorithm::ES256 => {
            let key = ring::signature::EcdsaKeyPair::from_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &der,
                &rng,
            )
            .map_err(|_| unusable())?;
            key.sign(&rng, input.as_bytes()).map_err(|_| unusable())?.as_ref().to_vec()
        }
    };
    Ok(format!("{input}.{}", b64.encode(signature)))
}

/// The DER bytes of a `-----BEGIN PRIVATE KEY-----` block.
fn private_key_der(pem: &SecretString) -> Result<zeroize::Zeroizing<Vec<u8>>, ExchangeError> {
    use base64::Engine;
    let text = pem.expose_secret();
    let body: zeroize::Zeroizing<String> = zeroize::Zeroizing::new(
        text.lines().filter(|l| !l.starts_with("-----")).map(str::trim).collect::<Vec<_>>().concat(),
    );
    if !text.contains("-----BEGIN PRIVATE KEY-----") {
        return Err(ExchangeError(
            "the credential's secret is not a PEM PKCS#8 private key (BEGIN PRIVATE KEY)".into(),
        ));
    }
    base64::engine::general_purpose::STANDARD
        .decode(body.as_bytes())
        .map(zeroize::Zeroizing::new)
        .map_err(|_| ExchangeError("the credential's private key is not valid PEM".into()))
}

/// Trades `secret` for a token at the recipe's endpoint, through `egress`
/// as `caller` (whose declared hosts are the credential's bound hosts, so
/// the secret goes to no other).
pub(crate) async fn trade(
    egress: &crate::egress::Egress,
    caller: &crate::egress::Caller<'_>,
    exchange: &TokenExchange,
    secret: &SecretString,
    refresh_token: Option<&SecretString>,
) -> Result<Obtained, ExchangeError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (body, content_type) = exchange.request(secret, refresh_token, now)?;
    let request = crate::egress::OutboundRequest {
        method: crate::egress::Method::Post,
        url: exchange.token_url().to_owned(),
        headers: vec![("content-type".into(), content_type.into()), ("accept".into(), "application/json".into())],
        body: Some(body),
        credentials: Vec::new(),
        timeout_ms: Some(30_000),
    };
    let answer = egress
        .send(caller, request)
        .await
        .map_err(|e| ExchangeError(format!("the token endpoint could not be reached: {e}")))?;
    exchange.token(answer.status, &answer.body, now)
}

/// Whether `secret` can be used by `exchange` (a key that parses, for a
/// JWT); checked when the credential is made.
pub fn check_secret(exchange: &TokenExchange, secret: &SecretString) -> Result<(), String> {
    if let Grant::JwtBearer { algorithm, .. } = &exchange.grant {
        sign_jwt(*algorithm, None, &json!({}), secret).map_err(|e| e.0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(v: Value) -> TokenExchange {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn recipes_send_the_secret_only_to_a_bound_https_endpoint() {
        let hosts = vec!["auth.example.com".to_owned()];
        let ok = recipe(
            json!({ "grant": "client_credentials", "token_url": "https://auth.example.com/token", "client_id": "app" }),
        );
        assert_eq!(ok.check(&hosts), Ok(()));
        for bad in [
            json!({ "grant": "client_credentials", "token_url": "https://evil.example/token", "client_id": "app" }),
            json!({ "grant": "client_credentials", "token_url": "http://auth.example.com/token", "client_id": "app" }),
            json!({ "grant": "login", "token_url": "https://auth.example.com/login", "username": "me", "token_pointer": "token" }),
            json!({ "grant": "client_credentials", "token_url": "https://auth.example.com/t", "client_id": "a", "header": "Cookie" }),
        ] {
            assert!(recipe(bad.clone()).check(&hosts).is_err(), "{bad}");
        }
        assert!(serde_json::from_value::<TokenExchange>(json!({ "grant": "password", "token_url": "x" })).is_err());
    }

    #[test]
    fn an_es256_assertion_verifies_with_the_public_key() {
        use base64::Engine;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 =
            ring::signature::EcdsaKeyPair::generate_pkcs8(&ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let exchange = recipe(json!({ "grant": "jwt_bearer", "token_url": "https://auth.example.com/token",
            "issuer": "svc@example.com", "algorithm": "ES256", "scope": "read" }));
        let (body, kind) = exchange.request(&SecretString::from(pem), None, 1_700_000_000).unwrap();
        assert_eq!(kind, "application/x-www-form-urlencoded");
        let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
        assert_eq!(form["grant_type"], "urn:ietf:params:oauth:grant-type:jwt-bearer");
        let jwt = &form["assertion"];
        let (input, signature) = jwt.rsplit_once('.').unwrap();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            ring::signature::KeyPair::public_key(&key).as_ref(),
        )
        .verify(input.as_bytes(), &b64.decode(signature).unwrap())
        .expect("the assertion verifies");
        let claims: Value = serde_json::from_slice(&b64.decode(input.split('.').nth(1).unwrap()).unwrap()).unwrap();
        assert_eq!(claims["iss"], "svc@example.com");
        assert_eq!(claims["aud"], "https://auth.example.com/token");
        assert_eq!(claims["exp"], 1_700_000_300);
        assert!(check_secret(&exchange, &SecretString::from("not a key".to_owned())).is_err());
    }

    #[test]
    fn a_login_reads_its_token_where_the_recipe_says() {
        let exchange = recipe(json!({ "grant": "login", "token_url": "https://auth.example.com/login",
            "username": "me", "token_pointer": "/data/token", "lifetime_secs": 600 }));
        let (body, kind) = exchange.request(&SecretString::from("pw\"1".to_owned()), None, 0).unwrap();
        assert_eq!(kind, "application/json");
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({ "username": "me", "password": "pw\"1" }));
        let got = exchange.token(200, br#"{"data":{"token":"s-1"}}"#, 0).unwrap();
        assert_eq!((got.token.expose_secret(), got.expires_in), ("s-1", Some(600)));
        let got = exchange.token(200, br#"{"data":{"token":"s-2","expires_in":30}}"#, 0).unwrap();
        assert_eq!(got.expires_in, Some(30));
        let refused = exchange.token(401, br#"{"error":"invalid_grant","password":"pw"}"#, 0).unwrap_err();
        assert!(refused.0.contains("invalid_grant") && !refused.0.contains("pw"), "{refused}");
        assert!(exchange.token(200, br#"{"data":{}}"#, 0).unwrap_err().0.contains("/data/token"));
        let got = exchange.token(200, br#"{"data":{"token":4711}}"#, 0).unwrap();
        assert_eq!(got.token.expose_secret(), "4711", "a session number");
        for no_token in
            [&br#"{"data":{"token":null}}"#[..], br#"{"data":{"token":{"id":1}}}"#, br#"{"data":{"token":""}}"#]
        {
            assert!(exchange.token(200, no_token, 0).is_err());
        }
    }

    #[test]
    fn the_refresh_token_grant_sends_both_secrets_and_reads_the_one_rotated_to() {
        let exchange =
            recipe(json!({ "grant": "refresh_token", "token_url": "https://auth.example.com/t", "client_id": "c-1" }));
        assert!(exchange.refreshes());
        let secret = SecretString::from("client-secret-1".to_owned());
        let missing = exchange.request(&secret, None, 0).unwrap_err();
        assert!(missing.0.contains("no refresh token"), "{missing}");
        let refresh = SecretString::from("refresh-1&x".to_owned());
        let (body, kind) = exchange.request(&secret, Some(&refresh), 0).unwrap();
        assert_eq!(kind, "application/x-www-form-urlencoded");
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "grant_type=refresh_token&client_id=c-1&client_secret=client-secret-1&refresh_token=refresh-1%26x"
        );
        let got = exchange.token(200, br#"{"access_token":"a-1","refresh_token":"refresh-2"}"#, 0).unwrap();
        assert_eq!(got.refresh_token.as_ref().map(|t| t.expose_secret()), Some("refresh-2"));
        let kept = exchange.token(200, br#"{"access_token":"a-1","refresh_token":""}"#, 0).unwrap();
        assert!(kept.refresh_token.is_none());
        // Another grant's answer never replaces a refresh token.
        let client = recipe(json!({ "grant": "client_credentials", "token_url": "https://auth.example.com/t",
            "client_id": "c-1" }));
        assert!(!client.refreshes());
        assert!(client.token(200, br#"{"access_token":"a","refresh_token":"r"}"#, 0).unwrap().refresh_token.is_none());
    }

    #[test]
    fn scopes_go_as_the_cdk_sends_them_and_an_expiry_may_be_an_instant() {
        let exchange = recipe(json!({ "grant": "refresh_token", "token_url": "https://auth.example.com/t",
            "client_id": "c-1", "scopes": ["read_all", "activity:read_all"],
            "expiry_field": "expires_at", "expiry_is_time": true }));
        let refresh = SecretString::from("refresh-1".to_owned());
        let (body, _) = exchange.request(&SecretString::from("s".to_owned()), Some(&refresh), 0).unwrap();
        assert!(
            String::from_utf8(body).unwrap().ends_with("&scopes=read_all&scopes=activity%3Aread_all"),
            "one field per scope"
        );
        let now = 1_700_000_000;
        let got = exchange.token(200, br#"{"access_token":"a","expires_at":"2023-11-14T22:23:20Z"}"#, now).unwrap();
        assert_eq!(got.expires_in, Some(10 * 60));
        let got = exchange.token(200, br#"{"access_token":"a","expires_at":1700000030}"#, now).unwrap();
        assert_eq!(got.expires_in, Some(30));
        // A field the answer lacks: the default lifetime, as for expires_in.
        let got = exchange.token(200, br#"{"access_token":"a","expires_in":5}"#, now).unwrap();
        assert_eq!(got.expires_in, Some(DEFAULT_LIFETIME_SECS));
        let seconds = recipe(json!({ "grant": "client_credentials", "token_url": "https://auth.example.com/t",
            "client_id": "c-1", "expiry_field": "ttl" }));
        assert_eq!(seconds.token(200, br#"{"access_token":"a","ttl":"90"}"#, now).unwrap().expires_in, Some(90));
        let hosts = ["auth.example.com".to_owned()];
        for (bad, field) in [
            (json!({ "expiry_is_time": true }), "exchange.expiry_is_time"),
            (json!({ "expiry_field": "a/b" }), "exchange.expiry_field"),
            (json!({ "scopes": [""] }), "exchange.scopes"),
        ] {
            let mut v =
                json!({ "grant": "client_credentials", "token_url": "https://auth.example.com/t", "client_id": "c" });
            v.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
            assert!(recipe(v).check(&hosts).unwrap_err().starts_with(field));
        }
        let jwt = recipe(json!({ "grant": "login", "token_url": "https://auth.example.com/t", "username": "u",
            "token_pointer": "/t", "scopes": ["x"] }));
        assert!(jwt.check(&hosts).unwrap_err().starts_with("exchange.scopes"));
    }

    #[test]
    fn an_empty_refresh_token_is_sent_empty_and_never_kept() {
        let exchange = recipe(
            json!({ "grant": "refresh_token", "token_url": "https://auth.example.com/t?grant_type=client_credentials",
            "client_id": "c-1", "empty_refresh_token": true }),
        );
        assert!(!exchange.refreshes(), "the credential holds no refresh token");
        let (body, _) = exchange.request(&SecretString::from("s-1".to_owned()), None, 0).unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "grant_type=refresh_token&client_id=c-1&client_secret=s-1&refresh_token="
        );
        let got = exchange.token(200, br#"{"access_token":"a","refresh_token":"r-2"}"#, 0).unwrap();
        assert!(got.refresh_token.is_none());
    }
}
