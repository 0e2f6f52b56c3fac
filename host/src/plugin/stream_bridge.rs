//! Connects tokio byte streams to the guest's `wasi:io` streams through
//! small bounded channels, so an archive of any size crosses the boundary
//! in constant memory: at most [`CHANNEL_DEPTH`] chunks of at most
//! [`CHUNK`] bytes are in flight in each direction.
//!
//! Host → guest (`upload`/`persist`): [`pump`] reads the caller's
//! `AsyncRead` into the channel; the guest reads it as an `input-stream`.
//! A read error in the caller's stream reaches the guest as
//! `last-operation-failed` (the contract's "producer failed, discard") and
//! is recorded in the [`PumpReport`].
//!
//! Guest → host (`download`/`restore`): the guest writes an
//! `output-stream`; [`drain`] copies the channel into the caller's
//! `AsyncWrite`.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use wasmtime_wasi::p2::{InputStream, OutputStream, Pollable, StreamError, StreamResult};

/// Largest chunk moved at once.
pub(crate) const CHUNK: usize = 256 * 1024;
/// Chunks buffered per direction.
pub(crate) const CHANNEL_DEPTH: usize = 4;

/// What the pump saw of the caller's stream.
#[derive(Default)]
pub(crate) struct PumpReport {
    /// The caller's stream reached its end and every byte was queued.
    eof: AtomicBool,
    /// The caller's stream failed.
    error: Mutex<Option<io::Error>>,
    /// The guest read until `closed` (it consumed the whole stream).
    guest_saw_end: AtomicBool,
}

impl PumpReport {
    /// Takes the caller-side read error, if any.
    pub(crate) fn take_error(&self) -> Option<io::Error> {
        self.error.lock().ok().and_then(|mut e| e.take())
    }

    /// Whether the guest read the stream to its end.
    pub(crate) fn guest_saw_end(&self) -> bool {
        self.guest_saw_end.load(Ordering::SeqCst)
    }
}

/// One message on the upload channel.
pub(crate) enum Item {
    Data(Bytes),
    Failed(String),
}

/// The guest's view of a host byte stream.
pub(crate) struct GuestInput {
    rx: mpsc::Receiver<Item>,
    pending: Bytes,
    failure: Option<String>,
    closed: bool,
    report: Arc<PumpReport>,
}

/// Creates the channel for an upload: the sender goes to [`pump`], the
/// [`GuestInput`] into the guest's resource table.
pub(crate) fn host_to_guest() -> (mpsc::Sender<Item>, GuestInput, Arc<PumpReport>) {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    let report = Arc::new(PumpReport::default());
    let input = GuestInput {
        rx,
        pending: Bytes::new(),
        failure: None,
        closed: false,
        report: report.clone(),
    };
    (tx, input, report)
}

/// Copies `source` into the channel until its end or an error. Stops early
/// (without error) when the guest drops its end.
pub(crate) async fn pump(
    source: &mut (dyn AsyncRead + Unpin + Send),
    tx: mpsc::Sender<Item>,
    report: Arc<PumpReport>,
) {
    loop {
        let mut buf = BytesMut::with_capacity(CHUNK);
        match source.read_buf(&mut buf).await {
            Ok(0) => {
                report.eof.store(true, Ordering::SeqCst);
                return;
            }
            Ok(_) => {
                if tx.send(Item::Data(buf.freeze())).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let message = format!("the archive being stored failed to read: {e}");
                if let Ok(mut slot) = report.error.lock() {
                    *slot = Some(e);
                }
                let _ = tx.send(Item::Failed(message)).await;
                return;
            }
        }
    }
}

impl GuestInput {
    fn take(&mut self, size: usize) -> Bytes {
        let n = size.min(self.pending.len());
        self.pending.split_to(n)
    }

    fn accept(&mut self, item: Option<Item>) {
        match item {
            Some(Item::Data(b)) => self.pending = b,
            Some(Item::Failed(m)) => self.failure = Some(m),
            None => self.closed = true,
        }
    }
}

#[async_trait::async_trait]
impl Pollable for GuestInput {
    async fn ready(&mut self) {
        if !self.pending.is_empty() || self.failure.is_some() || self.closed {
            return;
        }
        let item = self.rx.recv().await;
        self.accept(item);
    }
}

#[async_trait::async_trait]
impl InputStream for GuestInput {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        if self.pending.is_empty() && self.failure.is_none() && !self.closed {
            match self.rx.try_recv() {
                Ok(item) => self.accept(Some(item)),
                Err(mpsc::error::TryRecvError::Empty) => return Ok(Bytes::new()),
                Err(mpsc::error::TryRecvError::Disconnected) => self.accept(None),
            }
        }
        if !self.pending.is_empty() {
            return Ok(self.take(size));
        }
        if let Some(message) = self.failure.take() {
            // Later reads report `closed`, but the stream never counts as
            // having ended cleanly.
            self.closed = true;
            return Err(StreamError::LastOperationFailed(wasmtime::format_err!(
                "{message}"
            )));
        }
        if self.report.eof.load(Ordering::SeqCst) {
            self.report.guest_saw_end.store(true, Ordering::SeqCst);
        }
        Err(StreamError::Closed)
    }
}

/// The guest's output stream into a host channel.
pub(crate) struct GuestOutput {
    tx: mpsc::Sender<Bytes>,
    permit: Option<mpsc::OwnedPermit<Bytes>>,
    closed: bool,
}

/// Creates the channel for a download: the [`GuestOutput`] goes into the
/// guest's resource table, the receiver to [`drain`].
pub(crate) fn guest_to_host() -> (GuestOutput, mpsc::Receiver<Bytes>) {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    (
        GuestOutput {
            tx,
            permit: None,
            closed: false,
        },
        rx,
    )
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {
        if self.permit.is_some() || self.closed {
            return;
        }
        match self.tx.clone().reserve_owned().await {
            Ok(p) => self.permit = Some(p),
            Err(_) => self.closed = true,
        }
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() > CHUNK {
            return Err(StreamError::trap(
                "write larger than check-write allowed (contract: wasi:io/streams)",
            ));
        }
        match self.permit.take() {
            Some(p) => {
                p.send(bytes);
                Ok(())
            }
            None => Err(StreamError::trap(
                "write without a preceding check-write (contract: wasi:io/streams)",
            )),
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Data is handed over on `write`; the host drains the channel after
        // the call, so there is nothing to wait for here.
        if self.closed {
            Err(StreamError::Closed)
        } else {
            Ok(())
        }
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if self.permit.is_some() {
            return Ok(CHUNK);
        }
        match self.tx.clone().try_reserve_owned() {
            Ok(p) => {
                self.permit = Some(p);
                Ok(CHUNK)
            }
            Err(mpsc::error::TrySendError::Full(_)) => Ok(0),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.closed = true;
                Err(StreamError::Closed)
            }
        }
    }
}

/// Copies everything the guest writes into `sink`, then flushes it.
pub(crate) async fn drain(
    mut rx: mpsc::Receiver<Bytes>,
    sink: &mut (dyn AsyncWrite + Unpin + Send),
) -> io::Result<u64> {
    let mut total = 0u64;
    while let Some(chunk) = rx.recv().await {
        sink.write_all(&chunk).await?;
        total += chunk.len() as u64;
    }
    sink.flush().await?;
    Ok(total)
}

/// Runs the guest call while driving `side` (a pump or a drain) on the same
/// task. Returns the guest's result and the side's, if it finished first.
pub(crate) async fn alongside<G, S>(guest: G, side: S) -> (G::Output, Option<S::Output>)
where
    G: Future,
    S: Future,
{
    tokio::pin!(guest);
    tokio::pin!(side);
    let mut side_out = None;
    loop {
        tokio::select! {
            biased;
            g = &mut guest => return (g, side_out),
            s = &mut side, if side_out.is_none() => side_out = Some(s),
        }
    }
}
