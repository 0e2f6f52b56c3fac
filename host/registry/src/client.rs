//! A small OCI distribution client: manifests and blobs, pull and push,
//! Basic and Bearer-token auth, plain HTTP only for listed hosts, bounded
//! reads, timeouts, and the registry's own error text in every error.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::TryStreamExt;
use http::header::{
    HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Digest as _;
use tokio::io::AsyncWriteExt;

use super::credentials::{self, Credentials};
use super::reference::Digest;
use super::{RegistryError, RegistryOptions};

type Body = BoxBody<Bytes, std::io::Error>;
type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

/// What a request carries; re-creatable, so a request can be retried once
/// after an auth challenge.
#[derive(Clone)]
pub(crate) enum Payload {
    Empty,
    Bytes(Bytes),
    File(Arc<Path>, u64),
}

impl Payload {
    async fn body(&self) -> std::io::Result<Body> {
        Ok(match self {
            Payload::Empty => Empty::new().map_err(|never| match never {}).boxed(),
            Payload::Bytes(b) => Full::new(b.clone()).map_err(|never| match never {}).boxed(),
            Payload::File(path, _) => {
                let file = tokio::fs::File::open(path).await?;
                let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10)
                    .map_ok(Frame::data);
                BodyExt::boxed(StreamBody::new(stream))
            }
        })
    }

    fn len(&self) -> u64 {
        match self {
            Payload::Empty => 0,
            Payload::Bytes(b) => b.len() as u64,
            Payload::File(_, n) => *n,
        }
    }
}

/// One registry's client.
pub(crate) struct RegistryClient {
    http: HttpClient,
    registry: String,
    base: String,
    timeout: Duration,
    credentials: Option<Credentials>,
    /// The Authorization header that worked, per scope.
    auth: Mutex<HashMap<String, HeaderValue>>,
}

fn tls_config(options: &RegistryOptions) -> Result<rustls::ClientConfig, RegistryError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(ca) = &options.ca_file {
        let bad = |message: String| RegistryError::Tls {
            message: format!("CA file {}: {message}", ca.display()),
        };
        let pem = std::fs::read(ca).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| bad(format!("not PEM: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| bad(format!("not a usable certificate: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("holds no certificate".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RegistryError::Tls {
            message: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl RegistryClient {
    /// A client for `registry` (`host[:port]`).
    pub(crate) fn new(options: &RegistryOptions, registry: &str) -> Result<Self, RegistryError> {
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(options.timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(options)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let http = Client::builder(TokioExecutor::new()).build(https);
        let plain = options
            .plain_http
            .iter()
            .any(|h| h.eq_ignore_ascii_case(registry));
        let scheme = if plain { "http" } else { "https" };
        let credentials = match &options.docker_config {
            Some(dir) => credentials::lookup(dir, registry)?,
            None => None,
        };
        Ok(RegistryClient {
            http,
            registry: registry.to_string(),
            base: format!("{scheme}://{registry}"),
            timeout: options.timeout,
            credentials,
            auth: Mutex::new(HashMap::new()),
        })
    }

    /// What to check when the registry cannot be reached.
    fn hint(&self) -> &'static str {
        if self.base.starts_with("https") {
            " (is it running? A registry that speaks plain HTTP must be listed in \
             BERTH_REGISTRY_PLAIN_HTTP; a private CA goes in BERTH_REGISTRY_CA_FILE)"
        } else {
            " (is it running? It is reached over plain HTTP, as BERTH_REGISTRY_PLAIN_HTTP lists it)"
        }
    }

    /// Sends a request, answering one auth challenge; errors for any
    /// status not in `ok`, with the registry's own text.
    pub(crate) async fn send(
        &self,
        method: Method,
        url_or_path: &str,
        scope: &str,
        headers: &[(http::header::HeaderName, &str)],
        payload: Payload,
        ok: &[StatusCode],
    ) -> Result<Response<Incoming>, RegistryError> {
        let url = if url_or_path.starts_with("http://") || url_or_path.starts_with("https://") {
            url_or_path.to_string()
        } else if url_or_path.starts_with('/') {
            format!("{}{url_or_path}", self.base)
        } else {
            format!("{}/{url_or_path}", self.base)
        };
        let cached = self.auth.lock().ok().and_then(|m| m.get(scope).cloned());
        let mut response = self
            .once(&method, &url, headers, &payload, cached.as_ref())
            .await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let header = self.answer(&challenge, scope).await?;
            response = self
                .once(&method, &url, headers, &payload, Some(&header))
                .await?;
            if response.status() == StatusCode::UNAUTHORIZED {
                let text = self.error_text(response).await;
                return Err(RegistryError::Unauthorized {
                    registry: self.registry.clone(),
                    message: format!(
                        "{} were refused: {text}",
                        if self.credentials.is_some() {
                            "the credentials from the docker config"
                        } else {
                            "anonymous requests"
                        }
                    ),
                });
            }
            if let Ok(mut m) = self.auth.lock() {
                m.insert(scope.to_string(), header);
            }
        }
        if ok.contains(&response.status()) {
            return Ok(response);
        }
        let status = response.status();
        let text = self.error_text(response).await;
        Err(RegistryError::Status {
            registry: self.registry.clone(),
            request: format!("{method} {}", url.strip_prefix(&self.base).unwrap_or(&url)),
            status: status.as_u16(),
            message: text,
        })
    }

    async fn once(
        &self,
        method: &Method,
        url: &str,
        headers: &[(http::header::HeaderName, &str)],
        payload: &Payload,
        auth: Option<&HeaderValue>,
    ) -> Result<Response<Incoming>, RegistryError> {
        let mut builder = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            builder = builder.header(k, *v);
        }
        if let Some(a) = auth {
            builder = builder.header(AUTHORIZATION, a.clone());
        }
        if !matches!(payload, Payload::Empty) || *method == Method::PUT || *method == Method::POST {
            builder = builder.header(CONTENT_LENGTH, payload.len());
        }
        let body = payload.body().await.map_err(|e| RegistryError::Io {
            what: "reading what to upload".into(),
            source: e,
        })?;
        let request = builder.body(body).map_err(|e| RegistryError::Transport {
            registry: self.registry.clone(),
            message: format!("bad request {url}: {e}"),
        })?;
        self.request(request, &format!("{method} {url}")).await
    }

    /// Sends one request within the timeout; `what` names it in errors.
    async fn request(
        &self,
        request: Request<Body>,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        match tokio::time::timeout(self.timeout, self.http.request(request)).await {
            Err(_) => Err(RegistryError::Timeout {
                registry: self.registry.clone(),
                what: what.to_string(),
                seconds: self.timeout.as_secs_f64(),
            }),
            Ok(Err(e)) => Err(RegistryError::Transport {
                registry: self.registry.clone(),
                message: format!("{what}: {}{}", error_chain(&e), self.hint()),
            }),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// The Authorization header answering `challenge`.
    async fn answer(&self, challenge: &str, scope: &str) -> Result<HeaderValue, RegistryError> {
        let basic = self.credentials.as_ref().map(|c| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.secret))
            )
        });
        let no_credentials = || RegistryError::Unauthorized {
            registry: self.registry.clone(),
            message: format!(
                "it asks for credentials and the docker config has none for {0}; run \
                 `docker login {0}` (or set DOCKER_CONFIG to a config that has them)",
                self.registry
            ),
        };
        let (kind, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        let header = if kind.eq_ignore_ascii_case("basic") {
            basic.ok_or_else(no_credentials)?
        } else if kind.eq_ignore_ascii_case("bearer") {
            let params = parse_challenge(params);
            let realm = params
                .get("realm")
                .ok_or_else(|| RegistryError::Unauthorized {
                    registry: self.registry.clone(),
                    message: format!("its Bearer challenge has no realm: {challenge}"),
                })?;
            let mut url = format!("{realm}?");
            if let Some(service) = params.get("service") {
                url.push_str(&format!("service={}&", encode(service)));
            }
            url.push_str(&format!("scope={}", encode(scope)));
            let mut builder = Request::builder().method(Method::GET).uri(&url);
            if let Some(b) = &basic {
                builder = builder.header(AUTHORIZATION, b);
            }
            let request = builder
                .body(Empty::new().map_err(|never| match never {}).boxed())
                .map_err(|e| RegistryError::Transport {
                    registry: self.registry.clone(),
                    message: format!("bad token request {url}: {e}"),
                })?;
            let response = self
                .request(request, &format!("token request to {realm}"))
                .await?;
            if !response.status().is_success() {
                let status = response.status();
                let text = self.error_text(response).await;
                return Err(RegistryError::Unauthorized {
                    registry: self.registry.clone(),
                    message: format!("its token service {realm} answered {status}: {text}"),
                });
            }
            let body = read_capped(response, 1 << 20, self.timeout, &self.registry).await?;
            #[derive(serde::Deserialize)]
            struct Token {
                token: Option<String>,
                access_token: Option<String>,
            }
            let t: Token =
                serde_json::from_slice(&body).map_err(|e| RegistryError::Unauthorized {
                    registry: self.registry.clone(),
                    message: format!(
                        "its token service answered something that is not a token: {e}"
                    ),
                })?;
            let token = t
                .token
                .or(t.access_token)
                .ok_or_else(|| RegistryError::Unauthorized {
                    registry: self.registry.clone(),
                    message: "its token service answered no token".into(),
                })?;
            format!("Bearer {token}")
        } else {
            return Err(RegistryError::Unauthorized {
                registry: self.registry.clone(),
                message: format!(
                    "it answered 401 with an auth scheme Berth does not speak: {challenge:?}"
                ),
            });
        };
        HeaderValue::from_str(&header).map_err(|_| RegistryError::Unauthorized {
            registry: self.registry.clone(),
            message: "the credentials hold characters a header cannot carry".into(),
        })
    }

    /// The registry's error text: its `errors` JSON if it sent one, else
    /// the first bytes of the body.
    async fn error_text(&self, response: Response<Incoming>) -> String {
        let status = response.status();
        let body = read_capped(response, 64 << 10, self.timeout, &self.registry)
            .await
            .unwrap_or_default();
        #[derive(serde::Deserialize)]
        struct Errors {
            errors: Vec<OneError>,
        }
        #[derive(serde::Deserialize)]
        struct OneError {
            code: Option<String>,
            message: Option<String>,
        }
        let detail = match serde_json::from_slice::<Errors>(&body) {
            Ok(e) if !e.errors.is_empty() => e
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.code.as_deref().unwrap_or("ERROR"),
                        e.message.as_deref().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ => String::from_utf8_lossy(&body[..body.len().min(512)])
                .trim()
                .to_string(),
        };
        if detail.is_empty() {
            status.to_string()
        } else {
            format!("{status}: {detail}")
        }
    }

    /// Fetches a manifest by tag or digest: (bytes, content type, digest).
    pub(crate) async fn get_manifest(
        &self,
        repository: &str,
        reference: &str,
        accept: &str,
    ) -> Result<(Vec<u8>, Option<String>, Digest), RegistryError> {
        let response = self
            .send(
                Method::GET,
                &format!("/v2/{repository}/manifests/{reference}"),
                &pull_scope(repository),
                &[(ACCEPT, accept)],
                Payload::Empty,
                &[StatusCode::OK],
            )
            .await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_capped(
            response,
            super::layout::MAX_METADATA_BYTES,
            self.timeout,
            &self.registry,
        )
        .await?;
        let digest = Digest::of(&body);
        Ok((body, content_type, digest))
    }

    /// Fetches a small blob whole, checked against its digest.
    pub(crate) async fn get_small_blob(
        &self,
        repository: &str,
        digest: &Digest,
        max: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let response = self.blob_response(repository, digest).await?;
        let body = read_capped(response, max, self.timeout, &self.registry).await?;
        let got = Digest::of(&body);
        if got != *digest {
            return Err(RegistryError::DigestMismatch {
                what: format!("blob {digest} from {}", self.registry),
                expected: digest.to_string(),
                got: got.to_string(),
            });
        }
        Ok(body)
    }

    async fn blob_response(
        &self,
        repository: &str,
        digest: &Digest,
    ) -> Result<Response<Incoming>, RegistryError> {
        let mut response = self
            .send(
                Method::GET,
                &format!("/v2/{repository}/blobs/{digest}"),
                &pull_scope(repository),
                &[],
                Payload::Empty,
                &[
                    StatusCode::OK,
                    StatusCode::TEMPORARY_REDIRECT,
                    StatusCode::FOUND,
                    StatusCode::SEE_OTHER,
                ],
            )
            .await?;
        // Registries backed by object storage redirect blob reads.
        for _ in 0..3 {
            if response.status() == StatusCode::OK {
                return Ok(response);
            }
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| RegistryError::Transport {
                    registry: self.registry.clone(),
                    message: "a redirect without a Location".into(),
                })?;
            let request = Request::builder()
                .method(Method::GET)
                .uri(&location)
                .body(Empty::new().map_err(|never| match never {}).boxed())
                .map_err(|e| RegistryError::Transport {
                    registry: self.registry.clone(),
                    message: format!("bad redirect {location}: {e}"),
                })?;
            response = self.request(request, &format!("GET {location}")).await?;
        }
        Err(RegistryError::Transport {
            registry: self.registry.clone(),
            message: format!("too many redirects for blob {digest}"),
        })
    }

    /// Streams a blob into `out`, checking its size as it goes and its
    /// digest at the end.
    pub(crate) async fn get_blob_into(
        &self,
        repository: &str,
        digest: &Digest,
        size: u64,
        out: &mut tokio::fs::File,
    ) -> Result<(), RegistryError> {
        let response = self.blob_response(repository, digest).await?;
        let mut body = response.into_body();
        let mut hasher = sha2::Sha256::new();
        let mut total = 0u64;
        let what = format!("reading blob {digest}");
        loop {
            let Some(frame) = next_frame(&mut body, self.timeout, &self.registry, &what).await?
            else {
                break;
            };
            if let Ok(data) = frame.into_data() {
                total += data.len() as u64;
                if total > size {
                    return Err(RegistryError::DigestMismatch {
                        what: format!("blob {digest} from {}", self.registry),
                        expected: format!("{size} bytes as its manifest declares"),
                        got: "more".into(),
                    });
                }
                hasher.update(&data);
                out.write_all(&data).await.map_err(|e| RegistryError::Io {
                    what: "writing the plugin cache".into(),
                    source: e,
                })?;
            }
        }
        let got = Digest::from_hasher(hasher);
        if total != size || got != *digest {
            return Err(RegistryError::DigestMismatch {
                what: format!("blob {digest} from {}", self.registry),
                expected: format!("{digest} ({size} bytes)"),
                got: format!("{got} ({total} bytes)"),
            });
        }
        Ok(())
    }

    /// Uploads a blob unless the registry has it.
    pub(crate) async fn put_blob(
        &self,
        repository: &str,
        digest: &Digest,
        payload: Payload,
    ) -> Result<(), RegistryError> {
        let scope = push_scope(repository);
        let head = self
            .send(
                Method::HEAD,
                &format!("/v2/{repository}/blobs/{digest}"),
                &scope,
                &[],
                Payload::Empty,
                &[StatusCode::OK, StatusCode::NOT_FOUND],
            )
            .await?;
        if head.status() == StatusCode::OK {
            return Ok(());
        }
        let started = self
            .send(
                Method::POST,
                &format!("/v2/{repository}/blobs/uploads/"),
                &scope,
                &[],
                Payload::Empty,
                &[StatusCode::ACCEPTED],
            )
            .await?;
        let location = started
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| RegistryError::Transport {
                registry: self.registry.clone(),
                message: "an upload started without a Location".into(),
            })?;
        let sep = if location.contains('?') { '&' } else { '?' };
        let url = format!("{location}{sep}digest={digest}");
        self.send(
            Method::PUT,
            &url,
            &scope,
            &[(CONTENT_TYPE, "application/octet-stream")],
            payload,
            &[StatusCode::CREATED, StatusCode::NO_CONTENT, StatusCode::OK],
        )
        .await?;
        Ok(())
    }

    /// Uploads a manifest under `reference` (a tag or its digest).
    pub(crate) async fn put_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<(), RegistryError> {
        self.send(
            Method::PUT,
            &format!("/v2/{repository}/manifests/{reference}"),
            &push_scope(repository),
            &[(CONTENT_TYPE, media_type)],
            Payload::Bytes(bytes),
            &[StatusCode::CREATED, StatusCode::OK, StatusCode::ACCEPTED],
        )
        .await
        .map_err(|e| match e {
            RegistryError::Status {
                registry,
                request,
                status: status @ (400 | 403 | 415),
                message,
            } => RegistryError::Status {
                registry,
                request,
                status,
                message: format!(
                    "{message} (the registry refused the Wasm artifact's manifest; some registries \
                     refuse the config type {} or artifacts that are not container images by \
                     policy: allow it there, or push to another registry)",
                    super::layout::CONFIG_TYPE
                ),
            },
            other => other,
        })?;
        Ok(())
    }
}

/// Reads a response body, at most `max` bytes.
pub(crate) async fn read_capped(
    response: Response<Incoming>,
    max: u64,
    timeout: Duration,
    registry: &str,
) -> Result<Vec<u8>, RegistryError> {
    let mut body = response.into_body();
    let mut out = Vec::new();
    loop {
        let Some(frame) = next_frame(&mut body, timeout, registry, "reading a response").await?
        else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            if out.len() as u64 + data.len() as u64 > max {
                return Err(RegistryError::TooLarge {
                    registry: registry.into(),
                    what: "a response".into(),
                    limit: max,
                });
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// The body's next frame (`None` at its end), waiting at most `timeout`.
async fn next_frame(
    body: &mut Incoming,
    timeout: Duration,
    registry: &str,
    what: &str,
) -> Result<Option<Frame<Bytes>>, RegistryError> {
    let frame = tokio::time::timeout(timeout, body.frame())
        .await
        .map_err(|_| RegistryError::Timeout {
            registry: registry.into(),
            what: what.into(),
            seconds: timeout.as_secs_f64(),
        })?;
    frame.transpose().map_err(|e| RegistryError::Transport {
        registry: registry.into(),
        message: format!("{what}: {}", error_chain(&e)),
    })
}

fn pull_scope(repository: &str) -> String {
    format!("repository:{repository}:pull")
}

fn push_scope(repository: &str) -> String {
    format!("repository:{repository}:pull,push")
}

/// `key="value", key2=value2` of a WWW-Authenticate challenge.
fn parse_challenge(params: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.insert(key, value.to_string());
        rest = after.trim_start_matches([',', ' ']);
    }
    out
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_challenges() {
        let p = parse_challenge(
            r#"realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.example.com/token");
        assert_eq!(p["service"], "registry.example.com");
        assert_eq!(p["scope"], "repository:a/b:pull");
        assert_eq!(
            encode("repository:a/b:pull,push"),
            "repository%3Aa%2Fb%3Apull%2Cpush"
        );
    }
}
