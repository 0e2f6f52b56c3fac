//! A deduplicated snapshot's capabilities, as the lifecycle sees them:
//! it seals and compresses itself, keeps its record in the sandbox state,
//! and keeps generations ([`Generations`]).

use std::collections::BTreeSet;

use super::record::record_fields;
use super::{DedupRecord, DedupSnapshot, GcReport, Generation, Keep};
use crate::snapshot::{ArchiveSeal, DeleteReport, ForkBase, Generations, History, TreeDiff};
use crate::store_error::StoreError;

fn seal_of(g: &Generation) -> ArchiveSeal {
    ArchiveSeal {
        digest: g.digest.clone(),
        size: g.size,
    }
}

impl DedupSnapshot {
    /// The seal of the generation a restore reads now.
    pub(super) fn head_seal(&self) -> Option<ArchiveSeal> {
        self.record().head().map(seal_of)
    }
}

#[async_trait::async_trait]
impl Generations for DedupSnapshot {
    fn select(&self, number: u64) -> Option<ArchiveSeal> {
        self.select_generation(number).as_ref().map(seal_of)
    }

    fn kept(&self) -> String {
        self.record().kept_numbers()
    }

    async fn collect_garbage(&self, dry_run: bool) -> Result<GcReport, StoreError> {
        DedupSnapshot::collect_garbage(self, dry_run).await
    }

    fn history(&self) -> History {
        let record = self.record();
        let mut generations: Vec<Generation> = record
            .generations
            .iter()
            .chain(&record.pinned)
            .cloned()
            .collect();
        generations.sort_by_key(|g| g.number);
        History {
            generations,
            current: record.current,
        }
    }

    async fn diff(&self, older: u64, newer: u64) -> Result<TreeDiff, StoreError> {
        DedupSnapshot::diff(self, older, newer).await
    }

    fn hold(&self, number: Option<u64>) {
        self.update_record(|r| r.hold = number);
    }

    fn defer_tidy(&self, defer: bool) {
        DedupSnapshot::defer_tidy(self, defer)
    }

    async fn settle(&self) {
        DedupSnapshot::settle(self).await
    }

    fn keep_within(&self, seconds: Option<u64>) {
        self.update_record(|r| r.keep_within_secs = seconds);
    }

    async fn fork_base(&self, number: Option<u64>) -> Result<ForkBase, StoreError> {
        let keep = self.record().keep;
        let base = self.pin_generation(number).await?;
        Ok(ForkBase {
            seal: seal_of(&base),
            fields: record_fields(&DedupRecord::forked_from(base, keep)),
            keep,
            store: self.client().clone(),
        })
    }

    async fn delete_leftovers(
        &self,
        bases: &BTreeSet<String>,
        dry_run: bool,
    ) -> Result<DeleteReport, StoreError> {
        self.delete_all(&Keep::Bases(bases.clone()), dry_run).await
    }
}
