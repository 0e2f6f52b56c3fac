//! Version 3's blocks of members, in tree packs: a stop stores the blocks
//! its parent does not hold (or, once the parent's blocks are spread over
//! more than [`MAX_TREE_PACKS`] packs, every block, so reading an index
//! never needs more than that many packs besides its own); reading an
//! index fetches its tree packs (the pack cache first) and checks every
//! block against its id before the members are trusted.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::format::{decode_chunk_with, for_each_block, BlockRef, ChunkId, ChunkLocation, Index};
use super::format_error::{damaged, FormatError};
use super::pack_builder::PackBuilder;
use super::pack_builder::{local, FinishedPack};
use super::persist::Uploaded;
use super::restore::LocalPack;
use super::DedupSnapshot;
use crate::store_error::StoreError;

/// The most tree packs a stop reuses blocks from; beyond it, the stop
/// writes every block again (compaction).
pub(super) const MAX_TREE_PACKS: usize = 8;

/// A block of the new index as the first encoding found it: where the
/// parent holds it, or its bytes.
type Found<'a> = Result<(&'a str, ChunkLocation), Vec<u8>>;

/// Where a block of the new index is: reused from a pack the parent
/// lists, or new in the `n`th pack this stop builds.
enum Place {
    Listed(String),
    New(u32),
}

impl DedupSnapshot {
    /// Stores `index`'s blocks (the new ones in tree packs, uploaded with
    /// `held`, the packer's last pack, under one journal) and records
    /// where each is in the index: its `blocks`, and the tree packs in its
    /// `packs`.
    pub(super) async fn store_blocks(
        &self,
        number: u64,
        index: Index,
        parent: Option<Arc<Index>>,
        mut up: Uploaded,
        held: Option<FinishedPack>,
    ) -> Result<(Index, Uploaded), StoreError> {
        let (pack_tx, pack_rx) = mpsc::channel::<FinishedPack>(1);
        let builder = PackBuilder::new(
            self.tag.clone(),
            self.options.zstd_level,
            self.spool_dir()?,
            pack_tx,
        )?;
        let placing = tokio::task::spawn_blocking(move || {
            let mut index = index;
            place_blocks(&mut index, parent.as_deref(), builder).map(|()| index)
        });
        let placed = async {
            placing.await.map_err(|e| StoreError::Local {
                what: "storing the index's blocks",
                source: std::io::Error::other(e.to_string()),
            })?
        };
        let collect = async {
            let mut packs: Vec<FinishedPack> = held.into_iter().collect();
            let mut pack_rx = pack_rx;
            while let Some(pack) = pack_rx.recv().await {
                packs.push(pack);
            }
            Ok::<_, StoreError>(packs)
        };
        let started = std::time::Instant::now();
        let (packs, index) = tokio::try_join!(collect, placed)?;
        let placed_in = started.elapsed();
        self.upload_journaled(number, packs, &mut up).await?;
        tracing::debug!(
            placed_ms = placed_in.as_secs_f64() * 1e3,
            uploaded_ms = (started.elapsed() - placed_in).as_secs_f64() * 1e3,
            "the index's blocks placed, the stop's packs uploaded"
        );
        Ok((index, up))
    }

    /// Reads a version-3 outline's blocks from its tree packs; any other
    /// index is returned as it is.
    pub(super) async fn complete_index(
        &self,
        object: &str,
        mut index: Index,
    ) -> Result<Index, StoreError> {
        if index.header.version < 3 {
            return Ok(index);
        }
        let mut packs: HashMap<u32, LocalPack> = HashMap::new();
        for block in &index.blocks {
            if let std::collections::hash_map::Entry::Vacant(slot) = packs.entry(block.pack) {
                let name = &index.header.packs[block.pack as usize];
                slot.insert(self.fetch_pack(name).await?);
            }
        }
        let object = object.to_string();
        tokio::task::spawn_blocking(move || {
            let mut decompressor =
                zstd::bulk::Decompressor::new().map_err(local("starting the decompressor"))?;
            let mut files = HashMap::new();
            for (n, pack) in &packs {
                let file = std::fs::File::open(&pack.path).map_err(local("opening a tree pack"))?;
                files.insert(*n, file);
            }
            let names = index.header.packs.clone();
            let read = index.complete(|block| {
                let pack_name = &names[block.pack as usize];
                let mut stored = vec![0u8; block.location.stored_len as usize];
                let in_pack = files
                    .get(&block.pack)
                    .map(|f| f.read_exact_at(&mut stored, block.location.offset));
                if !matches!(in_pack, Some(Ok(()))) {
                    return Err(FormatError::Malformed {
                        kind: "pack",
                        why: format!("{pack_name} ends before a block of members it should hold"),
                    });
                }
                let mut raw = Vec::new();
                decode_chunk_with(
                    &mut decompressor,
                    &block.id,
                    &block.location,
                    &stored,
                    &mut raw,
                )
                .inspect_err(|_| {
                    if let Some(p) = packs.get(&block.pack).filter(|p| p.cached) {
                        tracing::warn!(pack = %pack_name, "a cached tree pack is damaged; removed it from the cache");
                        let _ = std::fs::remove_file(&p.path);
                    }
                })?;
                Ok(raw)
            });
            read.map_err(|source| damaged(object, source))?;
            Ok(index)
        })
        .await
        .map_err(|e| StoreError::Local {
            what: "reading the index's blocks",
            source: std::io::Error::other(e.to_string()),
        })?
    }
}

/// Cuts `index`'s members into blocks; reuses the parent's copy of each
/// block it has (unless its blocks are spread over too many packs), packs
/// the rest with `builder`, and sets `index.blocks` and the tree packs in
/// `index.header.packs`.
fn place_blocks(
    index: &mut Index,
    parent: Option<&Index>,
    mut builder: PackBuilder,
) -> Result<(), StoreError> {
    let held: HashMap<ChunkId, (&str, ChunkLocation)> = parent
        .map(|p| {
            p.blocks
                .iter()
                .map(|b| (b.id, (p.header.packs[b.pack as usize].as_str(), b.location)))
                .collect()
        })
        .unwrap_or_default();
    // One encoding of the blocks: every block's id, and where the parent
    // holds it or, for a new one, its bytes.
    let mut blocks: Vec<(ChunkId, u32, Found<'_>)> = Vec::new();
    for_each_block::<()>(index, |raw, members| {
        let id = *blake3::hash(raw).as_bytes();
        let found = held.get(&id).copied().ok_or_else(|| raw.to_vec());
        blocks.push((id, members, found));
        Ok(())
    })
    .ok();
    let spread: HashSet<&str> = blocks
        .iter()
        .filter_map(|(_, _, found)| found.as_ref().ok().map(|(pack, _)| *pack))
        .collect();
    let block_ref = |id, members, location| BlockRef {
        id,
        pack: 0,
        location,
        members,
    };
    let mut placed: Vec<(Place, BlockRef)> = Vec::with_capacity(blocks.len());
    if spread.len() <= MAX_TREE_PACKS {
        for (id, members, found) in blocks {
            let (place, location) = match found {
                Ok((pack, location)) => (Place::Listed(pack.to_string()), location),
                Err(raw) => {
                    let (n, location) = builder.add(id, &raw)?;
                    (Place::New(n), location)
                }
            };
            placed.push((place, block_ref(id, members, location)));
        }
    } else {
        // Compaction: every block into new tree packs, encoded again (only
        // the new ones' bytes were kept).
        let mut ids = blocks.into_iter().map(|(id, _, _)| id);
        for_each_block(index, |raw, members| {
            let id = ids.next().unwrap_or_else(|| *blake3::hash(raw).as_bytes());
            let (n, location) = builder.add(id, raw)?;
            placed.push((Place::New(n), block_ref(id, members, location)));
            Ok::<(), StoreError>(())
        })?;
    }
    let built = builder.finish()?;
    let mut numbers: HashMap<String, u32> = index
        .header
        .packs
        .iter()
        .enumerate()
        .map(|(n, p)| (p.clone(), n as u32))
        .collect();
    let mut number_of = |name: &str, packs: &mut Vec<String>| {
        *numbers.entry(name.to_string()).or_insert_with(|| {
            packs.push(name.to_string());
            (packs.len() - 1) as u32
        })
    };
    index.blocks = placed
        .into_iter()
        .map(|(place, mut block)| {
            let name = match &place {
                Place::Listed(name) => name.as_str(),
                Place::New(n) => built.packs[*n as usize].as_str(),
            };
            block.pack = number_of(name, &mut index.header.packs);
            block
        })
        .collect();
    Ok(())
}
