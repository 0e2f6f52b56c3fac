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
        archive_in(&self.dir, id.as_str())
    }

    /// Streams `source` to its end into a new archive for `id`, replacing any
    /// previous one only once everything is on disk.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future part-way removes the partial file; a writer that
    /// is killed leaves it, unlocked, for [`abandoned_partials`] to find.
    pub(crate) async fn write(
        &self,
        id: &SnapshotId,
        source: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<u64, StoreError> {
        let temp = PartialFile(
            self.dir
                .join(".partial")
                .join(format!("{id}.{:016x}", random_u64())),
        );
        self.write_temp_then_commit(id, &temp.0, source).await
        // `temp` drops here: after a commit there is nothing left to remove.
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
        // Held until the rename: a partial file nobody holds is abandoned.
        lock_exclusive(&file, false).map_err(|e| io_error("locking the archive file", temp, e))?;
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
        let target = self.archive_path(id);
        tokio::fs::rename(temp, &target)
            .await
            .map_err(|e| io_error("committing the archive", &target, e))?;
        drop(file);
        // Make the rename itself durable.
        if let Ok(dir) = tokio::fs::File::open(&self.dir).await {
            let _ = dir.sync_all().await;
        }
        self.sweep_abandoned_partials(id);
        Ok(total)
    }

    /// Removes partial files of `id` left by writers that were killed
    /// (files no live writer holds locked).
    fn sweep_abandoned_partials(&self, id: &SnapshotId) {
        for path in self.take_abandoned_partials(id) {
            tracing::info!(file = %path.display(), "removed a partial archive a killed stop left");
        }
    }

    /// Removes the partial files of `id` no live writer holds; returns them.
    pub(crate) fn take_abandoned_partials(&self, id: &SnapshotId) -> Vec<PathBuf> {
        let prefix = format!("{id}.");
        let mut removed = Vec::new();
        for path in abandoned_partials(&self.dir) {
            let ours = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(&prefix))
                // `<id>.<16 hex digits>`: the suffix keeps `a` from matching `a.b`'s files.
                .is_some_and(|rest| {
                    rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit())
                });
            if ours && std::fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
        }
        removed
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

/// A partial archive being written: removed when dropped (a failed or
/// cancelled write; after a commit the path no longer exists).
struct PartialFile(PathBuf);

impl Drop for PartialFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => tracing::debug!(file = %self.0.display(), "removed an unfinished archive"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %self.0.display(), error = %e, "removing an unfinished archive failed; `berth gc --orphans` finds it")
            }
        }
    }
}

/// Takes an exclusive `flock` on `file`; with `try_only`, fails at once
/// with `WouldBlock` if another open file holds one.
pub(crate) fn lock_exclusive(file: &impl std::os::fd::AsRawFd, try_only: bool) -> io::Result<()> {
    let flags = libc::LOCK_EX | if try_only { libc::LOCK_NB } else { 0 };
    // SAFETY: flock on a descriptor the caller owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The partial archives under `dir/.partial` whose writers are gone: files
/// no process holds locked (a writer holds its file locked until it
/// commits or removes it), sorted.
/// `<dir>/<id>.tar`: the one place the archive layout is spelled.
pub(crate) fn archive_in(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.tar"))
}

/// The whole archives in `dir` (its `<id>.tar` files), sorted.
pub(crate) fn archives(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar") && p.is_file())
        .collect();
    found.sort();
    found
}

pub(crate) fn abandoned_partials(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join(".partial")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|path| {
            let Ok(file) = std::fs::File::open(path) else {
                return false;
            };
            file.metadata().is_ok_and(|m| m.is_file()) && lock_exclusive(&file, true).is_ok()
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_sweeps_only_abandoned_partials_of_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let archives = ArchiveDir::create(dir.path()).unwrap();
        let partial = dir.path().join(".partial");
        let abandoned = partial.join("snap.00000000000000aa");
        let live = partial.join("snap.00000000000000bb");
        let other = partial.join("snap.b.00000000000000cc");
        for p in [&abandoned, &live, &other] {
            std::fs::write(p, b"leftover").unwrap();
        }
        // A writer still at work holds its file locked.
        let writer = std::fs::File::open(&live).unwrap();
        lock_exclusive(&writer, false).unwrap();
        assert_eq!(
            abandoned_partials(dir.path()),
            vec![abandoned.clone(), other.clone()]
        );
        let id = SnapshotId::parse("snap").unwrap();
        archives.write(&id, &mut &b"archive"[..]).await.unwrap();
        assert!(
            !abandoned.exists(),
            "an abandoned partial of the id survived"
        );
        assert!(live.exists(), "a live writer's partial was removed");
        assert!(other.exists(), "another id's partial was removed");
        drop(writer);
        assert_eq!(abandoned_partials(dir.path()), vec![live, other]);
    }

    /// A source that yields `n` bytes, then never ends.
    struct Endless(usize);

    impl AsyncRead for Endless {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            if self.0 == 0 {
                return std::task::Poll::Pending;
            }
            let n = self.0.min(buf.remaining());
            buf.put_slice(&vec![7u8; n]);
            self.0 -= n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_cancelled_write_leaves_neither_a_partial_nor_an_archive() {
        let dir = tempfile::tempdir().unwrap();
        let archives = ArchiveDir::create(dir.path()).unwrap();
        let id = SnapshotId::parse("snap").unwrap();
        let mut source = Endless(3 * COPY_CHUNK + 5);
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            archives.write(&id, &mut source),
        )
        .await;
        assert!(cut.is_err(), "the endless write finished");
        let left: Vec<_> = std::fs::read_dir(dir.path().join(".partial"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "a cancelled write left {left:?}");
        assert!(!archives.contains(&id).await.unwrap());
    }
}
