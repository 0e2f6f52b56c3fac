//! A sandbox's state on disk: one JSON file, replaced atomically, and a lock
//! beside it that serialises lifecycle operations across processes.
//!
//! Agent frameworks issue parallel tool calls against one sandbox. Each
//! process that changes a sandbox (start, stop, a resume that re-creates a
//! container) holds the [`StateLock`] from before it reads the state until
//! after it has written it back, so the second process sees what the first
//! did instead of racing it (two containers, or a `409 Conflict`). Commands
//! may run in parallel once the sandbox is up: take the lock for the resume,
//! drop it before the command.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why reading, writing or locking a state file failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// The file system refused.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The path of a state file, with its lock and atomic replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file at `path` (its lock is `path` with `.lock` appended).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateFile { path: path.into() }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file's path.
    pub fn lock_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Waits for the exclusive lock (an `flock` on the lock file, released
    /// when the [`StateLock`] is dropped or the process dies). A lock
    /// dropped while no state file exists (a name only looked up, a create
    /// that failed, a sandbox removed) removes its lock file: no lock file
    /// outlives the sandbox it guards.
    pub async fn lock(&self) -> Result<StateLock, StateFileError> {
        let path = self.lock_path();
        let state = self.path.clone();
        tokio::task::spawn_blocking(move || {
            StateLock::acquire(&path).map(|mut lock| {
                lock.guarded = Some((state, path));
                lock
            })
        })
        .await
        .map_err(|e| StateFileError::Io {
            what: "waiting for the lock",
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })?
    }

    /// Reads the file's text; `Ok(None)` when it does not exist.
    pub fn read(&self) -> Result<Option<String>, StateFileError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("reading", e)),
        }
    }

    /// Replaces the file with `text` atomically: temp file, fsync, rename,
    /// fsync of the directory. A crash leaves the old or the new file.
    pub fn write(&self, text: &str) -> Result<(), StateFileError> {
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| self.io("creating the directory of", e))?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(|e| self.io("creating a temp file for", e))?;
        tmp.write_all(text.as_bytes())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| self.io("writing", e))?;
        tmp.persist(&self.path)
            .map_err(|e| self.io("replacing", e.error))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Removes the state file and its lock file (call it holding the lock).
    pub fn remove(&self) -> Result<(), StateFileError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io("removing", e)),
        }
        let _ = std::fs::remove_file(self.lock_path());
        Ok(())
    }

    fn io(&self, what: &'static str, source: std::io::Error) -> StateFileError {
        StateFileError::Io {
            what,
            path: self.path.clone(),
            source,
        }
    }
}

/// An exclusive lock on a sandbox's state, held until dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
    /// The state file and lock file: the lock file is removed on drop when
    /// the state file does not exist.
    guarded: Option<(PathBuf, PathBuf)>,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        if let Some((state, lock)) = &self.guarded {
            // Still holding the lock: a waiter that gets it next finds its
            // file unlinked and opens the path again (see `acquire`).
            if !state.exists() {
                let _ = std::fs::remove_file(lock);
            }
        }
    }
}

impl StateLock {
    /// Blocks until the exclusive lock on `path` (created if missing) is
    /// held.
    pub fn acquire(path: &Path) -> Result<StateLock, StateFileError> {
        use std::os::unix::io::AsRawFd;
        let io = |what, source| StateFileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| io("opening the lock", e))?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(io("locking", err));
            }
        }
        // The holder before us may have removed the lock file (its sandbox
        // gone): a lock on an unlinked file excludes nobody, so take the
        // lock on the file now at `path` instead.
        let same = |file: &std::fs::File| {
            use std::os::unix::fs::MetadataExt;
            match (file.metadata(), std::fs::metadata(path)) {
                (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
                _ => false,
            }
        };
        if same(&file) {
            Ok(StateLock {
                _file: file,
                guarded: None,
            })
        } else {
            drop(file);
            Self::acquire(path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_excludes_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("a.json"));
        let first = StateLock::acquire(&file.lock_path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let lock_path = file.lock_path();
        let waiter = std::thread::spawn(move || {
            let _second = StateLock::acquire(&lock_path).unwrap();
            tx.send(()).unwrap();
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(300))
            .is_err());
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        waiter.join().unwrap();
    }

    #[tokio::test]
    async fn no_lock_file_outlives_its_sandbox_and_waiters_still_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("a.json"));
        // A name only looked up leaves nothing behind.
        drop(file.lock().await.unwrap());
        assert!(!file.lock_path().exists());
        // While a sandbox exists its lock file stays.
        let lock = file.lock().await.unwrap();
        file.write("{}").unwrap();
        drop(lock);
        assert!(file.lock_path().exists());
        // Removed under its lock, with waiters queued behind it: each waiter
        // gets the lock in turn, never two at once, and nothing is left.
        let holder = file.lock().await.unwrap();
        let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..4 {
            let (file, inside) = (file.clone(), inside.clone());
            waiters.push(tokio::spawn(async move {
                let _lock = file.lock().await.unwrap();
                assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        file.remove().unwrap();
        drop(holder);
        for w in waiters {
            w.await.unwrap();
        }
        assert!(!file.lock_path().exists());
    }

    #[test]
    fn write_replaces_and_read_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("s/a.json"));
        assert_eq!(file.read().unwrap(), None);
        file.write("one").unwrap();
        file.write("two").unwrap();
        assert_eq!(file.read().unwrap().as_deref(), Some("two"));
        file.remove().unwrap();
        assert_eq!(file.read().unwrap(), None);
    }
}
