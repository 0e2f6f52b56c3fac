//! The backend conformance suite on the swarm fixture (part of the `swarm`
//! test binary).

use super::*;

/// The swarm backend under the conformance suite; disasters inflicted on
/// the task's container through its node's engine.
struct SwarmUnderTest {
    swarm: Swarm,
    manifest: PathBuf,
}

#[async_trait::async_trait]
impl berth::conformance::BackendUnderTest for SwarmUnderTest {
    fn name(&self) -> String {
        format!("swarm backend ({})", test_image())
    }

    fn provider(&self) -> Option<std::sync::Arc<dyn berth::backend::BackendProvider>> {
        Some(std::sync::Arc::new(
            berth_docker::swarm::SwarmProvider::default(),
        ))
    }

    fn spec(&self) -> berth::backend::BackendSpec {
        berth::backend::BackendSpec::new(berth_docker::swarm::SwarmOptions::new(
            self.swarm.manager.clone(),
            test_image(),
        ))
    }

    fn snapshot(&self, _home: &Path) -> berth::sandbox::SnapshotSpec {
        berth::sandbox::SnapshotSpec::remote(self.manifest.clone())
    }

    fn disasters(&self) -> Vec<berth::conformance::Disaster> {
        use berth::conformance::Disaster;
        vec![
            Disaster::InstanceRemoved,
            Disaster::InstanceStopped,
            Disaster::WorkspaceDeleted,
        ]
    }

    async fn inflict(
        &self,
        disaster: berth::conformance::Disaster,
        state: &berth::sandbox::SandboxState,
    ) -> Result<(), String> {
        use berth::conformance::Disaster;
        let swarm: SwarmState = state.backend.decode().map_err(|e| e.to_string())?;
        let task = swarm.current.ok_or("no task recorded")?;
        let node = self.swarm.node_named(&task.node);
        let c = task.container.as_str();
        match disaster {
            Disaster::InstanceRemoved => self.swarm.docker(&node, &["rm", "-f", c]),
            Disaster::InstanceStopped => self.swarm.docker(&node, &["stop", "-t", "1", c]),
            Disaster::WorkspaceDeleted => self
                .swarm
                .docker(&node, &["exec", c, "rm", "-rf", "/workspace"]),
            other => return Err(format!("not a swarm disaster: {other:?}")),
        }
        .map(drop)
    }
}

#[test]
fn the_swarm_backend_keeps_the_lifecycles_promises() {
    let _serial = serial();
    let Some(s) = setup("the_swarm_backend_keeps_the_lifecycles_promises") else {
        return;
    };
    let before = s.swarm.berth_services();
    let under_test = SwarmUnderTest {
        swarm: s.swarm.clone(),
        manifest: s.manifest.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = runtime.block_on(berth::conformance::check_backend(
        &under_test,
        &s.home().join("suite"),
    ));
    assert!(report.passed(), "{}", report.table());
    for clause in [
        "round-trip-after-instance-removed",
        "round-trip-after-instance-stopped",
        "round-trip-after-workspace-deleted",
    ] {
        assert!(report.clause(clause).is_some(), "{clause} did not run");
    }
    assert_eq!(
        s.swarm.berth_services(),
        before,
        "the suite left services behind"
    );
}
