//! Backend providers: how the lifecycle makes, resumes, lists and cleans up
//! backends of a kind it does not know.
//!
//! A backend kind brings two things:
//! - its **options** ([`BackendOptions`]): the typed settings a new sandbox
//!   is created with (the local backend's directory, Docker's image and
//!   limits), wrapped in a [`BackendSpec`];
//! - its **provider** ([`BackendProvider`]), registered with the
//!   [`SandboxClient`](crate::SandboxClient): it resumes a backend from
//!   its typed state (decoded from the generic [`BackendState`]), says what
//!   a listing shows of it, removes an orphan, and makes options "like"
//!   an existing sandbox's (for a fork).
//!
//! The client holds one provider per kind (the built-in ones are
//! registered in `registration.rs`); `resume` looks the state's kind up
//! there, and a kind it does not know is an error naming the kinds it does.

use std::path::Path;

use super::settings::{BackendSettings, SettingDoc};
use super::{Backend, BackendError, BackendState};
use crate::workspace::spec::BindMount;
use crate::workspace::WorkspaceSpec;

/// What a new backend is made for: the session, the client's home, and
/// the workspace manifest (its root and bind mounts, typed).
#[derive(Debug)]
#[non_exhaustive]
pub struct CreateContext<'a> {
    /// The new sandbox's session id.
    pub session_id: &'a str,
    /// The client's home directory (where the local backend keeps
    /// workspaces by default).
    pub home: &'a Path,
    /// The workspace manifest.
    pub workspace: &'a WorkspaceSpec,
    /// The manifest's bind mounts: relative path, host path, read-only.
    pub bind_mounts: &'a [BindMount],
    /// The bounds a sandbox gets where its settings say nothing (the
    /// home's `config.toml` over Berth's own).
    pub defaults: &'a super::limits::HostDefaults,
    /// Where the sandbox's egress point is, when it has an egress policy:
    /// the backend binds it into the sandbox and gives the sandbox no
    /// other network (see [`crate::egress`]). Only given to options whose
    /// [`BackendOptions::routes_egress`] says yes.
    pub egress: Option<&'a crate::egress::EgressRoute>,
}

/// A kind's settings for a new sandbox: the local backend's
/// [`LocalOptions`](super::local::LocalOptions), Docker's
/// `DockerOptions`, or an embedder's own.
#[async_trait::async_trait]
pub trait BackendOptions: Send + std::fmt::Debug {
    /// The kind of backend these options make (the state's `type`).
    fn kind(&self) -> &str;

    /// Whether the sandbox may start on another host than the one that
    /// stopped it (a scheduler places it), so its snapshot must be one
    /// every host reads: a local snapshot is refused at create. By
    /// default, no.
    fn needs_portable_snapshot(&self) -> bool {
        false
    }

    /// Whether a sandbox of these options can be held to an egress policy
    /// (given [`CreateContext::egress`]): no network but the route to its
    /// egress point. `Err` says why not, and what to do; by default, a
    /// kind cannot, and a sandbox with a policy is refused rather than
    /// given a network the policy does not bound.
    fn routes_egress(&self) -> Result<(), String> {
        Err(String::new())
    }

    /// Makes the backend (connecting to its service, creating nothing
    /// yet: [`Backend::ensure_running`] does that at start).
    async fn create(
        self: Box<Self>,
        context: &CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError>;
}

/// What a listing shows of a sandbox's backend.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct BackendSummary {
    /// What holds the workspace: a container, a directory.
    pub instance: Option<String>,
    /// Where: an engine, a host.
    pub location: Option<String>,
    /// The node it runs on, for backends that place sandboxes on nodes.
    pub node: Option<String>,
    /// The host directory that holds the workspace, for backends that
    /// keep it in one (the local backend).
    pub workspace_dir: Option<std::path::PathBuf>,
    /// How its commands are contained (`confined`, `none`, a container
    /// runtime), for backends that say.
    pub isolation: Option<String>,
}

impl BackendSummary {
    /// A summary of `instance` at `location`.
    pub fn new(instance: Option<String>, location: Option<String>) -> Self {
        BackendSummary {
            instance,
            location,
            node: None,
            workspace_dir: None,
            isolation: None,
        }
    }
}

/// One backend kind, as the [`SandboxClient`](crate::SandboxClient) knows
/// it (see the module docs).
#[async_trait::async_trait]
pub trait BackendProvider: Send + Sync {
    /// The kind (the state's `type`): `local`, `docker`, or an embedder's
    /// own.
    fn kind(&self) -> &str;

    /// The backend of an existing sandbox, from its saved state.
    async fn resume(
        &self,
        state: &BackendState,
        session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError>;

    /// What a listing shows of `state`. By default, nothing.
    fn summary(&self, state: &BackendState) -> BackendSummary {
        let _ = state;
        BackendSummary::default()
    }

    /// The settings a front end may give this kind (see
    /// [`BackendSettings`]): help, `GET /v1/backends`. By default, none.
    fn settings_doc(&self) -> Vec<SettingDoc> {
        Vec::new()
    }

    /// Options for a new sandbox from a front end's settings (the CLI's
    /// `-o KEY=VALUE`, the API's JSON), decoded with
    /// [`BackendSettings::decode`] against [`Self::settings_doc`]. By
    /// default, the kind takes none: it is made by an embedder's code.
    fn options_from(&self, settings: &BackendSettings) -> Result<BackendSpec, BackendError> {
        let _ = settings;
        Err(BackendError::Config {
            backend: "backend provider",
            message: format!(
                "the {} backend is not made from settings; the program embedding Berth creates it",
                self.kind()
            ),
        })
    }

    /// Options for a new sandbox set up like the one whose state is
    /// `state` (same image, limits, engine; its own new instance), as a
    /// fork needs. By default, the kind cannot make one.
    fn options_like(&self, state: &BackendState) -> Result<BackendSpec, BackendError> {
        let _ = state;
        Err(BackendError::Config {
            backend: "backend provider",
            message: format!(
                "the {} backend cannot set up a new sandbox like an existing one; pass the backend explicitly",
                self.kind()
            ),
        })
    }

    /// Whether a sandbox of this kind can be moved to another place (an
    /// engine, a node) with
    /// [`SandboxClient::move_to`](crate::SandboxClient::move_to). By
    /// default, no.
    fn relocatable(&self) -> bool {
        false
    }

    /// This provider telling `sink` how its slow steps go (image pulls,
    /// placements), for a front end to draw: the client keeps the provider
    /// returned instead of this one. `None` (the default) when the kind
    /// has nothing slow to tell.
    fn with_progress(
        &self,
        sink: super::ProgressSink,
    ) -> Option<std::sync::Arc<dyn BackendProvider>> {
        let _ = sink;
        None
    }

    /// Removes an instance a sandbox left behind when it moved (see
    /// [`crate::sandbox::Orphan`]). By default, resumes it and destroys it.
    async fn remove_orphan(
        &self,
        state: &BackendState,
        session_id: &str,
    ) -> Result<(), BackendError> {
        let mut backend = self.resume(state, session_id).await?;
        backend.destroy().await
    }
}

/// Which backend a new sandbox runs on: a kind's [`BackendOptions`], or a
/// backend the embedder built. By default, the local backend under the
/// client's home.
pub struct BackendSpec(pub(crate) Choice);

pub(crate) enum Choice {
    Options(Box<dyn BackendOptions>),
    Built(Box<dyn Backend>),
}

impl BackendSpec {
    /// A backend made from `options` at create.
    pub fn new(options: impl BackendOptions + 'static) -> Self {
        BackendSpec(Choice::Options(Box::new(options)))
    }

    /// A backend the embedder built. On resume, register a
    /// [`BackendProvider`] for its kind, or pass it again with
    /// [`SandboxClient::resume_with_backend`](crate::SandboxClient::resume_with_backend).
    pub fn custom(backend: Box<dyn Backend>) -> Self {
        BackendSpec(Choice::Built(backend))
    }

    /// The kind and whether it needs a portable snapshot (see
    /// [`BackendOptions::needs_portable_snapshot`]); `None` for a backend
    /// the embedder built.
    pub(crate) fn needs_portable_snapshot(&self) -> Option<(&str, bool)> {
        match &self.0 {
            Choice::Options(o) => Some((o.kind(), o.needs_portable_snapshot())),
            Choice::Built(_) => None,
        }
    }

    /// The kind, and whether it routes egress (see
    /// [`BackendOptions::routes_egress`]); a backend the embedder built
    /// does not.
    pub(crate) fn routes_egress(&self) -> (String, Result<(), String>) {
        match &self.0 {
            Choice::Options(o) => (o.kind().to_string(), o.routes_egress()),
            Choice::Built(_) => (
                "embedder's".to_string(),
                Err("a backend built by the embedder is not given a route".to_string()),
            ),
        }
    }

    /// The backend, made for `context`.
    pub(crate) async fn build(
        self,
        context: &CreateContext<'_>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        match self.0 {
            Choice::Options(options) => options.create(context).await,
            Choice::Built(backend) => Ok(backend),
        }
    }
}

impl std::fmt::Debug for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Choice::Options(o) => write!(f, "BackendSpec({o:?})"),
            Choice::Built(_) => f.write_str("BackendSpec(custom)"),
        }
    }
}

/// The providers a client knows, by kind.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    providers: std::collections::BTreeMap<String, std::sync::Arc<dyn BackendProvider>>,
}

impl Registry {
    /// Every provider that reports progress, now reporting it to `sink`.
    pub(crate) fn report_progress_to(&mut self, sink: &super::ProgressSink) {
        for provider in self.providers.values_mut() {
            if let Some(reporting) = provider.with_progress(sink.clone()) {
                *provider = reporting;
            }
        }
    }

    /// Adds `provider`, replacing one of the same kind.
    pub(crate) fn register(&mut self, provider: std::sync::Arc<dyn BackendProvider>) {
        self.providers.insert(provider.kind().to_string(), provider);
    }

    /// The providers, by kind.
    pub(crate) fn providers(&self) -> impl Iterator<Item = &std::sync::Arc<dyn BackendProvider>> {
        self.providers.values()
    }

    /// The kinds known, sorted.
    pub(crate) fn kinds(&self) -> Vec<String> {
        self.providers.keys().cloned().collect()
    }

    /// The provider of `kind`.
    pub(crate) fn get(&self, kind: &str) -> Option<&std::sync::Arc<dyn BackendProvider>> {
        self.providers.get(kind)
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.providers.keys()).finish()
    }
}
