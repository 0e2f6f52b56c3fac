//! Moving a Docker sandbox to another engine: the engine's part of
//! `SandboxClient::move_to` (which place the sandbox goes to; the
//! lifecycle does the rest).

use super::{describe_engine, DockerState, EngineChoice, KIND};
use berth::backend::{BackendError, BackendState};

impl EngineChoice {
    /// The backend state of a sandbox (`current`, its state now) moved to
    /// this engine (an endpoint or a Docker context): a new container, not
    /// yet created, with the same settings, name, workspace and binds.
    /// `None` when it already runs on this engine. Refused for a sandbox of
    /// another backend and for a container Berth did not create.
    ///
    /// Hand the result to `SandboxClient::move_to`, whose `start` restores
    /// the workspace there from the snapshot (which must be in a shared
    /// store, such as the s3-store plugin), or resume as usual on `None`:
    ///
    /// ```no_run
    /// use berth_docker::EngineChoice;
    /// use berth::sandbox::{SandboxClient, SandboxState};
    /// # async fn f(json: &str) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = SandboxClient::new("/var/lib/my-agent/berth");
    /// let state = SandboxState::from_json(json)?;
    /// let target = EngineChoice::new("tcp://gpu2.internal:2376").tls_cert_path("/etc/berth/gpu2");
    /// let mut sandbox = match target.moved_state(&state.backend)? {
    ///     Some(moved) => client.move_to(state, moved, None, Default::default()).await?,
    ///     None => client.resume(state, None, Default::default()).await?,
    /// };
    /// sandbox.start().await?; // restored there from the shared snapshot
    /// let moved = sandbox.state(); // names the new engine, and any orphan left
    /// # let _ = moved; Ok(()) }
    /// ```
    pub fn moved_state(
        &self,
        current: &BackendState,
    ) -> Result<Option<BackendState>, BackendError> {
        let refuse = |why: String| BackendError::Config {
            backend: KIND,
            message: format!(
                "cannot move to {}: {why}",
                describe_engine(Some(self.reference()))
            ),
        };
        if current.kind != KIND {
            return Err(refuse(format!(
                "it runs on the {} backend; only Docker sandboxes run on engines",
                current.kind
            )));
        }
        let old: DockerState = current.decode()?;
        if self.is_engine_of(&old) {
            return Ok(None);
        }
        if !old.container_owned {
            return Err(refuse(format!(
                "its container {} is not Berth's, and Berth does not move containers it did not create",
                old.container_name
            )));
        }
        BackendState::encode(KIND, &self.apply_to(&old)).map(Some)
    }
}
