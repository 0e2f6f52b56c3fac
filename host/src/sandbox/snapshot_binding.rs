//! Turns a snapshot spec (on create) or snapshot state (on resume) into a
//! live [`SandboxSnapshot`] through the kinds' providers, and keeps the one
//! layer the lifecycle owns: deduplicated generations over a remote store.
//! The state records manifest paths and directories, never live objects;
//! a plugin is loaded again on every resume.
//!
//! The built-in kinds are registered here (`default_providers`), once.

use std::path::PathBuf;
use std::sync::Arc;

use super::SandboxError;
use crate::plugin::{LazyPluginHost, Plugin, PluginKindProvider, PluginOptions, World};
use crate::remote_client::RemoteSnapshotClient;
use crate::snapshot::dedup::{self, DedupOptions, DedupRecord, DedupSnapshot};
use crate::snapshot::{
    BindContext, Binding, BoundStore, LocalOptions, LocalProvider, NoopOptions, NoopProvider,
    PackCache, Registry, RemoteSnapshot, SandboxSnapshot, SnapshotKindError, SnapshotOptions,
    SnapshotState,
};
use crate::snapshot_id::SnapshotId;

/// The kind of snapshots an embedder gave as objects
/// ([`SnapshotSpec::custom`]): the state cannot make them again.
const CUSTOM: &str = "custom";

/// The built-in kinds: `noop`, `local`, and the plugin kinds `remote` and
/// `plugin`, loading with `plugins`.
pub(super) fn default_providers(plugins: &LazyPluginHost) -> Registry {
    let mut registry = Registry::default();
    registry.register(Arc::new(NoopProvider));
    registry.register(Arc::new(LocalProvider));
    for world in [World::RemoteClient, World::Snapshot] {
        registry.register(Arc::new(PluginKindProvider::new(world, plugins.clone())));
    }
    registry
}

/// Where a sandbox's snapshots go: one kind's options, or a choice the
/// client's providers resolve (`remote:MANIFEST`), optionally kept as
/// deduplicated generations.
///
/// The state records what the kind needs to bind again (a directory, a
/// manifest path), never live objects: a sandbox whose store was given as
/// an object ([`SnapshotSpec::remote_client`], [`SnapshotSpec::custom`], or
/// a [`SnapshotSpec::loaded_plugin`] not loaded from a file) is resumed by
/// passing the same spec to [`super::SandboxClient::resume`] again.
#[derive(Clone)]
pub struct SnapshotSpec {
    store: Store,
    keep: Option<u32>,
}

#[derive(Clone)]
enum Store {
    Options(Arc<dyn SnapshotOptions>),
    Choice(String),
}

impl SnapshotSpec {
    /// A snapshot of an embedder's kind, or of a built-in one by its
    /// options.
    pub fn new(options: impl SnapshotOptions + 'static) -> Self {
        SnapshotSpec::from_options(Arc::new(options))
    }

    /// A snapshot with these options.
    pub fn from_options(options: Arc<dyn SnapshotOptions>) -> Self {
        SnapshotSpec {
            store: Store::Options(options),
            keep: None,
        }
    }

    /// `berth create --snapshot`'s grammar, `KIND[:ARGUMENT]` (`noop`,
    /// `local`, `local:DIR`, `plugin:MANIFEST`, `remote:MANIFEST`, or a
    /// registered kind's own), resolved by the client's providers when the
    /// sandbox is made.
    pub fn choice(choice: impl Into<String>) -> Self {
        SnapshotSpec {
            store: Store::Choice(choice.into()),
            keep: None,
        }
    }

    /// Persistence disabled.
    pub fn noop() -> Self {
        SnapshotSpec::new(NoopOptions)
    }

    /// `<base_dir>/<id>.tar` on this host.
    pub fn local(base_dir: impl Into<PathBuf>) -> Self {
        SnapshotSpec::new(LocalOptions {
            base_dir: base_dir.into(),
        })
    }

    /// A remote store: the `remote-client-plugin` of `manifest`, loaded
    /// with the client's plugin host.
    pub fn remote(manifest: impl Into<PathBuf>) -> Self {
        SnapshotSpec::choice(format!("remote:{}", manifest.into().display()))
    }

    /// The `snapshot-plugin` of `manifest`, loaded with the client's
    /// plugin host.
    pub fn plugin(manifest: impl Into<PathBuf>) -> Self {
        SnapshotSpec::choice(format!("plugin:{}", manifest.into().display()))
    }

    /// A plugin already loaded with a [`crate::plugin::PluginHost`]: a
    /// `remote-client-plugin` becomes a remote snapshot, a
    /// `snapshot-plugin` is used as it is.
    pub fn loaded_plugin(plugin: Plugin) -> Self {
        SnapshotSpec::new(PluginOptions::loaded(plugin))
    }

    /// Any remote snapshot client, native or Wasm: the snapshot is the
    /// archive stored under the sandbox's snapshot id.
    pub fn remote_client(client: Arc<dyn RemoteSnapshotClient>) -> Self {
        SnapshotSpec::new(ObjectOptions::Remote(client))
    }

    /// A whole snapshot implementation of the embedder's own.
    pub fn custom(snapshot: Arc<dyn SandboxSnapshot>) -> Self {
        SnapshotSpec::new(ObjectOptions::Custom(snapshot))
    }

    /// This remote store, kept as incremental, deduplicated generations (a
    /// [`DedupSnapshot`]), the newest `keep` (at least 1). The state
    /// records it, so a resume without a spec is deduplicated too.
    pub fn deduplicated(mut self, keep: u32) -> Self {
        self.keep = Some(keep.max(1));
        self
    }

    /// The store without deduplication.
    pub fn undeduplicated(mut self) -> Self {
        self.keep = None;
        self
    }

    /// The generations kept, when deduplicated.
    pub fn dedup_keep(&self) -> Option<u32> {
        self.keep
    }

    /// Whether the spec binds to a remote store (so it can be
    /// deduplicated); `None` for a choice not resolved yet.
    pub fn is_remote_store(&self) -> Option<bool> {
        match &self.store {
            Store::Options(o) => Some(o.is_remote_store()),
            Store::Choice(_) => None,
        }
    }
}

impl std::fmt::Debug for SnapshotSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.store {
            Store::Options(o) => write!(f, "{o:?}")?,
            Store::Choice(c) => write!(f, "{c:?}")?,
        }
        match self.keep {
            Some(keep) => write!(f, ", deduplicated, keep {keep}"),
            None => Ok(()),
        }
    }
}

/// Snapshots given as objects.
#[derive(Clone)]
enum ObjectOptions {
    Remote(Arc<dyn RemoteSnapshotClient>),
    Custom(Arc<dyn SandboxSnapshot>),
}

impl std::fmt::Debug for ObjectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectOptions::Remote(_) => f.write_str("RemoteClient(..)"),
            ObjectOptions::Custom(s) => write!(f, "Custom({})", s.kind()),
        }
    }
}

#[async_trait::async_trait]
impl SnapshotOptions for ObjectOptions {
    fn kind(&self) -> &str {
        match self {
            ObjectOptions::Remote(_) => "remote",
            ObjectOptions::Custom(_) => CUSTOM,
        }
    }

    fn is_remote_store(&self) -> bool {
        matches!(self, ObjectOptions::Remote(_))
    }

    async fn bind(&self, _context: &BindContext<'_>) -> Result<Binding, SnapshotKindError> {
        Ok(match self {
            ObjectOptions::Remote(c) => Binding::new(self.kind(), BoundStore::Remote(c.clone())),
            ObjectOptions::Custom(s) => Binding::new(CUSTOM, BoundStore::Snapshot(s.clone())),
        })
    }
}

/// A `--snapshot` choice no registered kind takes.
#[derive(Debug, Clone, thiserror::Error)]
#[error("--snapshot {choice:?}: {problem} (use {})", usages.join(", "))]
#[non_exhaustive]
pub struct SnapshotChoiceError {
    /// The choice as given.
    pub choice: String,
    /// What is wrong with it.
    pub problem: String,
    /// How each registered kind is chosen.
    pub usages: Vec<String>,
}

/// `choice` (`KIND[:ARGUMENT]`) resolved by its kind's provider.
pub(super) fn resolve_choice(
    registry: &Registry,
    choice: &str,
    home: &std::path::Path,
) -> Result<Arc<dyn SnapshotOptions>, SnapshotChoiceError> {
    let (kind, argument) = match choice.split_once(':') {
        Some((kind, argument)) => (kind, Some(argument)),
        None => (choice, None),
    };
    let refuse = |problem: String| SnapshotChoiceError {
        choice: choice.to_string(),
        problem,
        usages: registry.usages(),
    };
    let provider = registry
        .get(kind)
        .ok_or_else(|| refuse(format!("no snapshot kind is called {kind:?}")))?;
    provider.parse_choice(argument, home).map_err(|e| match e {
        SnapshotKindError::Choice { problem, .. } => refuse(problem),
        other => refuse(other.to_string()),
    })
}

/// The deduplicated snapshot's record in a state's fields, if any; an
/// unreadable one is a corrupt state.
fn dedup_record_in(
    fields: &crate::snapshot::KindFields,
) -> Result<Option<DedupRecord>, SandboxError> {
    dedup::record_in(fields).map_err(|e| SandboxError::CorruptState {
        problem: format!("the deduplicated snapshot's record: {e}"),
    })
}

/// The spec a state was made from (for resume without one), through its
/// kind's provider. Versions before 0.4 wrote a deduplicated snapshot as
/// `remote` with its record.
pub(super) fn spec_of(
    registry: &Registry,
    state: &SnapshotState,
) -> Result<SnapshotSpec, SandboxError> {
    let record = dedup_record_in(&state.fields)?;
    let is_dedup = state.kind == dedup::KIND;
    let kind = if is_dedup { "remote" } else { &state.kind };
    if kind == CUSTOM {
        return Err(SnapshotKindError::NotRecorded { kind: kind.into() }.into());
    }
    let provider = registry
        .get(kind)
        .ok_or_else(|| SandboxError::UnknownSnapshotKind {
            kind: kind.to_string(),
            known: registry.providers().map(|p| p.kind().to_string()).collect(),
        })?;
    let spec = SnapshotSpec::from_options(provider.resume(&state.fields)?);
    Ok(match (record, is_dedup) {
        (Some(record), _) => spec.deduplicated(record.keep),
        (None, true) => spec.deduplicated(1),
        (None, false) => spec,
    })
}

/// Opens the snapshot `id` per `spec`; returns it with its state record.
/// `previous` (from resumed state) carries the digest to verify, the
/// component digest to compare and a deduplicated snapshot's generations;
/// `cache` is where deduplicated snapshots keep packs.
pub(super) async fn bind(
    spec: &SnapshotSpec,
    options: Arc<dyn SnapshotOptions>,
    id: SnapshotId,
    previous: Option<&SnapshotState>,
    cache: Option<&PackCache>,
    spool_dir: Option<&std::path::Path>,
) -> Result<(Arc<dyn SandboxSnapshot>, SnapshotState), SandboxError> {
    let recorded = match previous {
        Some(p) => dedup_record_in(&p.fields)?,
        None => None,
    };
    let record = match (recorded, spec.keep) {
        (Some(record), _) => Some(record),
        (None, Some(keep)) => Some(DedupRecord::new(keep)),
        (None, None) => None,
    };
    let binding = options.bind(&BindContext { id: &id, previous }).await?;
    let mut state = SnapshotState {
        kind: binding.kind,
        id: id.clone(),
        digest: previous.and_then(|p| p.digest.clone()),
        size: previous.and_then(|p| p.size),
        compression: previous.and_then(|p| p.compression.clone()),
        persist_pending: previous.is_some_and(|p| p.persist_pending),
        fields: binding.fields,
    };
    let snapshot: Arc<dyn SandboxSnapshot> = match (binding.store, record) {
        (BoundStore::Remote(client), Some(record)) => {
            let options = DedupOptions::default()
                .keep(record.keep)
                .cache(cache.cloned())
                .spool_dir(spool_dir.map(std::path::Path::to_path_buf));
            state.kind = dedup::KIND.into();
            state.fields.extend(dedup::record_fields(&record));
            Arc::new(DedupSnapshot::resume(
                id,
                client,
                record,
                state.persist_pending,
                options,
            ))
        }
        (BoundStore::Remote(client), None) => Arc::new(RemoteSnapshot::new(id, client)),
        (BoundStore::Snapshot(_), Some(_)) => {
            return Err(SandboxError::SnapshotSpec(format!(
                "deduplication needs a remote store (a remote-client plugin or a remote client), not a {} snapshot",
                state.kind
            )))
        }
        (BoundStore::Snapshot(snapshot), None) => snapshot,
    };
    Ok((snapshot, state))
}

/// The options of `spec`, its choice resolved by `registry`.
pub(super) fn options_of(
    registry: &Registry,
    spec: &SnapshotSpec,
    home: &std::path::Path,
) -> Result<Arc<dyn SnapshotOptions>, SandboxError> {
    match &spec.store {
        Store::Options(options) => Ok(options.clone()),
        Store::Choice(choice) => Ok(resolve_choice(registry, choice, home)
            .map_err(|e| SandboxError::SnapshotSpec(e.to_string()))?),
    }
}
