//! How a backend's slow steps go (an image pull, a swarm placement), in
//! one shape every kind fills, so a front end draws them without knowing
//! which kind it is talking to.

use std::sync::Arc;

/// A slow step a backend takes for its caller, as far as it has come.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendProgress {
    /// The backend kind taking the step.
    pub backend: String,
    /// What is happening, in a few words (`pulling alpine:3.20`, `waiting
    /// for the swarm: berth-1a2b`).
    pub what: String,
    /// Its state now, in words (a task's state and the swarm's reason), if
    /// the kind has one.
    pub detail: Option<String>,
    /// Bytes done and the total known so far, when the step moves bytes.
    pub bytes: Option<(u64, u64)>,
    /// Whether the step is over.
    pub finished: bool,
    /// Once it is over: what to tell the user about it, if anything (the
    /// kind decides; a wait too short to notice says nothing).
    pub summary: Option<String>,
}

impl BackendProgress {
    /// A report of `backend`'s step `what`.
    pub fn new(backend: impl Into<String>, what: impl Into<String>) -> Self {
        BackendProgress {
            backend: backend.into(),
            what: what.into(),
            ..Default::default()
        }
    }
}

/// The function behind a [`ProgressSink`].
pub type ProgressFn = dyn Fn(&BackendProgress) + Send + Sync;

/// A front end's way to be told [`BackendProgress`] (to draw a bar or a
/// spinner), given to every kind through
/// `SandboxClientBuilder::backend_progress`.
#[derive(Clone)]
pub struct ProgressSink(pub Arc<ProgressFn>);

impl ProgressSink {
    /// Tells the front end.
    pub fn report(&self, progress: &BackendProgress) {
        (self.0)(progress)
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink(..)")
    }
}
