//! The objects of a deduplicated snapshot (`docs/SNAPSHOT-FORMAT.md`):
//! packs of chunks, one index per generation, and the names they are
//! stored under. Pure encoding and decoding, with every checksum checked.

use std::io::{self, Read, Seek, SeekFrom, Write};

use serde::{Deserialize, Serialize};

use super::chunker::ChunkerParams;
pub(super) use super::format_error::FormatError;
use crate::workspace::tree::{self, EntryKind, FileIdentity, Timestamp, TreeEntry};

/// A chunk's id: the BLAKE3 of its raw bytes.
pub(super) type ChunkId = [u8; 32];

/// The format version this build writes (it reads this and versions 1
/// and 2).
pub const FORMAT_VERSION: u32 = 3;
/// A pack is closed once it holds this many stored bytes.
pub(super) const PACK_TARGET_BYTES: u64 = 32 * 1024 * 1024;
/// The most a pack may be (a chunk that starts below the target can end
/// above it); downloads are cut off beyond it.
pub(super) const MAX_PACK_BYTES: u64 = PACK_TARGET_BYTES + 8 * 1024 * 1024;
/// The most an index may be (about 2.5 M chunks); downloads are cut off
/// beyond it.
pub(super) const MAX_INDEX_BYTES: u64 = 128 * 1024 * 1024;

const PACK_MAGIC: &[u8; 8] = b"BERTHPK1";
const INDEX_MAGIC: &[u8; 8] = b"BERTHIX1";
const INDEX_MAGIC_V2: &[u8; 8] = b"BERTHIX2";
const INDEX_MAGIC_V3: &[u8; 8] = b"BERTHIX3";
/// The prefix of a version-2 seal (a digest of the tree and its chunk ids,
/// not of the tar's bytes).
pub(super) const TREE_SEAL_PREFIX: &str = "tree:blake3:";
const PACK_TABLE_ENTRY: usize = 32 + 4 + 4 + 1;
const PACK_TRAILER: usize = 4 + 8 + 8;
const INDEX_ENTRY: usize = 32 + 4 + 8 + 4 + 4 + 1;

fn malformed(kind: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Malformed {
        kind,
        why: why.into(),
    }
}

/// How a chunk is stored in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    /// As is.
    Raw,
    /// One zstd frame.
    Zstd,
}

impl Codec {
    fn byte(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Zstd => 1,
        }
    }

    fn from_byte(b: u8, kind: &'static str) -> Result<Self, FormatError> {
        match b {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            other => Err(malformed(kind, format!("unknown chunk codec {other}"))),
        }
    }
}

/// Where a chunk lives and how to read it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ChunkLocation {
    /// Offset of the stored bytes in the pack.
    pub offset: u64,
    /// Stored length.
    pub stored_len: u32,
    /// Raw length.
    pub raw_len: u32,
    /// Codec.
    pub codec: Codec,
}

/// Object names. Every name obeys the id grammar; names derived from a
/// long snapshot id use its owner tag instead.
pub(super) mod names {
    use crate::snapshot_id::MAX_ID_LEN;

    /// 16 hex digits naming a snapshot id's own packs, so one sandbox's
    /// garbage collection can tell its packs from shared ones.
    pub(crate) fn owner_tag(snapshot: &str) -> String {
        let h = blake3::hash(format!("berth-dedup-owner:{snapshot}").as_bytes());
        h.to_hex()[..16].to_string()
    }

    fn derived(snapshot: &str, suffix: &str) -> String {
        if snapshot.len() + suffix.len() <= MAX_ID_LEN {
            format!("{snapshot}{suffix}")
        } else {
            format!("x{}{suffix}", owner_tag(snapshot))
        }
    }

    /// The index of `snapshot`'s generation `generation`.
    pub(crate) fn index(snapshot: &str, generation: u64) -> String {
        derived(snapshot, &format!(".g{generation}.idx"))
    }

    /// The journal of the packs an unfinished stop of `snapshot` uploaded.
    pub(crate) fn journal(snapshot: &str) -> String {
        derived(snapshot, ".journal")
    }

    /// The marker that keeps the index `index` (a fork's base) from
    /// garbage collection.
    pub(crate) fn pin(index: &str) -> String {
        format!("pin-{}", &blake3::hash(index.as_bytes()).to_hex()[..32])
    }

    /// A pack owned by the snapshot with `tag`, named by its content hash.
    pub(crate) fn pack(tag: &str, hash: &blake3::Hash) -> String {
        format!("pk-{tag}-{}", hash.to_hex())
    }

    /// The owner tag and content hash a pack name carries.
    pub(crate) fn parse_pack(id: &str) -> Option<(&str, &str)> {
        let rest = id.strip_prefix("pk-")?;
        let (tag, hash) = rest.split_once('-')?;
        (tag.len() == 16 && hash.len() == 64).then_some((tag, hash))
    }
}

/// Writes a pack: stored chunks, then the chunk table and the trailer,
/// hashing everything for the pack's name.
pub(super) struct PackWriter<W: Write> {
    out: W,
    hasher: blake3::Hasher,
    table: Vec<(ChunkId, ChunkLocation)>,
    written: u64,
}

impl<W: Write> PackWriter<W> {
    /// A pack written to `out`.
    pub(super) fn new(out: W) -> Self {
        PackWriter {
            out,
            hasher: blake3::Hasher::new(),
            table: Vec::new(),
            written: 0,
        }
    }

    /// Appends one chunk; returns where it is.
    pub(super) fn add(
        &mut self,
        id: ChunkId,
        raw_len: u32,
        stored: &[u8],
        codec: Codec,
    ) -> io::Result<ChunkLocation> {
        let location = ChunkLocation {
            offset: self.written,
            stored_len: stored.len() as u32,
            raw_len,
            codec,
        };
        self.write(stored)?;
        self.table.push((id, location));
        Ok(location)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Stored bytes so far.
    pub(super) fn len(&self) -> u64 {
        self.written
    }

    /// Writes the table and trailer; returns the sink, the content hash and
    /// the pack's size.
    pub(super) fn finish(mut self) -> io::Result<(W, blake3::Hash, u64)> {
        let data_len = self.written;
        let mut table = Vec::with_capacity(self.table.len() * PACK_TABLE_ENTRY + PACK_TRAILER);
        for (id, loc) in &self.table {
            table.extend_from_slice(id);
            table.extend_from_slice(&loc.raw_len.to_le_bytes());
            table.extend_from_slice(&loc.stored_len.to_le_bytes());
            table.push(loc.codec.byte());
        }
        table.extend_from_slice(&(self.table.len() as u32).to_le_bytes());
        table.extend_from_slice(&data_len.to_le_bytes());
        table.extend_from_slice(PACK_MAGIC);
        self.write(&table)?;
        self.out.flush()?;
        Ok((self.out, self.hasher.finalize(), self.written))
    }
}

/// Reads a pack's chunk table (to check a cached pack is whole, or to
/// rebuild an index from packs): the chunks in order with their locations.
pub(super) fn read_pack_table<R: Read + Seek>(
    pack: &mut R,
) -> Result<Vec<(ChunkId, ChunkLocation)>, FormatError> {
    let io = |e: io::Error| malformed("pack", e.to_string());
    let size = pack.seek(SeekFrom::End(0)).map_err(io)?;
    if size < PACK_TRAILER as u64 {
        return Err(malformed("pack", "shorter than its trailer"));
    }
    pack.seek(SeekFrom::End(-(PACK_TRAILER as i64)))
        .map_err(io)?;
    let mut trailer = [0u8; PACK_TRAILER];
    pack.read_exact(&mut trailer).map_err(io)?;
    if &trailer[12..20] != PACK_MAGIC {
        return Err(malformed("pack", "no pack trailer"));
    }
    let count = u32::from_le_bytes(trailer[0..4].try_into().unwrap_or_default()) as u64;
    let data_len = u64::from_le_bytes(trailer[4..12].try_into().unwrap_or_default());
    let table_len = count * PACK_TABLE_ENTRY as u64;
    if data_len
        .checked_add(table_len)
        .map(|n| n + PACK_TRAILER as u64)
        != Some(size)
    {
        return Err(malformed("pack", "its table does not fit its size"));
    }
    pack.seek(SeekFrom::Start(data_len)).map_err(io)?;
    let mut table = vec![0u8; table_len as usize];
    pack.read_exact(&mut table).map_err(io)?;
    let mut offset = 0u64;
    let mut out = Vec::with_capacity(count as usize);
    for e in table.chunks_exact(PACK_TABLE_ENTRY) {
        let mut id = [0u8; 32];
        id.copy_from_slice(&e[..32]);
        let raw_len = u32::from_le_bytes(e[32..36].try_into().unwrap_or_default());
        let stored_len = u32::from_le_bytes(e[36..40].try_into().unwrap_or_default());
        let codec = Codec::from_byte(e[40], "pack")?;
        out.push((
            id,
            ChunkLocation {
                offset,
                stored_len,
                raw_len,
                codec,
            },
        ));
        offset += stored_len as u64;
    }
    if offset != data_len {
        return Err(malformed("pack", "its table does not add up to its data"));
    }
    Ok(out)
}

/// Decodes one stored chunk and checks it against its id.
#[cfg(test)]
pub(crate) fn decode_chunk(
    id: &ChunkId,
    location: &ChunkLocation,
    stored: &[u8],
) -> Result<Vec<u8>, FormatError> {
    let mut raw = Vec::new();
    decode_chunk_into(id, location, stored, &mut raw)?;
    Ok(raw)
}

/// Decodes one stored chunk into `raw` (its previous content replaced; its
/// allocation reused) and checks it against its id.
#[cfg(test)]
pub(super) fn decode_chunk_into(
    id: &ChunkId,
    location: &ChunkLocation,
    stored: &[u8],
    raw: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let mut decompressor =
        zstd::bulk::Decompressor::new().map_err(|_| FormatError::Chunk(hex::encode(id)))?;
    decode_chunk_with(&mut decompressor, id, location, stored, raw)
}

/// [`decode_chunk_into`] with a decompressor the caller keeps (one per
/// restore: making one per chunk costs more than small chunks do).
pub(super) fn decode_chunk_with(
    decompressor: &mut zstd::bulk::Decompressor<'static>,
    id: &ChunkId,
    location: &ChunkLocation,
    stored: &[u8],
    raw: &mut Vec<u8>,
) -> Result<(), FormatError> {
    raw.clear();
    match location.codec {
        Codec::Raw => raw.extend_from_slice(stored),
        Codec::Zstd => {
            raw.reserve(location.raw_len as usize);
            decompressor
                .decompress_to_buffer(stored, raw)
                .map_err(|_| FormatError::Chunk(hex::encode(id)))?;
        }
    }
    if raw.len() != location.raw_len as usize || blake3::hash(raw).as_bytes() != id {
        return Err(FormatError::Chunk(hex::encode(id)));
    }
    Ok(())
}

#[path = "format_index.rs"]
mod index;
#[path = "format_members.rs"]
mod members;
pub(super) use index::{Index, IndexEntry, IndexHeader, Member, Segment};
pub(super) use members::{for_each_block, BlockRef};

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn pack_of(chunks: &[&[u8]]) -> (Vec<u8>, Vec<(ChunkId, ChunkLocation)>, blake3::Hash) {
        let mut w = PackWriter::new(Vec::new());
        let mut locs = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let id = *blake3::hash(c).as_bytes();
            let (stored, codec) = if i % 2 == 0 {
                (zstd::bulk::compress(c, 1).unwrap(), Codec::Zstd)
            } else {
                (c.to_vec(), Codec::Raw)
            };
            locs.push((id, w.add(id, c.len() as u32, &stored, codec).unwrap()));
        }
        let (bytes, hash, size) = w.finish().unwrap();
        assert_eq!(size, bytes.len() as u64);
        (bytes, locs, hash)
    }

    #[test]
    fn pack_table_reads_back_and_chunks_verify() {
        let chunks: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 1000 * (i + 1)]).collect();
        let refs: Vec<&[u8]> = chunks.iter().map(|c| c.as_slice()).collect();
        let (bytes, locs, hash) = pack_of(&refs);
        assert_eq!(blake3::hash(&bytes), hash);
        let table = read_pack_table(&mut io::Cursor::new(&bytes)).unwrap();
        assert_eq!(table, locs);
        for ((id, loc), raw) in table.iter().zip(&chunks) {
            let stored = &bytes[loc.offset as usize..(loc.offset + loc.stored_len as u64) as usize];
            assert_eq!(&decode_chunk(id, loc, stored).unwrap(), raw);
            let mut bad = stored.to_vec();
            bad[0] ^= 1;
            assert!(decode_chunk(id, loc, &bad).is_err());
        }
        assert!(read_pack_table(&mut io::Cursor::new(&bytes[1..])).is_err());
    }

    fn index() -> Index {
        let packs = vec![names::pack("0123456789abcdef", &blake3::hash(b"p"))];
        let entries = (0..3)
            .map(|i| IndexEntry {
                chunk: [i as u8; 32],
                pack: 0,
                location: ChunkLocation {
                    offset: i * 10,
                    stored_len: 10,
                    raw_len: 20,
                    codec: Codec::Raw,
                },
            })
            .collect();
        Index {
            header: IndexHeader {
                version: 1,
                snapshot: "s".into(),
                generation: 1,
                chunker: ChunkerParams::default(),
                parent: None,
                tar_size: 60,
                tar_digest: "blake3:00".into(),
                packs,
                created: 0,
                instance: None,
            },
            entries,
            members: Vec::new(),
            blocks: Vec::new(),
        }
    }

    fn index_v2() -> Index {
        let mut i = index();
        i.header.version = 2;
        i.header.instance = Some("dir:1".into());
        let file = |path: &str, first: u64, chunks: u32, size: u64| Member {
            entry: TreeEntry {
                path: path.as_bytes().to_vec(),
                kind: if chunks == 0 && size == 0 && path.is_empty() {
                    EntryKind::Dir
                } else {
                    EntryKind::File
                },
                mode: 0o644,
                size,
                mtime: Timestamp { sec: 5, nsec: 7 },
                link: Vec::new(),
                identity: Some(FileIdentity {
                    dev: 1,
                    ino: 2,
                    ctime: Timestamp { sec: 3, nsec: 4 },
                }),
            },
            first_chunk: first,
            chunks,
        };
        i.members = vec![file("", 0, 0, 0), file("a", 0, 1, 20), file("b", 1, 2, 40)];
        i.header.tar_size = i.rendered_size();
        i.header.tar_digest = i.tree_seal();
        i
    }

    #[test]
    fn a_version_2_index_round_trips_and_every_flipped_byte_is_caught() {
        let i = index_v2();
        let bytes = i.encode();
        assert_eq!(Index::decode(&bytes).unwrap(), i);
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(Index::decode(&bad).is_err(), "flip at {at} went unnoticed");
        }
        // A re-sealed forgery (checksum recomputed) whose chunk ids
        // changed no longer matches the seal the state records.
        let mut forged = i.clone();
        forged.entries[1].chunk[0] ^= 1;
        let decoded = Index::decode(&forged.encode());
        assert!(decoded.is_err() || decoded.unwrap().header.tar_digest != forged.tree_seal());
        assert_ne!(forged.tree_seal(), i.tree_seal());
        // The rendered tar reads back as the members.
        let mut tar = Vec::new();
        for seg in i.segments() {
            match seg.unwrap() {
                Segment::Inline(b) => tar.extend(b),
                Segment::Chunk(c) => tar.extend(vec![b'x'; c.location.raw_len as usize]),
            }
        }
        assert_eq!(tar.len() as u64, i.header.tar_size);
        let mut paths = Vec::new();
        tree::items_of_tar(&tar[..], Default::default(), &mut |item| {
            if let tree::TreeItem::Entry { entry, .. } = item {
                paths.push((entry.path, entry.mtime));
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(paths.len(), 3);
        assert_eq!(paths[2].1, Timestamp { sec: 5, nsec: 7 });
    }

    #[test]
    fn index_round_trips_and_every_flipped_byte_is_caught() {
        let i = index();
        let bytes = i.encode();
        assert_eq!(Index::decode(&bytes).unwrap(), i);
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(Index::decode(&bad).is_err(), "flip at {at} went unnoticed");
        }
        for len in 0..bytes.len() {
            assert!(Index::decode(&bytes[..len]).is_err());
        }
    }

    #[test]
    fn names_obey_the_id_grammar() {
        let long = "a".repeat(128);
        for s in ["s", long.as_str()] {
            for name in [
                names::index(s, u64::MAX),
                names::journal(s),
                names::pin(&names::index(s, 3)),
                names::pack(&names::owner_tag(s), &blake3::hash(b"x")),
            ] {
                crate::snapshot_id::SnapshotId::parse(&name).unwrap();
            }
        }
        let p = names::pack("0123456789abcdef", &blake3::hash(b"x"));
        assert_eq!(
            names::parse_pack(&p).map(|(t, _)| t),
            Some("0123456789abcdef")
        );
        assert_eq!(names::parse_pack("pk-x-y"), None);
    }

    /// A seeded tree of `files` files in a few directories, one chunk
    /// each, sealed as a stop seals it.
    pub(in crate::snapshot::dedup) fn generated(seed: u64, files: usize) -> Index {
        let mut next = crate::test_rng::xorshift(seed);
        let mut i = index_v2();
        i.header.version = FORMAT_VERSION;
        i.entries.clear();
        i.members.truncate(1);
        let mut paths: Vec<String> = (0..files)
            .map(|n| format!("d{}/f{n:06}-{}", next() % 7, next() % 1000))
            .collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let size = 1 + next() % 100_000;
            i.members.push(Member {
                entry: TreeEntry {
                    path: path.into_bytes(),
                    kind: EntryKind::File,
                    mode: 0o644,
                    size,
                    mtime: Timestamp {
                        sec: 1_700_000_000,
                        nsec: (next() % 1_000_000_000) as u32,
                    },
                    link: Vec::new(),
                    identity: None,
                },
                first_chunk: i.entries.len() as u64,
                chunks: 1,
            });
            let mut chunk = [0u8; 32];
            chunk[..8].copy_from_slice(&next().to_le_bytes());
            i.entries.push(IndexEntry {
                chunk,
                pack: 0,
                location: ChunkLocation {
                    offset: 0,
                    stored_len: size as u32,
                    raw_len: size as u32,
                    codec: Codec::Raw,
                },
            });
        }
        i.header.tar_size = i.rendered_size();
        i.header.tar_digest = i.tree_seal();
        i
    }

    /// The seal, as version 2 defined it: each field handed to BLAKE3 on
    /// its own (the buffered [`Index::tree_seal`] must equal it).
    fn seal_field_by_field(i: &Index) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"berth-tree-v2\0");
        for m in &i.members {
            let e = &m.entry;
            h.update(&[e.kind.byte()]);
            h.update(&(e.path.len() as u64).to_le_bytes());
            h.update(&e.path);
            h.update(&e.mode.to_le_bytes());
            h.update(&e.size.to_le_bytes());
            h.update(&e.mtime.sec.to_le_bytes());
            h.update(&e.mtime.nsec.to_le_bytes());
            h.update(&(e.link.len() as u64).to_le_bytes());
            h.update(&e.link);
            h.update(&m.chunks.to_le_bytes());
            for c in i.run(m) {
                h.update(&c.chunk);
                h.update(&c.location.raw_len.to_le_bytes());
            }
        }
        format!("{TREE_SEAL_PREFIX}{}", h.finalize().to_hex())
    }

    /// An unchanged tree keeps its seal: the buffered seal is the one
    /// version 2 wrote, over seeded trees from empty to many buffers long
    /// (and with a path longer than a buffer).
    #[test]
    fn the_buffered_seal_is_the_field_by_field_seal() {
        let seed = crate::test_rng::seed(0x5EA1);
        for (round, files) in [0usize, 1, 7, 300, 5_000].into_iter().enumerate() {
            let mut i = generated(seed + round as u64, files);
            if files == 300 {
                i.members[1].entry.path = vec![b'p'; 70_000];
            }
            assert_eq!(
                i.tree_seal(),
                seal_field_by_field(&i),
                "seed {seed}, {files} files"
            );
        }
    }

    /// Its blocks by id, and the outline that lists them (in a tree pack
    /// named second in the header).
    fn outline_of(i: &Index) -> (std::collections::HashMap<ChunkId, Vec<u8>>, Index) {
        let mut blocks = std::collections::HashMap::new();
        let mut outline = i.clone();
        outline
            .header
            .packs
            .push(names::pack("0123456789abcdef", &blake3::hash(b"tree")));
        outline.entries.clear();
        outline.members.clear();
        for_each_block::<()>(i, |raw, members| {
            let id = *blake3::hash(raw).as_bytes();
            blocks.insert(id, raw.to_vec());
            outline.blocks.push(BlockRef {
                id,
                pack: 1,
                location: ChunkLocation {
                    offset: 0,
                    stored_len: raw.len() as u32,
                    raw_len: raw.len() as u32,
                    codec: Codec::Raw,
                },
                members,
            });
            Ok(())
        })
        .unwrap();
        (blocks, outline)
    }

    /// Version 3: the outline object round-trips and catches every flipped
    /// byte; completed from its blocks it is the tree that was encoded;
    /// a changed block, or a block of another tree, is refused.
    #[test]
    fn a_version_3_index_completes_to_its_tree_and_catches_damage() {
        let i = generated(7, 3000);
        let (blocks, outline) = outline_of(&i);
        assert!(outline.blocks.len() > 10, "{} blocks", outline.blocks.len());
        let bytes = outline.encode();
        assert!(
            bytes.len() < 8 * 1024,
            "the outline is {} bytes",
            bytes.len()
        );
        let mut read = Index::decode(&bytes).unwrap();
        assert_eq!(read, outline);
        read.complete(|b| Ok(blocks[&b.id].clone())).unwrap();
        assert_eq!((&read.entries, &read.members), (&i.entries, &i.members));
        assert_eq!(read.header.tar_digest, i.tree_seal());
        for at in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(Index::decode(&bad).is_err(), "flip at {at} went unnoticed");
        }
        let first = outline.blocks[3].id;
        for at in [0, 5, 40, blocks[&first].len() - 1] {
            let mut o = outline.clone();
            let e = o.complete(|b| {
                let mut raw = blocks[&b.id].clone();
                if b.id == first {
                    raw[at] ^= 1;
                }
                Ok(raw)
            });
            assert!(e.is_err(), "a flip at {at} of a block went unnoticed");
        }
        // A block re-sealed under its new id (its last chunk's id changed)
        // is caught by the seal.
        let mut forged = outline.clone();
        let mut raw = blocks[&first].clone();
        let last_chunk_id = raw.len() - 53;
        raw[last_chunk_id] ^= 1;
        forged.blocks[3].id = *blake3::hash(&raw).as_bytes();
        let mut with = blocks.clone();
        with.insert(forged.blocks[3].id, raw);
        assert!(forged.complete(|b| Ok(with[&b.id].clone())).is_err());
    }

    /// An edit, an insertion or a removal of one member changes at most
    /// two blocks of thousands: a stop writes what changed, not the tree
    /// (seeded; `BERTH_TEST_SEED` to vary).
    #[test]
    fn one_changed_member_changes_at_most_two_blocks() {
        let seed = crate::test_rng::seed(11);
        let mut i = generated(seed, 5000);
        let mut next = crate::test_rng::xorshift(seed);
        for round in 0..60 {
            let rng = next();
            let (before, _) = outline_of(&i);
            let at = 1 + (rng as usize % (i.members.len() - 1));
            match round % 3 {
                0 => i.members[at].entry.mtime.nsec = (rng % 1_000_000_000) as u32,
                1 => {
                    let mut m = i.members[at].clone();
                    m.entry.path.extend_from_slice(b"-new");
                    i.members.insert(at + 1, m);
                    let mut first = 0;
                    for m in &mut i.members {
                        m.first_chunk = first;
                        first += m.chunks as u64;
                    }
                    i.entries.insert(at, i.entries[at - 1]);
                }
                _ => {
                    let gone = i.members.remove(at);
                    i.entries.remove(gone.first_chunk as usize);
                    let mut first = 0;
                    for m in &mut i.members {
                        m.first_chunk = first;
                        first += m.chunks as u64;
                    }
                }
            }
            let (after, outline) = outline_of(&i);
            let new = after.keys().filter(|id| !before.contains_key(*id)).count();
            assert!(
                new <= 2,
                "round {round}: {new} of {} blocks changed",
                outline.blocks.len()
            );
        }
    }
}
