//! Moving a Docker sandbox to another engine: the engine-specific front
//! end of [`SandboxClient::move_to`].

use super::{describe_engine, DockerState, EngineChoice, KIND};
use crate::backend::BackendState;
use crate::sandbox::{
    Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxState, SnapshotSpec,
};

impl SandboxClient {
    /// Resumes a Docker sandbox on another engine (an endpoint or a Docker
    /// context): the container is created there, and `start` restores the
    /// workspace from the snapshot, which must be in a shared store (a
    /// remote plugin such as the s3-store; a local-directory snapshot is
    /// refused). If the old engine answers, the workspace is persisted
    /// there first and the old container removed; if not, the sandbox
    /// moves from its last snapshot and the old container is kept in
    /// [`SandboxState::orphans`]. On the engine it already runs on, this is
    /// [`SandboxClient::resume`]. See [`SandboxClient::move_to`].
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
            target: describe_engine(Some(target.reference())),
            reason,
        };
        if state.backend.kind != KIND {
            return Err(refuse(format!(
                "it runs on the {} backend; only Docker sandboxes run on engines",
                state.backend.kind
            )));
        }
        let old: DockerState = state.backend.decode()?;
        if target.is_engine_of(&old) {
            return self.resume(state, snapshot, options).await;
        }
        if !old.container_owned {
            return Err(refuse(format!(
                "its container {} is not Berth's, and Berth does not move containers it did not create",
                old.container_name
            )));
        }
        let moved = BackendState::encode(KIND, &target.apply_to(&old))?;
        self.move_to(state, moved, snapshot, options).await
    }
}
