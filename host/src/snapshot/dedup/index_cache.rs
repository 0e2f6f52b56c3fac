//! The indexes a snapshot has read or written in this process, held so a
//! long-lived process (the server, checkpointing every command) stays
//! flat in memory: whole indexes only for the newest few (the parent the
//! next stop deduplicates against, the one just written), and for every
//! other only its pack list, which is all garbage collection needs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::format::Index;

/// Whole indexes kept: the parent of the next stop and the generation a
/// stop just wrote (which becomes that parent).
const WHOLE_KEPT: usize = 2;

/// Indexes by object id: a few whole, the rest as pack lists.
#[derive(Default)]
pub(super) struct IndexCache {
    whole: Mutex<VecDeque<(String, Arc<Index>)>>,
    packs: Mutex<HashMap<String, Arc<[String]>>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // What a panic under this lock leaves is still a whole map.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl IndexCache {
    /// Index `object`, when it is one of the newest held whole.
    pub(super) fn whole(&self, object: &str) -> Option<Arc<Index>> {
        let mut whole = locked(&self.whole);
        let at = whole.iter().position(|(id, _)| id == object)?;
        // The most recently used goes to the front.
        let entry = whole.remove(at)?;
        let index = entry.1.clone();
        whole.push_front(entry);
        Some(index)
    }

    /// The packs index `object` references, when it was seen here.
    pub(super) fn packs(&self, object: &str) -> Option<Arc<[String]>> {
        locked(&self.packs).get(object).cloned()
    }

    /// Holds `index` whole (dropping the least recently used beyond
    /// [`WHOLE_KEPT`]) and its pack list.
    pub(super) fn remember(&self, object: &str, index: Arc<Index>) {
        self.remember_packs(object, &index);
        let mut whole = locked(&self.whole);
        whole.retain(|(id, _)| id != object);
        whole.push_front((object.to_string(), index));
        whole.truncate(WHOLE_KEPT);
    }

    /// Holds `index`'s pack list only.
    pub(super) fn remember_packs(&self, object: &str, index: &Index) {
        locked(&self.packs).insert(object.to_string(), index.header.packs.clone().into());
    }

    /// Forgets `object` (deleted from the store).
    pub(super) fn forget(&self, object: &str) {
        locked(&self.whole).retain(|(id, _)| id != object);
        locked(&self.packs).remove(object);
    }

    /// How many indexes are held whole (for tests).
    #[cfg(test)]
    pub(super) fn whole_count(&self) -> usize {
        locked(&self.whole).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::dedup::format::{IndexHeader, FORMAT_VERSION};

    fn index(packs: &[&str]) -> Arc<Index> {
        Arc::new(Index {
            header: IndexHeader {
                version: FORMAT_VERSION,
                snapshot: "s".into(),
                generation: 1,
                chunker: Default::default(),
                parent: None,
                tar_size: 0,
                tar_digest: String::new(),
                packs: packs.iter().map(|p| p.to_string()).collect(),
                created: 0,
                instance: None,
            },
            entries: Vec::new(),
            members: Vec::new(),
            blocks: Vec::new(),
        })
    }

    /// However many generations a long-lived process writes, it holds two
    /// indexes whole; every one's pack list stays, until it is forgotten.
    #[test]
    fn whole_indexes_stay_few_and_pack_lists_stay_all() {
        let cache = IndexCache::default();
        for n in 0..100 {
            cache.remember(&format!("g{n}"), index(&[&format!("p{n}")]));
            assert!(cache.whole_count() <= WHOLE_KEPT);
        }
        assert!(cache.whole("g99").is_some());
        assert!(cache.whole("g98").is_some());
        assert!(cache.whole("g0").is_none());
        assert_eq!(&*cache.packs("g0").unwrap(), &["p0".to_string()]);
        // A use makes an index the most recent.
        assert!(cache.whole("g98").is_some());
        cache.remember("g100", index(&[]));
        assert!(cache.whole("g98").is_some() && cache.whole("g99").is_none());
        cache.forget("g0");
        assert!(cache.packs("g0").is_none());
    }
}
