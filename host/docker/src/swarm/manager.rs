//! The swarm as Berth asks it: a manager that answers (the recorded ones
//! in turn), the sandbox's service (created once, never updated), its
//! tasks, and the node engine a task's container is on.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{
    Limit, ResourceObject, ServiceSpec, ServiceSpecMode, ServiceSpecModeReplicated, Task, TaskSpec,
    TaskSpecContainerSpec, TaskSpecPlacement, TaskSpecResources, TaskSpecRestartPolicy,
    TaskSpecRestartPolicyConditionEnum, TaskState,
};
use bollard::query_parameters::{ListNodesOptionsBuilder, ListTasksOptionsBuilder};
use bollard::Docker;

use super::options::SwarmState;
use super::BACKEND;
use crate::{engine, DEFAULT_PIDS_LIMIT, KEEP_ALIVE};
use berth::backend::BackendError;

/// How long one manager call may take before the next manager is tried
/// (a manager cut off from the others can hang until its election
/// timeout).
const MANAGER_CALL: Duration = Duration::from_secs(5);

/// A manager that answered, and which one.
pub(super) struct Manager {
    pub(super) docker: Docker,
    pub(super) reference: String,
}

fn unreachable(message: String, source: Option<BackendError>) -> BackendError {
    BackendError::Unreachable {
        backend: BACKEND,
        message,
        source: source.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
    }
}

/// What a manager says while the swarm has no leader (Docker's own
/// words: "The swarm does not have a leader. It's possible that too few
/// managers are online…").
const LEADERLESS_ANSWER: &str = "does not have a leader";

/// How Berth names that state; [`is_leaderless`] looks for it.
const NO_LEADER: &str = "the swarm has no leader";

/// How Berth names a manager call that did not finish in time: a manager
/// hangs so while it is cut off from the others or an election is under
/// way.
const NO_ANSWER_IN_TIME: &str = "cut off from the other managers, or electing a leader";

/// Whether `e` says the swarm has no leader — it is electing one, or too
/// few managers are up for one — or that a manager hung as managers do
/// meanwhile. Worth waiting for, as a placement is.
pub(super) fn is_leaderless(e: &BackendError) -> bool {
    matches!(e, BackendError::Unreachable { message, .. }
        if message.contains(NO_LEADER) || message.contains(NO_ANSWER_IN_TIME))
}

/// The manager's own answer is this backend's service error, its status
/// kept (so "not found" is told apart), except that the swarm has no
/// leader, which is a manager that cannot serve for now; anything else
/// means the manager stopped answering.
fn swarm_error(operation: &'static str, e: bollard::errors::Error) -> BackendError {
    if let bollard::errors::Error::DockerResponseServerError { message, .. } = &e {
        if message.contains(LEADERLESS_ANSWER) {
            return unreachable(
                format!(
                    "{operation}: {NO_LEADER} (it is electing one, or too few managers are up)"
                ),
                None,
            );
        }
    }
    crate::service_error(BACKEND, operation, e, |other| {
        unreachable(
            format!("{operation}: the swarm manager stopped answering"),
            Some(BackendError::Operation {
                backend: BACKEND,
                operation,
                source: Box::new(other),
            }),
        )
    })
}

async fn timed<T>(
    operation: &'static str,
    call: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(MANAGER_CALL, call).await {
        Ok(r) => r.map_err(|e| swarm_error(operation, e)),
        Err(_) => Err(no_answer(operation)),
    }
}

/// A manager call that did not finish within [`MANAGER_CALL`].
fn no_answer(operation: &'static str) -> BackendError {
    unreachable(
        format!(
            "{operation}: the swarm manager did not answer within {} s ({NO_ANSWER_IN_TIME})",
            MANAGER_CALL.as_secs()
        ),
        None,
    )
}

pub(super) fn is_not_found(e: &BackendError) -> bool {
    e.service_status() == Some(404)
}

/// The first of `state`'s managers that answers as a manager with a
/// leader (those in `suspects` last); every failure is named when none
/// does.
pub(super) async fn connect(
    state: &SwarmState,
    suspects: &[String],
) -> Result<Manager, BackendError> {
    let mut failures = Vec::new();
    let mut leaderless = false;
    let (last, first): (Vec<&String>, Vec<&String>) =
        state.managers.iter().partition(|m| suspects.contains(m));
    for reference in first.into_iter().chain(last) {
        match try_manager(reference, state).await {
            Ok(docker) => {
                return Ok(Manager {
                    docker,
                    reference: reference.clone(),
                })
            }
            Err(e) => {
                tracing::debug!(manager = %reference, error = %e, "swarm manager unusable; trying the next");
                leaderless |= e.to_string().contains(NO_LEADER);
                failures.push(format!("{reference}: {}", engine::causes(&e)));
            }
        }
    }
    let hint = match leaderless {
        true => NO_LEADER,
        false => "no swarm manager answers",
    };
    Err(unreachable(
        format!(
            "{hint} ({}); bring a manager back, or check that the swarm has a quorum",
            failures.join("; ")
        ),
        None,
    ))
}

async fn try_manager(reference: &str, state: &SwarmState) -> Result<Docker, BackendError> {
    let engine = engine::resolve(Some(reference), state.engine_cert_path.as_deref())?;
    let docker = engine::connect(&engine).await?;
    let info = timed("asking the engine for its swarm", docker.info()).await?;
    let swarm = info.swarm.unwrap_or_default();
    if swarm.control_available != Some(true) {
        return Err(BackendError::Config {
            backend: BACKEND,
            message: format!(
                "{engine} is not a swarm manager (its swarm state: {}); name a manager's engine, or run `docker swarm init` there",
                swarm
                    .local_node_state
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "unknown".into())
            ),
        });
    }
    // A call that needs the leader: a manager without one fails here.
    timed(
        "listing the swarm's managers",
        docker.list_nodes(Some(
            ListNodesOptionsBuilder::new()
                .filters(&HashMap::from([("role", vec!["manager"])]))
                .build(),
        )),
    )
    .await?;
    Ok(docker)
}

impl Manager {
    /// The managers' engines as their `berth.engine` labels name them, this
    /// one first (so a sandbox can be reached when this one is lost).
    pub(super) async fn managers(&self) -> Result<Vec<String>, BackendError> {
        let nodes = timed(
            "listing the swarm's managers",
            self.docker.list_nodes(Some(
                ListNodesOptionsBuilder::new()
                    .filters(&HashMap::from([("role", vec!["manager"])]))
                    .build(),
            )),
        )
        .await?;
        let mut out = vec![self.reference.clone()];
        for node in nodes {
            if let Some(label) = node
                .spec
                .and_then(|s| s.labels)
                .and_then(|mut l| l.remove(ENGINE_LABEL))
            {
                if !out.contains(&label) {
                    out.push(label);
                }
            }
        }
        Ok(out)
    }

    /// The service's id, or `None` when the swarm has no such service.
    pub(super) async fn service_id(&self, name: &str) -> Result<Option<String>, BackendError> {
        match timed(
            "inspecting the sandbox's service",
            self.docker.inspect_service(
                name,
                None::<bollard::query_parameters::InspectServiceOptions>,
            ),
        )
        .await
        {
            Ok(service) => Ok(service.id),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the sandbox's service: one replica, restarted on any exit,
    /// no network unless asked, every capability dropped, an init, limits,
    /// reservations and constraints.
    pub(super) async fn create_service(
        &self,
        state: &SwarmState,
        session_id: &str,
    ) -> Result<String, BackendError> {
        let labels = HashMap::from([("berth.session".to_string(), session_id.to_string())]);
        let container = TaskSpecContainerSpec {
            image: Some(state.image.clone()),
            labels: Some(labels.clone()),
            command: Some(vec!["sh".into(), "-c".into(), KEEP_ALIVE.into()]),
            env: Some(
                state
                    .environment
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            ),
            dir: Some(state.workspace_root.clone()),
            init: Some(true),
            capability_drop: Some(vec!["ALL".into()]),
            stop_grace_period: Some(2_000_000_000),
            ..Default::default()
        };
        let nano = |c: f64| (c * 1e9) as i64;
        let spec = ServiceSpec {
            name: Some(state.service_name.clone()),
            labels: Some(labels),
            task_template: Some(TaskSpec {
                container_spec: Some(container),
                resources: Some(TaskSpecResources {
                    limits: Some(Limit {
                        nano_cpus: state.cpu_count.map(nano),
                        memory_bytes: state.memory_size_bytes,
                        pids: Some(state.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT)),
                    }),
                    reservations: Some(ResourceObject {
                        nano_cpus: state.reserve_cpus.map(nano),
                        memory_bytes: state.reserve_memory_bytes,
                        ..Default::default()
                    }),
                }),
                restart_policy: Some(TaskSpecRestartPolicy {
                    condition: Some(TaskSpecRestartPolicyConditionEnum::ANY),
                    delay: Some(0),
                    max_attempts: Some(0),
                    ..Default::default()
                }),
                placement: Some(TaskSpecPlacement {
                    constraints: Some(state.constraints.clone()),
                    ..Default::default()
                }),
                networks: state.network.as_ref().map(|n| {
                    vec![bollard::models::NetworkAttachmentConfig {
                        target: Some(n.clone()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            mode: Some(ServiceSpecMode {
                replicated: Some(ServiceSpecModeReplicated { replicas: Some(1) }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = timed(
            "creating the sandbox's service",
            self.docker.create_service(spec, None),
        )
        .await?;
        created.id.ok_or_else(|| BackendError::Operation {
            backend: BACKEND,
            operation: "creating the sandbox's service",
            source: "the manager answered without the service's id".into(),
        })
    }

    /// Removes the service (its tasks' containers go with it); gone
    /// already is fine.
    pub(super) async fn remove_service(&self, name: &str) -> Result<(), BackendError> {
        match timed(
            "removing the sandbox's service",
            self.docker.delete_service(name),
        )
        .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The service's tasks the swarm wants running (normally one; two
    /// while a replacement starts).
    pub(super) async fn wanted_tasks(&self, service_id: &str) -> Result<Vec<Task>, BackendError> {
        let tasks = timed(
            "listing the sandbox's tasks",
            self.docker.list_tasks(Some(
                ListTasksOptionsBuilder::new()
                    .filters(&HashMap::from([
                        ("service", vec![service_id]),
                        ("desired-state", vec!["running"]),
                    ]))
                    .build(),
            )),
        )
        .await?;
        Ok(tasks
            .into_iter()
            .filter(|t| t.desired_state == Some(TaskState::RUNNING))
            .collect())
    }

    /// The node's engine (its `berth.engine` label) and hostname.
    pub(super) async fn node_engine(
        &self,
        node_id: &str,
    ) -> Result<(String, String), BackendError> {
        let node = timed(
            "inspecting the task's node",
            self.docker.inspect_node(node_id),
        )
        .await?;
        let hostname = node
            .description
            .and_then(|d| d.hostname)
            .unwrap_or_default();
        let engine = node
            .spec
            .and_then(|s| s.labels)
            .and_then(|mut l| l.remove(ENGINE_LABEL))
            .ok_or_else(|| BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "node {node_id} ({hostname}) has no `{ENGINE_LABEL}` label, so Berth cannot reach its engine \
                     (a manager proxies neither exec nor the archive API): \
                     `docker node update --label-add {ENGINE_LABEL}=ENDPOINT-OR-CONTEXT {node_id}`"
                ),
            })?;
        Ok((engine, hostname))
    }
}

/// The node label naming a node's own engine.
pub const ENGINE_LABEL: &str = "berth.engine";

/// A task's state, as the swarm words it.
pub(super) fn task_state(task: &Task) -> String {
    task.status
        .as_ref()
        .and_then(|s| s.state)
        .map(|s| s.to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Why a task is not running, in the swarm's words.
pub(super) fn task_reason(task: &Task) -> Option<String> {
    let status = task.status.as_ref()?;
    status
        .err
        .clone()
        .filter(|e| !e.is_empty())
        .or_else(|| status.message.clone().filter(|m| !m.is_empty()))
}

/// A running task's container id.
pub(super) fn task_container(task: &Task) -> Option<String> {
    if task.status.as_ref()?.state != Some(TaskState::RUNNING) {
        return None;
    }
    task.status
        .as_ref()?
        .container_status
        .as_ref()?
        .container_id
        .clone()
        .filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status_code: u16, message: &str) -> bollard::errors::Error {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.to_string(),
        }
    }

    #[test]
    fn a_swarm_without_a_leader_is_told_apart_from_other_answers() {
        let leaderless = swarm_error(
            "listing the service's tasks",
            answer(500, "rpc error: code = Unknown desc = The swarm does not have a leader. It's possible that too few managers are online. Make sure more than half of the managers are online."),
        );
        assert!(is_leaderless(&leaderless), "{leaderless}");
        assert!(leaderless
            .to_string()
            .contains("listing the service's tasks"));
        let other = swarm_error(
            "creating the service",
            answer(500, "rpc error: name conflicts"),
        );
        assert!(!is_leaderless(&other));
        assert_eq!(other.service_status(), Some(500));
        // A manager that hangs, as one does while cut off or electing.
        assert!(is_leaderless(&no_answer("asking the engine for its swarm")));
        let missing = swarm_error("inspecting the service", answer(404, "service x not found"));
        assert!(is_not_found(&missing) && !is_leaderless(&missing));
    }
}
