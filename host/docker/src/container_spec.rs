//! The container a sandbox runs in, as the Docker API is asked for it:
//! secure defaults (no network, no capabilities, no new privileges, a
//! pids limit, an init), limits, ports, typed bind mounts, run arguments.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountTypeEnum, PortBinding};

use super::{
    engine::api, run_args, runtime, DockerBackend, BACKEND, DEFAULT_PIDS_LIMIT, KEEP_ALIVE,
};
use berth::backend::BackendError;
use bollard::query_parameters::CreateContainerOptionsBuilder;

impl DockerBackend {
    pub(super) fn create_body(&self) -> Result<ContainerCreateBody, BackendError> {
        let extra = run_args::parse(&self.state.additional_run_args)?;
        // Legacy `host:container[:ro]` strings name the host path first.
        let legacy = self
            .state
            .binds
            .iter()
            .map(|b| PathBuf::from(b.split(':').next().unwrap_or("")));
        let typed = self.state.mounts.iter().map(|m| m.source.clone());
        for host in legacy.chain(typed) {
            let canonical = std::fs::canonicalize(&host).unwrap_or_else(|_| host.clone());
            if canonical.ends_with("docker.sock") {
                return Err(BackendError::Config {
                    backend: BACKEND,
                    message: format!("refusing to bind-mount the Docker socket ({}): it would hand the sandbox the host", host.display()),
                });
            }
        }
        let mut labels: HashMap<String, String> = extra.labels.clone().into_iter().collect();
        labels.insert("berth.session".into(), self.session_id.clone());
        labels.insert("berth.owned".into(), self.state.container_owned.to_string());
        let mut env = self.state.environment.clone();
        env.extend(extra.env.clone());
        if self.state.egress_socket_dir.is_some() {
            env.extend(berth::egress::proxy_environment());
        }
        let mut security_opt = extra.security_opt.clone();
        if !security_opt
            .iter()
            .any(|o| o.starts_with("no-new-privileges"))
        {
            security_opt.push("no-new-privileges".into());
        }
        let security_opt: Vec<String> = security_opt
            .into_iter()
            .filter(|o| o != "no-new-privileges=false")
            .collect();
        let mut exposed = HashMap::new();
        let mut bindings = HashMap::new();
        for p in &self.state.exposed_ports {
            let key = if p.contains('/') {
                p.clone()
            } else {
                format!("{p}/tcp")
            };
            exposed.insert(key.clone(), HashMap::new());
            bindings.insert(
                key,
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some(String::new()),
                }]),
            );
        }
        // The workspace's disk image first, the manifest's binds (inside
        // the workspace) over it.
        let disk = self.state.disk.iter().map(|d| Mount {
            target: Some(self.state.workspace_root.clone()),
            source: Some(d.mount_point.display().to_string()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(false),
            ..Default::default()
        });
        let binds = self.state.mounts.iter().map(|m| Mount {
            target: Some(m.target.clone()),
            source: Some(m.source.display().to_string()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(m.read_only),
            ..Default::default()
        });
        // The egress point's socket, where the bridge expects it.
        let egress = self.state.egress_socket_dir.iter().map(|dir| Mount {
            target: Some(berth::egress::SANDBOX_EGRESS_DIR.to_string()),
            source: Some(dir.display().to_string()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(true),
            ..Default::default()
        });
        let mounts: Vec<Mount> = disk.chain(binds).chain(egress).collect();
        let host_config = HostConfig {
            init: Some(true),
            memory: self.state.memory_size_bytes,
            memory_swap: self.state.memory_size_bytes,
            nano_cpus: self.state.cpu_count.map(|c| (c * 1e9) as i64),
            pids_limit: Some(
                extra
                    .pids_limit
                    .or(self.state.pids_limit)
                    .unwrap_or(DEFAULT_PIDS_LIMIT),
            ),
            network_mode: Some(self.state.network.clone()),
            cap_drop: Some(extra.cap_drop.clone().unwrap_or_else(|| vec!["ALL".into()])),
            cap_add: (!extra.cap_add.is_empty()).then(|| extra.cap_add.clone()),
            security_opt: Some(security_opt),
            port_bindings: (!bindings.is_empty()).then_some(bindings),
            binds: (!self.state.binds.is_empty()).then(|| self.state.binds.clone()),
            mounts: (!mounts.is_empty()).then_some(mounts),
            readonly_rootfs: extra.read_only.then_some(true),
            tmpfs: (!extra.tmpfs.is_empty()).then(|| extra.tmpfs.clone()),
            ulimits: (!extra.ulimits.is_empty()).then(|| extra.ulimits.clone()),
            shm_size: extra.shm_size,
            extra_hosts: (!extra.extra_hosts.is_empty()).then(|| extra.extra_hosts.clone()),
            runtime: self.state.runtime.clone(),
            ..Default::default()
        };
        Ok(ContainerCreateBody {
            image: Some(self.state.image.clone()),
            cmd: Some(vec!["sh".into(), "-c".into(), KEEP_ALIVE.into()]),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            user: self.state.user.clone().or_else(|| extra.user.clone()),
            working_dir: extra.workdir.clone(),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            host_config: Some(host_config),
            ..Default::default()
        })
    }

    /// Mounts the workspace's disk image on this host before a container
    /// that binds it is made or started (after a reboot, the mount is
    /// gone and the container would see an empty directory). The image
    /// must be on the engine's host: an engine reached over a unix
    /// socket, or over TCP on this host's loopback; another is refused.
    pub(super) async fn ensure_disk(
        &self,
    ) -> Result<Option<berth::backend::disk_image::Mounted>, BackendError> {
        let Some(disk) = &self.state.disk else {
            return Ok(None);
        };
        if !self.engine_on_this_host() {
            return Err(BackendError::Unbounded {
                backend: BACKEND,
                cause: format!(
                    "the workspace's disk: the engine {} is not on this host, where the sandbox's disk image is",
                    self.engine.reference
                ),
                remedy: "use an engine on this host (a unix socket), or give the sandbox `disk=unlimited` (`-o disk=unlimited`)".into(),
            });
        }
        disk.ensure_mounted(BACKEND).await.map(Some)
    }

    /// Whether the engine runs on this host (a unix socket, or TCP on
    /// loopback), so a host path it binds is this host's.
    pub(super) fn engine_on_this_host(&self) -> bool {
        let endpoint = &self.engine.endpoint;
        let loopback = endpoint
            .strip_prefix("tcp://")
            .and_then(|rest| rest.rsplit_once(':'))
            .is_some_and(|(host, _)| matches!(host, "127.0.0.1" | "localhost" | "[::1]"));
        endpoint.starts_with("unix://") || endpoint.starts_with('/') || loopback
    }

    /// Creates and starts the container (the image pulled as the state
    /// says; the runtime checked first).
    pub(super) async fn create(&mut self) -> Result<(), BackendError> {
        if !self.state.container_owned {
            return Err(BackendError::Operation {
                backend: BACKEND,
                operation: "resume",
                source: format!(
                    "container {} is not owned by Berth and no longer exists; Berth will not create it",
                    self.state.container_name
                )
                .into(),
            });
        }
        let mut body = self.create_body()?;
        if let Some(runtime) = &self.state.runtime {
            runtime::check_known(&self.docker, runtime).await?;
        }
        let image_user = self.ensure_image().await?;
        // For a root user, the engine makes the workspace root itself as
        // the working directory at start: no call of ours at all.
        let user = body.user.clone().or(image_user).unwrap_or_default();
        let root_user = matches!(user.split(':').next(), Some("" | "root" | "0"));
        let engine_makes_root = root_user
            && body.working_dir.is_none()
            && !self.state.workspace_root.trim_matches('/').is_empty();
        if engine_makes_root {
            body.working_dir = Some(self.state.workspace_root.clone());
        }
        self.root_made_at_create
            .store(engine_makes_root, std::sync::atomic::Ordering::Relaxed);
        let options = CreateContainerOptionsBuilder::new()
            .name(&self.state.container_name)
            .build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| api("creating the container", e))?;
        tracing::info!(container = %created.id, name = %self.state.container_name, "container created");
        self.state.container_id = Some(created.id);
        self.docker
            .start_container(
                &self.target(),
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(|e| api("starting the container", e))
    }
}
