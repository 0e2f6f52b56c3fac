//! `broken-store`: a deliberately wrong remote snapshot client, used to prove
//! that the conformance suite fails the clauses it breaks. It writes uploads
//! straight over the final file (so a broken upload destroys the previous
//! archive) and accepts any snapshot id. Never use it for real data.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;

use berth_guest_kit::{config_value, copy_input_to, copy_to_output};

berth_guest_kit::contract_bindings!("berth:snapshot/remote-client-plugin");

use exports::berth::snapshot::remote_client::{
    Client, Config, Guest, GuestClient, InputStream, OutputStream, StorageError,
};

struct BrokenStore {
    root: PathBuf,
}

impl BrokenStore {
    /// Flattens the id instead of validating it: the bug under test.
    fn path_of(&self, id: &str) -> PathBuf {
        let flat: String = id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.root.join(format!("x{flat}.tar"))
    }
}

fn io_err(e: io::Error) -> StorageError {
    StorageError::Io(e.to_string())
}

impl GuestClient for BrokenStore {
    fn open(config: Config) -> Result<Client, StorageError> {
        Ok(Client::new(BrokenStore {
            root: PathBuf::from(config_value(&config, "root", "/data")),
        }))
    }

    fn upload(&self, snapshot_id: String, data: InputStream) -> Result<(), StorageError> {
        let mut file = File::create(self.path_of(&snapshot_id)).map_err(io_err)?;
        copy_input_to(&data, &mut file).map_err(|e| StorageError::Io(e.to_string()))?;
        Ok(())
    }

    fn download(&self, snapshot_id: String, sink: OutputStream) -> Result<(), StorageError> {
        let mut file = File::open(self.path_of(&snapshot_id))
            .map_err(|e| StorageError::NotFound(e.to_string()))?;
        copy_to_output(&mut file, &sink).map_err(|e| StorageError::Io(e.to_string()))?;
        Ok(())
    }

    fn exists(&self, snapshot_id: String) -> Result<bool, StorageError> {
        Ok(self.path_of(&snapshot_id).is_file())
    }

    fn delete(&self, snapshot_id: String) -> Result<(), StorageError> {
        fs::remove_file(self.path_of(&snapshot_id))
            .map_err(|e| StorageError::NotFound(e.to_string()))
    }
}

struct Component;

impl Guest for Component {
    type Client = BrokenStore;
}

export!(Component);
