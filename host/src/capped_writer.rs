//! A writer with a byte cap: how every stream from outside (a store's
//! download, a plugin's answer) is kept within what is expected.

use std::sync::Arc;

/// An `AsyncWrite` that refuses to write more than `limit` bytes in all,
/// remembering that it did.
pub(crate) struct CappedWriter<W> {
    inner: W,
    written: u64,
    limit: u64,
    overran: Arc<std::sync::atomic::AtomicBool>,
}

impl<W> CappedWriter<W> {
    pub(crate) fn new(inner: W, limit: u64) -> Self {
        CappedWriter {
            inner,
            written: 0,
            limit,
            overran: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    pub(crate) fn flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.overran.clone()
    }

    pub(crate) fn overran(&self) -> bool {
        self.overran.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The wrapped writer.
    pub(crate) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CappedWriter<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.written.saturating_add(buf.len() as u64) > self.limit {
            self.overran
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "more than {} bytes",
                self.limit
            ))));
        }
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            this.written += *n as u64;
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
