//! The egress daemon: one process per sandbox with a policy, on the host,
//! serving that sandbox's egress point on a Unix socket the sandbox is
//! given, and taking the host's requests on a control socket it is not.
//!
//! It runs apart from any Berth process (the CLI exits after each command;
//! a server may restart), keeps its policy in its directory, and exits
//! when told to or when its directory is removed.

use std::fs::{File, TryLockError};
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use crate::ca::SandboxCa;
use crate::control::{read_line, ControlReply, ControlRequest, EgressStatus};
use crate::intercept::{upstream_config, Interception};
use crate::point::{EgressPoint, Resolver};
use crate::policy::EgressPolicy;
use crate::resolve::TestResolve;
use crate::secrets::StoredSecret;

/// The most connections one sandbox may have open through its egress
/// point; the next is answered `503` and closed.
pub const MAX_OPEN_CONNECTIONS: usize = 256;
/// How often the daemon checks that its directory is still there.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// An egress daemon's directory on the host (mode 0700) and the files in
/// it. Only [`EgressDir::sandbox_dir`] is given to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressDir {
    root: PathBuf,
}

impl EgressDir {
    /// The daemon directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        EgressDir { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The policy the daemon applies (JSON, written by the host before
    /// the daemon starts, and by the daemon on every change).
    pub fn policy_file(&self) -> PathBuf {
        self.root.join("policy.json")
    }

    /// The sandbox's test names (JSON list of `NAME=ADDR`), if any.
    pub fn resolve_file(&self) -> PathBuf {
        self.root.join("resolve.json")
    }

    /// The connection log, as last saved (JSON, mode 0600): a daemon that
    /// starts again goes on from it.
    pub fn connection_log_file(&self) -> PathBuf {
        self.root.join("connections.json")
    }

    /// The daemon's lock: held while it runs, so one runs per directory.
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// Where the daemon's own log goes (the spawner opens it).
    pub fn log_file(&self) -> PathBuf {
        self.root.join("daemon.log")
    }

    /// The host's control socket (mode 0600).
    pub fn control_socket(&self) -> PathBuf {
        self.root.join("control.sock")
    }

    /// The directory given to the sandbox, holding only the point's socket.
    pub fn sandbox_dir(&self) -> PathBuf {
        self.root.join("sandbox")
    }

    /// The egress point's socket, inside [`EgressDir::sandbox_dir`].
    pub fn point_socket(&self) -> PathBuf {
        self.sandbox_dir().join(POINT_SOCKET)
    }

    /// The sandbox's secrets with their values (JSON, mode 0600); never in
    /// [`EgressDir::sandbox_dir`].
    pub fn secrets_file(&self) -> PathBuf {
        self.root.join("secrets.json")
    }

    /// The key of the sandbox's CA (PEM, mode 0600), made by the daemon.
    pub fn ca_key_file(&self) -> PathBuf {
        self.root.join("ca-key.pem")
    }

    /// The certificate of the sandbox's CA, given to the sandbox.
    pub fn ca_certificate(&self) -> PathBuf {
        self.sandbox_dir().join(CA_CERTIFICATE)
    }

    /// What the sandbox trusts: the host's trust roots and the sandbox's CA.
    pub fn ca_bundle(&self) -> PathBuf {
        self.sandbox_dir().join(CA_BUNDLE)
    }

    /// Keeps the sandbox's secrets, values and all, for its daemon (mode
    /// 0600 in a directory of mode 0700). Replaces any kept before.
    pub fn write_secrets(&self, secrets: &[StoredSecret]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))?;
        write_json(&self.secrets_file(), secrets)
    }

    /// The secrets kept for the daemon (none when none were).
    pub fn read_secrets(&self) -> Result<Vec<StoredSecret>, DaemonError> {
        if self.secrets_file().exists() {
            read_json(&self.secrets_file())
        } else {
            Ok(Vec::new())
        }
    }

    /// Writes the policy (and the test names) the daemon will start with.
    pub fn write_settings(
        &self,
        policy: &EgressPolicy,
        test_names: &[TestResolve],
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))?;
        write_json(&self.policy_file(), policy)?;
        write_json(&self.resolve_file(), &test_names)
    }
}

/// The file name of the egress point's socket in the sandbox's directory.
pub const POINT_SOCKET: &str = "point.sock";
/// The file name of the sandbox's CA certificate in its directory (there
/// only when it has secrets).
pub const CA_CERTIFICATE: &str = "ca.pem";
/// The file name of the sandbox's trust bundle in its directory: the
/// host's roots and the sandbox's CA (there only when it has secrets).
pub const CA_BUNDLE: &str = "ca-bundle.pem";

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A file in its directory could not be read, written or bound.
    #[error("egress daemon: {what} {path}: {source}")]
    Io {
        /// What it was doing.
        what: &'static str,
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Its secrets' CA or trust roots could not be set up.
    #[error("egress daemon: {0}")]
    Interception(String),
    /// Its settings are not valid JSON of the right shape.
    #[error("egress daemon: {path} is not valid: {why}")]
    Settings {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// What [`serve`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonExit {
    /// Another daemon already serves the directory.
    AlreadyRunning,
    /// Told to shut down.
    Shutdown,
    /// Its directory was removed.
    DirectoryGone,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DaemonError + 'a {
    move |source| DaemonError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Serves the egress point for the directory `dir` until told to stop or
/// until the directory is removed.
pub async fn serve(dir: &EgressDir) -> Result<DaemonExit, DaemonError> {
    let lock_path = dir.lock_file();
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io("opening", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(DaemonExit::AlreadyRunning),
        Err(TryLockError::Error(e)) => return Err(io("locking", &lock_path)(e)),
    }
    let policy: EgressPolicy = read_json(&dir.policy_file())?;
    let test_names: Vec<TestResolve> = if dir.resolve_file().exists() {
        read_json(&dir.resolve_file())?
    } else {
        Vec::new()
    };
    let sandbox_dir = dir.sandbox_dir();
    std::fs::create_dir_all(&sandbox_dir).map_err(io("creating", &sandbox_dir))?;
    std::fs::set_permissions(&sandbox_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io("setting the mode of", &sandbox_dir))?;
    let (upstream_tls, interception) = tls(dir)?;
    let point = EgressPoint::with_interception(
        policy,
        Resolver::with_test_names(test_names),
        interception,
        Some(upstream_tls),
    );
    let mut saved_log = Vec::new();
    if let Ok(text) = std::fs::read(dir.connection_log_file()) {
        match serde_json::from_slice::<SavedLog>(&text) {
            Ok(log) => {
                point.restore_log(log.connections, log.dropped);
                saved_log = text;
            }
            Err(e) => tracing::warn!(
                error = %e,
                "the saved connection log is not readable; starting a new one"
            ),
        }
    }
    let points = bind(&dir.point_socket(), 0o666)?;
    let control = bind(&dir.control_socket(), 0o600)?;
    tracing::info!(dir = %dir.root().display(), "egress daemon serving");

    let slots = Arc::new(Semaphore::new(MAX_OPEN_CONNECTIONS));
    let (stop, mut stopped) = watch::channel(false);
    let mut watch = tokio::time::interval(WATCH_INTERVAL);
    let exit = loop {
        tokio::select! {
            accepted = points.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let point = point.clone();
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        tokio::spawn(async move {
                            point.serve(client).await;
                            drop(slot);
                        });
                    }
                    Err(_) => {
                        tokio::spawn(too_many(client));
                    }
                }
            }
            accepted = control.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let point = point.clone();
                let dir = dir.clone();
                let stop = stop.clone();
                tokio::spawn(async move { answer(stream, &point, &dir, &stop).await });
            }
            _ = stopped.changed() => break DaemonExit::Shutdown,
            _ = watch.tick() => {
                if !dir.control_socket().exists() {
                    break DaemonExit::DirectoryGone;
                }
                save_log(dir, &point, &mut saved_log);
            }
        }
    };
    if exit == DaemonExit::Shutdown {
        save_log(dir, &point, &mut saved_log);
    }
    // Gone already when the directory was removed; nothing to tell anyone.
    let _ = std::fs::remove_file(dir.control_socket());
    let _ = std::fs::remove_file(dir.point_socket());
    tracing::info!(?exit, "egress daemon exiting");
    Ok(exit)
}

/// The host's trust roots (as `rustls-native-certs` reads them: the
/// system's, or `$SSL_CERT_FILE`/`$SSL_CERT_DIR`), and the same as PEM.
fn host_roots() -> (rustls::RootCertStore, String) {
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::warn!(%error, "reading the host's trust roots");
    }
    let mut roots = rustls::RootCertStore::empty();
    let mut pem_text = String::new();
    for certificate in native.certs {
        pem_text.push_str(&pem::encode(&pem::Pem::new(
            "CERTIFICATE",
            certificate.to_vec(),
        )));
        // A root rustls cannot use is still the sandbox's to trust.
        let _ = roots.add(certificate);
    }
    (roots, pem_text)
}

/// How the point opens TLS upstream, and the interception of a sandbox
/// with secrets: its CA (made at the first start) and the sandbox's trust
/// bundle, written for it (the host's roots and the CA). No interception
/// for a sandbox without secrets.
fn tls(dir: &EgressDir) -> Result<(Arc<rustls::ClientConfig>, Option<Interception>), DaemonError> {
    let failed = |e: &dyn std::fmt::Display| DaemonError::Interception(e.to_string());
    let (roots, mut bundle) = host_roots();
    let root_count = roots.len();
    let upstream = upstream_config(roots).map_err(|e| failed(&e))?;
    let secrets = dir.read_secrets()?;
    if secrets.is_empty() {
        return Ok((upstream, None));
    }
    let hosts: Vec<&crate::rules::HostRule> = secrets
        .iter()
        .flat_map(|s| s.binding.hosts.iter())
        .collect();
    let ca = SandboxCa::load_or_create(&dir.ca_key_file(), &dir.ca_certificate(), &hosts)
        .map_err(|e| failed(&e))?;
    bundle.push_str(ca.certificate_pem());
    std::fs::write(dir.ca_bundle(), bundle).map_err(io("writing", &dir.ca_bundle()))?;
    tracing::info!(
        secrets = secrets.len(),
        roots = root_count,
        "secrets by placeholder: TLS to their hosts is intercepted"
    );
    let interception = Interception::new(secrets, ca, upstream.clone());
    Ok((upstream, Some(interception)))
}

/// The connection log as the daemon saves it between runs.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedLog {
    connections: Vec<crate::log::Connection>,
    dropped: u64,
}

/// Saves the log when it changed since `saved` (what was written last).
/// A daemon killed outright loses at most the last interval.
fn save_log(dir: &EgressDir, point: &EgressPoint, saved: &mut Vec<u8>) {
    let (connections, dropped) = point.connections();
    let Ok(text) = serde_json::to_vec(&SavedLog {
        connections,
        dropped,
    }) else {
        return;
    };
    if text == *saved {
        return;
    }
    match write_json_bytes(&dir.connection_log_file(), &text) {
        Ok(()) => *saved = text,
        Err(e) => tracing::warn!(error = %e, "saving the connection log"),
    }
}

fn bind(path: &Path, mode: u32) -> Result<UnixListener, DaemonError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("removing the stale socket", path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io("binding", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io("setting the mode of", path))?;
    Ok(listener)
}

async fn too_many(mut client: UnixStream) {
    let body = format!(
        "berth egress: more than {MAX_OPEN_CONNECTIONS} connections open from this sandbox\n"
    );
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may be gone: nothing more to tell it.
    let _ = client.write_all(reply.as_bytes()).await;
    let _ = client.shutdown().await;
}

async fn answer(
    mut stream: UnixStream,
    point: &EgressPoint,
    dir: &EgressDir,
    stop: &watch::Sender<bool>,
) {
    let reply = match read_line(&mut stream).await {
        Err(e) => ControlReply::Error {
            message: e.to_string(),
        },
        Ok(line) => match serde_json::from_slice::<ControlRequest>(&line) {
            Err(e) => ControlReply::Error {
                message: format!("not a control request: {e}"),
            },
            Ok(request) => carry_out(request, point, dir, stop),
        },
    };
    let mut line = serde_json::to_vec(&reply).unwrap_or_else(|e| {
        format!("{{\"reply\":\"error\",\"message\":{:?}}}", e.to_string()).into_bytes()
    });
    line.push(b'\n');
    // The host may have given up waiting: nothing more to tell it.
    let _ = stream.write_all(&line).await;
    let _ = stream.shutdown().await;
}

fn carry_out(
    request: ControlRequest,
    point: &EgressPoint,
    dir: &EgressDir,
    stop: &watch::Sender<bool>,
) -> ControlReply {
    match request {
        ControlRequest::Status => {
            let (connections, dropped) = point.connections();
            ControlReply::Status(Box::new(EgressStatus {
                policy: point.policy(),
                connections,
                dropped,
                open: point.open_connections(),
                pid: std::process::id(),
                rss_bytes: resident_bytes(),
            }))
        }
        ControlRequest::SetPolicy { policy } => match write_json(&dir.policy_file(), &policy) {
            Ok(()) => {
                point.set_policy(policy);
                ControlReply::Done
            }
            Err(e) => ControlReply::Error {
                message: format!("keeping the policy in {}: {e}", dir.policy_file().display()),
            },
        },
        ControlRequest::Shutdown => {
            stop.send_replace(true);
            ControlReply::Done
        }
    }
}

/// This process's resident memory, from `/proc/self/status` (0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, DaemonError> {
    let text = std::fs::read(path).map_err(io("reading", path))?;
    serde_json::from_slice(&text).map_err(|e| DaemonError::Settings {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

/// Writes `value` as JSON to `path` whole or not at all (a temporary file
/// renamed over it), mode 0600.
fn write_json<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> std::io::Result<()> {
    write_json_bytes(path, &serde_json::to_vec_pretty(value)?)
}

fn write_json_bytes(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut file = File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
