//! Sandbox state: everything needed to resume a sandbox, as JSON.
//!
//! Unknown fields are ignored and new fields have defaults, so state written
//! by older and newer versions loads. The snapshot's client is never stored:
//! plugins are referenced by manifest path and component digest, and
//! re-injected on resume.

use serde::{Deserialize, Serialize};

use crate::workspace::WorkspaceSpec;

pub use crate::snapshot::SnapshotState;

use crate::backend::BackendState;

/// Where the running workspace came from. A stop may only replace the
/// snapshot with a workspace that descends from it (see
/// [`crate::sandbox::Sandbox::stop`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceLineage {
    /// The backend instance that held the workspace when it was set up:
    /// a Docker container id, or the local directory's device and inode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The snapshot digest the workspace was restored from or last
    /// persisted as; `None` when it was set up from the manifest while no
    /// snapshot existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_digest: Option<String>,
}

/// The whole state of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxState {
    /// Backend and its fields (flattened, with the `type` discriminator).
    #[serde(flatten)]
    pub backend: BackendState,
    /// Session id.
    pub session_id: String,
    /// The workspace manifest.
    pub manifest: WorkspaceSpec,
    /// The snapshot.
    pub snapshot: SnapshotState,
    /// Whether the workspace root was set up (entries applied or restored).
    #[serde(default)]
    pub workspace_root_ready: bool,
    /// Where the running workspace came from (absent in state written by
    /// versions before 0.2, and before the first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<WorkspaceLineage>,
    /// Backend instances the sandbox left behind when it moved while their
    /// engine did not answer; removed by
    /// [`crate::sandbox::SandboxClient::remove_orphans`] once it does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans: Vec<Orphan>,
    /// Background processes started in the running sandbox (see
    /// [`crate::sandbox::Sandbox::detach`]): part of its running state, not
    /// of its snapshot. A start that finds its instance re-created reports
    /// those that did not come back and forgets them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub background: Vec<BackgroundRecord>,
    /// What the sandbox may reach beyond itself, and where its egress
    /// daemon lives; `None`: the backend's own network settings alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressState>,
}

/// A background process the sandbox started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundRecord {
    /// Its id.
    pub id: String,
    /// Its command.
    pub command: String,
}

/// A backend instance (a container on an engine that did not answer) that
/// a sandbox left behind when it moved. It never writes the sandbox's
/// snapshot again: the state no longer points at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// The instance's backend state, as it was when the sandbox moved.
    pub backend: BackendState,
    /// Why it was left (the engine's error).
    pub reason: String,
}

impl SandboxState {
    /// Serialises to pretty JSON. Fails only if a backend's or snapshot's
    /// own fields cannot be written as JSON (a map with non-string keys).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// Parses JSON, ignoring unknown fields.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}
