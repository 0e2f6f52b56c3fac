//! Snapshot providers: how the lifecycle makes, resumes and cleans up
//! snapshots of a kind it does not know — the snapshot side of
//! [`crate::backend::BackendProvider`].
//!
//! A snapshot kind brings two things:
//! - its **options** ([`SnapshotOptions`]): what a new sandbox's snapshot
//!   is made with (the local kind's directory, a plugin's manifest),
//!   wrapped in a [`SnapshotSpec`](crate::sandbox::SnapshotSpec); binding
//!   them opens the snapshot and returns the kind's own state fields;
//! - its **provider** ([`SnapshotProvider`]), registered with the
//!   [`SandboxClient`](crate::SandboxClient): it parses a front end's
//!   `--snapshot KIND[:ARGUMENT]`, makes options again from the fields a
//!   state recorded, and names the files of its kind that no sandbox uses
//!   (for `berth gc --orphans`).
//!
//! What `rm` deletes is the bound snapshot's own business
//! ([`SandboxSnapshot::delete_stored`]): no front end knows a layout.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{SandboxSnapshot, SnapshotState};
use crate::plugin_error::PluginError;
use crate::remote_client::RemoteSnapshotClient;
use crate::snapshot_id::SnapshotId;
use crate::store_error::StoreError;

/// The kind's own fields of a snapshot state (see [`SnapshotState::fields`]).
pub type KindFields = serde_json::Map<String, serde_json::Value>;

/// What a snapshot is bound for: its id, and the fields the state
/// recorded when it is resumed (`None` for a new sandbox).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BindContext<'a> {
    /// The snapshot id (stable across resumes).
    pub id: &'a SnapshotId,
    /// The state the sandbox was resumed from (or, for a fork, the state
    /// it continues), if any: a plugin kind compares the component digest
    /// it recorded.
    pub previous: Option<&'a SnapshotState>,
}

/// What options bind to: a remote store (which the lifecycle wraps in a
/// remote snapshot, or a deduplicated one) or a whole snapshot.
#[derive(Clone)]
pub enum BoundStore {
    /// A remote store: one archive per snapshot id, or generations of
    /// deduplicated chunks.
    Remote(Arc<dyn RemoteSnapshotClient>),
    /// A whole snapshot implementation.
    Snapshot(Arc<dyn SandboxSnapshot>),
}

impl fmt::Debug for BoundStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundStore::Remote(_) => f.write_str("Remote(..)"),
            BoundStore::Snapshot(s) => write!(f, "Snapshot({})", s.kind()),
        }
    }
}

/// Options bound: the store, the kind the state records, and the kind's
/// own state fields (what [`SnapshotProvider::resume`] reads back).
#[derive(Debug)]
#[non_exhaustive]
pub struct Binding {
    /// The kind recorded in the state (`type`).
    pub kind: String,
    /// What was opened.
    pub store: BoundStore,
    /// The kind's own state fields.
    pub fields: KindFields,
}

impl Binding {
    /// A binding of `kind` to `store`, with no fields of its own yet.
    pub fn new(kind: impl Into<String>, store: BoundStore) -> Self {
        Binding {
            kind: kind.into(),
            store,
            fields: KindFields::new(),
        }
    }

    /// With `fields` as the kind's own state fields.
    pub fn fields(mut self, fields: KindFields) -> Self {
        self.fields = fields;
        self
    }
}

/// A kind's settings for a sandbox's snapshot: the local kind's directory,
/// a plugin's manifest, or an embedder's own.
#[async_trait::async_trait]
pub trait SnapshotOptions: Send + Sync + fmt::Debug {
    /// The kind these options make (the state's `type`).
    fn kind(&self) -> &str;

    /// Whether they bind to a remote store (one archive per id), which
    /// deduplicated generations can be kept in. By default, no.
    fn is_remote_store(&self) -> bool {
        false
    }

    /// Opens the snapshot `context.id`, creating nothing the sandbox does
    /// not persist.
    async fn bind(&self, context: &BindContext<'_>) -> Result<Binding, SnapshotKindError>;
}

/// A file of a snapshot kind on this host that no known sandbox uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanFile {
    /// The file.
    pub path: PathBuf,
    /// Why it is an orphan.
    pub reason: OrphanFileReason,
}

/// Why a snapshot file is an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrphanFileReason {
    /// A whole archive in a directory Berth owns that no sandbox's
    /// snapshot is (left by an older `rm`, or by a state file deleted by
    /// hand).
    Unused,
    /// The unfinished archive of a stop that was killed (a cancelled stop
    /// removes its own; no live writer holds this one).
    UnfinishedStop,
}

impl OrphanFile {
    /// `path`, an orphan for `reason`.
    pub fn new(path: PathBuf, reason: OrphanFileReason) -> Self {
        OrphanFile { path, reason }
    }
}

impl fmt::Display for OrphanFileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrphanFileReason::Unused => "no sandbox uses it",
            OrphanFileReason::UnfinishedStop => "an unfinished archive of a stop that was killed",
        })
    }
}

/// The provider of one snapshot kind, registered with the client.
pub trait SnapshotProvider: Send + Sync {
    /// The kind (the state's `type`, and the `KIND` of `--snapshot KIND`).
    fn kind(&self) -> &str;

    /// How `--snapshot` names this kind, for help and errors: `local` or
    /// `local:DIR`, `plugin:MANIFEST`.
    fn choice_usage(&self) -> String;

    /// Options from a front end's `--snapshot KIND[:ARGUMENT]`: the part
    /// after the first `:`, if any. `home` is the client's home;
    /// relative paths are made absolute against the current directory.
    fn parse_choice(
        &self,
        argument: Option<&str>,
        home: &Path,
    ) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError>;

    /// Options from the fields a state of this kind recorded, for a resume
    /// without a spec. A kind whose stores are objects (not files) cannot
    /// be made from its state: [`SnapshotKindError::NotRecorded`].
    fn resume(&self, fields: &KindFields) -> Result<Arc<dyn SnapshotOptions>, SnapshotKindError>;

    /// The files of this kind under `home` (or in the places `known`, the
    /// snapshot states of this kind of every sandbox known, use) that no
    /// known sandbox uses: what `berth gc --orphans` lists and deletes.
    /// Nothing is deleted here. By default, none.
    fn orphan_files(&self, home: &Path, known: &[&SnapshotState]) -> Vec<OrphanFile> {
        let _ = (home, known);
        Vec::new()
    }
}

/// Why a snapshot kind could not be made, resumed or bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotKindError {
    /// The snapshot was given as an object, so its state cannot make it.
    #[error("this sandbox's {kind} snapshot was given as an object, not a manifest file, so its state cannot recreate it: pass the same SnapshotSpec to SandboxClient::resume")]
    NotRecorded {
        /// The kind.
        kind: String,
    },
    /// The state's fields of this kind are missing or unreadable.
    #[error("the {kind} snapshot's state is unreadable: {problem}")]
    CorruptState {
        /// The kind.
        kind: String,
        /// What is wrong.
        problem: String,
    },
    /// A `--snapshot` argument this kind does not take.
    #[error("--snapshot {choice:?}: {problem}")]
    Choice {
        /// The whole choice.
        choice: String,
        /// What is wrong, and what the kind takes.
        problem: String,
    },
    /// A plugin is of the other world.
    #[error("{plugin} is a {is}, but this snapshot needs a {needs}")]
    PluginWorld {
        /// The plugin (manifest path or name).
        plugin: String,
        /// Its world.
        is: &'static str,
        /// The world needed.
        needs: &'static str,
    },
    /// Loading or instantiating a plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An embedder's kind failed.
    #[error("the {kind} snapshot")]
    Other {
        /// The kind.
        kind: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The providers a client knows, by kind.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    providers: BTreeMap<String, Arc<dyn SnapshotProvider>>,
}

impl Registry {
    /// Adds `provider`, replacing one of the same kind.
    pub(crate) fn register(&mut self, provider: Arc<dyn SnapshotProvider>) {
        self.providers.insert(provider.kind().to_string(), provider);
    }

    /// The providers, by kind.
    pub(crate) fn providers(&self) -> impl Iterator<Item = &Arc<dyn SnapshotProvider>> {
        self.providers.values()
    }

    /// The provider of `kind`.
    pub(crate) fn get(&self, kind: &str) -> Option<&Arc<dyn SnapshotProvider>> {
        self.providers.get(kind)
    }

    /// How `--snapshot` names each kind, sorted by kind.
    pub(crate) fn usages(&self) -> Vec<String> {
        self.providers.values().map(|p| p.choice_usage()).collect()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.providers.keys()).finish()
    }
}

/// `argument` made absolute against the current directory, or a choice
/// error naming `choice`.
pub fn absolute_argument(choice: &str, argument: &str) -> Result<PathBuf, SnapshotKindError> {
    std::path::absolute(argument).map_err(|e| SnapshotKindError::Choice {
        choice: choice.to_string(),
        problem: format!("{argument:?} is not a usable path: {e}"),
    })
}
