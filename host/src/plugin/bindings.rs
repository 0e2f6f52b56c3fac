//! Host bindings for the two contract worlds, generated from `wit/`.
//! The `wasi:io` types are wasmtime-wasi's, so the guest's streams are the
//! host's [`wasmtime_wasi::p2::DynInputStream`] / `DynOutputStream`.

use crate::store_error::StorageError;

/// Bindings of the `remote-client-plugin` world.
pub(crate) mod remote {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "berth:snapshot/remote-client-plugin",
        imports: { default: async },
        exports: { default: async },
        with: {
            "wasi:io/poll": wasmtime_wasi_io::bindings::wasi::io::poll,
            "wasi:io/streams": wasmtime_wasi_io::bindings::wasi::io::streams,
            "wasi:io/error": wasmtime_wasi_io::bindings::wasi::io::error,
        },
    });
}

/// Bindings of the `snapshot-plugin` world.
pub(crate) mod snapshot {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "berth:snapshot/snapshot-plugin",
        imports: { default: async },
        exports: { default: async },
        with: {
            "wasi:io/poll": wasmtime_wasi_io::bindings::wasi::io::poll,
            "wasi:io/streams": wasmtime_wasi_io::bindings::wasi::io::streams,
            "wasi:io/error": wasmtime_wasi_io::bindings::wasi::io::error,
        },
    });
}

impl From<remote::berth::snapshot::types::StorageError> for StorageError {
    fn from(e: remote::berth::snapshot::types::StorageError) -> Self {
        use remote::berth::snapshot::types::StorageError as G;
        match e {
            G::NotFound(m) => StorageError::NotFound(m),
            G::InvalidId(m) => StorageError::InvalidId(m),
            G::Denied(m) => StorageError::Denied(m),
            G::Unavailable(m) => StorageError::Unavailable(m),
            G::Io(m) => StorageError::Io(m),
            G::Other(m) => StorageError::Other(m),
        }
    }
}

impl From<snapshot::berth::snapshot::types::StorageError> for StorageError {
    fn from(e: snapshot::berth::snapshot::types::StorageError) -> Self {
        use snapshot::berth::snapshot::types::StorageError as G;
        match e {
            G::NotFound(m) => StorageError::NotFound(m),
            G::InvalidId(m) => StorageError::InvalidId(m),
            G::Denied(m) => StorageError::Denied(m),
            G::Unavailable(m) => StorageError::Unavailable(m),
            G::Io(m) => StorageError::Io(m),
            G::Other(m) => StorageError::Other(m),
        }
    }
}
