//! The walk on the wire: the request (excludes and the known files) the
//! host sends, and the items the agent streams back, every length bounded
//! and every tag checked, since what the agent sends is untrusted.

use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::*;

/// The most a walk request (excludes and known files) may be.
pub const MAX_REQUEST: u64 = 512 << 20;
/// The longest path or link target on the wire.
const MAX_NAME: usize = 64 * 1024;
/// The largest content piece on the wire.
const MAX_PIECE: usize = 1 << 20;
const REQUEST_MAGIC: &[u8; 4] = b"BWK1";

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}
fn put_time(out: &mut Vec<u8>, t: Timestamp) {
    put_u64(out, t.sec as u64);
    put_u32(out, t.nsec);
}
fn put_identity(out: &mut Vec<u8>, id: &Option<FileIdentity>) {
    match id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            put_u64(out, id.dev);
            put_u64(out, id.ino);
            put_time(out, id.ctime);
        }
    }
}

fn bad(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Reads wire fields, bounded.
struct Wire<R: Read>(R);

impl<R: Read> Wire<R> {
    fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.0.read_exact(&mut b)?;
        Ok(b[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.0.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.0.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn time(&mut self) -> io::Result<Timestamp> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(bad("a time's nanoseconds are out of range"));
        }
        Ok(Timestamp { sec, nsec })
    }
    fn bytes(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(bad(format!(
                "a field of {n} bytes is over the {max}-byte limit"
            )));
        }
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn identity(&mut self) -> io::Result<Option<FileIdentity>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(FileIdentity {
                dev: self.u64()?,
                ino: self.u64()?,
                ctime: self.time()?,
            })),
            _ => Err(bad("an identity flag is not 0 or 1")),
        }
    }
}

/// The request a host sends `berth-agent fs ROOT walk` on its stdin: the
/// paths to leave out and the files the parent generation recorded.
pub fn encode_request(exclude: &[PathBuf], known: &KnownFiles) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(REQUEST_MAGIC);
    put_u32(&mut out, exclude.len() as u32);
    for x in exclude {
        put_bytes(&mut out, x.as_os_str().as_bytes());
    }
    put_u64(&mut out, known.files.len() as u64);
    for (path, s) in &known.files {
        put_bytes(&mut out, path);
        put_u64(&mut out, s.identity.dev);
        put_u64(&mut out, s.identity.ino);
        put_time(&mut out, s.identity.ctime);
        put_u64(&mut out, s.size);
        put_u32(&mut out, s.mode);
        put_time(&mut out, s.mtime);
    }
    out
}

/// Reads [`encode_request`]'s bytes (at most [`MAX_REQUEST`]).
pub fn decode_request<R: Read>(input: R) -> io::Result<(Vec<PathBuf>, KnownFiles)> {
    let mut w = Wire(input.take(MAX_REQUEST));
    let mut magic = [0u8; 4];
    w.0.read_exact(&mut magic)?;
    if &magic != REQUEST_MAGIC {
        return Err(bad("not a walk request"));
    }
    let n = w.u32()?;
    let mut exclude = Vec::new();
    for _ in 0..n {
        exclude.push(PathBuf::from(std::ffi::OsStr::from_bytes(
            &w.bytes(MAX_NAME)?,
        )));
    }
    let count = w.u64()?;
    let mut files = HashMap::new();
    for _ in 0..count {
        let path = w.bytes(MAX_NAME)?;
        let identity = FileIdentity {
            dev: w.u64()?,
            ino: w.u64()?,
            ctime: w.time()?,
        };
        let stamp = FileStamp {
            identity,
            size: w.u64()?,
            mode: w.u32()?,
            mtime: w.time()?,
        };
        files.insert(path, stamp);
    }
    Ok((
        exclude,
        KnownFiles {
            instance: None,
            files,
        },
    ))
}

/// Writes tree items on the wire: `E` entry, `D` content piece, `F` end
/// of a file, then `Z` with the walk's counts (or `X` and a reason).
pub struct ItemWriter<W: io::Write> {
    out: W,
    buf: Vec<u8>,
}

impl<W: io::Write> ItemWriter<W> {
    /// Items written to `out`.
    pub fn new(out: W) -> Self {
        ItemWriter {
            out,
            buf: Vec::with_capacity(1024),
        }
    }

    /// Writes one item.
    pub fn item(&mut self, item: &TreeItem) -> io::Result<()> {
        self.buf.clear();
        match item {
            TreeItem::Entry { entry, unchanged } => {
                self.buf.push(b'E');
                self.buf.push(entry.kind.byte());
                put_bytes(&mut self.buf, &entry.path);
                put_u32(&mut self.buf, entry.mode);
                put_u64(&mut self.buf, entry.size);
                put_time(&mut self.buf, entry.mtime);
                put_bytes(&mut self.buf, &entry.link);
                self.buf.push(u8::from(*unchanged));
                put_identity(&mut self.buf, &entry.identity);
                self.out.write_all(&self.buf)
            }
            TreeItem::Data(piece) => {
                for part in piece.chunks(MAX_PIECE) {
                    self.buf.clear();
                    self.buf.push(b'D');
                    put_u32(&mut self.buf, part.len() as u32);
                    self.out.write_all(&self.buf)?;
                    self.out.write_all(part)?;
                }
                Ok(())
            }
            TreeItem::EndOfFile { identity } => {
                self.buf.push(b'F');
                put_identity(&mut self.buf, identity);
                self.out.write_all(&self.buf)
            }
        }
    }

    /// Ends the stream with the walk's counts.
    pub fn finish(mut self, stats: &WalkStats) -> io::Result<W> {
        self.buf.clear();
        self.buf.push(b'Z');
        for n in [
            stats.entries,
            stats.files_read,
            stats.bytes_read,
            stats.files_unchanged,
            stats.bytes_unchanged,
            stats.skipped,
        ] {
            put_u64(&mut self.buf, n);
        }
        self.out.write_all(&self.buf)?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Ends the stream with a failure.
    pub fn fail(mut self, why: &str) -> io::Result<()> {
        self.buf.clear();
        self.buf.push(b'X');
        put_bytes(&mut self.buf, &why.as_bytes()[..why.len().min(MAX_NAME)]);
        self.out.write_all(&self.buf)?;
        self.out.flush()
    }
}

/// What an [`ItemReader`] read next.
#[derive(Debug)]
pub enum WireEvent {
    /// An item.
    Item(TreeItem),
    /// The end, with the walk's counts.
    End(WalkStats),
}

/// Reads tree items off the wire, trusting nothing: names and pieces are
/// bounded, a file's content must add up to its size, and every entry's
/// fields must be in range.
pub struct ItemReader<R: Read> {
    wire: Wire<R>,
    /// Content still due for the current file.
    due: Option<u64>,
}

impl<R: Read> ItemReader<R> {
    /// Items read from `input`.
    pub fn new(input: R) -> Self {
        ItemReader {
            wire: Wire(input),
            due: None,
        }
    }

    /// The next item, or the end.
    pub fn read_event(&mut self) -> io::Result<WireEvent> {
        let tag = self.wire.u8()?;
        match tag {
            b'E' => {
                if self.due.is_some() {
                    return Err(bad("an entry came inside a file's content"));
                }
                let kind = EntryKind::from_byte(self.wire.u8()?)
                    .ok_or_else(|| bad("an unknown entry kind"))?;
                let path = self.wire.bytes(MAX_NAME)?;
                let mode = self.wire.u32()? & 0o7777;
                let size = self.wire.u64()?;
                let mtime = self.wire.time()?;
                let link = self.wire.bytes(MAX_NAME)?;
                let unchanged = self.wire.u8()? != 0;
                let identity = self.wire.identity()?;
                if kind != EntryKind::File && size != 0 {
                    return Err(bad("a non-file entry with content"));
                }
                if kind == EntryKind::File && !unchanged {
                    self.due = Some(size);
                }
                Ok(WireEvent::Item(TreeItem::Entry {
                    entry: TreeEntry {
                        path,
                        kind,
                        mode,
                        size,
                        mtime,
                        link,
                        identity,
                    },
                    unchanged,
                }))
            }
            b'D' => {
                let piece = self.wire.bytes(MAX_PIECE)?;
                match &mut self.due {
                    Some(due) if *due >= piece.len() as u64 => {
                        *due -= piece.len() as u64;
                        Ok(WireEvent::Item(TreeItem::Data(piece)))
                    }
                    _ => Err(bad("content beyond a file's size")),
                }
            }
            b'F' => {
                if self.due != Some(0) {
                    return Err(bad("a file ended before its size"));
                }
                self.due = None;
                let identity = self.wire.identity()?;
                Ok(WireEvent::Item(TreeItem::EndOfFile { identity }))
            }
            b'Z' => {
                if self.due.is_some() {
                    return Err(bad("the walk ended inside a file"));
                }
                let mut n = [0u64; 6];
                for v in &mut n {
                    *v = self.wire.u64()?;
                }
                Ok(WireEvent::End(WalkStats {
                    entries: n[0],
                    files_read: n[1],
                    bytes_read: n[2],
                    files_unchanged: n[3],
                    bytes_unchanged: n[4],
                    skipped: n[5],
                }))
            }
            b'X' => {
                let why = self.wire.bytes(MAX_NAME)?;
                Err(io::Error::other(format!(
                    "the walk in the sandbox failed: {}",
                    String::from_utf8_lossy(&why)
                )))
            }
            other => Err(bad(format!("an unknown item tag {other}"))),
        }
    }
}
