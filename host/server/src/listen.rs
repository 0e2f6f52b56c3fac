//! Listening: a unix socket (mode 0600) and, when asked, loopback TCP with
//! a bearer token; connections served by hyper, each on its own task; an
//! idle server exits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::api::API_VERSION;
use crate::http::{ApiError, BoxError, Reply};
use crate::Api;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Another server answers on the socket.
    #[error("a berth server already answers on {}", path.display())]
    AlreadyRunning {
        /// The socket.
        path: PathBuf,
    },
    /// Binding, accepting or setting up the socket failed.
    #[error("{what} {where_}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        where_: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// TCP without a token, or not on loopback without saying so.
    #[error("{0}")]
    Refused(String),
}

fn io(what: &'static str, where_: impl std::fmt::Display, source: std::io::Error) -> ServeError {
    ServeError::Io {
        what,
        where_: where_.to_string(),
        source,
    }
}

/// A server for an [`Api`].
///
/// By default it listens nowhere (give it a unix socket, TCP, or both),
/// never exits on its own, and reads a request's headers for at most 30
/// seconds.
#[derive(Debug)]
pub struct Server {
    api: Api,
    socket: Option<PathBuf>,
    tcp: Option<(SocketAddr, String)>,
    idle_exit: Option<Duration>,
    header_timeout: Duration,
}

impl Server {
    /// A server for `api`.
    pub fn new(api: Api) -> Self {
        Server {
            api,
            socket: None,
            tcp: None,
            idle_exit: None,
            header_timeout: Duration::from_secs(30),
        }
    }

    /// Listen on a unix socket at `path`, mode 0600 (only this user may
    /// connect, as with dockerd's socket). A stale socket there is
    /// replaced; one a server answers on is refused. By default, none.
    pub fn unix_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket = Some(path.into());
        self
    }

    /// Listen on TCP at `addr` too, every request needing `Authorization:
    /// Bearer TOKEN`. By default, no TCP. [`Server::run`] refuses an
    /// address that is not loopback unless `beyond_loopback`.
    pub fn tcp(mut self, addr: SocketAddr, token: impl Into<String>) -> Self {
        self.tcp = Some((addr, token.into()));
        self
    }

    /// Exit once nothing has been open (no connection) for this long. By
    /// default, never.
    pub fn idle_exit(mut self, after: Option<Duration>) -> Self {
        self.idle_exit = after;
        self
    }

    /// How long a client may take to send a request's headers. By
    /// default, 30 seconds.
    pub fn header_timeout(mut self, timeout: Duration) -> Self {
        self.header_timeout = timeout;
        self
    }

    /// Serves until SIGTERM or SIGINT, or until idle for the idle time, or
    /// until its socket file is removed or replaced; then removes the
    /// socket. Connections still open are closed (their commands stopped).
    pub async fn run(self) -> Result<(), ServeError> {
        self.run_with(false).await
    }

    /// [`Server::run`], allowing a TCP address that is not loopback when
    /// `beyond_loopback`.
    pub async fn run_with(self, beyond_loopback: bool) -> Result<(), ServeError> {
        if self.socket.is_none() && self.tcp.is_none() {
            return Err(ServeError::Refused(
                "nothing to listen on: give a unix socket or a TCP address".into(),
            ));
        }
        let activity = Arc::new(Activity::default());
        self.api.keep_pools();
        let mut tasks = tokio::task::JoinSet::new();
        let mut socket_identity = None;
        if let Some(path) = &self.socket {
            let listener = bind_unix(path).await?;
            socket_identity = identity(path);
            tracing::info!(socket = %path.display(), api = API_VERSION, "berth server listening");
            let conn = self.connection(None, activity.clone());
            tasks.spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => conn.spawn(stream),
                        Err(e) => {
                            tracing::warn!("accepting on the unix socket: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        if let Some((addr, token)) = &self.tcp {
            if token.trim().is_empty() {
                return Err(ServeError::Refused(
                    "TCP needs a bearer token (--token-file): an empty one is refused".into(),
                ));
            }
            if !addr.ip().is_loopback() && !beyond_loopback {
                return Err(ServeError::Refused(format!(
                    "{addr} is not a loopback address; name it explicitly in --listen to serve beyond this host"
                )));
            }
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| io("binding", addr, e))?;
            tracing::info!(%addr, "berth server listening on TCP (bearer token required)");
            let conn = self.connection(Some(token.trim().to_string()), activity.clone());
            tasks.spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            conn.spawn(stream)
                        }
                        Err(e) => {
                            tracing::warn!("accepting on TCP: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| io("handling", "SIGTERM", e))?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let why = loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break "interrupted",
                _ = term.recv() => break "terminated",
                _ = tick.tick() => {
                    if let (Some(path), Some(id)) = (&self.socket, socket_identity) {
                        if identity(path) != Some(id) {
                            break "its socket was removed or replaced";
                        }
                    }
                    if let Some(idle) = self.idle_exit {
                        // A server keeping warm pools stays up while it
                        // has one.
                        if activity.idle_for() >= idle && !self.api.keeps_pools() {
                            break "idle";
                        }
                    }
                }
            }
        };
        tracing::info!("berth server exiting: {why}");
        tasks.abort_all();
        if let (Some(path), Some(id)) = (&self.socket, socket_identity) {
            if identity(path) == Some(id) {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(())
    }

    fn connection(&self, token: Option<String>, activity: Arc<Activity>) -> Connection {
        Connection {
            api: self.api.clone(),
            token: token.map(Arc::new),
            activity,
            header_timeout: self.header_timeout,
        }
    }
}

/// How many connections are open, and since when none is.
#[derive(Default)]
struct Activity {
    open: AtomicUsize,
    last: Mutex<Option<Instant>>,
}

impl Activity {
    fn idle_for(&self) -> Duration {
        if self.open.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.get_or_insert_with(Instant::now).elapsed()
    }

    fn enter(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::SeqCst);
        Open(self.clone())
    }
}

struct Open(Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        *self
            .0
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Connection {
    api: Api,
    token: Option<Arc<String>>,
    activity: Arc<Activity>,
    header_timeout: Duration,
}

impl Connection {
    fn spawn<S>(&self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let this = self.clone();
        let open = self.activity.enter();
        let header_timeout = self.header_timeout;
        tokio::spawn(async move {
            let _open = open;
            let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let this = this.clone();
                async move { Ok::<_, std::convert::Infallible>(this.answer(req).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Some(header_timeout))
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!("connection ended: {e}");
            }
        });
    }

    async fn answer(&self, req: http::Request<Incoming>) -> Reply {
        if let Some(token) = &self.token {
            let given = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            let ok = given.is_some_and(|g| same(g.as_bytes(), token.as_bytes()));
            if !ok {
                let e = ApiError::new(
                    http::StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    if given.is_none() {
                        "this server needs `Authorization: Bearer TOKEN` (the token in its --token-file)"
                    } else {
                        "the bearer token is wrong"
                    },
                );
                let mut reply = e.into_reply();
                reply.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
                return reply;
            }
        }
        let req = req.map(|b| b.map_err(BoxError::from).boxed_unsync());
        self.api.handle(req).await
    }
}

/// Constant-time equality (for equal lengths; the length is not secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The socket file's device and inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Binds a unix socket at `path` with mode 0600 from the first moment: it
/// is bound under a temporary name, restricted, then renamed into place.
async fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating", dir.display(), e))?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ServeError::AlreadyRunning {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path)
            .map_err(|e| io("removing the stale socket", path.display(), e))?;
    }
    // Bound inside a fresh private directory (0700), restricted, then
    // renamed into place: nobody can connect before it is 0600.
    let dir = path.parent().unwrap_or(Path::new("."));
    let private = tempfile_dir(dir)?;
    let tmp = private.join("berth.sock");
    let listener =
        tokio::net::UnixListener::bind(&tmp).map_err(|e| io("binding", tmp.display(), e));
    let placed = listener.and_then(|l| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io("restricting", tmp.display(), e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("placing the socket at", path.display(), e))?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&private);
    placed
}

/// A new directory under `dir` only this user can enter.
fn tempfile_dir(dir: &Path) -> Result<PathBuf, ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    for attempt in 0..16u32 {
        let p = dir.join(format!(".berth-sock-{}-{attempt}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_dir_all(&p);
            }
            Err(e) => return Err(io("creating", p.display(), e)),
        }
    }
    Err(ServeError::Refused(format!(
        "cannot make a private directory in {}",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(!same(b"", b"a"));
    }
}
