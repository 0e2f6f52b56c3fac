//! The dedup snapshot's rules over the native directory store (the Wasm
//! stores are exercised in `tests/dedup.rs`).

use std::sync::Arc;

use super::*;
use crate::remote_client::DirRemoteClient;
use crate::snapshot::RemoteSnapshot;

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn big(seed: u8, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut h = blake3::Hasher::new();
    h.update(&[seed]);
    let mut reader = h.finalize_xof();
    out.resize(len, 0);
    reader.fill(&mut out);
    out
}

fn store(dir: &std::path::Path) -> Arc<dyn RemoteSnapshotClient> {
    Arc::new(DirRemoteClient::new(dir).unwrap())
}

fn id(s: &str) -> SnapshotId {
    SnapshotId::parse(s).unwrap()
}

/// A tree as [`tree`] reads it: path, mode, mtime, content.
type Tree = Vec<(String, u32, u64, Vec<u8>)>;

/// A tar's entries and contents (a restore renders the canonical tar of
/// the same tree, not the same bytes).
fn tree(tar: &[u8]) -> Tree {
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(tar);
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = String::from_utf8_lossy(&e.path_bytes())
            .trim_end_matches('/')
            .to_string();
        if path == "." || path.is_empty() {
            continue;
        }
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        out.push((
            path,
            e.header().mode().unwrap(),
            e.header().mtime().unwrap(),
            data,
        ));
    }
    out
}

/// The packs the directory store at `dir` holds, by name.
fn stored_packs(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".tar")
                .map(String::from)
        })
        .filter(|n| names::parse_pack(n).is_some())
        .collect()
}

async fn restored(snapshot: &DedupSnapshot) -> Vec<u8> {
    let mut out = Vec::new();
    snapshot.restore(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_whole_archive_snapshot_restores_until_the_first_deduplicated_stop() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let old = tar_of(&[("a", b"whole")]);
    RemoteSnapshot::new(id("s"), client.clone())
        .persist(&mut &old[..])
        .await
        .unwrap();
    let dedup = DedupSnapshot::new(id("s"), client, DedupOptions::default());
    assert!(dedup.is_restorable().await.unwrap());
    assert_eq!(tree(&restored(&dedup).await), tree(&old));
    let new = tar_of(&[("a", b"deduplicated")]);
    dedup.persist(&mut &new[..]).await.unwrap();
    assert_eq!(tree(&restored(&dedup).await), tree(&new));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_adopts_the_generation_an_interrupted_stop_committed() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let writer = DedupSnapshot::new(id("s"), client.clone(), DedupOptions::default());
    let one = tar_of(&[("a", &big(1, 300_000))]);
    writer.persist(&mut &one[..]).await.unwrap();
    let after_one = writer.record();
    let two = tar_of(&[("a", &big(2, 300_000))]);
    writer.persist(&mut &two[..]).await.unwrap();
    // The state was last saved after generation 1, with the stop of
    // generation 2 pending.
    let interrupted = DedupSnapshot::resume(
        id("s"),
        client.clone(),
        after_one.clone(),
        true,
        DedupOptions::default(),
    );
    assert_eq!(tree(&restored(&interrupted).await), tree(&two));
    assert_eq!(interrupted.record().current, Some(2));
    // Not interrupted: the recorded generation is what is restored, and
    // it is gone (collected), so the restore fails rather than guess.
    let stale = DedupSnapshot::resume(id("s"), client, after_one, false, DedupOptions::default());
    let mut sink = Vec::new();
    assert!(stale.restore(&mut sink).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_of_an_interrupted_stop_starts_from_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let writer = DedupSnapshot::new(id("s"), client.clone(), DedupOptions::default());
    let one = tar_of(&[("a", &big(1, 300_000))]);
    writer.persist(&mut &one[..]).await.unwrap();
    let after_one = writer.record();
    let two = tar_of(&[("a", &big(2, 300_000))]);
    // Generation 2 commits and collects generation 1; the state still
    // records generation 1, with the stop pending.
    writer.persist(&mut &two[..]).await.unwrap();
    assert!(!client.exists(&names::index("s", 1)).await.unwrap());
    let interrupted = DedupSnapshot::resume(
        id("s"),
        client.clone(),
        after_one.clone(),
        true,
        DedupOptions::default(),
    );
    let base = interrupted.pin_generation(None).await.unwrap();
    assert_eq!(base.number, 2);
    let fork = DedupSnapshot::resume(
        id("fork"),
        client.clone(),
        DedupRecord::forked_from(base, 1),
        false,
        DedupOptions::default(),
    );
    assert_eq!(tree(&restored(&fork).await), tree(&two));
    // Not known to be interrupted, the record's generation 1 is gone:
    // refused by name, and no pin is left behind.
    let stale = DedupSnapshot::resume(
        id("s"),
        client.clone(),
        after_one,
        false,
        DedupOptions::default(),
    );
    let err = stale.pin_generation(None).await.unwrap_err().to_string();
    assert!(
        err.contains("generation 1") && err.contains("no longer"),
        "{err}"
    );
    assert!(!client
        .exists(&names::pin(&names::index("s", 1)))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_collection_deletes_only_its_own_unreferenced_packs() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let a = DedupSnapshot::new(id("a"), client.clone(), DedupOptions::default().keep(1));
    let b = DedupSnapshot::new(id("b"), client.clone(), DedupOptions::default().keep(1));
    let shared = big(3, 400_000);
    let tar_a = tar_of(&[("x", &shared)]);
    a.persist(&mut &tar_a[..]).await.unwrap();
    b.persist(&mut &tar_a[..]).await.unwrap();
    // b's journal claims a's pack (as a lying or damaged journal could).
    let a_pack = restored_index(&a).await.header.packs[0].clone();
    let journal = serde_json::to_vec(&serde_json::json!({ "packs": [a_pack] })).unwrap();
    client
        .upload(&names::journal("b"), &mut &journal[..])
        .await
        .unwrap();
    let report = b.collect_garbage(false).await.unwrap();
    assert!(report.journal);
    assert!(report.packs.is_empty(), "{report:?}");
    assert!(client.exists(&a_pack).await.unwrap());
    // a moves on: its old generation's index goes, and of its packs only
    // those the new generation references stay.
    let tar_a2 = tar_of(&[("y", &big(4, 400_000))]);
    a.persist(&mut &tar_a2[..]).await.unwrap();
    assert!(!client.exists(&names::index("a", 1)).await.unwrap());
    let kept = restored_index(&a).await.header.packs.clone();
    let tag = names::owner_tag("a");
    let stored: Vec<String> = stored_packs(dir.path())
        .into_iter()
        .filter(|n| names::parse_pack(n).is_some_and(|(t, _)| t == tag))
        .collect();
    assert!(!stored.is_empty());
    for p in &stored {
        assert!(kept.contains(p), "{p} is garbage that was not collected");
    }
    assert_eq!(tree(&restored(&a).await), tree(&tar_a2));
    assert_eq!(tree(&restored(&b).await), tree(&tar_a));
}

async fn restored_index(s: &DedupSnapshot) -> Arc<Index> {
    let head = s.record().head().cloned().unwrap();
    s.index(&head.index).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_generation_survives_its_snapshot_moving_on() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let src = DedupSnapshot::new(id("src"), client.clone(), DedupOptions::default());
    let base = tar_of(&[("x", &big(5, 500_000))]);
    src.persist(&mut &base[..]).await.unwrap();
    let pinned = src.pin_generation(None).await.unwrap();
    let fork = DedupSnapshot::resume(
        id("fork"),
        client.clone(),
        DedupRecord::forked_from(pinned.clone(), 1),
        false,
        DedupOptions::default(),
    );
    for n in 6..9 {
        let t = tar_of(&[("x", &big(n, 500_000))]);
        src.persist(&mut &t[..]).await.unwrap();
    }
    assert!(src.record().pinned.contains(&pinned));
    assert_eq!(tree(&restored(&fork).await), tree(&base));
    let changed = tar_of(&[("x", &big(5, 500_000)), ("y", b"mine")]);
    fork.persist(&mut &changed[..]).await.unwrap();
    let stats = fork.record().last_stop.unwrap();
    assert!(stats.new_bytes < 100_000, "{stats:?}");
    assert_eq!(tree(&restored(&fork).await), tree(&changed));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_index_or_a_mismatched_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let s = DedupSnapshot::new(id("s"), client.clone(), DedupOptions::default());
    let t = tar_of(&[("x", b"data")]);
    s.persist(&mut &t[..]).await.unwrap();
    let head = s.record().head().cloned().unwrap();
    // A record whose digest differs from the index's.
    let mut record = s.record();
    record.generations[0].digest = "blake3:00".into();
    let wrong = DedupSnapshot::resume(
        id("s"),
        client.clone(),
        record,
        false,
        DedupOptions::default(),
    );
    let mut sink = Vec::new();
    let e = wrong.restore(&mut sink).await.unwrap_err();
    assert!(matches!(e, StoreError::Format { .. }), "{e}");
    assert!(sink.is_empty());
    // A damaged index.
    let path = dir.path().join(format!("{}.tar", head.index));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let fresh = DedupSnapshot::resume(id("s"), client, s.record(), false, DedupOptions::default());
    let e = fresh.restore(&mut sink).await.unwrap_err();
    assert!(
        matches!(
            &e,
            StoreError::Format { source, .. }
                if matches!(source.downcast_ref(), Some(FormatError::Checksum { .. }))
        ),
        "{e}"
    );
    assert!(sink.is_empty());
}

/// Format version 3 as a user's stops meet it: a stop with no change
/// uploads the index alone (a few KiB for thousands of files, whose
/// members take hundreds); a one-file change adds one small tree pack;
/// an index's blocks never come from more than [`MAX_TREE_PACKS`] + 1
/// packs; every generation restores in a fresh process; and a version-2
/// index written before still restores and is the next stop's parent.
#[tokio::test(flavor = "multi_thread")]
async fn version_3_stops_write_what_changed_and_read_back_fresh() {
    use super::tree_packs::MAX_TREE_PACKS;
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let options = || DedupOptions::default().keep(100);
    let mut contents: Vec<(String, Vec<u8>)> = (0..3000)
        .map(|n| {
            (
                format!("src/m{:02}/file-{n:05}.txt", n % 37),
                big(n as u8, 100 + n % 300),
            )
        })
        .collect();
    let tar = |c: &[(String, Vec<u8>)]| {
        let files: Vec<(&str, &[u8])> = c.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        tar_of(&files)
    };
    let s = DedupSnapshot::new(id("v3"), client.clone(), options());
    s.persist(&mut &tar(&contents)[..]).await.unwrap();
    // Generation 1 rewritten as version 2, as an older Berth wrote it.
    let first = s.record().head().cloned().unwrap();
    let mut v2 = (*restored_index(&s).await).clone();
    v2.header.version = 2;
    v2.blocks.clear();
    let v2_bytes = v2.encode();
    client
        .upload(&first.index, &mut &v2_bytes[..])
        .await
        .unwrap();
    let fresh = |record| DedupSnapshot::resume(id("v3"), client.clone(), record, false, options());
    let old = fresh(s.record());
    assert_eq!(restored_index(&old).await.header.version, 2);
    assert_eq!(tree(&restored(&old).await), tree(&tar(&contents)));
    // Its next stop deduplicates against it and writes version 3.
    old.persist(&mut &tar(&contents)[..]).await.unwrap();
    let stats = old.record().last_stop.unwrap();
    assert_eq!(stats.new_bytes, 0, "{stats:?}");
    // No change: the index alone, far smaller than the members.
    old.persist(&mut &tar(&contents)[..]).await.unwrap();
    let stats = old.record().last_stop.unwrap();
    assert_eq!(stats.upload_calls, 1, "{stats:?}");
    assert!(
        stats.uploaded_bytes < 16 * 1024,
        "{stats:?} (v2: {} B)",
        v2_bytes.len()
    );
    let mut expected = vec![(old.record().head().unwrap().number, tar(&contents))];
    let mut compactions = 0;
    for round in 0..20usize {
        let at = (round * 677) % contents.len();
        contents[at].1 = big(200 + round as u8, 150);
        old.persist(&mut &tar(&contents)[..]).await.unwrap();
        let stats = old.record().last_stop.unwrap();
        let number = old.record().head().unwrap().number;
        expected.push((number, tar(&contents)));
        let index = restored_index(&fresh(old.record())).await;
        assert_eq!(index.header.version, FORMAT_VERSION);
        let packs: std::collections::HashSet<u32> = index.blocks.iter().map(|b| b.pack).collect();
        assert!(
            packs.len() <= MAX_TREE_PACKS + 1,
            "round {round}: {} tree packs",
            packs.len()
        );
        // Small, or a compaction: every block again, in one tree pack.
        if stats.uploaded_bytes >= 64 * 1024 {
            assert_eq!(packs.len(), 1, "round {round}: {stats:?}");
            compactions += 1;
        }
    }
    assert!(
        compactions <= 20 / MAX_TREE_PACKS,
        "{compactions} compactions"
    );
    for (number, tar) in expected.iter().step_by(4) {
        let reader = fresh(old.record());
        reader.select_generation(*number).unwrap();
        assert_eq!(
            tree(&restored(&reader).await),
            tree(tar),
            "generation {number}"
        );
    }
}

/// A chain of 200 generations, each a seeded random edit of a 2,000-file
/// tree (files rewritten, added, removed): every 20th restores, in a fresh
/// process, to what it was; no index needs more than
/// [`MAX_TREE_PACKS`] + 1 tree packs; and after the keep shrinks to 60
/// halfway and garbage is collected, every kept generation still
/// restores and the store holds no pack the kept ones do not list
/// (`BERTH_TEST_SEED` varies the edits).
#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_200_generations_restores_and_collects() {
    use super::tree_packs::MAX_TREE_PACKS;
    let mut next = crate::test_rng::xorshift(crate::test_rng::seed(42));
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let mut files: std::collections::BTreeMap<String, Vec<u8>> = (0..2000)
        .map(|n| {
            (
                format!("d{:02}/f{n:05}", n % 40),
                big(n as u8, 64 + n % 200),
            )
        })
        .collect();
    let tar = |f: &std::collections::BTreeMap<String, Vec<u8>>| {
        let list: Vec<(&str, &[u8])> = f.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        tar_of(&list)
    };
    let s = DedupSnapshot::new(
        id("chain"),
        client.clone(),
        DedupOptions::default().keep(200),
    );
    let mut expected = std::collections::BTreeMap::new();
    let mut fresh_id = 10_000u64;
    for step in 0..200u64 {
        for _ in 0..(1 + next() % 5) {
            let keys: Vec<String> = files.keys().cloned().collect();
            let key = keys[(next() % keys.len() as u64) as usize].clone();
            match next() % 3 {
                0 => {
                    files.insert(key, big(next() as u8, 50 + (next() % 300) as usize));
                }
                1 => {
                    fresh_id += 1;
                    files.insert(
                        format!("d{:02}/new{fresh_id}", next() % 45),
                        big(step as u8, 80),
                    );
                }
                _ => {
                    files.remove(&key);
                }
            }
        }
        let t = tar(&files);
        s.persist(&mut &t[..]).await.unwrap();
        let number = s.record().head().unwrap().number;
        if number.is_multiple_of(20) {
            expected.insert(number, tree(&t));
        }
        if step == 100 {
            // The keep shrinks to 60, as `--keep 60` on a later start.
            let mut record = s.record();
            record.keep = 60;
            let shrunk = DedupSnapshot::resume(
                id("chain"),
                client.clone(),
                record,
                false,
                DedupOptions::default(),
            );
            shrunk.collect_garbage(false).await.unwrap();
            expected.retain(|n, _| *n > number - 60);
            // The rest of the chain continues from the shrunk record.
            let t = tar(&files);
            shrunk.persist(&mut &t[..]).await.unwrap();
            return finish_chain(shrunk, client, dir, expected, files, &mut next, tar).await;
        }
    }
    unreachable!("the chain shrinks its keep at step 100");

    async fn finish_chain(
        s: DedupSnapshot,
        client: Arc<dyn RemoteSnapshotClient>,
        dir: tempfile::TempDir,
        mut expected: std::collections::BTreeMap<u64, Tree>,
        mut files: std::collections::BTreeMap<String, Vec<u8>>,
        next: &mut impl FnMut() -> u64,
        tar: impl Fn(&std::collections::BTreeMap<String, Vec<u8>>) -> Vec<u8>,
    ) {
        for step in 0..100u64 {
            let keys: Vec<String> = files.keys().cloned().collect();
            let key = keys[(next() % keys.len() as u64) as usize].clone();
            files.insert(key, big((step + next()) as u8, 100));
            let t = tar(&files);
            s.persist(&mut &t[..]).await.unwrap();
            let number = s.record().head().unwrap().number;
            if number.is_multiple_of(20) {
                expected.insert(number, tree(&t));
            }
        }
        let record = s.record();
        let kept: std::collections::BTreeSet<u64> =
            record.generations.iter().map(|g| g.number).collect();
        assert_eq!(kept.len(), 60, "{kept:?}");
        expected.retain(|n, _| kept.contains(n));
        assert!(expected.len() >= 2, "{expected:?}");
        let mut listed = std::collections::BTreeSet::new();
        for (number, want) in &expected {
            let reader = DedupSnapshot::resume(
                id("chain"),
                client.clone(),
                record.clone(),
                false,
                DedupOptions::default(),
            );
            reader.select_generation(*number).unwrap();
            assert_eq!(&tree(&restored(&reader).await), want, "generation {number}");
            let index = restored_index(&reader).await;
            let packs: std::collections::HashSet<u32> =
                index.blocks.iter().map(|b| b.pack).collect();
            assert!(
                packs.len() <= MAX_TREE_PACKS + 1,
                "generation {number}: {} tree packs",
                packs.len()
            );
        }
        for g in &record.generations {
            listed.extend(s.packs_of(&g.index).await.unwrap().iter().cloned());
        }
        let stored = stored_packs(dir.path());
        for p in &stored {
            assert!(
                listed.contains(p),
                "{p} is stored but no kept generation lists it"
            );
        }
    }
}

/// A stop told to defer its tidying returns with its journal still in the
/// store and what it dropped not yet collected; `settle`, or the next stop,
/// does it — over seeded interleavings of deferred and inline stops,
/// settles and collections, every stop's tree restores, and once settled
/// the store holds no journal and only packs a kept generation lists.
#[tokio::test(flavor = "multi_thread")]
async fn a_deferred_tidy_is_done_by_settle_or_the_next_stop() {
    let mut next = crate::test_rng::xorshift(crate::test_rng::seed(0x5E771E));
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let s = DedupSnapshot::new(id("t"), client.clone(), DedupOptions::default().keep(2));
    let journal = names::journal("t");
    let mut files: Vec<Vec<u8>> = (0..6).map(|n| big(n, 70_000)).collect();
    let (mut deferred_seen, mut settled_seen) = (false, false);
    for step in 0..40u8 {
        files[(next() % 6) as usize] = big(step.wrapping_add(100), 70_000);
        let list: Vec<(String, &[u8])> = files
            .iter()
            .enumerate()
            .map(|(n, d)| (format!("f{n}"), d.as_slice()))
            .collect();
        let t = tar_of(
            &list
                .iter()
                .map(|(p, d)| (p.as_str(), *d))
                .collect::<Vec<_>>(),
        );
        let defer = !next().is_multiple_of(3);
        let dropped = s.record().generations.first().cloned();
        s.defer_tidy(defer);
        s.persist(&mut &t[..]).await.unwrap();
        let full = s.record().generations.len() == 2;
        if defer && full {
            // Two kept: the oldest of the three was dropped, not yet
            // collected, and this stop's journal is still there.
            let dropped = dropped.unwrap();
            assert!(client.exists(&dropped.index).await.unwrap(), "step {step}");
            assert!(client.exists(&journal).await.unwrap(), "step {step}");
            deferred_seen = true;
        }
        if !defer {
            assert!(!client.exists(&journal).await.unwrap(), "step {step}");
        }
        match next() % 4 {
            0 => {
                s.settle().await;
                assert!(!client.exists(&journal).await.unwrap(), "step {step}");
                settled_seen |= defer && full;
            }
            1 => {
                s.collect_garbage(false).await.unwrap();
                assert!(!client.exists(&journal).await.unwrap(), "step {step}");
            }
            _ => {}
        }
        assert_eq!(tree(&restored(&s).await), tree(&t), "step {step}");
    }
    assert!(
        deferred_seen && settled_seen,
        "the seed exercised no deferral"
    );
    s.settle().await;
    assert!(!client.exists(&journal).await.unwrap());
    let record = s.record();
    let mut listed = std::collections::BTreeSet::new();
    for g in &record.generations {
        assert!(client.exists(&g.index).await.unwrap());
        listed.extend(s.packs_of(&g.index).await.unwrap().iter().cloned());
    }
    for p in stored_packs(dir.path()) {
        assert!(
            listed.contains(&p),
            "{p} is stored but no kept generation lists it"
        );
    }
    let newest = record.head().unwrap().number;
    for n in 1..=newest {
        let kept = record.generations.iter().any(|g| g.number == n);
        let stored = client.exists(&names::index("t", n)).await.unwrap();
        assert_eq!(stored, kept, "generation {n}: stored {stored}, kept {kept}");
    }
}

/// A stop killed after its uploads leaves packs only its journal names.
/// The next stop — in a process that resumed the interrupted state —
/// writes a journal under the same name; the packs the old one named must
/// still be found and collected, not forgotten.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_stops_packs_are_collected_after_the_next_stop() {
    let dir = tempfile::tempdir().unwrap();
    let client = store(dir.path());
    let s = DedupSnapshot::new(id("k"), client.clone(), DedupOptions::default().keep(1));
    let one = tar_of(&[("a", &big(1, 300_000))]);
    s.persist(&mut &one[..]).await.unwrap();
    let mut record = s.record();
    // What the killed stop uploaded: a pack of its own, named in its
    // journal, and no index.
    let orphan = names::pack(&names::owner_tag("k"), &blake3::hash(b"killed"));
    client.upload(&orphan, &mut &b"killed"[..]).await.unwrap();
    let journal = serde_json::to_vec(&serde_json::json!({
        "snapshot": "k", "generation": 2, "packs": [orphan],
    }))
    .unwrap();
    client
        .upload(&names::journal("k"), &mut &journal[..])
        .await
        .unwrap();
    for defer in [false, true] {
        let resumed = DedupSnapshot::resume(
            id("k"),
            client.clone(),
            record.clone(),
            true,
            DedupOptions::default().keep(1),
        );
        resumed.defer_tidy(defer);
        let two = tar_of(&[("b", &big(2 + defer as u8, 300_000))]);
        resumed.persist(&mut &two[..]).await.unwrap();
        resumed.settle().await;
        assert!(
            !client.exists(&orphan).await.unwrap(),
            "deferred {defer}: the killed stop's pack outlived the next stop"
        );
        assert!(!client.exists(&names::journal("k")).await.unwrap());
        assert_eq!(tree(&restored(&resumed).await), tree(&two));
        record = resumed.record();
        // Killed again, for the deferred case.
        client.upload(&orphan, &mut &b"killed"[..]).await.unwrap();
        client
            .upload(&names::journal("k"), &mut &journal[..])
            .await
            .unwrap();
    }
}
