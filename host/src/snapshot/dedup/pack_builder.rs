//! The pack builder: compresses new chunks (a chunk stays raw when zstd
//! saves less than 1/32 of it) into packs spooled on disk, and hands each
//! finished pack to the uploader. A stop runs one on a thread of its own
//! for the workspace's chunks, and one for its blocks of members.

use std::io::BufWriter;
use std::path::PathBuf;

use tokio::sync::mpsc;

use super::format::{names, ChunkId, ChunkLocation, Codec, PackWriter, PACK_TARGET_BYTES};
use crate::store_error::StoreError;

/// A pack ready to upload.
pub(super) struct FinishedPack {
    pub(super) name: String,
    pub(super) file: tempfile::TempPath,
    pub(super) size: u64,
}

/// A local failure, saying what was being done.
pub(super) fn local(what: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Local { what, source }
}

/// What the pack builder made: the new packs, and each new chunk's
/// place (pack number among the new packs), in the order added.
pub(super) struct Built {
    pub(super) packs: Vec<String>,
    pub(super) locations: Vec<(u32, ChunkLocation)>,
}

/// Builds packs of new chunks, each closed at [`PACK_TARGET_BYTES`].
pub(super) struct PackBuilder {
    tag: String,
    compressor: zstd::bulk::Compressor<'static>,
    open: Option<(PackWriter<BufWriter<std::fs::File>>, tempfile::TempPath)>,
    spool: PathBuf,
    packs: Vec<String>,
    locations: Vec<(u32, ChunkLocation)>,
    done: mpsc::Sender<FinishedPack>,
}

impl PackBuilder {
    /// A builder of packs named with `tag`, compressing at `zstd_level`,
    /// spooling in `spool`, handing finished packs to `done` (from a
    /// blocking thread).
    pub(super) fn new(
        tag: String,
        zstd_level: i32,
        spool: PathBuf,
        done: mpsc::Sender<FinishedPack>,
    ) -> Result<Self, StoreError> {
        Ok(PackBuilder {
            tag,
            compressor: zstd::bulk::Compressor::new(zstd_level)
                .map_err(local("starting the compressor"))?,
            open: None,
            spool,
            packs: Vec::new(),
            locations: Vec::new(),
            done,
        })
    }

    /// Packs every chunk `chunks` sends (handing each buffer back to
    /// `spare`), then closes the last pack.
    pub(super) fn run(
        mut self,
        chunks: std::sync::mpsc::Receiver<(ChunkId, Vec<u8>)>,
        spare: std::sync::mpsc::SyncSender<Vec<u8>>,
    ) -> Result<Built, StoreError> {
        for (id, raw) in chunks {
            self.add(id, &raw)?;
            let _ = spare.try_send(raw);
        }
        self.finish()
    }

    /// Closes the open pack; what was built.
    pub(super) fn finish(mut self) -> Result<Built, StoreError> {
        self.close_pack()?;
        Ok(Built {
            packs: self.packs,
            locations: self.locations,
        })
    }

    /// Adds one chunk; returns its place (the pack's number among this
    /// builder's packs).
    pub(super) fn add(
        &mut self,
        id: ChunkId,
        raw: &[u8],
    ) -> Result<(u32, ChunkLocation), StoreError> {
        let compressed = self.compressor.compress(raw).ok();
        let (stored, codec) = match &compressed {
            Some(c) if c.len() < raw.len() - raw.len() / 32 => (c.as_slice(), Codec::Zstd),
            _ => (raw, Codec::Raw),
        };
        let pack = self.packs.len() as u32;
        let writer = match &mut self.open {
            Some((writer, _)) => writer,
            open @ None => {
                let file = tempfile::Builder::new()
                    .prefix(".berth-pack-")
                    .tempfile_in(&self.spool)
                    .map_err(local("creating a pack file"))?;
                let (file, path) = file.into_parts();
                &mut open
                    .insert((
                        PackWriter::new(BufWriter::with_capacity(1 << 20, file)),
                        path,
                    ))
                    .0
            }
        };
        let location = writer
            .add(id, raw.len() as u32, stored, codec)
            .map_err(local("writing a pack file"))?;
        let full = writer.len() >= PACK_TARGET_BYTES;
        self.locations.push((pack, location));
        if full {
            self.close_pack()?;
        }
        Ok((pack, location))
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
