//! A restore: index → packs (three in flight, or from the cache), each
//! checked against its name → chunks in tar order, each checked against
//! its id → the sink; the tar's BLAKE3 is checked against the index at the
//! end (and by the sandbox against its state before extraction).

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::cache::hash_file;
use super::format::{decode_chunk_with, names, Index, Segment, MAX_PACK_BYTES};
use super::format_error::{damaged, FormatError};
use super::record::Generation;
use super::{is_not_found, DedupSnapshot};
use crate::capped_writer::CappedWriter;
use crate::store_error::StoreError;

/// Pack downloads in flight during a restore.
const PACKS_IN_FLIGHT: usize = 3;

/// The decoding stage: every chunk of the index, in order, read from its
/// pack as the packs arrive, checked against its id and sent on; returns
/// the tar's digest. A chunk that fails its check in a cached pack removes
/// that pack from the cache (a retry downloads it).
// Kept as one function: one loop over the index's chunks while packs arrive;
// the current pack, cache hits and the tar digest live across iterations.
fn decode_all(
    index: &Index,
    mut packs: mpsc::Receiver<(u32, LocalPack)>,
    out: mpsc::Sender<Vec<u8>>,
    mut spent: mpsc::Receiver<Vec<u8>>,
) -> Result<String, StoreError> {
    let mut ready: HashMap<u32, (std::fs::File, LocalPack)> = HashMap::new();
    // Version 1 is sealed by the tar's BLAKE3; version 2 by its members
    // and chunk ids (checked when the index was read), and every chunk is
    // checked against its id here.
    let v1 = index.header.version < 2;
    let mut tar = blake3::Hasher::new();
    let mut stored = Vec::new();
    let mut raw = Vec::new();
    let mut decompressor = zstd::bulk::Decompressor::new().map_err(|source| StoreError::Local {
        what: "starting the decompressor",
        source,
    })?;
    // Output goes in batches of about 1 MiB: small files make small
    // pieces, and each send and write costs more than its bytes. The
    // batches are a fixed set of [`OUT_BUFFERS`], handed back by the
    // writer: a buffer allocated on this thread and freed on another, over
    // and over, grows the allocator's arenas with the archive.
    let mut handed_out = 1;
    let mut batch = Vec::with_capacity(OUT_BATCH + (1 << 20));
    let mut flush = |batch: &mut Vec<u8>, force: bool| -> bool {
        if batch.is_empty() || (!force && batch.len() < OUT_BATCH) {
            return true;
        }
        let next = if handed_out < OUT_BUFFERS {
            handed_out += 1;
            Some(Vec::with_capacity(OUT_BATCH + (1 << 20)))
        } else {
            spent.blocking_recv()
        };
        let Some(mut next) = next else {
            return false; // the writer stopped
        };
        next.clear();
        out.blocking_send(std::mem::replace(batch, next)).is_ok()
    };
    for segment in index.segments() {
        let entry = match segment.map_err(|source| StoreError::Local {
            what: "rendering the workspace's headers",
            source,
        })? {
            Segment::Inline(bytes) => {
                if v1 {
                    tar.update(&bytes);
                }
                batch.extend_from_slice(&bytes);
                if !flush(&mut batch, false) {
                    return Ok(String::new());
                }
                continue;
            }
            Segment::Chunk(entry) => entry,
        };
        while !ready.contains_key(&entry.pack) {
            let Some((n, pack)) = packs.blocking_recv() else {
                // The fetcher stopped; its error says why.
                return Ok(String::new());
            };
            let file = std::fs::File::open(&pack.path).map_err(|source| StoreError::Local {
                what: "opening a downloaded pack",
                source,
            })?;
            ready.insert(n, (file, pack));
        }
        let Some((file, pack)) = ready.get(&entry.pack) else {
            continue;
        };
        let pack_name = &index.header.packs[entry.pack as usize];
        let pack_damaged = |source| {
            if pack.cached {
                tracing::warn!(pack = %pack_name, "a cached pack is damaged; removed it from the cache");
                let _ = std::fs::remove_file(&pack.path);
            }
            damaged(pack_name.clone(), source)
        };
        stored.resize(entry.location.stored_len as usize, 0);
        file.read_exact_at(&mut stored, entry.location.offset)
            .map_err(|_| {
                pack_damaged(FormatError::Malformed {
                    kind: "pack",
                    why: "a chunk the index names lies past its end".into(),
                })
            })?;
        decode_chunk_with(
            &mut decompressor,
            &entry.chunk,
            &entry.location,
            &stored,
            &mut raw,
        )
        .map_err(pack_damaged)?;
        if v1 {
            tar.update(&raw);
        }
        batch.extend_from_slice(&raw);
        if !flush(&mut batch, false) {
            // The writer stopped; its error says why.
            return Ok(String::new());
        }
    }
    if !flush(&mut batch, true) {
        return Ok(String::new());
    }
    if v1 {
        Ok(format!("blake3:{}", tar.finalize().to_hex()))
    } else {
        Ok(index.tree_seal())
    }
}

/// Bytes of tar handed to the writer at a time.
const OUT_BATCH: usize = 1 << 20;
/// Output buffers a restore uses, in all.
const OUT_BUFFERS: usize = 4;

/// A pack on local disk for the length of a restore.
pub(super) struct LocalPack {
    pub(super) path: PathBuf,
    /// It came from the cache (checked by size and trailer only; its
    /// chunks are checked as they are read).
    pub(super) cached: bool,
    /// Removed when the restore ends, unless the pack went to the cache.
    _temp: Option<tempfile::TempPath>,
}

impl DedupSnapshot {
    /// The generation a restore reads: after an interrupted stop, the one
    /// it committed if it got that far; else the current one or the fork
    /// base; `None` before the first deduplicated stop.
    pub(super) async fn restore_target(&self) -> Result<Option<Generation>, StoreError> {
        let record = self.record();
        if self.interrupted {
            let number = record.next_number();
            let index = names::index(self.id.as_str(), number);
            if self.client.exists(&index).await? {
                let committed = self.index(&index).await?;
                let g = Generation::bare(
                    number,
                    index,
                    committed.header.tar_digest.clone(),
                    committed.header.tar_size,
                );
                tracing::warn!(snapshot = %self.id, generation = number,
                    "an interrupted stop committed a newer generation; restoring it");
                self.update_record(|r| {
                    r.generations.push(g.clone());
                    r.current = Some(number);
                    r.drop_beyond_keep();
                });
                return Ok(Some(g));
            }
        }
        Ok(record.head().cloned())
    }

    pub(super) async fn restore_generation(
        &self,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<(), StoreError> {
        let Some(generation) = self.restore_target().await? else {
            return self.client.download(self.id.as_str(), sink).await;
        };
        let index = self.index(&generation.index).await?;
        let format_error = |source| damaged(generation.index.clone(), source);
        if index.header.tar_digest != generation.digest || index.header.tar_size != generation.size
        {
            return Err(format_error(FormatError::Archive(format!(
                "the state records {} ({} bytes), the index {} ({} bytes)",
                generation.digest, generation.size, index.header.tar_digest, index.header.tar_size
            ))));
        }
        // Three stages at once: packs are fetched (a few in flight), chunks
        // decoded and checked on a blocking thread, and written out here.
        let wanted: Vec<(u32, String)> = index
            .packs_in_use()
            .into_iter()
            .map(|p| (p, index.header.packs[p as usize].clone()))
            .collect();
        let (pack_tx, pack_rx) = mpsc::channel::<(u32, LocalPack)>(PACKS_IN_FLIGHT);
        let (raw_tx, mut raw_rx) = mpsc::channel::<Vec<u8>>(OUT_BUFFERS);
        // Written buffers go back to the decoder: allocating on one thread
        // and freeing on another grows the allocator's arenas with the
        // archive (measured: 66 MiB peak at 4 GiB without this).
        let (spent_tx, spent_rx) = mpsc::channel::<Vec<u8>>(OUT_BUFFERS);
        let fetch = async move {
            let mut fetches = futures::stream::iter(
                wanted
                    .into_iter()
                    .map(|(p, name)| async move { self.fetch_pack(&name).await.map(|l| (p, l)) }),
            )
            .buffered(PACKS_IN_FLIGHT);
            while let Some(fetched) = fetches.next().await {
                if pack_tx.send(fetched?).await.is_err() {
                    break; // the decoder stopped; its error says why
                }
            }
            Ok::<(), StoreError>(())
        };
        let decoding = {
            let index = index.clone();
            tokio::task::spawn_blocking(move || decode_all(&index, pack_rx, raw_tx, spent_rx))
        };
        let decode = async {
            decoding.await.map_err(|e| StoreError::Local {
                what: "decoding chunks",
                source: std::io::Error::other(e.to_string()),
            })?
        };
        let write = async {
            while let Some(raw) = raw_rx.recv().await {
                sink.write_all(&raw).await.map_err(StoreError::Sink)?;
                // Room for every buffer: this never waits.
                let _ = spent_tx.try_send(raw);
            }
            Ok::<(), StoreError>(())
        };
        let ((), digest, ()) = tokio::try_join!(fetch, decode, write)?;
        if digest != index.header.tar_digest {
            return Err(format_error(FormatError::Archive(format!(
                "reassembled {digest}, the index says {}",
                index.header.tar_digest
            ))));
        }
        sink.flush().await.map_err(StoreError::Sink)?;
        self.update_record(|r| {
            if r.find(generation.number).is_some() && r.base.as_ref() != Some(&generation) {
                r.current = Some(generation.number);
            }
        });
        if let Some(cache) = &self.options.cache {
            cache.trim();
        }
        Ok(())
    }

    /// A pack on local disk, checked against its name: from the cache, or
    /// downloaded (at most [`MAX_PACK_BYTES`]).
    pub(super) async fn fetch_pack(&self, name: &str) -> Result<LocalPack, StoreError> {
        let Some((_, expected)) = names::parse_pack(name) else {
            return Err(damaged(
                name.to_string(),
                FormatError::Malformed {
                    kind: "pack",
                    why: "not a pack name".into(),
                },
            ));
        };
        if let Some(cache) = self.options.cache.clone() {
            let lookup = name.to_string();
            if let Ok(Some(path)) = tokio::task::spawn_blocking(move || cache.lookup(&lookup)).await
            {
                return Ok(LocalPack {
                    path,
                    cached: true,
                    _temp: None,
                });
            }
        }
        let spool = self.spool_dir()?;
        let (file, temp) = tempfile::Builder::new()
            .prefix(".berth-pack-")
            .tempfile_in(&spool)
            .map_err(|source| StoreError::Local {
                what: "creating a file for a downloaded pack",
                source,
            })?
            .into_parts();
        let mut sink = CappedWriter::new(tokio::fs::File::from_std(file), MAX_PACK_BYTES);
        let downloaded = self.client.download(name, &mut sink).await;
        if sink.overran() {
            return Err(damaged(
                name.to_string(),
                FormatError::Malformed {
                    kind: "pack",
                    why: format!("it is larger than the {MAX_PACK_BYTES} bytes a pack may be"),
                },
            ));
        }
        downloaded.map_err(|e| {
            if is_not_found(&e) {
                damaged(name.to_string(), FormatError::Missing)
            } else {
                e
            }
        })?;
        sink.flush().await.map_err(StoreError::Sink)?;
        let path: PathBuf = temp.to_path_buf();
        let actual = tokio::task::spawn_blocking(move || hash_file(&path))
            .await
            .map_err(|e| StoreError::Local {
                what: "checking a downloaded pack",
                source: std::io::Error::other(e.to_string()),
            })?
            .map_err(|source| StoreError::Local {
                what: "checking a downloaded pack",
                source,
            })?;
        if actual.to_hex().as_str() != expected {
            return Err(damaged(
                name.to_string(),
                FormatError::Checksum {
                    expected: expected.to_string(),
                    actual: actual.to_hex().to_string(),
                },
            ));
        }
        match &self.options.cache {
            Some(cache) => match cache.admit(temp, name) {
                Ok(path) => Ok(LocalPack {
                    path,
                    cached: false,
                    _temp: None,
                }),
                Err(e) => Err(StoreError::Local {
                    what: "keeping a downloaded pack",
                    source: e,
                }),
            },
            None => Ok(LocalPack {
                path: temp.to_path_buf(),
                cached: false,
                _temp: Some(temp),
            }),
        }
    }
}
