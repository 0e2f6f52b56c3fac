//! Turns a snapshot spec (on create) or snapshot state (on resume) into a
//! live [`SandboxSnapshot`], loading plugins as needed. The state records
//! only the plugin's manifest path and component digest; the client itself
//! is re-created here on every resume.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::{PluginRef, SnapshotState};
use super::SandboxError;
use crate::plugin::{PluginHost, World};
use crate::snapshot::{LocalSnapshot, NoopSnapshot, RemoteSnapshot, SandboxSnapshot};
use crate::snapshot_id::SnapshotId;

/// Where a sandbox's snapshots go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
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
}

impl SnapshotSpec {
    /// The spec a state was made from (for resume without an override).
    pub fn from_state(state: &SnapshotState) -> Result<Self, SandboxError> {
        let plugin = || {
            state
                .plugin
                .as_ref()
                .map(|p| p.manifest.clone())
                .ok_or_else(|| {
                    SandboxError::State(format!(
                        "{} snapshot without a plugin reference",
                        state.kind
                    ))
                })
        };
        Ok(match state.kind.as_str() {
            "noop" => SnapshotSpec::Noop,
            "local" => SnapshotSpec::Local {
                base_dir: state
                    .base_dir
                    .clone()
                    .ok_or_else(|| SandboxError::State("local snapshot without base_dir".into()))?,
            },
            "remote" => SnapshotSpec::Remote { plugin: plugin()? },
            "plugin" => SnapshotSpec::Plugin { plugin: plugin()? },
            other => {
                return Err(SandboxError::State(format!(
                    "unknown snapshot type {other:?}"
                )))
            }
        })
    }
}

/// Opens the snapshot `id` per `spec`; returns it with its state record.
/// `previous` (from resumed state) carries the digest to verify and the
/// component digest to compare.
pub async fn bind(
    spec: &SnapshotSpec,
    id: SnapshotId,
    host: Option<&PluginHost>,
    previous: Option<&SnapshotState>,
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
    };
    let snapshot: Arc<dyn SandboxSnapshot> = match spec {
        SnapshotSpec::Noop => {
            state.kind = "noop".into();
            Arc::new(NoopSnapshot::new(id))
        }
        SnapshotSpec::Local { base_dir } => {
            state.kind = "local".into();
            state.base_dir = Some(base_dir.clone());
            Arc::new(LocalSnapshot::new(id, base_dir.clone())?)
        }
        SnapshotSpec::Remote { plugin } | SnapshotSpec::Plugin { plugin } => {
            let owned_host;
            let host = match host {
                Some(h) => h,
                None => {
                    owned_host = PluginHost::new()?;
                    &owned_host
                }
            };
            let loaded = host.load_file(plugin).await?;
            if let Some(prev) = previous.and_then(|p| p.plugin.as_ref()) {
                if prev.component_digest != loaded.digest() {
                    tracing::warn!(
                        plugin = %plugin.display(),
                        recorded = %prev.component_digest,
                        now = %loaded.digest(),
                        "the snapshot plugin's component changed since this sandbox was saved"
                    );
                }
            }
            state.plugin = Some(PluginRef {
                manifest: plugin.clone(),
                component_digest: loaded.digest().to_string(),
            });
            match spec {
                SnapshotSpec::Remote { .. } => {
                    if loaded.world() != World::RemoteClient {
                        return Err(SandboxError::State(format!(
                            "{} is a {}, but a remote snapshot needs a remote-client-plugin",
                            plugin.display(),
                            loaded.world().name()
                        )));
                    }
                    state.kind = "remote".into();
                    Arc::new(RemoteSnapshot::new(id, Arc::new(loaded.remote_client()?)))
                }
                _ => {
                    state.kind = "plugin".into();
                    Arc::new(loaded.open_snapshot(id.as_str()).await?)
                }
            }
        }
    };
    Ok((snapshot, state))
}
