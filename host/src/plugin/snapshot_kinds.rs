//! The plugin snapshot kinds: `remote` (a `remote-client-plugin`, one
//! archive per id in its store) and `plugin` (a `snapshot-plugin`, the whole
//! snapshot), each given by a manifest file or as a loaded [`Plugin`].
//! Their state records the manifest path and component digest under
//! `plugin`; the plugin is loaded again on every resume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{LazyPluginHost, Plugin, World};
use crate::snapshot::{
    absolute_argument, BindContext, Binding, BoundStore, KindFields, SnapshotKindError,
    SnapshotOptions, SnapshotProvider,
};

/// The state field that holds the plugin.
const PLUGIN: &str = "plugin";

/// Which plugin a snapshot used (the state's `plugin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRef {
    /// The plugin manifest.
    pub manifest: PathBuf,
    /// BLAKE3 digest of the component at the time.
    pub component_digest: String,
}

impl PluginRef {
    /// The plugin a snapshot state's kind fields record, if any.
    pub fn recorded_in(fields: &KindFields) -> Result<Option<PluginRef>, serde_json::Error> {
        fields
            .get(PLUGIN)
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()
    }
}

/// The kind a plugin of `world` makes.
fn kind_of(world: World) -> &'static str {
    match world {
        World::RemoteClient => "remote",
        World::Snapshot => "plugin",
    }
}

/// Plugin options: a manifest (loaded at bind) or a loaded plugin.
#[derive(Clone)]
enum Source {
    Manifest { path: PathBuf, host: LazyPluginHost },
    Loaded(Plugin),
}

/// A plugin snapshot's settings: the plugin, and the world asked for.
#[derive(Clone)]
pub struct PluginOptions {
    source: Source,
    world: Option<World>,
}

impl std::fmt::Debug for PluginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::Manifest { path, .. } => write!(f, "{}({})", self.kind(), path.display()),
            Source::Loaded(p) => write!(f, "LoadedPlugin({})", p.name()),
        }
    }
}

impl PluginOptions {
    /// The plugin of `manifest`, loaded with `host` at bind, which must be
    /// of `world`.
    pub fn manifest(manifest: PathBuf, world: World, host: LazyPluginHost) -> Self {
        PluginOptions {
            source: Source::Manifest {
                path: manifest,
                host,
            },
            world: Some(world),
        }
    }

    /// A plugin already loaded: a `remote-client-plugin` becomes a remote
    /// snapshot, a `snapshot-plugin` is used as it is.
    pub fn loaded(plugin: Plugin) -> Self {
        PluginOptions {
            source: Source::Loaded(plugin),
            world: None,
        }
    }

    /// The manifest file, when the options name one.
    pub fn manifest_path(&self) -> Option<&Path> {
        match &self.source {
            Source::Manifest { path, .. } => Some(path),
            Source::Loaded(p) => p.manifest().source.as_deref(),
        }
    }
}

#[async_trait::async_trait]
impl SnapshotOptions for PluginOptions {
    fn kind(&self) -> &str {
        match (&self.source, self.world) {
            (_, Some(world)) => kind_of(world),
            (Source::Loaded(p), None) => kind_of(p.world()),
            (Source::Manifest { .. }, None) => "plugin",
        }
    }

    fn is_remote_store(&self) -> bool {
        self.kind() == kind_of(World::RemoteClient)
    }

    async fn bind(&self, context: &BindContext<'_>) -> Result<Binding, SnapshotKindError> {
        let loaded = match &self.source {
            Source::Manifest { path, host } => host.get().await?.load_file(path).await?,
            Source::Loaded(p) => p.clone(),
        };
        let manifest = self.manifest_path().map(Path::to_path_buf);
        let name = manifest
            .as_ref()
            .map(|m| m.display().to_string())
            .unwrap_or_else(|| loaded.name().to_string());
        let recorded = match context.previous {
            Some(previous) => PluginRef::recorded_in(&previous.fields).ok().flatten(),
            None => None,
        };
        if let Some(previous) = recorded {
            if previous.component_digest != loaded.digest() {
                tracing::warn!(
                    plugin = %name,
                    recorded = %previous.component_digest,
                    now = %loaded.digest(),
                    "the snapshot plugin's component changed since this sandbox was saved"
                );
            }
        }
        if let Some(wants) = self.world {
            if loaded.world() != wants {
                return Err(SnapshotKindError::PluginWorld {
                    plugin: name,
                    is: loaded.world().name(),
                    needs: wants.name(),
                });
            }
        }
        let mut fields = KindFields::new();
        if let Some(manifest) = manifest {
            let plugin = PluginRef {
                manifest,
                component_digest: loaded.digest().to_string(),
            };
            if let Ok(value) = serde_json::to_value(plugin) {
                fields.insert(PLUGIN.into(), value);
            }
        }
        let kind = kind_of(loaded.world());
        let store = match loaded.world() {
            World::RemoteClient => BoundStore::Remote(Arc::new(loaded.remote_client()?)),
            World::Snapshot => {
                let snapshot = loaded.open_snapshot(context.id.as_str()).await?;
                BoundStore::Snapshot(Arc::new(snapshot))
            }
        };
        Ok(Binding::new(kind, store).fields(fields))
    }
}

/// The provider of one plugin kind: `remote:MANIFEST` (a
/// `remote-client-plugin`) or `plugin:MANIFEST` (a `snapshot-plugin`).
#[derive(Debug, Clone)]
pub struct PluginKindProvider {
    world: World,
    host: LazyPluginHost,
}

impl PluginKindProvider {
    /// The kind of plugins of `world`, loaded with `host`.
    pub fn new(world: World, host: LazyPluginHost) -> Self {
        PluginKindProvider { world, host }
    }
}

impl SnapshotProvider for PluginKindProvider {
    fn kind(&self) -> &str {
        kind_of(self.world)
    }

    fn choice_usage(&self) -> String {
        format!("{}:MANIFEST", self.kind())
    }

    fn parse_choice(
        &self,
        argument: Option<&str>,
        _home: &Path,
    ) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        let choice = format!("{}:{}", self.kind(), argument.unwrap_or(""));
        let manifest = match argument {
            Some(m) if !m.is_empty() => absolute_argument(&choice, m)?,
            _ => {
                return Err(SnapshotKindError::Choice {
                    choice,
                    problem: format!("name the plugin's manifest: {}", self.choice_usage()),
                })
            }
        };
        Ok(Arc::new(PluginOptions::manifest(
            manifest,
            self.world,
            self.host.clone(),
        )))
    }

    fn resume(&self, fields: &KindFields) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        let recorded =
            PluginRef::recorded_in(fields).map_err(|e| SnapshotKindError::CorruptState {
                kind: self.kind().into(),
                problem: format!("its plugin: {e}"),
            })?;
        let plugin = recorded.ok_or_else(|| SnapshotKindError::NotRecorded {
            kind: self.kind().into(),
        })?;
        Ok(Arc::new(PluginOptions::manifest(
            plugin.manifest,
            self.world,
            self.host.clone(),
        )))
    }
}
