//! The one place the egress point reads inside TLS: a connection to a host
//! a secret is bound to. The point ends the sandbox's TLS with a
//! certificate from the sandbox's own CA, opens its own TLS to the host
//! (verified against the host's trust roots), and relays HTTP/1.1 requests
//! with each bound secret's placeholder replaced by its value in the
//! request headers. Every other TLS connection passes through untouched
//! and unread (see [`crate::EgressPoint`]).
//!
//! HTTP/1.1 framing is `hyper`'s, on both sides: requests are relayed one
//! by one on one upstream connection, bodies streamed as they come.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::ca::SandboxCa;
use crate::rules::normalize_name;
use crate::secrets::{substitute, StoredSecret};
use crate::streams::{Counted, Counts, Prefixed};

/// The secrets of one sandbox, its CA, and how the point reaches hosts
/// over TLS.
#[derive(Debug)]
pub(crate) struct Interception {
    secrets: Vec<StoredSecret>,
    ca: SandboxCa,
    upstream: Arc<rustls::ClientConfig>,
}

type Body = Either<Incoming, Full<Bytes>>;

/// How the point opens TLS to a host: verified against `roots` (the
/// host's), HTTP/1.1 only.
pub(crate) fn upstream_config(
    roots: rustls::RootCertStore,
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Interception {
    /// Interception for `secrets`, with `ca`, opening TLS upstream with
    /// `upstream` (see [`upstream_config`]).
    pub(crate) fn new(
        secrets: Vec<StoredSecret>,
        ca: SandboxCa,
        upstream: Arc<rustls::ClientConfig>,
    ) -> Self {
        Interception {
            secrets,
            ca,
            upstream,
        }
    }

    /// A request head to go to `host` on `port` over TLS the point opened
    /// itself, with the bound secrets' placeholders replaced, and the
    /// names of those sent.
    pub(crate) fn substitute_head(
        &self,
        host: &str,
        port: u16,
        head: &[u8],
    ) -> (Vec<u8>, Vec<String>) {
        let bound = self.bound(host, port);
        let mut used = Vec::new();
        let replaced = substitute(head, &bound, &mut used).unwrap_or_else(|| head.to_vec());
        (replaced, used)
    }

    /// The secrets bound to `host` on `port`; none: not intercepted.
    pub(crate) fn bound(&self, host: &str, port: u16) -> Vec<&StoredSecret> {
        self.secrets
            .iter()
            .filter(|s| s.binding.bound_to(host, port))
            .collect()
    }

    /// Serves one intercepted tunnel: `client` (whose first bytes, its
    /// ClientHello, were read into `first`) to `host` over `upstream`,
    /// whose bytes go to `counts`. Returns the names of the secrets sent.
    pub(crate) async fn serve<S>(
        &self,
        client: S,
        first: Vec<u8>,
        host: &str,
        port: u16,
        upstream: TcpStream,
        counts: Arc<Counts>,
    ) -> Result<Vec<String>, String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let bound = self.bound_owned(host, port);
        let config = self.ca.server_config(host).map_err(|e| e.to_string())?;
        let client = tokio_rustls::TlsAcceptor::from(config)
            .accept(Prefixed::new(first, client))
            .await
            .map_err(|e| format!("TLS with the sandbox for {host}: {e}"))?;
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host} is not a TLS server name: {e}"))?;
        let upstream = tokio_rustls::TlsConnector::from(self.upstream.clone())
            .connect(name, Counted::new(upstream, counts.clone()))
            .await;
        let used = Arc::new(Mutex::new(Vec::new()));
        let sender = match upstream {
            Ok(tls) => {
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(|e| format!("HTTP to {host}: {e}"))?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "an intercepted upstream connection ended");
                    }
                });
                Ok(Arc::new(tokio::sync::Mutex::new(sender)))
            }
            Err(e) => Err(format!("TLS to {host}: {e}")),
        };
        let host_owned = host.to_string();
        let service_used = used.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let sender = sender.clone();
            let bound = bound.clone();
            let host = host_owned.clone();
            let used = service_used.clone();
            async move { Ok::<_, Infallible>(relay(request, sender, &bound, &host, &used).await) }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(client), service)
            .await;
        if let Err(e) = served {
            tracing::debug!(host, error = %e, "an intercepted connection ended");
        }
        let used = used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(used)
    }

    fn bound_owned(&self, host: &str, port: u16) -> Arc<Vec<StoredSecret>> {
        Arc::new(self.bound(host, port).into_iter().cloned().collect())
    }
}

type Sender = Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>>;

/// One request: its Host must be the tunnel's; its headers get the bound
/// secrets' values; then it goes to the host.
async fn relay(
    mut request: Request<Incoming>,
    sender: Result<Sender, String>,
    bound: &[StoredSecret],
    host: &str,
    used: &Mutex<Vec<String>>,
) -> Response<Body> {
    let sender = match sender {
        Ok(sender) => sender,
        Err(why) => return refusal(StatusCode::BAD_GATEWAY, &why),
    };
    let named = request
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.rsplit_once(':').map_or(v, |(h, _)| h))
        .and_then(|h| normalize_name(h).ok());
    if named.as_deref() != Some(host) {
        return refusal(
            StatusCode::FORBIDDEN,
            &format!("a request in the tunnel to {host} must name {host} in its Host header"),
        );
    }
    let secrets: Vec<&StoredSecret> = bound.iter().collect();
    let mut names = Vec::new();
    for value in request.headers_mut().values_mut() {
        if let Some(replaced) = substitute(value.as_bytes(), &secrets, &mut names) {
            match HeaderValue::from_bytes(&replaced) {
                Ok(mut new) => {
                    new.set_sensitive(true);
                    *value = new;
                }
                Err(_) => {
                    return refusal(
                        StatusCode::BAD_REQUEST,
                        "a header with a secret's value is not a valid header",
                    )
                }
            }
        }
    }
    if !names.is_empty() {
        let mut used = used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for name in names {
            if !used.contains(&name) {
                used.push(name);
            }
        }
    }
    let mut sender = sender.lock().await;
    if let Err(e) = sender.ready().await {
        return refusal(
            StatusCode::BAD_GATEWAY,
            &format!("{host} closed the connection: {e}"),
        );
    }
    match sender.send_request(request).await {
        Ok(response) => response.map(Either::Left),
        Err(e) => refusal(StatusCode::BAD_GATEWAY, &format!("{host}: {e}")),
    }
}

fn refusal(status: StatusCode, why: &str) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "berth egress: {why}\n"
    )))));
    *response.status_mut() = status;
    response
}
