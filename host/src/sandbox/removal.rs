//! Removing a named sandbox — its orphans, its instance, the snapshots
//! Berth made for it, and its name — in one place for the CLI and the
//! server, and the record of what a removal had to leave for forks
//! (`HOME/leftovers/<snapshot>.json`), which `berth gc --orphans` reads.

use std::path::PathBuf;

use super::{NamedSandboxError, NamedSandboxes, SandboxError, SnapshotState, StateFile, StateLock};
use crate::backend::BackendError;
use crate::snapshot::DeleteReport;

/// How to remove a sandbox.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoveOptions {
    /// Forget it even if removing an orphan, shutting down or deleting the
    /// snapshot fails (what failed is listed in [`Removal::forced`]).
    pub force: bool,
    /// Save the workspace into its snapshot first (as a stop does) and
    /// keep the snapshot.
    pub keep_snapshot: bool,
}

/// What a removal did.
#[derive(Debug)]
#[non_exhaustive]
pub struct Removal {
    /// Orphans removed (their instance and where it ran).
    pub orphans_removed: Vec<String>,
    /// What failed and was passed over because of
    /// [`RemoveOptions::force`], one sentence each.
    pub forced: Vec<String>,
    /// The snapshot as it was before the removal.
    pub snapshot: SnapshotState,
    /// What deleting the snapshot did (`None` when it was kept, or when
    /// deleting it failed and was forced past).
    pub deleted: Option<DeleteReport>,
}

/// Why a sandbox was not removed. Its state is kept in every case, so the
/// same removal can be run again once the cause is fixed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoveError {
    /// Orphans (instances left where a moved sandbox ran before) could not
    /// be removed: their place does not answer.
    #[error("{} of {name}'s orphans are still there ({}); remove it again once their engine answers, or force it to forget them", remaining.len(), remaining.iter().map(|(what, e)| format!("{what}: {e}")).collect::<Vec<_>>().join("; "))]
    OrphansRemain {
        /// The sandbox.
        name: String,
        /// Each orphan still there, with why.
        remaining: Vec<(String, BackendError)>,
    },
    /// Shutting the sandbox's instance down failed.
    #[error("shutting {name} down failed; its state was kept: fix the problem and remove it again, or force it")]
    Shutdown {
        /// The sandbox.
        name: String,
        /// Why.
        #[source]
        source: SandboxError,
    },
    /// Deleting the snapshot failed (the instance is shut down).
    #[error("deleting the snapshot {id} of {name} failed; the sandbox is shut down and its snapshot still stored: remove it again to delete it, or force it to forget it")]
    DeleteSnapshot {
        /// The sandbox.
        name: String,
        /// The snapshot's id.
        id: String,
        /// Why.
        #[source]
        source: SandboxError,
    },
    /// Reading, writing or locking its state failed.
    #[error(transparent)]
    Named(#[from] NamedSandboxError),
}

impl NamedSandboxes {
    /// Removes sandbox `name`, whose lock the caller holds (`_lock`): its
    /// orphans, its instance (after a stop when
    /// [`RemoveOptions::keep_snapshot`]), unless kept the snapshots Berth
    /// made for it (generations a fork starts from are kept and recorded
    /// for [`NamedSandboxes::leftovers`]), then its state. On an error
    /// nothing is forgotten: what changed is saved and the state stays.
    pub async fn remove_locked(
        &self,
        _lock: &StateLock,
        name: &str,
        options: RemoveOptions,
    ) -> Result<Removal, RemoveError> {
        let mut record = self.load(name)?;
        let mut removal = Removal {
            orphans_removed: Vec::new(),
            forced: Vec::new(),
            snapshot: record.state.snapshot.clone(),
            deleted: None,
        };
        if !record.state.orphans.is_empty() {
            let cleanup = self.client().remove_orphans(&record.state).await;
            record.state = cleanup.state;
            self.save(&record)?;
            removal.orphans_removed = cleanup.removed;
            if !cleanup.remaining.is_empty() {
                if !options.force {
                    return Err(RemoveError::OrphansRemain {
                        name: name.to_string(),
                        remaining: cleanup.remaining,
                    });
                }
                for (what, e) in cleanup.remaining {
                    removal
                        .forced
                        .push(format!("forgot orphan {what}, which is still there: {e}"));
                }
            }
        }
        let mut sandbox = self.resume(&record, |_| {}).await?;
        let closed = if options.keep_snapshot && sandbox.state().workspace_root_ready {
            sandbox.close().await
        } else {
            sandbox.shutdown().await
        };
        record.state = sandbox.state();
        removal.snapshot = record.state.snapshot.clone();
        if let Err(source) = closed {
            if !options.force {
                self.save(&record)?;
                return Err(RemoveError::Shutdown {
                    name: name.to_string(),
                    source,
                });
            }
            removal.forced.push(format!(
                "shutting it down failed: {}",
                crate::error_text::causes(&source)
            ));
        }
        if !options.keep_snapshot {
            match sandbox.delete_snapshot().await {
                Ok(report) => {
                    if !report.kept.is_empty() {
                        self.record_leftover(&sandbox.state().snapshot)?;
                    }
                    removal.deleted = Some(report);
                }
                Err(source) if options.force => removal.forced.push(format!(
                    "deleting the snapshot failed (its objects stay in the store): {}",
                    crate::error_text::causes(&source)
                )),
                Err(source) => {
                    self.save(&record)?;
                    return Err(RemoveError::DeleteSnapshot {
                        name: name.to_string(),
                        id: record.state.snapshot.id.to_string(),
                        source,
                    });
                }
            }
        }
        self.remove(name)?;
        Ok(removal)
    }

    fn leftover_file(&self, id: &str) -> StateFile {
        StateFile::new(self.home().join("leftovers").join(format!("{id}.json")))
    }

    /// Records (or replaces) what a removal had to leave of `snapshot`
    /// (generations a fork starts from).
    pub fn record_leftover(&self, snapshot: &SnapshotState) -> Result<(), NamedSandboxError> {
        let text = serde_json::to_string_pretty(snapshot).map_err(|source| {
            NamedSandboxError::Corrupt {
                path: self
                    .leftover_file(snapshot.id.as_str())
                    .path()
                    .to_path_buf(),
                source,
            }
        })?;
        Ok(self.leftover_file(snapshot.id.as_str()).write(&text)?)
    }

    /// Forgets the leftover of `snapshot`: nothing of it is left.
    pub fn forget_leftover(&self, snapshot: &SnapshotState) -> Result<(), NamedSandboxError> {
        Ok(self.leftover_file(snapshot.id.as_str()).remove()?)
    }

    /// Every recorded leftover, by snapshot id, and the records that did
    /// not parse.
    pub fn leftovers(&self) -> (Vec<SnapshotState>, Vec<PathBuf>) {
        let mut found = Vec::new();
        let mut unreadable = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.home().join("leftovers")) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                match std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|t| serde_json::from_str::<SnapshotState>(&t).ok())
                {
                    Some(s) => found.push(s),
                    None => unreadable.push(p),
                }
            }
        }
        found.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        unreadable.sort();
        (found, unreadable)
    }
}
