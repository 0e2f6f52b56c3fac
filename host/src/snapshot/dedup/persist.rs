//! A stop: tar → chunker → new chunks into packs → journal, packs → index
//! (the commit) → record → collection of what the new generation dropped.
//!
//! Three parts run at once: the tar is read on the async side, chunked,
//! hashed, compressed and packed on a blocking thread, and finished packs
//! are uploaded on the async side while the next one is being built.

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::chunker::{Chunker, ChunkerParams};
use super::format::{
    names, ChunkId, ChunkLocation, Codec, Index, IndexEntry, IndexHeader, PackWriter,
    FORMAT_VERSION, PACK_TARGET_BYTES,
};
use super::record::{Generation, StopStats};
use super::{is_not_found, DedupSnapshot};
use crate::store_error::StoreError;

/// Bytes read from the tar at a time.
const READ_PIECE: usize = 256 * 1024;

/// A pack ready to upload.
struct FinishedPack {
    name: String,
    file: tempfile::TempPath,
    size: u64,
}

/// What the packer made of the tar.
struct Packed {
    entries: Vec<IndexEntry>,
    /// Pack names by the number entries use: the parent's, then new ones.
    packs: Vec<String>,
    tar_size: u64,
    tar_digest: String,
    chunks: u64,
    new_chunks: u64,
    new_bytes: u64,
}

/// The blocking half: chunks, hashes, compresses and packs.
struct Packer {
    tag: String,
    chunker_params: ChunkerParams,
    compressor: zstd::bulk::Compressor<'static>,
    known: HashMap<ChunkId, (u32, ChunkLocation)>,
    packs: Vec<String>,
    open: Option<(PackWriter<BufWriter<std::fs::File>>, tempfile::TempPath)>,
    spool: PathBuf,
    entries: Vec<IndexEntry>,
    tar_size: u64,
    new_chunks: u64,
    new_bytes: u64,
    done: mpsc::Sender<FinishedPack>,
}

fn local(what: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Local { what, source }
}

impl Packer {
    fn run(
        mut self,
        mut input: mpsc::Receiver<Vec<u8>>,
        spent: mpsc::Sender<Vec<u8>>,
    ) -> Result<Packed, StoreError> {
        let mut chunker = Chunker::new(self.chunker_params);
        while let Some(piece) = input.blocking_recv() {
            self.tar_size += piece.len() as u64;
            chunker.push(&piece, &mut |c| self.chunk(c))?;
            // Back to the reader for reuse (see `persist_generation`).
            let _ = spent.try_send(piece);
        }
        chunker.finish(&mut |c| self.chunk(c))?;
        self.close_pack()?;
        Ok(Packed {
            chunks: self.entries.len() as u64,
            entries: self.entries,
            packs: self.packs,
            tar_size: self.tar_size,
            tar_digest: String::new(),
            new_chunks: self.new_chunks,
            new_bytes: self.new_bytes,
        })
    }

    fn chunk(&mut self, raw: &[u8]) -> Result<(), StoreError> {
        let id = *blake3::hash(raw).as_bytes();
        if let Some((pack, location)) = self.known.get(&id) {
            self.entries.push(IndexEntry {
                chunk: id,
                pack: *pack,
                location: *location,
            });
            return Ok(());
        }
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
        self.known.insert(id, (pack, location));
        self.entries.push(IndexEntry {
            chunk: id,
            pack,
            location,
        });
        self.new_chunks += 1;
        self.new_bytes += raw.len() as u64;
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

    pub(super) async fn persist_generation(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let parent = self.parent().await;
        let mut known = HashMap::new();
        let mut packs: Vec<String> = Vec::new();
        let mut learn = |index: &Index| {
            let offset = packs.len() as u32;
            packs.extend(index.header.packs.iter().cloned());
            for e in &index.entries {
                known
                    .entry(e.chunk)
                    .or_insert((e.pack + offset, e.location));
            }
        };
        if let Some((_, index)) = &parent {
            learn(index);
        }
        // A fork also deduplicates against its base, whatever its own
        // generations dropped since.
        let base = self.record().base.clone();
        if let Some(base) = base.filter(|b| parent.as_ref().is_none_or(|(p, _)| p.index != b.index))
        {
            match self.index(&base.index).await {
                Ok(index) => learn(&index),
                Err(e) => tracing::warn!(index = %base.index, error = %e,
                    "the fork's base index is unusable; not deduplicating against it"),
            }
        }
        let number = self.record().next_number();
        let spool = self.spool_dir()?;
        let (piece_tx, piece_rx) = mpsc::channel::<Vec<u8>>(2);
        // Read buffers go back to the reader: allocating on one thread and
        // freeing on another grows the allocator's arenas with the archive.
        let (spent_tx, mut spent_rx) = mpsc::channel::<Vec<u8>>(4);
        let (pack_tx, mut pack_rx) = mpsc::channel::<FinishedPack>(1);
        let packer = Packer {
            tag: self.tag.clone(),
            chunker_params: self.options.chunker,
            compressor: zstd::bulk::Compressor::new(self.options.zstd_level)
                .map_err(local("starting the compressor"))?,
            known,
            packs,
            open: None,
            spool,
            entries: Vec::new(),
            tar_size: 0,
            new_chunks: 0,
            new_bytes: 0,
            done: pack_tx,
        };
        let packing = tokio::task::spawn_blocking(move || packer.run(piece_rx, spent_tx));

        // The tar's digest is taken here, in parallel with the packer's
        // chunking and hashing.
        let read = async move {
            let mut tar = blake3::Hasher::new();
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
                if n == 0 {
                    return Ok::<String, StoreError>(format!("blake3:{}", tar.finalize().to_hex()));
                }
                tar.update(&piece);
                if piece_tx.send(piece).await.is_err() {
                    // The packer stopped; its error says why.
                    return Ok(String::new());
                }
            }
        };
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
        let (tar_digest, mut up, mut packed) = tokio::try_join!(read, upload, packed)?;
        packed.tar_digest = tar_digest;

        let index = build_index(self, number, parent.as_ref().map(|p| &p.0), packed);
        let index_id = names::index(self.id.as_str(), number);
        let bytes = index.0.encode();
        self.client.upload(&index_id, &mut &bytes[..]).await?;
        // Committed.
        up.calls += 1;
        up.bytes += bytes.len() as u64;
        let generation = Generation {
            number,
            index: index_id.clone(),
            digest: index.0.header.tar_digest.clone(),
            size: index.0.header.tar_size,
        };
        self.remember(&index_id, Arc::new(index.0));
        let stats = StopStats {
            generation: number,
            tar_bytes: generation.size,
            new_bytes: index.1.new_bytes,
            uploaded_bytes: up.bytes,
            upload_calls: up.calls,
            chunks: index.1.chunks,
            new_chunks: index.1.new_chunks,
            packs: up.packs.len() as u64,
            dedup_ratio: String::new(),
        }
        .finish();
        tracing::info!(snapshot = %self.id, generation = number, uploaded = up.bytes,
            calls = up.calls, ratio = %stats.dedup_ratio, "deduplicated stop committed");
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
    (
        Index {
            header: IndexHeader {
                version: FORMAT_VERSION,
                snapshot: snapshot.id.to_string(),
                generation: number,
                chunker: snapshot.options.chunker,
                parent: parent.map(|g| g.index.clone()),
                tar_size: packed.tar_size,
                tar_digest: packed.tar_digest,
                packs,
                created,
            },
            entries,
        },
        Counts {
            chunks: packed.chunks,
            new_chunks: packed.new_chunks,
            new_bytes: packed.new_bytes,
        },
    )
}
