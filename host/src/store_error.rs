//! Errors of snapshot stores, native or plugin.

use std::io;

use crate::plugin_error::PluginError;

/// A store's own answer, mirroring the WIT `storage-error` variant so native
/// and Wasm stores fail the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// No archive is stored under the id.
    #[error("not found: {}", said(.0))]
    NotFound(String),
    /// The id breaks the id grammar.
    #[error("invalid snapshot id: {}", said(.0))]
    InvalidId(String),
    /// Grants or credentials do not allow the operation.
    #[error("denied: {}", said(.0))]
    Denied(String),
    /// Transient; the same call may succeed later.
    #[error("unavailable (transient, retry later): {}", said(.0))]
    Unavailable(String),
    /// Reading or writing storage failed.
    #[error("storage i/o failed: {}", said(.0))]
    Io(String),
    /// Anything else, including invalid configuration.
    #[error("{}", said(.0))]
    Other(String),
}

/// A store's message, or a note that it gave none (rather than an empty
/// string after a colon).
fn said(message: &str) -> &str {
    if message.trim().is_empty() {
        "(the store gave no message)"
    } else {
        message
    }
}

impl StorageError {
    /// Short name of the variant, as in the WIT contract.
    pub fn kind(&self) -> &'static str {
        match self {
            StorageError::NotFound(_) => "not-found",
            StorageError::InvalidId(_) => "invalid-id",
            StorageError::Denied(_) => "denied",
            StorageError::Unavailable(_) => "unavailable",
            StorageError::Io(_) => "io",
            StorageError::Other(_) => "other",
        }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store answered with an error.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The plugin behind the store failed (trap, deadline, memory, contract).
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// Reading the archive we were given failed; nothing was committed.
    #[error("reading the archive to store failed")]
    Source(#[source] io::Error),
    /// Writing the archive to its destination failed.
    #[error("writing the restored archive failed")]
    Sink(#[source] io::Error),
    /// An object of a snapshot is damaged, missing a part, or not what its
    /// name says; nothing was extracted.
    #[error("snapshot object {object} is unusable")]
    Format {
        /// The object's id in the store.
        object: String,
        /// What is wrong with it, in the snapshot kind's own error (for a
        /// deduplicated snapshot, `snapshot::FormatError`; reach it
        /// with `downcast_ref`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Preparing or reading a deduplicated snapshot's files on this host
    /// (packs being built, downloaded packs) failed.
    #[error("{what} failed")]
    Local {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// The contract variant when the store itself answered.
    pub fn storage(&self) -> Option<&StorageError> {
        match self {
            StoreError::Storage(e) => Some(e),
            _ => None,
        }
    }
}
