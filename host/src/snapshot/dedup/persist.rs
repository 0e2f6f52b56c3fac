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
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::chunker::{Chunker, ChunkerParams};
use super::format::{
    names, ChunkId, ChunkLocation, Codec, Index, IndexEntry, IndexHeader, Member, PackWriter,
    FORMAT_VERSION, PACK_TARGET_BYTES,
};
use super::record::{Changes, Generation, StopStats};
use super::{is_not_found, DedupSnapshot};
use crate::store_error::StoreError;
use crate::workspace::tree::{self, EntryKind, KnownFiles, TreeItem, WalkStats};

/// Bytes read from a tar at a time.
const READ_PIECE: usize = 256 * 1024;

/// Where a stop's entries come from.
pub(crate) enum TreeSource {
    /// A tar stream, in pieces (a backend without a walk).
    Tar(mpsc::Receiver<Vec<u8>>),
    /// A walk: runs on its own thread and hands items on.
    Walk(crate::backend::TreeWalk),
}

/// A pack ready to upload.
struct FinishedPack {
    name: String,
    file: tempfile::TempPath,
    size: u64,
}

/// What the packer made of the tree.
struct Packed {
    entries: Vec<IndexEntry>,
    members: Vec<Member>,
    /// Pack names by the number entries use: the parent's, then new ones.
    packs: Vec<String>,
    new_chunks: u64,
    new_bytes: u64,
    walk: WalkStats,
}

/// A parent's file, for the files cache: its chunks, with pack numbers
/// in the packer's list.
type ParentRun = Vec<IndexEntry>;

/// The blocking half: cuts and hashes chunks, and hands new ones to the
/// pack builder's thread.
struct Packer {
    chunker_params: ChunkerParams,
    known: HashMap<ChunkId, Known>,
    parent_files: HashMap<Vec<u8>, ParentRun>,
    /// The parent's (and base's) packs; the new ones follow at the end.
    packs: Vec<String>,
    /// New chunks to the pack builder.
    builder: Option<std::sync::mpsc::SyncSender<(ChunkId, Vec<u8>)>>,
    building: Option<std::thread::JoinHandle<Result<Built, StoreError>>>,
    /// Buffers back from the pack builder.
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Entries of new chunks, in the order sent to the builder.
    pending: Vec<usize>,
    /// Entries repeating a new chunk, and the entry that first had it.
    duplicates: Vec<(usize, usize)>,
    entries: Vec<IndexEntry>,
    members: Vec<Member>,
    /// The file being read: its chunker.
    current: Option<Chunker>,
    /// Bytes of content the entries declared so far.
    declared: u64,
    new_chunks: u64,
    new_bytes: u64,
    limits: crate::workspace::ArchiveLimits,
}

fn local(what: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Local { what, source }
}

/// A tar's pieces, from the async reader, as a blocking `Read`.
struct PieceReader {
    input: mpsc::Receiver<Vec<u8>>,
    piece: Vec<u8>,
    at: usize,
    spent: mpsc::Sender<Vec<u8>>,
}

impl std::io::Read for PieceReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.piece.len() {
            match self.input.blocking_recv() {
                Some(next) => {
                    let old = std::mem::replace(&mut self.piece, next);
                    // Back to the reader for reuse (see `persist_tree`).
                    let _ = self.spent.try_send(old);
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// An error of the packer carried through an `io::Error` (the walk's
/// callback type), taken back out at the end.
fn carry(e: StoreError) -> std::io::Error {
    std::io::Error::other(CarriedStoreError(e))
}

#[derive(Debug)]
struct CarriedStoreError(StoreError);

impl std::fmt::Display for CarriedStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CarriedStoreError {}

fn uncarry(e: std::io::Error) -> StoreError {
    if e.get_ref().is_some_and(|r| r.is::<CarriedStoreError>()) {
        if let Some(Ok(carried)) = e.into_inner().map(|b| b.downcast::<CarriedStoreError>()) {
            return carried.0;
        }
        return StoreError::Source(std::io::Error::other("the packer failed"));
    }
    StoreError::Source(e)
}

impl Packer {
    fn run(
        mut self,
        source: TreeSource,
        spent: mpsc::Sender<Vec<u8>>,
    ) -> Result<Packed, StoreError> {
        let walk = match source {
            TreeSource::Tar(input) => {
                let reader = PieceReader {
                    input,
                    piece: Vec::new(),
                    at: 0,
                    spent,
                };
                let limits = self.limits;
                tree::items_of_tar(reader, limits, &mut |item| self.item(item).map_err(carry))
                    .map_err(uncarry)?
            }
            TreeSource::Walk(walk) => {
                // The walk reads on its own thread while this one chunks.
                let (tx, rx) = std::sync::mpsc::sync_channel::<TreeItem>(16);
                let walker = std::thread::Builder::new()
                    .name("berth-walk".into())
                    .spawn(move || {
                        walk(&mut |item| {
                            tx.send(item).map_err(|_| {
                                std::io::Error::new(
                                    std::io::ErrorKind::BrokenPipe,
                                    "the packer stopped",
                                )
                            })
                        })
                    })
                    .map_err(local("starting the workspace walk"))?;
                let mut failed = None;
                for item in rx {
                    if let Err(e) = self.item(item) {
                        failed = Some(e);
                        break;
                    }
                }
                let walked = walker.join().map_err(|_| StoreError::Local {
                    what: "walking the workspace",
                    source: std::io::Error::other("the walk panicked"),
                })?;
                if let Some(e) = failed {
                    return Err(e);
                }
                walked.map_err(StoreError::Source)?
            }
        };
        if self.current.is_some() {
            return Err(StoreError::Source(std::io::Error::other(
                "the workspace's last file ended early",
            )));
        }
        self.finish_packs()?;
        Ok(Packed {
            entries: self.entries,
            members: self.members,
            packs: self.packs,
            new_chunks: self.new_chunks,
            new_bytes: self.new_bytes,
            walk,
        })
    }

    fn item(&mut self, item: TreeItem) -> Result<(), StoreError> {
        let out_of_step = |why: &str| {
            StoreError::Source(std::io::Error::other(format!("the workspace walk {why}")))
        };
        match item {
            TreeItem::Entry { entry, unchanged } => {
                if self.current.is_some() {
                    return Err(out_of_step("started an entry inside a file"));
                }
                if self.members.len() as u64 >= self.limits.max_entries {
                    return Err(out_of_step(&format!(
                        "found more than {} entries (the archive limit)",
                        self.limits.max_entries
                    )));
                }
                self.declared = self.declared.saturating_add(entry.size);
                if self.declared > self.limits.max_bytes {
                    return Err(out_of_step(&format!(
                        "found more than {} bytes (the archive limit)",
                        self.limits.max_bytes
                    )));
                }
                let first_chunk = self.entries.len() as u64;
                let mut chunks = 0;
                if unchanged {
                    let run = self.parent_files.get(&entry.path).ok_or_else(|| {
                        out_of_step("reused a file its parent generation does not have")
                    })?;
                    self.entries.extend_from_slice(run);
                    chunks = run.len() as u32;
                } else if entry.kind == EntryKind::File {
                    self.current = Some(Chunker::for_file(self.chunker_params));
                }
                self.members.push(Member {
                    entry,
                    first_chunk,
                    chunks,
                });
            }
            TreeItem::Data(piece) => {
                let mut chunker = self
                    .current
                    .take()
                    .ok_or_else(|| out_of_step("sent content outside a file"))?;
                chunker.push(&piece, &mut |c| self.chunk(c))?;
                self.current = Some(chunker);
            }
            TreeItem::EndOfFile { identity } => {
                let chunker = self
                    .current
                    .take()
                    .ok_or_else(|| out_of_step("ended a file it did not start"))?;
                chunker.finish(&mut |c| self.chunk(c))?;
                let count = self.entries.len() as u64;
                let Some(member) = self.members.last_mut() else {
                    return Err(out_of_step("ended a file it did not start"));
                };
                member.chunks = (count - member.first_chunk) as u32;
                member.entry.identity = identity;
                let held: u64 = self.entries[member.first_chunk as usize..]
                    .iter()
                    .map(|c| c.location.raw_len as u64)
                    .sum();
                if held != member.entry.size {
                    return Err(out_of_step(&format!(
                        "sent {held} bytes of {}, which is {} bytes",
                        member.entry.display_path(),
                        member.entry.size
                    )));
                }
            }
        }
        Ok(())
    }

    fn chunk(&mut self, raw: &[u8]) -> Result<(), StoreError> {
        let id = *blake3::hash(raw).as_bytes();
        let placeholder = IndexEntry {
            chunk: id,
            pack: u32::MAX,
            location: ChunkLocation {
                offset: 0,
                stored_len: 0,
                raw_len: raw.len() as u32,
                codec: Codec::Raw,
            },
        };
        match self.known.get(&id) {
            Some(Known::At(pack, location)) => {
                self.entries.push(IndexEntry {
                    chunk: id,
                    pack: *pack,
                    location: *location,
                });
                return Ok(());
            }
            Some(Known::Pending(first)) => {
                self.duplicates.push((self.entries.len(), *first));
                self.entries.push(placeholder);
                return Ok(());
            }
            None => {}
        }
        self.known.insert(id, Known::Pending(self.entries.len()));
        self.pending.push(self.entries.len());
        self.entries.push(placeholder);
        self.new_chunks += 1;
        self.new_bytes += raw.len() as u64;
        let mut buffer = self.spare.try_recv().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(raw);
        let sent = self
            .builder
            .as_ref()
            .is_some_and(|b| b.send((id, buffer)).is_ok());
        if !sent {
            return Err(self.builder_stopped());
        }
        Ok(())
    }

    /// The pack builder's own error, once it stopped.
    fn builder_stopped(&mut self) -> StoreError {
        self.builder = None;
        match self.building.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            _ => StoreError::Local {
                what: "building packs",
                source: std::io::Error::other("the pack builder stopped"),
            },
        }
    }

    /// Waits for the pack builder, and puts the places it gave the new
    /// chunks into the entries.
    fn finish_packs(&mut self) -> Result<(), StoreError> {
        self.builder = None;
        let built = match self.building.take().map(|t| t.join()) {
            Some(Ok(built)) => built?,
            _ => {
                return Err(StoreError::Local {
                    what: "building packs",
                    source: std::io::Error::other("the pack builder panicked"),
                })
            }
        };
        let base = self.packs.len() as u32;
        if built.locations.len() != self.pending.len() {
            return Err(StoreError::Local {
                what: "building packs",
                source: std::io::Error::other("the pack builder lost chunks"),
            });
        }
        for (&at, (pack, location)) in self.pending.iter().zip(&built.locations) {
            self.entries[at].pack = base + pack;
            self.entries[at].location = *location;
        }
        for &(at, first) in &self.duplicates {
            self.entries[at].pack = self.entries[first].pack;
            self.entries[at].location = self.entries[first].location;
        }
        self.packs.extend(built.packs);
        Ok(())
    }
}

/// Where a chunk this stop has seen is.
#[derive(Clone, Copy)]
enum Known {
    /// In a pack (a parent's, by the packer's number).
    At(u32, ChunkLocation),
    /// New in this stop: the entry that first had it (its place comes
    /// from the pack builder at the end).
    Pending(usize),
}

/// What the pack builder made: the new packs, and each new chunk's
/// place (pack number among the new packs), in the order sent.
struct Built {
    packs: Vec<String>,
    locations: Vec<(u32, ChunkLocation)>,
}

/// The pack builder: on a thread of its own (the second core), it
/// compresses the new chunks and writes them into packs, handing each
/// finished pack to the uploader.
struct PackBuilder {
    tag: String,
    compressor: zstd::bulk::Compressor<'static>,
    open: Option<(PackWriter<BufWriter<std::fs::File>>, tempfile::TempPath)>,
    spool: PathBuf,
    packs: Vec<String>,
    locations: Vec<(u32, ChunkLocation)>,
    done: mpsc::Sender<FinishedPack>,
}

impl PackBuilder {
    fn run(
        mut self,
        chunks: std::sync::mpsc::Receiver<(ChunkId, Vec<u8>)>,
        spare: std::sync::mpsc::SyncSender<Vec<u8>>,
    ) -> Result<Built, StoreError> {
        for (id, raw) in chunks {
            self.add(id, &raw)?;
            let _ = spare.try_send(raw);
        }
        self.close_pack()?;
        Ok(Built {
            packs: self.packs,
            locations: self.locations,
        })
    }

    fn add(&mut self, id: ChunkId, raw: &[u8]) -> Result<(), StoreError> {
        let compressed = self.compressor.compress(raw).ok();
        let (stored, codec) = match &compressed {
            Some(c) if c.len() < raw.len() - raw.len() / 32 => (c.as_slice(), Codec::Zstd),
            _ => (raw, Codec::Raw),
        };
        if self.open.is_none() {
            let file = tempfile::Builder::new()
                .prefix(".berth-pack-")
                .tempfile_in(&self.spool)
                .map_err(local("creating a pack file"))?;
            let (file, path) = file.into_parts();
            self.open = Some((
                PackWriter::new(BufWriter::with_capacity(1 << 20, file)),
                path,
            ));
        }
        let pack = self.packs.len() as u32;
        let Some((writer, _)) = self.open.as_mut() else {
            return Ok(());
        };
        let location = writer
            .add(id, raw.len() as u32, stored, codec)
            .map_err(local("writing a pack file"))?;
        let full = writer.len() >= PACK_TARGET_BYTES;
        self.locations.push((pack, location));
        if full {
            self.close_pack()?;
        }
        Ok(())
    }

    /// Finishes the open pack (if any) and hands it to the uploader.
    fn close_pack(&mut self) -> Result<(), StoreError> {
        let Some((writer, path)) = self.open.take() else {
            return Ok(());
        };
        let (out, hash, size) = writer.finish().map_err(local("writing a pack file"))?;
        // Flushed, not synced: the spool is read back by the uploader, and
        // durability is the store's job.
        drop(out.into_inner().map_err(|e| StoreError::Local {
            what: "writing a pack file",
            source: e.into_error(),
        })?);
        let name = names::pack(&self.tag, &hash);
        self.packs.push(name.clone());
        self.done
            .blocking_send(FinishedPack {
                name,
                file: path,
                size,
            })
            .map_err(|_| StoreError::Local {
                what: "handing a pack to the uploader",
                source: std::io::Error::other("the upload stopped"),
            })
    }
}

/// Upload counters.
#[derive(Default)]
struct Uploaded {
    bytes: u64,
    calls: u64,
    packs: Vec<String>,
}

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

    async fn persist_tree(
        &self,
        source: TreeSource,
        spent_tx: mpsc::Sender<Vec<u8>>,
        instance: Option<String>,
    ) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let parent = self.parent().await;
        let mut known = HashMap::new();
        let mut packs: Vec<String> = Vec::new();
        let mut parent_files: HashMap<Vec<u8>, Vec<IndexEntry>> = HashMap::new();
        let mut learn = |index: &Index, files: bool| {
            let offset = packs.len() as u32;
            packs.extend(index.header.packs.iter().cloned());
            for e in &index.entries {
                known
                    .entry(e.chunk)
                    .or_insert((e.pack + offset, e.location));
            }
            if files {
                for m in &index.members {
                    if m.entry.stamp().is_some() {
                        let run = index
                            .run(m)
                            .iter()
                            .map(|e| IndexEntry {
                                pack: e.pack + offset,
                                ..*e
                            })
                            .collect();
                        parent_files.insert(m.entry.path.clone(), run);
                    }
                }
            }
        };
        if let Some((_, index)) = &parent {
            learn(index, true);
        }
        // A fork also deduplicates against its base, whatever its own
        // generations dropped since.
        let base = self.record().base.clone();
        if let Some(base) = base.filter(|b| parent.as_ref().is_none_or(|(p, _)| p.index != b.index))
        {
            match self.index(&base.index).await {
                Ok(index) => learn(&index, false),
                Err(e) => tracing::warn!(index = %base.index, error = %e,
                    "the fork's base index is unusable; not deduplicating against it"),
            }
        }
        let number = self.record().next_number();
        let spool = self.spool_dir()?;
        let (pack_tx, mut pack_rx) = mpsc::channel::<FinishedPack>(1);
        let (chunk_tx, chunk_rx) = std::sync::mpsc::sync_channel::<(ChunkId, Vec<u8>)>(8);
        let (spare_tx, spare_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
        let builder = PackBuilder {
            tag: self.tag.clone(),
            compressor: zstd::bulk::Compressor::new(self.options.zstd_level)
                .map_err(local("starting the compressor"))?,
            open: None,
            spool,
            packs: Vec::new(),
            locations: Vec::new(),
            done: pack_tx,
        };
        let building = std::thread::Builder::new()
            .name("berth-packs".into())
            .spawn(move || builder.run(chunk_rx, spare_tx))
            .map_err(local("starting the pack builder"))?;
        let packer = Packer {
            chunker_params: self.options.chunker,
            known: known
                .into_iter()
                .map(|(id, (pack, location))| (id, Known::At(pack, location)))
                .collect(),
            parent_files,
            packs,
            builder: Some(chunk_tx),
            building: Some(building),
            spare: spare_rx,
            pending: Vec::new(),
            duplicates: Vec::new(),
            entries: Vec::new(),
            members: Vec::new(),
            current: None,
            declared: 0,
            new_chunks: 0,
            new_bytes: 0,
            limits: crate::workspace::ArchiveLimits::default(),
        };
        let packing = tokio::task::spawn_blocking(move || packer.run(source, spent_tx));
        let upload = async {
            let mut up = Uploaded::default();
            while let Some(pack) = pack_rx.recv().await {
                up.packs.push(pack.name.clone());
                let journal = serde_json::to_vec(&serde_json::json!({
                    "snapshot": self.id.as_str(),
                    "generation": number,
                    "packs": up.packs,
                }))
                .unwrap_or_default();
                self.client
                    .upload(&names::journal(self.id.as_str()), &mut &journal[..])
                    .await?;
                up.calls += 1;
                up.bytes += journal.len() as u64;
                let mut file = tokio::fs::File::open(&pack.file)
                    .await
                    .map_err(local("reading a pack file"))?;
                self.client.upload(&pack.name, &mut file).await?;
                up.calls += 1;
                up.bytes += pack.size;
                match &self.options.cache {
                    Some(cache) => {
                        if let Err(e) = cache.admit(pack.file, &pack.name) {
                            tracing::debug!(error = %e, "could not keep a pack in the cache");
                        }
                    }
                    None => drop(pack.file),
                }
            }
            Ok::<Uploaded, StoreError>(up)
        };
        let packed = async {
            packing.await.map_err(|e| StoreError::Local {
                what: "packing chunks",
                source: std::io::Error::other(e.to_string()),
            })?
        };
        let (mut up, packed) = tokio::try_join!(upload, packed)?;
        let walk = packed.walk;
        let (index, counts) = build_index(
            self,
            number,
            parent.as_ref().map(|p| &p.0),
            packed,
            instance,
        )?;
        let changes = match &parent {
            Some((_, p)) => Changes::between(p, &index),
            None => Some(Changes::all_new(&index)),
        };
        let index_id = names::index(self.id.as_str(), number);
        let bytes = index.encode();
        self.client.upload(&index_id, &mut &bytes[..]).await?;
        // Committed.
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
        if !up.packs.is_empty() {
            if let Err(e) = self.client.delete(&names::journal(self.id.as_str())).await {
                if !is_not_found(&e) {
                    tracing::warn!(error = %e, "removing the stop's journal failed; garbage collection removes it");
                }
            }
        }
        if let Err(e) = self.collect_garbage(false).await {
            tracing::warn!(snapshot = %self.id, error = %e,
                "collecting dropped generations failed; the next stop or garbage collection retries");
        }
        if let Some(cache) = &self.options.cache {
            cache.trim();
        }
        Ok(())
    }
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
) -> Result<(Index, Counts), StoreError> {
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
    };
    index.header.tar_size = index
        .rendered_size()
        .map_err(local("rendering the workspace's headers"))?;
    index.header.tar_digest = index.tree_seal();
    Ok((index, counts))
}
