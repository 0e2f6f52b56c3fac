//! The members of an index on the wire: version 2 writes them all in the
//! index object; version 3 writes them in *blocks* — runs of members with
//! their chunk entries, each block stored as a chunk in a pack of its own
//! kind (a *tree pack*) — so an index holds only where its blocks are, and
//! a stop that changed one file writes one new block, not every member.
//!
//! Blocks end where a member's path hashes to a cut (about one member in
//! [`BLOCK_CUT_MODULUS`]) or the block reaches [`BLOCK_TARGET_BYTES`], so
//! an edit, an insertion or a removal changes the blocks around it only:
//! the rest encode to the same bytes and keep their ids.

use std::collections::HashMap;

use super::*;

/// About one member in this many ends a block (by its path's hash).
const BLOCK_CUT_MODULUS: u32 = 128;
/// A block also ends once its encoding reaches this many bytes.
const BLOCK_TARGET_BYTES: usize = 256 * 1024;
/// The most a block may decode to (one member with the longest names and
/// a file's worth of chunk entries fits); reads are refused beyond it.
pub(in crate::snapshot::dedup) const MAX_BLOCK_BYTES: u32 = 64 * 1024 * 1024;
/// A block reference in a version-3 index object.
const BLOCK_REF: usize = 32 + 4 + 8 + 4 + 4 + 1 + 4;
/// Longest path or link target a member may carry.
const MAX_NAME: usize = 64 * 1024;

/// Where one block of members is stored: a chunk of a tree pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::snapshot::dedup) struct BlockRef {
    /// The BLAKE3 of the block's raw bytes.
    pub id: ChunkId,
    /// Which of the header's packs holds it.
    pub pack: u32,
    /// Where in the pack, and how it is stored.
    pub location: ChunkLocation,
    /// How many members it holds.
    pub members: u32,
}

impl BlockRef {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&self.pack.to_le_bytes());
        encode_location(&self.location, out);
        out.extend_from_slice(&self.members.to_le_bytes());
    }

    /// The block references after a version-3 header: a count, then
    /// each; every one must point into the header's `packs` and fit the
    /// limits.
    pub(super) fn decode_all(bytes: &[u8], packs: usize) -> Result<Vec<BlockRef>, FormatError> {
        let mut f = Fields(bytes);
        let count = f.u64()?;
        if count.checked_mul(BLOCK_REF as u64) != Some(f.0.len() as u64) {
            return Err(malformed(
                "index",
                "its block count does not match its length",
            ));
        }
        let mut blocks = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let id = f.id()?;
            let pack = f.u32()?;
            let location = f.location()?;
            let members = f.u32()?;
            if pack as usize >= packs {
                return Err(malformed("index", "a block points past the pack list"));
            }
            if location.raw_len > MAX_BLOCK_BYTES {
                return Err(malformed("index", "a block is larger than a block may be"));
            }
            blocks.push(BlockRef {
                id,
                pack,
                location,
                members,
            });
        }
        Ok(blocks)
    }
}

/// Calls `emit` with each block of `index`'s members, in order: its raw
/// bytes and how many members it holds. The same members and chunks
/// always give the same blocks.
pub(in crate::snapshot::dedup) fn for_each_block<E>(
    index: &Index,
    mut emit: impl FnMut(&[u8], u32) -> Result<(), E>,
) -> Result<(), E> {
    let mut block = BlockBuilder::default();
    for m in &index.members {
        block.add(index, m);
        let hash = blake3::hash(&m.entry.path);
        let word = u32::from_le_bytes([
            hash.as_bytes()[0],
            hash.as_bytes()[1],
            hash.as_bytes()[2],
            hash.as_bytes()[3],
        ]);
        if word.is_multiple_of(BLOCK_CUT_MODULUS) || block.body.len() >= BLOCK_TARGET_BYTES {
            let (raw, count) = block.finish(&index.header.packs);
            emit(&raw, count)?;
        }
    }
    if block.count > 0 {
        let (raw, count) = block.finish(&index.header.packs);
        emit(&raw, count)?;
    }
    Ok(())
}

/// A block being encoded: its members, their chunk entries naming packs
/// by a number local to the block, and those packs (by name, so a block
/// reads the same in any index that lists its packs in any order).
#[derive(Default)]
struct BlockBuilder {
    body: Vec<u8>,
    count: u32,
    /// Header pack number → block pack number.
    local: HashMap<u32, u32>,
    /// Header pack numbers, in block order.
    packs: Vec<u32>,
}

impl BlockBuilder {
    fn add(&mut self, index: &Index, m: &Member) {
        encode_head(&m.entry, &mut self.body);
        encode_identity(&m.entry, &mut self.body);
        self.body.extend_from_slice(&m.chunks.to_le_bytes());
        for c in index.run(m) {
            let next = self.packs.len() as u32;
            let local = *self.local.entry(c.pack).or_insert(next);
            if local == next {
                self.packs.push(c.pack);
            }
            self.body.extend_from_slice(&c.chunk);
            self.body.extend_from_slice(&local.to_le_bytes());
            encode_location(&c.location, &mut self.body);
        }
        self.count += 1;
    }

    /// The block's bytes: its pack names, its member count, its members;
    /// the builder is empty again.
    fn finish(&mut self, names: &[String]) -> (Vec<u8>, u32) {
        let mut raw = Vec::with_capacity(self.body.len() + 8 + self.packs.len() * 90);
        raw.extend_from_slice(&(self.packs.len() as u32).to_le_bytes());
        for p in &self.packs {
            let name = names.get(*p as usize).map(String::as_bytes).unwrap_or(b"");
            raw.extend_from_slice(&(name.len() as u32).to_le_bytes());
            raw.extend_from_slice(name);
        }
        raw.extend_from_slice(&self.count.to_le_bytes());
        raw.extend_from_slice(&self.body);
        let count = self.count;
        *self = BlockBuilder::default();
        (raw, count)
    }
}

/// Decodes one block, appending its chunk entries to `entries` and its
/// members (numbering their chunks from where `entries` was) to
/// `members`. Every pack it names must be in the index's `packs`, and
/// every member's chunks must add up to its size.
pub(in crate::snapshot::dedup) fn decode_block(
    raw: &[u8],
    expected_members: u32,
    packs: &HashMap<&str, u32>,
    entries: &mut Vec<IndexEntry>,
    members: &mut Vec<Member>,
) -> Result<(), FormatError> {
    let mut f = Fields(raw);
    let pack_count = f.u32()? as usize;
    let mut local = Vec::with_capacity(pack_count.min(1024));
    for _ in 0..pack_count {
        let name = f.bytes(128)?;
        let number = std::str::from_utf8(&name)
            .ok()
            .and_then(|n| packs.get(n))
            .ok_or_else(|| malformed("index", "a block names a pack its index does not list"))?;
        local.push(*number);
    }
    let count = f.u32()?;
    if count != expected_members {
        return Err(malformed(
            "index",
            "a block holds another number of members than its index says",
        ));
    }
    for _ in 0..count {
        let mut entry = read_head(&mut f)?;
        entry.identity = read_identity(&mut f)?;
        let chunks = f.u32()?;
        let first_chunk = entries.len() as u64;
        let mut total = 0u64;
        for _ in 0..chunks {
            let chunk = f.id()?;
            let pack = *local
                .get(f.u32()? as usize)
                .ok_or_else(|| malformed("index", "a chunk points past its block's packs"))?;
            let location = f.location()?;
            total += location.raw_len as u64;
            entries.push(IndexEntry {
                chunk,
                pack,
                location,
            });
        }
        check_size(&entry, total)?;
        members.push(Member {
            entry,
            first_chunk,
            chunks,
        });
    }
    if !f.0.is_empty() {
        return Err(malformed("index", "a block has bytes after its members"));
    }
    Ok(())
}

/// A member in version 2's encoding (its chunks by number).
pub(super) fn encode_member(m: &Member, out: &mut Vec<u8>) {
    encode_head(&m.entry, out);
    out.extend_from_slice(&m.first_chunk.to_le_bytes());
    out.extend_from_slice(&m.chunks.to_le_bytes());
    encode_identity(&m.entry, out);
}

/// Kind, path, mode, size, mtime and link target.
fn encode_head(e: &TreeEntry, out: &mut Vec<u8>) {
    out.push(e.kind.byte());
    out.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.path);
    out.extend_from_slice(&e.mode.to_le_bytes());
    out.extend_from_slice(&e.size.to_le_bytes());
    out.extend_from_slice(&e.mtime.sec.to_le_bytes());
    out.extend_from_slice(&e.mtime.nsec.to_le_bytes());
    out.extend_from_slice(&(e.link.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.link);
}

/// The files cache's identity: a flag, then device, inode and ctime.
fn encode_identity(e: &TreeEntry, out: &mut Vec<u8>) {
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

/// Offset, stored length, raw length and codec.
pub(super) fn encode_location(l: &ChunkLocation, out: &mut Vec<u8>) {
    out.extend_from_slice(&l.offset.to_le_bytes());
    out.extend_from_slice(&l.stored_len.to_le_bytes());
    out.extend_from_slice(&l.raw_len.to_le_bytes());
    out.push(l.codec.byte());
}

fn read_head(f: &mut Fields<'_>) -> Result<TreeEntry, FormatError> {
    let kind_byte = f.u8()?;
    let kind = EntryKind::from_byte(kind_byte)
        .ok_or_else(|| malformed("index", format!("unknown member kind {kind_byte}")))?;
    Ok(TreeEntry {
        kind,
        path: f.bytes(MAX_NAME)?,
        mode: f.u32()?,
        size: f.u64()?,
        mtime: f.time()?,
        link: f.bytes(MAX_NAME)?,
        identity: None,
    })
}

fn read_identity(f: &mut Fields<'_>) -> Result<Option<FileIdentity>, FormatError> {
    match f.u8()? {
        0 => Ok(None),
        1 => Ok(Some(FileIdentity {
            dev: f.u64()?,
            ino: f.u64()?,
            ctime: f.time()?,
        })),
        _ => Err(malformed("index", "a member's identity flag is not 0 or 1")),
    }
}

/// A file's chunks hold its size; anything else holds nothing.
fn check_size(entry: &TreeEntry, total: u64) -> Result<(), FormatError> {
    if total != entry.size || (entry.kind != EntryKind::File && entry.size != 0) {
        return Err(malformed(
            "index",
            format!(
                "member {:?} is {} bytes but its chunks hold {total}",
                String::from_utf8_lossy(&entry.path),
                entry.size
            ),
        ));
    }
    Ok(())
}

/// Reads fixed-size fields off the front of a byte slice.
pub(super) struct Fields<'a>(pub(super) &'a [u8]);

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
    pub(super) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    pub(super) fn id(&mut self) -> Result<ChunkId, FormatError> {
        let mut id = [0u8; 32];
        id.copy_from_slice(self.take(32)?);
        Ok(id)
    }
    /// A chunk's place in its pack (within the largest pack).
    pub(super) fn location(&mut self) -> Result<ChunkLocation, FormatError> {
        let location = ChunkLocation {
            offset: self.u64()?,
            stored_len: self.u32()?,
            raw_len: self.u32()?,
            codec: Codec::from_byte(self.u8()?, "index")?,
        };
        if location.offset + location.stored_len as u64 > MAX_PACK_BYTES {
            return Err(malformed("index", "an entry points past the largest pack"));
        }
        Ok(location)
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
pub(super) fn decode_members(
    bytes: &[u8],
    entries: &[IndexEntry],
) -> Result<Vec<Member>, FormatError> {
    let mut f = Fields(bytes);
    let count = f.u64()?;
    if count > (bytes.len() / 40) as u64 + 1 {
        return Err(malformed(
            "index",
            "its member count does not match its length",
        ));
    }
    let mut members = Vec::with_capacity(count as usize);
    let mut next_chunk = 0u64;
    for _ in 0..count {
        let mut entry = read_head(&mut f)?;
        let first_chunk = f.u64()?;
        let chunks = f.u32()?;
        entry.identity = read_identity(&mut f)?;
        if first_chunk != next_chunk {
            return Err(malformed("index", "its members' chunks are not in order"));
        }
        let end = first_chunk
            .checked_add(chunks as u64)
            .filter(|e| *e <= entries.len() as u64)
            .ok_or_else(|| malformed("index", "a member's chunks run past the chunk list"))?;
        let total: u64 = entries[first_chunk as usize..end as usize]
            .iter()
            .map(|c| c.location.raw_len as u64)
            .sum();
        check_size(&entry, total)?;
        next_chunk = end;
        members.push(Member {
            entry,
            first_chunk,
            chunks,
        });
    }
    if next_chunk != entries.len() as u64 || !f.0.is_empty() {
        return Err(malformed(
            "index",
            "its members do not cover its chunks exactly",
        ));
    }
    Ok(members)
}
