//! Command execution types shared by backends, and the bounded capture of a
//! command's output.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

/// Default cap per output stream.
pub const DEFAULT_OUTPUT_CAP: usize = 512 * 1024;
/// Exit code reported for a command killed by its timeout (as `timeout(1)`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Called with every chunk of output as it arrives (before capping).
pub type OutputCallback = Arc<dyn Fn(OutputStream, &[u8]) + Send + Sync>;

/// A command to run.
#[derive(Clone)]
pub struct ExecRequest {
    /// Passed to `sh -c`.
    pub command: String,
    /// Environment (the manifest's, plus per-exec additions).
    pub env: BTreeMap<String, String>,
    /// Killed (with everything it started) after this long.
    pub timeout: Duration,
    /// Bytes of stdout kept.
    pub stdout_cap: usize,
    /// Bytes of stderr kept.
    pub stderr_cap: usize,
    /// Streaming callback.
    pub on_output: Option<OutputCallback>,
    /// A persistent shell session to run in: its working directory and
    /// exported variables carry over from one command of the session to
    /// the next. `None`: a fresh shell in the workspace root.
    pub session: Option<String>,
}

impl ExecRequest {
    /// A command with default caps and the given timeout.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        ExecRequest {
            command: command.into(),
            env: BTreeMap::new(),
            timeout,
            stdout_cap: DEFAULT_OUTPUT_CAP,
            stderr_cap: DEFAULT_OUTPUT_CAP,
            on_output: None,
            session: None,
        }
    }

    /// Runs in the persistent shell session `name` (created by its first
    /// command): `cd` and `export` in one command hold for the next. By
    /// default, every command starts in a fresh shell in the workspace
    /// root. Needs a backend that keeps sessions (Docker with its agent).
    pub fn in_session(mut self, name: impl Into<String>) -> Self {
        self.session = Some(name.into());
        self
    }
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecResult {
    /// Exit code; 124 on timeout; 128+N when killed by signal N.
    pub exit_code: i32,
    /// Captured stdout (lossy UTF-8), at most the cap.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), at most the cap.
    pub stderr: String,
    /// Whether any output was dropped by the caps.
    pub truncated: bool,
    /// Bytes of stdout dropped.
    pub stdout_dropped: u64,
    /// Bytes of stderr dropped.
    pub stderr_dropped: u64,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// Keeps the first `cap` bytes of a stream and counts the rest.
#[derive(Debug)]
pub struct CappedBuffer {
    cap: usize,
    kept: Vec<u8>,
    dropped: u64,
}

impl CappedBuffer {
    /// A buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        CappedBuffer {
            cap,
            kept: Vec::new(),
            dropped: 0,
        }
    }

    /// Appends a chunk.
    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = room.min(chunk.len());
        self.kept.extend_from_slice(&chunk[..take]);
        self.dropped += (chunk.len() - take) as u64;
    }

    /// Kept text (lossy UTF-8) and dropped byte count.
    pub fn finish(self) -> (String, u64) {
        (
            String::from_utf8_lossy(&self.kept).into_owned(),
            self.dropped,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_bytes_not_characters() {
        let mut b = CappedBuffer::new(4);
        b.push("héé".as_bytes()); // 5 bytes
        b.push(b"xyz");
        let (kept, dropped) = b.finish();
        assert_eq!(dropped, 4);
        assert_eq!(kept, "hé\u{FFFD}");
    }
}
