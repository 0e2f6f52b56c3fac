//! Moving a sandbox to another place of its backend (another engine, a
//! node), and cleaning up what a move had to leave behind. Which places a
//! backend has is its own business: its provider says whether it can move
//! at all, and its own front end (for Docker,
//! `EngineChoice::moved_state`) computes the target state.
//!
//! A move never loses work and never leaves two live instances writing
//! one snapshot:
//! - the snapshot must be portable ([`SandboxSnapshot::portable`]: a
//!   shared store), or the new place could not restore it;
//! - when the old place answers, the workspace is persisted there first
//!   (a normal, lineage-checked stop) and the old instance removed;
//! - when it does not, the sandbox moves from its last snapshot and the
//!   old instance is recorded as an orphan; the state no longer points
//!   at it, so nothing can stop it into the snapshot again, and
//!   [`SandboxClient::remove_orphans`] removes it once its place is back.

use crate::backend::{BackendError, BackendState};

use super::state::Orphan;
use super::{Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxState, SnapshotSpec};

/// What became of a sandbox's orphans (see
/// [`SandboxClient::remove_orphans`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct OrphanCleanup {
    /// The state without the orphans that are gone now; save it.
    pub state: SandboxState,
    /// Orphans removed (their instance and where it ran).
    pub removed: Vec<String>,
    /// Orphans still there, with why (their place still does not answer).
    pub remaining: Vec<(String, BackendError)>,
}

impl SandboxClient {
    /// How an instance reads in messages: what it is and where.
    fn describe_instance(&self, backend: &BackendState) -> String {
        let summary = self.backend_summary(backend).unwrap_or_default();
        match (summary.instance, summary.location) {
            (Some(i), Some(l)) => format!("{} {i} on {l}", backend.kind),
            (Some(i), None) => format!("{} {i}", backend.kind),
            _ => format!("a {} instance", backend.kind),
        }
    }

    /// Moves the sandbox whose state is `state` to `target`, the backend
    /// state of the same sandbox at its new place (a new instance, not yet
    /// created), and resumes it there: `start` then restores the workspace
    /// from the snapshot, which must be portable. If the old place answers,
    /// the workspace is persisted there first and the old instance
    /// removed; if not, the sandbox moves from its last snapshot and the
    /// old instance is kept in [`SandboxState::orphans`]. `target`
    /// describes the place in errors.
    ///
    /// Hold the sandbox's lock (across processes, its `StateLock`), and
    /// save the returned sandbox's state.
    pub async fn move_to(
        &self,
        state: SandboxState,
        target: BackendState,
        snapshot: Option<SnapshotSpec>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let place = self.describe_instance(&target);
        let refuse = |reason: String| SandboxError::Move {
            target: place.clone(),
            reason,
        };
        let provider = self.provider(&state.backend.kind)?;
        if !provider.relocatable() || target.kind != state.backend.kind {
            return Err(refuse(format!(
                "it runs on the {} backend, which cannot move its sandboxes{}",
                state.backend.kind,
                if target.kind != state.backend.kind {
                    format!(" to the {} backend", target.kind)
                } else {
                    String::new()
                }
            )));
        }
        let (bound, _, _) = self.bind_existing(&state, snapshot.clone(), None).await?;
        if !bound.portable() {
            return Err(SandboxError::NotPortable {
                target: place,
                kind: bound.kind().to_string(),
            });
        }
        drop(bound);
        // Orphans whose places answer go first: one left at the target
        // would otherwise be adopted there by its name.
        let cleanup = self.remove_orphans(&state).await;
        for (what, e) in &cleanup.remaining {
            tracing::warn!(orphan = %what, error = %e, "an orphan's place still does not answer; keeping it");
        }
        let mut state = cleanup.state;
        let target_location = provider.summary(&target).location;
        if let Some(stuck) = state
            .orphans
            .iter()
            .find(|o| provider.summary(&o.backend).location == target_location)
        {
            return Err(refuse(format!(
                "an orphaned instance of this sandbox is still there and could not be removed ({}); remove it once its place answers",
                stuck.reason
            )));
        }
        let mut orphan = None;
        match provider.resume(&state.backend, &state.session_id).await {
            Ok(backend) => {
                if backend.instance_exists().await? {
                    // Persist the latest work where it is, then remove the
                    // old instance: one live instance per snapshot.
                    let mut there = self
                        .resume_with_backend(
                            state.clone(),
                            snapshot.clone(),
                            backend,
                            options.clone(),
                        )
                        .await?;
                    if state.workspace_root_ready {
                        there.attach().await?;
                        there.stop().await?;
                    }
                    there.shutdown().await?;
                    state = there.state();
                    tracing::info!(session = %state.session_id, "persisted at the old place and removed its instance");
                }
            }
            Err(e) => {
                if state.snapshot.digest.is_none() {
                    return Err(refuse(format!(
                        "its place does not answer ({e}), and it was never stopped, so no snapshot holds its workspace; \
                         bring it back and run the move again"
                    )));
                }
                tracing::warn!(error = %e, "the old place does not answer; moving from the last snapshot and keeping the old instance as an orphan");
                orphan = Some(Orphan {
                    backend: state.backend.clone(),
                    reason: e.to_string(),
                });
            }
        }
        state.backend = target;
        state.orphans.extend(orphan);
        self.resume(state, snapshot, options).await
    }

    /// Removes the orphans of the sandbox whose state is `state` (see
    /// [`SandboxClient::move_to`]) whose places answer now, with their
    /// backend's provider, and says which are left. Hold the sandbox's
    /// lock and save the returned state.
    pub async fn remove_orphans(&self, state: &SandboxState) -> OrphanCleanup {
        let mut cleanup = OrphanCleanup {
            state: state.clone(),
            removed: Vec::new(),
            remaining: Vec::new(),
        };
        let mut kept = Vec::new();
        for orphan in &state.orphans {
            let what = self.describe_instance(&orphan.backend);
            let result = match self.provider(&orphan.backend.kind) {
                Ok(provider) => {
                    provider
                        .remove_orphan(&orphan.backend, &state.session_id)
                        .await
                }
                Err(e) => Err(BackendError::State {
                    kind: orphan.backend.kind.clone(),
                    message: e.to_string(),
                }),
            };
            match result {
                Ok(()) => cleanup.removed.push(what),
                Err(e) => {
                    cleanup.remaining.push((what, e));
                    kept.push(orphan.clone());
                }
            }
        }
        cleanup.state.orphans = kept;
        cleanup
    }
}
