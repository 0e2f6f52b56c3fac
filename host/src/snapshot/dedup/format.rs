//! The objects of a deduplicated snapshot (`docs/SNAPSHOT-FORMAT.md`):
//! packs of chunks, one index per generation, and the names they are
//! stored under. Pure encoding and decoding, with every checksum checked.

use std::io::{self, Read, Seek, SeekFrom, Write};

use serde::{Deserialize, Serialize};

use super::chunker::ChunkerParams;
pub(super) use crate::store_error::FormatError;
use crate::workspace::tree::{self, EntryKind, FileIdentity, Timestamp, TreeEntry};

/// A chunk's id: the BLAKE3 of its raw bytes.
pub(super) type ChunkId = [u8; 32];

/// The format version this build writes (it reads this and version 1).
pub const FORMAT_VERSION: u32 = 2;
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

/// The index header (JSON inside the binary index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct IndexHeader {
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// The snapshot id this generation belongs to.
    pub snapshot: String,
    /// Its generation number (1 for the first).
    pub generation: u64,
    /// How the chunks were cut.
    pub chunker: ChunkerParams,
    /// The index this one deduplicated against, if any.
    pub parent: Option<String>,
    /// Length of the workspace tar.
    pub tar_size: u64,
    /// `blake3:<hex>` of the workspace tar.
    pub tar_digest: String,
    /// The packs the entries point into.
    pub packs: Vec<String>,
    /// Seconds since the Unix epoch when it was written.
    pub created: u64,
    /// Version 2: the workspace instance (the backend's instance id) the
    /// members' identities belong to (the files cache's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// One chunk of the tar, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexEntry {
    /// Its id.
    pub chunk: ChunkId,
    /// Which of the header's packs holds it.
    pub pack: u32,
    /// Where in the pack.
    pub location: ChunkLocation,
}

/// One entry of the workspace in a version-2 index, with the run of
/// chunks that holds its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    /// The entry (its identity, when set, is the files cache's).
    pub entry: TreeEntry,
    /// Its first chunk in [`Index::entries`].
    pub first_chunk: u64,
    /// How many chunks hold its content (files only).
    pub chunks: u32,
}

/// One generation of a snapshot. Version 1: the tar as a sequence of
/// chunks. Version 2: the members (entries of the tree) in order, each
/// with its content's chunks; the tar is rendered from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Index {
    /// What the index describes.
    pub header: IndexHeader,
    /// The chunks, in tar order.
    pub entries: Vec<IndexEntry>,
    /// Version 2: the members; empty in version 1.
    pub members: Vec<Member>,
}

/// A piece of the tar a generation renders.
pub(super) enum Segment<'a> {
    /// Bytes that are not chunks (headers, padding, the end).
    Inline(Vec<u8>),
    /// A chunk.
    Chunk(&'a IndexEntry),
}

impl Index {
    /// The binary form: magic, header length and JSON, entry count and
    /// entries, BLAKE3 of all that.
    pub(super) fn encode(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out =
            Vec::with_capacity(8 + 4 + header.len() + 8 + self.entries.len() * INDEX_ENTRY + 32);
        out.extend_from_slice(if self.header.version >= 2 {
            INDEX_MAGIC_V2
        } else {
            INDEX_MAGIC
        });
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.chunk);
            out.extend_from_slice(&e.pack.to_le_bytes());
            out.extend_from_slice(&e.location.offset.to_le_bytes());
            out.extend_from_slice(&e.location.stored_len.to_le_bytes());
            out.extend_from_slice(&e.location.raw_len.to_le_bytes());
            out.push(e.location.codec.byte());
        }
        if self.header.version >= 2 {
            out.extend_from_slice(&(self.members.len() as u64).to_le_bytes());
            for m in &self.members {
                encode_member(m, &mut out);
            }
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Parses and checks an index: checksum, version, and that every entry
    /// points into a listed pack and the entries add up to the tar.
    pub(super) fn decode(bytes: &[u8]) -> Result<Index, FormatError> {
        let kind = "index";
        if bytes.len() < 8 + 4 + 8 + 32
            || (&bytes[..8] != INDEX_MAGIC && &bytes[..8] != INDEX_MAGIC_V2)
        {
            return Err(malformed(kind, "no index magic"));
        }
        let v2 = &bytes[..8] == INDEX_MAGIC_V2;
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        let actual = blake3::hash(body);
        if actual.as_bytes() != sum {
            return Err(FormatError::Checksum {
                expected: hex::encode(sum),
                actual: actual.to_hex().to_string(),
            });
        }
        let header_len = u32::from_le_bytes(body[8..12].try_into().unwrap_or_default()) as usize;
        let header_end = 12usize
            .checked_add(header_len)
            .filter(|end| end + 8 <= body.len())
            .ok_or_else(|| malformed(kind, "header runs past the end"))?;
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let version: Version = serde_json::from_slice(&body[12..header_end])
            .map_err(|e| malformed(kind, e.to_string()))?;
        if version.version != if v2 { 2 } else { 1 } {
            return Err(FormatError::Version(version.version));
        }
        let header: IndexHeader = serde_json::from_slice(&body[12..header_end])
            .map_err(|e| malformed(kind, e.to_string()))?;
        let count = u64::from_le_bytes(
            body[header_end..header_end + 8]
                .try_into()
                .unwrap_or_default(),
        );
        let rest = &body[header_end + 8..];
        let chunk_bytes = count
            .checked_mul(INDEX_ENTRY as u64)
            .filter(|n| *n <= rest.len() as u64)
            .ok_or_else(|| malformed(kind, "its entry count does not match its length"))?
            as usize;
        let (rest, member_bytes) = rest.split_at(chunk_bytes);
        if !v2 && !member_bytes.is_empty() {
            return Err(malformed(kind, "its entry count does not match its length"));
        }
        let mut entries = Vec::with_capacity(count as usize);
        let mut total = 0u64;
        for e in rest.chunks_exact(INDEX_ENTRY) {
            let mut chunk = [0u8; 32];
            chunk.copy_from_slice(&e[..32]);
            let pack = u32::from_le_bytes(e[32..36].try_into().unwrap_or_default());
            if pack as usize >= header.packs.len() {
                return Err(malformed(kind, "an entry points past the pack list"));
            }
            let location = ChunkLocation {
                offset: u64::from_le_bytes(e[36..44].try_into().unwrap_or_default()),
                stored_len: u32::from_le_bytes(e[44..48].try_into().unwrap_or_default()),
                raw_len: u32::from_le_bytes(e[48..52].try_into().unwrap_or_default()),
                codec: Codec::from_byte(e[52], kind)?,
            };
            if location.offset + location.stored_len as u64 > MAX_PACK_BYTES {
                return Err(malformed(kind, "an entry points past the largest pack"));
            }
            total += location.raw_len as u64;
            entries.push(IndexEntry {
                chunk,
                pack,
                location,
            });
        }
        for p in &header.packs {
            if names::parse_pack(p).is_none() {
                return Err(malformed(kind, format!("{p:?} is not a pack name")));
            }
        }
        if !v2 {
            if total != header.tar_size {
                return Err(malformed(
                    kind,
                    format!(
                        "its chunks add up to {total} bytes, its header says {}",
                        header.tar_size
                    ),
                ));
            }
            return Ok(Index {
                header,
                entries,
                members: Vec::new(),
            });
        }
        let members = decode_members(member_bytes, &entries)?;
        let index = Index {
            header,
            entries,
            members,
        };
        let size = index
            .rendered_size()
            .map_err(|e| malformed(kind, e.to_string()))?;
        if size != index.header.tar_size {
            return Err(malformed(
                kind,
                format!(
                    "its members render {size} bytes of tar, its header says {}",
                    index.header.tar_size
                ),
            ));
        }
        let seal = index.tree_seal();
        if seal != index.header.tar_digest {
            return Err(FormatError::Archive(format!(
                "its members and chunks seal to {seal}, its header says {}",
                index.header.tar_digest
            )));
        }
        Ok(index)
    }

    /// Version 2: the seal of the members (identities left out) and
    /// their chunks' ids and lengths — what the sandbox state records.
    /// Every chunk is checked against its id as it is read, so a restore
    /// that matches the seal is the tree that was stopped.
    pub(super) fn tree_seal(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"berth-tree-v2\0");
        for m in &self.members {
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
            for c in self.run(m) {
                h.update(&c.chunk);
                h.update(&c.location.raw_len.to_le_bytes());
            }
        }
        format!("{TREE_SEAL_PREFIX}{}", h.finalize().to_hex())
    }

    /// A member's chunks.
    pub(super) fn run(&self, m: &Member) -> &[IndexEntry] {
        let first = m.first_chunk as usize;
        self.entries
            .get(first..first + m.chunks as usize)
            .unwrap_or(&[])
    }

    /// Version 2: the length of the tar the members render.
    pub(super) fn rendered_size(&self) -> io::Result<u64> {
        let mut size = tree::END_OF_ARCHIVE as u64;
        for m in &self.members {
            size += tree::render_header(&m.entry)?.len() as u64;
            size += m.entry.size + tree::padding(m.entry.size);
        }
        Ok(size)
    }

    /// The tar, as pieces: version 1, its chunks; version 2, each
    /// member's header, content chunks and padding, then the end.
    pub(super) fn segments(&self) -> Box<dyn Iterator<Item = io::Result<Segment<'_>>> + '_> {
        if self.header.version < 2 {
            return Box::new(self.entries.iter().map(|e| Ok(Segment::Chunk(e))));
        }
        let members = self.members.iter().flat_map(move |m| {
            let header = tree::render_header(&m.entry).map(Segment::Inline);
            let pad = tree::padding(m.entry.size) as usize;
            std::iter::once(header)
                .chain(self.run(m).iter().map(|c| Ok(Segment::Chunk(c))))
                .chain((pad > 0).then(|| Ok(Segment::Inline(vec![0u8; pad]))))
        });
        Box::new(members.chain(std::iter::once(Ok(Segment::Inline(vec![
            0u8;
            tree::END_OF_ARCHIVE
        ])))))
    }

    /// The packs of the header that the entries use, in order of first use.
    pub(super) fn packs_in_use(&self) -> Vec<u32> {
        let mut seen = vec![false; self.header.packs.len()];
        let mut order = Vec::new();
        for e in &self.entries {
            if !seen[e.pack as usize] {
                seen[e.pack as usize] = true;
                order.push(e.pack);
            }
        }
        order
    }
}

fn encode_member(m: &Member, out: &mut Vec<u8>) {
    let e = &m.entry;
    out.push(e.kind.byte());
    out.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.path);
    out.extend_from_slice(&e.mode.to_le_bytes());
    out.extend_from_slice(&e.size.to_le_bytes());
    out.extend_from_slice(&e.mtime.sec.to_le_bytes());
    out.extend_from_slice(&e.mtime.nsec.to_le_bytes());
    out.extend_from_slice(&(e.link.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.link);
    out.extend_from_slice(&m.first_chunk.to_le_bytes());
    out.extend_from_slice(&m.chunks.to_le_bytes());
    match &e.identity {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            out.extend_from_slice(&id.dev.to_le_bytes());
            out.extend_from_slice(&id.ino.to_le_bytes());
            out.extend_from_slice(&id.ctime.sec.to_le_bytes());
            out.extend_from_slice(&id.ctime.nsec.to_le_bytes());
        }
    }
}

/// Reads fixed-size fields off the front of a byte slice.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.0.len() < n {
            return Err(malformed("index", "a member runs past the end"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn time(&mut self) -> Result<Timestamp, FormatError> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(malformed("index", "a time's nanoseconds are out of range"));
        }
        Ok(Timestamp { sec, nsec })
    }
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, FormatError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(malformed("index", "a member's name is too long"));
        }
        Ok(self.take(n)?.to_vec())
    }
}

/// The members of a version-2 index: their chunk runs must cover the
/// chunk list exactly, in order, and add up to each file's size.
fn decode_members(bytes: &[u8], entries: &[IndexEntry]) -> Result<Vec<Member>, FormatError> {
    let kind = "index";
    let mut f = Fields(bytes);
    let count = f.u64()?;
    if count > (bytes.len() / 40) as u64 + 1 {
        return Err(malformed(
            kind,
            "its member count does not match its length",
        ));
    }
    let mut members = Vec::with_capacity(count as usize);
    let mut next_chunk = 0u64;
    for _ in 0..count {
        let kind_byte = f.u8()?;
        let entry_kind = EntryKind::from_byte(kind_byte)
            .ok_or_else(|| malformed(kind, format!("unknown member kind {kind_byte}")))?;
        let path = f.bytes(64 * 1024)?;
        let mode = f.u32()?;
        let size = f.u64()?;
        let mtime = f.time()?;
        let link = f.bytes(64 * 1024)?;
        let first_chunk = f.u64()?;
        let chunks = f.u32()?;
        let identity = match f.u8()? {
            0 => None,
            1 => Some(FileIdentity {
                dev: f.u64()?,
                ino: f.u64()?,
                ctime: f.time()?,
            }),
            _ => return Err(malformed(kind, "a member's identity flag is not 0 or 1")),
        };
        if first_chunk != next_chunk {
            return Err(malformed(kind, "its members' chunks are not in order"));
        }
        let end = first_chunk
            .checked_add(chunks as u64)
            .filter(|e| *e <= entries.len() as u64)
            .ok_or_else(|| malformed(kind, "a member's chunks run past the chunk list"))?;
        let total: u64 = entries[first_chunk as usize..end as usize]
            .iter()
            .map(|c| c.location.raw_len as u64)
            .sum();
        if total != size || (entry_kind != EntryKind::File && size != 0) {
            return Err(malformed(
                kind,
                format!(
                    "member {:?} is {size} bytes but its chunks hold {total}",
                    String::from_utf8_lossy(&path)
                ),
            ));
        }
        next_chunk = end;
        members.push(Member {
            entry: TreeEntry {
                path,
                kind: entry_kind,
                mode,
                size,
                mtime,
                link,
                identity,
            },
            first_chunk,
            chunks,
        });
    }
    if next_chunk != entries.len() as u64 || !f.0.is_empty() {
        return Err(malformed(
            kind,
            "its members do not cover its chunks exactly",
        ));
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
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
        i.header.tar_size = i.rendered_size().unwrap();
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
}
