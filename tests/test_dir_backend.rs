//! A backend kind written outside the library, as an embedder would: a
//! workspace in a host directory with its own state, options, settings and
//! provider. `custom_backend.rs` drives it through the library; the
//! `berth-test-dir` binary registers it with the `berth` command
//! (`berth_cli::Berth`), which brings it to the CLI, the API and Python.

use std::path::PathBuf;

use berth::backend::{
    ArchiveStream, Backend, BackendError, BackendOptions, BackendProvider, BackendSettings,
    BackendState, BackendSummary, CreateContext, ExecDriver, ExecEvent, ExecExit, ExecInput,
    ExecProcess, ExecRequest, Provisioned, SettingDoc,
};
use berth::sandbox::BackendSpec;
use berth::workspace::archive::{extract_stream, pack_dir};
use berth::workspace::entries::BindMounts;
use serde::{Deserialize, Serialize};

/// The kind.
pub const KIND: &str = "test-dir";

/// Its state: the workspace directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirState {
    /// The workspace.
    pub dir: PathBuf,
}

/// A workspace in a host directory, commands run with `sh -c` in it.
pub struct DirBackend {
    /// Its state.
    pub state: DirState,
}

fn failed(
    operation: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    BackendError::Operation {
        backend: KIND,
        operation,
        source: e.into(),
    }
}

/// Options of a new `test-dir` sandbox: where its directories go.
#[derive(Debug)]
pub struct DirOptions {
    /// The parent of every sandbox's directory.
    pub parent: PathBuf,
}

#[async_trait::async_trait]
impl BackendOptions for DirOptions {
    fn kind(&self) -> &str {
        KIND
    }

    async fn create(
        self: Box<Self>,
        context: &CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(DirBackend {
            state: DirState {
                dir: self.parent.join(context.session_id),
            },
        }))
    }
}

/// Its settings from a front end: `berth create --backend test-dir -o
/// parent=DIR`, the API's `{"type": "test-dir", "parent": DIR}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirSettings {
    /// Where sandboxes' directories go.
    pub parent: PathBuf,
}

/// What [`DirSettings`] takes.
pub const SETTINGS: &[SettingDoc] = &[SettingDoc::required(
    "parent",
    "PATH",
    "the directory each sandbox's workspace directory goes in",
)];

/// The `test-dir` provider, registered with the client.
pub struct DirProvider;

#[async_trait::async_trait]
impl BackendProvider for DirProvider {
    fn kind(&self) -> &str {
        KIND
    }

    async fn resume(
        &self,
        state: &BackendState,
        _session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(DirBackend {
            state: state.decode()?,
        }))
    }

    fn summary(&self, state: &BackendState) -> BackendSummary {
        let dir: Option<DirState> = state.decode().ok();
        BackendSummary::new(dir.map(|d| d.dir.display().to_string()), None)
    }

    fn settings_doc(&self) -> Vec<SettingDoc> {
        SETTINGS.to_vec()
    }

    fn options_from(&self, settings: &BackendSettings) -> Result<BackendSpec, BackendError> {
        let settings: DirSettings = settings.decode(SETTINGS)?;
        Ok(BackendSpec::new(DirOptions {
            parent: settings.parent,
        }))
    }

    fn options_like(&self, state: &BackendState) -> Result<BackendSpec, BackendError> {
        let dir: DirState = state.decode()?;
        Ok(BackendSpec::new(DirOptions {
            parent: dir.dir.parent().unwrap_or(&dir.dir).to_path_buf(),
        }))
    }
}

impl DirBackend {
    /// The instance marker, beside the workspace directory.
    fn marker(&self) -> PathBuf {
        self.state.dir.with_extension("instance")
    }
}

#[async_trait::async_trait]
impl Backend for DirBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        Ok(Provisioned::Existing)
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        // Good enough for a test: a marker file beside the workspace names
        // the instance (deleting the workspace deletes the instance).
        if !self.state.dir.is_dir() {
            return Ok(None);
        }
        Ok(std::fs::read_to_string(self.marker()).ok())
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        Ok(self.state.dir.is_dir())
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        std::fs::create_dir_all(&self.state.dir).map_err(|e| failed("mkdir", e))?;
        let marker = self.marker();
        if !marker.exists() {
            let id = format!("{:?}", std::time::SystemTime::now());
            std::fs::write(marker, id).map_err(|e| failed("marking", e))?;
        }
        Ok(())
    }

    /// Runs the command in its own process group, its output streamed as
    /// events; the timeout, or a reader that drops the process, kills the
    /// whole group.
    async fn spawn(&self, request: ExecRequest) -> Result<ExecProcess, BackendError> {
        if request.pty.is_some() || request.session.is_some() {
            return Err(BackendError::Unsupported {
                backend: "dir backend",
                what: "run on a terminal or in a session",
                why: "it runs plain pipes".into(),
            });
        }
        let started = std::time::Instant::now();
        // Words go through `exec "$@"`: it runs a program, never a
        // builtin of that name, and exits 127 when there is none.
        let args: Vec<String> = match &request.argv {
            Some(argv) => ["-c", "exec \"$@\"", "berth"]
                .into_iter()
                .map(String::from)
                .chain(argv.iter().cloned())
                .collect(),
            None => vec!["-c".into(), request.command.clone()],
        };
        let mut child = tokio::process::Command::new("sh")
            .args(&args)
            .current_dir(&self.state.dir)
            .envs(&request.env)
            .stdin(if request.stdin {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed("exec", e))?;
        let pgid = child.id().unwrap_or(0);
        let kill_group = move || {
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{pgid}")])
                .status();
        };
        let (process, driver) = ExecProcess::channel();
        let ExecDriver { events, mut input } = driver;
        let mut stdin = child.stdin.take();
        let pump = |mut from: Box<dyn tokio::io::AsyncRead + Send + Unpin>, stdout: bool| {
            let events = events.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                loop {
                    let n = match tokio::io::AsyncReadExt::read(&mut from, &mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                    let event = if stdout {
                        ExecEvent::Stdout(chunk)
                    } else {
                        ExecEvent::Stderr(chunk)
                    };
                    if events.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            })
        };
        let out = pump(Box::new(child.stdout.take().unwrap()), true);
        let err = pump(Box::new(child.stderr.take().unwrap()), false);
        let timeout = request.timeout;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let finished = async {
                let status = child.wait().await;
                let _ = out.await;
                let _ = err.await;
                status
            };
            tokio::pin!(finished);
            let status = loop {
                tokio::select! {
                    s = &mut finished => break Some(s),
                    _ = tokio::time::sleep_until(deadline) => break None,
                    _ = events.closed() => {
                        kill_group();
                        return;
                    }
                    msg = input.recv() => match msg {
                        Some(ExecInput::Stdin(b)) => {
                            if let Some(w) = stdin.as_mut() {
                                let _ = tokio::io::AsyncWriteExt::write_all(w, &b).await;
                            }
                        }
                        Some(ExecInput::CloseStdin) => stdin = None,
                        Some(_) => {}
                        None => {}
                    },
                }
            };
            let exit = match status {
                Some(Ok(s)) => ExecExit::new(s.code().unwrap_or(-1), false, started.elapsed()),
                Some(Err(e)) => {
                    let _ = events.send(Err(failed("waiting", e))).await;
                    return;
                }
                None => {
                    kill_group();
                    ExecExit::new(124, true, started.elapsed())
                }
            };
            let _ = events.send(Ok(ExecEvent::Exit(exit))).await;
        });
        Ok(process)
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        Ok(Box::new(pack_dir(self.state.dir.clone(), exclude.to_vec())))
    }

    async fn write_archive(&self, archive: ArchiveStream) -> Result<(), BackendError> {
        extract_stream(archive, self.state.dir.clone())
            .await
            .map_err(|e| failed("extracting", e))?;
        Ok(())
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        let _ = std::fs::remove_dir_all(&self.state.dir);
        let _ = std::fs::remove_file(self.marker());
        Ok(())
    }

    fn bind_mounts(&self) -> BindMounts {
        BindMounts::Skip
    }

    fn state(&self) -> Result<BackendState, BackendError> {
        BackendState::encode(KIND, &self.state)
    }
}
