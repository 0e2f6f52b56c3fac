//! The local backend: the embedded default, needing no Docker.
//!
//! **Not isolated.** The workspace is a host directory and commands run as
//! the current user with `sh -c` in it. Use it for development, tests and
//! trusted agents; use the Docker backend to contain untrusted ones.
//! Each command runs in its own process group, so a timeout kills
//! everything it started.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::exec::{CappedBuffer, TIMEOUT_EXIT_CODE};
use super::Provisioned;
use super::{
    ArchiveStream, Backend, BackendError, ExecRequest, ExecResult, OutputCallback, OutputStream,
};
use crate::workspace::archive;
use crate::workspace::entries::BindMounts;

const BACKEND: &str = "local backend";

/// The local backend's kind in the sandbox state (`"type": "local"`).
pub const KIND: &str = "local";

/// Local backend state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalState {
    /// The host directory holding the workspace.
    pub root_dir: PathBuf,
    /// Whether shutdown may delete it.
    #[serde(default = "yes")]
    pub owned: bool,
}

fn yes() -> bool {
    true
}

/// Settings of a new local sandbox.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    root_dir: Option<PathBuf>,
}

impl LocalOptions {
    /// Keep the workspace in `dir` (created at start, deleted by
    /// shutdown). By default, `<home>/workspaces/<session id>`.
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = Some(dir.into());
        self
    }
}

#[async_trait::async_trait]
impl super::BackendOptions for LocalOptions {
    fn kind(&self) -> &str {
        KIND
    }

    async fn create(
        self: Box<Self>,
        context: &super::CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        let root_dir = self
            .root_dir
            .unwrap_or_else(|| context.home.join("workspaces").join(context.session_id));
        Ok(Box::new(LocalBackend::new(LocalState {
            root_dir,
            owned: true,
        })))
    }
}

/// The local backend's [`BackendProvider`](super::BackendProvider).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalProvider;

#[async_trait::async_trait]
impl super::BackendProvider for LocalProvider {
    fn kind(&self) -> &str {
        KIND
    }

    async fn resume(
        &self,
        state: &super::BackendState,
        _session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(LocalBackend::new(state.decode()?)))
    }

    fn summary(&self, state: &super::BackendState) -> super::BackendSummary {
        let dir = state
            .decode::<LocalState>()
            .ok()
            .map(|s| s.root_dir.display().to_string());
        super::BackendSummary::new(dir, Some("this host".into()))
    }

    fn options_like(
        &self,
        _state: &super::BackendState,
    ) -> Result<super::BackendSpec, BackendError> {
        Ok(super::BackendSpec::local())
    }
}

/// The local backend.
pub struct LocalBackend {
    state: LocalState,
}

impl LocalBackend {
    /// A backend over `state.root_dir`.
    pub fn new(state: LocalState) -> Self {
        LocalBackend { state }
    }

    fn op_error(
        operation: &'static str,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> BackendError {
        BackendError::Operation {
            backend: BACKEND,
            operation,
            source: e.into(),
        }
    }
}

#[async_trait::async_trait]
impl Backend for LocalBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        // Nothing runs between commands; the parent of the root must exist.
        if let Some(parent) = self.state.root_dir.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| Self::op_error("preparing the workspace parent directory", e))?;
        }
        Ok(Provisioned::Existing)
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        use std::os::unix::fs::MetadataExt;
        // A deleted and re-made directory is another workspace. Its inode
        // may be reused at once, so its birth time (nanoseconds, where the
        // filesystem records one) is part of the identity.
        Ok(tokio::fs::metadata(&self.state.root_dir)
            .await
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| {
                let born = m
                    .created()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                format!("dir:{}:{}:{born}", m.dev(), m.ino())
            }))
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        Ok(tokio::fs::metadata(&self.state.root_dir)
            .await
            .map(|m| m.is_dir())
            .unwrap_or(false))
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        tokio::fs::create_dir_all(&self.state.root_dir)
            .await
            .map_err(|e| Self::op_error("creating the workspace root", e))
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult, BackendError> {
        if let Some(name) = &request.session {
            return Err(BackendError::Config {
                backend: "local backend",
                message: format!(
                    "shell session {name:?}: the local backend runs every command in a fresh shell; sessions need the Docker backend's agent"
                ),
            });
        }
        run_local(&self.state.root_dir, request).await
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        if !self.root_exists().await? {
            return Err(Self::op_error(
                "reading the workspace",
                format!("{} does not exist", self.state.root_dir.display()),
            ));
        }
        Ok(Box::new(archive::pack_dir(
            self.state.root_dir.clone(),
            exclude.to_vec(),
        )))
    }

    async fn write_archive(&self, stream: ArchiveStream) -> Result<(), BackendError> {
        archive::extract_stream(stream, self.state.root_dir.clone())
            .await
            .map_err(|e| Self::op_error("extracting into the workspace", e))?;
        Ok(())
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        if !self.state.owned {
            tracing::info!(root = %self.state.root_dir.display(), "workspace not owned; leaving it");
            return Ok(());
        }
        match tokio::fs::remove_dir_all(&self.state.root_dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::op_error("removing the workspace", e)),
        }
    }

    fn bind_mounts(&self) -> BindMounts {
        BindMounts::AsSymlinks
    }

    /// A bind mount here is a symlink to the host path, which every command
    /// can write through: a read-only one is refused rather than silently
    /// made writable.
    fn check_workspace(&self, spec: &crate::workspace::WorkspaceSpec) -> Result<(), BackendError> {
        let binds = spec.bind_mounts().map_err(|e| BackendError::Config {
            backend: BACKEND,
            message: e.to_string(),
        })?;
        match binds.into_iter().find(|b| b.read_only) {
            None => Ok(()),
            Some(bind) => Err(BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "workspace entry {:?} asks for a read-only bind mount of {}, which the local backend cannot enforce: \
                     it links the host directory into the workspace, writable by every command; use the Docker backend, \
                     which mounts it read-only, or set \"read_only\": false to accept writes into {}",
                    bind.relative.display(),
                    bind.host.display(),
                    bind.host.display()
                ),
            }),
        }
    }

    fn state(&self) -> Result<crate::backend::BackendState, BackendError> {
        crate::backend::BackendState::encode(KIND, &self.state)
    }
}

async fn pump_output(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    cap: usize,
    stream: OutputStream,
    callback: Option<OutputCallback>,
) -> CappedBuffer {
    let mut buf = CappedBuffer::new(cap);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return buf,
            Ok(n) => {
                if let Some(cb) = &callback {
                    cb(stream, &chunk[..n]);
                }
                buf.push(&chunk[..n]);
            }
        }
    }
}

fn kill_group(pgid: u32) {
    // SAFETY: killpg only sends a signal; a stale id fails with ESRCH.
    unsafe {
        libc::killpg(pgid as libc::pid_t, libc::SIGKILL);
    }
}

/// Runs `sh -c` in `root` in a new process group; the timeout kills the
/// whole group, including children that outlive the shell.
async fn run_local(root: &Path, request: ExecRequest) -> Result<ExecResult, BackendError> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&request.command)
        .current_dir(root)
        .envs(&request.env)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LocalBackend::op_error("starting sh", e))?;
    let pgid = child.id().unwrap_or(0);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_task = tokio::spawn(pump_output(
        stdout.ok_or_else(|| LocalBackend::op_error("exec", "no stdout pipe"))?,
        request.stdout_cap,
        OutputStream::Stdout,
        request.on_output.clone(),
    ));
    let err_task = tokio::spawn(pump_output(
        stderr.ok_or_else(|| LocalBackend::op_error("exec", "no stderr pipe"))?,
        request.stderr_cap,
        OutputStream::Stderr,
        request.on_output.clone(),
    ));
    // The command is done when the shell has exited and its output is
    // closed (children holding the pipes keep it running).
    let deadline = tokio::time::Instant::now() + request.timeout;
    let mut out_task = out_task;
    let mut err_task = err_task;
    let mut exit_code = TIMEOUT_EXIT_CODE;
    let mut timed_out = true;
    let mut out_done: Option<CappedBuffer> = None;
    let mut err_done: Option<CappedBuffer> = None;
    if let Ok(status) = tokio::time::timeout_at(deadline, child.wait()).await {
        let status = status.map_err(|e| LocalBackend::op_error("waiting for the command", e))?;
        let outputs_closed = tokio::time::timeout_at(deadline, async {
            out_done = Some(
                (&mut out_task)
                    .await
                    .unwrap_or_else(|_| CappedBuffer::new(0)),
            );
            err_done = Some(
                (&mut err_task)
                    .await
                    .unwrap_or_else(|_| CappedBuffer::new(0)),
            );
        })
        .await;
        if outputs_closed.is_ok() {
            exit_code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(-1);
            timed_out = false;
        }
    }
    if timed_out && pgid != 0 {
        kill_group(pgid);
        let _ = child.kill().await;
    }
    // After the kill the pipes close; anything that escaped the group and
    // still holds them gets a short grace, then its output is abandoned.
    let grace = std::time::Duration::from_secs(2);
    let out = match out_done {
        Some(b) => b,
        None => match tokio::time::timeout(grace, &mut out_task).await {
            Ok(Ok(b)) => b,
            _ => {
                out_task.abort();
                CappedBuffer::new(0)
            }
        },
    };
    let err = match err_done {
        Some(b) => b,
        None => match tokio::time::timeout(grace, &mut err_task).await {
            Ok(Ok(b)) => b,
            _ => {
                err_task.abort();
                CappedBuffer::new(0)
            }
        },
    };
    let (stdout, stdout_dropped) = out.finish();
    let (stderr, stderr_dropped) = err.finish();
    Ok(ExecResult {
        exit_code,
        stdout,
        stderr,
        truncated: stdout_dropped + stderr_dropped > 0,
        stdout_dropped,
        stderr_dropped,
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}
