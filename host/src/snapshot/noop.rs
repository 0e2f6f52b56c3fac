//! The snapshot that stores nothing.

use tokio::io::{AsyncRead, AsyncWrite};

use super::SandboxSnapshot;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// Persistence disabled: `persist` drains and discards the archive,
/// `restore` fails with not-found, never restorable.
#[derive(Debug, Clone)]
pub struct NoopSnapshot {
    id: SnapshotId,
}

impl NoopSnapshot {
    /// A noop snapshot named `id`.
    pub fn new(id: SnapshotId) -> Self {
        NoopSnapshot { id }
    }
}

#[async_trait::async_trait]
impl SandboxSnapshot for NoopSnapshot {
    fn id(&self) -> &str {
        self.id.as_str()
    }

    fn kind(&self) -> &str {
        "noop"
    }

    fn persistence_enabled(&self) -> bool {
        false
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        tokio::io::copy(archive, &mut tokio::io::sink())
            .await
            .map_err(StoreError::Source)?;
        Ok(())
    }

    async fn restore(&self, _sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        Err(StorageError::NotFound(format!(
            "snapshot {:?} is a noop snapshot: persistence is disabled, nothing was stored",
            self.id.as_str()
        ))
        .into())
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn delete_stored(&self) -> Result<super::DeleteReport, StoreError> {
        Ok(super::DeleteReport::default())
    }
}
