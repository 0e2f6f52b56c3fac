//! `fs-store`: a Berth remote snapshot client over a directory the host
//! preopened for it. Archives live at `<root>/<id>.tar`; uploads are written
//! under `<root>/.partial/` and renamed into place only when complete, so a
//! broken upload never replaces the previous archive.
//!
//! Config: `root` — the guest path of the granted directory (default `/data`).

use std::fs;
use std::io;
use std::path::PathBuf;

use berth_guest_kit::{config_value, open_file_stream_source, validate_id, PendingFile};

berth_guest_kit::contract_bindings!("berth:snapshot/remote-client-plugin");

use exports::berth::snapshot::remote_client::{
    Client, Config, Guest, GuestClient, InputStream, OutputStream, StorageError,
};

struct FsStore {
    root: PathBuf,
}

impl FsStore {
    fn path_of(&self, id: &str) -> Result<PathBuf, StorageError> {
        validate_id(id).map_err(StorageError::InvalidId)?;
        Ok(self.root.join(format!("{id}.tar")))
    }
}

fn io_error(what: &str, e: io::Error) -> StorageError {
    match e.kind() {
        io::ErrorKind::PermissionDenied => StorageError::Denied(format!("{what}: {e}")),
        _ => StorageError::Io(format!("{what}: {e}")),
    }
}

impl GuestClient for FsStore {
    fn open(config: Config) -> Result<Client, StorageError> {
        let root = PathBuf::from(config_value(&config, "root", "/data"));
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Client::new(FsStore { root })),
            Ok(_) => Err(StorageError::Other(format!(
                "root {} is not a directory",
                root.display()
            ))),
            Err(e) => Err(StorageError::Denied(format!(
                "root {} is not reachable ({e}); grant it as a preopened directory in the plugin manifest",
                root.display()
            ))),
        }
    }

    fn upload(&self, snapshot_id: String, data: InputStream) -> Result<(), StorageError> {
        let target = self.path_of(&snapshot_id)?;
        let mut pending =
            PendingFile::create(&target).map_err(|e| io_error("creating the upload file", e))?;
        pending
            .fill_from(&data)
            .map_err(|e| StorageError::Io(e.to_string()))?;
        pending
            .commit()
            .map_err(|e| io_error("committing the upload", e))
    }

    fn download(&self, snapshot_id: String, sink: OutputStream) -> Result<(), StorageError> {
        let path = self.path_of(&snapshot_id)?;
        let file = match open_file_stream_source(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(format!(
                    "no snapshot {snapshot_id:?}"
                )))
            }
            Err(e) => return Err(io_error("opening the snapshot", e)),
        };
        file.splice_to(&sink)
            .map_err(|e| StorageError::Io(e.to_string()))?;
        Ok(())
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StorageError::NotFound(format!(
                "no snapshot {snapshot_id:?}"
            ))),
            Err(e) => Err(io_error("deleting the snapshot", e)),
        }
    }
}

struct Component;

impl Guest for Component {
    type Client = FsStore;
}

export!(Component);
