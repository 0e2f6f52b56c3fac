//! The workspace as a tree of entries, walked with a *files cache*: the
//! one walk Berth uses, in the host for a local workspace and in the
//! agent (`berth-agent fs ROOT walk`) for a container's, and the wire form
//! the agent sends it in.
//!
//! A regular file is *unchanged* when its device, inode, size, mode, and
//! mtime and ctime in nanoseconds all equal what the parent generation
//! recorded for its path; its content is then not read. ctime catches
//! `touch -d` and same-size rewrites. A file whose mtime or ctime is
//! within [`RACY_WINDOW`] of the walk's start is recorded without an
//! identity, so the next walk reads it again (git's "racily clean" rule: a
//! write in the same clock tick as the walk would not change the
//! timestamps). A file that changes while it is read is recorded without
//! an identity too. Identities are only compared within one workspace
//! instance (see [`KnownFiles::instance`]).

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Timestamps this close to a walk's start (or after it) are not trusted.
pub const RACY_WINDOW_NS: i128 = 2_000_000_000;

/// [`RACY_WINDOW_NS`] as a duration.
pub const RACY_WINDOW: std::time::Duration = std::time::Duration::from_nanos(2_000_000_000);

/// Bytes of file content handed on at a time.
pub const PIECE: usize = 256 * 1024;

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    /// Whole seconds (negative before 1970).
    pub sec: i64,
    /// Nanoseconds within the second, below 1e9.
    pub nsec: u32,
}

impl Timestamp {
    /// Nanoseconds since the epoch.
    pub fn as_nanos(&self) -> i128 {
        self.sec as i128 * 1_000_000_000 + self.nsec as i128
    }

    /// Now, by the system clock.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    /// `sec.nsec` as a PAX `mtime` record writes it.
    pub fn pax(&self) -> String {
        if self.sec < 0 && self.nsec > 0 {
            // -1.25 s is sec -2, nsec 750_000_000.
            let whole = self.sec + 1;
            let frac = 1_000_000_000 - self.nsec;
            if whole == 0 {
                format!("-0.{frac:09}")
            } else {
                format!("{whole}.{frac:09}")
            }
        } else {
            format!("{}.{:09}", self.sec, self.nsec)
        }
    }

    /// Parses a PAX time (`123`, `123.5`, `-1.25`).
    pub fn parse_pax(text: &str) -> Option<Self> {
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        let negative = whole.starts_with('-');
        let sec: i64 = whole.parse().ok()?;
        let digits: String = frac.chars().take(9).collect();
        if !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let nsec: u32 = if digits.is_empty() {
            0
        } else {
            format!("{digits:0<9}").parse().ok()?
        };
        Some(if negative && nsec > 0 {
            Timestamp {
                sec: sec - 1,
                nsec: 1_000_000_000 - nsec,
            }
        } else {
            Timestamp { sec, nsec }
        })
    }
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A regular file (a sparse one is read whole).
    File,
    /// A directory (the workspace root itself has the empty path).
    Dir,
    /// A symlink; `link` is its target.
    Symlink,
    /// Another name of a file earlier in the tree; `link` is that name.
    Hardlink,
}

impl EntryKind {
    /// One byte, for encodings.
    pub fn byte(self) -> u8 {
        match self {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
            EntryKind::Symlink => 2,
            EntryKind::Hardlink => 3,
        }
    }

    /// The kind a byte names.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            3 => EntryKind::Hardlink,
            _ => return None,
        })
    }

    /// A word for people.
    pub fn word(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Hardlink => "hardlink",
        }
    }
}

/// What identifies a file's content without reading it, besides its size,
/// mode and mtime (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Status change time.
    pub ctime: Timestamp,
}

/// One entry of the tree, in walk order (sorted, parents first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Relative path; empty for the workspace root.
    pub path: Vec<u8>,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (and setuid, setgid, sticky; the hydrate policy
    /// strips those on restore).
    pub mode: u32,
    /// Content length (files only; 0 otherwise).
    pub size: u64,
    /// Modification time.
    pub mtime: Timestamp,
    /// A symlink's target or a hardlink's first name; empty otherwise.
    pub link: Vec<u8>,
    /// For the files cache: set when the walk could trust it.
    pub identity: Option<FileIdentity>,
}

impl TreeEntry {
    /// The stamp the files cache compares (files with an identity only).
    pub fn stamp(&self) -> Option<FileStamp> {
        let identity = self.identity?;
        (self.kind == EntryKind::File).then_some(FileStamp {
            identity,
            size: self.size,
            mode: self.mode,
            mtime: self.mtime,
        })
    }

    /// The path for people.
    pub fn display_path(&self) -> String {
        if self.path.is_empty() {
            ".".into()
        } else {
            String::from_utf8_lossy(&self.path).into_owned()
        }
    }
}

/// Everything the files cache compares for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    /// Device, inode, ctime.
    pub identity: FileIdentity,
    /// Size.
    pub size: u64,
    /// Mode.
    pub mode: u32,
    /// mtime.
    pub mtime: Timestamp,
}

/// The files the parent generation recorded with a trusted identity, by
/// path: what a walk may skip.
#[derive(Debug, Clone, Default)]
pub struct KnownFiles {
    /// The workspace instance (the backend's instance id) the identities
    /// belong to; a walk of another instance ignores them.
    pub instance: Option<String>,
    /// Stamps by path.
    pub files: HashMap<Vec<u8>, FileStamp>,
}

impl KnownFiles {
    /// The cache for a walk of `instance`: these files, or nothing when
    /// they were recorded in another instance (a re-created container or
    /// directory starts cold).
    pub fn for_instance(self, instance: Option<&str>) -> KnownFiles {
        if self.instance.is_some() && self.instance.as_deref() == instance {
            self
        } else {
            KnownFiles::default()
        }
    }
}

/// What a walk hands on, in order: an entry, then (for a file that is
/// read) its content in pieces and [`TreeItem::EndOfFile`].
#[derive(Debug)]
pub enum TreeItem {
    /// The next entry; `unchanged` when its content was not read because
    /// the files cache matched (no data follows).
    Entry {
        /// The entry.
        entry: TreeEntry,
        /// Its content comes from the parent generation.
        unchanged: bool,
    },
    /// A piece of the current file's content.
    Data(Vec<u8>),
    /// The current file's content ended. `identity` is the identity
    /// confirmed after the read (`None` when the file changed meanwhile,
    /// or when it is racy).
    EndOfFile {
        /// The trusted identity, if any.
        identity: Option<FileIdentity>,
    },
}

/// Counts of a walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Entries walked.
    pub entries: u64,
    /// Files whose content was read.
    pub files_read: u64,
    /// Bytes of content read.
    pub bytes_read: u64,
    /// Files the cache skipped.
    pub files_unchanged: u64,
    /// Bytes the cache skipped.
    pub bytes_unchanged: u64,
    /// Special files (sockets, fifos, devices) left out.
    pub skipped: u64,
}

fn time_of(sec: i64, nsec: i64) -> Timestamp {
    Timestamp {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

fn identity_of(meta: &std::fs::Metadata) -> FileIdentity {
    FileIdentity {
        dev: meta.dev(),
        ino: meta.ino(),
        ctime: time_of(meta.ctime(), meta.ctime_nsec()),
    }
}

/// Walks `root` (leaving out `exclude`, relative paths whose subtrees are
/// skipped) in sorted order, the root first; reads the content of every
/// regular file `known` does not match; calls `emit` for every item.
/// Special files are skipped with a warning; a file with several names is
/// its first name plus hardlink entries. `started` is the walk's start for
/// the racy rule (take it before the walk). Runs on the calling thread.
pub fn walk(
    root: &Path,
    exclude: &[PathBuf],
    known: &KnownFiles,
    started: Timestamp,
    emit: &mut dyn FnMut(TreeItem) -> io::Result<()>,
) -> io::Result<WalkStats> {
    let mut w = Walk {
        root,
        exclude,
        known,
        racy_from: started.as_nanos() - RACY_WINDOW_NS,
        first_names: HashMap::new(),
        stats: WalkStats::default(),
        emit,
    };
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    w.emit_entry(
        TreeEntry {
            path: Vec::new(),
            kind: EntryKind::Dir,
            mode: meta.mode() & 0o7777,
            size: 0,
            mtime: time_of(meta.mtime(), meta.mtime_nsec()),
            link: Vec::new(),
            identity: None,
        },
        false,
    )?;
    w.dir(Path::new(""))?;
    Ok(w.stats)
}

struct Walk<'a> {
    root: &'a Path,
    exclude: &'a [PathBuf],
    known: &'a KnownFiles,
    racy_from: i128,
    first_names: HashMap<(u64, u64), Vec<u8>>,
    stats: WalkStats,
    emit: &'a mut dyn FnMut(TreeItem) -> io::Result<()>,
}

impl Walk<'_> {
    fn emit_entry(&mut self, entry: TreeEntry, unchanged: bool) -> io::Result<()> {
        self.stats.entries += 1;
        (self.emit)(TreeItem::Entry { entry, unchanged })
    }

    fn trusted(&self, meta: &std::fs::Metadata) -> Option<FileIdentity> {
        let identity = identity_of(meta);
        let mtime = time_of(meta.mtime(), meta.mtime_nsec());
        let newest = identity.ctime.as_nanos().max(mtime.as_nanos());
        (newest < self.racy_from).then_some(identity)
    }

    fn dir(&mut self, rel: &Path) -> io::Result<()> {
        let dir = self.root.join(rel);
        let mut entries: Vec<(std::ffi::OsString, std::fs::DirEntry)> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| (e.file_name(), e)))
            .collect::<Result<_, _>>()?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, dir_entry) in entries {
            let rel_path = rel.join(&name);
            if self.exclude.iter().any(|x| rel_path.starts_with(x)) {
                continue;
            }
            let full = dir.join(&name);
            // Relative to the open directory (`fstatat`): no walk of the
            // whole path per entry.
            let meta = match dir_entry.metadata() {
                Ok(m) => m,
                // Removed since the directory was listed (the sandbox is
                // not frozen): not part of this generation.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let path = rel_path.as_os_str().as_bytes().to_vec();
            let mtime = time_of(meta.mtime(), meta.mtime_nsec());
            let mode = meta.mode() & 0o7777;
            let ft = meta.file_type();
            if ft.is_dir() {
                self.emit_entry(
                    TreeEntry {
                        path,
                        kind: EntryKind::Dir,
                        mode,
                        size: 0,
                        mtime,
                        link: Vec::new(),
                        identity: None,
                    },
                    false,
                )?;
                self.dir(&rel_path)?;
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&full)?;
                self.emit_entry(
                    TreeEntry {
                        path,
                        kind: EntryKind::Symlink,
                        mode,
                        size: 0,
                        mtime,
                        link: target.as_os_str().as_bytes().to_vec(),
                        identity: None,
                    },
                    false,
                )?;
            } else if ft.is_file() {
                if meta.nlink() > 1 {
                    match self.first_names.entry((meta.dev(), meta.ino())) {
                        std::collections::hash_map::Entry::Occupied(first) => {
                            let link = first.get().clone();
                            self.emit_entry(
                                TreeEntry {
                                    path,
                                    kind: EntryKind::Hardlink,
                                    mode,
                                    size: 0,
                                    mtime,
                                    link,
                                    identity: None,
                                },
                                false,
                            )?;
                            continue;
                        }
                        std::collections::hash_map::Entry::Vacant(slot) => {
                            slot.insert(path.clone());
                        }
                    }
                }
                self.file(&full, path, &meta)?;
            } else {
                // Sockets, fifos, devices: not part of a workspace.
                self.stats.skipped += 1;
            }
        }
        Ok(())
    }

    fn file(&mut self, full: &Path, path: Vec<u8>, meta: &std::fs::Metadata) -> io::Result<()> {
        let entry = TreeEntry {
            path,
            kind: EntryKind::File,
            mode: meta.mode() & 0o7777,
            size: meta.len(),
            mtime: time_of(meta.mtime(), meta.mtime_nsec()),
            link: Vec::new(),
            identity: self.trusted(meta),
        };
        if let Some(stamp) = entry.stamp() {
            if self.known.files.get(&entry.path) == Some(&stamp) {
                self.stats.files_unchanged += 1;
                self.stats.bytes_unchanged += entry.size;
                return self.emit_entry(entry, true);
            }
        }
        let size = entry.size;
        let mut file = std::fs::File::open(full)?;
        self.emit_entry(entry, false)?;
        self.stats.files_read += 1;
        // Exactly `size` bytes: a file that grew is cut, one that shrank
        // is padded with zeros (and recorded without an identity, so the
        // next walk reads it again).
        let mut left = size;
        let mut short = false;
        while left > 0 {
            let want = left.min(PIECE as u64) as usize;
            let mut piece = vec![0u8; want];
            let mut filled = 0;
            while filled < want {
                let n = file.read(&mut piece[filled..])?;
                if n == 0 {
                    short = true;
                    break;
                }
                filled += n;
            }
            left -= want as u64;
            self.stats.bytes_read += want as u64;
            (self.emit)(TreeItem::Data(piece))?;
        }
        let after = file.metadata()?;
        let steady = !short
            && after.len() == size
            && identity_of(&after) == identity_of(meta)
            && after.mtime() == meta.mtime()
            && after.mtime_nsec() == meta.mtime_nsec();
        let identity = if steady { self.trusted(&after) } else { None };
        (self.emit)(TreeItem::EndOfFile { identity })
    }
}

#[path = "walk_wire.rs"]
mod wire;
pub use wire::{decode_request, encode_request, ItemReader, ItemWriter, WireEvent, MAX_REQUEST};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_crosses_the_wire_unchanged_and_the_cache_skips_known_files() {
        let dir = std::env::temp_dir().join(format!("berth-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join("d/a"), vec![7u8; 300_000]).unwrap();
        std::fs::write(dir.join("b"), b"bee").unwrap();
        std::os::unix::fs::symlink("d/a", dir.join("l")).unwrap();
        std::fs::hard_link(dir.join("b"), dir.join("h")).unwrap();
        // Long ago: nothing is racy.
        let later = Timestamp {
            sec: Timestamp::now().sec + 10,
            nsec: 0,
        };
        let mut items = Vec::new();
        let stats = walk(&dir, &[], &KnownFiles::default(), later, &mut |i| {
            items.push(i);
            Ok(())
        })
        .unwrap();
        assert_eq!(stats.files_read, 2);
        let mut wire = Vec::new();
        let mut w = ItemWriter::new(&mut wire);
        for i in &items {
            w.item(i).unwrap();
        }
        w.finish(&stats).unwrap();
        let mut r = ItemReader::new(&wire[..]);
        let mut back = Vec::new();
        let end = loop {
            match r.read_event().unwrap() {
                WireEvent::Item(i) => back.push(i),
                WireEvent::End(s) => break s,
            }
        };
        assert_eq!(end, stats);
        assert_eq!(format!("{back:?}"), format!("{items:?}"));
        // The files it recorded are skipped next time.
        let known = KnownFiles {
            instance: None,
            files: items
                .iter()
                .filter_map(|i| match i {
                    TreeItem::Entry { entry, .. } => {
                        entry.stamp().map(|_| (entry.path.clone(), entry.clone()))
                    }
                    _ => None,
                })
                .map(|(p, mut e)| {
                    // The identity comes with the end of the file.
                    e.identity = e.identity.or(None);
                    (p, e.stamp().unwrap())
                })
                .collect(),
        };
        let request = encode_request(&[PathBuf::from("x")], &known);
        let (exclude, decoded) = decode_request(&request[..]).unwrap();
        assert_eq!(exclude, [PathBuf::from("x")]);
        assert_eq!(decoded.files, known.files);
        let again = walk(&dir, &[], &decoded, later, &mut |_| Ok(())).unwrap();
        assert_eq!((again.files_read, again.files_unchanged), (0, 2));
        // Truncated or garbled wire bytes are errors, never panics.
        for len in 0..wire.len() {
            let mut r = ItemReader::new(&wire[..len]);
            while let Ok(WireEvent::Item(_)) = r.read_event() {}
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
