//! Shared pieces for Berth's Rust example plugins: `wasi:io` stream bindings,
//! the snapshot-id grammar, chunked stream copies and atomic file commits.
//!
//! Every plugin crate maps the `wasi:io` interfaces of its own bindings onto
//! the ones generated here (`with:` in `wit_bindgen::generate!`), so the
//! helpers below accept the plugin's stream handles directly.

use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

wit_bindgen::generate!({
    // The contract's wasi:io plus wasi:filesystem at the same version, so a
    // file's streams and the host's streams are one resource type and can
    // be spliced into each other.
    inline: "package berth:guest-kit;
             world imports {
                 import wasi:io/streams@0.2.12;
                 import wasi:filesystem/types@0.2.12;
                 import wasi:filesystem/preopens@0.2.12;
             }",
    path: ["../../wit/deps/io", "../wit-fs/deps/clocks.wit", "../wit-fs/deps/filesystem.wit"],
    world: "berth:guest-kit/imports",
    generate_all,
});

pub use wasi::io::streams::{InputStream, OutputStream, StreamError};

mod file_streams;
pub use file_streams::{open_file_stream_source, FileSource};

/// Bytes moved per stream call: large enough to amortise the host call,
/// small enough that memory stays flat whatever the archive size.
pub const CHUNK: usize = 256 * 1024;

/// Checks the contract's id grammar: `[A-Za-z0-9._-]{1,128}`, not `.`/`..`.
/// The one implementation lives in `berth-id`, shared with the host.
pub fn validate_id(id: &str) -> Result<(), String> {
    berth_id::check(id).map_err(|e| format!("snapshot id {id:?}: {e}"))
}

/// The contract's bindings for `world` (`"berth:snapshot/remote-client-plugin"`
/// or `"berth:snapshot/snapshot-plugin"`), generated from `wit/` with this
/// kit's `wasi:io` types, so the kit's stream helpers take the guest's
/// streams. Call it at the root of a guest crate. In `guest-examples/`
/// the contract is read from the repository's `wit/`; a crate elsewhere
/// names its own copy, relative to its `Cargo.toml`:
/// `contract_bindings!("remote-client-plugin", "wit")`.
#[macro_export]
macro_rules! contract_bindings {
    ($world:literal) => {
        $crate::contract_bindings!($world, "../../wit");
    };
    ($world:literal, $wit:literal) => {
        wit_bindgen::generate!({
            path: $wit,
            world: $world,
            with: {
                "wasi:io/streams@0.2.12": berth_guest_kit::wasi::io::streams,
                "wasi:io/error@0.2.12": berth_guest_kit::wasi::io::error,
                "wasi:io/poll@0.2.12": berth_guest_kit::wasi::io::poll,
            },
        });
    };
}

/// Why a stream copy stopped early.
#[derive(Debug)]
pub enum CopyError {
    /// The host's side of the stream reported a failure: the producer broke.
    Stream(String),
    /// Local storage failed.
    Storage(io::Error),
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::Stream(m) => write!(f, "archive stream failed: {m}"),
            CopyError::Storage(e) => write!(f, "storage failed: {e}"),
        }
    }
}

/// Reads `input` until the host closes it, writing every chunk to `out`.
/// Returns the number of bytes copied.
pub fn copy_input_to(input: &InputStream, out: &mut impl Write) -> Result<u64, CopyError> {
    let mut total = 0u64;
    loop {
        match input.blocking_read(CHUNK as u64) {
            Ok(chunk) => {
                out.write_all(&chunk).map_err(CopyError::Storage)?;
                total += chunk.len() as u64;
            }
            Err(StreamError::Closed) => return Ok(total),
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(CopyError::Stream(e.to_debug_string()))
            }
        }
    }
}

/// Reads `input` to its end and throws the bytes away.
pub fn drain_input(input: &InputStream) -> Result<u64, CopyError> {
    copy_input_to(input, &mut io::sink())
}

/// Copies `source` into `output` as fast as the host accepts it, then
/// flushes. Returns the number of bytes copied.
pub fn copy_to_output(source: &mut impl Read, output: &OutputStream) -> Result<u64, CopyError> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let permit = output.check_write().map_err(stream_error)? as usize;
        if permit == 0 {
            output.subscribe().block();
            continue;
        }
        let want = permit.min(buf.len());
        let n = read_some(source, &mut buf[..want]).map_err(CopyError::Storage)?;
        if n == 0 {
            break;
        }
        output.write(&buf[..n]).map_err(stream_error)?;
        total += n as u64;
    }
    output.blocking_flush().map_err(stream_error)?;
    Ok(total)
}

fn read_some(source: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match source.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn stream_error(e: StreamError) -> CopyError {
    match e {
        StreamError::Closed => CopyError::Stream("the host closed the stream".into()),
        StreamError::LastOperationFailed(e) => CopyError::Stream(e.to_debug_string()),
    }
}

/// A file written under a temporary name and only made visible by
/// [`PendingFile::commit`]; dropping it uncommitted removes the partial file.
/// This is how the examples honour the contract's atomic-visibility clause.
pub struct PendingFile {
    file: Option<File>,
    temp: PathBuf,
    target: PathBuf,
}

impl PendingFile {
    /// Starts a file that will become `target`. The partial data lives in
    /// `<dir of target>/.partial/`, which no snapshot id can name.
    pub fn create(target: &Path) -> io::Result<Self> {
        let dir = target
            .parent()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "target has no parent"))?
            .join(".partial");
        fs::create_dir_all(&dir)?;
        let temp = dir.join(format!("{:016x}", random_u64()));
        let file = File::create(&temp)?;
        Ok(PendingFile {
            file: Some(file),
            temp,
            target: target.to_path_buf(),
        })
    }

    /// Fills the file from `input` until the host closes it, splicing host
    /// stream into file stream: the bytes never enter guest memory.
    pub fn fill_from(&mut self, input: &InputStream) -> Result<u64, CopyError> {
        file_streams::splice_into_file(input, &self.temp)
    }

    /// Syncs the data and renames it over the target in one step.
    pub fn commit(mut self) -> io::Result<()> {
        if let Some(file) = self.file.take() {
            file.sync_all()?;
        }
        let renamed = fs::rename(&self.temp, &self.target);
        if renamed.is_err() {
            let _ = fs::remove_file(&self.temp);
        }
        renamed
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// A random value for temporary names, from the WASI random source that
/// seeds std's hash maps (no extra dependency needed).
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish()
}

/// Reads a configuration value, or the default.
pub fn config_value<'a>(config: &'a [(String, String)], key: &str, default: &'a str) -> &'a str {
    config
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or(default)
}
