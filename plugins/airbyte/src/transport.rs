//! Requests of the runtime sent through the host: the secret a request
//! needs is named by its credential handle and place, never carried; the
//! runtime's failures become the SDK's errors.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use connector_sdk::{CredentialPlace, Error, Http, HttpError, Method, Pending, Placement, RequestBuilder};
use declarative::retrieve::{Body, Place, ReadError, Request, Response, Started, Transport};

use crate::source::Config;

/// Sends through the host's egress.
pub struct HostTransport {
    handles: BTreeMap<String, String>,
    /// When it was made: the read's durations are measured from here.
    made: std::time::Instant,
}

impl HostTransport {
    pub fn new(config: &Config) -> HostTransport {
        HostTransport { handles: config.handles(), made: std::time::Instant::now() }
    }

    /// A read's failure as the SDK's error.
    pub fn explain(&self, e: ReadError) -> Error {
        match e {
            ReadError::Transport(e) => match e.downcast::<HttpError>() {
                Ok(http) => Error::from(*http),
                Err(e) => match e.downcast::<Missing>() {
                    Ok(missing) => Error::InvalidConfig(missing.to_string()),
                    Err(e) => Error::ProviderUnavailable(e.to_string()),
                },
            },
            ReadError::Provider { status: 401, .. } => Error::InvalidCredentials(e.to_string()),
            ReadError::Provider { status: 403, .. } => Error::PermissionDenied(e.to_string()),
            ReadError::Provider { status: 429, .. } => Error::RateLimited { retry_after: None },
            ReadError::Provider { status, .. } if status >= 500 => Error::ProviderUnavailable(e.to_string()),
            ReadError::Provider { .. } => Error::ProviderError(e.to_string()),
            ReadError::Secret(_) | ReadError::Evaluation { .. } | ReadError::Invalid(_) | ReadError::Refused(_) => {
                Error::InvalidConfig(e.to_string())
            }
            ReadError::Stopped(m) => Error::Internal(m),
        }
    }
}

/// Secret fields the manifest uses that the handles given do not cover.
#[derive(Debug)]
enum Missing {
    /// No handle was given for this field.
    Field(String),
    /// Secret fields of one credential (a Basic username and password; an
    /// OAuth client's secret, id and refresh token) that do not all name it.
    Together { field: String, beside: String },
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Field(field) => {
                write!(f, "/credentials: the manifest needs a credential for the secret field {field}")
            }
            Missing::Together { field, beside } => write!(
                f,
                "/credentials: the secret fields {field} and {beside} must name one credential, which holds both"
            ),
        }
    }
}

impl std::error::Error for Missing {}

/// The host's answer as the runtime reads it.
fn answer(response: &connector_sdk::Response) -> Response {
    Response { status: response.status(), headers: response.headers().to_vec(), body: response.body().to_vec() }
}

/// A request the host is performing.
struct Ahead(Pending);

impl Started for Ahead {
    fn finish(self: Box<Self>) -> Result<Response, Box<dyn std::error::Error + Send + Sync>> {
        Ok(answer(&self.0.finish_raw()?))
    }
}

impl Transport for HostTransport {
    fn send(&mut self, request: &Request) -> Result<Response, Box<dyn std::error::Error + Send + Sync>> {
        Ok(answer(&self.builder(request)?.send_raw()?))
    }

    fn start(&mut self, request: &Request) -> Result<Box<dyn Started>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Box::new(Ahead(self.builder(request)?.start()?)))
    }

    fn wait(&mut self, seconds: f64) {
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    }

    fn now(&self) -> DateTime<Utc> {
        crate::source::now()
    }

    fn monotonic(&self) -> std::time::Duration {
        self.made.elapsed()
    }
}

impl HostTransport {
    /// The host's request for `request`, each secret named by its handle.
    fn builder(&self, request: &Request) -> Result<RequestBuilder, Box<dyn std::error::Error + Send + Sync>> {
        let method = match request.method {
            declarative::retrieve::Method::Get => Method::Get,
            declarative::retrieve::Method::Post => Method::Post,
        };
        let mut builder = Http::request(method, request.url.clone());
        for (k, v) in &request.query {
            builder = builder.query(k, v);
        }
        for (k, v) in &request.headers {
            builder = builder.header(k, v.clone());
        }
        builder = match &request.body {
            Body::None => builder,
            Body::Json(v) => builder.json(v),
            Body::Form(fields) => builder.form(fields),
            Body::Text(t) => builder.body("text/plain", t.clone().into_bytes()),
        };
        for (i, credential) in request.credentials.iter().enumerate() {
            let handle = self
                .handles
                .get(&credential.pointer)
                .ok_or_else(|| Box::new(Missing::Field(credential.pointer.clone())))?
                .clone();
            let place = match &credential.place {
                Place::Bearer => CredentialPlace::Placed(Placement::Bearer),
                Place::Header(name) => CredentialPlace::Placed(Placement::Header(name.clone())),
                Place::Basic { username } => CredentialPlace::Placed(Placement::Basic { username: username.clone() }),
                Place::Query(name) => CredentialPlace::Query(name.clone()),
                Place::BodyField(field) => CredentialPlace::BodyField(field.clone()),
                // Places only the credential's record can name (checked
                // against the manifest when the source was saved).
                Place::HeaderAround { .. }
                | Place::BasicUsername { .. }
                | Place::BasicBoth
                | Place::UrlPath
                | Place::SessionLogin { .. } => CredentialPlace::AsStored,
                // One credential holds the secrets sent together (a Basic
                // pair; an OAuth client's secret, and its id and refresh
                // token when they are secret fields too, traded by the
                // credential's recipe): every field names it.
                Place::BasicPair { .. } | Place::OAuthClient { .. } => {
                    if let Some(field) =
                        credential.place.fields_beside().into_iter().find(|f| self.handles.get(*f) != Some(&handle))
                    {
                        return Err(Box::new(Missing::Together {
                            field: credential.pointer.clone(),
                            beside: field.clone(),
                        }));
                    }
                    CredentialPlace::AsStored
                }
            };
            builder = match (i, place) {
                (0, CredentialPlace::Placed(placement)) => builder.credential(handle, placement),
                (0, CredentialPlace::Query(name)) => builder.credential_in_query(handle, name),
                (0, CredentialPlace::BodyField(field)) => builder.credential_in_body(handle, field),
                (0, CredentialPlace::AsStored) => builder.credential_as_stored(handle),
                (_, place) => builder.and_credential(handle, place),
            };
        }
        Ok(builder)
    }
}
