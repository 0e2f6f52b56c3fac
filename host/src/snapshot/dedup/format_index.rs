//! The binary index of a generation: its header, one entry per chunk
//! and the members (files, directories, links) that the chunks make up.

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
    /// Version 2: the members; empty in version 1.
    pub members: Vec<Member>,
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
    pub(in crate::snapshot::dedup) fn decode(bytes: &[u8]) -> Result<Index, FormatError> {
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
    pub(in crate::snapshot::dedup) fn tree_seal(&self) -> String {
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
    pub(in crate::snapshot::dedup) fn run(&self, m: &Member) -> &[IndexEntry] {
        let first = m.first_chunk as usize;
        self.entries
            .get(first..first + m.chunks as usize)
            .unwrap_or(&[])
    }

    /// Version 2: the length of the tar the members render.
    pub(in crate::snapshot::dedup) fn rendered_size(&self) -> io::Result<u64> {
        let mut size = tree::END_OF_ARCHIVE as u64;
        for m in &self.members {
            size += tree::render_header(&m.entry)?.len() as u64;
            size += m.entry.size + tree::padding(m.entry.size);
        }
        Ok(size)
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
