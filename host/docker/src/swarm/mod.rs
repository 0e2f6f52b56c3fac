//! The swarm backend: sandboxes placed by Docker's swarm mode across
//! nodes, and brought back on another node when theirs is lost.
//!
//! Each sandbox is one service with one replica (restart condition `any`,
//! limits, reservations, constraints; never updated, since any spec change
//! replaces the container with an empty one). A start waits for the swarm
//! to run the task, finds its node and container, and reaches **that
//! node's own engine** (a manager proxies neither exec nor the archive
//! API) through the node's `berth.engine` label, checking that the engine
//! really is that node. From there it is the Docker path unchanged: the
//! agent, the archive API, the freeze during a stop.
//!
//! Resume: the recorded task still running → reconnect
//! ([`Provisioned::Existing`]); another task running (the swarm
//! rescheduled it after a node loss, or restarted it) → a fresh container
//! ([`Provisioned::Created`]: the lifecycle restores the snapshot); the
//! service gone → created again and restored; the task pending → wait,
//! then [`BackendError::Placement`] with the swarm's reason.
//!
//! Fencing: a node that was cut off keeps its old container until it
//! rejoins. Before every command, and as the instance a stop's lineage
//! check compares, the backend asks a manager whether the recorded task is
//! still the one the swarm wants running; a stale container is never used
//! ([`BackendError::Stale`]) and never persisted (the lineage refuses).
//!
//! Managers: the state records every manager's engine (from their
//! `berth.engine` labels), tried in turn, so losing the leader costs an
//! election, not the sandbox.
//!
//! # Example
//!
//! A sandbox the swarm places on a node of the `cpu` pool with 2 GiB free,
//! its snapshots in a shared store (a local snapshot is refused):
//!
//! ```no_run
//! use std::time::Duration;
//! use berth_docker::swarm::SwarmOptions;
//! use berth::sandbox::{BackendSpec, SandboxClient, SandboxSpec, SnapshotSpec};
//! use berth::{ExecRequest, WorkspaceSpec};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = SandboxClient::new("/var/lib/berth");
//! let options = SwarmOptions::new("unix:///var/run/docker.sock", "python:3.12-slim")
//!     .constraint("node.labels.pool==cpu")
//!     .reserve_memory(2 << 30)
//!     .memory(4 << 30);
//! let spec = SandboxSpec::new(WorkspaceSpec::default())
//!     .snapshot(SnapshotSpec::remote("s3-store.toml"))
//!     .backend(BackendSpec::new(options));
//! let mut sandbox = client.create(spec).await?;
//! sandbox.start().await?; // waits for the swarm to run the task
//! let result = sandbox
//!     .exec(ExecRequest::new("python3 -V", Duration::from_secs(60)))
//!     .await?;
//! println!("{}", result.stdout_text());
//! sandbox.stop().await?; // persisted; if the node is lost, the next
//!                        // resume restores this on another node
//! # Ok(()) }
//! ```

mod isolation;
mod manager;
mod options;
mod provider;
mod settings;

pub use manager::ENGINE_LABEL;
pub use options::{
    PlacementProgress, PlacementStatus, SwarmOptions, SwarmState, TaskRecord,
    DEFAULT_PLACEMENT_TIMEOUT,
};
pub use provider::SwarmProvider;
pub use settings::{SwarmSettings, SETTINGS};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::models::ContainerStateStatusEnum;

use super::{DockerBackend, DockerState, PullPolicy};
use berth::backend::{
    ArchiveStream, Backend, BackendError, BackendState, ExecProcess, ExecRequest, Provisioned,
    PublishedPort, SandboxHelper,
};
use berth::workspace::entries::BindMounts;
use manager::Manager;

pub(crate) const BACKEND: &str = "swarm backend";

/// The swarm backend's kind in the sandbox state (`"type": "swarm"`).
pub const KIND: &str = "swarm";

/// How long a node's engine may take to say which node it is.
const NODE_CALL: Duration = Duration::from_secs(3);

/// How often a start asks the swarm about a task it waits for.
const POLL: Duration = Duration::from_millis(250);

/// The swarm backend.
pub struct SwarmBackend {
    state: SwarmState,
    session_id: String,
    progress: Option<PlacementProgress>,
    /// The manager that last answered.
    manager: tokio::sync::Mutex<Option<Manager>>,
    /// Managers that stopped answering, tried last.
    suspects: std::sync::Mutex<Vec<String>>,
    /// The recorded task's container, on its node's engine, once reached.
    container: tokio::sync::OnceCell<DockerBackend>,
}

impl SwarmBackend {
    /// A backend for a sandbox with `state`; connects to nothing yet (a
    /// start reaches a manager, then the task's node).
    pub async fn connect(
        state: SwarmState,
        session_id: &str,
        progress: Option<PlacementProgress>,
    ) -> Result<Self, BackendError> {
        if state.managers.is_empty() {
            return Err(BackendError::Config {
                backend: BACKEND,
                message: "no swarm manager is named; give one (--engine MANAGER)".into(),
            });
        }
        Ok(SwarmBackend {
            state,
            session_id: session_id.to_string(),
            progress,
            manager: tokio::sync::Mutex::new(None),
            suspects: std::sync::Mutex::new(Vec::new()),
            container: tokio::sync::OnceCell::new(),
        })
    }

    /// The task the workspace is in, and where (`None` before a start).
    pub fn current_task(&self) -> Option<&TaskRecord> {
        self.state.current.as_ref()
    }

    /// A manager that answers: the last one, else the recorded ones in
    /// turn.
    async fn manager(&self) -> Result<Manager, BackendError> {
        let mut slot = self.manager.lock().await;
        if let Some(m) = &*slot {
            return Ok(Manager {
                docker: m.docker.clone(),
                reference: m.reference.clone(),
            });
        }
        let m = self.connect_waiting_for_a_leader().await?;
        *slot = Some(Manager {
            docker: m.docker.clone(),
            reference: m.reference.clone(),
        });
        Ok(m)
    }

    /// A manager that answers; while the swarm has no leader (an
    /// election, or too few managers up), waits for one within the
    /// placement timeout, saying so.
    async fn connect_waiting_for_a_leader(&self) -> Result<Manager, BackendError> {
        let timeout = Duration::from_secs(self.state.placement_timeout_secs);
        let started = Instant::now();
        let mut waited = false;
        loop {
            let suspects = self.suspects.lock().map(|s| s.clone()).unwrap_or_default();
            match manager::connect(&self.state, &suspects).await {
                Ok(m) => {
                    if waited {
                        tracing::info!(
                            seconds = started.elapsed().as_secs_f64(),
                            "the swarm has a leader again"
                        );
                    }
                    return Ok(m);
                }
                Err(e) if manager::is_leaderless(&e) && started.elapsed() < timeout => {
                    if !waited {
                        tracing::info!("waiting for the swarm to elect a leader: {e}");
                    }
                    waited = true;
                    self.report(
                        "waiting for the swarm to elect a leader",
                        Some(e.to_string()),
                        false,
                    );
                    tokio::time::sleep(POLL).await;
                }
                Err(e) if manager::is_leaderless(&e) => {
                    self.report(
                        "waiting for the swarm to elect a leader",
                        Some(e.to_string()),
                        true,
                    );
                    return Err(BackendError::Unreachable {
                        backend: BACKEND,
                        message: format!(
                            "waited {} s (the placement timeout) for the swarm to elect a leader; {e}",
                            timeout.as_secs()
                        ),
                        source: None,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Forgets the manager (it stopped answering), and tries it last from
    /// now on: a manager cut off from the others costs its timeout once.
    async fn forget_manager(&self) {
        if let Some(m) = self.manager.lock().await.take() {
            if let Ok(mut suspects) = self.suspects.lock() {
                if !suspects.contains(&m.reference) {
                    suspects.push(m.reference);
                }
            }
        }
    }

    /// Runs `call` on a manager, trying the next ones when the one used
    /// stops answering.
    async fn with_manager<T, F, Fut>(&self, call: F) -> Result<T, BackendError>
    where
        F: Fn(Manager) -> Fut,
        Fut: std::future::Future<Output = Result<T, BackendError>>,
    {
        let manager = self.manager().await?;
        match call(manager).await {
            Err(BackendError::Unreachable { .. }) => {
                self.forget_manager().await;
                call(self.manager().await?).await
            }
            other => other,
        }
    }

    fn report(&self, state: &str, message: Option<String>, finished: bool) {
        if let Some(p) = &self.progress {
            (p.0)(&PlacementStatus {
                service: self.state.service_name.clone(),
                state: state.to_string(),
                message,
                finished,
            });
        }
    }

    /// The service's id, creating the service when the swarm has none
    /// (`true`: created now).
    async fn ensure_service(&mut self) -> Result<(String, bool), BackendError> {
        let name = self.state.service_name.clone();
        if let Some(id) = self
            .with_manager(|m| {
                let name = name.clone();
                async move { m.service_id(&name).await }
            })
            .await?
        {
            return Ok((id, false));
        }
        if self.state.current.is_some() {
            tracing::info!(service = %name, "the sandbox's service is gone; creating it again");
        }
        let manager = self.manager().await?;
        let id = manager
            .create_service(&self.state, &self.session_id)
            .await?;
        tracing::info!(service = %name, id = %id, "service created");
        Ok((id, true))
    }

    /// Waits for a running task of the service whose node's engine
    /// answers, and reaches its container there.
    async fn place(&mut self, service_id: &str) -> Result<Provisioned, BackendError> {
        let timeout = Duration::from_secs(self.state.placement_timeout_secs);
        let started = Instant::now();
        let recorded = self.state.current.as_ref().map(|t| t.task.clone());
        loop {
            let last: (String, Option<String>);
            match self.try_place(service_id, recorded.as_deref()).await {
                Ok(Ok(provisioned)) => {
                    self.report("running", None, true);
                    return Ok(provisioned);
                }
                Ok(Err(waiting)) => last = waiting,
                Err(BackendError::Unreachable { message, .. }) => {
                    self.forget_manager().await;
                    last = ("unreachable".into(), Some(message));
                }
                Err(e) => {
                    self.report("failed", Some(e.to_string()), true);
                    return Err(e);
                }
            }
            if started.elapsed() >= timeout {
                self.report(&last.0, last.1.clone(), true);
                return Err(BackendError::Placement {
                    backend: BACKEND,
                    what: format!("service {}", self.state.service_name),
                    state: last.0,
                    reason: last.1,
                    seconds: timeout.as_secs(),
                });
            }
            self.report(&last.0, last.1.clone(), false);
            tokio::time::sleep(POLL).await;
        }
    }

    /// One look at the swarm: `Ok(Ok(_))` the task's container was reached;
    /// `Ok(Err((state, reason)))` not yet.
    async fn try_place(
        &mut self,
        service_id: &str,
        recorded: Option<&str>,
    ) -> Result<Result<Provisioned, (String, Option<String>)>, BackendError> {
        let manager = self.manager().await?;
        let tasks = manager.wanted_tasks(service_id).await?;
        let mut running: Vec<_> = tasks
            .iter()
            .filter_map(|t| manager::task_container(t).map(|c| (t, c)))
            .collect();
        // The recorded task first: while it runs, it is the workspace.
        running.sort_by_key(|(t, _)| t.id.as_deref() != recorded);
        let Some((task, container)) = running.into_iter().next() else {
            return Ok(Err(match tasks.first() {
                Some(t) => (manager::task_state(t), manager::task_reason(t)),
                None => ("not yet scheduled".into(), None),
            }));
        };
        let task_id = task.id.clone().unwrap_or_default();
        let node_id = task.node_id.clone().unwrap_or_default();
        let (engine, hostname) = manager.node_engine(&node_id).await?;
        let node_name = if hostname.is_empty() {
            node_id.clone()
        } else {
            format!("{hostname} ({})", &node_id[..node_id.len().min(12)])
        };
        let mut backend = match self.reach(&engine, &container, &node_id).await {
            Ok(b) => b,
            Err(BackendError::Unreachable { .. }) => {
                // The swarm still runs the task on a node Berth cannot
                // reach: it reschedules once it notices the node is down.
                return Ok(Err((
                    "on an unreachable node".into(),
                    Some(format!(
                        "node {node_name}'s engine {engine} does not answer and the swarm has not rescheduled the task yet"
                    )),
                )));
            }
            Err(e) => return Err(e),
        };
        // The swarm starts and replaces task containers; Berth only thaws
        // one it froze. A container gone or exited behind the swarm's back
        // is replaced by the swarm once it notices: wait for that.
        let status = backend
            .find_container()
            .await?
            .and_then(|info| info.state)
            .and_then(|state| state.status);
        match status {
            Some(ContainerStateStatusEnum::RUNNING) | Some(ContainerStateStatusEnum::PAUSED) => {}
            other => {
                return Ok(Err((
                    "replacing its container".into(),
                    Some(format!(
                        "task {task_id}'s container on node {node_name} is {}; the swarm starts another task",
                        other.map_or("gone".to_string(), |s| s.to_string())
                    )),
                )))
            }
        }
        backend.ensure_running().await?;
        let same = recorded == Some(task_id.as_str());
        if !same {
            isolation::verify(&backend, self.state.network.as_deref(), &node_name).await?;
            let record = TaskRecord {
                task: task_id.clone(),
                node: node_id,
                hostname,
                engine,
                container: container.clone(),
                since: now_rfc3339(),
            };
            tracing::info!(service = %self.state.service_name, task = %task_id, node = %node_name,
                previous = ?recorded, "sandbox task running");
            self.state.history.push(record.clone());
            let excess = self
                .state
                .history
                .len()
                .saturating_sub(options::HISTORY_KEPT);
            self.state.history.drain(..excess);
            self.state.current = Some(record);
        }
        self.container = tokio::sync::OnceCell::new_with(Some(backend));
        Ok(Ok(if same {
            Provisioned::Existing
        } else {
            Provisioned::Created
        }))
    }

    /// The task's container on its node's engine, after checking that the
    /// engine is that node.
    async fn reach(
        &self,
        engine: &str,
        container: &str,
        node_id: &str,
    ) -> Result<DockerBackend, BackendError> {
        let state = DockerState {
            container_id: Some(container.to_string()),
            container_name: container.to_string(),
            image: self.state.image.clone(),
            workspace_root: self.state.workspace_root.clone(),
            // The swarm owns the container: Berth never creates or removes
            // it on the node.
            container_owned: false,
            memory_size_bytes: self.state.memory_size_bytes,
            cpu_count: self.state.cpu_count,
            exposed_ports: Vec::new(),
            network: "none".into(),
            additional_run_args: Vec::new(),
            environment: self.state.environment.clone(),
            binds: Vec::new(),
            mounts: Vec::new(),
            engine: Some(engine.to_string()),
            engine_cert_path: self.state.engine_cert_path.clone(),
            pull: PullPolicy::Never,
            agent: self.state.agent,
            // The swarm made the container; its runtime is the node's.
            runtime: None,
            user: None,
            pids_limit: None,
            disk: None,
            egress_socket_dir: None,
            egress_tunnel: self.state.egress_point.clone(),
        };
        // A killed daemon's socket can still accept (a child kept the
        // listening descriptor) and never answer: bounded as below.
        let backend = match tokio::time::timeout(
            NODE_CALL,
            DockerBackend::connect(state, &self.session_id, None),
        )
        .await
        {
            Ok(connected) => connected?,
            Err(_) => {
                return Err(BackendError::Unreachable {
                    backend: BACKEND,
                    message: format!(
                        "node {node_id}'s engine {engine} did not answer within {} s",
                        NODE_CALL.as_secs()
                    ),
                    source: None,
                })
            }
        };
        // A node cut off from the other managers can hold this answer
        // until its election times out: not answering in time is
        // unreachable, and the placement waits for the swarm to notice.
        let info = match tokio::time::timeout(NODE_CALL, backend.docker.info()).await {
            Ok(answer) => {
                answer.map_err(|e| super::api("asking the node's engine which node it is", e))?
            }
            Err(_) => {
                return Err(BackendError::Unreachable {
                    backend: BACKEND,
                    message: format!(
                        "{} did not say which node it is within {} s",
                        backend.engine(),
                        NODE_CALL.as_secs()
                    ),
                    source: None,
                })
            }
        };
        let actual = info.swarm.and_then(|s| s.node_id).unwrap_or_default();
        if actual != node_id {
            return Err(BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "node {node_id}'s `{ENGINE_LABEL}` label names {}, which is {}: fix the label \
                     (`docker node update --label-add {ENGINE_LABEL}=ENGINE {node_id}`)",
                    backend.engine(),
                    if actual.is_empty() {
                        "not in a swarm".to_string()
                    } else {
                        format!("node {actual}")
                    }
                ),
            });
        }
        Ok(backend)
    }

    /// The recorded task's container, once the swarm says it is still
    /// the one it wants running.
    async fn fence(&self) -> Result<&DockerBackend, BackendError> {
        let (Some(current), Some(service_id)) =
            (self.state.current.as_ref(), self.state.service_id.clone())
        else {
            return Err(BackendError::Operation {
                backend: BACKEND,
                operation: "reaching the sandbox",
                source: "the sandbox has not been started; start it first".into(),
            });
        };
        let tasks = self
            .with_manager(|m| {
                let service_id = service_id.clone();
                async move { m.wanted_tasks(&service_id).await }
            })
            .await?;
        let still = tasks.iter().any(|t| {
            t.id.as_deref() == Some(current.task.as_str()) && manager::task_container(t).is_some()
        });
        if still {
            return self
                .container
                .get_or_try_init(|| self.reach(&current.engine, &current.container, &current.node))
                .await;
        }
        let now = tasks
            .first()
            .map(|t| {
                format!(
                    "the swarm now runs task {} ({})",
                    t.id.as_deref().unwrap_or("?"),
                    manager::task_state(t)
                )
            })
            .unwrap_or_else(|| "the swarm runs no task of it now".into());
        Err(BackendError::Stale {
            backend: BACKEND,
            instance: format!(
                "task {} on node {}",
                current.task,
                if current.hostname.is_empty() {
                    current.node.clone()
                } else {
                    format!("{} ({})", current.hostname, current.node)
                }
            ),
            message: format!(
                "{now}; it is not used or persisted. Run the command again: Berth resumes the sandbox where the swarm placed it \
                 and restores its last stop"
            ),
        })
    }
}

/// Now, as RFC 3339 in UTC (seconds).
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[async_trait::async_trait]
impl Backend for SwarmBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        self.container = tokio::sync::OnceCell::new();
        if let Ok(managers) = self
            .with_manager(|m| async move { m.managers().await })
            .await
        {
            self.state.managers = managers;
        }
        let (service_id, created) = self.ensure_service().await?;
        self.state.service_id = Some(service_id.clone());
        match self.place(&service_id).await {
            Ok(_) if created => Ok(Provisioned::Created),
            Ok(provisioned) => Ok(provisioned),
            Err(e) => {
                if created {
                    // Nothing left behind: the service this start made goes.
                    if let Ok(m) = self.manager().await {
                        if let Err(removal) = m.remove_service(&self.state.service_name).await {
                            tracing::warn!(service = %self.state.service_name, error = %removal,
                                "removing the service that could not be placed failed; `berth rm` retries");
                        } else {
                            self.state.service_id = None;
                        }
                    }
                }
                Err(e)
            }
        }
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        if self.state.current.is_none() {
            return Ok(None);
        }
        match self.fence().await {
            Ok(_) => Ok(self.state.current.as_ref().map(|t| t.task.clone())),
            // The lineage compares this with the task the workspace was set
            // up in, and refuses.
            Err(BackendError::Stale { message, .. }) => {
                Ok(Some(format!("another task ({message})")))
            }
            Err(e) => Err(e),
        }
    }

    async fn instance_exists(&self) -> Result<bool, BackendError> {
        match self.fence().await {
            Ok(_) => Ok(true),
            Err(BackendError::Stale { .. }) => Ok(false),
            Err(_) if self.state.current.is_none() => {
                let name = self.state.service_name.clone();
                Ok(self
                    .with_manager(|m| {
                        let name = name.clone();
                        async move { m.service_id(&name).await }
                    })
                    .await?
                    .is_some())
            }
            Err(e) => Err(e),
        }
    }

    async fn freeze(&self) -> Result<bool, BackendError> {
        self.fence().await?.freeze().await
    }

    fn thaw_detached(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        self.container.get()?.thaw_detached()
    }

    async fn thaw(&self) -> Result<(), BackendError> {
        match self.container.get() {
            Some(c) => c.thaw().await,
            None => Ok(()),
        }
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        self.fence().await?.root_exists().await
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        self.fence().await?;
        match self.container.get_mut() {
            Some(c) => c.prepare_root().await,
            None => Ok(()),
        }
    }

    async fn spawn(&self, request: ExecRequest) -> Result<ExecProcess, BackendError> {
        self.fence().await?.spawn(request).await
    }

    async fn published_ports(&self) -> Result<Vec<PublishedPort>, BackendError> {
        Ok(Vec::new())
    }

    async fn helper(&self) -> Result<SandboxHelper, BackendError> {
        Backend::helper(self.fence().await?).await
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        self.fence().await?.read_archive(exclude).await
    }

    async fn write_archive(&self, stream: ArchiveStream) -> Result<(), BackendError> {
        self.fence().await?.write_archive(stream).await
    }

    async fn walk_workspace(
        &self,
        exclude: &[PathBuf],
        known: berth::workspace::tree::KnownFiles,
        freeze: bool,
    ) -> Result<Option<berth::backend::TreeWalk>, BackendError> {
        self.fence()
            .await?
            .walk_workspace(exclude, known, freeze)
            .await
    }

    fn staging_dir(&self) -> Option<String> {
        self.container.get()?.staging_dir()
    }

    async fn finish_staging(&self, dir: &str, commit: bool) -> Result<(), BackendError> {
        match self.container.get() {
            Some(c) => c.finish_staging(dir, commit).await,
            None => Ok(()),
        }
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        let name = self.state.service_name.clone();
        self.with_manager(|m| {
            let name = name.clone();
            async move { m.remove_service(&name).await }
        })
        .await?;
        tracing::info!(service = %name, "service removed");
        self.state.service_id = None;
        self.state.current = None;
        self.container = tokio::sync::OnceCell::new();
        Ok(())
    }

    fn bind_mounts(&self) -> BindMounts {
        BindMounts::Skip
    }

    fn state(&self) -> Result<BackendState, BackendError> {
        BackendState::encode(KIND, &self.state)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_rfc3339() {
        let now = super::now_rfc3339();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
    }
}
