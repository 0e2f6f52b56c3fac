//! A stop's uploads before its commit: every pack goes up after a journal
//! that names it and every pack before it (so garbage collection finds
//! the packs of a stop that dies before its index) — and the packs of the
//! journal it replaces, if a stop before it did not finish — and is
//! admitted to the
//! pack cache. The packer's last pack is held back and goes up with the
//! index's tree packs under one journal, at once: a checkpoint that
//! changed a little costs one journal, the packs in parallel, the index.

use futures::StreamExt;
use tokio::sync::mpsc;

use super::format::names;
use super::pack_builder::{local, FinishedPack};
use super::DedupSnapshot;
use crate::store_error::StoreError;

/// Pack uploads in flight at once.
const UPLOADS_IN_FLIGHT: usize = 3;

/// Upload counters.
#[derive(Default)]
pub(super) struct Uploaded {
    pub(super) bytes: u64,
    pub(super) calls: u64,
    pub(super) packs: Vec<String>,
    /// Packs a journal this stop found named, from a stop that did not
    /// finish: named again in this stop's journal, and collected after
    /// its commit if no kept generation references them.
    pub(super) inherited: Vec<String>,
}

impl DedupSnapshot {
    /// Uploads each pack as the packer finishes it, journaled, except the
    /// last, which is returned for [`DedupSnapshot::upload_journaled`]
    /// with the tree packs.
    pub(super) async fn upload_packs(
        &self,
        number: u64,
        mut pack_rx: mpsc::Receiver<FinishedPack>,
        mut up: Uploaded,
    ) -> Result<(Uploaded, Option<FinishedPack>), StoreError> {
        let mut held = None;
        while let Some(pack) = pack_rx.recv().await {
            if let Some(previous) = held.replace(pack) {
                self.upload_journaled(number, vec![previous], &mut up)
                    .await?;
            }
        }
        Ok((up, held))
    }

    /// Uploads `packs`, a few at a time, after one journal naming them and
    /// every pack `up` counts; each goes to the pack cache.
    pub(super) async fn upload_journaled(
        &self,
        number: u64,
        packs: Vec<FinishedPack>,
        up: &mut Uploaded,
    ) -> Result<(), StoreError> {
        if packs.is_empty() {
            return Ok(());
        }
        up.packs.extend(packs.iter().map(|p| p.name.clone()));
        let listed: Vec<&String> = up.inherited.iter().chain(&up.packs).collect();
        let journal = serde_json::to_vec(&serde_json::json!({
            "snapshot": self.id.as_str(),
            "generation": number,
            "packs": listed,
        }))
        .unwrap_or_default();
        self.journal_gone(false);
        self.client
            .upload(&names::journal(self.id.as_str()), &mut &journal[..])
            .await?;
        up.calls += 1;
        up.bytes += journal.len() as u64;
        let mut uploads = futures::stream::iter(packs.into_iter().map(|p| self.upload_pack(p)))
            .buffer_unordered(UPLOADS_IN_FLIGHT);
        while let Some(size) = uploads.next().await {
            up.calls += 1;
            up.bytes += size?;
        }
        Ok(())
    }

    /// Uploads one pack and admits it to the cache; its size.
    async fn upload_pack(&self, pack: FinishedPack) -> Result<u64, StoreError> {
        let mut file = tokio::fs::File::open(&pack.file)
            .await
            .map_err(local("reading a pack file"))?;
        self.client.upload(&pack.name, &mut file).await?;
        match &self.options.cache {
            Some(cache) => {
                if let Err(e) = cache.admit(pack.file, &pack.name) {
                    tracing::debug!(error = %e, "could not keep a pack in the cache");
                }
            }
            None => drop(pack.file),
        }
        Ok(pack.size)
    }
}
