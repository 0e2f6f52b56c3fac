//! The snapshot that stores nothing.

use tokio::io::{AsyncRead, AsyncWrite};

use std::sync::Arc;

use super::provider::{
    BindContext, Binding, BoundStore, KindFields, SnapshotKindError, SnapshotOptions,
    SnapshotProvider,
};
use super::SandboxSnapshot;
use crate::snapshot_id::SnapshotId;
use crate::store_error::{StorageError, StoreError};

/// Persistence disabled: `persist` drains and discards the archive,
/// `restore` fails with not-found, never restorable.
#[derive(Debug, Clone)]
pub struct NoopSnapshot {
    id: SnapshotId,
}

impl NoopSnapshot {
    /// The kind's name, in the sandbox state and `--snapshot noop`.
    pub const KIND: &'static str = "noop";

    /// A noop snapshot named `id`.
    pub fn new(id: SnapshotId) -> Self {
        NoopSnapshot { id }
    }
}

#[async_trait::async_trait]
impl SandboxSnapshot for NoopSnapshot {
    fn id(&self) -> &str {
        self.id.as_str()
    }

    fn kind(&self) -> &str {
        Self::KIND
    }

    fn persistence_enabled(&self) -> bool {
        false
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        tokio::io::copy(archive, &mut tokio::io::sink())
            .await
            .map_err(StoreError::Source)?;
        Ok(())
    }

    async fn restore(&self, _sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        Err(StorageError::NotFound(format!(
            "snapshot {:?} is a noop snapshot: persistence is disabled, nothing was stored",
            self.id.as_str()
        ))
        .into())
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn delete_stored(&self) -> Result<super::DeleteReport, StoreError> {
        Ok(super::DeleteReport::default())
    }
}

/// The noop kind's options: nothing to set.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopOptions;

#[async_trait::async_trait]
impl SnapshotOptions for NoopOptions {
    fn kind(&self) -> &str {
        NoopSnapshot::KIND
    }

    async fn bind(&self, context: &BindContext<'_>) -> Result<Binding, SnapshotKindError> {
        Ok(Binding::new(
            NoopSnapshot::KIND,
            BoundStore::Snapshot(Arc::new(NoopSnapshot::new(context.id.clone()))),
        ))
    }
}

/// The noop kind: `--snapshot noop`, persistence off.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopProvider;

impl SnapshotProvider for NoopProvider {
    fn kind(&self) -> &str {
        NoopSnapshot::KIND
    }

    fn choice_usage(&self) -> String {
        "noop".into()
    }

    fn parse_choice(
        &self,
        argument: Option<&str>,
        _home: &std::path::Path,
    ) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        match argument {
            None => Ok(Arc::new(NoopOptions)),
            Some(a) => Err(SnapshotKindError::Choice {
                choice: format!("noop:{a}"),
                problem: "noop takes no argument".into(),
            }),
        }
    }

    fn resume(&self, _fields: &KindFields) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        Ok(Arc::new(NoopOptions))
    }
}
