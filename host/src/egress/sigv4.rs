//! AWS Signature Version 4, for the requests the host makes to an
//! S3-compatible store with a workspace's access key, and to AWS Secrets
//! Manager with the operator's: the secret key never leaves the host, not
//! even in the request, which carries only a signature over its method,
//! path, query, chosen headers and body hash.
//!
//! What is signed, as AWS specifies it for S3: the method; the path as
//! sent (already encoded, never encoded twice); the query parameters
//! encoded and sorted; the `host` header (with the port when it is not
//! the scheme's default), `x-amz-content-sha256`, `x-amz-date` and the
//! caller's extra headers, lower-cased and sorted; and the body's SHA-256.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use url::Url;

/// An access key, and where it signs.
#[derive(Clone)]
pub(crate) struct AccessKey {
    pub access_key_id: String,
    pub secret_access_key: SecretString,
    pub region: String,
    /// `s3` for object stores, `secretsmanager` for AWS Secrets Manager.
    pub service: &'static str,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// The SHA-256 of an empty body, in hex.
pub(crate) const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The hex SHA-256 of a body, as `x-amz-content-sha256` carries it.
pub(crate) fn payload_sha256(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// Encodes `s` as SigV4 wants it: every byte but the unreserved
/// characters (`A-Z a-z 0-9 - _ . ~`) as `%XX` with upper-case digits;
/// `/` too unless `keep_slash`.
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The headers that sign a request to `url`: `x-amz-date`,
/// `x-amz-content-sha256` and `authorization`, to send with `extra` (which
/// are signed too). `url`'s path must already be encoded as
/// [`uri_encode`] does.
pub(crate) fn sign(
    key: &AccessKey,
    method: &str,
    url: &Url,
    extra: &[(&str, &str)],
    content_sha256: &str,
    at: DateTime<Utc>,
) -> Vec<(&'static str, String)> {
    let amz_date = at.format("%Y%m%dT%H%M%SZ").to_string();
    let day = &amz_date[..8];
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    };
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), host),
        ("x-amz-content-sha256".into(), content_sha256.to_owned()),
        ("x-amz-date".into(), amz_date.clone()),
    ];
    headers.extend(extra.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned())));
    headers.sort();
    let signed_headers = headers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(";");
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let mut query: Vec<(String, String)> =
        url.query_pairs().map(|(k, v)| (uri_encode(&k, false), uri_encode(&v, false))).collect();
    query.sort();
    let canonical_query = query.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    let canonical_request =
        format!("{method}\n{}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{content_sha256}", url.path());
    let scope = format!("{day}/{}/{}/aws4_request", key.region, key.service);
    let string_to_sign =
        format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request)));
    let mut signing_key = format!("AWS4{}", key.secret_access_key.expose_secret()).into_bytes();
    for part in [day, key.region.as_str(), key.service, "aws4_request"] {
        signing_key = hmac(&signing_key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&signing_key, string_to_sign.as_bytes()));
    vec![
        ("x-amz-date", amz_date),
        ("x-amz-content-sha256", content_sha256.to_owned()),
        (
            "authorization",
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed_headers},Signature={signature}",
                key.access_key_id
            ),
        ),
    ]
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn example_key() -> AccessKey {
        AccessKey {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: SecretString::from("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            region: "us-east-1".into(),
            service: "s3",
        }
    }

    /// The GET Object example of AWS's S3 documentation ("Signature
    /// Calculations for the Authorization Header"): its published
    /// signature.
    #[test]
    fn signs_the_documented_get_object_example() {
        let url = Url::parse("https://examplebucket.s3.amazonaws.com/test.txt").unwrap();
        let at = Utc.with_ymd_and_hms(2013, 5, 24, 0, 0, 0).unwrap();
        let headers = sign(&example_key(), "GET", &url, &[("Range", "bytes=0-9")], EMPTY_SHA256, at);
        let authorization = &headers.iter().find(|(n, _)| *n == "authorization").unwrap().1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        assert_eq!(payload_sha256(b""), EMPTY_SHA256);
    }

    /// Anything signed changes the signature: the path, a query value,
    /// the port, the body's hash, the secret.
    #[test]
    fn every_signed_part_counts() {
        let at = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let signature = |key: &AccessKey, url: &str, body: &str| {
            let url = Url::parse(url).unwrap();
            sign(key, "GET", &url, &[], body, at).into_iter().find(|(n, _)| *n == "authorization").unwrap().1
        };
        let key = example_key();
        let base = signature(&key, "https://s3.test/b/k?list-type=2&prefix=a", EMPTY_SHA256);
        assert_ne!(base, signature(&key, "https://s3.test/b/k2?list-type=2&prefix=a", EMPTY_SHA256));
        assert_ne!(base, signature(&key, "https://s3.test/b/k?list-type=2&prefix=b", EMPTY_SHA256));
        assert_ne!(base, signature(&key, "https://s3.test:9000/b/k?list-type=2&prefix=a", EMPTY_SHA256));
        assert_ne!(base, signature(&key, "https://s3.test/b/k?list-type=2&prefix=a", &payload_sha256(b"x")));
        let other = AccessKey { secret_access_key: SecretString::from("another"), ..example_key() };
        assert_ne!(base, signature(&other, "https://s3.test/b/k?list-type=2&prefix=a", EMPTY_SHA256));
        // Query order does not matter: parameters are sorted.
        assert_eq!(base, signature(&key, "https://s3.test/b/k?prefix=a&list-type=2", EMPTY_SHA256));
        assert!(!format!("{key:?}").contains("EXAMPLEKEY"), "the secret stays out of debug output");
    }

    #[test]
    fn encodes_as_sigv4_wants() {
        assert_eq!(uri_encode("a b/c~d_e.f-g", true), "a%20b/c~d_e.f-g");
        assert_eq!(uri_encode("a/b=c&é", false), "a%2Fb%3Dc%26%C3%A9");
    }
}
