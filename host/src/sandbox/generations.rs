//! A snapshot's generations, as a sandbox uses them: select one to
//! restore, collect garbage, delete what was stored.

use super::{generations_of, Sandbox, SandboxError};
use crate::snapshot::{DeleteReport, GcReport, GenerationNote, Generations, History, TreeDiff};

impl Sandbox {
    pub(super) fn generations(&self) -> Result<&dyn Generations, SandboxError> {
        generations_of(self.snapshot.as_ref(), &self.state)
    }

    /// Makes the next [`start`](Sandbox::start) restore generation
    /// `number` of a deduplicated snapshot (see [`Generations`]) instead of
    /// the newest; the next stop then writes a new generation descending
    /// from it. The workspace must be gone ([`shutdown`](Sandbox::shutdown)
    /// first), since restoring over it would mix two moments.
    pub fn select_generation(&mut self, number: u64) -> Result<(), SandboxError> {
        if self.state.workspace_root_ready {
            return Err(SandboxError::WorkspaceStillThere);
        }
        let generations = self.generations()?;
        let generation =
            generations
                .select(number)
                .ok_or_else(|| SandboxError::GenerationNotKept {
                    id: self.state.snapshot.id.to_string(),
                    number,
                    kept: generations.kept(),
                })?;
        self.state.snapshot.digest = Some(generation.digest);
        self.state.snapshot.size = Some(generation.size);
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        Ok(())
    }

    /// The kept generations of a deduplicated snapshot, oldest first, each
    /// with when and why it was written and what it changed; read from the
    /// state (nothing is downloaded).
    pub fn history(&self) -> Result<History, SandboxError> {
        Ok(self.generations()?.history())
    }

    /// The paths generation `older` and generation `newer` differ by
    /// (added, removed, modified: kind, mode, size, content or target),
    /// read from their indexes without downloading any pack.
    pub async fn diff(&self, older: u64, newer: u64) -> Result<TreeDiff, SandboxError> {
        Ok(self.generations()?.diff(older, newer).await?)
    }

    /// Also keeps every generation written within `window` of the newest
    /// one, whatever the number kept says (`None`: only the number).
    pub fn keep_generations_within(
        &mut self,
        window: Option<std::time::Duration>,
    ) -> Result<(), SandboxError> {
        self.generations()?.keep_within(window.map(|d| d.as_secs()));
        self.sync_snapshot_fields();
        Ok(())
    }

    /// Persists the workspace as a new generation recording `note` (a
    /// command's checkpoint), leaving the sandbox running. As
    /// [`stop`](Sandbox::stop) otherwise.
    pub async fn checkpoint(&mut self, note: GenerationNote) -> Result<(), SandboxError> {
        let running = self.running;
        self.snapshot.note_next(note);
        let stopped = self.stop().await;
        self.running = running;
        stopped
    }

    /// As [`checkpoint`](Sandbox::checkpoint), but returns at the commit:
    /// the tidying after it — removing the stop's journal, collecting the
    /// generations it dropped, a store round trip or more — waits for
    /// [`settle`](Sandbox::settle) (a server runs it once the command's
    /// reply is on its way), or is done first by the next stop. If neither
    /// runs, nothing is lost: the journal names only the committed
    /// generation's packs, and the next collection removes it.
    pub async fn checkpoint_settling_later(
        &mut self,
        note: GenerationNote,
    ) -> Result<(), SandboxError> {
        self.generations()?.defer_tidy(true);
        let checkpointed = self.checkpoint(note).await;
        // A checkpoint that wrote nothing leaves the flag for no later stop.
        if let Ok(generations) = self.generations() {
            generations.defer_tidy(false);
        }
        checkpointed
    }

    /// Does the tidying a [`checkpoint_settling_later`] left; nothing when
    /// none is pending (or the snapshot keeps no generations).
    ///
    /// [`checkpoint_settling_later`]: Sandbox::checkpoint_settling_later
    pub async fn settle(&self) {
        if let Some(generations) = self.snapshot.generations() {
            generations.settle().await;
        }
    }

    /// Makes the workspace generation `number` of its deduplicated
    /// snapshot. The workspace as it is is saved first as a new generation
    /// (so the rewind can itself be undone by rewinding to that one); then
    /// the sandbox's instance is re-created and generation `number`
    /// restored into it. Returns the number of the generation that saved
    /// the workspace. Background processes do not survive a rewind.
    ///
    /// A generation that is not kept (collected, or never written) is an
    /// error before anything is saved or removed.
    pub async fn rewind(&mut self, number: u64) -> Result<u64, SandboxError> {
        let generations = self.generations()?;
        let history = generations.history();
        if !history.generations.iter().any(|g| g.number == number) {
            return Err(SandboxError::GenerationNotKept {
                id: self.state.snapshot.id.to_string(),
                number,
                kept: generations.kept(),
            });
        }
        generations.hold(Some(number));
        let rewound = self.rewind_held(number).await;
        if let Ok(g) = self.generations() {
            g.hold(None);
        }
        self.sync_snapshot_fields();
        self.save_state()?;
        rewound
    }

    async fn rewind_held(&mut self, number: u64) -> Result<u64, SandboxError> {
        if self.state.workspace_root_ready {
            self.snapshot
                .note_next(GenerationNote::BeforeRewind { to: number });
            self.stop().await?;
        }
        let saved = self.generations()?.history().current.unwrap_or_default();
        self.shutdown().await?;
        self.select_generation(number)?;
        self.save_state()?;
        self.start().await?;
        Ok(saved)
    }

    /// Deletes (or, with `dry_run`, lists) the objects of this sandbox's
    /// deduplicated snapshot that no kept generation needs: dropped
    /// generations, and packs an interrupted stop left behind. Stops of
    /// this sandbox must not run meanwhile (they take `&mut self`; across
    /// processes, hold the sandbox's [`StateLock`]).
    pub async fn collect_garbage(&mut self, dry_run: bool) -> Result<GcReport, SandboxError> {
        let report = self.generations()?.collect_garbage(dry_run).await?;
        if !dry_run {
            self.sync_snapshot_fields();
            self.save_state()?;
        }
        Ok(report)
    }

    /// Deletes what the snapshot stored (see
    /// [`SandboxSnapshot::delete_stored`]), for a sandbox removed for good:
    /// the local archive, the remote object, or a deduplicated snapshot's
    /// generations and the packs only they use — never what a fork still
    /// needs, which the report lists as kept. Call it after
    /// [`shutdown`](Sandbox::shutdown); the sandbox cannot be restored
    /// afterwards.
    pub async fn delete_snapshot(&mut self) -> Result<DeleteReport, SandboxError> {
        let report = self.snapshot.delete_stored().await?;
        if report.unsupported.is_none() {
            self.state.snapshot.digest = None;
            self.state.snapshot.size = None;
            self.state.snapshot.persist_pending = false;
        }
        self.sync_snapshot_fields();
        Ok(report)
    }
}
