//! `noop-snapshot`: a Berth snapshot plugin that stores nothing. Persist
//! reads the archive to its end and discards it; restore fails with
//! `not-found`; it is never restorable. Needs no grants at all.

use berth_guest_kit::{drain_input, validate_id};

berth_guest_kit::contract_bindings!("berth:snapshot/snapshot-plugin");

use exports::berth::snapshot::snapshot::{
    Config, Guest, GuestSnapshot, InputStream, OutputStream, Snapshot, StorageError,
};

struct NoopSnapshot {
    id: String,
}

impl GuestSnapshot for NoopSnapshot {
    fn open(id: String, _config: Config) -> Result<Snapshot, StorageError> {
        validate_id(&id).map_err(StorageError::InvalidId)?;
        Ok(Snapshot::new(NoopSnapshot { id }))
    }

    fn id(&self) -> String {
        self.id.clone()
    }

    fn kind(&self) -> String {
        "noop".to_string()
    }

    fn persistence_enabled(&self) -> bool {
        false
    }

    fn persist(&self, archive: InputStream) -> Result<(), StorageError> {
        drain_input(&archive).map_err(|e| StorageError::Io(e.to_string()))?;
        Ok(())
    }

    fn restore(&self, _sink: OutputStream) -> Result<(), StorageError> {
        Err(StorageError::NotFound(format!(
            "snapshot {:?} is a noop snapshot: persistence is disabled, nothing was stored",
            self.id
        )))
    }

    fn is_restorable(&self) -> Result<bool, StorageError> {
        Ok(false)
    }
}

struct Component;

impl Guest for Component {
    type Snapshot = NoopSnapshot;
}

export!(Component);
