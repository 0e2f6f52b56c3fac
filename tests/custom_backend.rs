//! A `Backend` written outside the crate, as an embedder would: a workspace
//! in a host directory with its own state type, its options and its
//! registered provider, driven by the same lifecycle (start, exec, stop,
//! shutdown, resume from JSON, listed, forked-like), snapshots and lineage
//! guard included; and without registration, `resume_with_backend`.

use std::path::PathBuf;
use std::time::Duration;

use berth::backend::{
    ArchiveStream, Backend, BackendError, BackendOptions, BackendProvider, BackendState,
    BackendSummary, CreateContext, ExecDriver, ExecEvent, ExecExit, ExecInput, ExecProcess,
    ExecRequest, Provisioned,
};
use berth::sandbox::{
    BackendSpec, SandboxClient, SandboxError, SandboxOptions, SandboxSpec, SandboxState,
    SnapshotSpec, StartBranch,
};
use berth::workspace::archive::{extract_stream, pack_dir};
use berth::workspace::entries::BindMounts;
use berth::workspace::WorkspaceSpec;
use serde::{Deserialize, Serialize};

const KIND: &str = "test-dir";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DirState {
    dir: PathBuf,
}

struct DirBackend {
    state: DirState,
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
struct DirOptions {
    parent: PathBuf,
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

/// The `test-dir` provider, registered with the client.
struct DirProvider;

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
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", &request.command])
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

/// Starts a resumed sandbox whose workspace is gone: it is rebuilt from
/// the snapshot, both files back; then shuts it down.
async fn restored_both_files(sb: &mut berth::sandbox::Sandbox) {
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    let r = sb
        .exec(ExecRequest::new("cat a.txt b.txt", Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(r.stdout, "a\nb\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_written_outside_the_crate_runs_the_whole_lifecycle() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("ws");
    let client = SandboxClient::new(home.path());
    let workspace: WorkspaceSpec =
        serde_json::from_str(r#"{"entries": {"a.txt": {"type": "file", "content": "a\n"}}}"#)
            .unwrap();
    let backend = DirBackend {
        state: DirState { dir: dir.clone() },
    };
    let spec = SandboxSpec::new(workspace)
        .snapshot(SnapshotSpec::Local {
            base_dir: home.path().join("snaps"),
        })
        .backend(BackendSpec::custom(Box::new(backend)));
    let mut sb = client.create(spec).await.unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    let r = sb
        .exec(ExecRequest::new(
            "cat a.txt; echo b > b.txt",
            Duration::from_secs(10),
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, "a\n");
    sb.stop().await.unwrap();
    let saved = sb.state().to_json().unwrap();
    sb.shutdown().await.unwrap();
    assert!(!dir.exists());

    // Resume from the JSON alone, with the embedder's own constructor.
    let state = SandboxState::from_json(&saved).unwrap();
    assert_eq!(state.backend.kind, KIND);
    let backend = DirBackend {
        state: state.backend.decode().unwrap(),
    };
    // A client without its provider cannot construct it: it says which
    // kinds it knows.
    let err = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .err()
        .unwrap();
    match &err {
        SandboxError::UnknownBackend { kind, known } => {
            assert_eq!(kind, KIND);
            assert!(known.contains(&"local".to_string()), "{known:?}");
        }
        other => panic!("expected UnknownBackend, got {other}"),
    }
    let mut sb = client
        .resume_with_backend(state, None, Box::new(backend), SandboxOptions::default())
        .await
        .unwrap();
    restored_both_files(&mut sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_provider_creates_resumes_lists_and_makes_one_like_it() {
    let home = tempfile::tempdir().unwrap();
    let parent = home.path().join("dirs");
    let client = SandboxClient::builder(home.path())
        .backend_provider(DirProvider)
        .build();
    assert!(client.backend_kinds().contains(&KIND.to_string()));
    let workspace: WorkspaceSpec =
        serde_json::from_str(r#"{"entries": {"a.txt": {"type": "file", "content": "a\n"}}}"#)
            .unwrap();
    let spec = SandboxSpec::new(workspace.clone())
        .snapshot(SnapshotSpec::Local {
            base_dir: home.path().join("snaps"),
        })
        .backend(BackendSpec::new(DirOptions {
            parent: parent.clone(),
        }));
    let mut sb = client.create(spec).await.unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    sb.exec(ExecRequest::new("echo b > b.txt", Duration::from_secs(10)))
        .await
        .unwrap();
    sb.stop().await.unwrap();
    let state = SandboxState::from_json(&sb.state().to_json().unwrap()).unwrap();
    let dir: DirState = state.backend.decode().unwrap();
    assert!(dir.dir.starts_with(&parent), "{dir:?}");
    let summary = client.backend_summary(&state.backend).unwrap();
    assert_eq!(summary.instance, Some(dir.dir.display().to_string()));
    sb.shutdown().await.unwrap();

    // Resumed by kind, as the built-in backends are.
    let mut sb = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .unwrap();
    restored_both_files(&mut sb).await;

    // A new sandbox like it: same kind, its own directory.
    let like = client.backend_like(&state.backend).unwrap();
    let mut other = client
        .create(SandboxSpec::new(workspace).backend(like))
        .await
        .unwrap();
    other.start().await.unwrap();
    let other_dir: DirState = other.state().backend.decode().unwrap();
    assert_eq!(other.state().backend.kind, KIND);
    assert_ne!(other_dir.dir, dir.dir);
    assert!(other_dir.dir.starts_with(&parent));
    other.shutdown().await.unwrap();
}

/// The out-of-crate backend passes the backend conformance suite, as the
/// built-in ones do (`lifecycle.rs`).
struct DirUnderTest {
    parent: PathBuf,
}

#[async_trait::async_trait]
impl berth::conformance::BackendUnderTest for DirUnderTest {
    fn name(&self) -> String {
        "test-dir backend (outside the crate)".into()
    }

    fn spec(&self) -> BackendSpec {
        BackendSpec::new(DirOptions {
            parent: self.parent.clone(),
        })
    }

    fn provider(&self) -> Option<std::sync::Arc<dyn BackendProvider>> {
        Some(std::sync::Arc::new(DirProvider))
    }

    fn disasters(&self) -> Vec<berth::conformance::Disaster> {
        vec![berth::conformance::Disaster::WorkspaceDeleted]
    }

    async fn inflict(
        &self,
        disaster: berth::conformance::Disaster,
        state: &SandboxState,
    ) -> Result<(), String> {
        let dir: DirState = state.backend.decode().map_err(|e| e.to_string())?;
        match disaster {
            berth::conformance::Disaster::WorkspaceDeleted => {
                std::fs::remove_dir_all(dir.dir).map_err(|e| e.to_string())
            }
            other => Err(format!("cannot inflict {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_out_of_crate_backend_passes_the_backend_conformance_suite() {
    let home = tempfile::tempdir().unwrap();
    let backend = DirUnderTest {
        parent: home.path().join("dirs"),
    };
    let report = berth::conformance::check_backend(&backend, home.path()).await;
    assert!(report.passed(), "{}", report.table());
}
