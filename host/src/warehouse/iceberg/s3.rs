//! Lakehouse warehouses in an S3-compatible object store: the bucket (and
//! prefix) a destination names, reached over HTTPS at its endpoint with
//! the workspace's access key.
//!
//! The host makes every request itself and signs it (AWS Signature
//! Version 4, [`super::sigv4`]): the secret key, revealed by the
//! vault for the endpoint's host only, never leaves the process. The
//! endpoint obeys the operator's warehouse policy like a database
//! destination's host, through the egress's one address policy and pinned
//! client (`egress::reach`, [`Reach::Warehouses`](crate::egress::Reach)):
//! its name must be allowed (`SERVICE_WAREHOUSE_ALLOWED_HOSTS`), every
//! address it resolves to must be a global one or in a network the
//! operator listed, and the connections go to exactly those addresses (a
//! second DNS answer cannot move them); the certificate is verified
//! against the system's roots and the operator's extra ones. Requests are path-style
//! (`https://endpoint/bucket/key`), which every S3-compatible store
//! serves, and reach only keys under the warehouse's prefix: a path
//! outside it (from a catalog row or a metadata file) is refused, not
//! fetched. Redirects are not followed.
//!
//! A file is written with one `PUT` when it is closed (a Parquet file
//! holds at most about 32 MB, and metadata files are small), and read with
//! ranged `GET`s. Writing a file returns once it is stored, so a manifest or a
//! metadata file is never stored before the files it names. A request
//! that fails on the way, or that the store answers with a 5xx or 429, is
//! tried up to [`ATTEMPTS`] times.
//!
//! The bucket's owner decides what its objects hold, so no answer is read
//! past a limit: a metadata file (or any object read whole), a manifest, a
//! listing page each have their own (`SERVICE_WAREHOUSE_MAX_*_MB`), a
//! ranged read stops at the range's length, and an announced length over
//! the limit is refused before a byte of the body is read.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use iceberg::io::{FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig, StorageFactory};
use iceberg::{Error, ErrorKind, Result};
use secrecy::SecretString;
use url::Url;

use crate::config::warehouse::ObjectReadLimits;
use crate::egress::reach::{PinnedClient, Rules};
use crate::egress::sigv4::{self, AccessKey};
use crate::warehouse::postgres::WarehousePolicy;
use crate::warehouse::{WriteError, unreachable};

/// Where an S3 warehouse is and how it is reached, as a destination's
/// configuration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Warehouse {
    pub bucket: String,
    /// Folders under the bucket, without leading or trailing `/` (may be
    /// empty).
    pub prefix: String,
    /// `https://host[:port]`.
    pub endpoint: Url,
    pub region: String,
    /// The credential holding the secret access key, bound to the
    /// endpoint's host.
    pub credential_handle: String,
}

impl S3Warehouse {
    /// `s3://bucket[/prefix]`: where the warehouse's tables are.
    pub fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// The endpoint's host name (or address).
    pub fn host(&self) -> &str {
        self.endpoint.host_str().unwrap_or_default()
    }
}

/// Requests are tried this many times when the store or the network fails.
pub(crate) const ATTEMPTS: u32 = 3;

/// A connection to one warehouse's bucket.
#[derive(Clone)]
pub struct ObjectStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    endpoint: Url,
    bucket: String,
    /// `prefix/`, or empty: every key reached starts with it.
    prefix: String,
    key: AccessKey,
    reads: ObjectReadLimits,
}

/// The most of one answer that is read, and what that limit is called.
#[derive(Debug, Clone, Copy)]
struct ReadLimit {
    bytes: usize,
    /// `metadata`, `manifest`, `listing page`, `range`, ...
    what: &'static str,
    /// The setting that changes it, if any.
    setting: Option<&'static str>,
}

/// Answers worth no more than their status and the store's error code:
/// a refusal's body, a `PUT`'s, a `DELETE`'s. Read this far and no further.
const SMALL_ANSWER: usize = 64 * 1024;

impl ReadLimit {
    const SMALL: ReadLimit = ReadLimit { bytes: SMALL_ANSWER, what: "answer", setting: None };

    fn exceeded(&self, method: &str, path: &str) -> Error {
        let setting = self.setting.map(|s| format!(" ({s})")).unwrap_or_default();
        Error::new(
            ErrorKind::DataInvalid,
            format!(
                "{method} {path}: the object store's answer is larger than the {} limit of {} bytes{setting}; nothing more was read",
                self.what, self.bytes
            ),
        )
    }
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("bucket", &self.inner.bucket)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// An object a listing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// `s3://bucket/key`.
    pub location: String,
    pub bytes: u64,
    /// When it was last written, as the store says (RFC 3339).
    pub last_modified: String,
}

impl ObjectStore {
    /// Checks the endpoint against the operator's policy and opens a
    /// client that connects only to the addresses checked.
    pub async fn connect(
        warehouse: &S3Warehouse,
        (access_key_id, secret_access_key): (String, SecretString),
        policy: &WarehousePolicy,
        extra_roots: &[reqwest::Certificate],
    ) -> std::result::Result<ObjectStore, WriteError> {
        let host = warehouse.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = warehouse.endpoint.port_or_known_default().unwrap_or(443);
        let pinned = PinnedClient::new(concat!("service-lakehouse/", env!("CARGO_PKG_VERSION")), extra_roots, |b| {
            b.https_only(true).connect_timeout(Duration::from_secs(10)).timeout(Duration::from_secs(300))
        })
        .map_err(|e| WriteError::Destination(format!("cannot open the object store: {e}")))?;
        pinned
            .check(&Rules::warehouses(policy), &host, port)
            .await
            .map_err(|e| unreachable(e, "cannot reach the object store"))?;
        let client = pinned.client().clone();
        let prefix = if warehouse.prefix.is_empty() { String::new() } else { format!("{}/", warehouse.prefix) };
        Ok(ObjectStore {
            inner: Arc::new(Inner {
                client,
                endpoint: warehouse.endpoint.clone(),
                bucket: warehouse.bucket.clone(),
                prefix,
                key: AccessKey { access_key_id, secret_access_key, region: warehouse.region.clone(), service: "s3" },
                reads: policy.reads,
            }),
        })
    }

    /// The key of `location` (`s3://bucket/key`), if it is in this
    /// warehouse: the bucket and the prefix must match, and no segment may
    /// be empty, `.` or `..`.
    fn key_of<'a>(&self, location: &'a str) -> Result<&'a str> {
        let outside = || {
            Error::new(
                ErrorKind::DataInvalid,
                format!("{location} is outside the warehouse s3://{}/{}", self.inner.bucket, self.inner.prefix),
            )
        };
        let rest = location.strip_prefix("s3://").ok_or_else(outside)?;
        let (bucket, key) = rest.split_once('/').ok_or_else(outside)?;
        let plain = key.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
        if bucket != self.inner.bucket || !key.starts_with(&self.inner.prefix) || !plain {
            return Err(outside());
        }
        Ok(key)
    }

    /// `https://endpoint/bucket/key`, the key encoded as SigV4 wants.
    fn object_url(&self, key: &str) -> Url {
        let mut url = self.inner.endpoint.clone();
        url.set_path(&format!("/{}/{}", self.inner.bucket, sigv4::uri_encode(key, true)));
        url
    }

    /// Sends one signed request, tried again when the network or the
    /// store fails; the answer, whatever its status, read up to `limit`
    /// (a larger success is an error naming the limit; a refusal's body is
    /// cut at [`SMALL_ANSWER`]).
    async fn send(
        &self,
        method: reqwest::Method,
        url: &Url,
        extra: &[(&str, &str)],
        body: Bytes,
        limit: ReadLimit,
    ) -> Result<(reqwest::StatusCode, reqwest::header::HeaderMap, Bytes)> {
        let content_sha256 =
            if body.is_empty() { sigv4::EMPTY_SHA256.to_owned() } else { sigv4::payload_sha256(&body) };
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << (2 * attempt))).await;
            }
            let mut request = self.inner.client.request(method.clone(), url.clone());
            for (name, value) in extra {
                request = request.header(*name, *value);
            }
            let signed = sigv4::sign(&self.inner.key, method.as_str(), url, extra, &content_sha256, chrono::Utc::now());
            for (name, value) in signed {
                request = request.header(name, value);
            }
            if !body.is_empty() || method == reqwest::Method::PUT {
                request = request.body(body.clone());
            }
            let answer = match request.send().await {
                Ok(response) => read_answer(response, &method, url, limit).await?,
                Err(e) => Err(e.to_string()),
            };
            match answer {
                Ok((status, ..)) if status.is_server_error() || status.as_u16() == 429 => {
                    last = Some(format!("the store answered {status}"));
                }
                Ok(answer) => return Ok(answer),
                Err(e) => last = Some(e),
            }
        }
        Err(Error::new(ErrorKind::Unexpected, format!("{method} {}: {}", url.path(), last.unwrap_or_default()))
            .with_retryable(true))
    }

    /// The limit of a whole read of `key`: manifests (Avro) have theirs,
    /// anything else is held to the metadata limit.
    fn whole_read_limit(&self, key: &str) -> ReadLimit {
        let reads = &self.inner.reads;
        if key.ends_with(".avro") {
            ReadLimit {
                bytes: reads.manifest_bytes,
                what: "manifest",
                setting: Some("SERVICE_WAREHOUSE_MAX_MANIFEST_MB"),
            }
        } else {
            ReadLimit {
                bytes: reads.metadata_bytes,
                what: "metadata",
                setting: Some("SERVICE_WAREHOUSE_MAX_METADATA_MB"),
            }
        }
    }

    /// An error for an answer that is not a success, with the store's code.
    fn refused(method: &str, key: &str, status: reqwest::StatusCode, body: &[u8]) -> Error {
        let code = xml_text(body, "Code").unwrap_or_default();
        let message = xml_text(body, "Message").unwrap_or_default();
        let kind =
            if status == reqwest::StatusCode::NOT_FOUND { ErrorKind::DataInvalid } else { ErrorKind::Unexpected };
        Error::new(
            kind,
            format!("{method} {key}: the object store answered {status} {code} {message}").trim().to_owned(),
        )
    }

    /// Sends one signed request for `key`; an answer whose status
    /// `accepted` refuses is an error naming the store's code.
    async fn on_object(
        &self,
        method: reqwest::Method,
        key: &str,
        extra: &[(&str, &str)],
        body: Bytes,
        accepted: fn(&reqwest::StatusCode) -> bool,
        limit: ReadLimit,
    ) -> Result<(reqwest::StatusCode, reqwest::header::HeaderMap, Bytes)> {
        let (status, headers, answer) = self.send(method.clone(), &self.object_url(key), extra, body, limit).await?;
        if !accepted(&status) {
            return Err(Self::refused(method.as_str(), key, status, &answer));
        }
        Ok((status, headers, answer))
    }

    async fn head(&self, key: &str) -> Result<Option<u64>> {
        let (status, headers, _) =
            self.on_object(reqwest::Method::HEAD, key, &[], Bytes::new(), success_or_missing, ReadLimit::SMALL).await?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let length = headers
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, format!("HEAD {key}: no Content-Length")))?;
        Ok(Some(length))
    }

    async fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Bytes> {
        let wanted = range.as_ref().map(|r| format!("bytes={}-{}", r.start, r.end.saturating_sub(1)));
        let extra: Vec<(&str, &str)> = wanted.iter().map(|r| ("range", r.as_str())).collect();
        if range.as_ref().is_some_and(|r| r.is_empty()) {
            return Ok(Bytes::new());
        }
        // A range is read to its length and no further; a whole object to
        // its kind's limit.
        let limit = match &range {
            Some(r) => ReadLimit {
                bytes: usize::try_from(r.end - r.start).unwrap_or(usize::MAX),
                what: "requested range",
                setting: None,
            },
            None => self.whole_read_limit(key),
        };
        let (_, _, body) = self
            .on_object(reqwest::Method::GET, key, &extra, Bytes::new(), reqwest::StatusCode::is_success, limit)
            .await?;
        if let Some(r) = range
            && body.len() as u64 != r.end - r.start
        {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("GET {key}: asked for {} bytes, got {}", r.end - r.start, body.len()),
            ));
        }
        Ok(body)
    }

    async fn put(&self, key: &str, body: Bytes) -> Result<()> {
        self.on_object(reqwest::Method::PUT, key, &[], body, reqwest::StatusCode::is_success, ReadLimit::SMALL)
            .await
            .map(drop)
    }

    async fn delete_key(&self, key: &str) -> Result<()> {
        self.on_object(reqwest::Method::DELETE, key, &[], Bytes::new(), success_or_missing, ReadLimit::SMALL)
            .await
            .map(drop)
    }

    /// Every object under `location` (a folder of this warehouse, or the
    /// warehouse itself when `None`), a page of the listing at a time.
    pub async fn list(&self, location: Option<&str>) -> Result<Vec<Listed>> {
        let prefix = match location {
            Some(location) => format!("{}/", self.key_of(location.trim_end_matches('/'))?),
            None => self.inner.prefix.clone(),
        };
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = self.inner.endpoint.clone();
            url.set_path(&format!("/{}", self.inner.bucket));
            let mut query = format!("list-type=2&prefix={}", sigv4::uri_encode(&prefix, false));
            if let Some(t) = &token {
                query.push_str(&format!("&continuation-token={}", sigv4::uri_encode(t, false)));
            }
            url.set_query(Some(&query));
            let page_limit = ReadLimit {
                bytes: self.inner.reads.listing_page_bytes,
                what: "listing page",
                setting: Some("SERVICE_WAREHOUSE_MAX_LISTING_MB"),
            };
            let (status, _, body) = self.send(reqwest::Method::GET, &url, &[], Bytes::new(), page_limit).await?;
            if !status.is_success() {
                return Err(Self::refused("LIST", &prefix, status, &body));
            }
            let page = std::str::from_utf8(&body)
                .map_err(|_| Error::new(ErrorKind::Unexpected, "the object store's listing is not UTF-8"))?;
            for contents in xml_elements(page, "Contents") {
                let (Some(key), Some(size)) =
                    (xml_text(contents.as_bytes(), "Key"), xml_text(contents.as_bytes(), "Size"))
                else {
                    continue;
                };
                found.push(Listed {
                    location: format!("s3://{}/{key}", self.inner.bucket),
                    bytes: size.parse().unwrap_or(0),
                    last_modified: xml_text(contents.as_bytes(), "LastModified").unwrap_or_default(),
                });
            }
            let truncated = xml_text(body.as_ref(), "IsTruncated").is_some_and(|t| t == "true");
            token = xml_text(body.as_ref(), "NextContinuationToken");
            if !truncated || token.is_none() {
                return Ok(found);
            }
        }
    }

    /// Removes the object at `location`.
    pub async fn delete(&self, location: &str) -> Result<()> {
        let key = self.key_of(location)?;
        self.delete_key(key).await
    }

    /// A file I/O over this store, for the catalog and the writers.
    pub fn file_io(&self) -> iceberg::io::FileIO {
        iceberg::io::FileIOBuilder::new(Arc::new(S3StorageFactory(self.clone()))).build()
    }
}

/// Reads an answer within `limit`. The outer error is final (a success
/// larger than the limit: reading it again would not make it smaller); the
/// inner one is the network failing on the way, worth another attempt.
async fn read_answer(
    mut response: reqwest::Response,
    method: &reqwest::Method,
    url: &Url,
    limit: ReadLimit,
) -> Result<std::result::Result<(reqwest::StatusCode, reqwest::header::HeaderMap, Bytes), String>> {
    let status = response.status();
    let headers = response.headers().clone();
    if *method == reqwest::Method::HEAD {
        return Ok(Ok((status, headers, Bytes::new())));
    }
    // A refusal's body is only read for its code: cut, never an error.
    let cut = !status.is_success();
    let cap = if cut { SMALL_ANSWER } else { limit.bytes };
    let announced = response.content_length().unwrap_or(0);
    if !cut && announced > cap as u64 {
        return Err(limit.exceeded(method.as_str(), url.path()));
    }
    let mut body = BytesMut::with_capacity((announced as usize).min(cap));
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    if cut {
                        body.extend_from_slice(&chunk[..cap - body.len()]);
                        break;
                    }
                    return Err(limit.exceeded(method.as_str(), url.path()));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Ok(Err(e.to_string())),
        }
    }
    Ok(Ok((status, headers, body.freeze())))
}

/// A success, or "no such object" (which a `HEAD` reports and a `DELETE`
/// of an object already gone accepts).
fn success_or_missing(status: &reqwest::StatusCode) -> bool {
    status.is_success() || *status == reqwest::StatusCode::NOT_FOUND
}

/// The text of the first `<name>` element of an S3 XML answer, with the
/// five XML entities and character references decoded.
fn xml_text(xml: &[u8], name: &str) -> Option<String> {
    let xml = std::str::from_utf8(xml).ok()?;
    xml_elements(xml, name).next().map(unescape)
}

/// The contents of each `<name>…</name>` element, in order (S3's answers
/// have no attributes on these and never nest an element in itself).
fn xml_elements<'a>(xml: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let inner = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(inner)
    })
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let entity = &rest[at + 1..at + end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(std::result::Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&rest[at..=at + end]),
        }
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Hands the catalog's file I/O its store (a connection, which no
/// configuration could describe).
#[derive(Debug, Clone)]
struct S3StorageFactory(ObjectStore);

/// A live connection has no serialised form: the file I/O of a lakehouse
/// is built in the process that uses it, never shipped.
impl serde::Serialize for ObjectStore {
    fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("an object-store connection cannot be serialised"))
    }
}

impl<'de> serde::Deserialize<'de> for ObjectStore {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Err(serde::de::Error::custom("an object-store connection cannot be deserialised"))
    }
}

impl serde::Serialize for S3StorageFactory {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for S3StorageFactory {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        ObjectStore::deserialize(d).map(S3StorageFactory)
    }
}

#[typetag::serde]
impl StorageFactory for S3StorageFactory {
    fn build(&self, _: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStore {
    async fn exists(&self, path: &str) -> Result<bool> {
        Ok(self.head(self.key_of(path)?).await?.is_some())
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let key = self.key_of(path)?;
        let size = self
            .head(key)
            .await?
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, format!("{path} does not exist")))?;
        Ok(FileMetadata { size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.get(self.key_of(path)?, None).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let key = self.key_of(path)?.to_owned();
        Ok(Box::new(ObjectRead { store: self.clone(), key }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        self.put(self.key_of(path)?, bs).await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let key = self.key_of(path)?.to_owned();
        Ok(Box::new(ObjectWrite { store: self.clone(), key, buffer: Some(BytesMut::new()) }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        ObjectStore::delete(self, path).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        for listed in self.list(Some(path)).await? {
            ObjectStore::delete(self, &listed.location).await?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            ObjectStore::delete(self, &path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.key_of(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.key_of(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// Ranged reads of one object.
struct ObjectRead {
    store: ObjectStore,
    key: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store.get(&self.key, Some(range)).await
    }
}

/// An object written when it is closed.
struct ObjectWrite {
    store: ObjectStore,
    key: String,
    buffer: Option<BytesMut>,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let buffer = self.buffer.as_mut().ok_or_else(|| Error::new(ErrorKind::DataInvalid, "the file is closed"))?;
        buffer.extend_from_slice(&bs);
        Ok(())
    }

    /// Stores the file, and returns once it is stored: whatever names it
    /// is written after it. (Uploading while the next batch is encoded was
    /// measured slower: the writer, no longer held back, wrote smaller
    /// batches, so more files and requests.)
    async fn close(&mut self) -> Result<()> {
        let buffer = self.buffer.take().ok_or_else(|| Error::new(ErrorKind::DataInvalid, "the file is closed"))?;
        self.store.put(&self.key, buffer.freeze()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (String, SecretString) {
        ("AKID".into(), SecretString::from("secret"))
    }

    async fn store(prefix: &str) -> ObjectStore {
        let warehouse = S3Warehouse {
            bucket: "lake".into(),
            prefix: prefix.into(),
            endpoint: Url::parse("https://127.0.0.1:9").unwrap(),
            region: "us-east-1".into(),
            credential_handle: "cred".into(),
        };
        let policy = WarehousePolicy::from_settings("127.0.0.1").unwrap();
        ObjectStore::connect(&warehouse, key(), &policy, &[]).await.unwrap()
    }

    /// A store at `router` over HTTPS on loopback (warehouse
    /// `s3://lake/t`), under `policy`; the fake stops when dropped.
    async fn fake_store(
        router: axum::Router,
        policy: &WarehousePolicy,
    ) -> (ObjectStore, testkit::provider::FakeProvider) {
        let ca = testkit::provider::TestCa::new();
        let provider = testkit::provider::FakeProvider::start(&ca, &["127.0.0.1"], router).await;
        let warehouse = S3Warehouse {
            bucket: "lake".into(),
            prefix: "t".into(),
            endpoint: Url::parse(&format!("https://127.0.0.1:{}", provider.addr.port())).unwrap(),
            region: "us-east-1".into(),
            credential_handle: "cred".into(),
        };
        let roots = reqwest::Certificate::from_pem_bundle(ca.pem.as_bytes()).unwrap();
        (ObjectStore::connect(&warehouse, key(), policy, &roots).await.unwrap(), provider)
    }

    /// A location from a catalog row or a metadata file reaches no key
    /// outside the warehouse: another bucket, another prefix, a prefix
    /// that only starts the same, `..` or an empty segment.
    #[tokio::test]
    async fn locations_outside_the_warehouse_are_refused() {
        let store = store("tenant/lake").await;
        assert_eq!(
            store.key_of("s3://lake/tenant/lake/ns/t/data/a.parquet").unwrap(),
            "tenant/lake/ns/t/data/a.parquet"
        );
        for outside in [
            "s3://other/tenant/lake/ns/t/a.parquet",
            "s3://lake/tenant/other/a.parquet",
            "s3://lake/tenant/lake2/a.parquet",
            "s3://lake/tenant/lake/../other/a.parquet",
            "s3://lake/tenant/lake//a.parquet",
            "s3://lake/tenant/lake/./a.parquet",
            "file:///etc/passwd",
            "s3://lake",
        ] {
            assert!(store.key_of(outside).is_err(), "{outside} was let through");
            assert!(store.new_input(outside).is_err(), "{outside} was opened");
        }
        let whole_bucket = self::store("").await;
        assert!(whole_bucket.key_of("s3://lake/any/key").is_ok());
        assert!(whole_bucket.key_of("s3://other/any/key").is_err());
    }

    /// An endpoint the operator does not allow, or one resolving to a
    /// private address the operator did not list, is never connected to.
    #[tokio::test]
    async fn endpoints_follow_the_warehouse_policy() {
        let mut warehouse = S3Warehouse {
            bucket: "lake".into(),
            prefix: String::new(),
            endpoint: Url::parse("https://10.1.2.3").unwrap(),
            region: "us-east-1".into(),
            credential_handle: "cred".into(),
        };
        let policy = WarehousePolicy::from_settings("localhost,127.0.0.2").unwrap();
        let refused = ObjectStore::connect(&warehouse, key(), &policy, &[]).await.unwrap_err();
        assert!(refused.to_string().contains("not a warehouse host the operator allows"), "{refused}");
        // Allowed by name, but it resolves to a loopback address no listed
        // network holds.
        warehouse.endpoint = Url::parse("https://localhost").unwrap();
        let refused = ObjectStore::connect(&warehouse, key(), &policy, &[]).await.unwrap_err();
        let said = refused.to_string();
        assert!(said.contains("resolves to a loopback address, which the operator does not allow"), "{said}");
        assert!(
            !said.contains("127.0.0.1") && !said.contains("::1"),
            "the address is the log's, not the member's: {said}"
        );
    }

    #[test]
    fn reads_the_parts_of_a_listing() {
        let page = "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>\
            <Contents><Key>a/b&amp;c.parquet</Key><LastModified>2026-11-27T05:00:00.000Z</LastModified><Size>12</Size></Contents>\
            <Contents><Key>a/d&#x20;e</Key><Size>3</Size></Contents>\
            <NextContinuationToken>tok/+=</NextContinuationToken></ListBucketResult>";
        let keys: Vec<String> = xml_elements(page, "Contents").filter_map(|c| xml_text(c.as_bytes(), "Key")).collect();
        assert_eq!(keys, ["a/b&c.parquet", "a/d e"]);
        assert_eq!(xml_text(page.as_bytes(), "NextContinuationToken").as_deref(), Some("tok/+="));
        assert_eq!(xml_text(page.as_bytes(), "IsTruncated").as_deref(), Some("true"));
        assert_eq!(xml_text(page.as_bytes(), "Missing"), None);
        assert_eq!(unescape("&bogus; &amp"), "&bogus; &amp");
    }

    /// A bucket's owner cannot make the server read any amount: a metadata
    /// file, a manifest or a listing page over its limit is refused by its
    /// announced length before its body, or cut off at the limit when it
    /// announces none, and the error names the limit and its setting.
    #[tokio::test]
    async fn no_answer_is_read_past_its_limit() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const HUGE: usize = 512 * 1024 * 1024;
        const CHUNK: usize = 64 * 1024;
        let served = Arc::new(AtomicUsize::new(0));
        let counter = served.clone();
        let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let counter = counter.clone();
            async move {
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                // 512 MiB made as it is sent, counted as it goes.
                let huge = || {
                    let counter = counter.clone();
                    axum::body::Body::from_stream(futures_util::stream::unfold(0usize, move |sent| {
                        let counter = counter.clone();
                        async move {
                            (sent < HUGE).then(|| {
                                counter.fetch_add(CHUNK, std::sync::atomic::Ordering::SeqCst);
                                (Ok::<_, std::convert::Infallible>(Bytes::from(vec![b'x'; CHUNK])), sent + CHUNK)
                            })
                        }
                    }))
                };
                use axum::response::IntoResponse;
                if query.starts_with("list-type=2") {
                    let mut page = String::from("<ListBucketResult>");
                    while page.len() < 2 * 1024 * 1024 {
                        page.push_str("<Contents><Key>t/a</Key><Size>1</Size></Contents>");
                    }
                    return page.into_response();
                }
                match path.as_str() {
                    "/lake/t/announced.metadata.json" => {
                        ([(axum::http::header::CONTENT_LENGTH, HUGE.to_string())], huge()).into_response()
                    }
                    _ => huge().into_response(),
                }
            }
        });
        let mib = 1024 * 1024;
        let policy = WarehousePolicy::from_settings("127.0.0.1").unwrap().with_reads(ObjectReadLimits {
            metadata_bytes: 4 * mib,
            manifest_bytes: 2 * mib,
            listing_page_bytes: mib,
        });
        let (store, _provider) = fake_store(router, &policy).await;

        let refused = store.read("s3://lake/t/announced.metadata.json").await.unwrap_err().to_string();
        assert!(refused.contains("metadata limit of 4194304 bytes (SERVICE_WAREHOUSE_MAX_METADATA_MB)"), "{refused}");
        for (path, limit) in [
            ("s3://lake/t/unannounced.metadata.json", "metadata limit of 4194304 bytes"),
            ("s3://lake/t/snap-1.avro", "manifest limit of 2097152 bytes (SERVICE_WAREHOUSE_MAX_MANIFEST_MB)"),
        ] {
            let refused = store.read(path).await.unwrap_err().to_string();
            assert!(refused.contains(limit), "{path}: {refused}");
        }
        let refused = store.list(None).await.unwrap_err().to_string();
        assert!(
            refused.contains("listing page limit of 1048576 bytes (SERVICE_WAREHOUSE_MAX_LISTING_MB)"),
            "{refused}"
        );
        // A range is read to its length, however much the store sends.
        let reader = store.reader("s3://lake/t/data/a.parquet").await.unwrap();
        assert!(reader.read(0..1024).await.unwrap_err().to_string().contains("requested range limit of 1024 bytes"));
        // Of the 2 GiB the store would have sent, what left it before the
        // reads stopped: each limit, and what the connection buffers.
        let sent = served.load(Ordering::SeqCst);
        assert!(sent < 64 * mib, "{} MiB were sent", sent / mib);
    }

    /// Nothing that refers to a data file reaches the store before it: a
    /// metadata file written after it is stored after it, even when the
    /// data file's `PUT` is the slow one.
    #[tokio::test]
    async fn nothing_is_stored_before_the_files_it_names() {
        use std::sync::Mutex;
        let stored: Arc<Mutex<Vec<String>>> = Default::default();
        let seen = stored.clone();
        let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let seen = seen.clone();
            async move {
                let path = request.uri().path().to_owned();
                if path.contains("/data/") {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                seen.lock().unwrap().push(path);
                axum::http::StatusCode::OK
            }
        });
        let (store, _provider) = fake_store(router, &WarehousePolicy::from_settings("127.0.0.1").unwrap()).await;
        let mut data = store.writer("s3://lake/t/ns/tb/data/a.parquet").await.unwrap();
        data.write(Bytes::from_static(b"rows")).await.unwrap();
        data.close().await.unwrap();
        store.write("s3://lake/t/ns/tb/metadata/v1.json", Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(*stored.lock().unwrap(), ["/lake/t/ns/tb/data/a.parquet", "/lake/t/ns/tb/metadata/v1.json"]);
    }
}
