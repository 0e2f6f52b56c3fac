//! Sandbox snapshots: where one sandbox's workspace archive is persisted and
//! restored from — the host-side face of the WIT `snapshot` interface.
//!
//! Native kinds: [`NoopSnapshot`] (persistence off), [`LocalSnapshot`]
//! (`<dir>/<id>.tar` on the host), [`RemoteSnapshot`] (delegates to any
//! [`RemoteSnapshotClient`](crate::RemoteSnapshotClient), native or Wasm).
//! Snapshot plugins come in through [`crate::plugin::WasmSnapshot`].
//! [`DedupSnapshot`] keeps generations of the workspace as deduplicated
//! chunks in any remote snapshot client.

mod dedup;
mod local;
mod noop;
mod remote;

pub use dedup::{
    ChunkerParams, DedupOptions, DedupRecord, DedupSnapshot, GcReport, Generation, Keep, PackCache,
    StopStats, DEFAULT_CACHE_BYTES, FORMAT_VERSION,
};
pub use local::LocalSnapshot;
pub use noop::NoopSnapshot;
pub use remote::RemoteSnapshot;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::store_error::StoreError;

/// One sandbox's snapshot.
#[async_trait::async_trait]
pub trait SandboxSnapshot: Send + Sync {
    /// The snapshot id (stable across resumes).
    fn id(&self) -> &str;

    /// The type discriminator recorded in sandbox state ("noop", "local",
    /// "remote", or a plugin's own).
    fn kind(&self) -> &str;

    /// Whether `persist` stores anything.
    fn persistence_enabled(&self) -> bool;

    /// Streams the workspace archive to its end into the snapshot; the
    /// previous archive stays restorable if anything fails.
    async fn persist(&self, archive: &mut (dyn AsyncRead + Unpin + Send))
        -> Result<(), StoreError>;

    /// Streams the stored archive into `sink` and flushes it.
    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError>;

    /// Whether `restore` would find an archive.
    async fn is_restorable(&self) -> Result<bool, StoreError>;

    /// Deletes what this snapshot stored, for a sandbox that is removed
    /// for good, and says what it deleted and what it kept (and why). A
    /// missing archive is not an error. By default, nothing is deleted and
    /// the report says the kind cannot delete what it stored.
    async fn delete_stored(&self) -> Result<DeleteReport, StoreError> {
        Ok(DeleteReport {
            unsupported: Some(format!(
                "a {} snapshot cannot delete what it stored; its archive stays in its storage",
                self.kind()
            )),
            ..DeleteReport::default()
        })
    }

    /// This snapshot as a [`DedupSnapshot`], if it is one (its generations
    /// are then part of the sandbox state). By default, `None`.
    fn as_dedup(&self) -> Option<&DedupSnapshot> {
        None
    }
}

/// What [`SandboxSnapshot::delete_stored`] deleted and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeleteReport {
    /// What was deleted: object ids in the store, or file paths.
    pub deleted: Vec<String>,
    /// What was kept on purpose, with why (a generation a fork starts from).
    pub kept: Vec<KeptObject>,
    /// Why nothing could be deleted, when the kind cannot delete.
    pub unsupported: Option<String>,
}

/// An object [`SandboxSnapshot::delete_stored`] kept on purpose.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeptObject {
    /// The object id.
    pub object: String,
    /// Why it was kept.
    pub why: String,
}
