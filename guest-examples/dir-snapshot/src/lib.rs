//! `dir-snapshot`: a Berth snapshot plugin that keeps one sandbox's archive
//! at `<dir>/<id>.tar` in a directory the host preopened for it. Persist
//! writes under `<dir>/.partial/` and renames into place when complete.
//!
//! Config: `dir` — the guest path of the granted directory (default `/data`).

use std::fs;
use std::io;
use std::path::PathBuf;

use berth_guest_kit::{config_value, open_file_stream_source, validate_id, PendingFile};

berth_guest_kit::contract_bindings!("berth:snapshot/snapshot-plugin");

use exports::berth::snapshot::snapshot::{
    Config, Guest, GuestSnapshot, InputStream, OutputStream, Snapshot, StorageError,
};

struct DirSnapshot {
    id: String,
    path: PathBuf,
}

fn io_error(what: &str, e: io::Error) -> StorageError {
    match e.kind() {
        io::ErrorKind::PermissionDenied => StorageError::Denied(format!("{what}: {e}")),
        _ => StorageError::Io(format!("{what}: {e}")),
    }
}

impl GuestSnapshot for DirSnapshot {
    fn open(id: String, config: Config) -> Result<Snapshot, StorageError> {
        validate_id(&id).map_err(StorageError::InvalidId)?;
        let dir = PathBuf::from(config_value(&config, "dir", "/data"));
        if !fs::metadata(&dir).map(|m| m.is_dir()).unwrap_or(false) {
            return Err(StorageError::Denied(format!(
                "directory {} is not reachable; grant it as a preopened directory in the plugin manifest",
                dir.display()
            )));
        }
        let path = dir.join(format!("{id}.tar"));
        Ok(Snapshot::new(DirSnapshot { id, path }))
    }

    fn id(&self) -> String {
        self.id.clone()
    }

    fn kind(&self) -> String {
        "dir".to_string()
    }

    fn persistence_enabled(&self) -> bool {
        true
    }

    fn persist(&self, archive: InputStream) -> Result<(), StorageError> {
        let mut pending =
            PendingFile::create(&self.path).map_err(|e| io_error("creating the archive", e))?;
        pending
            .fill_from(&archive)
            .map_err(|e| StorageError::Io(e.to_string()))?;
        pending
            .commit()
            .map_err(|e| io_error("committing the archive", e))
    }

    fn restore(&self, sink: OutputStream) -> Result<(), StorageError> {
        let file = match open_file_stream_source(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(format!(
                    "snapshot {:?} was never persisted",
                    self.id
                )))
            }
            Err(e) => return Err(io_error("opening the archive", e)),
        };
        file.splice_to(&sink)
            .map_err(|e| StorageError::Io(e.to_string()))?;
        Ok(())
    }

    fn is_restorable(&self) -> Result<bool, StorageError> {
        match fs::metadata(&self.path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error("checking the archive", e)),
        }
    }
}

struct Component;

impl Guest for Component {
    type Snapshot = DirSnapshot;
}

export!(Component);
