//! Sealing snapshots: optional zstd compression and a SHA-256 digest of the
//! stored bytes on the way out; on the way back, the archive is spooled to
//! disk, its digest verified, and the whole archive validated by the hydrate
//! policy before the first byte reaches the workspace.

use std::io::{self, Read, Seek};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::byte_pipe::{self, PipeReader};
use crate::workspace::archive::{self, ArchiveError, ArchiveLimits, ArchiveStats};

/// zstd's frame magic, to recognise compressed archives.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Digest and size of what passed through.
#[derive(Debug, Default, Clone)]
pub struct Seal {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

/// An `AsyncRead` that hashes what it yields.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    size: u64,
    out: Arc<Mutex<Option<Seal>>>,
    progress: Option<(super::Progress, &'static str)>,
}

impl<R> HashingReader<R> {
    /// Wraps `inner`; the seal appears in `out` at the end of the stream.
    pub fn new(inner: R) -> (Self, Arc<Mutex<Option<Seal>>>) {
        let out = Arc::new(Mutex::new(None));
        (
            HashingReader {
                inner,
                hasher: Sha256::new(),
                size: 0,
                out: out.clone(),
                progress: None,
            },
            out,
        )
    }

    /// Reports the byte count to `progress` as the stream moves.
    pub fn with_progress(
        mut self,
        progress: Option<super::Progress>,
        operation: &'static str,
    ) -> Self {
        self.progress = progress.map(|p| (p, operation));
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
                    let digest = format!("sha256:{}", hex::encode(me.hasher.clone().finalize()));
                    if let Ok(mut o) = me.out.lock() {
                        *o = Some(Seal {
                            digest,
                            size: me.size,
                        });
                    }
                } else {
                    me.hasher.update(fresh);
                    me.size += fresh.len() as u64;
                    if let Some((p, op)) = &me.progress {
                        (p.0)(op, me.size);
                    }
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

/// An `AsyncWrite` into a spool file that hashes what it receives.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
    progress: Option<(super::Progress, &'static str)>,
}

impl<W> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
            progress: None,
        }
    }

    /// Reports the byte count to `progress` as the stream moves.
    pub fn with_progress(
        mut self,
        progress: Option<super::Progress>,
        operation: &'static str,
    ) -> Self {
        self.progress = progress.map(|p| (p, operation));
        self
    }

    /// The seal of everything written.
    pub fn seal(&self) -> Seal {
        Seal {
            digest: format!("sha256:{}", hex::encode(self.hasher.clone().finalize())),
            size: self.size,
        }
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
                me.hasher.update(&buf[..n]);
                me.size += n as u64;
                if let Some((p, op)) = &me.progress {
                    (p.0)(op, me.size);
                }
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

/// Pass one: validates the whole spooled archive; writes nothing.
pub async fn validate_spooled(
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
pub fn stream_spooled(
    path: &Path,
    limits: ArchiveLimits,
) -> (
    PipeReader,
    tokio::task::JoinHandle<Result<ArchiveStats, ArchiveError>>,
) {
    let (writer, reader) = byte_pipe::pipe();
    let path = path.to_path_buf();
    let handle = tokio::task::spawn_blocking(move || {
        let source = match open_spooled(&path) {
            Ok(s) => s,
            Err(e) => {
                let message = e.to_string();
                writer.fail(e);
                return Err(ArchiveError::Io(io::Error::other(message)));
            }
        };
        let mut writer = writer;
        let result = archive::filter(source, Some(&mut writer), limits);
        match &result {
            Ok(_) => {
                let _ = writer.finish();
            }
            Err(e) => writer.fail(io::Error::other(e.to_string())),
        }
        result
    });
    (reader, handle)
}
