//! Commands: what to run ([`ExecRequest`]), the running command as a
//! stream of typed events ([`ExecProcess`]), and what a collected command
//! did ([`ExecResult`]), its output kept head and tail under caps.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;

use super::BackendError;

/// Default cap per output stream of a collected command.
pub const DEFAULT_OUTPUT_CAP: usize = 512 * 1024;
/// Default bytes of each capped stream kept from its end (the rest of the
/// cap is its start).
pub const DEFAULT_TAIL_KEPT: usize = 64 * 1024;
/// Exit code reported for a command killed by its timeout (as `timeout(1)`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;
/// Output events queued between a backend and the reader of a command
/// before the backend waits (back-pressure to the command).
const EVENT_QUEUE: usize = 64;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

/// A command to run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExecRequest {
    /// The command line, run by `sh -c` — or, with [`argv`](Self::argv)
    /// set, that program's words quoted for `sh`, shown where the command
    /// is named (history notes, logs).
    pub command: String,
    /// The program and its arguments, run directly with no shell (found on
    /// `PATH` as `execvp` finds it): no word is expanded, and no shell
    /// builtin or function stands in for a program of the same name. Set
    /// by [`ExecRequest::program`]; `None`: `command` goes to `sh -c`.
    pub argv: Option<Vec<String>>,
    /// Environment (the manifest's, plus per-exec additions).
    pub env: BTreeMap<String, String>,
    /// Killed (with everything it started) after this long.
    pub timeout: Duration,
    /// Bytes of stdout a collected command keeps.
    pub stdout_cap: usize,
    /// Bytes of stderr a collected command keeps.
    pub stderr_cap: usize,
    /// Of each cap, how many bytes are the stream's last ones.
    pub tail_kept: usize,
    /// A persistent shell session to run in: its working directory and
    /// exported variables carry over from one command of the session to
    /// the next. `None`: a fresh shell in the workspace root.
    pub session: Option<String>,
    /// Whether stdin is written through [`ExecProcess::write_stdin`]; when
    /// not, the command's stdin is empty.
    pub stdin: bool,
    /// Runs the command on a terminal of this size: its output comes as
    /// stdout (the terminal merges the streams), stdin is the keyboard.
    pub pty: Option<PtySize>,
    /// Set when the command is Berth's own helper rather than the
    /// caller's: a backend that confines commands may treat it apart (the
    /// local backend runs the background-process helper outside the
    /// confinement, as the supervisor it starts outlives the call and
    /// confines the process it runs itself). `None` for every caller's
    /// command.
    pub helper: Option<HelperCall>,
}

/// Which of Berth's helpers an [`ExecRequest`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperCall {
    /// `berth-agent fs`: the files API, inside the workspace.
    Files,
    /// `berth-agent proc`: background processes, in the run directory.
    Processes,
}

impl ExecRequest {
    /// A command with default caps and the given timeout.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        ExecRequest {
            command: command.into(),
            argv: None,
            env: BTreeMap::new(),
            timeout,
            stdout_cap: DEFAULT_OUTPUT_CAP,
            stderr_cap: DEFAULT_OUTPUT_CAP,
            tail_kept: DEFAULT_TAIL_KEPT,
            session: None,
            stdin: false,
            pty: None,
            helper: None,
        }
    }

    /// Runs `argv[0]` with the arguments `argv[1..]` directly, with no
    /// shell, and default caps and the given timeout. Where a caller has
    /// words rather than a command line, this is what it means: `$`, `*`,
    /// quotes and `;` reach the program as they are, and `echo` or `test`
    /// is the program on `PATH`, not the shell's builtin. It cannot run in
    /// a shell session ([`in_session`](Self::in_session)). An empty `argv`
    /// is refused when the command is run.
    pub fn program<I, S>(argv: I, timeout: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        let mut request = ExecRequest::new(shell_words(&argv), timeout);
        request.argv = Some(argv);
        request
    }

    /// What to execute for this request: its `argv`, or `sh -c command`.
    /// An empty `argv`, or an `argv` for a shell session (a session is a
    /// shell: it takes command lines), is an error that says what to send.
    pub fn words(&self) -> Result<Vec<String>, BackendError> {
        match (&self.argv, &self.session) {
            (None, _) => Ok(vec!["sh".into(), "-c".into(), self.command.clone()]),
            (Some(argv), _) if argv.is_empty() => Err(BackendError::Request(
                "an empty argv: give at least the program to run".into(),
            )),
            (Some(_), Some(session)) => Err(BackendError::Request(format!(
                "shell session {session:?} runs command lines, and argv runs with no shell: send a command line to the session, or run the argv outside it"
            ))),
            (Some(argv), None) => Ok(argv.clone()),
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

    /// Adds an environment variable. By default, a command gets the
    /// manifest's environment only.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Keeps at most `stdout` and `stderr` bytes of a collected command's
    /// streams. By default, [`DEFAULT_OUTPUT_CAP`] each.
    pub fn caps(mut self, stdout: usize, stderr: usize) -> Self {
        self.stdout_cap = stdout;
        self.stderr_cap = stderr;
        self
    }

    /// Of each cap, keeps the last `bytes` of the stream (the rest of the
    /// cap keeps its start, and what falls between is counted as dropped).
    /// By default, [`DEFAULT_TAIL_KEPT`] (or the whole cap, when smaller).
    pub fn tail_kept(mut self, bytes: usize) -> Self {
        self.tail_kept = bytes;
        self
    }

    /// Streams stdin to the command ([`ExecProcess::write_stdin`]). By
    /// default, its stdin is empty.
    pub fn with_stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// Runs the command on a new terminal of `size`. By default, commands
    /// get pipes.
    pub fn on_terminal(mut self, size: PtySize) -> Self {
        self.pty = Some(size);
        self
    }
}

/// `words` as one `sh` command line: each word kept as it is (quoted
/// unless it is made only of characters `sh` never treats specially).
pub fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as one word for `sh`: as it is when it holds only letters,
/// digits and `-_./:=@%+,`, else in single quotes (a quote inside as
/// `'\''`).
pub fn shell_word(word: &str) -> Cow<'_, str> {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(format!("'{}'", word.replace('\'', "'\\''")))
    }
}

/// How a command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ExecExit {
    /// Exit code; 124 on timeout; 128+N when killed by signal N.
    pub exit_code: i32,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Stdout bytes the backend did not deliver (a transport's own cap);
    /// 0 when the stream was whole.
    pub stdout_dropped: u64,
    /// Stderr bytes the backend did not deliver.
    pub stderr_dropped: u64,
    /// What the backend adds about the end (a timeout, the out-of-memory
    /// killer), for people.
    pub notes: Vec<String>,
}

impl ExecExit {
    /// An exit with `exit_code`, `signal` taken from a code over 128.
    pub fn new(exit_code: i32, timed_out: bool, duration: Duration) -> Self {
        ExecExit {
            exit_code,
            signal: (!timed_out && exit_code > 128 && exit_code < 128 + 65)
                .then(|| exit_code - 128),
            timed_out,
            duration_ms: duration.as_millis() as u64,
            ..ExecExit::default()
        }
    }
}

/// What a running command produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// A chunk of stdout, as produced.
    Stdout(Bytes),
    /// A chunk of stderr, as produced.
    Stderr(Bytes),
    /// The end; nothing follows.
    Exit(ExecExit),
}

/// What a reader sends a running command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// A chunk of stdin.
    Stdin(Bytes),
    /// The end of stdin.
    CloseStdin,
    /// The terminal's new size.
    Resize(PtySize),
    /// A signal for the command's process group.
    Signal(i32),
}

/// The running command went away before the input reached it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the command has ended; its input was not delivered")]
pub struct CommandEnded;

/// A handle to send a running command input, usable from another task
/// while the [`ExecProcess`] is read.
#[derive(Debug, Clone)]
pub struct ExecInputSender(mpsc::Sender<ExecInput>);

impl ExecInputSender {
    /// Sends one input, waiting while the command is behind.
    pub async fn send(&self, input: ExecInput) -> Result<(), CommandEnded> {
        self.0.send(input).await.map_err(|_| CommandEnded)
    }
}

/// A running command: its events, in order, ending with
/// [`ExecEvent::Exit`]; and its input.
///
/// # Cancel safety
///
/// Dropping the process (before its exit event) stops the command in the
/// sandbox: the backend kills it and everything it started, as its timeout
/// would. Reading an event ([`ExecProcess::next_event`]) is cancel safe:
/// an event not yet returned stays queued.
#[derive(Debug)]
pub struct ExecProcess {
    events: mpsc::Receiver<Result<ExecEvent, BackendError>>,
    input: mpsc::Sender<ExecInput>,
}

/// A backend's end of an [`ExecProcess`]: where it sends events and reads
/// input. The reader is gone (the process was dropped) when
/// [`ExecDriver::cancelled`] completes; the backend then kills the command.
#[derive(Debug)]
pub struct ExecDriver {
    /// Where events go; sending waits while the reader is behind.
    pub events: mpsc::Sender<Result<ExecEvent, BackendError>>,
    /// The reader's input, in order.
    pub input: mpsc::Receiver<ExecInput>,
}

impl ExecDriver {
    /// Completes when the reader has dropped the process.
    pub async fn cancelled(&self) {
        self.events.closed().await
    }

    /// Sends an event; `false` when the reader is gone.
    pub async fn send(&self, event: ExecEvent) -> bool {
        self.events.send(Ok(event)).await.is_ok()
    }

    /// Ends the stream with an error.
    pub async fn fail(&self, error: BackendError) {
        let _ = self.events.send(Err(error)).await;
    }
}

impl ExecProcess {
    /// A process and the backend's end of it.
    pub fn channel() -> (ExecProcess, ExecDriver) {
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let (input, input_rx) = mpsc::channel(EVENT_QUEUE);
        (
            ExecProcess { events, input },
            ExecDriver {
                events: events_tx,
                input: input_rx,
            },
        )
    }

    /// The next event; `None` after the exit (or the backend's failure).
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, BackendError>> {
        self.events.recv().await
    }

    /// Polls for the next event (what [`ExecProcess::next_event`] awaits).
    pub fn poll_next_event(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ExecEvent, BackendError>>> {
        self.events.poll_recv(cx)
    }

    /// A handle for input from another task.
    pub fn input(&self) -> ExecInputSender {
        ExecInputSender(self.input.clone())
    }

    /// Writes a chunk of stdin (for a request [`ExecRequest::with_stdin`]
    /// or on a terminal), waiting while the command is behind.
    pub async fn write_stdin(&self, bytes: impl Into<Bytes>) -> Result<(), CommandEnded> {
        self.input().send(ExecInput::Stdin(bytes.into())).await
    }

    /// Ends stdin: the command reads end-of-file.
    pub async fn close_stdin(&self) -> Result<(), CommandEnded> {
        self.input().send(ExecInput::CloseStdin).await
    }

    /// Tells the command's terminal its new size.
    pub async fn resize(&self, size: PtySize) -> Result<(), CommandEnded> {
        self.input().send(ExecInput::Resize(size)).await
    }

    /// Sends a signal to the command's process group.
    pub async fn signal(&self, signal: i32) -> Result<(), CommandEnded> {
        self.input().send(ExecInput::Signal(signal)).await
    }

    /// Ends stdin, then gathers the command's output, each stream kept
    /// head and tail within `stdout_cap` / `stderr_cap` (the last
    /// `tail_kept` bytes always among them).
    pub async fn collect(
        self,
        stdout_cap: usize,
        stderr_cap: usize,
        tail_kept: usize,
    ) -> Result<ExecResult, BackendError> {
        let _ = self.input.try_send(ExecInput::CloseStdin);
        self.gather(stdout_cap, stderr_cap, tail_kept).await
    }

    /// [`ExecProcess::collect`] for a command started
    /// [`ExecRequest::with_stdin`]: `stdin` is written to it (then its end)
    /// while its output is gathered, so a command that answers as it reads
    /// never waits on a full pipe.
    pub async fn collect_with_stdin(
        self,
        stdin: Bytes,
        stdout_cap: usize,
        stderr_cap: usize,
        tail_kept: usize,
    ) -> Result<ExecResult, BackendError> {
        let input = self.input();
        let feed = async move {
            for chunk in stdin.chunks(64 * 1024) {
                if input
                    .send(ExecInput::Stdin(stdin.slice_ref(chunk)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let _ = input.send(ExecInput::CloseStdin).await;
        };
        let (_, result) = futures::join!(feed, self.gather(stdout_cap, stderr_cap, tail_kept));
        result
    }

    async fn gather(
        mut self,
        stdout_cap: usize,
        stderr_cap: usize,
        tail_kept: usize,
    ) -> Result<ExecResult, BackendError> {
        let mut stdout = CappedBuffer::new(stdout_cap, tail_kept);
        let mut stderr = CappedBuffer::new(stderr_cap, tail_kept);
        while let Some(event) = self.events.recv().await {
            match event? {
                ExecEvent::Stdout(b) => stdout.push(&b),
                ExecEvent::Stderr(b) => stderr.push(&b),
                ExecEvent::Exit(exit) => {
                    let (stdout, out_dropped) = stdout.finish();
                    let (stderr, err_dropped) = stderr.finish();
                    let stdout_dropped = out_dropped + exit.stdout_dropped;
                    let stderr_dropped = err_dropped + exit.stderr_dropped;
                    return Ok(ExecResult {
                        exit_code: exit.exit_code,
                        signal: exit.signal,
                        stdout,
                        stderr,
                        truncated: stdout_dropped + stderr_dropped > 0,
                        stdout_dropped,
                        stderr_dropped,
                        timed_out: exit.timed_out,
                        duration_ms: exit.duration_ms,
                        notes: exit.notes,
                    });
                }
            }
        }
        Err(BackendError::Operation {
            backend: "exec",
            operation: "reading the command's output",
            source: "the backend ended the stream without the command's exit".into(),
        })
    }
}

impl futures::Stream for ExecProcess {
    type Item = Result<ExecEvent, BackendError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

/// What a command did, its output collected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecResult {
    /// Exit code; 124 on timeout; 128+N when killed by signal N.
    pub exit_code: i32,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Kept stdout bytes: its start and its end, at most the cap.
    pub stdout: Bytes,
    /// Kept stderr bytes: its start and its end, at most the cap.
    pub stderr: Bytes,
    /// Whether any output was dropped by the caps.
    pub truncated: bool,
    /// Bytes of stdout dropped (between the kept start and end).
    pub stdout_dropped: u64,
    /// Bytes of stderr dropped.
    pub stderr_dropped: u64,
    /// Whether the timeout killed it (what it printed until then is kept).
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// What the backend adds about the end, for people (a timeout, the
    /// out-of-memory killer).
    pub notes: Vec<String>,
}

impl ExecResult {
    /// Stdout as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stdout)
    }

    /// Stderr as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stderr)
    }
}

/// JSON: each stream as text when it is UTF-8, and as base64 in
/// `stdout_base64` / `stderr_base64` when it is not.
impl Serialize for ExecResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("ExecResult", 12)?;
        st.serialize_field("exit_code", &self.exit_code)?;
        st.serialize_field("signal", &self.signal)?;
        for (name, b64, bytes) in [
            ("stdout", "stdout_base64", &self.stdout),
            ("stderr", "stderr_base64", &self.stderr),
        ] {
            match std::str::from_utf8(bytes) {
                Ok(text) => {
                    st.serialize_field(name, text)?;
                    st.skip_field(b64)?;
                }
                Err(_) => {
                    st.serialize_field(name, &String::from_utf8_lossy(bytes))?;
                    st.serialize_field(
                        b64,
                        &base64::engine::general_purpose::STANDARD.encode(bytes),
                    )?;
                }
            }
        }
        st.serialize_field("truncated", &self.truncated)?;
        st.serialize_field("stdout_dropped", &self.stdout_dropped)?;
        st.serialize_field("stderr_dropped", &self.stderr_dropped)?;
        st.serialize_field("timed_out", &self.timed_out)?;
        st.serialize_field("duration_ms", &self.duration_ms)?;
        st.serialize_field("notes", &self.notes)?;
        st.end()
    }
}

/// Keeps the first `cap - tail` bytes and the last `tail` bytes of a
/// stream, and counts what falls between.
#[derive(Debug)]
pub struct CappedBuffer {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    dropped: u64,
}

impl CappedBuffer {
    /// A buffer keeping at most `cap` bytes, `tail` of them (at most
    /// `cap`) from the end.
    pub fn new(cap: usize, tail: usize) -> Self {
        let tail_cap = tail.min(cap);
        CappedBuffer {
            head_cap: cap - tail_cap,
            tail_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Appends a chunk.
    pub fn push(&mut self, mut chunk: &[u8]) {
        let room = self.head_cap.saturating_sub(self.head.len());
        let take = room.min(chunk.len());
        self.head.extend_from_slice(&chunk[..take]);
        chunk = &chunk[take..];
        if chunk.is_empty() {
            return;
        }
        if chunk.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + chunk.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&chunk[chunk.len() - self.tail_cap..]);
            return;
        }
        self.tail.extend(chunk);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        self.tail.drain(..excess);
        self.dropped += excess as u64;
    }

    /// The kept bytes (start, then end) and the dropped byte count.
    pub fn finish(self) -> (Bytes, u64) {
        let mut kept = self.head;
        kept.extend(self.tail);
        (Bytes::from(kept), self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_bytes_not_characters() {
        let mut b = CappedBuffer::new(4, 0);
        b.push("héé".as_bytes()); // 5 bytes
        b.push(b"xyz");
        let (kept, dropped) = b.finish();
        assert_eq!(dropped, 4);
        assert_eq!(
            kept.as_ref(),
            "hé"
                .as_bytes()
                .iter()
                .chain(&[0xc3])
                .copied()
                .collect::<Vec<_>>()
        );
    }

    /// Whatever the chunks, the kept bytes are the stream's first
    /// `cap - tail` and last `tail` bytes, and kept + dropped is the whole.
    /// Seeded, so a failure replays.
    #[test]
    fn head_and_tail_are_kept_whatever_the_chunks() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..500 {
            let len = (next() % 5000) as usize;
            let stream: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let cap = (next() % 1200) as usize;
            let tail = (next() % 1500) as usize;
            let mut b = CappedBuffer::new(cap, tail);
            let mut rest = &stream[..];
            while !rest.is_empty() {
                let n = (1 + next() % 700).min(rest.len() as u64) as usize;
                b.push(&rest[..n]);
                rest = &rest[n..];
            }
            let (kept, dropped) = b.finish();
            let tail = tail.min(cap);
            let head = (cap - tail).min(len);
            let end = tail.min(len - head);
            let mut want = stream[..head].to_vec();
            want.extend_from_slice(&stream[len - end..]);
            assert_eq!(kept.as_ref(), want.as_slice(), "case {case}");
            assert_eq!(kept.len() as u64 + dropped, len as u64, "case {case}");
        }
    }
}

/// A signal name or number that is not one Berth knows.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown signal {0:?} (TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT or a number)")]
pub struct UnknownSignal(pub String);

/// A signal's number from its name (`TERM`, `SIGKILL`, `int`) or number.
pub fn signal_number(name: &str) -> Result<i32, UnknownSignal> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    Ok(
        match name.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
            "HUP" => 1,
            "INT" => 2,
            "QUIT" => 3,
            "KILL" => 9,
            "USR1" => 10,
            "USR2" => 12,
            "TERM" => 15,
            "CONT" => 18,
            "STOP" => 19,
            _ => return Err(UnknownSignal(name.to_string())),
        },
    )
}
