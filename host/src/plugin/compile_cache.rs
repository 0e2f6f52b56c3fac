//! On-disk cache of compiled components. A 12–18 MB Python or JavaScript
//! component takes 10+ s of Cranelift; from the cache it loads in
//! milliseconds.
//!
//! Entries are keyed by the component's BLAKE3 digest plus a fingerprint of
//! the engine (wasmtime version and every setting that affects code). An
//! entry is the exact artifact `Component::serialize` produced
//! (`<key>.cwasm`) beside a BLAKE3 digest of it (`<key>.cwasm.blake3`). A
//! truncated, corrupt or stale entry fails verification, is logged, deleted
//! and rebuilt — never trusted.
//!
//! A verified entry is mapped, not read: `Component::deserialize_file`
//! maps the file and runs the code from that mapping, where reading it into
//! memory first and deserializing the copy cost a 37 MB Python component
//! 51 ms per load (BENCHMARKS.md). Entries are only ever replaced by an
//! atomic rename (a new inode), so a mapping in use never sees its file
//! change; writing into an entry in place while it is loaded is
//! unsupported.

use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::component::Component;
use wasmtime::Engine;

/// Suffix of the file holding an entry's BLAKE3 digest (32 raw bytes).
const DIGEST_SUFFIX: &str = "blake3";

/// How a component was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a verified cache entry.
    Hit,
    /// Compiled and stored.
    Miss,
    /// An entry existed but was rejected (reason); compiled again.
    Rebuilt(String),
    /// Caching is turned off; compiled.
    Disabled,
}

/// The cache directory (or none, to always compile).
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: Option<PathBuf>,
}

/// `std::hash::Hasher` over BLAKE3, so wasmtime's compatibility hash can be
/// turned into a stable fingerprint.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        let d = self.0.finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_bytes()[..8]);
        u64::from_le_bytes(b)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The fingerprint of `engine`'s code-generation settings.
pub fn engine_fingerprint(engine: &Engine) -> String {
    use std::hash::Hash;
    let mut h = Blake3Hasher(blake3::Hasher::new());
    h.write(b"wasmtime-48.0.8");
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize().as_bytes()[..12])
}

impl CompileCache {
    /// Caches under `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        CompileCache {
            dir: Some(dir.into()),
        }
    }

    /// Never caches.
    pub fn disabled() -> Self {
        CompileCache { dir: None }
    }

    /// `$BERTH_CACHE_DIR`, else `$XDG_CACHE_HOME/berth/compiled`, else
    /// `~/.cache/berth/compiled`; disabled if none can be found.
    pub fn from_env() -> Self {
        if let Some(d) = std::env::var_os("BERTH_CACHE_DIR") {
            return Self::at(PathBuf::from(d));
        }
        match crate::user_cache::user_cache_dir("compiled") {
            Some(dir) => Self::at(dir),
            None => Self::disabled(),
        }
    }

    /// The cache directory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The entry path for a component digest on this engine.
    pub fn entry_path(&self, engine: &Engine, component_digest: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| {
            d.join(format!(
                "{component_digest}-{}.cwasm",
                engine_fingerprint(engine)
            ))
        })
    }

    /// Loads `bytes` (digest `digest`) from the cache or compiles it.
    /// Blocking: call from a blocking thread.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        digest: &str,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(path) = self.entry_path(engine, digest) else {
            return Ok((
                Component::from_binary(engine, bytes)?,
                CacheOutcome::Disabled,
            ));
        };
        let rejected = match verify(&path) {
            // SAFETY: the file is a verified artifact of `serialize` from an
            // engine with the same fingerprint, written by `store` below
            // and only ever replaced by rename (see the module docs).
            Ok(()) => match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(c) => return Ok((c, CacheOutcome::Hit)),
                Err(e) => Some(format!("wasmtime refused it: {e}")),
            },
            Err(Verdict::Absent) => None,
            Err(Verdict::Rejected(reason)) => Some(reason),
        };
        if let Some(reason) = &rejected {
            tracing::warn!(entry = %path.display(), %reason, "discarding compile-cache entry");
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(digest_path(&path));
        }
        let component = Component::from_binary(engine, bytes)?;
        match component.serialize() {
            Ok(payload) => {
                if let Err(e) = store(&path, &payload) {
                    tracing::warn!(entry = %path.display(), error = %e, "cannot write compile-cache entry");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot serialize compiled component"),
        }
        let outcome = match rejected {
            Some(r) => CacheOutcome::Rebuilt(r),
            None => CacheOutcome::Miss,
        };
        Ok((component, outcome))
    }
}

/// Why an entry cannot be used.
enum Verdict {
    /// There is no entry: a plain miss.
    Absent,
    /// There is one, but it must not be trusted (the reason).
    Rejected(String),
}

fn digest_path(entry: &Path) -> PathBuf {
    let mut name = entry.as_os_str().to_owned();
    name.push(".");
    name.push(DIGEST_SUFFIX);
    PathBuf::from(name)
}

/// Checks the entry at `path` against its recorded digest, streaming the
/// file through the hasher (no copy of the artifact is kept).
fn verify(path: &Path) -> Result<(), Verdict> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Verdict::Absent),
        Err(e) => return Err(Verdict::Rejected(format!("unreadable: {e}"))),
    };
    let recorded = std::fs::read(digest_path(path))
        .map_err(|e| Verdict::Rejected(format!("no readable digest beside it ({e})")))?;
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(file)
        .map_err(|e| Verdict::Rejected(format!("unreadable: {e}")))?;
    if hasher.finalize().as_bytes()[..] != recorded[..] {
        return Err(Verdict::Rejected(
            "payload digest mismatch (corrupt or truncated)".into(),
        ));
    }
    Ok(())
}

fn store(path: &Path, payload: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("cache entry has no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    // Digest first: a crash between the two renames leaves a digest that
    // matches no artifact, which verification rejects and rebuilds.
    let mut digest = tempfile::NamedTempFile::new_in(dir)?;
    digest.write_all(blake3::hash(payload).as_bytes())?;
    digest.as_file().sync_all()?;
    digest.persist(digest_path(path)).map_err(|e| e.error)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(payload)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
