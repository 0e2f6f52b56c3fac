//! A snapshot kind written outside the library, as an embedder would:
//! `test-copies:DIR` keeps each snapshot as `DIR/<id>.copy`, with its own
//! options, state field (`dir`), provider and orphan collection. The
//! `berth-test-dir` binary registers it with the `berth` command
//! (`berth_cli::Berth::snapshot_provider`), which brings it to the CLI, the
//! API and Python with no front-end code.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth::snapshot::{
    absolute_argument, BindContext, Binding, BoundStore, DeleteReport, KindFields, OrphanFile,
    OrphanFileReason, SandboxSnapshot, SnapshotKindError, SnapshotOptions, SnapshotProvider,
    SnapshotState,
};
use berth::{StorageError, StoreError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// The kind.
pub const KIND: &str = "test-copies";

/// A snapshot's file.
fn copy_of(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.copy"))
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Local { what, source }
}

/// One snapshot: `DIR/<id>.copy`, written to a temporary file and renamed.
pub struct CopySnapshot {
    dir: PathBuf,
    id: String,
}

#[async_trait::async_trait]
impl SandboxSnapshot for CopySnapshot {
    fn id(&self) -> &str {
        &self.id
    }

    fn kind(&self) -> &str {
        KIND
    }

    fn persistence_enabled(&self) -> bool {
        true
    }

    async fn persist(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<(), StoreError> {
        let partial = self.dir.join(format!(".{}.partial", self.id));
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(io("creating the copy"))?;
        tokio::io::copy(archive, &mut file)
            .await
            .map_err(io("writing the copy"))?;
        file.flush().await.map_err(io("writing the copy"))?;
        tokio::fs::rename(&partial, copy_of(&self.dir, &self.id))
            .await
            .map_err(io("renaming the copy"))
    }

    async fn restore(&self, sink: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<(), StoreError> {
        let mut file = match tokio::fs::File::open(copy_of(&self.dir, &self.id)).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(self.id.clone()).into())
            }
            other => other.map_err(io("opening the copy"))?,
        };
        tokio::io::copy(&mut file, sink)
            .await
            .map_err(io("reading the copy"))?;
        sink.flush().await.map_err(io("reading the copy"))
    }

    async fn is_restorable(&self) -> Result<bool, StoreError> {
        Ok(copy_of(&self.dir, &self.id).is_file())
    }

    async fn delete_stored(&self) -> Result<DeleteReport, StoreError> {
        let mut report = DeleteReport::default();
        let file = copy_of(&self.dir, &self.id);
        match std::fs::remove_file(&file) {
            Ok(()) => report.deleted.push(file.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("deleting the copy")(e)),
        }
        Ok(report)
    }
}

/// The kind's settings: the directory.
#[derive(Debug, Clone)]
pub struct CopiesOptions {
    /// Where the copies live.
    pub dir: PathBuf,
}

#[async_trait::async_trait]
impl SnapshotOptions for CopiesOptions {
    fn kind(&self) -> &str {
        KIND
    }

    async fn bind(&self, context: &BindContext<'_>) -> Result<Binding, SnapshotKindError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| SnapshotKindError::Other {
            kind: KIND.into(),
            source: Box::new(e),
        })?;
        let snapshot = CopySnapshot {
            dir: self.dir.clone(),
            id: context.id.as_str().to_string(),
        };
        let mut fields = KindFields::new();
        fields.insert("dir".into(), self.dir.display().to_string().into());
        Ok(Binding::new(KIND, BoundStore::Snapshot(Arc::new(snapshot))).fields(fields))
    }
}

/// The kind's provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopiesProvider;

fn dir_in(fields: &KindFields) -> Option<PathBuf> {
    fields.get("dir")?.as_str().map(PathBuf::from)
}

impl SnapshotProvider for CopiesProvider {
    fn kind(&self) -> &str {
        KIND
    }

    fn choice_usage(&self) -> String {
        format!("{KIND}:DIR")
    }

    fn parse_choice(
        &self,
        argument: Option<&str>,
        _home: &Path,
    ) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        match argument {
            Some(dir) if !dir.is_empty() => Ok(Arc::new(CopiesOptions {
                dir: absolute_argument(&format!("{KIND}:{dir}"), dir)?,
            })),
            _ => Err(SnapshotKindError::Choice {
                choice: KIND.into(),
                problem: format!("name the directory: {KIND}:DIR"),
            }),
        }
    }

    fn resume(&self, fields: &KindFields) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        let dir = dir_in(fields).ok_or_else(|| SnapshotKindError::CorruptState {
            kind: KIND.into(),
            problem: "no dir".into(),
        })?;
        Ok(Arc::new(CopiesOptions { dir }))
    }

    /// Copies in the directories known snapshots use that none of them is.
    fn orphan_files(&self, _home: &Path, known: &[&SnapshotState]) -> Vec<OrphanFile> {
        let used: Vec<PathBuf> = known
            .iter()
            .filter_map(|s| Some(copy_of(&dir_in(&s.fields)?, s.id.as_str())))
            .collect();
        let mut dirs: Vec<PathBuf> = known.iter().filter_map(|s| dir_in(&s.fields)).collect();
        dirs.sort();
        dirs.dedup();
        dirs.iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "copy") && !used.contains(p))
            .map(|path| OrphanFile::new(path, OrphanFileReason::Unused))
            .collect()
    }
}
