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
    /// Its seal: `tree:blake3:<hex>` of its entries and chunk ids (format
    /// version 2), or `blake3:<hex>` of the workspace tar (version 1).
    pub digest: String,
    /// Length of the workspace tar.
    pub size: u64,
    /// When it was written (Unix seconds; generations written before
    /// version 2 do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// What made it: a command's checkpoint, a rewind, or a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<GenerationNote>,
    /// Paths added, changed and removed since its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// Bytes its stop sent to the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
}

impl Generation {
    /// A generation known by its index and seal only (restored from an
    /// interrupted stop, or read from a fork's base).
    pub fn bare(number: u64, index: String, digest: String, size: u64) -> Self {
        Generation {
            number,
            index,
            digest,
            size,
            created: None,
            note: None,
            changes: None,
            stored_bytes: None,
        }
    }
}

/// Why a generation was written, for `berth history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum GenerationNote {
    /// A checkpoint after a command (`--checkpoint each-exec`).
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
    /// A checkpoint asked for by name (`berth checkpoint`, `POST
    /// …/checkpoint`), with what its asker said of it.
    Checkpoint {
        /// A message (`-m`), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The workspace as it was before a rewind to generation `to`.
    BeforeRewind {
        /// The generation the workspace was rewound to.
        to: u64,
    },
}

/// Counts of the paths two generations differ by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    /// Paths only in the newer one.
    pub added: u64,
    /// Paths in both whose kind, mode, size, content or target differ.
    pub changed: u64,
    /// Paths only in the older one.
    pub removed: u64,
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
    /// Bytes of file content read from the workspace (the files cache
    /// skips unchanged files).
    #[serde(default)]
    pub read_bytes: u64,
    /// Files whose content was read.
    #[serde(default)]
    pub files_read: u64,
    /// Files the files cache found unchanged (not read).
    #[serde(default)]
    pub files_unchanged: u64,
    /// How long the stop took in the snapshot, in milliseconds.
    #[serde(default)]
    pub millis: u64,
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
    /// Generations written within this many seconds of the newest one are
    /// kept too, beyond `keep` (`--keep-within`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_within_secs: Option<u64>,
    /// A generation kept whatever `keep` says while a rewind to it is
    /// under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<u64>,
}

impl DedupRecord {
    /// The record in a snapshot state's kind-specific fields
    /// (`SnapshotState::fields`), if it is a deduplicated snapshot's and
    /// readable.
    pub fn from_fields(fields: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        record_in(fields).ok().flatten()
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
            keep_within_secs: None,
            hold: None,
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

    /// Moves generations beyond `keep` (oldest first; never the current
    /// one, the one a rewind holds, nor one written within
    /// `keep_within_secs` of the newest) to `doomed`.
    pub(super) fn drop_beyond_keep(&mut self) {
        let keep = self.keep.max(1) as usize;
        let newest = self.generations.iter().filter_map(|g| g.created).max();
        let recent = |g: &Generation| match (self.keep_within_secs, newest, g.created) {
            (Some(within), Some(newest), Some(created)) => created + within >= newest,
            _ => false,
        };
        let mut droppable: Vec<u64> = self
            .generations
            .iter()
            .filter(|g| Some(g.number) != self.current && Some(g.number) != self.hold && !recent(g))
            .map(|g| g.number)
            .collect();
        droppable.sort_unstable();
        let mut excess = self.generations.len().saturating_sub(keep);
        for number in droppable {
            if excess == 0 {
                break;
            }
            if let Some(pos) = self.generations.iter().position(|g| g.number == number) {
                let g = self.generations.remove(pos);
                self.doomed.push(g);
                excess -= 1;
            }
        }
    }
}

/// The state field holding a deduplicated snapshot's record.
pub(crate) const RECORD_FIELD: &str = "dedup";

/// `record` as the kind's state fields.
pub(crate) fn record_fields(record: &DedupRecord) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    if let Ok(value) = serde_json::to_value(record) {
        fields.insert(RECORD_FIELD.into(), value);
    }
    fields
}

/// The record in a snapshot state's fields, if there is one.
pub(crate) fn record_in(
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<DedupRecord>, serde_json::Error> {
    fields
        .get(RECORD_FIELD)
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u64) -> Generation {
        Generation::bare(n, format!("s.g{n}.idx"), format!("blake3:{n}"), n)
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
