//! Turns a snapshot spec (on create) or snapshot state (on resume) into a
//! live [`SandboxSnapshot`], loading plugins as needed. The state records
//! only the plugin's manifest path and component digest; the client itself
//! is re-created here on every resume.

use std::path::PathBuf;
use std::sync::Arc;

use super::state::{PluginRef, SnapshotState};
use super::SandboxError;
use crate::plugin::{Plugin, PluginHost, World};
use crate::remote_client::RemoteSnapshotClient;
use crate::snapshot::dedup::{self, DedupOptions, DedupRecord, DedupSnapshot};
use crate::snapshot::{LocalSnapshot, NoopSnapshot, PackCache, RemoteSnapshot, SandboxSnapshot};
use crate::snapshot_id::SnapshotId;

/// Where a sandbox's snapshots go.
///
/// The state records manifest paths, never live objects: a sandbox whose
/// store was given as an object ([`SnapshotSpec::RemoteClient`],
/// [`SnapshotSpec::Custom`], or a [`SnapshotSpec::LoadedPlugin`] not loaded
/// from a file) is resumed by passing the same spec to
/// [`super::SandboxClient::resume`] again.
#[derive(Clone)]
#[non_exhaustive]
pub enum SnapshotSpec {
    /// Persistence disabled.
    Noop,
    /// `<base_dir>/<id>.tar` on the host.
    Local {
        /// Base directory.
        base_dir: PathBuf,
    },
    /// A remote store: a `remote-client-plugin` described by its manifest.
    Remote {
        /// Plugin manifest path.
        plugin: PathBuf,
    },
    /// A `snapshot-plugin` described by its manifest.
    Plugin {
        /// Plugin manifest path.
        plugin: PathBuf,
    },
    /// A plugin already loaded with a [`PluginHost`]: a
    /// `remote-client-plugin` becomes a remote snapshot, a
    /// `snapshot-plugin` is used as it is.
    LoadedPlugin(Plugin),
    /// Any remote snapshot client, native or Wasm: the snapshot is the
    /// archive stored under the sandbox's snapshot id.
    RemoteClient(Arc<dyn RemoteSnapshotClient>),
    /// A whole snapshot implementation of the embedder's own.
    Custom(Arc<dyn SandboxSnapshot>),
    /// Incremental, deduplicated generations (a [`DedupSnapshot`]) in the
    /// remote store `store` (a [`SnapshotSpec::Remote`],
    /// [`SnapshotSpec::RemoteClient`], or a remote-client
    /// [`SnapshotSpec::LoadedPlugin`]), keeping the newest `keep`. The
    /// state records it, so a resume without a spec is deduplicated too.
    Dedup {
        /// The remote store.
        store: Box<SnapshotSpec>,
        /// Generations kept (at least 1).
        keep: u32,
    },
}

impl SnapshotSpec {
    /// Parses `berth create --snapshot`'s grammar: `noop`, `local` (under
    /// `home/snapshots`), `local:DIR`, `plugin:MANIFEST`, `remote:MANIFEST`.
    /// Relative paths are made absolute against the current directory.
    pub fn parse_choice(s: &str, home: &std::path::Path) -> Result<Self, SnapshotChoiceError> {
        let abs = |p: &str| std::path::absolute(p).map_err(|_| SnapshotChoiceError(s.to_string()));
        Ok(match s.split_once(':') {
            None if s == "noop" => SnapshotSpec::Noop,
            None if s == "local" => SnapshotSpec::Local {
                base_dir: home.join("snapshots"),
            },
            Some(("local", dir)) if !dir.is_empty() => SnapshotSpec::Local {
                base_dir: abs(dir)?,
            },
            Some(("plugin", m)) if !m.is_empty() => SnapshotSpec::Plugin { plugin: abs(m)? },
            Some(("remote", m)) if !m.is_empty() => SnapshotSpec::Remote { plugin: abs(m)? },
            _ => return Err(SnapshotChoiceError(s.to_string())),
        })
    }

    /// This remote store, deduplicated, keeping `keep` generations.
    pub fn deduplicated(self, keep: u32) -> Self {
        SnapshotSpec::Dedup {
            store: Box::new(self),
            keep: keep.max(1),
        }
    }
}

impl std::fmt::Debug for SnapshotSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotSpec::Noop => f.write_str("Noop"),
            SnapshotSpec::Local { base_dir } => write!(f, "Local({})", base_dir.display()),
            SnapshotSpec::Remote { plugin } => write!(f, "Remote({})", plugin.display()),
            SnapshotSpec::Plugin { plugin } => write!(f, "Plugin({})", plugin.display()),
            SnapshotSpec::LoadedPlugin(p) => write!(f, "LoadedPlugin({})", p.name()),
            SnapshotSpec::RemoteClient(_) => f.write_str("RemoteClient(..)"),
            SnapshotSpec::Custom(_) => f.write_str("Custom(..)"),
            SnapshotSpec::Dedup { store, keep } => write!(f, "Dedup({store:?}, keep {keep})"),
        }
    }
}

impl SnapshotSpec {
    /// The spec a state was made from (for resume without an override).
    pub fn from_state(state: &SnapshotState) -> Result<Self, SandboxError> {
        let plugin = || {
            state
                .plugin
                .as_ref()
                .map(|p| p.manifest.clone())
                .ok_or_else(|| SandboxError::SnapshotNotRecorded {
                    kind: state.kind.clone(),
                })
        };
        let unreadable = |e: serde_json::Error| SandboxError::CorruptState {
            problem: format!("the deduplicated snapshot's record: {e}"),
        };
        Ok(match state.kind.as_str() {
            "noop" => SnapshotSpec::Noop,
            LocalSnapshot::KIND => SnapshotSpec::Local {
                base_dir: state
                    .base_dir
                    .clone()
                    .ok_or_else(|| SandboxError::CorruptState {
                        problem: "a local snapshot without base_dir".into(),
                    })?,
            },
            // Versions before 0.4 wrote a deduplicated snapshot as
            // `remote` with its record.
            "remote" | dedup::KIND => {
                let remote = SnapshotSpec::Remote { plugin: plugin()? };
                let record = dedup::record_in(&state.fields).map_err(unreadable)?;
                match (record, state.kind.as_str()) {
                    (Some(record), _) => remote.deduplicated(record.keep),
                    (None, dedup::KIND) => remote.deduplicated(1),
                    (None, _) => remote,
                }
            }
            "plugin" => SnapshotSpec::Plugin { plugin: plugin()? },
            "custom" => {
                return Err(SandboxError::SnapshotNotRecorded {
                    kind: state.kind.clone(),
                })
            }
            other => {
                return Err(SandboxError::UnknownSnapshotKind {
                    kind: other.to_string(),
                })
            }
        })
    }
}

/// Opens the snapshot `id` per `spec`; returns it with its state record.
/// `previous` (from resumed state) carries the digest to verify, the
/// component digest to compare and a deduplicated snapshot's generations;
/// `cache` is where deduplicated snapshots keep packs.
pub(super) async fn bind(
    spec: &SnapshotSpec,
    id: SnapshotId,
    host: &PluginHost,
    previous: Option<&SnapshotState>,
    cache: Option<&PackCache>,
    spool_dir: Option<&std::path::Path>,
) -> Result<(Arc<dyn SandboxSnapshot>, SnapshotState), SandboxError> {
    let mut state = SnapshotState {
        kind: String::new(),
        id: id.clone(),
        base_dir: None,
        plugin: None,
        digest: previous.and_then(|p| p.digest.clone()),
        size: previous.and_then(|p| p.size),
        compression: previous.and_then(|p| p.compression.clone()),
        persist_pending: previous.is_some_and(|p| p.persist_pending),
        fields: serde_json::Map::new(),
    };
    let (spec, keep) = match spec {
        SnapshotSpec::Dedup { store, keep } => (store.as_ref(), Some(*keep)),
        other => (other, None),
    };
    let recorded = match previous {
        Some(p) => dedup::record_in(&p.fields).map_err(|e| SandboxError::CorruptState {
            problem: format!("the deduplicated snapshot's record: {e}"),
        })?,
        None => None,
    };
    let record = match (recorded, keep) {
        (Some(record), _) => Some(record),
        (None, Some(keep)) => Some(DedupRecord::new(keep)),
        (None, None) => None,
    };
    let bound = bind_store(spec, &id, host, previous, &mut state).await?;
    let snapshot: Arc<dyn SandboxSnapshot> = match (bound, record) {
        (Bound::Remote(client), Some(record)) => {
            let options = DedupOptions::default()
                .keep(record.keep)
                .cache(cache.cloned())
                .spool_dir(spool_dir.map(std::path::Path::to_path_buf));
            state.kind = dedup::KIND.into();
            state.fields = dedup::record_fields(&record);
            Arc::new(DedupSnapshot::resume(
                id,
                client,
                record,
                state.persist_pending,
                options,
            ))
        }
        (Bound::Remote(client), None) => Arc::new(RemoteSnapshot::new(id, client)),
        (Bound::Snapshot(_), Some(_)) => {
            return Err(SandboxError::SnapshotSpec(format!(
                "deduplication needs a remote store (a remote-client plugin or a remote client), not a {} snapshot",
                state.kind
            )))
        }
        (Bound::Snapshot(snapshot), None) => snapshot,
    };
    Ok((snapshot, state))
}

/// What a spec binds to: a remote store (which becomes a remote or a
/// deduplicated snapshot) or a whole snapshot.
enum Bound {
    Remote(Arc<dyn RemoteSnapshotClient>),
    Snapshot(Arc<dyn SandboxSnapshot>),
}

async fn bind_store(
    spec: &SnapshotSpec,
    id: &SnapshotId,
    host: &PluginHost,
    previous: Option<&SnapshotState>,
    state: &mut SnapshotState,
) -> Result<Bound, SandboxError> {
    let id = id.clone();
    Ok(match spec {
        SnapshotSpec::Noop => {
            state.kind = "noop".into();
            Bound::Snapshot(Arc::new(NoopSnapshot::new(id)))
        }
        SnapshotSpec::Local { base_dir } => {
            state.kind = LocalSnapshot::KIND.into();
            state.base_dir = Some(base_dir.clone());
            Bound::Snapshot(Arc::new(LocalSnapshot::new(id, base_dir.clone())?))
        }
        SnapshotSpec::RemoteClient(client) => {
            state.kind = "remote".into();
            Bound::Remote(client.clone())
        }
        SnapshotSpec::Custom(snapshot) => {
            state.kind = "custom".into();
            Bound::Snapshot(snapshot.clone())
        }
        SnapshotSpec::LoadedPlugin(loaded) => {
            let source = loaded.manifest().source.clone();
            bind_plugin(loaded, source, None, id, previous, state).await?
        }
        SnapshotSpec::Remote { plugin } | SnapshotSpec::Plugin { plugin } => {
            let loaded = host.load_file(plugin).await?;
            let wants = match spec {
                SnapshotSpec::Remote { .. } => Some(World::RemoteClient),
                _ => Some(World::Snapshot),
            };
            bind_plugin(&loaded, Some(plugin.clone()), wants, id, previous, state).await?
        }
        SnapshotSpec::Dedup { .. } => {
            return Err(SandboxError::SnapshotSpec(
                "a deduplicated snapshot cannot wrap another deduplicated snapshot".into(),
            ))
        }
    })
}
/// A loaded plugin as the sandbox's snapshot: a remote client becomes a
/// remote snapshot, a snapshot plugin opens `id`. `wants` is the world the
/// spec asked for, if it named one.
async fn bind_plugin(
    loaded: &Plugin,
    manifest: Option<PathBuf>,
    wants: Option<World>,
    id: SnapshotId,
    previous: Option<&SnapshotState>,
    state: &mut SnapshotState,
) -> Result<Bound, SandboxError> {
    let name = manifest
        .as_ref()
        .map(|m| m.display().to_string())
        .unwrap_or_else(|| loaded.name().to_string());
    if let Some(prev) = previous.and_then(|p| p.plugin.as_ref()) {
        if prev.component_digest != loaded.digest() {
            tracing::warn!(
                plugin = %name,
                recorded = %prev.component_digest,
                now = %loaded.digest(),
                "the snapshot plugin's component changed since this sandbox was saved"
            );
        }
    }
    state.plugin = manifest.map(|manifest| PluginRef {
        manifest,
        component_digest: loaded.digest().to_string(),
    });
    if let Some(wants) = wants {
        if loaded.world() != wants {
            return Err(SandboxError::PluginWorld {
                plugin: name,
                is: loaded.world().name(),
                needs: wants.name(),
            });
        }
    }
    Ok(match loaded.world() {
        World::RemoteClient => {
            state.kind = "remote".into();
            Bound::Remote(Arc::new(loaded.remote_client()?))
        }
        _ => {
            state.kind = "plugin".into();
            Bound::Snapshot(Arc::new(loaded.open_snapshot(id.as_str()).await?))
        }
    })
}

/// A snapshot choice that is not `noop`, `local`, `local:DIR`,
/// `plugin:MANIFEST` or `remote:MANIFEST`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("--snapshot {0:?}: use noop, local, local:DIR, plugin:MANIFEST or remote:MANIFEST")]
pub struct SnapshotChoiceError(pub String);
