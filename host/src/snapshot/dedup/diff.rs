//! What changed between two generations, read from their indexes alone
//! (format version 2 records every entry): `berth diff`, and the counts
//! `berth history` shows.

use std::collections::BTreeMap;

use serde::Serialize;

use super::format::{Index, Member};
use super::record::Changes;
use crate::workspace::tree::EntryKind;

/// How a path differs between two generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Only in the newer generation.
    Added,
    /// Only in the older generation.
    Removed,
    /// In both, with a different kind, mode, size, content or target.
    Modified,
}

/// One path of a [`TreeDiff`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PathChange {
    /// The path, relative to the workspace (lossy UTF-8).
    pub path: String,
    /// How it differs.
    pub change: ChangeKind,
    /// For a modified path, what differs: `kind`, `mode`, `size`,
    /// `content`, `target`.
    pub what: Vec<&'static str>,
    /// The entry's kind in the newer generation (the older one's when
    /// removed): `file`, `directory`, `symlink`, `hardlink`.
    pub kind: &'static str,
}

/// The paths two generations differ by, sorted by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TreeDiff {
    /// The older generation.
    pub from: u64,
    /// The newer generation.
    pub to: u64,
    /// The paths, sorted.
    pub paths: Vec<PathChange>,
}

impl TreeDiff {
    /// The counts of added, modified and removed paths.
    pub fn counts(&self) -> Changes {
        let mut c = Changes::default();
        for p in &self.paths {
            match p.change {
                ChangeKind::Added => c.added += 1,
                ChangeKind::Modified => c.changed += 1,
                ChangeKind::Removed => c.removed += 1,
            }
        }
        c
    }
}

/// A member as a person sees the path: a hardlink is the file it is
/// another name of (its kind, size and content), so a change through
/// one name shows on both, and a link broken by a copy is no change.
fn seen<'a>(index: &'a Index, m: &'a Member) -> &'a Member {
    if m.entry.kind != EntryKind::Hardlink {
        return m;
    }
    index
        .members
        .iter()
        .find(|t| t.entry.path == m.entry.link && t.entry.kind == EntryKind::File)
        .unwrap_or(m)
}

/// What differs between two members of the same path.
fn differences(a_index: &Index, a: &Member, b_index: &Index, b: &Member) -> Vec<&'static str> {
    let mut what = Vec::new();
    let (fa, fb) = (seen(a_index, a), seen(b_index, b));
    if fa.entry.kind != fb.entry.kind {
        what.push("kind");
    }
    if a.entry.mode != b.entry.mode {
        what.push("mode");
    }
    if fa.entry.size != fb.entry.size {
        what.push("size");
    }
    let ids =
        |i: &Index, m: &Member| -> Vec<[u8; 32]> { i.run(m).iter().map(|c| c.chunk).collect() };
    if fa.entry.kind == fb.entry.kind && ids(a_index, fa) != ids(b_index, fb) {
        what.push("content");
    }
    if fa.entry.kind == EntryKind::Symlink && a.entry.link != b.entry.link {
        what.push("target");
    }
    what
}

/// The paths `older` and `newer` differ by. The workspace root is left
/// out (its time changes with every entry); times alone are not a
/// difference.
pub(super) fn diff(older: &Index, newer: &Index) -> TreeDiff {
    let by_path = |i: &Index| -> BTreeMap<Vec<u8>, usize> {
        i.members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.entry.path.is_empty())
            .map(|(n, m)| (m.entry.path.clone(), n))
            .collect()
    };
    let (a, b) = (by_path(older), by_path(newer));
    let mut paths = Vec::new();
    let mut keys: Vec<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let path = String::from_utf8_lossy(key).into_owned();
        match (a.get(key), b.get(key)) {
            (None, Some(&n)) => paths.push(PathChange {
                path,
                change: ChangeKind::Added,
                what: Vec::new(),
                kind: newer.members[n].entry.kind.word(),
            }),
            (Some(&o), None) => paths.push(PathChange {
                path,
                change: ChangeKind::Removed,
                what: Vec::new(),
                kind: older.members[o].entry.kind.word(),
            }),
            (Some(&o), Some(&n)) => {
                let what = differences(older, &older.members[o], newer, &newer.members[n]);
                if !what.is_empty() {
                    paths.push(PathChange {
                        path,
                        change: ChangeKind::Modified,
                        what,
                        kind: newer.members[n].entry.kind.word(),
                    });
                }
            }
            (None, None) => {}
        }
    }
    TreeDiff {
        from: older.header.generation,
        to: newer.header.generation,
        paths,
    }
}

impl Changes {
    /// The counts between a parent generation and its child (`None` when
    /// the parent is format version 1, which does not record its files).
    pub(super) fn between(parent: &Index, child: &Index) -> Option<Changes> {
        (parent.header.version >= 2).then(|| diff(parent, child).counts())
    }

    /// Every path of a first generation is added.
    pub(super) fn all_new(index: &Index) -> Changes {
        Changes {
            added: index
                .members
                .iter()
                .filter(|m| !m.entry.path.is_empty())
                .count() as u64,
            ..Changes::default()
        }
    }
}
