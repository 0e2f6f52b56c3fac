//! A `Backend` written outside the crate, as an embedder would: a workspace
//! in a host directory with its own state type, driven by the same
//! lifecycle (start, exec, stop, shutdown, resume from JSON with
//! `resume_with_backend`), snapshots and lineage guard included.

use std::path::PathBuf;
use std::time::Duration;

use berth::backend::{
    ArchiveStream, Backend, BackendError, BackendState, ExecRequest, ExecResult, Provisioned,
};
use berth::sandbox::{
    BackendSpec, SandboxClient, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec,
    StartBranch,
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

#[async_trait::async_trait]
impl Backend for DirBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        Ok(Provisioned::Existing)
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        // Good enough for a test: a marker file names the instance.
        Ok(std::fs::read_to_string(self.state.dir.join(".instance")).ok())
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        Ok(self.state.dir.is_dir())
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        std::fs::create_dir_all(&self.state.dir).map_err(|e| failed("mkdir", e))?;
        let marker = self.state.dir.join(".instance");
        if !marker.exists() {
            let id = format!("{:?}", std::time::SystemTime::now());
            std::fs::write(marker, id).map_err(|e| failed("marking", e))?;
        }
        Ok(())
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult, BackendError> {
        let out = tokio::process::Command::new("sh")
            .args(["-c", &request.command])
            .current_dir(&self.state.dir)
            .envs(&request.env)
            .output()
            .await
            .map_err(|e| failed("exec", e))?;
        Ok(ExecResult {
            exit_code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            truncated: false,
            stdout_dropped: 0,
            stderr_dropped: 0,
            timed_out: false,
            duration_ms: 0,
        })
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        let mut exclude = exclude.to_vec();
        exclude.push(PathBuf::from(".instance"));
        Ok(Box::new(pack_dir(self.state.dir.clone(), exclude)))
    }

    async fn write_archive(&self, archive: ArchiveStream) -> Result<(), BackendError> {
        extract_stream(archive, self.state.dir.clone())
            .await
            .map_err(|e| failed("extracting", e))?;
        Ok(())
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        let _ = std::fs::remove_dir_all(&self.state.dir);
        Ok(())
    }

    fn bind_mounts(&self) -> BindMounts {
        BindMounts::Skip
    }

    fn state(&self) -> Result<BackendState, BackendError> {
        BackendState::encode(KIND, &self.state)
    }
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
        .backend(BackendSpec::Custom(Box::new(backend)));
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
    let saved = sb.state().to_json();
    sb.shutdown().await.unwrap();
    assert!(!dir.exists());

    // Resume from the JSON alone, with the embedder's own constructor.
    let state = SandboxState::from_json(&saved).unwrap();
    assert_eq!(state.backend.kind, KIND);
    let backend = DirBackend {
        state: state.backend.decode().unwrap(),
    };
    // The library cannot construct it: it says how to.
    let err = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("resume_with_backend"), "{err}");
    let mut sb = client
        .resume_with_backend(state, None, Box::new(backend), SandboxOptions::default())
        .await
        .unwrap();
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
