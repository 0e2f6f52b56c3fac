//! Why a sandbox operation failed: [`SandboxError`].

use crate::backend::BackendError;
use crate::plugin::PluginError;
use crate::store_error::{StorageError, StoreError};
use crate::workspace::archive::ArchiveError;
use crate::workspace::spec::SpecError;

/// Why a sandbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The workspace manifest is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// An archive was refused by the hydrate policy or is unreadable.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The snapshot store failed.
    #[error("snapshot store")]
    Store(#[from] StoreError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The host's defaults file (`$BERTH_HOME/config.toml`) cannot be
    /// used; nothing was created.
    #[error(transparent)]
    HostDefaults(#[from] crate::backend::limits::DefaultsError),
    /// A workspace path was refused: `..`, an absolute path elsewhere, or a
    /// symlink leading out of the workspace. Nothing was read or written.
    #[error("{path}: refused: {reason}")]
    PathRefused {
        /// The path as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// No such file, directory or background process.
    #[error("{what}: not found")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A background process of that id is running.
    #[error("a background process {id:?} is running: kill it first, or choose another name")]
    ProcessRunning {
        /// The id.
        id: String,
    },
    /// The background process has exited: there is nothing to signal.
    #[error("background process {id:?} has exited, so there is nothing to signal; `berth ps` shows its exit code, `berth logs` its output")]
    ProcessExited {
        /// The id.
        id: String,
    },
    /// Berth's helper in the sandbox failed an operation (a file operation,
    /// a background process); the message is its reason.
    #[error("{operation} failed: {message}")]
    Helper {
        /// What was being done.
        operation: String,
        /// The helper's reason.
        message: String,
    },
    /// A plugin could not be loaded.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The restored archive is not the one that was persisted.
    #[error("snapshot {id} failed verification: expected {expected}, got {actual}; nothing was extracted (the stored archive is corrupt or was replaced)")]
    DigestMismatch {
        /// The snapshot.
        id: String,
        /// Digest recorded at persist.
        expected: String,
        /// Digest of what the store returned.
        actual: String,
    },
    /// Persist or restore ran past its deadline.
    #[error("{operation} did not finish within {seconds}s (SandboxOptions::archive_deadline)")]
    Deadline {
        /// Which operation.
        operation: &'static str,
        /// The deadline.
        seconds: u64,
    },
    /// The state names a backend kind this client has no provider for.
    #[error("no backend provider for {kind:?} is registered (this client knows {}); register one with SandboxClientBuilder::backend_provider, or resume with resume_with_backend", known.join(", "))]
    UnknownBackend {
        /// The kind the state names.
        kind: String,
        /// The kinds the client knows.
        known: Vec<String>,
    },
    /// The operation needs a snapshot that keeps generations (a
    /// deduplicated one), and this sandbox's does not.
    #[error("snapshot {id} is a {kind} snapshot, which keeps one archive, not generations (a deduplicated snapshot keeps them)")]
    NoGenerations {
        /// The snapshot.
        id: String,
        /// Its kind.
        kind: String,
    },
    /// The sandbox must be started first.
    #[error("the sandbox is not started; call start first")]
    NotStarted,
    /// The state could not be saved (see [`SandboxOptions::state_sink`]).
    #[error("saving the sandbox state failed")]
    SaveState(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The saved state is inconsistent or unreadable.
    #[error("the sandbox state is unreadable: {problem}")]
    CorruptState {
        /// What is wrong with it.
        problem: String,
    },
    /// The state or a `--snapshot` choice names a snapshot kind this
    /// client has no provider for.
    #[error("no snapshot provider for {kind:?} is registered (this client knows {}); register one with SandboxClientBuilder::snapshot_provider", known.join(", "))]
    UnknownSnapshotKind {
        /// The kind.
        kind: String,
        /// The kinds the client knows.
        known: Vec<String>,
    },
    /// A snapshot kind could not be made, resumed or bound (its options,
    /// its state fields, its plugin or its store).
    #[error(transparent)]
    SnapshotKind(#[from] crate::snapshot::SnapshotKindError),
    /// A snapshot spec that cannot be honoured as written.
    #[error("{0}")]
    SnapshotSpec(String),
    /// A snapshot broke its contract with the lifecycle (it stopped
    /// reading the archive early, or does not record what it stored).
    #[error("snapshot {id} misbehaved: {problem}")]
    SnapshotContract {
        /// The snapshot.
        id: String,
        /// What it did.
        problem: &'static str,
    },
    /// `stop` on a sandbox whose workspace was never set up.
    #[error(
        "the workspace was never set up, so there is nothing to persist; start the sandbox first"
    )]
    NeverSetUp,
    /// An older generation can only be selected once the workspace is
    /// gone (see [`Sandbox::select_generation`]).
    #[error("the workspace is still there; shut the sandbox down first (its unsaved changes would be mixed with the older generation)")]
    WorkspaceStillThere,
    /// The generation asked for is not kept.
    #[error("generation {number} of snapshot {id} is not kept (kept: {kept})")]
    GenerationNotKept {
        /// The snapshot.
        id: String,
        /// The generation asked for.
        number: u64,
        /// The generations kept.
        kept: String,
    },
    /// A task of the lifecycle (the archive filter) failed to finish.
    #[error("the {task} task failed")]
    Task {
        /// Which task.
        task: &'static str,
        /// Why (a panic or a cancellation).
        #[source]
        source: tokio::task::JoinError,
    },
    /// The store sent more bytes than the snapshot holds: reading stopped
    /// there, nothing was extracted.
    #[error("snapshot {id}: the store sent more than the {limit} bytes {why}; reading stopped and nothing was extracted (the store is misbehaving or holds another archive)")]
    SnapshotOverrun {
        /// The snapshot.
        id: String,
        /// The cap that was hit.
        limit: u64,
        /// Where the cap came from.
        why: &'static str,
    },
    /// An archive given to hydrate is larger than the archive limit.
    #[error("the archive is larger than {limit} bytes (ArchiveLimits); nothing was extracted")]
    ArchiveTooLarge {
        /// The cap that was hit.
        limit: u64,
    },
    /// A stop was refused because the workspace did not come from the
    /// snapshot it would replace.
    #[error("refusing to persist over snapshot {id}: {reason}. The snapshot was left as it was; starting the sandbox restores it")]
    LineageMismatch {
        /// The snapshot that was protected.
        id: String,
        /// What happened.
        reason: String,
    },
    /// A backend that places sandboxes on any of several hosts (the
    /// swarm) was given a snapshot only one host can read; nothing was
    /// created.
    #[error("the {backend} backend may start the sandbox on any node, so its snapshot must be kept where every node reads it; a {kind} snapshot is kept on this host only: use a shared store, such as a remote snapshot plugin (--snapshot remote:MANIFEST, the s3-store)")]
    NeedsSharedStore {
        /// The backend's kind.
        backend: String,
        /// The snapshot's kind.
        kind: String,
    },
    /// A sandbox cannot move because its snapshot is kept where only this
    /// host can read it (a local directory) or nowhere (noop); nothing was
    /// changed.
    #[error("cannot move the sandbox to {target}: its {kind} snapshot is kept where only this host can read it; a sandbox that moves needs a shared store, such as a remote snapshot plugin (the s3-store)")]
    NotPortable {
        /// Where it was to move to.
        target: String,
        /// The snapshot's kind.
        kind: String,
    },
    /// A sandbox cannot move to another place (see
    /// [`SandboxClient::move_to`]); nothing was changed.
    #[error("cannot move the sandbox to {target}: {reason}")]
    Move {
        /// Where it was to move to.
        target: String,
        /// Why not, and what to do.
        reason: String,
    },
    /// The sandbox's egress daemon could not be started, reached or
    /// changed; its commands were not started without it.
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressError),
    /// The sandbox was given an egress policy its backend cannot enforce;
    /// nothing was created.
    #[error("the {backend} backend cannot hold a sandbox to an egress policy{}; nothing was created", if why.is_empty() { String::new() } else { format!(": {why}") })]
    EgressNotRouted {
        /// The backend's kind.
        backend: String,
        /// Why, and what to do.
        why: String,
    },
    /// Host-side file work (spooling) failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// `close` failed: the stop error, and the shutdown error if shutdown
    /// failed too (shutdown always runs).
    #[error("close failed: stop: {stop}{}", shutdown.as_ref().map(|s| format!("; shutdown: {s}")).unwrap_or_default())]
    Close {
        /// Why stop failed.
        stop: Box<SandboxError>,
        /// Why shutdown failed, if it did.
        shutdown: Option<Box<SandboxError>>,
    },
    /// [`super::Sandbox::take_over`] found a workspace that is not empty:
    /// only a sandbox that has run nothing is handed to a new owner.
    #[error("the workspace holds {entries} entries already: only a sandbox that has run nothing is taken over (it is not a fresh pool member)")]
    NotFresh {
        /// How many entries the workspace's root holds.
        entries: usize,
    },
}

impl From<StorageError> for SandboxError {
    fn from(e: StorageError) -> Self {
        SandboxError::Store(e.into())
    }
}

impl SandboxError {
    /// Whether the failed operation left nothing behind for the sandbox's
    /// state to remember: a scheduler could not place a new sandbox and
    /// the backend removed what it made ([`BackendError::Placement`]). A
    /// create whose start fails so need not keep the sandbox.
    pub fn left_nothing(&self) -> bool {
        matches!(
            self,
            SandboxError::Backend(crate::backend::BackendError::Placement { .. })
        )
    }
}
