//! Request signing: a credential whose secret never leaves the host, not
//! even in a header. The host computes an HMAC of the request as it sends
//! it (the parts the credential lists, joined by its separator) and adds
//! the signature, and the timestamp it signed, as headers.
//!
//! The recipe is the credential's, set when it is stored (for example
//! `{"algorithm": "hmac-sha256", "header": "X-Signature", "timestamp_header":
//! "X-Timestamp", "parts": ["timestamp", "method", "path", "body"]}`), so a
//! plugin cannot make the host sign a message of its choosing with a
//! recipe of its choosing.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use url::Url;

use super::Method;

/// How a credential signs requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signing {
    pub algorithm: Algorithm,
    /// The header the signature goes in.
    pub header: String,
    /// Text before the signature in that header (e.g. `sha256=`).
    #[serde(default)]
    pub prefix: String,
    /// The header the signed timestamp goes in, when one is signed.
    #[serde(default)]
    pub timestamp_header: Option<String>,
    /// What is signed, in this order.
    pub parts: Vec<Part>,
    /// What joins the parts.
    #[serde(default = "newline")]
    pub separator: String,
    #[serde(default)]
    pub encoding: Encoding,
}

fn newline() -> String {
    "\n".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Algorithm {
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    #[serde(rename = "hmac-sha512")]
    HmacSha512,
}

/// A part of the signed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// `GET`, `POST`, ...
    Method,
    /// The path, and `?query` when there is one.
    Path,
    /// The host name.
    Host,
    /// Seconds since the Unix epoch, as sent in `timestamp_header`.
    Timestamp,
    /// The body as sent (empty without one).
    Body,
    /// The body's SHA-256, in lower-case hex.
    BodySha256,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    #[default]
    Hex,
    Base64,
}

impl Signing {
    /// Checks a recipe as stored with a credential; the reason names the
    /// field.
    pub fn check(&self) -> Result<(), String> {
        let header_ok =
            |h: &str| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
        if !header_ok(&self.header) {
            return Err(format!("signing.header: '{}' is not a header name", self.header));
        }
        if connector_rules::headers::is_reserved(&self.header) {
            return Err(format!("signing.header: {} is the host's", self.header));
        }
        match &self.timestamp_header {
            Some(h) if !header_ok(h) || connector_rules::headers::is_reserved(h) => {
                return Err(format!("signing.timestamp_header: '{h}' is not a header name the host may set"));
            }
            None if self.parts.contains(&Part::Timestamp) => {
                return Err("signing.timestamp_header: a signed timestamp must be sent too".into());
            }
            _ => {}
        }
        if self.parts.is_empty() || self.parts.len() > 8 {
            return Err("signing.parts: one to eight of method, path, host, timestamp, body, body_sha256".into());
        }
        if self.prefix.len() > 64 || self.separator.len() > 8 || self.prefix.chars().any(char::is_control) {
            return Err("signing.prefix or signing.separator is too long or holds control characters".into());
        }
        Ok(())
    }

    /// The headers to add to a request of `method` to `url` with `body`,
    /// signed with `secret` at `now` (Unix seconds).
    pub(crate) fn headers(
        &self,
        secret: &SecretString,
        method: Method,
        url: &Url,
        body: &[u8],
        now: u64,
    ) -> Vec<(String, String)> {
        let timestamp = now.to_string();
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let mut message: Vec<u8> = Vec::with_capacity(body.len() + 128);
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                message.extend_from_slice(self.separator.as_bytes());
            }
            match part {
                Part::Method => message.extend_from_slice(method.as_str().as_bytes()),
                Part::Path => message.extend_from_slice(path.as_bytes()),
                Part::Host => message.extend_from_slice(url.host_str().unwrap_or_default().as_bytes()),
                Part::Timestamp => message.extend_from_slice(timestamp.as_bytes()),
                Part::Body => message.extend_from_slice(body),
                Part::BodySha256 => {
                    use sha2::Digest;
                    message.extend_from_slice(hex::encode(sha2::Sha256::digest(body)).as_bytes());
                }
            }
        }
        let key = secret.expose_secret().as_bytes();
        let mac = match self.algorithm {
            Algorithm::HmacSha256 => {
                let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(&message);
                m.finalize().into_bytes().to_vec()
            }
            Algorithm::HmacSha512 => {
                let mut m = <Hmac<sha2::Sha512> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(&message);
                m.finalize().into_bytes().to_vec()
            }
        };
        let signature = match self.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(mac)
            }
        };
        let mut headers = vec![(self.header.to_ascii_lowercase(), format!("{}{signature}", self.prefix))];
        if let Some(h) = &self.timestamp_header {
            headers.push((h.to_ascii_lowercase(), timestamp));
        }
        headers
    }

    /// The header names the host sets; the plugin's own are dropped.
    pub(crate) fn header_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.header.as_str()).chain(self.timestamp_header.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_an_hmac_of_the_listed_parts() {
        let signing: Signing = serde_json::from_value(serde_json::json!({
            "algorithm": "hmac-sha256", "header": "X-Signature", "prefix": "v1=", "timestamp_header": "X-Timestamp",
            "parts": ["timestamp", "method", "path", "body_sha256"]
        }))
        .unwrap();
        assert_eq!(signing.check(), Ok(()));
        let url = Url::parse("https://api.example.com/v2/orders?since=1").unwrap();
        let secret = SecretString::from("key".to_owned());
        let headers = signing.headers(&secret, Method::Post, &url, b"{}", 1_700_000_000);
        // The message, computed by hand: timestamp, method, path and query,
        // the body's SHA-256.
        let message =
            "1700000000\nPOST\n/v2/orders?since=1\n44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"key").unwrap();
        mac.update(message.as_bytes());
        let expected = format!("v1={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(headers, vec![("x-signature".into(), expected), ("x-timestamp".into(), "1700000000".into())]);
    }

    #[test]
    fn recipes_that_would_steer_the_request_are_refused() {
        let with = |v: serde_json::Value| serde_json::from_value::<Signing>(v).map_err(|e| e.to_string());
        let bad = [
            serde_json::json!({ "algorithm": "hmac-sha256", "header": "Authorization", "parts": ["body"] }),
            serde_json::json!({ "algorithm": "hmac-sha256", "header": "X-Sig", "parts": [] }),
            serde_json::json!({ "algorithm": "hmac-sha256", "header": "X-Sig", "parts": ["timestamp"] }),
            serde_json::json!({ "algorithm": "hmac-sha256", "header": "X Sig", "parts": ["body"] }),
        ];
        for recipe in bad {
            assert!(with(recipe.clone()).unwrap().check().is_err(), "{recipe}");
        }
        assert!(with(serde_json::json!({ "algorithm": "md5", "header": "X-Sig", "parts": ["body"] })).is_err());
    }
}
