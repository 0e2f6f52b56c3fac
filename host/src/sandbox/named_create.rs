//! Creating a named sandbox, once for every front end: the CLI's `berth
//! create`, the server's `POST /v1/sandboxes`. The request names the
//! backend by its settings ([`BackendSettings`]), so no front end knows
//! a backend kind.

use std::time::Duration;

use super::{
    NamedSandbox, NamedSandboxError, NamedSandboxes, Sandbox, SandboxError, SandboxOptions,
    SandboxSpec, SnapshotChoiceError,
};
use crate::backend::BackendSettings;
use crate::workspace::WorkspaceSpec;

/// What to create: every field but the name and the backend has a
/// default (see [`CreateRequest::new`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CreateRequest {
    /// The sandbox's name.
    pub name: String,
    /// The backend: a kind and its settings.
    pub backend: BackendSettings,
    /// The workspace manifest, host paths resolved. By default, empty.
    pub workspace: WorkspaceSpec,
    /// The snapshot store as `berth create --snapshot` takes it: `noop`,
    /// `local`, `local:DIR`, `plugin:MANIFEST`, `remote:MANIFEST`. By
    /// default, `local`.
    pub snapshot: String,
    /// The snapshot id. By default, derived from the session id.
    pub snapshot_id: Option<String>,
    /// Whether snapshots are zstd-compressed. By default, no.
    pub compression: bool,
    /// Whether the container is paused while a stop reads the workspace.
    /// By default, yes.
    pub freeze: bool,
    /// Keep this many deduplicated generations (a `remote:` store only;
    /// [`default_keep`] is what to keep when the creator names no number).
    /// By default, whole archives, not generations.
    pub dedup_keep: Option<u32>,
    /// With `dedup_keep`: also keep every generation written within this
    /// long of the newest. By default, none.
    pub keep_within: Option<Duration>,
    /// With `dedup_keep`: write a generation after every command. By
    /// default, no.
    pub checkpoint_each_exec: bool,
    /// Start it after creating. By default, yes.
    pub start: bool,
    /// Hold it to an egress policy (see [`crate::egress`]). By default,
    /// none: the backend's network settings alone.
    pub egress: Option<crate::egress::EgressSettings>,
}

/// The generations a checkpointing sandbox (`checkpoint_each_exec`) keeps
/// when its creator names no number: its last 50 steps. A count rather than
/// a time: an agent's step is a generation, and "undo the last few steps"
/// is what history is for; a busy day can be thousands of steps (each an
/// index in the store) and an idle one none, so a day would keep either
/// too much or nothing to go back to.
pub const CHECKPOINT_KEEP: u32 = 50;

/// The generations a deduplicated sandbox keeps when its creator names no
/// number: [`CHECKPOINT_KEEP`] for one that checkpoints every command (a
/// history to rewind through), else 1 (each stop replaces the last; a
/// fork or a `--keep N` keeps more).
pub fn default_keep(checkpoint_each_exec: bool) -> u32 {
    if checkpoint_each_exec {
        CHECKPOINT_KEEP
    } else {
        1
    }
}

impl CreateRequest {
    /// A sandbox `name` on `backend`, with every other default.
    pub fn new(name: impl Into<String>, backend: BackendSettings) -> Self {
        CreateRequest {
            name: name.into(),
            backend,
            workspace: WorkspaceSpec::default(),
            snapshot: "local".into(),
            snapshot_id: None,
            compression: false,
            freeze: true,
            dedup_keep: None,
            keep_within: None,
            checkpoint_each_exec: false,
            start: true,
            egress: None,
        }
    }
}

/// Why a create did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// The name: invalid, taken, or its lock or state file failed.
    #[error(transparent)]
    Named(#[from] NamedSandboxError),
    /// The snapshot choice does not parse.
    #[error(transparent)]
    Snapshot(#[from] SnapshotChoiceError),
    /// Deduplicated generations asked of a store that is not remote.
    #[error(
        "deduplicated generations need a remote store (such as remote:MANIFEST), not {snapshot:?}"
    )]
    DedupNeedsRemote {
        /// The snapshot choice given.
        snapshot: String,
    },
    /// The backend's settings or the create failed; nothing was made.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The sandbox did not start; what the start made was removed and the
    /// name is free, so the same create can run again.
    #[error("{name} was not created: it did not start, and what it had made was removed")]
    NotStarted {
        /// The name.
        name: String,
        /// Why it did not start.
        #[source]
        source: SandboxError,
    },
    /// The sandbox did not start, and removing what it made failed too:
    /// it is kept under its name for `rm` to finish.
    #[error("{name} did not start, and removing what it had made failed too ({cleanup}); it is kept: remove it (`berth rm {name}`)")]
    NotStartedKept {
        /// The name.
        name: String,
        /// Why it did not start.
        #[source]
        source: SandboxError,
        /// Why removing failed.
        cleanup: SandboxError,
    },
}

impl NamedSandboxes {
    /// Creates (and by default starts) the named sandbox `request`
    /// describes, with `adjust` applied to its options (a progress bar),
    /// holding its lock throughout. A create that fails leaves no name
    /// behind, except as [`CreateError::NotStartedKept`] says.
    pub async fn create(
        &self,
        request: CreateRequest,
        adjust: impl FnOnce(&mut SandboxOptions),
    ) -> Result<(NamedSandbox, Sandbox), CreateError> {
        let name = request.name.clone();
        let _lock = self.lock(&name).await?;
        if self.read_text(&name)?.is_some() {
            return Err(NamedSandboxError::Exists { name }.into());
        }
        let mut snapshot = self.client().snapshot_from_choice(&request.snapshot)?;
        if let Some(keep) = request.dedup_keep {
            if snapshot.is_remote_store() != Some(true) {
                return Err(CreateError::DedupNeedsRemote {
                    snapshot: request.snapshot,
                });
            }
            snapshot = snapshot.deduplicated(keep);
        }
        let backend = self.client().backend_from_settings(&request.backend)?;
        let mut options = self.options(
            &name,
            request.compression,
            request.freeze,
            request.checkpoint_each_exec,
        );
        adjust(&mut options);
        let mut spec = SandboxSpec::new(request.workspace)
            .snapshot(snapshot)
            .backend(backend)
            .options(options);
        if let Some(id) = request.snapshot_id {
            spec = spec.snapshot_id(id);
        }
        if let Some(egress) = request.egress {
            spec = spec.egress(egress);
        }
        let mut sandbox = self.client().create(spec).await?;
        if let Some(window) = request.keep_within {
            sandbox.keep_generations_within(Some(window))?;
        }
        let started = match request.start {
            true => sandbox.start().await.map(|_| ()),
            false => Ok(()),
        };
        let mut record = NamedSandbox {
            name: name.clone(),
            compression: request.compression,
            freeze: request.freeze,
            checkpoint_each_exec: request.checkpoint_each_exec,
            state: sandbox.state(),
        };
        if let Err(source) = started {
            return Err(
                match self
                    .settle_failed_create(&mut record, &mut sandbox, &source)
                    .await
                {
                    Ok(()) => CreateError::NotStarted { name, source },
                    Err(cleanup) => CreateError::NotStartedKept {
                        name,
                        source,
                        cleanup,
                    },
                },
            );
        }
        record.state = sandbox.state();
        self.save(&record)?;
        Ok((record, sandbox))
    }
}
