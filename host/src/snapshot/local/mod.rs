//! The local snapshot: a tar file per snapshot id on the host.

mod provider;

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncWrite};

pub use provider::{LocalOptions, LocalProvider};

use super::{DeleteReport, SandboxSnapshot};
use crate::archive_dir::ArchiveDir;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// `<base>/<id>.tar`, base created with mode 0700, replaced atomically.
#[derive(Debug, Clone)]
pub struct LocalSnapshot {
    id: SnapshotId,
    archives: ArchiveDir,
}

impl LocalSnapshot {
    /// The kind's name, in the sandbox state.
    pub const KIND: &'static str = "local";

    /// The snapshot `id` under `base_dir`.
    pub fn new(id: SnapshotId, base_dir: impl Into<PathBuf>) -> Result<Self, StorageError> {
        Ok(LocalSnapshot {
            id,
            archives: ArchiveDir::create(base_dir)?,
        })
    }

    /// Where the archive lives.
    pub fn archive_path(&self) -> PathBuf {
        self.archives.archive_path(&self.id)
    }

    /// The base directory.
    pub fn base_dir(&self) -> &Path {
        self.archives.path()
    }

    /// Unfinished archives under `base_dir` whose writers are gone (a stop
    /// that was killed): files in `base_dir/.partial` no live writer holds
    /// locked. A stop that is cancelled removes its own; a later stop of
    /// the same id, and `delete_stored`, sweep the id's; these are what is
    /// left for `berth gc --orphans`.
    pub fn abandoned_partials(base_dir: &Path) -> Vec<PathBuf> {
        crate::archive_dir::abandoned_partials(base_dir)
    }

    /// Where the archive of snapshot `id` under `base_dir` lives.
    pub fn archive_of(base_dir: &Path, id: &str) -> PathBuf {
        crate::archive_dir::archive_in(base_dir, id)
    }

    /// The whole archives under `base_dir`, sorted.
    pub fn archives_in(base_dir: &Path) -> Vec<PathBuf> {
        crate::archive_dir::archives(base_dir)
    }
}

#[async_trait::async_trait]
impl SandboxSnapshot for LocalSnapshot {
    fn id(&self) -> &str {
        self.id.as_str()
    }

    fn kind(&self) -> &str {
        Self::KIND
    }

    fn persistence_enabled(&self) -> bool {
        true
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        self.archives.write(&self.id, archive).await.map(|_| ())
    }

    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        self.archives.read_into(&self.id, sink).await.map(|_| ())
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        self.archives.contains(&self.id).await
    }

    async fn delete_stored(&self) -> Result<DeleteReport, StoreError> {
        let mut report = DeleteReport::default();
        match self.archives.remove(&self.id).await {
            Ok(()) => report
                .deleted
                .push(self.archive_path().display().to_string()),
            Err(e) if matches!(e.storage(), Some(StorageError::NotFound(_))) => {}
            Err(e) => return Err(e),
        }
        for partial in self.archives.take_abandoned_partials(&self.id) {
            report.deleted.push(partial.display().to_string());
        }
        Ok(report)
    }
}
