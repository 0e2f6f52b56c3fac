//! A bounded pipe from blocking code (the `tar` crate) to async consumers,
//! which — unlike a plain duplex — carries the producer's failure to the
//! reader. A tar stream cut short by an error must never look like a
//! complete archive.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Chunks buffered in the pipe.
const DEPTH: usize = 8;
/// Bytes collected before a chunk is sent.
const CHUNK: usize = 256 * 1024;

/// Creates a pipe: write from a blocking thread, read asynchronously.
pub fn pipe() -> (PipeWriter, PipeReader) {
    let (tx, rx) = mpsc::channel(DEPTH);
    (
        PipeWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            ended: false,
        },
        PipeReader {
            rx,
            current: Bytes::new(),
            done: false,
        },
    )
}

/// The blocking end. It must be ended with [`PipeWriter::finish`] or
/// [`PipeWriter::fail`]; dropped otherwise (a panicking producer), the
/// reader sees an error, never a clean end.
pub struct PipeWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    ended: bool,
}

impl PipeWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the archive reader went away"))
    }

    /// Ends the stream with an error the reader will see.
    pub fn fail(mut self, error: io::Error) {
        self.buf.clear();
        self.ended = true;
        let _ = self.tx.blocking_send(Err(error));
    }

    /// Ends the stream normally.
    pub fn finish(mut self) -> io::Result<()> {
        self.ended = true;
        self.send()
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.tx.blocking_send(Err(io::Error::other(
                "the archive producer stopped before finishing the stream",
            )));
        }
    }
}

impl io::Write for PipeWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// The async end.
pub struct PipeReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    done: bool,
}

impl AsyncRead for PipeReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.current.is_empty() {
                let n = buf.remaining().min(self.current.len());
                let chunk = self.current.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            if self.done {
                return Poll::Ready(Ok(()));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) => self.current = b,
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(None) => self.done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Bytes an async stream is read into before blocking code is woken for
/// them: one thread switch per batch rather than per network chunk.
const BATCH: usize = 1 << 20;

/// Reads an async stream from blocking code in batches: a task reads
/// `inner` into buffers of up to [`BATCH`] bytes and hands them over, so a
/// stream arriving in small chunks costs a thread switch per batch.
/// Errors pass through; must be created on a runtime and read from a
/// blocking thread.
pub fn batched_reader<R: AsyncRead + Unpin + Send + 'static>(inner: R) -> BatchedReader {
    // Two batches queued and one being filled: at most 3 MiB per reader.
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(2);
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut inner = inner;
        loop {
            let mut buf = Vec::with_capacity(BATCH);
            let mut ended = false;
            while buf.len() < BATCH {
                match inner.read_buf(&mut buf).await {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            if !buf.is_empty() && tx.send(Ok(Bytes::from(buf))).await.is_err() {
                return;
            }
            if ended {
                // An empty batch marks the end: a reader that sees the
                // channel close without it knows the stream was cut off.
                let _ = tx.send(Ok(Bytes::new())).await;
                return;
            }
        }
    });
    BatchedReader {
        rx,
        current: Bytes::new(),
        done: false,
    }
}

/// The blocking end of [`batched_reader`].
pub struct BatchedReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    done: bool,
}

impl io::Read for BatchedReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(b)) if b.is_empty() => self.done = true,
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                None => {
                    self.done = true;
                    return Err(io::Error::other(
                        "the stream's reader stopped before its end",
                    ));
                }
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}
