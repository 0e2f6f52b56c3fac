//! The native directory remote client: the reference the `fs-store` plugin
//! is compared against.

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncWrite};

use super::RemoteSnapshotClient;
use crate::archive_dir::ArchiveDir;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// Stores archives as `<dir>/<id>.tar` on the host file system.
#[derive(Debug, Clone)]
pub struct DirRemoteClient {
    archives: ArchiveDir,
}

impl DirRemoteClient {
    /// A client over `dir`, created with mode 0700 if missing.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, StorageError> {
        Ok(DirRemoteClient {
            archives: ArchiveDir::create(dir)?,
        })
    }
}

fn parse(id: &str) -> Result<SnapshotId, StorageError> {
    SnapshotId::parse(id).map_err(|e| StorageError::InvalidId(e.to_string()))
}

#[async_trait::async_trait]
impl RemoteSnapshotClient for DirRemoteClient {
    async fn upload(
        &self,
        id: &str,
        data: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let id = parse(id)?;
        self.archives.write(&id, data).await.map(|_| ())
    }

    async fn download(
        &self,
        id: &str,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<(), StoreError> {
        let id = parse(id)?;
        self.archives.read_into(&id, sink).await.map(|_| ())
    }

    async fn exists(&self, id: &str) -> Result<bool, StoreError> {
        let id = parse(id)?;
        self.archives.contains(&id).await
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let id = parse(id)?;
        self.archives.remove(&id).await
    }
}
