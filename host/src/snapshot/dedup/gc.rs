//! Garbage collection: deletes the packs and indexes of dropped
//! generations, and the packs an interrupted stop left behind, when no
//! retained generation references them.
//!
//! Safety rests on three rules (see `docs/SNAPSHOT-FORMAT.md`): a snapshot
//! only ever deletes packs carrying its own owner tag; a generation that a
//! fork started from is pinned by a marker object and kept; and collection
//! runs under the sandbox's lock, like its stops, so no stop of the same
//! snapshot is between uploading packs and committing their index while it
//! runs. An index that a stop committed but whose state write was lost is
//! probed for and counted as retained.

use std::collections::BTreeSet;

use futures::StreamExt;

use serde::{Deserialize, Serialize};

use super::format::names;
use super::{is_not_found, DedupSnapshot};
use crate::store_error::StoreError;

/// What a collection deleted (or, dry, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Nothing was deleted; this is what would be.
    pub dry_run: bool,
    /// Index objects of dropped generations.
    pub indexes: Vec<String>,
    /// Packs no retained generation references.
    pub packs: Vec<String>,
    /// Whether an interrupted stop's journal was found.
    pub journal: bool,
    /// Generations kept because a fork started from them.
    pub pinned: Vec<u64>,
}

/// What a stop writes before each pack upload.
#[derive(Deserialize)]
struct Journal {
    packs: Vec<String>,
}

/// Deletes a collection has in flight at once.
const DELETES_IN_FLIGHT: usize = 4;

impl DedupSnapshot {
    /// Deletes `object`; one already gone is no error.
    pub(super) async fn delete_object(&self, object: &str) -> Result<(), StoreError> {
        match self.client.delete(object).await {
            Err(e) if is_not_found(&e) => Ok(()),
            done => done,
        }
    }

    /// Deletes `objects`, a few at a time; returns those that were there,
    /// in order (one already gone is no error).
    pub(super) async fn delete_objects(
        &self,
        objects: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut deletes = futures::stream::iter(objects.iter().cloned().map(|object| async move {
            match self.client.delete(&object).await {
                Ok(()) => Ok(Some(object)),
                Err(e) if is_not_found(&e) => Ok(None),
                Err(e) => Err(e),
            }
        }))
        .buffered(DELETES_IN_FLIGHT);
        let mut deleted = Vec::new();
        while let Some(object) = deletes.next().await {
            deleted.extend(object?);
        }
        Ok(deleted)
    }

    /// Deletes the journal a stop writes before its uploads, and records
    /// that it is gone.
    pub(super) async fn delete_journal(&self) -> Result<(), StoreError> {
        self.delete_object(&names::journal(self.id.as_str()))
            .await?;
        self.journal_gone(true);
        Ok(())
    }

    /// The packs listed by the journal an interrupted stop left, or `None`
    /// when there is no journal. An unreadable journal lists nothing.
    pub(super) async fn journal_packs(&self) -> Result<Option<Vec<String>>, StoreError> {
        let journal_id = names::journal(self.id.as_str());
        match self
            .fetch_small(&journal_id, 16 * 1024 * 1024, "journal")
            .await
        {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice::<Journal>(&bytes)
                    .map(|j| j.packs)
                    .unwrap_or_default(),
            )),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Of `candidates`, the packs carrying this snapshot's owner tag that
    /// `referenced` does not hold: the only packs it may ever delete.
    pub(super) fn own_unreferenced(
        &self,
        candidates: BTreeSet<String>,
        referenced: &BTreeSet<String>,
    ) -> Vec<String> {
        candidates
            .into_iter()
            .filter(|p| {
                names::parse_pack(p).is_some_and(|(tag, _)| tag == self.tag)
                    && !referenced.contains(p)
            })
            .collect()
    }

    /// Deletes (or, with `dry_run`, lists) the objects of this snapshot that
    /// no retained generation needs. Run it under the sandbox's lock.
    pub async fn collect_garbage(&self, dry_run: bool) -> Result<GcReport, StoreError> {
        if !dry_run {
            // A deferred tidy first: it may be collecting already.
            self.settle().await;
        }
        self.collect(dry_run, false, false, Vec::new()).await
    }

    /// The collection after a stop's commit: as [`Self::collect_garbage`],
    /// but the journal is not looked for when it is this stop's own
    /// (`own_journal`: it lists only packs the committed index names, and
    /// the caller removes it) or one this process removed (or found
    /// absent) since it last wrote one — a round trip per checkpoint. A
    /// journal another process left is found by the next `gc`, or by the
    /// first stop of a process that resumes the sandbox after a stop that
    /// did not finish (which names its packs in its own journal).
    /// `inherited`: packs an unfinished stop's journal named, which the
    /// stop's own journal took over — candidates too.
    pub(super) async fn collect_after_commit(
        &self,
        own_journal: bool,
        inherited: Vec<String>,
    ) -> Result<GcReport, StoreError> {
        self.collect(false, true, own_journal, inherited).await
    }

    async fn collect(
        &self,
        dry_run: bool,
        trust_absent_journal: bool,
        own_journal: bool,
        inherited: Vec<String>,
    ) -> Result<GcReport, StoreError> {
        let mut record = self.record();
        record.drop_beyond_keep();
        let mut report = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let mut doomed = Vec::new();
        for g in std::mem::take(&mut record.doomed) {
            if self.client.exists(&names::pin(&g.index)).await? {
                report.pinned.push(g.number);
                record.pinned.push(g);
            } else {
                doomed.push(g);
            }
        }
        let mut candidates: BTreeSet<String> = inherited.into_iter().collect();
        for g in &doomed {
            match self.packs_of(&g.index).await {
                Ok(packs) => {
                    candidates.extend(packs.iter().cloned());
                    report.indexes.push(g.index.clone());
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let journal_absent = own_journal
            || trust_absent_journal
                && self
                    .journal_absent
                    .load(std::sync::atomic::Ordering::SeqCst);
        if !journal_absent {
            match self.journal_packs().await? {
                Some(packs) => {
                    report.journal = true;
                    candidates.extend(packs);
                }
                None if !dry_run => self.journal_gone(true),
                None => {}
            }
        }
        // What is kept matters only when something may go.
        let mut referenced = BTreeSet::new();
        if !candidates.is_empty() {
            let mut retained: Vec<String> = record
                .generations
                .iter()
                .chain(&record.pinned)
                .map(|g| g.index.clone())
                .collect();
            let unrecorded = names::index(self.id.as_str(), record.next_number());
            if self.client.exists(&unrecorded).await? {
                retained.push(unrecorded);
            }
            for object in &retained {
                // An unreadable retained index stops the collection:
                // better to keep garbage than to delete what it might need.
                referenced.extend(self.packs_of(object).await?.iter().cloned());
            }
        }
        report.packs = self.own_unreferenced(candidates, &referenced);
        if dry_run {
            return Ok(report);
        }
        // Packs first, then the indexes that name them: an index removed
        // before its packs would leave them unfound by a retry.
        self.delete_objects(&report.packs).await?;
        self.delete_objects(&report.indexes).await?;
        if report.journal {
            self.delete_journal().await?;
        }
        for i in &report.indexes {
            self.indexes.forget(i);
        }
        self.update_record(|r| {
            r.generations = record.generations;
            r.pinned = record.pinned;
            r.doomed.clear();
        });
        if !report.packs.is_empty() || !report.indexes.is_empty() {
            tracing::info!(snapshot = %self.id, packs = report.packs.len(),
                indexes = report.indexes.len(), "collected dropped generations");
        }
        Ok(report)
    }
}
