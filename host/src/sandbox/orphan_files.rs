//! Local snapshot files no sandbox uses: what `berth gc --orphans` lists
//! and deletes in the local stores. Which files a local snapshot keeps is
//! the local kind's business (`<base>/<id>.tar`, and the partial files of
//! a stop); front ends get paths and reasons from here, never a layout.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use super::named::{NamedSandbox, NamedSandboxes};
use crate::snapshot::LocalSnapshot;

/// A file in a local snapshot directory that no known sandbox uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanFile {
    /// The file.
    pub path: PathBuf,
    /// Why it is an orphan.
    pub reason: OrphanFileReason,
}

/// Why a local snapshot file is an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrphanFileReason {
    /// A whole archive in the home's snapshot directory that no sandbox's
    /// snapshot is (left by an older `rm`, or by a state file deleted by
    /// hand).
    Unused,
    /// The unfinished archive of a stop that was killed (a cancelled stop
    /// removes its own; no live writer holds this one).
    UnfinishedStop,
}

impl fmt::Display for OrphanFileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrphanFileReason::Unused => "no sandbox uses it",
            OrphanFileReason::UnfinishedStop => "an unfinished archive of a stop that was killed",
        })
    }
}

impl NamedSandboxes {
    /// The files of local snapshots that none of `known` (the sandboxes
    /// under this home, as [`NamedSandboxes::list`] reads them) uses:
    /// whole archives in `$BERTH_HOME/snapshots` (every file there is
    /// Berth's), and unfinished archives of killed stops there and in
    /// every local snapshot directory a known sandbox uses. Sorted; nothing
    /// is deleted here.
    pub fn orphan_files(&self, known: &[NamedSandbox]) -> Vec<OrphanFile> {
        let home_dir = self.home().join("snapshots");
        let local: Vec<(PathBuf, PathBuf)> = known
            .iter()
            .filter(|s| s.state.snapshot.kind == LocalSnapshot::KIND)
            .filter_map(|s| {
                let base = s.state.snapshot.base_dir.clone()?;
                let file = LocalSnapshot::archive_of(&base, s.state.snapshot.id.as_str());
                Some((base, file))
            })
            .collect();
        let used: BTreeSet<&PathBuf> = local.iter().map(|(_, file)| file).collect();
        let mut out: Vec<OrphanFile> = LocalSnapshot::archives_in(&home_dir)
            .into_iter()
            .filter(|file| !used.contains(file))
            .map(|path| OrphanFile {
                path,
                reason: OrphanFileReason::Unused,
            })
            .collect();
        let mut bases: BTreeSet<PathBuf> = local.into_iter().map(|(base, _)| base).collect();
        bases.insert(home_dir);
        for base in bases {
            out.extend(
                LocalSnapshot::abandoned_partials(&base)
                    .into_iter()
                    .map(|path| OrphanFile {
                        path,
                        reason: OrphanFileReason::UnfinishedStop,
                    }),
            );
        }
        out
    }
}
