//! The snapshot part of a sandbox's state: the fields every kind has
//! (its kind, id, the stored archive's digest and size), and the kind's
//! own, which only its provider reads.

use serde::{Deserialize, Serialize};

use crate::snapshot_id::SnapshotId;

/// The snapshot part of the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// `noop`, `local`, `remote`, `dedup`, `plugin` or `custom`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The stable snapshot id.
    pub id: SnapshotId,
    /// `blake3:<hex>` (or, from older versions, `sha256:<hex>`) of the
    /// stored archive, verified on restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Size in bytes of the stored archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// `zstd` when the stored archive is compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// A stop began persisting and has not recorded its outcome: the store
    /// may hold that (complete) newer archive, whose digest we never saw.
    /// Set before persisting, cleared after; see `Sandbox::stop`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persist_pending: bool,
    /// The kind's own fields, beside the common ones: a local snapshot's
    /// `base_dir`, a plugin's `plugin` (its manifest and component
    /// digest), a deduplicated snapshot's generations under `dedup` (see
    /// [`SnapshotProvider::resume`](super::SnapshotProvider::resume) and
    /// [`SandboxSnapshot::state_fields`](super::SandboxSnapshot::state_fields)).
    /// Older versions wrote `base_dir` and `plugin` as fields of their own;
    /// the JSON is the same, so their states load unchanged.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}
