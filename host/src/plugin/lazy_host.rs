//! A plugin host made on first use, so a client that never loads a
//! plugin never builds a Wasm engine.

use std::sync::Arc;

use super::PluginHost;
use crate::plugin_error::PluginError;

/// A client's plugin host, made on first use and shared by its sandboxes
/// and its plugin snapshot kinds.
#[derive(Debug, Clone, Default)]
pub struct LazyPluginHost(Arc<tokio::sync::OnceCell<PluginHost>>);

impl LazyPluginHost {
    /// A lazy host that is `host` from the start.
    pub fn with(host: PluginHost) -> Self {
        let cell = tokio::sync::OnceCell::new();
        let _ = cell.set(host);
        LazyPluginHost(Arc::new(cell))
    }

    /// The host, made now if it was not yet.
    pub async fn get(&self) -> Result<&PluginHost, PluginError> {
        self.0.get_or_try_init(|| async { PluginHost::new() }).await
    }
}
