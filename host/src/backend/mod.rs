//! Backends: where a sandbox's workspace lives and its commands run. Each
//! implements the small [`Backend`] trait; the lifecycle (start branches,
//! snapshots, entries) lives once, in [`crate::sandbox`].

pub mod docker;
pub mod exec;
pub mod local;

use std::path::PathBuf;

use tokio::io::AsyncRead;

pub use exec::{ExecRequest, ExecResult, OutputCallback, OutputStream};

use crate::sandbox::state::BackendState;
use crate::workspace::entries::BindMounts;

/// A tar stream of (or for) a workspace.
pub type ArchiveStream = Box<dyn AsyncRead + Send + Unpin>;

/// A backend failure, saying what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend's service cannot be reached (e.g. the Docker daemon).
    #[error("{backend} is unreachable: {message}")]
    Unreachable {
        /// Which backend.
        backend: &'static str,
        /// What failed and what to do.
        message: String,
    },
    /// Options or run arguments that cannot be honoured.
    #[error("{backend}: {message}")]
    Config {
        /// Which backend.
        backend: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An operation failed.
    #[error("{backend}: {operation} failed: {message}")]
    Operation {
        /// Which backend.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
        /// Why.
        message: String,
    },
}

/// What [`Backend::ensure_running`] had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    /// The sandbox existed (it may have been restarted).
    Existing,
    /// The sandbox was created from nothing (first start, or re-created
    /// after it was removed behind our back).
    Created,
}

/// Where a workspace lives and commands run.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Makes the sandbox able to run commands: create, reconnect or restart
    /// as needed. Never destroys anything. Says whether it had to create
    /// the sandbox from nothing, in which case whatever the image holds at
    /// the root is not the workspace.
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError>;

    /// What holds the workspace right now: a container id, a directory's
    /// identity; `None` when nothing does. The lifecycle records it when it
    /// sets a workspace up and refuses to persist from another one.
    async fn instance_id(&self) -> Result<Option<String>, BackendError>;

    /// Suspends the sandbox's processes so that reading the workspace sees
    /// one moment of it. Returns whether anything was suspended; by
    /// default, nothing is (backends that cannot pause).
    async fn freeze(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Resumes what [`Backend::freeze`] suspended. By default, nothing.
    async fn thaw(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Whether the workspace root exists.
    async fn root_exists(&self) -> Result<bool, BackendError>;

    /// Creates an empty workspace root.
    async fn prepare_root(&mut self) -> Result<(), BackendError>;

    /// Runs a shell command in the workspace root.
    async fn exec(&self, request: ExecRequest) -> Result<ExecResult, BackendError>;

    /// Streams a tar of the workspace root (paths relative to `.`),
    /// leaving out `exclude` (relative paths).
    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError>;

    /// Extracts a tar stream (already validated by the archive filter) into
    /// the workspace root.
    async fn write_archive(&self, archive: ArchiveStream) -> Result<(), BackendError>;

    /// Destroys the resources this sandbox owns (and only those).
    async fn destroy(&mut self) -> Result<(), BackendError>;

    /// How bind-mount entries are expressed in entry archives.
    fn bind_mounts(&self) -> BindMounts;

    /// The backend's part of the sandbox state.
    fn state(&self) -> BackendState;
}
