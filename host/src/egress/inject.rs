//! Putting a secret where its credential says, in the request the host
//! sends (never in the one the plugin described): a query parameter of the
//! URL, or a field of a JSON or form body. Headers need no help here.
//!
//! Both rewrite only what they must: the rest of the plugin's query, and
//! the rest of a form body, stay byte for byte as the plugin wrote them.

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;
use zeroize::Zeroizing;

use super::EgressError;

/// `url` with every value of the query parameter `name` dropped (the
/// plugin's own, or a `[REDACTED]` one from a link it follows) and, with
/// `secret`, the parameter set to it.
pub(crate) fn query(url: &Url, name: &str, secret: Option<&SecretString>) -> Url {
    let kept: Vec<&str> = url
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
            url::form_urlencoded::parse(key.as_bytes()).next().is_none_or(|(k, _)| k != name)
        })
        .collect();
    let mut query = Zeroizing::new(kept.join("&"));
    if let Some(secret) = secret {
        if !query.is_empty() {
            query.push('&');
        }
        query.extend(url::form_urlencoded::byte_serialize(name.as_bytes()));
        query.push('=');
        query.extend(url::form_urlencoded::byte_serialize(secret.expose_secret().as_bytes()));
    }
    let mut out = url.clone();
    out.set_query(if query.is_empty() { None } else { Some(query.as_str()) });
    out
}

/// `url` with `secret` in its path where the plugin wrote the marker
/// (`connector_rules::path::CREDENTIAL_MARKER`), once; refused without it.
pub(crate) fn path(url: &Url, secret: &SecretString) -> Result<Url, EgressError> {
    let path =
        Zeroizing::new(connector_rules::path::with_secret(url.path(), secret.expose_secret()).ok_or_else(|| {
            EgressError::InvalidRequest(format!(
                "the credential goes into the URL's path: write {} there, once",
                connector_rules::path::CREDENTIAL_MARKER
            ))
        })?);
    let mut out = url.clone();
    out.set_path(&path);
    Ok(out)
}

/// Refuses a URL whose query still names the parameter `name` in a
/// spelling some servers read as it (another case, after a `;`, percent
/// encoded), once the exact spelling is dropped: the plugin's own value
/// must never stand beside, or before, the secret.
pub(crate) fn check_query(url: &Url, name: &str) -> Result<(), EgressError> {
    let kept = query(url, name, None);
    let lowered = name.to_ascii_lowercase();
    let names_it = |text: &str| {
        text.split(';').any(|segment| {
            let key = segment.split_once('=').map_or(segment, |(k, _)| k);
            key.trim().to_ascii_lowercase() == lowered
        })
    };
    let pairs = url::form_urlencoded::parse(kept.query().unwrap_or_default().as_bytes());
    for (key, value) in pairs {
        if names_it(&key) || value.split(';').skip(1).any(names_it) {
            return Err(EgressError::Denied(format!(
                "the URL names query parameter {name} another way; the host sets it and nothing else may"
            )));
        }
    }
    Ok(())
}

/// The kind of body a request carries, from its `Content-Type`.
fn body_kind(headers: &[(String, String)]) -> Option<BodyKind> {
    let content_type = headers.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case("content-type"))?.1.as_str();
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Some(BodyKind::Json),
        e if e.starts_with("application/") && e.ends_with("+json") => Some(BodyKind::Json),
        "application/x-www-form-urlencoded" => Some(BodyKind::Form),
        _ => None,
    }
}

enum BodyKind {
    Json,
    Form,
}

/// `body` with its field `field` set to `secret`: a top-level key of a
/// JSON object, or a JSON pointer (`/auth/password`) whose parent object
/// exists; or a form field (any value of it the plugin wrote is dropped).
pub(crate) fn body_field(
    headers: &[(String, String)],
    body: Option<&[u8]>,
    field: &str,
    secret: &SecretString,
) -> Result<Zeroizing<Vec<u8>>, EgressError> {
    let refuse = |why: &str| EgressError::InvalidRequest(format!("the credential goes into body field {field}: {why}"));
    // The host and the server must read the body as the same kind.
    if headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("content-type")).count() > 1 {
        return Err(refuse("the request has more than one content-type"));
    }
    let Some(kind) = body_kind(headers) else {
        return Err(refuse(
            "the request needs a JSON or form body (content-type application/json or application/x-www-form-urlencoded)",
        ));
    };
    let body = body.unwrap_or_default();
    match kind {
        BodyKind::Json => {
            let mut value: Value = if body.is_empty() {
                Value::Object(Default::default())
            } else {
                serde_json::from_slice(body).map_err(|_| refuse("the body is not JSON"))?
            };
            let (parent, key) = match field.strip_prefix('/') {
                Some(_) => {
                    let (parent, last) = field.rsplit_once('/').unwrap_or(("", field));
                    let key = last.replace("~1", "/").replace("~0", "~");
                    (value.pointer_mut(parent), key)
                }
                None => (Some(&mut value), field.to_owned()),
            };
            let Some(Value::Object(object)) = parent else {
                return Err(refuse("the body has no object there"));
            };
            object.insert(key, Value::String(secret.expose_secret().to_owned()));
            let bytes = Zeroizing::new(serde_json::to_vec(&value).map_err(|_| refuse("the body is not JSON"))?);
            // The tree held a copy of the secret.
            zero_strings(&mut value);
            Ok(bytes)
        }
        BodyKind::Form => {
            let text = std::str::from_utf8(body).map_err(|_| refuse("the form is not UTF-8"))?;
            let mut out = Zeroizing::new(String::with_capacity(text.len() + 64));
            for pair in text.split('&').filter(|p| !p.is_empty()) {
                let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                if url::form_urlencoded::parse(key.as_bytes()).next().is_some_and(|(k, _)| k == field) {
                    continue;
                }
                out.push_str(pair);
                out.push('&');
            }
            out.extend(url::form_urlencoded::byte_serialize(field.as_bytes()));
            out.push('=');
            out.extend(url::form_urlencoded::byte_serialize(secret.expose_secret().as_bytes()));
            Ok(Zeroizing::new(out.as_bytes().to_vec()))
        }
    }
}

/// Zeroises every string of `value`: a parsed document that held a secret.
pub(crate) fn zero_strings(value: &mut Value) {
    match value {
        Value::String(s) => zeroize::Zeroize::zeroize(s),
        Value::Array(items) => items.iter_mut().for_each(zero_strings),
        Value::Object(map) => map.values_mut().for_each(zero_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    #[test]
    fn the_query_parameter_is_set_once_and_the_rest_kept_as_written() {
        let url =
            Url::parse("https://api.example.com/items?b=a%20b&api_key=mine&page=2&api_key=%5BREDACTED%5D").unwrap();
        let sent = query(&url, "api_key", Some(&secret("k/y+&=1")));
        assert_eq!(sent.as_str(), "https://api.example.com/items?b=a%20b&page=2&api_key=k%2Fy%2B%26%3D1");
        assert_eq!(query(&url, "api_key", None).as_str(), "https://api.example.com/items?b=a%20b&page=2");
        let bare = Url::parse("https://api.example.com/items").unwrap();
        assert_eq!(query(&bare, "key", Some(&secret("s"))).as_str(), "https://api.example.com/items?key=s");
        assert_eq!(query(&bare, "key", None).as_str(), "https://api.example.com/items");
    }

    #[test]
    fn another_spelling_of_the_parameter_is_refused() {
        for bad in [
            "https://a.example/x?API_KEY=mine",
            "https://a.example/x?q=1;api_key=mine",
            "https://a.example/x?a;Api_Key=1",
        ] {
            assert!(check_query(&Url::parse(bad).unwrap(), "api_key").is_err(), "{bad}");
        }
        // The exact spelling (also percent-encoded) is dropped, not refused;
        // the name as a value is a value.
        for good in [
            "https://a.example/x?api_key=mine&page=2",
            "https://a.example/x?%61pi_key=mine",
            "https://a.example/x?api_keys=1",
            "https://a.example/x?q=api_key",
            "https://a.example/x",
        ] {
            assert!(check_query(&Url::parse(good).unwrap(), "api_key").is_ok(), "{good}");
        }
    }

    #[test]
    fn a_json_field_is_set_at_a_key_or_a_pointer() {
        let json = vec![("Content-Type".to_owned(), "application/json; charset=utf-8".to_owned())];
        let body = br#"{"user":"me","auth":{"x":1},"password":"guest's"}"#;
        let out = body_field(&json, Some(body), "password", &secret("p\"w")).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["password"], "p\"w");
        assert_eq!(v["user"], "me");
        let out = body_field(&json, Some(body), "/auth/key", &secret("k")).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap()["auth"], serde_json::json!({"x": 1, "key": "k"}));
        let out = body_field(&json, None, "password", &secret("k")).unwrap();
        assert_eq!(&out[..], br#"{"password":"k"}"#);
        for (bad, why) in [(&b"[1]"[..], "no object"), (b"nope", "not JSON")] {
            let e = body_field(&json, Some(bad), "password", &secret("k")).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        let e = body_field(&json, Some(body), "/missing/key", &secret("k")).unwrap_err().to_string();
        assert!(e.contains("no object"), "{e}");
    }

    #[test]
    fn a_form_field_replaces_the_plugins_and_other_bodies_are_refused() {
        let form = vec![("content-type".to_owned(), "application/x-www-form-urlencoded".to_owned())];
        let out = body_field(&form, Some(b"grant=a+b&password=x&z=%26"), "password", &secret("s &=")).unwrap();
        assert_eq!(&out[..], b"grant=a+b&z=%26&password=s+%26%3D");
        let text = vec![("content-type".to_owned(), "text/plain".to_owned())];
        let e = body_field(&text, Some(b"x"), "password", &secret("s")).unwrap_err().to_string();
        assert!(e.contains("JSON or form body") && !e.contains("s\""), "{e}");
        assert!(body_field(&[], Some(b"{}"), "password", &secret("s")).is_err(), "no content type");
        let two = vec![
            ("content-type".to_owned(), "text/plain".to_owned()),
            ("content-type".to_owned(), "application/x-www-form-urlencoded".to_owned()),
        ];
        assert!(body_field(&two, Some(b"a=1"), "password", &secret("s")).is_err(), "two content types");
    }
}
