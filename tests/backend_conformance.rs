//! The backend conformance suite (`berth::conformance::check_backend`)
//! against the built-in backends: local, and Docker with each disaster a
//! container can suffer. (The out-of-crate backend runs it in
//! `custom_backend.rs`.)

use std::process::Command;

use berth::backend::BackendSpec;
use berth::conformance::{check_backend, BackendUnderTest, Disaster};
use berth::sandbox::SandboxState;
use berth_tests::{container_id, docker_or_skip, local_root, test_image};

struct Local;

#[async_trait::async_trait]
impl BackendUnderTest for Local {
    fn name(&self) -> String {
        "local backend".into()
    }

    fn spec(&self) -> BackendSpec {
        BackendSpec::local()
    }

    fn disasters(&self) -> Vec<Disaster> {
        vec![Disaster::WorkspaceDeleted]
    }

    async fn inflict(&self, disaster: Disaster, state: &SandboxState) -> Result<(), String> {
        match disaster {
            Disaster::WorkspaceDeleted => {
                berth_tests::remove_workspace(local_root(state));
                Ok(())
            }
            other => Err(format!("the local backend cannot suffer {other:?}")),
        }
    }
}

/// The Docker backend, under the engine's default runtime or a named one.
struct Docker {
    runtime: Option<&'static str>,
}

fn docker_cli(args: &[&str]) -> Result<(), String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[async_trait::async_trait]
impl BackendUnderTest for Docker {
    fn name(&self) -> String {
        match self.runtime {
            Some(runtime) => format!("docker backend ({}, runtime {runtime})", test_image()),
            None => format!("docker backend ({})", test_image()),
        }
    }

    fn spec(&self) -> BackendSpec {
        let options = berth_docker::DockerOptions::new(test_image());
        BackendSpec::new(match self.runtime {
            Some(runtime) => options.runtime(runtime),
            None => options,
        })
    }

    fn provider(&self) -> Option<std::sync::Arc<dyn berth::backend::BackendProvider>> {
        Some(std::sync::Arc::new(berth_docker::DockerProvider::default()))
    }

    fn disasters(&self) -> Vec<Disaster> {
        vec![
            Disaster::InstanceRemoved,
            Disaster::InstanceStopped,
            Disaster::WorkspaceDeleted,
        ]
    }

    async fn inflict(&self, disaster: Disaster, state: &SandboxState) -> Result<(), String> {
        let id = container_id(state);
        match disaster {
            Disaster::InstanceRemoved => docker_cli(&["rm", "-f", &id]),
            Disaster::InstanceStopped => docker_cli(&["stop", "-t", "1", &id]),
            // A workspace with a disk quota is its image: losing it is
            // losing the image (the mount point itself cannot be removed).
            Disaster::WorkspaceDeleted => match state
                .backend
                .decode::<berth_docker::DockerState>()
                .map_err(|e| e.to_string())?
                .disk
            {
                Some(disk) => {
                    berth_tests::remove_workspace(&disk.mount_point);
                    Ok(())
                }
                None => docker_cli(&["exec", &id, "rm", "-rf", "/workspace"]),
            },
            other => Err(format!("not a Docker disaster: {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_backend_keeps_the_lifecycles_promises() {
    let home = tempfile::tempdir().unwrap();
    let report = check_backend(&Local, home.path()).await;
    assert!(report.passed(), "{}", report.table());
    assert!(report
        .clause("round-trip-after-workspace-deleted")
        .is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_docker_backend_keeps_the_lifecycles_promises() {
    if docker_or_skip("the_docker_backend_keeps_the_lifecycles_promises")
        .await
        .is_none()
    {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let report = check_backend(&Docker { runtime: None }, home.path()).await;
    assert!(report.passed(), "{}", report.table());
    for clause in [
        "round-trip-after-instance-removed",
        "round-trip-after-instance-stopped",
        "round-trip-after-workspace-deleted",
    ] {
        assert!(report.clause(clause).is_some(), "{clause} did not run");
    }
}

/// The same promises under gVisor: the agent, streamed commands, caps,
/// timeouts, persist and restore, and recovery from each disaster.
#[tokio::test(flavor = "multi_thread")]
async fn the_docker_backend_under_gvisor_keeps_the_lifecycles_promises() {
    if docker_or_skip("the_docker_backend_under_gvisor_keeps_the_lifecycles_promises")
        .await
        .is_none()
    {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let docker = Docker {
        runtime: Some(berth_docker::runtime::GVISOR),
    };
    let report = check_backend(&docker, home.path()).await;
    assert!(report.passed(), "{}", report.table());
    assert!(report.clause("round-trip-after-instance-removed").is_some());
}
