//! A sandbox's tunables ([`SandboxOptions`]) and what the lifecycle
//! reports back ([`StartBranch`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::state::SandboxState;
use crate::workspace::archive::ArchiveLimits;

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
