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
            G::NotFound(m) => StorageError::NotFound(bounded(m)),
            G::InvalidId(m) => StorageError::InvalidId(bounded(m)),
            G::Denied(m) => StorageError::Denied(bounded(m)),
            G::Unavailable(m) => StorageError::Unavailable(bounded(m)),
            G::Io(m) => StorageError::Io(bounded(m)),
            G::Other(m) => StorageError::Other(bounded(m)),
        }
    }
}

impl From<snapshot::berth::snapshot::types::StorageError> for StorageError {
    fn from(e: snapshot::berth::snapshot::types::StorageError) -> Self {
        use snapshot::berth::snapshot::types::StorageError as G;
        match e {
            G::NotFound(m) => StorageError::NotFound(bounded(m)),
            G::InvalidId(m) => StorageError::InvalidId(bounded(m)),
            G::Denied(m) => StorageError::Denied(bounded(m)),
            G::Unavailable(m) => StorageError::Unavailable(bounded(m)),
            G::Io(m) => StorageError::Io(bounded(m)),
            G::Other(m) => StorageError::Other(bounded(m)),
        }
    }
}

/// Longest guest error message kept; a plugin cannot flood logs or callers
/// through its error strings.
const MAX_MESSAGE: usize = 4096;

fn bounded(mut m: String) -> String {
    if m.len() <= MAX_MESSAGE {
        return m;
    }
    let mut cut = MAX_MESSAGE;
    while !m.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = m.len() - cut;
    m.truncate(cut);
    m.push_str(&format!("… ({dropped} more bytes from the plugin dropped)"));
    m
}
