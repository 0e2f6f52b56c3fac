//! Incremental, deduplicated snapshots over any [`RemoteSnapshotClient`]
//! (native or Wasm), without changing the plugin contract: chunks, packs
//! and indexes are plain objects under ids. The format is specified in
//! `docs/SNAPSHOT-FORMAT.md`.
//!
//! A stop cuts the workspace tar into content-defined chunks, uploads the
//! chunks its parent generation does not have in packs of up to 32 MiB
//! (each announced in a journal first), then writes one index object: the
//! commit point. Packs no retained generation references are deleted after
//! the commit, or by [`DedupSnapshot::collect_garbage`]. A restore fetches
//! the index, then the packs it needs (three in flight, or from the host's
//! [`PackCache`]), checks every pack and chunk, and streams the tar in
//! order; its BLAKE3 is checked against the index and the sandbox state
//! before anything is extracted.

mod cache;
mod chunker;
mod delete;
mod diff;
mod format;
mod format_error;
mod gc;
mod generations;
mod index_cache;
mod pack_builder;
mod packing;
mod persist;
mod record;
mod restore;
#[cfg(test)]
mod tests;
mod tree_packs;
mod uploads;

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};

pub use cache::{PackCache, DEFAULT_CACHE_BYTES};
pub use chunker::ChunkerParams;
pub use delete::Keep;
pub use diff::{ChangeKind, PathChange, TreeDiff};
pub use format::FORMAT_VERSION;
pub use gc::GcReport;
pub(crate) use record::{record_fields, record_in};
pub use record::{Changes, DedupRecord, Generation, GenerationNote, StopStats};

use super::SandboxSnapshot;
use crate::capped_writer::CappedWriter;
use crate::remote_client::RemoteSnapshotClient;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};
use format::{names, Index, MAX_INDEX_BYTES};
use format_error::damaged;
pub use format_error::FormatError;

/// A deduplicated snapshot's kind in the sandbox state. (Versions before
/// 0.4 wrote `remote` with a `dedup` record; that reads as this kind.)
pub(crate) const KIND: &str = "dedup";

/// How a deduplicated snapshot cuts, compresses and caches.
#[derive(Debug, Clone)]
pub struct DedupOptions {
    keep: u32,
    keep_within: Option<std::time::Duration>,
    chunker: ChunkerParams,
    zstd_level: i32,
    cache: Option<PackCache>,
    spool_dir: Option<std::path::PathBuf>,
}

impl Default for DedupOptions {
    fn default() -> Self {
        DedupOptions {
            keep: 1,
            keep_within: None,
            chunker: ChunkerParams::default(),
            zstd_level: 1,
            cache: None,
            spool_dir: None,
        }
    }
}

impl DedupOptions {
    /// Generations kept per snapshot, the newest first. By default, 1.
    /// A resumed snapshot keeps what its record says.
    pub fn keep(mut self, generations: u32) -> Self {
        self.keep = generations.max(1);
        self
    }

    /// Also keep every generation written within `window` of the newest
    /// one. By default, none (only `keep` counts). A resumed snapshot
    /// keeps what its record says.
    pub fn keep_within(mut self, window: Option<std::time::Duration>) -> Self {
        self.keep_within = window;
        self
    }

    /// Chunk size bounds. By default, 64 KiB / 256 KiB / 1 MiB; invalid
    /// bounds are replaced by the default.
    pub fn chunker(mut self, params: ChunkerParams) -> Self {
        self.chunker = if params.is_valid() {
            params
        } else {
            ChunkerParams::default()
        };
        self
    }

    /// zstd level for new chunks (kept raw when compression saves less
    /// than 1/32). By default, 1.
    pub fn zstd_level(mut self, level: i32) -> Self {
        self.zstd_level = level;
        self
    }

    /// Keep packs in this host-side cache. By default, none (the
    /// [`crate::SandboxClient`] passes the one `$BERTH_CACHE_DIR` names).
    pub fn cache(mut self, cache: Option<PackCache>) -> Self {
        self.cache = cache;
        self
    }

    /// Where packs are built and downloaded when there is no cache. By
    /// default, the system temp dir.
    pub fn spool_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.spool_dir = dir;
        self
    }

    /// The number of generations kept.
    pub fn kept_generations(&self) -> u32 {
        self.keep
    }
}

/// A [`SandboxSnapshot`] that stores generations of the workspace as
/// deduplicated chunks through any [`RemoteSnapshotClient`].
///
/// ```
/// use std::sync::Arc;
/// use berth::remote_client::DirRemoteClient;
/// use berth::snapshot::{DedupOptions, DedupSnapshot};
/// use berth::{SandboxSnapshot, SnapshotId};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = Arc::new(DirRemoteClient::new(dir.path())?);
/// let snapshot = DedupSnapshot::new(SnapshotId::parse("agent-1")?, store, DedupOptions::default());
/// # let mut b = tar::Builder::new(Vec::new());
/// # let mut h = tar::Header::new_gnu(); h.set_size(3); h.set_mode(0o644); h.set_cksum();
/// # b.append_data(&mut h, "a.txt", &b"hi\n"[..])?; let tar = b.into_inner()?;
/// snapshot.persist(&mut &tar[..]).await?; // generation 1: everything is new
/// snapshot.persist(&mut &tar[..]).await?; // generation 2: the index alone
/// let stats = snapshot.record().last_stop.unwrap();
/// assert_eq!((stats.generation, stats.upload_calls, stats.new_bytes), (2, 1, 0));
/// let mut back = Vec::new();
/// snapshot.restore(&mut back).await?; // the same tree, as a canonical tar
/// let mut entries = tar::Archive::new(&back[..]);
/// let names: Vec<String> = entries.entries()?
///     .map(|e| Ok(e?.path()?.display().to_string()))
///     .collect::<std::io::Result<_>>()?;
/// assert_eq!(names, ["a.txt"]);
/// # Ok(()) }
/// ```
pub struct DedupSnapshot {
    id: SnapshotId,
    tag: String,
    client: Arc<dyn RemoteSnapshotClient>,
    options: DedupOptions,
    record: Mutex<DedupRecord>,
    /// A stop was interrupted: an index newer than the record may exist.
    interrupted: bool,
    /// Indexes read or written in this process: the newest whole, the
    /// rest as pack lists.
    indexes: index_cache::IndexCache,
    /// What the next stop's generation records about why it was made.
    next_note: Mutex<Option<GenerationNote>>,
    /// No journal names packs an index may not reference: this process
    /// removed the journal, or saw there was none, and wrote none since —
    /// or the state says the last stop finished (its journal, if any, is
    /// being removed and names only committed packs). Garbage collection
    /// and the next stop need not look for one.
    journal_absent: std::sync::atomic::AtomicBool,
    /// The next stop leaves its tidying for [`DedupSnapshot::settle`].
    defer_next_tidy: std::sync::atomic::AtomicBool,
    /// Tidying a stop left for later; held while it runs, so a stop (which
    /// does it first) waits for a settle under way.
    pending_tidy: tokio::sync::Mutex<Option<persist::PendingTidy>>,
}

impl DedupSnapshot {
    /// A new deduplicated snapshot `id` in `client`.
    pub fn new(
        id: SnapshotId,
        client: Arc<dyn RemoteSnapshotClient>,
        options: DedupOptions,
    ) -> Self {
        let mut record = DedupRecord::new(options.keep);
        record.keep_within_secs = options.keep_within.map(|d| d.as_secs());
        Self::resume(id, client, record, false, options)
    }

    /// The snapshot as its `record` (from the sandbox state) describes it;
    /// `interrupted` when the state says a stop did not finish.
    pub fn resume(
        id: SnapshotId,
        client: Arc<dyn RemoteSnapshotClient>,
        record: DedupRecord,
        interrupted: bool,
        options: DedupOptions,
    ) -> Self {
        DedupSnapshot {
            tag: names::owner_tag(id.as_str()),
            id,
            client,
            options,
            record: Mutex::new(record),
            interrupted,
            indexes: index_cache::IndexCache::default(),
            next_note: Mutex::new(None),
            journal_absent: std::sync::atomic::AtomicBool::new(!interrupted),
            defer_next_tidy: std::sync::atomic::AtomicBool::new(false),
            pending_tidy: tokio::sync::Mutex::new(None),
        }
    }

    /// The record to keep in the sandbox state.
    pub fn record(&self) -> DedupRecord {
        self.record
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn update_record(&self, f: impl FnOnce(&mut DedupRecord)) {
        match self.record.lock() {
            Ok(mut r) => f(&mut r),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Makes generation `number` the one the next restore reads and the
    /// next stop deduplicates against. Returns it, or `None` if it is not
    /// retained.
    pub fn select_generation(&self, number: u64) -> Option<Generation> {
        let mut found = None;
        self.update_record(|r| {
            found = r.find(number).cloned();
            if found.is_some() {
                r.current = Some(number);
            }
        });
        found
    }

    /// Marks a generation as the base of a fork, so garbage collection
    /// keeps it and the packs it references; returns it. `number` picks
    /// a kept generation; by default (`None`), the newest one (or, before
    /// this snapshot's first stop, the generation it was forked from).
    ///
    /// A snapshot resumed after an interrupted stop first adopts the
    /// generation that stop committed, if it did (that stop may already
    /// have collected the generation the record calls newest). A chosen
    /// generation whose index the store no longer holds is refused: a fork
    /// of it would have nothing to start from.
    pub async fn pin_generation(&self, number: Option<u64>) -> Result<Generation, StoreError> {
        self.restore_target().await?;
        let record = self.record();
        let chosen = match number {
            Some(n) => record.find(n).cloned().ok_or_else(|| {
                StoreError::Storage(StorageError::NotFound(format!(
                    "generation {n} of snapshot {} is not kept (kept: {})",
                    self.id,
                    record.kept_numbers()
                )))
            })?,
            None => record
                .generations
                .iter()
                .chain(&record.pinned)
                .max_by_key(|g| g.number)
                .or(record.head())
                .cloned()
                .ok_or_else(|| {
                    StoreError::Storage(StorageError::NotFound(format!(
                        "snapshot {} has no generation yet: stop it once before forking it",
                        self.id
                    )))
                })?,
        };
        let marker =
            serde_json::to_vec(&serde_json::json!({ "pinned": chosen.index })).unwrap_or_default();
        self.client
            .upload(&names::pin(&chosen.index), &mut &marker[..])
            .await?;
        if !self.client.exists(&chosen.index).await? {
            // Pinned too late: the generation was collected before it.
            let _ = self.client.delete(&names::pin(&chosen.index)).await;
            return Err(StoreError::Storage(StorageError::NotFound(format!(
                "generation {} of snapshot {} is no longer in its store (its index {} was collected); fork another generation (`berth history`)",
                chosen.number, self.id, chosen.index
            ))));
        }
        Ok(chosen)
    }

    /// Records why the next stop's generation is made (a command's
    /// checkpoint, a rewind); the next stop takes it.
    pub fn note_next(&self, note: GenerationNote) {
        if let Ok(mut n) = self.next_note.lock() {
            *n = Some(note);
        }
    }

    /// Whether the next stop returns at its commit, leaving its tidying —
    /// removing its journal, collecting the generations it dropped — for
    /// [`DedupSnapshot::settle`] or, if that is never called, for the stop
    /// after it (which does it first). By default, no. Nothing is at risk
    /// meanwhile: the packs the journal names are the committed
    /// generation's, and a journal left behind (the process ended first)
    /// is removed by the next collection.
    pub fn defer_tidy(&self, defer: bool) {
        self.defer_next_tidy
            .store(defer, std::sync::atomic::Ordering::SeqCst);
    }

    /// Does the tidying a stop left for later (see
    /// [`DedupSnapshot::defer_tidy`]); nothing when none is pending.
    /// Failures are logged: the next stop or `gc` retries.
    pub async fn settle(&self) {
        let mut pending = self.pending_tidy.lock().await;
        if let Some(tidy) = pending.take() {
            self.tidy_after_commit(tidy).await;
        }
    }

    /// Records whether the journal is known to be absent from the store.
    fn journal_gone(&self, gone: bool) {
        self.journal_absent
            .store(gone, std::sync::atomic::Ordering::SeqCst);
    }

    fn take_note(&self) -> Option<GenerationNote> {
        self.next_note.lock().ok().and_then(|mut n| n.take())
    }

    /// The paths generation `older` and generation `newer` differ by,
    /// read from their indexes (no pack is downloaded). Both must be kept
    /// and written in format version 2.
    pub async fn diff(&self, older: u64, newer: u64) -> Result<TreeDiff, StoreError> {
        let a = self.kept_index(older).await?;
        let b = self.kept_index(newer).await?;
        Ok(diff::diff(&a, &b))
    }

    /// A kept generation's index, in format version 2.
    async fn kept_index(&self, number: u64) -> Result<Arc<Index>, StoreError> {
        let record = self.record();
        let generation = record.find(number).cloned().ok_or_else(|| {
            StoreError::Storage(StorageError::NotFound(format!(
                "generation {number} of snapshot {} is not kept (kept: {})",
                self.id,
                record.kept_numbers()
            )))
        })?;
        let index = self.index(&generation.index).await?;
        if index.header.version < 2 {
            return Err(damaged(generation.index, FormatError::Malformed {
                    kind: "index",
                    why: format!("generation {number} was written in format version 1, which does not record its files; stop the sandbox once to write one that does"),
                }));
        }
        Ok(index)
    }

    /// The snapshot's store.
    pub fn client(&self) -> &Arc<dyn RemoteSnapshotClient> {
        &self.client
    }

    /// An index, from this process's memory or the store, checked.
    async fn index(&self, object: &str) -> Result<Arc<Index>, StoreError> {
        if let Some(i) = self.indexes.whole(object) {
            return Ok(i);
        }
        let index = Arc::new(self.fetch_index(object).await?);
        self.remember(object, index.clone());
        Ok(index)
    }

    /// The packs index `object` references (all garbage collection needs
    /// of a generation): held for every index seen, so a collection does
    /// not read every kept index again, nor keep them whole.
    async fn packs_of(&self, object: &str) -> Result<Arc<[String]>, StoreError> {
        if let Some(packs) = self.indexes.packs(object) {
            return Ok(packs);
        }
        let index = self.fetch_outline(object).await?;
        self.indexes.remember_packs(object, &index);
        Ok(index.header.packs.into())
    }

    /// An index from the store, checked, with its members.
    async fn fetch_index(&self, object: &str) -> Result<Index, StoreError> {
        let outline = self.fetch_outline(object).await?;
        self.complete_index(object, outline).await
    }

    /// An index object from the store, checked: version 3 without its
    /// blocks read (its header and pack list are whole).
    async fn fetch_outline(&self, object: &str) -> Result<Index, StoreError> {
        let bytes = self.fetch_small(object, MAX_INDEX_BYTES, "index").await?;
        Index::decode(&bytes).map_err(|source| damaged(object.to_string(), source))
    }

    fn remember(&self, object: &str, index: Arc<Index>) {
        self.indexes.remember(object, index);
    }

    /// Downloads a small object into memory, at most `cap` bytes.
    async fn fetch_small(
        &self,
        object: &str,
        cap: u64,
        kind: &'static str,
    ) -> Result<Vec<u8>, StoreError> {
        let mut sink = CappedWriter::new(Vec::new(), cap);
        let fetched = self.client.download(object, &mut sink).await;
        if sink.overran() {
            return Err(damaged(
                object.to_string(),
                FormatError::Malformed {
                    kind,
                    why: format!("it is larger than the {cap} bytes an {kind} may be"),
                },
            ));
        }
        fetched?;
        Ok(sink.into_inner())
    }

    fn spool_dir(&self) -> Result<std::path::PathBuf, StoreError> {
        let local = |source| StoreError::Local {
            what: "creating the pack directory",
            source,
        };
        match (&self.options.cache, &self.options.spool_dir) {
            (Some(cache), _) => cache.ensure_dir().map(|p| p.to_path_buf()).map_err(local),
            (None, Some(dir)) => Ok(dir.clone()),
            (None, None) => Ok(std::env::temp_dir()),
        }
    }
}

fn is_not_found(e: &StoreError) -> bool {
    matches!(e.storage(), Some(StorageError::NotFound(_)))
}

#[async_trait::async_trait]
impl SandboxSnapshot for DedupSnapshot {
    fn id(&self) -> &str {
        self.id.as_str()
    }

    fn kind(&self) -> &str {
        KIND
    }

    fn persistence_enabled(&self) -> bool {
        true
    }

    /// The store is the plugin's (remote, shared): any host that can load
    /// the plugin can restore from it.
    fn portable(&self) -> bool {
        true
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        self.persist_generation(archive).await
    }

    async fn known_files(&self) -> Option<crate::workspace::tree::KnownFiles> {
        Some(DedupSnapshot::known_files(self).await)
    }

    async fn persist_walk(
        &self,
        walk: crate::backend::TreeWalk,
        instance: Option<String>,
    ) -> Result<(), StoreError> {
        DedupSnapshot::persist_walk(self, walk, instance).await
    }

    fn note_next(&self, note: GenerationNote) {
        DedupSnapshot::note_next(self, note)
    }

    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        self.restore_generation(sink).await
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        match self.restore_target().await? {
            Some(g) => self.client.exists(&g.index).await,
            // Before its first deduplicated stop, a snapshot that used to
            // be a whole tar restores from that.
            None => self.client.exists(self.id.as_str()).await,
        }
    }

    fn seals_itself(&self) -> bool {
        true
    }

    fn own_seal(&self) -> Option<crate::snapshot::ArchiveSeal> {
        self.head_seal()
    }

    fn compresses_itself(&self) -> bool {
        true
    }

    fn state_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        record_fields(&self.record())
    }

    fn generations(&self) -> Option<&dyn crate::snapshot::Generations> {
        Some(self)
    }

    async fn delete_stored(&self) -> Result<crate::snapshot::DeleteReport, StoreError> {
        self.delete_all(&Keep::Pinned, false).await
    }
}
