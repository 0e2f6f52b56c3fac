//! Moving a Docker sandbox to another engine, and cleaning up what a move
//! had to leave behind.
//!
//! A move never loses work and never leaves two live containers writing
//! one snapshot:
//! - the snapshot must be in a shared store (a remote plugin), or the new
//!   engine's host could not restore it;
//! - when the old engine answers, the workspace is persisted there first
//!   (a normal, lineage-checked stop) and the old container removed;
//! - when it does not, the sandbox moves from its last snapshot and the
//!   old container is recorded as an orphan; the state no longer points
//!   at it, so nothing can stop it into the snapshot again, and
//!   [`SandboxClient::remove_orphans`] removes it once its engine is back.

use crate::backend::docker::{self, DockerBackend, DockerState, EngineChoice};
use crate::backend::{Backend, BackendError, BackendState};

use super::state::Orphan;
use super::{Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxState, SnapshotSpec};

/// What became of a sandbox's orphans (see
/// [`SandboxClient::remove_orphans`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct OrphanCleanup {
    /// The state without the orphans that are gone now; save it.
    pub state: SandboxState,
    /// Orphans removed (their engine and container).
    pub removed: Vec<String>,
    /// Orphans still there, with why (their engine still does not answer).
    pub remaining: Vec<(String, BackendError)>,
}

/// How an orphan reads in messages: its container and engine.
fn describe(orphan: &DockerState) -> String {
    format!(
        "container {} on the {}",
        orphan
            .container_id
            .as_deref()
            .map(|id| &id[..id.len().min(12)])
            .unwrap_or(&orphan.container_name),
        docker::describe_engine(orphan.engine.as_deref())
    )
}

impl SandboxClient {
    /// Resumes a Docker sandbox on another engine (an endpoint or a Docker
    /// context): the container is created there, and `start` restores the
    /// workspace from the snapshot, which must be in a shared store (a
    /// remote plugin such as the s3-store; a local-directory snapshot is
    /// refused). If the old engine answers, the workspace is persisted
    /// there first and the old container removed; if not, the sandbox
    /// moves from its last snapshot and the old container is kept in
    /// [`SandboxState::orphans`]. On the engine it already runs on, this is
    /// [`SandboxClient::resume`].
    ///
    /// Hold the sandbox's lock (across processes, its `StateLock`), and
    /// save the returned sandbox's state.
    ///
    /// ```no_run
    /// use berth::backend::docker::EngineChoice;
    /// use berth::sandbox::{SandboxClient, SandboxState};
    /// # async fn f(json: &str) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = SandboxClient::new("/var/lib/my-agent/berth");
    /// let state = SandboxState::from_json(json)?;
    /// let target = EngineChoice::new("tcp://gpu2.internal:2376").tls_cert_path("/etc/berth/gpu2");
    /// let mut sandbox = client
    ///     .resume_on_engine(state, &target, None, Default::default())
    ///     .await?;
    /// sandbox.start().await?; // restored there from the shared snapshot
    /// let moved = sandbox.state(); // names the new engine, and any orphan left
    /// # let _ = moved; Ok(()) }
    /// ```
    pub async fn resume_on_engine(
        &self,
        state: SandboxState,
        target: &EngineChoice,
        snapshot: Option<SnapshotSpec>,
        options: SandboxOptions,
    ) -> Result<Sandbox, SandboxError> {
        let refuse = |reason: String| SandboxError::Move {
            engine: docker::describe_engine(Some(target.reference())),
            reason,
        };
        if state.backend.kind != docker::KIND {
            return Err(refuse(format!(
                "it runs on the {} backend; only Docker sandboxes run on engines",
                state.backend.kind
            )));
        }
        let old: DockerState = state.backend.decode()?;
        if target.is_engine_of(&old) {
            return self.resume(state, snapshot, options).await;
        }
        let spec = match &snapshot {
            Some(s) => s.clone(),
            None => SnapshotSpec::from_state(&state.snapshot)?,
        };
        match &spec {
            SnapshotSpec::Local { base_dir } => {
                return Err(refuse(format!(
                    "its snapshots are kept in a directory on this host ({}), which another engine's host cannot read; \
                     a sandbox that moves needs a shared store: create it with `--snapshot remote:MANIFEST` (e.g. the s3-store plugin)",
                    base_dir.display()
                )))
            }
            SnapshotSpec::Noop => {
                return Err(refuse(
                    "it keeps no snapshot, so nothing could restore its workspace there; create it with `--snapshot remote:MANIFEST`".into(),
                ))
            }
            _ => {}
        }
        if !old.container_owned {
            return Err(refuse(format!(
                "its container {} is not Berth's, and Berth does not move containers it did not create",
                old.container_name
            )));
        }
        // Orphans whose engines answer go first: one left on the target
        // engine would otherwise be adopted there by its name.
        let cleanup = self.remove_orphans(&state).await;
        for (what, e) in &cleanup.remaining {
            tracing::warn!(orphan = %what, error = %e, "an orphan's engine still does not answer; keeping it");
        }
        let mut state = cleanup.state;
        if let Some(stuck) = state.orphans.iter().find(|o| {
            o.backend
                .decode::<DockerState>()
                .is_ok_and(|d| target.is_engine_of(&d))
        }) {
            return Err(refuse(format!(
                "an orphaned container of this sandbox is still on that engine and could not be removed ({}); `berth rm` it once the engine answers",
                stuck.reason
            )));
        }
        let mut orphan = None;
        match DockerBackend::connect(old.clone(), &state.session_id, None).await {
            Ok(backend) => {
                if backend.container_present().await? {
                    // Persist the latest work where it is, then remove the
                    // old container: one live container per snapshot.
                    let mut there = self
                        .resume_with_backend(
                            state.clone(),
                            snapshot.clone(),
                            Box::new(backend),
                            options.clone(),
                        )
                        .await?;
                    if state.workspace_root_ready {
                        there.attach().await?;
                        there.stop().await?;
                    }
                    there.shutdown().await?;
                    state = there.state();
                    tracing::info!(session = %state.session_id, "persisted on the old engine and removed its container");
                }
            }
            Err(e) => {
                if state.snapshot.digest.is_none() {
                    return Err(refuse(format!(
                        "its engine does not answer ({e}), and it was never stopped, so no snapshot holds its workspace; \
                         bring the engine back and run the move again"
                    )));
                }
                tracing::warn!(error = %e, "the old engine does not answer; moving from the last snapshot and keeping the old container as an orphan");
                orphan = Some(Orphan {
                    backend: state.backend.clone(),
                    reason: e.to_string(),
                });
            }
        }
        let old: DockerState = state.backend.decode()?;
        state.backend = BackendState::encode(docker::KIND, &target.apply_to(&old))?;
        state.orphans.extend(orphan);
        self.resume(state, snapshot, options).await
    }

    /// Removes the orphans of the sandbox whose state is `state` (see
    /// [`SandboxClient::resume_on_engine`]) whose engines answer now, and
    /// says which are left. Hold the sandbox's lock and save the returned
    /// state.
    pub async fn remove_orphans(&self, state: &SandboxState) -> OrphanCleanup {
        let mut cleanup = OrphanCleanup {
            state: state.clone(),
            removed: Vec::new(),
            remaining: Vec::new(),
        };
        let mut kept = Vec::new();
        for orphan in &state.orphans {
            let decoded: Result<DockerState, _> = orphan.backend.decode();
            let result = match &decoded {
                Ok(old) => match DockerBackend::connect(old.clone(), &state.session_id, None).await
                {
                    Ok(mut backend) => backend.destroy().await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(BackendError::State {
                    kind: orphan.backend.kind.clone(),
                    message: e.to_string(),
                }),
            };
            let what = decoded
                .as_ref()
                .map(describe)
                .unwrap_or_else(|_| format!("a {} instance", orphan.backend.kind));
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
