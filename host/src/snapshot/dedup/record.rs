//! What a deduplicated snapshot keeps in the sandbox state: its retained
//! generations, which one the workspace descends from, and what the last
//! stop cost.

use serde::{Deserialize, Serialize};

/// One persisted generation: an index object and the tar it describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Its number (1 for a snapshot's first stop).
    pub number: u64,
    /// The index object's id in the store.
    pub index: String,
    /// `blake3:<hex>` of the workspace tar.
    pub digest: String,
    /// Length of the workspace tar.
    pub size: u64,
}

/// What the last stop stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopStats {
    /// The generation it wrote.
    pub generation: u64,
    /// Length of the workspace tar.
    pub tar_bytes: u64,
    /// Raw bytes of the chunks the store did not have yet.
    pub new_bytes: u64,
    /// Bytes sent to the store (packs, journal and index).
    pub uploaded_bytes: u64,
    /// Upload calls made (packs, journal and index).
    pub upload_calls: u64,
    /// Chunks in the tar.
    pub chunks: u64,
    /// Of those, chunks the store did not have yet.
    pub new_chunks: u64,
    /// Packs uploaded.
    pub packs: u64,
    /// Share of the tar that was already stored, `0.000` to `1.000`.
    pub dedup_ratio: String,
}

impl StopStats {
    pub(super) fn finish(mut self) -> Self {
        let reused = self.tar_bytes.saturating_sub(self.new_bytes);
        let ratio = if self.tar_bytes == 0 {
            1.0
        } else {
            reused as f64 / self.tar_bytes as f64
        };
        self.dedup_ratio = format!("{ratio:.3}");
        self
    }
}

/// A deduplicated snapshot's part of the sandbox state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// How many generations are kept (the newest ones).
    pub keep: u32,
    /// Retained generations, oldest first.
    #[serde(default)]
    pub generations: Vec<Generation>,
    /// The generation the workspace was restored from or last persisted
    /// as; `None` before the first stop (or when it is the fork base).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// The generation of another snapshot this one was forked from: what
    /// its first start restores, and its first stop deduplicates against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Generation>,
    /// Generations kept beyond `keep` because a fork started from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<Generation>,
    /// Generations dropped but not yet collected (a collection failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub doomed: Vec<Generation>,
    /// What the last stop stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stop: Option<StopStats>,
}

impl DedupRecord {
    /// The record in a snapshot state's kind-specific fields
    /// (`SnapshotState::fields`), if it is a deduplicated snapshot's and
    /// readable.
    pub fn from_fields(fields: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        super::record_in(fields).ok().flatten()
    }

    /// A record for a new snapshot keeping `keep` generations (at least 1).
    pub fn new(keep: u32) -> Self {
        DedupRecord {
            keep: keep.max(1),
            generations: Vec::new(),
            current: None,
            base: None,
            pinned: Vec::new(),
            doomed: Vec::new(),
            last_stop: None,
        }
    }

    /// A record for a fork starting from `base`.
    pub fn forked_from(base: Generation, keep: u32) -> Self {
        DedupRecord {
            base: Some(base),
            ..DedupRecord::new(keep)
        }
    }

    /// The generation the workspace descends from: the current one, else
    /// the fork base.
    pub fn head(&self) -> Option<&Generation> {
        match self.current {
            Some(n) => self.find(n),
            None => self.base.as_ref(),
        }
    }

    /// A retained (or pinned) generation by number.
    pub fn find(&self, number: u64) -> Option<&Generation> {
        self.generations
            .iter()
            .chain(&self.pinned)
            .find(|g| g.number == number)
    }

    /// The numbers of the kept (retained and pinned) generations, as a
    /// list for messages: `1, 2, 5`, or `none`.
    pub fn kept_numbers(&self) -> String {
        let kept: Vec<String> = self
            .generations
            .iter()
            .chain(&self.pinned)
            .map(|g| g.number.to_string())
            .collect();
        if kept.is_empty() {
            "none".into()
        } else {
            kept.join(", ")
        }
    }

    /// The number the next stop writes.
    pub fn next_number(&self) -> u64 {
        self.generations
            .iter()
            .chain(&self.pinned)
            .chain(&self.doomed)
            .map(|g| g.number)
            .max()
            .unwrap_or(0)
            + 1
    }

    /// Moves generations beyond `keep` (oldest first, never the current
    /// one) to `doomed`.
    pub(super) fn drop_beyond_keep(&mut self) {
        let keep = self.keep.max(1) as usize;
        while self.generations.len() > keep {
            let Some(pos) = self
                .generations
                .iter()
                .position(|g| Some(g.number) != self.current)
            else {
                break;
            };
            let g = self.generations.remove(pos);
            self.doomed.push(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u64) -> Generation {
        Generation {
            number: n,
            index: format!("s.g{n}.idx"),
            digest: format!("blake3:{n}"),
            size: n,
        }
    }

    #[test]
    fn keeps_the_newest_and_the_current() {
        let mut r = DedupRecord::new(2);
        r.generations = vec![g(1), g(2), g(3), g(4)];
        r.current = Some(4);
        r.drop_beyond_keep();
        assert_eq!(r.generations, vec![g(3), g(4)]);
        assert_eq!(r.doomed, vec![g(1), g(2)]);
        assert_eq!(r.next_number(), 5);

        let mut r = DedupRecord::new(1);
        r.generations = vec![g(1), g(2)];
        r.current = Some(1);
        r.drop_beyond_keep();
        assert_eq!(r.generations, vec![g(1)]);
        assert_eq!(r.head(), Some(&g(1)));
        assert_eq!(r.next_number(), 3);
    }

    #[test]
    fn a_fork_starts_from_its_base() {
        let r = DedupRecord::forked_from(g(7), 1);
        assert_eq!(r.head(), Some(&g(7)));
        assert_eq!(r.next_number(), 1);
    }
}
