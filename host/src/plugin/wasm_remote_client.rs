//! [`RemoteSnapshotClient`] over a `remote-client-plugin` component.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use super::bindings::remote::RemoteClientPluginPre;
use super::capability::PluginState;
use super::{LoadedPlugin, Pre};
use crate::plugin_error::PluginError;
use crate::remote_client::RemoteSnapshotClient;
use crate::store_error::{StorageError, StoreError};

/// A remote snapshot client implemented by a Wasm plugin. Every operation
/// runs in a fresh instance: `open(config)` then the method.
#[derive(Clone)]
pub struct WasmRemoteClient {
    plugin: Arc<LoadedPlugin>,
    pre: RemoteClientPluginPre<PluginState>,
}

impl WasmRemoteClient {
    pub(crate) fn new(plugin: Arc<LoadedPlugin>) -> Result<Self, PluginError> {
        match &plugin.pre {
            Pre::Remote(pre) => Ok(WasmRemoteClient {
                pre: pre.clone(),
                plugin,
            }),
            Pre::Snapshot(_) => Err(PluginError::ContractViolation {
                plugin: plugin.manifest.name.clone(),
                message: "it is a snapshot-plugin, not a remote-client-plugin".into(),
                source: None,
            }),
        }
    }

    /// The plugin's name.
    pub fn plugin_name(&self) -> &str {
        &self.plugin.manifest.name
    }
}

/// Instantiates the plugin and opens a client with the manifest's config.
#[allow(clippy::ptr_arg)]
async fn open(
    pre: &RemoteClientPluginPre<PluginState>,
    store: &mut Store<PluginState>,
    config: &Vec<(String, String)>, // the generated binding takes `&Vec`
) -> wasmtime::Result<
    Result<(super::bindings::remote::RemoteClientPlugin, ResourceAny), StorageError>,
> {
    let instance = pre.instantiate_async(&mut *store).await?;
    let opened = instance
        .berth_snapshot_remote_client()
        .client()
        .call_open(&mut *store, config)
        .await?;
    Ok(opened.map(|c| (instance, c)).map_err(StorageError::from))
}

#[async_trait::async_trait]
impl RemoteSnapshotClient for WasmRemoteClient {
    async fn upload(
        &self,
        id: &str,
        data: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = id.to_string();
        self.plugin
            .call_reading("upload", data, move |store, stream| {
                Box::pin(async move {
                    let (instance, client) = match open(&pre, store, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_remote_client()
                        .client()
                        .call_upload(&mut *store, client, &id, stream)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }

    async fn download(
        &self,
        id: &str,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<(), StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = id.to_string();
        self.plugin
            .call_writing("download", sink, move |store, stream| {
                Box::pin(async move {
                    let (instance, client) = match open(&pre, store, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_remote_client()
                        .client()
                        .call_download(&mut *store, client, &id, stream)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }

    async fn exists(&self, id: &str) -> Result<bool, StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = id.to_string();
        self.plugin
            .call("exists", move |store| {
                Box::pin(async move {
                    let (instance, client) = match open(&pre, store, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_remote_client()
                        .client()
                        .call_exists(&mut *store, client, &id)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let pre = self.pre.clone();
        let config = self.plugin.manifest.config.clone();
        let id = id.to_string();
        self.plugin
            .call("delete", move |store| {
                Box::pin(async move {
                    let (instance, client) = match open(&pre, store, &config).await? {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    };
                    let r = instance
                        .berth_snapshot_remote_client()
                        .client()
                        .call_delete(&mut *store, client, &id)
                        .await?;
                    Ok(r.map_err(StorageError::from))
                })
            })
            .await
    }
}
