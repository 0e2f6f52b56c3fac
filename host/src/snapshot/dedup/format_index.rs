//! The binary index of a generation: its header, one entry per chunk
//! and the members (files, directories, links) that the chunks make up.

use super::members::{decode_block, decode_members, encode_location, encode_member, Fields};
use super::*;

/// The index header (JSON inside the binary index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::snapshot::dedup) struct IndexHeader {
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
pub(in crate::snapshot::dedup) struct IndexEntry {
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
pub(in crate::snapshot::dedup) struct Member {
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
pub(in crate::snapshot::dedup) struct Index {
    /// What the index describes.
    pub header: IndexHeader,
    /// The chunks, in tar order.
    pub entries: Vec<IndexEntry>,
    /// Version 2 and 3: the members; empty in version 1.
    pub members: Vec<Member>,
    /// Version 3: where the blocks of members are stored (the index
    /// object holds these; the members and chunks come from the blocks).
    pub blocks: Vec<BlockRef>,
}

/// A piece of the tar a generation renders.
pub(in crate::snapshot::dedup) enum Segment<'a> {
    /// Bytes that are not chunks (headers, padding, the end).
    Inline(Vec<u8>),
    /// A chunk.
    Chunk(&'a IndexEntry),
}

impl Index {
    /// The binary form: magic, header length and JSON, entry count and
    /// entries, BLAKE3 of all that.
    pub(in crate::snapshot::dedup) fn encode(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out =
            Vec::with_capacity(8 + 4 + header.len() + 8 + self.entries.len() * INDEX_ENTRY + 32);
        out.extend_from_slice(match self.header.version {
            1 => INDEX_MAGIC,
            2 => INDEX_MAGIC_V2,
            _ => INDEX_MAGIC_V3,
        });
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        if self.header.version >= 3 {
            out.extend_from_slice(&(self.blocks.len() as u64).to_le_bytes());
            for b in &self.blocks {
                b.encode(&mut out);
            }
            let sum = blake3::hash(&out);
            out.extend_from_slice(sum.as_bytes());
            return out;
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.chunk);
            out.extend_from_slice(&e.pack.to_le_bytes());
            encode_location(&e.location, &mut out);
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
    /// Version 3 reads as an *outline*: the header and the blocks, with no
    /// members or chunks until [`Index::complete`] reads the blocks.
    pub(in crate::snapshot::dedup) fn decode(bytes: &[u8]) -> Result<Index, FormatError> {
        let kind = "index";
        let magic_version = match bytes.get(..8) {
            Some(m) if m == INDEX_MAGIC => 1,
            Some(m) if m == INDEX_MAGIC_V2 => 2,
            Some(m) if m == INDEX_MAGIC_V3 => 3,
            _ => 0,
        };
        if bytes.len() < 8 + 4 + 8 + 32 || magic_version == 0 {
            return Err(malformed(kind, "no index magic"));
        }
        let v2 = magic_version == 2;
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
        if version.version != magic_version {
            return Err(FormatError::Version(version.version));
        }
        let header: IndexHeader = serde_json::from_slice(&body[12..header_end])
            .map_err(|e| malformed(kind, e.to_string()))?;
        for p in &header.packs {
            if names::parse_pack(p).is_none() {
                return Err(malformed(kind, format!("{p:?} is not a pack name")));
            }
        }
        if magic_version == 3 {
            let blocks = BlockRef::decode_all(&body[header_end..], header.packs.len())?;
            return Ok(Index {
                header,
                entries: Vec::new(),
                members: Vec::new(),
                blocks,
            });
        }
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
        let mut f = Fields(rest);
        while !f.0.is_empty() {
            let chunk = f.id()?;
            let pack = f.u32()?;
            if pack as usize >= header.packs.len() {
                return Err(malformed(kind, "an entry points past the pack list"));
            }
            let location = f.location()?;
            total += location.raw_len as u64;
            entries.push(IndexEntry {
                chunk,
                pack,
                location,
            });
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
                blocks: Vec::new(),
            });
        }
        let members = decode_members(member_bytes, &entries)?;
        let index = Index {
            header,
            entries,
            members,
            blocks: Vec::new(),
        };
        index.check_tree()?;
        Ok(index)
    }

    /// Version 3: reads the members and chunks from the blocks of an
    /// outline ([`Index::decode`]); `raw_block` gives each block's raw
    /// bytes (it is checked against its id here). Then the tree is checked
    /// as a version-2 index is: sizes, the rendered length, the seal.
    pub(in crate::snapshot::dedup) fn complete(
        &mut self,
        mut raw_block: impl FnMut(&BlockRef) -> Result<Vec<u8>, FormatError>,
    ) -> Result<(), FormatError> {
        if self.header.version < 3 || !self.members.is_empty() {
            return Ok(());
        }
        let packs: std::collections::HashMap<&str, u32> = self
            .header
            .packs
            .iter()
            .enumerate()
            .map(|(n, p)| (p.as_str(), n as u32))
            .collect();
        let mut entries = Vec::new();
        let mut members = Vec::new();
        for block in &self.blocks {
            let raw = raw_block(block)?;
            if blake3::hash(&raw).as_bytes() != &block.id {
                return Err(FormatError::Chunk(hex::encode(block.id)));
            }
            decode_block(&raw, block.members, &packs, &mut entries, &mut members)?;
        }
        self.entries = entries;
        self.members = members;
        self.check_tree()
    }

    /// A version-2 or 3 tree's checks: the members render `tar_size`
    /// bytes and seal to `tar_digest`.
    fn check_tree(&self) -> Result<(), FormatError> {
        let kind = "index";
        let index = self;
        let size = index.rendered_size();
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
        Ok(())
    }

    /// Version 2: the seal of the members (identities left out) and
    /// their chunks' ids and lengths — what the sandbox state records.
    /// Every chunk is checked against its id as it is read, so a restore
    /// that matches the seal is the tree that was stopped.
    pub(in crate::snapshot::dedup) fn tree_seal(&self) -> String {
        // The fields go through a buffer: BLAKE3 hashes the same bytes to
        // the same seal however they are handed over, and a dozen small
        // updates per member cost more than the hashing.
        const FLUSH_AT: usize = 64 * 1024;
        let mut h = blake3::Hasher::new();
        let mut buf = Vec::with_capacity(FLUSH_AT + 4096);
        buf.extend_from_slice(b"berth-tree-v2\0");
        for m in &self.members {
            let e = &m.entry;
            buf.push(e.kind.byte());
            buf.extend_from_slice(&(e.path.len() as u64).to_le_bytes());
            buf.extend_from_slice(&e.path);
            buf.extend_from_slice(&e.mode.to_le_bytes());
            buf.extend_from_slice(&e.size.to_le_bytes());
            buf.extend_from_slice(&e.mtime.sec.to_le_bytes());
            buf.extend_from_slice(&e.mtime.nsec.to_le_bytes());
            buf.extend_from_slice(&(e.link.len() as u64).to_le_bytes());
            buf.extend_from_slice(&e.link);
            buf.extend_from_slice(&m.chunks.to_le_bytes());
            for c in self.run(m) {
                buf.extend_from_slice(&c.chunk);
                buf.extend_from_slice(&c.location.raw_len.to_le_bytes());
            }
            if buf.len() >= FLUSH_AT {
                h.update(&buf);
                buf.clear();
            }
        }
        h.update(&buf);
        format!("{TREE_SEAL_PREFIX}{}", h.finalize().to_hex())
    }

    /// A member's chunks.
    pub(in crate::snapshot::dedup) fn run(&self, m: &Member) -> &[IndexEntry] {
        let first = m.first_chunk as usize;
        self.entries
            .get(first..first + m.chunks as usize)
            .unwrap_or(&[])
    }

    /// Version 2: the length of the tar the members render.
    pub(in crate::snapshot::dedup) fn rendered_size(&self) -> u64 {
        let mut size = tree::END_OF_ARCHIVE as u64;
        for m in &self.members {
            size += tree::header_len(&m.entry);
            size += m.entry.size + tree::padding(m.entry.size);
        }
        size
    }

    /// The tar, as pieces: version 1, its chunks; version 2, each
    /// member's header, content chunks and padding, then the end.
    pub(in crate::snapshot::dedup) fn segments(
        &self,
    ) -> Box<dyn Iterator<Item = io::Result<Segment<'_>>> + '_> {
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
    pub(in crate::snapshot::dedup) fn packs_in_use(&self) -> Vec<u32> {
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
