//! The remote snapshot: one id in a remote snapshot client.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::{DeleteReport, SandboxSnapshot};
use crate::remote_client::RemoteSnapshotClient;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// Delegates to a [`RemoteSnapshotClient`] under a fixed id.
#[derive(Clone)]
pub struct RemoteSnapshot {
    id: SnapshotId,
    client: Arc<dyn RemoteSnapshotClient>,
}

impl RemoteSnapshot {
    /// The snapshot `id` stored through `client`.
    pub fn new(id: SnapshotId, client: Arc<dyn RemoteSnapshotClient>) -> Self {
        RemoteSnapshot { id, client }
    }
}

#[async_trait::async_trait]
impl SandboxSnapshot for RemoteSnapshot {
    fn id(&self) -> &str {
        self.id.as_str()
    }

    fn kind(&self) -> &str {
        "remote"
    }

    fn persistence_enabled(&self) -> bool {
        true
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
        self.client.upload(self.id.as_str(), archive).await
    }

    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        self.client.download(self.id.as_str(), sink).await
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        self.client.exists(self.id.as_str()).await
    }

    async fn delete_stored(&self) -> Result<DeleteReport, StoreError> {
        let mut report = DeleteReport::default();
        match self.client.delete(self.id.as_str()).await {
            Ok(()) => report.deleted.push(self.id.as_str().to_string()),
            Err(e) if matches!(e.storage(), Some(StorageError::NotFound(_))) => {}
            Err(e) => return Err(e),
        }
        Ok(report)
    }
}
