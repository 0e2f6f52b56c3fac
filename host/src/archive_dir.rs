//! A directory of `<id>.tar` archives with atomic replacement: the storage
//! under both the native directory remote client and the local snapshot.
//!
//! New data goes to `<dir>/.partial/<random>`, is fsynced, then renamed over
//! `<dir>/<id>.tar`, and the directory is fsynced, so a crash or a broken
//! input stream at any point leaves either the old archive or the new one,
//! never a torn file. No id can name `.partial` (ids map to `*.tar`).

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::random_id::random_u64;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// Partial files older than this belong to writers that died.
const STALE_PARTIAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Bytes moved per read or write when streaming archives.
pub(crate) const COPY_CHUNK: usize = 256 * 1024;

/// A directory holding one `<id>.tar` file per snapshot.
#[derive(Debug, Clone)]
pub(crate) struct ArchiveDir {
    dir: PathBuf,
}

impl ArchiveDir {
    /// Opens (creating with mode 0700 when missing) the directory `dir`.
    pub(crate) fn create(dir: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join(".partial"))
            .map_err(|e| {
                StorageError::Io(format!(
                    "cannot create snapshot directory {}: {e}",
                    dir.display()
                ))
            })?;
        // An existing directory keeps its mode only if it is already private.
        if let Ok(meta) = std::fs::metadata(&dir) {
            if meta.permissions().mode() & 0o077 != 0 {
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            }
        }
        Ok(ArchiveDir { dir })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Where the archive of `id` lives.
    pub(crate) fn archive_path(&self, id: &SnapshotId) -> PathBuf {
        self.dir.join(format!("{id}.tar"))
    }

    /// Streams `source` to its end into a new archive for `id`, replacing any
    /// previous one only once everything is on disk.
    pub(crate) async fn write(
        &self,
        id: &SnapshotId,
        source: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<u64, StoreError> {
        let temp = self
            .dir
            .join(".partial")
            .join(format!("{id}.{:016x}", random_u64()));
        let result = self.write_temp_then_commit(id, &temp, source).await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&temp).await;
        }
        result
    }

    async fn write_temp_then_commit(
        &self,
        id: &SnapshotId,
        temp: &Path,
        source: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<u64, StoreError> {
        let mut file = tokio::fs::File::create(temp)
            .await
            .map_err(|e| io_error("creating the archive file", temp, e))?;
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut total = 0u64;
        let started = std::time::Instant::now();
        loop {
            let n = source.read(&mut buf).await.map_err(StoreError::Source)?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n])
                .await
                .map_err(|e| io_error("writing the archive file", temp, e))?;
            total += n as u64;
        }
        let written = started.elapsed();
        file.sync_all()
            .await
            .map_err(|e| io_error("syncing the archive file", temp, e))?;
        // Where a local archive's time goes, for `RUST_LOG=berth=debug`.
        tracing::debug!(
            stream_ms = written.as_secs_f64() * 1e3,
            sync_ms = (started.elapsed() - written).as_secs_f64() * 1e3,
            bytes = total,
            "archive written"
        );
        drop(file);
        let target = self.archive_path(id);
        tokio::fs::rename(temp, &target)
            .await
            .map_err(|e| io_error("committing the archive", &target, e))?;
        // Make the rename itself durable.
        if let Ok(dir) = tokio::fs::File::open(&self.dir).await {
            let _ = dir.sync_all().await;
        }
        self.sweep_stale_partials(id).await;
        Ok(total)
    }

    /// Removes partial files of `id` left by writers that were killed.
    /// Only files older than [`STALE_PARTIAL`] go, so a concurrent writer
    /// of the same id is never cut off.
    async fn sweep_stale_partials(&self, id: &SnapshotId) {
        let Ok(mut entries) = tokio::fs::read_dir(self.dir.join(".partial")).await else {
            return;
        };
        let prefix = format!("{id}.");
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            // `<id>.<16 hex digits>`: the suffix keeps `a` from matching `a.b`'s files.
            let ours = name.strip_prefix(&prefix).is_some_and(|rest| {
                rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if !ours {
                continue;
            }
            let old = entry
                .metadata()
                .await
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_PARTIAL);
            if old {
                tracing::info!(file = %entry.path().display(), "removing a stale partial archive");
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
    }

    /// Streams the archive of `id` into `sink` and flushes it.
    pub(crate) async fn read_into(
        &self,
        id: &SnapshotId,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<u64, StoreError> {
        let path = self.archive_path(id);
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(format!(
                    "no snapshot {id:?} in {}",
                    self.dir.display()
                ))
                .into())
            }
            Err(e) => return Err(io_error("opening the archive", &path, e)),
        };
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut total = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| io_error("reading the archive", &path, e))?;
            if n == 0 {
                break;
            }
            sink.write_all(&buf[..n]).await.map_err(StoreError::Sink)?;
            total += n as u64;
        }
        sink.flush().await.map_err(StoreError::Sink)?;
        Ok(total)
    }

    /// Whether an archive exists for `id`.
    pub(crate) async fn contains(&self, id: &SnapshotId) -> Result<bool, StoreError> {
        let path = self.archive_path(id);
        match tokio::fs::metadata(&path).await {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error("checking the archive", &path, e)),
        }
    }

    /// Removes the archive of `id`.
    pub(crate) async fn remove(&self, id: &SnapshotId) -> Result<(), StoreError> {
        let path = self.archive_path(id);
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StorageError::NotFound(format!(
                "no snapshot {id:?} in {}",
                self.dir.display()
            ))
            .into()),
            Err(e) => Err(io_error("removing the archive", &path, e)),
        }
    }
}

fn io_error(what: &str, path: &Path, e: io::Error) -> StoreError {
    let message = format!("{what} {}: {e}", path.display());
    if e.kind() == io::ErrorKind::PermissionDenied {
        StorageError::Denied(message).into()
    } else {
        StorageError::Io(message).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_sweeps_only_stale_partials_of_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let archives = ArchiveDir::create(dir.path()).unwrap();
        let partial = dir.path().join(".partial");
        let stale = partial.join("snap.00000000000000aa");
        let fresh = partial.join("snap.00000000000000bb");
        let other = partial.join("snap.b.00000000000000cc");
        for p in [&stale, &fresh, &other] {
            std::fs::write(p, b"leftover").unwrap();
        }
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for p in [&stale, &other] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
        let id = SnapshotId::parse("snap").unwrap();
        archives.write(&id, &mut &b"archive"[..]).await.unwrap();
        assert!(!stale.exists(), "a stale partial of the id survived");
        assert!(
            fresh.exists(),
            "a recent partial (maybe a live writer) was removed"
        );
        assert!(other.exists(), "another id's partial was removed");
    }
}
