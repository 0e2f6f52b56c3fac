//! {{name}}: a Berth store plugin (world `remote-client-plugin`).
//!
//! It keeps each snapshot as `<root>/<id>.tar` in a directory the host
//! grants it (see berth-plugin.toml), and makes an upload visible only when
//! it is complete: the bytes go to `<root>/.partial/` first and are renamed
//! into place, so a broken upload never replaces the previous snapshot.
//!
//! A real backend goes where the comments say `BACKEND:`; keep the rules
//! that `berth plugin check` tests: the id grammar, `not-found` for a
//! missing snapshot, all-or-nothing uploads, and reading each stream to
//! its end.

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::path::PathBuf;

wit_bindgen::generate!({
    path: "wit",
    world: "berth:fs-guest/fs-remote-client",
    generate_all,
});

use exports::berth::snapshot::remote_client::{Client, Config, Guest, GuestClient, StorageError};
use wasi::io::streams::{InputStream, OutputStream, StreamError};

/// Bytes moved per stream call.
const CHUNK: usize = 256 * 1024;

struct Store {
    /// BACKEND: the connection to a real store (a bucket, a database, an
    /// HTTP endpoint granted in `grants.http_hosts`) goes here.
    root: PathBuf,
}

/// The contract's id grammar: `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
fn check_id(id: &str) -> Result<(), StorageError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidId(format!(
            "snapshot id {id:?} is not [A-Za-z0-9._-]{{1,128}}"
        )))
    }
}

fn io_error(what: &str, e: io::Error) -> StorageError {
    match e.kind() {
        io::ErrorKind::PermissionDenied => StorageError::Denied(format!("{what}: {e}")),
        _ => StorageError::Io(format!("{what}: {e}")),
    }
}

fn stream_error(e: StreamError) -> StorageError {
    match e {
        StreamError::Closed => StorageError::Io("the host closed the stream".into()),
        StreamError::LastOperationFailed(e) => {
            StorageError::Io(format!("archive stream failed: {}", e.to_debug_string()))
        }
    }
}

fn random_name() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    format!("{:016x}", h.finish())
}

impl Store {
    fn path_of(&self, id: &str) -> Result<PathBuf, StorageError> {
        check_id(id)?;
        Ok(self.root.join(format!("{id}.tar")))
    }
}

impl GuestClient for Store {
    fn open(config: Config) -> Result<Client, StorageError> {
        let root = config
            .iter()
            .rev()
            .find(|(k, _)| k == "root")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| PathBuf::from("/data"));
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Client::new(Store { root })),
            Ok(_) => Err(StorageError::Other(format!("root {} is not a directory", root.display()))),
            Err(e) => Err(StorageError::Denied(format!(
                "root {} is not reachable ({e}); grant it in the plugin manifest",
                root.display()
            ))),
        }
    }

    fn upload(&self, snapshot_id: String, data: InputStream) -> Result<(), StorageError> {
        let target = self.path_of(&snapshot_id)?;
        // BACKEND: stream `data` to the real store; make it visible only
        // once the whole stream has arrived.
        let partial = self.root.join(".partial");
        fs::create_dir_all(&partial).map_err(|e| io_error("creating .partial", e))?;
        let temp = partial.join(random_name());
        let result = (|| {
            let mut file = fs::File::create(&temp).map_err(|e| io_error("creating the upload", e))?;
            loop {
                match data.blocking_read(CHUNK as u64) {
                    Ok(chunk) => file
                        .write_all(&chunk)
                        .map_err(|e| io_error("writing the upload", e))?,
                    Err(StreamError::Closed) => break,
                    Err(e) => return Err(stream_error(e)),
                }
            }
            file.sync_all().map_err(|e| io_error("syncing the upload", e))?;
            fs::rename(&temp, &target).map_err(|e| io_error("committing the upload", e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    fn download(&self, snapshot_id: String, sink: OutputStream) -> Result<(), StorageError> {
        let path = self.path_of(&snapshot_id)?;
        // BACKEND: fetch from the real store, writing to `sink` as it comes.
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(format!("no snapshot {snapshot_id:?}")))
            }
            Err(e) => return Err(io_error("opening the snapshot", e)),
        };
        let mut buf = vec![0u8; CHUNK];
        loop {
            let permit = sink.check_write().map_err(stream_error)? as usize;
            if permit == 0 {
                sink.subscribe().block();
                continue;
            }
            let n = file
                .read(&mut buf[..permit.min(CHUNK)])
                .map_err(|e| io_error("reading the snapshot", e))?;
            if n == 0 {
                break;
            }
            sink.write(&buf[..n]).map_err(stream_error)?;
        }
        sink.blocking_flush().map_err(stream_error)
    }

    fn exists(&self, snapshot_id: String) -> Result<bool, StorageError> {
        let path = self.path_of(&snapshot_id)?;
        match fs::metadata(&path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error("checking the snapshot", e)),
        }
    }

    fn delete(&self, snapshot_id: String) -> Result<(), StorageError> {
        let path = self.path_of(&snapshot_id)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(StorageError::NotFound(format!("no snapshot {snapshot_id:?}")))
            }
            Err(e) => Err(io_error("deleting the snapshot", e)),
        }
    }
}

struct Component;

impl Guest for Component {
    type Client = Store;
}

export!(Component);
