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
    CidrRule, Connection, EgressPolicy, EgressStatus, HostRule, RuleError, TestResolve, Verdict,
};

/// Where the egress point's directory is inside a sandbox.
pub const SANDBOX_EGRESS_DIR: &str = "/run/berth/egress";
/// The egress point's socket inside a sandbox.
pub const SANDBOX_EGRESS_SOCKET: &str = "/run/berth/egress/point.sock";
/// The proxy address a sandbox's commands are given, on its loopback.
pub const SANDBOX_PROXY: &str = "127.0.0.1:3128";
/// How long a new daemon has to answer before its start counts as failed.
const DAEMON_START_DEADLINE: Duration = Duration::from_secs(10);

/// What a new sandbox may reach (`berth create --allow-host …`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressSettings {
    /// The policy: default deny, then what it allows.
    #[serde(default)]
    pub policy: EgressPolicy,
    /// Test names (under `.test` only) and the addresses they resolve to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_resolve: Vec<TestResolve>,
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

    /// The host directory a backend binds at [`SANDBOX_EGRESS_DIR`].
    pub fn route(&self) -> EgressRoute {
        EgressRoute {
            socket_dir: self.daemon_dir().sandbox_dir(),
        }
    }
}

/// What a backend is given to route a sandbox's egress: the host directory
/// to bind at [`SANDBOX_EGRESS_DIR`] (read-only; it holds the point's
/// socket). A backend that cannot route egress refuses a sandbox that has
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
    if let Err(e) = std::fs::remove_dir_all(dir.root()) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.root().display(), error = %e, "removing the egress daemon's directory");
        }
    }
}
