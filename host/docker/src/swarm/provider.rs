//! The swarm backend's provider: how the lifecycle resumes, lists and
//! forks swarm sandboxes, and makes options from a front end's settings.

use super::options::*;
use std::sync::Arc;

use super::*;
use berth::backend::{
    Backend, BackendError, BackendProvider, BackendSpec, BackendState, BackendSummary,
};

/// The swarm backend's [`BackendProvider`].
#[derive(Debug, Clone, Default)]
pub struct SwarmProvider {
    progress: Option<PlacementProgress>,
}

impl SwarmProvider {
    /// Told how placements go when a resumed sandbox waits for its task.
    /// By default, nobody.
    pub fn placement_progress(mut self, progress: PlacementProgress) -> Self {
        self.progress = Some(progress);
        self
    }
}

#[async_trait::async_trait]
impl BackendProvider for SwarmProvider {
    fn kind(&self) -> &str {
        KIND
    }

    async fn resume(
        &self,
        state: &BackendState,
        session_id: &str,
    ) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(
            SwarmBackend::connect(state.decode()?, session_id, self.progress.clone()).await?,
        ))
    }

    fn summary(&self, state: &BackendState) -> BackendSummary {
        match state.decode::<SwarmState>() {
            Ok(s) => {
                let mut summary =
                    BackendSummary::new(Some(s.service_name), s.managers.first().cloned());
                summary.isolation = Some("container".into());
                summary.node = s.current.map(|t| {
                    let short = &t.node[..t.node.len().min(12)];
                    if t.hostname.is_empty() {
                        short.to_string()
                    } else {
                        format!("{} ({short})", t.hostname)
                    }
                });
                summary
            }
            Err(_) => BackendSummary::default(),
        }
    }

    fn settings_doc(&self) -> Vec<berth::backend::SettingDoc> {
        super::SETTINGS.to_vec()
    }

    fn options_from(
        &self,
        settings: &berth::backend::BackendSettings,
    ) -> Result<BackendSpec, BackendError> {
        let mut options = super::SwarmSettings::decode(settings)?.into_options(settings)?;
        options.progress = self.progress.clone();
        Ok(BackendSpec::new(options))
    }

    fn options_like(&self, state: &BackendState) -> Result<BackendSpec, BackendError> {
        let mut options = SwarmOptions::like(&state.decode()?);
        options.progress = self.progress.clone();
        Ok(BackendSpec::new(options))
    }

    fn with_progress(
        &self,
        sink: berth::backend::ProgressSink,
    ) -> Option<Arc<dyn BackendProvider>> {
        Some(Arc::new(
            self.clone().placement_progress(placement_reported_to(sink)),
        ))
    }
}

/// A [`PlacementProgress`] that tells `sink` in the kinds' common shape:
/// the task's state while Berth waits for it, and, when the task runs
/// after a wait long enough to notice (2 s), a line saying how long.
fn placement_reported_to(sink: berth::backend::ProgressSink) -> PlacementProgress {
    let waiting =
        std::sync::Mutex::new(std::collections::HashMap::<String, std::time::Instant>::new());
    PlacementProgress(Arc::new(move |status: &PlacementStatus| {
        let mut report = berth::backend::BackendProgress::new(
            KIND,
            format!("waiting for the swarm: {}", status.service),
        );
        report.detail = Some(match &status.message {
            Some(m) => format!("{} ({m})", status.state),
            None => status.state.clone(),
        });
        let mut waits = waiting.lock().unwrap_or_else(|p| p.into_inner());
        if status.finished {
            let waited = waits
                .remove(&status.service)
                .map_or(0.0, |w| w.elapsed().as_secs_f64());
            report.finished = true;
            if waited >= 2.0 && status.state == "running" {
                report.summary = Some(format!(
                    "{} running after {waited:.1} s of placement",
                    status.service
                ));
            }
        } else {
            waits
                .entry(status.service.clone())
                .or_insert_with(std::time::Instant::now);
        }
        drop(waits);
        sink.report(&report);
    }))
}
