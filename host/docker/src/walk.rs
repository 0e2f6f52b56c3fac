//! A stop through the in-container agent: `berth-agent fs ROOT walk`
//! walks the workspace with the files cache inside the container (every
//! other process stopped meanwhile, since a container paused by its
//! engine runs nothing), and sends the metadata of every entry and the
//! content of changed files only. Everything it sends is checked as it is
//! read (`berth_agent::walk::ItemReader`).

use std::io::{self, Read};
use std::path::PathBuf;

use berth_agent::walk::{encode_request, ItemReader, KnownFiles, WireEvent};
use bytes::Bytes;

use berth::backend::{ExecEvent, ExecProcess, ExecRequest, TreeWalk};

/// How long a walk may take.
const WALK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The agent's stderr kept for an error message.
const STDERR_CAP: usize = 16 * 1024;

/// The command that runs the walk.
pub(super) fn request(program: &str, root: &str, freeze: bool) -> ExecRequest {
    let mut words = vec![program, "fs", root, "walk"];
    if freeze {
        words.push("--freeze");
    }
    ExecRequest::program(words, WALK_TIMEOUT).with_stdin()
}

/// Sends the walk its request, then hands back the walk that reads its
/// answer (on the snapshot's thread, through `handle`).
pub(super) async fn start(
    process: ExecProcess,
    exclude: &[PathBuf],
    known: &KnownFiles,
) -> Result<TreeWalk, berth::backend::BackendError> {
    let request = Bytes::from(encode_request(exclude, known));
    let sending = async {
        for piece in request.chunks(256 * 1024) {
            process.write_stdin(request.slice_ref(piece)).await?;
        }
        process.close_stdin().await
    };
    if sending.await.is_err() {
        // It ended early: its own error comes with its events.
        tracing::debug!("the walk ended before it read its request");
    }
    let handle = tokio::runtime::Handle::current();
    Ok(Box::new(move |emit| {
        let reader = EventReader {
            process,
            handle,
            pending: Bytes::new(),
            stderr: Vec::new(),
            ended: false,
        };
        let mut items = ItemReader::new(io::BufReader::with_capacity(1 << 20, reader));
        loop {
            match items.read_event()? {
                WireEvent::Item(item) => emit(item)?,
                WireEvent::End(stats) => return Ok(stats),
            }
        }
    }))
}

/// The walk's stdout as a blocking reader; its exit code checked at the
/// end, its stderr in the error.
struct EventReader {
    process: ExecProcess,
    handle: tokio::runtime::Handle,
    pending: Bytes,
    stderr: Vec<u8>,
    ended: bool,
}

impl Read for EventReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pending.is_empty() {
            if self.ended {
                return Ok(0);
            }
            let event = self.handle.block_on(self.process.next_event());
            match event {
                Some(Ok(ExecEvent::Stdout(b))) => self.pending = b,
                Some(Ok(ExecEvent::Stderr(b))) => {
                    let room = STDERR_CAP.saturating_sub(self.stderr.len());
                    self.stderr.extend_from_slice(&b[..b.len().min(room)]);
                }
                Some(Ok(ExecEvent::Exit(exit))) => {
                    self.ended = true;
                    if exit.exit_code != 0 {
                        return Err(io::Error::other(format!(
                            "the walk in the container exited with {}: {}",
                            exit.exit_code,
                            String::from_utf8_lossy(&self.stderr).trim()
                        )));
                    }
                }
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => {
                    self.ended = true;
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending = self.pending.slice(n..);
        Ok(n)
    }
}
