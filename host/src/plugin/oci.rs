//! Components distributed through OCI registries, in the layout the Wasm
//! OCI artifact format (CNCF TAG Runtime) and the Bytecode Alliance's
//! `wkg` use: an image manifest whose config has media type
//! `application/vnd.wasm.config.v0+json` and whose one layer is the
//! component (`application/wasm`). A publisher's signature file rides in
//! the manifest's annotation [`SIGNATURE_ANNOTATION`], so the layer stays
//! the component itself and other tools read the artifact unchanged.
//!
//! Pulling trusts the registry for nothing: a manifest asked for by digest
//! must hash to it, a tag is resolved once to the digest of the manifest
//! it served, and the component must hash to the layer's digest; the
//! signature is then checked by the registry of plugins like any other.
//! Registries on a loopback address are spoken to over plain HTTP (a
//! registry on the same machine); every other one over HTTPS.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::signature;

/// The manifest annotation holding the signature file's text.
pub(crate) const SIGNATURE_ANNOTATION: &str = "dev.service.plugin.signature";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";
const LAYER_TYPE: &str = "application/wasm";
/// The most a manifest may weigh.
const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// The most a component may weigh.
const MAX_COMPONENT_BYTES: usize = 64 << 20;

/// `oci://REGISTRY/REPOSITORY` with a tag or a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    pub registry: String,
    pub repository: String,
    pub target: Target,
}

/// What a reference names in its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Tag(String),
    /// A manifest's SHA-256, hex.
    Digest(String),
}

/// Why a pull or push failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OciError {
    #[error("{0:.200}: not a reference of the form oci://REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]")]
    BadReference(String),
    #[error("{0}: {1}")]
    Network(String, String),
    #[error("{0} answered HTTP {1}")]
    Status(String, u16),
    #[error("{what} is larger than {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    #[error("the registry served {what} that does not match its digest: expected sha256:{expected}, got sha256:{got}")]
    DigestMismatch { what: &'static str, expected: String, got: String },
    #[error("not a Wasm component artifact: {0}")]
    NotAComponent(String),
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Tag(tag) => write!(f, "oci://{}/{}:{tag}", self.registry, self.repository),
            Target::Digest(d) => write!(f, "oci://{}/{}@sha256:{d}", self.registry, self.repository),
        }
    }
}

impl Reference {
    /// Parses `oci://…`; a reference with neither tag nor digest names the
    /// tag `latest`.
    pub(crate) fn parse(text: &str) -> Result<Reference, OciError> {
        Self::parse_or(text, "latest")
    }

    /// Parses `oci://…`; a reference with neither tag nor digest names the
    /// tag `default_tag`.
    pub(crate) fn parse_or(text: &str, default_tag: &str) -> Result<Reference, OciError> {
        let bad = || OciError::BadReference(text.to_owned());
        let rest = text.strip_prefix("oci://").ok_or_else(bad)?;
        let (registry, path) = rest.split_once('/').ok_or_else(bad)?;
        let registry_ok = !registry.is_empty()
            && registry.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        let (repository, target) = if let Some((repo, digest)) = path.split_once("@sha256:") {
            let ok = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !ok {
                return Err(bad());
            }
            (repo, Target::Digest(digest.to_owned()))
        } else {
            match path.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')) {
                Some((repo, tag)) => {
                    let ok = !tag.is_empty()
                        && tag.len() <= 128
                        && tag.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
                    if !ok {
                        return Err(bad());
                    }
                    (repo, Target::Tag(tag.to_owned()))
                }
                None => (path, Target::Tag(default_tag.to_owned())),
            }
        };
        let repository_ok = !repository.is_empty()
            && repository.split('/').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
            });
        if !registry_ok || !repository_ok {
            return Err(bad());
        }
        Ok(Reference { registry: registry.to_owned(), repository: repository.to_owned(), target })
    }

    /// The same repository, naming the manifest with `digest`.
    pub(crate) fn pinned(&self, digest: &str) -> Reference {
        Reference { target: Target::Digest(digest.to_owned()), ..self.clone() }
    }

    fn base(&self) -> String {
        let host = self.registry.rsplit_once(':').map_or(self.registry.as_str(), |(h, _)| h);
        let loopback = host == "localhost"
            || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        format!("{}://{}/v2/{}", if loopback { "http" } else { "https" }, self.registry, self.repository)
    }
}

/// A component pulled and checked against every digest involved.
#[derive(Debug)]
pub(crate) struct Pulled {
    /// The reference pinned to the manifest's digest.
    pub reference: Reference,
    pub component: Vec<u8>,
    /// The signature file's text, when the artifact carries one.
    pub signature: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    artifact_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("service/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .expect("an HTTP client builds")
}

fn network(url: &str, e: &reqwest::Error) -> OciError {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    OciError::Network(url.to_owned(), cause.to_string())
}

/// Reads a body of at most `limit` bytes.
async fn body(url: &str, mut res: reqwest::Response, what: &'static str, limit: usize) -> Result<Vec<u8>, OciError> {
    if !res.status().is_success() {
        return Err(OciError::Status(url.to_owned(), res.status().as_u16()));
    }
    if res.content_length().is_some_and(|n| n > limit as u64) {
        return Err(OciError::TooLarge { what, limit });
    }
    let mut out = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| network(url, &e))? {
        if out.len() + chunk.len() > limit {
            return Err(OciError::TooLarge { what, limit });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn hex_of(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Pulls a component artifact and checks the manifest and the component
/// against their digests.
pub(crate) async fn pull(reference: &Reference) -> Result<Pulled, OciError> {
    let http = client();
    let wanted = match &reference.target {
        Target::Tag(tag) => tag.clone(),
        Target::Digest(d) => format!("sha256:{d}"),
    };
    let url = format!("{}/manifests/{wanted}", reference.base());
    let res = http.get(&url).header("accept", MANIFEST_TYPE).send().await.map_err(|e| network(&url, &e))?;
    let manifest_bytes = body(&url, res, "the manifest", MAX_MANIFEST_BYTES).await?;
    let manifest_digest = signature::digest(&manifest_bytes);
    if let Target::Digest(expected) = &reference.target
        && *expected != manifest_digest
    {
        return Err(OciError::DigestMismatch { what: "a manifest", expected: expected.clone(), got: manifest_digest });
    }
    let manifest: Manifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| OciError::NotAComponent(format!("the manifest: {e}")))?;
    let layers: Vec<&Descriptor> = manifest.layers.iter().filter(|l| l.media_type == LAYER_TYPE).collect();
    let [layer] = layers.as_slice() else {
        return Err(OciError::NotAComponent(format!("{} layers of type {LAYER_TYPE}, not one", layers.len())));
    };
    let expected =
        hex_of(&layer.digest).ok_or_else(|| OciError::NotAComponent("a layer digest is no SHA-256".into()))?;
    if layer.size > MAX_COMPONENT_BYTES as u64 {
        return Err(OciError::TooLarge { what: "the component", limit: MAX_COMPONENT_BYTES });
    }
    let url = format!("{}/blobs/{}", reference.base(), layer.digest);
    let res = http.get(&url).send().await.map_err(|e| network(&url, &e))?;
    let component = body(&url, res, "the component", MAX_COMPONENT_BYTES).await?;
    let got = signature::digest(&component);
    if got != expected {
        return Err(OciError::DigestMismatch { what: "a component", expected: expected.to_owned(), got });
    }
    if !component.starts_with(b"\0asm") {
        return Err(OciError::NotAComponent("the layer is not WebAssembly".into()));
    }
    Ok(Pulled {
        reference: reference.pinned(&manifest_digest),
        component,
        signature: manifest.annotations.get(SIGNATURE_ANNOTATION).cloned(),
    })
}

/// Uploads one blob (monolithic upload) unless the registry has it.
async fn put_blob(http: &reqwest::Client, reference: &Reference, bytes: &[u8]) -> Result<String, OciError> {
    let digest = format!("sha256:{}", signature::digest(bytes));
    let head = format!("{}/blobs/{digest}", reference.base());
    if http.head(&head).send().await.is_ok_and(|r| r.status().is_success()) {
        return Ok(digest);
    }
    let start = format!("{}/blobs/uploads/", reference.base());
    let res = http.post(&start).send().await.map_err(|e| network(&start, &e))?;
    if res.status().as_u16() != 202 {
        return Err(OciError::Status(start, res.status().as_u16()));
    }
    let location = res
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| OciError::Status(start.clone(), 202))?;
    let mut upload = url::Url::parse(&start)
        .and_then(|base| base.join(location))
        .map_err(|e| OciError::Network(start.clone(), e.to_string()))?;
    upload.query_pairs_mut().append_pair("digest", &digest);
    let res = http
        .put(upload.as_str())
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .map_err(|e| network(upload.as_str(), &e))?;
    if res.status().as_u16() != 201 {
        return Err(OciError::Status(upload.to_string(), res.status().as_u16()));
    }
    Ok(digest)
}

/// Publishes a component (and its signature file's text) under
/// `reference`'s tag; returns the reference pinned to the manifest's
/// digest.
pub(crate) async fn push(
    reference: &Reference,
    component: &[u8],
    signature: Option<&str>,
) -> Result<Reference, OciError> {
    let Target::Tag(tag) = &reference.target else {
        return Err(OciError::BadReference(format!("{reference}: push to a tag, not a digest")));
    };
    let http = client();
    let layer = put_blob(&http, reference, component).await?;
    let config = serde_json::to_vec(&json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer],
    }))
    .unwrap_or_default();
    let config_digest = put_blob(&http, reference, &config).await?;
    let mut annotations = BTreeMap::new();
    if let Some(text) = signature {
        annotations.insert(SIGNATURE_ANNOTATION.to_owned(), text.to_owned());
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MANIFEST_TYPE.to_owned()),
        artifact_type: Some(CONFIG_TYPE.to_owned()),
        config: Descriptor { media_type: CONFIG_TYPE.to_owned(), digest: config_digest, size: config.len() as u64 },
        layers: vec![Descriptor { media_type: LAYER_TYPE.to_owned(), digest: layer, size: component.len() as u64 }],
        annotations,
    };
    let bytes = serde_json::to_vec(&manifest).unwrap_or_default();
    let url = format!("{}/manifests/{tag}", reference.base());
    let res = http
        .put(&url)
        .header("content-type", MANIFEST_TYPE)
        .body(bytes.clone())
        .send()
        .await
        .map_err(|e| network(&url, &e))?;
    if res.status().as_u16() != 201 {
        return Err(OciError::Status(url, res.status().as_u16()));
    }
    Ok(reference.pinned(&signature::digest(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_a_tag_a_digest_or_neither() {
        let r = Reference::parse("oci://127.0.0.1:5000/acme/source:1.2.0").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str()), ("127.0.0.1:5000", "acme/source"));
        assert_eq!(r.target, Target::Tag("1.2.0".into()));
        assert_eq!(r.base(), "http://127.0.0.1:5000/v2/acme/source");
        let d = "a".repeat(64);
        let r = Reference::parse(&format!("oci://ghcr.io/acme/source@sha256:{d}")).unwrap();
        assert_eq!(r.target, Target::Digest(d.clone()));
        assert_eq!(r.base(), "https://ghcr.io/v2/acme/source");
        assert_eq!(r.to_string(), format!("oci://ghcr.io/acme/source@sha256:{d}"));
        assert_eq!(Reference::parse("oci://ghcr.io/acme/source").unwrap().target, Target::Tag("latest".into()));
        for bad in [
            "ghcr.io/acme/source",
            "oci://ghcr.io",
            "oci://ghcr.io/Acme/source",
            "oci://ghcr.io/acme/source@sha256:abc",
            "oci://ghcr.io/acme//source",
            "oci://ghcr.io/acme/source:a b",
            "oci://user@evil/acme/source",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
