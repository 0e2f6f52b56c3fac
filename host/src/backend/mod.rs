//! Backends: where a sandbox's workspace lives and its commands run. Each
//! implements the small [`Backend`] trait; the lifecycle (start branches,
//! snapshots, entries) lives once, in [`crate::sandbox`].

pub mod disk_image;
pub mod exec;
pub mod helper_binary;
mod host_process;
pub mod limits;
pub mod local;
mod progress;
mod provider;
mod registration;
pub mod settings;

use std::path::PathBuf;

use tokio::io::AsyncRead;

pub use exec::{
    signal_number, CommandEnded, ExecDriver, ExecEvent, ExecExit, ExecInput, ExecInputSender,
    ExecProcess, ExecRequest, ExecResult, HelperCall, OutputStream, PtySize, UnknownSignal,
};
pub use progress::{BackendProgress, ProgressFn, ProgressSink};
pub(crate) use provider::Registry;
pub use provider::{BackendOptions, BackendProvider, BackendSpec, BackendSummary, CreateContext};
pub use settings::{BackendSettings, SettingDoc, SettingsError};

use crate::workspace::entries::BindMounts;

/// A backend's part of a sandbox's state: its kind (`type` in the state
/// JSON) and its own fields, whatever they are. Each backend encodes and
/// decodes its own; the sandbox state holds it without knowing any
/// backend, so backends written outside this crate fit in too.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackendState {
    /// The backend's kind: `local`, `docker`, or an embedder's own.
    #[serde(rename = "type")]
    pub kind: String,
    /// The backend's fields.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl BackendError {
    /// The status of the backend's service's answer (the Docker daemon's
    /// HTTP status: 404 not found, 409 conflict, ...), when the service
    /// answered a call with an error ([`BackendError::Service`]).
    pub fn service_status(&self) -> Option<u16> {
        match self {
            BackendError::Service { status, .. } => *status,
            _ => None,
        }
    }
}

impl BackendState {
    /// Encodes `fields` (a struct serialising to a JSON object) as the
    /// state of a backend of `kind`.
    pub fn encode<T: serde::Serialize>(kind: &str, fields: &T) -> Result<Self, BackendError> {
        match serde_json::to_value(fields) {
            Ok(serde_json::Value::Object(fields)) => Ok(BackendState {
                kind: kind.to_string(),
                fields,
            }),
            Ok(other) => Err(BackendError::State {
                kind: kind.to_string(),
                message: format!("the state must be a JSON object, not {other}"),
            }),
            Err(e) => Err(BackendError::State {
                kind: kind.to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// Decodes the fields as a backend's own state type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, BackendError> {
        serde_json::from_value(serde_json::Value::Object(self.fields.clone())).map_err(|e| {
            BackendError::State {
                kind: self.kind.clone(),
                message: e.to_string(),
            }
        })
    }
}

/// A sandbox port reachable from outside it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublishedPort {
    /// The port inside the sandbox, with its protocol (`8080/tcp`).
    pub port: String,
    /// Where it is reached (`127.0.0.1:32768`).
    pub address: String,
}

/// Where Berth's helper program is inside a sandbox (see
/// [`Backend::helper`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHelper {
    /// The `berth-agent` binary, as a path the sandbox's shell runs.
    pub program: String,
    /// The workspace root, as the helper sees it.
    pub workspace_root: String,
    /// A directory outside the workspace, kept while the sandbox runs, for
    /// background processes' state and logs.
    pub run_dir: String,
}

/// A tar stream of (or for) a workspace.
pub type ArchiveStream = Box<dyn AsyncRead + Send + Unpin>;

/// A walk of a workspace (see [`crate::workspace::tree`]): run on a
/// blocking thread of the snapshot's choosing, it hands every item to
/// the callback in order and returns its counts.
pub type TreeWalk = Box<
    dyn FnOnce(
            &mut dyn FnMut(crate::workspace::tree::TreeItem) -> std::io::Result<()>,
        ) -> std::io::Result<crate::workspace::tree::WalkStats>
        + Send,
>;

/// A backend failure, saying what failed and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend's service cannot be reached (e.g. the Docker daemon).
    #[error("{backend} is unreachable: {message}")]
    Unreachable {
        /// Which backend.
        backend: &'static str,
        /// What failed and what to do.
        message: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The backend's service (the Docker daemon, a swarm manager) answered
    /// a call with an error; its answer is the source, and its status is
    /// [`BackendError::service_status`].
    #[error("{backend}: {operation} failed")]
    Service {
        /// Which backend.
        backend: &'static str,
        /// What was being done.
        operation: &'static str,
        /// The service's status code (HTTP for Docker), when it gave one.
        status: Option<u16>,
        /// The service's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An image could not be pulled onto the engine.
    #[error("pulling image {image} from registry {registry} failed: {message}")]
    ImagePull {
        /// The image (with its tag or digest).
        image: String,
        /// The registry it was pulled from.
        registry: String,
        /// The engine's or registry's answer, and what to do.
        message: String,
    },
    /// Settings a front end passed that the kind does not take or cannot
    /// use.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Options or run arguments that cannot be honoured.
    #[error("{backend}: {message}")]
    Config {
        /// Which backend.
        backend: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A command that cannot be run as asked (an empty argv; argv in a
    /// shell session): says what to send instead.
    #[error("{0}")]
    Request(String),
    /// A backend's saved state cannot be encoded or decoded.
    #[error("the {kind} backend's state is unreadable: {message}")]
    State {
        /// The backend's kind.
        kind: String,
        /// What is wrong.
        message: String,
    },
    /// The sandbox's instance is no longer the one its scheduler wants
    /// running (a swarm rescheduled its task after a node loss): it is
    /// never used or persisted. The next command resumes the sandbox where
    /// the scheduler placed it.
    #[error("{backend}: {instance} is stale: {message}")]
    Stale {
        /// Which backend.
        backend: &'static str,
        /// The stale instance (a task, a container).
        instance: String,
        /// What replaced it and what to do.
        message: String,
    },
    /// A scheduler did not run the sandbox in time; nothing is left
    /// behind when the sandbox was being created.
    #[error("{backend}: {what} did not run within {seconds} s; it is {state}{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Placement {
        /// Which backend.
        backend: &'static str,
        /// What was to run (a service).
        what: String,
        /// Its state as the scheduler says it (`pending`).
        state: String,
        /// The scheduler's reason, if it gave one.
        reason: Option<String>,
        /// How long Berth waited.
        seconds: u64,
    },
    /// The backend cannot do this (here, or at all); says why and what to
    /// do instead.
    #[error("{backend} cannot {what}: {why}")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked.
        what: &'static str,
        /// Why not, and what to do.
        why: String,
    },
    /// The backend cannot contain commands on this host as the sandbox's
    /// isolation asks (its confinement cannot be set up, or a runtime is
    /// missing), so it runs nothing rather than run it uncontained.
    #[error("{backend} cannot confine commands on this host: {cause}; {remedy}")]
    Unconfined {
        /// Which backend.
        backend: &'static str,
        /// What is missing or refused.
        cause: String,
        /// The ways out.
        remedy: String,
    },
    /// The sandbox's bounds (memory, processes, CPU, disk) cannot be kept
    /// on this host (not root, cgroups not delegated, no loop devices), so
    /// it runs nothing rather than run unbounded.
    #[error("{backend} cannot bound the sandbox on this host: {cause}; {remedy}")]
    Unbounded {
        /// Which backend.
        backend: &'static str,
        /// What is missing or refused.
        cause: String,
        /// The ways out.
        remedy: String,
    },
    /// An operation failed; the cause is the source.
    #[error("{backend}: {operation} failed")]
    Operation {
        /// Which backend.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What [`Backend::ensure_running`] had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    /// The sandbox existed (it may have been restarted).
    Existing,
    /// The sandbox was created from nothing (first start, or re-created
    /// after it was removed behind our back).
    Created,
}

/// Where a workspace lives and commands run.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Makes the sandbox able to run commands: create, reconnect or restart
    /// as needed. Never destroys anything. Says whether it had to create
    /// the sandbox from nothing, in which case whatever the image holds at
    /// the root is not the workspace.
    async fn ensure_running(&mut self) -> Result<Provisioned, BackendError>;

    /// What holds the workspace right now: a container id, a directory's
    /// identity; `None` when nothing does. The lifecycle records it when it
    /// sets a workspace up and refuses to persist from another one.
    async fn instance_id(&self) -> Result<Option<String>, BackendError>;

    /// Whether the instance holding this sandbox's workspace (a container)
    /// exists now, without creating or starting anything. By default,
    /// whether [`Backend::instance_id`] names one.
    async fn instance_exists(&self) -> Result<bool, BackendError> {
        Ok(self.instance_id().await?.is_some())
    }

    /// Suspends the sandbox's processes so that reading the workspace sees
    /// one moment of it. Returns whether anything was suspended; by
    /// default, nothing is (backends that cannot pause).
    async fn freeze(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Resumes what [`Backend::freeze`] suspended. By default, nothing.
    async fn thaw(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// What resumes the suspended processes when the caller is dropped
    /// between [`Backend::freeze`] and [`Backend::thaw`] (a cancelled
    /// `stop`): a future the lifecycle runs on its own, detached from the
    /// dropped caller (see [`crate::cleanup`]). By default, `None` (backends
    /// that do not freeze).
    fn thaw_detached(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        None
    }

    /// Whether the workspace root exists.
    async fn root_exists(&self) -> Result<bool, BackendError>;

    /// Creates an empty workspace root.
    async fn prepare_root(&mut self) -> Result<(), BackendError>;

    /// Starts a shell command in the workspace root and returns it
    /// running: its output as events as it is produced (uncapped; the
    /// reader decides what to keep), its stdin and terminal as the request
    /// asks. Dropping the process kills the command (see
    /// [`ExecProcess`]'s cancel safety). A backend that cannot honour part
    /// of the request (a terminal, a session) refuses it with
    /// [`BackendError::Unsupported`] before anything runs.
    async fn spawn(&self, request: ExecRequest) -> Result<ExecProcess, BackendError>;

    /// Runs a shell command in the workspace root and collects its output
    /// under the request's caps. By default, [`Backend::spawn`] then
    /// [`ExecProcess::collect`].
    async fn exec(&self, request: ExecRequest) -> Result<ExecResult, BackendError> {
        let (out, err, tail) = (request.stdout_cap, request.stderr_cap, request.tail_kept);
        self.spawn(request).await?.collect(out, err, tail).await
    }

    /// The ports of the sandbox published on this host's side, as
    /// `docker port` lists them. By default, none (backends that publish
    /// nothing).
    async fn published_ports(&self) -> Result<Vec<PublishedPort>, BackendError> {
        Ok(Vec::new())
    }

    /// Berth's helper program inside the sandbox (the `berth-agent` binary),
    /// which the lifecycle runs through [`Backend::spawn`] for files and
    /// background processes. By default, none: those are
    /// [`BackendError::Unsupported`].
    async fn helper(&self) -> Result<SandboxHelper, BackendError> {
        Err(BackendError::Unsupported {
            backend: "this backend",
            what: "run Berth's helper (files and background processes)",
            why: "it does not provide one".into(),
        })
    }

    /// Streams a tar of the workspace root (paths relative to `.`),
    /// leaving out `exclude` (relative paths).
    async fn read_archive(&self, exclude: &[PathBuf]) -> Result<ArchiveStream, BackendError>;

    /// Extracts a tar stream (already validated by the archive filter) into
    /// the workspace root.
    async fn write_archive(&self, archive: ArchiveStream) -> Result<(), BackendError>;

    /// A walk of the workspace root for a snapshot that records files
    /// (leaving out `exclude`), which does not read the files `known`
    /// matches (the files cache). With `freeze`, the sandbox's processes
    /// are stopped while it reads (the walk is not run inside
    /// [`Backend::freeze`]: a backend whose freeze stops everything would
    /// stop the walk too). By default, `None`: the backend streams archives
    /// only, and the snapshot reads every byte of them.
    async fn walk_workspace(
        &self,
        exclude: &[PathBuf],
        known: crate::workspace::tree::KnownFiles,
        freeze: bool,
    ) -> Result<Option<TreeWalk>, BackendError> {
        let _ = (exclude, known, freeze);
        Ok(None)
    }

    /// A directory name, inside the workspace root, where an archive can be
    /// extracted while it is still being validated and then moved into
    /// place with [`Backend::finish_staging`], so a restore takes one pass
    /// and a bad entry anywhere leaves nothing behind. By default, `None`:
    /// the lifecycle validates the whole archive before `write_archive`.
    fn staging_dir(&self) -> Option<String> {
        None
    }

    /// Moves what was extracted into `dir` (see [`Backend::staging_dir`])
    /// into the workspace root, replacing what is there under the same
    /// names, when `commit`; removes it otherwise.
    async fn finish_staging(&self, dir: &str, commit: bool) -> Result<(), BackendError> {
        let _ = (dir, commit);
        Ok(())
    }

    /// Destroys the resources this sandbox owns (and only those).
    async fn destroy(&mut self) -> Result<(), BackendError>;

    /// How bind-mount entries are expressed in entry archives.
    fn bind_mounts(&self) -> BindMounts;

    /// Refuses a workspace manifest this backend cannot honour as written,
    /// for example a read-only bind mount on a backend that cannot make
    /// one read-only. The lifecycle checks it at create and at every start,
    /// before anything is written. By default, every manifest is accepted.
    fn check_workspace(&self, spec: &crate::workspace::WorkspaceSpec) -> Result<(), BackendError> {
        let _ = spec;
        Ok(())
    }

    /// The backend's part of the sandbox state (see [`BackendState`]).
    fn state(&self) -> Result<BackendState, BackendError>;
}
