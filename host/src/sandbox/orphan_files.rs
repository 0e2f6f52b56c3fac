//! Snapshot files no sandbox uses: what `berth gc --orphans` lists and
//! deletes. Which files a kind keeps is its provider's business (see
//! [`crate::snapshot::SnapshotProvider::orphan_files`]); front ends get
//! paths and reasons from here, never a layout.

use super::named::{NamedSandbox, NamedSandboxes};
use crate::snapshot::OrphanFile;

impl NamedSandboxes {
    /// The snapshot files under this home (and in the places the
    /// snapshots of `known` use) that none of `known` (the sandboxes under
    /// this home, as [`NamedSandboxes::list`] reads them) uses, asked of
    /// every snapshot kind's provider. Nothing is deleted here.
    pub fn orphan_files(&self, known: &[NamedSandbox]) -> Vec<OrphanFile> {
        let states: Vec<_> = known.iter().map(|s| &s.state.snapshot).collect();
        self.client().snapshot_orphan_files(&states)
    }
}
