//! Commands: collected, or streamed as newline-delimited JSON events; and
//! the input of interactive ones (stdin, terminal size, signals), sent on
//! other requests by the exec's id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;
use berth::backend::{ExecEvent, ExecInput, ExecInputSender, ExecProcess, ExecRequest, PtySize};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use http::StatusCode;
use http_body_util::BodyExt;

use super::history;
use crate::api::{self, ExecLine};
use crate::http::{json_reply, read_json, stream_reply, ApiError, BoxError, Reply};
use crate::open::OpenSandbox;
use crate::route::Call;
use crate::Inner;

type Answer = BoxFuture<'static, Result<Reply, ApiError>>;

/// The interactive execs running, by id: where their input goes.
#[derive(Default)]
pub(crate) struct Execs {
    inputs: Mutex<HashMap<String, ExecInputSender>>,
}

impl Execs {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, ExecInputSender>> {
        self.inputs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn input(&self, id: &str) -> Result<ExecInputSender, ApiError> {
        self.map().get(id).cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "exec_not_found",
                format!("no running interactive exec {id:?} (it ended, or was never started with `interactive`)"),
            )
        })
    }
}

/// Removes an exec's input from [`Execs`] when its stream ends.
pub(crate) struct Registered {
    inner: Arc<Inner>,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.inner.execs.map().remove(&self.id);
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// One event as a line.
pub(crate) fn line(event: &ExecLine) -> Bytes {
    let mut v = serde_json::to_vec(event).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// A library event as a wire line.
pub(crate) fn wire(event: ExecEvent) -> ExecLine {
    match event {
        ExecEvent::Stdout(b) => ExecLine::Stdout {
            data: B64.encode(&b),
        },
        ExecEvent::Stderr(b) => ExecLine::Stderr {
            data: B64.encode(&b),
        },
        ExecEvent::Exit(e) => ExecLine::Exit {
            exit_code: e.exit_code,
            signal: e.signal,
            timed_out: e.timed_out,
            duration_ms: e.duration_ms,
            notes: e.notes,
            checkpoint: None,
        },
    }
}

/// A collected result and the checkpoint taken after it (the fields of
/// [`api::ExecOutcome`], in its order).
#[derive(serde::Serialize)]
struct WithCheckpoint<'a> {
    #[serde(flatten)]
    result: &'a berth::backend::ExecResult,
    checkpoint: api::Checkpointed,
}

/// What an exec checkpoints after its command: the command line and when
/// it started.
#[derive(Clone)]
pub(crate) struct CheckpointAfter {
    command: String,
    started: SystemTime,
}

/// The kind byte of a binary frame holding stdout.
const FRAME_STDOUT: u8 = 1;
/// The kind byte of a binary frame holding stderr.
const FRAME_STDERR: u8 = 2;
/// The kind byte of a binary frame holding an [`ExecLine`] as JSON.
const FRAME_JSON: u8 = 0;

/// One binary frame: `kind`, the payload's length (4 bytes, big-endian),
/// the payload. Payloads are at most what one event carries (far below
/// 4 GiB), which the length's type also bounds.
fn frame(kind: u8, payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(kind);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&payload[..len as usize]);
    Bytes::from(out)
}

impl api::Framing {
    /// An event as this framing writes it.
    fn event(self, event: ExecEvent) -> Bytes {
        match (self, event) {
            (api::Framing::Binary, ExecEvent::Stdout(b)) => frame(FRAME_STDOUT, &b),
            (api::Framing::Binary, ExecEvent::Stderr(b)) => frame(FRAME_STDERR, &b),
            (_, event) => self.line(&wire(event)),
        }
    }

    /// A wire event as this framing writes it.
    fn line(self, event: &ExecLine) -> Bytes {
        match self {
            api::Framing::JsonLines => line(event),
            api::Framing::Binary => {
                frame(FRAME_JSON, &serde_json::to_vec(event).unwrap_or_default())
            }
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            api::Framing::JsonLines => "application/x-ndjson",
            api::Framing::Binary => "application/vnd.berth.exec-frames",
        }
    }
}

/// A process's events in `framing`, `first` before them; the stream ends
/// after the exit (or an error event). Dropping it (the client went away)
/// drops the process, which stops the command. With `checkpoint` (and
/// `sandbox`), a generation is written before the exit event, which says
/// what it wrote.
pub(crate) fn ndjson(
    framing: api::Framing,
    first: Option<ExecLine>,
    process: ExecProcess,
    guard: Option<Registered>,
    sandbox: Option<(Arc<Inner>, String)>,
    checkpoint: Option<CheckpointAfter>,
) -> Reply {
    let head = futures::stream::iter(first.map(|l| Ok::<_, BoxError>(framing.line(&l))));
    let events = futures::stream::unfold(Some((process, guard)), move |state| {
        let sandbox = sandbox.clone();
        let checkpoint = checkpoint.clone();
        async move {
            let (mut process, guard) = state?;
            match process.next_event().await {
                Some(Ok(ExecEvent::Exit(e))) => {
                    let (code, duration_ms) = (e.exit_code, e.duration_ms);
                    let mut exit = wire(ExecEvent::Exit(e));
                    if let (Some(after), Some((inner, name)), ExecLine::Exit { checkpoint, .. }) =
                        (&checkpoint, &sandbox, &mut exit)
                    {
                        *checkpoint = Some(
                            history::after_command(
                                inner,
                                name,
                                &after.command,
                                code,
                                after.started,
                                duration_ms,
                            )
                            .await,
                        );
                    }
                    Some((Ok(framing.line(&exit)), None))
                }
                Some(Ok(event)) => Some((Ok(framing.event(event)), Some((process, guard)))),
                Some(Err(e)) => {
                    let mut e = ApiError::from(berth::SandboxError::from(e));
                    if let Some((inner, name)) = &sandbox {
                        e = removed_meanwhile(inner, name, e).await;
                    }
                    Some((
                        Ok(framing.line(&ExecLine::Error { error: e.detail() })),
                        None,
                    ))
                }
                None => Some((
                    Ok(framing.line(&ExecLine::Error {
                        error: api::ErrorDetail {
                            code: "backend".into(),
                            message: "the command's output ended without its exit".into(),
                        },
                    })),
                    None,
                )),
            }
        }
    });
    stream_reply(head.chain(events), framing.content_type())
}

/// How long a failed command waits for a removal under way to finish
/// before its error is told as it is.
const REMOVAL_WAIT: Duration = Duration::from_secs(30);

/// `e`, or — when the command failed because its sandbox was removed
/// while it ran (`berth rm` ends the instance, then forgets the name,
/// holding the sandbox's lock throughout) — an error that says so.
pub(crate) async fn removed_meanwhile(inner: &Inner, name: &str, e: ApiError) -> ApiError {
    let named = inner.open.named();
    let locked = tokio::time::timeout(REMOVAL_WAIT, named.lock(name)).await;
    let gone = matches!(locked, Ok(Ok(_))) && matches!(named.read_text(name), Ok(None));
    if gone {
        ApiError::new(
            http::StatusCode::GONE,
            "removed",
            format!("sandbox {name} was removed while the command ran (`berth rm`); the command ended with it"),
        )
    } else {
        e
    }
}

pub(crate) fn exec(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let body: api::ExecBody = read_json(call.body, inner.limits.json_body).await?;
        if (body.interactive || body.pty.is_some()) && !body.stream {
            return Err(ApiError::bad_request(
                "`interactive` and `pty` need `stream`: their output comes as it is produced",
            ));
        }
        if body.framing != api::Framing::JsonLines && !body.stream {
            return Err(ApiError::bad_request(
                "`framing` is for `stream`: a collected result is one JSON object",
            ));
        }
        if body.interactive && body.stdin.is_some() {
            return Err(ApiError::bad_request(
                "`stdin` and `interactive` exclude each other: send the bytes to /v1/execs/{id}/stdin",
            ));
        }
        let stdin = body
            .stdin
            .as_deref()
            .map(|s| B64.decode(s))
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("`stdin` is not base64: {e}")))?;
        let timeout = Duration::from_millis(body.timeout_ms.unwrap_or(600_000));
        let mut request = match (&body.command, &body.argv) {
            (Some(line), None) => ExecRequest::new(line.clone(), timeout),
            // An empty one is refused where every argv is checked
            // (`ExecRequest::words`), as a 400.
            (None, Some(argv)) => ExecRequest::program(argv.clone(), timeout),
            _ => {
                return Err(ApiError::bad_request(
                    "give `command` (a command line, run by `sh -c`) or `argv` (the program and its arguments, run with no shell) — one of them",
                ))
            }
        };
        // The command as history notes name it.
        let command = request.command.clone();
        // When the command started (its checkpoint's note says so).
        let started = SystemTime::now();
        // Whether to checkpoint after it: as asked, else as the sandbox
        // was created (known to its open sandbox, not read per command).
        let checkpoint_after = |open: &OpenSandbox| {
            body.checkpoint
                .unwrap_or(open.checkpoint_each_exec)
                .then(|| CheckpointAfter {
                    command: command.clone(),
                    started,
                })
        };
        request.env.extend(body.env.clone());
        if body.stdout_cap.is_some() || body.stderr_cap.is_some() {
            let cap = |c: Option<u64>, default: usize| {
                c.map(|c| usize::try_from(c).unwrap_or(usize::MAX))
                    .unwrap_or(default)
            };
            let (out, err) = (
                cap(body.stdout_cap, request.stdout_cap),
                cap(body.stderr_cap, request.stderr_cap),
            );
            request = request.caps(out, err);
        }
        if body.interactive || stdin.is_some() {
            request = request.with_stdin();
        }
        if let Some(size) = body.pty {
            request = request.on_terminal(PtySize {
                rows: size.rows,
                cols: size.cols,
            });
        }
        if !body.stream {
            let (out, err, tail) = (request.stdout_cap, request.stderr_cap, request.tail_kept);
            let (process, open) = spawn_retrying(&inner, &name, request).await?;
            let checkpoint = checkpoint_after(&open);
            let result = match stdin {
                Some(bytes) => {
                    process
                        .collect_with_stdin(Bytes::from(bytes), out, err, tail)
                        .await
                }
                None => process.collect(out, err, tail).await,
            };
            let result = match result {
                Ok(r) => r,
                Err(e) => {
                    let e = ApiError::from(berth::SandboxError::from(e));
                    return Err(removed_meanwhile(&inner, &name, e).await);
                }
            };
            let Some(after) = checkpoint else {
                return Ok(json_reply(&result));
            };
            let taken = history::after_command(
                &inner,
                &name,
                &after.command,
                result.exit_code,
                after.started,
                result.duration_ms,
            )
            .await;
            return Ok(json_reply(&WithCheckpoint {
                result: &result,
                checkpoint: taken,
            }));
        }
        let (process, open) = spawn_retrying(&inner, &name, request).await?;
        let checkpoint = checkpoint_after(&open);
        if let Some(bytes) = stdin {
            feed(&process, Bytes::from(bytes));
        }
        if body.interactive {
            let id = exec_id();
            inner.execs.map().insert(id.clone(), process.input());
            let guard = Registered {
                inner: inner.clone(),
                id: id.clone(),
            };
            return Ok(ndjson(
                body.framing,
                Some(ExecLine::Started { exec_id: id }),
                process,
                Some(guard),
                Some((inner.clone(), name)),
                checkpoint,
            ));
        }
        Ok(ndjson(
            body.framing,
            None,
            process,
            None,
            Some((inner.clone(), name)),
            checkpoint,
        ))
    }
    .boxed()
}

/// Spawns `request` on `name`'s open sandbox. A spawn that fails on an
/// open sandbox (its container went away since) is tried once more on a
/// freshly attached one: nothing ran, so nothing runs twice. Returns the
/// process and the open sandbox it runs on.
async fn spawn_retrying(
    inner: &Arc<Inner>,
    name: &str,
    request: ExecRequest,
) -> Result<(ExecProcess, Arc<OpenSandbox>), ApiError> {
    let mut last = None;
    for attempt in 0..2 {
        let open = inner.open.get(name).await?;
        let spawned = open.sandbox.read().await.exec_stream(request.clone()).await;
        match spawned {
            Ok(process) => return Ok((process, open)),
            Err(e @ berth::SandboxError::Backend(_)) if attempt == 0 => {
                tracing::info!(
                    sandbox = name,
                    "spawn on the open sandbox failed ({e}); attaching again"
                );
                inner.open.forget(name);
                last = Some(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(last
        .map(ApiError::from)
        .unwrap_or_else(|| ApiError::bad_request("unreachable")))
}

/// Sends `bytes` then the end of stdin, from a task (the command may read
/// while it writes).
fn feed(process: &ExecProcess, bytes: Bytes) {
    let input = process.input();
    tokio::spawn(async move {
        for chunk in bytes.chunks(64 * 1024) {
            if input
                .send(ExecInput::Stdin(Bytes::copy_from_slice(chunk)))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = input.send(ExecInput::CloseStdin).await;
    });
}

fn exec_id() -> String {
    use rand::Rng;
    let n: u128 = rand::thread_rng().gen();
    format!("{n:032x}")
}

pub(crate) fn stdin(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let input = inner.execs.input(call.param(0))?;
        let keep_open = call.flag("keep_open");
        let mut body = call.body;
        let mut sent = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                sent += data.len() as u64;
                input
                    .send(ExecInput::Stdin(data))
                    .await
                    .map_err(|_| ended())?;
            }
        }
        if !keep_open {
            input
                .send(ExecInput::CloseStdin)
                .await
                .map_err(|_| ended())?;
        }
        Ok(json_reply(&api::Written {
            bytes: sent,
            entries: None,
        }))
    }
    .boxed()
}

fn ended() -> ApiError {
    ApiError::new(StatusCode::GONE, "exec_ended", "the command has ended")
}

pub(crate) fn resize(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let input = inner.execs.input(call.param(0))?;
        let size: api::ResizeBody = read_json(call.body, inner.limits.json_body).await?;
        input
            .send(ExecInput::Resize(PtySize {
                rows: size.rows,
                cols: size.cols,
            }))
            .await
            .map_err(|_| ended())?;
        Ok(json_reply(&api::Done { ok: true }))
    }
    .boxed()
}

pub(crate) fn signal(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let input = inner.execs.input(call.param(0))?;
        let body: api::SignalBody = read_json(call.body, inner.limits.json_body).await?;
        let signal = signal_of(&body)?;
        input
            .send(ExecInput::Signal(signal))
            .await
            .map_err(|_| ended())?;
        Ok(json_reply(&api::Done { ok: true }))
    }
    .boxed()
}

/// The signal a body names (TERM by default).
pub(crate) fn signal_of(body: &api::SignalBody) -> Result<i32, ApiError> {
    berth::backend::signal_number(body.signal.as_deref().unwrap_or("TERM"))
        .map_err(|e| ApiError::bad_request(e.to_string()))
}
