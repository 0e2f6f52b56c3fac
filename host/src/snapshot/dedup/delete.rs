//! Deleting a deduplicated snapshot for good: every generation it wrote,
//! the packs only those use, its journal, and the whole archive it may
//! have started from — except what a fork still needs.
//!
//! The safety argument is the collector's (see `gc.rs` and
//! `docs/SNAPSHOT-FORMAT.md`): only packs carrying this snapshot's owner tag
//! are ever deleted, and a fork references this snapshot's packs only
//! through the generation it forked from, whose pin marks it. Which
//! generations stay is decided by [`Keep`]: the pins in the store when the
//! sandbox itself is removed, or the set of fork bases still known when
//! leftovers of an earlier removal are collected.

use std::collections::BTreeSet;

use super::format::names;
use super::{is_not_found, DedupSnapshot};
use crate::snapshot::{DeleteReport, KeptObject};
use crate::store_error::StoreError;

/// Which of a removed snapshot's generations must stay.
#[derive(Debug, Clone)]
pub enum Keep {
    /// Those with a pin object in the store (a fork started from them).
    Pinned,
    /// Those whose index is in this set (the bases of the forks still
    /// known); their pins are deleted with the rest otherwise.
    Bases(BTreeSet<String>),
}

impl DedupSnapshot {
    /// Deletes every object of this snapshot that no fork needs (see
    /// [`Keep`]). With `dry_run`, lists them and deletes nothing. Run it
    /// under the sandbox's lock, with no stop of this snapshot running.
    // Kept as one function: list, decide what forks keep, delete indexes
    // after packs, report: the decisions share the sets the listing builds.
    pub async fn delete_all(&self, keep: &Keep, dry_run: bool) -> Result<DeleteReport, StoreError> {
        if !dry_run {
            self.settle().await;
        }
        let record = self.record();
        let mut indexes: Vec<(u64, String)> = record
            .generations
            .iter()
            .chain(&record.pinned)
            .chain(&record.doomed)
            .map(|g| (g.number, g.index.clone()))
            .collect();
        // A stop that committed but whose state write was lost.
        let unrecorded = names::index(self.id.as_str(), record.next_number());
        if self.client.exists(&unrecorded).await? {
            indexes.push((record.next_number(), unrecorded));
        }
        let mut report = DeleteReport::default();
        let mut kept = Vec::new();
        let mut doomed = Vec::new();
        for (number, index) in indexes {
            let stays = match keep {
                Keep::Pinned => self.client.exists(&names::pin(&index)).await?,
                Keep::Bases(bases) => bases.contains(&index),
            };
            if stays {
                report.kept.push(KeptObject {
                    object: index.clone(),
                    why: format!("generation {number}: a fork starts from it"),
                });
                kept.push(index);
            } else {
                doomed.push(index);
            }
        }
        // An unreadable kept index stops the deletion: better to keep
        // garbage than to delete a pack a fork needs.
        let mut referenced = BTreeSet::new();
        for index in &kept {
            referenced.extend(self.packs_of(index).await?.iter().cloned());
        }
        // A fork of a fork starts from an index of another snapshot that
        // may reference this one's packs: every known base counts. One that
        // is not in this store belongs to another store.
        if let Keep::Bases(bases) = keep {
            for index in bases {
                match self.packs_of(index).await {
                    Ok(packs) => referenced.extend(packs.iter().cloned()),
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let mut candidates = BTreeSet::new();
        let mut indexes_gone = Vec::new();
        for index in &doomed {
            match self.packs_of(index).await {
                Ok(packs) => {
                    candidates.extend(packs.iter().cloned());
                    indexes_gone.push(index.clone());
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let journal = match self.journal_packs().await? {
            Some(packs) => {
                candidates.extend(packs);
                true
            }
            None => false,
        };
        let packs = self.own_unreferenced(candidates, &referenced);
        // Packs go first (a retry after a crash finds them through the
        // indexes that remain), then the rest.
        let mut objects: Vec<String> = indexes_gone.clone();
        if journal {
            objects.push(names::journal(self.id.as_str()));
        }
        if matches!(keep, Keep::Bases(_)) {
            for index in &indexes_gone {
                let pin = names::pin(index);
                if self.client.exists(&pin).await? {
                    objects.push(pin);
                }
            }
        }
        // The whole archive a snapshot that used to be whole-tar kept.
        if self.client.exists(self.id.as_str()).await? {
            objects.push(self.id.as_str().to_string());
        }
        if dry_run {
            report.deleted = packs;
            report.deleted.extend(objects);
        } else {
            report.deleted = self.delete_objects(&packs).await?;
            report.deleted.extend(self.delete_objects(&objects).await?);
            for i in &indexes_gone {
                self.indexes.forget(i);
            }
            let kept_set: BTreeSet<&String> = kept.iter().collect();
            self.update_record(|r| {
                let stays = |g: &super::Generation| kept_set.contains(&g.index);
                let mut pinned: Vec<_> = r.generations.drain(..).filter(stays).collect();
                pinned.extend(r.pinned.drain(..).filter(stays));
                pinned.extend(r.doomed.drain(..).filter(stays));
                r.pinned = pinned;
                r.current = None;
                r.last_stop = None;
            });
        }
        Ok(report)
    }
}
