//! An archive entry's path, normalised or refused, and why an archive was
//! refused: shared by the archive filter (`archive`) and the tree walk
//! (`tree`), which neither owns.

use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[error("archive i/o failed")]
    Io(#[from] io::Error),
}

pub(crate) fn display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// Normalises an archive path: relative, no `..`, `./` prefixes dropped.
/// `None` for the archive root itself.
pub(crate) fn normalise(raw: &[u8]) -> Result<Option<PathBuf>, ArchiveError> {
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

/// [`normalise`] as bytes: empty for the archive root.
pub(crate) fn normalise_bytes(raw: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    Ok(normalise(raw)?
        .map(|p| p.into_os_string().into_vec())
        .unwrap_or_default())
}
