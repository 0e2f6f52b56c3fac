//! The host's end of the in-container agent: the agent binary copied into
//! the container through the archive API, one long-lived exec session
//! running it, and commands multiplexed over that session's stdin and
//! stdout as frames (see the `berth-agent` crate). A command then costs
//! one frame each way instead of an exec's set-up inside the daemon.
//!
//! Everything the agent says is untrusted input: frames are bounded,
//! output is capped here whatever the agent claims, and a malformed frame
//! ends the session with an error naming it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use berth_agent::{
    Decoder, ExitReport, Frame, Kind, RunRequest, AGENT_PATH, CHUNK, STDIN_WINDOW, VERSION,
};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::UploadToContainerOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use bytes::Bytes;

use berth::backend::exec::TIMEOUT_EXIT_CODE;
use berth::backend::{
    BackendError, ExecDriver, ExecEvent, ExecExit, ExecInput, ExecProcess, ExecRequest,
};

/// How long the agent has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long past a command's timeout the host waits for the agent's own
/// kill to be reported before it sends one itself.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// The largest agent binary the host will copy.
const MAX_AGENT_BYTES: u64 = 64 << 20;
/// Frames queued per command before the session waits for the reader.
const QUEUE: usize = 256;
/// Bytes of the agent's own stderr kept for the log.
const AGENT_LOG_CAP: usize = 16 * 1024;

/// Why the agent is not used, or stopped.
#[derive(Debug, Clone)]
pub(crate) struct AgentUnavailable(pub String);

/// The start of the reason given when no agent binary is installed (an
/// expected set-up, logged quietly, unlike an agent that fails to run).
pub(crate) const NO_BINARY: &str = "no berth-agent binary";

/// The start of the reason given when the container itself is gone (removed
/// or re-created behind Berth's back): not the agent's failure, so neither
/// a warning nor a reason to give up on the agent.
pub(crate) const CONTAINER_GONE: &str = "the container is gone or stopped";

/// `e` as the reason the agent did not start while `what`: the container
/// being gone (404) or stopped (409) is said as such.
fn unavailable(what: &str, container: &str, e: bollard::errors::Error) -> AgentUnavailable {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            message,
        } => AgentUnavailable(format!("{CONTAINER_GONE} ({container}: {message})")),
        e => AgentUnavailable(format!("{what} failed: {e}")),
    }
}

impl std::fmt::Display for AgentUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The agent binary as a tar holding `/.berth/agent`, read once per
/// process.
fn agent_tar() -> Result<Arc<Vec<u8>>, AgentUnavailable> {
    static TAR: OnceLock<Result<Arc<Vec<u8>>, AgentUnavailable>> = OnceLock::new();
    TAR.get_or_init(|| {
        let path = berth::backend::helper_binary::path().ok_or_else(|| {
            AgentUnavailable(
                format!("{NO_BINARY} (set BERTH_AGENT to the static berth-agent binary, or put berth-agent-static beside the program)"),
            )
        })?;
        let meta = std::fs::metadata(&path)
            .map_err(|e| AgentUnavailable(format!("reading {}: {e}", path.display())))?;
        if meta.len() > MAX_AGENT_BYTES {
            return Err(AgentUnavailable(format!(
                "{} is larger than {MAX_AGENT_BYTES} bytes",
                path.display()
            )));
        }
        let binary = std::fs::read(&path)
            .map_err(|e| AgentUnavailable(format!("reading {}: {e}", path.display())))?;
        let mut tar = tar::Builder::new(Vec::with_capacity(binary.len() + 4096));
        let dir = AGENT_PATH.trim_start_matches('/');
        let (parent, _) = dir.rsplit_once('/').unwrap_or(("", dir));
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        header.set_mtime(0);
        let made = tar
            .append_data(&mut header, format!("{parent}/"), std::io::empty())
            .and_then(|()| {
                let mut header = tar::Header::new_gnu();
                header.set_mode(0o755);
                header.set_size(binary.len() as u64);
                header.set_mtime(0);
                tar.append_data(&mut header, dir, binary.as_slice())
            })
            .and_then(|()| tar.into_inner());
        made.map(Arc::new)
            .map_err(|e| AgentUnavailable(format!("packing the agent: {e}")))
    })
    .clone()
}

type Waiters = Arc<Mutex<HashMap<u32, mpsc::Sender<Frame>>>>;

/// One running agent, shared by every command of a sandbox.
pub(crate) struct AgentSession {
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    waiters: Waiters,
    next_id: AtomicU32,
    ended: Arc<Mutex<Option<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for AgentSession {
    fn drop(&mut self) {
        // Closing stdin ends the agent, which kills what it still runs.
        self.reader.abort();
    }
}

impl AgentSession {
    /// Copies the agent into `container` and starts it. Fails (and the
    /// caller falls back to plain execs) when there is no agent binary, the
    /// container's filesystem refuses it, or it does not say hello.
    pub(crate) async fn start(docker: &Docker, container: &str) -> Result<Self, AgentUnavailable> {
        let tar = agent_tar()?;
        let options = UploadToContainerOptionsBuilder::new().path("/").build();
        docker
            .upload_to_container(
                container,
                Some(options),
                bollard::body_full(bytes::Bytes::from(tar.as_ref().clone())),
            )
            .await
            .map_err(|e| {
                unavailable(
                    "copying the agent into the container (a read-only filesystem?)",
                    container,
                    e,
                )
            })?;
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions::<String> {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec![AGENT_PATH.to_string()]),
                    working_dir: Some("/".into()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| unavailable("creating the agent's exec", container, e))?;
        let (output, input) = match docker.start_exec(&exec.id, None).await {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => {
                return Err(AgentUnavailable(
                    "the daemon detached the agent's exec".into(),
                ))
            }
            Err(e) => return Err(unavailable("starting the agent", container, e)),
        };
        let waiters: Waiters = Arc::default();
        let ended: Arc<Mutex<Option<String>>> = Arc::default();
        let (hello_tx, hello_rx) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(demultiplex(
            output,
            waiters.clone(),
            ended.clone(),
            hello_tx,
        ));
        let session = AgentSession {
            input: tokio::sync::Mutex::new(input),
            waiters,
            next_id: AtomicU32::new(1),
            ended,
            reader,
        };
        match tokio::time::timeout(HELLO_TIMEOUT, hello_rx).await {
            Ok(Ok(version)) if version == VERSION => Ok(session),
            Ok(Ok(version)) => Err(AgentUnavailable(format!(
                "the agent speaks protocol {version}, this host {VERSION}"
            ))),
            Ok(Err(_)) => Err(AgentUnavailable(format!(
                "the agent did not start: {}",
                session.why_ended()
            ))),
            Err(_) => Err(AgentUnavailable(format!(
                "the agent said nothing within {HELLO_TIMEOUT:?}"
            ))),
        }
    }

    fn why_ended(&self) -> String {
        self.ended
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| "the session ended".into())
    }

    /// Whether the session still runs.
    pub(crate) fn is_alive(&self) -> bool {
        !self.reader.is_finished()
    }

    async fn send(&self, frame: Frame) -> Result<(), String> {
        let bytes = frame.encode();
        let mut input = self.input.lock().await;
        input
            .write_all(&bytes)
            .await
            .and(input.flush().await)
            .map_err(|e| format!("writing to the agent: {e}"))
    }

    /// Starts a command through the agent. `Err` means the session failed
    /// before the command was sent; failures after that end the process's
    /// events with an error. `memory_limit` explains a SIGKILL as the
    /// out-of-memory killer's.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        request: &ExecRequest,
        cwd: &str,
        memory_limit: Option<u64>,
    ) -> Result<ExecProcess, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE);
        if let Ok(mut w) = self.waiters.lock() {
            w.insert(id, tx);
        }
        // The session may have ended before the command was registered
        // (its end clears the waiters only once).
        if let Some(why) = self.ended.lock().ok().and_then(|e| e.clone()) {
            self.forget(id);
            return Err(format!("the agent stopped: {why}"));
        }
        let run = RunRequest {
            command: request.command.clone(),
            argv: request.argv.clone().unwrap_or_default(),
            cwd: cwd.to_string(),
            env: request
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            timeout_ms: request.timeout.as_millis().min(u64::MAX as u128) as u64,
            // The reader caps (head and tail); the agent sends everything.
            stdout_cap: u64::MAX,
            stderr_cap: u64::MAX,
            session: request.session.clone().unwrap_or_default(),
            stdin: request.stdin,
            pty: request.pty.map(|p| (p.rows, p.cols)).unwrap_or((0, 0)),
        };
        if let Err(e) = self.send(Frame::new(Kind::Run, id, run.encode())).await {
            self.forget(id);
            return Err(e);
        }
        let (process, driver) = ExecProcess::channel();
        tokio::spawn(
            self.clone()
                .drive(id, rx, driver, request.timeout, memory_limit),
        );
        Ok(process)
    }

    fn forget(&self, id: u32) {
        if let Ok(mut w) = self.waiters.lock() {
            w.remove(&id);
        }
    }

    /// Relays one command's frames to its reader and the reader's input to
    /// the agent, until the command's exit, the session's end or the
    /// reader's drop (which kills the command).
    // Kept as one function: one select loop over the agent's frames, the
    // reader's input and the drop signal, whose arms share the command's
    // state.
    async fn drive(
        self: Arc<Self>,
        id: u32,
        mut frames: mpsc::Receiver<Frame>,
        driver: ExecDriver,
        timeout: Duration,
        memory_limit: Option<u64>,
    ) {
        let started = Instant::now();
        let ExecDriver { events, mut input } = driver;
        let mut in_flight = 0usize;
        let mut pending: std::collections::VecDeque<Vec<u8>> = Default::default();
        let mut input_open = true;
        let mut stdin_closed = false;
        let mut killed_here = false;
        let mut kill_at = tokio::time::Instant::now() + timeout + KILL_GRACE;
        let ended: Result<Option<ExitReport>, String> = loop {
            while in_flight < STDIN_WINDOW {
                let Some(chunk) = pending.pop_front() else {
                    break;
                };
                let end = chunk.is_empty();
                if self.send(Frame::new(Kind::Stdin, id, chunk)).await.is_err() {
                    // The session broke; its end reaches the frames below.
                    break;
                }
                if !end {
                    in_flight += 1;
                }
            }
            tokio::select! {
                frame = frames.recv() => {
                    let Some(frame) = frame else {
                        break Err(format!("the agent stopped: {}", self.why_ended()));
                    };
                    let event = match frame.kind {
                        Kind::Stdout => ExecEvent::Stdout(Bytes::from(frame.payload)),
                        Kind::Stderr => ExecEvent::Stderr(Bytes::from(frame.payload)),
                        Kind::StdinAck => {
                            in_flight = in_flight.saturating_sub(1);
                            continue;
                        }
                        Kind::Exit => {
                            break ExitReport::decode(&frame.payload)
                                .map(Some)
                                .map_err(|e| format!("the agent sent {e}"));
                        }
                        Kind::Error => {
                            break Err(format!(
                                "the agent could not run the command: {}",
                                String::from_utf8_lossy(&frame.payload)
                            ));
                        }
                        other => break Err(format!("the agent sent a {other:?} frame for a command")),
                    };
                    if events.send(Ok(event)).await.is_err() {
                        let _ = self.send(Frame::new(Kind::Kill, id, Vec::new())).await;
                        break Ok(None);
                    }
                }
                msg = input.recv(), if input_open && pending.is_empty() => match msg {
                    None => input_open = false,
                    Some(ExecInput::Stdin(bytes)) if !stdin_closed => {
                        pending.extend(bytes.chunks(CHUNK).map(<[u8]>::to_vec));
                    }
                    Some(ExecInput::Stdin(_)) => {}
                    Some(ExecInput::CloseStdin) => {
                        if !stdin_closed {
                            stdin_closed = true;
                            pending.push_back(Vec::new());
                        }
                    }
                    Some(ExecInput::Resize(size)) => {
                        let _ = self
                            .send(Frame::new(Kind::Resize, id, berth_agent::encode_size(size.rows, size.cols)))
                            .await;
                    }
                    Some(ExecInput::Signal(signal)) => {
                        let _ = self
                            .send(Frame::new(Kind::Signal, id, signal.to_be_bytes().to_vec()))
                            .await;
                    }
                },
                _ = events.closed() => {
                    let _ = self.send(Frame::new(Kind::Kill, id, Vec::new())).await;
                    break Ok(None);
                }
                _ = tokio::time::sleep_until(kill_at) => {
                    if killed_here {
                        break Err(format!(
                            "the agent reported nothing for command {id} long past its timeout"
                        ));
                    }
                    // The agent should have killed it by now; ask again.
                    killed_here = true;
                    kill_at = tokio::time::Instant::now() + KILL_GRACE;
                    let _ = self.send(Frame::new(Kind::Kill, id, Vec::new())).await;
                }
            }
        };
        self.forget(id);
        let last = match ended {
            Ok(None) => return,
            Ok(Some(report)) => {
                let code = if report.timed_out {
                    TIMEOUT_EXIT_CODE
                } else {
                    report.code
                };
                let mut exit = ExecExit::new(code, report.timed_out, started.elapsed());
                exit.stdout_dropped = report.stdout_dropped;
                exit.stderr_dropped = report.stderr_dropped;
                if report.timed_out {
                    exit.notes.push(format!(
                        "command timed out after {timeout:?} and was killed"
                    ));
                }
                if let Some(note) = super::exec::oom_note(code, report.timed_out, memory_limit) {
                    exit.notes.push(note);
                }
                Ok(ExecEvent::Exit(exit))
            }
            Err(why) => Err(BackendError::Operation {
                backend: "docker backend",
                operation: "running the command through the in-container agent",
                source: why.into(),
            }),
        };
        let _ = events.send(last).await;
    }
}

/// Reads the agent's output, splits it into frames and hands each to its
/// command; ends the session on a malformed frame or when the agent
/// exits.
async fn demultiplex(
    mut output: Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    waiters: Waiters,
    ended: Arc<Mutex<Option<String>>>,
    hello: tokio::sync::oneshot::Sender<u32>,
) {
    let mut hello = Some(hello);
    let mut decoder = Decoder::new();
    let mut agent_log = Vec::new();
    let why = 'session: loop {
        let item = match output.next().await {
            Some(Ok(item)) => item,
            Some(Err(e)) => break format!("the agent's stream failed: {e}"),
            None => {
                break format!(
                    "the agent exited{}",
                    if agent_log.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", String::from_utf8_lossy(&agent_log).trim())
                    }
                )
            }
        };
        match item {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                decoder.push(&message)
            }
            LogOutput::StdErr { message } => {
                let room = AGENT_LOG_CAP.saturating_sub(agent_log.len());
                agent_log.extend_from_slice(&message[..room.min(message.len())]);
                tracing::warn!(agent = %String::from_utf8_lossy(&message).trim(), "agent");
                continue;
            }
            LogOutput::StdIn { .. } => continue,
        }
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'session format!("the agent sent {e}; the session was ended"),
            };
            if frame.kind == Kind::Hello {
                let version = <[u8; 4]>::try_from(frame.payload.as_slice())
                    .map(u32::from_be_bytes)
                    .unwrap_or(0);
                if let Some(h) = hello.take() {
                    let _ = h.send(version);
                }
                continue;
            }
            if matches!(
                frame.kind,
                Kind::Run
                    | Kind::Kill
                    | Kind::Stdin
                    | Kind::Resize
                    | Kind::Signal
                    | Kind::TunnelOpen
                    | Kind::TunnelData
                    | Kind::TunnelAck
                    | Kind::TunnelClose
            ) {
                break 'session format!(
                    "the agent sent a {:?} frame; the session was ended",
                    frame.kind
                );
            }
            let waiter = waiters.lock().ok().and_then(|w| w.get(&frame.id).cloned());
            match waiter {
                // Waits when the command's reader is behind: backpressure
                // to the agent rather than unbounded queues here.
                Some(tx) => {
                    let _ = tx.send(frame).await;
                }
                None => tracing::debug!(id = frame.id, "a frame for no running command"),
            }
        }
    };
    tracing::debug!(%why, "agent session ended");
    if let Ok(mut e) = ended.lock() {
        *e = Some(why);
    }
    // Dropping the senders tells every waiting command.
    if let Ok(mut w) = waiters.lock() {
        w.clear();
    }
}
