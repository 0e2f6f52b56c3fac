//! The start branches: reuse, rebuild, restore, fresh; and attach.

use super::{Sandbox, SandboxError, StartBranch, WorkspaceLineage};
use crate::backend::Provisioned;
use crate::workspace::entries::{self, Selection};

impl Sandbox {
    /// Starts the sandbox, choosing one of four branches. A failure leaves
    /// `workspace_root_ready = false`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe. Dropping the future part-way changes nothing
    /// stored, but can leave a half-restored workspace that this `Sandbox`
    /// (and, if it was ready before, its state) still takes for its own:
    /// call [`Sandbox::shutdown`] before starting again.
    pub async fn start(&mut self) -> Result<StartBranch, SandboxError> {
        let provisioned = self.ensure_running().await?;
        self.start_provisioned(provisioned).await
    }

    /// The one `ensure_running` of a resume.
    pub(super) async fn ensure_running(&mut self) -> Result<Provisioned, SandboxError> {
        let started = std::time::Instant::now();
        // The egress point first: the backend binds its socket's directory.
        if let Some(egress) = &self.state.egress {
            crate::egress::ensure_daemon(egress, true)
                .await
                .inspect_err(|_| {
                    self.running = false;
                })?;
        }
        let provisioned = self.backend.ensure_running().await;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            ?provisioned,
            "ensure_running"
        );
        self.refresh_backend_state()?;
        provisioned.map_err(|e| {
            self.running = false;
            e.into()
        })
    }

    /// The start branches, given what the one `ensure_running` of this
    /// resume did.
    pub(super) async fn start_provisioned(
        &mut self,
        provisioned: Provisioned,
    ) -> Result<StartBranch, SandboxError> {
        match self.start_branches(provisioned).await {
            Ok(branch) => {
                self.state.workspace_root_ready = true;
                self.running = true;
                tracing::info!(session = %self.state.session_id, ?branch, "sandbox started");
                self.save_state()?;
                self.check_background().await?;
                Ok(branch)
            }
            Err(e) => {
                self.state.workspace_root_ready = false;
                self.running = false;
                Err(e)
            }
        }
    }

    pub(super) async fn start_branches(
        &mut self,
        provisioned: Provisioned,
    ) -> Result<StartBranch, SandboxError> {
        self.state.manifest.validate()?;
        self.backend.check_workspace(&self.state.manifest)?;
        if self.state.workspace_root_ready && self.workspace_is_ours(provisioned).await? {
            self.apply_entries(Selection::EphemeralOnly).await?;
            return Ok(StartBranch::Reuse);
        }
        let restorable =
            self.snapshot.persistence_enabled() && self.snapshot.is_restorable().await?;
        if !restorable && self.state.snapshot.digest.is_some() {
            tracing::warn!(snapshot = %self.state.snapshot.id,
                "this sandbox persisted a snapshot that its store no longer has; starting from the manifest");
            self.state.snapshot.digest = None;
            self.state.snapshot.size = None;
        }
        self.backend.prepare_root().await?;
        let was_ready = self.state.workspace_root_ready;
        if restorable {
            self.restore().await?;
            self.apply_entries(Selection::EphemeralOnly).await?;
        } else {
            self.apply_entries(Selection::All).await?;
        }
        self.state.lineage = Some(WorkspaceLineage {
            instance: self.backend.instance_id().await?,
            snapshot_digest: if restorable {
                self.state.snapshot.digest.clone()
            } else {
                None
            },
        });
        Ok(match (was_ready, restorable) {
            (true, restored) => StartBranch::Rebuild { restored },
            (false, true) => StartBranch::Restore,
            (false, false) => StartBranch::Fresh,
        })
    }

    /// Whether the backend still holds the workspace this sandbox set up:
    /// not created from nothing by this resume, its root present, and the
    /// same instance the lineage records. State from versions without a
    /// lineage adopts the current instance.
    pub(super) async fn workspace_is_ours(
        &mut self,
        provisioned: Provisioned,
    ) -> Result<bool, SandboxError> {
        if provisioned == Provisioned::Created || !self.backend.root_exists().await? {
            return Ok(false);
        }
        let current = self.backend.instance_id().await?;
        match &self.state.lineage {
            Some(lineage) if lineage.instance == current => Ok(true),
            Some(lineage) => {
                tracing::warn!(recorded = ?lineage.instance, found = ?current,
                    "the workspace is held by another instance than the one it was set up in; treating it as gone");
                Ok(false)
            }
            None => {
                self.state.lineage = Some(WorkspaceLineage {
                    instance: current,
                    snapshot_digest: self.state.snapshot.digest.clone(),
                });
                Ok(true)
            }
        }
    }

    /// Reconnects to a started sandbox without re-applying anything, when
    /// its workspace is still the one it set up; otherwise runs the start
    /// branches (restoring from the snapshot when there is one). For
    /// callers (like the CLI) that resume a sandbox for each command.
    pub async fn attach(&mut self) -> Result<StartBranch, SandboxError> {
        let provisioned = self.ensure_running().await?;
        if self.state.workspace_root_ready && self.workspace_is_ours(provisioned).await? {
            self.running = true;
            return Ok(StartBranch::Attached);
        }
        self.start_provisioned(provisioned).await
    }

    /// Hands this started sandbox, which has run nothing (a warm pool's
    /// member), to a new owner: checks that its workspace is empty, gives
    /// it `manifest` (its environment for every command from now on, its
    /// entries written into the workspace) and `options` (the new owner's
    /// state file). Saves nothing: the caller records the new owner. On
    /// [`SandboxError::NotFresh`] or an error before writing, the sandbox
    /// is as it was; a failed write can leave part of the entries.
    ///
    /// The manifest must keep the sandbox's workspace root and name no
    /// bind mount: those are fixed when the backend makes the sandbox
    /// (`check_workspace` refuses what this backend cannot honour).
    pub async fn take_over(
        &mut self,
        manifest: crate::workspace::WorkspaceSpec,
        options: super::SandboxOptions,
    ) -> Result<(), SandboxError> {
        if !self.running {
            return Err(SandboxError::NotStarted);
        }
        manifest.validate()?;
        self.backend.check_workspace(&manifest)?;
        entries::check_sources(&manifest, Selection::All)?;
        let found = self.files().list(".").await?;
        if !found.is_empty() {
            return Err(SandboxError::NotFresh {
                entries: found.len(),
            });
        }
        self.state.manifest = manifest;
        self.options = options;
        self.apply_entries(Selection::All).await
    }

    pub(super) async fn apply_entries(&mut self, selection: Selection) -> Result<(), SandboxError> {
        if !entries::selects_any(&self.state.manifest, selection, self.backend.bind_mounts()) {
            return Ok(());
        }
        entries::check_sources(&self.state.manifest, selection)?;
        let archive =
            entries::entries_archive(&self.state.manifest, selection, self.backend.bind_mounts());
        self.backend.write_archive(Box::new(archive)).await?;
        Ok(())
    }
}
