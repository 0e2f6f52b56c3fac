//! What an archive may hold: caps checked from its headers, before any
//! content is read.

/// Caps on what an archive may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArchiveLimits {
    /// Total declared bytes of all entries.
    pub max_bytes: u64,
    /// Number of entries.
    pub max_entries: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_bytes: 64 << 30,
            max_entries: 2_000_000,
        }
    }
}

impl ArchiveLimits {
    /// The most bytes a tar stream within these limits can take: the
    /// content limit plus room for each entry's headers. Streams from
    /// outside (a user's file, a store without a recorded size) are read up
    /// to this and no further.
    pub fn max_stream_bytes(&self) -> u64 {
        self.max_bytes
            .saturating_add(self.max_entries.saturating_mul(3 * 512))
            .saturating_add(1024)
    }
}
