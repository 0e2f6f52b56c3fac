//! Guest stdout and stderr: routed line by line to `tracing` under the
//! plugin's name, and bounded so a chatty or hostile plugin cannot flood
//! the host's logs. Writes never fail, so output cannot crash a guest.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::WasiCtxBuilder;

/// Output bytes logged per call and stream before the rest is dropped.
const BUDGET: usize = 64 * 1024;
/// Longest line logged as one record.
const MAX_LINE: usize = 4096;

#[derive(Clone)]
struct GuestOutput {
    plugin: Arc<str>,
    stream: &'static str,
    remaining: Arc<AtomicUsize>,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineLogger {
            out: self.clone(),
            line: Vec::new(),
        })
    }
}

struct LineLogger {
    out: GuestOutput,
    line: Vec<u8>,
}

impl LineLogger {
    fn emit(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end_matches(['\n', '\r']);
        tracing::info!(target: "berth::plugin", plugin = %self.out.plugin, stream = self.out.stream, "{text}");
        self.line.clear();
    }

    fn accept(&mut self, buf: &[u8]) {
        let before = self.out.remaining.load(Ordering::Relaxed);
        if before == 0 {
            return;
        }
        let take = buf.len().min(before);
        self.out.remaining.fetch_sub(take, Ordering::Relaxed);
        for &b in &buf[..take] {
            self.line.push(b);
            if b == b'\n' || self.line.len() >= MAX_LINE {
                self.emit();
            }
        }
        if take < buf.len() {
            self.emit();
            tracing::warn!(target: "berth::plugin", plugin = %self.out.plugin, stream = self.out.stream,
                "plugin output exceeded {BUDGET} bytes in one call; the rest is dropped");
        }
    }
}

impl AsyncWrite for LineLogger {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.accept(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.emit();
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        self.emit();
    }
}

pub(super) fn route_stdio(builder: &mut WasiCtxBuilder, plugin: &str) {
    let plugin: Arc<str> = Arc::from(plugin);
    let make = |stream| GuestOutput {
        plugin: plugin.clone(),
        stream,
        remaining: Arc::new(AtomicUsize::new(BUDGET)),
    };
    builder.stdout(make("stdout"));
    builder.stderr(make("stderr"));
}
