//! The Docker backend, entirely over the Docker API (`bollard`); no `docker`
//! CLI anywhere.
//!
//! Resume is transparent: [`Backend::ensure_running`] inspects the container
//! by id, then by name — running: reconnect; created/exited: start; paused:
//! unpause; **not found**: create it again (the lifecycle then restores the
//! workspace from the snapshot). Any other error (daemon down, timeout,
//! permission) is returned and never triggers a re-create.
//!
//! Engines: a sandbox records which engine it runs on (an endpoint or a
//! Docker context, resolved as the docker CLI resolves them; TCP with
//! mutual TLS), and pulls its image when the engine lacks it (see
//! [`PullPolicy`]).
//!
//! Secure defaults: network `none`, all capabilities dropped,
//! `no-new-privileges`, a pids limit, an init that reaps zombies.

mod agent;
mod config;
mod container_spec;
mod egress;
mod engine;
mod exec;
mod moving;
mod options;
mod provider;
mod pull;
mod reown;
pub mod run_args;
pub mod runtime;
mod settings;
mod staging;
pub mod swarm;
mod tunnel;
mod walk;

pub use options::{DockerMount, DockerOptions, DockerState, EngineChoice};
pub use provider::DockerProvider;
pub use pull::{PullPolicy, PullProgress, PullProgressFn, PullStatus};
pub use settings::{DockerSettings, SETTINGS};

use engine::api;
pub(crate) use engine::service_error;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, RemoveContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;

use berth::backend::{
    ArchiveStream, Backend, BackendError, ExecProcess, ExecRequest, Provisioned, PublishedPort,
    SandboxHelper,
};
use berth::byte_pipe;
use berth::workspace::archive;
use berth::workspace::entries::BindMounts;

pub(crate) const BACKEND: &str = "docker backend";

/// The Docker backend's kind in the sandbox state (`"type": "docker"`).
pub const KIND: &str = "docker";

/// Default pids limit when run arguments do not set one.
pub const DEFAULT_PIDS_LIMIT: i64 = 1024;

/// The Docker backend.
pub struct DockerBackend {
    state: DockerState,
    session_id: String,
    docker: Docker,
    engine: engine::Engine,
    pull_progress: Option<PullProgress>,
    agent: tokio::sync::Mutex<AgentSlot>,
    /// The egress tunnel, for a sandbox whose egress point is reached so.
    tunnel: tokio::sync::Mutex<Option<tunnel::EgressTunnel>>,
    /// The container was just created with the workspace root as its
    /// working directory, which the engine made at start.
    root_made_at_create: std::sync::atomic::AtomicBool,
    /// The staging directory of the archive being written, if any.
    staging: std::sync::Mutex<Option<String>>,
}

/// The agent, as far as this backend knows.
enum AgentSlot {
    /// Not started (or its container was re-created or restarted).
    Untried,
    /// Running.
    Running(std::sync::Arc<agent::AgentSession>),
    /// It cannot run here; commands use one exec each.
    Unavailable(String),
}

/// Connects to the engine `state` names and negotiates the API version;
/// fails fast, naming the engine and what to fix, when it does not answer
/// (a wrong CA, a missing certificate, nothing listening).
pub(crate) async fn connect(state: &DockerState) -> Result<Docker, BackendError> {
    let engine = engine::resolve(state.engine.as_deref(), state.engine_cert_path.as_deref())?;
    engine::connect(&engine).await
}

/// Whether the engine `state` names answers; `Err` names the engine and
/// what to fix.
pub async fn check_engine(state: &DockerState) -> Result<(), BackendError> {
    connect(state).await.map(drop)
}

/// Whether the engine `state` names holds its image already (so a start
/// needs no pull).
pub async fn image_present(state: &DockerState) -> Result<bool, BackendError> {
    match connect(state).await?.inspect_image(&state.image).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => {
            Err(pull::refused_image(&state.image, &e)
                .unwrap_or_else(|| api("inspecting the image", e)))
        }
    }
}

/// How an engine reference (an endpoint or a context name) reads in
/// messages, resolved as the docker CLI would.
pub fn describe_engine(reference: Option<&str>) -> String {
    match engine::resolve(reference, None) {
        Ok(e) => e.to_string(),
        Err(_) => format!("engine {}", reference.unwrap_or(engine::DEFAULT_ENDPOINT)),
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn op(
    operation: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    BackendError::Operation {
        backend: BACKEND,
        operation,
        source: e.into(),
    }
}

/// The keep-alive process: sleeps until stopped, under the API's init.
const KEEP_ALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

impl DockerBackend {
    /// Connects for a sandbox with `state`; `pull_progress` is told how
    /// image pulls go.
    pub async fn connect(
        state: DockerState,
        session_id: &str,
        pull_progress: Option<PullProgress>,
    ) -> Result<Self, BackendError> {
        // Refuse unsupported run arguments at create, before any daemon work.
        run_args::parse(&state.additional_run_args)?;
        let engine = engine::resolve(state.engine.as_deref(), state.engine_cert_path.as_deref())?;
        let docker = engine::connect(&engine).await?;
        Ok(DockerBackend {
            state,
            session_id: session_id.to_string(),
            docker,
            engine,
            pull_progress,
            agent: tokio::sync::Mutex::new(AgentSlot::Untried),
            tunnel: tokio::sync::Mutex::new(None),
            root_made_at_create: std::sync::atomic::AtomicBool::new(false),
            staging: std::sync::Mutex::new(None),
        })
    }

    /// The running agent session, started on first use; `Err` says why
    /// commands use plain execs instead (logged the first time).
    async fn agent_session(&self) -> Result<std::sync::Arc<agent::AgentSession>, String> {
        let mut slot = self.agent.lock().await;
        match &*slot {
            AgentSlot::Running(s) if s.is_alive() => return Ok(s.clone()),
            AgentSlot::Unavailable(why) => return Err(why.clone()),
            _ => {}
        }
        if !self.state.agent {
            return Err("the sandbox was created without the agent".into());
        }
        match agent::AgentSession::start(&self.docker, &self.target()).await {
            Ok(session) => {
                let session = std::sync::Arc::new(session);
                *slot = AgentSlot::Running(session.clone());
                Ok(session)
            }
            Err(why) if why.0.starts_with(agent::CONTAINER_GONE) => {
                // Tried again once the container is back (the lifecycle
                // re-creates or restarts it, which resets the agent).
                tracing::debug!(reason = %why, "no agent: the container is gone");
                Err(why.to_string())
            }
            Err(why) => {
                if why.0.starts_with(agent::NO_BINARY) {
                    tracing::info!(reason = %why, "no in-container agent; commands run as one docker exec each");
                } else {
                    tracing::warn!(container = %self.target(), reason = %why,
                        "the in-container agent cannot run; commands fall back to one docker exec each");
                }
                *slot = AgentSlot::Unavailable(why.to_string());
                Err(why.to_string())
            }
        }
    }

    /// Forgets the agent (its container was re-created or restarted).
    async fn reset_agent(&self) {
        *self.agent.lock().await = AgentSlot::Untried;
        *self.tunnel.lock().await = None;
    }

    /// Makes sure the image is on the engine, pulling it as the sandbox's
    /// [`PullPolicy`] says.
    /// Returns the image's user (its `USER`), once the image is there.
    async fn ensure_image(&self) -> Result<Option<String>, BackendError> {
        let (present, user) = match self.docker.inspect_image(&self.state.image).await {
            Ok(info) => (true, info.config.and_then(|c| c.user)),
            Err(e) if is_not_found(&e) => (false, None),
            Err(e) => {
                return Err(pull::refused_image(&self.state.image, &e)
                    .unwrap_or_else(|| api("inspecting the image", e)))
            }
        };
        match (self.state.pull, present) {
            (PullPolicy::Never, false) => Err(BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "image {} is not on the {} and the pull policy is `never`; pull or import it there, or allow pulls (--pull missing)",
                    self.state.image, self.engine
                ),
            }),
            (PullPolicy::Always, _) | (PullPolicy::Missing, false) => {
                let status = pull::pull(
                    &self.docker,
                    &self.engine,
                    &self.state.image,
                    self.pull_progress.as_ref(),
                )
                .await?;
                tracing::info!(image = %self.state.image, layers = status.layers,
                    bytes = status.bytes_done, "image pulled");
                match self.docker.inspect_image(&self.state.image).await {
                    Ok(info) => Ok(info.config.and_then(|c| c.user)),
                    Err(e) => Err(api("inspecting the pulled image", e)),
                }
            }
            _ => Ok(user),
        }
    }

    /// The engine this backend talks to, as messages name it.
    pub fn engine(&self) -> String {
        self.engine.to_string()
    }

    /// The sandbox's container as the engine describes it (by id, else by
    /// name), or `None` when neither finds one.
    async fn find_container(
        &self,
    ) -> Result<Option<bollard::models::ContainerInspectResponse>, BackendError> {
        for reference in [
            self.state.container_id.clone(),
            Some(self.state.container_name.clone()),
        ]
        .into_iter()
        .flatten()
        {
            match self
                .docker
                .inspect_container(
                    &reference,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
            {
                Ok(info) => return Ok(Some(info)),
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(api("inspecting the container", e)),
            }
        }
        Ok(None)
    }

    /// Whether the sandbox's container exists on the engine (and, if Berth
    /// owns it, carries this sandbox's session label), without creating or
    /// starting anything.
    pub async fn container_present(&self) -> Result<bool, BackendError> {
        let Some(info) = self.find_container().await? else {
            return Ok(false);
        };
        let session = info
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get("berth.session"));
        Ok(session == Some(&self.session_id) || !self.state.container_owned)
    }

    /// The container reference: id when known, else name.
    fn target(&self) -> String {
        self.state
            .container_id
            .clone()
            .unwrap_or_else(|| self.state.container_name.clone())
    }

    /// The current container id.
    pub fn container_id(&self) -> Option<&str> {
        self.state.container_id.as_deref()
    }
}

#[async_trait::async_trait]
impl Backend for DockerBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        self.check_egress_engine()?;
        let disk = self.ensure_disk().await?;
        let mut found = self.find_container().await?;
        if let (Some(info), true) = (&found, self.state.container_owned) {
            // A container found by name may be another sandbox's: never
            // adopt it (two sandboxes in one container would each persist
            // the other's work), and never remove it.
            let session = info
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .and_then(|l| l.get("berth.session"));
            if session != Some(&self.session_id) {
                return Err(BackendError::Config {
                    backend: BACKEND,
                    message: format!(
                        "a container named {} exists but belongs to {}; pick another name, or remove it if it is stale",
                        self.state.container_name,
                        session.map_or("no Berth sandbox".to_string(), |s| format!("Berth session {s}"))
                    ),
                });
            }
        }
        if disk == Some(berth::backend::disk_image::Mounted::New)
            && found.is_some()
            && self.state.container_owned
        {
            // The workspace's image was lost: the container binds one that
            // is gone. It is made again over the new image, and the start
            // restores the workspace into it.
            tracing::warn!(name = %self.state.container_name, "the workspace's disk image was lost; making the container again");
            let options = RemoveContainerOptionsBuilder::new().force(true).build();
            self.docker
                .remove_container(&self.state.container_name, Some(options))
                .await
                .map_err(|e| api("removing the container of a lost workspace", e))?;
            found = None;
        }
        let Some(info) = found else {
            tracing::info!(name = %self.state.container_name, "container gone; creating it again");
            self.state.container_id = None;
            self.reset_agent().await;
            self.create().await?;
            if let Some(wanted) = self.state.runtime.clone() {
                runtime::verify_inside(self, &wanted).await?;
            }
            return Ok(Provisioned::Created);
        };
        if let Some(wanted) = &self.state.runtime {
            let actual = info.host_config.as_ref().and_then(|h| h.runtime.as_deref());
            runtime::check_container(&self.state.container_name, wanted, actual)?;
        }
        self.state.container_id = info.id.clone();
        let status = info.state.and_then(|s| s.status);
        if !matches!(
            status,
            Some(ContainerStateStatusEnum::RUNNING) | Some(ContainerStateStatusEnum::PAUSED)
        ) {
            self.reset_agent().await;
        }
        let target = self.target();
        let resumed = match status {
            Some(ContainerStateStatusEnum::RUNNING) => Ok(()),
            Some(ContainerStateStatusEnum::PAUSED) => self
                .docker
                .unpause_container(&target)
                .await
                .map_err(|e| api("unpausing the container", e)),
            Some(ContainerStateStatusEnum::CREATED) | Some(ContainerStateStatusEnum::EXITED) => {
                self.docker
                    .start_container(
                        &target,
                        None::<bollard::query_parameters::StartContainerOptions>,
                    )
                    .await
                    .map_err(|e| api("starting the container", e))
            }
            other => Err(op(
                "resuming the container",
                format!("container {target} is {other:?}; wait for it to settle or remove it"),
            )),
        };
        resumed?;
        let restarted = !matches!(
            status,
            Some(ContainerStateStatusEnum::RUNNING) | Some(ContainerStateStatusEnum::PAUSED)
        );
        if let (true, Some(wanted)) = (restarted, self.state.runtime.clone()) {
            runtime::verify_inside(self, &wanted).await?;
        }
        Ok(Provisioned::Existing)
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        Ok(self.state.container_id.clone())
    }

    async fn instance_exists(&self) -> Result<bool, BackendError> {
        self.container_present().await
    }

    async fn freeze(&self) -> Result<bool, BackendError> {
        self.docker
            .pause_container(&self.target())
            .await
            .map_err(|e| api("pausing the container for a consistent snapshot", e))?;
        Ok(true)
    }

    fn thaw_detached(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        let docker = self.docker.clone();
        let target = self.target();
        Some(Box::pin(async move {
            if let Err(e) = docker.unpause_container(&target).await {
                tracing::warn!(container = %target, error = %e, "resuming the container after a cancelled stop failed; the next command resumes it");
            }
        }))
    }

    async fn thaw(&self) -> Result<(), BackendError> {
        self.docker
            .unpause_container(&self.target())
            .await
            .map_err(|e| api("unpausing the container after the snapshot", e))
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        let r = self
            .helper(
                vec![
                    "test".into(),
                    "-d".into(),
                    self.state.workspace_root.clone(),
                ],
                Duration::from_secs(30),
            )
            .await?;
        Ok(r.exit_code == 0)
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        if self
            .root_made_at_create
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        // Through the archive API, no exec: a tar holding the root alone,
        // owned by the container's user (`copyUIDGID`, as the daemon reads
        // it from the container's own user database; a numeric user, which
        // that database may not list, in the header), parents as needed.
        let relative = self.state.workspace_root.trim_matches('/');
        if relative.is_empty() {
            return Ok(());
        }
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        let numeric = options::numeric_owner(self.state.user.as_deref());
        if let Some((uid, gid)) = numeric {
            header.set_uid(uid.into());
            header.set_gid(gid.into());
        }
        header.set_mtime(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        let bytes = tar
            .append_data(&mut header, format!("{relative}/"), std::io::empty())
            .and_then(|()| tar.into_inner())
            .map_err(|e| op("creating the workspace root", e))?;
        let options = UploadToContainerOptionsBuilder::new()
            .path("/")
            .copy_uidgid(if numeric.is_some() { "0" } else { "1" })
            .no_overwrite_dir_non_dir("1")
            .build();
        self.docker
            .upload_to_container(
                &self.target(),
                Some(options),
                bollard::body_full(bytes::Bytes::from(bytes)),
            )
            .await
            .map_err(|e| api("creating the workspace root", e))
    }

    async fn spawn(&self, mut request: ExecRequest) -> Result<ExecProcess, BackendError> {
        let unavailable = match self.agent_session().await {
            Ok(session) => {
                self.route_egress(&mut request).await?;
                let memory = self.state.memory_size_bytes.map(|b| b as u64);
                return match session
                    .spawn(&request, &self.state.workspace_root, memory)
                    .await
                {
                    Ok(process) => Ok(process),
                    Err(why) => {
                        // The next command starts a new session.
                        self.reset_agent().await;
                        Err(op(
                            "running the command through the in-container agent",
                            why,
                        ))
                    }
                };
            }
            Err(why) => why,
        };
        self.egress_needs_the_agent(&request, &unavailable)?;
        if let Some(name) = &request.session {
            return Err(BackendError::Unsupported {
                backend: BACKEND,
                what: "keep shell sessions",
                why: format!(
                    "shell session {name:?} needs the in-container agent, which is not running here ({unavailable})"
                ),
            });
        }
        self.spawn_plain(&request).await
    }

    async fn published_ports(&self) -> Result<Vec<PublishedPort>, BackendError> {
        let Some(info) = self.find_container().await? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let ports = info
            .network_settings
            .and_then(|n| n.ports)
            .unwrap_or_default();
        for (port, bindings) in ports {
            for b in bindings.unwrap_or_default() {
                let host = b.host_ip.unwrap_or_else(|| "0.0.0.0".into());
                if let Some(p) = b.host_port.filter(|p| !p.is_empty()) {
                    out.push(PublishedPort {
                        port: port.clone(),
                        address: format!("{host}:{p}"),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.port.cmp(&b.port));
        Ok(out)
    }

    /// The agent copied into the container (`/.berth/agent`); background
    /// processes keep their state in `/.berth/run`, outside the workspace
    /// and its snapshots, for as long as the container lives.
    async fn helper(&self) -> Result<SandboxHelper, BackendError> {
        match self.agent_session().await {
            Ok(_) => Ok(SandboxHelper {
                program: berth_agent::AGENT_PATH.to_string(),
                workspace_root: self.state.workspace_root.clone(),
                run_dir: "/.berth/run".to_string(),
            }),
            Err(why) => Err(BackendError::Unsupported {
                backend: BACKEND,
                what: "run Berth's helper (files and background processes)",
                why: format!("they need the in-container agent, which is not running here ({why})"),
            }),
        }
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        let options = DownloadFromContainerOptionsBuilder::new()
            .path(&self.state.workspace_root)
            .build();
        let stream = self
            .docker
            .download_from_container(&self.target(), Some(options));
        let reader =
            tokio_util::io::StreamReader::new(stream.map(|r| r.map_err(std::io::Error::other)));
        let (writer, out) = byte_pipe::pipe();
        let exclude = exclude.to_vec();
        let source = byte_pipe::batched_reader(Box::pin(reader));
        tokio::task::spawn_blocking(move || {
            let mut writer = writer;
            match archive::reroot(source, &mut writer, &exclude) {
                Ok(_) => {
                    let _ = writer.finish();
                }
                Err(e) => writer.fail(std::io::Error::other(format!(
                    "reading the workspace from the container: {e}"
                ))),
            }
        });
        Ok(Box::new(out))
    }

    async fn walk_workspace(
        &self,
        exclude: &[PathBuf],
        known: berth::workspace::tree::KnownFiles,
        freeze: bool,
    ) -> Result<Option<berth::backend::TreeWalk>, BackendError> {
        // Without the agent, the archive API (every byte) it is.
        if self.agent_session().await.is_err() {
            return Ok(None);
        }
        let request = walk::request(berth_agent::AGENT_PATH, &self.state.workspace_root, freeze);
        let process = self.spawn(request).await?;
        walk::start(process, exclude, &known).await.map(Some)
    }

    async fn write_archive(&self, stream: ArchiveStream) -> Result<(), BackendError> {
        // Owned by the container's user, whatever the archive says (as its
        // own commands would have made them): looked up by the engine in
        // the image's user database, or, for a numeric user it may not
        // list, written into every entry on the way (see `reown`).
        let numeric = options::numeric_owner(self.state.user.as_deref());
        let options = UploadToContainerOptionsBuilder::new()
            .path(&self.state.workspace_root)
            .copy_uidgid(if numeric.is_none() { "1" } else { "0" })
            .build();
        let chunks = tokio_util::io::ReaderStream::with_capacity(stream, 256 * 1024);
        let chunks = match numeric {
            Some((uid, gid)) => reown::reown(chunks, uid, gid).boxed(),
            None => chunks.boxed(),
        };
        let body = bollard::body_try_stream(chunks);
        let upload = async {
            self.docker
                .upload_to_container(&self.target(), Some(options), body)
                .await
                .map_err(|e| api("uploading into the container", e))
        };
        let staging = self.staging.lock().map(|s| s.is_some()).unwrap_or(false);
        let started = Instant::now();
        // (Starting the agent alongside a restore's upload was measured:
        // on two cores it slowed the upload by more than the exec that
        // moves the staged workspace into place costs. It starts with the
        // first command instead.)
        let uploaded = upload.await;
        tracing::debug!(
            upload_ms = started.elapsed().as_secs_f64() * 1e3,
            staging,
            "archive upload timings"
        );
        uploaded
    }

    fn staging_dir(&self) -> Option<String> {
        let dir = format!(".berth-staging-{:016x}", berth::random_id::random_u64());
        if let Ok(mut s) = self.staging.lock() {
            *s = Some(dir.clone());
        }
        Some(dir)
    }

    async fn finish_staging(&self, dir: &str, commit: bool) -> Result<(), BackendError> {
        self.settle_staging(dir, commit).await
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        if !self.state.container_owned {
            tracing::info!(container = %self.target(), "container not owned by Berth; leaving it");
            return Ok(());
        }
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self
            .docker
            .remove_container(&self.target(), Some(options))
            .await
        {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(api("removing the container", e)),
        }
        self.state.container_id = None;
        self.reset_agent().await;
        if let Some(disk) = &self.state.disk {
            disk.remove(BACKEND).await?;
            if let Err(e) = tokio::fs::remove_dir(&disk.mount_point).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %disk.mount_point.display(), error = %e, "cannot remove the workspace disk's mount point");
                }
            }
        }
        Ok(())
    }

    fn bind_mounts(&self) -> BindMounts {
        BindMounts::Skip
    }

    fn state(&self) -> Result<berth::backend::BackendState, BackendError> {
        berth::backend::BackendState::encode(KIND, &self.state)
    }
}

/// The Docker and swarm backend providers, to register with a client so
/// that it resumes, lists and moves their sandboxes and takes their
/// settings from front ends:
///
/// ```no_run
/// let client = berth::SandboxClient::builder("/var/lib/my-agent/berth")
///     .backend_providers(berth_docker::providers())
///     .build();
/// # let _ = client;
/// ```
///
/// A sandbox is created on Docker with [`DockerOptions`] (or
/// [`swarm::SwarmOptions`]) whether or not they are registered; resuming
/// one needs them.
pub fn providers() -> Vec<std::sync::Arc<dyn berth::backend::BackendProvider>> {
    vec![
        std::sync::Arc::new(DockerProvider::default()),
        std::sync::Arc::new(swarm::SwarmProvider::default()),
    ]
}
