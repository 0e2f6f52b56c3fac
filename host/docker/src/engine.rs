//! Which Docker engine a sandbox talks to, and the connection to it.
//!
//! An engine reference is what the state records (never key material):
//! an endpoint (`unix:///path`, a socket path, `tcp://HOST:PORT`,
//! `https://HOST:PORT`) or the name of a Docker context. Without one, the
//! docker CLI's rules pick it: `$DOCKER_HOST`, else `$DOCKER_CONTEXT`,
//! else the config's current context, else `unix:///var/run/docker.sock`.
//! A TCP endpoint speaks mutual TLS when it has a certificate directory
//! (`ca.pem`, `cert.pem`, `key.pem`): the context's, the one the state
//! recorded, or `$DOCKER_CERT_PATH` (else `~/.docker`) when
//! `$DOCKER_TLS_VERIFY` is set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;

use super::config;
use super::BACKEND;
use berth::backend::BackendError;

/// The default endpoint when nothing else names one.
pub(crate) const DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";

/// How long to wait for an engine to answer a ping.
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Seconds a single API request may take (archives of many GiB included).
const REQUEST_TIMEOUT: u64 = 3600;

/// The engine reference the docker CLI would use here and now, and the
/// certificate directory that goes with it (for a TCP endpoint under
/// `$DOCKER_TLS_VERIFY`), for recording in a new sandbox's state.
pub(crate) fn current_reference() -> (String, Option<PathBuf>) {
    if let Some(host) = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()) {
        let certs = env_cert_dir(&host);
        return (host, certs);
    }
    if let Some(name) = std::env::var("DOCKER_CONTEXT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return (name, None);
    }
    if let Ok(file) = config::ConfigFile::load(&config::config_dir()) {
        if let Some(name) = file
            .current_context
            .filter(|c| !c.is_empty() && c != "default")
        {
            return (name, None);
        }
    }
    (DEFAULT_ENDPOINT.to_string(), None)
}

/// `$DOCKER_CERT_PATH` (else `~/.docker`) when `$DOCKER_TLS_VERIFY` asks
/// for TLS and `endpoint` is a TCP one.
pub(crate) fn env_cert_dir(endpoint: &str) -> Option<PathBuf> {
    let tls = std::env::var("DOCKER_TLS_VERIFY").is_ok_and(|v| !v.is_empty() && v != "0");
    if !tls || !is_tcp(endpoint) {
        return None;
    }
    Some(
        std::env::var_os("DOCKER_CERT_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(config::config_dir),
    )
}

fn is_tcp(endpoint: &str) -> bool {
    endpoint.starts_with("tcp://") || endpoint.starts_with("https://")
}

/// Whether a reference is an endpoint (rather than a context name).
pub(crate) fn is_endpoint(reference: &str) -> bool {
    reference.contains("://") || reference.starts_with('/')
}

/// A resolved engine: where it is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Engine {
    /// What the user named (an endpoint or a context), for messages.
    pub reference: String,
    /// The endpoint.
    pub endpoint: String,
    /// TLS files, for a TCP endpoint that uses TLS.
    pub tls: Option<TlsFiles>,
}

/// The three files of mutual TLS, the docker CLI's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    fn in_dir(dir: &Path) -> Self {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reference == self.endpoint {
            write!(f, "engine {}", self.endpoint)
        } else {
            write!(f, "engine {:?} ({})", self.reference, self.endpoint)
        }
    }
}

fn config_error(message: String) -> BackendError {
    BackendError::Config {
        backend: BACKEND,
        message,
    }
}

/// Resolves `reference` (`None`: the docker CLI's defaults) with the
/// certificate directory a state recorded.
pub(crate) fn resolve(
    reference: Option<&str>,
    recorded_certs: Option<&Path>,
) -> Result<Engine, BackendError> {
    let (reference, env_certs) = match reference {
        Some(r) => (r.to_string(), None),
        None => current_reference(),
    };
    let (endpoint, tls_dir) = if is_endpoint(&reference) {
        let certs = recorded_certs
            .map(Path::to_path_buf)
            .or(env_certs)
            .or_else(|| env_cert_dir(&reference));
        (reference.clone(), certs)
    } else if reference == "default" {
        let host = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let certs = env_cert_dir(&host);
        (host, certs)
    } else {
        let found = config::context(&config::config_dir(), &reference).map_err(config_error)?;
        (found.host, found.tls_dir)
    };
    let tls = match (&tls_dir, endpoint.starts_with("https://")) {
        (Some(dir), _) if is_tcp(&endpoint) => Some(TlsFiles::in_dir(dir)),
        (None, true) => Some(TlsFiles::in_dir(&config::config_dir())),
        _ => None,
    };
    let engine = Engine {
        reference,
        endpoint,
        tls,
    };
    if let Some(tls) = &engine.tls {
        for (file, what) in [
            (&tls.ca, "the CA certificate"),
            (&tls.cert, "the client certificate"),
            (&tls.key, "the client key"),
        ] {
            if !file.is_file() {
                return Err(config_error(format!(
                    "{engine}: {what} {} is missing; put ca.pem, cert.pem and key.pem in the directory DOCKER_CERT_PATH names (or the context's)",
                    file.display()
                )));
            }
        }
    }
    if !(engine.endpoint.starts_with("unix://")
        || engine.endpoint.starts_with('/')
        || is_tcp(&engine.endpoint))
    {
        return Err(config_error(format!(
            "{engine}: Berth reaches engines over unix:// sockets and tcp:// (with TLS); {} is neither",
            engine.endpoint
        )));
    }
    Ok(engine)
}

pub(crate) use berth::error_text::causes;

/// The advice that goes with a failure to reach `engine`.
fn advice(engine: &Engine, why: &str) -> String {
    let lower = why.to_ascii_lowercase();
    match &engine.tls {
        Some(tls) if lower.contains("unknownissuer") || lower.contains("unknown issuer") => format!(
            "the engine's TLS certificate is not signed by the CA in {}; point DOCKER_CERT_PATH (or the context) at the CA that signed the engine's certificate",
            tls.ca.display()
        ),
        Some(tls)
            if lower.contains("notvalidforname") || lower.contains("not valid for name") =>
        {
            format!(
                "the engine's TLS certificate does not name the host in {}; use the host name or address the certificate was made for (CA {})",
                engine.endpoint,
                tls.ca.display()
            )
        }
        Some(tls)
            if lower.contains("certificate")
                || lower.contains("handshake")
                || lower.contains("tls") =>
        {
            format!(
                "the TLS handshake failed; check that {} and {} are a client certificate and key the engine's CA signed, and that {} is that CA",
                tls.cert.display(),
                tls.key.display(),
                tls.ca.display()
            )
        }
        None if is_tcp(&engine.endpoint) && (lower.contains("connection closed") || lower.contains("http")) => {
            "the engine may expect TLS: set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH to its ca.pem/cert.pem/key.pem".into()
        }
        _ if engine.endpoint.starts_with("unix://") || engine.endpoint.starts_with('/') => {
            "start dockerd, or name another engine (DOCKER_HOST, a Docker context)".into()
        }
        _ => "check that the engine runs and listens there, or name another engine (DOCKER_HOST, a Docker context)".into(),
    }
}

fn unreachable(
    engine: &Engine,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    let e = e.into();
    let why = causes(e.as_ref());
    BackendError::Unreachable {
        backend: BACKEND,
        message: format!("cannot reach the Docker {engine}: {}", advice(engine, &why)),
        source: Some(root_cause(e)),
    }
}

/// The cause worth showing of a failure to talk to an engine: the
/// operating system's error at the bottom of the HTTP client's chain
/// (`Connection refused (os error 111)`), with its kind, rather than the
/// client's layers (`Error in the hyper legacy client: client error
/// (Connect): …`). The whole error when it has no such cause.
pub(crate) fn root_cause(
    e: Box<dyn std::error::Error + Send + Sync>,
) -> Box<dyn std::error::Error + Send + Sync> {
    let mut deepest: Option<&std::io::Error> = None;
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(current) = link {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            deepest = Some(io);
        }
        link = current.source();
    }
    match deepest {
        Some(io) => Box::new(std::io::Error::new(io.kind(), io.to_string())),
        None => e,
    }
}

/// Connects to `engine` and negotiates the API version; fails fast, naming
/// the engine and what to fix, when it does not answer.
pub(crate) async fn connect(engine: &Engine) -> Result<Docker, BackendError> {
    let version = bollard::API_DEFAULT_VERSION;
    let docker = if let Some(tls) = &engine.tls {
        Docker::connect_with_ssl(
            &engine.endpoint,
            &tls.key,
            &tls.cert,
            &tls.ca,
            REQUEST_TIMEOUT,
            version,
        )
    } else if is_tcp(&engine.endpoint) {
        tracing::warn!(engine = %engine.endpoint, "talking to a Docker engine over TCP without TLS");
        Docker::connect_with_http(&engine.endpoint, REQUEST_TIMEOUT, version)
    } else {
        let path = engine
            .endpoint
            .strip_prefix("unix://")
            .unwrap_or(&engine.endpoint);
        Docker::connect_with_unix(path, REQUEST_TIMEOUT, version)
    }
    .map_err(|e| unreachable(engine, e))?;
    match tokio::time::timeout(PING_TIMEOUT, docker.negotiate_version()).await {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(unreachable(engine, e)),
        Err(_) => Err(unreachable(
            engine,
            format!("no answer within {PING_TIMEOUT:?}"),
        )),
    }
}

/// An API failure: the daemon's own answer is an operation error; anything
/// else (connection refused, socket gone, timeout) means the daemon is not
/// reachable, which never counts as "container gone".
pub(crate) fn api(operation: &'static str, e: bollard::errors::Error) -> BackendError {
    service_error(BACKEND, operation, e, |other| BackendError::Unreachable {
        backend: BACKEND,
        message: format!(
            "{operation}: cannot reach the Docker daemon; is dockerd running? Retry once it is back"
        ),
        source: Some(root_cause(Box::new(other))),
    })
}

/// An engine's error for `backend` (Docker or the swarm): an error status
/// becomes `Service`, keeping the status and bollard's error as the
/// source; anything else (no answer) is `otherwise`'s to say.
pub(crate) fn service_error(
    backend: &'static str,
    operation: &'static str,
    e: bollard::errors::Error,
    otherwise: impl FnOnce(bollard::errors::Error) -> BackendError,
) -> BackendError {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => {
            BackendError::Service {
                backend,
                operation,
                status: Some(status_code),
                source: Box::new(e),
            }
        }
        other => otherwise(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_contexts_are_told_apart() {
        assert!(is_endpoint("unix:///var/run/docker.sock"));
        assert!(is_endpoint("/var/run/docker.sock"));
        assert!(is_endpoint("tcp://10.0.0.2:2376"));
        assert!(!is_endpoint("remote-box"));
        let e = resolve(Some("unix:///tmp/x.sock"), None).unwrap();
        assert_eq!(e.tls, None);
        let dir = tempfile::tempdir().unwrap();
        let err = resolve(Some("tcp://127.0.0.1:1"), Some(dir.path())).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("engine tcp://127.0.0.1:1") && text.contains("ca.pem is missing"),
            "{text}"
        );
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let e = resolve(Some("tcp://127.0.0.1:1"), Some(dir.path())).unwrap();
        assert_eq!(e.tls.unwrap().ca, dir.path().join("ca.pem"));
        let bad = resolve(Some("ssh://host"), None).unwrap_err().to_string();
        assert!(bad.contains("unix://"), "{bad}");
    }
}
