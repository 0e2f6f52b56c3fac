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
mod generations;
mod moving;
mod options;
mod persist;
mod restore;
pub(crate) mod sealing;
mod snapshot_binding;
mod start;
mod state;
mod state_file;

use std::sync::Arc;

pub use crate::backend::{BackendSpec, BackendState};
pub use client::{SandboxClient, SandboxClientBuilder, SandboxSpec};
pub use error::SandboxError;
pub use moving::OrphanCleanup;
pub use options::{Progress, ProgressFn, SandboxOptions, SaveState, StartBranch, StateSink};
pub use snapshot_binding::SnapshotSpec;
pub use state::{Orphan, PluginRef, SandboxState, SnapshotState, WorkspaceLineage};
pub use state_file::{StateFile, StateLock};

use crate::backend::{Backend, ExecRequest, ExecResult};
use crate::snapshot::SandboxSnapshot;
use client::generations_of;

/// Thaws a frozen sandbox when dropped armed (see [`Sandbox::stop`]'s
/// cancel safety).
struct ThawOnDrop(Option<Box<dyn FnOnce() + Send>>);

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
            thaw();
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

    /// Runs a command in the workspace root with the manifest's environment.
    pub async fn exec(&self, mut request: ExecRequest) -> Result<ExecResult, SandboxError> {
        if !self.running {
            return Err(SandboxError::NotStarted);
        }
        let mut env = self.state.manifest.environment.clone();
        env.append(&mut request.env);
        request.env = env;
        Ok(self.backend.exec(request).await?)
    }

    /// Destroys the backend resources this sandbox owns.
    pub async fn shutdown(&mut self) -> Result<(), SandboxError> {
        self.running = false;
        let destroyed = self.backend.destroy().await;
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
