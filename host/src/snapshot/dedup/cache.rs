//! The host-side pack cache: packs a stop uploaded or a restore downloaded,
//! kept by name so a later restore on the same host skips their download.
//! Packs are named by their content hash, so a cached pack is checked
//! before use and dropped if it is not what its name says.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::format::{names, read_pack_table};

/// BLAKE3 of a file's content.
pub(super) fn hash_file(path: &Path) -> io::Result<blake3::Hash> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hasher.finalize()),
            n => {
                hasher.update(&buf[..n]);
            }
        }
    }
}

/// A directory of packs with a size cap (oldest used evicted first).
#[derive(Debug, Clone)]
pub struct PackCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// By default, the cache holds up to 4 GiB.
pub const DEFAULT_CACHE_BYTES: u64 = 4 * 1024 * 1024 * 1024;

impl PackCache {
    /// A cache in `dir` (created on first use), holding up to `max_bytes`.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> Self {
        PackCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The cache the environment asks for: `$BERTH_CACHE_DIR` (else
    /// `default_dir`), capped at `$BERTH_CACHE_MAX_BYTES` (else
    /// [`DEFAULT_CACHE_BYTES`]); `None` when `BERTH_CACHE_MAX_BYTES=0`.
    pub fn from_env(default_dir: &Path) -> Option<Self> {
        let dir = std::env::var_os("BERTH_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| default_dir.to_path_buf());
        let max = std::env::var("BERTH_CACHE_MAX_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_CACHE_BYTES);
        (max > 0).then(|| PackCache::new(dir, max))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cap in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub(super) fn ensure_dir(&self) -> io::Result<&Path> {
        std::fs::create_dir_all(&self.dir)?;
        Ok(&self.dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The cached pack `name`, if present and whole: its trailer and table
    /// read back and add up to its size (its chunks are checked against
    /// their ids as they are read); a damaged copy is removed.
    pub(super) fn lookup(&self, name: &str) -> Option<PathBuf> {
        let path = self.path(name);
        names::parse_pack(name)?;
        let mut file = std::fs::File::open(&path).ok()?;
        if read_pack_table(&mut file).is_err() {
            tracing::warn!(pack = name, "a cached pack was damaged; removed it");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Mark it used (eviction goes by modification time).
        let _ = filetime::set_file_mtime(&path, filetime::FileTime::now());
        Some(path)
    }

    /// Moves a complete, checked pack file into the cache.
    pub(super) fn admit(&self, file: tempfile::TempPath, name: &str) -> io::Result<PathBuf> {
        let path = self.path(name);
        file.persist(&path).map_err(|e| e.error)?;
        Ok(path)
    }

    /// Evicts the least recently used packs until the cache fits its cap.
    pub(super) fn trim(&self) {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut packs: Vec<(std::time::SystemTime, u64, PathBuf)> = read
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| names::parse_pack(n).is_some())
            })
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = packs.iter().map(|p| p.1).sum();
        packs.sort();
        for (_, len, path) in packs {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_packs_are_dropped_and_the_cap_holds() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PackCache::new(dir.path(), 2100);
        cache.ensure_dir().unwrap();
        let mut names_in = Vec::new();
        for i in 0..3u8 {
            let chunk = vec![i; 900];
            let mut w = super::super::format::PackWriter::new(Vec::new());
            let id = *blake3::hash(&chunk).as_bytes();
            w.add(id, 900, &chunk, super::super::format::Codec::Raw)
                .unwrap();
            let (bytes, hash, _) = w.finish().unwrap();
            let name = names::pack("0123456789abcdef", &hash);
            let tmp = tempfile::NamedTempFile::new_in(dir.path()).unwrap();
            std::fs::write(tmp.path(), &bytes).unwrap();
            cache.admit(tmp.into_temp_path(), &name).unwrap();
            let old = filetime::FileTime::from_unix_time(1000 + i as i64, 0);
            filetime::set_file_mtime(dir.path().join(&name), old).unwrap();
            names_in.push(name);
        }
        cache.trim();
        assert!(cache.lookup(&names_in[0]).is_none(), "oldest evicted");
        assert!(cache.lookup(&names_in[1]).is_some());
        std::fs::write(dir.path().join(&names_in[2]), b"truncated").unwrap();
        assert!(cache.lookup(&names_in[2]).is_none());
        assert!(!dir.path().join(&names_in[2]).exists());
    }
}
