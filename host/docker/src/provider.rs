//! The Docker backend's provider: how the lifecycle resumes, lists and
//! forks Docker sandboxes, and makes options from a front end's settings.

use super::options::*;
use super::*;
use berth::backend::{
    Backend, BackendError, BackendProvider, BackendSpec, BackendState, BackendSummary,
};

/// The Docker backend's [`BackendProvider`]: resumes containers on the
/// engine their state names.
#[derive(Debug, Clone, Default)]
pub struct DockerProvider {
    pull_progress: Option<PullProgress>,
}

impl DockerProvider {
    /// Told how image pulls go when a resumed sandbox's engine lacks its
    /// image (it is re-created after being removed). By default, nobody.
    pub fn pull_progress(mut self, progress: PullProgress) -> Self {
        self.pull_progress = Some(progress);
        self
    }
}

#[async_trait::async_trait]
impl BackendProvider for DockerProvider {
    fn kind(&self) -> &str {
        KIND
    }

    async fn resume(
        &self,
        state: &BackendState,
        session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(
            DockerBackend::connect(state.decode()?, session_id, self.pull_progress.clone()).await?,
        ))
    }

    fn settings_doc(&self) -> Vec<berth::backend::SettingDoc> {
        super::SETTINGS.to_vec()
    }

    fn options_from(
        &self,
        settings: &berth::backend::BackendSettings,
    ) -> Result<BackendSpec, BackendError> {
        let mut options = super::DockerSettings::decode(settings)?.into_options(settings)?;
        options.pull_progress = self.pull_progress.clone();
        Ok(BackendSpec::new(options))
    }

    fn summary(&self, state: &BackendState) -> BackendSummary {
        match state.decode::<DockerState>() {
            Ok(s) => {
                let mut summary = BackendSummary::new(
                    Some(
                        s.container_id
                            .as_deref()
                            .map(|id| id[..id.len().min(12)].to_string())
                            .unwrap_or(s.container_name),
                    ),
                    s.engine,
                );
                summary.isolation = Some(super::runtime::isolation_name(s.runtime.as_deref()));
                summary
            }
            Err(_) => BackendSummary::default(),
        }
    }

    fn options_like(&self, state: &BackendState) -> Result<BackendSpec, BackendError> {
        let mut options = DockerOptions::like(&state.decode()?);
        options.pull_progress = self.pull_progress.clone();
        Ok(BackendSpec::new(options))
    }

    fn relocatable(&self) -> bool {
        true
    }

    fn with_progress(
        &self,
        sink: berth::backend::ProgressSink,
    ) -> Option<std::sync::Arc<dyn BackendProvider>> {
        Some(std::sync::Arc::new(
            self.clone()
                .pull_progress(super::pull::reported_to(KIND, sink)),
        ))
    }

    async fn remove_orphan(
        &self,
        state: &BackendState,
        session_id: &str,
    ) -> Result<(), BackendError> {
        let mut orphan: DockerState = state.decode()?;
        // The workspace's disk image is on this host, one per sandbox: the
        // instance that holds the sandbox now mounts it, and removes it
        // when the sandbox goes. An orphan's container only binds it.
        orphan.disk = None;
        let mut backend = DockerBackend::connect(orphan, session_id, None).await?;
        backend.destroy().await
    }
}
