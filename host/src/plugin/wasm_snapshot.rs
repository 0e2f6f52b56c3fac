//! [`SandboxSnapshot`] over a `snapshot-plugin` component.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use super::bindings::snapshot::{SnapshotPlugin, SnapshotPluginPre};
use super::capability::PluginState;
use super::{LoadedPlugin, Pre};
use crate::plugin_error::PluginError;
use crate::snapshot::SandboxSnapshot;
use crate::store_error::{StorageError, StoreError};

/// A sandbox snapshot implemented by a Wasm plugin. `id`, `kind` and
/// `persistence-enabled` are read once at open; every other operation runs
/// in a fresh instance.
#[derive(Clone)]
pub struct WasmSnapshot {
    plugin: Arc<LoadedPlugin>,
    pre: SnapshotPluginPre<PluginState>,
    id: String,
    kind: String,
    persistence_enabled: bool,
}

#[allow(clippy::ptr_arg)]
async fn open(
    pre: &SnapshotPluginPre<PluginState>,
    store: &mut Store<PluginState>,
    id: &str,
    config: &Vec<(String, String)>, // the generated binding takes `&Vec`
) -> wasmtime::Result<Result<(SnapshotPlugin, ResourceAny), StorageError>> {
    let instance = pre.instantiate_async(&mut *store).await?;
    let opened = instance
        .berth_snapshot_snapshot()
        .snapshot()
        .call_open(&mut *store, id, config)
        .await?;
    Ok(opened.map(|s| (instance, s)).map_err(StorageError::from))
}

impl WasmSnapshot {
    pub(crate) async fn open(plugin: Arc<LoadedPlugin>, id: &str) -> Result<Self, StoreError> {
        let pre = match &plugin.pre {
            Pre::Snapshot(pre) => pre.clone(),
            Pre::Remote(_) => {
                return Err(PluginError::ContractViolation {
                    plugin: plugin.manifest.name.clone(),
                    message: "it is a remote-client-plugin, not a snapshot-plugin".into(),
                    source: None,
                }
                .into())
            }
        };
        let config = plugin.manifest.config.clone();
        let id_owned = id.to_string();
        let pre2 = pre.clone();
        let (got_id, kind, persistence_enabled) = plugin
            .call("open", move |store| {
                Box::pin(async move {
                    let (instance, snap) = match open(&pre2, store, &id_owned, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let api = instance.berth_snapshot_snapshot().snapshot();
                    let got_id = api.call_id(&mut *store, snap).await?;
                    let kind = api.call_kind(&mut *store, snap).await?;
                    let enabled = api.call_persistence_enabled(&mut *store, snap).await?;
                    Ok(Ok((got_id, kind, enabled)))
                })
            })
            .await?;
        if got_id != id {
            return Err(PluginError::ContractViolation {
                plugin: plugin.manifest.name.clone(),
                message: format!("opened with id {id:?}, but id() returned {got_id:?}"),
                source: None,
            }
            .into());
        }
        Ok(WasmSnapshot {
            plugin,
            pre,
            id: got_id,
            kind,
            persistence_enabled,
        })
    }
}

#[async_trait::async_trait]
impl SandboxSnapshot for WasmSnapshot {
    fn id(&self) -> &str {
        &self.id
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn persistence_enabled(&self) -> bool {
        self.persistence_enabled
    }

    /// The store is the plugin's (remote, shared): any host that can load
    /// the plugin can restore from it.
    fn portable(&self) -> bool {
        true
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = self.id.clone();
        self.plugin
            .call_reading("persist", archive, move |store, stream| {
                Box::pin(async move {
                    let (instance, snap) = match open(&pre, store, &id, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_snapshot()
                        .snapshot()
                        .call_persist(&mut *store, snap, stream)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }

    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = self.id.clone();
        self.plugin
            .call_writing("restore", sink, move |store, stream| {
                Box::pin(async move {
                    let (instance, snap) = match open(&pre, store, &id, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_snapshot()
                        .snapshot()
                        .call_restore(&mut *store, snap, stream)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = self.id.clone();
        self.plugin
            .call("is-restorable", move |store| {
                Box::pin(async move {
                    let (instance, snap) = match open(&pre, store, &id, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_snapshot()
                        .snapshot()
                        .call_is_restorable(&mut *store, snap)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }
}
