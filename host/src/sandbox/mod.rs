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

mod moving;
pub mod sealing;
pub mod snapshot_binding;
pub mod state;
pub mod state_file;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncRead;

pub use crate::backend::{BackendSpec, BackendState};
pub use moving::OrphanCleanup;
pub use snapshot_binding::SnapshotSpec;
pub use state::{Orphan, SandboxState, SnapshotState, WorkspaceLineage};
pub use state_file::{StateFile, StateLock};

use crate::backend::{
    Backend, BackendError, BackendProvider, BackendSummary, CreateContext, ExecRequest, ExecResult,
    Provisioned, Registry,
};
use crate::capped_writer::CappedWriter;
use crate::plugin::{PluginError, PluginHost};
use crate::snapshot::{DeleteReport, GcReport, Generations, PackCache, SandboxSnapshot};
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};
use crate::workspace::archive::{ArchiveError, ArchiveLimits, ArchiveStats};
use crate::workspace::entries::{self, Selection};
use crate::workspace::spec::SpecError;
use crate::workspace::WorkspaceSpec;

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
    /// The state records a snapshot kind this build does not know.
    #[error("unknown snapshot kind {kind:?} in the sandbox state")]
    UnknownSnapshotKind {
        /// The kind.
        kind: String,
    },
    /// The snapshot was given as an object (a remote client, a custom
    /// snapshot, a plugin loaded from memory), which the state cannot
    /// record: pass the same [`SnapshotSpec`] to resume again.
    #[error("this sandbox's {kind} snapshot was given as an object, not a manifest file, so its state cannot recreate it: pass the same SnapshotSpec to SandboxClient::resume")]
    SnapshotNotRecorded {
        /// The snapshot's kind.
        kind: String,
    },
    /// A snapshot spec that cannot be honoured as written.
    #[error("{0}")]
    SnapshotSpec(String),
    /// A plugin of one world was given where another is needed.
    #[error("{plugin} is a {is}, but this snapshot needs a {needs}")]
    PluginWorld {
        /// The plugin.
        plugin: String,
        /// Its world.
        is: &'static str,
        /// The world needed.
        needs: &'static str,
    },
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
    /// A sandbox cannot move to another place (see
    /// [`SandboxClient::move_to`]); nothing was changed.
    #[error("cannot move the sandbox to {target}: {reason}")]
    Move {
        /// Where it was to move to.
        target: String,
        /// Why not, and what to do.
        reason: String,
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
}

impl From<StorageError> for SandboxError {
    fn from(e: StorageError) -> Self {
        SandboxError::Store(e.into())
    }
}

/// Where the lifecycle saves state at the moments a crash must not lose
/// (before and after persisting). Embedders write it to their state file.
#[derive(Clone)]
pub struct StateSink(pub Arc<SaveState>);

/// The function behind a [`StateSink`].
pub type SaveState =
    dyn Fn(&SandboxState) -> Result<(), Box<dyn std::error::Error + Send + Sync>> + Send + Sync;

impl std::fmt::Debug for StateSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateSink")
    }
}

/// Told how many bytes a persist (`"persist"`) or restore (`"restore"`)
/// has moved so far, e.g. to draw a progress bar.
#[derive(Clone)]
pub struct Progress(pub Arc<ProgressFn>);

/// The function behind a [`Progress`].
pub type ProgressFn = dyn Fn(&'static str, u64) + Send + Sync;

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// Tunables of a sandbox.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Told byte counts during persist and restore. By default, nobody.
    pub progress: Option<Progress>,
    /// Called with the state after start and before and after each
    /// persist. By default, the client's state file
    /// (`<home>/state/<session id>.json`) unless the client was built with
    /// `save_state(false)`.
    pub state_sink: Option<StateSink>,
    /// Deadline for one persist or restore. By default, one hour.
    pub archive_deadline: Duration,
    /// Limits of the hydrate policy, and the cap on archive streams from
    /// outside. By default, [`ArchiveLimits::default`] (64 GiB, 2 M entries).
    pub limits: ArchiveLimits,
    /// Compress snapshots with zstd. By default, off (on resume, on if the
    /// state says the snapshot was compressed).
    pub compression: bool,
    /// Where restores are spooled. By default, the system temp dir.
    pub spool_dir: Option<PathBuf>,
    /// Pause the sandbox's processes while `stop` (or
    /// [`Sandbox::persist_workspace_to`]) reads the workspace, so the
    /// archive is one moment of it rather than a smear of a running agent's
    /// writes (and, on Docker, so files changing under the engine's archive
    /// cannot break it). By default, on (backends that cannot pause ignore
    /// it).
    pub freeze_during_stop: bool,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            progress: None,
            state_sink: None,
            archive_deadline: Duration::from_secs(3600),
            limits: ArchiveLimits::default(),
            compression: false,
            spool_dir: None,
            freeze_during_stop: true,
        }
    }
}

/// Which start branch ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StartBranch {
    /// A: root ready and present; ephemeral entries re-applied.
    Reuse,
    /// B: root ready but gone; set up again (restored if restorable).
    Rebuild {
        /// Whether the snapshot was restored.
        restored: bool,
    },
    /// C: not ready, snapshot restorable; restored then entries applied.
    Restore,
    /// D: fresh from the full manifest.
    Fresh,
    /// Reattached without touching the workspace (see [`Sandbox::attach`]).
    Attached,
}

/// Words for people: `started NAME: {branch}`.
impl std::fmt::Display for StartBranch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StartBranch::Reuse => "workspace still in place; ephemeral entries applied again",
            StartBranch::Rebuild { restored: true } => {
                "workspace was gone; restored from the snapshot"
            }
            StartBranch::Rebuild { restored: false } => {
                "workspace was gone; set up again from the manifest (no snapshot to restore)"
            }
            StartBranch::Restore => "workspace restored from the snapshot",
            StartBranch::Fresh => "new workspace set up from the manifest",
            StartBranch::Attached => "workspace already running",
        })
    }
}

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
    pub fn new(
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
    fn refresh_backend_state(&mut self) -> Result<(), SandboxError> {
        self.state.backend = self.backend.state()?;
        Ok(())
    }

    /// The snapshot.
    pub fn snapshot(&self) -> &Arc<dyn SandboxSnapshot> {
        &self.snapshot
    }

    /// Starts the sandbox, choosing one of four branches. A failure leaves
    /// `workspace_root_ready = false`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe. Dropping the future part-way changes nothing
    /// stored, but can leave a half-restored workspace that this `Sandbox`
    /// (and, if it was ready before, its state) still takes for its own:
    /// call [`Sandbox::shutdown`] before starting again.
    pub async fn start(&mut self) -> Result<StartBranch, SandboxError> {
        let provisioned = self.ensure_running().await?;
        self.start_provisioned(provisioned).await
    }

    /// The one `ensure_running` of a resume.
    async fn ensure_running(&mut self) -> Result<Provisioned, SandboxError> {
        let started = std::time::Instant::now();
        let provisioned = self.backend.ensure_running().await;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            ?provisioned,
            "ensure_running"
        );
        self.refresh_backend_state()?;
        provisioned.map_err(|e| {
            self.running = false;
            e.into()
        })
    }

    /// The start branches, given what the one `ensure_running` of this
    /// resume did.
    async fn start_provisioned(
        &mut self,
        provisioned: Provisioned,
    ) -> Result<StartBranch, SandboxError> {
        match self.start_branches(provisioned).await {
            Ok(branch) => {
                self.state.workspace_root_ready = true;
                self.running = true;
                tracing::info!(session = %self.state.session_id, ?branch, "sandbox started");
                self.save_state()?;
                Ok(branch)
            }
            Err(e) => {
                self.state.workspace_root_ready = false;
                self.running = false;
                Err(e)
            }
        }
    }

    async fn start_branches(
        &mut self,
        provisioned: Provisioned,
    ) -> Result<StartBranch, SandboxError> {
        self.state.manifest.validate()?;
        self.backend.check_workspace(&self.state.manifest)?;
        if self.state.workspace_root_ready && self.workspace_is_ours(provisioned).await? {
            self.apply_entries(Selection::EphemeralOnly).await?;
            return Ok(StartBranch::Reuse);
        }
        let restorable =
            self.snapshot.persistence_enabled() && self.snapshot.is_restorable().await?;
        if !restorable && self.state.snapshot.digest.is_some() {
            tracing::warn!(snapshot = %self.state.snapshot.id,
                "this sandbox persisted a snapshot that its store no longer has; starting from the manifest");
            self.state.snapshot.digest = None;
            self.state.snapshot.size = None;
        }
        self.backend.prepare_root().await?;
        let was_ready = self.state.workspace_root_ready;
        if restorable {
            self.restore().await?;
            self.apply_entries(Selection::EphemeralOnly).await?;
        } else {
            self.apply_entries(Selection::All).await?;
        }
        self.state.lineage = Some(WorkspaceLineage {
            instance: self.backend.instance_id().await?,
            snapshot_digest: if restorable {
                self.state.snapshot.digest.clone()
            } else {
                None
            },
        });
        Ok(match (was_ready, restorable) {
            (true, restored) => StartBranch::Rebuild { restored },
            (false, true) => StartBranch::Restore,
            (false, false) => StartBranch::Fresh,
        })
    }

    /// Whether the backend still holds the workspace this sandbox set up:
    /// not created from nothing by this resume, its root present, and the
    /// same instance the lineage records. State from versions without a
    /// lineage adopts the current instance.
    async fn workspace_is_ours(&mut self, provisioned: Provisioned) -> Result<bool, SandboxError> {
        if provisioned == Provisioned::Created || !self.backend.root_exists().await? {
            return Ok(false);
        }
        let current = self.backend.instance_id().await?;
        match &self.state.lineage {
            Some(lineage) if lineage.instance == current => Ok(true),
            Some(lineage) => {
                tracing::warn!(recorded = ?lineage.instance, found = ?current,
                    "the workspace is held by another instance than the one it was set up in; treating it as gone");
                Ok(false)
            }
            None => {
                self.state.lineage = Some(WorkspaceLineage {
                    instance: current,
                    snapshot_digest: self.state.snapshot.digest.clone(),
                });
                Ok(true)
            }
        }
    }

    /// Reconnects to a started sandbox without re-applying anything, when
    /// its workspace is still the one it set up; otherwise runs the start
    /// branches (restoring from the snapshot when there is one). For
    /// callers (like the CLI) that resume a sandbox for each command.
    pub async fn attach(&mut self) -> Result<StartBranch, SandboxError> {
        let provisioned = self.ensure_running().await?;
        if self.state.workspace_root_ready && self.workspace_is_ours(provisioned).await? {
            self.running = true;
            return Ok(StartBranch::Attached);
        }
        self.start_provisioned(provisioned).await
    }

    async fn apply_entries(&mut self, selection: Selection) -> Result<(), SandboxError> {
        if !entries::selects_any(&self.state.manifest, selection, self.backend.bind_mounts()) {
            return Ok(());
        }
        entries::check_sources(&self.state.manifest, selection)?;
        let archive =
            entries::entries_archive(&self.state.manifest, selection, self.backend.bind_mounts());
        self.backend.write_archive(Box::new(archive)).await?;
        Ok(())
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

    /// A tar stream of the workspace (ephemeral entries and bind mounts left
    /// out), exactly what `stop` persists before compression.
    pub async fn persist_workspace(&self) -> Result<crate::backend::ArchiveStream, SandboxError> {
        let exclude = self.state.manifest.excluded_from_snapshots()?;
        Ok(self.backend.read_archive(&exclude).await?)
    }

    /// Writes [`Sandbox::persist_workspace`]'s tar into `out`, with the
    /// sandbox frozen while it is read (as `stop` does; see
    /// [`SandboxOptions::freeze_during_stop`]). Returns the bytes written.
    pub async fn persist_workspace_to(
        &self,
        out: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    ) -> Result<u64, SandboxError> {
        self.while_frozen(async {
            let mut tar = self.persist_workspace().await?;
            tokio::io::copy(&mut tar, out)
                .await
                .map_err(|e| SandboxError::Io {
                    what: "writing the workspace archive",
                    source: e,
                })
        })
        .await
    }

    /// Runs `read` with the sandbox's processes paused when
    /// [`SandboxOptions::freeze_during_stop`] is on, resuming them after,
    /// whether `read` succeeded or not.
    async fn while_frozen<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, SandboxError>>,
    ) -> Result<T, SandboxError> {
        let frozen = if self.options.freeze_during_stop {
            self.backend.freeze().await?
        } else {
            false
        };
        // Dropped before the thaw below (the caller cancelled): the guard
        // starts one on its own.
        let guard = ThawOnDrop(if frozen {
            self.backend.thaw_detached()
        } else {
            None
        });
        let result = read.await;
        guard.disarm();
        if frozen {
            if let Err(e) = self.backend.thaw().await {
                tracing::warn!(error = %e, "resuming the sandbox's processes after reading its workspace failed; the next command resumes them");
            }
        }
        result
    }

    /// Extracts an archive into the workspace after the whole of it has
    /// passed the hydrate policy (see [`crate::workspace::archive`]).
    pub async fn hydrate_workspace(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<ArchiveStats, SandboxError> {
        let spool = self.spool_file()?;
        let file = tokio::fs::File::create(spool.path())
            .await
            .map_err(|e| SandboxError::Io {
                what: "creating the spool file",
                source: e,
            })?;
        let limit = self.options.limits.max_stream_bytes();
        let mut capped = CappedWriter::new(file, limit);
        let copied = tokio::io::copy(archive, &mut capped).await;
        if capped.overran() {
            return Err(SandboxError::ArchiveTooLarge { limit });
        }
        copied.map_err(|e| SandboxError::Io {
            what: "spooling the archive",
            source: e,
        })?;
        drop(capped);
        // Merged into the live workspace, as `tar -x` would: validated
        // whole first (a staged restore replaces top-level names instead).
        self.extract_spooled(spool.path()).await
    }

    fn spool_file(&self) -> Result<tempfile::NamedTempFile, SandboxError> {
        let made = match &self.options.spool_dir {
            Some(d) => tempfile::Builder::new()
                .prefix("berth-spool-")
                .tempfile_in(d),
            None => tempfile::Builder::new().prefix("berth-spool-").tempfile(),
        };
        made.map_err(|e| SandboxError::Io {
            what: "creating the spool file",
            source: e,
        })
    }

    /// Extracts a spooled archive after the whole of it passed the
    /// hydrate policy.
    async fn extract_spooled(&self, path: &Path) -> Result<ArchiveStats, SandboxError> {
        let limits = self.options.limits;
        let stats = sealing::validate_spooled(path, limits).await?;
        let (clean, verdict) = sealing::stream_spooled(path, limits);
        let written = self.backend.write_archive(Box::new(clean)).await;
        let verdict = verdict.await.map_err(|e| SandboxError::Task {
            task: "archive filter",
            source: e,
        })?;
        match (verdict, written) {
            // The backend stopped reading (its own failure), so the filter
            // could not write: the backend's error is the cause.
            (Err(ArchiveError::Io(e)), Err(w)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                return Err(w.into())
            }
            (Err(v), _) => return Err(v.into()),
            (Ok(_), w) => w?,
        }
        tracing::info!(
            entries = stats.entries,
            bytes = stats.bytes,
            "archive extracted"
        );
        Ok(stats)
    }

    /// Restores the snapshot into the workspace: in one pass through the
    /// backend's staging directory when it has one (nothing spooled; the
    /// staged copy is moved into place only once the digest and every entry
    /// checked out, and removed otherwise), else spooled, verified,
    /// validated and extracted.
    async fn restore(&mut self) -> Result<(), SandboxError> {
        let deadline = self.options.archive_deadline;
        let started = std::time::Instant::now();
        let timed_out = |_| SandboxError::Deadline {
            operation: "restore",
            seconds: deadline.as_secs(),
        };
        if let Some(dir) = self.backend.staging_dir() {
            let staged = tokio::time::timeout(deadline, self.restore_staged(&dir))
                .await
                .unwrap_or_else(|e| Err(timed_out(e)));
            let accepted = staged.and_then(|seal| self.accept_seal(seal));
            let finished = self.backend.finish_staging(&dir, accepted.is_ok()).await;
            tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "restore timings (one pass)"
            );
            return match (accepted, finished) {
                (Ok(()), finished) => finished.map_err(SandboxError::from),
                (Err(e), Err(f)) => {
                    tracing::warn!(error = %f, staging = %dir, "removing the staged archive failed; the next restore replaces it");
                    Err(e)
                }
                (Err(e), Ok(())) => Err(e),
            };
        }
        let spool = self.spool_file()?;
        let fetched = tokio::time::timeout(deadline, async {
            let file =
                tokio::fs::File::create(spool.path())
                    .await
                    .map_err(|e| SandboxError::Io {
                        what: "creating the spool file",
                        source: e,
                    })?;
            self.fetch_into(file).await
        })
        .await
        .map_err(timed_out)??;
        self.accept_seal(fetched)?;
        let fetched_at = started.elapsed();
        tokio::time::timeout(deadline, self.extract_spooled(spool.path()))
            .await
            .map_err(timed_out)??;
        // Where a restore's time goes, for `RUST_LOG=berth=debug`.
        tracing::debug!(
            fetch_and_verify_ms = fetched_at.as_secs_f64() * 1e3,
            extract_ms = (started.elapsed() - fetched_at).as_secs_f64() * 1e3,
            "restore timings"
        );
        Ok(())
    }

    /// Streams the snapshot through the archive filter into the staging
    /// directory `dir` while it is fetched and digested. Returns the seal;
    /// the caller checks it before anything is moved into place.
    async fn restore_staged(&self, dir: &str) -> Result<sealing::Seal, SandboxError> {
        let (into_filter, from_store) = tokio::io::duplex(1 << 20);
        let (clean, verdict) =
            sealing::stream_filtered(from_store, self.options.limits, PathBuf::from(dir));
        let (fetched, written) = tokio::join!(
            self.fetch_into(into_filter),
            self.backend.write_archive(Box::new(clean))
        );
        let verdict = verdict.await.map_err(|e| SandboxError::Task {
            task: "archive filter",
            source: e,
        })?;
        // The first cause wins. A changed archive is reported as such,
        // whatever the filter made of it; a policy refusal stops the filter
        // reading, which breaks the fetch; a failed upload stops it
        // writing; a failed fetch truncates the archive, which the filter
        // then calls corrupt.
        if let Ok(seal) = &fetched {
            self.check_seal(seal)?;
        }
        let secondary =
            |v: &ArchiveError| matches!(v, ArchiveError::Io(_) | ArchiveError::Corrupt(_));
        match (fetched, verdict, written) {
            (_, Err(v), _) if !secondary(&v) => Err(v.into()),
            (_, Err(ArchiveError::Io(e)), Err(w)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                Err(w.into())
            }
            (Err(f), _, _) => Err(f),
            (Ok(_), Err(v), _) => Err(v.into()),
            (Ok(_), Ok(_), Err(w)) => Err(w.into()),
            (Ok(seal), Ok(stats), Ok(())) => {
                tracing::info!(
                    entries = stats.entries,
                    bytes = stats.bytes,
                    "archive extracted (staged)"
                );
                Ok(seal)
            }
        }
    }

    /// Never more than was persisted: the recorded size when the state
    /// knows it for sure, otherwise the archive limit.
    fn restore_cap(&self) -> (u64, &'static str) {
        match (
            &self.state.snapshot.digest,
            self.state.snapshot.size,
            self.state.snapshot.persist_pending,
        ) {
            (Some(_), Some(size), false) => (size, "recorded when it was persisted"),
            _ => (
                self.options.limits.max_stream_bytes(),
                "of the archive limit (no size was recorded)",
            ),
        }
    }

    /// Fetches the stored archive into `sink` under the restore cap,
    /// digesting it, and closes `sink`.
    async fn fetch_into<W: tokio::io::AsyncWrite + Unpin + Send>(
        &self,
        sink: W,
    ) -> Result<sealing::Seal, SandboxError> {
        let id = self.snapshot.id().to_string();
        let (cap, why) = self.restore_cap();
        let capped = CappedWriter::new(sink, cap);
        let overran = capped.flag();
        // A deduplicated generation checks every chunk and the tar's
        // BLAKE3 against its index itself; hashing here too would cost a
        // pass. (Its whole-archive fallback, with no generation yet, is
        // hashed here as any archive.)
        let self_verifying = self.snapshot.own_seal().is_some();
        let writer = if self_verifying {
            sealing::HashingWriter::counting(capped)
        } else {
            sealing::HashingWriter::new(capped, self.state.snapshot.digest.as_deref())
        };
        let mut writer = writer.with_progress(self.options.progress.clone(), "restore");
        let restored = self.snapshot.restore(&mut writer).await;
        if overran.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(SandboxError::SnapshotOverrun {
                id,
                limit: cap,
                why,
            });
        }
        restored?;
        tokio::io::AsyncWriteExt::shutdown(&mut writer)
            .await
            .map_err(|e| SandboxError::Io {
                what: "closing the restored archive",
                source: e,
            })?;
        let seal = writer.seal();
        if self_verifying {
            return self.own_seal(seal);
        }
        Ok(seal)
    }

    /// Whether a fetched archive is the one the state recorded (or the
    /// newer one an interrupted stop committed).
    fn check_seal(&self, fetched: &sealing::Seal) -> Result<(), SandboxError> {
        let id = self.snapshot.id().to_string();
        match &self.state.snapshot.digest {
            Some(expected) if *expected != fetched.digest => {
                if !self.state.snapshot.persist_pending {
                    return Err(SandboxError::DigestMismatch {
                        id,
                        expected: expected.clone(),
                        actual: fetched.digest.clone(),
                    });
                }
                // A stop was interrupted after the store committed its
                // (complete, atomically written) archive but before the new
                // digest was recorded. Accept it; the hydrate policy still
                // checks every entry.
                tracing::warn!(snapshot = %id, recorded = %expected, found = %fetched.digest,
                    "an interrupted stop left a newer archive; restoring it");
            }
            Some(_) => {}
            None => {
                tracing::warn!(snapshot = %id, "no digest recorded for this snapshot; restoring unverified")
            }
        }
        Ok(())
    }

    /// Checks a fetched archive's seal and records it in the state.
    fn accept_seal(&mut self, fetched: sealing::Seal) -> Result<(), SandboxError> {
        self.check_seal(&fetched)?;
        self.state.snapshot.digest = Some(fetched.digest);
        self.state.snapshot.size = Some(fetched.size);
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        Ok(())
    }

    /// Persists the workspace into the snapshot (if persistence is on).
    /// Destroys nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future part-way loses nothing: the previous snapshot
    /// stays restorable (stores commit atomically), the state says a
    /// persist was under way (`persist_pending`), so the next start
    /// accepts whichever archive the store holds, and a sandbox frozen for
    /// the read is thawed (by a detached task when the backend can; the
    /// next command otherwise).
    pub async fn stop(&mut self) -> Result<(), SandboxError> {
        if !self.snapshot.persistence_enabled() {
            self.running = false;
            return Ok(());
        }
        if !self.state.workspace_root_ready {
            return Err(SandboxError::NeverSetUp);
        }
        self.check_lineage().await?;
        // Crash safety: the state says a persist is under way before the
        // store can commit, so a kill between the store's commit and the
        // state write below is recognised on restore (see `restore`).
        self.state.snapshot.persist_pending = true;
        self.save_state()?;
        let deadline = self.options.archive_deadline;
        let seal = self
            .while_frozen(async {
                tokio::time::timeout(deadline, self.persist_into_snapshot())
                    .await
                    .map_err(|_| SandboxError::Deadline {
                        operation: "persist",
                        seconds: deadline.as_secs(),
                    })?
            })
            .await?;
        if let Some(lineage) = self.state.lineage.as_mut() {
            lineage.snapshot_digest = Some(seal.digest.clone());
        }
        self.state.snapshot.digest = Some(seal.digest);
        self.state.snapshot.size = Some(seal.size);
        self.state.snapshot.compression = self.compresses().then(|| "zstd".to_string());
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        self.save_state()?;
        self.running = false;
        Ok(())
    }

    /// Refuses a stop whose workspace did not come from the snapshot it
    /// would replace (see the module docs).
    async fn check_lineage(&self) -> Result<(), SandboxError> {
        let id = self.state.snapshot.id.to_string();
        let Some(lineage) = &self.state.lineage else {
            // State from a version that recorded no lineage: nothing to
            // compare against (attach adopts one).
            return Ok(());
        };
        if let Some(recorded) = &self.state.snapshot.digest {
            if lineage.snapshot_digest.as_ref() != Some(recorded) {
                return Err(SandboxError::LineageMismatch {
                    id,
                    reason: match &lineage.snapshot_digest {
                        None => "the workspace was set up from the manifest, not restored from this snapshot".into(),
                        Some(d) => format!("the workspace descends from {d}, not from the snapshot's {recorded}"),
                    },
                });
            }
        }
        let current = self.backend.instance_id().await?;
        if lineage.instance != current {
            return Err(SandboxError::LineageMismatch {
                id,
                reason: format!(
                    "the workspace was set up in {} but the sandbox is now {} (re-created or replaced behind Berth's back)",
                    lineage.instance.as_deref().unwrap_or("nothing"),
                    current.as_deref().unwrap_or("gone"),
                ),
            });
        }
        Ok(())
    }

    fn save_state(&self) -> Result<(), SandboxError> {
        match &self.options.state_sink {
            Some(sink) => (sink.0)(&self.state()).map_err(SandboxError::SaveState),
            None => Ok(()),
        }
    }

    async fn persist_into_snapshot(&self) -> Result<sealing::Seal, SandboxError> {
        let tar = self.persist_workspace().await?;
        let stored: Box<dyn AsyncRead + Send + Unpin> = if self.compresses() {
            Box::new(async_compression::tokio::bufread::ZstdEncoder::new(
                tokio::io::BufReader::with_capacity(256 * 1024, tar),
            ))
        } else {
            tar
        };
        // A snapshot that digests the archive itself (a deduplicated one,
        // in parallel with chunking) is only counted: hashing it here too
        // would cost a pass.
        let seals_itself = self.snapshot.seals_itself();
        let (sealed, seal) = if seals_itself {
            sealing::HashingReader::counting(stored)
        } else {
            sealing::HashingReader::new(stored)
        };
        let mut sealed = sealed.with_progress(self.options.progress.clone(), "persist");
        self.snapshot.persist(&mut sealed).await?;
        let seal = seal.lock().ok().and_then(|s| s.clone()).ok_or_else(|| {
            SandboxError::SnapshotContract {
                id: self.state.snapshot.id.to_string(),
                problem: "it did not read the archive to its end",
            }
        })?;
        if seals_itself {
            return self.own_seal(seal);
        }
        Ok(seal)
    }

    /// The seal of an archive that passed (counted, not hashed) through a
    /// snapshot that seals itself: the digest is the one the snapshot
    /// verified, whose size must match what passed.
    fn own_seal(&self, mut seal: sealing::Seal) -> Result<sealing::Seal, SandboxError> {
        let own = self
            .snapshot
            .own_seal()
            .filter(|s| s.size == seal.size)
            .ok_or_else(|| SandboxError::SnapshotContract {
                id: self.state.snapshot.id.to_string(),
                problem: "it does not record the archive that passed through it",
            })?;
        seal.digest = own.digest;
        Ok(seal)
    }

    /// Whether `stop` compresses the whole archive (a snapshot that
    /// compresses itself, as a deduplicated one does its chunks, is not
    /// given a compressed one).
    fn compresses(&self) -> bool {
        self.options.compression && !self.snapshot.compresses_itself()
    }

    /// Copies the snapshot's own state fields (a deduplicated snapshot's
    /// generations) into the state.
    fn sync_snapshot_fields(&mut self) {
        self.state
            .snapshot
            .fields
            .extend(self.snapshot.state_fields());
    }

    fn generations(&self) -> Result<&dyn Generations, SandboxError> {
        generations_of(self.snapshot.as_ref(), &self.state)
    }

    /// Makes the next [`start`](Sandbox::start) restore generation
    /// `number` of a deduplicated snapshot (see [`Generations`]) instead of
    /// the newest; the next stop then writes a new generation descending
    /// from it. The workspace must be gone ([`shutdown`](Sandbox::shutdown)
    /// first), since restoring over it would mix two moments.
    pub fn select_generation(&mut self, number: u64) -> Result<(), SandboxError> {
        if self.state.workspace_root_ready {
            return Err(SandboxError::WorkspaceStillThere);
        }
        let generations = self.generations()?;
        let generation =
            generations
                .select(number)
                .ok_or_else(|| SandboxError::GenerationNotKept {
                    id: self.state.snapshot.id.to_string(),
                    number,
                    kept: generations.kept(),
                })?;
        self.state.snapshot.digest = Some(generation.digest);
        self.state.snapshot.size = Some(generation.size);
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        Ok(())
    }

    /// Deletes (or, with `dry_run`, lists) the objects of this sandbox's
    /// deduplicated snapshot that no kept generation needs: dropped
    /// generations, and packs an interrupted stop left behind. Stops of
    /// this sandbox must not run meanwhile (they take `&mut self`; across
    /// processes, hold the sandbox's [`StateLock`]).
    pub async fn collect_garbage(&mut self, dry_run: bool) -> Result<GcReport, SandboxError> {
        let report = self.generations()?.collect_garbage(dry_run).await?;
        if !dry_run {
            self.sync_snapshot_fields();
            self.save_state()?;
        }
        Ok(report)
    }

    /// Deletes what the snapshot stored (see
    /// [`SandboxSnapshot::delete_stored`]), for a sandbox removed for good:
    /// the local archive, the remote object, or a deduplicated snapshot's
    /// generations and the packs only they use — never what a fork still
    /// needs, which the report lists as kept. Call it after
    /// [`shutdown`](Sandbox::shutdown); the sandbox cannot be restored
    /// afterwards.
    pub async fn delete_snapshot(&mut self) -> Result<DeleteReport, SandboxError> {
        let report = self.snapshot.delete_stored().await?;
        if report.unsupported.is_none() {
            self.state.snapshot.digest = None;
            self.state.snapshot.size = None;
            self.state.snapshot.persist_pending = false;
        }
        self.sync_snapshot_fields();
        Ok(report)
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

/// Everything a new sandbox is made from. Every field has a default:
/// `SandboxSpec::new(workspace)` is a local sandbox with local snapshots.
#[derive(Debug)]
#[non_exhaustive]
pub struct SandboxSpec {
    /// The workspace manifest. By default, an empty workspace at
    /// `/workspace`.
    pub workspace: WorkspaceSpec,
    /// Where snapshots go. By default, `<home>/snapshots` on the host.
    pub snapshot: Option<SnapshotSpec>,
    /// The snapshot id. By default, derived from the session id; it stays
    /// the same for the sandbox's life.
    pub snapshot_id: Option<String>,
    /// The backend. By default, the local backend under the home.
    pub backend: BackendSpec,
    /// Tunables. By default, [`SandboxOptions::default`] (state saved
    /// under the home, see [`SandboxClientBuilder::save_state`]).
    pub options: SandboxOptions,
}

impl SandboxSpec {
    /// A sandbox of `workspace`, everything else by default.
    pub fn new(workspace: WorkspaceSpec) -> Self {
        SandboxSpec {
            workspace,
            snapshot: None,
            snapshot_id: None,
            backend: BackendSpec::default(),
            options: SandboxOptions::default(),
        }
    }

    /// Where snapshots go. By default, `<home>/snapshots` on the host.
    pub fn snapshot(mut self, snapshot: SnapshotSpec) -> Self {
        self.snapshot = Some(snapshot);
        self
    }

    /// The snapshot id. By default, `berth-<session id>`.
    pub fn snapshot_id(mut self, id: impl Into<String>) -> Self {
        self.snapshot_id = Some(id.into());
        self
    }

    /// The backend. By default, the local backend under the home.
    pub fn backend(mut self, backend: BackendSpec) -> Self {
        self.backend = backend;
        self
    }

    /// Tunables. By default, [`SandboxOptions::default`].
    pub fn options(mut self, options: SandboxOptions) -> Self {
        self.options = options;
        self
    }
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec::new(WorkspaceSpec::default())
    }
}

/// Builds a [`SandboxClient`].
#[derive(Debug)]
pub struct SandboxClientBuilder {
    home: PathBuf,
    plugins: Option<PluginHost>,
    save_state: bool,
    pack_cache: Option<Option<PackCache>>,
    backends: Registry,
}

impl SandboxClientBuilder {
    /// Resumes (and lists, and forks) sandboxes of `provider`'s kind with
    /// it, replacing the provider the client had for that kind. By
    /// default, the client knows the local backend and, with the `docker`
    /// feature, Docker ([`crate::backend::docker::DockerProvider`]).
    pub fn backend_provider(mut self, provider: impl BackendProvider + 'static) -> Self {
        self.backends.register(Arc::new(provider));
        self
    }

    /// Loads snapshot plugins with `host` (sharing its engine and compile
    /// cache). By default, the client makes one [`PluginHost`] the first
    /// time it needs one and shares it between all its sandboxes.
    pub fn plugin_host(mut self, host: PluginHost) -> Self {
        self.plugins = Some(host);
        self
    }

    /// Whether sandboxes save their state, crash-safely, to
    /// `<home>/state/<session id>.json` at the moments a crash must not
    /// lose (after start, before and after each persist). By default, on;
    /// a [`SandboxOptions::state_sink`] given to a sandbox replaces it.
    pub fn save_state(mut self, save: bool) -> Self {
        self.save_state = save;
        self
    }

    /// Where deduplicated snapshots keep the packs they upload and
    /// download, so a restore on this host skips downloads (`None`: no
    /// cache). By default, `$BERTH_CACHE_DIR` (else `<home>/cache/packs`)
    /// capped at `$BERTH_CACHE_MAX_BYTES` (else 4 GiB; `0` turns it off).
    pub fn pack_cache(mut self, cache: Option<PackCache>) -> Self {
        self.pack_cache = Some(cache);
        self
    }

    /// The client.
    pub fn build(self) -> SandboxClient {
        let plugins = Arc::new(tokio::sync::OnceCell::new());
        if let Some(host) = self.plugins {
            let _ = plugins.set(host);
        }
        let pack_cache = self
            .pack_cache
            .unwrap_or_else(|| PackCache::from_env(&self.home.join("cache").join("packs")));
        SandboxClient {
            home: self.home,
            plugins,
            save_state: self.save_state,
            pack_cache,
            backends: self.backends,
        }
    }
}

/// Creates and resumes sandboxes.
///
/// The library needs a multi-threaded tokio runtime (the default of
/// `#[tokio::main]`; `#[tokio::test(flavor = "multi_thread")]` in tests):
/// archives are produced and consumed on blocking threads that wait on the
/// runtime.
#[derive(Clone, Debug)]
pub struct SandboxClient {
    home: PathBuf,
    plugins: Arc<tokio::sync::OnceCell<PluginHost>>,
    save_state: bool,
    pack_cache: Option<PackCache>,
    backends: Registry,
}

impl SandboxClient {
    /// A client keeping its sandboxes' workspaces, snapshots and state
    /// under `home`, everything else by default.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Self::builder(home).build()
    }

    /// A builder for a client keeping its sandboxes under `home`.
    ///
    /// ```
    /// use berth::{PluginHost, SandboxClient};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let plugins = PluginHost::new()?; // one engine and compile cache, shared
    /// let client = SandboxClient::builder("/var/lib/my-agent/berth")
    ///     .plugin_host(plugins)
    ///     .save_state(false) // the embedder keeps `Sandbox::state()` itself
    ///     .build();
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder(home: impl Into<PathBuf>) -> SandboxClientBuilder {
        SandboxClientBuilder {
            home: home.into(),
            plugins: None,
            save_state: true,
            pack_cache: None,
            backends: Registry::with_defaults(),
        }
    }

    /// The backend kinds this client can resume, sorted.
    pub fn backend_kinds(&self) -> Vec<String> {
        self.backends.kinds()
    }

    /// The provider of backend `kind`, or an error naming the kinds known.
    pub(crate) fn provider(&self, kind: &str) -> Result<&Arc<dyn BackendProvider>, SandboxError> {
        self.backends
            .get(kind)
            .ok_or_else(|| SandboxError::UnknownBackend {
                kind: kind.to_string(),
                known: self.backends.kinds(),
            })
    }

    /// What a listing shows of a sandbox's backend (its instance and
    /// where it runs), from its state alone.
    pub fn backend_summary(&self, state: &BackendState) -> Result<BackendSummary, SandboxError> {
        Ok(self.provider(&state.kind)?.summary(state))
    }

    /// Options for a new sandbox set up like the one whose backend state
    /// is `state` (as a fork is): same kind and settings, its own instance.
    pub fn backend_like(&self, state: &BackendState) -> Result<BackendSpec, SandboxError> {
        Ok(self.provider(&state.kind)?.options_like(state)?)
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The plugin host shared by this client's sandboxes (made on first
    /// use).
    pub async fn plugin_host(&self) -> Result<&PluginHost, SandboxError> {
        Ok(self
            .plugins
            .get_or_try_init(|| async { PluginHost::new() })
            .await?)
    }

    /// Where a sandbox's state is saved by default.
    pub fn state_path(&self, session_id: &str) -> PathBuf {
        self.home.join("state").join(format!("{session_id}.json"))
    }

    /// Options with the default state file filled in, unless the caller
    /// gave a sink or turned saving off.
    fn with_state_file(&self, mut options: SandboxOptions, session_id: &str) -> SandboxOptions {
        if self.save_state && options.state_sink.is_none() {
            let file = StateFile::new(self.state_path(session_id));
            options.state_sink = Some(StateSink(Arc::new(move |state: &SandboxState| {
                let json = state.to_json()?;
                file.write(&json)
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            })));
        }
        options
    }

    /// Creates a sandbox (not yet started) from `spec`.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox, SandboxError> {
        self.create_from(spec, None).await
    }

    /// A new sandbox that starts from generation `generation` (by default,
    /// `None`, the newest) of the sandbox whose state is `source`: its
    /// first start restores that workspace, and its stops store only what
    /// differs from it, sharing `source`'s chunks. `source` needs a
    /// deduplicated snapshot with at least one generation; the fork's
    /// state records which one it started from (its record's `base`).
    /// That generation is pinned in the store, so
    /// `source`'s garbage collection keeps it. The fork gets the same
    /// workspace manifest and snapshot store (bound from `source`, or from
    /// `snapshot` if given, as in [`SandboxClient::resume`]), a new
    /// snapshot id, and runs on `backend` with `options`. Hold `source`'s
    /// lock (across processes, its [`StateLock`]) while forking.
    pub async fn fork(
        &self,
        source: &SandboxState,
        generation: Option<u64>,
        snapshot: Option<SnapshotSpec>,
        backend: BackendSpec,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let (bound, _, store) = self
            .bind_existing(source, snapshot, options.spool_dir.as_deref())
            .await?;
        let base = generations_of(bound.as_ref(), source)?
            .fork_base(generation)
            .await?;
        let keep = base.keep;
        let store = match store {
            SnapshotSpec::Dedup { store, .. } => *store,
            SnapshotSpec::Remote { plugin } => SnapshotSpec::Remote { plugin },
            _ => SnapshotSpec::RemoteClient(base.store),
        };
        let previous = SnapshotState {
            kind: source.snapshot.kind.clone(),
            id: source.snapshot.id.clone(),
            base_dir: None,
            plugin: source.snapshot.plugin.clone(),
            digest: Some(base.seal.digest),
            size: Some(base.seal.size),
            compression: None,
            persist_pending: false,
            fields: base.fields,
        };
        let spec = SandboxSpec::new(source.manifest.clone())
            .snapshot(store.deduplicated(keep))
            .backend(backend)
            .options(options);
        self.create_from(spec, Some(&previous)).await
    }

    /// Collects the garbage of the deduplicated snapshot of the sandbox
    /// whose state is `state` (see [`Sandbox::collect_garbage`]) without
    /// reaching its backend; returns what was (or, with `dry_run`, would
    /// be) deleted and the state to save. Hold the sandbox's lock.
    pub async fn collect_garbage(
        &self,
        state: &SandboxState,
        snapshot: Option<SnapshotSpec>,
        dry_run: bool,
    ) -> Result<(GcReport, SandboxState), SandboxError> {
        let (bound, _, _) = self.bind_existing(state, snapshot, None).await?;
        let report = generations_of(bound.as_ref(), state)?
            .collect_garbage(dry_run)
            .await?;
        let mut state = state.clone();
        state.snapshot.fields.extend(bound.state_fields());
        Ok((report, state))
    }

    /// Collects what an earlier removal left of a deduplicated snapshot
    /// (`snapshot`, as [`Sandbox::delete_snapshot`] left it: only the
    /// generations forks started from): deletes every generation whose
    /// index is not in `bases` — the fork bases of the sandboxes still
    /// known — with the packs of this snapshot no base references. Returns
    /// what was (or, with `dry_run`, would be) deleted and the snapshot
    /// state that remains.
    pub async fn collect_leftovers(
        &self,
        snapshot: &SnapshotState,
        bases: &std::collections::BTreeSet<String>,
        dry_run: bool,
    ) -> Result<(DeleteReport, SnapshotState), SandboxError> {
        let spec = SnapshotSpec::from_state(snapshot)?;
        let (bound, _) = snapshot_binding::bind(
            &spec,
            snapshot.id.clone(),
            self.plugin_host().await?,
            Some(snapshot),
            self.pack_cache.as_ref(),
            None,
        )
        .await?;
        let generations = bound
            .generations()
            .ok_or_else(|| SandboxError::NoGenerations {
                id: snapshot.id.to_string(),
                kind: bound.kind().to_string(),
            })?;
        let report = generations.delete_leftovers(bases, dry_run).await?;
        let mut remaining = snapshot.clone();
        remaining.fields.extend(bound.state_fields());
        Ok((report, remaining))
    }

    /// The snapshot of an existing sandbox, bound from `snapshot` or its
    /// state, with the spec it was bound from.
    async fn bind_existing(
        &self,
        state: &SandboxState,
        snapshot: Option<SnapshotSpec>,
        spool_dir: Option<&Path>,
    ) -> Result<(Arc<dyn SandboxSnapshot>, SnapshotState, SnapshotSpec), SandboxError> {
        let spec = match snapshot {
            Some(s) => s,
            None => SnapshotSpec::from_state(&state.snapshot)?,
        };
        let (bound, record) = snapshot_binding::bind(
            &spec,
            state.snapshot.id.clone(),
            self.plugin_host().await?,
            Some(&state.snapshot),
            self.pack_cache.as_ref(),
            spool_dir,
        )
        .await?;
        Ok((bound, record, spec))
    }

    /// [`SandboxClient::create`], with a snapshot that continues
    /// `previous` (a fork's base).
    async fn create_from(
        &self,
        spec: SandboxSpec,
        previous: Option<&SnapshotState>,
    ) -> Result<Sandbox, SandboxError> {
        let SandboxSpec {
            workspace,
            snapshot,
            snapshot_id,
            backend,
            options,
        } = spec;
        workspace.validate()?;
        let session_id = new_session_id();
        let id = match snapshot_id {
            Some(id) => {
                SnapshotId::parse(&id).map_err(|e| StorageError::InvalidId(e.to_string()))?
            }
            None => SnapshotId::parse(&format!("berth-{session_id}"))
                .map_err(|e| StorageError::InvalidId(e.to_string()))?,
        };
        let snapshot = snapshot.unwrap_or_else(|| SnapshotSpec::Local {
            base_dir: self.home.join("snapshots"),
        });
        let (snap, snap_state) = snapshot_binding::bind(
            &snapshot,
            id,
            self.plugin_host().await?,
            previous,
            self.pack_cache.as_ref(),
            options.spool_dir.as_deref(),
        )
        .await?;
        let bind_mounts = workspace.bind_mounts()?;
        let backend = backend
            .build(&CreateContext {
                session_id: &session_id,
                home: &self.home,
                workspace: &workspace,
                bind_mounts: &bind_mounts,
            })
            .await?;
        backend.check_workspace(&workspace)?;
        entries::check_sources(&workspace, Selection::All)?;
        let options = self.with_state_file(options, &session_id);
        let state = SandboxState {
            backend: backend.state()?,
            session_id,
            manifest: workspace,
            snapshot: snap_state,
            workspace_root_ready: false,
            lineage: None,
            orphans: Vec::new(),
        };
        Ok(Sandbox::new(state, backend, snap, options))
    }

    /// Resumes a sandbox from saved state. The snapshot is bound again from
    /// `snapshot` if given, else from what the state records (a manifest
    /// path); the backend by the provider of the state's `type` (see
    /// [`SandboxClientBuilder::backend_provider`]).
    /// Snapshots are compressed if the state says they were.
    pub async fn resume(
        &self,
        state: SandboxState,
        snapshot: Option<SnapshotSpec>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let backend = self
            .provider(&state.backend.kind)?
            .resume(&state.backend, &state.session_id)
            .await?;
        self.resume_with_backend(state, snapshot, backend, options)
            .await
    }

    /// Resumes a sandbox onto `backend`, constructed by the caller from
    /// the state's backend part ([`BackendState::decode`]): how sandboxes
    /// on a backend of the embedder's own are resumed.
    pub async fn resume_with_backend(
        &self,
        state: SandboxState,
        snapshot: Option<SnapshotSpec>,
        backend: Box<dyn Backend>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let (snap, mut snap_state, _) = self
            .bind_existing(&state, snapshot, options.spool_dir.as_deref())
            .await?;
        snap_state.digest = state.snapshot.digest.clone();
        let mut options = self.with_state_file(options, &state.session_id);
        options.compression |= state.snapshot.compression.is_some();
        let mut state = state;
        state.snapshot = snap_state;
        Ok(Sandbox::new(state, backend, snap, options))
    }
}

/// `snapshot`'s generations, or why it has none.
fn generations_of<'a>(
    snapshot: &'a dyn SandboxSnapshot,
    state: &SandboxState,
) -> Result<&'a dyn Generations, SandboxError> {
    snapshot
        .generations()
        .ok_or_else(|| SandboxError::NoGenerations {
            id: state.snapshot.id.to_string(),
            kind: snapshot.kind().to_string(),
        })
}

fn new_session_id() -> String {
    format!("{:016x}", crate::random_id::random_u64())
}
