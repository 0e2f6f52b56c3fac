//! A snapshot's generations, as a sandbox uses them: select one to
//! restore, collect garbage, delete what was stored.

use super::{generations_of, Sandbox, SandboxError};
use crate::snapshot::{DeleteReport, GcReport, Generations};

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
