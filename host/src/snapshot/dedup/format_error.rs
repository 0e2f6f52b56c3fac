//! Why an object of a deduplicated snapshot is unusable: the kind's own
//! error, carried as the source of `StoreError::Format`.

use crate::store_error::StoreError;

/// Why an object is not what it claims to be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The object's content does not hash to the name or checksum it has.
    #[error("its content does not match its checksum (expected {expected}, got {actual})")]
    Checksum {
        /// The checksum the name or trailer promises.
        expected: String,
        /// The checksum of what arrived.
        actual: String,
    },
    /// The object is not of the expected kind or is cut short.
    #[error("it is not a valid {kind}: {why}")]
    Malformed {
        /// `pack` or `index`.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Written by a newer version of Berth.
    #[error("it is format version {0}; this build reads version {v} (upgrade Berth)", v = super::FORMAT_VERSION)]
    Version(u32),
    /// The object is not in the store, though the snapshot needs it.
    #[error("it is missing from the store (removed behind Berth's back?); restore another kept generation, or start afresh")]
    Missing,
    /// A chunk's bytes do not hash to its id.
    #[error("chunk {0} does not hash to its id")]
    Chunk(String),
    /// The reassembled archive differs from the one the index describes.
    #[error("the reassembled archive does not match the index ({0})")]
    Archive(String),
}

/// `object` is unusable because of `source`.
pub(super) fn damaged(object: impl Into<String>, source: FormatError) -> StoreError {
    StoreError::Format {
        object: object.into(),
        source: Box::new(source),
    }
}
