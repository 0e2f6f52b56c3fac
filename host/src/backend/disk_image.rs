//! A workspace's disk quota: a sparse ext4 image of the quota's size,
//! made for the sandbox and mounted (loop, `nosuid`, `nodev`, `discard`)
//! where its workspace lives. A command that fills it gets `ENOSPC`; the
//! host's disk, the snapshot spool and the other sandboxes do not notice.
//!
//! Why an image: it bounds a workspace on any host filesystem (ext4 and
//! overlay2 here, where `--storage-opt size` and project quotas are not
//! available), needs nothing from the engine, and costs one `mkfs.ext4`
//! (about 20 ms; the image is sparse) at the first start and one `mount`
//! (about 20 ms) then and after a reboot. The host pays only for the blocks the workspace holds
//! (`discard` gives deleted ones back). `mkfs.ext4` (e2fsprogs) and
//! `mount`/`umount` (util-linux) do the work: there is no library for
//! making an ext4 filesystem, and mounting through `mount(8)` sets up and
//! releases the loop device as every admin tool does. Mounting needs root;
//! without it a bounded sandbox fails closed, naming `disk=unlimited`.

use std::path::{Path, PathBuf};

use super::BackendError;

/// The smallest quota an image can hold a filesystem in.
pub const MIN_BYTES: u64 = 16 << 20;

/// One sandbox's image and where it is mounted (kept in the sandbox's
/// state, so a resumed sandbox mounts the same one).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskImage {
    /// The image file.
    pub image: PathBuf,
    /// Where the workspace is: the image's mount point.
    pub mount_point: PathBuf,
    /// The quota, in bytes.
    pub bytes: u64,
    /// The owner (uid, gid) of the filesystem's root, for a workspace
    /// whose commands do not run as root. `None`: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<(u32, u32)>,
}

/// Why a quota cannot be kept, for [`BackendError::Unconfined`].
fn unbounded(backend: &'static str, cause: String) -> BackendError {
    BackendError::Unbounded {
        backend,
        cause: format!("the workspace's disk: {cause}"),
        remedy: "run Berth as root on a host with loop devices, mkfs.ext4 and mount; \
                 or give the sandbox `disk=unlimited` (`-o disk=unlimited`) to leave its workspace unbounded"
            .into(),
    }
}

/// Checks a quota before anything is made.
pub fn check_size(backend: &'static str, bytes: u64) -> Result<(), BackendError> {
    if bytes < MIN_BYTES {
        return Err(BackendError::Config {
            backend,
            message: format!(
                "disk: {} is too small for a filesystem; give at least {}, or `unlimited`",
                crate::units::size_text(bytes),
                crate::units::size_text(MIN_BYTES)
            ),
        });
    }
    Ok(())
}

async fn run(
    backend: &'static str,
    program: &str,
    args: &[&std::ffi::OsStr],
) -> Result<(), BackendError> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| unbounded(backend, format!("running {program}: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    Err(unbounded(
        backend,
        format!("{program} failed ({}): {}", output.status, said.trim()),
    ))
}

/// The mount at exactly `dir`, as `/proc/self/mountinfo` lists it: its
/// source device.
fn mounted_source(dir: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = std::fs::canonicalize(dir).ok()?;
    // Fields: id parent major:minor root mount-point options ... - type source ...
    table.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        let point = point
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\134", "\\");
        (Path::new(&point) == dir).then(|| right.split(' ').nth(1).unwrap_or("").to_string())
    })
}

/// The file behind loop device `device` (`/dev/loop3`).
fn loop_backing_file(device: &str) -> Option<PathBuf> {
    let name = Path::new(device).file_name()?.to_str()?;
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim().trim_end_matches(" (deleted)")))
}

/// What [`DiskImage::ensure_mounted`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mounted {
    /// It was mounted already.
    Already,
    /// The image was there and is mounted again (after a reboot).
    Again,
    /// There was no image: a new, empty one is mounted. Whatever held
    /// the old one (a container's bind mount) holds a workspace that is
    /// gone.
    New,
}

impl DiskImage {
    /// Whether this image is mounted at its mount point. Another
    /// filesystem mounted there is an error.
    pub fn is_mounted(&self, backend: &'static str) -> Result<bool, BackendError> {
        let Some(source) = mounted_source(&self.mount_point) else {
            return Ok(false);
        };
        let image = std::fs::canonicalize(&self.image).unwrap_or_else(|_| self.image.clone());
        match loop_backing_file(&source) {
            Some(file) if file == image => Ok(true),
            other => Err(unbounded(
                backend,
                format!(
                    "{} is already a mount point of {source}{}, not of this sandbox's image {}; unmount it",
                    self.mount_point.display(),
                    other.map(|f| format!(" ({})", f.display())).unwrap_or_default(),
                    self.image.display()
                ),
            )),
        }
    }

    /// Refuses a mount point that holds files (the image would hide
    /// them) and is not this image's mount already.
    pub fn check_mount_point(&self, backend: &'static str) -> Result<(), BackendError> {
        if self.is_mounted(backend)? {
            return Ok(());
        }
        let holds_files = std::fs::read_dir(&self.mount_point)
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false);
        if holds_files {
            return Err(BackendError::Config {
                backend,
                message: format!(
                    "{} already holds files, which the workspace's disk image would hide when mounted there: \
                     move them, choose another workspace directory, or give the sandbox `disk=unlimited`",
                    self.mount_point.display()
                ),
            });
        }
        Ok(())
    }

    /// Mounts the image at its mount point, making both first where they
    /// do not exist. Does nothing when it is mounted already. A mount
    /// point that holds files is refused (they would be hidden).
    pub async fn ensure_mounted(&self, backend: &'static str) -> Result<Mounted, BackendError> {
        if self.is_mounted(backend)? {
            return Ok(Mounted::Already);
        }
        let io = |what: &str, path: &Path, e: std::io::Error| {
            unbounded(backend, format!("{what} {}: {e}", path.display()))
        };
        if let Some(parent) = self.image.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io("making", parent, e))?;
        }
        // One process mounts it: the server and a CLI command resuming
        // the same sandbox at once would otherwise mount it twice.
        let lock_path = self.image.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("opening", &lock_path, e))?;
        let lock = tokio::task::spawn_blocking(move || {
            crate::archive_dir::lock_exclusive(&lock, false).map(|()| lock)
        })
        .await
        .map_err(|e| unbounded(backend, format!("locking {}: {e}", lock_path.display())))?
        .map_err(|e| io("locking", &lock_path, e))?;
        if self.is_mounted(backend)? {
            return Ok(Mounted::Already);
        }
        self.check_mount_point(backend)?;
        tokio::fs::create_dir_all(&self.mount_point)
            .await
            .map_err(|e| io("making", &self.mount_point, e))?;
        let made = !self.image.exists();
        if made {
            self.make(backend).await?;
        }
        run(
            backend,
            "mount",
            &[
                "-o".as_ref(),
                "loop,nosuid,nodev,discard".as_ref(),
                self.image.as_os_str(),
                self.mount_point.as_os_str(),
            ],
        )
        .await?;
        if made {
            // The workspace starts empty: mkfs's lost+found is not the
            // agent's (fsck makes it again if it ever needs it).
            let _ = tokio::fs::remove_dir(self.mount_point.join("lost+found")).await;
        }
        tracing::debug!(image = %self.image.display(), at = %self.mount_point.display(), "workspace disk mounted");
        drop(lock);
        Ok(if made { Mounted::New } else { Mounted::Again })
    }

    /// Makes the sparse image and its filesystem.
    async fn make(&self, backend: &'static str) -> Result<(), BackendError> {
        let partial = self.image.with_extension("part");
        let file = std::fs::File::create(&partial)
            .and_then(|f| f.set_len(self.bytes).map(|()| f))
            .map_err(|e| unbounded(backend, format!("making {}: {e}", partial.display())))?;
        drop(file);
        let (uid, gid) = self.owner.unwrap_or((0, 0));
        let extended = format!("lazy_itable_init=1,lazy_journal_init=1,root_owner={uid}:{gid}");
        let made = run(
            backend,
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                "-m".as_ref(),
                "0".as_ref(),
                "-L".as_ref(),
                "berth-workspace".as_ref(),
                "-E".as_ref(),
                extended.as_ref(),
                partial.as_os_str(),
            ],
        )
        .await;
        if let Err(e) = made {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &self.image)
            .map_err(|e| unbounded(backend, format!("naming {}: {e}", self.image.display())))
    }

    /// A stable name for the filesystem the workspace is: the image
    /// file's device, inode and birth time (another image is another
    /// workspace; a remount after a reboot is the same one).
    pub fn identity(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&self.image).ok()?;
        let born = m
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Some(format!("disk:{}:{}:{born}", m.dev(), m.ino()))
    }

    /// Unmounts the image (waiting a little for processes that are
    /// ending, then detaching lazily) and deletes it.
    pub async fn remove(&self, backend: &'static str) -> Result<(), BackendError> {
        let mut attempts = 0;
        while self.is_mounted(backend).unwrap_or(false) {
            attempts += 1;
            let lazy = attempts > 20;
            let mut args: Vec<&std::ffi::OsStr> = Vec::new();
            if lazy {
                args.push("-l".as_ref());
            }
            args.push(self.mount_point.as_os_str());
            match run(backend, "umount", &args).await {
                Ok(()) => break,
                Err(e) if lazy => return Err(e),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
        let _ = tokio::fs::remove_file(self.image.with_extension("lock")).await;
        match tokio::fs::remove_file(&self.image).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BackendError::Operation {
                backend,
                operation: "removing the workspace's disk image",
                source: e.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_too_small_for_a_filesystem_is_refused_naming_the_minimum() {
        let e = check_size("local backend", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("16MiB") && e.contains("unlimited"), "{e}");
        assert!(check_size("local backend", MIN_BYTES).is_ok());
    }

    #[test]
    fn an_unmounted_directory_has_no_source() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(mounted_source(dir.path()), None);
        assert!(mounted_source(Path::new("/")).is_some());
    }
}
