//! The workspace as a tree of entries, for snapshots that keep one record
//! per file (deduplicated format version 2): the walk with its *files
//! cache* (from the `berth-agent` crate, the same code in the host and in
//! a container; see [`walk`] for the rule), the same entries parsed from
//! any tar stream, and the one canonical tar header every entry is
//! rendered with.

use std::io::{self, Read};

pub use berth_agent::walk::{
    walk, EntryKind, FileIdentity, FileStamp, KnownFiles, Timestamp, TreeEntry, TreeItem,
    WalkStats, PIECE, RACY_WINDOW, RACY_WINDOW_NS,
};

/// Parses a tar stream (a backend's archive) into tree items: no
/// identities, every file read. The root entry (`.` or `./`) keeps its
/// time; special files are skipped with a warning. Bounded by `limits`.
pub fn items_of_tar<R: Read>(
    source: R,
    limits: super::ArchiveLimits,
    emit: &mut dyn FnMut(TreeItem) -> io::Result<()>,
) -> io::Result<WalkStats> {
    let mut archive = tar::Archive::new(source);
    let mut stats = WalkStats::default();
    let mut declared: u64 = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(io::Error::other(format!(
                "the workspace has more than {} entries (the archive limit)",
                limits.max_entries
            )));
        }
        let raw = entry.path_bytes().into_owned();
        let path = match super::entry_path::normalise_bytes(&raw) {
            Ok(p) => p,
            Err(e) => return Err(io::Error::other(e.to_string())),
        };
        let header = entry.header().clone();
        let mtime = pax_mtime(&mut entry).unwrap_or(Timestamp {
            sec: header.mtime().unwrap_or(0) as i64,
            nsec: 0,
        });
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        use tar::EntryType as T;
        let kind = match header.entry_type() {
            T::Regular | T::Continuous | T::GNUSparse => EntryKind::File,
            T::Directory => EntryKind::Dir,
            T::Symlink => EntryKind::Symlink,
            T::Link => EntryKind::Hardlink,
            _ => {
                tracing::warn!(path = %String::from_utf8_lossy(&raw), "skipping special file in workspace");
                continue;
            }
        };
        if path.is_empty() && kind != EntryKind::Dir {
            return Err(io::Error::other("the archive's root is not a directory"));
        }
        let link = match kind {
            EntryKind::Symlink => entry
                .link_name_bytes()
                .map(|l| l.into_owned())
                .unwrap_or_default(),
            EntryKind::Hardlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|l| l.into_owned())
                    .unwrap_or_default();
                super::entry_path::normalise_bytes(&target)
                    .map_err(|e| io::Error::other(e.to_string()))?
            }
            _ => Vec::new(),
        };
        let size = if kind == EntryKind::File {
            entry.size()
        } else {
            0
        };
        declared = declared.saturating_add(size);
        if declared > limits.max_bytes {
            return Err(io::Error::other(format!(
                "the workspace holds more than {} bytes (the archive limit)",
                limits.max_bytes
            )));
        }
        emit(TreeItem::Entry {
            entry: TreeEntry {
                path,
                kind,
                mode,
                size,
                mtime,
                link,
                identity: None,
            },
            unchanged: false,
        })?;
        if kind == EntryKind::File {
            let mut left = size;
            while left > 0 {
                let want = left.min(PIECE as u64) as usize;
                let mut piece = vec![0u8; want];
                entry.read_exact(&mut piece)?;
                left -= want as u64;
                stats.bytes_read += want as u64;
                emit(TreeItem::Data(piece))?;
            }
            stats.files_read += 1;
            emit(TreeItem::EndOfFile { identity: None })?;
        }
    }
    Ok(stats)
}

/// The PAX `mtime` of an entry, with its nanoseconds.
pub(crate) fn pax_mtime<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<Timestamp> {
    let extensions = entry.pax_extensions().ok()??;
    for ext in extensions.flatten() {
        if ext.key_bytes() == b"mtime" {
            return std::str::from_utf8(ext.value_bytes())
                .ok()
                .and_then(Timestamp::parse_pax);
        }
    }
    None
}

/// The path an entry's header carries: `./` for the root, a directory's
/// with a trailing `/`.
fn header_path(entry: &TreeEntry) -> Vec<u8> {
    if entry.path.is_empty() {
        b"./".to_vec()
    } else if entry.kind == EntryKind::Dir {
        let mut p = entry.path.clone();
        p.push(b'/');
        p
    } else {
        entry.path.clone()
    }
}

/// The PAX records an entry's header needs: its time when it has
/// nanoseconds or does not fit, its names when they do not fit, its size
/// when it does not fit.
fn pax_records<'a>(entry: &'a TreeEntry, path: &'a [u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut pax: Vec<(&'static str, Vec<u8>)> = Vec::new();
    if entry.mtime.nsec != 0 || entry.mtime.sec < 0 || entry.mtime.sec > 0o77777777777 {
        pax.push(("mtime", entry.mtime.pax().into_bytes()));
    }
    let fits = |b: &[u8]| b.len() <= 100 && !b.contains(&0);
    if !fits(path) {
        pax.push(("path", path.to_vec()));
    }
    if !fits(&entry.link) {
        pax.push(("linkpath", entry.link.clone()));
    }
    if entry.size > 0o77777777777 {
        pax.push(("size", entry.size.to_string().into_bytes()));
    }
    pax
}

/// The length of one PAX record, `"len key=value\n"`, where len counts
/// itself.
fn pax_record_len(key: &str, value: &[u8]) -> usize {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + rest.to_string().len();
    if len.to_string().len() != rest.to_string().len() {
        len = rest + len.to_string().len();
    }
    len
}

/// The length of [`render_header`]'s bytes for `entry`, without
/// rendering them (a stop sums it over every member).
pub fn header_len(entry: &TreeEntry) -> u64 {
    let path = header_path(entry);
    let records: usize = pax_records(entry, &path)
        .iter()
        .map(|(key, value)| pax_record_len(key, value))
        .sum();
    if records == 0 {
        512
    } else {
        1024 + records as u64 + padding(records as u64)
    }
}

/// The canonical tar header of an entry: a PAX extended header when the
/// time has nanoseconds or a name does not fit (`mtime`, `path`,
/// `linkpath`, `size`), then a ustar header. One rendering for every
/// writer, so a tree always gives the same bytes.
pub fn render_header(entry: &TreeEntry) -> io::Result<Vec<u8>> {
    let path = header_path(entry);
    let pax = pax_records(entry, &path);
    let mut out = Vec::with_capacity(512 * if pax.is_empty() { 1 } else { 3 });
    if !pax.is_empty() {
        let mut records = Vec::new();
        for (key, value) in &pax {
            records.extend_from_slice(pax_record_len(key, value).to_string().as_bytes());
            records.push(b' ');
            records.extend_from_slice(key.as_bytes());
            records.push(b'=');
            records.extend_from_slice(value);
            records.push(b'\n');
        }
        let mut h = tar::Header::new_ustar();
        set_name(&mut h, b"././@PaxHeader");
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_mode(0o644);
        h.set_size(records.len() as u64);
        h.set_mtime(0);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&records);
        out.resize(out.len() + padding(records.len() as u64) as usize, 0);
    }
    let mut h = tar::Header::new_ustar();
    set_name(&mut h, &path[..path.len().min(100)]);
    h.set_entry_type(match entry.kind {
        EntryKind::File => tar::EntryType::Regular,
        EntryKind::Dir => tar::EntryType::Directory,
        EntryKind::Symlink => tar::EntryType::Symlink,
        EntryKind::Hardlink => tar::EntryType::Link,
    });
    h.set_mode(entry.mode);
    h.set_size(entry.size.min(0o77777777777));
    h.set_mtime(entry.mtime.sec.clamp(0, 0o77777777777) as u64);
    h.set_uid(0);
    h.set_gid(0);
    if !entry.link.is_empty() {
        let n = entry.link.len().min(100);
        if let Some(old) = h.as_old_mut().linkname.get_mut(..n) {
            old.copy_from_slice(&entry.link[..n]);
        }
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    Ok(out)
}

fn set_name(h: &mut tar::Header, name: &[u8]) {
    let n = name.len().min(100);
    let field = &mut h.as_old_mut().name;
    field.fill(0);
    field[..n].copy_from_slice(&name[..n]);
}

/// The zeros after `size` bytes of content, up to the next 512-byte block.
pub fn padding(size: u64) -> u64 {
    (512 - size % 512) % 512
}

/// The two zero blocks that end a tar.
pub const END_OF_ARCHIVE: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times_round_trip() {
        for (sec, nsec) in [
            (0, 0),
            (1, 5),
            (1_700_000_000, 123_456_789),
            (-2, 750_000_000),
            (-1, 1),
        ] {
            let t = Timestamp { sec, nsec };
            assert_eq!(Timestamp::parse_pax(&t.pax()), Some(t), "{}", t.pax());
        }
        assert_eq!(
            Timestamp::parse_pax("12.5"),
            Some(Timestamp {
                sec: 12,
                nsec: 500_000_000
            })
        );
    }

    fn entry(path: &str, kind: EntryKind, size: u64, nsec: u32, link: &str) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind,
            mode: 0o640,
            size,
            mtime: Timestamp {
                sec: 1_600_000_000,
                nsec,
            },
            link: link.as_bytes().to_vec(),
            identity: None,
        }
    }

    #[test]
    fn rendered_headers_read_back_with_long_names_and_nanoseconds() {
        let long = "d/".repeat(80) + "file";
        let entries = [
            entry("", EntryKind::Dir, 0, 7, ""),
            entry("a", EntryKind::File, 3, 0, ""),
            entry(&long, EntryKind::File, 5, 123_456_789, ""),
            entry("l", EntryKind::Symlink, 0, 1, &"t/".repeat(70)),
            entry("h", EntryKind::Hardlink, 0, 0, &long),
        ];
        let mut tar = Vec::new();
        for e in &entries {
            tar.extend(render_header(e).unwrap());
            tar.extend(std::iter::repeat_n(b'x', e.size as usize));
            tar.extend(std::iter::repeat_n(0u8, padding(e.size) as usize));
        }
        tar.extend([0u8; END_OF_ARCHIVE]);
        let mut items = Vec::new();
        items_of_tar(&tar[..], Default::default(), &mut |i| {
            if let TreeItem::Entry { entry, .. } = i {
                items.push(entry);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(items, entries);
    }

    /// `header_len` is the length `render_header` renders, over seeded
    /// entries with every reason for a PAX header (and none).
    #[test]
    fn header_len_is_the_rendered_length() {
        let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let word = |n: u64| "ab/".repeat(n as usize);
            let kind = [
                EntryKind::File,
                EntryKind::Dir,
                EntryKind::Symlink,
                EntryKind::Hardlink,
            ][(next() % 4) as usize];
            let path = if next().is_multiple_of(50) {
                String::new()
            } else {
                word(next() % 60) + "f"
            };
            let link = word(next() % 60);
            let size = match next() % 3 {
                0 => 0,
                1 => next() % 100_000,
                _ => 0o77777777777 + next() % 1000,
            };
            let mut e = entry(&path, kind, size, (next() % 3) as u32 * 333_333_333, &link);
            e.mtime.sec = [1_600_000_000, -5, 0o77777777777 + 1][(next() % 3) as usize];
            assert_eq!(
                header_len(&e),
                render_header(&e).unwrap().len() as u64,
                "{e:?}"
            );
        }
    }
}
