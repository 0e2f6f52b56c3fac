//! The Docker backend's typed state and options, and its provider: how
//! the lifecycle creates, resumes, lists and forks Docker sandboxes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{engine, DockerBackend, PullPolicy, PullProgress, BACKEND, KIND};
use berth::backend::limits::{Bound, Bounds, Chosen};
use berth::backend::{Backend, BackendError, BackendOptions, CreateContext};
use berth::workspace::spec::BindMount;

fn default_root() -> String {
    berth::workspace::spec::DEFAULT_ROOT.to_string()
}
fn yes() -> bool {
    true
}
fn none_network() -> String {
    "none".to_string()
}

/// Docker backend state (every field of the seed's `DockerSandboxState`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DockerState {
    /// Container id, once created.
    #[serde(default)]
    pub container_id: Option<String>,
    /// Container name (`berth-<session>` by default).
    pub container_name: String,
    /// Image (pulled as [`DockerState::pull`] says).
    pub image: String,
    /// Workspace root inside the container.
    #[serde(default = "default_root")]
    pub workspace_root: String,
    /// Whether shutdown may remove the container.
    #[serde(default = "yes")]
    pub container_owned: bool,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_size_bytes: Option<i64>,
    /// CPU limit (fractional CPUs).
    #[serde(default)]
    pub cpu_count: Option<f64>,
    /// Container ports published on 127.0.0.1 (`8080` or `8080/udp`).
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    /// Network mode (default `none`).
    #[serde(default = "none_network")]
    pub network: String,
    /// Extra `docker run` arguments (see [`run_args::SUPPORTED`]).
    #[serde(default)]
    pub additional_run_args: Vec<String>,
    /// Container environment.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Bind mounts as `host:container[:ro]` strings, as versions before
    /// 0.4 recorded them (Docker parses them; new sandboxes record
    /// [`DockerState::mounts`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<String>,
    /// Bind mounts from the workspace manifest, typed (a host path may
    /// hold any character, `:` included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<DockerMount>,
    /// The engine: an endpoint (`unix:///path`, `tcp://HOST:PORT`) or a
    /// Docker context's name, recorded at create. `None` (state from
    /// older versions): the docker CLI's defaults at each connect.
    #[serde(default, alias = "docker_host")]
    pub engine: Option<String>,
    /// The directory of `ca.pem`, `cert.pem` and `key.pem` for a TCP
    /// endpoint (a path, never the keys themselves).
    #[serde(default)]
    pub engine_cert_path: Option<PathBuf>,
    /// When the image is pulled.
    #[serde(default)]
    pub pull: PullPolicy,
    /// Run commands through the in-container agent (falling back to one
    /// exec per command when it cannot run).
    #[serde(default = "yes")]
    pub agent: bool,
    /// The OCI runtime the engine runs the container under (`runsc` for
    /// gVisor); `None`: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The user commands run as (`UID[:GID]` or a name in the image);
    /// `None`: the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The process limit; `None`: 1024 (states written before 0.10), or
    /// the `--pids-limit` run argument. `-1`: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// The workspace's disk quota: a filesystem image on the engine's
    /// host, mounted there and bind-mounted at the workspace root (see
    /// [`berth::backend::disk_image`]); `None`: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<berth::backend::disk_image::DiskImage>,
    /// The host directory of the sandbox's egress point's socket, bound
    /// read-only into the container, which has no network but its
    /// loopback (see [`berth::egress`]); `None`: the network alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_socket_dir: Option<std::path::PathBuf>,
    /// The host directory of the sandbox's egress point, reached through
    /// a tunnel in an exec session (see `berth-agent egress-tunnel`)
    /// rather than bound in: for a container on an engine that cannot bind
    /// a path of this host (a swarm node's). `None`: no tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_tunnel: Option<std::path::PathBuf>,
}

/// The engine a sandbox moves to (see
/// `EngineChoice::moved_state`): an endpoint or a Docker context's
/// name, and for a `tcp://` endpoint the directory of its TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineChoice {
    reference: String,
    cert_path: Option<PathBuf>,
}

impl EngineChoice {
    /// The engine `reference` names: `unix:///path`, a socket path,
    /// `tcp://HOST:PORT`, or a Docker context's name.
    pub fn new(reference: impl Into<String>) -> Self {
        EngineChoice {
            reference: reference.into(),
            cert_path: None,
        }
    }
    /// The directory of `ca.pem`, `cert.pem` and `key.pem` for a `tcp://`
    /// endpoint. By default, `$DOCKER_CERT_PATH` (else `~/.docker`) when
    /// `$DOCKER_TLS_VERIFY` is set; a context brings its own.
    pub fn tls_cert_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cert_path = Some(dir.into());
        self
    }
    /// The reference, as given.
    pub fn reference(&self) -> &str {
        &self.reference
    }
    /// Whether `state` already runs on this engine.
    pub fn is_engine_of(&self, state: &DockerState) -> bool {
        let current = state
            .engine
            .clone()
            .unwrap_or_else(|| engine::current_reference().0);
        current == self.reference
    }
    /// `state` moved to this engine: a new container (not yet created)
    /// with the same settings, name, workspace and binds.
    pub fn apply_to(&self, state: &DockerState) -> DockerState {
        DockerState {
            container_id: None,
            engine: Some(self.reference.clone()),
            engine_cert_path: self
                .cert_path
                .clone()
                .or_else(|| engine::env_cert_dir(&self.reference)),
            ..state.clone()
        }
    }
}

/// A bind mount of a Docker sandbox: `source` on the engine's host at
/// `target` in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerMount {
    /// The host path.
    pub source: PathBuf,
    /// The path in the container.
    pub target: String,
    /// Whether the mount is read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// Builder for a new Docker sandbox.
#[derive(Debug, Clone)]
pub struct DockerOptions {
    state: DockerState,
    bounds: Chosen,
    pub(super) pull_progress: Option<PullProgress>,
}

impl DockerOptions {
    /// A sandbox from `image` with secure defaults.
    pub fn new(image: impl Into<String>) -> Self {
        DockerOptions {
            state: DockerState {
                container_id: None,
                container_name: String::new(),
                image: image.into(),
                workspace_root: default_root(),
                container_owned: true,
                memory_size_bytes: None,
                cpu_count: None,
                exposed_ports: Vec::new(),
                network: none_network(),
                additional_run_args: Vec::new(),
                environment: BTreeMap::new(),
                binds: Vec::new(),
                mounts: Vec::new(),
                engine: None,
                engine_cert_path: None,
                pull: PullPolicy::Missing,
                agent: true,
                runtime: None,
                user: None,
                pids_limit: None,
                disk: None,
                egress_socket_dir: None,
                egress_tunnel: None,
            },
            bounds: Chosen::default(),
            pull_progress: None,
        }
    }
    /// Memory limit in bytes (swap included). By default, the host's
    /// ([`HostDefaults`](berth::backend::limits::HostDefaults): 2 GiB
    /// unless its `config.toml` says otherwise): past it, the kernel
    /// kills a process of the sandbox.
    pub fn memory(mut self, bytes: i64) -> Self {
        self.bounds.memory = Some(Bound::At(bytes.max(0) as u64));
        self
    }
    /// No memory limit: one command can take all of the engine host's
    /// memory. Logged as a warning when the sandbox is created.
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
    /// The CPU limit as a bound, in thousandths of a CPU.
    pub fn cpus_millis(mut self, bound: Bound) -> Self {
        self.bounds.cpus = Some(bound);
        self
    }
    /// How many processes and threads the container may hold. By
    /// default, the host's (1024 unless its `config.toml` says
    /// otherwise); a `--pids-limit` run argument wins.
    pub fn pids(mut self, bound: Bound) -> Self {
        self.bounds.pids = Some(bound);
        self
    }
    /// The workspace's disk quota: a filesystem image of this size on
    /// the engine's host, bind-mounted at the workspace root, so a
    /// command that fills it gets `ENOSPC`. Needs a local engine (a unix
    /// socket) and root. By default, the host's (10 GiB unless its
    /// `config.toml` says otherwise).
    pub fn disk(mut self, bound: Bound) -> Self {
        self.bounds.disk = Some(bound);
        self
    }
    /// Publishes a container port on 127.0.0.1 (repeatable). By default,
    /// nothing is published.
    pub fn expose(mut self, port: impl Into<String>) -> Self {
        self.state.exposed_ports.push(port.into());
        self
    }
    /// Network mode (e.g. `bridge`). By default, `none`: no network.
    pub fn network(mut self, network: impl Into<String>) -> Self {
        self.state.network = network.into();
        self
    }
    /// Extra `docker run` arguments from the supported subset
    /// ([`run_args::SUPPORTED`]); anything else is refused at create. By
    /// default, none: no capabilities, no new privileges, pids limit 1024.
    pub fn run_args(mut self, args: Vec<String>) -> Self {
        self.state.additional_run_args = args;
        self
    }
    /// An environment variable for the container (repeatable). By
    /// default, only the image's.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.state.environment.insert(k.into(), v.into());
        self
    }
    /// Container name. By default, `berth-<session id>`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.state.container_name = name.into();
        self
    }
    /// Uses an existing container that Berth does not own: shutdown leaves
    /// it alone and stop only persists.
    pub fn existing_container(mut self, name_or_id: impl Into<String>) -> Self {
        self.state.container_name = name_or_id.into();
        self.state.container_owned = false;
        self
    }
    /// The engine: an endpoint (`unix:///path`, a socket path,
    /// `tcp://HOST:PORT`) or a Docker context's name. By default, what the
    /// docker CLI would use: `$DOCKER_HOST`, else `$DOCKER_CONTEXT`, else
    /// the config's current context, else `unix:///var/run/docker.sock`.
    /// The sandbox's state records it, so later commands reach the same
    /// engine whatever their environment says.
    pub fn engine(mut self, engine: impl Into<String>) -> Self {
        self.state.engine = Some(engine.into());
        self
    }
    /// The directory of `ca.pem`, `cert.pem` and `key.pem` for mutual TLS
    /// with a `tcp://` engine. By default, `$DOCKER_CERT_PATH` (else
    /// `~/.docker`) when `$DOCKER_TLS_VERIFY` is set, or the context's
    /// files; the state records the directory, never the keys.
    pub fn tls_cert_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state.engine_cert_path = Some(dir.into());
        self
    }
    /// Whether commands run through Berth's agent inside the container (a
    /// small static binary copied in through the archive API, one
    /// long-lived exec session for all commands, needed for persistent
    /// shell sessions). By default, on; when the agent cannot run (no
    /// binary, a read-only filesystem), commands fall back to one exec
    /// each, and that is logged once.
    pub fn agent(mut self, on: bool) -> Self {
        self.state.agent = on;
        self
    }
    /// The OCI runtime the engine runs the container under, as the
    /// engine registers it: `runsc` for gVisor, a kernel in user space
    /// between the sandbox and the host's. By default, the engine's own
    /// (runc: a plain container). Fails closed: creating the sandbox fails
    /// with [`BackendError::Unconfined`] when the engine does not know the
    /// runtime, and so does every start of a container found under
    /// another one.
    pub fn runtime(mut self, runtime: impl Into<String>) -> Self {
        self.state.runtime = Some(runtime.into());
        self
    }
    /// The user the container and its commands run as: `UID[:GID]` or a
    /// name the image's `/etc/passwd` knows. By default, the image's user
    /// (often root: uid 0 in a kernel shared with the host, though without
    /// capabilities). The workspace root is made owned by this user.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.state.user = Some(user.into());
        self
    }
    /// When to pull the image from its registry. By default,
    /// [`PullPolicy::Missing`]: when the engine lacks it.
    pub fn pull(mut self, policy: PullPolicy) -> Self {
        self.state.pull = policy;
        self
    }

    /// The settings of an existing sandbox's container, for a new one of
    /// its own (as `berth fork` makes): same image, limits, network, ports,
    /// run arguments, environment and daemon; a new, owned container.
    pub fn like(existing: &DockerState) -> Self {
        let bound = |limit: Option<u64>| Some(limit.map_or(Bound::Unlimited, Bound::At));
        let bounds = Chosen {
            memory: bound(existing.memory_size_bytes.map(|b| b.max(0) as u64)),
            cpus: bound(existing.cpu_count.map(|c| (c * 1000.0).round() as u64)),
            pids: existing.pids_limit.map(|n| {
                if n > 0 {
                    Bound::At(n as u64)
                } else {
                    Bound::Unlimited
                }
            }),
            disk: bound(existing.disk.as_ref().map(|d| d.bytes)),
        };
        DockerOptions {
            state: DockerState {
                container_id: None,
                container_name: String::new(),
                container_owned: true,
                binds: Vec::new(),
                mounts: Vec::new(),
                disk: None,
                egress_socket_dir: None,
                egress_tunnel: None,
                ..existing.clone()
            },
            bounds,
            pull_progress: None,
        }
    }

    /// Told how image pulls go when the engine lacks the image. By
    /// default, nobody.
    pub fn pull_progress(mut self, progress: PullProgress) -> Self {
        self.pull_progress = Some(progress);
        self
    }

    /// The state as configured so far, bounded by Berth's built-in
    /// defaults (for probing the daemon).
    pub fn into_state_for_probe(self) -> DockerState {
        let bounds = self
            .bounds
            .resolve(&berth::backend::limits::HostDefaults::builtin(), KIND);
        let mut state = self.state;
        apply_bounds(&mut state, &bounds);
        state
    }

    /// Records the engine the docker CLI's rules pick now, when none was
    /// named, with the certificate directory its environment gives.
    fn with_engine_recorded(mut self) -> Self {
        match &self.state.engine {
            None => {
                let (reference, certs) = engine::current_reference();
                self.state.engine = Some(reference);
                if self.state.engine_cert_path.is_none() {
                    self.state.engine_cert_path = certs;
                }
            }
            Some(reference) if self.state.engine_cert_path.is_none() => {
                self.state.engine_cert_path = engine::env_cert_dir(reference);
            }
            Some(_) => {}
        }
        self
    }

    /// The state for session `session_id` with workspace `root` and the
    /// manifest's bind mounts.
    fn into_state(mut self, session_id: &str, root: &str, binds: &[BindMount]) -> DockerState {
        self = self.with_engine_recorded();
        if self.state.container_name.is_empty() {
            self.state.container_name = format!("berth-{session_id}");
        }
        let root = root.trim_end_matches('/');
        self.state.workspace_root = root.to_string();
        self.state.mounts = binds
            .iter()
            .map(|b| DockerMount {
                source: b.host.clone(),
                target: format!("{root}/{}", b.relative.display()),
                read_only: b.read_only,
            })
            .collect();
        self.state
    }
}

#[async_trait::async_trait]
impl BackendOptions for DockerOptions {
    fn kind(&self) -> &str {
        KIND
    }

    /// With no network of its own (`none`, the default), a container
    /// reaches nothing but its egress point; with one, the policy would
    /// bound nothing.
    fn routes_egress(&self) -> Result<(), String> {
        if self.state.network != "none" {
            return Err(format!(
                "the sandbox is to have the network {:?}, which the policy would not bound; \
                 drop `-o network=…` (a sandbox with an egress policy has no network but its \
                 route to the egress point)",
                self.state.network
            ));
        }
        Ok(())
    }

    async fn create(
        self: Box<Self>,
        context: &CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        if !self.state.exposed_ports.is_empty() && self.state.network == "none" {
            return Err(BackendError::Config {
                backend: "docker backend",
                message: format!(
                    "port {} is to be published, but the sandbox has no network (network `none`, the default), \
                     on which the engine cannot publish a port: give it a network (a bridge network of yours, \
                     or `bridge`) to reach the port from this host, or publish nothing",
                    self.state.exposed_ports.join(", ")
                ),
            });
        }
        let bounds = self.bounds.resolve(context.defaults, KIND);
        let progress = self.pull_progress.clone();
        let mut state = self.into_state(
            context.session_id,
            &context.workspace.root,
            context.bind_mounts,
        );
        apply_bounds(&mut state, &bounds);
        state.egress_socket_dir = context.egress.map(|route| route.socket_dir.clone());
        if let Bound::At(bytes) = bounds.disk {
            berth::backend::disk_image::check_size(BACKEND, bytes)?;
            let disks = context.home.join("disks");
            state.disk = Some(berth::backend::disk_image::DiskImage {
                image: disks.join(format!("{}.ext4", context.session_id)),
                mount_point: disks.join(context.session_id),
                bytes,
                owner: numeric_owner(state.user.as_deref()),
            });
        }
        Ok(Box::new(
            DockerBackend::connect(state, context.session_id, progress).await?,
        ))
    }
}

/// Memory, CPU and processes as the engine takes them.
fn apply_bounds(state: &mut DockerState, bounds: &Bounds) {
    state.memory_size_bytes = bounds.memory.limit().map(|b| b as i64);
    state.cpu_count = bounds.cpus.limit().map(|m| m as f64 / 1000.0);
    state.pids_limit = Some(bounds.pids.limit().map_or(-1, |n| n as i64));
}

/// The owner a numeric `UID[:GID]` user (not root) gives the workspace
/// root, without the image's user database (a named one is looked up in
/// the container).
pub(crate) fn numeric_owner(user: Option<&str>) -> Option<(u32, u32)> {
    let mut parts = user?.split(':');
    let uid: u32 = parts.next()?.parse().ok()?;
    let gid = match parts.next() {
        Some(g) => g.parse().ok()?,
        None => uid,
    };
    (uid != 0).then_some((uid, gid))
}
