//! The commands that attach to a sandbox, through the server: the same
//! output and exit codes as in-process, each a request on a warm
//! sandbox instead of a resume and an attach.
//!
//! A streamed exec becomes an [`ExecProcess`] here (its events read from
//! the reply's lines, its input sent on other requests), so the CLI
//! relays it with the same code as a local one.

use base64::Engine;
use berth::backend::{BackendError, ExecEvent, ExecExit, ExecInput, ExecProcess};
use berth_server::{ExecLine, SandboxRecord, Started};
use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;

use crate::server::{encode, Remote, ServerError};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The streamed reply of `path` as a process: NDJSON lines to events;
/// stdin, resizes and signals sent to `/v1/execs/{id}/…` once the server
/// named the exec. Dropping the process closes the reply, which stops the
/// command.
pub async fn process(
    remote: &Remote,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<ExecProcess> {
    let body = body.map(|v| {
        http_body_util::Full::new(Bytes::from(v.to_string()))
            .map_err(|e| match e {})
            .boxed_unsync()
    });
    let answer = remote.send(method, path, body).await?;
    let (process, mut driver) = ExecProcess::channel();
    let remote = remote.clone();
    tokio::spawn(async move {
        let mut body = answer.body;
        let mut pending = Vec::new();
        let mut stdin: Option<tokio::sync::mpsc::Sender<Bytes>> = None;
        let mut exec_id: Option<String> = None;
        let mut waiting_input = Vec::new();
        let events = driver.events.clone();
        let mut input_open = true;
        loop {
            tokio::select! {
                _ = events.closed() => return,
                input = driver.input.recv(), if input_open => {
                    let Some(input) = input else {
                        input_open = false;
                        continue;
                    };
                    match &exec_id {
                        Some(id) => forward(&remote, id, &mut stdin, input).await,
                        None => waiting_input.push(input),
                    }
                }
                frame = body.frame() => {
                    let Some(frame) = frame else {
                        driver.fail(server_failed("the server's reply ended without the command's exit")).await;
                        return;
                    };
                    let Ok(data) = frame.map(|f| f.into_data()) else {
                        driver.fail(server_failed("the connection to the server broke")).await;
                        return;
                    };
                    let Ok(data) = data else { continue };
                    pending.extend_from_slice(&data);
                    while let Some(at) = pending.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=at).collect();
                        let line: ExecLine = match serde_json::from_slice(&line) {
                            Ok(l) => l,
                            Err(e) => {
                                driver.fail(server_failed(&format!("a line of the server's reply is not an event: {e}"))).await;
                                return;
                            }
                        };
                        let event = match line {
                            ExecLine::Started { exec_id: id } => {
                                for input in waiting_input.drain(..) {
                                    forward(&remote, &id, &mut stdin, input).await;
                                }
                                exec_id = Some(id);
                                continue;
                            }
                            ExecLine::Stdout { data } => ExecEvent::Stdout(decode(&data)),
                            ExecLine::Stderr { data } => ExecEvent::Stderr(decode(&data)),
                            ExecLine::Exit { exit_code, signal, timed_out, duration_ms, notes, checkpoint } => {
                                report_checkpoint(checkpoint.as_ref());
                                let mut exit = ExecExit::new(exit_code, timed_out, std::time::Duration::from_millis(duration_ms));
                                exit.signal = signal;
                                exit.notes = notes;
                                // Stdin's request ends with the command.
                                drop(stdin.take());
                                let _ = driver.send(ExecEvent::Exit(exit)).await;
                                return;
                            }
                            ExecLine::Error { error } => {
                                driver.fail(server_failed(&error.message)).await;
                                return;
                            }
                        };
                        if !driver.send(event).await {
                            return;
                        }
                    }
                }
            }
        }
    });
    Ok(process)
}

/// Says so when the checkpoint after a command failed (the command's own
/// exit code stands), as the in-process checkpoint does.
pub fn report_checkpoint(checkpoint: Option<&berth_server::Checkpointed>) {
    if let Some(error) = checkpoint.and_then(|c| c.error.as_ref()) {
        eprintln!(
            "berth: the checkpoint after this command failed: {}",
            error.message
        );
    }
}

fn decode(data: &str) -> Bytes {
    Bytes::from(B64.decode(data).unwrap_or_default())
}

fn server_failed(message: &str) -> BackendError {
    BackendError::Config {
        backend: "berth server",
        message: message.to_string(),
    }
}

/// Sends one input to exec `id`: stdin goes on one long request whose body
/// is fed chunk by chunk; its end closes stdin.
async fn forward(
    remote: &Remote,
    id: &str,
    stdin: &mut Option<tokio::sync::mpsc::Sender<Bytes>>,
    input: ExecInput,
) {
    match input {
        ExecInput::Stdin(bytes) => {
            if stdin.is_none() {
                let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|b| {
                        (
                            Ok::<_, berth_server::BoxError>(http_body::Frame::data(b)),
                            rx,
                        )
                    })
                });
                let body = http_body_util::StreamBody::new(stream).boxed_unsync();
                let remote = remote.clone();
                let path = format!("/v1/execs/{id}/stdin");
                tokio::spawn(async move {
                    if let Err(e) = remote.send(Method::POST, &path, Some(body)).await {
                        tracing::debug!("stdin to the server: {e:#}");
                    }
                });
                *stdin = Some(tx);
            }
            if let Some(tx) = stdin {
                let _ = tx.send(bytes).await;
            }
        }
        ExecInput::CloseStdin => {
            if stdin.take().is_none() {
                // Nothing was sent: an empty body closes it.
                let _ = remote
                    .send(Method::POST, &format!("/v1/execs/{id}/stdin"), None)
                    .await;
            }
        }
        ExecInput::Resize(size) => {
            let _ = remote
                .json::<serde_json::Value>(
                    Method::POST,
                    &format!("/v1/execs/{id}/resize"),
                    Some(serde_json::json!({"rows": size.rows, "cols": size.cols})),
                )
                .await;
        }
        ExecInput::Signal(n) => {
            let _ = remote
                .json::<serde_json::Value>(
                    Method::POST,
                    &format!("/v1/execs/{id}/signal"),
                    Some(serde_json::json!({"signal": n.to_string()})),
                )
                .await;
        }
    }
}

/// `/v1/sandboxes/NAME`.
pub fn sandbox_path(name: &str) -> String {
    format!("/v1/sandboxes/{}", encode(name))
}

/// A record from the server as the CLI's.
pub fn saved(record: SandboxRecord) -> anyhow::Result<super::Saved> {
    Ok(super::Saved {
        checkpoint_each_exec: record.checkpoint_each_exec,
        name: record.name,
        compression: record.compression,
        freeze: record.freeze,
        state: serde_json::from_value(record.state)?,
    })
}

/// `berth start NAME` through the server.
pub async fn start(remote: &Remote, name: &str) -> anyhow::Result<Started> {
    remote
        .json(Method::POST, &format!("{}/start", sandbox_path(name)), None)
        .await
}

/// `berth stop NAME` through the server.
pub async fn stop(remote: &Remote, name: &str) -> anyhow::Result<super::Saved> {
    let record: SandboxRecord = remote
        .json(Method::POST, &format!("{}/stop", sandbox_path(name)), None)
        .await?;
    saved(record)
}

/// `berth shutdown NAME` through the server (after a stop unless
/// `discard`).
pub async fn shutdown(remote: &Remote, name: &str) -> anyhow::Result<super::Saved> {
    let record: SandboxRecord = remote
        .json(
            Method::POST,
            &format!("{}/shutdown", sandbox_path(name)),
            None,
        )
        .await?;
    saved(record)
}

/// Whether `e` is the server's error of `code`.
pub fn is_code(e: &anyhow::Error, code: &str) -> bool {
    e.downcast_ref::<ServerError>()
        .is_some_and(|s| s.code == code)
}
