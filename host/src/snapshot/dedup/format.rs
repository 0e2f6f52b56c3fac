//! The objects of a deduplicated snapshot (`docs/SNAPSHOT-FORMAT.md`):
//! packs of chunks, one index per generation, and the names they are
//! stored under. Pure encoding and decoding, with every checksum checked.

use std::io::{self, Read, Seek, SeekFrom, Write};

use serde::{Deserialize, Serialize};

use super::chunker::ChunkerParams;
pub(super) use crate::store_error::FormatError;

/// A chunk's id: the BLAKE3 of its raw bytes.
pub(super) type ChunkId = [u8; 32];

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
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
pub(super) fn decode_chunk_into(
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
            zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(stored, raw))
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

/// One generation of a snapshot: the tar as a sequence of chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Index {
    /// What the index describes.
    pub header: IndexHeader,
    /// The chunks, in tar order.
    pub entries: Vec<IndexEntry>,
}

impl Index {
    /// The binary form: magic, header length and JSON, entry count and
    /// entries, BLAKE3 of all that.
    pub(super) fn encode(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out =
            Vec::with_capacity(8 + 4 + header.len() + 8 + self.entries.len() * INDEX_ENTRY + 32);
        out.extend_from_slice(INDEX_MAGIC);
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
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Parses and checks an index: checksum, version, and that every entry
    /// points into a listed pack and the entries add up to the tar.
    pub(super) fn decode(bytes: &[u8]) -> Result<Index, FormatError> {
        let kind = "index";
        if bytes.len() < 8 + 4 + 8 + 32 || &bytes[..8] != INDEX_MAGIC {
            return Err(malformed(kind, "no index magic"));
        }
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
        if version.version != FORMAT_VERSION {
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
        if Some(rest.len() as u64) != count.checked_mul(INDEX_ENTRY as u64) {
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
        if total != header.tar_size {
            return Err(malformed(
                kind,
                format!(
                    "its chunks add up to {total} bytes, its header says {}",
                    header.tar_size
                ),
            ));
        }
        for p in &header.packs {
            if names::parse_pack(p).is_none() {
                return Err(malformed(kind, format!("{p:?} is not a pack name")));
            }
        }
        Ok(Index { header, entries })
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
                version: FORMAT_VERSION,
                snapshot: "s".into(),
                generation: 1,
                chunker: ChunkerParams::default(),
                parent: None,
                tar_size: 60,
                tar_digest: "blake3:00".into(),
                packs,
                created: 0,
            },
            entries,
        }
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
