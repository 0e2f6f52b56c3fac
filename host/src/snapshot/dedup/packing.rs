//! The packing half of a stop: a blocking thread cuts each file into
//! content-defined chunks and hashes them (files the files cache matched
//! keep their parent's chunks unread), and a second thread compresses the
//! new chunks into packs, handed back one by one for upload.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::chunker::{Chunker, ChunkerParams};
use super::format::{ChunkId, ChunkLocation, Codec, Index, IndexEntry, Member};
pub(super) use super::pack_builder::{local, FinishedPack};
use super::pack_builder::{Built, PackBuilder};
use crate::store_error::StoreError;
use crate::workspace::tree::{self, EntryKind, TreeItem, WalkStats};

/// New chunks queued for the pack builder (and buffers it hands back).
const CHUNKS_QUEUED: usize = 4;

/// Walk items handed from the walk's thread to the packer at a time (a
/// piece of a file's content goes at once, so memory stays bounded).
const WALK_BATCH: usize = 256;

/// What packing starts from: the parent's (and a fork base's) chunks and
/// files, and how to build packs.
pub(super) struct Inputs {
    /// The snapshot's tag (pack names carry it).
    pub(super) tag: String,
    /// The zstd level of chunks.
    pub(super) zstd_level: i32,
    /// Where packs are built before upload.
    pub(super) spool: PathBuf,
    pub(super) chunker_params: ChunkerParams,
    /// Chunks already stored: where (`Known::At`, a pack by its number in
    /// `packs`).
    pub(super) known: HashMap<ChunkId, Known>,
    /// The parent generation, whose files a walk may reuse (the files
    /// cache); its pack numbers are the first of `packs`.
    pub(super) parent: Option<Arc<Index>>,
    /// The parent's (and base's) pack names.
    pub(super) packs: Vec<String>,
}

/// The packer's thread: what it made of the tree, once the source ended.
pub(super) type PackingTask = tokio::task::JoinHandle<Result<Packed, StoreError>>;

/// Starts packing `source`: the finished packs arrive on the returned
/// receiver as they are built (one may wait while the next is built); the
/// handle gives what the packer made of the tree once the source ended.
pub(super) fn start(
    inputs: Inputs,
    source: TreeSource,
    spent: mpsc::Sender<Vec<u8>>,
) -> Result<(PackingTask, mpsc::Receiver<FinishedPack>), StoreError> {
    let (pack_tx, pack_rx) = mpsc::channel::<FinishedPack>(1);
    // Chunks are up to 1 MiB each: the queue and the buffers handed back
    // are what a stop's memory grows with, so both stay short.
    let (chunk_tx, chunk_rx) = std::sync::mpsc::sync_channel::<(ChunkId, Vec<u8>)>(CHUNKS_QUEUED);
    let (spare_tx, spare_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(CHUNKS_QUEUED);
    let builder = PackBuilder::new(inputs.tag, inputs.zstd_level, inputs.spool, pack_tx)?;
    let building = std::thread::Builder::new()
        .name("berth-packs".into())
        .spawn(move || builder.run(chunk_rx, spare_tx))
        .map_err(local("starting the pack builder"))?;
    let packer = Packer {
        chunker_params: inputs.chunker_params,
        known: inputs.known,
        parent: inputs.parent.map(|index| ParentFiles {
            index,
            next: 0,
            by_path: None,
        }),
        packs: inputs.packs,
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
    let packing = tokio::task::spawn_blocking(move || packer.run(source, spent));
    Ok((packing, pack_rx))
}

/// Where a stop's entries come from.
pub(crate) enum TreeSource {
    /// A tar stream, in pieces (a backend without a walk).
    Tar(mpsc::Receiver<Vec<u8>>),
    /// A walk: runs on its own thread and hands items on.
    Walk(crate::backend::TreeWalk),
}

/// What the packer made of the tree.
pub(super) struct Packed {
    pub(super) entries: Vec<IndexEntry>,
    pub(super) members: Vec<Member>,
    /// Pack names by the number entries use: the parent's, then new ones.
    pub(super) packs: Vec<String>,
    pub(super) new_chunks: u64,
    pub(super) new_bytes: u64,
    pub(super) walk: WalkStats,
}

/// The parent generation's files, found by path as a walk reuses them. A
/// walk visits the workspace in the order the parent's walk recorded it,
/// so each is found at or after the last one found (no map to build on
/// the way to a checkpoint); a path out of that order builds the map.
struct ParentFiles {
    index: Arc<Index>,
    /// Where the next file is looked for first.
    next: usize,
    /// Every member by path, built on the first path found out of order.
    by_path: Option<HashMap<Vec<u8>, usize>>,
}

impl ParentFiles {
    /// The chunks of the parent's file at `path`: only a file the parent
    /// recorded with an identity (a stamp the files cache compared) can be
    /// reused; any other member at that path is none.
    fn run(&mut self, path: &[u8]) -> Option<&[IndexEntry]> {
        let members = &self.index.members;
        let found = match members[self.next.min(members.len())..]
            .iter()
            .take(ORDERED_LOOKAHEAD)
            .position(|m| m.entry.path == path)
        {
            Some(ahead) => Some(self.next + ahead),
            None => self
                .by_path
                .get_or_insert_with(|| {
                    members
                        .iter()
                        .enumerate()
                        .map(|(n, m)| (m.entry.path.clone(), n))
                        .collect()
                })
                .get(path)
                .copied(),
        }?;
        self.next = found + 1;
        let member = &members[found];
        member
            .entry
            .stamp()
            .is_some()
            .then(|| self.index.run(member))
    }
}

/// Parent members passed over looking for a path in walk order before the
/// map is built instead (files removed since the parent are passed over).
const ORDERED_LOOKAHEAD: usize = 4096;

/// The blocking half: cuts and hashes chunks, and hands new ones to the
/// pack builder's thread.
struct Packer {
    chunker_params: ChunkerParams,
    known: HashMap<ChunkId, Known>,
    parent: Option<ParentFiles>,
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
                // Entries go in batches: one hand-over per entry cost a
                // thread wake-up each (most of a no-change stop's time).
                let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<TreeItem>>(4);
                let walker = std::thread::Builder::new()
                    .name("berth-walk".into())
                    .spawn(move || {
                        let stopped = || {
                            std::io::Error::new(
                                std::io::ErrorKind::BrokenPipe,
                                "the packer stopped",
                            )
                        };
                        let mut batch = Vec::with_capacity(WALK_BATCH);
                        let walked = walk(&mut |item| {
                            let data = matches!(item, TreeItem::Data(_));
                            batch.push(item);
                            if data || batch.len() >= WALK_BATCH {
                                let full =
                                    std::mem::replace(&mut batch, Vec::with_capacity(WALK_BATCH));
                                tx.send(full).map_err(|_| stopped())?;
                            }
                            Ok(())
                        });
                        if walked.is_ok() && !batch.is_empty() {
                            tx.send(batch).map_err(|_| stopped())?;
                        }
                        walked
                    })
                    .map_err(local("starting the workspace walk"))?;
                let mut failed = None;
                'batches: for batch in rx {
                    for item in batch {
                        if let Err(e) = self.item(item) {
                            failed = Some(e);
                            break 'batches;
                        }
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
                    let run = self
                        .parent
                        .as_mut()
                        .and_then(|p| p.run(&entry.path))
                        .ok_or_else(|| {
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
pub(super) enum Known {
    /// In a pack (a parent's, by the packer's number).
    At(u32, ChunkLocation),
    /// New in this stop: the entry that first had it (its place comes
    /// from the pack builder at the end).
    Pending(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parent's files are found whatever order they are asked in: in
    /// walk order with removed files passed over (no map built), out of
    /// order (the map); a path the parent lacks, a file it recorded without
    /// an identity and the root (a directory) are none.
    #[test]
    fn a_parents_files_are_found_in_walk_order_and_out_of_it() {
        let seed = crate::test_rng::seed(0xF11E5);
        let mut index = super::super::format::tests::generated(seed, 9_000);
        for (n, m) in index.members.iter_mut().enumerate().skip(1) {
            m.entry.identity = Some(crate::workspace::tree::FileIdentity {
                dev: 1,
                ino: n as u64,
                ctime: m.entry.mtime,
            });
        }
        let unidentified = index.members.len() / 2;
        index.members[unidentified].entry.identity = None;
        let unidentified_path = index.members[unidentified].entry.path.clone();
        let index = Arc::new(index);
        let mut next = crate::test_rng::xorshift(seed);
        let run_of = |n: usize| index.run(&index.members[n]).to_vec();
        let mut files = ParentFiles {
            index: index.clone(),
            next: 0,
            by_path: None,
        };
        for n in 1..index.members.len() {
            if n == unidentified || next().is_multiple_of(3) {
                continue; // removed since the parent
            }
            let path = index.members[n].entry.path.clone();
            assert_eq!(files.run(&path).map(<[_]>::to_vec), Some(run_of(n)));
        }
        assert!(files.by_path.is_none(), "walk order built the map");
        for _ in 0..500 {
            let n = 1 + (next() as usize) % (index.members.len() - 1);
            if n == unidentified {
                continue;
            }
            let path = index.members[n].entry.path.clone();
            assert_eq!(files.run(&path).map(<[_]>::to_vec), Some(run_of(n)));
        }
        assert_eq!(files.run(b"not/in/the/parent").map(<[_]>::to_vec), None);
        assert_eq!(files.run(&unidentified_path).map(<[_]>::to_vec), None);
        let root = index.members[0].entry.path.clone();
        assert_eq!(files.run(&root).map(<[_]>::to_vec), None);
    }
}
