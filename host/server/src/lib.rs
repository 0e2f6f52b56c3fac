//! `berth serve`: Berth's API for agent frameworks in any language.
//!
//! The server holds sandboxes open (their agent sessions warm) and serves a
//! versioned JSON API over HTTP/1.1: every lifecycle operation, commands
//! with output streamed as newline-delimited JSON events, background
//! processes, the file API, and the workspace as a tar stream. The OpenAPI
//! document is generated from the route table and served at
//! `/v1/openapi.json`.
//!
//! It is built on the public library only: [`Api`] is a request handler
//! an embedder can mount in their own service, and [`Server`] listens on a
//! unix socket (mode 0600) and, when asked, on loopback TCP with a bearer
//! token.
//!
//! ```no_run
//! use berth::sandbox::{NamedSandboxes, SandboxClient};
//! use berth_server::{Api, Server};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let api = Api::new(NamedSandboxes::new(SandboxClient::new("/var/lib/berth")));
//! Server::new(api)
//!     .unix_socket("/var/lib/berth/berth.sock")
//!     .idle_exit(Some(std::time::Duration::from_secs(600)))
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```

mod api;
mod api_egress;
mod api_history;
mod api_pools;
mod handlers;
mod http;
mod listen;
mod notices;
mod open;
mod openapi;
mod pool_keeper;
mod route;
mod routes;

use std::sync::Arc;

use berth::sandbox::NamedSandboxes;

pub use api::*;
pub use api_egress::*;
pub use api_history::*;
pub use api_pools::*;
pub use http::{BoxError, Reply, ReplyBody, RequestBody};
pub use listen::{ServeError, Server};
pub use notices::{EventText, WarningRelay, NOTICES_HEADER, NOTICE_TARGET, WARNINGS_HEADER};

/// The OpenAPI document of API v1 (what `/v1/openapi.json` serves).
pub fn openapi() -> serde_json::Value {
    openapi::document(&routes::table())
}

use handlers::exec::Execs;
use open::OpenSandboxes;

/// A digest of this process's environment that decides how Berth behaves:
/// every `BERTH_*` and `DOCKER_*` variable, except those that only steer
/// the CLI's choice of server. A server answers with it at
/// `/v1/version`; a CLI whose own digest differs (another engine in
/// `DOCKER_HOST`, another cache) runs in-process instead.
pub fn environment_fingerprint() -> String {
    const IGNORED: &[&str] = &[
        "BERTH_NO_SERVER",
        "BERTH_SERVER_IDLE_EXIT",
        "BERTH_SKIP_LOG",
    ];
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| {
            (k.starts_with("BERTH_") || k.starts_with("DOCKER_")) && !IGNORED.contains(&k.as_str())
        })
        .collect();
    vars.sort();
    let mut hasher = blake3::Hasher::new();
    for (k, v) in &vars {
        hasher.update(k.as_bytes());
        hasher.update(b"=");
        hasher.update(v.as_bytes());
        hasher.update(b"\0");
    }
    hasher.finalize().to_hex()[..16].to_string()
}

/// Which build of Berth this process runs: a digest of its executable's
/// path, size and modification time. A CLI talks only to a server of its
/// own build (after an upgrade or a rebuild, an older server still running
/// is left alone and the CLI runs in-process).
pub fn build_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let mut hasher = blake3::Hasher::new();
    hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
    if let Ok(exe) = std::env::current_exe() {
        hasher.update(exe.as_os_str().as_encoded_bytes());
        if let Ok(m) = std::fs::metadata(&exe) {
            hasher.update(&m.size().to_le_bytes());
            hasher.update(&m.mtime().to_le_bytes());
            hasher.update(&m.mtime_nsec().to_le_bytes());
        }
    }
    hasher.finalize().to_hex()[..16].to_string()
}

/// Limits on what a request may send. By default: JSON bodies 1 MiB,
/// archives to hydrate 16 GiB, files written 16 GiB.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Limits {
    /// Bytes of a JSON request body.
    pub json_body: usize,
    /// Bytes of an archive to hydrate.
    pub archive: u64,
    /// Bytes of a file written.
    pub file: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            json_body: 1 << 20,
            archive: 16 << 30,
            file: 16 << 30,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) open: OpenSandboxes,
    pub(crate) pools: Arc<pool_keeper::PoolKeeper>,
    pub(crate) execs: Execs,
    pub(crate) limits: Limits,
    pub(crate) routes: Vec<routes::Route>,
}

/// The API: turns requests into replies. Cheap to clone.
#[derive(Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("home", &self.inner.open.named().home())
            .finish()
    }
}

impl Api {
    /// The API over the named sandboxes `named` (their state files and
    /// locks shared with any other process using the same home).
    pub fn new(named: NamedSandboxes) -> Self {
        Self::with_limits(named, Limits::default())
    }

    /// [`Api::new`] with other [`Limits`].
    pub fn with_limits(named: NamedSandboxes, limits: Limits) -> Self {
        Api {
            inner: Arc::new(Inner {
                pools: Arc::new(pool_keeper::PoolKeeper::new(berth::sandbox::Pools::new(
                    named.clone(),
                ))),
                open: OpenSandboxes::new(named),
                execs: Execs::default(),
                limits,
                routes: routes::table(),
            }),
        }
    }

    /// How many sandboxes are open (kept attached between requests).
    pub fn open_sandboxes(&self) -> usize {
        self.inner.open.count()
    }

    /// Starts keeping the home's warm pools full (members made, opened
    /// and checked in the background); a server calls it as it starts, so
    /// the pools a previous server kept are opened again. Call it on a
    /// tokio runtime.
    pub fn keep_pools(&self) {
        self.inner.pools.start();
    }

    /// Whether the home has a warm pool (a server keeping one does not
    /// exit when idle).
    pub fn keeps_pools(&self) -> bool {
        self.inner.pools.keeps_any()
    }

    /// Answers one request. Paths start with `/v1/`; see
    /// `/v1/openapi.json`.
    pub async fn handle(&self, request: ::http::Request<RequestBody>) -> Reply {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let started = std::time::Instant::now();
        let (mut reply, collected) = notices::collecting(self.answer(&parts, body, &path)).await;
        for (header, lines) in [
            (WARNINGS_HEADER, &collected.warnings),
            (NOTICES_HEADER, &collected.notices),
        ] {
            if lines.is_empty() {
                continue;
            }
            use base64::Engine;
            let encoded = base64::engine::general_purpose::STANDARD
                .encode(serde_json::to_vec(lines).unwrap_or_default());
            if let Ok(value) = ::http::HeaderValue::from_str(&encoded) {
                reply.headers_mut().insert(header, value);
            }
        }
        tracing::debug!(
            method = %parts.method,
            path,
            status = reply.status().as_u16(),
            ms = started.elapsed().as_millis() as u64,
            "request"
        );
        reply
    }

    async fn answer(&self, parts: &::http::request::Parts, body: RequestBody, path: &str) -> Reply {
        match routes::find(&self.inner.routes, &parts.method, path) {
            Err(e) => e.into_reply(),
            Ok((route, params)) => match routes::parse_query(parts.uri.query()) {
                Err(e) => e.into_reply(),
                Ok(query) => {
                    let sandbox = route
                        .path
                        .starts_with("/v1/sandboxes/{name}")
                        .then(|| params.first().cloned())
                        .flatten();
                    let call = routes::Call {
                        params,
                        query,
                        headers: parts.headers.clone(),
                        body,
                    };
                    match (route.handler)(self.inner.clone(), call).await {
                        Ok(reply) => reply,
                        Err(e) => {
                            // A stale instance (its scheduler replaced it)
                            // is never used again: the next request opens
                            // the sandbox afresh, where it now runs.
                            if let (Some(name), "stale") = (sandbox, e.code) {
                                self.inner.open.forget(&name);
                            }
                            e.into_reply()
                        }
                    }
                }
            },
        }
    }
}
