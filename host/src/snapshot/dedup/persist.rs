//! A stop: workspace entries (walked with the files cache, or parsed from
//! a tar) → each file's content into content-defined chunks → new chunks
//! into packs → journal, packs → index (the commit) → record → collection
//! of what the new generation dropped.
//!
//! Up to three parts run at once: the entries are produced (a walk on its
//! own thread, or the tar read on the async side), chunked, hashed,
//! compressed and packed on a blocking thread, and finished packs are
//! uploaded on the async side while the next one is being built. A file
//! the files cache matched is not read: its chunks are the parent's.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::format::ChunkId;
use super::format::{names, Index, IndexHeader, FORMAT_VERSION};
pub(crate) use super::packing::TreeSource;
use super::packing::{Known, Packed};
use super::record::{Changes, Generation, StopStats};
use super::DedupSnapshot;
use crate::store_error::StoreError;
use crate::workspace::tree::{KnownFiles, WalkStats};

/// Bytes read from a tar at a time.
const READ_PIECE: usize = 256 * 1024;

pub(super) use super::uploads::Uploaded;

impl DedupSnapshot {
    /// The generation to deduplicate against (and restore): the current
    /// one or the fork base. A missing or unreadable parent index costs
    /// deduplication only.
    async fn parent(&self) -> Option<(Generation, Arc<Index>)> {
        let head = self.record().head().cloned()?;
        match self.index(&head.index).await {
            Ok(i) => Some((head, i)),
            Err(e) => {
                tracing::warn!(snapshot = %self.id, index = %head.index, error = %e,
                    "the parent generation's index is unusable; this stop stores everything again");
                None
            }
        }
    }

    /// The files a walk may skip: the parent generation's files recorded
    /// with an identity, for the instance they were recorded in.
    pub(super) async fn known_files(&self) -> KnownFiles {
        let Some((_, index)) = self.parent().await else {
            return KnownFiles::default();
        };
        KnownFiles {
            instance: index.header.instance.clone(),
            files: index
                .members
                .iter()
                .filter_map(|m| m.entry.stamp().map(|s| (m.entry.path.clone(), s)))
                .collect(),
        }
    }

    /// A stop from a tar stream: parsed into entries (every file read).
    pub(super) async fn persist_generation(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let (piece_tx, piece_rx) = mpsc::channel::<Vec<u8>>(2);
        // Read buffers go back to the reader: allocating on one thread and
        // freeing on another grows the allocator's arenas with the archive.
        let (spent_tx, mut spent_rx) = mpsc::channel::<Vec<u8>>(4);
        let read = async move {
            loop {
                let mut piece = spent_rx
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(READ_PIECE));
                piece.clear();
                let n = (&mut *archive)
                    .take(READ_PIECE as u64)
                    .read_to_end(&mut piece)
                    .await
                    .map_err(StoreError::Source)?;
                if n == 0 || piece_tx.send(piece).await.is_err() {
                    // The end, or the packer stopped (its error says why).
                    return Ok::<(), StoreError>(());
                }
            }
        };
        let stored = self.persist_tree(TreeSource::Tar(piece_rx), spent_tx, None);
        let ((), ()) = tokio::try_join!(read, stored)?;
        Ok(())
    }

    /// A stop from a walk of the workspace instance `instance`.
    pub(super) async fn persist_walk(
        &self,
        walk: crate::backend::TreeWalk,
        instance: Option<String>,
    ) -> Result<(), StoreError> {
        let (spent_tx, _spent_rx) = mpsc::channel::<Vec<u8>>(1);
        self.persist_tree(TreeSource::Walk(walk), spent_tx, instance)
            .await
    }

    /// A stop, in its steps: learn what the stored generations hold, pack
    /// the tree while uploading each pack as it is built, commit the index
    /// (the generation exists from then on), then tidy up.
    async fn persist_tree(
        &self,
        source: TreeSource,
        spent_tx: mpsc::Sender<Vec<u8>>,
        instance: Option<String>,
    ) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let defer_tidy = self
            .defer_next_tidy
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        // What the last stop left for later goes first: it may remove the
        // journal this stop is about to write.
        let mut pending = self.pending_tidy.lock().await;
        if let Some(tidy) = pending.take() {
            self.tidy_after_commit(tidy).await;
        }
        // A journal a stop that did not finish left names packs no index
        // may reference; this stop's journal replaces it, so it names them
        // too and this stop collects them.
        let inherited = if self
            .journal_absent
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            Vec::new()
        } else {
            self.journal_packs().await?.unwrap_or_default()
        };
        let parent = self.parent().await;
        let stored = self.stored(parent.as_ref()).await;
        let learned = started.elapsed();
        let number = self.record().next_number();
        let spool = self.spool_dir()?;
        let (packing, pack_rx) = super::packing::start(
            super::packing::Inputs {
                tag: self.tag.clone(),
                zstd_level: self.options.zstd_level,
                spool,
                chunker_params: self.options.chunker,
                known: stored.known,
                parent: stored.parent,
                packs: stored.packs,
            },
            source,
            spent_tx,
        )?;
        let packed = async {
            packing.await.map_err(|e| StoreError::Local {
                what: "packing chunks",
                source: std::io::Error::other(e.to_string()),
            })?
        };
        let ((up, held), packed) = tokio::try_join!(
            self.upload_packs(
                number,
                pack_rx,
                Uploaded {
                    inherited,
                    ..Uploaded::default()
                }
            ),
            packed
        )?;
        let walk = packed.walk;
        let packed_at = started.elapsed();
        let (index, counts) = build_index(
            self,
            number,
            parent.as_ref().map(|p| &p.0),
            packed,
            instance,
        );
        let (index, mut up) = self
            .store_blocks(
                number,
                index,
                parent.as_ref().map(|p| p.1.clone()),
                up,
                held,
            )
            .await?;
        let blocks_at = started.elapsed();
        let stop = Stop {
            number,
            walk,
            counts,
            started,
        };
        self.commit(stop, parent, index, &mut up).await?;
        let committed_at = started.elapsed();
        let tidy = PendingTidy {
            own_journal: !up.packs.is_empty(),
            inherited: std::mem::take(&mut up.inherited),
        };
        if defer_tidy {
            *pending = Some(tidy);
        } else {
            self.tidy_after_commit(tidy).await;
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            learned = ms(learned),
            packed = ms(packed_at),
            blocks = ms(blocks_at),
            committed = ms(committed_at),
            tidied = ms(started.elapsed()),
            deferred = defer_tidy,
            "a stop's steps (ms since it started; tidying deferred or not)"
        );
        Ok(())
    }

    /// What a stop deduplicates against: the parent generation's chunks
    /// and files, and a fork's base's chunks (whatever its own generations
    /// dropped since).
    async fn stored(&self, parent: Option<&(Generation, Arc<Index>)>) -> Stored {
        let mut stored = Stored::default();
        if let Some((_, index)) = parent {
            stored.learn(index);
            stored.parent = Some(index.clone());
        }
        let base = self.record().base.clone();
        if let Some(base) = base.filter(|b| parent.is_none_or(|(p, _)| p.index != b.index)) {
            match self.index(&base.index).await {
                Ok(index) => stored.learn(&index),
                Err(e) => tracing::warn!(index = %base.index, error = %e,
                    "the fork's base index is unusable; not deduplicating against it"),
            }
        }
        stored
    }

    /// Uploads generation `number`'s index — the commit point — and
    /// records the generation with what the stop did.
    async fn commit(
        &self,
        stop: Stop,
        parent: Option<(Generation, Arc<Index>)>,
        index: Index,
        up: &mut Uploaded,
    ) -> Result<(), StoreError> {
        let Stop {
            number,
            walk,
            counts,
            started,
        } = stop;
        let changes = match &parent {
            Some((_, p)) => Changes::between(p, &index),
            None => Some(Changes::all_new(&index)),
        };
        let index_id = names::index(self.id.as_str(), number);
        let compared = started.elapsed();
        let bytes = index.encode();
        let encoded = started.elapsed();
        self.client.upload(&index_id, &mut &bytes[..]).await?;
        // Committed.
        tracing::debug!(
            compared = compared.as_secs_f64() * 1e3,
            encoded = encoded.as_secs_f64() * 1e3,
            uploaded = started.elapsed().as_secs_f64() * 1e3,
            bytes = bytes.len(),
            "the index (ms since the stop started)"
        );
        up.calls += 1;
        up.bytes += bytes.len() as u64;
        let note = self.take_note();
        let generation = Generation {
            number,
            index: index_id.clone(),
            digest: index.header.tar_digest.clone(),
            size: index.header.tar_size,
            created: Some(index.header.created),
            note,
            changes,
            stored_bytes: Some(up.bytes),
        };
        self.remember(&index_id, Arc::new(index));
        let stats = StopStats {
            generation: number,
            tar_bytes: generation.size,
            new_bytes: counts.new_bytes,
            uploaded_bytes: up.bytes,
            upload_calls: up.calls,
            chunks: counts.chunks,
            new_chunks: counts.new_chunks,
            packs: up.packs.len() as u64,
            dedup_ratio: String::new(),
            read_bytes: walk.bytes_read,
            files_read: walk.files_read,
            files_unchanged: walk.files_unchanged,
            millis: started.elapsed().as_millis() as u64,
        }
        .finish();
        tracing::info!(snapshot = %self.id, generation = number, uploaded = up.bytes,
            calls = up.calls, ratio = %stats.dedup_ratio, read = walk.bytes_read,
            unchanged_files = walk.files_unchanged, "deduplicated stop committed");
        self.update_record(|r| {
            r.generations.push(generation);
            r.current = Some(number);
            r.last_stop = Some(stats);
            r.drop_beyond_keep();
        });
        Ok(())
    }

    /// After a commit: the journal goes while dropped generations are
    /// collected, then the pack cache is trimmed. Failures here lose
    /// nothing (the next stop or `gc` retries), so they are logged, not
    /// returned.
    pub(super) async fn tidy_after_commit(&self, tidy: PendingTidy) {
        let PendingTidy {
            own_journal,
            inherited,
        } = tidy;
        let remove_journal = async {
            if !own_journal {
                return;
            }
            if let Err(e) = self.delete_journal().await {
                tracing::warn!(error = %e, "removing the stop's journal failed; garbage collection removes it");
            }
        };
        let collect = async {
            if let Err(e) = self.collect_after_commit(own_journal, inherited).await {
                tracing::warn!(snapshot = %self.id, error = %e,
                    "collecting dropped generations failed; the next stop or garbage collection retries");
            }
        };
        tokio::join!(remove_journal, collect);
        if let Some(cache) = &self.options.cache {
            cache.trim();
        }
    }
}

/// What a committed stop has left to tidy.
#[derive(Debug, Clone)]
pub(super) struct PendingTidy {
    /// The stop wrote a journal (it uploaded packs).
    own_journal: bool,
    /// Packs an unfinished stop's journal named, which this stop's
    /// journal took over: collected unless a kept generation needs them.
    inherited: Vec<String>,
}

/// What the stored generations hold that a stop deduplicates against.
#[derive(Default)]
struct Stored {
    /// Chunks already stored: their pack (a number in `packs`) and place.
    known: HashMap<ChunkId, Known>,
    /// The pack names the numbers in `known` refer to.
    packs: Vec<String>,
    /// The parent, for the files cache (learned first, so its pack
    /// numbers are its own).
    parent: Option<Arc<Index>>,
}

impl Stored {
    /// Learns `index`'s chunks.
    fn learn(&mut self, index: &Index) {
        let offset = self.packs.len() as u32;
        self.packs.extend(index.header.packs.iter().cloned());
        self.known.reserve(index.entries.len());
        for e in &index.entries {
            self.known
                .entry(e.chunk)
                .or_insert(Known::At(e.pack + offset, e.location));
        }
    }
}

/// What a stop knows besides its index and uploads, for its record.
struct Stop {
    number: u64,
    walk: WalkStats,
    counts: Counts,
    started: std::time::Instant,
}

/// The counts a stop reports besides its uploads.
struct Counts {
    chunks: u64,
    new_chunks: u64,
    new_bytes: u64,
}

/// The index of generation `number`, listing only the packs its entries
/// use; and the counts.
fn build_index(
    snapshot: &DedupSnapshot,
    number: u64,
    parent: Option<&Generation>,
    packed: Packed,
    instance: Option<String>,
) -> (Index, Counts) {
    // Renumbered to the packs the entries use, each name once.
    let mut renumber: Vec<Option<u32>> = vec![None; packed.packs.len()];
    let mut by_name: HashMap<String, u32> = HashMap::new();
    let mut packs = Vec::new();
    let mut entries = packed.entries;
    for e in &mut entries {
        let slot = &mut renumber[e.pack as usize];
        let n = *slot.get_or_insert_with(|| {
            let name = &packed.packs[e.pack as usize];
            *by_name.entry(name.clone()).or_insert_with(|| {
                packs.push(name.clone());
                (packs.len() - 1) as u32
            })
        });
        e.pack = n;
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let counts = Counts {
        chunks: entries.len() as u64,
        new_chunks: packed.new_chunks,
        new_bytes: packed.new_bytes,
    };
    let mut index = Index {
        header: IndexHeader {
            version: FORMAT_VERSION,
            snapshot: snapshot.id.to_string(),
            generation: number,
            chunker: snapshot.options.chunker,
            parent: parent.map(|g| g.index.clone()),
            tar_size: 0,
            tar_digest: String::new(),
            packs,
            created,
            instance,
        },
        entries,
        members: packed.members,
        blocks: Vec::new(),
    };
    index.header.tar_size = index.rendered_size();
    index.header.tar_digest = index.tree_seal();
    (index, counts)
}
