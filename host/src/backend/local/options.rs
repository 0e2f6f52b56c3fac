//! The local backend's options (the library's builder) and settings
//! (what front ends hand over), and how a new local sandbox is made from
//! them.

use std::path::PathBuf;

use serde::Deserialize;

use super::{cgroup, confine, LocalBackend, LocalState, BACKEND, KIND};
use super::{Isolation, UnknownIsolation};
use crate::backend::limits::{self, Bound};
use crate::backend::{disk_image, Backend, BackendError};

/// Settings of a new local sandbox.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    root_dir: Option<PathBuf>,
    isolation: Isolation,
    bounds: limits::Chosen,
}

impl LocalOptions {
    /// Keep the workspace in `dir` (created at start, deleted by
    /// shutdown). By default, `<home>/workspaces/<session id>`.
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = Some(dir.into());
        self
    }

    /// How commands are contained. By default, [`Isolation::Confined`];
    /// [`Isolation::None`] is for trusted work only and is logged as a
    /// warning when the sandbox is created.
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// The memory the sandbox's processes may use together (swap
    /// included), enforced by a control group of its own. By default,
    /// the host's ([`limits::HostDefaults`], 2 GiB unless its
    /// `config.toml` says otherwise); [`Bound::Unlimited`] is logged as a
    /// warning when the sandbox is created.
    pub fn memory(mut self, bound: Bound) -> Self {
        self.bounds.memory = Some(bound);
        self
    }

    /// How many processes and threads the sandbox may hold at once. By
    /// default, the host's (1024 unless its `config.toml` says
    /// otherwise).
    pub fn pids(mut self, bound: Bound) -> Self {
        self.bounds.pids = Some(bound);
        self
    }

    /// CPU time, in thousandths of a CPU (`1500`: one and a half CPUs'
    /// worth), enforced by the control group's CPU quota. By default, the
    /// host's (all of its CPUs but one unless its `config.toml` says
    /// otherwise).
    pub fn cpus_millis(mut self, bound: Bound) -> Self {
        self.bounds.cpus = Some(bound);
        self
    }

    /// The workspace's disk quota in bytes: the workspace is a filesystem
    /// image of this size mounted at its directory (see
    /// [`disk_image`]), so a command that fills it gets `ENOSPC` and the
    /// host does not. By default, the host's (10 GiB unless its
    /// `config.toml` says otherwise).
    pub fn disk(mut self, bound: Bound) -> Self {
        self.bounds.disk = Some(bound);
        self
    }
}

#[async_trait::async_trait]
impl crate::backend::BackendOptions for LocalOptions {
    fn kind(&self) -> &str {
        KIND
    }

    /// Confined sandboxes have no network of their own; unconfined ones
    /// have the host's, which no policy bounds.
    fn routes_egress(&self) -> Result<(), String> {
        match self.isolation {
            Isolation::Confined => Ok(()),
            Isolation::None => Err(
                "an unconfined local sandbox (isolation none) has the host's network; \
                 keep it confined (the default) to give it an egress policy"
                    .to_string(),
            ),
        }
    }

    async fn create(
        self: Box<Self>,
        context: &crate::backend::CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        let root_dir = self
            .root_dir
            .unwrap_or_else(|| context.home.join("workspaces").join(context.session_id));
        match self.isolation {
            Isolation::Confined => confine::check().await?,
            Isolation::None => tracing::warn!(
                workspace = %root_dir.display(),
                "this sandbox's commands run unconfined (isolation none): they have every right of the user running Berth on this host"
            ),
        }
        let bounds = self.bounds.resolve(context.defaults, KIND);
        if let Bound::At(bytes) = bounds.disk {
            disk_image::check_size(BACKEND, bytes)?;
        }
        let state = LocalState {
            root_dir,
            owned: true,
            run_dir: Some(context.home.join("run").join(context.session_id)),
            isolation: self.isolation,
            binds: context.bind_mounts.to_vec(),
            memory_bytes: bounds.memory.limit(),
            pids: bounds.pids.limit(),
            cpus_millis: bounds.cpus.limit(),
            disk_bytes: bounds.disk.limit(),
            egress_socket_dir: context.egress.map(|route| route.socket_dir.clone()),
        };
        // Fails here, before anything exists, when the bounds cannot be
        // kept on this host.
        cgroup::prepare(&cgroup::key(&state.run_dir()), state.bounds())?;
        if let Some(disk) = state.disk() {
            disk.check_mount_point(BACKEND)?;
        }
        Ok(Box::new(LocalBackend::new(state)))
    }
}

/// The local backend's settings from a front end (`berth create
/// --backend local -o root_dir=DIR`, the API's `{"type": "local"}`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalSettings {
    /// The host directory for the workspace; a relative one is taken
    /// from the current directory.
    #[serde(default)]
    pub root_dir: Option<PathBuf>,
    /// `confined` (the default) or `none`.
    #[serde(default)]
    pub isolation: Option<String>,
    /// The memory bound, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::size")]
    pub memory: Option<Bound>,
    /// The process bound, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::count")]
    pub pids: Option<Bound>,
    /// The CPU bound (a number of CPUs), or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::cpus")]
    pub cpus: Option<Bound>,
    /// The workspace's disk quota, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::size")]
    pub disk: Option<Bound>,
}

/// What [`LocalSettings`] takes.
pub const SETTINGS: &[crate::backend::SettingDoc] = &[
    crate::backend::SettingDoc::optional(
        "root_dir",
        "PATH",
        "the host directory for the workspace (default: <home>/workspaces/<session id>)",
    ),
    crate::backend::SettingDoc::optional(
        "isolation",
        "confined|none",
        "confined (the default): commands in namespaces of their own, seeing only the workspace; none: as the user running Berth, for trusted work only",
    ),
    crate::backend::SettingDoc::optional(
        "memory",
        "SIZE|unlimited",
        "memory its processes may use together, swap included (default: the host's, 2GiB; enforced by a control group; unlimited is warned about)",
    ),
    crate::backend::SettingDoc::optional(
        "pids",
        "COUNT|unlimited",
        "processes and threads it may hold at once (default: the host's, 1024)",
    ),
    crate::backend::SettingDoc::optional(
        "cpus",
        "NUMBER|unlimited",
        "CPUs' worth of time, e.g. 1.5 (default: the host's, all its CPUs but one)",
    ),
    crate::backend::SettingDoc::optional(
        "disk",
        "SIZE|unlimited",
        "the workspace's disk quota: a filesystem image of this size mounted at the workspace (default: the host's, 10GiB; needs root)",
    ),
];

impl LocalSettings {
    /// The options these settings make.
    pub fn into_options(self) -> Result<LocalOptions, BackendError> {
        let mut options = LocalOptions::default();
        if let Some(dir) = self.root_dir {
            let dir = std::path::absolute(&dir).map_err(|e| BackendError::Config {
                backend: BACKEND,
                message: format!("root_dir {}: {e}", dir.display()),
            })?;
            options = options.root_dir(dir);
        }
        if let Some(isolation) = self.isolation {
            let isolation =
                isolation
                    .parse()
                    .map_err(|e: UnknownIsolation| BackendError::Config {
                        backend: BACKEND,
                        message: e.to_string(),
                    })?;
            options = options.isolation(isolation);
        }
        if let Some(bound) = self.memory {
            options = options.memory(bound);
        }
        if let Some(bound) = self.pids {
            options = options.pids(bound);
        }
        if let Some(bound) = self.cpus {
            options = options.cpus_millis(bound);
        }
        if let Some(bound) = self.disk {
            options = options.disk(bound);
        }
        Ok(options)
    }
}
