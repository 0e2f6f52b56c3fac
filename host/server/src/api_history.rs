//! The wire types of a sandbox's generations (deduplicated snapshots):
//! history, diff, checkpoint and rewind. Their JSON is the library's
//! (`berth history --json` and `berth diff --json` print the same
//! whether a server answered or not).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::SandboxRecord;

/// `GET /v1/sandboxes/{name}/history`: the kept generations.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct History {
    /// The kept generations, oldest first.
    pub generations: Vec<GenerationRow>,
    /// The generation the workspace descends from.
    pub current: Option<u64>,
}

/// One kept generation.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct GenerationRow {
    /// Its number (1 for the snapshot's first stop).
    pub number: u64,
    /// Its index object's id in the store.
    pub index: String,
    /// Its seal: equal seals, equal workspaces.
    pub digest: String,
    /// Length of the workspace tar.
    pub size: u64,
    /// When it was written (Unix seconds), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// What made it; none: a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<Note>,
    /// Paths added, changed and removed since its parent, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// Bytes its stop sent to the store, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
}

/// Why a generation was written.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Note {
    /// The checkpoint after a command.
    Exec {
        /// The command line.
        command: String,
        /// Its exit code.
        exit_code: i32,
        /// When it started (Unix milliseconds).
        started_ms: u64,
        /// How long it ran.
        duration_ms: u64,
    },
    /// A checkpoint asked for by name.
    Checkpoint {
        /// What its asker said of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The workspace as it was before a rewind to generation `to`.
    BeforeRewind {
        /// The generation rewound to.
        to: u64,
    },
    /// A note this server does not know how to show.
    #[serde(other)]
    Other,
}

/// Counts of the paths two generations differ by.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub struct Changes {
    /// Paths only in the newer one.
    pub added: u64,
    /// Paths in both that differ.
    pub changed: u64,
    /// Paths only in the older one.
    pub removed: u64,
}

/// `GET /v1/sandboxes/{name}/diff`: the paths two generations differ by,
/// sorted by path.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Diff {
    /// The older generation.
    pub from: u64,
    /// The newer generation.
    pub to: u64,
    /// The paths, sorted.
    pub paths: Vec<PathDiff>,
}

/// One path of a [`Diff`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PathDiff {
    /// Relative to the workspace (lossy UTF-8).
    pub path: String,
    /// `added`, `removed` or `modified`.
    pub change: String,
    /// For a modified path, what differs: `kind`, `mode`, `size`,
    /// `content`, `target`.
    pub what: Vec<String>,
    /// `file`, `directory`, `symlink` or `hardlink` (in the newer
    /// generation; the older one's when removed).
    pub kind: String,
}

/// `POST /v1/sandboxes/{name}/checkpoint`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// What to say of it in the history.
    #[serde(default)]
    pub message: Option<String>,
}

/// `POST /v1/sandboxes/{name}/rewind`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindBody {
    /// The kept generation to make the workspace.
    pub generation: u64,
}

/// What a rewind did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Rewound {
    /// The generation the workspace now is.
    pub generation: u64,
    /// The generation that saved the workspace as it was before (rewind to
    /// it to undo this).
    pub saved_as: u64,
    /// The record after the rewind.
    pub sandbox: SandboxRecord,
}

impl From<berth::snapshot::History> for History {
    fn from(h: berth::snapshot::History) -> Self {
        History {
            current: h.current,
            generations: h.generations.into_iter().map(GenerationRow::from).collect(),
        }
    }
}

impl From<berth::snapshot::Generation> for GenerationRow {
    fn from(g: berth::snapshot::Generation) -> Self {
        use berth::snapshot::GenerationNote as N;
        let note = g.note.map(|n| match n {
            N::Exec {
                command,
                exit_code,
                started_ms,
                duration_ms,
            } => Note::Exec {
                command,
                exit_code,
                started_ms,
                duration_ms,
            },
            N::Checkpoint { message } => Note::Checkpoint { message },
            N::BeforeRewind { to } => Note::BeforeRewind { to },
            _ => Note::Other,
        });
        GenerationRow {
            number: g.number,
            index: g.index,
            digest: g.digest,
            size: g.size,
            created: g.created,
            note,
            changes: g.changes.map(|c| Changes {
                added: c.added,
                changed: c.changed,
                removed: c.removed,
            }),
            stored_bytes: g.stored_bytes,
        }
    }
}

impl From<berth::snapshot::TreeDiff> for Diff {
    fn from(d: berth::snapshot::TreeDiff) -> Self {
        Diff {
            from: d.from,
            to: d.to,
            paths: d
                .paths
                .into_iter()
                .map(|p| PathDiff {
                    change: match p.change {
                        berth::snapshot::ChangeKind::Added => "added",
                        berth::snapshot::ChangeKind::Removed => "removed",
                        berth::snapshot::ChangeKind::Modified => "modified",
                    }
                    .to_string(),
                    path: p.path,
                    what: p.what.iter().map(|w| w.to_string()).collect(),
                    kind: p.kind.to_string(),
                })
                .collect(),
        }
    }
}

impl Diff {
    /// Counts of added, modified and removed paths.
    pub fn counts(&self) -> Changes {
        let mut c = Changes {
            added: 0,
            changed: 0,
            removed: 0,
        };
        for p in &self.paths {
            match p.change.as_str() {
                "added" => c.added += 1,
                "removed" => c.removed += 1,
                _ => c.changed += 1,
            }
        }
        c
    }
}
