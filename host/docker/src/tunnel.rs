//! The host's end of an egress tunnel (see `berth-agent egress-tunnel`):
//! for a container on an engine that cannot bind the egress point's
//! socket (a swarm node's), one exec session runs the agent's tunnel,
//! which listens on the sandbox's proxy address; every connection made to
//! it is carried here, over the session's stdin and stdout, and on to the
//! egress point's socket on this host. The point decides everything, as
//! for every other backend; the tunnel only carries bytes.
//!
//! It lives as long as the Berth process that holds the sandbox (a
//! server, or one CLI command): a process a command leaves running keeps
//! no route once that ends (its connections fail; none goes around the
//! point). Everything the agent says is untrusted: frames are bounded,
//! each connection's data is windowed (a side that overruns its window is
//! cut off), and connections are capped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_agent::{
    Decoder, Frame, Kind, AGENT_PATH, CHUNK, TUNNEL_CONNECTIONS, TUNNEL_WINDOW, VERSION,
};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::UploadToContainerOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

/// How long the tunnel has to say it listens.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of the point's directory a sandbox needs to trust the point
/// (present only for a sandbox with secrets).
const TRUST_FILES: [&str; 2] = ["ca.pem", "ca-bundle.pem"];

type Input = tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>;

/// A running tunnel; dropping it ends it (and every connection it
/// carries).
pub(crate) struct EgressTunnel {
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for EgressTunnel {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl EgressTunnel {
    /// Puts the point's trust files into `container` at
    /// [`berth::egress::SANDBOX_EGRESS_DIR`], starts the agent's tunnel
    /// there (the agent is already in the container) and waits until it
    /// listens on [`berth::egress::SANDBOX_PROXY`]. `point_dir` is the
    /// host directory holding the point's socket and trust files.
    pub(crate) async fn start(
        docker: &Docker,
        container: &str,
        point_dir: &Path,
    ) -> Result<Self, String> {
        copy_trust(docker, container, point_dir).await?;
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions::<String> {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec![
                        AGENT_PATH.to_string(),
                        "egress-tunnel".into(),
                        berth::egress::SANDBOX_PROXY.into(),
                    ]),
                    working_dir: Some("/".into()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("creating the tunnel's exec: {e}"))?;
        let (output, input) = match docker.start_exec(&exec.id, None).await {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => {
                return Err("the engine detached the tunnel's exec".into())
            }
            Err(e) => return Err(format!("starting the tunnel: {e}")),
        };
        let socket = point_dir.join(socket_name());
        let (hello_tx, hello_rx) = tokio::sync::oneshot::channel();
        let pump = tokio::spawn(pump(output, Arc::new(input.into()), socket, hello_tx));
        let tunnel = EgressTunnel { pump };
        match tokio::time::timeout(HELLO_TIMEOUT, hello_rx).await {
            Ok(Ok(Ok(()))) => Ok(tunnel),
            Ok(Ok(Err(why))) => Err(why),
            Ok(Err(_)) => Err("the tunnel ended before it listened".into()),
            Err(_) => Err(format!(
                "the tunnel did not listen within {HELLO_TIMEOUT:?}"
            )),
        }
    }

    /// Whether the tunnel still runs.
    pub(crate) fn is_alive(&self) -> bool {
        !self.pump.is_finished()
    }
}

/// The point's socket's name in its directory.
fn socket_name() -> &'static str {
    Path::new(berth::egress::SANDBOX_EGRESS_SOCKET)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("point.sock")
}

/// Copies the trust files that exist in `point_dir` into the container.
async fn copy_trust(docker: &Docker, container: &str, point_dir: &Path) -> Result<(), String> {
    let mut tar = tar::Builder::new(Vec::new());
    let dir = berth::egress::SANDBOX_EGRESS_DIR.trim_start_matches('/');
    let mut any = false;
    for name in TRUST_FILES {
        let bytes = match std::fs::read(point_dir.join(name)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("reading the egress point's {name}: {e}")),
        };
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        header.set_mtime(0);
        tar.append_data(&mut header, format!("{dir}/{name}"), bytes.as_slice())
            .map_err(|e| format!("packing the egress point's {name}: {e}"))?;
        any = true;
    }
    if !any {
        return Ok(());
    }
    let bytes = tar
        .into_inner()
        .map_err(|e| format!("packing the egress point's trust files: {e}"))?;
    let options = UploadToContainerOptionsBuilder::new().path("/").build();
    docker
        .upload_to_container(
            container,
            Some(options),
            bollard::body_full(bytes::Bytes::from(bytes)),
        )
        .await
        .map_err(|e| {
            format!(
                "copying the egress point's CA into the container at {}: {e}",
                berth::egress::SANDBOX_EGRESS_DIR
            )
        })
}

async fn send(input: &Input, kind: Kind, id: u32, payload: Vec<u8>) -> Result<(), ()> {
    let bytes = Frame::new(kind, id, payload).encode();
    let mut input = input.lock().await;
    match input.write_all(&bytes).await {
        Ok(()) => input.flush().await.map_err(|_| ()),
        Err(_) => Err(()),
    }
}

/// One carried connection, as the pump sees it.
struct Connection {
    to_point: mpsc::Sender<Vec<u8>>,
    credits: Arc<Semaphore>,
    task: AbortHandle,
}

/// Reads the tunnel's frames and carries each connection's to the point;
/// ends on a malformed or unexpected frame, or with the tunnel.
// One select loop over the agent's frames and the connections' ends,
// which share the connection table.
async fn pump(
    mut output: Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    input: Arc<Input>,
    socket: PathBuf,
    hello: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let mut hello = Some(hello);
    let mut decoder = Decoder::new();
    let mut connections: HashMap<u32, Connection> = HashMap::new();
    let mut tasks: JoinSet<u32> = JoinSet::new();
    let mut said = Vec::new();
    let why = 'tunnel: loop {
        let item = tokio::select! {
            item = output.next() => item,
            Some(Ok(done)) = tasks.join_next(), if !tasks.is_empty() => {
                connections.remove(&done);
                continue;
            }
        };
        let message = match item {
            Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => message,
            Some(Ok(LogOutput::StdErr { message })) => {
                let room = 4096usize.saturating_sub(said.len());
                said.extend_from_slice(&message[..room.min(message.len())]);
                continue;
            }
            Some(Ok(LogOutput::StdIn { .. })) => continue,
            Some(Err(e)) => break format!("the tunnel's stream failed: {e}"),
            None => {
                break format!(
                    "the tunnel exited{}",
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", String::from_utf8_lossy(&said).trim())
                    }
                )
            }
        };
        decoder.push(&message);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'tunnel format!("the tunnel sent {e}"),
            };
            let id = frame.id;
            match frame.kind {
                Kind::Hello => {
                    let version = <[u8; 4]>::try_from(frame.payload.as_slice())
                        .map(u32::from_be_bytes)
                        .unwrap_or(0);
                    if let Some(h) = hello.take() {
                        let _ = h.send(if version == VERSION {
                            Ok(())
                        } else {
                            Err(format!(
                                "the tunnel speaks protocol {version}, this host {VERSION}"
                            ))
                        });
                    }
                }
                Kind::TunnelOpen if connections.len() < TUNNEL_CONNECTIONS => {
                    let (to_point, from_agent) = mpsc::channel(TUNNEL_WINDOW);
                    let credits = Arc::new(Semaphore::new(TUNNEL_WINDOW));
                    let task = tasks.spawn(carry(
                        id,
                        socket.clone(),
                        from_agent,
                        credits.clone(),
                        input.clone(),
                    ));
                    if let Some(old) = connections.insert(
                        id,
                        Connection {
                            to_point,
                            credits,
                            task,
                        },
                    ) {
                        old.task.abort();
                    }
                }
                Kind::TunnelOpen => {
                    let _ = send(&input, Kind::TunnelClose, id, Vec::new()).await;
                }
                Kind::TunnelData => {
                    let Some(conn) = connections.get(&id) else {
                        continue;
                    };
                    // Over its window, or gone: cut off.
                    if conn.to_point.try_send(frame.payload).is_err() {
                        if let Some(conn) = connections.remove(&id) {
                            conn.task.abort();
                        }
                        let _ = send(&input, Kind::TunnelClose, id, Vec::new()).await;
                    }
                }
                Kind::TunnelAck => {
                    if let Some(conn) = connections.get(&id) {
                        if conn.credits.available_permits() < TUNNEL_WINDOW {
                            conn.credits.add_permits(1);
                        }
                    }
                }
                Kind::TunnelClose => {
                    if let Some(conn) = connections.remove(&id) {
                        conn.task.abort();
                    }
                }
                other => break 'tunnel format!("the tunnel sent a {other:?} frame"),
            }
        }
    };
    tracing::debug!(%why, "egress tunnel ended");
    if let Some(h) = hello.take() {
        let _ = h.send(Err(why));
    }
}

/// Carries connection `id` between the tunnel and the point's socket;
/// returns its id when both directions have ended.
async fn carry(
    id: u32,
    socket: PathBuf,
    mut from_agent: mpsc::Receiver<Vec<u8>>,
    credits: Arc<Semaphore>,
    input: Arc<Input>,
) -> u32 {
    let stream = match UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(socket = %socket.display(), error = %e, "the egress point does not answer");
            let _ = send(&input, Kind::TunnelClose, id, Vec::new()).await;
            return id;
        }
    };
    let (mut reader, mut writer) = stream.into_split();
    let up = async {
        while let Some(chunk) = from_agent.recv().await {
            if chunk.is_empty() {
                let _ = writer.shutdown().await;
                return Ok(());
            }
            writer.write_all(&chunk).await.map_err(|_| ())?;
            send(&input, Kind::TunnelAck, id, Vec::new()).await?;
        }
        Err(())
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            credits.acquire().await.map_err(|_| ())?.forget();
            let n = reader.read(&mut buf).await.map_err(|_| ())?;
            send(&input, Kind::TunnelData, id, buf[..n].to_vec()).await?;
            if n == 0 {
                return Ok::<(), ()>(());
            }
        }
    };
    if tokio::try_join!(up, down).is_err() {
        let _ = send(&input, Kind::TunnelClose, id, Vec::new()).await;
    }
    id
}
