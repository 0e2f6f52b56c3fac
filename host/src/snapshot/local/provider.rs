//! The local kind's options and provider: `--snapshot local[:DIR]`, the
//! state's `base_dir`, and the archives under a home no sandbox uses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::LocalSnapshot;
use crate::snapshot::provider::{
    absolute_argument, BindContext, Binding, BoundStore, KindFields, OrphanFile, OrphanFileReason,
    SnapshotKindError, SnapshotOptions, SnapshotProvider,
};
use crate::snapshot::SnapshotState;

/// The state field that holds the base directory.
const BASE_DIR: &str = "base_dir";

/// A local snapshot's settings: `<base_dir>/<id>.tar` on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The directory archives are kept in (made with mode 0700).
    pub base_dir: PathBuf,
}

#[async_trait::async_trait]
impl SnapshotOptions for LocalOptions {
    fn kind(&self) -> &str {
        LocalSnapshot::KIND
    }

    async fn bind(&self, context: &BindContext<'_>) -> Result<Binding, SnapshotKindError> {
        let snapshot = LocalSnapshot::new(context.id.clone(), self.base_dir.clone())
            .map_err(crate::store_error::StoreError::from)?;
        let mut fields = KindFields::new();
        fields.insert(BASE_DIR.into(), self.base_dir.display().to_string().into());
        Ok(Binding::new(
            LocalSnapshot::KIND,
            BoundStore::Snapshot(Arc::new(snapshot)),
        )
        .fields(fields))
    }
}

/// The local kind: `local` keeps archives under `$BERTH_HOME/snapshots`,
/// `local:DIR` under `DIR`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalProvider;

impl LocalProvider {
    /// The base directory a local snapshot state records.
    fn base_dir(fields: &KindFields) -> Option<PathBuf> {
        fields.get(BASE_DIR)?.as_str().map(PathBuf::from)
    }

    /// The home's own snapshot directory (every file there is Berth's).
    fn home_dir(home: &Path) -> PathBuf {
        home.join("snapshots")
    }
}

impl SnapshotProvider for LocalProvider {
    fn kind(&self) -> &str {
        LocalSnapshot::KIND
    }

    fn choice_usage(&self) -> String {
        "local, local:DIR".into()
    }

    fn parse_choice(
        &self,
        argument: Option<&str>,
        home: &Path,
    ) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        let base_dir = match argument {
            None => Self::home_dir(home),
            Some(dir) if !dir.is_empty() => absolute_argument(&format!("local:{dir}"), dir)?,
            Some(_) => {
                return Err(SnapshotKindError::Choice {
                    choice: "local:".into(),
                    problem: "name a directory after `local:`, or use `local`".into(),
                })
            }
        };
        Ok(Arc::new(LocalOptions { base_dir }))
    }

    fn resume(&self, fields: &KindFields) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError> {
        let base_dir = Self::base_dir(fields).ok_or_else(|| SnapshotKindError::CorruptState {
            kind: LocalSnapshot::KIND.into(),
            problem: "a local snapshot without base_dir".into(),
        })?;
        Ok(Arc::new(LocalOptions { base_dir }))
    }

    /// Whole archives in `home/snapshots` that no known snapshot is, and
    /// unfinished archives of killed stops there and in every directory a
    /// known snapshot uses. Sorted by directory.
    fn orphan_files(&self, home: &Path, known: &[&SnapshotState]) -> Vec<OrphanFile> {
        let home_dir = Self::home_dir(home);
        let local: Vec<(PathBuf, PathBuf)> = known
            .iter()
            .filter_map(|s| {
                let base = Self::base_dir(&s.fields)?;
                let file = LocalSnapshot::archive_of(&base, s.id.as_str());
                Some((base, file))
            })
            .collect();
        let used: BTreeSet<&PathBuf> = local.iter().map(|(_, file)| file).collect();
        let mut out: Vec<OrphanFile> = LocalSnapshot::archives_in(&home_dir)
            .into_iter()
            .filter(|file| !used.contains(file))
            .map(|path| OrphanFile {
                path,
                reason: OrphanFileReason::Unused,
            })
            .collect();
        let mut bases: BTreeSet<PathBuf> = local.into_iter().map(|(base, _)| base).collect();
        bases.insert(home_dir);
        for base in bases {
            out.extend(
                LocalSnapshot::abandoned_partials(&base)
                    .into_iter()
                    .map(|path| OrphanFile {
                        path,
                        reason: OrphanFileReason::UnfinishedStop,
                    }),
            );
        }
        out
    }
}
