//! What changed between two generations, read from their indexes alone
//! (format version 2 records every entry): `berth diff`, and the counts
//! `berth history` shows.

use std::collections::HashMap;

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
            c.count(p.change);
        }
        c
    }
}

/// An index's members by path (borrowed: nothing is copied).
struct ByPath<'a> {
    index: &'a Index,
    members: HashMap<&'a [u8], usize>,
}

impl<'a> ByPath<'a> {
    fn new(index: &'a Index) -> Self {
        ByPath {
            index,
            members: index
                .members
                .iter()
                .enumerate()
                .map(|(n, m)| (m.entry.path.as_slice(), n))
                .collect(),
        }
    }

    /// A member as a person sees the path: a hardlink is the file it is
    /// another name of (its kind, size and content), so a change through
    /// one name shows on both, and a link broken by a copy is no change.
    fn seen(&self, m: &'a Member) -> &'a Member {
        if m.entry.kind != EntryKind::Hardlink {
            return m;
        }
        self.members
            .get(m.entry.link.as_slice())
            .map(|&n| &self.index.members[n])
            .filter(|t| t.entry.kind == EntryKind::File)
            .unwrap_or(m)
    }
}

/// What differs between two members of the same path.
fn differences(a_side: &ByPath, a: &Member, b_side: &ByPath, b: &Member) -> Vec<&'static str> {
    let mut what = Vec::new();
    let (fa, fb) = (a_side.seen(a), b_side.seen(b));
    if fa.entry.kind != fb.entry.kind {
        what.push("kind");
    }
    if a.entry.mode != b.entry.mode {
        what.push("mode");
    }
    if fa.entry.size != fb.entry.size {
        what.push("size");
    }
    let same_chunks = || {
        let (ra, rb) = (a_side.index.run(fa), b_side.index.run(fb));
        ra.len() == rb.len() && ra.iter().zip(rb).all(|(x, y)| x.chunk == y.chunk)
    };
    if fa.entry.kind == fb.entry.kind && !same_chunks() {
        what.push("content");
    }
    if fa.entry.kind == EntryKind::Symlink && a.entry.link != b.entry.link {
        what.push("target");
    }
    what
}

/// Calls `found` with every path `older` and `newer` differ by (newer's
/// in its order, then the removed ones), its change, what differs and its
/// kind's word. The workspace root is left out (its time changes with
/// every entry); times alone are not a difference.
fn compare<'a>(
    older: &'a Index,
    newer: &'a Index,
    mut found: impl FnMut(&'a [u8], ChangeKind, Vec<&'static str>, &'static str),
) {
    let (a, b) = (ByPath::new(older), ByPath::new(newer));
    let mut matched = vec![false; older.members.len()];
    for m in newer.members.iter().filter(|m| !m.entry.path.is_empty()) {
        let path = m.entry.path.as_slice();
        match a.members.get(path) {
            None => found(path, ChangeKind::Added, Vec::new(), m.entry.kind.word()),
            Some(&o) => {
                matched[o] = true;
                let what = differences(&a, &older.members[o], &b, m);
                if !what.is_empty() {
                    found(path, ChangeKind::Modified, what, m.entry.kind.word());
                }
            }
        }
    }
    for (o, m) in older.members.iter().enumerate() {
        if !matched[o] && !m.entry.path.is_empty() {
            let path = m.entry.path.as_slice();
            found(path, ChangeKind::Removed, Vec::new(), m.entry.kind.word());
        }
    }
}

/// The paths `older` and `newer` differ by, sorted (see [`compare`]).
pub(super) fn diff(older: &Index, newer: &Index) -> TreeDiff {
    let mut found = Vec::new();
    compare(older, newer, |path, change, what, kind| {
        found.push((path, change, what, kind));
    });
    found.sort_by(|x, y| x.0.cmp(y.0));
    TreeDiff {
        from: older.header.generation,
        to: newer.header.generation,
        paths: found
            .into_iter()
            .map(|(path, change, what, kind)| PathChange {
                path: String::from_utf8_lossy(path).into_owned(),
                change,
                what,
                kind,
            })
            .collect(),
    }
}

impl Changes {
    /// The counts between a parent generation and its child (`None` when
    /// the parent is format version 1, which does not record its files).
    pub(super) fn between(parent: &Index, child: &Index) -> Option<Changes> {
        (parent.header.version >= 2).then(|| {
            let mut c = Changes::default();
            compare(parent, child, |_, change, _, _| c.count(change));
            c
        })
    }

    /// Counts one changed path.
    fn count(&mut self, change: ChangeKind) {
        match change {
            ChangeKind::Added => self.added += 1,
            ChangeKind::Modified => self.changed += 1,
            ChangeKind::Removed => self.removed += 1,
        }
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
