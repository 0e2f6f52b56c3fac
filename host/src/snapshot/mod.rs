//! Sandbox snapshots: where one sandbox's workspace archive is persisted and
//! restored from — the host-side face of the WIT `snapshot` interface.
//!
//! Native kinds: [`NoopSnapshot`] (persistence off), [`LocalSnapshot`]
//! (`<dir>/<id>.tar` on the host), [`RemoteSnapshot`] (delegates to any
//! [`RemoteSnapshotClient`](crate::RemoteSnapshotClient), native or Wasm).
//! Snapshot plugins come in through [`crate::plugin::WasmSnapshot`].
//! [`DedupSnapshot`] keeps generations of the workspace as deduplicated
//! chunks in any remote snapshot client.

pub(crate) mod dedup;
mod local;
mod noop;
mod provider;
mod remote;
mod state;

pub use dedup::{
    ChangeKind, Changes, ChunkerParams, DedupOptions, DedupRecord, DedupSnapshot, FormatError,
    GcReport, Generation, GenerationNote, Keep, PackCache, PathChange, StopStats, TreeDiff,
    DEFAULT_CACHE_BYTES, FORMAT_VERSION,
};
pub use local::{LocalOptions, LocalProvider, LocalSnapshot};
pub use noop::{NoopOptions, NoopProvider, NoopSnapshot};
pub(crate) use provider::Registry;
pub use provider::{
    absolute_argument, BindContext, Binding, BoundStore, KindFields, OrphanFile, OrphanFileReason,
    SnapshotKindError, SnapshotOptions, SnapshotProvider,
};
pub use remote::RemoteSnapshot;
pub use state::SnapshotState;

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

    /// Whether this snapshot records the workspace's files (so a walk can
    /// be handed to [`SandboxSnapshot::persist_walk`]), and the files its
    /// newest generation recorded, which a walk need not read. By
    /// default, `None`: the snapshot takes archives only.
    async fn known_files(&self) -> Option<crate::workspace::tree::KnownFiles> {
        None
    }

    /// Persists a walk of the workspace instance `instance` (see
    /// [`SandboxSnapshot::known_files`]); the previous generation stays
    /// restorable if anything fails. By default, unsupported.
    async fn persist_walk(
        &self,
        walk: crate::backend::TreeWalk,
        instance: Option<String>,
    ) -> Result<(), StoreError> {
        let _ = (walk, instance);
        Err(StoreError::Local {
            what: "persisting a walk of the workspace",
            source: std::io::Error::other(format!(
                "a {} snapshot takes archives only",
                self.kind()
            )),
        })
    }

    /// Records why the next generation is made (a command's checkpoint, a
    /// rewind), for a snapshot that keeps generations. By default, ignored.
    fn note_next(&self, note: GenerationNote) {
        let _ = note;
    }

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

    /// Whether what this snapshot stores can be restored on another host
    /// (a shared store), so a sandbox using it can move. By default, no:
    /// a kind says so only when it is true.
    fn portable(&self) -> bool {
        false
    }

    /// Whether this snapshot digests what it persists itself (a chunk
    /// index records the archive's BLAKE3), so the lifecycle only counts
    /// the bytes and takes the digest from [`SandboxSnapshot::own_seal`].
    /// By default, no: the lifecycle hashes the archive.
    fn seals_itself(&self) -> bool {
        false
    }

    /// The seal of the archive this snapshot holds now — the one `restore`
    /// would stream, the one `persist` just stored — when it verifies that
    /// archive itself (see [`SandboxSnapshot::seals_itself`]); `restore`
    /// then fails rather than stream anything else. By default, `None`:
    /// the lifecycle verifies against the digest in the sandbox state.
    fn own_seal(&self) -> Option<ArchiveSeal> {
        None
    }

    /// Whether this snapshot compresses what it stores itself, so the
    /// lifecycle must not compress the archive first. By default, no.
    fn compresses_itself(&self) -> bool {
        false
    }

    /// The kind's own fields of the sandbox state (a deduplicated
    /// snapshot's generations), saved after every change and given back
    /// on resume. By default, none.
    fn state_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }

    /// The snapshot's generations, when it keeps more than the newest
    /// archive. By default, `None`.
    fn generations(&self) -> Option<&dyn Generations> {
        None
    }
}

/// A stored archive's BLAKE3 (`blake3:<hex>`) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSeal {
    /// `blake3:<hex>` of the uncompressed tar.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
}

/// What a fork starts from (see [`Generations::fork_base`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct ForkBase {
    /// The generation's archive.
    pub seal: ArchiveSeal,
    /// The fork's own kind-specific state fields (its record of the
    /// base), given to its snapshot at create.
    pub fields: serde_json::Map<String, serde_json::Value>,
    /// How many generations the fork keeps (as its source does).
    pub keep: u32,
    /// The store the fork's generations go to (the source's).
    pub store: std::sync::Arc<dyn crate::RemoteSnapshotClient>,
}

impl std::fmt::Debug for ForkBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkBase")
            .field("seal", &self.seal)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

/// A snapshot that keeps several generations of the workspace (see
/// [`SandboxSnapshot::generations`]): one can be restored instead of the
/// newest, forks start from one, and what no kept generation needs can
/// be collected.
#[async_trait::async_trait]
pub trait Generations: Send + Sync {
    /// Makes the next restore stream generation `number`, and returns its
    /// seal; `None` when it is not kept.
    fn select(&self, number: u64) -> Option<ArchiveSeal>;

    /// The numbers of the kept generations, for messages (`1, 2, 3`).
    fn kept(&self) -> String;

    /// Deletes (or, with `dry_run`, lists) what no kept generation needs.
    async fn collect_garbage(&self, dry_run: bool) -> Result<GcReport, StoreError>;

    /// Pins generation `number` (by default, `None`, the newest) so the
    /// source's garbage collection keeps it, and says what a fork of it
    /// starts from.
    async fn fork_base(&self, number: Option<u64>) -> Result<ForkBase, StoreError>;

    /// The kept generations, oldest first, and the one the workspace
    /// descends from.
    fn history(&self) -> History;

    /// The paths generation `older` and generation `newer` differ by,
    /// read from their indexes (nothing else is downloaded).
    async fn diff(&self, older: u64, newer: u64) -> Result<TreeDiff, StoreError>;

    /// Keeps generation `number` whatever the keep policy says until it is
    /// released with `None` (a rewind to it is under way).
    fn hold(&self, number: Option<u64>);

    /// Also keeps the generations written within `seconds` of the newest.
    fn keep_within(&self, seconds: Option<u64>);

    /// Whether the next stop returns at its commit and leaves its tidying
    /// (removing its journal, collecting the generations it dropped) for
    /// [`Generations::settle`], or for the stop after it.
    fn defer_tidy(&self, defer: bool);

    /// Does what a stop left for later; nothing when nothing is pending.
    async fn settle(&self);

    /// Deletes (or lists) what a removal left for forks, except the
    /// generations whose index ids are in `bases` (the fork bases still in
    /// use) and what they need.
    async fn delete_leftovers(
        &self,
        bases: &std::collections::BTreeSet<String>,
        dry_run: bool,
    ) -> Result<DeleteReport, StoreError>;
}

/// A snapshot's kept generations (see [`Generations::history`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct History {
    /// The kept generations, oldest first (pinned ones included).
    pub generations: Vec<Generation>,
    /// The generation the workspace descends from.
    pub current: Option<u64>,
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
