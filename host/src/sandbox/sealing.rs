//! Sealing snapshots: optional zstd compression and a digest of the stored
//! bytes on the way out; on the way back, the archive is spooled to disk,
//! its digest verified, and the whole archive validated by the hydrate
//! policy before the first byte reaches the workspace.
//!
//! New seals are BLAKE3 (`blake3:<hex>`): the digest runs on the persist
//! critical path, and SHA-256 took a third of a 1 GiB stop's CPU (profile
//! in BENCHMARKS.md). Seals recorded as `sha256:<hex>` by earlier versions
//! still verify.

use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::byte_pipe::{self, PipeReader};
use crate::workspace::archive::{self, ArchiveError, ArchiveLimits, ArchiveStats};

/// zstd's frame magic, to recognise compressed archives.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// A running digest in one of the algorithms a seal can name.
#[derive(Clone)]
enum SealHasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
    /// Counting only (the snapshot digests the archive itself).
    Off,
}

impl SealHasher {
    /// The algorithm new seals use.
    fn for_new_seal() -> Self {
        SealHasher::Blake3(Box::new(blake3::Hasher::new()))
    }

    /// The algorithm `expected` (a recorded seal) was made with; BLAKE3
    /// when nothing was recorded.
    fn matching(expected: Option<&str>) -> Self {
        match expected {
            Some(d) if d.starts_with("sha256:") => SealHasher::Sha256(sha2::Sha256::new()),
            _ => Self::for_new_seal(),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            SealHasher::Blake3(h) => {
                h.update(bytes);
            }
            SealHasher::Sha256(h) => h.update(bytes),
            SealHasher::Off => {}
        }
    }

    fn digest(&self) -> String {
        match self {
            SealHasher::Blake3(h) => format!("blake3:{}", h.finalize().to_hex()),
            SealHasher::Sha256(h) => format!("sha256:{}", hex::encode(h.clone().finalize())),
            SealHasher::Off => String::new(),
        }
    }
}

/// Digest and size of what passed through.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seal {
    /// `blake3:<hex>` (or `sha256:<hex>` when verifying an older seal).
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

/// What the hashing reader and writer keep of the bytes passing through:
/// the running digest, the count, and whom to tell about progress.
struct Tally {
    hasher: SealHasher,
    size: u64,
    progress: Option<(super::Progress, &'static str)>,
}

impl Tally {
    fn new(hasher: SealHasher) -> Self {
        Tally {
            hasher,
            size: 0,
            progress: None,
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        if let Some((p, op)) = &self.progress {
            (p.0)(op, self.size);
        }
    }

    fn seal(&self) -> Seal {
        Seal {
            digest: self.hasher.digest(),
            size: self.size,
        }
    }
}

/// An `AsyncRead` that hashes what it yields.
pub(crate) struct HashingReader<R> {
    inner: R,
    tally: Tally,
    out: Arc<Mutex<Option<Seal>>>,
}

impl<R> HashingReader<R> {
    /// Wraps `inner`; the seal appears in `out` at the end of the stream.
    pub(crate) fn new(inner: R) -> (Self, Arc<Mutex<Option<Seal>>>) {
        let out = Arc::new(Mutex::new(None));
        (
            HashingReader {
                inner,
                tally: Tally::new(SealHasher::for_new_seal()),
                out: out.clone(),
            },
            out,
        )
    }

    /// Counts (and reports progress) without hashing: for snapshots that
    /// digest the archive themselves. The seal's digest is empty.
    pub(crate) fn counting(inner: R) -> (Self, Arc<Mutex<Option<Seal>>>) {
        let (mut reader, out) = Self::new(inner);
        reader.tally.hasher = SealHasher::Off;
        (reader, out)
    }

    /// Reports the byte count to `progress` as the stream moves.
    pub(crate) fn with_progress(
        mut self,
        progress: Option<super::Progress>,
        operation: &'static str,
    ) -> Self {
        self.tally.progress = progress.map(|p| (p, operation));
        self
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for HashingReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let me = &mut *self;
        match Pin::new(&mut me.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                if fresh.is_empty() {
                    if let Ok(mut o) = me.out.lock() {
                        *o = Some(me.tally.seal());
                    }
                } else {
                    me.tally.add(fresh);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

/// An `AsyncWrite` into a spool file that hashes what it receives.
pub(crate) struct HashingWriter<W> {
    inner: W,
    tally: Tally,
}

impl<W> HashingWriter<W> {
    /// Wraps `inner`, hashing with the algorithm of the seal the bytes
    /// will be checked against (`expected`, e.g. `blake3:…`).
    pub(crate) fn new(inner: W, expected: Option<&str>) -> Self {
        HashingWriter {
            inner,
            tally: Tally::new(SealHasher::matching(expected)),
        }
    }

    /// Counts (and reports progress) without hashing: for snapshots that
    /// verify what they restore themselves. The seal's digest is empty.
    pub(crate) fn counting(inner: W) -> Self {
        let mut writer = Self::new(inner, None);
        writer.tally.hasher = SealHasher::Off;
        writer
    }

    /// Reports the byte count to `progress` as the stream moves.
    pub(crate) fn with_progress(
        mut self,
        progress: Option<super::Progress>,
        operation: &'static str,
    ) -> Self {
        self.tally.progress = progress.map(|p| (p, operation));
        self
    }

    /// The seal of everything written.
    pub(crate) fn seal(&self) -> Seal {
        self.tally.seal()
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for HashingWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        match Pin::new(&mut me.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                me.tally.add(&buf[..n]);
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The archive inside a spooled file, decompressing if it is zstd.
fn open_spooled(path: &Path) -> io::Result<Box<dyn Read + Send>> {
    let mut file = std::fs::File::open(path)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic)?;
    file.rewind()?;
    if n == 4 && magic == ZSTD_MAGIC {
        Ok(Box::new(zstd::stream::read::Decoder::new(file)?))
    } else {
        Ok(Box::new(io::BufReader::with_capacity(256 * 1024, file)))
    }
}

/// A stored archive as a tar reader: zstd-decompressed when it starts
/// with zstd's magic.
fn open_stored<R: Read + Send + 'static>(mut source: R) -> io::Result<Box<dyn Read + Send>> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < magic.len() {
        match source.read(&mut magic[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let head = io::Cursor::new(magic[..n].to_vec()).chain(source);
    if n == 4 && magic == ZSTD_MAGIC {
        Ok(Box::new(zstd::stream::read::Decoder::new(head)?))
    } else {
        Ok(Box::new(io::BufReader::with_capacity(256 * 1024, head)))
    }
}

/// One pass, no spool: reads the stored archive from `source` as it
/// arrives and streams a clean copy under the directory `prefix` (a
/// staging directory the backend moves into place only once everything
/// checked out). The filter's verdict comes back through the handle.
pub(crate) fn stream_filtered<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    source: R,
    limits: ArchiveLimits,
    prefix: PathBuf,
) -> (
    PipeReader,
    tokio::task::JoinHandle<Result<ArchiveStats, ArchiveError>>,
) {
    let (writer, reader) = byte_pipe::pipe();
    let bridge = byte_pipe::batched_reader(source);
    let handle = tokio::task::spawn_blocking(move || {
        filter_to_pipe(open_stored(bridge), writer, limits, Some(&prefix))
    });
    (reader, handle)
}

/// Filters `source` (once opened) into `writer`, ending the pipe cleanly
/// only if every entry passed; the reader sees the filter's error otherwise.
fn filter_to_pipe(
    source: io::Result<Box<dyn Read + Send>>,
    mut writer: byte_pipe::PipeWriter,
    limits: ArchiveLimits,
    prefix: Option<&Path>,
) -> Result<ArchiveStats, ArchiveError> {
    let result = source
        .map_err(ArchiveError::Io)
        .and_then(|tar| archive::filter_under(tar, Some(&mut writer), limits, prefix));
    match &result {
        Ok(_) => {
            let _ = writer.finish();
        }
        Err(e) => writer.fail(io::Error::other(e.to_string())),
    }
    result
}

/// Pass one: validates the whole spooled archive; writes nothing.
pub(crate) async fn validate_spooled(
    path: &Path,
    limits: ArchiveLimits,
) -> Result<ArchiveStats, ArchiveError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let source = open_spooled(&path)?;
        archive::filter(source, None::<io::Sink>, limits)
    })
    .await
    .map_err(|e| ArchiveError::Io(io::Error::other(e)))?
}

/// Pass two: streams a clean copy of the spooled archive. The filter's own
/// verdict comes back through the returned handle.
pub(crate) fn stream_spooled(
    path: &Path,
    limits: ArchiveLimits,
) -> (
    PipeReader,
    tokio::task::JoinHandle<Result<ArchiveStats, ArchiveError>>,
) {
    let (writer, reader) = byte_pipe::pipe();
    let path = path.to_path_buf();
    let handle = tokio::task::spawn_blocking(move || {
        filter_to_pipe(open_spooled(&path), writer, limits, None)
    });
    (reader, handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn new_seals_are_blake3_of_the_bytes() {
        let data = b"a workspace archive".to_vec();
        let (mut reader, seal) = HashingReader::new(&data[..]);
        let mut sink = Vec::new();
        reader.read_to_end(&mut sink).await.unwrap();
        let seal = seal.lock().unwrap().clone().unwrap();
        assert_eq!(
            seal.digest,
            format!("blake3:{}", blake3::hash(&data).to_hex())
        );
        assert_eq!(seal.size, data.len() as u64);
    }

    #[tokio::test]
    async fn verifying_an_older_sha256_seal_hashes_with_sha256() {
        let data = b"archived by an older berth".to_vec();
        let recorded = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&data)));
        let mut writer = HashingWriter::new(Vec::new(), Some(&recorded));
        writer.write_all(&data).await.unwrap();
        assert_eq!(writer.seal().digest, recorded);
        // With nothing recorded, the restore side hashes like new seals.
        let mut writer = HashingWriter::new(Vec::new(), None);
        writer.write_all(&data).await.unwrap();
        assert!(writer.seal().digest.starts_with("blake3:"));
    }
}
