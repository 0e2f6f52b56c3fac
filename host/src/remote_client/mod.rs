//! Remote snapshot clients: byte stores keyed by snapshot id, the host-side
//! face of the WIT `remote-client` interface. Wasm plugins implement it
//! through [`crate::plugin::WasmRemoteClient`]; [`DirRemoteClient`] is the
//! native directory implementation held to the same conformance suite.

mod dir;

pub use dir::DirRemoteClient;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::store_error::StoreError;

/// A store of tar streams keyed by snapshot id.
///
/// Ids are passed as plain strings so that a store's own validation is what
/// decides (and what the conformance suite checks); stores must refuse ids
/// outside the grammar with `StorageError::InvalidId`.
#[async_trait::async_trait]
pub trait RemoteSnapshotClient: Send + Sync {
    /// Streams `data` to its end into the archive for `id`; visible only once
    /// complete. A failing `data` reader must leave the previous archive.
    async fn upload(
        &self,
        id: &str,
        data: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError>;

    /// Streams the archive for `id` into `sink` and flushes it.
    async fn download(
        &self,
        id: &str,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<(), StoreError>;

    /// Whether an archive is stored for `id`.
    async fn exists(&self, id: &str) -> Result<bool, StoreError>;

    /// Removes the archive for `id`.
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
}
