//! The local backend: the embedded default, needing no Docker.
//!
//! The workspace is a host directory and commands run with `sh -c` in it.
//! By default they are **confined** ([`Isolation::Confined`]): each runs
//! under bubblewrap in namespaces of its own, seeing the workspace, its
//! binds and the system read-only and nothing else of the host (see
//! [`confine`](self::Isolation) for exactly what). A host that cannot
//! confine refuses to run commands ([`BackendError::Unconfined`]), never
//! running them unconfined. [`Isolation::None`] runs them as the current
//! user, with every right it has: for trusted work only, chosen
//! explicitly and warned about.
//! Each command runs in its own process group, so a timeout kills
//! everything it started.

mod cgroup;
mod confine;
mod options;
mod seccomp;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::host_process::Launch;
use super::limits::Bound;
use super::Provisioned;
use super::{
    ArchiveStream, Backend, BackendError, ExecProcess, ExecRequest, HelperCall, SandboxHelper,
};
use crate::workspace::archive;
use crate::workspace::entries::BindMounts;

pub use confine::{Isolation, UnknownIsolation};
pub use options::{LocalOptions, LocalSettings, SETTINGS};

const BACKEND: &str = "local backend";

/// The local backend's kind in the sandbox state (`"type": "local"`).
pub const KIND: &str = "local";

/// Local backend state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalState {
    /// The host directory holding the workspace.
    pub root_dir: PathBuf,
    /// Whether shutdown may delete it.
    #[serde(default = "yes")]
    pub owned: bool,
    /// Where background processes keep their state and logs (outside the
    /// workspace). `None` in states written before 0.5:
    /// `<root_dir>.berth-run` beside the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<PathBuf>,
    /// How its commands are contained. States written before 0.9 have
    /// none and are confined.
    #[serde(default)]
    pub isolation: Isolation,
    /// The manifest's bind mounts, which a confined sandbox mounts itself
    /// (an unconfined one links them into the workspace instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<crate::workspace::spec::BindMount>,
    /// The memory its processes may use together, in bytes (swap
    /// included); `None`: unbounded (by choice, or a state written before
    /// 0.10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// How many processes and threads it may hold at once; `None`:
    /// unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPU time, in thousandths of a CPU; `None`: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_millis: Option<u64>,
    /// The workspace's disk quota in bytes (an image mounted at
    /// `root_dir`, see [`disk_image`](super::disk_image)); `None`:
    /// unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// The host directory holding the sandbox's egress point's socket,
    /// bound into every command, which reaches nothing else (see
    /// [`crate::egress`]); `None`: no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_socket_dir: Option<PathBuf>,
}

impl LocalState {
    /// A state for a workspace in `root_dir`, owned by the sandbox.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        LocalState {
            root_dir: root_dir.into(),
            owned: true,
            run_dir: None,
            isolation: Isolation::default(),
            binds: Vec::new(),
            memory_bytes: None,
            pids: None,
            cpus_millis: None,
            disk_bytes: None,
            egress_socket_dir: None,
        }
    }

    fn bounds(&self) -> cgroup::Bounds {
        cgroup::Bounds {
            memory: self.memory_bytes,
            pids: self.pids,
            cpus_millis: self.cpus_millis,
        }
    }

    /// The workspace's disk image (mounted at `root_dir`), when its disk
    /// is bounded.
    pub fn disk(&self) -> Option<super::disk_image::DiskImage> {
        self.disk_bytes.map(|bytes| super::disk_image::DiskImage {
            image: self.run_dir().join("workspace.ext4"),
            mount_point: self.root_dir.clone(),
            bytes,
            owner: None,
        })
    }

    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(|| {
            let mut name = self.root_dir.as_os_str().to_owned();
            name.push(".berth-run");
            PathBuf::from(name)
        })
    }
}

fn yes() -> bool {
    true
}

/// The local backend's [`BackendProvider`](super::BackendProvider).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalProvider;

#[async_trait::async_trait]
impl super::BackendProvider for LocalProvider {
    fn kind(&self) -> &str {
        KIND
    }

    async fn resume(
        &self,
        state: &super::BackendState,
        _session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(LocalBackend::new(state.decode()?)))
    }

    fn summary(&self, state: &super::BackendState) -> super::BackendSummary {
        let local = state.decode::<LocalState>().ok();
        let dir = local.as_ref().map(|s| s.root_dir.clone());
        let mut summary = super::BackendSummary::new(
            dir.as_ref().map(|d| d.display().to_string()),
            Some("this host".into()),
        );
        summary.workspace_dir = dir;
        summary.isolation = local.map(|s| s.isolation.name().to_string());
        summary
    }

    fn settings_doc(&self) -> Vec<super::SettingDoc> {
        SETTINGS.to_vec()
    }

    fn options_from(
        &self,
        settings: &super::BackendSettings,
    ) -> Result<super::BackendSpec, BackendError> {
        let settings: LocalSettings = settings.decode(SETTINGS)?;
        Ok(super::BackendSpec::new(settings.into_options()?))
    }

    /// A new sandbox like this one: a workspace of its own, the same
    /// isolation.
    fn options_like(
        &self,
        state: &super::BackendState,
    ) -> Result<super::BackendSpec, BackendError> {
        let local: LocalState = state.decode()?;
        let bound = |limit: Option<u64>| limit.map_or(Bound::Unlimited, Bound::At);
        Ok(super::BackendSpec::new(
            LocalOptions::default()
                .isolation(local.isolation)
                .memory(bound(local.memory_bytes))
                .pids(bound(local.pids))
                .cpus_millis(bound(local.cpus_millis))
                .disk(bound(local.disk_bytes)),
        ))
    }
}

/// The local backend.
pub struct LocalBackend {
    state: LocalState,
}

impl LocalBackend {
    /// A backend over `state.root_dir`.
    pub fn new(state: LocalState) -> Self {
        LocalBackend { state }
    }

    /// Writes, in the run directory, how the background-process supervisor
    /// confines what it starts (see `berth-agent proc supervise`):
    /// `confine/argv`, bubblewrap and its arguments NUL-separated, and
    /// `confine/fd.N`, what the supervisor hands it on descriptor N (the
    /// seccomp programs the arguments name).
    async fn write_confinement(&self) -> Result<(), BackendError> {
        let mut argv: Vec<std::ffi::OsString> = vec![confine::BWRAP.into()];
        argv.extend(self.confinement_arguments()?);
        argv.extend(self.egress_bridge()?);
        let dir = self.state.run_dir().join("confine");
        let programs = confine::seccomp_programs_by_fd()?;
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::os::unix::ffi::OsStrExt;
            std::fs::create_dir_all(&dir)?;
            let mut joined = Vec::new();
            for word in &argv {
                joined.extend_from_slice(word.as_bytes());
                joined.push(0);
            }
            let mut files = vec![("argv".to_string(), joined)];
            for (fd, program) in programs {
                files.push((format!("fd.{fd}"), program.clone()));
            }
            for (name, bytes) in files {
                let part = dir.join(format!("{name}.part"));
                std::fs::write(&part, bytes)?;
                std::fs::rename(&part, dir.join(name))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Self::op_error("writing the background processes' confinement", e))?;
        written.map_err(|e| Self::op_error("writing the background processes' confinement", e))
    }

    /// bubblewrap's arguments for this sandbox's commands: its workspace,
    /// its binds, and Berth's helper.
    fn confinement_arguments(&self) -> Result<Vec<std::ffi::OsString>, BackendError> {
        let helper = super::helper_binary::path();
        confine::arguments(&confine::View {
            root: &self.state.root_dir,
            binds: &self.state.binds,
            helper: helper.as_deref(),
            egress: self.state.egress_socket_dir.as_deref(),
            // run_dir is <home>/run/<session>.
            home: self
                .state
                .run_dir
                .as_deref()
                .and_then(Path::parent)
                .and_then(Path::parent),
        })
    }

    /// What a command is run behind when the sandbox has an egress
    /// policy: `-- HELPER egress-bridge SOCKET ADDRESS` (the command's own
    /// words follow), so its proxy address on its loopback reaches
    /// the egress point. Nothing without a policy.
    fn egress_bridge(&self) -> Result<Vec<std::ffi::OsString>, BackendError> {
        if self.state.egress_socket_dir.is_none() {
            return Ok(Vec::new());
        }
        let helper = super::helper_binary::path().ok_or_else(|| BackendError::Unsupported {
            backend: BACKEND,
            what: "route a sandbox's egress",
            why: "no berth-agent binary: set BERTH_AGENT to one, or put berth-agent-static beside the program".into(),
        })?;
        Ok(vec![
            "--".into(),
            helper.into(),
            "egress-bridge".into(),
            crate::egress::SANDBOX_EGRESS_SOCKET.into(),
            crate::egress::SANDBOX_PROXY.into(),
        ])
    }

    fn op_error(
        operation: &'static str,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> BackendError {
        BackendError::Operation {
            backend: BACKEND,
            operation,
            source: e.into(),
        }
    }
}

#[async_trait::async_trait]
impl Backend for LocalBackend {
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError> {
        if self.state.isolation == Isolation::Confined {
            confine::check().await?;
        }
        // Nothing runs between commands; the parent of the root must exist.
        if let Some(parent) = self.state.root_dir.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| Self::op_error("preparing the workspace parent directory", e))?;
        }
        // A bounded workspace is its image, mounted again after a reboot
        // (or made, the first time: an empty workspace).
        if let Some(disk) = self.state.disk() {
            // A new image is a new identity: the start restores into it.
            disk.ensure_mounted(BACKEND).await?;
        }
        Ok(Provisioned::Existing)
    }

    async fn instance_id(&self) -> Result<Option<String>, BackendError> {
        use std::os::unix::fs::MetadataExt;
        // A bounded workspace is its image: the same after a remount.
        if let Some(disk) = self.state.disk() {
            return Ok(disk.identity());
        }
        // A deleted and re-made directory is another workspace. Its inode
        // may be reused at once, so its birth time (nanoseconds, where the
        // filesystem records one) is part of the identity.
        Ok(tokio::fs::metadata(&self.state.root_dir)
            .await
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| {
                let born = m
                    .created()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                format!("dir:{}:{}:{born}", m.dev(), m.ino())
            }))
    }

    async fn root_exists(&self) -> Result<bool, BackendError> {
        Ok(tokio::fs::metadata(&self.state.root_dir)
            .await
            .map(|m| m.is_dir())
            .unwrap_or(false))
    }

    async fn prepare_root(&mut self) -> Result<(), BackendError> {
        tokio::fs::create_dir_all(&self.state.root_dir)
            .await
            .map_err(|e| Self::op_error("creating the workspace root", e))
    }

    async fn spawn(&self, request: ExecRequest) -> Result<ExecProcess, BackendError> {
        if let Some(name) = &request.session {
            return Err(BackendError::Unsupported {
                backend: BACKEND,
                what: "keep shell sessions",
                why: format!(
                    "shell session {name:?}: every command runs in a fresh shell here; sessions need the Docker backend's agent"
                ),
            });
        }
        let mut words: Vec<std::ffi::OsString> = Vec::new();
        // A caller's words run through the helper's `exec` where there is
        // one (bound into the confinement at its own path): a program that
        // cannot be started then ends with 127 or 126 and the reason, as a
        // shell's command line does, rather than as `bwrap` or a spawn
        // error. (The helper's own calls are the helper.)
        let helper = super::helper_binary::path().filter(|_| request.helper.is_none());
        if let (Some(_), Some(helper)) = (&request.argv, helper) {
            words.extend([helper.into_os_string(), "exec".into(), "--".into()]);
        }
        words.extend(request.words()?.into_iter().map(Into::into));
        let cgroups = cgroup::prepare(&cgroup::key(&self.state.run_dir()), self.state.bounds())?;
        let confined = self.state.isolation == Isolation::Confined
            && request.helper != Some(HelperCall::Processes);
        let launch = if confined {
            let mut args = self.confinement_arguments()?;
            // The file helper needs no network; every command may want it.
            if request.helper != Some(HelperCall::Files) {
                args.extend(self.egress_bridge()?);
            }
            args.push("--".into());
            args.extend(words);
            Launch {
                program: confine::BWRAP.into(),
                args,
                clean_env: Some(confine::base_environment().to_vec()),
                fds: confine::seccomp_files()?,
                place: Some(confine::place_fds),
                cgroups,
            }
        } else {
            if self.state.isolation == Isolation::Confined {
                // The supervisor a background process gets confines it.
                self.write_confinement().await?;
            }
            let mut words = words.into_iter();
            Launch {
                program: words.next().unwrap_or_default(),
                args: words.collect(),
                // Confined, not even the supervisor gets Berth's own
                // variables, so the process it starts cannot either.
                clean_env: (self.state.isolation == Isolation::Confined)
                    .then(|| confine::base_environment().to_vec()),
                fds: Vec::new(),
                place: None,
                cgroups,
            }
        };
        super::host_process::spawn(&self.state.root_dir, launch, &request)
    }

    /// The host's `berth-agent` binary, found as the Docker backend finds
    /// the agent (`$BERTH_AGENT`, or `berth-agent-static` beside the
    /// program).
    async fn helper(&self) -> Result<SandboxHelper, BackendError> {
        let program = super::helper_binary::path().ok_or_else(|| BackendError::Unsupported {
            backend: BACKEND,
            what: "run Berth's helper (files and background processes)",
            why: "no berth-agent binary: set BERTH_AGENT to one, or put berth-agent-static beside the program".into(),
        })?;
        Ok(SandboxHelper {
            program: program.display().to_string(),
            workspace_root: self.state.root_dir.display().to_string(),
            run_dir: self.state.run_dir().display().to_string(),
        })
    }

    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError> {
        if !self.root_exists().await? {
            return Err(Self::op_error(
                "reading the workspace",
                format!("{} does not exist", self.state.root_dir.display()),
            ));
        }
        Ok(Box::new(archive::pack_dir(
            self.state.root_dir.clone(),
            exclude.to_vec(),
        )))
    }

    async fn walk_workspace(
        &self,
        exclude: &[PathBuf],
        known: crate::workspace::tree::KnownFiles,
        _freeze: bool,
    ) -> Result<Option<super::TreeWalk>, BackendError> {
        if !self.root_exists().await? {
            return Err(Self::op_error(
                "reading the workspace",
                format!("{} does not exist", self.state.root_dir.display()),
            ));
        }
        let root = self.state.root_dir.clone();
        let exclude = exclude.to_vec();
        let started = crate::workspace::tree::Timestamp::now();
        Ok(Some(Box::new(move |emit| {
            crate::workspace::tree::walk(&root, &exclude, &known, started, emit)
        })))
    }

    fn staging_dir(&self) -> Option<String> {
        Some(format!(
            ".berth-staging-{:016x}",
            crate::random_id::random_u64()
        ))
    }

    async fn finish_staging(&self, dir: &str, commit: bool) -> Result<(), BackendError> {
        let root = self.state.root_dir.clone();
        let staging = root.join(dir);
        let moved = tokio::task::spawn_blocking(move || finish_staging(&root, &staging, commit))
            .await
            .map_err(|e| Self::op_error("moving the restored workspace into place", e))?;
        moved.map_err(|e| {
            Self::op_error(
                if commit {
                    "moving the restored workspace into place"
                } else {
                    "removing a refused archive's staging directory"
                },
                e,
            )
        })
    }

    async fn write_archive(&self, stream: ArchiveStream) -> Result<(), BackendError> {
        archive::extract_stream(stream, self.state.root_dir.clone())
            .await
            .map_err(|e| Self::op_error("extracting into the workspace", e))?;
        Ok(())
    }

    async fn destroy(&mut self) -> Result<(), BackendError> {
        // Background processes end with the sandbox.
        let run_dir = self.state.run_dir();
        if run_dir.is_dir() {
            if let Some(program) = super::helper_binary::path() {
                let _ = tokio::process::Command::new(program)
                    .arg("proc")
                    .arg(&run_dir)
                    .arg("kill-all")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .status()
                    .await;
            }
        }
        // The image goes before the run directory that holds it: unmounted
        // first, so the workspace directory is left empty.
        if let Some(disk) = self.state.disk() {
            disk.remove(BACKEND).await?;
        }
        if run_dir.is_dir() {
            let _ = tokio::fs::remove_dir_all(&run_dir).await;
        }
        cgroup::remove(&cgroup::key(&run_dir));
        if !self.state.owned {
            tracing::info!(root = %self.state.root_dir.display(), "workspace not owned; leaving it");
            return Ok(());
        }
        match tokio::fs::remove_dir_all(&self.state.root_dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::op_error("removing the workspace", e)),
        }
    }

    /// Confined: mounted by the kernel for each command. Unconfined: links.
    fn bind_mounts(&self) -> BindMounts {
        match self.state.isolation {
            Isolation::Confined => BindMounts::Skip,
            Isolation::None => BindMounts::AsSymlinks,
        }
    }

    /// Unconfined, a bind mount is a symlink to the host path, which every
    /// command can write through: a read-only one is refused rather than
    /// silently made writable. Confined, the kernel mounts it as declared.
    fn check_workspace(&self, spec: &crate::workspace::WorkspaceSpec) -> Result<(), BackendError> {
        if self.state.isolation == Isolation::Confined {
            return Ok(());
        }
        let binds = spec.bind_mounts().map_err(|e| BackendError::Config {
            backend: BACKEND,
            message: e.to_string(),
        })?;
        match binds.into_iter().find(|b| b.read_only) {
            None => Ok(()),
            Some(bind) => Err(BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "workspace entry {:?} asks for a read-only bind mount of {}, which an unconfined local sandbox cannot enforce: \
                     it links the host directory into the workspace, writable by every command; confine the sandbox \
                     (drop --isolation none) or use the Docker backend (both mount it read-only), \
                     or set \"read_only\": false to accept writes into {}",
                    bind.relative.display(),
                    bind.host.display(),
                    bind.host.display()
                ),
            }),
        }
    }

    fn state(&self) -> Result<crate::backend::BackendState, BackendError> {
        crate::backend::BackendState::encode(KIND, &self.state)
    }
}

/// Moves what a staged restore extracted into `staging` to `root`, each
/// top-level name replacing the one there, and gives `root` the staging
/// directory's time (the archive's root time); with `commit` false, only
/// removes `staging`.
fn finish_staging(
    root: &std::path::Path,
    staging: &std::path::Path,
    commit: bool,
) -> std::io::Result<()> {
    if !staging.is_dir() {
        return Ok(());
    }
    if commit {
        let time = std::fs::metadata(staging)
            .ok()
            .map(|m| filetime::FileTime::from_last_modification_time(&m));
        for entry in std::fs::read_dir(staging)? {
            let entry = entry?;
            let target = root.join(entry.file_name());
            match std::fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&target)?,
                Ok(_) => std::fs::remove_file(&target)?,
                Err(_) => {}
            }
            std::fs::rename(entry.path(), &target)?;
        }
        std::fs::remove_dir(staging)?;
        if let Some(time) = time {
            filetime::set_file_times(root, time, time)?;
        }
        return Ok(());
    }
    std::fs::remove_dir_all(staging)
}

#[cfg(test)]
mod settings_tests {
    #[test]
    fn the_documented_settings_are_the_fields() {
        let keys = super::super::settings::documented_names(super::SETTINGS);
        assert_eq!(
            keys,
            super::super::settings::struct_fields::<super::LocalSettings>()
        );
    }
}
