//! [`SandboxClient`]: creates, resumes and forks sandboxes; [`SandboxSpec`]
//! and the client's builder.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::snapshot_binding::{self, SnapshotChoiceError};
use super::{
    Sandbox, SandboxError, SandboxOptions, SandboxState, SnapshotSpec, SnapshotState, StateFile,
    StateSink,
};
use crate::backend::limits::HostDefaults;
use crate::backend::{
    Backend, BackendError, BackendProvider, BackendSettings, BackendSpec, BackendState,
    BackendSummary, CreateContext, Registry, SettingDoc, SettingsError,
};
use crate::egress::{EgressSettings, EgressState};
use crate::plugin::{LazyPluginHost, PluginHost};
use crate::snapshot::{
    DeleteReport, GcReport, Generations, OrphanFile, PackCache, Registry as SnapshotRegistry,
    SandboxSnapshot, SnapshotProvider,
};
use crate::snapshot_id::SnapshotId;
use crate::store_error::StorageError;
use crate::workspace::entries::{self, Selection};
use crate::workspace::WorkspaceSpec;

/// Everything a new sandbox is made from. Every field has a default:
/// `SandboxSpec::new(workspace)` is a local sandbox with local snapshots.
#[derive(Debug)]
#[non_exhaustive]
pub struct SandboxSpec {
    /// The workspace manifest. By default, an empty workspace at
    /// `/workspace`.
    pub workspace: WorkspaceSpec,
    /// Where snapshots go. By default, `<home>/snapshots` on the host.
    pub snapshot: Option<SnapshotSpec>,
    /// The snapshot id. By default, derived from the session id; it stays
    /// the same for the sandbox's life.
    pub snapshot_id: Option<String>,
    /// The backend. By default, the local backend under the home.
    pub backend: BackendSpec,
    /// Tunables. By default, [`SandboxOptions::default`] (state saved
    /// under the home, see [`SandboxClientBuilder::save_state`]).
    pub options: SandboxOptions,
    /// What the sandbox may reach beyond itself (see [`crate::egress`]).
    /// By default, `None`: the backend's own network settings alone (no
    /// network for every built-in backend).
    pub egress: Option<EgressSettings>,
}

impl SandboxSpec {
    /// A sandbox of `workspace`, everything else by default.
    pub fn new(workspace: WorkspaceSpec) -> Self {
        SandboxSpec {
            workspace,
            snapshot: None,
            snapshot_id: None,
            backend: BackendSpec::default(),
            options: SandboxOptions::default(),
            egress: None,
        }
    }

    /// Holds the sandbox to an egress policy: no network but what the
    /// policy allows, through its egress point on the host.
    pub fn egress(mut self, egress: EgressSettings) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Where snapshots go. By default, `<home>/snapshots` on the host.
    pub fn snapshot(mut self, snapshot: SnapshotSpec) -> Self {
        self.snapshot = Some(snapshot);
        self
    }

    /// The snapshot id. By default, `berth-<session id>`.
    pub fn snapshot_id(mut self, id: impl Into<String>) -> Self {
        self.snapshot_id = Some(id.into());
        self
    }

    /// The backend. By default, the local backend under the home.
    pub fn backend(mut self, backend: BackendSpec) -> Self {
        self.backend = backend;
        self
    }

    /// Tunables. By default, [`SandboxOptions::default`].
    pub fn options(mut self, options: SandboxOptions) -> Self {
        self.options = options;
        self
    }
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec::new(WorkspaceSpec::default())
    }
}

/// Builds a [`SandboxClient`].
#[derive(Debug)]
pub struct SandboxClientBuilder {
    home: PathBuf,
    plugins: Option<PluginHost>,
    save_state: bool,
    pack_cache: Option<Option<PackCache>>,
    backends: Registry,
    snapshot_providers: SnapshotRegistry,
    progress: Option<crate::backend::ProgressSink>,
    defaults: Option<HostDefaults>,
}

impl SandboxClientBuilder {
    /// Tells `sink` how every kind's slow steps go (image pulls, swarm
    /// placements): a front end draws them without naming a kind. Applies
    /// to the kinds registered before and after this call. By default,
    /// nobody is told.
    pub fn backend_progress(mut self, sink: crate::backend::ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Resumes (and lists, and forks) sandboxes of `provider`'s kind with
    /// it, replacing the provider the client had for that kind. By
    /// default, the client knows the local backend only; other kinds live
    /// in their own crates (`berth_docker::providers()` for Docker and the
    /// swarm).
    pub fn backend_provider(self, provider: impl BackendProvider + 'static) -> Self {
        self.backend_provider_shared(Arc::new(provider))
    }

    /// [`backend_provider_shared`](Self::backend_provider_shared) for each
    /// of `providers` (a crate's kinds: `berth_docker::providers()`).
    pub fn backend_providers(
        self,
        providers: impl IntoIterator<Item = Arc<dyn BackendProvider>>,
    ) -> Self {
        providers
            .into_iter()
            .fold(self, Self::backend_provider_shared)
    }

    /// The same, for a provider already shared (a front end registering
    /// an embedder's kinds on every client it builds).
    pub fn backend_provider_shared(mut self, provider: Arc<dyn BackendProvider>) -> Self {
        self.backends.register(provider);
        self
    }

    /// Registers the provider of a snapshot kind (replacing a built-in
    /// one of the same kind): sandboxes whose state names it resume
    /// without a spec, and `--snapshot KIND[:ARGUMENT]` chooses it.
    pub fn snapshot_provider(self, provider: impl SnapshotProvider + 'static) -> Self {
        self.snapshot_provider_shared(Arc::new(provider))
    }

    /// [`SandboxClientBuilder::snapshot_provider`] for a shared provider.
    pub fn snapshot_provider_shared(mut self, provider: Arc<dyn SnapshotProvider>) -> Self {
        self.snapshot_providers.register(provider);
        self
    }

    /// Loads snapshot plugins with `host` (sharing its engine and compile
    /// cache). By default, the client makes one [`PluginHost`] the first
    /// time it needs one and shares it between all its sandboxes.
    pub fn plugin_host(mut self, host: PluginHost) -> Self {
        self.plugins = Some(host);
        self
    }

    /// Whether sandboxes save their state, crash-safely, to
    /// `<home>/state/<session id>.json` at the moments a crash must not
    /// lose (after start, before and after each persist). By default, on;
    /// a [`SandboxOptions::state_sink`] given to a sandbox replaces it.
    pub fn save_state(mut self, save: bool) -> Self {
        self.save_state = save;
        self
    }

    /// Where deduplicated snapshots keep the packs they upload and
    /// download, so a restore on this host skips downloads (`None`: no
    /// cache). By default, `$BERTH_CACHE_DIR` (else `<home>/cache/packs`)
    /// capped at `$BERTH_CACHE_MAX_BYTES` (else 4 GiB; `0` turns it off).
    pub fn pack_cache(mut self, cache: Option<PackCache>) -> Self {
        self.pack_cache = Some(cache);
        self
    }

    /// The bounds new sandboxes get where their settings say nothing. By
    /// default, the home's `config.toml` (read at each create) over
    /// Berth's own ([`HostDefaults`]).
    pub fn host_defaults(mut self, defaults: HostDefaults) -> Self {
        self.defaults = Some(defaults);
        self
    }

    /// The client.
    pub fn build(self) -> SandboxClient {
        let plugins = match self.plugins {
            Some(host) => LazyPluginHost::with(host),
            None => LazyPluginHost::default(),
        };
        let mut snapshots = snapshot_binding::default_providers(&plugins);
        for provider in self.snapshot_providers.providers() {
            snapshots.register(provider.clone());
        }
        let pack_cache = self
            .pack_cache
            .unwrap_or_else(|| PackCache::from_env(&self.home.join("cache").join("packs")));
        let mut backends = self.backends;
        if let Some(sink) = &self.progress {
            backends.report_progress_to(sink);
        }
        SandboxClient {
            home: self.home,
            plugins,
            save_state: self.save_state,
            pack_cache,
            backends,
            snapshots,
            defaults: self.defaults,
        }
    }
}

/// Creates and resumes sandboxes.
///
/// The library needs a multi-threaded tokio runtime (the default of
/// `#[tokio::main]`; `#[tokio::test(flavor = "multi_thread")]` in tests):
/// archives are produced and consumed on blocking threads that wait on the
/// runtime.
#[derive(Clone, Debug)]
pub struct SandboxClient {
    home: PathBuf,
    plugins: LazyPluginHost,
    save_state: bool,
    pack_cache: Option<PackCache>,
    backends: Registry,
    snapshots: SnapshotRegistry,
    defaults: Option<HostDefaults>,
}

impl SandboxClient {
    /// A client keeping its sandboxes' workspaces, snapshots and state
    /// under `home`, everything else by default.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Self::builder(home).build()
    }

    /// A builder for a client keeping its sandboxes under `home`.
    ///
    /// ```
    /// use berth::{PluginHost, SandboxClient};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let plugins = PluginHost::new()?; // one engine and compile cache, shared
    /// let client = SandboxClient::builder("/var/lib/my-agent/berth")
    ///     .plugin_host(plugins)
    ///     .save_state(false) // the embedder keeps `Sandbox::state()` itself
    ///     .build();
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder(home: impl Into<PathBuf>) -> SandboxClientBuilder {
        SandboxClientBuilder {
            home: home.into(),
            plugins: None,
            save_state: true,
            pack_cache: None,
            backends: Registry::with_defaults(),
            snapshot_providers: SnapshotRegistry::default(),
            progress: None,
            defaults: None,
        }
    }

    /// The backend kinds this client can resume, sorted.
    pub fn backend_kinds(&self) -> Vec<String> {
        self.backends.kinds()
    }

    /// The provider of backend `kind`, or an error naming the kinds known.
    pub(crate) fn provider(&self, kind: &str) -> Result<&Arc<dyn BackendProvider>, SandboxError> {
        self.backends
            .get(kind)
            .ok_or_else(|| SandboxError::UnknownBackend {
                kind: kind.to_string(),
                known: self.backends.kinds(),
            })
    }

    /// What a listing shows of a sandbox's backend (its instance and
    /// where it runs), from its state alone.
    pub fn backend_summary(&self, state: &BackendState) -> Result<BackendSummary, SandboxError> {
        Ok(self.provider(&state.kind)?.summary(state))
    }

    /// Options for a new sandbox set up like the one whose backend state
    /// is `state` (as a fork is): same kind and settings, its own instance.
    pub fn backend_like(&self, state: &BackendState) -> Result<BackendSpec, SandboxError> {
        Ok(self.provider(&state.kind)?.options_like(state)?)
    }

    /// Each kind this client knows, with the settings a front end may
    /// give it ([`BackendProvider::settings_doc`]), sorted by kind.
    pub fn backend_settings_docs(&self) -> Vec<(String, Vec<SettingDoc>)> {
        self.backends
            .providers()
            .map(|p| (p.kind().to_string(), p.settings_doc()))
            .collect()
    }

    /// Options for a new sandbox from a front end's settings: the kind's
    /// provider decodes them. A key the kind lacks is refused naming the
    /// kinds that have it.
    pub fn backend_from_settings(
        &self,
        settings: &BackendSettings,
    ) -> Result<BackendSpec, SandboxError> {
        match self.provider(settings.kind())?.options_from(settings) {
            Err(BackendError::Settings(SettingsError::UnknownKey {
                kind, key, known, ..
            })) => {
                let elsewhere = self
                    .backend_settings_docs()
                    .into_iter()
                    .filter(|(_, docs)| docs.iter().any(|d| d.key == key))
                    .map(|(kind, _)| kind)
                    .collect();
                Err(BackendError::Settings(SettingsError::UnknownKey {
                    kind,
                    key,
                    known,
                    elsewhere,
                })
                .into())
            }
            other => Ok(other?),
        }
    }

    /// The snapshot a `--snapshot KIND[:ARGUMENT]` choice names, its kind's
    /// provider parsing the argument.
    pub fn snapshot_from_choice(&self, choice: &str) -> Result<SnapshotSpec, SnapshotChoiceError> {
        let options = snapshot_binding::resolve_choice(&self.snapshots, choice, &self.home)?;
        Ok(SnapshotSpec::from_options(options))
    }

    /// How `--snapshot` names each snapshot kind this client knows, sorted
    /// by kind.
    pub fn snapshot_choices(&self) -> Vec<String> {
        self.snapshots.usages()
    }

    /// The spec a snapshot state was made from, through its kind's
    /// provider: what a resume without a spec binds.
    pub fn snapshot_spec_of(&self, state: &SnapshotState) -> Result<SnapshotSpec, SandboxError> {
        snapshot_binding::spec_of(&self.snapshots, state)
    }

    /// The snapshot files on this host, of every kind, that none of
    /// `known` (the snapshot states of every sandbox known) uses: what
    /// `berth gc --orphans` lists and deletes. Nothing is deleted here.
    pub fn snapshot_orphan_files(&self, known: &[&SnapshotState]) -> Vec<OrphanFile> {
        let mut out = Vec::new();
        for provider in self.snapshots.providers() {
            let of_kind: Vec<&SnapshotState> = known
                .iter()
                .copied()
                .filter(|s| s.kind == provider.kind())
                .collect();
            out.extend(provider.orphan_files(&self.home, &of_kind));
        }
        out
    }

    /// The bounds new sandboxes get where their settings say nothing:
    /// the ones given to the builder
    /// ([`SandboxClientBuilder::host_defaults`]), else the home's
    /// `config.toml` read now (so an edit counts from the next create),
    /// else Berth's own.
    pub fn host_defaults(&self) -> Result<HostDefaults, SandboxError> {
        match &self.defaults {
            Some(defaults) => Ok(defaults.clone()),
            None => Ok(HostDefaults::load(&self.home)?),
        }
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The plugin host shared by this client's sandboxes (made on first
    /// use).
    pub async fn plugin_host(&self) -> Result<&PluginHost, SandboxError> {
        Ok(self.plugins.get().await?)
    }

    /// Where a sandbox's state is saved by default.
    pub fn state_path(&self, session_id: &str) -> PathBuf {
        self.home.join("state").join(format!("{session_id}.json"))
    }

    /// Options with the default state file filled in, unless the caller
    /// gave a sink or turned saving off.
    fn with_state_file(&self, mut options: SandboxOptions, session_id: &str) -> SandboxOptions {
        if self.save_state && options.state_sink.is_none() {
            let file = StateFile::new(self.state_path(session_id));
            options.state_sink = Some(StateSink(Arc::new(move |state: &SandboxState| {
                let json = state.to_json()?;
                file.write(&json)
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            })));
        }
        options
    }

    /// Creates a sandbox (not yet started) from `spec`.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox, SandboxError> {
        self.create_from(spec, None).await
    }

    /// A new sandbox that starts from generation `generation` (by default,
    /// `None`, the newest) of the sandbox whose state is `source`: its
    /// first start restores that workspace, and its stops store only what
    /// differs from it, sharing `source`'s chunks. `source` needs a
    /// deduplicated snapshot with at least one generation; the fork's
    /// state records which one it started from (its record's `base`).
    /// That generation is pinned in the store, so
    /// `source`'s garbage collection keeps it. The fork gets the same
    /// workspace manifest and snapshot store (bound from `source`, or from
    /// `snapshot` if given, as in [`SandboxClient::resume`]), a new
    /// snapshot id, and runs on `backend` with `options`. Hold `source`'s
    /// lock (across processes, its [`StateLock`]) while forking.
    pub async fn fork(
        &self,
        source: &SandboxState,
        generation: Option<u64>,
        snapshot: Option<SnapshotSpec>,
        backend: BackendSpec,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let (bound, _, store) = self
            .bind_existing(source, snapshot, options.spool_dir.as_deref())
            .await?;
        let base = generations_of(bound.as_ref(), source)?
            .fork_base(generation)
            .await?;
        let keep = base.keep;
        let mut fields = source.snapshot.fields.clone();
        fields.extend(base.fields);
        let previous = SnapshotState {
            kind: source.snapshot.kind.clone(),
            id: source.snapshot.id.clone(),
            digest: Some(base.seal.digest),
            size: Some(base.seal.size),
            compression: None,
            persist_pending: false,
            fields,
        };
        let mut spec = SandboxSpec::new(source.manifest.clone())
            .snapshot(store.undeduplicated().deduplicated(keep))
            .backend(backend)
            .options(options);
        // A fork is held to its source's policy, by a daemon of its own.
        spec.egress = match &source.egress {
            Some(egress) => {
                let mut settings = egress.settings.clone();
                settings.secret_values = egress.secret_values()?;
                Some(settings)
            }
            None => None,
        };
        self.create_from(spec, Some(&previous)).await
    }

    /// Collects the garbage of the deduplicated snapshot of the sandbox
    /// whose state is `state` (see [`Sandbox::collect_garbage`]) without
    /// reaching its backend; returns what was (or, with `dry_run`, would
    /// be) deleted and the state to save. Hold the sandbox's lock.
    pub async fn collect_garbage(
        &self,
        state: &SandboxState,
        snapshot: Option<SnapshotSpec>,
        dry_run: bool,
    ) -> Result<(GcReport, SandboxState), SandboxError> {
        let (bound, _, _) = self.bind_existing(state, snapshot, None).await?;
        let report = generations_of(bound.as_ref(), state)?
            .collect_garbage(dry_run)
            .await?;
        let mut state = state.clone();
        state.snapshot.fields.extend(bound.state_fields());
        Ok((report, state))
    }

    /// Collects what an earlier removal left of a deduplicated snapshot
    /// (`snapshot`, as [`Sandbox::delete_snapshot`] left it: only the
    /// generations forks started from): deletes every generation whose
    /// index is not in `bases` — the fork bases of the sandboxes still
    /// known — with the packs of this snapshot no base references. Returns
    /// what was (or, with `dry_run`, would be) deleted and the snapshot
    /// state that remains.
    pub async fn collect_leftovers(
        &self,
        snapshot: &SnapshotState,
        bases: &std::collections::BTreeSet<String>,
        dry_run: bool,
    ) -> Result<(DeleteReport, SnapshotState), SandboxError> {
        let spec = self.snapshot_spec_of(snapshot)?;
        let (bound, _) = snapshot_binding::bind(
            &spec,
            snapshot_binding::options_of(&self.snapshots, &spec, &self.home)?,
            snapshot.id.clone(),
            Some(snapshot),
            self.pack_cache.as_ref(),
            None,
        )
        .await?;
        let generations = bound
            .generations()
            .ok_or_else(|| SandboxError::NoGenerations {
                id: snapshot.id.to_string(),
                kind: bound.kind().to_string(),
            })?;
        let report = generations.delete_leftovers(bases, dry_run).await?;
        let mut remaining = snapshot.clone();
        remaining.fields.extend(bound.state_fields());
        Ok((report, remaining))
    }

    /// The snapshot of an existing sandbox, bound from `snapshot` or its
    /// state, with the spec it was bound from.
    pub(super) async fn bind_existing(
        &self,
        state: &SandboxState,
        snapshot: Option<SnapshotSpec>,
        spool_dir: Option<&Path>,
    ) -> Result<(Arc<dyn SandboxSnapshot>, SnapshotState, SnapshotSpec), SandboxError> {
        let spec = match snapshot {
            Some(s) => s,
            None => self.snapshot_spec_of(&state.snapshot)?,
        };
        let (bound, record) = snapshot_binding::bind(
            &spec,
            snapshot_binding::options_of(&self.snapshots, &spec, &self.home)?,
            state.snapshot.id.clone(),
            Some(&state.snapshot),
            self.pack_cache.as_ref(),
            spool_dir,
        )
        .await?;
        Ok((bound, record, spec))
    }

    /// [`SandboxClient::create`], with a snapshot that continues
    /// `previous` (a fork's base).
    async fn create_from(
        &self,
        spec: SandboxSpec,
        previous: Option<&SnapshotState>,
    ) -> Result<Sandbox, SandboxError> {
        let SandboxSpec {
            workspace,
            snapshot,
            snapshot_id,
            backend,
            options,
            egress,
        } = spec;
        workspace.validate()?;
        if let Some(settings) = &egress {
            if let (kind, Err(why)) = backend.routes_egress() {
                return Err(SandboxError::EgressNotRouted { backend: kind, why });
            }
            settings.check_secrets()?;
        }
        let session_id = new_session_id();
        let egress_settings = egress;
        let mut egress = egress_settings
            .as_ref()
            .map(|settings| EgressState::new(settings.clone(), &self.home, &session_id));
        let route = egress.as_ref().map(EgressState::route);
        let id = match snapshot_id {
            Some(id) => {
                SnapshotId::parse(&id).map_err(|e| StorageError::InvalidId(e.to_string()))?
            }
            None => SnapshotId::parse(&format!("berth-{session_id}"))
                .map_err(|e| StorageError::InvalidId(e.to_string()))?,
        };
        let snapshot = snapshot.unwrap_or_else(|| SnapshotSpec::local(self.home.join("snapshots")));
        let (snap, snap_state) = snapshot_binding::bind(
            &snapshot,
            snapshot_binding::options_of(&self.snapshots, &snapshot, &self.home)?,
            id,
            previous,
            self.pack_cache.as_ref(),
            options.spool_dir.as_deref(),
        )
        .await?;
        if let Some((kind, true)) = backend.needs_portable_snapshot() {
            if !snap.portable() {
                return Err(SandboxError::NeedsSharedStore {
                    backend: kind.to_string(),
                    kind: snap.kind().to_string(),
                });
            }
        }
        let bind_mounts = workspace.bind_mounts()?;
        let defaults = self.host_defaults()?;
        let backend = backend
            .build(&CreateContext {
                session_id: &session_id,
                home: &self.home,
                workspace: &workspace,
                bind_mounts: &bind_mounts,
                defaults: &defaults,
                egress: route.as_ref(),
            })
            .await?;
        backend.check_workspace(&workspace)?;
        entries::check_sources(&workspace, Selection::All)?;
        if let (Some(state), Some(settings)) = (&mut egress, &egress_settings) {
            state.store_secrets(settings)?;
        }
        let options = self.with_state_file(options, &session_id);
        let state = SandboxState {
            backend: backend.state()?,
            session_id,
            manifest: workspace,
            snapshot: snap_state,
            workspace_root_ready: false,
            lineage: None,
            orphans: Vec::new(),
            background: Vec::new(),
            egress,
        };
        Ok(Sandbox::new(state, backend, snap, options))
    }

    /// Resumes a sandbox from saved state. The snapshot is bound again from
    /// `snapshot` if given, else from what the state records (a manifest
    /// path); the backend by the provider of the state's `type` (see
    /// [`SandboxClientBuilder::backend_provider`]).
    /// Snapshots are compressed if the state says they were.
    pub async fn resume(
        &self,
        state: SandboxState,
        snapshot: Option<SnapshotSpec>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let backend = self
            .provider(&state.backend.kind)?
            .resume(&state.backend, &state.session_id)
            .await?;
        self.resume_with_backend(state, snapshot, backend, options)
            .await
    }

    /// Resumes a sandbox onto `backend`, constructed by the caller from
    /// the state's backend part ([`BackendState::decode`]): how sandboxes
    /// on a backend of the embedder's own are resumed.
    pub async fn resume_with_backend(
        &self,
        state: SandboxState,
        snapshot: Option<SnapshotSpec>,
        backend: Box<dyn Backend>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let (snap, mut snap_state, _) = self
            .bind_existing(&state, snapshot, options.spool_dir.as_deref())
            .await?;
        snap_state.digest = state.snapshot.digest.clone();
        let mut options = self.with_state_file(options, &state.session_id);
        options.compression |= state.snapshot.compression.is_some();
        let mut state = state;
        state.snapshot = snap_state;
        Ok(Sandbox::new(state, backend, snap, options))
    }
}

/// `snapshot`'s generations, or why it has none.
pub(super) fn generations_of<'a>(
    snapshot: &'a dyn SandboxSnapshot,
    state: &SandboxState,
) -> Result<&'a dyn Generations, SandboxError> {
    snapshot
        .generations()
        .ok_or_else(|| SandboxError::NoGenerations {
            id: state.snapshot.id.to_string(),
            kind: snapshot.kind().to_string(),
        })
}

fn new_session_id() -> String {
    format!("{:016x}", crate::random_id::random_u64())
}
