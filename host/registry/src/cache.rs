//! The plugin cache: blobs by digest (`blobs/sha256/HEX`), written through
//! a temporary file and renamed, re-hashed every time they are read.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::reference::Digest;
use super::RegistryError;

/// A content-addressed blob store on disk.
#[derive(Debug, Clone)]
pub struct BlobCache {
    root: PathBuf,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RegistryError {
    move |source| RegistryError::Io { what, source }
}

impl BlobCache {
    /// A cache under `root`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        BlobCache { root: root.into() }
    }

    /// `$BERTH_PLUGIN_CACHE`, else `$XDG_CACHE_HOME/berth/plugins`, else
    /// `~/.cache/berth/plugins`, else `./.berth-plugins`.
    pub fn from_env() -> Self {
        if let Some(d) = std::env::var_os("BERTH_PLUGIN_CACHE") {
            return Self::at(PathBuf::from(d));
        }
        match berth_base::user_cache::user_cache_dir("plugins") {
            Some(dir) => Self::at(dir),
            None => Self::at(".berth-plugins"),
        }
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob `digest` lives.
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs").join("sha256").join(digest.hex())
    }

    /// The blob's bytes if cached and whole; a corrupt or truncated entry
    /// is removed (and reported) so it is fetched again.
    pub fn read_verified(
        &self,
        digest: &Digest,
        max: u64,
    ) -> Result<Option<Vec<u8>>, RegistryError> {
        let path = self.path(digest);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("opening {}", path.display()))(e)),
        };
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(io(format!("reading {}", path.display())))?;
        let got = Digest::of(&bytes);
        if bytes.len() as u64 <= max && got == *digest {
            return Ok(Some(bytes));
        }
        tracing::warn!(
            path = %path.display(),
            expected = %digest,
            got = %got,
            "a plugin cache entry does not match its digest (corrupt or half-written); removing it and fetching again"
        );
        std::fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?;
        Ok(None)
    }

    /// Whether the blob is cached (not verified).
    pub fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// A temporary file in the cache, to be [`commit`](Self::commit)ted.
    pub fn temp(&self) -> Result<tempfile::NamedTempFile, RegistryError> {
        let dir = self.root.join("tmp");
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        tempfile::NamedTempFile::new_in(&dir)
            .map_err(io(format!("creating a file in {}", dir.display())))
    }

    /// Checks `temp` hashes to `digest`, flushes it and renames it into
    /// place: a reader sees the whole blob or none.
    pub fn commit(
        &self,
        temp: tempfile::NamedTempFile,
        digest: &Digest,
    ) -> Result<PathBuf, RegistryError> {
        let mut hasher = sha2::Sha256::new();
        let mut f = temp
            .reopen()
            .map_err(io("re-reading a cache file".into()))?;
        std::io::copy(&mut f, &mut hasher).map_err(io("re-reading a cache file".into()))?;
        let got = Digest::from_hasher(hasher);
        if got != *digest {
            return Err(RegistryError::DigestMismatch {
                what: "a blob written to the plugin cache".into(),
                expected: digest.to_string(),
                got: got.to_string(),
            });
        }
        temp.as_file()
            .sync_all()
            .map_err(io("flushing a cache file".into()))?;
        let path = self.path(digest);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        temp.persist(&path)
            .map_err(|e| io(format!("renaming into {}", path.display()))(e.error))?;
        Ok(path)
    }

    /// Stores small bytes under their digest.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, RegistryError> {
        use std::io::Write;
        let digest = Digest::of(bytes);
        if self.read_verified(&digest, bytes.len() as u64)?.is_some() {
            return Ok(digest);
        }
        let mut temp = self.temp()?;
        temp.write_all(bytes)
            .map_err(io("writing the plugin cache".into()))?;
        self.commit(temp, &digest)?;
        Ok(digest)
    }
}
