//! Extraction: an archive that passed [`filter`](super::filter) written
//! into a workspace without following a symlink out of it, regular files
//! with their holes, small files batched to a writer thread, directory
//! times set last.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::*;

/// Extracts an archive (already passed through [`filter`]) into `root`,
/// never following symlinks out of it. Regular files are written with
/// holes where the archive holds whole blocks of zeros (sparse files come
/// back sparse); directory times are set once everything is in place.
pub fn unpack_into<R: Read>(source: R, root: &Path) -> Result<ArchiveStats, ArchiveError> {
    let mut writer = FileWriter::start()?;
    let unpacked = unpack_with(source, root, &mut writer);
    // The writer's error (a file it could not write) comes first.
    let finished = writer.finish();
    let stats = match (unpacked, finished) {
        (Ok(stats), Ok(())) => stats,
        (_, Err(e)) => return Err(e),
        (Err(e), Ok(())) => return Err(e),
    };
    Ok(stats)
}

// Kept as one function: one pass over the tar stream, with the same running
// state as `archive::filter_under`.
fn unpack_with<R: Read>(
    source: R,
    root: &Path,
    writer: &mut FileWriter,
) -> Result<ArchiveStats, ArchiveError> {
    let mut archive = tar::Archive::new(source);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    let corrupt = |e: io::Error| ArchiveError::Corrupt(describe_tar_error(&e));
    let mut stats = ArchiveStats::default();
    let mut directory_times: Vec<(PathBuf, Timestamp)> = Vec::new();
    let mut destinations = Destinations::new(root)?;
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        stats.entries += 1;
        stats.bytes += entry.size();
        let raw = entry.path_bytes().into_owned();
        let mtime = crate::workspace::tree::pax_mtime(&mut entry).unwrap_or(Timestamp {
            sec: entry.header().mtime().unwrap_or(0) as i64,
            nsec: 0,
        });
        let Some(path) = normalise(&raw)? else {
            // The workspace root: its time, set last.
            if entry.header().entry_type() == tar::EntryType::Directory {
                directory_times.push((PathBuf::new(), mtime));
            }
            continue;
        };
        let target = root.join(&path);
        let kind = entry.header().entry_type();
        if kind != tar::EntryType::Directory {
            destinations.forget(&path);
        }
        // A file replacing an existing symlink must not write through it.
        if kind != tar::EntryType::Directory {
            if let Ok(m) = std::fs::symlink_metadata(&target) {
                if m.file_type().is_symlink() {
                    std::fs::remove_file(&target)?;
                }
            }
        }
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let target = destinations.inside(&path)?;
                let size = entry.size();
                let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
                if size <= HANDED_OFF {
                    let mut data = Vec::with_capacity(size as usize);
                    (&mut entry).take(size).read_to_end(&mut data)?;
                    if data.len() as u64 != size {
                        return Err(ArchiveError::Corrupt(format!(
                            "{} ends after {} of its {size} bytes",
                            path.display(),
                            data.len()
                        )));
                    }
                    writer.write(SmallFile {
                        target,
                        data,
                        mode,
                        mtime,
                    })?;
                } else {
                    write_regular(&mut entry, &target, size, mode, mtime)?;
                }
            }
            _ => {
                // A hardlink needs its file written; anything else might
                // replace a file still queued.
                writer.settle()?;
                if kind == tar::EntryType::Directory {
                    directory_times.push((path.clone(), mtime));
                }
                // `unpack_in` refuses paths that would land outside `root`,
                // including through symlinks already on disk.
                if !entry.unpack_in(root)? {
                    return Err(ArchiveError::ParentTraversal(display(&raw)));
                }
                if kind == tar::EntryType::Symlink {
                    let time = filetime::FileTime::from_unix_time(mtime.sec, mtime.nsec);
                    // A symlink's own time; not every filesystem keeps it.
                    let _ = filetime::set_symlink_file_times(&target, time, time);
                }
            }
        }
    }
    writer.settle()?;
    // Children change their directory's time as they are written: set the
    // recorded times last (deepest first does not matter: setting a time
    // does not touch the parent).
    for (path, mtime) in directory_times {
        let time = filetime::FileTime::from_unix_time(mtime.sec, mtime.nsec);
        let target = root.join(&path);
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            filetime::set_file_times(&target, time, time)?;
        }
    }
    Ok(stats)
}

/// [`unpack_into`] for an async stream, on a blocking thread: what a
/// backend that keeps workspaces in host directories calls from
/// `Backend::write_archive`. Streams; never holds the archive in memory.
pub async fn extract_stream(
    archive: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    root: PathBuf,
) -> Result<ArchiveStats, ArchiveError> {
    let source = crate::byte_pipe::batched_reader(archive);
    tokio::task::spawn_blocking(move || unpack_into(source, &root))
        .await
        .map_err(|e| ArchiveError::Io(io::Error::other(e)))?
}

/// Where entries may be written: `root`, and the directories below it
/// already checked to lead nowhere else (so each is checked once, not once
/// per file in it).
struct Destinations {
    root: PathBuf,
    canonical_root: PathBuf,
    checked: HashSet<PathBuf>,
}

impl Destinations {
    fn new(root: &Path) -> io::Result<Self> {
        Ok(Destinations {
            root: root.to_path_buf(),
            canonical_root: root.canonicalize()?,
            checked: HashSet::new(),
        })
    }

    /// Something other than a directory was written at `rel` (a symlink
    /// above all): no directory at or below it counts as checked.
    fn forget(&mut self, rel: &Path) {
        if self.checked.contains(rel) {
            self.checked.retain(|d| !d.starts_with(rel));
        }
    }

    /// Creates the parent directories of `root/rel` and checks that the
    /// parent, with every symlink already on disk resolved, is still
    /// inside `root`.
    fn inside(&mut self, rel: &Path) -> Result<PathBuf, ArchiveError> {
        let target = self.root.join(rel);
        let outside = || ArchiveError::ThroughSymlink {
            path: rel.display().to_string(),
            link: "a symlink already in the workspace".to_string(),
        };
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        if parent_rel.as_os_str().is_empty() || self.checked.contains(parent_rel) {
            return Ok(target);
        }
        // Create missing ancestors one by one, checking each before the
        // next is made inside it.
        let mut built = self.root.clone();
        let mut built_rel = PathBuf::new();
        for component in parent_rel.components() {
            built.push(component);
            built_rel.push(component);
            if self.checked.contains(&built_rel) {
                continue;
            }
            if std::fs::symlink_metadata(&built).is_err() {
                std::fs::create_dir(&built)?;
            }
            if !built.canonicalize()?.starts_with(&self.canonical_root) {
                return Err(outside());
            }
            self.checked.insert(built_rel.clone());
        }
        Ok(target)
    }
}

/// Size of the blocks that [`write_regular`] checks for zeros: a
/// filesystem block, so a hole made for one is a real hole.
const HOLE_BLOCK: usize = 4096;

/// Writes one regular file's `size` bytes from `data` at `target` (an
/// existing file there replaced), seeking over whole zero blocks instead
/// of writing them, then sets its mode and time.
fn write_regular(
    data: &mut dyn Read,
    target: &Path,
    size: u64,
    mode: u32,
    mtime: Timestamp,
) -> Result<(), ArchiveError> {
    use std::io::Seek;
    use std::os::unix::fs::PermissionsExt;
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => {
            return Err(ArchiveError::Io(io::Error::other(format!(
                "{} is a directory in the workspace but a file in the archive; remove it and retry",
                target.display()
            ))))
        }
        Ok(_) => std::fs::remove_file(target)?,
        Err(_) => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(target)?;
    let mut buffer = vec![0u8; (size as usize).clamp(HOLE_BLOCK, 256 * 1024)];
    let mut filled = 0usize;
    let mut written: u64 = 0;
    loop {
        let n = data.read(&mut buffer[filled..])?;
        filled += n;
        let at_end = n == 0;
        if filled == buffer.len() || (at_end && filled > 0) {
            // Runs of data are written at once; whole zero blocks are
            // skipped (holes).
            let mut offset = 0;
            let mut run = 0;
            while offset < filled {
                let end = (offset + HOLE_BLOCK).min(filled);
                let block = &buffer[offset..end];
                if block.len() == HOLE_BLOCK && block.iter().all(|&b| b == 0) {
                    file.write_all(&buffer[run..offset])?;
                    file.seek(io::SeekFrom::Current(HOLE_BLOCK as i64))?;
                    run = end;
                }
                offset = end;
            }
            file.write_all(&buffer[run..filled])?;
            written += filled as u64;
            filled = 0;
        }
        if at_end {
            break;
        }
    }
    if written != size {
        return Err(ArchiveError::Corrupt(format!(
            "{} ends after {written} of its {size} bytes",
            target.display()
        )));
    }
    // Trailing holes: the length is set, not written.
    if size > 0 && written == size {
        file.set_len(size)?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    let time = filetime::FileTime::from_unix_time(mtime.sec, mtime.nsec);
    filetime::set_file_handle_times(&file, Some(time), Some(time))?;
    Ok(())
}

/// Files this small are read whole and written by the second thread of
/// [`unpack_into`] (file creation, not bytes, limits a restore of many
/// small files); larger ones are streamed by the reading thread.
const HANDED_OFF: u64 = 1 << 20;

/// A small file for the writing thread.
struct SmallFile {
    target: PathBuf,
    data: Vec<u8>,
    mode: u32,
    mtime: Timestamp,
}

/// The second thread of [`unpack_into`]: writes the small files it is
/// handed, in order; a barrier waits until all before it are written.
enum WriterJob {
    File(SmallFile),
    Barrier(std::sync::mpsc::SyncSender<()>),
}

struct FileWriter {
    jobs: Option<std::sync::mpsc::SyncSender<WriterJob>>,
    thread: Option<std::thread::JoinHandle<Result<(), ArchiveError>>>,
}

impl FileWriter {
    fn start() -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<WriterJob>(64);
        let thread = std::thread::Builder::new()
            .name("berth-unpack".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        WriterJob::File(f) => {
                            let size = f.data.len() as u64;
                            write_regular(&mut &f.data[..], &f.target, size, f.mode, f.mtime)?;
                        }
                        WriterJob::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
                Ok(())
            })?;
        Ok(FileWriter {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// The writer's own error, when it stopped.
    fn stopped(&mut self) -> ArchiveError {
        self.jobs = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            _ => ArchiveError::Io(io::Error::other("the file writer stopped")),
        }
    }

    fn write(&mut self, file: SmallFile) -> Result<(), ArchiveError> {
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|j| j.send(WriterJob::File(file)).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.stopped())
        }
    }

    /// Waits until every file handed over so far is written.
    fn settle(&mut self) -> Result<(), ArchiveError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|j| j.send(WriterJob::Barrier(tx)).is_ok());
        if sent && rx.recv().is_ok() {
            Ok(())
        } else {
            Err(self.stopped())
        }
    }

    fn finish(mut self) -> Result<(), ArchiveError> {
        self.jobs = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            _ => Err(ArchiveError::Io(io::Error::other(
                "the file writer panicked",
            ))),
        }
    }
}
