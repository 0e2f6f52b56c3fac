//! A sandbox's egress: what it may reach beyond itself, enforced on the
//! host.
//!
//! A sandbox created with an [`EgressSettings`] has no network but its own
//! loopback. Its backend binds one host directory into it, read-only, at
//! [`SANDBOX_EGRESS_DIR`]: the directory holding the Unix socket of its
//! egress point, served on the host by the `berth-egress` daemon (one per
//! sandbox, see [`berth_egress::serve`]). Inside, Berth's helper bridges
//! [`SANDBOX_PROXY`] on loopback to that socket, and every command's
//! environment names it in `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`
//! ([`proxy_environment`]). A tool that ignores them has no route anywhere
//! and fails at once. The sandbox can speak to the socket directly too —
//! it reaches the same point with the same policy: what it may reach does
//! not depend on its cooperation.
//!
//! The settings are part of the sandbox's state ([`EgressState`]), so they
//! survive resume, a restore elsewhere, and a fork (which gets its own
//! daemon with the same policy). The daemon is started at each start when
//! it is not running, changed while it runs ([`set_policy`]), and stopped
//! with the sandbox's backend.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_egress::{call, ControlError, ControlReply, ControlRequest, EgressDir};
pub use berth_egress::{
    CidrRule, Connection, EgressPolicy, EgressStatus, HostRule, RuleError, SecretBinding,
    SecretError, SecretValue, TestResolve, Verdict,
};
use berth_egress::{StoredSecret, CA_BUNDLE, CA_CERTIFICATE};

/// Where the egress point's directory is inside a sandbox.
pub const SANDBOX_EGRESS_DIR: &str = "/run/berth/egress";
/// The egress point's socket inside a sandbox.
pub const SANDBOX_EGRESS_SOCKET: &str = "/run/berth/egress/point.sock";
/// The proxy address a sandbox's commands are given, on its loopback.
pub const SANDBOX_PROXY: &str = "127.0.0.1:3128";
/// How long a new daemon has to answer before its start counts as failed.
const DAEMON_START_DEADLINE: Duration = Duration::from_secs(10);
/// How long a daemon told to stop has to exit before its directory is
/// removed anyway.
const DAEMON_STOP_DEADLINE: Duration = Duration::from_secs(5);

/// What a new sandbox may reach (`berth create --allow-host …`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressSettings {
    /// The policy: default deny, then what it allows.
    #[serde(default)]
    pub policy: EgressPolicy,
    /// Test names (under `.test` only) and the addresses they resolve to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_resolve: Vec<TestResolve>,
    /// Secrets by placeholder: each one's name, hosts and placeholder
    /// (`berth create --secret NAME=@FILE --secret-hosts NAME=HOST`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretBinding>,
    /// The secrets' values, by name, on their way to the daemon's
    /// directory at create. Never serialized: not in the state, not in a
    /// snapshot, not in a log.
    #[serde(skip)]
    pub secret_values: std::collections::BTreeMap<String, SecretValue>,
}

impl EgressSettings {
    /// Adds the secret `name`, whose value is `value` (one trailing line
    /// end dropped), sent only to `hosts`; the sandbox holds a fresh
    /// placeholder instead.
    pub fn add_secret(
        &mut self,
        name: &str,
        value: &str,
        hosts: &[String],
    ) -> Result<(), SecretError> {
        let binding = SecretBinding::new(name, hosts)?;
        let value = SecretValue::new(name, value)?;
        if self.secrets.iter().any(|s| s.name == name) {
            return Err(SecretError::Duplicate(name.to_string()));
        }
        self.secrets.push(binding);
        self.secret_values.insert(name.to_string(), value);
        Ok(())
    }

    /// Checks the secrets before a create: names once each, a value for
    /// each, and each named host one the policy allows (a secret bound to
    /// a host the sandbox may not reach would never be sent).
    pub fn check_secrets(&self) -> Result<(), EgressError> {
        berth_egress::check_unique(&self.secrets)?;
        for secret in &self.secrets {
            if !self.secret_values.contains_key(&secret.name) {
                return Err(EgressError::SecretWithoutValue(secret.name.clone()));
            }
            for rule in &secret.hosts {
                let text = rule.to_string();
                if text.starts_with("*.") {
                    continue;
                }
                let (host, port) = match rule.port() {
                    Some(port) => (
                        text.rsplit_once(':').map_or(text.as_str(), |(h, _)| h),
                        port,
                    ),
                    None => (text.as_str(), 443),
                };
                if let Err(denial) = self.policy.decide(host, port) {
                    return Err(EgressError::SecretHostNotAllowed {
                        secret: secret.name.clone(),
                        host: text.clone(),
                        why: denial.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A sandbox's egress, as its state keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressState {
    /// The settings in force (a change while running is kept here too).
    #[serde(flatten)]
    pub settings: EgressSettings,
    /// The daemon's directory on the host
    /// (`<home>/egress/<session id>`).
    pub dir: PathBuf,
}

impl EgressState {
    /// The state of a new sandbox's egress, its daemon under `home`.
    pub fn new(settings: EgressSettings, home: &Path, session_id: &str) -> Self {
        EgressState {
            settings,
            dir: home.join("egress").join(session_id),
        }
    }

    fn daemon_dir(&self) -> EgressDir {
        EgressDir::new(&self.dir)
    }

    /// Keeps the values of `settings`' secrets for this sandbox's daemon
    /// (mode 0600, outside what the sandbox is given); the state keeps
    /// only their names, hosts and placeholders.
    pub fn store_secrets(&mut self, settings: &EgressSettings) -> Result<(), EgressError> {
        let stored: Vec<StoredSecret> = settings
            .secrets
            .iter()
            .map(|binding| {
                let value = settings
                    .secret_values
                    .get(&binding.name)
                    .cloned()
                    .ok_or_else(|| EgressError::SecretWithoutValue(binding.name.clone()))?;
                Ok(StoredSecret {
                    binding: binding.clone(),
                    value,
                })
            })
            .collect::<Result<_, EgressError>>()?;
        self.settings.secret_values.clear();
        if stored.is_empty() {
            return Ok(());
        }
        self.daemon_dir()
            .write_secrets(&stored)
            .map_err(|source| EgressError::Start {
                dir: self.dir.display().to_string(),
                source,
            })
    }

    /// The values of this sandbox's secrets, from its daemon's directory
    /// (for a fork, which sends them to the same hosts).
    pub fn secret_values(
        &self,
    ) -> Result<std::collections::BTreeMap<String, SecretValue>, EgressError> {
        let stored = self
            .daemon_dir()
            .read_secrets()
            .map_err(|e| EgressError::SecretsUnreadable(e.to_string()))?;
        Ok(stored
            .into_iter()
            .map(|s| (s.binding.name, s.value))
            .collect())
    }

    /// The variables every command of the sandbox gets: the proxy's, and
    /// for a sandbox with secrets, each secret's placeholder and the trust
    /// bundle that holds the sandbox's CA, under the names common tools
    /// read (OpenSSL, curl, git, Python's requests and pip, Node.js).
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut vars = proxy_environment();
        if self.settings.secrets.is_empty() {
            return vars;
        }
        for secret in &self.settings.secrets {
            vars.push((secret.name.clone(), secret.placeholder.clone()));
        }
        let bundle = format!("{SANDBOX_EGRESS_DIR}/{CA_BUNDLE}");
        for name in [
            "SSL_CERT_FILE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "AWS_CA_BUNDLE",
        ] {
            vars.push((name.to_string(), bundle.clone()));
        }
        vars.push((
            "NODE_EXTRA_CA_CERTS".to_string(),
            format!("{SANDBOX_EGRESS_DIR}/{CA_CERTIFICATE}"),
        ));
        vars
    }

    /// The host directory a backend binds at [`SANDBOX_EGRESS_DIR`].
    pub fn route(&self) -> EgressRoute {
        EgressRoute {
            socket_dir: self.daemon_dir().sandbox_dir(),
        }
    }
}

/// What a backend is given to route a sandbox's egress: the host directory
/// to bind at [`SANDBOX_EGRESS_DIR`] (read-only; it holds the point's
/// socket and, for a sandbox with secrets, the CA files the sandbox
/// trusts), or whose socket a backend that cannot bind it carries
/// connections to some other way (the swarm's, through the agent). A backend that cannot route egress refuses a sandbox that has
/// it (see [`crate::backend::BackendOptions::routes_egress`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressRoute {
    /// The host directory holding the point's socket.
    pub socket_dir: PathBuf,
}

/// The variables that point a sandbox's tools at its egress point.
pub fn proxy_environment() -> Vec<(String, String)> {
    let url = format!("http://{SANDBOX_PROXY}");
    let mut vars: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .iter()
    .map(|name| (name.to_string(), url.clone()))
    .collect();
    for name in ["NO_PROXY", "no_proxy"] {
        vars.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    vars
}

/// The egress daemon could not be started, reached or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    /// No `berth-egress` binary was found.
    #[error(
        "no berth-egress binary: set BERTH_EGRESS to one, or put berth-egress beside the program \
         (cargo build -p berth-egress)"
    )]
    NoDaemonBinary,
    /// Its directory could not be written, or the daemon not spawned.
    #[error("starting the egress daemon in {dir}: {source}")]
    Start {
        /// Its directory.
        dir: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// It started but did not answer; its log says why.
    #[error("the egress daemon in {dir} did not start: {log}")]
    NotStarted {
        /// Its directory.
        dir: String,
        /// The end of its log.
        log: String,
    },
    /// It did not take a request.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// A secret is not one.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// A secret was named with no value.
    #[error("the secret {0} has no value: give it with --secret {0}=@FILE")]
    SecretWithoutValue(String),
    /// A secret is bound to a host the policy does not allow.
    #[error(
        "the secret {secret} is bound to {host}, which the policy does not allow ({why}); \
         allow it with --allow-host {host}"
    )]
    SecretHostNotAllowed {
        /// The secret.
        secret: String,
        /// The host rule.
        host: String,
        /// The policy's reason.
        why: String,
    },
    /// The secrets kept for the daemon could not be read.
    #[error("reading the sandbox's secrets: {0}")]
    SecretsUnreadable(String),
}

/// `$BERTH_EGRESS`, else `berth-egress` beside the running program or in
/// its parent directory (where cargo puts it for the CLI and the tests).
pub fn daemon_binary() -> Option<PathBuf> {
    crate::programs::find("BERTH_EGRESS", "berth-egress")
}

/// Makes sure the sandbox's daemon runs: when one answers, tells it
/// `state`'s policy if `tell_policy` (at a start; before each command a
/// status is enough), else starts one with the policy (detached: it
/// outlives this process) and waits for it to answer.
pub async fn ensure_daemon(state: &EgressState, tell_policy: bool) -> Result<(), EgressError> {
    let dir = state.daemon_dir();
    let start_error = |source| EgressError::Start {
        dir: state.dir.display().to_string(),
        source,
    };
    let probe = if tell_policy {
        ControlRequest::SetPolicy {
            policy: state.settings.policy.clone(),
        }
    } else {
        ControlRequest::Status
    };
    match call(&dir.control_socket(), &probe).await {
        Ok(_) => return Ok(()),
        Err(ControlError::Unreachable { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    dir.write_settings(&state.settings.policy, &state.settings.test_resolve)
        .map_err(start_error)?;
    let program = daemon_binary().ok_or(EgressError::NoDaemonBinary)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.log_file())
        .map_err(start_error)?;
    let mut daemon = std::process::Command::new(program);
    daemon
        .arg("serve")
        .arg(dir.root())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(start_error)?)
        .stderr(log);
    // Its own process group: a ^C at the terminal that started it does
    // not stop another sandbox's traffic.
    std::os::unix::process::CommandExt::process_group(&mut daemon, 0);
    let mut child = daemon.spawn().map_err(start_error)?;
    let started = Instant::now();
    let mut exited = None;
    loop {
        match call(&dir.control_socket(), &ControlRequest::Status).await {
            Ok(_) => break,
            Err(ControlError::Unreachable { .. }) if started.elapsed() < DAEMON_START_DEADLINE => {
                if exited.is_none() {
                    exited = child.try_wait().map_err(start_error)?;
                }
                // Exited with success: another daemon holds the lock and
                // will answer; with failure: its log says why.
                if exited.is_some_and(|status| !status.success()) {
                    return Err(not_started(&dir));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(ControlError::Unreachable { .. }) => return Err(not_started(&dir)),
            Err(e) => return Err(e.into()),
        }
    }
    if exited.is_none() {
        // Reaped when it exits, by a thread that waits for nothing else
        // (this process may be a long-lived server).
        std::thread::spawn(move || child.wait());
    }
    tracing::info!(dir = %state.dir.display(), "egress daemon started");
    Ok(())
}

fn not_started(dir: &EgressDir) -> EgressError {
    let log = std::fs::read_to_string(dir.log_file()).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    EgressError::NotStarted {
        dir: dir.root().display().to_string(),
        log: if tail.is_empty() {
            "it wrote nothing".to_string()
        } else {
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        },
    }
}

/// The running daemon's policy and connection log.
pub async fn status(state: &EgressState) -> Result<EgressStatus, EgressError> {
    match call(
        &state.daemon_dir().control_socket(),
        &ControlRequest::Status,
    )
    .await?
    {
        ControlReply::Status(status) => Ok(*status),
        other => Err(ControlError::NoAnswer {
            socket: state.daemon_dir().control_socket().display().to_string(),
            why: format!("expected a status, got {other:?}"),
        }
        .into()),
    }
}

/// Changes a running daemon's policy (from its next connection). A daemon
/// that is not running takes the new policy when it starts.
pub async fn set_policy(state: &EgressState, policy: &EgressPolicy) -> Result<(), EgressError> {
    let dir = state.daemon_dir();
    let request = ControlRequest::SetPolicy {
        policy: policy.clone(),
    };
    match call(&dir.control_socket(), &request).await {
        Ok(_) => Ok(()),
        Err(ControlError::Unreachable { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Stops the daemon and removes its directory (it exits by itself once
/// the directory is gone, if it did not answer).
pub async fn stop_daemon(state: &EgressState) {
    let dir = state.daemon_dir();
    if let Err(e) = call(&dir.control_socket(), &ControlRequest::Shutdown).await {
        tracing::debug!(error = %e, "the egress daemon did not take a shutdown");
    }
    // It saves its log as it exits: wait until it lets go of its lock, so
    // nothing is written into the directory while it is removed (which
    // would leave it, secrets and all, behind).
    let deadline = Instant::now() + DAEMON_STOP_DEADLINE;
    while Instant::now() < deadline && daemon_holds_lock(&dir) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for attempt in 1..=3 {
        match std::fs::remove_dir_all(dir.root()) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if attempt < 3 => {
                tracing::debug!(error = %e, attempt, "removing the egress daemon's directory");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::warn!(dir = %dir.root().display(), error = %e, "removing the egress daemon's directory");
            }
        }
    }
}

/// Whether a daemon holds the lock of `dir` (false when there is none).
fn daemon_holds_lock(dir: &EgressDir) -> bool {
    match std::fs::File::open(dir.lock_file()) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}
