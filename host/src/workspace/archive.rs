//! Workspace archives: streaming tar out of a directory, and the filter every
//! archive passes before it may reach a workspace.
//!
//! # Hydrate policy
//!
//! An archive is checked entry by entry, from its headers, before any of its
//! content is written:
//!
//! - paths are relative; absolute paths and `..` components are refused;
//! - only regular files, directories, symlinks and hardlinks are allowed:
//!   device nodes, fifos, sparse and unknown entry types are refused;
//! - no entry may be written *through* a symlink the archive created (e.g.
//!   `link -> /etc` followed by `link/passwd`), nor replace such a symlink;
//! - symlinks themselves are kept, whatever they point at (virtualenvs need
//!   links out of the workspace), and are never followed during extraction;
//! - a hardlink must point at a regular file earlier in the same archive;
//! - setuid, setgid and sticky bits are stripped (mode & 0o777);
//! - the declared sizes and the entry count are capped
//!   ([`ArchiveLimits`]), so a size bomb is refused from its header.
//!
//! [`filter`] enforces this and re-emits a clean archive; the sandbox runs it
//! once over a spooled copy to validate the whole archive, then again while
//! extracting, so an archive with a bad entry anywhere writes nothing.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::byte_pipe::{self, PipeReader};

/// Caps on what an archive may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArchiveLimits {
    /// Total declared bytes of all entries.
    pub max_bytes: u64,
    /// Number of entries.
    pub max_entries: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_bytes: 64 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// An absolute path.
    #[error("archive entry {0:?} has an absolute path")]
    AbsolutePath(String),
    /// A `..` component.
    #[error("archive entry {0:?} climbs out of the workspace with '..'")]
    ParentTraversal(String),
    /// Written through (or over) a symlink from the same archive.
    #[error("archive entry {path:?} would be written through the symlink {link:?}")]
    ThroughSymlink {
        /// The entry.
        path: String,
        /// The symlink in its way.
        link: String,
    },
    /// A hardlink to something that is not an earlier regular file.
    #[error("archive entry {path:?} is a hardlink to {target:?}, which is not a file earlier in the archive")]
    HardlinkOutside {
        /// The entry.
        path: String,
        /// Its target.
        target: String,
    },
    /// A device node, fifo or other special entry.
    #[error("archive entry {path:?} is a {kind}, which workspaces may not contain")]
    SpecialFile {
        /// The entry.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// Over the entry-count limit.
    #[error("archive has more than {0} entries (limit); raise the limit if this is legitimate")]
    TooManyEntries(u64),
    /// Over the size limit.
    #[error("archive declares more than {0} bytes (limit); raise the limit if this is legitimate")]
    TooLarge(u64),
    /// Not a readable tar stream.
    #[error("archive is not a valid tar stream: {0}")]
    Corrupt(String),
    /// Reading the source or writing the destination failed.
    #[error("archive i/o failed: {0}")]
    Io(#[from] io::Error),
}

/// What a filtered archive held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Entries passed through.
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

fn display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// Normalises an archive path: relative, no `..`, `./` prefixes dropped.
/// `None` for the archive root itself.
fn normalise(raw: &[u8]) -> Result<Option<PathBuf>, ArchiveError> {
    let path = Path::new(std::ffi::OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => return Err(ArchiveError::ParentTraversal(display(raw))),
            Component::RootDir | Component::Prefix(_) => {
                return Err(ArchiveError::AbsolutePath(display(raw)))
            }
        }
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

/// Validates `source` and, if `sink` is given, writes a clean copy to it.
pub fn filter<R: Read, W: Write>(
    source: R,
    sink: Option<W>,
    limits: ArchiveLimits,
) -> Result<ArchiveStats, ArchiveError> {
    let mut archive = tar::Archive::new(source);
    let mut builder = sink.map(tar::Builder::new);
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut files: HashSet<PathBuf> = HashSet::new();
    let mut stats = ArchiveStats::default();
    let corrupt = |e: io::Error| ArchiveError::Corrupt(e.to_string());

    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(ArchiveError::TooManyEntries(limits.max_entries));
        }
        let raw = entry.path_bytes().into_owned();
        let Some(path) = normalise(&raw)? else {
            continue; // "." itself
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
        let header = entry.header().clone();
        let kind = header.entry_type();
        let size = header.entry_size().map_err(corrupt)?;
        let mode = header.mode().map_err(corrupt)? & 0o777;
        let mtime = header.mtime().unwrap_or(0);
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous => {
                stats.bytes = stats.bytes.saturating_add(size);
                if stats.bytes > limits.max_bytes {
                    return Err(ArchiveError::TooLarge(limits.max_bytes));
                }
                files.insert(path.clone());
                if let Some(b) = builder.as_mut() {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(T::Regular);
                    h.set_size(size);
                    h.set_mode(mode);
                    h.set_mtime(mtime);
                    b.append_data(&mut h, &path, &mut entry)?;
                } else {
                    io::copy(&mut entry, &mut io::sink()).map_err(corrupt)?;
                }
            }
            T::Directory => {
                files.remove(&path);
                if let Some(b) = builder.as_mut() {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(T::Directory);
                    h.set_size(0);
                    h.set_mode(mode | 0o700);
                    h.set_mtime(mtime);
                    b.append_data(&mut h, &path, io::empty())?;
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
                if let Some(b) = builder.as_mut() {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(T::Symlink);
                    h.set_size(0);
                    h.set_mode(0o777);
                    h.set_mtime(mtime);
                    b.append_link(
                        &mut h,
                        &path,
                        Path::new(std::ffi::OsStr::from_bytes(&target)),
                    )?;
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
                        if let Some(b) = builder.as_mut() {
                            let mut h = tar::Header::new_gnu();
                            h.set_entry_type(T::Link);
                            h.set_size(0);
                            h.set_mode(mode);
                            h.set_mtime(mtime);
                            b.append_link(&mut h, &path, &t)?;
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
            T::GNUSparse => return Err(special(&raw, "sparse file")),
            _ => return Err(special(&raw, "special or unknown entry type")),
        }
    }
    if let Some(b) = builder {
        b.into_inner()?.flush()?;
    }
    Ok(stats)
}

fn special(raw: &[u8], kind: &'static str) -> ArchiveError {
    ArchiveError::SpecialFile {
        path: display(raw),
        kind,
    }
}

/// Streams a tar of `root` (paths relative to `.`), leaving out `exclude`
/// (relative paths; a directory excludes its whole subtree). Symlinks are
/// archived as links, never followed. Runs on a blocking thread; errors
/// reach the reader.
pub fn pack_dir(root: PathBuf, exclude: Vec<PathBuf>) -> PipeReader {
    let (writer, reader) = byte_pipe::pipe();
    tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let result =
            walk(&mut builder, &root, Path::new(""), &exclude).and_then(|()| builder.finish());
        match (result, builder.into_inner()) {
            (Ok(()), Ok(w)) => {
                let _ = w.finish();
            }
            (Err(e), Ok(w)) => w.fail(e),
            (_, Err(e)) => tracing::warn!(error = %e, "archive writer failed"),
        }
    });
    reader
}

fn walk<W: Write>(
    builder: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    exclude: &[PathBuf],
) -> io::Result<()> {
    let dir = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        let rel_path = rel.join(&name);
        if exclude.iter().any(|x| rel_path.starts_with(x)) {
            continue;
        }
        let full = root.join(&rel_path);
        let meta = std::fs::symlink_metadata(&full)?;
        let ft = meta.file_type();
        if ft.is_dir() {
            builder.append_path_with_name(&full, &rel_path)?;
            walk(builder, root, &rel_path, exclude)?;
        } else if ft.is_file() || ft.is_symlink() {
            builder.append_path_with_name(&full, &rel_path)?;
        } else {
            tracing::warn!(path = %full.display(), "skipping special file in workspace");
        }
    }
    Ok(())
}

/// Extracts an archive (already passed through [`filter`]) into `root`,
/// never following symlinks out of it.
pub fn unpack_into<R: Read>(source: R, root: &Path) -> Result<ArchiveStats, ArchiveError> {
    let mut archive = tar::Archive::new(source);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    let mut stats = ArchiveStats::default();
    for entry in archive
        .entries()
        .map_err(|e| ArchiveError::Corrupt(e.to_string()))?
    {
        let mut entry = entry.map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        stats.entries += 1;
        stats.bytes += entry.header().entry_size().unwrap_or(0);
        // A file replacing an existing symlink must not write through it.
        if let Ok(Some(p)) = normalise(&entry.path_bytes()) {
            let target = root.join(&p);
            if entry.header().entry_type() != tar::EntryType::Directory {
                if let Ok(m) = std::fs::symlink_metadata(&target) {
                    if m.file_type().is_symlink() {
                        std::fs::remove_file(&target)?;
                    }
                }
            }
        }
        // `unpack_in` refuses paths that would land outside `root`,
        // including through symlinks already on disk.
        if !entry.unpack_in(root)? {
            return Err(ArchiveError::ParentTraversal(display(&entry.path_bytes())));
        }
    }
    Ok(stats)
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
    let corrupt = |e: io::Error| ArchiveError::Corrupt(e.to_string());
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
