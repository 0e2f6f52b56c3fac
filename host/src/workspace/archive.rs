//! Workspace archives: streaming tar out of a directory, and the filter every
//! archive passes before it may reach a workspace.
//!
//! # Hydrate policy
//!
//! An archive is checked entry by entry, from its headers, before any of its
//! content is written:
//!
//! - paths are relative; absolute paths and `..` components are refused;
//! - only regular files (sparse ones included), directories, symlinks and
//!   hardlinks are allowed: device nodes, fifos and unknown entry types are
//!   refused. A GNU sparse entry is re-emitted as a regular file of its full
//!   size; extraction on the local backend turns runs of zero blocks back
//!   into holes, so whatever [`pack_dir`] writes, the filter accepts;
//! - no entry may be written *through* a symlink the archive created (e.g.
//!   `link -> /etc` followed by `link/passwd`), nor replace such a symlink;
//! - symlinks themselves are kept, whatever they point at (virtualenvs need
//!   links out of the workspace), and are never followed during extraction;
//! - a hardlink must point at a regular file earlier in the same archive;
//! - setuid, setgid and sticky bits are stripped (mode & 0o777);
//! - the declared sizes (a sparse file's full size) and the entry count are
//!   capped ([`ArchiveLimits`]), so a size bomb is refused from its header.
//!
//! [`filter`] enforces this and re-emits a clean archive; the sandbox runs it
//! once over a spooled copy to validate the whole archive, then again while
//! extracting, so an archive with a bad entry anywhere writes nothing.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

pub use super::entry_path::ArchiveError;
use super::entry_path::{display, normalise};
use crate::byte_pipe::{self, PipeReader};
use crate::workspace::tree::{EntryKind, Timestamp, TreeEntry};

pub use super::limits::ArchiveLimits;

/// What a filtered archive held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Entries passed through.
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

/// Validates `source` and, if `sink` is given, writes a clean copy to it.
pub fn filter<R: Read, W: Write>(
    source: R,
    sink: Option<W>,
    limits: ArchiveLimits,
) -> Result<ArchiveStats, ArchiveError> {
    filter_under(source, sink, limits, None)
}

/// [`filter`], with every path of the clean copy (hardlink targets too)
/// under the directory `prefix`, which comes first (a staging directory a
/// backend extracts into and moves into place once all of it passed).
// Kept as one function: one pass over the tar stream: every check (paths, the
// symlinks and files met so far, caps) reads state built from the entries
// before it.
pub fn filter_under<R: Read, W: Write>(
    source: R,
    sink: Option<W>,
    limits: ArchiveLimits,
    prefix: Option<&Path>,
) -> Result<ArchiveStats, ArchiveError> {
    let mut archive = tar::Archive::new(source);
    let mut out = sink.map(|w| CleanWriter { out: w });
    let under = |p: &Path| -> Vec<u8> {
        match prefix {
            Some(dir) => dir.join(p).into_os_string().into_vec(),
            None => p.as_os_str().as_bytes().to_vec(),
        }
    };
    let prefix_entry = |mtime: Timestamp| TreeEntry {
        path: prefix
            .map(|d| d.as_os_str().as_bytes().to_vec())
            .unwrap_or_default(),
        kind: EntryKind::Dir,
        mode: 0o700,
        size: 0,
        mtime,
        link: Vec::new(),
        identity: None,
    };
    if let (Some(o), Some(_)) = (out.as_mut(), prefix) {
        o.entry(&prefix_entry(Timestamp::default()), None)?;
    }
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut files: HashSet<PathBuf> = HashSet::new();
    let mut stats = ArchiveStats::default();
    let corrupt = |e: io::Error| ArchiveError::Corrupt(describe_tar_error(&e));

    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(ArchiveError::TooManyEntries(limits.max_entries));
        }
        let raw = entry.path_bytes().into_owned();
        let header = entry.header().clone();
        let mtime = crate::workspace::tree::pax_mtime(&mut entry).unwrap_or(Timestamp {
            sec: header.mtime().unwrap_or(0) as i64,
            nsec: 0,
        });
        let Some(path) = normalise(&raw)? else {
            // "." itself: only its time is kept (a directory's mode is
            // the workspace's own).
            if header.entry_type() == tar::EntryType::Directory {
                if let Some(o) = out.as_mut() {
                    let mut root = prefix_entry(mtime);
                    if prefix.is_none() {
                        root.mode = header.mode().map_err(corrupt)? & 0o777 | 0o700;
                    }
                    o.entry(&root, None)?;
                }
            }
            continue;
        };
        // Nothing may go through, or replace, a symlink this archive made.
        for ancestor in path.ancestors().skip(1) {
            if symlinks.contains(ancestor) {
                return Err(ArchiveError::ThroughSymlink {
                    path: display(&raw),
                    link: ancestor.display().to_string(),
                });
            }
        }
        if symlinks.contains(&path) {
            return Err(ArchiveError::ThroughSymlink {
                path: display(&raw),
                link: path.display().to_string(),
            });
        }
        let kind = header.entry_type();
        // The entry's full size: for a GNU sparse entry, holes included.
        let size = entry.size();
        let mode = header.mode().map_err(corrupt)? & 0o777;
        let clean = |kind: EntryKind, mode: u32, size: u64, link: Vec<u8>| TreeEntry {
            path: under(&path),
            kind,
            mode,
            size,
            mtime,
            link,
            identity: None,
        };
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous | T::GNUSparse => {
                stats.bytes = stats.bytes.saturating_add(size);
                if stats.bytes > limits.max_bytes {
                    return Err(ArchiveError::TooLarge(limits.max_bytes));
                }
                files.insert(path.clone());
                match out.as_mut() {
                    Some(o) => o.entry(
                        &clean(EntryKind::File, mode, size, Vec::new()),
                        Some(&mut entry),
                    )?,
                    None => {
                        io::copy(&mut entry, &mut io::sink()).map_err(corrupt)?;
                    }
                }
            }
            T::Directory => {
                files.remove(&path);
                if let Some(o) = out.as_mut() {
                    o.entry(&clean(EntryKind::Dir, mode | 0o700, 0, Vec::new()), None)?;
                }
            }
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| {
                        ArchiveError::Corrupt(format!("symlink {} has no target", display(&raw)))
                    })?;
                files.remove(&path);
                symlinks.insert(path.clone());
                if let Some(o) = out.as_mut() {
                    o.entry(&clean(EntryKind::Symlink, 0o777, 0, target), None)?;
                }
            }
            T::Link => {
                let target_raw = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = normalise(&target_raw).map_err(|_| ArchiveError::HardlinkOutside {
                    path: display(&raw),
                    target: display(&target_raw),
                })?;
                match target {
                    Some(t) if files.contains(&t) => {
                        files.insert(path.clone());
                        if let Some(o) = out.as_mut() {
                            o.entry(&clean(EntryKind::Hardlink, mode, 0, under(&t)), None)?;
                        }
                    }
                    _ => {
                        return Err(ArchiveError::HardlinkOutside {
                            path: display(&raw),
                            target: display(&target_raw),
                        })
                    }
                }
            }
            T::Char => return Err(special(&raw, "character device")),
            T::Block => return Err(special(&raw, "block device")),
            T::Fifo => return Err(special(&raw, "fifo")),
            _ => return Err(special(&raw, "special or unknown entry type")),
        }
    }
    if let Some(o) = out {
        o.finish()?;
    }
    Ok(stats)
}

/// Writes a clean archive: every header rendered by
/// [`render_header`](crate::workspace::tree::render_header), so times keep
/// their nanoseconds.
struct CleanWriter<W: Write> {
    out: W,
}

impl<W: Write> CleanWriter<W> {
    fn entry(
        &mut self,
        entry: &TreeEntry,
        data: Option<&mut dyn Read>,
    ) -> Result<(), ArchiveError> {
        self.out
            .write_all(&crate::workspace::tree::render_header(entry)?)?;
        if let Some(data) = data {
            let copied = io::copy(&mut data.take(entry.size), &mut self.out)?;
            if copied != entry.size {
                return Err(ArchiveError::Corrupt(format!(
                    "{} ends after {copied} of its {} bytes",
                    String::from_utf8_lossy(&entry.path),
                    entry.size
                )));
            }
            let pad = crate::workspace::tree::padding(entry.size) as usize;
            self.out.write_all(&[0u8; 512][..pad])?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), ArchiveError> {
        self.out
            .write_all(&[0u8; crate::workspace::tree::END_OF_ARCHIVE])?;
        self.out.flush()?;
        Ok(())
    }
}

fn special(raw: &[u8], kind: &'static str) -> ArchiveError {
    ArchiveError::SpecialFile {
        path: display(raw),
        kind,
    }
}

/// Streams a tar of `root` (paths relative to `.`), leaving out `exclude`
/// (relative paths; a directory excludes its whole subtree). Entries come in
/// sorted order. Symlinks are archived as links, never followed; sparse
/// files as GNU sparse entries (holes are not stored); a file with several
/// names in the workspace as its first name plus hardlink entries, as GNU
/// tar does. Runs on a blocking thread; errors reach the reader.
pub fn pack_dir(root: PathBuf, exclude: Vec<PathBuf>) -> PipeReader {
    let (writer, reader) = byte_pipe::pipe();
    tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        match write_tar(&root, &exclude, &mut writer) {
            Ok(()) => {
                let _ = writer.finish();
            }
            Err(e) => writer.fail(e),
        }
    });
    reader
}

/// The blocking core of [`pack_dir`]: writes the tar of `root` to `sink`.
pub fn write_tar<W: Write>(root: &Path, exclude: &[PathBuf], sink: W) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut builder = tar::Builder::new(sink);
    builder.follow_symlinks(false);
    // The root's own time, as "./".
    let meta = std::fs::symlink_metadata(root)?;
    let root_entry = TreeEntry {
        path: Vec::new(),
        kind: EntryKind::Dir,
        mode: meta.mode() & 0o7777,
        size: 0,
        mtime: Timestamp {
            sec: meta.mtime(),
            nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
        },
        link: Vec::new(),
        identity: None,
    };
    builder
        .get_mut()
        .write_all(&crate::workspace::tree::render_header(&root_entry)?)?;
    let mut walker = Walker {
        root,
        exclude,
        first_names: std::collections::HashMap::new(),
    };
    walker.walk(&mut builder, Path::new(""))?;
    builder.into_inner()?.flush()
}

/// One traversal of a workspace for [`pack_dir`].
struct Walker<'a> {
    root: &'a Path,
    exclude: &'a [PathBuf],
    /// The first archived name of each multiply-linked file, by inode.
    first_names: std::collections::HashMap<(u64, u64), PathBuf>,
}

impl Walker<'_> {
    fn walk<W: Write>(&mut self, builder: &mut tar::Builder<W>, rel: &Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.root.join(rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for name in names {
            let rel_path = rel.join(&name);
            if self.exclude.iter().any(|x| rel_path.starts_with(x)) {
                continue;
            }
            let full = self.root.join(&rel_path);
            let meta = std::fs::symlink_metadata(&full)?;
            let ft = meta.file_type();
            // Nanoseconds of the time, as GNU tar's POSIX format keeps them.
            let nsec = meta.mtime_nsec();
            if nsec != 0 && (ft.is_dir() || ft.is_file() || ft.is_symlink()) {
                let time = Timestamp {
                    sec: meta.mtime(),
                    nsec: nsec.clamp(0, 999_999_999) as u32,
                }
                .pax();
                builder.append_pax_extensions([("mtime", time.as_bytes())])?;
            }
            if ft.is_dir() {
                builder.append_path_with_name(&full, &rel_path)?;
                self.walk(builder, &rel_path)?;
            } else if ft.is_file() && meta.nlink() > 1 {
                match self.first_names.entry((meta.dev(), meta.ino())) {
                    std::collections::hash_map::Entry::Occupied(first) => {
                        let mut header = tar::Header::new_gnu();
                        header.set_metadata(&meta);
                        header.set_entry_type(tar::EntryType::Link);
                        header.set_size(0);
                        builder.append_link(&mut header, &rel_path, first.get())?;
                    }
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(rel_path.clone());
                        builder.append_path_with_name(&full, &rel_path)?;
                    }
                }
            } else if ft.is_file() || ft.is_symlink() {
                builder.append_path_with_name(&full, &rel_path)?;
            } else {
                tracing::warn!(path = %full.display(), "skipping special file in workspace");
            }
        }
        Ok(())
    }
}

/// Re-roots a tar whose entries sit under one top directory (as the Docker
/// archive API returns `workspace/...`) to paths relative to `.`, leaving
/// out `exclude` (relative paths; directories exclude their subtree).
/// Entries are copied as they are otherwise: this is our own workspace
/// going out, not an archive coming in.
pub fn reroot<R: Read, W: Write>(
    source: R,
    sink: W,
    exclude: &[PathBuf],
) -> Result<ArchiveStats, ArchiveError> {
    let mut archive = tar::Archive::new(source);
    let mut builder = tar::Builder::new(sink);
    let mut stats = ArchiveStats::default();
    let corrupt = |e: io::Error| ArchiveError::Corrupt(describe_tar_error(&e));
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry.path_bytes().into_owned();
        let Some(path) = normalise(&raw)? else {
            continue;
        };
        let mut parts = path.components();
        parts.next();
        let rel = parts.as_path().to_path_buf();
        if rel.as_os_str().is_empty() || exclude.iter().any(|x| rel.starts_with(x)) {
            continue;
        }
        let mut header = entry.header().clone();
        stats.entries += 1;
        stats.bytes += header.entry_size().unwrap_or(0);
        match header.entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let mut target = PathBuf::from(std::ffi::OsStr::from_bytes(&target));
                if header.entry_type() == tar::EntryType::Link {
                    // Hardlink targets are archive paths: re-root them too.
                    let mut t = target.components();
                    t.next();
                    target = t.as_path().to_path_buf();
                }
                builder.append_link(&mut header, &rel, &target)?;
            }
            _ => builder.append_data(&mut header, &rel, &mut entry)?,
        }
    }
    builder.into_inner()?.flush()?;
    Ok(stats)
}

/// The tar reader's complaint, for people: the tar crate ends some messages
/// with the header it could not parse (`... when getting cksum for <the
/// header's bytes>`), which are bytes of the user's file, not an
/// explanation. Control characters are never echoed and the text is capped.
fn describe_tar_error(e: &io::Error) -> String {
    let text = e.to_string();
    let text = if let Some(at) = text.find(" when getting ") {
        let field = text[at + " when getting ".len()..]
            .split(" for ")
            .next()
            .unwrap_or("a");
        format!("a header's {field} field is not a number")
    } else if text.contains("failed to read entire block") {
        "it ends inside a 512-byte block (truncated?)".to_string()
    } else {
        text
    };
    let mut clean: String = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(200)
        .collect();
    if text.chars().count() > 200 {
        clean.push('…');
    }
    clean
}

#[path = "archive_extract.rs"]
mod extract;
pub use extract::{extract_stream, unpack_into};

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
