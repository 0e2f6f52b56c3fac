//! The swarm backend's typed state and options, and its provider.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SwarmBackend, KIND};
use berth::backend::limits::{Bound, Chosen};
use berth::backend::{Backend, BackendError, BackendOptions, CreateContext};

/// How long a start waits for the swarm to run the sandbox's task, by
/// default: longer than a node loss takes to be noticed and rescheduled
/// at the default 5 s heartbeat (about 15 s).
pub const DEFAULT_PLACEMENT_TIMEOUT: Duration = Duration::from_secs(60);

fn default_root() -> String {
    berth::workspace::spec::DEFAULT_ROOT.to_string()
}
fn yes() -> bool {
    true
}
fn default_timeout() -> u64 {
    DEFAULT_PLACEMENT_TIMEOUT.as_secs()
}

/// Where one of the sandbox's tasks ran: the swarm's task, its node, the
/// node's engine and the container, and when Berth first found it running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The swarm's task id.
    pub task: String,
    /// The node's id.
    pub node: String,
    /// The node's hostname, as the swarm reports it.
    #[serde(default)]
    pub hostname: String,
    /// The node's own engine (its `berth.engine` label).
    pub engine: String,
    /// The task's container on that engine.
    pub container: String,
    /// When Berth first found the task running (RFC 3339, UTC).
    pub since: String,
}

/// The swarm backend's state: the service, its settings, the managers it
/// can be reached through, and the tasks it has run in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwarmState {
    /// The service's name (`berth-<session>`).
    pub service_name: String,
    /// The service's id, once created.
    #[serde(default)]
    pub service_id: Option<String>,
    /// The engines of the swarm's managers, tried in order (the one the
    /// sandbox was created on first); refreshed from the swarm's node
    /// labels whenever one answers.
    pub managers: Vec<String>,
    /// The directory of `ca.pem`, `cert.pem` and `key.pem` for `tcp://`
    /// engines (managers and nodes alike).
    #[serde(default)]
    pub engine_cert_path: Option<PathBuf>,
    /// The image (every node must hold it or reach its registry).
    pub image: String,
    /// Workspace root inside the container.
    #[serde(default = "default_root")]
    pub workspace_root: String,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_size_bytes: Option<i64>,
    /// CPU limit (fractional CPUs).
    #[serde(default)]
    pub cpu_count: Option<f64>,
    /// Pids limit.
    #[serde(default)]
    pub pids_limit: Option<i64>,
    /// Memory the swarm reserves for the sandbox on its node, in bytes.
    #[serde(default)]
    pub reserve_memory_bytes: Option<i64>,
    /// CPUs the swarm reserves for the sandbox on its node.
    #[serde(default)]
    pub reserve_cpus: Option<f64>,
    /// Placement constraints (`node.labels.pool==gpu`).
    #[serde(default)]
    pub constraints: Vec<String>,
    /// A swarm network to attach to; `None`: no network (loopback only,
    /// verified inside the container).
    #[serde(default)]
    pub network: Option<String>,
    /// The host directory of the sandbox's egress point (its socket and
    /// trust files), on this host, reached from whichever node runs the
    /// sandbox through a tunnel in the agent's exec session (see
    /// [`berth::egress`]); `None`: no egress policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_point: Option<PathBuf>,
    /// Container environment.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Run commands through the in-container agent.
    #[serde(default = "yes")]
    pub agent: bool,
    /// Seconds a start waits for the task to run.
    #[serde(default = "default_timeout")]
    pub placement_timeout_secs: u64,
    /// The task the workspace was last set up in; `None` before the first
    /// start.
    #[serde(default)]
    pub current: Option<TaskRecord>,
    /// Every task the sandbox has run in, oldest first (the newest few).
    #[serde(default)]
    pub history: Vec<TaskRecord>,
}

/// How many task records the state keeps.
pub(super) const HISTORY_KEPT: usize = 16;

/// What a start is waiting for, as [`PlacementProgress`] is told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlacementStatus {
    /// The service.
    pub service: String,
    /// The task's state as the swarm says it (`pending`, `preparing`,
    /// `running`), or what Berth waits for (`node unreachable`).
    pub state: String,
    /// The swarm's or Berth's explanation, if any.
    pub message: Option<String>,
    /// Whether the wait is over (the task runs, or Berth gave up).
    pub finished: bool,
}

/// Told how a placement goes, e.g. to draw a spinner.
#[derive(Clone)]
pub struct PlacementProgress(pub Arc<dyn Fn(&PlacementStatus) + Send + Sync>);

impl std::fmt::Debug for PlacementProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlacementProgress(..)")
    }
}

/// Builder for a new swarm sandbox.
#[derive(Debug, Clone)]
pub struct SwarmOptions {
    state: SwarmState,
    bounds: Chosen,
    pub(super) progress: Option<PlacementProgress>,
}

impl SwarmOptions {
    /// A sandbox from `image`, placed by the swarm whose manager is
    /// `manager` (an endpoint or a Docker context's name).
    pub fn new(manager: impl Into<String>, image: impl Into<String>) -> Self {
        SwarmOptions {
            state: SwarmState {
                service_name: String::new(),
                service_id: None,
                managers: vec![manager.into()],
                engine_cert_path: None,
                image: image.into(),
                workspace_root: default_root(),
                memory_size_bytes: None,
                cpu_count: None,
                pids_limit: None,
                reserve_memory_bytes: None,
                reserve_cpus: None,
                constraints: Vec::new(),
                network: None,
                egress_point: None,
                environment: BTreeMap::new(),
                agent: true,
                placement_timeout_secs: default_timeout(),
                current: None,
                history: Vec::new(),
            },
            bounds: Chosen::default(),
            progress: None,
        }
    }
    /// Options for a new sandbox set up like `state`'s (a fork): same
    /// swarm, image, limits and placement; its own service.
    pub fn like(state: &SwarmState) -> Self {
        let bound = |limit: Option<u64>| Some(limit.map_or(Bound::Unlimited, Bound::At));
        let bounds = Chosen {
            memory: bound(state.memory_size_bytes.map(|b| b.max(0) as u64)),
            cpus: bound(state.cpu_count.map(|c| (c * 1000.0).round() as u64)),
            pids: state.pids_limit.map(|n| {
                if n > 0 {
                    Bound::At(n as u64)
                } else {
                    Bound::Unlimited
                }
            }),
            disk: None,
        };
        SwarmOptions {
            state: SwarmState {
                service_name: String::new(),
                service_id: None,
                current: None,
                history: Vec::new(),
                // The fork's own point is given at its create.
                egress_point: None,
                ..state.clone()
            },
            bounds,
            progress: None,
        }
    }
    /// The directory of `ca.pem`, `cert.pem` and `key.pem` for `tcp://`
    /// engines. By default, `$DOCKER_CERT_PATH` (else `~/.docker`) when
    /// `$DOCKER_TLS_VERIFY` is set; a context brings its own.
    pub fn tls_cert_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state.engine_cert_path = Some(dir.into());
        self
    }
    /// Memory limit in bytes (swap included). By default, the host's
    /// ([`HostDefaults`](berth::backend::limits::HostDefaults): 2 GiB
    /// unless its `config.toml` says otherwise).
    pub fn memory(mut self, bytes: i64) -> Self {
        self.bounds.memory = Some(Bound::At(bytes.max(0) as u64));
        self
    }
    /// No memory limit: one command can take all of its node's memory.
    /// Logged as a warning when the sandbox is created.
    pub fn unlimited_memory(mut self) -> Self {
        self.bounds.memory = Some(Bound::Unlimited);
        self
    }
    /// CPU limit, in (fractional) CPUs. By default, the host's (all of
    /// its CPUs but one unless its `config.toml` says otherwise).
    pub fn cpus(mut self, cpus: f64) -> Self {
        self.bounds.cpus = Some(Bound::At((cpus * 1000.0).round().max(1.0) as u64));
        self
    }
    /// Pids limit. By default, the host's (1024 unless its
    /// `config.toml` says otherwise); 0 or less: unlimited.
    pub fn pids_limit(mut self, limit: i64) -> Self {
        self.bounds.pids = Some(if limit > 0 {
            Bound::At(limit as u64)
        } else {
            Bound::Unlimited
        });
        self
    }
    /// Memory the swarm reserves on the node (a node without it free is
    /// not chosen). By default, none.
    pub fn reserve_memory(mut self, bytes: i64) -> Self {
        self.state.reserve_memory_bytes = Some(bytes);
        self
    }
    /// CPUs the swarm reserves on the node. By default, none.
    pub fn reserve_cpus(mut self, cpus: f64) -> Self {
        self.state.reserve_cpus = Some(cpus);
        self
    }
    /// A placement constraint, as `docker service create --constraint`
    /// takes it (repeatable). By default, any node.
    pub fn constraint(mut self, constraint: impl Into<String>) -> Self {
        self.state.constraints.push(constraint.into());
        self
    }
    /// A swarm network (an attachable overlay) for the sandbox. By
    /// default, none: loopback only, verified inside the container.
    pub fn network(mut self, network: impl Into<String>) -> Self {
        self.state.network = Some(network.into());
        self
    }
    /// A container environment variable. By default, the image's only.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.state.environment.insert(key.into(), value.into());
        self
    }
    /// Whether commands run through Berth's in-container agent. By
    /// default, yes.
    pub fn agent(mut self, agent: bool) -> Self {
        self.state.agent = agent;
        self
    }
    /// How long a start waits for the swarm to run the task before it
    /// fails with the swarm's reason. By default,
    /// [`DEFAULT_PLACEMENT_TIMEOUT`].
    pub fn placement_timeout(mut self, timeout: Duration) -> Self {
        self.state.placement_timeout_secs = timeout.as_secs().max(1);
        self
    }
    /// Told how placements go. By default, nobody.
    pub fn placement_progress(mut self, progress: PlacementProgress) -> Self {
        self.progress = Some(progress);
        self
    }
}

#[async_trait::async_trait]
impl BackendOptions for SwarmOptions {
    fn kind(&self) -> &str {
        KIND
    }

    fn needs_portable_snapshot(&self) -> bool {
        true
    }

    /// With no network of its own (the default), a swarm sandbox reaches
    /// nothing but its egress point, on this host, through a tunnel the
    /// in-container agent keeps (so the agent is needed); with a network,
    /// the policy would bound nothing.
    fn routes_egress(&self) -> Result<(), String> {
        if let Some(network) = &self.state.network {
            return Err(format!(
                "the sandbox is to have the network {network:?}, which the policy would not bound; \
                 drop `-o network=…` (a sandbox with an egress policy has no network but its \
                 route to the egress point)"
            ));
        }
        if !self.state.agent {
            return Err(
                "a swarm sandbox reaches its egress point through Berth's in-container agent, \
                 which this sandbox is not to run (`-o agent=false`): drop that option"
                    .to_string(),
            );
        }
        Ok(())
    }

    async fn create(
        self: Box<Self>,
        context: &CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        if !context.bind_mounts.is_empty() {
            return Err(BackendError::Config {
                backend: super::BACKEND,
                message: "a swarm sandbox cannot bind-mount host paths: the swarm may place it on any node; \
                          put the files in the workspace (a `file`/`dir` entry) instead"
                    .into(),
            });
        }
        // A swarm sandbox's workspace is in its container's layer on
        // whichever node runs it: no disk quota here, and it says so.
        if context.defaults.disk != Bound::Unlimited {
            tracing::warn!(
                backend = super::KIND,
                "this sandbox's workspace disk is not bounded: a swarm sandbox's workspace lives in its container on whichever node runs it, where the host's disk default cannot apply"
            );
        }
        let bounds = Chosen {
            disk: Some(Bound::Unlimited),
            ..self.bounds
        }
        .resolve(context.defaults, super::KIND);
        let mut state = self.state;
        state.memory_size_bytes = bounds.memory.limit().map(|b| b as i64);
        state.cpu_count = bounds.cpus.limit().map(|m| m as f64 / 1000.0);
        state.pids_limit = Some(bounds.pids.limit().map_or(0, |n| n as i64));
        state.service_name = format!("berth-{}", context.session_id);
        state.workspace_root = context.workspace.root.clone();
        state.egress_point = context.egress.map(|route| route.socket_dir.clone());
        Ok(Box::new(
            SwarmBackend::connect(state, context.session_id, self.progress).await?,
        ))
    }
}
