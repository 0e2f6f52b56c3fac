//! The lifecycle engine: one implementation of create, resume, start, exec,
//! stop, shutdown and close, shared by every backend.
//!
//! Stop, in one line: lineage check → freeze → backend tar stream → (zstd)
//! → BLAKE3 seal → snapshot `persist` → store → thaw. Restore: snapshot
//! `restore` → spool file (capped at the recorded size, digest verified) →
//! hydrate policy over the whole archive → clean copy → backend archive
//! upload.
//!
//! # Nothing lost
//!
//! A stop never replaces a snapshot with a workspace that did not come from
//! it. The state records the workspace's [`WorkspaceLineage`]: the backend
//! instance that holds it (a container id, a directory's identity) and the
//! snapshot it was restored from or last persisted as. Each resume calls
//! [`Backend::ensure_running`] once and carries its answer through the start
//! branches, so a sandbox the backend had to create from nothing is always
//! restored; and [`Sandbox::stop`] refuses to persist a workspace whose
//! lineage does not match the snapshot it would replace.

mod client;
mod error;
mod files;
mod generations;
mod helper;
mod moving;
mod named;
mod named_create;
mod named_fork;
mod options;
mod orphan_files;
mod persist;
mod pool;
mod processes;
mod removal;
mod restore;
pub(crate) mod sealing;
mod snapshot_binding;
mod start;
mod state;
mod state_file;

use std::sync::Arc;

pub use crate::backend::{BackendSpec, BackendState};
pub use crate::snapshot::{OrphanFile, OrphanFileReason};
pub use client::{SandboxClient, SandboxClientBuilder, SandboxSpec};
pub use error::SandboxError;
pub use files::{FileInfo, FileKind, FileReader, Files};
pub use moving::OrphanCleanup;
pub use named::{NamedSandbox, NamedSandboxError, NamedSandboxes};
pub use named_create::{default_keep, CreateError, CreateRequest, CHECKPOINT_KEEP};
pub use named_fork::{fork_names, ForkError, MAX_FORKS};
pub use options::{Progress, ProgressFn, SandboxOptions, SaveState, StartBranch, StateSink};
pub use pool::{
    Claim, ClaimRequest, ClaimSource, HandOverError, PoolError, PoolSpec, PoolStatus, Pools,
    MAX_POOL_SIZE,
};
pub use processes::{BackgroundProcess, DetachRequest, ProcessState, Processes, DEFAULT_LOG_RING};
pub use removal::{Removal, RemoveError, RemoveOptions};
pub use snapshot_binding::{SnapshotChoiceError, SnapshotSpec};
pub use state::{BackgroundRecord, Orphan, SandboxState, SnapshotState, WorkspaceLineage};

/// What [`Sandbox::shell`] runs when given no command.
pub const LOGIN_SHELL: &str = "exec sh -i";

/// How long [`Sandbox::shell`] lets a shell run: a year, in effect none.
pub const SHELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

pub use state_file::{StateFile, StateFileError, StateLock};

use crate::backend::{Backend, ExecProcess, ExecRequest, ExecResult, PtySize};
use crate::snapshot::SandboxSnapshot;
use client::generations_of;

/// Thaws a frozen sandbox when dropped armed (see [`Sandbox::stop`]'s
/// cancel safety).
struct ThawOnDrop(Option<futures::future::BoxFuture<'static, ()>>);

impl ThawOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        if let Some(thaw) = self.0.take() {
            tracing::warn!(
                "a stop was cancelled while the sandbox was frozen; resuming its processes"
            );
            crate::cleanup::spawn_cleanup("resuming a sandbox frozen for a cancelled stop", thaw);
        }
    }
}

/// A sandbox: state + backend + snapshot, driven by one lifecycle.
pub struct Sandbox {
    state: SandboxState,
    backend: Box<dyn Backend>,
    snapshot: Arc<dyn SandboxSnapshot>,
    options: SandboxOptions,
    running: bool,
    /// What the last start found gone of the recorded background processes.
    lost_background: Vec<state::BackgroundRecord>,
}

impl Sandbox {
    /// Assembles a sandbox (used by [`SandboxClient`]).
    pub(crate) fn new(
        state: SandboxState,
        backend: Box<dyn Backend>,
        snapshot: Arc<dyn SandboxSnapshot>,
        options: SandboxOptions,
    ) -> Self {
        Sandbox {
            state,
            backend,
            snapshot,
            options,
            running: false,
            lost_background: Vec::new(),
        }
    }

    /// Whether `start` (or `attach`) succeeded and no stop/shutdown since.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// The current state, to save and resume from.
    pub fn state(&self) -> SandboxState {
        self.state.clone()
    }

    /// Takes the backend's part of the state after it may have changed
    /// (a container created, re-created or removed).
    pub(super) fn refresh_backend_state(&mut self) -> Result<(), SandboxError> {
        self.state.backend = self.backend.state()?;
        Ok(())
    }

    /// The snapshot.
    pub fn snapshot(&self) -> &Arc<dyn SandboxSnapshot> {
        &self.snapshot
    }

    /// Runs a command in the workspace root with the manifest's
    /// environment, and collects its output: each stream kept head and
    /// tail within the request's caps (the last
    /// [`ExecRequest::tail_kept`] bytes always among them), what the
    /// command printed before a timeout kept too. Built on
    /// [`Sandbox::exec_stream`].
    pub async fn exec(&self, request: ExecRequest) -> Result<ExecResult, SandboxError> {
        let (out, err, tail) = (request.stdout_cap, request.stderr_cap, request.tail_kept);
        Ok(self
            .exec_stream(request)
            .await?
            .collect(out, err, tail)
            .await?)
    }

    /// Starts a command in the workspace root with the manifest's
    /// environment and returns it running: stdout and stderr as events,
    /// as they are produced, uncapped (the reader keeps what it wants);
    /// stdin when the request asks for it.
    ///
    /// ```no_run
    /// # async fn f(sandbox: &berth::Sandbox) -> Result<(), Box<dyn std::error::Error>> {
    /// use berth::backend::ExecEvent;
    /// use std::time::Duration;
    /// let mut make = sandbox
    ///     .exec_stream(berth::ExecRequest::new("make test", Duration::from_secs(600)))
    ///     .await?;
    /// while let Some(event) = make.next_event().await {
    ///     match event? {
    ///         ExecEvent::Stdout(bytes) | ExecEvent::Stderr(bytes) => print!("{}", String::from_utf8_lossy(&bytes)),
    ///         ExecEvent::Exit(exit) => println!("exit {}", exit.exit_code),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned process before its exit stops the command in
    /// the sandbox, with everything it started.
    pub async fn exec_stream(&self, mut request: ExecRequest) -> Result<ExecProcess, SandboxError> {
        if !self.running {
            return Err(SandboxError::NotStarted);
        }
        // An argv that cannot run is refused before anything starts.
        request.words()?;
        self.ensure_egress().await?;
        let mut env = self.command_environment();
        env.append(&mut request.env);
        request.env = env;
        Ok(self.backend.spawn(request).await?)
    }

    /// Before a command: the egress daemon of a sandbox with a policy
    /// answers, or is started again (it died with a reboot, or was
    /// killed), so a long-open sandbox (a server's) keeps its route.
    pub(super) async fn ensure_egress(&self) -> Result<(), SandboxError> {
        if let Some(egress) = &self.state.egress {
            crate::egress::ensure_daemon(egress, false).await?;
        }
        Ok(())
    }

    /// The environment every command starts from: the manifest's, and the
    /// proxy variables of a sandbox with an egress policy (which the
    /// manifest cannot override: they are the only way out).
    pub(super) fn command_environment(&self) -> std::collections::BTreeMap<String, String> {
        let mut env = self.state.manifest.environment.clone();
        if let Some(egress) = &self.state.egress {
            env.extend(egress.environment());
        }
        env
    }

    /// The sandbox's egress policy and connection log, from its egress
    /// daemon; `None` when it has no policy.
    pub async fn egress_status(&self) -> Result<Option<crate::egress::EgressStatus>, SandboxError> {
        match &self.state.egress {
            None => Ok(None),
            Some(egress) => Ok(Some(crate::egress::status(egress).await?)),
        }
    }

    /// Replaces the sandbox's egress policy, kept in its state and, while
    /// it runs, in force from its next connection. A sandbox created
    /// without a policy cannot be given one (its backend gave it the
    /// network its settings said): create one with a policy instead.
    pub async fn set_egress_policy(
        &mut self,
        policy: crate::egress::EgressPolicy,
    ) -> Result<(), SandboxError> {
        let Some(egress) = &mut self.state.egress else {
            return Err(SandboxError::EgressNotRouted {
                backend: self.state.backend.kind.clone(),
                why: "this sandbox was created without an egress policy, and its network is \
                      its backend's; create a sandbox with --allow-host (or an empty policy) \
                      to hold it to one"
                    .to_string(),
            });
        };
        egress.settings.policy = policy;
        crate::egress::set_policy(egress, &egress.settings.policy).await?;
        self.save_state()?;
        Ok(())
    }

    /// The sandbox's ports published on this host (see
    /// [`Backend::published_ports`]).
    pub async fn published_ports(
        &self,
    ) -> Result<Vec<crate::backend::PublishedPort>, SandboxError> {
        Ok(self.backend.published_ports().await?)
    }

    /// Starts an interactive shell ([`LOGIN_SHELL`], or `command`) on a new terminal of
    /// `size`: write keystrokes with [`ExecProcess::write_stdin`], read the
    /// terminal's output as stdout events, and resize with
    /// [`ExecProcess::resize`]. Its exit code is the shell's. It runs until
    /// it exits (no timeout).
    pub async fn shell(
        &self,
        command: Option<&str>,
        size: PtySize,
    ) -> Result<ExecProcess, SandboxError> {
        let command = command.unwrap_or(LOGIN_SHELL);
        let request = ExecRequest::new(command, SHELL_TIMEOUT).on_terminal(size);
        self.exec_stream(request).await
    }

    /// Destroys the backend resources this sandbox owns.
    pub async fn shutdown(&mut self) -> Result<(), SandboxError> {
        // What a checkpoint left for later is the store's, not the
        // instance's: done before the instance goes.
        self.settle().await;
        self.running = false;
        // Background processes end with the instance.
        self.state.background.clear();
        let destroyed = self.backend.destroy().await;
        if destroyed.is_ok() {
            if let Some(egress) = &self.state.egress {
                crate::egress::stop_daemon(egress).await;
            }
        }
        self.refresh_backend_state()?;
        destroyed?;
        self.state.workspace_root_ready = false;
        Ok(())
    }

    /// Stop, then shutdown. Shutdown runs even if stop fails; the stop
    /// error is reported, not swallowed.
    pub async fn close(&mut self) -> Result<(), SandboxError> {
        let stopped = self.stop().await;
        let shut = self.shutdown().await;
        match (stopped, shut) {
            (Ok(()), Ok(())) => Ok(()),
            (Ok(()), Err(e)) => Err(e),
            (Err(stop), shut) => Err(SandboxError::Close {
                stop: Box::new(stop),
                shutdown: shut.err().map(Box::new),
            }),
        }
    }
}
